//! The PV control loop: a reflector over all PVs feeds a [`WorkQueue`] keyed
//! by PV name; `--worker-threads` workers sync PVs with the seed's
//! `processNextVolumeWorkItem` retry semantics. With [`run_loop_observed`], the
//! queue reports client-go's `workqueue_*` metrics (`name="volumes"`) and the
//! loop beats the runtime's liveness heartbeat while workers take PVs or none
//! wait ([`common::health`]).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use common::cache::strip_for_cache;
use common::deadline::Deadline;
use common::retry::{FailureThreshold, RetryPolicy};
use futures::StreamExt;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::operation::{Reclaimer, SyncError};
use common::health::Heartbeat;
use common::workqueue::WorkQueue;
use common::workqueue_metrics::WorkQueueMetrics;

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
    /// Concurrent workers (seed threadiness).
    pub workers: usize,
    /// Give up a PV after this many failed syncs (0 = never).
    pub threshold: FailureThreshold,
    /// Upper bound of one sync; zero = unlimited (seed `deletionTimeout`).
    pub deletion_timeout: Duration,
    /// Every PV is queued again this often; zero disables (seed resync period).
    pub resync_period: Duration,
}

/// Sync one PV named `key` from `store` and apply the seed's retry rules:
/// success → forget its failures; failure → requeue after the policy's delay
/// while `threshold` allows, else give up (failures are kept — "Done but do not
/// Forget" — until the PV is deleted, so later updates get one try each).
pub async fn process_item(
    key: &str,
    store: &Store<PersistentVolume>,
    reclaimer: &Reclaimer,
    queue: &WorkQueue,
    retry: &RetryPolicy<String>,
    config: &LoopConfig,
) -> Result<(), SyncError> {
    let result = match store.get(&ObjectRef::new(key)) {
        // Already deleted, nothing to do anymore.
        None => Ok(()),
        Some(volume) => {
            if config.deletion_timeout.is_zero() {
                reclaimer.sync_volume(&volume).await
            } else {
                let deadline = Deadline::after(config.deletion_timeout);
                reclaimer.sync_volume_within(&volume, deadline).await
            }
        }
    };
    let owned = key.to_string();
    match &result {
        Ok(()) => retry.forget(&owned),
        Err(err) => {
            let requeues = retry.requeues(&owned);
            if config.threshold.allows_retry(requeues) {
                let delay = retry.next_delay(&owned);
                tracing::warn!(pv = key, failures = requeues, threshold = config.threshold.0, ?delay, error = %err, "retrying syncing PV");
                queue.add_rate_limited(key, delay);
            } else {
                tracing::error!(pv = key, failures = requeues, threshold = config.threshold.0, error = %err, "giving up syncing PV");
            }
        }
    }
    result
}

/// Run the loop until `shutdown` fires: watch PVs, queue changed ones, resync
/// periodically, and sync them with `config.workers` workers. Calls `on_synced`
/// once, after the first complete list of PVs is in the store (report readiness
/// there); in-flight syncs finish before this returns. The workers live in a
/// `JoinSet` owned by this future, so dropping it (the runtime aborting the
/// work loop) aborts them too.
pub async fn run_loop(
    api: Api<PersistentVolume>,
    reclaimer: Arc<Reclaimer>,
    retry: Arc<RetryPolicy<String>>,
    config: LoopConfig,
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<PersistentVolume>) + Send,
) -> anyhow::Result<()> {
    run_loop_in(
        WorkQueue::new(),
        None,
        api,
        reclaimer,
        retry,
        config,
        shutdown,
        on_synced,
    )
    .await
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
    on_synced: impl FnOnce(&Store<PersistentVolume>) + Send,
) -> anyhow::Result<()> {
    let queue = WorkQueue::with_metrics(observers.queue_metrics.clone());
    run_loop_in(
        queue,
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
    queue: WorkQueue,
    observers: Option<LoopObservers>,
    api: Api<PersistentVolume>,
    reclaimer: Arc<Reclaimer>,
    retry: Arc<RetryPolicy<String>>,
    config: LoopConfig,
    shutdown: CancellationToken,
    on_synced: impl FnOnce(&Store<PersistentVolume>) + Send,
) -> anyhow::Result<()> {
    let (store, writer) = reflector::store::<PersistentVolume>();

    // Held by this future: if the runtime aborts the work loop (lost Lease,
    // grace period over), dropping the set aborts every worker with it.
    let mut workers = tokio::task::JoinSet::new();
    if let Some(o) = observers {
        let queue = queue.clone();
        workers.spawn(common::health::beat_while_progressing(
            o.heartbeat,
            common::health::beat_period(o.stall_timeout),
            o.stall_timeout,
            move || queue.stalled_for(),
            shutdown.clone(),
        ));
    }
    for _ in 0..config.workers.max(1) {
        let (store, reclaimer, queue, retry, config) = (
            store.clone(),
            Arc::clone(&reclaimer),
            queue.clone(),
            Arc::clone(&retry),
            config.clone(),
        );
        workers.spawn(async move {
            while let Some(key) = queue.get().await {
                let _ = process_item(&key, &store, &reclaimer, &queue, &retry, &config).await;
                queue.done(&key);
            }
        });
    }

    let stream = reflector::reflector(
        writer,
        watcher(api, watcher::Config::default()).modify(strip_for_cache),
    )
    .default_backoff();
    let mut stream = std::pin::pin!(stream);
    let mut resync = (!config.resync_period.is_zero()).then(|| {
        let mut i = tokio::time::interval(config.resync_period);
        i.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        i
    });
    let mut on_synced = Some(on_synced);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => break,
            _ = async { match resync.as_mut() { Some(i) => { i.tick().await; } None => std::future::pending().await } } => {
                if on_synced.is_none() {
                    for pv in store.state() {
                        queue.add(&pv.name_any());
                    }
                }
            }
            event = stream.next() => match event {
                None => anyhow::bail!("PV watch stream ended"),
                Some(Err(err)) => tracing::warn!(error = %err, "PV watch failed; the reflector retries with backoff"),
                Some(Ok(watcher::Event::Apply(pv))) => queue.add(&pv.name_any()),
                Some(Ok(watcher::Event::Delete(pv))) => {
                    // Seed forgetVolume: the PV is gone, drop its retry state.
                    retry.forget(&pv.name_any());
                    if let Some(uid) = pv.metadata.uid.as_deref() {
                        reclaimer.forget_uid(uid);
                    }
                }
                Some(Ok(watcher::Event::Init | watcher::Event::InitApply(_))) => {}
                Some(Ok(watcher::Event::InitDone)) => {
                    let state = store.state();
                    let alive: HashSet<String> =
                        state.iter().filter_map(|pv| pv.metadata.uid.clone()).collect();
                    reclaimer.retain_uids(|uid| alive.contains(uid));
                    for pv in &state {
                        queue.add(&pv.name_any());
                    }
                    if let Some(f) = on_synced.take() {
                        tracing::info!(pvs = state.len(), "PV reflector synced; workers started");
                        f(&store);
                    }
                }
            },
        }
    }

    tracing::info!("shutting down: finishing in-flight PV syncs");
    queue.shut_down();
    while workers.join_next().await.is_some() {}
    Ok(())
}
