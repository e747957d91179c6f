//! The PV control loop on kube-runtime's `Controller` ([`common::runtime::control`],
//! as kube-rs' `controller-rs` example): a reflector of [`CachedPv`]s triggers
//! [`reconcile`] per PV name, at most `--worker-threads` at once and never
//! twice at once for one PV; [`error_policy`] applies the seed's retry rules;
//! a deleted PV's retry state is forgotten ([`Context::observe`]). [`run_term`]
//! runs one leader term: this loop and one orphan sweep. The only module that
//! spawns. Why `Controller`: docs/decisions/0008-reclaim-on-kube-runtime-controller.md.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::kube::cache::Compact;
use common::kube::events::EventSink;
use common::kube::retry::{FailureThreshold, RetryPolicy};
use common::kube::workqueue_metrics::WorkQueueMetrics;
use common::runtime::control::{self, LoopSettings};
use common::runtime::frame::ServiceContext;
use common::runtime::metrics::DeleteMetrics;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use provisioner_api::Provisioner;

use crate::config::ReclaimArgs;
use crate::metrics::SweepMetrics;
use crate::operation::{Reclaimer, SyncError};
use crate::sweep;

/// A PV as the PV cache holds it: identity typed, the rest as compact JSON
/// decoded by [`reconcile`] for each sync ([`Compact`]).
pub type CachedPv = Compact<PersistentVolume>;

/// What [`reconcile`] and [`error_policy`] share.
pub struct Context {
    /// Runs the seed's sync and delete operation.
    pub reclaimer: Arc<Reclaimer>,
    /// Per-PV failure counts and backoff.
    pub retry: Arc<RetryPolicy<String>>,
    /// Give up a PV after this many failed syncs (0 = never).
    pub threshold: FailureThreshold,
    /// Upper bound of one sync; zero = unlimited (seed `deletionTimeout`).
    pub deletion_timeout: Duration,
}

impl Context {
    /// Forget a deleted PV's retry state and uid (seed `forgetVolume`), and
    /// after a (re-)list the uids of PVs no longer present.
    pub fn observe(&self, event: &watcher::Event<CachedPv>, store: &Store<CachedPv>) {
        match event {
            watcher::Event::Delete(pv) => {
                self.retry.forget(&pv.name_any());
                if let Some(uid) = pv.meta().uid.as_deref() {
                    self.reclaimer.retain_uids(|alive| alive != uid);
                }
            }
            watcher::Event::InitDone => {
                let alive: HashSet<String> = store
                    .state()
                    .iter()
                    .filter_map(|pv| pv.meta().uid.clone())
                    .collect();
                self.reclaimer.retain_uids(|uid| alive.contains(uid));
            }
            _ => {}
        }
    }
}

/// Sync one PV (seed `syncVolume` under `--deletion-timeout`); success forgets
/// its failures. Errors: [`SyncError`], handed to [`error_policy`].
pub async fn reconcile(cached: Arc<CachedPv>, ctx: Arc<Context>) -> Result<Action, SyncError> {
    let pv = cached.object();
    let timeout = ctx.deletion_timeout;
    ctx.reclaimer.sync_volume_within(&pv, timeout).await?;
    ctx.retry.forget(&pv.name_any());
    Ok(Action::await_change())
}

/// The seed's retry rule: requeue after the backoff while the threshold
/// allows, else wait for the PV's next change, keeping its failures ("Done but
/// do not Forget") until the PV is deleted.
pub fn error_policy(pv: Arc<CachedPv>, err: &SyncError, ctx: Arc<Context>) -> Action {
    let key = pv.name_any();
    let (requeues, threshold) = (ctx.retry.requeues(&key), ctx.threshold);
    if threshold.allows_retry(requeues) {
        let delay = ctx.retry.next_delay(&key);
        tracing::warn!(pv = %key, failures = requeues, threshold = threshold.0, ?delay, error = %err, "retrying syncing PV");
        Action::requeue(delay)
    } else {
        tracing::error!(pv = %key, failures = requeues, threshold = threshold.0, error = %err, "giving up syncing PV");
        Action::await_change()
    }
}

/// What a leader term needs besides the [`ServiceContext`]; cloned per term.
#[derive(Clone)]
pub struct TermDeps {
    /// The backend whose volumes are reclaimed.
    pub backend: Arc<dyn Provisioner>,
    /// The seed's delete families (label `class`), registered once per process.
    pub delete: DeleteMetrics,
    /// The orphan sweep's gauges.
    pub sweep: SweepMetrics,
    /// client-go's `workqueue_*` series of the PV queue (`name="volumes"`).
    pub queue: WorkQueueMetrics,
    /// reclaim-svc's own flags.
    pub args: ReclaimArgs,
}

/// One leader term: the PV control loop and, once the reflector has synced
/// (readiness), one orphan sweep; a new reflector and reclaimer each term.
/// Errors: none once running.
pub async fn run_term(ctx: ServiceContext, deps: TermDeps) -> anyhow::Result<()> {
    let (args, reclaim) = (&ctx.args, deps.args);
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let events = EventSink::new(ctx.client.clone(), ctx.spec.name, &ctx.identity);
    let provisioner = args.cluster.provisioner_name.clone();
    let reclaimer = Reclaimer::new(
        api.clone(),
        deps.backend.clone(),
        Arc::new(events),
        deps.delete,
        provisioner.clone(),
        reclaim.add_finalizer,
    )
    .with_term(ctx.term.clone());
    let workers = args.worker_threads_for(crate::SPEC);
    tracing::info!(%provisioner, add_finalizer = reclaim.add_finalizer, failed_delete_threshold = reclaim.failed_delete_threshold, workers, "starting PV reclaim loop");
    let retry = RetryPolicy::from_args(args.retry_backoff(crate::SPEC), &reclaim.retry);
    let loop_ctx = Arc::new(Context {
        reclaimer: Arc::new(reclaimer),
        retry: Arc::new(retry),
        threshold: FailureThreshold(reclaim.failed_delete_threshold),
        deletion_timeout: reclaim.deletion_timeout,
    });
    let job = sweep::SweepJob {
        redis: args.cluster.redis(),
        provisioner_name: provisioner,
        pvs: api,
        backend: deps.backend,
        action: sweep::SweepAction {
            archive: reclaim.sweep_orphans,
            min_age: reclaim.sweep_min_age,
            shutdown: ctx.shutdown.clone(),
        },
        metrics: deps.sweep,
        reporter: ctx.identity.clone(),
    };
    // The sweep is part of this future: it stops with the term.
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<Store<CachedPv>>();
    let sweep_shutdown = ctx.shutdown.clone();
    let sweep_task = async move {
        let Ok(store) = synced_rx.await else { return };
        let cached = move |name: &str| store.get(&ObjectRef::new(name)).is_some();
        sweep_shutdown
            .run_until_cancelled(sweep::run_once(job, cached))
            .await;
    };
    let (store, writer) = reflector::store::<CachedPv>();
    let (observer, readiness, mut synced_tx) =
        (loop_ctx.clone(), ctx.readiness.clone(), Some(synced_tx));
    let pvs = Api::<CachedPv>::all(ctx.client.clone());
    let trigger = control::trigger(pvs, writer, deps.queue.clone(), move |event, store| {
        observer.observe(event, store);
        let first_list = matches!(event, watcher::Event::InitDone);
        if let Some(synced_tx) = synced_tx.take_if(|_| first_list) {
            tracing::info!(pvs = store.state().len(), "PV reflector synced");
            readiness.set_ready(true);
            let _ = synced_tx.send(store.clone());
        }
    });
    let settings = LoopSettings {
        workers,
        resync_period: reclaim.resync_period,
        stall: args.healthz_stall_timeout,
        heartbeat: ctx.heartbeat.clone(),
        metrics: deps.queue,
        shutdown: ctx.shutdown.clone(),
        reconcile_all: None,
    };
    let control_loop = control::run(trigger, store, settings, reconcile, error_policy, loop_ctx);
    tokio::pin!(control_loop, sweep_task);
    tokio::select! {
        () = &mut control_loop => {}
        () = &mut sweep_task => control_loop.await,
    }
    tracing::info!("PV controller stopped");
    Ok(())
}
