//! pv-writer's checks right before its side effect (the PV create), driving
//! `Writer::process` in-process against a control plane (as pv-writer's own
//! identity on the real one) and a private `redis-server`:
//! * a writer whose term was superseded after it took an entry creates nothing;
//! * a correctly signed entry whose claim is gone (deleted, or re-created with
//!   another uid), e.g. replayed into the queue later, creates no PV: it is
//!   dropped and counted as `claim_gone`; an entry of a live claim is written.
//!
//! Runs on the simulator (`…::sim`) and on a real kube-apiserver v1.19 (`…::real`).

use std::sync::Arc;
use std::time::Duration;

use api_types::queue::QueuedPvWrite;
use backend_hostpath::{base_dirs::BaseDirs, HostPath, OnDelete};
use common::handoff::queue::{PvQueue, TakenEntry};
use common::handoff::queue_auth::QueueKey;
use e2e::harness::pv_writer::{create_claim, entry_for_claim, queue_key, BASE_DIR, PROVISIONER};
use e2e::harness::redis::RedisServer;
use e2e::harness::wait::wait_until;
use e2e::harness::{ControlPlane, Plane, Service};
use e2e::on_both_planes;
use e2e::sim::SimConfig;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams};
use pv_writer::checks::EntryChecks;
use pv_writer::config::WriterConfig;
use pv_writer::metrics::{Registry, WriterMetrics};
use pv_writer::operation::{Writer, CLAIM_GONE};
use tokio_util::sync::CancellationToken;

struct Fixture {
    plane: Plane,
    _redis: RedisServer,
    queue: PvQueue,
    key: QueueKey,
    admin: kube::Client,
    registry: Registry,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new(plane: ControlPlane) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let plane = Plane::start(plane.with_sim_config(SimConfig::bare()))
            .await
            .unwrap();
        assert_eq!(plane.provisioner_name(), PROVISIONER);
        let redis = RedisServer::start(&dir.path().join("redis"), &dir.path().join("redis.log"))
            .await
            .unwrap();
        let queue = PvQueue::connect(&redis.url(), PROVISIONER).await.unwrap();
        Fixture {
            admin: plane.admin_client().await.unwrap(),
            key: queue_key(dir.path()),
            plane,
            _redis: redis,
            queue,
            registry: Registry::new(),
            _dir: dir,
        }
    }

    /// A writer as pv-writer's identity, not yet in any term, counting into
    /// `registry`.
    async fn writer(&self, registry: &Registry) -> Writer {
        let checks = EntryChecks::new(
            vec![PROVISIONER.into()],
            Some(self.key.clone()),
            Arc::new(BaseDirs(vec![HostPath {
                base_dir: BASE_DIR.into(),
                node_name: None,
                on_delete: OnDelete::Retain,
                capacity: None,
            }])),
        );
        Writer::new(
            self.queue.clone(),
            checks,
            self.plane.service_client(Service::PvWriter).await.unwrap(),
            "pv-writer-test",
            WriterMetrics::register(registry),
            Default::default(),
            WriterConfig {
                workers: 1,
                retry_initial: Duration::from_millis(100),
                retry_max: Duration::from_secs(1),
                write_timeout: Duration::from_secs(10),
                visibility_timeout: Duration::from_secs(60),
                redis_reconnect: Duration::from_millis(200),
            },
        )
    }

    /// Enqueue `entry` signed with the queue key, as provision-svc does.
    async fn enqueue(&self, entry: &QueuedPvWrite) {
        let mut entry = entry.clone();
        self.key.sign(PROVISIONER, &mut entry);
        assert!(self.queue.enqueue(&entry).await.unwrap().added);
    }

    /// Take every due entry under `term`.
    async fn take(&self, term: u64) -> Vec<TakenEntry> {
        self.queue
            .take_due(term, 100, Duration::from_secs(60))
            .await
            .unwrap()
            .expect("current term")
    }

    async fn pv_exists(&self, name: &str) -> bool {
        Api::<PersistentVolume>::all(self.admin.clone())
            .get_opt(name)
            .await
            .unwrap()
            .is_some()
    }

    /// Delete the claim `default/<name>` and wait until it is gone.
    async fn delete_claim(&self, name: &str) {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.admin.clone(), "default");
        api.delete(name, &DeleteParams::default()).await.unwrap();
        wait_until(Duration::from_secs(30), "the claim is gone", || {
            let api = api.clone();
            async move { matches!(api.get_opt(name).await, Ok(None)) }
        })
        .await
        .unwrap();
    }

    fn refused(&self, reason: &str) -> f64 {
        let text = common::runtime::metrics::render(&self.registry);
        let prefix = format!("pv_writer_refused_entries_total{{reason=\"{reason}\"}} ");
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
            .unwrap_or(0.0)
    }
}

async fn a_superseded_writer_creates_nothing(plane: ControlPlane) {
    let f = Fixture::new(plane).await;
    let uid = create_claim(&f.admin, "stale0").await;
    let entry = entry_for_claim("stale0", &uid);
    f.enqueue(&entry).await;
    let term = f.queue.begin_term().await.unwrap();
    let taken = f.take(term).await;
    assert_eq!(taken.len(), 1);
    // A newer leader begins its term while this writer holds the entry.
    let newer = f.queue.begin_term().await.unwrap();
    let writer = f.writer(&f.registry).await;
    writer.set_term(term);
    let fenced_before = f.queue.fenced_operations().await.unwrap();
    for t in taken {
        writer.process(t, &CancellationToken::new()).await;
    }
    assert!(
        !f.pv_exists(entry.pv_name()).await,
        "a superseded writer created a PV"
    );
    assert!(f.queue.fenced_operations().await.unwrap() > fenced_before);
    // The entry is still in flight for the new term's recovery, which writes it.
    assert_eq!(f.queue.recover_inflight(newer).await.unwrap(), 1);
    let writer = f.writer(&Registry::new()).await;
    writer.set_term(newer);
    for t in f.take(newer).await {
        writer.process(t, &CancellationToken::new()).await;
    }
    assert!(f.pv_exists(entry.pv_name()).await);
    assert_eq!(f.queue.stats().await.unwrap().depth, 0);
}

on_both_planes!(a_superseded_writer_creates_nothing);

async fn a_signed_entry_of_a_gone_claim_creates_no_pv(plane: ControlPlane) {
    let f = Fixture::new(plane).await;
    // Deleted: a genuine, correctly signed entry replayed after its claim is gone.
    let gone_uid = create_claim(&f.admin, "gone0").await;
    let gone = entry_for_claim("gone0", &gone_uid);
    f.delete_claim("gone0").await;
    // Re-created under the same name: the entry's claim (its uid) is gone.
    let old_uid = create_claim(&f.admin, "again0").await;
    let again = entry_for_claim("again0", &old_uid);
    f.delete_claim("again0").await;
    let new_uid = create_claim(&f.admin, "again0").await;
    assert_ne!(new_uid, old_uid);
    // A live claim next to them is written as usual.
    let live_uid = create_claim(&f.admin, "live0").await;
    let live = entry_for_claim("live0", &live_uid);
    for e in [&gone, &again, &live] {
        f.enqueue(e).await;
    }
    let term = f.queue.begin_term().await.unwrap();
    let writer = f.writer(&f.registry).await;
    writer.set_term(term);
    let taken = f.take(term).await;
    assert_eq!(taken.len(), 3);
    for t in taken {
        writer.process(t, &CancellationToken::new()).await;
    }
    assert!(!f.pv_exists(gone.pv_name()).await, "PV of a deleted claim");
    assert!(
        !f.pv_exists(again.pv_name()).await,
        "PV of a re-created claim's old uid"
    );
    assert!(f.pv_exists(live.pv_name()).await);
    // Both dropped (nothing dead-lettered, nothing left to write), counted.
    assert!(f.queue.list_dead().await.unwrap().is_empty());
    assert_eq!(f.queue.stats().await.unwrap().depth, 0);
    assert!(f.queue.payload(gone.pv_name()).await.unwrap().is_none());
    assert_eq!(f.refused(CLAIM_GONE), 2.0);
}

on_both_planes!(a_signed_entry_of_a_gone_claim_creates_no_pv);
