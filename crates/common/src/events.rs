//! Kubernetes events through kube-runtime's events [`Recorder`]
//! (events.k8s.io/v1, de-duplicated into series by the recorder).

use api_types::queue::ClaimKey;
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::{Client, Resource};

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
}

/// Publishes events for one service; cheap to clone.
#[derive(Clone)]
pub struct EventSink {
    recorder: Recorder,
}

impl EventSink {
    /// A sink reporting as `component` (e.g. `provision-svc`) from `instance`
    /// (the replica identity).
    pub fn new(client: Client, component: &str, instance: &str) -> Self {
        let reporter = Reporter {
            controller: component.to_string(),
            instance: Some(instance.to_string()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
        }
    }

    /// Publish a Normal (`warning = false`) or Warning event with `reason` and
    /// `note` about `object`. Failures are logged, never returned: an event is
    /// informative and must not fail the operation it reports.
    pub async fn publish(
        &self,
        object: &ObjectReference,
        warning: bool,
        reason: &str,
        action: &str,
        note: String,
    ) {
        let event = Event {
            type_: if warning {
                EventType::Warning
            } else {
                EventType::Normal
            },
            reason: reason.to_string(),
            note: Some(note),
            action: action.to_string(),
            secondary: None,
        };
        if let Err(err) = self.recorder.publish(&event, object).await {
            tracing::warn!(reason, object = ?object.name, error = %err, "publishing event failed");
        }
    }
}

/// An [`ObjectReference`] to any typed object (kind, apiVersion, namespace, name, uid).
pub fn reference<K: Resource<DynamicType = ()>>(object: &K) -> ObjectReference {
    object.object_ref(&())
}

/// What a claim [`ObjectReference`] can be built from; see [`claim_reference`].
pub trait ClaimReferenceSource {
    /// The claim's `(namespace, name, uid, resourceVersion)`, each `None` when unknown.
    fn claim_reference_parts(
        &self,
    ) -> (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    );
}

impl ClaimReferenceSource for ClaimKey {
    /// Namespace, name and uid; a key carries no resourceVersion.
    fn claim_reference_parts(
        &self,
    ) -> (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        (
            Some(self.namespace.clone()),
            Some(self.name.clone()),
            Some(self.uid.clone()),
            None,
        )
    }
}

impl ClaimReferenceSource for PersistentVolumeClaim {
    /// Namespace, name, uid and resourceVersion from the claim's metadata.
    fn claim_reference_parts(
        &self,
    ) -> (
        Option<String>,
        Option<String>,
        Option<String>,
        Option<String>,
    ) {
        let m = &self.metadata;
        (
            m.namespace.clone(),
            m.name.clone(),
            m.uid.clone(),
            m.resource_version.clone(),
        )
    }
}

/// An [`ObjectReference`] to a claim (`apiVersion: v1`, `kind:
/// PersistentVolumeClaim`, namespace, name, uid), from the whole claim — then
/// with its `resourceVersion`, as the seed's `ref.GetReference` fills a PV's
/// `claimRef` — or from a [`ClaimKey`] when only the key is at hand (events).
/// The one definition used by every service.
pub fn claim_reference<C: ClaimReferenceSource + ?Sized>(claim: &C) -> ObjectReference {
    let (namespace, name, uid, resource_version) = claim.claim_reference_parts();
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace,
        name,
        uid,
        resource_version,
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

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
            claim_reference(&claim),
            ObjectReference {
                resource_version: Some("42".into()),
                ..from_key
            }
        );
    }
}
