//! Annotation, finalizer and well-known value names, as the seed controller and
//! kube-controller-manager's PV controller use them.

/// Set on a PV by the provisioner that created it; value is the provisioner name.
pub const ANN_DYNAMICALLY_PROVISIONED: &str = "pv.kubernetes.io/provisioned-by";

/// Set on a PV under CSI migration; value is the CSI driver that now owns deletion.
pub const ANN_MIGRATED_TO: &str = "pv.kubernetes.io/migrated-to";

/// Set on a claim by the PV controller: the provisioner expected to provision it (GA name).
pub const ANN_STORAGE_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

/// Beta twin of [`ANN_STORAGE_PROVISIONER`]; read when the GA one is absent.
pub const ANN_BETA_STORAGE_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";

/// Set on a claim by the scheduler for `WaitForFirstConsumer` classes: the selected node.
pub const ANN_SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Kubernetes 1.11 name of [`ANN_SELECTED_NODE`]; read when the current one is absent.
pub const ANN_ALPHA_SELECTED_NODE: &str = "volume.alpha.kubernetes.io/selected-node";

/// The provisioner's own PV finalizer: while present, the PV object outlives
/// the storage asset's deletion (seed `finalizerPV`).
pub const FINALIZER_PV: &str = "external-provisioner.volume.kubernetes.io/finalizer";

/// The PV protection finalizer kube-controller-manager adds to every PV.
pub const FINALIZER_PV_PROTECTION: &str = "kubernetes.io/pv-protection";

/// `volumeBindingMode` value that delays provisioning until a pod is scheduled.
pub const BINDING_MODE_WAIT_FOR_FIRST_CONSUMER: &str = "WaitForFirstConsumer";

/// PV name the seed derives from a claim: `pvc-<claim uid>`. Deterministic, so a
/// retry or a second replica can never create a second volume for one claim.
pub fn pv_name_for_claim_uid(claim_uid: &str) -> String {
    format!("pvc-{claim_uid}")
}

/// Lease name for one service, as the design fixes it: the provisioner name with
/// every `/` replaced by `-`, then `-<suffix>` (`provision`, `pv-writer`, `reclaim`).
pub fn lease_name(provisioner_name: &str, suffix: &str) -> String {
    format!("{}-{suffix}", provisioner_name.replace('/', "-"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pv_name_is_pvc_dash_uid() {
        assert_eq!(pv_name_for_claim_uid("1234-ab"), "pvc-1234-ab");
    }

    #[test]
    fn lease_name_replaces_slashes() {
        assert_eq!(
            lease_name("example.com/hostpath", "provision"),
            "example.com-hostpath-provision"
        );
        assert_eq!(lease_name("a/b/c", "reclaim"), "a-b-c-reclaim");
    }
}
