//! provision-svc's metrics: its own stage of provisioning (backend called,
//! PV queued for pv-writer) by `class`, plus the service's gauges.
//!
//! The seed's `controller_persistentvolumeclaim_provision_*` families count a
//! provisioning that ended with the PV stored; that happens in pv-writer, so
//! pv-writer exports them (see its `metrics` module) and provision-svc does not,
//! and a dashboard summing across services counts each provisioning once.

use common::runtime::metrics::{counter, counter_vec, gauge, gauge_vec, SeedMetrics};
use prometheus::{IntCounter, IntCounterVec, IntGauge, IntGaugeVec, Registry};

/// All metrics of provision-svc.
#[derive(Clone)]
pub struct ServiceMetrics {
    /// Label `class` (`""` when unset): `provision_svc_volumes_provisioned_total` (PV queued),
    /// `provision_svc_provision_failed_total` (each retry counts) and
    /// `provision_svc_provision_duration_seconds` (successful attempt's start to PV queued).
    pub provision: SeedMetrics,
    /// client-go's `workqueue_*` families of the claim queue (`name="claims"`).
    pub queue: common::kube::workqueue_metrics::WorkQueueMetrics,
    /// `provision_svc_operations_in_flight`: provision operations running now.
    pub in_flight: IntGauge,
    /// `provision_svc_intents`: provisioning intents recorded in Redis.
    pub intents: IntGauge,
    /// `provision_svc_claims_in_background`: claims whose backend reported
    /// `InBackground` (the seed's claims in progress).
    pub claims_in_background: IntGauge,
    /// `provision_svc_poisoned_intents_total`: intents a walk cannot act on
    /// (unreadable; a gone claim's volume the backend refuses to delete or with
    /// no recorded class), kept in Redis for an operator.
    pub poisoned_intents: IntCounter,
    /// `provision_svc_stalled_queue_entries_total{reason}`: syncs of a claim
    /// that still wants a volume but whose queued PV write pv-writer will never
    /// write (`dead_lettered`, `unverifiable`); each also emits a Warning.
    pub stalled_queue_entries: IntCounterVec,
    /// `provision_svc_capacity_bytes{pool}`: capacity of each pool the backend limits
    /// (hostpath `--capacity`, per base directory).
    pub capacity: IntGaugeVec,
    /// `provision_svc_capacity_free_bytes{pool}`: what the pool's volumes do not take.
    pub capacity_free: IntGaugeVec,
    /// `provision_svc_redis_data_losses_total`: times the Redis data marker
    /// vanished or Redis failed over (every claim was then reconciled again).
    pub redis_data_losses: IntCounter,
}

impl ServiceMetrics {
    /// Create and register every family into `registry`.
    pub fn register(registry: &Registry) -> Self {
        let [in_flight, intents, claims_in_background] = [
            ("provision_svc_operations_in_flight", "Provision operations currently running."),
            ("provision_svc_intents", "Provisioning intents recorded in Redis (volumes being made whose PV is not yet queued)."),
            ("provision_svc_claims_in_background", "Claims whose backend reported provisioning in background (retried until final); a claim deleted meanwhile has its volume cleaned up, not provisioned."),
        ]
        .map(|(name, help)| gauge(registry, name, help));
        let [poisoned_intents, redis_data_losses] = [
            ("provision_svc_poisoned_intents_total", "Provisioning intents the start-up walk could not act on (unreadable record, a PV name not its claim's, or a deleted claim's volume the backend refuses to delete); kept in Redis for an operator."),
            ("provision_svc_redis_data_losses_total", "Times Redis may have lost writes (its data marker vanished: wiped volume, FLUSHALL; or it failed over to a replica); every claim was then reconciled again."),
        ]
        .map(|(name, help)| counter(registry, name, help));
        let [capacity, capacity_free] = [
            ("provision_svc_capacity_bytes", "Capacity of each storage pool the backend limits (hostpath: each base directory with --capacity), in bytes."),
            ("provision_svc_capacity_free_bytes", "Bytes of each storage pool not taken by its volumes' requests; a claim larger than this fails (is rescheduled with a selected node)."),
        ]
        .map(|(name, help)| gauge_vec(registry, name, help, &["pool"]));
        Self {
            provision: SeedMetrics::with_names(registry, [
                ("provision_svc_volumes_provisioned_total", "Volumes the backend provisioned whose PV was queued for pv-writer, by storage class name."),
                ("provision_svc_provision_failed_total", "Failed provision attempts in provision-svc (each retry counts), by storage class name."),
                ("provision_svc_provision_duration_seconds", "Seconds from the start of a provision attempt to its PV queued for pv-writer; failed attempts are ignored. By storage class name."),
            ]),
            queue: common::kube::workqueue_metrics::WorkQueueMetrics::register(registry, "claims"),
            in_flight,
            intents,
            claims_in_background,
            poisoned_intents,
            stalled_queue_entries: counter_vec(
                registry,
                "provision_svc_stalled_queue_entries_total",
                "Syncs of a claim that wants a volume while the PV write queued under its PV name will never be written (dead-lettered, or not signed by this provisioner for the claim); each emits a Warning event naming the operator action.",
                &["reason"],
            ),
            capacity,
            capacity_free,
            redis_data_losses,
        }
    }
}

/// Counts one provision operation in `provision_svc_operations_in_flight` for
/// as long as it lives: the gauge goes down on drop, so an operation cancelled
/// by `--provision-timeout` (its future dropped mid-await) is not left counted.
pub struct InFlight(IntGauge);

impl InFlight {
    /// Count one operation in `gauge` until dropped.
    pub fn start(gauge: &IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    /// The help says what the service does with a claim deleted in background:
    /// cleaned up (docs/ARCHITECTURE.md), where the seed retried its provisioning.
    #[test]
    fn in_background_help_states_the_cleanup() {
        let registry = prometheus::Registry::new();
        super::ServiceMetrics::register(&registry);
        let text = common::runtime::metrics::render(&registry);
        let help = text
            .lines()
            .find(|l| l.starts_with("# HELP provision_svc_claims_in_background "))
            .expect("help line");
        assert!(help.contains("cleaned up, not provisioned"), "{help}");
    }
}
