//! Pure helpers of the seed's decisions: which StorageClass a claim names,
//! which provisioner it expects, whether a provisioner name is ours, and its
//! selected node.

use api_types::{
    ANN_ALPHA_SELECTED_NODE, ANN_BETA_STORAGE_PROVISIONER, ANN_SELECTED_NODE,
    ANN_STORAGE_PROVISIONER,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;

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
}

/// The claim's StorageClass name: the beta annotation, else
/// `spec.storageClassName`, else `""`.
pub fn claim_class(claim: &PersistentVolumeClaim) -> String {
    if let Some(class) = annotation(claim, ANN_BETA_STORAGE_CLASS) {
        return class.to_string();
    }
    claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default()
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
    claim
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get(key))
        .map(String::as_str)
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
}
