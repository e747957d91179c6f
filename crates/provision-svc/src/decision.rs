//! The seed's decisions as pure functions of Kubernetes objects: whether a
//! claim is to be provisioned ([`should_provision`], seed `shouldProvision`),
//! which StorageClass a claim names, which provisioner it expects, whether a
//! provisioner name is ours, and its selected node.

use std::sync::Arc;

use api_types::{
    ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_PROVISIONER, ANN_DYNAMICALLY_PROVISIONED,
    ANN_SELECTED_NODE, ANN_STORAGE_PROVISIONER, BINDING_MODE_WAIT_FOR_FIRST_CONSUMER, FINALIZER_PV,
};
use common::kube::events::claim_ref_of;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;

/// Seed `shouldProvision`: not when bound, declined by the backend, expecting
/// no or another provisioner; with `WaitForFirstConsumer` only once a node is
/// selected. Errors: [`ClassNotFound`] for our claim (retried).
pub fn should_provision(
    claim: &PersistentVolumeClaim,
    names: &ProvisionerNames,
    backend_accepts: impl FnOnce(&PersistentVolumeClaim) -> bool,
    class: impl FnOnce(&str) -> Option<Arc<StorageClass>>,
) -> Result<bool, ClassNotFound> {
    let volume_name = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
    let bound = volume_name.is_some_and(|v| !v.is_empty());
    if bound || !backend_accepts(claim) || !names.expected_by(claim) {
        return Ok(false);
    }
    let class_name = claim_class(claim);
    let class = class(&class_name).ok_or(ClassNotFound(class_name))?;
    let mode = class.volume_binding_mode.as_deref();
    // Delayed binding: only once the scheduler selected a node (the
    // provisioner itself may have removed it to ask for rescheduling).
    let delayed = mode == Some(BINDING_MODE_WAIT_FOR_FIRST_CONSUMER);
    Ok(!delayed || annotation(claim, ANN_SELECTED_NODE).is_some_and(|n| !n.is_empty()))
}

/// The claim's StorageClass is not in the cache (retried: it can be created
/// independently of the claim).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("storageClass {0:?} not found")]
pub struct ClassNotFound(pub String);

/// Deprecated beta annotation naming a claim's StorageClass; wins over
/// `spec.storageClassName` as in Kubernetes' `GetPersistentVolumeClaimClass`.
pub const ANN_BETA_STORAGE_CLASS: &str = "volume.beta.kubernetes.io/storage-class";

/// The names this provision-svc answers to: `--provisioner-name` plus every
/// `--additional-provisioner` (seed `knownProvisioner`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvisionerNames {
    /// The provisioner name.
    pub name: String,
    /// Additional names also accepted.
    pub additional: Vec<String>,
}

impl ProvisionerNames {
    /// Whether `provisioner` is the provisioner name or an additional one.
    pub fn is_known(&self, provisioner: &str) -> bool {
        self.name == provisioner || self.additional.iter().any(|p| p == provisioner)
    }

    /// Whether `claim` expects one of these names ([`expected_provisioner`]).
    pub fn expected_by(&self, claim: &PersistentVolumeClaim) -> bool {
        expected_provisioner(claim).is_some_and(|p| self.is_known(p))
    }
}

/// The claim's StorageClass name: the beta annotation, else
/// `spec.storageClassName`, else `""`.
pub fn claim_class(claim: &PersistentVolumeClaim) -> String {
    annotation(claim, ANN_BETA_STORAGE_CLASS).map_or_else(|| metrics_class(claim), str::to_string)
}

/// The class name used as the metrics `class` label: `spec.storageClassName`
/// or `""` (seed `updateProvisionStats`).
pub fn metrics_class(claim: &PersistentVolumeClaim) -> String {
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
}

/// The provisioner the claim expects: `volume.kubernetes.io/storage-provisioner`,
/// else the beta annotation; `None` when neither is set.
pub fn expected_provisioner(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, ANN_STORAGE_PROVISIONER)
        .or_else(|| annotation(claim, ANN_BETA_STORAGE_PROVISIONER))
}

/// The selected node: `volume.kubernetes.io/selected-node`, else the alpha
/// annotation; present even when empty (the seed then fails the node lookup).
pub fn selected_node(claim: &PersistentVolumeClaim) -> Option<&str> {
    annotation(claim, ANN_SELECTED_NODE).or_else(|| annotation(claim, ANN_ALPHA_SELECTED_NODE))
}

/// Whether the claim asks for `volumeMode: Block`.
pub fn is_block(claim: &PersistentVolumeClaim) -> bool {
    claim.spec.as_ref().and_then(|s| s.volume_mode.as_deref()) == Some("Block")
}

/// The value of annotation `key` on `claim`.
pub fn annotation<'a>(claim: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    claim.annotations().get(key).map(String::as_str)
}

/// The PV to queue for a volume the backend made for `claim`: `claimRef` to
/// the claim, its class, `pv.kubernetes.io/provisioned-by: <provisioner>` and,
/// with `add_finalizer`, the provisioner's PV finalizer (seed `provisionClaimOperation`).
pub fn complete_pv(
    mut volume: PersistentVolume,
    claim: &PersistentVolumeClaim,
    class: &str,
    provisioner: &str,
    add_finalizer: bool,
) -> PersistentVolume {
    let spec = volume.spec.get_or_insert_with(Default::default);
    spec.claim_ref = Some(claim_ref_of(claim));
    spec.storage_class_name = Some(class.to_string());
    let meta = &mut volume.metadata;
    if add_finalizer {
        let finalizers = meta.finalizers.get_or_insert_with(Vec::new);
        if !finalizers.iter().any(|f| f == FINALIZER_PV) {
            finalizers.push(FINALIZER_PV.to_string());
        }
    }
    let annotations = meta.annotations.get_or_insert_with(Default::default);
    annotations.insert(ANN_DYNAMICALLY_PROVISIONED.into(), provisioner.into());
    volume
}

/// `namespace/name` of a claim, for logs and event messages (seed `claimToClaimKey`).
pub fn claim_key(claim: &PersistentVolumeClaim) -> String {
    format!(
        "{}/{}",
        claim.metadata.namespace.as_deref().unwrap_or_default(),
        claim.metadata.name.as_deref().unwrap_or_default()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn claim(annotations: &[(&str, &str)], class: Option<&str>) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                annotations: Some(
                    annotations
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect(),
                ),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                storage_class_name: class.map(str::to_string),
                ..Default::default()
            }),
            status: None,
        }
    }

    #[test]
    fn class_prefers_the_beta_annotation() {
        assert_eq!(claim_class(&claim(&[], Some("fast"))), "fast");
        assert_eq!(
            claim_class(&claim(&[(ANN_BETA_STORAGE_CLASS, "old")], Some("fast"))),
            "old"
        );
        assert_eq!(claim_class(&claim(&[], None)), "");
        assert_eq!(
            metrics_class(&claim(&[(ANN_BETA_STORAGE_CLASS, "old")], Some("fast"))),
            "fast"
        );
    }

    #[test]
    fn provisioner_and_node_annotations_fall_back() {
        let ga = claim(
            &[
                (ANN_STORAGE_PROVISIONER, "a"),
                (ANN_BETA_STORAGE_PROVISIONER, "b"),
            ],
            None,
        );
        assert_eq!(expected_provisioner(&ga), Some("a"));
        let beta = claim(&[(ANN_BETA_STORAGE_PROVISIONER, "b")], None);
        assert_eq!(expected_provisioner(&beta), Some("b"));
        assert_eq!(expected_provisioner(&claim(&[], None)), None);

        let both = claim(
            &[(ANN_SELECTED_NODE, "n1"), (ANN_ALPHA_SELECTED_NODE, "n2")],
            None,
        );
        assert_eq!(selected_node(&both), Some("n1"));
        let alpha = claim(&[(ANN_ALPHA_SELECTED_NODE, "n2")], None);
        assert_eq!(selected_node(&alpha), Some("n2"));
        assert_eq!(
            selected_node(&claim(&[(ANN_SELECTED_NODE, "")], None)),
            Some("")
        );
    }

    #[test]
    fn known_names_include_additional_ones() {
        let names = ProvisionerNames {
            name: "example.com/hostpath".into(),
            additional: vec!["legacy.io/hp".into()],
        };
        assert!(names.is_known("example.com/hostpath"));
        assert!(names.is_known("legacy.io/hp"));
        assert!(!names.is_known("other.io/x"));
    }

    #[test]
    fn should_provision_follows_the_seed() {
        let names = ProvisionerNames {
            name: "me.io/x".into(),
            additional: vec!["old.io/x".into()],
        };
        let immediate = Arc::new(StorageClass {
            provisioner: "me.io/x".into(),
            ..Default::default()
        });
        let delayed = Arc::new(StorageClass {
            provisioner: "me.io/x".into(),
            volume_binding_mode: Some(BINDING_MODE_WAIT_FOR_FIRST_CONSUMER.into()),
            ..Default::default()
        });
        let decide =
            |c: &PersistentVolumeClaim, accepts: bool, class: Option<&Arc<StorageClass>>| {
                should_provision(c, &names, |_| accepts, |_| class.cloned())
            };
        let ours = claim(&[(ANN_STORAGE_PROVISIONER, "me.io/x")], Some("fast"));
        assert_eq!(decide(&ours, true, Some(&immediate)), Ok(true));
        assert_eq!(
            decide(&ours, false, Some(&immediate)),
            Ok(false),
            "backend declines"
        );
        let mut bound = ours.clone();
        bound.spec.as_mut().unwrap().volume_name = Some("pv".into());
        assert_eq!(decide(&bound, true, Some(&immediate)), Ok(false), "bound");
        bound.spec.as_mut().unwrap().volume_name = Some(String::new());
        assert_eq!(
            decide(&bound, true, Some(&immediate)),
            Ok(true),
            "empty volumeName"
        );
        let other = claim(&[(ANN_STORAGE_PROVISIONER, "other.io/x")], Some("fast"));
        assert_eq!(
            decide(&other, true, Some(&immediate)),
            Ok(false),
            "not ours"
        );
        let none = claim(&[], Some("fast"));
        assert_eq!(
            decide(&none, true, Some(&immediate)),
            Ok(false),
            "no provisioner"
        );
        let additional = claim(&[(ANN_STORAGE_PROVISIONER, "old.io/x")], Some("fast"));
        assert_eq!(decide(&additional, true, Some(&immediate)), Ok(true));
        assert_eq!(decide(&ours, true, None), Err(ClassNotFound("fast".into())));
        assert_eq!(
            decide(&ours, true, Some(&delayed)),
            Ok(false),
            "no node yet"
        );
        let empty_node = claim(
            &[
                (ANN_STORAGE_PROVISIONER, "me.io/x"),
                (ANN_SELECTED_NODE, ""),
            ],
            Some("fast"),
        );
        assert_eq!(decide(&empty_node, true, Some(&delayed)), Ok(false));
        let node = claim(
            &[
                (ANN_STORAGE_PROVISIONER, "me.io/x"),
                (ANN_SELECTED_NODE, "n1"),
            ],
            Some("fast"),
        );
        assert_eq!(decide(&node, true, Some(&delayed)), Ok(true));
    }
}
