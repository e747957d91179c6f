//! The leader's work loop: reflectors for claims, StorageClasses and PVs, the
//! start-up walk over intents, the claim workers and the periodic resync.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use common::cache::strip_for_cache;
use common::intents::IntentStore;
use common::queue::PvQueue;
use common::queue_auth::QueueKey;

use crate::ports::SignedQueue;
use common::retry::{FailureThreshold, RetryPolicy};
use common::runtime::ServiceContext;
use common::Provisioner;
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, store::Writer};
use kube::runtime::{watcher, WatchStreamExt};
use kube::Api;
use tokio_util::sync::CancellationToken;

use crate::config::ProvisionArgs;
use crate::decision::ProvisionerNames;
use crate::engine::{Caches, Engine, Settings};
use crate::metrics::ServiceMetrics;
use crate::ports::KubeCluster;
use crate::recovery::{self, Recovery};
use common::workqueue::WorkQueue;

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

/// Retry a Redis connection until it succeeds or `shutdown` fires (`None`).
async fn connect_with_retry<T, E: std::fmt::Display, F, Fut>(
    what: &str,
    shutdown: &CancellationToken,
    period: Duration,
    mut connect: F,
) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    loop {
        match connect().await {
            Ok(v) => return Some(v),
            Err(e) => {
                tracing::warn!(error = %e, "cannot connect to Redis for the {what}; retrying")
            }
        }
        tokio::select! {
            _ = shutdown.cancelled() => return None,
            _ = tokio::time::sleep(period) => {}
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
    let name = args.common.provisioner_name.clone();
    let url = args.common.redis_url.clone();
    let period = args.common.retry_period;
    let Some(pv_queue) = connect_with_retry("PV-write queue", &shutdown, period, || {
        PvQueue::connect(&url, &name)
    })
    .await
    else {
        return Ok(());
    };
    let Some(intents) = connect_with_retry("provisioning intents", &shutdown, period, || {
        IntentStore::connect(&url, &name)
    })
    .await
    else {
        return Ok(());
    };

    let client = ctx.client.clone();
    let claim_writer = Writer::<PersistentVolumeClaim>::default();
    let class_writer = Writer::<StorageClass>::default();
    let volume_writer = Writer::<PartialObjectMeta<PersistentVolume>>::default();
    let caches = Caches {
        claims: claim_writer.as_reader(),
        classes: class_writer.as_reader(),
        volumes: volume_writer.as_reader(),
    };
    let (cluster, event_publisher) =
        KubeCluster::new(client.clone(), ctx.kind.component(), &ctx.identity);
    let queue = WorkQueue::new();
    let engine = Arc::new(Engine::new(
        settings(&args),
        caches.clone(),
        backend,
        Arc::new(cluster),
        Arc::new(SignedQueue::new(pv_queue, queue_key, &name)),
        Arc::new(intents.clone()),
        metrics.clone(),
        RetryPolicy::from_args(&args.retry),
        queue.clone(),
    ));

    let watch_cfg = watcher::Config::default();
    let mut tasks = tokio::task::JoinSet::new();
    {
        let engine = engine.clone();
        let stream = reflector::reflector(
            claim_writer,
            watcher(
                Api::<PersistentVolumeClaim>::all(client.clone()),
                watch_cfg.clone(),
            )
            .modify(strip_for_cache),
        )
        .default_backoff();
        tasks.spawn(drive("PersistentVolumeClaim", stream, move |ev| match ev {
            watcher::Event::Apply(c) | watcher::Event::InitApply(c) => engine.claim_seen(c),
            // Seed: nothing on delete; a claim in background is still retried.
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
        .default_backoff(),
        |_| {},
    ));
    tasks.spawn(drive(
        "PersistentVolume",
        reflector::reflector(
            volume_writer,
            // Metadata only (an `Api<PartialObjectMeta<_>>` lists and watches
            // with the metadata-only media type): the claim logic asks whether
            // `pvc-<uid>` exists.
            watcher(
                Api::<PartialObjectMeta<PersistentVolume>>::all(client.clone()),
                watch_cfg,
            )
            .modify(strip_for_cache),
        )
        .default_backoff(),
        |_| {},
    ));

    let synced = async {
        caches.claims.wait_until_ready().await?;
        caches.classes.wait_until_ready().await?;
        caches.volumes.wait_until_ready().await
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
    let decisions = recovery::walk(&engine, &entries).await;
    let cleanups: Vec<_> = entries
        .into_iter()
        .zip(decisions)
        .filter(|(_, (_, d))| *d == Recovery::Cleanup)
        .map(|(e, _)| e)
        .collect();
    if !cleanups.is_empty() {
        tasks.spawn(recovery::cleanup_all(
            engine.clone(),
            cleanups,
            args.retry.retry_initial_delay,
            args.retry.retry_max_delay,
            shutdown.clone(),
        ));
    }
    ctx.readiness.set_ready(true);
    tracing::info!(workers = args.worker_threads, "started provisioning claims");

    // Resync: queue every cached claim (and every claim in background) again.
    {
        let engine = engine.clone();
        let claims = caches.claims.clone();
        let resync = args.resync_period;
        let stop = shutdown.clone();
        tasks.spawn(async move {
            let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + resync, resync);
            loop {
                tokio::select! {
                    _ = stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                for claim in claims.state() {
                    engine.claim_seen(&claim);
                }
                for uid in engine.in_background_uids() {
                    engine.queue().add(&uid);
                }
            }
        });
    }

    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.worker_threads {
        let engine = engine.clone();
        workers.spawn(async move {
            while let Some(uid) = engine.queue().get().await {
                engine.process(&uid).await;
                engine.queue().done(&uid);
            }
        });
    }

    shutdown.cancelled().await;
    tracing::info!("shutting down: finishing in-flight claims");
    queue.shut_down();
    while workers.join_next().await.is_some() {}
    tasks.abort_all();
    ctx.readiness.set_ready(false);
    drop(engine);
    // The publisher ends once the last event sender (the engine's cluster) is gone.
    let _ = tokio::time::timeout(Duration::from_secs(5), event_publisher).await;
    Ok(())
}
