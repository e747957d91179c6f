//! reclaim-svc's metrics: the seed's delete families
//! (`controller_persistentvolume_delete_total`, `..._delete_failed_total`,
//! `..._delete_duration_seconds`, label `class`; [`DeleteMetrics`]) and the
//! orphan sweep's gauges ([`SweepMetrics`]).

use common::runtime::metrics::{self, DeleteMetrics};
use prometheus::{IntGauge, Registry};

/// Every metric reclaim-svc exports, registered once per process (they live on
/// across leader terms).
#[derive(Clone)]
pub struct ReclaimMetrics {
    /// The seed's delete families.
    pub delete: DeleteMetrics,
    /// The orphan sweep's gauges.
    pub sweep: SweepMetrics,
}

impl ReclaimMetrics {
    /// Create and register all of them in `registry`.
    ///
    /// Panics: when registered twice in the same registry.
    pub fn register(registry: &Registry) -> Self {
        Self {
            delete: DeleteMetrics::register(registry),
            sweep: SweepMetrics::register(registry),
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
