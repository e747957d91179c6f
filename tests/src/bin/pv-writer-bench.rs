//! Benchmark (not a test): the drain rate of the real `pv-writer` binary for
//! 2,000 queued PVs against the in-process API-server simulator and a private
//! `redis-server`, with default flags and with client-side limits off.
//!
//! `cargo run --release -p e2e --bin pv-writer-bench`

use std::time::{Duration, Instant};

use common::handoff::queue::PvQueue;
use e2e::harness::pv_writer::{
    enqueue_all, pv_writer_binary, queue_key, spawn_writer, PROVISIONER,
};
use e2e::harness::redis::RedisServer;
use e2e::harness::wait::wait_until;
use e2e::sim::{SimConfig, Simulator};

#[tokio::main]
async fn main() {
    run().await;
}

async fn run() {
    let bin = pv_writer_binary();
    let dir = tempfile::tempdir().unwrap();
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let kubeconfig = dir.path().join("kubeconfig");
    sim.write_kubeconfig(&kubeconfig).unwrap();
    let redis = RedisServer::start(&dir.path().join("redis"), &dir.path().join("redis.log"))
        .await
        .unwrap();
    let queue = PvQueue::connect(&redis.url(), PROVISIONER).await.unwrap();
    for (run, (label, extra)) in [
        (
            "default flags (--kube-api-qps 1000 --kube-api-burst 2000, --worker-threads 16)",
            vec![],
        ),
        (
            "--kube-api-qps 0 --worker-threads 32",
            vec!["--kube-api-qps", "0", "--worker-threads", "32"],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("b{run}-");
        enqueue_all(
            &sim.client().unwrap(),
            &queue,
            &queue_key(dir.path()),
            &prefix,
            2000,
        )
        .await;
        let before = sim.count("persistentvolumes");
        let started = Instant::now();
        let mut p = spawn_writer(
            &bin,
            dir.path(),
            &kubeconfig,
            &redis.url(),
            &extra,
            run as u32,
        );
        let q = queue.clone();
        wait_until(Duration::from_secs(50), "2000 entries drained", || {
            let q = q.clone();
            async move { q.stats().await.map(|s| s.depth == 0).unwrap_or(false) }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", p.log_text()));
        let took = started.elapsed();
        p.terminate(Duration::from_secs(10));
        assert_eq!(
            sim.count("persistentvolumes") - before,
            2000,
            "every entry written once"
        );
        println!(
            "pv-writer drain rate, {label}: 2000 PVs in {:.2}s = {:.0} PVs/s (incl. process start)",
            took.as_secs_f64(),
            2000.0 / took.as_secs_f64()
        );
    }
}
