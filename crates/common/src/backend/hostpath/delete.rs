//! Deletion half of the hostpath backend (to be implemented by the reclaim-svc issue).

use api_types::DeleteError;
use k8s_openapi::api::core::v1::PersistentVolume;

use super::HostPath;

/// Remove, retain or archive the directory behind `volume`.
pub async fn delete(_backend: &HostPath, _volume: &PersistentVolume) -> Result<(), DeleteError> {
    Err(DeleteError::Refused {
        reason: "hostpath deletion is not implemented yet".into(),
    })
}

/// PV names whose directories exist under the base directory.
pub async fn list_volumes(_backend: &HostPath) -> Result<Vec<String>, String> {
    Err("hostpath listing is not implemented yet".into())
}
