//! The services' one control-loop shape: kube-runtime's `Controller` over one
//! reflector ([`trigger`], [`run`]) with the seed's resync, client-go's
//! `workqueue_*` metrics and the `/healthz` stall heartbeat. provision-svc
//! (claims) and reclaim-svc (PVs) both run on it.

use std::fmt::Debug;
use std::hash::Hash;
use std::sync::Arc;
use std::time::Duration;

use futures::{FutureExt, Stream, StreamExt, TryFuture, TryFutureExt};
use kube::runtime::controller::{self, Action, Controller};
use kube::runtime::reflector::{self, store::Writer, ObjectRef, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::kube::cache::watch_backoff;
use crate::kube::workqueue_metrics::WorkQueueMetrics;
use crate::runtime::config::resync_interval;
use crate::runtime::health::{beat_period, beat_while_progressing, Heartbeat};

/// How one control loop runs (from the service's flags and leader term).
pub struct LoopSettings {
    /// Concurrent reconciles (seed threadiness, `--worker-threads`); at least 1.
    pub workers: usize,
    /// Every cached object is reconciled again this often; zero disables.
    pub resync_period: Duration,
    /// `/healthz` fails once every worker slot stays busy this long.
    pub stall: Duration,
    /// The runtime's liveness heartbeat, beaten while the loop progresses.
    pub heartbeat: Heartbeat,
    /// client-go's work-queue series of this loop (label `name`).
    pub metrics: WorkQueueMetrics,
    /// Stops the loop; in-flight reconciles finish first.
    pub shutdown: CancellationToken,
    /// Each item reconciles every cached object again (provision-svc: Redis
    /// lost its data); `None`: only the resync.
    pub reconcile_all: Option<futures::channel::mpsc::UnboundedReceiver<()>>,
}

/// Every object of `api` as a trigger for [`run`]: a reflector into `writer`
/// showing each event to `observe` (store already updated). Watch errors are
/// logged and go no further; the watcher backs off and re-lists.
pub fn trigger<K>(
    api: Api<K>,
    writer: Writer<K>,
    metrics: WorkQueueMetrics,
    mut observe: impl FnMut(&watcher::Event<K>, &Store<K>) + Send + 'static,
) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static
where
    K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Default + Eq + Hash + Clone + Send + Sync,
{
    let store = writer.as_reader();
    let kind = K::kind(&Default::default()).to_string();
    reflector::reflector(writer, watcher(api, watcher::Config::default()))
        .backoff(watch_backoff())
        .inspect(move |event| match event {
            Ok(event) => observe(event, &store),
            Err(e) => log_watch_error(&kind, e),
        })
        .applied_objects()
        // Errors are logged above and backed off by `watch_backoff`; passed on,
        // they would also start the `Controller`'s own backoff (up to 30 s).
        .filter_map(|object| std::future::ready(object.ok()))
        .inspect(move |object| metrics.add(&ObjectRef::from_obj(object).to_string()))
        .map(Ok)
}

/// Log a reflector's watch error for `kind` (the watcher backs off and
/// re-lists by itself): at debug level when the API server is unreachable,
/// which the client logs once.
pub fn log_watch_error(kind: &str, error: &watcher::Error) {
    crate::runtime::api_reachability::log_failure(
        kind,
        "watch failed; the reflector retries",
        error,
    )
}

/// Run `reconcile` for the objects of `trigger` (cached in `store`) until
/// `settings.shutdown`: at most `workers` at once, never twice at once for one
/// object, retried as `error_policy` says. Errors: none once running.
pub async fn run<K, Ctx, R, F, P>(
    trigger: impl Stream<Item = Result<K, watcher::Error>> + Send + 'static,
    store: Store<K>,
    settings: LoopSettings,
    mut reconcile: R,
    error_policy: P,
    ctx: Arc<Ctx>,
) where
    K: Clone + Resource + DeserializeOwned + Debug + Send + Sync + 'static,
    K::DynamicType: Eq + Hash + Clone + Debug + Unpin + Default,
    Ctx: Send + Sync + 'static,
    R: FnMut(Arc<K>, Arc<Ctx>) -> F,
    F: TryFuture<Ok = Action> + Send + 'static,
    F::Error: std::error::Error + Send + 'static,
    P: Fn(Arc<K>, &F::Error, Arc<Ctx>) -> Action,
{
    let workers = u16::try_from(settings.workers.max(1)).unwrap_or(u16::MAX);
    let (metrics, shutdown, stall) = (settings.metrics, settings.shutdown, settings.stall);
    // Held by this future: the heartbeat task is aborted with the loop.
    let mut beater = tokio::task::JoinSet::new();
    let busy = metrics.clone();
    beater.spawn(beat_while_progressing(
        settings.heartbeat,
        beat_period(stall),
        stall,
        move || busy.stalled_when_busy(usize::from(workers)),
        shutdown.clone(),
    ));
    let mut controller = Controller::for_stream(trigger, store)
        .with_config(controller::Config::default().concurrency(workers))
        .graceful_shutdown_on(shutdown.cancelled_owned());
    if let Some(mut tick) = resync_interval(settings.resync_period) {
        let ticks = futures::stream::poll_fn(move |cx| tick.poll_tick(cx).map(|_| Some(())));
        controller = controller.reconcile_all_on(ticks);
    }
    if let Some(rx) = settings.reconcile_all {
        controller = controller.reconcile_all_on(rx);
    }
    let work = metrics.clone();
    let timed = move |object: Arc<K>, ctx| {
        let processing = work.start_processing(&ObjectRef::from_obj(&*object).to_string());
        reconcile(object, ctx)
            .into_future()
            .inspect(move |_| drop(processing))
    };
    let gone = metrics.clone();
    let counted = move |object, error: &F::Error, ctx| {
        let action = error_policy(object, error, ctx);
        if action != Action::await_change() {
            metrics.retry();
        }
        action
    };
    controller
        .run(timed, counted, ctx)
        .for_each(move |result| {
            match result {
                Ok(_) | Err(controller::Error::ReconcilerFailed(..)) => {}
                Err(controller::Error::ObjectNotFound(obj)) => {
                    gone.forget(&obj.to_string());
                    tracing::debug!(object = %obj, "gone before its reconcile")
                }
                Err(error) => tracing::warn!(%error, "controller"),
            }
            std::future::ready(())
        })
        .await;
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::ConfigMap;
    use kube::api::ObjectMeta;
    use std::sync::Mutex;

    #[derive(Debug, thiserror::Error)]
    #[error("first attempt fails")]
    struct Flaky;

    fn config_map(name: &str) -> ConfigMap {
        ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// Every triggered object is reconciled; an error goes through the error
    /// policy and is counted in `workqueue_retries_total`, each reconcile in
    /// `workqueue_work_duration_seconds`; shutdown ends the loop.
    #[tokio::test]
    async fn reconciles_retries_counts_and_stops() {
        let registry = prometheus::Registry::new();
        let metrics = WorkQueueMetrics::register(&registry, "things");
        let (store, mut writer) = reflector::store::<ConfigMap>();
        writer.apply_watcher_event(&watcher::Event::InitDone);
        for name in ["a", "b"] {
            writer.apply_watcher_event(&watcher::Event::Apply(config_map(name)));
        }
        let seen = Arc::new(Mutex::new(Vec::<String>::new()));
        let trigger = futures::stream::iter([Ok(config_map("a")), Ok(config_map("b"))])
            .chain(futures::stream::pending());
        let shutdown = CancellationToken::new();
        let settings = LoopSettings {
            workers: 2,
            resync_period: Duration::ZERO,
            stall: Duration::from_secs(60),
            heartbeat: Heartbeat::default(),
            metrics,
            shutdown: shutdown.clone(),
            reconcile_all: None,
        };
        let reconcile = |cm: Arc<ConfigMap>, seen: Arc<Mutex<Vec<String>>>| async move {
            let name = cm.metadata.name.clone().unwrap();
            let mut seen = seen.lock().unwrap();
            let first = !seen.contains(&name);
            seen.push(name.clone());
            if first && name == "a" {
                Err(Flaky)
            } else {
                Ok(Action::await_change())
            }
        };
        let policy = |_: Arc<ConfigMap>, _: &Flaky, _: Arc<Mutex<Vec<String>>>| {
            Action::requeue(Duration::from_millis(10))
        };
        let run = tokio::spawn(run(
            trigger,
            store,
            settings,
            reconcile,
            policy,
            seen.clone(),
        ));
        tokio::time::sleep(Duration::from_millis(500)).await;
        shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(5), run)
            .await
            .expect("stops on shutdown")
            .unwrap();
        let mut seen = seen.lock().unwrap().clone();
        seen.sort();
        assert_eq!(seen, vec!["a", "a", "b"]);
        let text = crate::runtime::metrics::render(&registry);
        let line = |name: &str| {
            text.lines()
                .find(|l| l.starts_with(name))
                .unwrap_or_default()
                .to_string()
        };
        assert_eq!(
            line("workqueue_retries_total"),
            r#"workqueue_retries_total{name="things"} 1"#
        );
        assert_eq!(
            line("workqueue_work_duration_seconds_count"),
            r#"workqueue_work_duration_seconds_count{name="things"} 3"#
        );
    }
}
