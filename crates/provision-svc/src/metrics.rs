//! provision-svc's metrics: the seed's provisioning families (by `class`) plus
//! the service's own gauges.

use common::service::metrics::{gauge, ProvisionMetrics};
use prometheus::{IntCounter, IntGauge, Registry};

/// All metrics of provision-svc.
#[derive(Clone)]
pub struct ServiceMetrics {
    /// `controller_persistentvolumeclaim_provision_{total,failed_total,duration_seconds}`,
    /// label `class` (the claim's `spec.storageClassName`, `""` when unset).
    /// The duration is observed only on success, as in the seed.
    pub provision: ProvisionMetrics,
    /// `provision_svc_operations_in_flight`: provision operations running now.
    pub in_flight: IntGauge,
    /// `provision_svc_intents`: provisioning intents recorded in Redis.
    pub intents: IntGauge,
    /// `provision_svc_claims_in_background`: claims whose backend reported
    /// `InBackground` (the seed's claims in progress).
    pub claims_in_background: IntGauge,
    /// `provision_svc_poisoned_intents_total`: provisioning intents the
    /// start-up walk could not act on (unreadable record; volume of a deleted
    /// claim the backend refuses to delete or that has no recorded class).
    /// Each is kept in Redis for an operator.
    pub poisoned_intents: IntCounter,
}

impl ServiceMetrics {
    /// Create and register every family into `registry`.
    pub fn register(registry: &Registry) -> Self {
        Self {
            provision: ProvisionMetrics::register(registry),
            in_flight: gauge(
                registry,
                "provision_svc_operations_in_flight",
                "Provision operations currently running.",
            ),
            intents: gauge(
                registry,
                "provision_svc_intents",
                "Provisioning intents recorded in Redis (volumes being made whose PV is not yet queued).",
            ),
            claims_in_background: gauge(
                registry,
                "provision_svc_claims_in_background",
                "Claims whose backend reported provisioning in background; retried even after their PVC is deleted.",
            ),
            poisoned_intents: common::service::metrics::register(
                registry,
                IntCounter::new(
                    "provision_svc_poisoned_intents_total",
                    "Provisioning intents the start-up walk could not act on (unreadable record, or a deleted claim's volume the backend refuses to delete); kept in Redis for an operator.",
                )
                .expect("valid metric"),
            ),
        }
    }
}
