//! The leader's work loop: reflectors for claims, StorageClasses and PVs, the
//! start-up walk over intents, the claim work queue and its workers (seed
//! `processNextClaimWorkItem`: [`ClaimQueue`], [`process`]) and the periodic
//! resync. Health: the queue's stall time beats the runtime's heartbeat, and
//! readiness follows a Redis probe every [`REDIS_PROBE_INTERVAL`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use common::handoff::intents::IntentStore;
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::kube::cache::{strip_for_cache, watch_backoff, NameSet};

use crate::ports::SignedQueue;
use common::kube::retry::{Backoff, FailureThreshold, RetryPolicy};
use common::runtime::config::resync_interval;
use common::runtime::frame::ServiceContext;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use provisioner_api::Provisioner;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::ProvisionArgs;
use crate::decision;
use crate::decision::ProvisionerNames;
use crate::metrics::ServiceMetrics;
use crate::operation::{Caches, Operation, Ports, Settings};
use crate::ports::KubeCluster;
use crate::recovery::{self, ClaimRequeue, Recovery};
use common::kube::workqueue::WorkQueue;

pub use crate::operation::CachedClaim;

/// The claim work queue (keyed by claim uid) with its per-claim retry state
/// and the uid → claim index the claim watch keeps.
pub struct ClaimQueue {
    queue: WorkQueue,
    retry: RetryPolicy<String>,
    claims: Store<CachedClaim>,
    uid_index: Mutex<HashMap<String, ObjectRef<CachedClaim>>>,
}

impl ClaimQueue {
    /// A queue over the claims cache `claims`, retrying under `retry`; `queue`
    /// is the work queue of claim uids (with its `workqueue_*` metrics).
    pub fn new(claims: Store<CachedClaim>, retry: RetryPolicy<String>, queue: WorkQueue) -> Self {
        Self {
            queue,
            retry,
            claims,
            uid_index: Mutex::default(),
        }
    }

    /// The work queue of claim uids.
    pub fn queue(&self) -> &WorkQueue {
        &self.queue
    }

    fn index(&self) -> std::sync::MutexGuard<'_, HashMap<String, ObjectRef<CachedClaim>>> {
        self.uid_index.lock().expect("uid index poisoned")
    }

    /// Note a claim seen by the claim watch and queue it (seed `enqueueClaim`).
    pub fn claim_seen(&self, claim: &CachedClaim) {
        let Some(uid) = claim.meta().uid.clone() else {
            return;
        };
        self.index().insert(uid.clone(), claim_ref(claim));
        self.queue.add(&uid);
    }

    /// Queue a deleted claim's uid: [`process`] finds it gone and deletes the
    /// volume of a PV write still queued for it
    /// ([`recovery::cleanup_unwritten_volume`]).
    pub fn claim_deleted(&self, claim: &CachedClaim) {
        if let Some(uid) = claim.meta().uid.as_deref() {
            self.queue.add(uid);
        }
    }

    /// The claim with `uid` in the claims cache, decoded (a copy the caller owns).
    pub fn claim_by_uid(&self, uid: &str) -> Option<PersistentVolumeClaim> {
        let indexed = self.index().get(uid).cloned();
        let by_ref = indexed
            .and_then(|r| self.claims.get(&r))
            .filter(|c| c.meta().uid.as_deref() == Some(uid));
        let cached = by_ref.or_else(|| {
            let found = self.claims.find(|c| c.meta().uid.as_deref() == Some(uid))?;
            self.index()
                .insert(uid.to_string(), claim_ref(found.as_ref()));
            Some(found)
        })?;
        Some(cached.object())
    }
}

impl ClaimRequeue for ClaimQueue {
    fn restore_in_background(&self, op: &Operation, claim: PersistentVolumeClaim) {
        if let Some(uid) = claim.metadata.uid.clone() {
            op.in_background.insert(&uid, &claim);
            self.queue.add(&uid);
        }
    }

    fn requeue_if_cached(&self, uid: &str) -> bool {
        let cached = self.claim_by_uid(uid).is_some();
        if cached {
            self.queue.add(uid);
        }
        cached
    }
}

/// The store key of a cached claim: namespace and name only (the index maps a
/// uid to it and checks the uid on lookup, so the reference needs no copy of
/// the uid or resourceVersion).
fn claim_ref(claim: &CachedClaim) -> ObjectRef<CachedClaim> {
    let meta = claim.meta();
    let r = ObjectRef::new(meta.name.as_deref().unwrap_or_default());
    match meta.namespace.as_deref() {
        Some(ns) => r.within(ns),
        None => r,
    }
}

/// Seed `processNextClaimWorkItem` + `syncClaimHandler` for one claim uid:
/// sync the cached claim (or its in-background snapshot) through `op`, then
/// forget it on success, or requeue it with backoff while the failure
/// threshold allows.
pub async fn process(op: &Operation, claims: &ClaimQueue, uid: &str) {
    let claim = match claims.claim_by_uid(uid) {
        Some(c) => c,
        None => match op.in_background.get(uid) {
            Some(c) => c,
            None => {
                tracing::debug!(claim_uid = uid, "claim in work queue no longer exists");
                recovery::cleanup_unwritten_volume(op, uid).await;
                claims.index().remove(uid);
                claims.retry.forget(&uid.to_string());
                op.forget_first_attempt(uid);
                return;
            }
        },
    };
    let key = uid.to_string();
    let span = tracing::info_span!(
        "claim",
        claim = %decision::claim_key(&claim),
        claim_uid = uid,
        class = %decision::claim_class(&claim),
        attempt = claims.retry.requeues(&key) + 1,
    );
    process_claim(op, claims, uid, claim).instrument(span).await
}

/// [`process`] for one resolved claim, inside its `claim` span.
async fn process_claim(
    op: &Operation,
    claims: &ClaimQueue,
    uid: &str,
    claim: PersistentVolumeClaim,
) {
    let result = op.sync(&claim).await;
    let key = uid.to_string();
    match result {
        Ok(()) => {
            claims.retry.forget(&key);
            op.forget_first_attempt(uid);
            op.done_with(uid, &claim).await;
        }
        Err(err) => {
            let requeues = claims.retry.requeues(&key);
            let threshold = op.settings.failure_threshold;
            if threshold.allows_retry(requeues) {
                let delay = claims.retry.next_delay(&key);
                tracing::warn!(failures = requeues, ?delay, error = %err, "retrying syncing claim");
                claims.queue.add_rate_limited(uid, delay);
            } else {
                tracing::error!(failures = requeues, threshold = threshold.0, error = %err,
                    "giving up syncing claim; its provisioning intent (if any) is kept for the next leader's start-up walk");
                // Done but not forgotten: the count stays until the claim is gone.
                op.forget_first_attempt(uid);
                op.done_with(uid, &claim).await;
            }
        }
    }
}

/// How often the leader checks that Redis answers, for `/readyz`.
pub const REDIS_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// Settings of the claim logic from the flags.
pub fn settings(args: &ProvisionArgs) -> Settings {
    Settings {
        names: ProvisionerNames {
            name: args.common.provisioner_name.clone(),
            additional: args.additional_provisioners.clone(),
        },
        add_finalizer: args.add_finalizer,
        failure_threshold: FailureThreshold(args.failed_provision_threshold),
        provision_timeout: args.provision_timeout,
    }
}

/// Retry a Redis call every `--redis-reconnect-period` until it succeeds or
/// `shutdown` fires (`None`).
async fn connect_with_retry<T, E: std::fmt::Display, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    policy: Backoff,
    connect: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    policy
        .retry(shutdown, connect, |e, _, _| {
            tracing::warn!(error = %e, "cannot connect to Redis for the {what}; retrying")
        })
        .await
}

/// Call `on_tick` every `period` (first one `period` from now) until `stop`
/// fires; `period` zero (`--resync-period=0s`) means no resync: returns at
/// once.
async fn resync(period: Duration, stop: CancellationToken, mut on_tick: impl FnMut()) {
    let Some(mut tick) = resync_interval(period) else {
        tracing::info!("--resync-period=0s: claims are not resynced");
        return;
    };
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tick.tick() => on_tick(),
        }
    }
}

/// Drive a reflector stream, logging watch errors (the stream backs off and
/// re-lists by itself); `on_event` sees every applied event.
async fn drive<K, S>(kind: &'static str, stream: S, mut on_event: impl FnMut(&watcher::Event<K>))
where
    S: Stream<Item = Result<watcher::Event<K>, watcher::Error>>,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(item) = stream.next().await {
        match item {
            Ok(ev) => on_event(&ev),
            // An unreachable API server is logged once by the client.
            Err(e) if common::runtime::api_reachability::unreachable_cause(&e).is_some() => {
                tracing::debug!(kind, error = %e, "watch failed; the reflector retries")
            }
            Err(e) => tracing::warn!(kind, error = %e, "watch failed; the reflector retries"),
        }
    }
}

/// The work loop run while leading: see the module docs. Returns after
/// `ctx.shutdown` fires and in-flight claims finished.
///
/// Errors: none once running (Redis and API failures are retried); returns
/// early only if shut down during start-up.
pub async fn work(
    ctx: ServiceContext,
    args: ProvisionArgs,
    backend: Arc<dyn Provisioner>,
    metrics: ServiceMetrics,
    queue_key: Option<QueueKey>,
) -> anyhow::Result<()> {
    let shutdown = ctx.shutdown.clone();
    let claim_writer = Writer::<CachedClaim>::default();
    // The one claim queue: the workers take from it and the stall detector
    // below watches it.
    let claims = Arc::new(ClaimQueue::new(
        claim_writer.as_reader(),
        RetryPolicy::from_args(args.common.retry_backoff(crate::SPEC), &args.retry),
        WorkQueue::with_metrics(metrics.queue.clone()),
    ));
    // The heartbeat runs from the start (waiting for Redis, the first lists or
    // the start-up walk is not a stall: keys wait then, but no worker runs
    // yet), owned by this future like every task below.
    let workers_started = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut beater = tokio::task::JoinSet::new();
    {
        let stall = args.common.healthz_stall_timeout;
        let (claims, started) = (claims.clone(), workers_started.clone());
        beater.spawn(common::runtime::health::beat_while_progressing(
            ctx.heartbeat.clone(),
            common::runtime::health::beat_period(stall),
            stall,
            move || {
                if started.load(std::sync::atomic::Ordering::SeqCst) {
                    claims.queue().stalled_for()
                } else {
                    Duration::ZERO
                }
            },
            shutdown.clone(),
        ));
    }
    let name = args.common.provisioner_name.clone();
    let redis = args.common.redis();
    let period = args.common.redis_reconnect();
    let Some(pv_queue) = connect_with_retry("PV-write queue", &shutdown, period, || {
        PvQueue::connect(&redis, &name)
    })
    .await
    else {
        return Ok(());
    };
    let Some(intents) = connect_with_retry("provisioning intents", &shutdown, period, || {
        IntentStore::connect(&redis, &name)
    })
    .await
    else {
        return Ok(());
    };

    let client = ctx.client.clone();
    let class_writer = Writer::<StorageClass>::default();
    let volume_names = NameSet::default();
    let caches = Caches {
        claims: claim_writer.as_reader(),
        classes: class_writer.as_reader(),
        volumes: volume_names.clone(),
    };
    let (cluster, event_publisher) = KubeCluster::new(client.clone(), ctx.spec.name, &ctx.identity);
    let op = Arc::new(Operation::new(
        settings(&args),
        caches.clone(),
        Ports {
            backend,
            cluster: Arc::new(cluster),
            handoff: Arc::new(SignedQueue::new(pv_queue, queue_key, &name)),
            intents: Arc::new(intents.clone()),
        },
        metrics.clone(),
    ));

    let watch_cfg = watcher::Config::default();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let claims = claims.clone();
        let stream = reflector::reflector(
            claim_writer,
            // Compact claims (the whole claim as JSON, decoded when worked on):
            // a k8s-openapi claim is several times its JSON size.
            watcher(Api::<CachedClaim>::all(client.clone()), watch_cfg.clone()),
        )
        .backoff(watch_backoff());
        tasks.spawn(drive("PersistentVolumeClaim", stream, move |ev| match ev {
            watcher::Event::Apply(c) | watcher::Event::InitApply(c) => claims.claim_seen(c),
            // A claim in background is still retried (seed); any other deleted
            // claim is processed once more for its unwritten volume.
            watcher::Event::Delete(c) => claims.claim_deleted(c),
            _ => {}
        }));
    }
    tasks.spawn(drive(
        "StorageClass",
        reflector::reflector(
            class_writer,
            watcher(Api::<StorageClass>::all(client.clone()), watch_cfg.clone())
                .modify(strip_for_cache),
        )
        .backoff(watch_backoff()),
        |_| {},
    ));
    tasks.spawn(drive(
        "PersistentVolume",
        // Metadata only (an `Api<PartialObjectMeta<_>>` lists and watches
        // with the metadata-only media type), and of that only the names: the
        // claim logic asks whether `pvc-<uid>` exists.
        watcher(
            Api::<PartialObjectMeta<PersistentVolume>>::all(client.clone()),
            watch_cfg,
        )
        .backoff(watch_backoff()),
        move |ev| volume_names.apply_watcher_event(ev),
    ));

    let synced = async {
        caches.claims.wait_until_ready().await?;
        caches.classes.wait_until_ready().await?;
        caches.volumes.wait_until_ready().await;
        Ok::<(), reflector::store::WriterDropped>(())
    };
    tokio::select! {
        _ = shutdown.cancelled() => { tasks.abort_all(); return Ok(()); }
        r = synced => r.context("a reflector stopped before its first list")?,
    }
    tracing::info!("reflectors synced (claims, StorageClasses, PVs)");

    // Start-up walk over the recorded intents.
    let Some(entries) = connect_with_retry("start-up walk over intents", &shutdown, period, || {
        intents.list_with_claims()
    })
    .await
    else {
        tasks.abort_all();
        return Ok(());
    };
    let stored = intents.count().await.unwrap_or(entries.len());
    metrics.intents.set(stored as i64);
    // Unreadable records were logged and skipped by the listing; they stay in
    // Redis (and keep protecting their asset from the orphan sweep).
    let unreadable = stored.saturating_sub(entries.len());
    if unreadable > 0 {
        metrics.poisoned_intents.inc_by(unreadable as u64);
        tracing::error!(unreadable, "provisioning intents in Redis cannot be read; they are kept for an operator and skipped by the start-up walk");
    }
    let decisions = recovery::walk(&op, &claims, &entries).await;
    let cleanups: Vec<_> = entries
        .into_iter()
        .zip(decisions)
        .filter(|(_, (_, d))| *d == Recovery::Cleanup)
        .map(|(e, _)| e)
        .collect();
    if !cleanups.is_empty() {
        tasks.spawn(recovery::cleanup_all(
            op.clone(),
            cleanups,
            args.common.retry_backoff(crate::SPEC),
            shutdown.clone(),
        ));
    }
    ctx.readiness.set_ready(true);
    tasks.spawn(probe_redis(
        intents.clone(),
        ctx.readiness.clone(),
        shutdown.clone(),
    ));
    tracing::info!(
        workers = args.worker_threads(),
        "started provisioning claims"
    );

    // Resync: queue every cached claim (and every claim in background) again.
    {
        let (op, claims, cache) = (op.clone(), claims.clone(), caches.claims.clone());
        tasks.spawn(resync(args.resync_period, shutdown.clone(), move || {
            for claim in cache.state() {
                claims.claim_seen(&claim);
            }
            for uid in op.in_background.uids() {
                claims.queue().add(&uid);
            }
        }));
    }

    let mut workers = tokio::task::JoinSet::new();
    workers_started.store(true, std::sync::atomic::Ordering::SeqCst);
    for _ in 0..args.worker_threads() {
        let (op, claims) = (op.clone(), claims.clone());
        workers.spawn(async move {
            while let Some(uid) = claims.queue().get().await {
                process(&op, &claims, &uid).await;
                claims.queue().done(&uid);
            }
        });
    }

    shutdown.cancelled().await;
    tracing::info!("shutting down: finishing in-flight claims");
    claims.queue().shut_down();
    while workers.join_next().await.is_some() {}
    tasks.abort_all();
    ctx.readiness.set_ready(false);
    drop(op);
    // The publisher ends once the last event sender (the operation's cluster) is gone.
    let _ = tokio::time::timeout(Duration::from_secs(5), event_publisher).await;
    Ok(())
}

/// Report readiness from Redis every [`REDIS_PROBE_INTERVAL`] until `shutdown`:
/// not ready while it does not answer within the interval, ready again once it
/// does (claims are then retried by their backoff or the next resync).
async fn probe_redis(
    intents: IntentStore,
    readiness: common::runtime::http::Readiness,
    shutdown: CancellationToken,
) {
    let mut up = true;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REDIS_PROBE_INTERVAL) => {}
        }
        let answered = matches!(
            tokio::time::timeout(REDIS_PROBE_INTERVAL, intents.count()).await,
            Ok(Ok(_))
        );
        if answered != up {
            if answered {
                tracing::info!("Redis reachable again; ready");
            } else {
                tracing::warn!("Redis unreachable; not ready (provisioning needs the PV-write queue and intents)");
            }
            up = answered;
        }
        if !shutdown.is_cancelled() {
            readiness.set_ready(answered);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `--resync-period=0s` is "off": the resync task ends quietly instead of
    /// panicking (it used to build `interval_at(now, 0s)`, which panics).
    #[tokio::test(start_paused = true)]
    async fn resync_period_zero_turns_resync_off() {
        let stop = CancellationToken::new();
        let task = tokio::spawn(resync(Duration::ZERO, stop.clone(), || {
            panic!("no resync when off")
        }));
        task.await.expect("resync task must not panic");
    }

    #[tokio::test(start_paused = true)]
    async fn resync_ticks_every_period_until_stopped() {
        let stop = CancellationToken::new();
        let ticks = Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counted = ticks.clone();
        let task = tokio::spawn(resync(Duration::from_secs(60), stop.clone(), move || {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        }));
        tokio::time::sleep(Duration::from_secs(59)).await;
        assert_eq!(ticks.load(std::sync::atomic::Ordering::SeqCst), 0);
        tokio::time::sleep(Duration::from_secs(2 * 60)).await;
        assert_eq!(ticks.load(std::sync::atomic::Ordering::SeqCst), 2);
        stop.cancel();
        task.await.unwrap();
    }
}
