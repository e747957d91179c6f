//! Trimming objects before they enter a reflector cache.
//!
//! The services keep every claim and PV of the cluster in kube-runtime
//! reflector stores. `metadata.managedFields` (server-side apply bookkeeping)
//! and the `kubectl.kubernetes.io/last-applied-configuration` annotation are
//! often larger than the rest of the object and nothing here reads them, so
//! they are dropped on the way in (`watcher(..).modify(strip_for_cache)`), as
//! kube-rs recommends for memory-bound controllers.

use kube::ResourceExt;

/// The annotation `kubectl apply` (client-side) writes: a full copy of the object.
pub const LAST_APPLIED_ANNOTATION: &str = "kubectl.kubernetes.io/last-applied-configuration";

/// Remove `metadata.managedFields` and the last-applied annotation from `obj`.
/// Everything the services read (spec, status, annotations, finalizers,
/// resourceVersion, uid) is kept.
pub fn strip_for_cache<K: ResourceExt>(obj: &mut K) {
    obj.managed_fields_mut().clear();
    obj.annotations_mut().remove(LAST_APPLIED_ANNOTATION);
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::PersistentVolume;

    #[test]
    fn drops_bookkeeping_and_keeps_the_rest() {
        let mut pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": "pvc-1",
                "resourceVersion": "7",
                "finalizers": ["kubernetes.io/pv-protection"],
                "annotations": {
                    "pv.kubernetes.io/provisioned-by": "example.com/hostpath",
                    LAST_APPLIED_ANNOTATION: "{\"big\":true}"
                },
                "managedFields": [{"manager": "kubectl", "operation": "Apply", "fieldsType": "FieldsV1", "fieldsV1": {}}]
            },
            "spec": {"capacity": {"storage": "1Gi"}}
        }))
        .unwrap();
        strip_for_cache(&mut pv);
        assert!(pv.managed_fields().is_empty());
        let annotations = pv.annotations();
        assert_eq!(annotations.len(), 1);
        assert_eq!(
            annotations["pv.kubernetes.io/provisioned-by"],
            "example.com/hostpath"
        );
        assert_eq!(pv.metadata.resource_version.as_deref(), Some("7"));
        assert_eq!(pv.finalizers(), ["kubernetes.io/pv-protection"]);
    }
}
