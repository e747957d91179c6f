use super::*;
use api_types::queue::{DecodeError, SCHEMA_VERSION};
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::handoff::test_redis::TestRedis as Redis;

fn entry(name: &str) -> QueuedPvWrite {
    QueuedPvWrite {
        version: SCHEMA_VERSION,
        pv: PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        },
        claim: ClaimKey {
            namespace: "ns".into(),
            name: format!("claim-{name}"),
            uid: format!("uid-{name}"),
        },
        class: "fast".into(),
        enqueued_at_ms: 1_000,
        first_attempt_at_ms: None,
        mac: None,
    }
}

const VIS: Duration = Duration::from_secs(60);

async fn queue(redis: &Redis, provisioner: &str) -> PvQueue {
    PvQueue::connect(&redis.url(), provisioner).await.unwrap()
}

/// Names of the entries `term` takes (up to 10, the usual visibility timeout), in order.
async fn take(q: &PvQueue, term: u64) -> Vec<String> {
    names(q.take_due(term, 10, VIS).await.unwrap())
}

/// How many pending entries have an owner term.
async fn owned(q: &PvQueue) -> usize {
    let pending = q.list_pending().await.unwrap();
    pending.iter().filter(|e| e.owner_term.is_some()).count()
}

/// A private Redis and a queue of provisioner `p` on it.
async fn started() -> (Redis, PvQueue) {
    let redis = Redis::start().await;
    let q = queue(&redis, "p").await;
    (redis, q)
}

/// Complete `names` in `term`, each settled.
async fn complete_all(q: &PvQueue, term: u64, names: &[&str]) {
    for name in names {
        assert_eq!(q.complete(term, name).await.unwrap(), Settled::Done);
    }
}

fn names(taken: Option<Vec<TakenEntry>>) -> Vec<String> {
    taken
        .expect("current term")
        .into_iter()
        .map(|t| t.pv_name)
        .collect()
}

async fn inflight_deadline(q: &PvQueue, name: &str) -> u64 {
    let score: Option<f64> = q
        .conn
        .clone()
        .zscore(q.keys.get(Key::InFlight), name)
        .await
        .unwrap();
    score.expect("in flight") as u64
}

#[tokio::test]
async fn enqueue_is_idempotent_and_drains() {
    let redis = Redis::start().await;
    let q = queue(&redis, "example.com/hostpath").await;
    let other = queue(&redis, "other.io/x").await;
    let term = q.begin_term().await.unwrap();
    assert!(q.enqueue(&entry("pvc-a")).await.unwrap().added);
    assert!(!q.enqueue(&entry("pvc-a")).await.unwrap().added);
    q.enqueue(&entry("pvc-b")).await.unwrap();
    assert!(q.is_pending("pvc-a").await.unwrap());
    assert!(!q.is_pending("pvc-c").await.unwrap());
    assert!(
        !other.is_pending("pvc-a").await.unwrap(),
        "keys are per provisioner"
    );
    let stats = q.stats().await.unwrap();
    assert_eq!((stats.depth, stats.dead), (2, 0));
    let oldest = stats.oldest_enqueued_ms.unwrap();
    assert!(oldest <= stats.redis_now_ms && stats.redis_now_ms - oldest < 5_000);

    let taken = q.take_due(term, 1, VIS).await.unwrap().unwrap();
    assert_eq!(taken.len(), 1);
    assert_eq!(taken[0].pv_name, "pvc-a");
    assert_eq!(taken[0].attempts, 0);
    assert_eq!(
        QueuedPvWrite::decode(&taken[0].payload).unwrap(),
        entry("pvc-a")
    );
    assert_eq!(take(&q, term).await, ["pvc-b"]);
    assert!(
        q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty(),
        "in flight is invisible"
    );
    assert!(q.is_pending("pvc-a").await.unwrap());
    assert_eq!(q.complete(term, "pvc-a").await.unwrap(), Settled::Done);
    assert_eq!(
        q.complete(term, "pvc-a").await.unwrap(),
        Settled::NotInFlight
    );
    assert!(!q.is_pending("pvc-a").await.unwrap());
    q.complete(term, "pvc-b").await.unwrap();
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.depth, stats.dead, stats.oldest_enqueued_ms),
        (0, 0, None)
    );
    // Once completed, the same PV name may be queued again.
    assert!(q.enqueue(&entry("pvc-a")).await.unwrap().added);
    assert_eq!(q.fenced_operations().await.unwrap(), 0);
}

#[tokio::test]
async fn enqueue_clears_the_provisioning_intent_in_the_same_script() {
    let redis = Redis::start().await;
    let q = queue(&redis, "p").await;
    let intents = crate::handoff::intents::IntentStore::connect(&redis.url(), "p")
        .await
        .unwrap();
    let claim = k8s_openapi::api::core::v1::PersistentVolumeClaim::default();
    intents
        .record_with_claim(&intent_for("pvc-a"), &claim, true)
        .await
        .unwrap();
    intents
        .record_with_claim(&intent_for("pvc-b"), &claim, false)
        .await
        .unwrap();

    // An observer polling both hashes atomically never sees the PV neither
    // queued nor covered by its intent.
    let observer = {
        let q = q.clone();
        tokio::spawn(async move {
            let mut gaps = 0;
            for _ in 0..400 {
                let (queued, intent): (bool, bool) = redis::pipe()
                    .atomic()
                    .hexists(q.keys.get(Key::Payloads), "pvc-a")
                    .hexists(q.keys.get(Key::Intents), "pvc-a")
                    .query_async(&mut q.conn.clone())
                    .await
                    .unwrap();
                if !queued && !intent {
                    gaps += 1;
                }
            }
            gaps
        })
    };
    let outcome = q.enqueue(&entry("pvc-a")).await.unwrap();
    assert!(outcome.added && outcome.intent_cleared, "{outcome:?}");
    assert_eq!(observer.await.unwrap(), 0);
    assert!(!intents.contains("pvc-a").await.unwrap());
    assert_eq!(intents.entry("pvc-a").await.unwrap(), None);
    assert!(
        intents.contains("pvc-b").await.unwrap(),
        "only the queued PV's intent"
    );
    // A repeated enqueue clears nothing more and adds nothing.
    let again = q.enqueue(&entry("pvc-a")).await.unwrap();
    assert!(!again.added && !again.intent_cleared);
}

fn intent_for(pv_name: &str) -> api_types::queue::ProvisionIntent {
    api_types::queue::ProvisionIntent {
        version: api_types::queue::INTENT_VERSION,
        claim: entry(pv_name).claim,
        pv_name: pv_name.into(),
        class: "fast".into(),
        storage_class: None,
        selected_node: None,
        recorded_at_ms: 1,
    }
}

#[tokio::test]
async fn enqueue_reports_the_aof_fsync_only_where_waitaof_exists() {
    let redis = Redis::start().await;
    let q = queue(&redis, "p").await;
    let info: String = redis::cmd("INFO")
        .arg("server")
        .query_async(&mut q.conn.clone())
        .await
        .unwrap();
    let version: Vec<u32> = info
        .lines()
        .find_map(|l| l.strip_prefix("redis_version:"))
        .unwrap()
        .trim()
        .split('.')
        .map(|p| p.parse().unwrap())
        .collect();
    let has_waitaof = (version[0], version[1]) >= (7, 2);
    for name in ["pvc-a", "pvc-b"] {
        let outcome = q.enqueue(&entry(name)).await.unwrap();
        assert!(outcome.added);
        assert_eq!(outcome.fsynced, has_waitaof, "Redis {version:?}");
    }
}

#[tokio::test]
async fn an_enqueue_wakes_a_waiting_writer_at_once() {
    let redis = Redis::start().await;
    let q = queue(&redis, "example.com/hostpath").await;
    // Idle: the wait runs to its timeout and reports no signal.
    let started = std::time::Instant::now();
    assert!(!q.wait_for_work(Duration::from_millis(200)).await.unwrap());
    assert!(started.elapsed() >= Duration::from_millis(190));

    let waiter = {
        let q = q.clone();
        tokio::spawn(async move {
            let started = std::time::Instant::now();
            let woken = q.wait_for_work(Duration::from_secs(5)).await.unwrap();
            (woken, started.elapsed())
        })
    };
    tokio::time::sleep(Duration::from_millis(100)).await;
    q.enqueue(&entry("pvc-w")).await.unwrap();
    let (woken, waited) = waiter.await.unwrap();
    assert!(woken);
    assert!(waited < Duration::from_secs(1), "woken late: {waited:?}");

    // Several enqueues leave a single token; a re-enqueue of a queued PV none.
    q.enqueue(&entry("pvc-x")).await.unwrap();
    q.enqueue(&entry("pvc-y")).await.unwrap();
    assert!(q.wait_for_work(Duration::from_millis(100)).await.unwrap());
    q.enqueue(&entry("pvc-x")).await.unwrap();
    assert!(!q.wait_for_work(Duration::from_millis(100)).await.unwrap());
}

#[tokio::test]
async fn a_term_begun_after_a_flush_stays_above_the_lost_one() {
    let redis = Redis::start().await;
    let q = queue(&redis, "p").await;
    q.begin_term().await.unwrap();
    let held = q.begin_term().await.unwrap();
    let _: () = redis::cmd("FLUSHALL")
        .query_async(&mut q.conn.clone())
        .await
        .unwrap();
    assert_eq!(q.current_term().await.unwrap(), 0, "the counter is gone");
    let resumed = q.begin_term_above(held).await.unwrap();
    assert_eq!(resumed, held + 1);
    assert_eq!(
        q.take_due(held, 1, VIS).await.unwrap(),
        None,
        "the lost term stays fenced"
    );
    assert_eq!(
        q.begin_term_above(1).await.unwrap(),
        resumed + 1,
        "a low floor is just INCR"
    );
}

#[tokio::test]
async fn a_stale_term_cannot_take_complete_retry_or_dead_letter() {
    let (_redis, q) = started().await;
    let old = q.begin_term().await.unwrap();
    q.enqueue(&entry("pvc-a")).await.unwrap();
    q.enqueue(&entry("pvc-b")).await.unwrap();
    assert_eq!(names(q.take_due(old, 1, VIS).await.unwrap()), ["pvc-a"]);
    // A new leader begins while the old one is paused.
    let new = q.begin_term().await.unwrap();
    assert!(new > old);
    assert_eq!(q.current_term().await.unwrap(), new);

    assert_eq!(q.holds(old, "pvc-a").await.unwrap(), Settled::Fenced);
    assert_eq!(q.complete(old, "pvc-a").await.unwrap(), Settled::Fenced);
    assert_eq!(
        q.schedule_retry(old, "pvc-a", Duration::ZERO, 1)
            .await
            .unwrap(),
        Settled::Fenced
    );
    let letter = DeadLetter {
        pv_name: "pvc-a".into(),
        reason: "x".into(),
        dead_at_ms: 1,
        attempts: 0,
        claim: None,
    };
    assert_eq!(q.dead_letter(old, &letter).await.unwrap(), Settled::Fenced);
    assert_eq!(q.take_due(old, 10, VIS).await.unwrap(), None);
    assert_eq!(q.fenced_operations().await.unwrap(), 5);
    // Nothing moved: pvc-a is still in flight, pvc-b still due, no dead letter.
    let pending = q.list_pending().await.unwrap();
    assert!(matches!(pending[0].state, PendingState::InFlight(_)));
    assert!(matches!(pending[1].state, PendingState::Due(_)));
    assert!(q.list_dead().await.unwrap().is_empty());

    // The new term owns the work from here.
    assert_eq!(q.recover_inflight(new).await.unwrap(), 1);
    let mut taken = take(&q, new).await;
    taken.sort();
    assert_eq!(taken, ["pvc-a", "pvc-b"]);
    assert_eq!(q.holds(new, "pvc-a").await.unwrap(), Settled::Done);
    assert_eq!(q.complete(new, "pvc-a").await.unwrap(), Settled::Done);
    assert_eq!(q.holds(new, "pvc-a").await.unwrap(), Settled::NotInFlight);
    assert_eq!(
        q.dead_letter(new, &letter.clone()).await.unwrap(),
        Settled::NotInFlight
    );
    let letter_b = DeadLetter {
        pv_name: "pvc-b".into(),
        ..letter
    };
    assert_eq!(q.dead_letter(new, &letter_b).await.unwrap(), Settled::Done);
    assert_eq!(q.fenced_operations().await.unwrap(), 5);
}

#[tokio::test]
async fn recovery_takes_only_entries_of_earlier_terms() {
    let (_redis, q) = started().await;
    // An in-flight entry of the previous layout (no owner recorded).
    q.enqueue(&entry("pvc-legacy")).await.unwrap();
    let _: () = q
        .conn
        .clone()
        .zrem(q.keys.get(Key::Due), "pvc-legacy")
        .await
        .unwrap();
    let _: () = q
        .conn
        .clone()
        .zadd(q.keys.get(Key::InFlight), "pvc-legacy", u64::MAX / 4)
        .await
        .unwrap();
    let first = q.begin_term().await.unwrap();
    q.enqueue(&entry("pvc-old")).await.unwrap();
    assert_eq!(take(&q, first).await, ["pvc-old"]);
    let second = q.begin_term().await.unwrap();
    q.enqueue(&entry("pvc-mine")).await.unwrap();
    assert_eq!(take(&q, second).await, ["pvc-mine"]);
    // Recovery hands back pvc-legacy (no owner) and pvc-old (first term),
    // never this term's own pvc-mine.
    assert_eq!(q.recover_inflight(second).await.unwrap(), 2);
    let mut taken = take(&q, second).await;
    taken.sort();
    assert_eq!(taken, ["pvc-legacy", "pvc-old"]);
    assert_eq!(q.recover_inflight(second).await.unwrap(), 0);
    complete_all(&q, second, &["pvc-legacy", "pvc-mine", "pvc-old"]).await;
}

#[tokio::test]
async fn a_take_whose_reply_was_lost_is_requeued_unless_a_worker_holds_it() {
    let (_redis, q) = started().await;
    let old = q.begin_term().await.unwrap();
    q.enqueue(&entry("pvc-old-term")).await.unwrap();
    assert_eq!(take(&q, old).await, ["pvc-old-term"]);
    let term = q.begin_term().await.unwrap();
    for name in ["pvc-held", "pvc-lost"] {
        q.enqueue(&entry(name)).await.unwrap();
    }
    let mut taken = take(&q, term).await;
    taken.sort();
    assert_eq!(taken, ["pvc-held", "pvc-lost"]);
    // A worker holds pvc-held; pvc-lost's take reply never reached anyone.
    assert_eq!(
        q.requeue_unheld(term, &["pvc-held".into()]).await.unwrap(),
        Some(1)
    );
    // pvc-lost is due again at once (not after the 60 s visibility timeout);
    // the held entry and the earlier term's entry are left alone.
    assert_eq!(take(&q, term).await, ["pvc-lost"]);
    assert_eq!(owned(&q).await, 3);
    assert_eq!(
        q.requeue_unheld(term, &["pvc-held".into(), "pvc-lost".into()])
            .await
            .unwrap(),
        Some(0)
    );
    // A stale term changes nothing and is counted as fenced.
    let fenced = q.fenced_operations().await.unwrap();
    assert_eq!(q.requeue_unheld(old, &[]).await.unwrap(), None);
    assert_eq!(q.fenced_operations().await.unwrap(), fenced + 1);
    assert_eq!(owned(&q).await, 3);
    complete_all(&q, term, &["pvc-held", "pvc-lost"]).await;
}

#[tokio::test]
async fn visibility_and_retry_times_come_from_redis_not_the_callers_clock() {
    let (_redis, q) = started().await;
    let term = q.begin_term().await.unwrap();
    q.enqueue(&entry("pvc-a")).await.unwrap();
    let before = q.stats().await.unwrap().redis_now_ms;
    assert_eq!(
        names(
            q.take_due(term, 10, Duration::from_millis(600))
                .await
                .unwrap()
        ),
        ["pvc-a"]
    );
    let deadline = inflight_deadline(&q, "pvc-a").await;
    assert!(
        deadline >= before + 600 && deadline < before + 600 + 2_000,
        "deadline {deadline} vs Redis now {before}"
    );
    // Not taken again before the timeout, whatever the caller's clock says.
    assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
    tokio::time::sleep(Duration::from_millis(700)).await;
    assert_eq!(take(&q, term).await, ["pvc-a"]);

    // A retry is due Redis' now + delay; pulled forward it is due at once.
    let before = q.stats().await.unwrap().redis_now_ms;
    assert_eq!(
        q.schedule_retry(term, "pvc-a", Duration::from_secs(60), 3)
            .await
            .unwrap(),
        Settled::Done
    );
    let pending = q.list_pending().await.unwrap();
    let PendingState::Due(due) = pending[0].state else {
        panic!("{pending:?}")
    };
    assert!(
        due >= before + 60_000 && due < before + 62_000,
        "{due} vs {before}"
    );
    assert_eq!(pending[0].attempts, 3);
    assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
    assert_eq!(q.pull_forward_retries().await.unwrap(), 1);
    let taken = q.take_due(term, 10, VIS).await.unwrap().unwrap();
    assert_eq!((taken[0].pv_name.as_str(), taken[0].attempts), ("pvc-a", 3));
}

#[tokio::test]
async fn dead_letters_keep_the_payload_and_can_be_requeued() {
    let (_redis, q) = started().await;
    let term = q.begin_term().await.unwrap();
    q.enqueue_raw("pvc-x", b"{garbled").await.unwrap();
    let taken = q.take_due(term, 10, VIS).await.unwrap().unwrap();
    assert_eq!(taken[0].payload, b"{garbled");
    let letter = DeadLetter {
        pv_name: "pvc-x".into(),
        reason: "unreadable".into(),
        dead_at_ms: 1_500,
        attempts: 0,
        claim: None,
    };
    assert_eq!(q.dead_letter(term, &letter).await.unwrap(), Settled::Done);
    assert!(
        q.is_pending("pvc-x").await.unwrap(),
        "a dead letter blocks re-provisioning"
    );
    assert_eq!(q.list_dead().await.unwrap(), vec![letter.clone()]);
    assert!(q.list_pending().await.unwrap().is_empty());
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.depth, stats.dead, stats.oldest_enqueued_ms),
        (0, 1, None)
    );
    assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
    assert_eq!(q.recover_inflight(term + 1).await.unwrap(), 0);
    assert_eq!(q.payload("pvc-x").await.unwrap().unwrap(), b"{garbled");

    assert!(!q.requeue_dead("pvc-nope").await.unwrap());
    assert!(q.requeue_dead("pvc-x").await.unwrap());
    assert!(!q.requeue_dead("pvc-x").await.unwrap());
    assert!(q.list_dead().await.unwrap().is_empty());
    let pending = q.list_pending().await.unwrap();
    assert!(matches!(pending[0].state, PendingState::Due(_)));
    assert!(matches!(
        pending[0].entry,
        Err(super::inspect::Unreadable::Decode(DecodeError::Garbled(_)))
    ));
    assert_eq!(q.stats().await.unwrap().depth, 1);
}

/// A name pushed to `incoming` (provision-svc's only way to make an entry
/// due) arms only an entry in no other state: it re-arms nothing in
/// flight or dead, delays no retry and ignores names without a payload.
#[tokio::test]
async fn incoming_names_arm_only_fresh_entries() {
    let (_redis, q) = started().await;
    let term = q.begin_term().await.unwrap();
    for name in ["pvc-flying", "pvc-dead", "pvc-later"] {
        q.enqueue(&entry(name)).await.unwrap();
    }
    assert_eq!(
        q.stats().await.unwrap().depth,
        3,
        "incoming counts as pending"
    );
    assert_eq!(take(&q, term).await.len(), 3);
    let letter = DeadLetter {
        pv_name: "pvc-dead".into(),
        reason: "test".into(),
        dead_at_ms: 1,
        attempts: 0,
        claim: None,
    };
    assert_eq!(q.dead_letter(term, &letter).await.unwrap(), Settled::Done);
    let later = Duration::from_secs(600);
    assert_eq!(
        q.schedule_retry(term, "pvc-later", later, 1).await.unwrap(),
        Settled::Done
    );
    let mut conn = q.conn.clone();
    let later_at: f64 = conn
        .zscore(q.keys.get(Key::Due), "pvc-later")
        .await
        .unwrap();
    for name in ["pvc-flying", "pvc-dead", "pvc-later", "pvc-ghost"] {
        let _: i64 = conn.rpush(q.keys.get(Key::Incoming), name).await.unwrap();
    }
    assert!(take(&q, term).await.is_empty());
    let still: f64 = conn
        .zscore(q.keys.get(Key::Due), "pvc-later")
        .await
        .unwrap();
    assert_eq!(
        still, later_at,
        "a retry is neither delayed nor pulled forward"
    );
    assert_eq!(q.list_dead().await.unwrap().len(), 1);
    let due: Vec<String> = conn.zrange(q.keys.get(Key::Due), 0, -1).await.unwrap();
    assert_eq!(due, ["pvc-later"]);
    let left: i64 = conn.llen(q.keys.get(Key::Incoming)).await.unwrap();
    assert_eq!(left, 0);
    // A fresh enqueue is armed by the next take, in enqueue order.
    q.enqueue(&entry("pvc-new1")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    q.enqueue(&entry("pvc-new0")).await.unwrap();
    assert_eq!(names(q.take_due(term, 1, VIS).await.unwrap()), ["pvc-new1"]);
}

#[tokio::test]
async fn a_due_name_without_payload_is_dropped_from_every_index() {
    let (_redis, q) = started().await;
    let term = q.begin_term().await.unwrap();
    q.enqueue_raw("pvc-lost", b"{}").await.unwrap();
    tokio::time::sleep(Duration::from_millis(5)).await;
    q.enqueue(&entry("pvc-kept")).await.unwrap();
    // A failed attempt leaves a count in `attempts`; then the payload is
    // removed behind the queue's back.
    assert_eq!(names(q.take_due(term, 1, VIS).await.unwrap()), ["pvc-lost"]);
    assert_eq!(
        q.schedule_retry(term, "pvc-lost", Duration::ZERO, 3)
            .await
            .unwrap(),
        Settled::Done
    );
    let mut conn = q.conn.clone();
    let removed: i64 = conn
        .hdel(q.keys.get(Key::Payloads), "pvc-lost")
        .await
        .unwrap();
    assert_eq!(removed, 1);
    let kept_at: f64 = conn
        .zscore(q.keys.get(Key::Enqueued), "pvc-kept")
        .await
        .unwrap();

    let mut taken = take(&q, term).await;
    taken.sort();
    assert_eq!(taken, ["pvc-kept"]);
    let enqueued: Vec<String> = conn.zrange(q.keys.get(Key::Enqueued), 0, -1).await.unwrap();
    assert_eq!(enqueued, ["pvc-kept"]);
    let attempts: Option<String> = conn
        .hget(q.keys.get(Key::Attempts), "pvc-lost")
        .await
        .unwrap();
    assert_eq!(attempts, None);
    let stats = q.stats().await.unwrap();
    assert_eq!(
        (stats.depth, stats.oldest_enqueued_ms),
        (1, Some(kept_at as u64)),
        "pvc-lost no longer counts as the oldest pending entry"
    );
}

#[tokio::test]
async fn unreachable_redis_is_a_clear_error() {
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let err = PvQueue::connect(&format!("redis://u:secret@127.0.0.1:{port}/0"), "p")
        .await
        .err()
        .expect("nothing listens");
    let text = err.to_string();
    assert!(
        text.contains("cannot connect to Redis at redis://u:***@127.0.0.1"),
        "{text}"
    );
    assert!(!text.contains("secret"));
}

#[tokio::test]
async fn enqueue_connections_go_to_the_shared_connections_primary_without_asking_sentinels() {
    let redis = Redis::start().await;
    let conn = crate::handoff::test_redis::behind_unreachable_sentinels(&redis.url()).await;
    let mut q = PvQueue::with_connection(conn, "p");
    q.dedicated = Some(Dedicated::default());
    let outcome = q.enqueue(&entry("pv-1")).await.expect("enqueued");
    assert!(outcome.added);
    assert!(
        q.wait_for_work(Duration::from_secs(1)).await.unwrap(),
        "woken"
    );
    assert!(q.is_pending("pv-1").await.unwrap());
}

#[tokio::test]
async fn after_the_shared_connection_connects_again_idle_enqueue_connections_are_not_reused() {
    let redis = Redis::start().await;
    let proxy = crate::handoff::test_redis::Proxy::start(redis.port()).await;
    let url = proxy.url();
    let conn = crate::handoff::redis_store::connect(url.as_str()).await;
    let mut q = PvQueue::with_connection(conn.unwrap(), "p");
    q.dedicated = Some(Dedicated::default());
    q.enqueue(&entry("pv-1")).await.expect("enqueued");
    // Redis goes silent on every open connection; the shared one connects again first.
    proxy.silence();
    q.connection().timed_out().await;
    let started = std::time::Instant::now();
    let outcome = q.enqueue(&entry("pv-2")).await;
    assert!(outcome.expect("enqueued on a new connection").added);
    let took = started.elapsed();
    assert!(
        took < Duration::from_secs(2),
        "waited {took:?} on a silent one"
    );
}

#[tokio::test]
async fn the_replica_count_is_read_again_after_the_shared_connection_is_replaced() {
    let (primary, replica) = (Redis::start().await, Redis::start().await);
    let conn = crate::handoff::redis_store::connect(primary.url().as_str()).await;
    let mut q = PvQueue::with_connection(conn.unwrap(), "p");
    q.dedicated = Some(Dedicated::default());
    let q = q.with_replica_acks(ReplicaAcks::Auto, Duration::from_secs(2));
    let outcome = q.enqueue(&entry("pv-1")).await.unwrap();
    assert_eq!(outcome.replicas, (0, 0), "no replica yet");
    replica.replicate(&primary).await;
    // As after a move to another primary: the count read from the old one no longer holds.
    q.connection().timed_out().await;
    let outcome = q.enqueue(&entry("pv-2")).await.unwrap();
    assert_eq!(
        outcome.replicas,
        (1, 1),
        "the new primary's replica is waited for"
    );
}

/// A retry whose first script committed still waits for the entry: Redis >= 7.2 counts `WAIT`
/// from the connection's last write (7.0 from its last command), so the script writes again.
#[tokio::test]
async fn a_repeated_enqueue_waits_for_replicas_to_hold_the_entry_already_queued() {
    let (primary, replica) = (Redis::start().await, Redis::start().await);
    replica.replicate(&primary).await;
    let acks = (ReplicaAcks::Count(1), Duration::from_millis(500));
    let first = PvQueue::connect(&primary.url(), "p").await.unwrap();
    let first = first.with_replica_acks(acks.0, acks.1);
    replica.hang();
    let outcome = first.enqueue(&entry("pv-1")).await.unwrap();
    assert_eq!(outcome.replicas, (1, 0), "the hung replica holds nothing");
    // A retry on a connection of its own (as after the first reply was lost).
    let again = PvQueue::connect(&primary.url(), "p").await.unwrap();
    let outcome = again
        .with_replica_acks(acks.0, acks.1)
        .enqueue(&entry("pv-1"))
        .await;
    let outcome = outcome.unwrap();
    assert!(!outcome.added);
    assert_eq!(outcome.replicas, (1, 0), "the entry is still on no replica");
}
