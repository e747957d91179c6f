//! reclaim-svc's own series (the seed's delete metrics and client-go's work-queue
//! metrics come from `common`).

use common::runtime::metrics;
use prometheus::{IntGauge, Registry};

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
