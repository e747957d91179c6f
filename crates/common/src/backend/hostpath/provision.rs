//! Provisioning half of the hostpath backend (to be implemented by the provision-svc issue).

use api_types::{ProvisionError, ProvisionOptions};
use k8s_openapi::api::core::v1::PersistentVolume;

use super::HostPath;

/// Create `<base-dir>/<pv name>` and return its PV.
pub async fn provision(
    _backend: &HostPath,
    options: &ProvisionOptions,
) -> Result<PersistentVolume, ProvisionError> {
    Err(ProvisionError::finished(format!(
        "hostpath provisioning of {} is not implemented yet",
        options.pv_name
    )))
}
