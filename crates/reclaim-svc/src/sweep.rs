//! The orphan sweep, once per leader term after the PV reflector synced: the
//! backend's volumes that nothing accounts for (no intent, no pending PV write,
//! no PV using them, every PV listed live and mapped by
//! [`Provisioner::volumes_in_use`]) are reported (log, gauge, the Redis report
//! `provisioner-ctl status` shows). Checks run in the reverse order of a volume's life
//! (intent → queue entry → PV), and a volume gone by the end (deleted meanwhile) is
//! dropped; any lookup error abandons the sweep. With
//! `--sweep-orphans` an orphan older than `--sweep-min-age`, still an orphan on
//! a re-check and before shutdown is archived through
//! [`Provisioner::archive_orphan`], never removed (docs/ARCHITECTURE.md).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use common::handoff::intents::IntentStore;
use common::handoff::orphan_report::{self, OrphanReport};
use common::handoff::queue::PvQueue;
use common::handoff::redis_store::{self, RedisConfig};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::Api;
use provisioner_api::{OrphanOutcome, Provisioner};
use tokio_util::sync::CancellationToken;

use crate::metrics::SweepMetrics;

/// Where a volume may be accounted for.
#[async_trait::async_trait]
pub trait Accounting: Send + Sync {
    /// Whether a provisioning intent is recorded for `pv_name` or, if not, a PV
    /// write for it is pending in the durable queue.
    async fn is_pending(&self, pv_name: &str) -> anyhow::Result<bool>;
    /// Every PV on the API server (a quorum read, in pages).
    async fn list_pvs(&self) -> anyhow::Result<Vec<PersistentVolume>>;
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
    async fn is_pending(&self, pv_name: &str) -> anyhow::Result<bool> {
        if self.intents.contains(pv_name).await.context("intents")? {
            return Ok(true);
        }
        self.queue.is_pending(pv_name).await.context("queue")
    }
    async fn list_pvs(&self) -> anyhow::Result<Vec<PersistentVolume>> {
        Ok(common::kube::list::list_all(&self.pvs)
            .await
            .context("PVs")?)
    }
}

/// The `volumes` nothing accounts for, in order (`cached_pv` short-cuts a PV the
/// reflector holds). Errors: the first lookup failure.
pub async fn find_orphans(
    volumes: &[String],
    cached_pv: &impl Fn(&str) -> bool,
    accounting: &dyn Accounting,
    backend: &dyn Provisioner,
) -> anyhow::Result<Vec<String>> {
    let mut candidates = Vec::new();
    for name in volumes.iter().filter(|name| !cached_pv(name)) {
        if !accounting.is_pending(name).await? {
            candidates.push(name.clone());
        }
    }
    if candidates.is_empty() {
        return Ok(candidates);
    }
    let pvs = accounting.list_pvs().await?;
    let in_use = backend
        .volumes_in_use(&pvs)
        .await
        .context("backend volumes")?;
    candidates.retain(|name| !in_use.contains(name));
    Ok(candidates)
}

/// What the sweep does with the orphans it finds.
pub struct SweepAction {
    /// Archive orphans through the backend (`--sweep-orphans`); `false`: report only.
    pub archive: bool,
    /// `--sweep-min-age`: younger orphans are left alone.
    pub min_age: Duration,
    /// The service's shutdown token: no orphan is archived once it fired.
    pub shutdown: CancellationToken,
}

/// One sweep: list, find orphans, set the gauges and with `action.archive`
/// archive each re-checked orphan old enough. Returns the orphans found.
/// Errors: listing or a lookup failed.
pub async fn sweep(
    backend: &dyn Provisioner,
    cached_pv: impl Fn(&str) -> bool,
    accounting: &dyn Accounting,
    action: &SweepAction,
    metrics: &SweepMetrics,
) -> anyhow::Result<Vec<String>> {
    let Some(listed) = backend.list_volumes().await else {
        tracing::info!("orphan sweep skipped, backend cannot list volumes");
        return Ok(Vec::new());
    };
    let volumes = listed.context("backend volumes")?;
    let mut orphans = find_orphans(&volumes, &cached_pv, accounting, backend).await?;
    // A volume deleted during the sweep (reclaim deletes it before its PV) is no orphan.
    if !orphans.is_empty() {
        if let Some(relisted) = backend.list_volumes().await {
            let still: HashSet<String> = relisted.context("backend volumes")?.into_iter().collect();
            orphans.retain(|name| still.contains(name));
        }
    }
    metrics.found.set(orphans.len() as i64);
    metrics.archived.set(0);
    let mut archived = 0;
    for name in &orphans {
        if !action.archive {
            tracing::warn!(pv = %name, "orphaned volume found");
            continue;
        }
        if action.shutdown.is_cancelled() {
            tracing::info!("orphan sweep stopped for shutdown");
            break;
        }
        // Re-check right before acting: the volume may have moved on meanwhile.
        let again = find_orphans(std::slice::from_ref(name), &cached_pv, accounting, backend);
        if again.await?.is_empty() {
            tracing::info!(pv = %name, "volume accounted for on re-check");
            continue;
        }
        let Some(outcome) = backend.archive_orphan(name, action.min_age).await else {
            tracing::warn!(pv = %name, "backend cannot archive, orphans only reported");
            break;
        };
        match outcome {
            Ok(OrphanOutcome::Archived(to)) => {
                archived += 1;
                metrics.archived.set(archived);
                tracing::warn!(pv = %name, to = %to.display(), "orphan sweep archived an orphaned volume");
            }
            Ok(OrphanOutcome::TooYoung(age)) => {
                tracing::info!(pv = %name, age_seconds = age.as_secs(), min_age_seconds = action.min_age.as_secs(), "orphaned volume younger than --sweep-min-age");
            }
            Ok(OrphanOutcome::Absent) => {
                tracing::info!(pv = %name, "orphaned volume disappeared before archiving");
            }
            Err(err) => {
                tracing::error!(pv = %name, error = %err, "orphan sweep failed to archive a volume")
            }
        }
    }
    tracing::info!(
        volumes = volumes.len(),
        orphans = orphans.len(),
        archived,
        "orphan sweep finished"
    );
    Ok(orphans)
}

/// Everything one leader-start sweep needs besides the PV cache.
pub struct SweepJob {
    /// Redis connection of the queue and intents (`--redis-url` and the
    /// `--redis-*` credential/TLS flags).
    pub redis: RedisConfig,
    /// Our provisioner name (Redis key prefix).
    pub provisioner_name: String,
    /// PV API, for the live existence check.
    pub pvs: Api<PersistentVolume>,
    /// The backend whose volumes are swept.
    pub backend: Arc<dyn Provisioner>,
    /// What to do with the orphans found.
    pub action: SweepAction,
    /// Gauges to set.
    pub metrics: SweepMetrics,
    /// This replica's identity, recorded as the report's `reporter`.
    pub reporter: String,
}

/// Connect to Redis, run [`sweep`] once and store its report; failures are only
/// logged. Run inside the leader's work future, so a lost Lease stops it.
pub async fn run_once(job: SweepJob, cached_pv: impl Fn(&str) -> bool) {
    let name = job.provisioner_name.as_str();
    let result = async {
        let mut conn = redis_store::connect(&job.redis).await.context("redis")?;
        let accounting = LiveAccounting {
            intents: IntentStore::with_connection(conn.clone(), name),
            queue: PvQueue::with_connection(conn.clone(), name),
            pvs: job.pvs.clone(),
        };
        let backend = job.backend.as_ref();
        let mut orphans = sweep(backend, cached_pv, &accounting, &job.action, &job.metrics).await?;
        orphans.sort();
        let report = OrphanReport {
            version: orphan_report::REPORT_VERSION,
            swept_at_ms: common::kube::time::now_ms(),
            reporter: job.reporter.clone(),
            orphans,
            archived: job.metrics.archived.get().max(0) as u64,
        };
        let written = orphan_report::write(&mut conn, name, &report).await;
        written.context("report")
    };
    if let Err(error) = result.await {
        tracing::warn!(error = %format_args!("{error:#}"), "orphan sweep abandoned");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioner_api::testing::FakeProvisioner;

    struct Fake {
        intents: Vec<&'static str>,
        queued: Vec<&'static str>,
        pvs: Vec<&'static str>,
        fail: bool,
    }

    #[async_trait::async_trait]
    impl Accounting for Fake {
        async fn is_pending(&self, n: &str) -> anyhow::Result<bool> {
            if self.intents.contains(&n) {
                return Ok(true);
            }
            if self.fail {
                return Err(anyhow::anyhow!("redis down").context("queue"));
            }
            Ok(self.queued.contains(&n))
        }
        async fn list_pvs(&self) -> anyhow::Result<Vec<PersistentVolume>> {
            Ok(self
                .pvs
                .iter()
                .map(|n| PersistentVolume {
                    metadata: kube::api::ObjectMeta {
                        name: Some(n.to_string()),
                        ..Default::default()
                    },
                    ..Default::default()
                })
                .collect())
        }
    }

    /// Five volumes, one of them (`pvc-orphan`) orphaned; the backend can
    /// archive, and answers `TooYoung` for `pvc-young`.
    fn fixture(fail: bool) -> (FakeProvisioner, Fake) {
        let names = [
            "pvc-cached",
            "pvc-intent",
            "pvc-queued",
            "pvc-live",
            "pvc-orphan",
        ];
        (
            FakeProvisioner {
                volumes: Some(names.iter().map(|s| s.to_string()).collect()),
                can_archive: true,
                archive_outcomes: [(
                    "pvc-young".to_string(),
                    OrphanOutcome::TooYoung(Duration::from_secs(5)),
                )]
                .into(),
                ..Default::default()
            },
            Fake {
                intents: vec!["pvc-intent"],
                queued: vec!["pvc-queued"],
                pvs: vec!["pvc-live"],
                fail,
            },
        )
    }

    /// One sweep of `backend` (`pvc-cached` in the PV cache when `cached`), archiving orphans
    /// an hour old when `archive`, until `shutdown`; with the metrics it set.
    async fn run(
        backend: &FakeProvisioner,
        acc: &Fake,
        cached: bool,
        archive: bool,
        shutdown: &CancellationToken,
    ) -> (anyhow::Result<Vec<String>>, SweepMetrics) {
        let m = SweepMetrics::register(&prometheus::Registry::new());
        let min_age = Duration::from_secs(3600);
        let action = SweepAction {
            archive,
            min_age,
            shutdown: shutdown.clone(),
        };
        let is_cached = |n: &str| cached && n == "pvc-cached";
        (sweep(backend, is_cached, acc, &action, &m).await, m)
    }

    #[tokio::test]
    async fn reports_only_volumes_nothing_accounts_for() {
        let (backend, acc) = fixture(false);
        let (result, m) = run(&backend, &acc, true, false, &CancellationToken::new()).await;
        let orphans = result.unwrap();
        assert_eq!(orphans, vec!["pvc-orphan"]);
        assert_eq!(m.found.get(), 1);
        assert_eq!(m.archived.get(), 0);
        assert!(backend.deleted().is_empty());
        assert!(backend.archived().is_empty(), "report only");
    }

    #[tokio::test]
    async fn archives_old_orphans_and_never_deletes() {
        let (mut backend, acc) = fixture(false);
        backend.volumes.as_mut().unwrap().push("pvc-young".into());
        let (result, m) = run(&backend, &acc, true, true, &CancellationToken::new()).await;
        let orphans = result.unwrap();
        assert_eq!(orphans, vec!["pvc-orphan", "pvc-young"]);
        assert_eq!(
            backend.archived(),
            vec![
                ("pvc-orphan".to_string(), Duration::from_secs(3600)),
                ("pvc-young".to_string(), Duration::from_secs(3600)),
            ]
        );
        assert_eq!(m.found.get(), 2);
        assert_eq!(m.archived.get(), 1);
        assert!(
            backend.deleted().is_empty(),
            "the sweep never calls the backend's delete"
        );
    }

    #[tokio::test]
    async fn a_volume_used_by_a_pv_of_another_name_is_no_orphan() {
        let (mut backend, mut acc) = fixture(false);
        // `restore-orphan`, made by hand, points at the directory of `pvc-orphan`.
        acc.pvs.push("restore-orphan");
        backend
            .uses
            .insert("restore-orphan".into(), "pvc-orphan".into());
        let (result, _) = run(&backend, &acc, false, true, &CancellationToken::new()).await;
        let orphans = result.unwrap();
        assert_eq!(orphans, vec!["pvc-cached"]);
        assert_eq!(
            backend.archived(),
            vec![("pvc-cached".to_string(), Duration::from_secs(3600))]
        );
    }

    #[tokio::test]
    async fn a_volume_deleted_during_the_sweep_is_no_orphan() {
        // `pvc-deleted`'s PV and directory went while the sweep ran (reclaim deletes the
        // directory first): listed at the start, without a PV at the end.
        let first = ["pvc-deleted", "pvc-orphan", "pvc-live"].map(String::from);
        let backend = FakeProvisioner {
            volume_listings: std::sync::Mutex::new(vec![first.to_vec()]),
            volumes: Some(vec!["pvc-orphan".into(), "pvc-live".into()]),
            ..Default::default()
        };
        let (_, acc) = fixture(false);
        let m = SweepMetrics::register(&prometheus::Registry::new());
        let action = SweepAction {
            archive: false,
            min_age: Duration::from_secs(3600),
            shutdown: CancellationToken::new(),
        };
        let orphans = sweep(&backend, |_: &str| false, &acc, &action, &m).await;
        assert_eq!(orphans.unwrap(), vec!["pvc-orphan"]);
        assert_eq!(m.found.get(), 1);
    }

    #[tokio::test]
    async fn nothing_is_archived_after_shutdown() {
        let (backend, acc) = fixture(false);
        let token = CancellationToken::new();
        token.cancel();
        let (result, m) = run(&backend, &acc, false, true, &token).await;
        result.unwrap();
        assert!(backend.archived().is_empty());
        assert_eq!(m.archived.get(), 0);
    }

    #[tokio::test]
    async fn a_lookup_failure_abandons_the_sweep() {
        let (backend, acc) = fixture(true);
        let (result, _) = run(&backend, &acc, false, true, &CancellationToken::new()).await;
        let err = result.unwrap_err();
        assert_eq!(format!("{err:#}"), "queue: redis down");
        assert!(backend.archived().is_empty());
    }

    #[tokio::test]
    async fn a_backend_that_cannot_archive_is_only_reported() {
        let (mut backend, acc) = fixture(false);
        backend.can_archive = false;
        let (result, m) = run(&backend, &acc, false, true, &CancellationToken::new()).await;
        let orphans = result.unwrap();
        assert_eq!(orphans, vec!["pvc-cached", "pvc-orphan"]);
        assert_eq!(m.found.get(), 2);
        assert_eq!(m.archived.get(), 0);
        assert!(backend.deleted().is_empty());
    }
}
