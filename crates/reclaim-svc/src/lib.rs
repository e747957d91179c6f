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
//!    ([`controller`], on kube-runtime's `Controller`).
//!
//! Modules: [`config`] (flags), [`metrics`], [`decision`] (pure rules), [`finalizer`]
//! (conflict-safe finalizer patch), [`operation`] (sync and delete operation),
//! [`controller`] (reflector + `Controller`: reconcile and error policy),
//! [`sweep`] (leader-start orphan sweep), [`api_calls`] (RBAC declaration).

pub mod api_calls;
pub mod config;
pub mod controller;
pub mod decision;
pub mod finalizer;
pub mod metrics;
pub mod operation;
pub mod sweep;

use std::sync::Arc;

use common::kube::events::EventSink;
use common::kube::retry::{FailureThreshold, RetryPolicy};
use common::runtime::config::{CommonArgs, RetryArgs, ServiceSpec};
use common::runtime::frame::{run_service, Launch};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::runtime::reflector::{ObjectRef, Store};
use kube::Api;
use prometheus::Registry;
use provisioner_api::Provisioner;

pub use crate::config::{Cli, ReclaimArgs};
use crate::controller::LoopConfig;
use crate::metrics::ReclaimMetrics;
use crate::operation::Reclaimer;

/// This service as the runtime knows it: component name, Lease suffix, default
/// HTTP port, worker threads and retry intervals.
pub const SPEC: ServiceSpec = ServiceSpec::new("reclaim-svc", "reclaim", 9103);

/// Run reclaim-svc with `backend` until SIGTERM (a lost Lease stops the work
/// and the replica campaigns again, see `common::runtime::frame`): serves
/// `/metrics` (seed delete families, label `class`), `/healthz`, `/readyz`
/// (ready once the PV reflector has synced), elects a leader on the
/// `<provisioner>-reclaim` Lease and, as leader, runs the PV control loop and
/// one orphan sweep per term (archiving through
/// [`Provisioner::archive_orphan`] with `--sweep-orphans`, see [`sweep`]).
///
/// Errors: setup failures, or the PV watch ending.
pub async fn run(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    let registry = Registry::new();
    let ReclaimMetrics {
        delete: metrics,
        sweep: sweep_metrics,
    } = ReclaimMetrics::register(&registry);
    let queue_metrics =
        common::kube::workqueue_metrics::WorkQueueMetrics::register(&registry, "volumes");
    run_service(
        SPEC,
        common,
        registry,
        Launch::default(),
        // Called once per leader term: each term starts from scratch (new
        // reflector, reclaimer and orphan sweep); the metrics live on.
        move |ctx| {
            let queue_metrics = queue_metrics.clone();
            let (backend, metrics, sweep_metrics, retry, reclaim) = (
                backend.clone(),
                metrics.clone(),
                sweep_metrics.clone(),
                retry.clone(),
                reclaim.clone(),
            );
            async move {
                let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
                let events = Arc::new(EventSink::new(
                    ctx.client.clone(),
                    ctx.spec.name,
                    &ctx.identity,
                ));
                let reclaimer = Arc::new(
                    Reclaimer::new(
                        api.clone(),
                        backend.clone(),
                        events,
                        metrics,
                        ctx.args.provisioner_name.clone(),
                        reclaim.add_finalizer,
                    )
                    .with_term(ctx.term.clone()),
                );
                let policy = Arc::new(RetryPolicy::from_args(ctx.args.retry_backoff(SPEC), &retry));
                let config = LoopConfig {
                    workers: ctx.args.worker_threads_for(SPEC),
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
                    tokio::sync::oneshot::channel::<Store<controller::CachedPv>>();
                let on_synced = move |store: &Store<controller::CachedPv>| {
                    readiness.set_ready(true);
                    let _ = synced_tx.send(store.clone());
                };
                // One orphan sweep per leadership, owned by this work future: it
                // stops on shutdown, and is dropped with the loop (or when the
                // runtime aborts the work future on a lost Lease).
                let job = sweep::SweepJob {
                    redis: ctx.args.redis(),
                    provisioner_name: ctx.args.provisioner_name.clone(),
                    pvs: api.clone(),
                    backend,
                    archive: reclaim.sweep_orphans,
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
                let observers = controller::LoopObservers {
                    queue_metrics,
                    heartbeat: ctx.heartbeat.clone(),
                    stall_timeout: ctx.args.healthz_stall_timeout,
                };
                let control_loop = controller::run_loop_observed(
                    observers,
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
