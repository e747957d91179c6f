//! The orphan sweep (beyond the seed): when this replica becomes leader and the
//! PV reflector has synced, list the backend's volumes and find those that
//! nothing accounts for — no provisioning intent, no pending PV write in the
//! durable queue, and no PV (checked live on the API server, not in the
//! possibly lagging cache). They are reported (log + gauge) and, with
//! `--sweep-orphans`, deleted through the backend.
//!
//! The checks run in the reverse order of a volume's life (intent → queue
//! entry → PV), so a volume moving along that path while the sweep runs is
//! always seen in at least one place. Any lookup error aborts the sweep:
//! "unknown" is never treated as "orphan".

use std::sync::Arc;

use common::intents::IntentStore;
use common::metrics;
use common::queue::PvQueue;
use common::Provisioner;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::Api;
use prometheus::{IntGauge, Registry};

/// Builds the PV handed to the backend's delete for an orphan named `pv_name`
/// (the backend needs to know where the asset lives, e.g. `spec.hostPath`).
pub type OrphanPvFn = Arc<dyn Fn(&str) -> PersistentVolume + Send + Sync>;

/// Gauges of the last sweep.
#[derive(Clone)]
pub struct SweepMetrics {
    /// `reclaim_orphan_volumes`: orphans the last sweep found.
    pub found: IntGauge,
    /// `reclaim_orphan_volumes_deleted`: orphans the last sweep deleted.
    pub deleted: IntGauge,
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
            deleted: metrics::gauge(
                registry,
                "reclaim_orphan_volumes_deleted",
                "Orphaned backend volumes deleted by the last orphan sweep (only with --sweep-orphans).",
            ),
        }
    }
}

/// Where a volume may be accounted for.
#[async_trait::async_trait]
pub trait Accounting: Send + Sync {
    /// Whether a provisioning intent is recorded for `pv_name`.
    async fn has_intent(&self, pv_name: &str) -> Result<bool, String>;
    /// Whether a PV write for `pv_name` is pending in the durable queue.
    async fn is_queued(&self, pv_name: &str) -> Result<bool, String>;
    /// Whether the PV `pv_name` exists on the API server.
    async fn pv_exists(&self, pv_name: &str) -> Result<bool, String>;
}

/// [`Accounting`] backed by Redis (intents, queue) and the API server (PVs).
pub struct LiveAccounting {
    /// Provisioning intents.
    pub intents: IntentStore,
    /// Durable PV-write queue.
    pub queue: PvQueue,
    /// PVs.
    pub pvs: Api<PersistentVolume>,
}

#[async_trait::async_trait]
impl Accounting for LiveAccounting {
    async fn has_intent(&self, pv_name: &str) -> Result<bool, String> {
        self.intents
            .contains(pv_name)
            .await
            .map_err(|e| e.to_string())
    }
    async fn is_queued(&self, pv_name: &str) -> Result<bool, String> {
        self.queue
            .is_pending(pv_name)
            .await
            .map_err(|e| e.to_string())
    }
    async fn pv_exists(&self, pv_name: &str) -> Result<bool, String> {
        self.pvs
            .get_opt(pv_name)
            .await
            .map(|pv| pv.is_some())
            .map_err(|e| e.to_string())
    }
}

/// The volumes among `volumes` that nothing accounts for, in input order.
/// `cached_pv` short-cuts the common case (the reflector already has the PV).
///
/// Errors: the first lookup failure (the sweep must then be abandoned).
pub async fn find_orphans(
    volumes: &[String],
    cached_pv: impl Fn(&str) -> bool,
    accounting: &dyn Accounting,
) -> Result<Vec<String>, String> {
    let mut orphans = Vec::new();
    for name in volumes {
        if cached_pv(name) {
            continue;
        }
        if accounting.has_intent(name).await? || accounting.is_queued(name).await? {
            continue;
        }
        if accounting.pv_exists(name).await? {
            continue;
        }
        orphans.push(name.clone());
    }
    Ok(orphans)
}

/// Run one sweep: list the backend's volumes (skipped if the backend cannot
/// list), find orphans, log each, set the gauges and, when `delete` is set and
/// `orphan_pv` is given, delete each orphan through the backend (a failure is
/// logged and the rest continue). Returns the orphans found.
pub async fn sweep(
    backend: &dyn Provisioner,
    cached_pv: impl Fn(&str) -> bool,
    accounting: &dyn Accounting,
    delete: bool,
    orphan_pv: Option<&OrphanPvFn>,
    metrics: &SweepMetrics,
) -> Result<Vec<String>, String> {
    let Some(listed) = backend.list_volumes().await else {
        tracing::info!("orphan sweep skipped: the backend cannot list its volumes");
        return Ok(Vec::new());
    };
    let volumes = listed.map_err(|e| format!("listing backend volumes: {e}"))?;
    let orphans = find_orphans(&volumes, cached_pv, accounting).await?;
    metrics.found.set(orphans.len() as i64);
    let mut deleted = 0;
    for name in &orphans {
        match (delete, orphan_pv) {
            (true, Some(build)) => match backend.delete(&build(name)).await {
                Ok(()) => {
                    deleted += 1;
                    tracing::warn!(pv = %name, "orphan sweep: deleted orphaned volume (no PV, no pending write, no intent)");
                }
                Err(err) => {
                    tracing::error!(pv = %name, error = %err, "orphan sweep: deleting orphaned volume failed")
                }
            },
            (true, None) => {
                tracing::warn!(pv = %name, "orphan sweep: orphaned volume found; this backend gives no way to address it for deletion")
            }
            (false, _) => {
                tracing::warn!(pv = %name, "orphan sweep: orphaned volume found (no PV, no pending write, no intent); --sweep-orphans=true deletes such volumes")
            }
        }
    }
    metrics.deleted.set(deleted);
    tracing::info!(
        volumes = volumes.len(),
        orphans = orphans.len(),
        deleted,
        "orphan sweep finished"
    );
    Ok(orphans)
}

/// Everything one leader-start sweep needs besides the PV cache.
pub struct SweepJob {
    /// Redis URL of the queue and intents (`--redis-url`).
    pub redis_url: String,
    /// Our provisioner name (Redis key prefix).
    pub provisioner_name: String,
    /// PV API, for the live existence check.
    pub pvs: Api<PersistentVolume>,
    /// The backend whose volumes are swept.
    pub backend: Arc<dyn Provisioner>,
    /// `--sweep-orphans`: delete what is found.
    pub delete: bool,
    /// How to address an orphan for the backend's delete.
    pub orphan_pv: Option<OrphanPvFn>,
    /// Gauges to set.
    pub metrics: SweepMetrics,
}

/// Connect to Redis and run [`sweep`] once; every failure is logged (the
/// sweep is a report, never a reason to stop the service).
pub async fn run_once(job: SweepJob, cached_pv: impl Fn(&str) -> bool) {
    let SweepJob {
        redis_url,
        provisioner_name,
        pvs,
        backend,
        delete,
        orphan_pv,
        metrics,
    } = job;
    let (redis_url, provisioner_name) = (redis_url.as_str(), provisioner_name.as_str());
    let intents = match IntentStore::connect(redis_url, provisioner_name).await {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "orphan sweep skipped: provisioning intents unreachable");
            return;
        }
    };
    let queue = match PvQueue::connect(redis_url, provisioner_name).await {
        Ok(q) => q,
        Err(e) => {
            tracing::warn!(error = %e, "orphan sweep skipped: PV-write queue unreachable");
            return;
        }
    };
    let accounting = LiveAccounting {
        intents,
        queue,
        pvs,
    };
    if let Err(e) = sweep(
        backend.as_ref(),
        cached_pv,
        &accounting,
        delete,
        orphan_pv.as_ref(),
        &metrics,
    )
    .await
    {
        tracing::warn!(error = %e, "orphan sweep abandoned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::{DeleteError, ProvisionError, ProvisionOptions};
    use std::sync::Mutex;

    struct Fake {
        intents: Vec<&'static str>,
        queued: Vec<&'static str>,
        pvs: Vec<&'static str>,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl Accounting for Fake {
        async fn has_intent(&self, n: &str) -> Result<bool, String> {
            Ok(self.intents.contains(&n))
        }
        async fn is_queued(&self, n: &str) -> Result<bool, String> {
            if self.fail {
                return Err("redis down".into());
            }
            Ok(self.queued.contains(&n))
        }
        async fn pv_exists(&self, n: &str) -> Result<bool, String> {
            Ok(self.pvs.contains(&n))
        }
    }

    struct Backend {
        volumes: Vec<String>,
        deleted: Mutex<Vec<String>>,
    }

    #[async_trait::async_trait]
    impl Provisioner for Backend {
        async fn provision(
            &self,
            _: &ProvisionOptions,
        ) -> Result<PersistentVolume, ProvisionError> {
            unreachable!()
        }
        async fn delete(&self, v: &PersistentVolume) -> Result<(), DeleteError> {
            let name = v.metadata.name.clone().unwrap();
            self.deleted.lock().unwrap().push(name);
            Ok(())
        }
        async fn list_volumes(&self) -> Option<Result<Vec<String>, String>> {
            Some(Ok(self.volumes.clone()))
        }
    }

    fn fixture(fail: bool) -> (Backend, Fake) {
        let names = [
            "pvc-cached",
            "pvc-intent",
            "pvc-queued",
            "pvc-live",
            "pvc-orphan",
        ];
        (
            Backend {
                volumes: names.iter().map(|s| s.to_string()).collect(),
                deleted: Mutex::new(vec![]),
            },
            Fake {
                intents: vec!["pvc-intent"],
                queued: vec!["pvc-queued"],
                pvs: vec!["pvc-live"],
                fail,
            },
        )
    }

    fn template() -> OrphanPvFn {
        Arc::new(|name: &str| PersistentVolume {
            metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        })
    }

    #[tokio::test]
    async fn reports_only_volumes_nothing_accounts_for() {
        let (backend, acc) = fixture(false);
        let m = SweepMetrics::register(&Registry::new());
        let orphans = sweep(
            &backend,
            |n| n == "pvc-cached",
            &acc,
            false,
            Some(&template()),
            &m,
        )
        .await
        .unwrap();
        assert_eq!(orphans, vec!["pvc-orphan"]);
        assert_eq!(m.found.get(), 1);
        assert_eq!(m.deleted.get(), 0);
        assert!(
            backend.deleted.lock().unwrap().is_empty(),
            "report only by default"
        );
    }

    #[tokio::test]
    async fn deletes_orphans_when_enabled() {
        let (backend, acc) = fixture(false);
        let m = SweepMetrics::register(&Registry::new());
        sweep(
            &backend,
            |n| n == "pvc-cached",
            &acc,
            true,
            Some(&template()),
            &m,
        )
        .await
        .unwrap();
        assert_eq!(*backend.deleted.lock().unwrap(), vec!["pvc-orphan"]);
        assert_eq!(m.deleted.get(), 1);
    }

    #[tokio::test]
    async fn a_lookup_failure_abandons_the_sweep() {
        let (backend, acc) = fixture(true);
        let m = SweepMetrics::register(&Registry::new());
        let err = sweep(&backend, |_| false, &acc, true, Some(&template()), &m)
            .await
            .unwrap_err();
        assert_eq!(err, "redis down");
        assert!(backend.deleted.lock().unwrap().is_empty());
    }
}
