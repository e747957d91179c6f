//! The real `pv-writer` binary against the API-server simulator and a private
//! `redis-server`: SIGKILL mid-drain loses nothing and writes nothing twice.
//! (The drain-rate benchmark is a program: `cargo run --release -p e2e --bin pv-writer-bench`.)

use std::time::Duration;

use common::queue::PvQueue;
use e2e::harness::pv_writer::{
    enqueue_all, pv_writer_binary, queue_key, spawn_writer, PROVISIONER,
};
use e2e::harness::redis::RedisServer;
use e2e::harness::wait::wait_until;
use e2e::sim::{SimConfig, Simulator};

#[tokio::test]
async fn sigkill_mid_drain_writes_every_pv_exactly_once() {
    let bin = pv_writer_binary();
    let dir = tempfile::tempdir().unwrap();
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let redis = RedisServer::start(&dir.path().join("redis"), &dir.path().join("redis.log"))
        .await
        .unwrap();
    let queue = PvQueue::connect(&redis.url(), PROVISIONER).await.unwrap();
    enqueue_all(&queue, &queue_key(dir.path()), "k", 500).await;
    // Slow writes so the kills land mid-drain with writes in flight.
    sim.set_latency(Duration::from_millis(15));

    let mut run = 0;
    for kill_at in [100usize, 300] {
        let mut p = spawn_writer(
            &bin,
            dir.path(),
            &kubeconfig,
            &redis.url(),
            &["--kube-api-qps", "0"],
            run,
        );
        run += 1;
        wait_until(
            Duration::from_secs(30),
            &format!("{kill_at} PVs written"),
            || {
                let n = sim.count("persistentvolumes");
                async move { n >= kill_at }
            },
        )
        .await
        .unwrap();
        p.kill();
        assert!(sim.count("persistentvolumes") < 500, "killed mid-drain");
    }
    let mut p = spawn_writer(
        &bin,
        dir.path(),
        &kubeconfig,
        &redis.url(),
        &["--kube-api-qps", "0"],
        run,
    );
    let q = queue.clone();
    wait_until(Duration::from_secs(40), "queue drained", || {
        let q = q.clone();
        async move { q.stats().await.map(|s| s.depth == 0).unwrap_or(false) }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", p.log_text()));
    p.terminate(Duration::from_secs(10));

    assert_eq!(sim.count("persistentvolumes"), 500);
    for i in 0..500 {
        let pv = sim
            .object("persistentvolumes", "", &format!("pvc-k{i}"))
            .unwrap();
        assert_eq!(pv["spec"]["claimRef"]["uid"], format!("k{i}"));
    }
    assert!(queue.list_dead().await.unwrap().is_empty());
    // Only the writes in flight at each kill (at most --workers = 16) are sent again,
    // and the API server answered those AlreadyExists for the same claim.
    let creates = sim.stats().count("create", "persistentvolumes");
    assert!(
        (500..=500 + 2 * 16).contains(&creates),
        "{creates} PV creates"
    );
    println!("PV create requests for 500 PVs across two SIGKILLs: {creates}");
}
