//! Writing a PV's `metadata.finalizers` and nothing else: a JSON merge patch of
//! the complete list guarded by the `resourceVersion` it was computed from; on
//! 409 the PV is re-read and the list recomputed, so no concurrent change is lost.

use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams};

/// How many times a finalizer patch is recomputed after a 409 Conflict before
/// the error is returned (and the PV retried through the work queue).
pub const MAX_CONFLICT_RETRIES: usize = 5;

/// The merge patch body setting `metadata.finalizers` to `finalizers` (JSON
/// `null` when empty, which removes the field) guarded by `resource_version`.
pub fn finalizers_patch(finalizers: &[String], resource_version: &str) -> serde_json::Value {
    serde_json::json!({
        "metadata": {
            "resourceVersion": resource_version,
            "finalizers": (!finalizers.is_empty()).then_some(finalizers),
        }
    })
}

/// Patch the PV's finalizers to `compute(pv)` when it returns `Some`, re-reading
/// and recomputing on 409. Returns the PV after it; `None` when the PV is gone.
/// Errors: API errors other than 404, 409 after [`MAX_CONFLICT_RETRIES`].
pub async fn update_finalizers<F>(
    api: &Api<PersistentVolume>,
    volume: &PersistentVolume,
    compute: F,
) -> Result<Option<PersistentVolume>, kube::Error>
where
    F: Fn(&PersistentVolume) -> Option<Vec<String>>,
{
    let name = volume.metadata.name.clone().unwrap_or_default();
    let mut current = volume.clone();
    let mut conflicts = 0;
    loop {
        let Some(desired) = compute(&current) else {
            return Ok(Some(current));
        };
        if let Some(rv) = current.metadata.resource_version.as_deref() {
            let patch = Patch::Merge(finalizers_patch(&desired, rv));
            match api.patch(&name, &PatchParams::default(), &patch).await {
                Ok(updated) => {
                    tracing::info!(pv = %name, finalizers = ?desired, "PV finalizers updated");
                    return Ok(Some(updated));
                }
                Err(kube::Error::Api(status)) if status.is_not_found() => return Ok(None),
                Err(kube::Error::Api(status))
                    if status.is_conflict() && conflicts < MAX_CONFLICT_RETRIES =>
                {
                    conflicts += 1;
                    tracing::debug!(pv = %name, conflicts, "PV changed concurrently, recomputing finalizers");
                }
                Err(err) => return Err(err),
            }
        }
        // After a conflict, or without a resourceVersion (the patch could not detect
        // concurrent changes): read a fresh copy.
        let Some(fresh) = api.get_opt(&name).await? else {
            return Ok(None);
        };
        if fresh.metadata.resource_version.is_none() {
            let msg = format!("PV {name} has no metadata.resourceVersion");
            return Err(kube::Error::Service(msg.into()));
        }
        current = fresh;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patch_carries_only_finalizers_and_resource_version() {
        let body = finalizers_patch(&["a".to_string(), "b".to_string()], "42");
        assert_eq!(
            body,
            serde_json::json!({"metadata": {"resourceVersion": "42", "finalizers": ["a", "b"]}})
        );
        let empty = finalizers_patch(&[], "7");
        assert_eq!(
            empty,
            serde_json::json!({"metadata": {"resourceVersion": "7", "finalizers": null}})
        );
    }
}
