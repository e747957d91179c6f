//! The PV control loop on kube-runtime's [`Controller`] (as kube-rs'
//! `controller-rs` example): a reflector over all PVs (kept as [`CachedPv`]:
//! identity typed, the whole PV as compact JSON) triggers [`reconcile`] per
//! PV name, at most
//! `--worker-threads` at a time and never twice at once for one PV; failures go
//! through [`error_policy`] with the seed's `processNextVolumeWorkItem` retry
//! semantics (per-PV exponential backoff `--retry-interval-start` doubling to
//! `--retry-interval-max`, capped overall by `--retry-qps`/`--retry-burst`, given
//! up after `--failed-delete-threshold` until the PV changes). A PV that is
//! gone is dropped: `Controller` only reconciles names still in its store, and
//! the delete event forgets the PV's retry state ([`Context::observe`], seed
//! `forgetVolume`).
//!
//! Why `Controller` here and not [`common::kube::workqueue`]: a PV's work item is
//! its name, and once the PV is gone there is nothing left to do, which is
//! exactly the `Controller` model. provision-svc keeps the hand-written queue
//! because its claims are keyed by uid and must outlive the cache.
//!
//! With [`run_loop_observed`] the loop reports client-go's `workqueue_*`
//! series (`name="volumes"`: adds = PV changes fed to the `Controller`,
//! retries = requeues by [`error_policy`], work duration and unfinished work
//! from [`reconcile`]; `Controller`'s scheduler does not expose its depth, so
//! `workqueue_depth` and the queue duration stay unobserved) and beats the
//! runtime's liveness heartbeat unless every reconcile slot has been busy for
//! `--healthz-stall-timeout` ([`common::runtime::health`]).

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

use crate::operation::{Reclaimer, SyncError};
use common::kube::workqueue_metrics::WorkQueueMetrics;
use common::runtime::health::Heartbeat;

/// A PV as the PV cache holds it: its identity (name, uid, resourceVersion)
/// typed, the whole PV (minus `managedFields` and the last-applied
/// annotation) as compact JSON, decoded by [`reconcile`] for each sync
/// ([`Compact`]). A k8s-openapi `PersistentVolume` is a few KB as a Rust
/// value (its spec holds every volume source inline); 5,000 of them were the
/// largest item of reclaim-svc's heap.
pub type CachedPv = Compact<PersistentVolume>;

/// What the loop reports to, besides logs: [`run_loop_observed`].
#[derive(Clone)]
pub struct LoopObservers {
    /// The PV queue's `workqueue_*` series (`name="volumes"`).
    pub queue_metrics: WorkQueueMetrics,
    /// The runtime's work-loop heartbeat (`ServiceContext::heartbeat`).
    pub heartbeat: Heartbeat,
    /// `--healthz-stall-timeout`: stop beating once PVs have waited this long
    /// with no worker taking one.
    pub stall_timeout: Duration,
}

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

/// What [`reconcile`] and [`error_policy`] share: the operation, the per-PV
/// retry state (keyed by PV name) and the loop's tuning.
pub struct Context {
    /// Runs the seed's sync and delete operation.
    pub reclaimer: Arc<Reclaimer>,
    /// Per-PV failure counts and backoff.
    pub retry: Arc<RetryPolicy<String>>,
    /// Threshold, deletion timeout, workers, resync.
    pub config: LoopConfig,
    /// client-go's `workqueue_*` series of the PV queue (`name="volumes"`),
    /// when observed ([`run_loop_observed`]).
    pub queue_metrics: Option<WorkQueueMetrics>,
}

impl Context {
    /// Bookkeeping on a watch event before `Controller` sees it: a deleted PV's
    /// retry state and remembered uid are forgotten (seed `forgetVolume`); after
    /// a (re-)list, uids of PVs no longer present are dropped.
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

/// Sync one PV (seed `syncVolume` under `--deletion-timeout`) on the whole
/// PV decoded from the cache. Success forgets the PV's failures and waits for
/// its next change (or the resync).
///
/// Errors: [`SyncError`], handed to [`error_policy`].
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

/// The seed's retry rule for a failed sync: requeue after the policy's delay
/// while the threshold allows (failures before this one < threshold), else give
/// up until the PV changes; the failures are kept — "Done but do not Forget" —
/// until the PV is deleted, so later updates get one try each.
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

/// Run the loop until `shutdown` fires: watch PVs, reconcile changed ones,
/// resync every PV each `config.resync_period`. Calls `on_synced` once, after
/// the first complete list of PVs is in the store (report readiness there);
/// in-flight syncs finish before this returns (`Controller`'s graceful
/// shutdown). Reconciles run as tasks `Controller` cancels when this future is
/// dropped (the runtime aborting the work loop on a lost Lease).
///
/// Errors: none once running (watch errors are retried with backoff).
pub async fn run_loop(
    api: Api<PersistentVolume>,
    reclaimer: Arc<Reclaimer>,
    retry: Arc<RetryPolicy<String>>,
    config: LoopConfig,
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<CachedPv>) + Send + 'static,
) -> anyhow::Result<()> {
    run_loop_in(None, api, reclaimer, retry, config, shutdown, on_synced).await
}

/// [`run_loop`] reporting to `observers` (queue metrics, liveness heartbeat).
///
/// Errors: as [`run_loop`].
pub async fn run_loop_observed(
    observers: LoopObservers,
    api: Api<PersistentVolume>,
    reclaimer: Arc<Reclaimer>,
    retry: Arc<RetryPolicy<String>>,
    config: LoopConfig,
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<CachedPv>) + Send + 'static,
) -> anyhow::Result<()> {
    run_loop_in(
        Some(observers),
        api,
        reclaimer,
        retry,
        config,
        shutdown,
        on_synced,
    )
    .await
}

#[allow(clippy::too_many_arguments)]
async fn run_loop_in(
    observers: Option<LoopObservers>,
    api: Api<PersistentVolume>,
    reclaimer: Arc<Reclaimer>,
    retry: Arc<RetryPolicy<String>>,
    config: LoopConfig,
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<CachedPv>) + Send + 'static,
) -> anyhow::Result<()> {
    let (store, writer) = reflector::store::<CachedPv>();
    // The same PVs through the compact type (`api` is cluster-wide: PVs have
    // no namespace).
    let cached_api = Api::<CachedPv>::all(api.into_client());
    let workers = u16::try_from(config.workers.max(1)).unwrap_or(u16::MAX);
    let resync = resync_interval(config.resync_period);
    let queue_metrics = observers.as_ref().map(|o| o.queue_metrics.clone());
    let ctx = Arc::new(Context {
        reclaimer,
        retry,
        config,
        queue_metrics: queue_metrics.clone(),
    });
    // Held by this future: dropped (and the heartbeat task aborted) with the loop.
    let mut beater = tokio::task::JoinSet::new();
    if let Some(o) = observers {
        let metrics = o.queue_metrics.clone();
        let workers = usize::from(workers);
        beater.spawn(common::runtime::health::beat_while_progressing(
            o.heartbeat,
            common::runtime::health::beat_period(o.stall_timeout),
            o.stall_timeout,
            // Stalled: every reconcile slot busy for longer than the timeout
            // (PVs may wait and no slot frees up); idle or moving is healthy.
            move || metrics.stalled_when_busy(workers),
            shutdown.clone(),
        ));
    }

    let mut on_synced = Some(on_synced);
    let (hook_ctx, hook_store) = (Arc::clone(&ctx), store.clone());
    let trigger = reflector::reflector(writer, watcher(cached_api, watcher::Config::default()))
        .backoff(watch_backoff())
        .inspect(move |event| match event {
            Ok(event) => {
                hook_ctx.observe(event, &hook_store);
                if matches!(event, watcher::Event::InitDone) {
                    if let Some(f) = on_synced.take() {
                        tracing::info!(
                            pvs = hook_store.state().len(),
                            "PV reflector synced; reconciling"
                        );
                        f(&hook_store);
                    }
                }
            }
            Err(err) => {
                tracing::warn!(error = %err, "PV watch failed; the reflector retries with backoff")
            }
        })
        .applied_objects()
        .inspect(move |pv| {
            if let (Ok(_), Some(m)) = (pv, &queue_metrics) {
                m.add();
            }
        });

    let mut controller = Controller::for_stream(trigger, store)
        .with_config(controller::Config::default().concurrency(workers))
        .graceful_shutdown_on(async move { shutdown.cancelled_owned().await });
    if let Some(tick) = resync {
        let ticks = futures::stream::unfold(tick, |mut tick| async move {
            tick.tick().await;
            Some(((), tick))
        });
        controller = controller.reconcile_all_on(ticks);
    }
    controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| async move {
            match result {
                Ok(_) => {}
                // Logged by `error_policy`.
                Err(controller::Error::ReconcilerFailed(..)) => {}
                // The PV was deleted before its turn: nothing to do.
                Err(controller::Error::ObjectNotFound(obj)) => {
                    tracing::debug!(pv = %obj.name, "PV gone before its sync")
                }
                Err(err) => tracing::warn!(error = %err, "PV controller"),
            }
        })
        .await;
    tracing::info!("PV controller stopped; in-flight syncs finished");
    Ok(())
}
