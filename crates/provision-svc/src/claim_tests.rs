//! Tests of the claim logic (operation, reconcile and retry rules, cleanup of
//! gone claims) with fake ports and a fake backend.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use api_types::queue::{ProvisionIntent, QueuedPvWrite};
use api_types::{
    ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_PROVISIONER, ANN_DYNAMICALLY_PROVISIONED,
    ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, FINALIZER_PV,
};
use async_trait::async_trait;
use common::handoff::intents::{IntentClaim, IntentEntry};
use common::kube::retry::{FailureThreshold, RetryPolicy};
use k8s_openapi::api::core::v1::{
    Node, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::core::PartialObjectMetaExt;
use kube::runtime::controller::Action;
use kube::runtime::reflector::store::Writer;
use kube::runtime::watcher;
use prometheus::Registry;
use provisioner_api::testing::FakeProvisioner as FakeBackend;
use provisioner_api::{ProvisionError, ProvisioningState};

use crate::controller::{clean_gone_claims, error_policy, reconcile, CachedClaim, Context, Gone};
use crate::decision::ProvisionerNames;
use crate::metrics::ServiceMetrics;
use crate::operation::{Caches, OpError, Operation, Ports, Settings};
use crate::ports::{ClusterApi, Effect, EffectError, IntentLog, PvHandoff, QueuedState};
use crate::recovery::{self, CleanupOutcome};
use common::handoff::queue::QueueError;
use common::kube::cache::NameSet;

const NAME: &str = "example.com/hostpath";

fn pv(name: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// A failed API `call` whose server answered `message`.
fn api_failed(call: &str, message: &str) -> EffectError {
    let status = kube::core::Status::failure(message, "InternalError");
    EffectError::Kube {
        call: call.to_string(),
        source: kube::Error::Api(Box::new(status)),
    }
}

/// A failed Redis command of the queue's `operation`.
fn redis_failed(operation: &'static str, message: &str) -> EffectError {
    let source = redis::RedisError::from(std::io::Error::other(message.to_string()));
    EffectError::Queue(QueueError::Command { operation, source })
}

#[derive(Default)]
struct FakeCluster {
    nodes: HashSet<String>,
    node_error: Option<String>,
    patch_error: Option<String>,
    patched: Mutex<Vec<String>>,
    /// PVs a live GET finds.
    pvs: Mutex<HashSet<String>>,
    /// Uids of the claims a live lookup finds.
    live_claims: Mutex<HashSet<String>>,
    /// Error of every live PV GET.
    pv_error: Option<String>,
    events: Mutex<Vec<(bool, String, String)>>,
    /// PV objects a live GET returns (expansion).
    pv_objects: Mutex<Vec<PersistentVolume>>,
    /// Merge patches sent: (`pv/<name>` or `claim/<name>/status`, patch).
    patches: Mutex<Vec<(String, serde_json::Value)>>,
}

impl FakeCluster {
    fn events(&self) -> Vec<(bool, String, String)> {
        self.events.lock().unwrap().clone()
    }
}

#[async_trait]
impl ClusterApi for FakeCluster {
    async fn get_node(&self, name: &str) -> Effect<Option<Node>> {
        if let Some(e) = &self.node_error {
            return Err(api_failed("get Node", e));
        }
        Ok(self.nodes.contains(name).then(|| Node {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        }))
    }
    async fn pv_exists(&self, name: &str) -> Effect<bool> {
        if let Some(e) = &self.pv_error {
            return Err(api_failed("get PersistentVolume", e));
        }
        Ok(self.pvs.lock().unwrap().contains(name))
    }
    async fn claim_exists(&self, _ns: &str, _name: &str, uid: &str) -> Effect<bool> {
        Ok(self.live_claims.lock().unwrap().contains(uid))
    }
    async fn list_pvs(&self) -> Effect<Vec<PersistentVolume>> {
        if let Some(e) = &self.pv_error {
            return Err(api_failed("list PersistentVolume", e));
        }
        let mut all = self.pv_objects.lock().unwrap().clone();
        all.extend(self.pvs.lock().unwrap().iter().map(|n| pv(n)));
        Ok(all)
    }
    async fn get_pv(&self, name: &str) -> Effect<Option<PersistentVolume>> {
        let pvs = self.pv_objects.lock().unwrap();
        Ok(pvs
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(name))
            .cloned())
    }
    async fn patch_pv(&self, name: &str, patch: &serde_json::Value) -> Effect<()> {
        self.patches
            .lock()
            .unwrap()
            .push((format!("pv/{name}"), patch.clone()));
        Ok(())
    }
    async fn patch_claim_status(
        &self,
        claim: &PersistentVolumeClaim,
        patch: &serde_json::Value,
    ) -> Effect<()> {
        let name = claim.metadata.name.clone().unwrap_or_default();
        self.patches
            .lock()
            .unwrap()
            .push((format!("claim/{name}/status"), patch.clone()));
        Ok(())
    }
    async fn remove_selected_node(&self, claim: &PersistentVolumeClaim) -> Effect<()> {
        self.patched
            .lock()
            .unwrap()
            .push(claim.metadata.name.clone().unwrap_or_default());
        match &self.patch_error {
            Some(e) => Err(api_failed("patch PersistentVolumeClaim", e)),
            None => Ok(()),
        }
    }
    fn claim_event(
        &self,
        _claim: &PersistentVolumeClaim,
        warning: bool,
        reason: &str,
        note: String,
    ) {
        self.events
            .lock()
            .unwrap()
            .push((warning, reason.to_string(), note));
    }
}

#[derive(Default)]
struct FakeHandoff {
    pending: Mutex<HashSet<String>>,
    enqueued: Mutex<Vec<QueuedPvWrite>>,
    fail: bool,
    /// Error of every `is_pending`.
    pending_error: Option<String>,
    /// PV name → (kind, reason) of a stalled entry.
    stalled: Mutex<HashMap<String, (&'static str, String)>>,
    /// The intents the enqueue script clears.
    intents: Option<Arc<FakeIntents>>,
}

#[async_trait]
impl PvHandoff for FakeHandoff {
    async fn is_pending(&self, pv_name: &str) -> Effect<bool> {
        if let Some(e) = &self.pending_error {
            return Err(redis_failed("is_pending", e));
        }
        Ok(self.pending.lock().unwrap().contains(pv_name))
    }
    async fn queued_entry(&self, pv_name: &str, claim_uid: &str) -> Effect<Option<QueuedPvWrite>> {
        if !self.is_pending(pv_name).await? {
            return Ok(None);
        }
        Ok(self
            .enqueued
            .lock()
            .unwrap()
            .iter()
            .rev()
            .find(|e| e.pv_name() == pv_name && e.claim.uid == claim_uid)
            .cloned())
    }
    async fn queued_state(&self, pv_name: &str, _claim_uid: &str) -> Effect<QueuedState> {
        if let Some((kind, reason)) = self.stalled.lock().unwrap().get(pv_name) {
            return Ok(QueuedState::Stalled {
                kind,
                reason: reason.clone(),
            });
        }
        Ok(if self.is_pending(pv_name).await? {
            QueuedState::Yes
        } else {
            QueuedState::No
        })
    }
    async fn enqueue(&self, entry: &QueuedPvWrite) -> Effect<()> {
        if self.fail {
            return Err(redis_failed("enqueue", "redis down"));
        }
        self.pending
            .lock()
            .unwrap()
            .insert(entry.pv_name().to_string());
        self.enqueued.lock().unwrap().push(entry.clone());
        // As the real queue's script: the intent goes in the same step.
        let intents = self.intents.as_ref().expect("wired by Setup::build");
        intents
            .log
            .lock()
            .unwrap()
            .push(format!("enqueue clears {}", entry.pv_name()));
        intents.map.lock().unwrap().remove(entry.pv_name());
        Ok(())
    }
}

#[derive(Default)]
struct FakeIntents {
    /// PV name → intent with its claim snapshot (and in-background flag).
    map: Mutex<HashMap<String, IntentEntry>>,
    log: Mutex<Vec<String>>,
    /// The claim snapshot of every `record`, in order.
    snapshots: Mutex<Vec<PersistentVolumeClaim>>,
}

impl FakeIntents {
    /// Store `entry` as if recorded earlier.
    fn put(&self, entry: &IntentEntry) {
        let pv = entry.intent.pv_name.clone();
        self.map.lock().unwrap().insert(pv, entry.clone());
    }
    /// The in-background flag of `pv_name`'s intent, if one is recorded.
    fn flag(&self, pv_name: &str) -> Option<bool> {
        let map = self.map.lock().unwrap();
        let entry = map.get(pv_name)?;
        Some(entry.claim.as_ref().is_some_and(|c| c.in_background))
    }
    fn has(&self, pv_name: &str) -> bool {
        self.map.lock().unwrap().contains_key(pv_name)
    }
}

#[async_trait]
impl IntentLog for FakeIntents {
    async fn record(
        &self,
        intent: &ProvisionIntent,
        claim: &PersistentVolumeClaim,
        in_background: Option<bool>,
    ) -> Effect<()> {
        let bg = in_background.unwrap_or_else(|| self.flag(&intent.pv_name).unwrap_or(false));
        self.snapshots.lock().unwrap().push(claim.clone());
        self.log
            .lock()
            .unwrap()
            .push(format!("record {} bg={bg}", intent.pv_name));
        self.put(&IntentEntry {
            intent: intent.clone(),
            claim: Some(IntentClaim {
                version: 1,
                in_background: bg,
                claim: claim.clone(),
            }),
        });
        Ok(())
    }
    async fn clear(&self, pv_name: &str) -> Effect<()> {
        self.log.lock().unwrap().push(format!("clear {pv_name}"));
        self.map.lock().unwrap().remove(pv_name);
        Ok(())
    }
    async fn entry(&self, pv_name: &str) -> Effect<Option<IntentEntry>> {
        Ok(self.map.lock().unwrap().get(pv_name).cloned())
    }
    async fn list(&self) -> Effect<(Vec<IntentEntry>, usize)> {
        let entries: Vec<_> = self.map.lock().unwrap().values().cloned().collect();
        let n = entries.len();
        Ok((entries, n))
    }
}

struct World {
    op: Arc<Operation>,
    ctx: Arc<Context>,
    backend: Arc<FakeBackend>,
    cluster: Arc<FakeCluster>,
    handoff: Arc<FakeHandoff>,
    intents: Arc<FakeIntents>,
    claims: Writer<CachedClaim>,
    volumes: NameSet,
    registry: Registry,
}

struct Setup {
    backend: FakeBackend,
    cluster: FakeCluster,
    handoff: FakeHandoff,
    classes: Vec<StorageClass>,
    add_finalizer: bool,
    threshold: u32,
    timeout: Option<Duration>,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            backend: FakeBackend::default(),
            cluster: FakeCluster::default(),
            handoff: FakeHandoff::default(),
            classes: vec![class("fast", NAME, None)],
            add_finalizer: false,
            threshold: 15,
            timeout: None,
        }
    }
}

fn class(name: &str, provisioner: &str, binding: Option<&str>) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        provisioner: provisioner.into(),
        volume_binding_mode: binding.map(str::to_string),
        ..Default::default()
    }
}

fn claim(uid: &str, annotations: &[(&str, &str)]) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            namespace: Some("ns".into()),
            name: Some(format!("claim-{uid}")),
            uid: Some(uid.into()),
            resource_version: Some("5".into()),
            annotations: Some(
                annotations
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect::<BTreeMap<_, _>>(),
            ),
            ..Default::default()
        },
        spec: Some(PersistentVolumeClaimSpec {
            storage_class_name: Some("fast".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// A claim of ours with `annotation` (a selected-node one) set to `node`.
fn on_node(uid: &str, annotation: &str, node: &str) -> PersistentVolumeClaim {
    claim(uid, &[(ANN_STORAGE_PROVISIONER, NAME), (annotation, node)])
}

/// The default set-up with `cluster`.
fn with_cluster(cluster: FakeCluster) -> World {
    Setup {
        cluster,
        ..Default::default()
    }
    .build()
}

/// A set-up whose backend fails `attempts` times (`Finished`), giving up after `threshold` requeues.
fn failing(attempts: usize, threshold: u32) -> World {
    let answers = (0..attempts)
        .map(|_| Err(ProvisionError::finished("nope")))
        .collect();
    Setup {
        backend: FakeBackend::answering(answers),
        threshold,
        ..Default::default()
    }
    .build()
}

/// A set-up with claim `u1` whose backend takes `delay` against a `--provision-timeout` of `timeout`.
fn overrunning(delay: Duration, timeout: Duration) -> World {
    let backend = FakeBackend {
        delay: Some(delay),
        ..Default::default()
    };
    let timeout = Some(timeout);
    let mut w = Setup {
        backend,
        timeout,
        ..Default::default()
    }
    .build();
    w.add_claim(&ours("u1"));
    w
}

/// The default set-up with `backend`.
fn with_backend(backend: FakeBackend) -> World {
    Setup {
        backend,
        ..Default::default()
    }
    .build()
}

fn ours(uid: &str) -> PersistentVolumeClaim {
    claim(uid, &[(ANN_STORAGE_PROVISIONER, NAME)])
}

impl Setup {
    fn build(self) -> World {
        let mut claims = Writer::<CachedClaim>::default();
        let mut classes = Writer::<StorageClass>::default();
        let volumes = NameSet::default();
        claims.apply_watcher_event(&watcher::Event::InitDone);
        for c in self.classes {
            classes.apply_watcher_event(&watcher::Event::Apply(c));
        }
        let caches = Caches {
            claims: claims.as_reader(),
            classes: classes.as_reader(),
            volumes: volumes.clone(),
        };
        let registry = Registry::new();
        let backend = Arc::new(self.backend);
        let cluster = Arc::new(self.cluster);
        let intents = Arc::new(FakeIntents::default());
        let handoff = Arc::new(FakeHandoff {
            intents: Some(intents.clone()),
            ..self.handoff
        });
        let metrics = ServiceMetrics::register(&registry);
        let op = Arc::new(Operation::new(
            Settings {
                names: ProvisionerNames {
                    name: NAME.into(),
                    additional: vec!["legacy.io/hp".into()],
                },
                add_finalizer: self.add_finalizer,
                failure_threshold: FailureThreshold(self.threshold),
                provision_timeout: self.timeout,
            },
            caches.clone(),
            Ports {
                backend: backend.clone(),
                cluster: cluster.clone(),
                handoff: handoff.clone(),
                intents: intents.clone(),
            },
            metrics.clone(),
        ));
        let ctx = Arc::new(Context {
            op: op.clone(),
            retry: RetryPolicy::new(Duration::ZERO, Duration::ZERO, 0.0, 1),
        });
        World {
            op,
            ctx,
            backend,
            cluster,
            handoff,
            intents,
            claims,
            volumes,
            registry,
        }
    }
}

/// What [`error_policy`] answers with the tests' zero backoff: retry now.
fn retried() -> Action {
    Action::requeue(Duration::ZERO)
}

impl World {
    fn add_claim(&mut self, c: &PersistentVolumeClaim) {
        let cached = CachedClaim::new(c.clone());
        self.claims
            .apply_watcher_event(&watcher::Event::Apply(cached));
    }
    fn delete_claim(&mut self, c: &PersistentVolumeClaim) {
        self.claims
            .apply_watcher_event(&watcher::Event::Delete(CachedClaim::new(c.clone())));
    }
    fn cached(&self, uid: &str) -> Option<Arc<CachedClaim>> {
        let claims = &self.op.caches.claims;
        claims.find(|c| kube::Resource::meta(c).uid.as_deref() == Some(uid))
    }
    /// One pass of the controller for the cached claim `uid`: [`reconcile`],
    /// then [`error_policy`] on an error; the action it ends with.
    async fn process(&self, uid: &str) -> Action {
        let cached = self.cached(uid).expect("claim cached");
        match reconcile(cached.clone(), self.ctx.clone()).await {
            Ok(action) => action,
            Err(e) => error_policy(cached, &e, self.ctx.clone()),
        }
    }
    /// Run [`clean_gone_claims`] over `gone` until every cleanup ended.
    async fn clean(&self, gone: Vec<Gone>) {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        for g in gone {
            tx.send(g).unwrap();
        }
        drop(tx);
        let policy = common::kube::retry::Backoff::exponential(
            Duration::from_millis(1),
            Duration::from_millis(10),
        );
        let shutdown = tokio_util::sync::CancellationToken::new();
        clean_gone_claims(self.op.clone(), rx, policy, shutdown).await;
    }
    fn metric(&self, needle: &str) -> String {
        common::runtime::metrics::render(&self.registry)
            .lines()
            .find(|l| l.starts_with(needle))
            .unwrap_or_default()
            .to_string()
    }
    fn enqueued(&self) -> Vec<QueuedPvWrite> {
        self.handoff.enqueued.lock().unwrap().clone()
    }
}

// ---------------------------------------------------------------- claims cache

/// A claim with every field the claim logic or a backend may read, and the
/// bookkeeping the cache drops.
fn full_claim(uid: &str) -> PersistentVolumeClaim {
    let mut c: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "metadata": {
            "labels": {"app": "db"},
            "finalizers": ["kubernetes.io/pvc-protection"],
            "creationTimestamp": "2026-12-01T10:00:00Z",
            "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}]
        },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "1Gi"}},
            "volumeMode": "Filesystem",
            "selector": {"matchLabels": {"tier": "a"}},
            "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}
        },
        "status": {"phase": "Pending"}
    }))
    .unwrap();
    let base = claim(
        uid,
        &[
            (ANN_STORAGE_PROVISIONER, NAME),
            ("nfs.io/storage-path", "db/data"),
            (
                common::kube::cache::LAST_APPLIED_ANNOTATION,
                "{\"big\":true}",
            ),
        ],
    );
    c.metadata.namespace = base.metadata.namespace;
    c.metadata.name = base.metadata.name;
    c.metadata.uid = base.metadata.uid;
    c.metadata.resource_version = base.metadata.resource_version;
    c.metadata.annotations = base.metadata.annotations;
    c.spec.as_mut().unwrap().storage_class_name = Some("fast".into());
    c
}

/// The claims cache holds compact claims (`CachedClaim`); a claim worked on
/// from it is the whole claim as watched, minus `managedFields` and the
/// last-applied annotation: the same `shouldProvision` verdict, the same claim
/// in the intent snapshot and the backend's `ProvisionOptions` (both are the
/// claim being synced), the same queued PV as a claim never cached.
#[tokio::test]
async fn a_claim_from_the_compact_cache_is_the_whole_claim() {
    let full = full_claim("u1");
    let mut stripped = full.clone();
    common::kube::cache::strip_for_cache(&mut stripped);
    assert_ne!(stripped, full, "the fixture carries bookkeeping to drop");

    let mut cached = Setup::default().build();
    cached.add_claim(&full);
    let from_cache = cached.cached("u1").unwrap().object();
    assert_eq!(from_cache, stripped);
    assert_eq!(
        cached.op.should_provision(&from_cache),
        cached.op.should_provision(&full)
    );
    assert_eq!(cached.op.should_provision(&from_cache), Ok(true));
    assert_eq!(cached.process("u1").await, Action::await_change());

    let direct = Setup::default().build();
    direct.op.sync_claim(&stripped).await.unwrap();
    assert_eq!(*cached.intents.snapshots.lock().unwrap(), vec![stripped]);
    assert_eq!(cached.enqueued().len(), 1);
    assert_eq!(cached.enqueued()[0].pv, direct.enqueued()[0].pv);
    assert_eq!(cached.backend.calls(), direct.backend.calls());
}

// ---------------------------------------------------------------- shouldProvision

#[test]
fn should_provision_follows_every_seed_branch() {
    let w = Setup {
        classes: vec![
            class("fast", NAME, None),
            class("late", NAME, Some("WaitForFirstConsumer")),
        ],
        ..Default::default()
    }
    .build();
    let e = &w.op;

    let mut bound = ours("a");
    bound.spec.as_mut().unwrap().volume_name = Some("pv-x".into());
    assert_eq!(e.should_provision(&bound), Ok(false), "volumeName set");
    let mut empty_volume_name = ours("a");
    empty_volume_name.spec.as_mut().unwrap().volume_name = Some(String::new());
    assert_eq!(e.should_provision(&empty_volume_name), Ok(true));

    assert_eq!(
        e.should_provision(&claim("a", &[])),
        Ok(false),
        "no annotation"
    );
    assert_eq!(e.should_provision(&ours("a")), Ok(true));
    assert_eq!(
        e.should_provision(&claim("a", &[(ANN_BETA_STORAGE_PROVISIONER, NAME)])),
        Ok(true),
        "beta annotation fallback"
    );
    assert_eq!(
        e.should_provision(&claim(
            "a",
            &[
                (ANN_STORAGE_PROVISIONER, "other.io/x"),
                (ANN_BETA_STORAGE_PROVISIONER, NAME)
            ]
        )),
        Ok(false),
        "the GA annotation wins over the beta one"
    );
    assert_eq!(
        e.should_provision(&claim("a", &[(ANN_STORAGE_PROVISIONER, "legacy.io/hp")])),
        Ok(true),
        "additional provisioner name"
    );

    let mut missing_class = ours("a");
    missing_class.spec.as_mut().unwrap().storage_class_name = Some("gone".into());
    assert_eq!(
        e.should_provision(&missing_class),
        Err(crate::decision::ClassNotFound("gone".into()))
    );

    let late = |ann: &[(&str, &str)]| {
        let mut c = claim("a", ann);
        c.spec.as_mut().unwrap().storage_class_name = Some("late".into());
        c
    };
    assert_eq!(
        e.should_provision(&late(&[(ANN_STORAGE_PROVISIONER, NAME)])),
        Ok(false)
    );
    assert_eq!(
        e.should_provision(&late(&[
            (ANN_STORAGE_PROVISIONER, NAME),
            (ANN_SELECTED_NODE, "")
        ])),
        Ok(false),
        "empty selected node"
    );
    assert_eq!(
        e.should_provision(&late(&[
            (ANN_STORAGE_PROVISIONER, NAME),
            (ANN_SELECTED_NODE, "n1")
        ])),
        Ok(true)
    );
}

#[test]
fn the_backend_qualifier_can_decline() {
    let w = with_backend(FakeBackend {
        decline: true,
        ..Default::default()
    });
    assert_eq!(w.op.should_provision(&ours("a")), Ok(false));
}

// ---------------------------------------------------------------- provision operation

#[tokio::test]
async fn success_queues_a_complete_pv_and_clears_the_intent() {
    let mut w = Setup {
        add_finalizer: true,
        ..Default::default()
    }
    .build();
    let c = ours("u1");
    w.add_claim(&c);
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));

    assert_eq!(w.backend.calls(), vec!["pvc-u1 node="]);
    let queued = w.enqueued();
    assert_eq!(queued.len(), 1);
    let entry = &queued[0];
    assert_eq!(entry.pv_name(), "pvc-u1");
    assert_eq!(entry.class, "fast");
    assert_eq!(entry.claim.to_string(), "ns/claim-u1");
    assert_eq!(entry.claim.uid, "u1");
    let spec = entry.pv.spec.as_ref().unwrap();
    let claim_ref = spec.claim_ref.as_ref().unwrap();
    assert_eq!(claim_ref.kind.as_deref(), Some("PersistentVolumeClaim"));
    assert_eq!(claim_ref.namespace.as_deref(), Some("ns"));
    assert_eq!(claim_ref.name.as_deref(), Some("claim-u1"));
    assert_eq!(claim_ref.uid.as_deref(), Some("u1"));
    assert_eq!(claim_ref.resource_version.as_deref(), Some("5"));
    assert_eq!(spec.storage_class_name.as_deref(), Some("fast"));
    assert_eq!(
        entry.pv.metadata.finalizers,
        Some(vec![FINALIZER_PV.to_string()])
    );
    assert_eq!(
        entry.pv.metadata.annotations.as_ref().unwrap()[ANN_DYNAMICALLY_PROVISIONED],
        NAME
    );
    assert_eq!(
        w.cluster.events(),
        vec![(
            false,
            "Provisioning".to_string(),
            "External provisioner is provisioning volume for claim \"ns/claim-u1\"".to_string()
        )]
    );
    assert_eq!(
        *w.intents.log.lock().unwrap(),
        vec!["record pvc-u1 bg=false", "enqueue clears pvc-u1"]
    );
    assert_eq!(
        w.metric("provision_svc_volumes_provisioned_total"),
        "provision_svc_volumes_provisioned_total{class=\"fast\"} 1"
    );
    assert_eq!(
        w.metric("provision_svc_provision_duration_seconds_count"),
        "provision_svc_provision_duration_seconds_count{class=\"fast\"} 1"
    );
    w.op.refresh_intent_gauges().await.unwrap();
    assert_eq!(w.metric("provision_svc_intents"), "provision_svc_intents 0");
    assert_eq!(
        w.metric("provision_svc_operations_in_flight"),
        "provision_svc_operations_in_flight 0"
    );

    // A second sync (resync before the PV shows up) stops: the PV is queued.
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert_eq!(w.backend.calls().len(), 1);
}

#[tokio::test]
async fn an_entry_lost_from_redis_is_provisioned_again() {
    // Redis is the only truth about what is queued: when the entry disappears
    // (a Redis crash inside the AOF fsync window) and no PV exists, the next
    // sync provisions again (idempotently) and queues the PV again.
    let w = Setup::default().build();
    let c = ours("u1");
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert_eq!(w.enqueued().len(), 1);
    w.handoff.pending.lock().unwrap().clear();
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert_eq!(w.backend.calls().len(), 2, "provisioned again");
    let queued = w.enqueued();
    assert_eq!(queued.len(), 2, "queued again");
    assert_eq!(queued[1].pv_name(), "pvc-u1");
    assert_eq!(queued[1].claim, queued[0].claim);
}

#[tokio::test]
async fn a_stalled_queue_entry_is_a_warning_and_a_retry_never_a_silent_skip() {
    // Something pv-writer will never write sits under the claim's PV name (a
    // stray payload, or a dead letter): the claim is not "already queued".
    let w = Setup::default().build();
    let c = ours("u1");
    w.handoff.stalled.lock().unwrap().insert(
        "pvc-u1".into(),
        ("dead_lettered", "pv-writer dead-lettered it: bad".into()),
    );
    let err = w.op.sync_claim(&c).await.expect_err("retried, not skipped");
    assert!(
        err.to_string()
            .contains("provisioner-ctl queue requeue pvc-u1"),
        "{err}"
    );
    let events = w.cluster.events();
    assert_eq!(events.len(), 1, "{events:?}");
    let (warning, reason, note) = &events[0];
    assert!(*warning);
    assert_eq!(reason, "ProvisioningFailed");
    assert!(
        note.contains("dead-lettered it: bad") && note.contains("operator"),
        "{note}"
    );
    assert_eq!(
        w.metric("provision_svc_stalled_queue_entries_total"),
        "provision_svc_stalled_queue_entries_total{reason=\"dead_lettered\"} 1"
    );
    assert!(
        w.backend.calls().is_empty(),
        "nothing provisioned meanwhile"
    );
    assert!(w.enqueued().is_empty());
    // Once an operator cleared it, the claim is provisioned as usual.
    w.handoff.stalled.lock().unwrap().clear();
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert_eq!(w.enqueued().len(), 1);
}

#[tokio::test]
async fn a_claim_deleted_while_its_pv_write_is_queued_gets_its_volume_deleted() {
    let w = Setup::default().build();
    for uid in ["u1", "u2"] {
        assert_eq!(w.op.sync_claim(&ours(uid)).await, Ok(()));
    }
    assert_eq!(w.op.sync_claim(&ours("u3")).await, Ok(()));
    // u2's PV was written meanwhile: reclaim's job, not ours; u3's claim is
    // still there (a stale cache): nothing to delete.
    w.cluster.pvs.lock().unwrap().insert("pvc-u2".into());
    w.cluster.live_claims.lock().unwrap().insert("u3".into());
    for uid in ["u1", "u2", "u3", "never-queued"] {
        recovery::cleanup_unwritten_volume(&w.op, uid, None).await;
    }
    let deleted = w.backend.unprovisioned.lock().unwrap().clone();
    assert_eq!(deleted.len(), 1, "{deleted:?}");
    assert!(deleted[0].starts_with("pvc-u1 "), "{deleted:?}");
}

/// pv-writer dropped a deleted claim's queued write before the cleanup ran: the claim's
/// last state decides, only for a claim we would provision, a class that deletes released
/// volumes, and a volume no live PV uses; a failed PV list keeps the volume.
#[tokio::test]
async fn a_claim_deleted_after_pv_writer_dropped_its_write_gets_its_volume_deleted() {
    let mut setup = Setup::default();
    let mut retain = class("keep", NAME, None);
    retain.reclaim_policy = Some("Retain".into());
    setup.classes.push(retain);
    // `restore-u6`, made by hand, uses the directory of `pvc-u6`.
    setup
        .backend
        .uses
        .insert("restore-u6".into(), "pvc-u6".into());
    let w = setup.build();
    assert_eq!(w.op.sync_claim(&ours("u1")).await, Ok(()));
    w.handoff.pending.lock().unwrap().clear();
    let mut dropped = ours("u1");
    let annotations = dropped.metadata.annotations.as_mut().unwrap();
    annotations.insert(ANN_SELECTED_NODE.into(), "node-a".into());
    // u2 was bound (its PV is reclaim's business), u3's PV exists, u4's claim is
    // still there (a stale event), u5 is another provisioner's claim, a PV of another
    // name uses u6's volume, u7's class retains released volumes.
    let mut bound = ours("u2");
    bound.spec.as_mut().unwrap().volume_name = Some("pvc-u2".into());
    w.cluster
        .pvs
        .lock()
        .unwrap()
        .extend(["pvc-u3".into(), "restore-u6".into()]);
    w.cluster.live_claims.lock().unwrap().insert("u4".into());
    let others = claim("u5", &[]);
    let mut retained = ours("u7");
    retained.spec.as_mut().unwrap().storage_class_name = Some("keep".into());
    for last in [
        &dropped,
        &bound,
        &ours("u3"),
        &ours("u4"),
        &others,
        &ours("u6"),
        &retained,
    ] {
        let uid = last.metadata.uid.as_deref().unwrap();
        recovery::cleanup_unwritten_volume(&w.op, uid, Some(last)).await;
    }
    recovery::cleanup_unwritten_volume(&w.op, "u1", None).await;
    let deleted = w.backend.unprovisioned.lock().unwrap().clone();
    assert_eq!(deleted, vec!["pvc-u1 node=node-a class=fast"]);
    let unlisted = Setup {
        cluster: FakeCluster {
            pv_error: Some("apiserver timeout".into()),
            ..Default::default()
        },
        ..Default::default()
    }
    .build();
    recovery::cleanup_unwritten_volume(&unlisted.op, "u1", Some(&dropped)).await;
    assert!(unlisted.backend.unprovisioned.lock().unwrap().is_empty());
}

/// A claim's Delete arrives while a walk's cleanup of it waits for the claim's lock. When
/// the write that lock's holder queued is dropped by pv-writer, the cleanup finds nothing
/// in Redis, and the Delete's last state, run after it, deletes the volume; when the
/// intent or the queued write is still there, it decides alone (one delete).
#[tokio::test(start_paused = true)]
async fn a_delete_during_a_walks_cleanup_of_the_claim_is_run_after_it() {
    let dropped = delete_during_a_walk(false, true).await;
    assert_eq!(dropped, vec!["pvc-u1 node=node-a class=fast"]);
    let intent = delete_during_a_walk(false, false).await;
    assert_eq!(intent, vec!["pvc-u1 node=n9 class=fast"]);
    let queued = delete_during_a_walk(true, true).await;
    assert_eq!(
        queued.len(),
        1,
        "the queued write decided alone: {queued:?}"
    );
}

/// The backend's deletes after a Delete during a walk's cleanup (`queued`: the claim's PV
/// write is queued; `taken`: the intent is gone by the time the cleanup has the lock).
async fn delete_during_a_walk(queued: bool, taken: bool) -> Vec<String> {
    let w = Setup::default().build();
    if queued {
        assert_eq!(w.op.sync_claim(&ours("u1")).await, Ok(()));
    }
    w.intents.put(&entry("u1", Some(true)));
    let held = w.op.locks.lock("u1").await;
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let policy = common::kube::retry::Backoff::exponential(
        Duration::from_millis(1),
        Duration::from_millis(10),
    );
    let run = tokio::spawn(clean_gone_claims(
        w.op.clone(),
        rx,
        policy,
        tokio_util::sync::CancellationToken::new(),
    ));
    tx.send(Gone::Walk).unwrap();
    let mut deleted = ours("u1");
    let annotations = deleted.metadata.annotations.as_mut().unwrap();
    annotations.insert(ANN_SELECTED_NODE.into(), "node-a".into());
    tx.send(Gone::Claim(Box::new(deleted))).unwrap();
    tokio::time::sleep(Duration::from_millis(50)).await;
    if taken {
        // The holder's enqueue took the intent (and pv-writer dropped the write, unless queued).
        w.intents.map.lock().unwrap().clear();
    }
    drop(held);
    // Paused time: the sleep ends once every task is idle, both cleanups done.
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(tx);
    run.await.unwrap();
    let deletes = w.backend.unprovisioned.lock().unwrap().clone();
    deletes
}

#[tokio::test]
async fn no_finalizer_without_the_flag() {
    let w = Setup::default().build();
    w.op.sync_claim(&ours("u1")).await.unwrap();
    assert_eq!(w.enqueued()[0].pv.metadata.finalizers, None);
}

#[tokio::test]
async fn existing_or_pending_pv_stops_without_calling_the_backend() {
    let w = Setup::default().build();
    w.volumes.apply_watcher_event(&watcher::Event::Apply(
        pv("pvc-u1")
            .metadata
            .into_response_partial::<PersistentVolume>(),
    ));
    w.handoff.pending.lock().unwrap().insert("pvc-u2".into());
    for uid in ["u1", "u2"] {
        let (state, result) = w.op.provision_claim_operation(&ours(uid)).await;
        assert_eq!(
            (state, result),
            (ProvisioningState::Finished, Err(OpError::Stop))
        );
        assert_eq!(w.op.sync_claim(&ours(uid)).await, Ok(()));
    }
    assert!(w.backend.calls().is_empty());
    assert!(w.cluster.events().is_empty());
    assert_eq!(
        w.metric("provision_svc_provision_failed_total"),
        "provision_svc_provision_failed_total{class=\"fast\"} 2",
        "the seed counts errStopProvision as a failed attempt"
    );
}

#[tokio::test]
async fn block_mode_without_backend_support_fails_with_an_event_and_stops() {
    let w = Setup::default().build();
    let mut c = ours("u1");
    c.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (ProvisioningState::Finished, Err(OpError::Stop))
    );
    assert_eq!(
        w.cluster.events(),
        vec![(
            true,
            "ProvisioningFailed".to_string(),
            "example.com/hostpath does not support block volume provisioning".to_string()
        )]
    );
    assert!(w.backend.calls().is_empty());
}

#[tokio::test]
async fn missing_class_retries_and_foreign_class_stops() {
    let w = Setup {
        classes: vec![class("foreign", "other.io/x", None)],
        ..Default::default()
    }
    .build();
    assert_eq!(
        w.op.provision_claim_operation(&ours("u1")).await,
        (
            ProvisioningState::Finished,
            Err(OpError::Failed("storageClass \"fast\" not found".into()))
        )
    );
    let mut c = ours("u2");
    c.spec.as_mut().unwrap().storage_class_name = Some("foreign".into());
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (ProvisioningState::Finished, Err(OpError::Stop))
    );
    assert!(w.backend.calls().is_empty());
}

#[tokio::test]
async fn selected_node_found_is_passed_to_the_backend_alpha_annotation_too() {
    let w = with_cluster(FakeCluster {
        nodes: HashSet::from(["n1".to_string(), "n2".to_string()]),
        ..Default::default()
    });
    let c = on_node("u1", ANN_SELECTED_NODE, "n1");
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    let c = on_node("u2", ANN_ALPHA_SELECTED_NODE, "n2");
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert_eq!(w.backend.calls(), vec!["pvc-u1 node=n1", "pvc-u2 node=n2"]);
}

#[tokio::test]
async fn node_not_found_reschedules_by_removing_the_selected_node() {
    let w = Setup::default().build();
    let c = on_node("u1", ANN_SELECTED_NODE, "n1");
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (ProvisioningState::Finished, Err(OpError::Stop))
    );
    assert_eq!(*w.cluster.patched.lock().unwrap(), vec!["claim-u1"]);
    assert_eq!(
        w.cluster.events(),
        vec![(
            true,
            "ProvisioningFailed".to_string(),
            "nodes \"n1\" not found".to_string()
        )]
    );
    assert!(w.backend.calls().is_empty());

    // Only the alpha annotation: nothing to remove, treated as Finished with the error.
    let c = on_node("u2", ANN_ALPHA_SELECTED_NODE, "n1");
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (
            ProvisioningState::Finished,
            Err(OpError::Failed("nodes \"n1\" not found".into()))
        )
    );
    assert_eq!(w.cluster.patched.lock().unwrap().len(), 1);
}

#[tokio::test]
async fn failed_reschedule_patch_keeps_the_claim_for_a_retry() {
    let w = with_cluster(FakeCluster {
        patch_error: Some("conflict".into()),
        ..Default::default()
    });
    let c = on_node("u1", ANN_SELECTED_NODE, "n1");
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (
            ProvisioningState::Finished,
            Err(OpError::Failed("nodes \"n1\" not found".into()))
        )
    );
}

#[tokio::test]
async fn node_lookup_error_is_an_event_and_a_retry() {
    let w = with_cluster(FakeCluster {
        node_error: Some("boom".into()),
        ..Default::default()
    });
    let c = on_node("u1", ANN_SELECTED_NODE, "n1");
    assert_eq!(
        w.op.provision_claim_operation(&c).await,
        (
            ProvisioningState::NoChange,
            Err(OpError::Failed(
                "failed to get target node: get Node: boom (InternalError)".into()
            ))
        )
    );
    assert_eq!(
        w.cluster.events(),
        vec![(
            true,
            "ProvisioningFailed".to_string(),
            "failed to get target node: get Node: boom (InternalError)".to_string()
        )]
    );
}

#[tokio::test]
async fn ignored_error_stops_quietly_and_clears_the_intent() {
    let w = with_backend(FakeBackend::answering(vec![Err(ProvisionError::Ignored {
        reason: "not mine".into(),
    })]));
    assert_eq!(w.op.sync_claim(&ours("u1")).await, Ok(()));
    let events = w.cluster.events();
    assert_eq!(events.len(), 1, "only the Provisioning event: {events:?}");
    assert_eq!(events[0].1, "Provisioning");
    assert!(w.intents.map.lock().unwrap().is_empty());
    assert!(w.enqueued().is_empty());
}

#[tokio::test]
async fn backend_failure_states_are_handled_as_the_seed() {
    let failed = |state| {
        Err(ProvisionError::Failed {
            state,
            reason: "disk full".into(),
        })
    };
    let w = Setup {
        backend: FakeBackend::answering(vec![
            failed(ProvisioningState::Finished),
            failed(ProvisioningState::NoChange),
            failed(ProvisioningState::Reschedule),
            failed(ProvisioningState::Reschedule),
        ]),
        ..Default::default()
    }
    .build();
    let msg = "failed to provision volume with StorageClass \"fast\": disk full".to_string();

    // Finished: retried, intent cleared.
    assert_eq!(
        w.op.sync_claim(&ours("u1")).await,
        Err(OpError::Failed(msg.clone()))
    );
    assert!(!w.intents.map.lock().unwrap().contains_key("pvc-u1"));
    // NoChange: retried, intent kept, not in background.
    assert_eq!(
        w.op.sync_claim(&ours("u2")).await,
        Err(OpError::Failed(msg.clone()))
    );
    assert_eq!(w.intents.flag("pvc-u2"), Some(false), "not in background");
    // Reschedule with a selected node: annotation removed, stop.
    let c = on_node("u3", ANN_SELECTED_NODE, "n1");
    let w_nodes = Setup {
        backend: FakeBackend::answering(vec![failed(ProvisioningState::Reschedule)]),
        cluster: FakeCluster {
            nodes: HashSet::from(["n1".to_string()]),
            ..Default::default()
        },
        ..Default::default()
    }
    .build();
    assert_eq!(w_nodes.op.sync_claim(&c).await, Ok(()));
    assert_eq!(*w_nodes.cluster.patched.lock().unwrap(), vec!["claim-u3"]);
    // Reschedule without a selected node: treated as Finished.
    assert_eq!(
        w.op.provision_claim_operation(&ours("u4")).await,
        (
            ProvisioningState::Finished,
            Err(OpError::Failed(msg.clone()))
        )
    );
    let warnings: Vec<_> = w.cluster.events().into_iter().filter(|e| e.0).collect();
    assert_eq!(warnings.len(), 3);
    assert!(warnings
        .iter()
        .all(|e| e.1 == "ProvisioningFailed" && e.2 == msg));
}

/// A deliberate difference from the seed (which calls `Provision` again for
/// a deleted claim still in `claimsInProgress`): a claim deleted while its
/// volume is made in background gets the cleanup of any gone claim, so the
/// half-made volume is deleted, never provisioned further.
#[tokio::test]
async fn a_claim_deleted_while_in_background_gets_its_volume_deleted_not_provisioned() {
    let mut w = with_backend(FakeBackend::answering(vec![Err(ProvisionError::Failed {
        state: ProvisioningState::InBackground,
        reason: "still creating".into(),
    })]));
    let c = ours("u1");
    w.add_claim(&c);
    assert_eq!(w.process("u1").await, retried());
    assert_eq!(
        w.intents.flag("pvc-u1"),
        Some(true),
        "durably in background"
    );
    w.op.refresh_intent_gauges().await.unwrap();
    assert_eq!(
        w.metric("provision_svc_claims_in_background"),
        "provision_svc_claims_in_background 1"
    );

    w.delete_claim(&c);
    w.clean(vec![
        Gone::Claim(Box::new(c.clone())),
        // Another provisioner's claim: nothing of ours to clean up.
        Gone::Claim(Box::new(claim("never-seen", &[]))),
    ])
    .await;
    assert_eq!(
        w.backend.calls().len(),
        1,
        "provision() is not called again"
    );
    assert!(w.enqueued().is_empty());
    assert_eq!(
        *w.backend.unprovisioned.lock().unwrap(),
        vec!["pvc-u1 node= class=fast"],
        "only the half-made volume is deleted"
    );
    assert!(!w.intents.has("pvc-u1"));
    assert_eq!(
        *w.intents.log.lock().unwrap(),
        vec![
            "record pvc-u1 bg=false",
            "record pvc-u1 bg=true",
            "clear pvc-u1"
        ]
    );
}

/// A claim deleted while its sync runs: the cleanup waits for the sync (one
/// at a time per claim) and then sees what the sync left; a sync that starts
/// after the cleanup finds the claim gone and does nothing.
#[tokio::test(start_paused = true)]
async fn a_sync_and_the_cleanup_of_the_same_claim_never_overlap() {
    let mut w = with_backend(FakeBackend {
        delay: Some(Duration::from_secs(5)),
        ..Default::default()
    });
    let c = ours("u1");
    w.add_claim(&c);
    let cached = w.cached("u1").unwrap();
    let sync = tokio::spawn(reconcile(cached.clone(), w.ctx.clone()));
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(
        w.backend.calls().len(),
        1,
        "the backend is making the volume"
    );
    w.delete_claim(&c);
    let clean = w.clean(vec![Gone::Claim(Box::new(c.clone()))]);
    tokio::pin!(clean);
    assert!(
        tokio::time::timeout(Duration::from_secs(2), &mut clean)
            .await
            .is_err(),
        "the cleanup waits for the sync"
    );
    assert_eq!(sync.await.unwrap().unwrap(), Action::await_change());
    clean.await;
    assert_eq!(
        w.enqueued().len(),
        1,
        "the sync ran to its end: PV write queued"
    );
    assert_eq!(
        *w.backend.unprovisioned.lock().unwrap(),
        vec!["pvc-u1 node= class=fast"],
        "then the cleanup: pv-writer drops a write whose claim is gone, so its volume goes"
    );
    // A sync of the stale claim after the cleanup: nothing happens.
    assert_eq!(
        reconcile(cached, w.ctx.clone()).await.unwrap(),
        Action::await_change()
    );
    assert_eq!(w.backend.calls().len(), 1);
}

#[tokio::test]
async fn enqueue_failure_retries_and_keeps_the_intent() {
    let w = Setup {
        handoff: FakeHandoff {
            fail: true,
            ..Default::default()
        },
        ..Default::default()
    }
    .build();
    let err = w.op.sync_claim(&ours("u1")).await.unwrap_err();
    assert!(matches!(err, OpError::NotQueued(_)), "{err:?}");
    let err = err.to_string();
    assert!(
        err.starts_with("queueing PV \"pvc-u1\" for pv-writer: "),
        "{err}"
    );
    assert!(err.contains("redis down"), "{err}");
    assert_eq!(
        w.intents.flag("pvc-u1"),
        Some(false),
        "kept, not in background"
    );
    w.op.refresh_intent_gauges().await.unwrap();
    assert_eq!(w.metric("provision_svc_intents"), "provision_svc_intents 1");
}

#[tokio::test]
async fn failure_threshold_gives_up_after_the_configured_requeues() {
    let mut w = failing(5, 2);
    w.add_claim(&ours("u1"));
    assert_eq!(w.process("u1").await, retried()); // requeues 0 < 2
    assert_eq!(w.process("u1").await, retried()); // requeues 1 < 2
    assert_eq!(w.process("u1").await, Action::await_change()); // 2: give up
    assert_eq!(w.backend.calls().len(), 3);
}

#[tokio::test]
async fn threshold_zero_retries_forever_and_success_forgets() {
    let mut w = failing(20, 0);
    w.add_claim(&ours("u1"));
    for _ in 0..20 {
        assert_eq!(w.process("u1").await, retried());
    }
    // The 21st attempt succeeds, and its failures are forgotten.
    assert_eq!(w.process("u1").await, Action::await_change());
    assert_eq!(w.enqueued().len(), 1);
    assert_eq!(w.ctx.retry.requeues(&"u1".to_string()), 0);
}

#[tokio::test(start_paused = true)]
async fn provision_timeout_fails_the_attempt_and_requeues() {
    let w = overrunning(Duration::from_secs(5), Duration::from_millis(20));
    assert_eq!(w.process("u1").await, retried());
    assert!(w.enqueued().is_empty());
    assert!(
        w.intents.has("pvc-u1"),
        "an interrupted attempt keeps its intent"
    );
    assert_eq!(
        w.metric("provision_svc_operations_in_flight"),
        "provision_svc_operations_in_flight 0",
        "a timed-out operation is no longer counted in flight"
    );
}

/// Seed: `--provision-timeout` is a context cancellation that flows through
/// `provisionClaimOperation` as an error: a `ProvisioningFailed` event, the
/// failure metric, and (the backend may still be making the volume) the
/// claim kept in background, durably.
#[tokio::test(start_paused = true)]
async fn a_backend_overrunning_the_provision_timeout_fails_like_the_seeds_cancelled_context() {
    let w = overrunning(Duration::from_secs(3600), Duration::from_secs(10));
    let start = tokio::time::Instant::now();
    assert_eq!(w.process("u1").await, retried());
    assert_eq!(
        start.elapsed(),
        Duration::from_secs(10) + provisioner_api::deadline::ABANDON_GRACE,
        "abandoned right after the deadline's grace"
    );
    let failed: Vec<_> = w
        .cluster
        .events()
        .into_iter()
        .filter(|(warn, r, _)| *warn && r == "ProvisioningFailed")
        .collect();
    assert_eq!(failed.len(), 1, "{:?}", w.cluster.events());
    assert!(
        failed[0].2.contains("context deadline exceeded"),
        "{failed:?}"
    );
    assert_eq!(
        w.metric("provision_svc_provision_failed_total"),
        r#"provision_svc_provision_failed_total{class="fast"} 1"#
    );
    assert_eq!(
        w.intents.flag("pvc-u1"),
        Some(true),
        "handled as in background, durably"
    );
    assert!(w.enqueued().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_cooperative_backend_stops_at_the_deadline_with_its_own_error() {
    let mut w = Setup {
        backend: FakeBackend {
            cooperative: Some(ProvisioningState::NoChange),
            ..Default::default()
        },
        timeout: Some(Duration::from_secs(10)),
        ..Default::default()
    }
    .build();
    w.add_claim(&ours("u1"));
    let start = tokio::time::Instant::now();
    assert_eq!(w.process("u1").await, retried());
    assert_eq!(start.elapsed(), Duration::from_secs(10));
    let events = w.cluster.events();
    assert!(
        events.iter().any(|(w, r, n)| *w
            && r == "ProvisioningFailed"
            && n.contains("stopped at the deadline")),
        "{events:?}"
    );
    assert_eq!(
        w.metric("provision_svc_provision_failed_total"),
        r#"provision_svc_provision_failed_total{class="fast"} 1"#
    );
    assert_eq!(
        w.intents.flag("pvc-u1"),
        Some(false),
        "the backend's own state (NoChange) is respected"
    );
}

// ---------------------------------------------------------------- start-up walk

fn entry(uid: &str, snapshot: Option<bool>) -> IntentEntry {
    IntentEntry {
        intent: ProvisionIntent {
            version: 1,
            claim: api_types::queue::ClaimKey::of(&ours(uid)).unwrap(),
            pv_name: format!("pvc-{uid}"),
            class: "fast".into(),
            recorded_at_ms: 1,
            storage_class: None,
            selected_node: None,
        },
        claim: snapshot.map(|bg| IntentClaim {
            version: 1,
            in_background: bg,
            claim: claim(
                uid,
                &[(ANN_STORAGE_PROVISIONER, NAME), (ANN_SELECTED_NODE, "n9")],
            ),
        }),
    }
}

/// The walk at every claims (re)list: every intent whose claim is not cached
/// is cleaned up (the volume deleted from the record, or kept when a PV
/// carries it); a cached claim's intent is left to its sync.
#[tokio::test]
async fn the_walk_cleans_up_after_every_claim_that_is_gone() {
    let mut w = Setup::default().build();
    w.add_claim(&ours("present"));
    // The PV exists on the API server but the reflector cache lags behind.
    w.cluster.pvs.lock().unwrap().insert("pvc-made".into());
    for e in [
        entry("bg", Some(true)),
        entry("present", Some(false)),
        entry("made", Some(false)),
        entry("gone", Some(false)),
        entry("bare", None),
    ] {
        w.intents.put(&e);
    }
    let mut gone = recovery::walk(&w.op, true).await.unwrap();
    gone.sort();
    assert_eq!(gone, vec!["bare", "bg", "gone", "made"]);
    w.clean(vec![Gone::Walk]).await;
    let remaining: Vec<String> = w.intents.map.lock().unwrap().keys().cloned().collect();
    assert_eq!(remaining, vec!["pvc-present"]);
    assert!(
        w.backend.calls().is_empty(),
        "provision() is never called for a claim that is gone"
    );
    let mut deleted = w.backend.unprovisioned.lock().unwrap().clone();
    deleted.sort();
    assert_eq!(
        deleted,
        vec![
            "pvc-bare node= class=fast",
            "pvc-bg node=n9 class=fast",
            "pvc-gone node=n9 class=fast"
        ]
    );
    assert!(w.backend.deleted.lock().unwrap().is_empty());
}

#[tokio::test]
async fn cleanup_retries_while_the_backend_is_busy() {
    let w = with_backend(FakeBackend {
        fail: ["pvc-gone".to_string()].into(),
        ..Default::default()
    });
    let e = entry("gone", Some(false));
    w.intents.put(&e);
    assert_eq!(
        recovery::cleanup_gone_claim(&w.op, &e).await,
        CleanupOutcome::Retry("backend delete: busy".into())
    );
    assert!(w.backend.calls().is_empty());
    assert!(w.intents.map.lock().unwrap().contains_key("pvc-gone"));
}

/// A version-2 intent of a deleted claim, recorded without a claim snapshot,
/// whose StorageClass has since been deleted: the volume is still removed
/// from the record alone (recorded class and node), never by provisioning.
#[tokio::test]
async fn a_deleted_claims_volume_is_removed_from_the_intent_alone() {
    let w = Setup {
        classes: vec![],
        ..Default::default()
    }
    .build();
    let mut e = entry("gone", None);
    e.intent.version = api_types::queue::INTENT_VERSION;
    e.intent.storage_class = Some(class("recorded", NAME, None));
    e.intent.selected_node = Some("n3".into());
    w.intents.put(&e);
    w.clean(vec![Gone::Walk]).await;
    assert!(w.backend.calls().is_empty(), "no provision() call");
    assert_eq!(
        *w.backend.unprovisioned.lock().unwrap(),
        vec!["pvc-gone node=n3 class=recorded"]
    );
    assert!(w.intents.map.lock().unwrap().is_empty());
}

/// One poisoned intent (the backend refuses; a version-1 record whose class
/// is gone) and one that keeps failing never hold up the others; the
/// poisoned ones are counted once and not retried in a loop.
#[tokio::test(start_paused = true)]
async fn bad_intents_do_not_block_the_rest_of_the_cleanup() {
    let w = with_backend(FakeBackend {
        refuse: ["pvc-refused".to_string()].into(),
        fail: ["pvc-flaky".to_string()].into(),
        ..Default::default()
    });
    let mut no_class = entry("noclass", Some(false));
    no_class.intent.class = "deleted-class".into();
    let mut entries = vec![
        entry("refused", Some(false)),
        entry("flaky", Some(false)),
        no_class,
    ];
    for i in 0..20 {
        entries.push(entry(&format!("ok{i}"), Some(false)));
    }
    for e in &entries {
        w.intents.put(e);
    }
    let shutdown = tokio_util::sync::CancellationToken::new();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tx.send(Gone::Walk).unwrap();
    let run = tokio::spawn(clean_gone_claims(
        w.op.clone(),
        rx,
        common::kube::retry::Backoff::exponential(Duration::from_secs(1), Duration::from_secs(60)),
        shutdown.clone(),
    ));
    tokio::time::sleep(Duration::from_secs(600)).await;
    let remaining: HashSet<String> = w.intents.map.lock().unwrap().keys().cloned().collect();
    assert_eq!(
        remaining,
        ["pvc-refused", "pvc-flaky", "pvc-noclass"]
            .map(String::from)
            .into(),
        "every good entry was cleaned up; bad ones are kept for an operator"
    );
    assert_eq!(
        w.metric("provision_svc_poisoned_intents_total"),
        "provision_svc_poisoned_intents_total 2"
    );
    let calls = w.backend.unprovisioned.lock().unwrap().clone();
    let count = |pv: &str| {
        calls
            .iter()
            .filter(|c| c.starts_with(&format!("{pv} ")))
            .count()
    };
    assert_eq!(count("pvc-refused"), 1, "a refused intent is not retried");
    assert_eq!(count("pvc-noclass"), 0, "no made-up class is ever passed");
    let flaky = count("pvc-flaky");
    assert!(
        (5..=20).contains(&flaky),
        "a failing entry is retried with backoff, not in a tight loop: {flaky} attempts in 600 s"
    );
    assert!(w.backend.calls().is_empty());
    shutdown.cancel();
    drop(tx);
    tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("cleanup stops on shutdown")
        .unwrap();
}

#[tokio::test]
async fn walk_checks_the_queue_then_the_live_pv_and_never_deletes_on_an_error() {
    // A PV write still queued: present, intent cleared, nothing deleted.
    let w = Setup::default().build();
    w.handoff.pending.lock().unwrap().insert("pvc-q".into());
    let e = entry("q", Some(false));
    w.intents.put(&e);
    w.clean(vec![Gone::Walk]).await;
    assert!(w.intents.map.lock().unwrap().is_empty());
    assert!(w.backend.unprovisioned.lock().unwrap().is_empty());

    // Queue lookup fails: the cleanup keeps retrying and deletes nothing.
    let w = Setup {
        handoff: FakeHandoff {
            pending_error: Some("redis down".into()),
            ..Default::default()
        },
        ..Default::default()
    }
    .build();
    let e = entry("gone", Some(false));
    w.intents.put(&e);
    assert_eq!(
        recovery::cleanup_gone_claim(&w.op, &e).await,
        CleanupOutcome::Retry("Redis command is_pending failed: redis down".into())
    );
    assert!(w.backend.calls().is_empty());
    assert!(w.backend.deleted.lock().unwrap().is_empty());
    assert!(w.intents.map.lock().unwrap().contains_key("pvc-gone"));

    // Live PV GET fails: same, and without a snapshot the intent is kept.
    let w = with_cluster(FakeCluster {
        pv_error: Some("apiserver timeout".into()),
        ..Default::default()
    });
    let bare = entry("bare", None);
    w.intents.put(&bare);
    assert_eq!(
        recovery::cleanup_gone_claim(&w.op, &bare).await,
        CleanupOutcome::Retry("get PersistentVolume: apiserver timeout (InternalError)".into())
    );
    assert!(w.backend.deleted.lock().unwrap().is_empty());
    assert!(w.intents.map.lock().unwrap().contains_key("pvc-bare"));

    // PV written between the walk and the cleanup: the cleanup re-checks.
    let w = Setup::default().build();
    let e = entry("late", Some(false));
    w.intents.put(&e);
    assert_eq!(recovery::walk(&w.op, true).await.unwrap(), vec!["late"]);
    w.cluster.pvs.lock().unwrap().insert("pvc-late".into());
    assert_eq!(
        recovery::cleanup_gone_claim(&w.op, &e).await,
        CleanupOutcome::Done
    );
    assert!(w.backend.calls().is_empty());
    assert!(w.backend.deleted.lock().unwrap().is_empty());
    assert!(w.intents.map.lock().unwrap().is_empty());
}

/// Seed: giving up on a claim drops it from `claimsInProgress`; here the
/// intent (kept for the next walk) loses its durable in-background flag.
#[tokio::test]
async fn giving_up_on_an_in_background_claim_clears_its_durable_flag() {
    let in_background = || {
        Err(ProvisionError::Failed {
            state: ProvisioningState::InBackground,
            reason: "still creating".into(),
        })
    };
    let mut w = Setup {
        backend: FakeBackend::answering(vec![in_background(), in_background()]),
        threshold: 1,
        ..Default::default()
    }
    .build();
    w.add_claim(&ours("u1"));
    assert_eq!(w.process("u1").await, retried());
    assert_eq!(w.intents.flag("pvc-u1"), Some(true));
    assert_eq!(w.process("u1").await, Action::await_change(), "given up");
    assert_eq!(
        w.intents.flag("pvc-u1"),
        Some(false),
        "intent kept, flag cleared"
    );
    assert_eq!(
        *w.intents.log.lock().unwrap(),
        vec![
            "record pvc-u1 bg=false",
            "record pvc-u1 bg=true",
            "record pvc-u1 bg=true",
            "record pvc-u1 bg=true",
            "record pvc-u1 bg=false",
        ]
    );
}

#[tokio::test]
async fn the_queued_entry_carries_the_claims_first_attempt_across_retries() {
    let mut w = Setup {
        backend: FakeBackend::answering(vec![Err(ProvisionError::finished("nope"))]),
        threshold: 0,
        ..Default::default()
    }
    .build();
    w.add_claim(&ours("u1"));
    let before_first = common::kube::time::now_ms();
    assert_eq!(w.process("u1").await, retried());
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(w.process("u1").await, Action::await_change(), "PV queued");
    let queued = w.enqueued();
    assert_eq!(queued.len(), 1);
    let entry = &queued[0];
    assert_eq!(entry.version, api_types::queue::QUEUE_ENTRY_VERSION);
    let first = entry.first_attempt_at_ms.expect("first attempt recorded");
    assert!(first >= before_first, "{first} < {before_first}");
    assert!(
        entry.enqueued_at_ms >= first + 50,
        "the first attempt ({first}) is the failed one, not the one that queued ({})",
        entry.enqueued_at_ms
    );
    // provision-svc's own stage: one failed attempt, one volume queued.
    assert_eq!(
        w.metric("provision_svc_provision_failed_total"),
        r#"provision_svc_provision_failed_total{class="fast"} 1"#
    );
    assert_eq!(
        w.metric("provision_svc_volumes_provisioned_total"),
        r#"provision_svc_volumes_provisioned_total{class="fast"} 1"#
    );
}

/// A claim of ours Bound to `pvc-<uid>` that asks for `request` with `capacity` in its status.
fn bound(uid: &str, request: &str, capacity: &str) -> PersistentVolumeClaim {
    use k8s_openapi::api::core::v1::{PersistentVolumeClaimStatus, VolumeResourceRequirements};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    let mut c = claim(uid, &[(ANN_STORAGE_PROVISIONER, NAME)]);
    let spec = c.spec.as_mut().unwrap();
    spec.volume_name = Some(format!("pvc-{uid}"));
    let storage = |q: &str| BTreeMap::from([("storage".to_string(), Quantity(q.into()))]);
    spec.resources = Some(VolumeResourceRequirements {
        requests: Some(storage(request)),
        ..Default::default()
    });
    c.status = Some(PersistentVolumeClaimStatus {
        phase: Some("Bound".into()),
        capacity: Some(storage(capacity)),
        ..Default::default()
    });
    c
}

/// The PV of `claim`, provisioned by us with `capacity`.
fn volume_of(claim: &PersistentVolumeClaim, capacity: &str) -> PersistentVolume {
    use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    PersistentVolume {
        metadata: ObjectMeta {
            name: claim.spec.as_ref().unwrap().volume_name.clone(),
            annotations: Some(BTreeMap::from([(
                api_types::ANN_DYNAMICALLY_PROVISIONED.to_string(),
                NAME.to_string(),
            )])),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([(
                "storage".to_string(),
                Quantity(capacity.into()),
            )])),
            claim_ref: Some(ObjectReference {
                uid: claim.metadata.uid.clone(),
                ..Default::default()
            }),
            ..Default::default()
        }),
        status: None,
    }
}

/// A set-up whose class `fast` allows expansion (or not) and whose API server has `pv`.
fn expandable(allow: bool, pv: PersistentVolume) -> World {
    let mut fast = class("fast", NAME, None);
    fast.allow_volume_expansion = Some(allow);
    let cluster = FakeCluster {
        pv_objects: Mutex::new(vec![pv]),
        ..Default::default()
    };
    Setup {
        cluster,
        classes: vec![fast],
        ..Default::default()
    }
    .build()
}

/// One pass on a Bound claim asking for 2Mi (status 1Mi) whose PV has `pv_size`.
async fn grown_to_2mi_with_a_pv_of(pv_size: &str) -> World {
    let c = bound("u1", "2Mi", "1Mi");
    let mut w = expandable(true, volume_of(&c, pv_size));
    w.add_claim(&c);
    assert_eq!(w.process("u1").await, Action::await_change());
    w
}

#[tokio::test]
async fn a_grown_request_grows_the_pv_then_the_claims_status_as_the_resizer_does() {
    let w = grown_to_2mi_with_a_pv_of("1Mi").await;
    let patches = w.cluster.patches.lock().unwrap().clone();
    let targets: Vec<&str> = patches.iter().map(|(t, _)| t.as_str()).collect();
    assert_eq!(
        targets,
        [
            "claim/claim-u1/status",
            "pv/pvc-u1",
            "claim/claim-u1/status"
        ]
    );
    assert_eq!(patches[0].1["status"]["conditions"][0]["type"], "Resizing");
    assert_eq!(patches[0].1["status"]["conditions"][0]["status"], "True");
    assert_eq!(
        patches[1].1,
        serde_json::json!({"spec": {"capacity": {"storage": "2Mi"}}})
    );
    assert_eq!(
        patches[2].1,
        serde_json::json!({"status": {"capacity": {"storage": "2Mi"}, "conditions": []}})
    );
    let reasons: Vec<String> = w.cluster.events().into_iter().map(|e| e.1).collect();
    assert_eq!(reasons, ["Resizing", "VolumeResizeSuccessful"]);
    assert!(w.enqueued().is_empty(), "nothing provisioned");
}

/// A second pass on a claim whose cached status predates the first pass's status patch (the
/// PV is grown already) completes the status without a second `VolumeResizeSuccessful` (the
/// node scenario saw two).
#[tokio::test]
async fn a_pass_on_a_stale_claim_after_the_pv_grew_publishes_no_second_success() {
    let w = grown_to_2mi_with_a_pv_of("2Mi").await;
    let patched: Vec<String> = w
        .cluster
        .patches
        .lock()
        .unwrap()
        .iter()
        .map(|p| p.0.clone())
        .collect();
    assert_eq!(patched, ["claim/claim-u1/status"]);
    assert!(w.cluster.events().is_empty(), "{:?}", w.cluster.events());
}

#[tokio::test]
async fn shrinking_a_class_without_expansion_or_a_foreign_pv_is_a_warning_and_no_change() {
    let c = bound("u1", "2Mi", "1Mi");
    for (allow, pv, expected) in [
        (
            true,
            volume_of(&c, "4Mi"),
            "shrinking volume pvc-u1 from 4194304 to 2097152 is not supported",
        ),
        (
            false,
            volume_of(&c, "1Mi"),
            "StorageClass \"fast\" does not allow volume expansion",
        ),
        (
            true,
            volume_of(&bound("u2", "1Mi", "1Mi"), "1Mi"),
            "PV pvc-u2 was",
        ),
    ] {
        let mut pv = pv;
        pv.metadata.name = Some("pvc-u1".into());
        if expected.starts_with("PV") {
            pv.metadata.annotations = None;
        }
        let w = expandable(allow, pv);
        let want = crate::resize::wanted(&c, &w.op.settings.names).expect("growth wanted");
        let resized = crate::resize::resize(&w.op, &c, want).await;
        assert_eq!(resized, Ok(()), "{expected}");
        assert!(w.cluster.patches.lock().unwrap().is_empty(), "{expected}");
        let events = w.cluster.events();
        assert_eq!(events.len(), 1, "{events:?}");
        assert!(
            events[0].0 && events[0].1 == "VolumeResizeFailed",
            "{events:?}"
        );
        let expected = expected.replace("PV pvc-u2 was", "PV pvc-u1 was not provisioned");
        assert!(events[0].2.starts_with(&expected), "{events:?}");
    }
}

/// An intent left behind for a claim already Bound to its PV (a Redis crash lost the
/// enqueue's clearing after a retry re-recorded it) is cleared by the claim's next sync.
#[tokio::test]
async fn a_bound_claims_leftover_intent_is_cleared_by_its_next_sync() {
    let c = bound("u1", "1Mi", "1Mi");
    let w = Setup::default().build();
    let intent = ProvisionIntent {
        version: api_types::queue::INTENT_VERSION,
        pv_name: "pvc-u1".into(),
        claim: api_types::queue::ClaimKey {
            namespace: "ns".into(),
            name: "claim-u1".into(),
            uid: "u1".into(),
        },
        class: "fast".into(),
        recorded_at_ms: 1,
        storage_class: None,
        selected_node: None,
    };
    w.intents.record(&intent, &c, Some(false)).await.unwrap();
    assert!(w.intents.has("pvc-u1"));
    assert_eq!(w.op.sync_claim(&c).await, Ok(()));
    assert!(!w.intents.has("pvc-u1"), "the PV is the record now");
    assert!(w.enqueued().is_empty(), "nothing provisioned again");
}

/// An intent naming a PV other than its claim uid's (forged in Redis, which signs no
/// intent) deletes nothing: counted as poisoned and kept for an operator.
#[tokio::test]
async fn an_intent_naming_another_pv_deletes_nothing() {
    let w = Setup::default().build();
    let mut forged = entry("u1", Some(false));
    forged.intent.pv_name = "data".into();
    // Stored under the claim uid's PV name, as provision-svc would.
    let field = "pvc-u1".to_string();
    w.intents.map.lock().unwrap().insert(field.clone(), forged);
    w.clean(vec![Gone::Walk]).await;
    assert!(w.backend.unprovisioned.lock().unwrap().is_empty());
    assert!(w.intents.map.lock().unwrap().contains_key(&field));
    assert_eq!(
        w.metric("provision_svc_poisoned_intents_total"),
        "provision_svc_poisoned_intents_total 1"
    );
}
