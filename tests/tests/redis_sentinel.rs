//! The Redis connection behind a `redis+sentinel://` URL, on a real primary,
//! replica and three Sentinels: it follows a failover without a restart.

use std::time::Duration;

use common::handoff::data_marker::DataMarker;
use common::handoff::queue::{PvQueue, ReplicaAcks};
use common::handoff::redis_store;
use e2e::harness::sentinel::info;
use e2e::harness::wait::wait_for;
use e2e::harness::{RedisSentinels, RedisServer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_follows_the_primary_through_a_sentinel_failover() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = RedisSentinels::start(dir.path()).await.unwrap();
    let mut conn = redis_store::connect(set.url()).await.unwrap();
    let first = set.primary_port().await.unwrap();
    assert_eq!(conn.primary_addr(), Some(format!("127.0.0.1:{first}")));
    let _: () = redis::cmd("SET")
        .arg("before")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    // The replica has the write before the primary dies (WAIT 1 replica).
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(acked, 1);

    let second = set.kill_primary_and_fail_over().await.unwrap();
    assert_ne!(first, second);
    // Commands fail while the old address is gone, then go to the new primary.
    let written = wait_for(
        Duration::from_secs(20),
        "a write on the new primary",
        || {
            let mut conn = conn.clone();
            async move {
                let r: redis::RedisResult<()> = redis::cmd("SET")
                    .arg("after")
                    .arg(2)
                    .query_async(&mut conn)
                    .await;
                r.ok()
            }
        },
    )
    .await;
    assert!(written.is_ok(), "no write after the failover: {written:?}");
    assert_eq!(conn.primary_addr(), Some(format!("127.0.0.1:{second}")));
    let both: (i64, i64) = redis::cmd("MGET")
        .arg("before")
        .arg("after")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(both, (1, 2), "the replicated write survived the failover");
}

#[tokio::test]
async fn sentinel_urls_with_credentials_are_refused_without_echoing_them() {
    let err = redis_store::connect("redis+sentinel://u:secret@127.0.0.1:1/p")
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("no credentials"), "{err}");
    assert!(!err.contains("secret"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enqueue_waits_for_a_replica_and_reports_a_shortfall() {
    let dir = tempfile::tempdir().unwrap();
    let set = RedisSentinels::start(dir.path()).await.unwrap();
    let queue = PvQueue::connect(set.url(), "example.com/hostpath")
        .await
        .unwrap()
        .with_replica_acks(ReplicaAcks::Auto, Duration::from_millis(500));
    let outcome = queue.enqueue_raw("pvc-1", b"x").await.unwrap();
    assert_eq!(outcome.replicas, (1, 1), "auto asks the one replica");
    // A frozen replica cannot acknowledge: the shortfall is reported, not fatal.
    set.freeze(1, true);
    let started = std::time::Instant::now();
    let outcome = queue.enqueue_raw("pvc-2", b"x").await.unwrap();
    set.freeze(1, false);
    assert!(outcome.added);
    assert_eq!(outcome.replicas, (1, 0));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );

    // Concurrent enqueues wait side by side, each on a connection of its own, and the
    // queue's other commands are not held behind their `WAIT`s.
    set.freeze(1, true);
    let started = std::time::Instant::now();
    let names: Vec<String> = (0..8).map(|i| format!("pvc-c{i}")).collect();
    let enqueues = futures::future::join_all(names.iter().map(|n| queue.enqueue_raw(n, b"x")));
    let check = async {
        tokio::time::sleep(Duration::from_millis(100)).await;
        let asked = std::time::Instant::now();
        queue.is_pending("pvc-1").await.unwrap();
        asked.elapsed()
    };
    let (outcomes, check) = tokio::join!(enqueues, check);
    let waited = started.elapsed();
    set.freeze(1, false);
    for outcome in outcomes {
        assert_eq!(outcome.unwrap().replicas, (1, 0));
    }
    assert!(
        waited < Duration::from_secs(2),
        "8 waits of 500 ms took {waited:?}"
    );
    assert!(
        check < Duration::from_millis(300),
        "a lookup waited {check:?}"
    );

    let alone = RedisServer::start(&dir.path().join("alone"), &dir.path().join("alone.log"))
        .await
        .unwrap();
    let queue = PvQueue::connect(alone.url(), "example.com/hostpath")
        .await
        .unwrap();
    let outcome = queue.enqueue_raw("pvc-1", b"x").await.unwrap();
    assert_eq!(outcome.replicas, (0, 0), "no replica, no WAIT");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_enqueues_after_a_failover_land_on_the_new_primary() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = RedisSentinels::start(dir.path()).await.unwrap();
    let queue = PvQueue::connect(set.url(), "example.com/hostpath")
        .await
        .unwrap();
    let enqueue_all = |prefix: &'static str| {
        let queue = &queue;
        futures::future::join_all((0..8).map(move |i| async move {
            let name = format!("{prefix}-{i}");
            (queue.enqueue_raw(&name, b"x").await, name)
        }))
    };
    // Idle connections to the first primary, one per concurrent enqueue.
    for (outcome, name) in enqueue_all("pvc-before").await {
        outcome.unwrap_or_else(|e| panic!("{name}: {e}"));
    }
    let second = set.kill_primary_and_fail_over().await.unwrap();
    // Every idle connection is dead; each enqueue waits for the one lookup and runs again.
    for (outcome, name) in enqueue_all("pvc-after").await {
        outcome.unwrap_or_else(|e| panic!("{name} failed after the failover: {e}"));
        assert!(queue.is_pending(&name).await.unwrap(), "{name} is queued");
    }
    let primary = queue.connection().primary_addr();
    assert_eq!(primary, Some(format!("127.0.0.1:{second}")));
}

/// An old primary cut off from its replicas refuses an enqueue (`NOREPLICAS`, from the
/// deployed `min-replicas-to-write 1`) instead of keeping a write the failover would
/// discard, and the refusal moves the queue's connection to the primary Sentinels name.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_old_primary_without_replicas_refuses_an_enqueue_and_the_queue_moves_on() {
    let dir = tempfile::tempdir().unwrap();
    let set = RedisSentinels::start_as_deployed(dir.path()).await.unwrap();
    let queue = PvQueue::connect(set.url(), "example.com/hostpath")
        .await
        .unwrap();
    let enqueue = |name: &'static str| {
        let queue = &queue;
        move || async move { queue.enqueue_raw(name, b"x").await.ok() }
    };
    // Writes pass once the primary counts its replicas (within a second or two of start).
    let first = wait_for(Duration::from_secs(20), "a first enqueue", enqueue("pvc-0")).await;
    first.unwrap();

    let old = set.fail_over_by_hand().await.unwrap();
    let new = set.wait_failover(old).await.unwrap();
    let window = info(old, "replication").await.unwrap_or_default();
    assert!(
        window.contains("role:master"),
        "the old primary still runs as one"
    );
    let answer = queue.enqueue_raw("pvc-1", b"x").await;
    let on_old = PvQueue::connect(format!("redis://127.0.0.1:{old}/0"), "example.com/hostpath");
    let kept = on_old.await.unwrap().is_pending("pvc-1").await.unwrap();
    assert!(
        !kept,
        "the old primary kept the enqueue (answered {answer:?})"
    );
    let moved = queue.connection().primary_addr();
    assert_eq!(moved, Some(format!("127.0.0.1:{new}")), "after {answer:?}");

    // The new primary takes it (once its other replica follows it).
    let landed = wait_for(Duration::from_secs(20), "an enqueue", enqueue("pvc-1")).await;
    landed.unwrap();
    let on_new = PvQueue::connect(format!("redis://127.0.0.1:{new}/0"), "example.com/hostpath");
    assert!(on_new.await.unwrap().is_pending("pvc-1").await.unwrap());
}

/// A move to another primary that first refuses writes (as the deployed guard does while
/// its replicas catch up) is still reported by the data marker, at its first look that
/// succeeds: provision-svc then reconciles every claim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_data_marker_reports_a_failover_after_the_new_primary_refused_its_first_writes() {
    let dir = tempfile::tempdir().unwrap();
    let mut set = RedisSentinels::start(dir.path()).await.unwrap();
    let conn = redis_store::connect(set.url()).await.unwrap();
    let mut marker = DataMarker::new(conn.clone(), "example.com/hostpath");
    assert!(!marker.lost().await.unwrap(), "the first look");
    let acked: i64 = redis::cmd("WAIT")
        .arg(1)
        .arg(2000)
        .query_async(&mut conn.clone())
        .await
        .unwrap();
    assert_eq!(acked, 1, "the marker is on the replica");

    let new = set.kill_primary_and_fail_over().await.unwrap();
    let client = redis::Client::open(format!("redis://127.0.0.1:{new}/0")).unwrap();
    let mut direct = client.get_multiplexed_async_connection().await.unwrap();
    let guard = |n: i64| {
        let mut config = redis::cmd("CONFIG");
        config.arg("SET").arg("min-replicas-to-write").arg(n);
        config
    };
    let _: () = guard(1).query_async(&mut direct).await.unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        match marker.lost().await {
            Err(err) if err.code() == Some("NOREPLICAS") => break,
            Ok(lost) => panic!("a write passed on a primary that refuses them ({lost})"),
            Err(err) => assert!(std::time::Instant::now() < deadline, "never moved: {err}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let _: () = guard(0).query_async(&mut direct).await.unwrap();
    let key = format!(
        "{}data-marker",
        redis_store::key_prefix("example.com/hostpath")
    );
    let kept: Option<String> = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut direct)
        .await
        .unwrap();
    assert!(
        kept.is_some(),
        "the marker itself survived: only the move can be reported"
    );
    assert!(
        marker.lost().await.unwrap(),
        "the move is reported once a look succeeds"
    );
}
