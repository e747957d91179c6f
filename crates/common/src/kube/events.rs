//! Kubernetes events (events.k8s.io/v1) through [`EventSink`], de-duplicated into series as
//! kube-runtime's `Recorder` does. Events about PersistentVolumes go to
//! [`CLUSTER_SCOPED_NAMESPACE`]; [`EventSink::publish_once`] names an event `<uid>.<reason>`
//! so it exists once per object whoever publishes it. Why not the Recorder:
//! docs/decisions/0005-events-and-client-go-metrics.md.

use api_types::queue::ClaimKey;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType};
use kube::{Client, Resource};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Mutex;

/// Namespace of the Events about cluster-scoped objects (PersistentVolumes): the one
/// namespace every supported Kubernetes (1.19+) accepts for an events.k8s.io/v1 Event whose
/// `regarding` object has no namespace.
pub const CLUSTER_SCOPED_NAMESPACE: &str = "kube-system";

/// How long a published cluster-scoped Event is remembered for series de-duplication (the
/// Recorder's 6 minutes).
const SERIES_TTL: SignedDuration = SignedDuration::from_mins(6);

/// Event reasons used by the services (the seed's strings).
pub mod reason {
    /// Normal, on the claim: the backend is about to be called.
    pub const PROVISIONING: &str = "Provisioning";
    /// Normal, on the claim: the PV exists.
    pub const PROVISIONING_SUCCEEDED: &str = "ProvisioningSucceeded";
    /// Warning, on the claim: provisioning failed or was refused.
    pub const PROVISIONING_FAILED: &str = "ProvisioningFailed";
    /// Warning, on the PV: the backend's delete failed or was refused.
    pub const VOLUME_FAILED_DELETE: &str = "VolumeFailedDelete";
    /// Normal, on the claim: its volume is being grown (the external-resizer's reason).
    pub const RESIZING: &str = "Resizing";
    /// Normal, on the claim: its volume has the new size.
    pub const VOLUME_RESIZE_SUCCESSFUL: &str = "VolumeResizeSuccessful";
    /// Warning, on the claim: its volume cannot take the new size.
    pub const VOLUME_RESIZE_FAILED: &str = "VolumeResizeFailed";
}

/// What the series cache remembers of a published Event: enough to patch its
/// `series` on a repeat, nothing else.
#[derive(Debug, Clone)]
struct SeriesEntry {
    namespace: String,
    name: String,
    count: i32,
    last: Timestamp,
}

/// Publishes events for one service; cheap to clone. A small copy of kube-runtime's
/// `Recorder` (create, then patch `series` on repeats within [`SERIES_TTL`]) that keeps
/// only a hash per series (docs/decisions/0005-events-and-client-go-metrics.md).
#[derive(Clone)]
pub struct EventSink {
    client: Client,
    /// `reportingController` (the component) and `reportingInstance` (the replica).
    controller: String,
    instance: String,
    hasher: std::collections::hash_map::RandomState,
    /// Events published in the last [`SERIES_TTL`], by the hash of their series identity
    /// (type, reason, action, note, object): 8 bytes per series instead of its strings.
    series: Arc<Mutex<HashMap<u64, SeriesEntry>>>,
}

impl EventSink {
    /// A sink reporting as `component` (e.g. `provision-svc`) from `instance`
    /// (the replica identity).
    pub fn new(client: Client, component: &str, instance: &str) -> Self {
        Self {
            client,
            controller: component.to_string(),
            instance: instance.to_string(),
            hasher: Default::default(),
            series: Arc::default(),
        }
    }

    /// Publish `event` about `object`, in its namespace or [`CLUSTER_SCOPED_NAMESPACE`] when
    /// cluster-scoped. Failures are logged, never returned.
    pub async fn publish(&self, object: &ObjectReference, event: Event) {
        log_failure(object, &event, self.try_publish(object, &event).await);
    }

    /// [`EventSink::publish`] returning the API error: created the first time, its
    /// `series` patched on repeats within [`SERIES_TTL`] (as the Recorder does).
    /// Errors: the create or patch failed.
    pub async fn try_publish(
        &self,
        object: &ObjectReference,
        event: &Event,
    ) -> Result<(), kube::Error> {
        use std::hash::BuildHasher;
        let now = Timestamp::now();
        let key = self.hasher.hash_one((
            (event.type_, &event.reason, &event.action, &event.note),
            (&object.kind, &object.namespace, &object.name, &object.uid),
        ));
        // The lock is never held across an API call: publishes run concurrently.
        let previous = {
            let mut cache = self.series.lock().await;
            cache.retain(|_, e| e.last + SERIES_TTL > now);
            cache.get(&key).cloned()
        };
        let entry = if let Some(previous) = previous {
            let series = EventSeries {
                count: previous.count + 1,
                last_observed_time: MicroTime(now),
            };
            let patch = Patch::Merge(serde_json::json!({ "series": series }));
            Api::<K8sEvent>::namespaced(self.client.clone(), &previous.namespace)
                .patch(&previous.name, &PatchParams::default(), &patch)
                .await?;
            SeriesEntry {
                count: series.count,
                last: now,
                ..previous
            }
        } else {
            let object_name = object.name.as_deref().unwrap_or(&self.controller);
            let name = format!("{object_name}.{:x}", now.as_nanosecond());
            SeriesEntry {
                namespace: self.create(object, name.clone(), event, now).await?,
                name,
                count: 1,
                last: now,
            }
        };
        self.series.lock().await.insert(key, entry);
        Ok(())
    }

    /// Publish `event` about `object` at most once per (`uid`, `reason`) across replicas and
    /// restarts, named [`once_event_name`] (`AlreadyExists`: announced already); without a
    /// uid, [`EventSink::publish`]. Failures are logged.
    pub async fn publish_once(&self, object: &ObjectReference, event: Event) {
        let result = self.try_publish_once(object, &event).await;
        log_failure(object, &event, result.map(drop));
    }

    /// [`EventSink::publish_once`] returning the API error; `Ok(true)` when this call created the
    /// Event, `Ok(false)` when it already existed. Errors: the API server rejected (other than `409
    /// AlreadyExists`) or did not answer the create.
    pub async fn try_publish_once(
        &self,
        object: &ObjectReference,
        event: &Event,
    ) -> Result<bool, kube::Error> {
        let Some(name) = once_event_name(object, &event.reason) else {
            return self.try_publish(object, event).await.map(|()| true);
        };
        match self.create(object, name, event, Timestamp::now()).await {
            Ok(_) => Ok(true),
            Err(kube::Error::Api(status)) if status.code == 409 => Ok(false),
            Err(err) => Err(err),
        }
    }

    /// Create `event` about `object` (events.k8s.io/v1, named `name`, observed `now`) in its
    /// namespace, or [`CLUSTER_SCOPED_NAMESPACE`] when cluster-scoped. Returns the namespace
    /// used. Errors: the create failed.
    async fn create(
        &self,
        object: &ObjectReference,
        name: String,
        event: &Event,
        now: Timestamp,
    ) -> Result<String, kube::Error> {
        let own_namespace = object.namespace.clone().filter(|ns| !ns.is_empty());
        let regarding = ObjectReference {
            namespace: own_namespace.clone(),
            ..object.clone()
        };
        let namespace = own_namespace.unwrap_or_else(|| CLUSTER_SCOPED_NAMESPACE.to_string());
        let type_ = match event.type_ {
            EventType::Warning => "Warning",
            EventType::Normal => "Normal",
        };
        let created = K8sEvent {
            metadata: ObjectMeta {
                namespace: Some(namespace.clone()),
                name: Some(name),
                ..Default::default()
            },
            action: Some(event.action.clone()),
            reason: Some(event.reason.clone()),
            note: event.note.clone(),
            type_: Some(type_.to_string()),
            event_time: Some(MicroTime(now)),
            regarding: Some(regarding),
            related: event.secondary.clone(),
            reporting_controller: Some(self.controller.clone()),
            reporting_instance: Some(self.instance.clone()),
            ..Default::default()
        };
        Api::<K8sEvent>::namespaced(self.client.clone(), &namespace)
            .create(&PostParams::default(), &created)
            .await?;
        Ok(namespace)
    }
}

/// A Normal (`warning == false`) or Warning [`Event`] with `reason`, `action` and `note`.
pub fn event(warning: bool, reason: &str, action: &str, note: String) -> Event {
    Event {
        type_: if warning {
            EventType::Warning
        } else {
            EventType::Normal
        },
        reason: reason.into(),
        note: Some(note),
        action: action.into(),
        secondary: None,
    }
}

/// Logs a failed publish of `event` about `object`.
fn log_failure(object: &ObjectReference, event: &Event, result: Result<(), kube::Error>) {
    if let Err(err) = result {
        tracing::warn!(reason = %event.reason, object = ?object.name, error = %err, "publishing event failed");
    }
}

/// `<object uid>.<reason in lower case>`, the name of the one Event
/// [`EventSink::publish_once`] writes; `None` without a uid or when that is not
/// a DNS subdomain (≤ 253 chars of `[a-z0-9.-]`, alphanumeric ends).
pub fn once_event_name(object: &ObjectReference, reason: &str) -> Option<String> {
    let uid = object.uid.as_deref().filter(|u| !u.is_empty())?;
    let name = format!("{uid}.{reason}").to_ascii_lowercase();
    let valid = name.len() <= 253
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
        && name
            .split('.')
            .all(|label| !label.is_empty() && !label.starts_with('-') && !label.ends_with('-'));
    valid.then_some(name)
}

/// An [`ObjectReference`] to any typed object (kind, apiVersion, namespace, name, uid).
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    object.object_ref(&())
}

/// An [`ObjectReference`] to the claim named by `key` (`apiVersion: v1`,
/// `kind: PersistentVolumeClaim`, namespace, name, uid), for events when only
/// the key is at hand. From a whole claim use [`claim_ref_of`].
pub fn claim_reference(key: &ClaimKey) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some(key.namespace.clone()),
        name: Some(key.name.clone()),
        uid: Some(key.uid.clone()),
        ..Default::default()
    }
}

/// A PV's `claimRef` to `claim`: [`reference`] plus the claim's
/// `resourceVersion`, as the seed's `ref.GetReference` fills it.
pub fn claim_ref_of(claim: &PersistentVolumeClaim) -> ObjectReference {
    ObjectReference {
        resource_version: claim.metadata.resource_version.clone(),
        ..reference(claim)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    #[test]
    fn once_event_names_are_deterministic_dns_subdomains() {
        let object = ObjectReference {
            uid: Some("6A1E0A51-0000-4000-8000-000000000002".into()),
            ..Default::default()
        };
        assert_eq!(
            once_event_name(&object, reason::PROVISIONING_SUCCEEDED).as_deref(),
            Some("6a1e0a51-0000-4000-8000-000000000002.provisioningsucceeded")
        );
        assert_eq!(
            once_event_name(&object, reason::PROVISIONING_SUCCEEDED),
            once_event_name(&object, reason::PROVISIONING_SUCCEEDED)
        );
        assert_ne!(
            once_event_name(&object, reason::PROVISIONING_SUCCEEDED),
            once_event_name(&object, reason::PROVISIONING_FAILED)
        );
        assert_eq!(once_event_name(&ObjectReference::default(), "X"), None);
        let odd = ObjectReference {
            uid: Some("a/b".into()),
            ..Default::default()
        };
        assert_eq!(once_event_name(&odd, "X"), None);
        assert_eq!(once_event_name(&object, "Not Valid"), None);
    }

    #[test]
    fn claim_reference_from_a_key_and_from_a_claim() {
        let key = ClaimKey {
            namespace: "ns".into(),
            name: "data".into(),
            uid: "uid-1".into(),
        };
        let from_key = claim_reference(&key);
        assert_eq!(
            from_key,
            ObjectReference {
                api_version: Some("v1".into()),
                kind: Some("PersistentVolumeClaim".into()),
                namespace: Some("ns".into()),
                name: Some("data".into()),
                uid: Some("uid-1".into()),
                ..Default::default()
            }
        );
        let claim = PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some("data".into()),
                uid: Some("uid-1".into()),
                resource_version: Some("42".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(
            claim_ref_of(&claim),
            ObjectReference {
                resource_version: Some("42".into()),
                ..from_key
            }
        );
    }
}
