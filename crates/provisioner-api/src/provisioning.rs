//! What a backend is told ([`ProvisionOptions`]) and what it reports
//! ([`ProvisioningState`]), following the seed's `ProvisionOptions` and
//! `ProvisioningState`.

use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::{Deserialize, Serialize};

/// Where provisioning of one claim stands after a backend call (seed `ProvisioningState`).
/// Only meaningful together with an error: on success the state is always
/// [`ProvisioningState::Finished`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum ProvisioningState {
    /// Nothing is in progress: the volume was made, or the failure is final for
    /// this attempt and no asset is being created in the background.
    Finished,
    /// The backend is still creating the asset; the claim must be retried even if
    /// it is deleted meanwhile, so the half-made asset is found again.
    InBackground,
    /// The attempt changed nothing; keep whatever in-progress record exists.
    NoChange,
    /// The selected node cannot host the volume; remove the selected-node
    /// annotation so the scheduler picks another node.
    Reschedule,
}

/// Everything a backend needs to provision one volume (seed `ProvisionOptions`).
#[derive(Debug, Clone)]
pub struct ProvisionOptions {
    /// The claim's StorageClass, as read from the reflector cache.
    pub storage_class: StorageClass,
    /// The PV name to create: always `pvc-<claim uid>`.
    pub pv_name: String,
    /// The claim being provisioned.
    pub pvc: PersistentVolumeClaim,
    /// The node the scheduler selected (`WaitForFirstConsumer`), if any.
    pub selected_node: Option<Node>,
}

impl ProvisionOptions {
    /// The reclaim policy the PV gets: the StorageClass's `reclaimPolicy`,
    /// `Delete` when unset (the API server's default for a StorageClass).
    pub fn reclaim_policy(&self) -> String {
        self.storage_class
            .reclaim_policy
            .clone()
            .unwrap_or_else(|| "Delete".to_string())
    }
}
