//! Reflector helpers: [`strip_for_cache`] drops `managedFields` and the
//! last-applied annotation on the way in (`watcher(..).modify(strip_for_cache)`),
//! [`Compact`] keeps many objects small, [`NameSet`] answers "does this name
//! exist?", and [`watch_backoff`] is every reflector's watch backoff.

use std::borrow::Cow;
use std::collections::HashSet;
use std::marker::PhantomData;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::{Event, ExponentialBackoff};
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize};

/// Longest pause between two watch attempts of a reflector ([`watch_backoff`]).
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The backoff of every reflector's watch: kube-runtime's default (800 ms doubling
/// with jitter, reset after 2 min) capped at [`WATCH_BACKOFF_MAX`] instead of 30 s.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(WATCH_BACKOFF_MAX)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

/// The annotation `kubectl apply` (client-side) writes: a full copy of the object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Remove `metadata.managedFields` and the last-applied annotation from `obj`.
/// Everything the services read (spec, status, annotations, finalizers,
/// resourceVersion, uid) is kept.
pub fn strip_for_cache<K: ResourceExt>(obj: &mut K) {
    let meta = obj.meta_mut();
    meta.managed_fields = None;
    if let Some(annotations) = meta.annotations.as_mut() {
        annotations.remove(LAST_APPLIED_ANNOTATION);
    }
}

/// An object of kind `K` as a reflector cache keeps it: typed identity metadata
/// (all a store and `Controller` read) plus the object as compact JSON, decoded by
/// [`Compact::object`]; use it as a watcher's resource type (`Api::<Compact<K>>`).
#[derive(Clone)]
pub struct Compact<K> {
    metadata: ObjectMeta,
    json: Box<[u8]>,
    kind: PhantomData<fn() -> K>,
}

impl<K: Resource + Serialize> Compact<K> {
    /// Compact `object`: [`strip_for_cache`], then keep its identity (`name`, `namespace`,
    /// `uid`, `resourceVersion`) and its JSON encoding.
    pub fn new(mut object: K) -> Self {
        strip_for_cache(&mut object);
        let meta = object.meta();
        let metadata = ObjectMeta {
            name: meta.name.clone(),
            namespace: meta.namespace.clone(),
            uid: meta.uid.clone(),
            resource_version: meta.resource_version.clone(),
            ..ObjectMeta::default()
        };
        // A k8s-openapi object always serializes (string-keyed maps only).
        let json = serde_json::to_vec(&object)
            .expect("a Kubernetes object serializes to JSON")
            .into_boxed_slice();
        Self {
            metadata,
            json,
            kind: PhantomData,
        }
    }
}

impl<K: DeserializeOwned> Compact<K> {
    /// The whole object, decoded from the cached JSON (a new value each call).
    /// Panics only if `K` cannot decode its own serialization (a bug in `K`).
    pub fn object(&self) -> K {
        serde_json::from_slice(&self.json)
            .expect("a cached object decodes from the JSON it was encoded to")
    }
}

impl<K> std::fmt::Debug for Compact<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Compact")
            .field("metadata", &self.metadata)
            .field("json_bytes", &self.json.len())
            .finish()
    }
}

/// Same API resource as `K` (kind, group, version, plural; the derived `apiVersion` and
/// URL follow); `meta` is the identity only (see [`Compact`]), and changing it through
/// `meta_mut` does not change the cached object.
impl<K: Resource> Resource for Compact<K> {
    type DynamicType = K::DynamicType;
    type Scope = K::Scope;

    fn kind(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::kind(dt)
    }
    fn group(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::group(dt)
    }
    fn version(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::version(dt)
    }
    fn plural(dt: &Self::DynamicType) -> Cow<'_, str> {
        K::plural(dt)
    }
    fn meta(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn meta_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}

/// Decodes a `K` (a list item or watch event object) and compacts it
/// ([`Compact::new`]); errors are `K`'s decoding errors.
impl<'de, K: Resource + Serialize + DeserializeOwned> Deserialize<'de> for Compact<K> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        K::deserialize(deserializer).map(Self::new)
    }
}

/// The names of every object of one cluster-scoped kind, kept from a watcher's
/// events with a reflector store's semantics (a re-list replaces the set at
/// `InitDone`), one string per object. Clones share the set.
#[derive(Clone, Default)]
pub struct NameSet {
    state: Arc<Mutex<NameSetState>>,
    ready: tokio::sync::watch::Sender<bool>,
}

#[derive(Default)]
struct NameSetState {
    names: HashSet<Box<str>>,
    /// Names of a (re-)list in progress (`Init` .. `InitDone`).
    relist: Option<HashSet<Box<str>>>,
}

impl NameSet {
    fn state(&self) -> std::sync::MutexGuard<'_, NameSetState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Apply one watcher event as a store writer does: `Apply` adds, `Delete` removes,
    /// `Init`/`InitApply`/`InitDone` rebuild the set and mark it ready.
    pub fn apply_watcher_event<K: Resource>(&self, event: &Event<K>) {
        let name = |obj: &K| obj.meta().name.as_deref().map(Box::<str>::from);
        let mut state = self.state();
        match event {
            Event::Apply(obj) => state.names.extend(name(obj)),
            Event::Delete(obj) => {
                if let Some(n) = obj.meta().name.as_deref() {
                    state.names.remove(n);
                }
            }
            Event::Init => state.relist = Some(HashSet::new()),
            Event::InitApply(obj) => state.relist.iter_mut().for_each(|l| l.extend(name(obj))),
            Event::InitDone => {
                if let Some(list) = state.relist.take() {
                    state.names = list;
                }
                drop(state);
                self.ready.send_replace(true);
            }
        }
    }

    /// Whether an object named `name` exists (as of the last event applied).
    pub fn contains(&self, name: &str) -> bool {
        self.state().names.contains(name)
    }

    /// Resolves once the first list is complete (the first `InitDone`).
    pub async fn wait_until_ready(&self) {
        let mut ready = self.ready.subscribe();
        // The sender lives in `self`, so the channel cannot close here.
        let _ = ready.wait_for(|r| *r).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn watch_backoff_grows_from_800ms_and_never_exceeds_its_cap() {
        let delays: Vec<Duration> = watch_backoff().take(20).collect();
        assert_eq!(delays.len(), 20, "never gives up");
        assert!(delays[0] >= Duration::from_millis(800), "{delays:?}");
        assert!(delays[0] < Duration::from_millis(3200), "{delays:?}");
        // jitter adds at most one more delay's worth on top of the capped value
        assert!(
            delays.iter().all(|d| *d <= WATCH_BACKOFF_MAX * 2),
            "{delays:?}"
        );
        assert!(
            delays[10..].iter().all(|d| *d >= WATCH_BACKOFF_MAX),
            "reaches the cap: {delays:?}"
        );
    }
    use k8s_openapi::api::core::v1::PersistentVolume;

    #[test]
    fn drops_bookkeeping_and_keeps_the_rest() {
        let mut pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pvc-1",
                "resourceVersion": "7",
                "finalizers": ["kubernetes.io/pv-protection"],
                "annotations": {
                    "pv.kubernetes.io/provisioned-by": "example.com/hostpath",
                    LAST_APPLIED_ANNOTATION: "{\"big\":true}"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}]
            },
            "spec": {"capacity": {"storage": "1Gi"}}
        }))
        .unwrap();
        strip_for_cache(&mut pv);
        assert!(pv.managed_fields().is_empty());
        let annotations = pv.annotations();
        assert_eq!(annotations.len(), 1);
        assert_eq!(
            annotations["pv.kubernetes.io/provisioned-by"],
            "example.com/hostpath"
        );
        assert_eq!(pv.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(pv.finalizers(), ["kubernetes.io/pv-protection"]);
    }
}

#[cfg(test)]
mod compact_tests {
    use super::*;
    use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
    use kube::core::ObjectList;
    use serde_json::json;

    /// A claim with every field the services and the built-in backends read,
    /// and more (selector, dataSource, status), plus the bookkeeping that
    /// [`strip_for_cache`] drops.
    fn full_claim() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {
                "name": "data", "namespace": "apps", "uid": "u-1", "resourceVersion": "42",
                "generation": 3,
                "creationTimestamp": "2026-12-01T10:00:00Z",
                "labels": {"app": "db"},
                "annotations": {
                    "volume.kubernetes.io/storage-provisioner": "example.com/hostpath",
                    "volume.beta.kubernetes.io/storage-provisioner": "example.com/hostpath",
                    "volume.beta.kubernetes.io/storage-class": "old",
                    "volume.kubernetes.io/selected-node": "n1",
                    "nfs.io/storage-path": "db/data",
                    LAST_APPLIED_ANNOTATION: "{\"big\":true}"
                },
                "finalizers": ["kubernetes.io/pvc-protection"],
                "ownerReferences": [{"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "db", "uid": "s-1"}],
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}]
            },
            "spec": {
                "accessModes": ["ReadWriteOnce", "ReadOnlyMany"],
                "resources": {"requests": {"storage": "1Gi"}, "limits": {"storage": "2Gi"}},
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
                "selector": {"matchLabels": {"tier": "a"}},
                "dataSource": {"kind": "PersistentVolumeClaim", "name": "src"}
            },
            "status": {
                "phase": "Pending",
                "conditions": [{"type": "Resizing", "status": "True", "lastTransitionTime": "2026-12-01T10:00:01Z"}]
            }
        })
    }

    fn full_pv() -> serde_json::Value {
        json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {
                "name": "pvc-u-1", "uid": "v-1", "resourceVersion": "43",
                "creationTimestamp": "2026-12-01T10:00:02Z",
                "deletionTimestamp": "2026-12-01T11:00:00Z",
                "annotations": {"pv.kubernetes.io/provisioned-by": "example.com/hostpath"},
                "finalizers": ["kubernetes.io/pv-protection", "external-provisioner.volume.kubernetes.io/finalizer"],
                "managedFields": [{"manager": "kcm", "operation": "Update", "fieldsType": "FieldsV1", "fieldsV1": {}}]
            },
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": "fast",
                "volumeMode": "Filesystem",
                "mountOptions": ["noatime"],
                "hostPath": {"path": "/var/lib/hostpath/pvc-u-1", "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "apps",
                             "name": "data", "uid": "u-1", "resourceVersion": "42"},
                "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [
                    {"key": "kubernetes.io/hostname", "operator": "In", "values": ["n1"]}]}]}}
            },
            "status": {"phase": "Released", "message": "claim gone", "lastPhaseTransitionTime": "2026-12-01T10:30:00Z"}
        })
    }

    /// What the API server sent, after `strip_for_cache` (the old cache content).
    fn stripped<K: Resource + DeserializeOwned>(value: serde_json::Value) -> K {
        let mut obj: K = serde_json::from_value(value).unwrap();
        strip_for_cache(&mut obj);
        obj
    }

    #[test]
    fn a_compact_claim_decodes_to_the_whole_claim_minus_bookkeeping() {
        let cached: Compact<PersistentVolumeClaim> = serde_json::from_value(full_claim()).unwrap();
        let expected: PersistentVolumeClaim = stripped(full_claim());
        assert_eq!(cached.object(), expected);
        assert!(cached.object().metadata.managed_fields.is_none());
        assert!(!cached
            .object()
            .annotations()
            .contains_key(LAST_APPLIED_ANNOTATION));
        // The typed metadata is the identity only.
        assert_eq!(
            cached.meta(),
            &ObjectMeta {
                name: Some("data".into()),
                namespace: Some("apps".into()),
                uid: Some("u-1".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            }
        );
        assert!(cached.json.len() < 1500, "{}", cached.json.len());
    }

    #[test]
    fn a_compact_pv_decodes_to_the_whole_pv_minus_bookkeeping() {
        let cached: Compact<PersistentVolume> = serde_json::from_value(full_pv()).unwrap();
        let expected: PersistentVolume = stripped(full_pv());
        assert_eq!(cached.object(), expected);
        assert_eq!(cached.name_any(), "pvc-u-1");
        assert_eq!(cached.uid().as_deref(), Some("v-1"));
        assert!(cached.finalizers().is_empty(), "identity only");
        // Clones are equal objects.
        assert_eq!(cached.clone().object(), expected);
    }

    #[test]
    fn compact_is_the_same_api_resource() {
        assert_eq!(
            Compact::<PersistentVolume>::url_path(&(), None),
            PersistentVolume::url_path(&(), None)
        );
        assert_eq!(
            Compact::<PersistentVolumeClaim>::url_path(&(), Some("ns")),
            PersistentVolumeClaim::url_path(&(), Some("ns"))
        );
        assert_eq!(Compact::<PersistentVolume>::kind(&()), "PersistentVolume");
        assert_eq!(Compact::<PersistentVolume>::api_version(&()), "v1");
        assert!(!Compact::<PersistentVolume>::metadata_api());
    }

    #[test]
    fn list_items_without_kind_decode() {
        // A list response's items carry neither apiVersion nor kind.
        let mut item = full_claim();
        item.as_object_mut().unwrap().remove("apiVersion");
        item.as_object_mut().unwrap().remove("kind");
        let list: ObjectList<Compact<PersistentVolumeClaim>> = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaimList",
            "metadata": {"resourceVersion": "50"},
            "items": [item]
        }))
        .unwrap();
        assert_eq!(list.items.len(), 1);
        assert_eq!(
            list.items[0].object(),
            stripped::<PersistentVolumeClaim>(full_claim())
        );
    }

    #[test]
    fn a_watch_event_decodes() {
        let ev: kube::core::WatchEvent<Compact<PersistentVolume>> =
            serde_json::from_value(json!({"type": "MODIFIED", "object": full_pv()})).unwrap();
        let kube::core::WatchEvent::Modified(pv) = ev else {
            panic!("{ev:?}")
        };
        assert_eq!(pv.object(), stripped::<PersistentVolume>(full_pv()));
        // Object before type (the adjacently tagged enum buffers the object).
        let ev: kube::core::WatchEvent<Compact<PersistentVolume>> =
            serde_json::from_str(&format!(r#"{{"object":{},"type":"ADDED"}}"#, full_pv())).unwrap();
        assert!(matches!(ev, kube::core::WatchEvent::Added(_)));
    }

    #[test]
    fn compact_keeps_name_namespace_uid_and_version() {
        let pv: PersistentVolume = serde_json::from_value(full_pv()).unwrap();
        assert_eq!(
            Compact::new(pv).metadata,
            ObjectMeta {
                name: Some("pvc-u-1".into()),
                uid: Some("v-1".into()),
                resource_version: Some("43".into()),
                ..Default::default()
            }
        );
    }
}

#[cfg(test)]
mod name_set_tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use kube::core::PartialObjectMeta;

    fn pv(name: &str) -> PartialObjectMeta<PersistentVolume> {
        PartialObjectMeta {
            types: None,
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            _phantom: PhantomData,
        }
    }

    #[tokio::test]
    async fn follows_applies_deletes_and_relists() {
        let set = NameSet::default();
        let ready = {
            let set = set.clone();
            tokio::spawn(async move { set.wait_until_ready().await })
        };
        type Ev = Event<PartialObjectMeta<PersistentVolume>>;
        set.apply_watcher_event(&Ev::Init);
        set.apply_watcher_event(&Event::InitApply(pv("a")));
        set.apply_watcher_event(&Event::InitApply(pv("b")));
        assert!(!set.contains("a"), "a list in progress is not the set yet");
        assert!(!ready.is_finished());
        set.apply_watcher_event(&Ev::InitDone);
        ready.await.unwrap();
        assert!(set.contains("a") && set.contains("b"));
        set.apply_watcher_event(&Event::Apply(pv("c")));
        set.apply_watcher_event(&Event::Delete(pv("a")));
        assert!(!set.contains("a") && set.contains("b") && set.contains("c"));
        // A re-list replaces the set: "b", deleted while the watch was down, goes.
        set.apply_watcher_event(&Ev::Init);
        set.apply_watcher_event(&Event::InitApply(pv("c")));
        assert!(
            set.contains("b"),
            "the old set answers until the list is done"
        );
        set.apply_watcher_event(&Ev::InitDone);
        assert!(!set.contains("b"));
        assert!(set.contains("c"));
        set.wait_until_ready().await;
    }
}
