//! The PV control loop on kube-runtime's [`Controller`] (as kube-rs'
//! `controller-rs` example): a reflector of [`CachedPv`]s triggers
//! [`reconcile`] per PV name, at most `--worker-threads` at once and never
//! twice at once for one PV; [`error_policy`] applies the seed's retry rules;
//! a deleted PV's retry state is forgotten ([`Context::observe`]). [`run_term`]
//! runs one leader term: this loop and one orphan sweep. The only module that
//! spawns. Why `Controller`: docs/decisions/0008-reclaim-on-kube-runtime-controller.md.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::kube::cache::{watch_backoff, Compact};
use common::kube::retry::{FailureThreshold, RetryPolicy};
use common::runtime::config::resync_interval;
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Resource, ResourceExt};
use provisioner_api::deadline::Deadline;
use tokio_util::sync::CancellationToken;

use crate::config::ReclaimArgs;
use crate::metrics::ReclaimMetrics;
use crate::operation::{Reclaimer, SyncError};
use crate::sweep;
use common::kube::events::EventSink;
use common::kube::workqueue_metrics::WorkQueueMetrics;
use common::runtime::config::RetryArgs;
use common::runtime::frame::ServiceContext;
use common::runtime::health::Heartbeat;
use kube::runtime::reflector::ObjectRef;
use provisioner_api::Provisioner;

/// A PV as the PV cache holds it: identity typed, the rest as compact JSON
/// decoded by [`reconcile`] for each sync ([`Compact`]).
pub type CachedPv = Compact<PersistentVolume>;

/// Tuning of the control loop.
#[derive(Debug, Clone)]
pub struct LoopConfig {
    /// Concurrent PV syncs (seed threadiness, `--worker-threads`); at least 1.
    pub workers: usize,
    /// Give up a PV after this many failed syncs (0 = never).
    pub threshold: FailureThreshold,
    /// Upper bound of one sync; zero = unlimited (seed `deletionTimeout`).
    pub deletion_timeout: Duration,
    /// Every PV is synced again this often; zero disables (seed resync period).
    pub resync_period: Duration,
}

/// What [`reconcile`] and [`error_policy`] share.
pub struct Context {
    /// Runs the seed's sync and delete operation.
    pub reclaimer: Arc<Reclaimer>,
    /// Per-PV failure counts and backoff.
    pub retry: Arc<RetryPolicy<String>>,
    /// Threshold, deletion timeout, workers, resync.
    pub config: LoopConfig,
    /// client-go's `workqueue_*` series of the PV queue, when observed.
    pub queue_metrics: Option<WorkQueueMetrics>,
}

impl Context {
    /// Forget a deleted PV's retry state and uid (seed `forgetVolume`), and
    /// after a (re-)list the uids of PVs no longer present.
    pub fn observe(&self, event: &watcher::Event<CachedPv>, store: &Store<CachedPv>) {
        match event {
            watcher::Event::Delete(pv) => {
                self.retry.forget(&pv.name_any());
                if let Some(uid) = pv.meta().uid.as_deref() {
                    self.reclaimer.forget_uid(uid);
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
    let _processing = ctx.queue_metrics.as_ref().map(|m| m.start_processing());
    let pv = cached.object();
    if ctx.config.deletion_timeout.is_zero() {
        ctx.reclaimer.sync_volume(&pv).await?;
    } else {
        let deadline = Deadline::after(ctx.config.deletion_timeout);
        ctx.reclaimer.sync_volume_within(&pv, deadline).await?;
    }
    ctx.retry.forget(&pv.name_any());
    Ok(Action::await_change())
}

/// The seed's retry rule: requeue after the backoff while the threshold
/// allows, else wait for the PV's next change, keeping its failures ("Done but
/// do not Forget") until the PV is deleted.
pub fn error_policy(pv: Arc<CachedPv>, err: &SyncError, ctx: Arc<Context>) -> Action {
    let key = pv.name_any();
    let requeues = ctx.retry.requeues(&key);
    let threshold = ctx.config.threshold;
    if threshold.allows_retry(requeues) {
        let delay = ctx.retry.next_delay(&key);
        tracing::warn!(pv = %key, failures = requeues, threshold = threshold.0, ?delay, error = %err, "retrying syncing PV");
        if let Some(m) = &ctx.queue_metrics {
            m.retry();
        }
        Action::requeue(delay)
    } else {
        tracing::error!(pv = %key, failures = requeues, threshold = threshold.0, error = %err, "giving up syncing PV");
        Action::await_change()
    }
}

/// Run the loop until `shutdown` fires, beating `heartbeat` unless every
/// slot stays busy for `stall`; `on_synced` runs once the first list is in the
/// store; in-flight syncs finish first. Errors: none once running.
pub async fn run_loop(
    ctx: Arc<Context>,
    api: Api<PersistentVolume>,
    (heartbeat, stall): (Heartbeat, Duration),
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<CachedPv>) + Send + 'static,
) -> anyhow::Result<()> {
    let (store, writer) = reflector::store::<CachedPv>();
    let workers = u16::try_from(ctx.config.workers.max(1)).unwrap_or(u16::MAX);
    // Held by this future: dropped (and the heartbeat task aborted) with the loop.
    let mut beater = tokio::task::JoinSet::new();
    if let Some(metrics) = ctx.queue_metrics.clone() {
        let period = common::runtime::health::beat_period(stall);
        // Stalled: every reconcile slot busy for longer than `stall`.
        let stalled = move || metrics.stalled_when_busy(usize::from(workers));
        let beat = common::runtime::health::beat_while_progressing;
        beater.spawn(beat(heartbeat, period, stall, stalled, shutdown.clone()));
    }
    let trigger = pv_events(Arc::clone(&ctx), api, writer, store.clone(), on_synced);
    let mut controller = Controller::for_stream(trigger, store)
        .with_config(controller::Config::default().concurrency(workers))
        .graceful_shutdown_on(async move { shutdown.cancelled_owned().await });
    if let Some(tick) = resync_interval(ctx.config.resync_period) {
        let ticks = futures::stream::unfold(tick, |mut tick| async move {
            tick.tick().await;
            Some(((), tick))
        });
        controller = controller.reconcile_all_on(ticks);
    }
    let results = controller.run(reconcile, error_policy, ctx);
    results
        .for_each(|result| async move { log_outcome(result) })
        .await;
    tracing::info!("PV controller stopped");
    Ok(())
}

/// The PVs the reflector applies (all PVs, as [`CachedPv`]), after
/// [`Context::observe`], `on_synced` once the first list is in, and the queue's adds.
fn pv_events(
    ctx: Arc<Context>,
    api: Api<PersistentVolume>,
    writer: reflector::store::Writer<CachedPv>,
    store: Store<CachedPv>,
    on_synced: impl FnOnce(&Store<CachedPv>) + Send + 'static,
) -> impl futures::Stream<Item = Result<CachedPv, watcher::Error>> + Send + 'static {
    let cached_api = Api::<CachedPv>::all(api.into_client());
    let queue_metrics = ctx.queue_metrics.clone();
    let mut on_synced = Some(on_synced);
    reflector::reflector(writer, watcher(cached_api, watcher::Config::default()))
        .backoff(watch_backoff())
        .inspect(move |event| match event {
            Ok(event) => {
                ctx.observe(event, &store);
                let first_list = matches!(event, watcher::Event::InitDone);
                if let Some(f) = on_synced.take_if(|_| first_list) {
                    tracing::info!(pvs = store.state().len(), "PV reflector synced");
                    f(&store);
                }
            }
            Err(error) => tracing::warn!(%error, "PV watch failed, retrying"),
        })
        .applied_objects()
        .inspect(move |pv| {
            if let (Ok(_), Some(m)) = (pv, &queue_metrics) {
                m.add();
            }
        })
}

/// Log what `Controller` reports beyond [`error_policy`].
fn log_outcome<T>(result: Result<T, controller::Error<SyncError, watcher::Error>>) {
    match result {
        Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
        Err(controller::Error::ObjectNotFound(obj)) => {
            tracing::debug!(pv = %obj.name, "PV gone before its sync")
        }
        Err(error) => tracing::warn!(%error, "PV controller"),
    }
}

/// What a leader term needs besides the [`ServiceContext`]; cloned per term.
#[derive(Clone)]
pub struct TermDeps {
    /// The backend whose volumes are reclaimed.
    pub backend: Arc<dyn Provisioner>,
    /// Metrics, registered once per process.
    pub metrics: ReclaimMetrics,
    /// `--retry-qps`/`--retry-burst`.
    pub retry: RetryArgs,
    /// reclaim-svc's own flags.
    pub reclaim: ReclaimArgs,
}

/// One leader term: the PV control loop and, once the reflector has synced
/// (readiness), one orphan sweep; a new reflector and reclaimer each term.
/// Errors: as [`run_loop`].
pub async fn run_term(ctx: ServiceContext, deps: TermDeps) -> anyhow::Result<()> {
    let TermDeps {
        backend,
        metrics,
        retry,
        reclaim,
    } = deps;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let events = EventSink::new(ctx.client.clone(), ctx.spec.name, &ctx.identity);
    let (provisioner, add) = (ctx.args.provisioner_name.clone(), reclaim.add_finalizer);
    let reclaimer = Reclaimer::new(
        api.clone(),
        backend.clone(),
        Arc::new(events),
        metrics.delete,
        provisioner,
        add,
    )
    .with_term(ctx.term.clone());
    let config = LoopConfig {
        workers: ctx.args.worker_threads_for(crate::SPEC),
        threshold: FailureThreshold(reclaim.failed_delete_threshold),
        deletion_timeout: reclaim.deletion_timeout,
        resync_period: reclaim.resync_period,
    };
    tracing::info!(provisioner = %ctx.args.provisioner_name, add_finalizer = add, failed_delete_threshold = reclaim.failed_delete_threshold, workers = config.workers, "starting PV reclaim loop");
    let loop_ctx = Arc::new(Context {
        reclaimer: Arc::new(reclaimer),
        retry: Arc::new(RetryPolicy::from_args(
            ctx.args.retry_backoff(crate::SPEC),
            &retry,
        )),
        config,
        queue_metrics: Some(metrics.queue),
    });
    let readiness = ctx.readiness.clone();
    let (synced_tx, synced_rx) = tokio::sync::oneshot::channel::<Store<CachedPv>>();
    let on_synced = move |store: &Store<CachedPv>| {
        readiness.set_ready(true);
        let _ = synced_tx.send(store.clone());
    };
    let job = sweep::SweepJob {
        redis: ctx.args.redis(),
        provisioner_name: ctx.args.provisioner_name.clone(),
        pvs: api.clone(),
        backend,
        archive: reclaim.sweep_orphans,
        min_age: reclaim.sweep_min_age,
        shutdown: ctx.shutdown.clone(),
        metrics: metrics.sweep,
        reporter: ctx.identity.clone(),
    };
    // The sweep is part of this future: it stops with the term.
    let sweep_shutdown = ctx.shutdown.clone();
    let sweep_task = async move {
        let Ok(store) = synced_rx.await else { return };
        let cached = move |name: &str| store.get(&ObjectRef::new(name)).is_some();
        tokio::select! {
            _ = sweep_shutdown.cancelled() => {}
            _ = sweep::run_once(job, cached) => {}
        }
    };
    let liveness = (ctx.heartbeat.clone(), ctx.args.healthz_stall_timeout);
    let control_loop = run_loop(loop_ctx, api, liveness, ctx.shutdown.clone(), on_synced);
    tokio::pin!(control_loop, sweep_task);
    tokio::select! {
        result = &mut control_loop => result,
        () = &mut sweep_task => control_loop.await,
    }
}
