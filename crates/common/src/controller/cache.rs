//! Reflector helpers: trimming objects before they enter a reflector cache,
//! and the watch backoff every reflector of the services uses.
//!
//! The services keep every claim and PV of the cluster in kube-runtime
//! reflector stores. `metadata.managedFields` (server-side apply bookkeeping)
//! and the `kubectl.kubernetes.io/last-applied-configuration` annotation are
//! often larger than the rest of the object and nothing here reads them, so
//! they are dropped on the way in (`watcher(..).modify(strip_for_cache)`), as
//! kube-rs recommends for memory-bound controllers.

use std::time::Duration;

use kube::runtime::utils::ResetTimerBackoff;
use kube::runtime::watcher::ExponentialBackoff;
use kube::ResourceExt;

/// Longest pause between two watch attempts of a reflector ([`watch_backoff`]).
pub const WATCH_BACKOFF_MAX: Duration = Duration::from_secs(2);

/// The backoff of every reflector's watch (`.backoff(watch_backoff())`):
/// kube-runtime's default (client-go's reflector policy: 800 ms doubling with
/// jitter, reset after 2 minutes without failures) but capped at
/// [`WATCH_BACKOFF_MAX`] instead of 30 s. After an API-server outage the
/// default left a reflector up to 30 s behind the API server's return (claims
/// waited that long to be provisioned); a few services retrying one watch
/// every 2–4 s (jitter adds up to one delay) cost a recovering API server
/// nothing worth that delay.
pub fn watch_backoff() -> ResetTimerBackoff<ExponentialBackoff> {
    let builder = backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(800))
        .with_max_delay(WATCH_BACKOFF_MAX)
        .with_factor(2.0)
        .with_jitter()
        .without_max_times();
    ResetTimerBackoff::new(builder.into(), Duration::from_secs(120))
}

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

    #[test]
    fn watch_backoff_grows_from_800ms_and_never_exceeds_its_cap() {
        let delays: Vec<Duration> = watch_backoff().take(20).collect();
        assert_eq!(delays.len(), 20, "never gives up");
        assert!(delays[0] >= Duration::from_millis(800), "{delays:?}");
        assert!(delays[0] < Duration::from_millis(3200), "{delays:?}");
        // jitter adds at most one more delay's worth on top of the capped value
        assert!(
            delays.iter().all(|d| *d <= WATCH_BACKOFF_MAX * 2),
            "{delays:?}"
        );
        assert!(
            delays[10..].iter().all(|d| *d >= WATCH_BACKOFF_MAX),
            "reaches the cap: {delays:?}"
        );
    }
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
