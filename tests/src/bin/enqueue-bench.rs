//! Benchmark (not a test): the cost of provision-svc's replicated acknowledgement.
//! Enqueues 2,000 entries (or the count given) through the Sentinels of a loopback primary
//! and replica, with `WAIT` for 0 and for 1 replica, 8 at a time as provision-svc's workers
//! do; prints the `redis-server` on `PATH`, enqueues per second and the p50/p99 latency of one.
//!
//! `cargo run --release -p e2e --bin enqueue-bench [ENTRIES]`

use std::time::{Duration, Instant};

use common::handoff::queue::{PvQueue, ReplicaAcks};
use e2e::harness::RedisSentinels;
use futures::StreamExt;

const CONCURRENCY: usize = 8;

#[tokio::main]
async fn main() {
    let entries: usize = std::env::args().nth(1).map_or(2000, |n| n.parse().unwrap());
    let version = std::process::Command::new("redis-server")
        .arg("--version")
        .output();
    let version = String::from_utf8_lossy(&version.unwrap().stdout).into_owned();
    println!(
        "{}",
        version.split(' ').take(3).collect::<Vec<_>>().join(" ")
    );
    let dir = tempfile::tempdir().unwrap();
    let set = RedisSentinels::start(dir.path()).await.unwrap();
    println!("{entries} enqueues, {CONCURRENCY} at a time, primary + 1 replica on loopback");
    for (run, acks) in [ReplicaAcks::Count(0), ReplicaAcks::Count(1)]
        .into_iter()
        .enumerate()
    {
        let queue = PvQueue::connect(set.url(), "bench.example.com/p")
            .await
            .unwrap()
            .with_replica_acks(acks, Duration::from_secs(1));
        let started = Instant::now();
        let mut latencies: Vec<Duration> = futures::stream::iter(0..entries)
            .map(|i| {
                let queue = queue.clone();
                async move {
                    let t = Instant::now();
                    queue
                        .enqueue_raw(&format!("pvc-{run}-{i}"), &[b'x'; 600])
                        .await
                        .unwrap();
                    t.elapsed()
                }
            })
            .buffer_unordered(CONCURRENCY)
            .collect()
            .await;
        let total = started.elapsed();
        latencies.sort();
        let pct =
            |p: f64| latencies[((latencies.len() as f64 * p) as usize).min(latencies.len() - 1)];
        println!(
            "{acks:?}: {:.0} enqueues/s, p50 {:.2} ms, p99 {:.2} ms",
            entries as f64 / total.as_secs_f64(),
            pct(0.50).as_secs_f64() * 1e3,
            pct(0.99).as_secs_f64() * 1e3,
        );
    }
}
