//! reclaim-svc: the reclaim half of the seed controller
//! (sig-storage-lib-external-provisioner v8).
//!
//! Watches PVs through a reflector and, for each PV of our provisioner
//! (`pv.kubernetes.io/provisioned-by` or `pv.kubernetes.io/migrated-to` equals
//! the provisioner name):
//!
//! 1. keeps the provisioner finalizer
//!    (`external-provisioner.volume.kubernetes.io/finalizer`) in line with
//!    `--add-finalizer` and the reclaim policy ([`decision::finalizer_update`],
//!    written by [`finalizer::update_finalizers`]);
//! 2. when the PV is `Released` with reclaim policy `Delete`
//!    ([`decision::should_delete`]), deletes the storage asset through the
//!    backend, then the PV, then our finalizer ([`operation::Reclaimer`]);
//! 3. retries failures per PV with backoff up to `--failed-delete-threshold`
//!    ([`controller`]).
//!
//! Modules: [`decision`] (pure rules), [`finalizer`] (conflict-safe finalizer
//! patch), [`operation`] (sync and delete operation), [`common::workqueue`],
//! [`controller`] (reflector + workers), [`api_calls`] (RBAC declaration).

pub mod api_calls;
pub mod controller;
pub mod decision;
pub mod finalizer;
pub mod operation;
pub mod sweep;

use std::sync::Arc;
use std::time::Duration;

use clap::{Args, Parser};
use common::backend::select::{Backend, BackendArgs};
use common::config::{parse_duration, CommonArgs, RetryArgs, ServiceKind};
use common::events::EventSink;
use common::metrics::DeleteMetrics;
use common::retry::{FailureThreshold, RetryPolicy};
use common::runtime::run_service;
use common::Provisioner;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Api;
use prometheus::Registry;

use crate::controller::LoopConfig;
use crate::operation::Reclaimer;
use crate::sweep::{OrphanPvFn, SweepMetrics};

/// Flags of reclaim-svc itself (each with an environment twin).
#[derive(Debug, Clone, Args)]
pub struct ReclaimArgs {
    /// Add the provisioner finalizer to our PVs with reclaim policy `Delete`, so
    /// a PV object outlives its asset's deletion; when off, the finalizer is
    /// removed from our PVs (seed `AddFinalizer`).
    #[arg(long, env = "ADD_FINALIZER", default_value_t = false, action = clap::ArgAction::Set)]
    pub add_finalizer: bool,

    /// Failed syncs of one PV before it is given up until its next change
    /// (seed `FailedDeleteThreshold`). 0 retries forever.
    #[arg(long, env = "FAILED_DELETE_THRESHOLD", default_value_t = 15)]
    pub failed_delete_threshold: u32,

    /// Upper bound of one PV sync including the backend's delete; `0s` means
    /// unlimited (seed `DeletionTimeout`, default unlimited). As the seed's
    /// context timeout, the backend's delete sees the deadline
    /// (`common::deadline`) and a timed-out attempt is a failure: a
    /// `VolumeFailedDelete` event, `..._delete_failed_total`, a retry.
    #[arg(long, env = "DELETION_TIMEOUT", default_value = "0s", value_parser = parse_duration)]
    pub deletion_timeout: Duration,

    /// Every PV is re-examined this often even without changes (seed resync
    /// period). `0s` disables.
    #[arg(long, env = "RESYNC_PERIOD", default_value = "15m", value_parser = parse_duration)]
    pub resync_period: Duration,

    /// PVs synced concurrently (seed threadiness).
    #[arg(long, env = "WORKER_THREADS", default_value_t = 4)]
    pub worker_threads: usize,

    /// Archive orphaned backend volumes the leader-start sweep finds (no PV, no
    /// pending PV write, no provisioning intent) once their directory is older
    /// than --sweep-min-age: renamed `archived-<name>` in the base directory,
    /// never removed, whatever --on-delete says — such a directory may be a
    /// Retain volume whose PV an admin deleted, or another provisioner's
    /// in-flight volume in a shared base directory. Off: report them only.
    #[arg(long, env = "SWEEP_ORPHANS", default_value_t = false, action = clap::ArgAction::Set)]
    pub sweep_orphans: bool,

    /// Minimum age (newer of directory mtime/ctime) before --sweep-orphans
    /// archives an orphaned volume; younger orphans are only reported.
    #[arg(long, env = "SWEEP_MIN_AGE", default_value = "1h", value_parser = parse_duration)]
    pub sweep_min_age: Duration,
}

/// The reclaim-svc command line.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "reclaim-svc",
    version,
    about = "Deletes released volumes of a Kubernetes external provisioner and manages its PV finalizer"
)]
pub struct Cli {
    /// Shared flags.
    #[command(flatten)]
    pub common: CommonArgs,
    /// Per-PV retry flags.
    #[command(flatten)]
    pub retry: RetryArgs,
    /// `--backend` and the built-in backends' flags.
    #[command(flatten)]
    pub backend: BackendArgs,
    /// reclaim-svc's own flags.
    #[command(flatten)]
    pub reclaim: ReclaimArgs,
}

/// Run reclaim-svc with `backend` until SIGTERM (a lost Lease stops the work
/// and the replica campaigns again, see `common::runtime`): serves
/// `/metrics` (seed delete families, label `class`), `/healthz`, `/readyz`
/// (ready once the PV reflector has synced), elects a leader on the
/// `<provisioner>-reclaim` Lease and, as leader, runs the PV control loop.
///
/// Errors: setup failures, or the PV watch ending.
pub async fn run(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    run_with_orphan_pv(common, retry, reclaim, backend, None).await
}

/// [`run`] with a built-in backend and its orphan archiver
/// ([`sweep::HostPathArchiver`] or [`sweep::NfsSubdirArchiver`], used with
/// `--sweep-orphans`).
///
/// Errors: as [`run`].
pub async fn run_with_backend(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Backend,
) -> anyhow::Result<()> {
    let archiver: Arc<dyn sweep::OrphanArchiver> = match &backend {
        Backend::HostPath(hp) => {
            let hp = Arc::clone(hp);
            let orphan_pv: OrphanPvFn = Arc::new(move |name: &str| {
                common::backend::hostpath::delete::volume_for_directory(&hp, name)
            });
            Arc::new(sweep::HostPathArchiver(orphan_pv))
        }
        Backend::NfsSubdir(nfs) => Arc::new(sweep::NfsSubdirArchiver(Arc::clone(nfs))),
    };
    run_with_archiver(
        common,
        retry,
        reclaim,
        backend.provisioner(),
        Some(archiver),
    )
    .await
}

/// [`run`], plus how to address an orphaned `hostPath` volume (`orphan_pv`,
/// see [`sweep::OrphanPvFn`]) so `--sweep-orphans` can archive it (see
/// [`sweep`]: never removed, only when older than `--sweep-min-age`). Without
/// it the leader-start orphan sweep only reports, even with `--sweep-orphans`.
///
/// Errors: as [`run`].
pub async fn run_with_orphan_pv(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Arc<dyn Provisioner>,
    orphan_pv: Option<OrphanPvFn>,
) -> anyhow::Result<()> {
    let archiver =
        orphan_pv.map(|f| Arc::new(sweep::HostPathArchiver(f)) as Arc<dyn sweep::OrphanArchiver>);
    run_with_archiver(common, retry, reclaim, backend, archiver).await
}

/// [`run`], plus the archiver `--sweep-orphans` uses (see [`sweep`]: never
/// removed, only when older than `--sweep-min-age`). Without one the
/// leader-start orphan sweep only reports, even with `--sweep-orphans`.
///
/// Errors: as [`run`].
pub async fn run_with_archiver(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Arc<dyn Provisioner>,
    archiver: Option<Arc<dyn sweep::OrphanArchiver>>,
) -> anyhow::Result<()> {
    let registry = Registry::new();
    let metrics = DeleteMetrics::register(&registry);
    let sweep_metrics = SweepMetrics::register(&registry);
    run_service(
        ServiceKind::Reclaim,
        common,
        registry,
        // Called once per leader term: each term starts from scratch (new
        // reflector, reclaimer and orphan sweep); the metrics live on.
        move |ctx| {
            let (backend, metrics, sweep_metrics, archiver, retry, reclaim) = (
                backend.clone(),
                metrics.clone(),
                sweep_metrics.clone(),
                archiver.clone(),
                retry.clone(),
                reclaim.clone(),
            );
            async move {
                let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
                let events = Arc::new(EventSink::new(
                    ctx.client.clone(),
                    ctx.kind.component(),
                    &ctx.identity,
                ));
                let reclaimer = Arc::new(Reclaimer::new(
                    api.clone(),
                    backend.clone(),
                    events,
                    metrics,
                    ctx.args.provisioner_name.clone(),
                    reclaim.add_finalizer,
                ));
                let policy = Arc::new(RetryPolicy::from_args(&retry));
                let config = LoopConfig {
                    workers: reclaim.worker_threads,
                    threshold: FailureThreshold(reclaim.failed_delete_threshold),
                    deletion_timeout: reclaim.deletion_timeout,
                    resync_period: reclaim.resync_period,
                };
                tracing::info!(
                    provisioner = %ctx.args.provisioner_name,
                    add_finalizer = reclaim.add_finalizer,
                    failed_delete_threshold = reclaim.failed_delete_threshold,
                    workers = config.workers,
                    "starting PV reclaim loop"
                );
                let readiness = ctx.readiness.clone();
                // Once the reflector has synced: ready, and hand the PV cache to the sweep.
                let (synced_tx, synced_rx) =
                    tokio::sync::oneshot::channel::<Store<PersistentVolume>>();
                let on_synced = move |store: &Store<PersistentVolume>| {
                    readiness.set_ready(true);
                    let _ = synced_tx.send(store.clone());
                };
                // One orphan sweep per leadership, owned by this work future: it
                // stops on shutdown, and is dropped with the loop (or when the
                // runtime aborts the work future on a lost Lease).
                let archiver = archiver.filter(|_| reclaim.sweep_orphans);
                let job = sweep::SweepJob {
                    redis_url: ctx.args.redis_url.clone(),
                    provisioner_name: ctx.args.provisioner_name.clone(),
                    pvs: api.clone(),
                    backend,
                    archiver,
                    min_age: reclaim.sweep_min_age,
                    shutdown: ctx.shutdown.clone(),
                    metrics: sweep_metrics,
                    reporter: ctx.identity.clone(),
                };
                let sweep_shutdown = ctx.shutdown.clone();
                let sweep_task = async move {
                    let Ok(store) = synced_rx.await else {
                        return;
                    };
                    let cached = move |name: &str| store.get(&ObjectRef::new(name)).is_some();
                    tokio::select! {
                        _ = sweep_shutdown.cancelled() => {}
                        _ = sweep::run_once(job, cached) => {}
                    }
                };
                let control_loop = controller::run_loop(
                    api,
                    reclaimer,
                    policy,
                    config,
                    ctx.shutdown.clone(),
                    on_synced,
                );
                tokio::pin!(control_loop, sweep_task);
                tokio::select! {
                    result = &mut control_loop => result,
                    () = &mut sweep_task => control_loop.await,
                }
            }
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flag_defaults_follow_the_seed() {
        let cli = Cli::try_parse_from(["reclaim-svc"]).unwrap();
        assert!(!cli.reclaim.add_finalizer);
        assert_eq!(cli.reclaim.failed_delete_threshold, 15);
        assert_eq!(cli.reclaim.deletion_timeout, Duration::ZERO);
        assert_eq!(cli.reclaim.resync_period, Duration::from_secs(15 * 60));
        assert_eq!(cli.reclaim.worker_threads, 4);
        assert!(!cli.reclaim.sweep_orphans);
        assert_eq!(cli.reclaim.sweep_min_age, Duration::from_secs(3600));
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "reclaim-svc",
            "--add-finalizer=true",
            "--failed-delete-threshold",
            "0",
            "--deletion-timeout",
            "2m",
            "--on-delete",
            "archive",
            "--sweep-orphans=true",
            "--sweep-min-age",
            "6h",
        ])
        .unwrap();
        assert!(cli.reclaim.add_finalizer);
        assert_eq!(cli.reclaim.failed_delete_threshold, 0);
        assert_eq!(cli.reclaim.deletion_timeout, Duration::from_secs(120));
        assert_eq!(
            cli.backend.hostpath.on_delete,
            common::backend::hostpath::OnDelete::Archive
        );
        assert!(cli.reclaim.sweep_orphans);
        assert_eq!(cli.reclaim.sweep_min_age, Duration::from_secs(6 * 3600));
    }
}
