//! Claim checks shared by the filesystem backends (hostpath, nfs-subdir).

use k8s_openapi::api::core::v1::PersistentVolumeClaimSpec;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use provisioner_api::{ProvisionError, ProvisionOptions};

/// The claim's `(spec, storage request, access modes)`, checked for a filesystem
/// backend named `backend`. Errors (final): `Block` mode, no storage request, no
/// access modes, or a `volumeAttributesClassName` (only CSI drivers apply one).
pub fn filesystem_claim(
    options: &ProvisionOptions,
    backend: &str,
) -> Result<(PersistentVolumeClaimSpec, Quantity, Vec<String>), ProvisionError> {
    let claim_spec = options.pvc.spec.clone().unwrap_or_default();
    if claim_spec.volume_mode.as_deref() == Some("Block") {
        return Err(ProvisionError::finished(format!(
            "the {backend} backend does not support volumeMode Block"
        )));
    }
    if let Some(vac) = claim_spec
        .volume_attributes_class_name
        .as_deref()
        .filter(|v| !v.is_empty())
    {
        return Err(ProvisionError::finished(format!(
            "claim names VolumeAttributesClass {vac:?}, but the {backend} backend is not a CSI driver and cannot apply volume attributes; remove spec.volumeAttributesClassName"
        )));
    }
    let request = claim_spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .cloned()
        .ok_or_else(|| {
            ProvisionError::finished("claim has no storage request (resources.requests.storage)")
        })?;
    let access_modes = claim_spec.access_modes.clone().unwrap_or_default();
    if access_modes.is_empty() {
        return Err(ProvisionError::finished("claim has no access modes"));
    }
    Ok((claim_spec, request, access_modes))
}
