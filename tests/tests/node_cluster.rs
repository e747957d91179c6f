//! The deploy on a real node: `kubectl apply -k deploy/overlays/node-test` on a v1.37.2
//! control plane with one real node (e2e::realkube::node), images built offline by
//! `tools/node/images.sh`. Scenarios run in order on one cluster:
//! 1. every pod Ready with no restarts, each service holding its Lease;
//! 2. a Pod writes a file to a claim, a second Pod reads it back, deleting the claim
//!    removes the directory on the node.
//!
//! Opt-in with `E2E_NODE=1` (root, tools/node/build.sh and images.sh); otherwise, or when
//! the machine lacks what the node needs, it is skipped with one line saying why.
//! `E2E_NODE_HOLD=1` keeps the cluster up afterwards and prints its kubeconfig.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::realkube::node::{apiserver_flags, node_or_skip, RealNode};
use e2e::realkube::{assets_or_skip, KubeVersion, RealCluster, RealClusterOptions};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

const NAMESPACES: [&str; 2] = ["split-provisioner", "split-provisioner-volumes"];
const SERVICES: [&str; 3] = ["provision-svc", "pv-writer", "reclaim-svc"];
const WORKLOAD_IMAGE: &str = "docker.io/library/redis:node-test";
/// Where the overlay's hostpath backend makes volume directories on the node.
const BASE_DIR: &str = "/var/lib/hostpath-provisioner";

fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `kubectl ARGS` as admin; panics with its output when it fails.
fn kubectl(cluster: &RealCluster, args: &[&str]) -> String {
    let out = Command::new("kubectl")
        .args(args)
        .env("KUBECONFIG", cluster.admin_kubeconfig())
        .current_dir(repo_root())
        .output()
        .expect("running kubectl");
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "kubectl {args:?} failed: {text}");
    text
}

/// Poll `check` every 500 ms until it returns `Some`, or panic with `what` and the last state.
async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    let start = Instant::now();
    loop {
        match check().await {
            Ok(v) => return v,
            Err(state) if start.elapsed() > timeout => {
                panic!("{what}: not done after {timeout:?}; last state: {state}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
}

fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .map(|cs| cs.iter().map(|c| c.restart_count).sum())
        .unwrap_or(0)
}

/// Scenario 1: apply the overlay; every pod Ready, no restarts, each service leads.
async fn apply_and_everything_ready(cluster: &RealCluster) {
    let out = kubectl(cluster, &["apply", "-k", "deploy/overlays/node-test"]);
    eprintln!("node scenario 1: {} objects applied", out.lines().count());
    let client = cluster.client();
    let start = Instant::now();
    wait_for("every pod Ready", Duration::from_secs(300), || {
        let client = client.clone();
        async move {
            let mut state = Vec::new();
            let mut all = true;
            for ns in NAMESPACES {
                let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
                let list = pods
                    .list(&ListParams::default())
                    .await
                    .map_err(|e| e.to_string())?;
                for p in &list.items {
                    let phase = p.status.as_ref().and_then(|s| s.phase.clone());
                    state.push(format!(
                        "{}/{} {phase:?} ready={}",
                        ns,
                        p.metadata.name.as_deref().unwrap_or("?"),
                        pod_ready(p)
                    ));
                    all &= pod_ready(p);
                }
            }
            // The dev overlay runs one replica of each: redis and the three services.
            if all && state.len() == 4 {
                Ok(())
            } else {
                Err(state.join(", "))
            }
        }
    })
    .await;
    eprintln!(
        "node scenario 1: all pods Ready {:.0} s after apply",
        start.elapsed().as_secs_f64()
    );
    let mut pod_names = Vec::new();
    for ns in NAMESPACES {
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        for p in pods.list(&ListParams::default()).await.unwrap().items {
            assert_eq!(restarts(&p), 0, "no restarts: {:?}", p.status);
            pod_names.push(p.metadata.name.clone().unwrap());
        }
    }
    let holders = wait_for(
        "each service holds its Lease",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            let pod_names = pod_names.clone();
            async move {
                let mut holders = Vec::new();
                for ns in NAMESPACES {
                    let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
                    let list = leases
                        .list(&ListParams::default())
                        .await
                        .map_err(|e| e.to_string())?;
                    for l in list.items {
                        if let Some(h) = l.spec.and_then(|s| s.holder_identity) {
                            holders.push(h);
                        }
                    }
                }
                let led = SERVICES.iter().all(|s| {
                    holders.iter().any(|h| {
                        h.starts_with(&format!("{s}-"))
                            && pod_names.iter().any(|p| h.contains(p.as_str()))
                    })
                });
                if led {
                    Ok(holders)
                } else {
                    Err(format!("holders {holders:?}, pods {pod_names:?}"))
                }
            }
        },
    )
    .await;
    eprintln!("node scenario 1: Lease holders {holders:?}");
}

fn workload_pod(name: &str, claim: &str, script: &str) -> Pod {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": WORKLOAD_IMAGE, "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                            "volumeMounts": [{"name": "v", "mountPath": "/data"}]}],
            "volumes": [{"name": "v", "persistentVolumeClaim": {"claimName": claim}}]
        }
    }))
    .unwrap()
}

/// Run a Pod to completion; panics unless it Succeeded.
async fn run_to_success(pods: &Api<Pod>, pod: Pod) {
    let name = pod.metadata.name.clone().unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    wait_for(
        &format!("pod {name} Succeeded"),
        Duration::from_secs(120),
        || async {
            let p = pods.get(&name).await.map_err(|e| e.to_string())?;
            match p.status.as_ref().and_then(|s| s.phase.as_deref()) {
                Some("Succeeded") => Ok(()),
                Some("Failed") => panic!("pod {name} failed: {:?}", p.status),
                _ => Err(format!("{:?}", p.status)),
            }
        },
    )
    .await;
    pods.delete(&name, &DeleteParams::default()).await.unwrap();
    wait_for(
        &format!("pod {name} gone"),
        Duration::from_secs(60),
        || async {
            match pods.get_opt(&name).await {
                Ok(None) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        },
    )
    .await;
}

/// Scenario 2: write, delete the pod, read back in a second pod; the claim's delete
/// removes the directory on the node.
async fn claim_survives_pods_and_goes_with_claim(cluster: &RealCluster) {
    let client = cluster.client();
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "node-data"},
        "spec": {"storageClassName": "example-hostpath", "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
    let pv_name = wait_for("claim Bound", Duration::from_secs(60), || async {
        let c = claims.get("node-data").await.map_err(|e| e.to_string())?;
        match (
            c.status.as_ref().and_then(|s| s.phase.as_deref()),
            c.spec.as_ref().and_then(|s| s.volume_name.clone()),
        ) {
            (Some("Bound"), Some(pv)) => Ok(pv),
            other => Err(format!("{other:?}")),
        }
    })
    .await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let pv = pvs.get(&pv_name).await.unwrap();
    let dir = PathBuf::from(
        pv.spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| h.path.clone())
            .expect("a hostPath PV"),
    );
    assert!(
        dir.starts_with(BASE_DIR),
        "{} under {BASE_DIR}",
        dir.display()
    );
    assert!(dir.is_dir(), "{} exists on the node", dir.display());

    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    run_to_success(
        &pods,
        workload_pod("writer", "node-data", "echo written-by-writer > /data/file"),
    )
    .await;
    assert_eq!(
        std::fs::read_to_string(dir.join("file")).unwrap(),
        "written-by-writer\n",
        "the file is in the PV's directory on the node"
    );
    run_to_success(
        &pods,
        workload_pod(
            "reader",
            "node-data",
            "grep -qx written-by-writer /data/file",
        ),
    )
    .await;

    claims
        .delete("node-data", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "PV and directory gone",
        Duration::from_secs(120),
        || async {
            let pv = pvs.get_opt(&pv_name).await.map_err(|e| e.to_string())?;
            if pv.is_none() && !dir.exists() {
                Ok(())
            } else {
                Err(format!(
                    "pv present: {}, dir present: {}",
                    pv.is_some(),
                    dir.exists()
                ))
            }
        },
    )
    .await;
    eprintln!("node scenario 2: data kept across pods, directory removed with the claim");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_scenarios() {
    if std::env::var("E2E_NODE").as_deref() != Ok("1") {
        eprintln!("node: SKIPPED node_scenarios (set E2E_NODE=1 to run them on a real node)");
        return;
    }
    let Some(assets) = assets_or_skip(KubeVersion::V1_37, "node_scenarios") else {
        return;
    };
    let Some(node_assets) = node_or_skip("node_scenarios") else {
        return;
    };
    let opts = RealClusterOptions {
        apiserver_extra_flags: apiserver_flags(),
        keep_dir: std::env::var("E2E_NODE_KEEP").is_ok(),
        ..Default::default()
    };
    let before = base_dir_entries();
    let cluster = RealCluster::start(&assets, opts).await.unwrap();
    let node = RealNode::start(&cluster, &node_assets).await.unwrap();
    // The Redis StatefulSet's claim names no class: a class-less local PV serves it.
    node.add_local_pv(&cluster.client(), "node-redis-data", "1Gi")
        .await
        .unwrap();
    let start = Instant::now();
    apply_and_everything_ready(&cluster).await;
    claim_survives_pods_and_goes_with_claim(&cluster).await;
    eprintln!(
        "node: scenarios 1-2 passed in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    if std::env::var("E2E_NODE_HOLD").as_deref() == Ok("1") {
        eprintln!(
            "node: cluster kept up; export KUBECONFIG={} (Ctrl-C stops it; the next run cleans up)",
            cluster.admin_kubeconfig().display()
        );
        std::future::pending::<()>().await;
    }
    drop(node);
    // Volumes the run made in the node's base dir (the example claim's) go with the cluster.
    for entry in base_dir_entries().difference(&before) {
        let _ = std::fs::remove_dir_all(std::path::Path::new(BASE_DIR).join(entry));
    }
}

fn base_dir_entries() -> std::collections::HashSet<std::ffi::OsString> {
    std::fs::read_dir(BASE_DIR)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}
