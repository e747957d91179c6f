//! The claim control loop on kube-runtime's `Controller` ([`common::runtime::control`]):
//! a reflector of [`CachedClaim`]s triggers [`reconcile`] (seed `syncClaim`
//! under its retry rules, [`error_policy`]); a claim that is gone (deleted, or
//! absent from a (re)list) goes to [`clean_gone_claims`] ([`recovery`]).
//! [`run_term`] runs one leader term: Redis, the StorageClass and PV caches,
//! this loop, the cleanup and the Redis readiness probe. The only module that spawns.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use common::handoff::data_marker::DataMarker;
use common::handoff::intents::IntentStore;
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::kube::cache::{strip_for_cache, watch_backoff, NameSet};
use common::kube::retry::{Backoff, FailureThreshold, RetryPolicy};
use common::runtime::control::{self, LoopSettings};
use common::runtime::frame::ServiceContext;
use futures::{Stream, StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::controller::Action;
use kube::runtime::reflector::{self, store::Writer, ObjectRef};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use provisioner_api::Provisioner;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::config::ProvisionArgs;
use crate::decision::{self, ProvisionerNames};
use crate::metrics::ServiceMetrics;
use crate::operation::{Caches, OpError, Operation, Ports, Settings};
use crate::ports::{EffectError, KubeCluster, SignedQueue};
use crate::{recovery, resize};

pub use crate::operation::CachedClaim;

/// What [`reconcile`] and [`error_policy`] share.
pub struct Context {
    /// The claim operation (seed `syncClaim`).
    pub op: Arc<Operation>,
    /// Per-claim failure counts and backoff, keyed by claim uid.
    pub retry: RetryPolicy<String>,
}

/// What the claim watch tells [`clean_gone_claims`].
#[derive(Debug, Clone, PartialEq)]
pub enum Gone {
    /// This claim (its last state) was deleted.
    Claim(Box<PersistentVolumeClaim>),
    /// The claims were (re)listed: walk the intents for claims gone meanwhile.
    Walk,
}

/// Seed `syncClaimHandler` for one claim, holding its lock: sync it if still
/// cached; success forgets its failures, the threshold gives it up until it
/// changes. Errors: [`OpError`], retried by [`error_policy`].
pub async fn reconcile(cached: Arc<CachedClaim>, ctx: Arc<Context>) -> Result<Action, OpError> {
    let Some(uid) = cached.meta().uid.clone() else {
        return Ok(Action::await_change());
    };
    let op = &ctx.op;
    let _claim = op.locks.lock(&uid).await;
    // Deleted while waiting for the lock: the cleanup of gone claims has it.
    let current = op.caches.claims.get(&ObjectRef::from_obj(cached.as_ref()));
    let Some(current) = current.filter(|c| c.meta().uid.as_deref() == Some(uid.as_str())) else {
        return Ok(Action::await_change());
    };
    let claim = current.object();
    let requeues = ctx.retry.requeues(&uid);
    let span = tracing::info_span!(
        "claim",
        claim = %decision::claim_key(&claim),
        claim_uid = %uid,
        class = %decision::claim_class(&claim),
        attempt = requeues + 1,
    );
    let work = async {
        match resize::wanted(&claim, &op.settings.names) {
            Some(want) => resize::resize(op, &claim, want).await,
            None => op.sync(&claim).await,
        }
    };
    let result = work.instrument(span.clone()).await;
    let threshold = op.settings.failure_threshold;
    match result {
        Ok(()) => {
            ctx.retry.forget(&uid);
            op.forget_first_attempt(&uid);
            Ok(Action::await_change())
        }
        Err(e) if threshold.allows_retry(requeues) => Err(e),
        Err(e) => {
            span.in_scope(|| tracing::error!(failures = requeues, threshold = threshold.0, error = %e, "giving up syncing claim; its provisioning intent (if any) is kept"));
            // Done but not forgotten: the count stays until the claim is gone.
            op.give_up(&claim).await;
            Ok(Action::await_change())
        }
    }
}

/// The seed's retry rule for a failed sync: requeue after the claim's backoff.
pub fn error_policy(claim: Arc<CachedClaim>, err: &OpError, ctx: Arc<Context>) -> Action {
    let uid = claim.meta().uid.clone().unwrap_or_default();
    let failures = ctx.retry.requeues(&uid);
    let delay = ctx.retry.next_delay(&uid);
    tracing::warn!(claim = %claim.meta().name.as_deref().unwrap_or_default(), claim_uid = %uid, failures, ?delay, error = %err, "retrying syncing claim");
    Action::requeue(delay)
}

/// Clean up after the claims reported on `gone` until it closes: each gone claim once at a
/// time ([`recovery::claim_gone`]; a Delete arriving meanwhile runs after it), every walk's
/// gone claims too ([`recovery::walk`], retried under `policy`). Owns its tasks.
pub async fn clean_gone_claims(
    op: Arc<Operation>,
    mut gone: mpsc::UnboundedReceiver<Gone>,
    policy: Backoff,
    shutdown: CancellationToken,
) {
    let limit = Arc::new(tokio::sync::Semaphore::new(recovery::CLEANUP_CONCURRENCY));
    let mut tasks = tokio::task::JoinSet::new();
    // Uids with a cleanup running (by task), and the last state of a claim deleted meanwhile.
    let mut active: HashMap<String, Option<Box<PersistentVolumeClaim>>> = HashMap::new();
    let mut uids = HashMap::new();
    let mut first_walk = true;
    loop {
        let gone_claims: Vec<(String, Option<Box<PersistentVolumeClaim>>)> = tokio::select! {
            Some(done) = tasks.join_next_with_id(), if !tasks.is_empty() => {
                // A panicked cleanup decided nothing.
                let (id, decided) = done.unwrap_or_else(|e| (e.id(), false));
                let uid: String = uids.remove(&id).expect("every task's uid is kept");
                match active.remove(&uid) {
                    Some(Some(deleted)) if !decided => vec![(uid, Some(deleted))],
                    _ => continue,
                }
            }
            message = gone.recv() => match message {
                None => break,
                Some(Gone::Claim(claim)) => match claim.metadata.uid.clone() {
                    Some(uid) => vec![(uid, Some(claim))],
                    None => continue,
                },
                Some(Gone::Walk) => {
                    let count = std::mem::take(&mut first_walk);
                    let walk = || recovery::walk(&op, count);
                    let log = |e: &EffectError, _, _| tracing::warn!(error = %e, "cannot list the provisioning intents; retrying");
                    match policy.retry(&shutdown, walk, log).await {
                        Some(uids) => uids.into_iter().map(|uid| (uid, None)).collect(),
                        None => break,
                    }
                }
            },
        };
        for (uid, deleted) in gone_claims {
            if let Some(later) = active.get_mut(&uid) {
                if deleted.is_some() {
                    *later = deleted;
                }
                continue;
            }
            active.insert(uid.clone(), None);
            let (op, limit, shutdown) = (op.clone(), limit.clone(), shutdown.clone());
            let task = tasks.spawn({
                let uid = uid.clone();
                async move {
                    let deleted = deleted.as_deref();
                    recovery::claim_gone(&op, &uid, deleted, &limit, policy, &shutdown).await
                }
            });
            uids.insert(task.id(), uid);
        }
    }
    while tasks.join_next().await.is_some() {}
    for uid in active
        .into_iter()
        .filter_map(|(uid, later)| later.map(|_| uid))
    {
        tracing::warn!(claim_uid = %uid, left_to = "the orphan sweep", "shutting down before a deleted claim's cleanup");
    }
}

/// How often the leader checks that Redis answers, for `/readyz`.
pub const REDIS_PROBE_INTERVAL: Duration = Duration::from_secs(1);

/// How often the intent gauges are read from Redis.
pub const INTENT_GAUGES_INTERVAL: Duration = Duration::from_secs(5);

/// After a data loss, when every claim is reconciled once more: decisions of the first pass
/// may have read a demoted primary that still answered during the failover.
pub const RESCAN_AGAIN_AFTER: Duration = Duration::from_secs(30);

/// Drive a cache's watch stream, logging its errors ([`control::log_watch_error`]).
async fn drive<T>(kind: &'static str, stream: impl Stream<Item = Result<T, watcher::Error>>) {
    let log = |item: Result<T, _>| async move {
        if let Err(e) = item {
            control::log_watch_error(kind, &e);
        }
    };
    stream.for_each(log).await
}

/// What a leader term needs besides the [`ServiceContext`]; cloned per term.
#[derive(Clone)]
pub struct TermDeps {
    /// provision-svc's flags.
    pub args: ProvisionArgs,
    /// The backend that makes volumes.
    pub backend: Arc<dyn Provisioner>,
    /// Metrics, registered once per process.
    pub metrics: ServiceMetrics,
    /// The queue-signing key (`--queue-key-file`), if any.
    pub queue_key: Option<QueueKey>,
}

/// One leader term (see the module docs); a new operation, caches and
/// controller each term. Returns after `ctx.shutdown` fires and in-flight
/// syncs finished. Errors: a cache's reflector stopped before its first list.
pub async fn run_term(ctx: ServiceContext, deps: TermDeps) -> anyhow::Result<()> {
    let shutdown = ctx.shutdown.clone();
    let Some((pv_queue, intents)) = connect_redis(&ctx, &deps.args).await else {
        return Ok(());
    };
    let (claims, claim_writer) = reflector::store::<CachedClaim>();
    // The StorageClass and PV-name caches, owned by this future.
    let mut tasks = tokio::task::JoinSet::new();
    let Some(caches) = start_caches(&ctx, claims, &mut tasks).await? else {
        return Ok(());
    };
    let (cluster, publisher) = KubeCluster::new(ctx.client.clone(), ctx.spec.name, &ctx.identity);
    let event_publisher = tokio::spawn(publisher);
    let (args, metrics) = (deps.args, deps.metrics);
    let name = ctx.args.cluster.provisioner_name.clone();
    let settings = Settings {
        names: ProvisionerNames {
            name: name.clone(),
            additional: args.additional_provisioners.names.clone(),
        },
        add_finalizer: args.add_finalizer,
        failure_threshold: FailureThreshold(args.failed_provision_threshold),
        provision_timeout: args.provision_timeout,
    };
    let ports = Ports {
        backend: deps.backend,
        cluster: Arc::new(cluster),
        handoff: Arc::new(SignedQueue::new(pv_queue, deps.queue_key, &name)),
        intents: Arc::new(intents.clone()),
    };
    let op = Arc::new(Operation::new(
        settings,
        caches.clone(),
        ports,
        metrics.clone(),
    ));
    let loop_ctx = Arc::new(Context {
        op: op.clone(),
        retry: RetryPolicy::from_args(ctx.args.retry_backoff(crate::SPEC), &args.retry),
    });
    let (gone_tx, gone_rx) = mpsc::unbounded_channel();
    let listed = Arc::new(tokio::sync::Notify::new());
    let observe = observer(loop_ctx.clone(), gone_tx.clone(), listed.clone());
    let claims = Api::<CachedClaim>::all(ctx.client.clone());
    let trigger = control::trigger(claims, claim_writer, metrics.queue.clone(), observe);
    let (rescan, reconcile_all) = futures::channel::mpsc::unbounded();
    let settings = LoopSettings {
        reconcile_all: Some(reconcile_all),
        workers: ctx.args.worker_threads_for(crate::SPEC),
        resync_period: args.resync_period,
        stall: ctx.args.healthz_stall_timeout,
        heartbeat: ctx.heartbeat.clone(),
        metrics: metrics.queue.clone(),
        shutdown: shutdown.clone(),
    };
    tasks.spawn(probe_redis(
        op.clone(),
        intents,
        listed,
        rescan,
        gone_tx,
        ctx.clone(),
    ));
    tracing::info!(workers = settings.workers, "started provisioning claims");
    let backoff = ctx.args.retry_backoff(crate::SPEC);
    let claims = caches.claims.clone();
    tokio::join!(
        control::run(trigger, claims, settings, reconcile, error_policy, loop_ctx),
        clean_gone_claims(op.clone(), gone_rx, backoff, shutdown.clone()),
    );
    tasks.abort_all();
    ctx.readiness.set_ready(false);
    drop(op);
    // The publisher ends once the last event sender (the operation's cluster) is gone.
    let _ = tokio::time::timeout(Duration::from_secs(5), event_publisher).await;
    Ok(())
}

/// pv-writer's queue and the intents in Redis on one connection (the enqueue script clears
/// intents: both follow one primary), with `args`' replica acknowledgements; retried every
/// `--redis-reconnect-period`. `None`: `ctx.shutdown` fired first.
async fn connect_redis(
    ctx: &ServiceContext,
    args: &ProvisionArgs,
) -> Option<(PvQueue, IntentStore)> {
    let (name, redis) = (&ctx.args.cluster.provisioner_name, ctx.args.cluster.redis());
    let acks = (args.redis_wait_replicas, args.redis_wait_timeout);
    let connect = || async {
        let queue = PvQueue::connect(&redis, name).await?;
        let intents = IntentStore::with_connection(queue.connection(), name);
        Ok::<_, EffectError>((queue.with_replica_acks(acks.0, acks.1), intents))
    };
    let log =
        |e: &EffectError, _, _| tracing::warn!(error = %e, "cannot connect to Redis; retrying");
    ctx.args
        .redis_reconnect()
        .retry(&ctx.shutdown, connect, log)
        .await
}

/// The caches around `claims`: StorageClasses and PV names, their reflectors spawned on `tasks`,
/// once both have listed. `None`: `ctx.shutdown` fired first. Errors: a reflector stopped first.
async fn start_caches(
    ctx: &ServiceContext,
    claims: reflector::Store<CachedClaim>,
    tasks: &mut tokio::task::JoinSet<()>,
) -> anyhow::Result<Option<Caches>> {
    let client = ctx.client.clone();
    let class_writer = Writer::<StorageClass>::default();
    let caches = Caches {
        claims,
        classes: class_writer.as_reader(),
        volumes: NameSet::default(),
    };
    let classes = watcher(Api::<StorageClass>::all(client.clone()), Default::default());
    let classes = reflector::reflector(class_writer, classes.modify(strip_for_cache));
    tasks.spawn(drive("StorageClass", classes.backoff(watch_backoff())));
    // Metadata only, and of that only the names: is `pvc-<uid>` there?
    let pvs = Api::<PartialObjectMeta<PersistentVolume>>::all(client);
    let volume_names = caches.volumes.clone();
    let pvs = watcher(pvs, Default::default()).backoff(watch_backoff());
    let pvs = pvs.inspect_ok(move |ev| volume_names.apply_watcher_event(ev));
    tasks.spawn(drive("PersistentVolume", pvs));
    let synced = async {
        caches.classes.wait_until_ready().await?;
        caches.volumes.wait_until_ready().await;
        Ok::<(), reflector::store::WriterDropped>(())
    };
    tokio::select! {
        _ = ctx.shutdown.cancelled() => Ok(None),
        r = synced => r.context("a reflector stopped before its first list").map(|()| Some(caches)),
    }
}

/// What the claim watch's events do: a deleted claim's retry state is forgotten and it is
/// reported `gone`; so is every (re)list (a walk), so claims deleted while the watch was down
/// are found too. The first list also fires `listed`.
fn observer(
    ctx: Arc<Context>,
    gone: mpsc::UnboundedSender<Gone>,
    listed: Arc<tokio::sync::Notify>,
) -> impl FnMut(&watcher::Event<CachedClaim>, &reflector::Store<CachedClaim>) + Send + 'static {
    move |event, store| match event {
        watcher::Event::Delete(claim) => {
            if let Some(uid) = &claim.meta().uid {
                ctx.retry.forget(uid);
                ctx.op.forget_first_attempt(uid);
                let _ = gone.send(Gone::Claim(Box::new(claim.object())));
            }
        }
        watcher::Event::InitDone => {
            let _ = gone.send(Gone::Walk);
            listed.notify_one();
            tracing::info!(claims = store.state().len(), "claims listed");
        }
        _ => {}
    }
}

/// From the claims' first list (`listed`) until shutdown: readiness from Redis (`HLEN`) each
/// [`REDIS_PROBE_INTERVAL`], intent gauges each [`INTENT_GAUGES_INTERVAL`], a `rescan` of
/// every claim when Redis lost its data (data marker), an intent `walk` when it answers again.
async fn probe_redis(
    op: Arc<Operation>,
    intents: IntentStore,
    listed: Arc<tokio::sync::Notify>,
    rescan: futures::channel::mpsc::UnboundedSender<()>,
    walk: mpsc::UnboundedSender<Gone>,
    ctx: ServiceContext,
) {
    let (readiness, shutdown) = (ctx.readiness, ctx.shutdown);
    let mut marker = DataMarker::new(intents.connection(), &op.settings.names.name);
    tokio::select! {
        _ = shutdown.cancelled() => return,
        // Not `Store::wait_until_ready`: kube-runtime wakes only its last waiter (the Controller).
        _ = listed.notified() => {}
    }
    let mut up = true;
    let mut gauges_read = tokio::time::Instant::now() - INTENT_GAUGES_INTERVAL;
    let mut rescan_again = None;
    loop {
        let answered = match tokio::time::timeout(REDIS_PROBE_INTERVAL, intents.count()).await {
            Ok(count) => count.is_ok(),
            // A silent connection: redis-rs would keep it.
            Err(_) => {
                intents.connection().timed_out().await;
                false
            }
        };
        if answered != up {
            if answered {
                tracing::info!("Redis reachable again; ready");
                // Claims gone while it did not answer were left to the next walk.
                let _ = walk.send(Gone::Walk);
            } else {
                tracing::warn!("Redis unreachable; not ready");
            }
            up = answered;
        }
        if !shutdown.is_cancelled() {
            readiness.set_ready(answered);
        }
        if answered && matches!(marker.lost().await, Ok(true)) {
            op.metrics.redis_data_losses.inc();
            tracing::error!(
                recovery =
                    "every claim reconciled again; leaked volumes reported by the orphan sweep",
                "Redis lost its data (its data marker vanished)"
            );
            let _ = rescan.unbounded_send(());
            let _ = walk.send(Gone::Walk);
            rescan_again = Some(tokio::time::Instant::now() + RESCAN_AGAIN_AFTER);
        }
        if answered && rescan_again.is_some_and(|at| at <= tokio::time::Instant::now()) {
            rescan_again = None;
            tracing::info!("every claim reconciled once more after the Redis data loss");
            let _ = rescan.unbounded_send(());
        }
        if gauges_read.elapsed() >= INTENT_GAUGES_INTERVAL {
            gauges_read = tokio::time::Instant::now();
            op.refresh_capacity_gauges().await;
            if answered {
                if let Err(e) = op.refresh_intent_gauges().await {
                    tracing::debug!(error = %e, "cannot read the intent gauges");
                }
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(REDIS_PROBE_INTERVAL) => {}
        }
    }
}
