//! The real `pv-writer` binary against the API-server simulator and a private
//! `redis-server`: SIGKILL mid-drain loses nothing and writes nothing twice, and
//! a benchmark prints the drain rate.
//!
//! Only `pv-writer` is built here (`cargo build -p pv-writer`), so these tests
//! do not depend on the other services compiling.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use api_types::queue::{ClaimKey, QueuedPvWrite, SCHEMA_VERSION};
use common::queue::{now_ms, PvQueue};
use e2e::harness::binaries::{target_dir, workspace_root};
use e2e::harness::process::ManagedProcess;
use e2e::harness::redis::RedisServer;
use e2e::harness::wait::wait_until;
use e2e::sim::{SimConfig, Simulator};
use serde_json::json;

const PROVISIONER: &str = "example.com/hostpath";

fn pv_writer_binary() -> PathBuf {
    let profile = if cfg!(debug_assertions) {
        "debug"
    } else {
        "release"
    };
    let mut cmd =
        std::process::Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(workspace_root())
        .args(["build", "--quiet", "-p", "pv-writer"]);
    if profile == "release" {
        cmd.arg("--release");
    }
    assert!(
        cmd.status().expect("cargo runs").success(),
        "building pv-writer"
    );
    target_dir().join(profile).join("pv-writer")
}

fn entry(uid: &str) -> QueuedPvWrite {
    let name = format!("pvc-{uid}");
    QueuedPvWrite {
        version: SCHEMA_VERSION,
        pv: serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                "volumeMode": "Filesystem", "hostPath": {"path": format!("/tmp/{name}")},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "default", "name": format!("claim-{uid}"), "uid": uid},
            }
        }))
        .unwrap(),
        claim: ClaimKey { namespace: "default".into(), name: format!("claim-{uid}"), uid: uid.into() },
        class: "fast".into(),
        enqueued_at_ms: now_ms(),
    }
}

fn spawn_writer(
    bin: &Path,
    dir: &Path,
    kubeconfig: &Path,
    redis_url: &str,
    extra: &[&str],
    run: u32,
) -> ManagedProcess {
    let mut args: Vec<String> = [
        "--kubeconfig",
        kubeconfig.to_str().unwrap(),
        "--redis-url",
        redis_url,
        "--provisioner-name",
        PROVISIONER,
        "--leader-election=false",
        "--http-port",
        "0",
        "--retry-initial",
        "200ms",
        "--retry-max",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(extra.iter().map(|s| s.to_string()));
    ManagedProcess::spawn(
        "pv-writer",
        bin,
        &args,
        &[],
        &dir.join(format!("pv-writer-{run}.log")),
    )
    .unwrap()
}

async fn enqueue_all(queue: &PvQueue, prefix: &str, n: usize) {
    for i in 0..n {
        queue
            .enqueue(&entry(&format!("{prefix}{i}")))
            .await
            .unwrap();
    }
}

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
    enqueue_all(&queue, "k", 500).await;
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

#[tokio::test]
async fn benchmark_drain_rate_of_2000_entries() {
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
        ("default flags (--kube-api-qps 200, --workers 16)", vec![]),
        (
            "--kube-api-qps 0 --workers 32",
            vec!["--kube-api-qps", "0", "--workers", "32"],
        ),
    ]
    .into_iter()
    .enumerate()
    {
        let prefix = format!("b{run}-");
        enqueue_all(&queue, &prefix, 2000).await;
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
        assert_eq!(sim.count("persistentvolumes") - before, 2000);
        println!(
            "pv-writer drain rate, {label}: 2000 PVs in {:.2}s = {:.0} PVs/s (incl. process start)",
            took.as_secs_f64(),
            2000.0 / took.as_secs_f64()
        );
    }
}
