//! reclaim-svc's metrics: the seed's delete families ([`DeleteMetrics`], label
//! `class`), the orphan sweep's gauges ([`SweepMetrics`]) and the PV queue's
//! `workqueue_*` series.

use common::kube::workqueue_metrics::WorkQueueMetrics;
use common::runtime::metrics::{self, DeleteMetrics};
use prometheus::{IntGauge, Registry};

/// Every metric reclaim-svc exports, registered once per process (they outlive leader terms).
#[derive(Clone)]
pub struct ReclaimMetrics {
    /// The seed's delete families.
    pub delete: DeleteMetrics,
    /// The orphan sweep's gauges.
    pub sweep: SweepMetrics,
    /// client-go's `workqueue_*` series of the PV queue (`name="volumes"`).
    pub queue: WorkQueueMetrics,
}

impl ReclaimMetrics {
    /// Create and register all of them in `registry`.
    ///
    /// Panics: when registered twice in the same registry.
    pub fn register(registry: &Registry) -> Self {
        Self {
            delete: DeleteMetrics::delete(registry),
            sweep: SweepMetrics::register(registry),
            queue: WorkQueueMetrics::register(registry, "volumes"),
        }
    }
}

/// Gauges of the last sweep.
#[derive(Clone)]
pub struct SweepMetrics {
    /// `reclaim_orphan_volumes`: orphans the last sweep found.
    pub found: IntGauge,
    /// `reclaim_orphan_volumes_archived`: orphans the last sweep archived.
    pub archived: IntGauge,
}

impl SweepMetrics {
    /// Create and register both gauges.
    pub fn register(registry: &Registry) -> Self {
        Self {
            found: metrics::gauge(
                registry,
                "reclaim_orphan_volumes",
                "Backend volumes found by the last orphan sweep with no PV, no pending PV write and no provisioning intent.",
            ),
            archived: metrics::gauge(
                registry,
                "reclaim_orphan_volumes_archived",
                "Orphaned backend volumes older than --sweep-min-age archived (renamed archived-<name>, never removed) by the last orphan sweep (only with --sweep-orphans).",
            ),
        }
    }
}
