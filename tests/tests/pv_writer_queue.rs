//! pv-writer's drain loop in-process against the API-server simulator and a
//! private `redis-server` (AOF, `appendfsync always`): writes, idempotence, dead letters,
//! retries, Redis restarts, an API outage, requeue.

use provisioner_ctl::queue::{run_queue_command, Action};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::queue::{ClaimKey, QueuedPvWrite, SCHEMA_VERSION};
use backend_hostpath::{base_dirs::BaseDirs, HostPath, OnDelete};
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::handoff::test_redis::Proxy;
use common::kube::time::now_ms;
use common::runtime::http::Readiness;
use e2e::harness::redis::RedisServer;
use e2e::harness::wait::wait_until;
use e2e::sim::{FaultSpec, SimConfig, Simulator};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, DeleteParams};
use pv_writer::checks::EntryChecks;
use pv_writer::config::WriterConfig;
use pv_writer::metrics::{Registry, WriterMetrics};
use pv_writer::operation::Writer;
use serde_json::json;
use tokio_util::sync::CancellationToken;

const PROVISIONER: &str = "example.com/hostpath";
const BASE_DIR: &str = "/var/lib/hostpath-provisioner";

/// A PV as provision-svc makes it; `valid: false` leaves out `spec.capacity`,
/// which pv-writer's own checks do not look at but the API server rejects (422).
fn pv_json(name: &str, claim_uid: &str, valid: bool) -> serde_json::Value {
    let mut spec = json!({
        "capacity": {"storage": "1Gi"},
        "accessModes": ["ReadWriteOnce"],
        "persistentVolumeReclaimPolicy": "Delete",
        "storageClassName": "fast",
        "volumeMode": "Filesystem",
        "hostPath": {"path": format!("{BASE_DIR}/{name}"), "type": "DirectoryOrCreate"},
        "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "default", "name": format!("claim-{claim_uid}"), "uid": claim_uid},
    });
    if !valid {
        spec.as_object_mut().unwrap().remove("capacity");
    }
    json!({"apiVersion": "v1", "kind": "PersistentVolume",
           "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
           "spec": spec})
}

const PROVISION_TOTAL: &str = "controller_persistentvolumeclaim_provision_total";
const PROVISION_FAILED: &str = "controller_persistentvolumeclaim_provision_failed_total";

fn entry(uid: &str) -> QueuedPvWrite {
    entry_with(uid, true)
}

fn entry_with(uid: &str, valid: bool) -> QueuedPvWrite {
    let name = format!("pvc-{uid}");
    QueuedPvWrite {
        version: SCHEMA_VERSION,
        pv: serde_json::from_value(pv_json(&name, uid, valid)).unwrap(),
        claim: ClaimKey {
            namespace: "default".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
        },
        class: "fast".into(),
        enqueued_at_ms: now_ms(),
        first_attempt_at_ms: None,
        mac: None,
    }
}

struct Fixture {
    sim: e2e::sim::SimHandle,
    redis: RedisServer,
    queue: PvQueue,
    /// The queue key provision-svc and the writer share.
    key: QueueKey,
    registry: Registry,
    readiness: Readiness,
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<Result<(), pv_writer::operation::WriterError>>>,
    _dir: tempfile::TempDir,
}

impl Fixture {
    async fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let sim = Simulator::start(SimConfig::bare()).await.unwrap();
        let redis = RedisServer::start(&dir.path().join("redis"), &dir.path().join("redis.log"))
            .await
            .unwrap();
        let queue = PvQueue::connect(&redis.url(), PROVISIONER).await.unwrap();
        Fixture {
            sim,
            redis,
            queue,
            key: QueueKey::from_bytes(uuid::Uuid::new_v4().simple().to_string().as_bytes())
                .unwrap(),
            registry: Registry::new(),
            readiness: Readiness::default(),
            shutdown: CancellationToken::new(),
            task: None,
            _dir: dir,
        }
    }

    /// Enqueue `entry` signed with the fixture's key, as provision-svc does,
    /// after creating its claim (with the entry's uid) unless it exists.
    async fn enqueue(&self, entry: &QueuedPvWrite) {
        self.create_claim(&entry.claim);
        let mut entry = entry.clone();
        self.key.sign(PROVISIONER, &mut entry);
        self.queue.enqueue(&entry).await.unwrap();
    }

    /// Create the claim `key` names, with its uid, unless it exists.
    fn create_claim(&self, key: &ClaimKey) {
        let claim = json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": key.name, "namespace": key.namespace, "uid": key.uid},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                     "resources": {"requests": {"storage": "1Gi"}}},
        });
        match self
            .sim
            .create_object("persistentvolumeclaims", &key.namespace, claim)
        {
            Ok(_) => {}
            Err(e) if e.code == 409 => {}
            Err(e) => panic!("creating claim {key}: {e:?}"),
        }
    }

    fn checks(&self) -> EntryChecks {
        EntryChecks::new(
            vec![PROVISIONER.into()],
            Some(self.key.clone()),
            Arc::new(BaseDirs(vec![HostPath {
                base_dir: BASE_DIR.into(),
                node_name: None,
                on_delete: OnDelete::Retain,
                capacity: None,
            }])),
        )
    }

    async fn start_writer(&mut self, retry_initial: Duration, retry_max: Duration) {
        self.start_writer_at(&self.redis.url(), retry_initial, retry_max)
            .await;
    }

    /// [`start_writer`](Self::start_writer) with the writer's Redis at `url`.
    async fn start_writer_at(&mut self, url: &str, retry_initial: Duration, retry_max: Duration) {
        let metrics = WriterMetrics::register(&self.registry);
        let queue = PvQueue::connect(url, PROVISIONER).await.unwrap();
        let writer = Arc::new(Writer::new(
            queue,
            self.checks(),
            self.sim.client().unwrap(),
            "pv-writer-test",
            metrics,
            self.readiness.clone(),
            WriterConfig {
                workers: 8,
                retry_initial,
                retry_max,
                write_timeout: Duration::from_secs(5),
                visibility_timeout: Duration::from_secs(30),
                redis_reconnect: Duration::from_millis(500),
            },
        ));
        self.readiness.set_leading(true);
        self.task = Some(tokio::spawn(writer.run(self.shutdown.clone())));
    }

    fn metric(&self, name: &str, label: Option<(&str, &str)>) -> f64 {
        let text = common::runtime::metrics::render(&self.registry);
        let prefix = match label {
            Some((k, v)) => format!("{name}{{{k}=\"{v}\"}} "),
            None => format!("{name} "),
        };
        text.lines()
            .find_map(|l| l.strip_prefix(&prefix))
            .map(|v| v.parse().unwrap())
            .unwrap_or(0.0)
    }

    fn pv_claim_uid(&self, name: &str) -> Option<String> {
        self.sim
            .object("persistentvolumes", "", name)
            .and_then(|pv| pv["spec"]["claimRef"]["uid"].as_str().map(String::from))
    }

    fn events(&self, reason: &str) -> Vec<serde_json::Value> {
        self.sim
            .objects("events.events.k8s.io")
            .into_iter()
            .filter(|e| e["reason"] == reason)
            .collect()
    }

    async fn wait_drained(&self, timeout: Duration) {
        let q = self.queue.clone();
        wait_until(timeout, "queue drained", || {
            let q = q.clone();
            async move { q.stats().await.map(|s| s.depth == 0).unwrap_or(false) }
        })
        .await
        .unwrap();
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(t) = self.task.take() {
            t.await.unwrap().unwrap();
        }
    }
}

#[tokio::test]
async fn drains_entries_into_pvs_with_events_and_is_idempotent() {
    let mut f = Fixture::new().await;
    for i in 0..40 {
        f.enqueue(&entry(&format!("u{i}"))).await;
        // Re-enqueue of the same PV name does not duplicate.
        f.enqueue(&entry(&format!("u{i}"))).await;
    }
    assert_eq!(f.queue.stats().await.unwrap().depth, 40);
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    f.wait_drained(Duration::from_secs(20)).await;
    assert_eq!(f.sim.count("persistentvolumes"), 40);
    for i in 0..40 {
        assert_eq!(
            f.pv_claim_uid(&format!("pvc-u{i}")).as_deref(),
            Some(format!("u{i}").as_str())
        );
        assert!(!f.queue.is_pending(&format!("pvc-u{i}")).await.unwrap());
    }
    assert_eq!(f.sim.stats().count("create", "persistentvolumes"), 40);
    assert_eq!(
        f.metric("pv_writer_writes_total", Some(("outcome", "created"))),
        40.0
    );
    assert_eq!(
        f.metric(PROVISION_TOTAL, Some(("class", "fast"))),
        40.0,
        "the seed's count: one per PV stored"
    );
    let q = f.queue.clone();
    let sim_events = || f.events("ProvisioningSucceeded").len();
    wait_until(
        Duration::from_secs(5),
        "40 ProvisioningSucceeded events",
        || {
            let n = sim_events();
            async move { n == 40 }
        },
    )
    .await
    .unwrap();
    let ev = &f.events("ProvisioningSucceeded")[0];
    assert_eq!(ev["type"], "Normal");
    assert_eq!(ev["regarding"]["kind"], "PersistentVolumeClaim");
    assert!(ev["note"]
        .as_str()
        .unwrap()
        .starts_with("Successfully provisioned volume pvc-u"));
    assert!(f.readiness.is_ready());
    drop(q);
    f.stop().await;
}

#[tokio::test]
async fn already_exists_and_invalid_entries_are_settled_without_blind_retries() {
    let mut f = Fixture::new().await;
    // Same claim uid already written (an earlier attempt): success.
    f.sim
        .create_object("persistentvolumes", "", pv_json("pvc-same", "same", true))
        .unwrap();
    // Another claim owns the PV name: dead letter.
    f.sim
        .create_object(
            "persistentvolumes",
            "",
            pv_json("pvc-other", "someone-else", true),
        )
        .unwrap();
    let mut same = entry("same");
    same.pv.metadata.name = Some("pvc-same".into());
    let mut other = entry("other");
    other.pv.metadata.name = Some("pvc-other".into());
    f.enqueue(&same).await;
    f.enqueue(&other).await;
    f.enqueue(&entry_with("invalid", false)).await;
    // Unreadable entries: dead-lettered, the worker keeps going.
    f.queue
        .enqueue_raw("pvc-garbled", b"{not json")
        .await
        .unwrap();
    let mut v = serde_json::to_value(entry("future")).unwrap();
    v["version"] = 99.into();
    f.queue
        .enqueue_raw("pvc-future", &serde_json::to_vec(&v).unwrap())
        .await
        .unwrap();
    f.enqueue(&entry("ok")).await;
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    f.wait_drained(Duration::from_secs(10)).await;
    // Give a blind retry time to show up; there must be none.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(
        f.sim.stats().count("create", "persistentvolumes"),
        4,
        "same, other, invalid, ok: once each"
    );

    let dead = f.queue.list_dead().await.unwrap();
    let names: Vec<_> = dead.iter().map(|d| d.pv_name.as_str()).collect();
    assert_eq!(
        names,
        ["pvc-future", "pvc-garbled", "pvc-invalid", "pvc-other"]
    );
    assert!(
        dead[0].reason.contains("unknown record version 99"),
        "{}",
        dead[0].reason
    );
    assert!(
        dead[1]
            .reason
            .starts_with("unreadable queue entry: garbled record"),
        "{}",
        dead[1].reason
    );
    assert!(
        dead[2]
            .reason
            .starts_with("API server rejected PV pvc-invalid as invalid"),
        "{}",
        dead[2].reason
    );
    assert!(
        dead[3]
            .reason
            .contains("already exists for claim default/claim-someone-else (uid someone-else)"),
        "{}",
        dead[3].reason
    );
    assert_eq!(f.pv_claim_uid("pvc-same").as_deref(), Some("same"));
    assert_eq!(
        f.pv_claim_uid("pvc-other").as_deref(),
        Some("someone-else"),
        "never overwritten"
    );
    assert_eq!(f.pv_claim_uid("pvc-ok").as_deref(), Some("ok"));
    assert!(
        f.queue.is_pending("pvc-other").await.unwrap(),
        "a dead letter still blocks re-provisioning"
    );
    assert_eq!(
        f.metric(
            "pv_writer_writes_total",
            Some(("outcome", "already_exists"))
        ),
        1.0
    );
    assert_eq!(
        f.metric("pv_writer_writes_total", Some(("outcome", "created"))),
        1.0
    );
    assert_eq!(
        f.metric("pv_writer_writes_total", Some(("outcome", "dead_letter"))),
        4.0
    );
    // The seed's families: same + ok stored; other + invalid failed under
    // their class; garbled and future-version entries have no class to trust.
    assert_eq!(f.metric(PROVISION_TOTAL, Some(("class", "fast"))), 2.0);
    assert_eq!(f.metric(PROVISION_FAILED, Some(("class", "fast"))), 2.0);
    assert_eq!(f.metric(PROVISION_FAILED, Some(("class", ""))), 2.0);
    assert_eq!(
        f.metric(
            "pv_writer_dead_letters_total",
            Some(("reason", "claimed_by_other"))
        ),
        1.0
    );
    assert_eq!(
        f.metric("pv_writer_dead_letters_total", Some(("reason", "invalid"))),
        1.0
    );
    assert_eq!(
        f.metric("pv_writer_dead_letters_total", Some(("reason", "garbled"))),
        1.0
    );
    assert_eq!(
        f.metric(
            "pv_writer_dead_letters_total",
            Some(("reason", "unknown_version"))
        ),
        1.0
    );
    wait_until(Duration::from_secs(3), "dead-letter gauge", || {
        let v = f.metric("pv_writer_queue_dead_letters", None);
        async move { v == 4.0 }
    })
    .await
    .unwrap();
    let warnings = f.events("ProvisioningFailed");
    let mut claims: Vec<_> = warnings
        .iter()
        .map(|e| e["regarding"]["name"].as_str().unwrap().to_string())
        .collect();
    claims.sort();
    assert_eq!(claims, ["claim-invalid", "claim-other"]);
    assert!(warnings.iter().all(|e| e["type"] == "Warning"));

    // Operator resolves the conflict and requeues the dead letter.
    let api: Api<PersistentVolume> = Api::all(f.sim.client().unwrap());
    api.delete("pvc-other", &DeleteParams::default())
        .await
        .unwrap();
    let out = run_queue_command(&f.queue, Action::Requeue("pvc-other"))
        .await
        .unwrap();
    assert_eq!(out, "requeued dead letter pvc-other\n");
    f.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(f.pv_claim_uid("pvc-other").as_deref(), Some("other"));
    let err = run_queue_command(&f.queue, Action::Requeue("pvc-ok"))
        .await
        .unwrap_err();
    assert_eq!(err.to_string(), "PV pvc-ok is not in the queue");
    let listing = run_queue_command(&f.queue, Action::Dead).await.unwrap();
    assert_eq!(listing.lines().count(), 4, "{listing}");
    assert!(
        listing
            .lines()
            .nth(3)
            .unwrap()
            .starts_with("pvc-invalid\tdefault/claim-invalid (uid invalid)\t0\t"),
        "{listing}"
    );
    f.stop().await;
}

#[tokio::test]
async fn transient_failures_are_retried_with_backoff() {
    let mut f = Fixture::new().await;
    f.sim
        .inject_fault(FaultSpec::error(500, &["create"], &["persistentvolumes"]).times(3));
    f.enqueue(&entry("t")).await;
    let started = Instant::now();
    f.start_writer(Duration::from_millis(200), Duration::from_secs(5))
        .await;
    f.wait_drained(Duration::from_secs(10)).await;
    let took = started.elapsed();
    // Backoff 200 + 400 + 800 ms, each at least 80 %: ≥ 1.12 s.
    assert!(took >= Duration::from_millis(1120), "{took:?}");
    assert!(took < Duration::from_secs(4), "{took:?}");
    assert_eq!(f.pv_claim_uid("pvc-t").as_deref(), Some("t"));
    assert_eq!(f.sim.stats().count("create", "persistentvolumes"), 4);
    assert_eq!(f.metric("pv_writer_retries_total", None), 3.0);
    assert_eq!(
        f.metric("pv_writer_writes_total", Some(("outcome", "retry"))),
        3.0
    );
    assert_eq!(
        f.metric("pv_writer_writes_total", Some(("outcome", "created"))),
        1.0
    );
    f.stop().await;
}

#[tokio::test]
async fn redis_restarts_with_pending_entries_lose_nothing() {
    let mut f = Fixture::new().await;
    for i in 0..100 {
        f.enqueue(&entry(&format!("r{i}"))).await;
    }
    // Past a second: on disk even if the server fsynced only every second.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    f.redis.restart(true).await.unwrap();
    // The test's own connection reconnects in the background; its first command may fail.
    let q = f.queue.clone();
    wait_until(
        Duration::from_secs(5),
        "all 100 entries back after the restart",
        || {
            let q = q.clone();
            async move { q.stats().await.map(|s| s.depth == 100).unwrap_or(false) }
        },
    )
    .await
    .unwrap();

    // Slow the API server so Redis crashes mid-drain too.
    f.sim.set_latency(Duration::from_millis(20));
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    let sim = &f.sim;
    wait_until(Duration::from_secs(10), "some PVs written", || {
        let n = sim.count("persistentvolumes");
        async move { n >= 20 }
    })
    .await
    .unwrap();
    f.redis.stop(true);
    let readiness = f.readiness.clone();
    wait_until(
        Duration::from_secs(10),
        "not ready while Redis is down",
        || {
            let r = readiness.is_ready();
            async move { !r }
        },
    )
    .await
    .unwrap();
    f.redis.restart(false).await.unwrap();
    f.wait_drained(Duration::from_secs(30)).await;
    assert!(f.readiness.is_ready());
    assert_eq!(f.sim.count("persistentvolumes"), 100);
    for i in 0..100 {
        assert_eq!(
            f.pv_claim_uid(&format!("pvc-r{i}")).as_deref(),
            Some(format!("r{i}").as_str())
        );
    }
    assert!(f.queue.list_dead().await.unwrap().is_empty());
    f.stop().await;
}

#[tokio::test]
async fn api_outage_of_30s_then_all_written_within_seconds() {
    let mut f = Fixture::new().await;
    let outage = Duration::from_secs(30);
    f.sim.inject_fault(
        FaultSpec::error(503, &["create", "get"], &["persistentvolumes"]).for_duration(outage),
    );
    let fault_start = Instant::now();
    for i in 0..200 {
        f.enqueue(&entry(&format!("o{i}"))).await;
    }
    // Default flags: --retry-interval-start 1s, --retry-interval-max 5m.
    f.start_writer(Duration::from_secs(1), Duration::from_secs(300))
        .await;
    tokio::time::sleep(outage - Duration::from_secs(1)).await;
    assert_eq!(f.sim.count("persistentvolumes"), 0);
    f.wait_drained(Duration::from_secs(20)).await;
    let after_recovery = fault_start.elapsed().saturating_sub(outage);
    println!("all 200 PVs written {after_recovery:?} after the API server recovered");
    assert!(
        after_recovery < Duration::from_secs(5),
        "{after_recovery:?}"
    );
    assert_eq!(f.sim.count("persistentvolumes"), 200);
    let retries = f.metric("pv_writer_retries_total", None);
    // kube's client retries 503 a few times itself before pv-writer sees a failure.
    println!(
        "retries scheduled: {retries}, PV create requests: {}",
        f.sim.stats().count("create", "persistentvolumes")
    );
    assert!(retries >= 1.0, "{retries}");
    f.stop().await;
}

/// Write `payload` straight into the queue's Redis keys, bypassing provision-svc
/// and the enqueue script: what anyone holding Redis credentials can do.
async fn write_behind_the_queues_back(redis_url: &str, pv_name: &str, payload: &[u8]) {
    let mut conn = redis::Client::open(redis_url)
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let prefix = format!("provisioner:{{{PROVISIONER}}}:pv-queue:");
    let _: () = redis::pipe()
        .hset(format!("{prefix}payloads"), pv_name, payload)
        .zadd(format!("{prefix}due"), pv_name, 0)
        .zadd(format!("{prefix}enqueued"), pv_name, 0)
        .query_async(&mut conn)
        .await
        .unwrap();
}

#[tokio::test]
async fn forged_entries_written_into_redis_are_refused_and_nothing_is_created() {
    let mut f = Fixture::new().await;
    // An attacker's entry: a hostPath of / bound to their own claim, unsigned.
    let mut forged = entry("evil");
    forged
        .pv
        .spec
        .as_mut()
        .unwrap()
        .host_path
        .as_mut()
        .unwrap()
        .path = "/".into();
    write_behind_the_queues_back(&f.redis.url(), "pvc-evil", &forged.encode()).await;
    // The same, signed with a key the attacker made up.
    let mut guessed = entry("guess");
    guessed
        .pv
        .spec
        .as_mut()
        .unwrap()
        .host_path
        .as_mut()
        .unwrap()
        .path = "/".into();
    QueueKey::from_bytes(&[b'x'; 32])
        .unwrap()
        .sign(PROVISIONER, &mut guessed);
    write_behind_the_queues_back(&f.redis.url(), "pvc-guess", &guessed.encode()).await;
    // A correctly signed entry whose volume source is not one the backend makes
    // (a provision-svc bug, or a stolen key with a different path): still refused.
    let mut outside = entry("outside");
    outside
        .pv
        .spec
        .as_mut()
        .unwrap()
        .host_path
        .as_mut()
        .unwrap()
        .path = "/etc".into();
    f.enqueue(&outside).await;
    // A signed entry for another claim's PV name.
    let mut stolen = entry("thief");
    stolen
        .pv
        .spec
        .as_mut()
        .unwrap()
        .claim_ref
        .as_mut()
        .unwrap()
        .uid = Some("victim".into());
    f.enqueue(&stolen).await;
    f.enqueue(&entry("ok")).await;

    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    f.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(
        f.sim.stats().count("create", "persistentvolumes"),
        1,
        "only the genuine entry reached the API server"
    );
    assert_eq!(f.sim.count("persistentvolumes"), 1);
    assert_eq!(f.pv_claim_uid("pvc-ok").as_deref(), Some("ok"));

    let dead = f.queue.list_dead().await.unwrap();
    let got: Vec<_> = dead
        .iter()
        .map(|d| (d.pv_name.as_str(), d.reason.as_str()))
        .collect();
    assert_eq!(got.len(), 4, "{got:?}");
    assert!(
        got[0].0 == "pvc-evil" && got[0].1.contains("not signed"),
        "{got:?}"
    );
    assert!(
        got[1].0 == "pvc-guess" && got[1].1.contains("signature does not match"),
        "{got:?}"
    );
    assert!(
        got[2].0 == "pvc-outside" && got[2].1.contains("hostPath \"/etc\""),
        "{got:?}"
    );
    assert!(
        got[3].0 == "pvc-thief" && got[3].1.contains("claimRef"),
        "{got:?}"
    );
    for (name, _) in &got {
        assert!(
            f.queue.payload(name).await.unwrap().is_some(),
            "{name}: a refused entry is kept for the operator"
        );
    }
    // Refusals are provisioning failures; the class of an entry that failed
    // its MAC check is the attacker's choice and is not used as a label.
    assert_eq!(f.metric(PROVISION_FAILED, Some(("class", ""))), 2.0);
    assert_eq!(f.metric(PROVISION_FAILED, Some(("class", "fast"))), 2.0);
    assert_eq!(f.metric(PROVISION_TOTAL, Some(("class", "fast"))), 1.0);
    for (reason, n) in [
        ("unsigned", 1.0),
        ("bad_signature", 1.0),
        ("volume_source", 1.0),
        ("claim_ref", 1.0),
    ] {
        assert_eq!(
            f.metric("pv_writer_refused_entries_total", Some(("reason", reason))),
            n,
            "{reason}"
        );
    }
    let mut warned: Vec<_> = f
        .events("ProvisioningFailed")
        .iter()
        .map(|e| e["regarding"]["name"].as_str().unwrap().to_string())
        .collect();
    warned.sort();
    assert_eq!(
        warned,
        ["claim-evil", "claim-guess", "claim-outside", "claim-thief"]
    );
    f.stop().await;
}

#[tokio::test]
async fn a_writer_whose_term_was_superseded_moves_no_entry() {
    let mut f = Fixture::new().await;
    for i in 0..20 {
        f.enqueue(&entry(&format!("s{i}"))).await;
    }
    // Slow PV creates: the old writer has writes in flight when it is superseded.
    let slow = f
        .sim
        .inject_fault(FaultSpec::hang(300, &["create"], &["persistentvolumes"]));
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    let q = f.queue.clone();
    wait_until(Duration::from_secs(10), "writes in flight", || {
        let q = q.clone();
        async move {
            q.list_pending()
                .await
                .map(|p| {
                    p.iter().any(|e| {
                        matches!(e.state, common::handoff::queue::PendingState::InFlight(_))
                    })
                })
                .unwrap_or(false)
        }
    })
    .await
    .unwrap();
    // Another leader begins its term (as after this one stalled past its Lease).
    let new_term = f.queue.begin_term().await.unwrap();
    let old = f.task.take().unwrap();
    let result = tokio::time::timeout(Duration::from_secs(15), old)
        .await
        .expect("the superseded writer stops on its own")
        .unwrap();
    let err = result.expect_err("a superseded writer ends with an error");
    assert!(err.to_string().contains("superseded"), "{err}");
    assert!(f.metric("pv_writer_fenced_operations_total", None) >= 1.0);
    assert!(f.queue.fenced_operations().await.unwrap() >= 1);
    // The old writer completed nothing after the new term began: every entry
    // it had in flight is still queued, and it announced nothing for them.
    let left = f.queue.stats().await.unwrap().depth;
    let announced = f.events("ProvisioningSucceeded").len() as u64;
    assert_eq!(left + announced, 20, "left {left}, announced {announced}");
    assert!(left > 0);

    // The new leader (a fresh writer) recovers and drains; each PV exists once
    // and each claim gets exactly one ProvisioningSucceeded.
    f.sim.remove_fault(slow);
    f.readiness = Readiness::default();
    f.registry = Registry::new();
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    f.wait_drained(Duration::from_secs(20)).await;
    assert!(f.queue.current_term().await.unwrap() > new_term);
    assert_eq!(f.sim.count("persistentvolumes"), 20);
    let mut claims: Vec<_> = f
        .events("ProvisioningSucceeded")
        .iter()
        .map(|e| e["regarding"]["name"].as_str().unwrap().to_string())
        .collect();
    claims.sort();
    let mut expected: Vec<_> = (0..20).map(|i| format!("claim-s{i}")).collect();
    expected.sort();
    assert_eq!(claims, expected, "one ProvisioningSucceeded per claim");
    f.stop().await;
}

/// After Redis lost its data, a term begun above the lost one whose reply never arrived
/// is still this writer's: it drains on under it instead of stopping as if superseded.
#[tokio::test]
async fn a_writer_whose_new_term_reply_was_lost_drains_on_under_it() {
    let mut f = Fixture::new().await;
    let proxy = Proxy::start(f.redis.port()).await;
    f.start_writer_at(
        &proxy.url(),
        Duration::from_millis(100),
        Duration::from_secs(1),
    )
    .await;
    f.enqueue(&entry("before")).await;
    f.wait_drained(Duration::from_secs(10)).await;
    let term = f.queue.current_term().await.unwrap();
    // Keys epoch and epoch-owner followed by arguments: only BEGIN_TERM.
    let key = |k: &str| format!("provisioner:{{{PROVISIONER}}}:pv-queue:{k}");
    let (epoch, owner) = (key("epoch"), key("epoch-owner"));
    let trap = format!(
        "\r\n2\r\n${}\r\n{epoch}\r\n${}\r\n{owner}\r\n$",
        epoch.len(),
        owner.len()
    );
    proxy.lose_reply_of(trap.as_bytes());
    let admin = redis::Client::open(f.redis.url()).unwrap();
    let mut admin = admin.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut admin)
        .await
        .unwrap();
    let q = f.queue.clone();
    wait_until(Duration::from_secs(10), "a term above the lost one", || {
        let q = q.clone();
        async move {
            q.current_term()
                .await
                .map(|t| t == term + 1)
                .unwrap_or(false)
        }
    })
    .await
    .unwrap();
    f.enqueue(&entry("after")).await;
    f.wait_drained(Duration::from_secs(30)).await;
    assert!(proxy.sprung(), "no term began through the proxy");
    assert!(
        !f.task.as_ref().unwrap().is_finished(),
        "the writer stopped"
    );
    assert_eq!(f.queue.current_term().await.unwrap(), term + 1);
    assert!(f.pv_claim_uid(entry("after").pv_name()).is_some());
    f.stop().await;
}

/// The seed's provision duration runs from the claim's first provision attempt
/// (version-2 entries carry it) to the PV stored; a version-1 entry of an
/// earlier release still counts, from its enqueue time.
#[tokio::test]
async fn provision_duration_runs_from_the_first_attempt_and_old_entries_still_count() {
    let mut f = Fixture::new().await;
    let now = now_ms();
    let mut v2 = entry("new");
    v2.version = api_types::queue::QUEUE_ENTRY_VERSION;
    v2.class = "slow".into();
    v2.enqueued_at_ms = now - 1_000;
    v2.first_attempt_at_ms = Some(now - 60_000);
    f.enqueue(&v2).await;
    let mut v1 = entry("old");
    v1.class = "slow".into();
    v1.enqueued_at_ms = now - 20_000;
    f.enqueue(&v1).await;
    f.start_writer(Duration::from_millis(100), Duration::from_secs(1))
        .await;
    f.wait_drained(Duration::from_secs(10)).await;
    assert_eq!(f.metric(PROVISION_TOTAL, Some(("class", "slow"))), 2.0);
    let count = f.metric(
        "controller_persistentvolumeclaim_provision_duration_seconds_count",
        Some(("class", "slow")),
    );
    assert_eq!(count, 2.0);
    let sum = f.metric(
        "controller_persistentvolumeclaim_provision_duration_seconds_sum",
        Some(("class", "slow")),
    );
    // 60 s from the first attempt + 20 s from the old entry's enqueue, plus
    // the few seconds the writer took.
    assert!((80.0..90.0).contains(&sum), "duration sum {sum}");
    f.stop().await;
}
