//! The delete operation and finalizer handling against a small in-memory PV API
//! (GET, merge PATCH with resourceVersion checks, DELETE with finalizers and
//! uid preconditions, event POSTs), with a fake backend counting delete calls.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_types::{ANN_DYNAMICALLY_PROVISIONED, FINALIZER_PV, FINALIZER_PV_PROTECTION};
use common::kube::retry::{FailureThreshold, RetryPolicy};
use common::runtime::metrics::{render, DeleteMetrics};
use http::{Request, Response, StatusCode};
use k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeSpec, PersistentVolumeStatus,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::client::Body;
use kube::runtime::controller::Action;
use kube::runtime::{reflector, watcher};
use kube::{Api, Client};
use prometheus::Registry;
use provisioner_api::testing::FakeProvisioner;
use provisioner_api::DeleteError;
use reclaim_svc::controller::{error_policy, reconcile, CachedPv, Context};
use reclaim_svc::operation::{EventPublisher, Reclaimer, SyncError};

const ME: &str = "example.com/hostpath";

// ---------------------------------------------------------------- fake API

#[derive(Default)]
struct ApiState {
    pvs: HashMap<String, PersistentVolume>,
    next_rv: u64,
    /// Fail this many PV DELETE calls with 500 before serving them.
    fail_deletes: usize,
    /// Requests seen, as "METHOD name" ("METHOD class <name>" for StorageClasses).
    log: Vec<String>,
    /// StorageClasses by name.
    classes: HashMap<String, StorageClass>,
    /// Requests of this method never answer.
    hang: Option<http::Method>,
}

#[derive(Clone, Default)]
struct FakeApi(Arc<Mutex<ApiState>>);

impl FakeApi {
    fn put(&self, mut pv: PersistentVolume) {
        let mut s = self.0.lock().unwrap();
        s.next_rv += 1;
        pv.metadata.resource_version = Some(s.next_rv.to_string());
        s.pvs.insert(pv.metadata.name.clone().unwrap(), pv);
    }
    fn get(&self, name: &str) -> Option<PersistentVolume> {
        self.0.lock().unwrap().pvs.get(name).cloned()
    }
    fn log(&self) -> Vec<String> {
        self.0.lock().unwrap().log.clone()
    }
    fn client(&self) -> Client {
        let state = self.0.clone();
        let svc = tower::service_fn(move |req: Request<Body>| {
            let state = state.clone();
            async move {
                let (parts, body) = req.into_parts();
                if state.lock().unwrap().hang.as_ref() == Some(&parts.method) {
                    std::future::pending::<()>().await;
                }
                let bytes = body.collect_bytes().await.unwrap();
                let resp = handle(&state, &parts.method, parts.uri.path(), &bytes);
                Ok::<_, std::convert::Infallible>(resp)
            }
        });
        Client::new(svc, "default")
    }
}

fn json(code: StatusCode, v: serde_json::Value) -> Response<Body> {
    Response::builder()
        .status(code)
        .header("content-type", "application/json")
        .body(Body::from(serde_json::to_vec(&v).unwrap()))
        .unwrap()
}

fn status(code: u16, reason: &str) -> Response<Body> {
    json(
        StatusCode::from_u16(code).unwrap(),
        serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
            "message": reason, "reason": reason, "code": code}),
    )
}

fn handle(
    state: &Mutex<ApiState>,
    method: &http::Method,
    path: &str,
    body: &[u8],
) -> Response<Body> {
    let mut s = state.lock().unwrap();
    if path.contains("/events") {
        s.log
            .push(format!("{method} event {}", String::from_utf8_lossy(body)));
        let v: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
        return json(StatusCode::CREATED, v);
    }
    if let Some(name) = path.strip_prefix("/apis/storage.k8s.io/v1/storageclasses/") {
        s.log.push(format!("{method} class {name}"));
        return match s.classes.get(name) {
            Some(c) => json(StatusCode::OK, serde_json::to_value(c).unwrap()),
            None if name == "unreadable" => status(500, "InternalError"),
            None => status(404, "NotFound"),
        };
    }
    let name = path
        .strip_prefix("/api/v1/persistentvolumes/")
        .unwrap_or("")
        .to_string();
    s.log.push(format!("{method} {name}"));
    let Some(current) = s.pvs.get(&name).cloned() else {
        return status(404, "NotFound");
    };
    match *method {
        http::Method::GET => json(StatusCode::OK, serde_json::to_value(&current).unwrap()),
        http::Method::PATCH => {
            let patch: serde_json::Value = serde_json::from_slice(body).unwrap();
            let meta = &patch["metadata"];
            // Only finalizers and resourceVersion may be sent.
            let keys: Vec<&String> = meta.as_object().unwrap().keys().collect();
            assert!(
                keys.iter()
                    .all(|k| *k == "finalizers" || *k == "resourceVersion"),
                "{patch}"
            );
            assert_eq!(patch.as_object().unwrap().len(), 1, "{patch}");
            if meta["resourceVersion"].as_str() != current.metadata.resource_version.as_deref() {
                return status(409, "Conflict");
            }
            let mut pv = current;
            pv.metadata.finalizers = serde_json::from_value(meta["finalizers"].clone()).unwrap();
            s.next_rv += 1;
            pv.metadata.resource_version = Some(s.next_rv.to_string());
            if pv.metadata.deletion_timestamp.is_some()
                && pv.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty())
            {
                s.pvs.remove(&name);
            } else {
                s.pvs.insert(name, pv.clone());
            }
            json(StatusCode::OK, serde_json::to_value(&pv).unwrap())
        }
        http::Method::DELETE => {
            if s.fail_deletes > 0 {
                s.fail_deletes -= 1;
                return status(500, "InternalError");
            }
            let opts: serde_json::Value = serde_json::from_slice(body).unwrap_or_default();
            if let Some(uid) = opts["preconditions"]["uid"].as_str() {
                if Some(uid) != current.metadata.uid.as_deref() {
                    return status(409, "Conflict");
                }
            }
            let mut pv = current;
            if pv.metadata.finalizers.as_ref().is_none_or(|f| f.is_empty()) {
                s.pvs.remove(&name);
            } else {
                pv.metadata.deletion_timestamp = Some(
                    k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Default::default()),
                );
                s.next_rv += 1;
                pv.metadata.resource_version = Some(s.next_rv.to_string());
                s.pvs.insert(name, pv.clone());
            }
            json(StatusCode::OK, serde_json::to_value(&pv).unwrap())
        }
        _ => status(405, "MethodNotAllowed"),
    }
}

// ---------------------------------------------------------------- fakes

#[derive(Default)]
struct Events(Mutex<Vec<(String, String)>>);

#[async_trait::async_trait]
impl EventPublisher for Events {
    async fn publish(&self, volume: &PersistentVolume, event: kube::runtime::events::Event) {
        let _ = volume;
        let note = event.note.unwrap_or_default();
        self.0.lock().unwrap().push((event.reason, note));
    }
}

fn released(name: &str, finalizers: &[&str]) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            uid: Some(format!("uid-{name}")),
            annotations: Some(BTreeMap::from([(
                ANN_DYNAMICALLY_PROVISIONED.to_string(),
                ME.to_string(),
            )])),
            finalizers: (!finalizers.is_empty())
                .then(|| finalizers.iter().map(|s| s.to_string()).collect()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            persistent_volume_reclaim_policy: Some("Delete".into()),
            storage_class_name: Some("fast".into()),
            ..Default::default()
        }),
        status: Some(PersistentVolumeStatus {
            phase: Some("Released".into()),
            ..Default::default()
        }),
    }
}

struct Harness {
    api: FakeApi,
    backend: Arc<FakeProvisioner>,
    events: Arc<Events>,
    registry: Registry,
    reclaimer: Arc<Reclaimer>,
}

/// PV `pvc-1` was deleted (it now carries a deletion timestamp) and then
/// patched to drop our finalizer, keeping `kubernetes.io/pv-protection`.
fn assert_deleted_with_only_our_finalizer_removed(h: &Harness) {
    let pv = stored(h, "pvc-1");
    assert!(pv.metadata.deletion_timestamp.is_some());
    assert_eq!(
        pv.metadata.finalizers,
        Some(vec![FINALIZER_PV_PROTECTION.to_string()])
    );
    assert_eq!(
        h.api.log(),
        vec!["GET pvc-1", "DELETE pvc-1", "PATCH pvc-1"]
    );
}

/// A reconcile [`Context`] over `reclaimer`: one worker, no resync, a retry
/// backoff from `retry_start` to `retry_max` without jitter, the failure
/// threshold `threshold` and the seed's `--deletion-timeout` `deletion_timeout`
/// (zero: none).
/// [`context`] with 1 s retries, threshold 15 and no deletion timeout.
fn quick_context(h: &Harness) -> Arc<Context> {
    context(
        h.reclaimer.clone(),
        Duration::from_secs(1),
        Duration::from_secs(1),
        15,
        Duration::ZERO,
    )
}

fn context(
    reclaimer: Arc<Reclaimer>,
    retry_start: Duration,
    retry_max: Duration,
    threshold: u32,
    deletion_timeout: Duration,
) -> Arc<Context> {
    Arc::new(Context {
        reclaimer,
        retry: Arc::new(RetryPolicy::<String>::new(retry_start, retry_max, 0.0, 1)),
        threshold: FailureThreshold(threshold),
        deletion_timeout,
    })
}

/// The `controller_persistentvolume_delete_*` samples in `registry` (name, labels, value),
/// without the histogram's buckets and sum.
fn delete_samples(registry: &Registry) -> Vec<String> {
    let text = render(registry);
    let samples = text.lines().filter(|l| {
        l.starts_with("controller_persistentvolume_delete_")
            && !l.contains("_bucket{")
            && !l.contains("_sum{")
    });
    samples.map(str::to_string).collect()
}

fn harness(answer: Result<(), DeleteError>, add_finalizer: bool) -> Harness {
    let api = FakeApi::default();
    let backend = Arc::new(FakeProvisioner::deleting(answer));
    let events = Arc::new(Events::default());
    let registry = Registry::new();
    let metrics = DeleteMetrics::delete(&registry);
    let reclaimer = Arc::new(Reclaimer::new(
        Api::all(api.client()),
        backend.clone(),
        events.clone(),
        metrics,
        ME.to_string(),
        add_finalizer,
    ));
    Harness {
        api,
        backend,
        events,
        registry,
        reclaimer,
    }
}

/// A harness whose backend answers `err`, with the released PV `pvc-1` stored.
fn failing(err: DeleteError) -> Harness {
    let h = harness(Err(err), false);
    h.api.put(released("pvc-1", &[]));
    h
}

/// The (reason, note) of each event published so far.
fn events(h: &Harness) -> Vec<(String, String)> {
    h.events.0.lock().unwrap().clone()
}

fn stored(h: &Harness, name: &str) -> PersistentVolume {
    h.api.get(name).expect("PV present")
}

/// The PV `name` as the PV cache holds it.
fn cached(h: &Harness, name: &str) -> CachedPv {
    CachedPv::new(stored(h, name))
}

// ---------------------------------------------------------------- tests

#[tokio::test]
async fn released_volume_is_deleted_then_its_pv() {
    let h = harness(Ok(()), false);
    h.api.put(released("pvc-1", &[]));
    h.reclaimer.sync_volume(&stored(&h, "pvc-1")).await.unwrap();
    assert_eq!(h.backend.deleted().len(), 1);
    assert!(h.api.get("pvc-1").is_none());
    assert_eq!(h.api.log(), vec!["GET pvc-1", "DELETE pvc-1"]);
    assert_eq!(
        delete_samples(&h.registry),
        [
            "controller_persistentvolume_delete_duration_seconds_count{class=\"fast\"} 1",
            "controller_persistentvolume_delete_total{class=\"fast\"} 1",
        ]
    );
}

#[tokio::test]
async fn with_finalizer_the_pv_outlives_the_asset_and_only_our_finalizer_is_removed() {
    let h = harness(Ok(()), true);
    h.api
        .put(released("pvc-1", &[FINALIZER_PV_PROTECTION, FINALIZER_PV]));
    h.reclaimer.sync_volume(&stored(&h, "pvc-1")).await.unwrap();
    assert_eq!(h.backend.deleted().len(), 1);
    assert_deleted_with_only_our_finalizer_removed(&h);
}

#[tokio::test]
async fn backend_failure_publishes_volume_failed_delete_and_counts_a_failure() {
    let h = failing(DeleteError::Failed {
        reason: "disk on fire".into(),
    });
    let err = h
        .reclaimer
        .sync_volume(&stored(&h, "pvc-1"))
        .await
        .unwrap_err();
    assert!(matches!(err, SyncError::Backend { .. }), "{err}");
    assert!(h.api.get("pvc-1").is_some(), "PV kept");
    assert_eq!(
        events(&h),
        vec![("VolumeFailedDelete".to_string(), "disk on fire".to_string())]
    );
    assert_eq!(
        delete_samples(&h.registry),
        ["controller_persistentvolume_delete_failed_total{class=\"fast\"} 1"]
    );
}

#[tokio::test]
async fn refused_delete_is_reported_and_nothing_else_happens() {
    let h = failing(DeleteError::Refused {
        reason: "path outside base".into(),
    });
    assert!(h.reclaimer.sync_volume(&stored(&h, "pvc-1")).await.is_err());
    assert!(h.api.get("pvc-1").is_some());
    assert_eq!(
        events(&h),
        vec![(
            "VolumeFailedDelete".to_string(),
            "deletion refused: path outside base".to_string()
        )]
    );
}

#[tokio::test]
async fn ignored_delete_leaves_the_pv() {
    let h = failing(DeleteError::Ignored {
        reason: "not mine".into(),
    });
    h.reclaimer.sync_volume(&stored(&h, "pvc-1")).await.unwrap();
    assert_eq!(h.backend.deleted().len(), 1);
    assert!(h.api.get("pvc-1").is_some());
    assert_eq!(h.api.log(), vec!["GET pvc-1"]);
    assert!(events(&h).is_empty());
}

#[tokio::test]
async fn second_delivery_after_a_failed_pv_delete_does_not_call_the_backend_again() {
    let h = harness(Ok(()), false);
    h.api.put(released("pvc-1", &[]));
    h.api.0.lock().unwrap().fail_deletes = 1;
    let pv = stored(&h, "pvc-1");
    let err = h.reclaimer.sync_volume(&pv).await.unwrap_err();
    assert!(matches!(err, SyncError::DeletePv { .. }), "{err}");
    assert!(h.reclaimer.asset_deleted("uid-pvc-1"));
    h.reclaimer.sync_volume(&pv).await.unwrap();
    assert_eq!(h.backend.deleted().len(), 1);
    assert!(h.api.get("pvc-1").is_none());
    h.reclaimer.retain_uids(|uid| uid != "uid-pvc-1");
    assert!(!h.reclaimer.asset_deleted("uid-pvc-1"));
}

#[tokio::test]
async fn pv_replaced_under_the_same_name_is_not_deleted() {
    let h = harness(Ok(()), false);
    let old = released("pvc-1", &[]);
    let mut newer = old.clone();
    newer.metadata.uid = Some("another-uid".into());
    h.api.put(newer);
    // The cache still shows the old object.
    h.reclaimer.sync_volume(&old).await.unwrap();
    assert!(
        h.backend.deleted().is_empty(),
        "the new object's volume is kept"
    );
    assert_eq!(
        h.api.get("pvc-1").unwrap().metadata.uid.as_deref(),
        Some("another-uid")
    );
}

#[tokio::test]
async fn finalizer_is_added_by_patch_and_a_concurrent_change_is_kept() {
    let h = harness(Ok(()), true);
    let mut bound = released("pvc-1", &[FINALIZER_PV_PROTECTION]);
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    h.api.put(bound);
    let cached = stored(&h, "pvc-1");
    // Another controller adds its finalizer after our cache was filled.
    let mut changed = cached.clone();
    changed
        .metadata
        .finalizers
        .as_mut()
        .unwrap()
        .push("other.io/keep".into());
    h.api.put(changed);

    h.reclaimer.sync_volume(&cached).await.unwrap();
    assert_eq!(
        stored(&h, "pvc-1").metadata.finalizers,
        Some(vec![
            FINALIZER_PV_PROTECTION.to_string(),
            "other.io/keep".to_string(),
            FINALIZER_PV.to_string()
        ])
    );
    assert_eq!(h.api.log(), vec!["PATCH pvc-1", "GET pvc-1", "PATCH pvc-1"]);
    assert_eq!(h.backend.deleted().len(), 0, "a Bound PV is not deleted");
}

#[tokio::test]
async fn finalizer_is_removed_when_the_option_is_off_and_pvs_of_others_are_untouched() {
    let h = harness(Ok(()), false);
    let mut bound = released("pvc-1", &[FINALIZER_PV, FINALIZER_PV_PROTECTION]);
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    let mut theirs = bound.clone();
    theirs.metadata.name = Some("pvc-2".into());
    theirs
        .metadata
        .annotations
        .as_mut()
        .unwrap()
        .insert(ANN_DYNAMICALLY_PROVISIONED.into(), "other.io/nfs".into());
    h.api.put(bound);
    h.api.put(theirs);
    h.reclaimer.sync_volume(&stored(&h, "pvc-1")).await.unwrap();
    h.reclaimer.sync_volume(&stored(&h, "pvc-2")).await.unwrap();
    assert_eq!(
        stored(&h, "pvc-1").metadata.finalizers,
        Some(vec![FINALIZER_PV_PROTECTION.to_string()])
    );
    assert_eq!(
        stored(&h, "pvc-2").metadata.finalizers,
        Some(vec![
            FINALIZER_PV.to_string(),
            FINALIZER_PV_PROTECTION.to_string()
        ])
    );
    assert_eq!(h.api.log(), vec!["PATCH pvc-1"]);
}

#[tokio::test]
async fn failed_syncs_are_retried_up_to_the_threshold_then_given_up() {
    let h = failing(DeleteError::Failed {
        reason: "boom".into(),
    });
    let (store, mut writer) = reflector::store::<CachedPv>();
    writer.apply_watcher_event(&watcher::Event::Apply(cached(&h, "pvc-1")));
    let ctx = context(
        h.reclaimer.clone(),
        Duration::from_secs(15),
        Duration::from_secs(1000),
        3,
        Duration::ZERO,
    );
    let key = "pvc-1".to_string();
    for attempt in 1..=4u32 {
        let pv = Arc::new(cached(&h, "pvc-1"));
        let err = reconcile(pv.clone(), ctx.clone()).await.unwrap_err();
        let action = error_policy(pv, &err, ctx.clone());
        // Requeued with the per-PV backoff (15s doubling) while the failures
        // before this one (attempt - 1) are < 3; the 4th failure gives up until
        // the PV changes and keeps the count ("Done but not Forget").
        let expected = match attempt {
            1 => Action::requeue(Duration::from_secs(15)),
            2 => Action::requeue(Duration::from_secs(30)),
            3 => Action::requeue(Duration::from_secs(60)),
            _ => Action::await_change(),
        };
        assert_eq!(action, expected, "attempt {attempt}");
        assert_eq!(
            ctx.retry.requeues(&key),
            attempt.min(3),
            "attempt {attempt}"
        );
    }
    assert_eq!(h.backend.deleted().len(), 4);
    assert_eq!(events(&h).len(), 4);

    // A deleted PV is forgotten: its failures are dropped (seed forgetVolume).
    let gone = cached(&h, "pvc-1");
    writer.apply_watcher_event(&watcher::Event::Delete(gone.clone()));
    ctx.observe(&watcher::Event::Delete(gone), &store);
    assert_eq!(ctx.retry.requeues(&key), 0);
}

#[tokio::test]
async fn a_successful_sync_forgets_earlier_failures() {
    let h = harness(Ok(()), false);
    h.api.put(released("pvc-1", &[]));
    let ctx = quick_context(&h);
    let key = "pvc-1".to_string();
    ctx.retry.next_delay(&key);
    ctx.retry.next_delay(&key);
    assert_eq!(ctx.retry.requeues(&key), 2);
    let action = reconcile(Arc::new(cached(&h, "pvc-1")), ctx.clone())
        .await
        .unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(ctx.retry.requeues(&key), 0);
    assert_eq!(h.backend.deleted().len(), 1);
}

/// The PV cache holds `CachedPv`s (identity typed, the rest as JSON):
/// `reconcile` syncs the whole PV decoded from it, finalizers, annotations and
/// spec included, as `sync_volume` on the PV itself does
/// (`with_finalizer_the_pv_outlives_the_asset_and_only_our_finalizer_is_removed`).
#[tokio::test]
async fn reconcile_syncs_the_whole_pv_from_its_compact_cache_entry() {
    let h = harness(Ok(()), true);
    let mut pv = released("pvc-1", &[FINALIZER_PV_PROTECTION, FINALIZER_PV]);
    pv.metadata.managed_fields = Some(vec![Default::default()]);
    h.api.put(pv);
    let entry = cached(&h, "pvc-1");
    assert!(
        kube::ResourceExt::finalizers(&entry).is_empty(),
        "the typed part is the identity only"
    );
    let ctx = quick_context(&h);
    let action = reconcile(Arc::new(entry), ctx).await.unwrap();
    assert_eq!(action, Action::await_change());
    assert_eq!(h.backend.deleted(), vec!["pvc-1".to_string()]);
    assert_deleted_with_only_our_finalizer_removed(&h);
}

/// `--deletion-timeout` runs `process_item` against `backend`; returns the
/// error, the events, the rendered metrics and the time taken.
async fn sync_with_deletion_timeout(
    backend: Arc<FakeProvisioner>,
) -> (SyncError, Vec<(String, String)>, String, Duration, FakeApi) {
    let api = FakeApi::default();
    api.put(released("pvc-1", &[]));
    let events = Arc::new(Events::default());
    let registry = Registry::new();
    let reclaimer = Arc::new(Reclaimer::new(
        Api::all(api.client()),
        backend,
        events.clone(),
        DeleteMetrics::delete(&registry),
        ME.into(),
        false,
    ));
    let ctx = context(
        reclaimer,
        Duration::from_secs(1),
        Duration::from_secs(1),
        15,
        Duration::from_secs(5),
    );
    let start = tokio::time::Instant::now();
    let err = reconcile(Arc::new(CachedPv::new(api.get("pvc-1").unwrap())), ctx)
        .await
        .unwrap_err();
    let took = start.elapsed();
    let events = events.0.lock().unwrap().clone();
    (err, events, render(&registry), took, api)
}

/// Seed: `--deletion-timeout` is a context cancellation that reaches the
/// provisioner's `Delete`; its error is handled like any other: a
/// `VolumeFailedDelete` event, `..._delete_failed_total`, a retry.
#[tokio::test(start_paused = true)]
async fn deletion_timeout_fails_a_slow_backend_like_a_cancelled_context() {
    let backend = Arc::new(FakeProvisioner {
        delay: Some(Duration::from_secs(3600)),
        ..Default::default()
    });
    let (err, events, metrics, took, api) = sync_with_deletion_timeout(backend.clone()).await;
    assert!(matches!(err, SyncError::Backend { .. }), "{err}");
    assert_eq!(
        took,
        Duration::from_secs(5) + provisioner_api::deadline::ABANDON_GRACE
    );
    assert_eq!(
        *backend.saw_deadline.lock().unwrap(),
        Some(Duration::from_secs(5)),
        "the backend call sees the deadline"
    );
    assert_eq!(events.len(), 1, "{events:?}");
    assert_eq!(events[0].0, "VolumeFailedDelete");
    assert!(
        events[0].1.contains("context deadline exceeded"),
        "{events:?}"
    );
    assert!(
        metrics.contains("controller_persistentvolume_delete_failed_total{class=\"fast\"} 1\n"),
        "{metrics}"
    );
    assert!(api.get("pvc-1").is_some(), "PV kept");
}

#[tokio::test(start_paused = true)]
async fn a_cooperative_backend_stops_at_the_deletion_deadline() {
    let backend = Arc::new(FakeProvisioner {
        cooperative_delete: true,
        ..Default::default()
    });
    let (err, events, metrics, took, _api) = sync_with_deletion_timeout(backend).await;
    assert!(matches!(err, SyncError::Backend { .. }), "{err}");
    assert_eq!(took, Duration::from_secs(5));
    assert_eq!(
        events,
        vec![(
            "VolumeFailedDelete".to_string(),
            "delete cancelled at the deadline".to_string()
        )]
    );
    assert!(
        metrics.contains("controller_persistentvolume_delete_failed_total{class=\"fast\"} 1\n"),
        "{metrics}"
    );
}

// ------------------------------------------- decisions re-checked at the side effect

/// A delete decided on a cached (or paused leader's) copy is re-decided on
/// the PV as the API server holds it right before the backend's delete:
/// set to Retain, re-bound to another claim, or no longer Released
/// meanwhile → the volume is kept and nothing fails.
#[tokio::test]
async fn a_delete_decided_on_a_stale_copy_is_not_carried_out() {
    let h = harness(Ok(()), false);
    let mut decided = released("pvc-1", &[]);
    decided.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
        uid: Some("claim-1".into()),
        ..Default::default()
    });
    let changes: [fn(&mut PersistentVolume); 3] = [
        |pv| pv.spec.as_mut().unwrap().persistent_volume_reclaim_policy = Some("Retain".into()),
        |pv| {
            pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("claim-2".into());
        },
        |pv| pv.status.as_mut().unwrap().phase = Some("Available".into()),
    ];
    for change in changes {
        let mut now = decided.clone();
        change(&mut now);
        h.api.put(now);
        h.reclaimer.delete_volume_operation(&decided).await.unwrap();
        assert!(h.backend.deleted().is_empty(), "volume kept");
        assert!(h.api.get("pvc-1").is_some(), "PV kept");
    }
    // Gone meanwhile: nothing to do either.
    h.api.0.lock().unwrap().pvs.clear();
    h.reclaimer.delete_volume_operation(&decided).await.unwrap();
    assert!(h.backend.deleted().is_empty());
    assert!(events(&h).is_empty());
}

/// A leader whose term is no longer current (paused past its Lease) deletes
/// nothing, even when the PV still says Delete.
#[tokio::test(start_paused = true)]
async fn a_leader_past_its_term_deletes_nothing() {
    let api = FakeApi::default();
    let backend = Arc::new(FakeProvisioner::default());
    let live = common::runtime::health::Liveness::default();
    live.set_leading(true);
    let registry = Registry::new();
    let reclaimer = Reclaimer::new(
        Api::all(api.client()),
        backend.clone(),
        Arc::new(Events::default()),
        DeleteMetrics::delete(&registry),
        ME.to_string(),
        false,
    )
    .with_term(live.term(Duration::from_secs(10)));
    api.put(released("pvc-1", &[]));
    tokio::time::advance(Duration::from_secs(30)).await;
    let err = reclaimer
        .sync_volume(&api.get("pvc-1").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, SyncError::NotLeader { .. }), "{err}");
    assert!(backend.deleted().is_empty());
    assert!(api.get("pvc-1").is_some());
    assert!(
        !render(&registry).contains("controller_persistentvolume_delete_failed_total{"),
        "not counted as a failed delete"
    );
    // Renewed again (the Lease is ours): the delete goes ahead.
    live.renewed();
    reclaimer
        .sync_volume(&api.get("pvc-1").unwrap())
        .await
        .unwrap();
    assert_eq!(backend.deleted(), ["pvc-1"]);
}

/// A backend that reads the class at delete gets it as the API server holds
/// it now (`None` when it is gone); a class that cannot be read fails the
/// delete with `VolumeFailedDelete` and touches nothing.
#[tokio::test]
async fn the_class_is_read_at_delete_for_a_backend_that_needs_it() {
    let api = FakeApi::default();
    let backend = Arc::new(FakeProvisioner {
        reads_class: true,
        ..Default::default()
    });
    let events = Arc::new(Events::default());
    let reclaimer = Reclaimer::new(
        Api::all(api.client()),
        backend.clone(),
        events.clone(),
        DeleteMetrics::delete(&Registry::new()),
        ME.to_string(),
        false,
    );
    let class = StorageClass {
        metadata: ObjectMeta {
            name: Some("fast".into()),
            ..Default::default()
        },
        provisioner: ME.into(),
        ..Default::default()
    };
    api.0.lock().unwrap().classes.insert("fast".into(), class);
    api.put(released("pvc-1", &[]));
    reclaimer
        .sync_volume(&api.get("pvc-1").unwrap())
        .await
        .unwrap();
    let mut gone = released("pvc-2", &[]);
    gone.spec.as_mut().unwrap().storage_class_name = Some("deleted".into());
    api.put(gone);
    reclaimer
        .sync_volume(&api.get("pvc-2").unwrap())
        .await
        .unwrap();
    assert_eq!(
        *backend.deleted_with_class.lock().unwrap(),
        [
            ("pvc-1".to_string(), Some("fast".to_string())),
            ("pvc-2".to_string(), None)
        ]
    );
    let mut unreadable = released("pvc-3", &[]);
    unreadable.spec.as_mut().unwrap().storage_class_name = Some("unreadable".into());
    api.put(unreadable);
    let err = reclaimer
        .sync_volume(&api.get("pvc-3").unwrap())
        .await
        .unwrap_err();
    assert!(matches!(err, SyncError::Backend { .. }), "{err}");
    assert_eq!(backend.deleted_with_class.lock().unwrap().len(), 2);
    assert!(api.get("pvc-3").is_some());
    let events = events.0.lock().unwrap();
    assert_eq!(events.len(), 1);
    assert!(
        events[0]
            .1
            .contains("cannot read StorageClass \"unreadable\""),
        "{events:?}"
    );
}

/// `--deletion-timeout` bounds the whole sync (seed), but only a delete that ran out of
/// time is a failed delete: a finalizer update that did gets no `VolumeFailedDelete`.
#[tokio::test(start_paused = true)]
async fn only_a_delete_that_times_out_is_a_failed_delete() {
    let h = harness(Ok(()), true);
    let mut bound = released("pvc-1", &[]);
    bound.status.as_mut().unwrap().phase = Some("Bound".into());
    h.api.put(bound);
    h.api.0.lock().unwrap().hang = Some(http::Method::PATCH);
    let limit = Duration::from_millis(50);
    let err = h
        .reclaimer
        .sync_volume_within(&stored(&h, "pvc-1"), limit)
        .await;
    assert!(matches!(err, Err(SyncError::Timeout(..))), "{err:?}");
    assert!(events(&h).is_empty(), "{:?}", events(&h));
    let failed = |h: &Harness| {
        let samples = delete_samples(&h.registry);
        samples
            .iter()
            .any(|l| l.starts_with("controller_persistentvolume_delete_failed_total{"))
    };
    assert!(!failed(&h), "{:?}", delete_samples(&h.registry));
    // The PV object's DELETE hangs in a delete operation: a failed delete.
    h.api.put(released("pvc-2", &[]));
    h.api.0.lock().unwrap().hang = Some(http::Method::DELETE);
    let err = h
        .reclaimer
        .sync_volume_within(&stored(&h, "pvc-2"), limit)
        .await;
    assert!(matches!(err, Err(SyncError::Timeout(..))), "{err:?}");
    let reasons: Vec<String> = events(&h).into_iter().map(|(r, _)| r).collect();
    assert_eq!(reasons, ["VolumeFailedDelete"]);
    assert!(failed(&h), "{:?}", delete_samples(&h.registry));
}
