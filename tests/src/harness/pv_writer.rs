//! Driving the real `pv-writer` binary on its own (without the other
//! services): building it, queue entries for it, and starting it against a
//! simulator kubeconfig and a Redis URL. Used by the pv-writer process tests
//! and the drain-rate benchmark.

use std::path::{Path, PathBuf};

use api_types::queue::{ClaimKey, QueuedPvWrite, SCHEMA_VERSION};
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::kube::time::now_ms;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use serde_json::json;

use super::binaries::{target_dir, workspace_root};
use super::process::ManagedProcess;
use super::services::write_queue_key;

/// Provisioner name the entries and the writer use.
pub const PROVISIONER: &str = "example.com/hostpath";

/// The hostpath base directory the entries' PVs point into: pv-writer's default
/// `--base-dir` (the writer only checks the path, nothing is created).
pub const BASE_DIR: &str = "/var/lib/hostpath-provisioner";

/// The queue key of the pv-writer runs in `dir`: `<dir>/queue-hmac-key`,
/// written with a fresh random key on first use ([`write_queue_key`]).
pub fn queue_key(dir: &Path) -> QueueKey {
    let path = dir.join("queue-hmac-key");
    if !path.exists() {
        write_queue_key(dir);
    }
    QueueKey::load(&path).expect("queue key")
}

/// [`entry`] signed with `key`, as provision-svc enqueues it.
pub fn signed_entry(uid: &str, key: &QueueKey) -> QueuedPvWrite {
    let mut e = entry(uid);
    key.sign(PROVISIONER, &mut e);
    e
}

/// Build `pv-writer` in the current profile (debug under `cargo test`,
/// release under `--release`) and return its path. Panics when cargo fails.
pub fn pv_writer_binary() -> PathBuf {
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

/// An unsigned queue entry for claim uid `uid`: PV `pvc-<uid>` bound to
/// `default/claim-<uid>`, `hostPath` `<BASE_DIR>/pvc-<uid>`.
pub fn entry(uid: &str) -> QueuedPvWrite {
    entry_for_claim(&format!("claim-{uid}"), uid)
}

/// An unsigned queue entry for the claim `default/<claim>` of uid `uid`: PV
/// `pvc-<uid>`, `hostPath` `<BASE_DIR>/pvc-<uid>`.
pub fn entry_for_claim(claim: &str, uid: &str) -> QueuedPvWrite {
    let name = format!("pvc-{uid}");
    QueuedPvWrite {
        version: SCHEMA_VERSION,
        pv: serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": PROVISIONER}},
            "spec": {
                "capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "fast",
                "volumeMode": "Filesystem", "hostPath": {"path": format!("{BASE_DIR}/{name}"), "type": "DirectoryOrCreate"},
                "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "default", "name": claim, "uid": uid},
            }
        }))
        .unwrap(),
        claim: ClaimKey { namespace: "default".into(), name: claim.into(), uid: uid.into() },
        class: "fast".into(),
        enqueued_at_ms: now_ms(),
        first_attempt_at_ms: None,
        mac: None,
    }
}

/// Start `pv-writer` (no leader election, free HTTP port, retries 200 ms..2 s,
/// the queue key of `dir` ([`queue_key`])) with `extra` flags; its log goes to
/// `<dir>/pv-writer-<run>.log`.
pub fn spawn_writer(
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
        "--retry-interval-start",
        "200ms",
        "--retry-interval-max",
        "2s",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    queue_key(dir);
    args.extend([
        "--queue-hmac-key-file".to_string(),
        dir.join("queue-hmac-key").display().to_string(),
    ]);
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

/// Create the claim `default/<name>` (class `fast`, 1Gi, never bound by a
/// provisioner) through `client` and return its uid: pv-writer writes a PV
/// only for a claim that exists with the entry's uid.
pub async fn create_claim(client: &kube::Client, name: &str) -> String {
    let api: kube::Api<PersistentVolumeClaim> = kube::Api::namespaced(client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
                 "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    let created = api
        .create(&kube::api::PostParams::default(), &claim)
        .await
        .unwrap_or_else(|e| panic!("creating claim {name}: {e}"));
    created.metadata.uid.expect("the API server sets a uid")
}

/// Create `n` claims `default/<prefix>0..<prefix>n-1` through `client` and
/// enqueue an entry for each, signed with `key`; returns their uids.
pub async fn enqueue_all(
    client: &kube::Client,
    queue: &PvQueue,
    key: &QueueKey,
    prefix: &str,
    n: usize,
) -> Vec<String> {
    let mut uids = Vec::with_capacity(n);
    for i in 0..n {
        let name = format!("{prefix}{i}");
        let uid = create_claim(client, &name).await;
        let mut e = entry_for_claim(&name, &uid);
        key.sign(PROVISIONER, &mut e);
        queue.enqueue(&e).await.unwrap();
        uids.push(uid);
    }
    uids
}
