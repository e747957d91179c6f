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
