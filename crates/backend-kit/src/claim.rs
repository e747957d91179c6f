//! Claim, class and PV checks shared by the filesystem backends (hostpath, nfs-subdir).

use crate::Refusal;
use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provisioner_api::{ProvisionError, ProvisionOptions};

/// The claim's PV (`options.pv_name`; capacity, access modes, reclaim policy, mount options)
/// for filesystem backend `backend`, which adds its volume source. Errors (final): `Block`,
/// no storage request or access modes, a `volumeAttributesClassName` (CSI drivers only).
pub fn filesystem_pv(
    options: &ProvisionOptions,
    backend: &str,
) -> Result<PersistentVolume, ProvisionError> {
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
    let access_modes = claim_spec.access_modes.unwrap_or_default();
    if access_modes.is_empty() {
        return Err(ProvisionError::finished("claim has no access modes"));
    }
    Ok(PersistentVolume {
        metadata: ObjectMeta {
            name: Some(options.pv_name.clone()),
            ..Default::default()
        },
        spec: Some(PersistentVolumeSpec {
            capacity: Some(BTreeMap::from([("storage".to_string(), request)])),
            access_modes: Some(access_modes),
            volume_mode: claim_spec.volume_mode,
            persistent_volume_reclaim_policy: Some(options.reclaim_policy()),
            mount_options: options.storage_class.mount_options.clone(),
            ..Default::default()
        }),
        status: None,
    })
}

type Parameters = BTreeMap<String, String>;

/// StorageClass parameters backend-kit reads for every filesystem backend (project quota,
/// directory mode and owner).
pub const FILESYSTEM_PARAMETERS: &[&str] = &[
    crate::quota::QUOTA_PARAMETER,
    crate::attrs::PARAM_DIRECTORY_MODE,
    crate::attrs::PARAM_DIRECTORY_UID,
    crate::attrs::PARAM_DIRECTORY_GID,
];

/// `class`'s name and parameters, once every parameter is one of the backend's `own` or
/// [`FILESYSTEM_PARAMETERS`]. Errors: a message naming the class, the unknown keys (sorted)
/// and what is accepted.
pub fn checked_class<'a>(
    backend: &str,
    class: &'a StorageClass,
    own: &[&str],
) -> Result<(&'a str, Option<&'a Parameters>), Refusal> {
    let name = class.metadata.name.as_deref().unwrap_or_default();
    let parameters = class.parameters.as_ref();
    let accepted = [own, FILESYSTEM_PARAMETERS].concat();
    let keys = parameters
        .into_iter()
        .flat_map(|p| p.keys().map(String::as_str));
    let unknown: Vec<&str> = keys.filter(|k| !accepted.contains(k)).collect();
    if unknown.is_empty() {
        return Ok((name, parameters));
    }
    Err(Refusal(format!(
        "StorageClass {name:?} has parameters the {backend} backend does not know: {} (it accepts {})",
        unknown.join(", "),
        accepted.join(", ")
    )))
}

/// `spec` keys of a PV that are not volume sources.
const NON_SOURCE_KEYS: &[&str] = &[
    "accessModes",
    "capacity",
    "claimRef",
    "mountOptions",
    "nodeAffinity",
    "persistentVolumeReclaimPolicy",
    "storageClassName",
    "volumeAttributesClassName",
    "volumeMode",
];

/// `pv`'s spec, when `source` (a JSON name such as `hostPath`) is the only volume source it
/// may have. Errors: no spec, or other volume sources (named).
pub fn only_source<'a>(
    pv: &'a PersistentVolume,
    source: &str,
) -> Result<&'a PersistentVolumeSpec, Refusal> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let spec = pv
        .spec
        .as_ref()
        .ok_or_else(|| Refusal(format!("PV {name} has no spec")))?;
    let others = other_sources(spec, source);
    if !others.is_empty() {
        return Err(Refusal(format!(
            "PV {name} has volume sources besides {source}: {}",
            others.join(", ")
        )));
    }
    Ok(spec)
}

/// The volume sources of `spec` (JSON names, sorted) other than `source`.
pub fn other_sources(spec: &PersistentVolumeSpec, source: &str) -> Vec<String> {
    let Ok(serde_json::Value::Object(fields)) = serde_json::to_value(spec) else {
        return Vec::new();
    };
    let source = |k: &&String| k.as_str() != source && !NON_SOURCE_KEYS.contains(&k.as_str());
    fields.keys().filter(source).cloned().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, NFSVolumeSource};

    #[test]
    fn unknown_parameters_are_named_with_what_is_accepted() {
        let mut class = StorageClass {
            metadata: ObjectMeta {
                name: Some("c".into()),
                ..Default::default()
            },
            ..Default::default()
        };
        assert_eq!(checked_class("x", &class, &[]), Ok(("c", None)));
        class.parameters = Some(BTreeMap::from([
            ("b".to_string(), String::new()),
            ("a".to_string(), String::new()),
            ("quota".to_string(), String::new()),
        ]));
        assert_eq!(
            checked_class("x", &class, &["b"]).unwrap_err().0,
            "StorageClass \"c\" has parameters the x backend does not know: a (it accepts b, quota, directoryMode, directoryUID, directoryGID)"
        );
    }

    #[test]
    fn other_sources_ignore_the_non_source_fields() {
        let mut spec = PersistentVolumeSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            storage_class_name: Some("fast".into()),
            host_path: Some(HostPathVolumeSource::default()),
            ..Default::default()
        };
        assert!(other_sources(&spec, "hostPath").is_empty());
        spec.nfs = Some(NFSVolumeSource::default());
        assert_eq!(other_sources(&spec, "hostPath"), vec!["nfs"]);
        assert_eq!(other_sources(&spec, "nfs"), vec!["hostPath"]);
    }
}
