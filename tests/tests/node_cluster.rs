//! The deploy on a real node: `kubectl apply -k deploy/overlays/node-test` on a v1.37.2
//! control plane with one real node (e2e::realkube::node), images built offline by
//! `tools/node/images.sh`. Scenarios run in order on one cluster:
//! 1. every pod Ready with no restarts, each service holding its Lease;
//! 2. a Pod writes a file to a claim, a second Pod reads it back, deleting the claim
//!    removes the directory on the node;
//! 6. provision-svc scaled to 3, pv-writer (and reclaim-svc) to 2: one leader each, one
//!    PV and one ProvisioningSucceeded event per claim of a burst;
//! 5. each leader pod deleted: a standby holds the Lease within the Lease's duration;
//! 3. 100 claims and 100 pods at once: all Running; deleted: no directory, no PV left;
//! 4. the Redis pod deleted in a 200-claim burst: every claim Bound, a directory each;
//! 7. Prometheus (Debian's) scrapes the services as the ServiceMonitor describes; promtool
//!    checks and unit-tests the PrometheusRule; SplitProvisionerRedisUnreachable fires with
//!    Redis scaled to 0 and resolves after;
//! 8. `deploy/components/redis-sentinel` applied over the install (three Redis pods, a
//!    Sentinel each); the primary hung (SIGSTOP) in a 100-claim burst until the Sentinels
//!    fail over: every claim Bound once, a directory each, provision-svc saw the failover.
//!
//! 9. class parameters on the node: `directoryMode` is the directory's mode, `quota:
//!    best-effort` provisions (the node's kernel has no project quotas), `quota: required`
//!    fails with a Warning naming the cause, an expanded claim's PV and status grow and a Pod
//!    mounts it after.
//!
//! Opt-in with `E2E_NODE=1` (root, tools/node/build.sh and images.sh); otherwise, or when
//! the machine lacks what the node needs, it is skipped with one line saying why.
//! `E2E_NODE_HOLD=1` keeps the cluster up afterwards and prints its kubeconfig;
//! `E2E_NODE_SCENARIOS=2,7` runs only those (after scenario 1).

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use e2e::harness::process::last_lines;
use e2e::realkube::node::{apiserver_flags, node_or_skip, pod_logs, RealNode};
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
    let mut cmd = Command::new("kubectl");
    cmd.env("KUBECONFIG", cluster.admin_kubeconfig())
        .current_dir(repo_root());
    run_tool(cmd, args)
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

/// Whether scenario `n` runs: all by default, else those listed in `E2E_NODE_SCENARIOS`
/// (e.g. `2,7`; scenario 1, the deploy, always runs).
fn scenario_on(n: u32) -> bool {
    match std::env::var("E2E_NODE_SCENARIOS") {
        Ok(list) => list.split(',').any(|s| s.trim() == n.to_string()),
        Err(_) => true,
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
    let pv_name = bound_pv(&claims, "node-data").await;
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
    pv_and_directory_gone(&pvs, &pv_name, &dir).await;
    eprintln!("node scenario 2: data kept across pods, directory removed with the claim");
}

/// Wait until claim `name` is Bound; its PV's name.
async fn bound_pv(claims: &Api<PersistentVolumeClaim>, name: &str) -> String {
    wait_for("claim Bound", Duration::from_secs(60), || async {
        let c = claims.get(name).await.map_err(|e| e.to_string())?;
        let phase = c.status.as_ref().and_then(|s| s.phase.as_deref());
        match (phase, c.spec.as_ref().and_then(|s| s.volume_name.clone())) {
            (Some("Bound"), Some(pv)) => Ok(pv),
            other => Err(format!("{other:?}")),
        }
    })
    .await
}

/// Wait until PV `pv_name` and its directory `dir` on the node are gone.
async fn pv_and_directory_gone(pvs: &Api<PersistentVolume>, pv_name: &str, dir: &std::path::Path) {
    wait_for(
        "PV and directory gone",
        Duration::from_secs(120),
        || async {
            let pv = pvs.get_opt(pv_name).await.map_err(|e| e.to_string())?;
            match (pv.is_some(), dir.exists()) {
                (false, false) => Ok(()),
                (pv, dir) => Err(format!("pv present: {pv}, dir present: {dir}")),
            }
        },
    )
    .await
}

/// Create claim `name` (1Gi) of `class` in `default`.
async fn create_claim(claims: &Api<PersistentVolumeClaim>, name: &str, class: &str) {
    let claim = json!({
        "metadata": {"name": name},
        "spec": {"storageClassName": class, "accessModes": ["ReadWriteOnce"],
                 "resources": {"requests": {"storage": "1Gi"}}}
    });
    let claim: PersistentVolumeClaim = serde_json::from_value(claim).unwrap();
    claims.create(&PostParams::default(), &claim).await.unwrap();
}

/// The notes of the events of reason `reason` about claim `name` in `default`, each once per
/// time it was published (an Event's `count` or `series.count`).
async fn claim_event_notes(client: &kube::Client, name: &str, reason: &str) -> Vec<String> {
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let selector = format!("involvedObject.name={name},reason={reason}");
    let list = events.list(&ListParams::default().fields(&selector)).await;
    let each = |e: k8s_openapi::api::core::v1::Event| {
        let series = e.series.as_ref().and_then(|s| s.count).unwrap_or(1);
        let times = e.count.unwrap_or(1).max(series).max(1) as usize;
        std::iter::repeat_n(e.message.unwrap_or_default(), times)
    };
    list.map(|l| l.items.into_iter().flat_map(each).collect())
        .unwrap_or_default()
}

/// Wait (60 s) for the first event of reason `reason` about claim `name`; its note.
async fn first_event_note(client: &kube::Client, name: &str, reason: &str) -> String {
    wait_for(reason, Duration::from_secs(60), || async {
        let notes = claim_event_notes(client, name, reason).await;
        notes
            .into_iter()
            .next()
            .ok_or_else(|| "no event yet".to_string())
    })
    .await
}

/// Scenario 9: a class with `directoryMode`, `quota: best-effort` and expansion, and one with
/// `quota: required`, on the node.
async fn class_parameters_on_the_node(cluster: &RealCluster) {
    use k8s_openapi::api::storage::v1::StorageClass;
    use kube::api::{Patch, PatchParams};
    let client = cluster.client();
    let classes: Api<StorageClass> = Api::all(client.clone());
    let provisioner = classes.get("example-hostpath").await.unwrap().provisioner;
    for (name, params) in [
        (
            "node-sized",
            json!({"directoryMode": "0750", "quota": "best-effort"}),
        ),
        ("node-quota-required", json!({"quota": "required"})),
    ] {
        let class = json!({
            "metadata": {"name": name}, "provisioner": provisioner, "parameters": params,
            "reclaimPolicy": "Delete", "allowVolumeExpansion": true
        });
        let class: StorageClass = serde_json::from_value(class).unwrap();
        classes
            .create(&PostParams::default(), &class)
            .await
            .unwrap();
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    create_claim(&claims, "node-sized", "node-sized").await;
    create_claim(&claims, "node-unlimited", "node-quota-required").await;
    let pv_name = bound_pv(&claims, "node-sized").await;
    let dir = PathBuf::from(BASE_DIR).join(&pv_name);
    let mode = std::os::unix::fs::PermissionsExt::mode(&dir.metadata().unwrap().permissions());
    assert_eq!(mode & 0o7777, 0o750, "directoryMode on {}", dir.display());

    let failed = first_event_note(&client, "node-unlimited", "ProvisioningFailed").await;
    assert!(
        failed.contains("project quota") && failed.contains("quota=required"),
        "{failed}"
    );
    let unlimited = claims.get("node-unlimited").await.unwrap();
    assert_eq!(
        unlimited.status.and_then(|s| s.phase).as_deref(),
        Some("Pending")
    );

    let grow = json!({"spec": {"resources": {"requests": {"storage": "2Gi"}}}});
    claims
        .patch("node-sized", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    wait_for("claim and PV at 2Gi", Duration::from_secs(60), || async {
        let c = claims.get("node-sized").await.map_err(|e| e.to_string())?;
        let pv = pvs.get(&pv_name).await.map_err(|e| e.to_string())?;
        let status = c.status.unwrap_or_default();
        let claim_size = status.capacity.and_then(|c| c.get("storage").cloned());
        let pv_size = pv.spec.and_then(|s| s.capacity?.get("storage").cloned());
        let resizing = status
            .conditions
            .unwrap_or_default()
            .into_iter()
            .any(|c| c.type_ == "Resizing");
        match (claim_size, pv_size) {
            (Some(a), Some(b)) if a.0 == "2Gi" && b.0 == "2Gi" && !resizing => Ok(()),
            other => Err(format!("{other:?}, resizing {resizing}")),
        }
    })
    .await;
    // The event follows the status patch: wait for it, then make sure no second one follows.
    first_event_note(&client, "node-sized", "VolumeResizeSuccessful").await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let resized = claim_event_notes(&client, "node-sized", "VolumeResizeSuccessful").await;
    assert_eq!(resized.len(), 1, "{resized:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let script = "echo grown > /data/file && test \"$(stat -c %a /data)\" = 750";
    run_to_success(&pods, workload_pod("sized-writer", "node-sized", script)).await;
    assert_eq!(
        std::fs::read_to_string(dir.join("file")).unwrap(),
        "grown\n"
    );

    for claim in ["node-sized", "node-unlimited"] {
        claims
            .delete(claim, &DeleteParams::default())
            .await
            .unwrap();
    }
    pv_and_directory_gone(&pvs, &pv_name, &dir).await;
    for name in ["node-sized", "node-quota-required"] {
        classes
            .delete(name, &DeleteParams::default())
            .await
            .unwrap();
    }
    eprintln!("node scenario 9: directory mode, best-effort and required quota, expansion");
}

/// GET `http://ip:port/metrics` (HTTP/1.0) and sum the samples of `metric`.
async fn scrape_sum(ip: &str, port: u16, metric: &str) -> Result<f64, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect((ip, port)).await?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: pod\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(5), attempt)
        .await
        .map_err(|_| format!("{ip}:{port} timed out"))?
        .map_err(|e| format!("{ip}:{port}: {e}"))?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with(metric) && !l.starts_with('#'))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum())
}

/// (namespace, metrics port) of each service's Deployment.
fn service_home(service: &str) -> (&'static str, u16) {
    match service {
        "provision-svc" => ("split-provisioner-volumes", 9101),
        "pv-writer" => ("split-provisioner", 9102),
        _ => ("split-provisioner-volumes", 9103),
    }
}

/// Running, Ready pods of `service` (name, IP).
async fn service_pods(client: &kube::Client, service: &str) -> Vec<(String, String)> {
    let (ns, _) = service_home(service);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels(&format!("app.kubernetes.io/name={service}"));
    pods.list(&lp)
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|p| pod_ready(p) && p.metadata.deletion_timestamp.is_none())
        .filter_map(|p| {
            let ip = p.status.as_ref()?.pod_ip.clone()?;
            Some((p.metadata.name?, ip))
        })
        .collect()
}

/// The Lease of `service` (the one whose holder is one of its pods): (name, holder, duration s).
async fn lease_of(client: &kube::Client, service: &str) -> Option<(String, String, i32)> {
    for ns in NAMESPACES {
        let leases: Api<Lease> = Api::namespaced(client.clone(), ns);
        for l in leases.list(&ListParams::default()).await.ok()?.items {
            let spec = l.spec.clone().unwrap_or_default();
            if let Some(h) = spec
                .holder_identity
                .filter(|h| h.starts_with(&format!("{service}-")))
            {
                return Some((
                    l.metadata.name.clone()?,
                    h,
                    spec.lease_duration_seconds.unwrap_or(15),
                ));
            }
        }
    }
    None
}

/// Scale `service` to `replicas` and wait until that many pods are Ready and exactly one
/// of them reports `leader_election_master_status` 1 (the Lease holder).
async fn scale_and_one_leader(cluster: &RealCluster, service: &str, replicas: usize) {
    let (ns, port) = service_home(service);
    kubectl(
        cluster,
        &[
            "-n",
            ns,
            "scale",
            &format!("deployment/{service}"),
            &format!("--replicas={replicas}"),
        ],
    );
    let client = cluster.client();
    wait_for(
        &format!("{service}: {replicas} Ready, one leader"),
        Duration::from_secs(180),
        || {
            let client = client.clone();
            async move {
                let pods = service_pods(&client, service).await;
                if pods.len() != replicas {
                    return Err(format!("{} Ready pods", pods.len()));
                }
                let mut leaders = Vec::new();
                for (name, ip) in &pods {
                    if scrape_sum(ip, port, "leader_election_master_status").await? > 0.0 {
                        leaders.push(name.clone());
                    }
                }
                let holder = lease_of(&client, service).await.map(|l| l.1);
                match (leaders.as_slice(), &holder) {
                    ([one], Some(h)) if h.starts_with(one.as_str()) => Ok(()),
                    _ => Err(format!(
                        "leaders by metrics {leaders:?}, Lease holder {holder:?}"
                    )),
                }
            }
        },
    )
    .await;
}

/// Create `n` claims `<prefix>-<i>` of the example class in `default` at once.
async fn create_claims(client: &kube::Client, prefix: &str, n: usize) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let creates = (0..n).map(|i| {
        let claims = claims.clone();
        async move {
            let claim: PersistentVolumeClaim = serde_json::from_value(json!({
                "metadata": {"name": format!("{prefix}-{i}")},
                "spec": {"storageClassName": "example-hostpath", "accessModes": ["ReadWriteOnce"],
                         "resources": {"requests": {"storage": "1Gi"}}}
            }))
            .unwrap();
            claims.create(&PostParams::default(), &claim).await.unwrap();
        }
    });
    futures::future::join_all(creates).await;
}

/// Wait until every claim `<prefix>-*` is Bound; returns their PV names.
async fn wait_bound(
    client: &kube::Client,
    prefix: &str,
    n: usize,
    timeout: Duration,
) -> Vec<String> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    wait_for(&format!("{n} claims {prefix}-* Bound"), timeout, || async {
        let list = claims
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let ours: Vec<_> = list
            .items
            .iter()
            .filter(|c| {
                c.metadata
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with(&format!("{prefix}-")))
            })
            .collect();
        let bound: Vec<String> = ours
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .filter_map(|c| c.spec.as_ref()?.volume_name.clone())
            .collect();
        if ours.len() == n && bound.len() == n {
            Ok(bound)
        } else {
            Err(format!("{} of {} Bound", bound.len(), ours.len()))
        }
    })
    .await
}

/// Delete the claims `<prefix>-*` and wait until their PVs and directories are gone.
async fn delete_claims(client: &kube::Client, prefix: &str, pvs_of: &[String]) {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "default");
    let names: Vec<String> = claims
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter_map(|c| c.metadata.name)
        .filter(|n| n.starts_with(&format!("{prefix}-")))
        .collect();
    let dp = DeleteParams::default();
    futures::future::join_all(names.iter().map(|n| claims.delete(n, &dp))).await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    wait_for(
        &format!("PVs and dirs of {prefix}-* gone"),
        Duration::from_secs(300),
        || async {
            let left: Vec<&String> = pvs_of
                .iter()
                .filter(|pv| std::path::Path::new(BASE_DIR).join(pv).exists())
                .collect();
            let all = pvs
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?;
            let pv_left = all
                .items
                .iter()
                .filter(|p| p.metadata.name.as_ref().is_some_and(|n| pvs_of.contains(n)))
                .count();
            if left.is_empty() && pv_left == 0 {
                Ok(())
            } else {
                Err(format!("{} dirs, {pv_left} PVs left", left.len()))
            }
        },
    )
    .await;
}

/// Scenario 6: provision-svc ×3, pv-writer ×2 (reclaim-svc ×2 for scenario 5): one leader
/// each; a burst of claims gets one PV and one ProvisioningSucceeded event per claim.
async fn scaled_one_leader_no_duplicates(cluster: &RealCluster) {
    for (service, replicas) in [("provision-svc", 3), ("pv-writer", 2), ("reclaim-svc", 2)] {
        scale_and_one_leader(cluster, service, replicas).await;
    }
    let client = cluster.client();
    let n = 30;
    create_claims(&client, "scaled", n).await;
    let pv_names = wait_bound(&client, "scaled", n, Duration::from_secs(180)).await;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let all = pvs.list(&ListParams::default()).await.unwrap();
    let for_claims = all
        .items
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.name.as_deref())
                .is_some_and(|n| n.starts_with("scaled-"))
        })
        .count();
    assert_eq!(for_claims, n, "one PV per claim, no duplicates");
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(client.clone(), "default");
    let succeeded: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some("ProvisioningSucceeded")
                && e.involved_object
                    .name
                    .as_deref()
                    .is_some_and(|n| n.starts_with("scaled-"))
        })
        .collect();
    let mut per_claim = std::collections::HashMap::new();
    for e in &succeeded {
        *per_claim
            .entry(e.involved_object.name.clone().unwrap())
            .or_insert(0) += e.count.unwrap_or(1);
    }
    assert!(
        per_claim.len() == n && per_claim.values().all(|c| *c == 1),
        "one ProvisioningSucceeded per claim: {per_claim:?}"
    );
    delete_claims(&client, "scaled", &pv_names).await;
    eprintln!(
        "node scenario 6: one leader each at 3/2/2 replicas; {n} claims, {n} PVs, {n} events"
    );
}

/// Scenario 5: delete each service's leader pod; a standby holds the Lease within the
/// Lease's duration.
async fn standby_takes_over(cluster: &RealCluster) {
    let client = cluster.client();
    for service in SERVICES {
        let (ns, _) = service_home(service);
        let (lease, holder, duration) = lease_of(&client, service).await.expect("a held Lease");
        let leader = service_pods(&client, service)
            .await
            .into_iter()
            .find(|(name, _)| holder.starts_with(name.as_str()))
            .map(|(name, _)| name)
            .unwrap_or_else(|| panic!("{service}: holder {holder} is a Ready pod"));
        let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
        let start = Instant::now();
        pods.delete(&leader, &DeleteParams::default())
            .await
            .unwrap();
        let new_holder = wait_for(
            &format!("{service}: a standby holds Lease {lease}"),
            Duration::from_secs(duration as u64 * 3),
            || {
                let client = client.clone();
                let leader = leader.clone();
                async move {
                    match lease_of(&client, service).await {
                        Some((_, h, _)) if !h.starts_with(leader.as_str()) => Ok(h),
                        other => Err(format!("{other:?}")),
                    }
                }
            },
        )
        .await;
        let took = start.elapsed();
        assert!(
            took <= Duration::from_secs(duration as u64),
            "{service}: the standby took Lease {lease} after {took:?}, over its {duration} s"
        );
        eprintln!(
            "node scenario 5: {service}: {leader} deleted, {new_holder} leads after {:.1} s",
            took.as_secs_f64()
        );
    }
}

/// Wait until exactly `n` pods named `<prefix>*` exist (only Running ones when `running`).
async fn wait_pod_count(pods: &Api<Pod>, prefix: &str, running: bool, n: usize, timeout: Duration) {
    let what = format!("{n} pods {prefix}* (running: {running})");
    wait_for(&what, timeout, || async {
        let list = pods
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let count = list
            .items
            .iter()
            .filter(|p| {
                p.metadata
                    .name
                    .as_deref()
                    .is_some_and(|name| name.starts_with(prefix))
            })
            .filter(|p| {
                !running || p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
            })
            .count();
        if count == n {
            Ok(())
        } else {
            Err(format!("{count} pods"))
        }
    })
    .await;
}

/// Scenario 3: 100 claims and 100 pods using them at once: all Running; deleted, no
/// directory and no PV of them is left.
async fn hundred_pods_on_hundred_claims(cluster: &RealCluster) {
    let client = cluster.client();
    let n = 100;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let start = Instant::now();
    let make_pods = (0..n).map(|i| {
        let pods = pods.clone();
        async move {
            let mut pod = workload_pod(
                &format!("many-{i}"),
                &format!("many-{i}"),
                "echo x > /data/x && exec sleep 3600",
            );
            pod.spec.as_mut().unwrap().restart_policy = Some("Always".into());
            pods.create(&PostParams::default(), &pod).await.unwrap();
        }
    });
    futures::future::join(
        create_claims(&client, "many", n),
        futures::future::join_all(make_pods),
    )
    .await;
    let pv_names = wait_bound(&client, "many", n, Duration::from_secs(300)).await;
    wait_pod_count(&pods, "many-", true, n, Duration::from_secs(600)).await;
    eprintln!(
        "node scenario 3: {n} claims Bound and {n} pods Running {:.0} s after creation",
        start.elapsed().as_secs_f64()
    );
    for pv in &pv_names {
        assert!(
            std::path::Path::new(BASE_DIR).join(pv).join("x").is_file(),
            "{pv}: the pod wrote into its directory"
        );
    }
    let dp = DeleteParams::default();
    futures::future::join_all((0..n).map(|i| {
        let pods = pods.clone();
        let dp = dp.clone();
        async move { pods.delete(&format!("many-{i}"), &dp).await }
    }))
    .await;
    wait_pod_count(&pods, "many-", false, 0, Duration::from_secs(300)).await;
    delete_claims(&client, "many", &pv_names).await;
    eprintln!(
        "node scenario 3: deleted; 0 directories, 0 PVs left after {:.0} s",
        start.elapsed().as_secs_f64()
    );
}

/// Scenario 4: the Redis pod deleted during a 200-claim burst: every claim Bound, one
/// directory per claim.
async fn redis_restart_in_a_burst(cluster: &RealCluster) {
    let client = cluster.client();
    let n = 200;
    let redis: Api<Pod> = Api::namespaced(client.clone(), "split-provisioner");
    let burst = create_claims(&client, "burst", n);
    let kill = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        redis
            .delete("redis-0", &DeleteParams::default())
            .await
            .unwrap();
    };
    futures::future::join(burst, kill).await;
    let pv_names = wait_bound(&client, "burst", n, Duration::from_secs(600)).await;
    assert_one_pv_and_directory_each(&pv_names, n);
    let redis_pod = redis.get("redis-0").await.unwrap();
    assert!(
        pod_ready(&redis_pod),
        "Redis is back: {:?}",
        redis_pod.status
    );
    assert_redis_replayed_everything();
    delete_claims(&client, "burst", &pv_names).await;
    eprintln!("node scenario 4: Redis deleted in a {n}-claim burst; {n} Bound, {n} directories");
}

/// Scenario 8: `components/redis-sentinel` applied over the running install (the redis
/// StatefulSet replaced by a primary, two replicas and three Sentinels); the primary hangs
/// in a 100-claim burst until the Sentinels fail over: every claim Bound once, one
/// directory each, and provision-svc saw the failover.
async fn redis_sentinel_failover_in_a_burst(cluster: &RealCluster) {
    let client = cluster.client();
    // serviceName cannot change in place: the StatefulSet goes first (its PVC stays).
    kubectl(
        cluster,
        &[
            "-n",
            "split-provisioner",
            "delete",
            "statefulset/redis",
            "--wait=true",
        ],
    );
    let overlay = repo_root().join("target/node-sentinel-overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    std::fs::write(
        overlay.join("kustomization.yaml"),
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
         resources: [../../deploy/overlays/redis-sentinel]\n\
         images:\n  - name: split-provisioner\n    newTag: node-test\n  - name: redis\n    newTag: node-test\n",
    )
    .unwrap();
    let out = kubectl(cluster, &["apply", "-k", "target/node-sentinel-overlay"]);
    eprintln!("node scenario 8: {} objects applied", out.lines().count());
    let start = Instant::now();
    kubectl(
        cluster,
        &[
            "-n",
            "split-provisioner",
            "rollout",
            "status",
            "statefulset/redis",
            "--timeout=300s",
        ],
    );
    for service in SERVICES {
        let (ns, _) = service_home(service);
        kubectl(
            cluster,
            &[
                "-n",
                ns,
                "rollout",
                "status",
                &format!("deployment/{service}"),
                "--timeout=300s",
            ],
        );
    }
    eprintln!(
        "node scenario 8: 3 Redis pods with Sentinels and the services on them {:.0} s after apply",
        start.elapsed().as_secs_f64()
    );
    // A failover needs replicas the Sentinels know to be in sync (they learn them by INFO).
    wait_for(
        "every Sentinel sees two replicas in sync",
        Duration::from_secs(120),
        || {
            let client = client.clone();
            async move { sentinels_see_replicas(&client).await }
        },
    )
    .await;
    let n = 100;
    let burst = create_claims(&client, "sentinel", n);
    // The primary hangs (SIGSTOP) until the Sentinels promoted a replica (past their 5 s
    // down-after; a split vote puts their next election 2 × failover-timeout later, so a
    // fixed 12 s hang could end with no failover); thawed, it is made a replica.
    let hang = async {
        tokio::time::sleep(Duration::from_secs(2)).await;
        let pid = redis_server_pid("redis-0").expect("redis-0's redis-server on the node");
        // SAFETY: plain syscalls on a process this test found by its pod.
        unsafe { libc::kill(pid, libc::SIGSTOP) };
        let started = Instant::now();
        wait_for(
            "the Sentinels promote a replica",
            Duration::from_secs(150),
            || sentinels_moved_from(&client, "redis-0."),
        )
        .await;
        eprintln!(
            "node scenario 8: failover {:.0} s into the hang",
            started.elapsed().as_secs_f64()
        );
        unsafe { libc::kill(pid, libc::SIGCONT) };
    };
    futures::future::join(burst, hang).await;
    let pv_names = wait_bound(&client, "sentinel", n, Duration::from_secs(600)).await;
    assert_one_pv_and_directory_each(&pv_names, n);
    // Its probe writes the data marker every second: on the old primary that is a
    // NOREPLICAS or READONLY, after which the connection asks the Sentinels and moves.
    let (_, port) = service_home("provision-svc");
    wait_for(
        "provision-svc saw the failover",
        Duration::from_secs(60),
        || {
            let client = client.clone();
            async move {
                let mut seen = 0.0;
                for (_, ip) in service_pods(&client, "provision-svc").await {
                    seen += scrape_sum(&ip, port, "provision_svc_redis_data_losses_total").await?;
                }
                if seen >= 1.0 {
                    Ok(())
                } else {
                    Err(format!("provision_svc_redis_data_losses_total {seen}"))
                }
            }
        },
    )
    .await;
    delete_claims(&client, "sentinel", &pv_names).await;
    eprintln!(
        "node scenario 8: primary hung in a {n}-claim burst; {n} Bound, {n} directories, failover seen"
    );
}

/// A connection to the Sentinel of each of the three redis pods, with the pod's IP.
async fn sentinel_connections(
    client: &kube::Client,
) -> Result<Vec<(String, redis::aio::MultiplexedConnection)>, String> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), "split-provisioner");
    let lp = ListParams::default().labels("app.kubernetes.io/name=redis");
    let list = pods.list(&lp).await.map_err(|e| e.to_string())?;
    let ips: Vec<String> = list
        .items
        .iter()
        .filter_map(|p| p.status.as_ref()?.pod_ip.clone())
        .collect();
    if ips.len() != 3 {
        return Err(format!("redis pod IPs {ips:?}"));
    }
    let mut conns = Vec::new();
    for ip in ips {
        let client =
            redis::Client::open(format!("redis://{ip}:26379")).map_err(|e| e.to_string())?;
        let conn = client
            .get_multiplexed_async_connection()
            .await
            .map_err(|e| format!("{ip}: {e}"))?;
        conns.push((ip, conn));
    }
    Ok(conns)
}

/// Ok when the Sentinel of each of the three redis pods lists two replicas whose link to
/// the primary is up; else what one of them sees.
async fn sentinels_see_replicas(client: &kube::Client) -> Result<(), String> {
    for (ip, mut conn) in sentinel_connections(client).await? {
        let replicas: Vec<std::collections::HashMap<String, String>> = redis::cmd("SENTINEL")
            .arg("REPLICAS")
            .arg("provisioner")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("{ip}: {e}"))?;
        let in_sync = replicas
            .iter()
            .filter(|r| r.get("master-link-status").map(String::as_str) == Some("ok"))
            .filter(|r| !r.get("flags").is_some_and(|f| f.contains("down")))
            .count();
        if in_sync != 2 {
            return Err(format!(
                "Sentinel {ip}: {in_sync} replicas in sync of {replicas:?}"
            ));
        }
    }
    Ok(())
}

/// Ok when the Sentinel of each of the three redis pods names a primary whose host does not
/// start with `old` (`SENTINEL MASTER`, the table clients read); else what one names.
async fn sentinels_moved_from(client: &kube::Client, old: &str) -> Result<(), String> {
    for (ip, mut conn) in sentinel_connections(client).await? {
        let table: std::collections::HashMap<String, String> = redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg("provisioner")
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("{ip}: {e}"))?;
        let named = table.get("ip").cloned().unwrap_or_default();
        if named.starts_with(old) {
            return Err(format!("Sentinel {ip} still names {named}"));
        }
    }
    Ok(())
}

/// `pv_names` (of `n` Bound claims) are `n` distinct PVs, each with its directory on the node.
fn assert_one_pv_and_directory_each(pv_names: &[String], n: usize) {
    let mut unique = pv_names.to_vec();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), n, "one PV per claim");
    let dirs = pv_names
        .iter()
        .filter(|pv| std::path::Path::new(BASE_DIR).join(pv).is_dir())
        .count();
    assert_eq!(dirs, n, "one directory per claim on the node");
}

/// PID on this machine of the data `redis-server` (not the Sentinel) of pod `pod`.
fn redis_server_pid(pod: &str) -> Option<i32> {
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: i32 = e.file_name().to_str()?.parse().ok()?;
        let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
        let cmdline = std::fs::read_to_string(format!("/proc/{pid}/cmdline")).ok()?;
        let host = std::fs::read_to_string(format!("/proc/{pid}/root/etc/hostname")).ok()?;
        (comm.trim() == "redis-server" && cmdline.contains(":6379") && host.trim() == pod)
            .then_some(pid)
    })
}

/// GET `path_and_query` from 127.0.0.1:`port` (HTTP/1.0) and parse the JSON body.
async fn http_json(port: u16, path_and_query: &str) -> Result<serde_json::Value, String> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let head = format!("GET {path_and_query} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n");
        s.write_all(head.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .map_err(|_| "timed out".to_string())?
        .map_err(|e| e.to_string())?;
    let body = text.split_once("\r\n\r\n").map(|(_, b)| b).unwrap_or("");
    serde_json::from_str(body).map_err(|e| format!("{e}: {body}"))
}

fn percent_encode(q: &str) -> String {
    q.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Replace `{{ $labels.X }}` in `text` with `labels[X]`.
fn render_labels(text: &str, labels: &[(&str, &str)]) -> String {
    let mut out = text.to_string();
    for (k, v) in labels {
        out = out.replace(&format!("{{{{ $labels.{k} }}}}"), v);
    }
    out
}

/// Run `cmd ARGS`; its stdout and stderr, or a panic with them when it fails.
fn run_tool(mut cmd: Command, args: &[&str]) -> String {
    let program = cmd.get_program().to_string_lossy().into_owned();
    let out = cmd
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running {program}: {e}"));
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "{program} {args:?} failed: {text}");
    text
}

/// What the ServiceMonitor selects, as file_sd groups: one per endpoint address of the
/// port `metrics` of each Service labelled part-of=split-provisioner, component=metrics.
async fn service_monitor_targets(client: &kube::Client) -> Vec<serde_json::Value> {
    use k8s_openapi::api::core::v1::{Endpoints, Service};
    let mut groups = Vec::new();
    for ns in NAMESPACES {
        let services: Api<Service> = Api::namespaced(client.clone(), ns);
        let endpoints: Api<Endpoints> = Api::namespaced(client.clone(), ns);
        let lp = ListParams::default().labels(
            "app.kubernetes.io/part-of=split-provisioner,app.kubernetes.io/component=metrics",
        );
        for svc in services.list(&lp).await.unwrap().items {
            let name = svc.metadata.name.clone().unwrap();
            let job = svc
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get("app.kubernetes.io/name"))
                .cloned()
                .unwrap_or_default();
            let Some(ep) = endpoints.get_opt(&name).await.unwrap() else {
                continue;
            };
            for subset in ep.subsets.unwrap_or_default() {
                let Some(port) = subset
                    .ports
                    .unwrap_or_default()
                    .into_iter()
                    .find(|p| p.name.as_deref() == Some("metrics"))
                else {
                    continue;
                };
                for addr in subset.addresses.unwrap_or_default() {
                    let pod = addr.target_ref.and_then(|r| r.name).unwrap_or_default();
                    groups.push(serde_json::json!({
                        "targets": [format!("{}:{}", addr.ip, port.port)],
                        "labels": {"job": job, "namespace": ns, "service": name, "pod": pod}
                    }));
                }
            }
        }
    }
    groups
}

/// Scenario 7: the PrometheusRule passes `promtool check rules` and a `promtool test
/// rules` case; Prometheus scrapes the three services as the ServiceMonitor describes;
/// with Redis scaled to 0 SplitProvisionerRedisUnreachable fires, and resolves after.
async fn prometheus_scrapes_and_alerts(cluster: &RealCluster, node: &RealNode) {
    let dir = node.root().join("prometheus");
    std::fs::create_dir_all(&dir).unwrap();
    // The rule groups of the PrometheusRule, as a Prometheus rule file.
    let rule: serde_yaml::Value = serde_yaml::from_str(
        &std::fs::read_to_string(
            repo_root().join("deploy/components/servicemonitor/prometheusrule.yaml"),
        )
        .unwrap(),
    )
    .unwrap();
    let rules = dir.join("rules.yml");
    std::fs::write(&rules, serde_yaml::to_string(&rule["spec"]).unwrap()).unwrap();
    let checked = run_tool(
        Command::new("promtool"),
        &["check", "rules", &rules.display().to_string()],
    );
    eprintln!(
        "node scenario 7: promtool check rules: {}",
        checked.trim().replace('\n', "; ")
    );

    // One unit test: Redis unreachable for 3 minutes fires the alert (its `for` is 2m).
    let alert = rule["spec"]["groups"][0]["rules"]
        .as_sequence()
        .unwrap()
        .iter()
        .find(|r| r["alert"].as_str() == Some("SplitProvisionerRedisUnreachable"))
        .expect("the RedisUnreachable rule")
        .clone();
    let labels = [
        ("namespace", "split-provisioner"),
        ("job", "pv-writer"),
        ("pod", "pv-writer-0"),
    ];
    let mut annotations = serde_yaml::Mapping::new();
    for (k, v) in alert["annotations"].as_mapping().unwrap() {
        annotations.insert(
            k.clone(),
            render_labels(v.as_str().unwrap(), &labels).into(),
        );
    }
    let test = serde_json::json!({
        "rule_files": ["rules.yml"],
        "evaluation_interval": "30s",
        "tests": [{
            "interval": "30s",
            "input_series": [{"series": "redis_reachable{namespace=\"split-provisioner\",job=\"pv-writer\",pod=\"pv-writer-0\"}",
                              "values": "0x10"}],
            "alert_rule_test": [
                {"eval_time": "1m", "alertname": "SplitProvisionerRedisUnreachable", "exp_alerts": []},
                {"eval_time": "3m", "alertname": "SplitProvisionerRedisUnreachable", "exp_alerts": [{
                    "exp_labels": {"severity": "critical", "namespace": "split-provisioner",
                                   "job": "pv-writer", "pod": "pv-writer-0"},
                    "exp_annotations": serde_json::to_value(&annotations).unwrap()}]}
            ]
        }]
    });
    let test_file = dir.join("rules-test.yml");
    std::fs::write(&test_file, serde_yaml::to_string(&test).unwrap()).unwrap();
    run_tool(
        Command::new("promtool"),
        &["test", "rules", &test_file.display().to_string()],
    );
    eprintln!("node scenario 7: promtool test rules passed");

    // The ServiceMonitor's scrape: the endpoints of Services labelled
    // part-of=split-provisioner and component=metrics, port `metrics`, job from
    // app.kubernetes.io/name; Debian's Prometheus has no Kubernetes discovery, so the
    // harness resolves them into a file_sd file (5 s interval instead of 30 s).
    let targets = service_monitor_targets(&cluster.client()).await;
    assert!(targets.len() >= 3, "targets {targets:?}");
    let targets_file = dir.join("targets.json");
    std::fs::write(&targets_file, serde_json::Value::Array(targets).to_string()).unwrap();
    let port = e2e::harness::process::free_port().unwrap();
    let config = serde_json::json!({
        "global": {"scrape_interval": "5s", "evaluation_interval": "5s"},
        "rule_files": [rules.display().to_string()],
        "scrape_configs": [{
            "job_name": "split-provisioner/split-provisioner",
            "scrape_interval": "5s", "scrape_timeout": "5s", "metrics_path": "/metrics",
            "file_sd_configs": [{"files": [targets_file.display().to_string()]}],
        }]
    });
    let config_file = dir.join("prometheus.yml");
    std::fs::write(&config_file, serde_yaml::to_string(&config).unwrap()).unwrap();
    let mut prometheus = e2e::harness::ManagedProcess::spawn(
        "prometheus",
        std::path::Path::new("prometheus"),
        &[
            format!("--config.file={}", config_file.display()),
            format!("--storage.tsdb.path={}", dir.join("data").display()),
            format!("--web.listen-address=127.0.0.1:{port}"),
        ],
        &[],
        &dir.join("prometheus.log"),
    )
    .unwrap();
    let query = |q: &str| format!("/api/v1/query?query={}", percent_encode(q));
    let up_query = query(r#"sum by (job) (up{job=~"provision-svc|pv-writer|reclaim-svc"})"#);
    let up = wait_for(
        "every service scraped",
        Duration::from_secs(120),
        || async {
            let answer = http_json(port, &up_query).await?;
            let result = answer["data"]["result"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let jobs: Vec<String> = result
                .iter()
                .filter(|r| r["value"][1].as_str().is_some_and(|v| v != "0"))
                .filter_map(|r| r["metric"]["job"].as_str().map(str::to_string))
                .collect();
            if jobs.len() == 3 {
                Ok(result)
            } else {
                Err(format!("{answer}"))
            }
        },
    )
    .await;
    eprintln!("node scenario 7: scraped {up:?}");

    let firing = |answer: &serde_json::Value| {
        answer["data"]["alerts"].as_array().is_some_and(|alerts| {
            alerts.iter().any(|a| {
                a["labels"]["alertname"] == "SplitProvisionerRedisUnreachable"
                    && a["state"] == "firing"
            })
        })
    };
    let start = Instant::now();
    kubectl(
        cluster,
        &[
            "-n",
            "split-provisioner",
            "scale",
            "statefulset/redis",
            "--replicas=0",
        ],
    );
    wait_for(
        "SplitProvisionerRedisUnreachable firing",
        Duration::from_secs(300),
        || async {
            let answer = http_json(port, "/api/v1/alerts").await?;
            if firing(&answer) {
                Ok(())
            } else {
                Err(format!("{answer}"))
            }
        },
    )
    .await;
    eprintln!(
        "node scenario 7: SplitProvisionerRedisUnreachable firing {:.0} s after Redis went to 0",
        start.elapsed().as_secs_f64()
    );
    kubectl(
        cluster,
        &[
            "-n",
            "split-provisioner",
            "scale",
            "statefulset/redis",
            "--replicas=1",
        ],
    );
    wait_for("the alert resolved", Duration::from_secs(300), || async {
        let answer = http_json(port, "/api/v1/alerts").await?;
        if firing(&answer) {
            Err(format!("{answer}"))
        } else {
            Ok(())
        }
    })
    .await;
    eprintln!(
        "node scenario 7: resolved {:.0} s after the scale-down",
        start.elapsed().as_secs_f64()
    );
    prometheus.kill();
    assert_redis_replayed_everything();
}

/// The Redis pods' logs show no refusal of their AOF at start (the `default` user's
/// replay rights, deploy/base/redis/users.acl).
fn assert_redis_replayed_everything() {
    for (pod, text) in pod_logs("split-provisioner", "redis-") {
        let refused = last_lines(&text, usize::MAX, |l| l.contains("AOF-loading-client"));
        assert!(
            refused.is_empty(),
            "{pod} refused part of its AOF:\n{refused}"
        );
    }
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
    let _dump = DumpOnPanic(&cluster, &node);
    // The Redis StatefulSet's claim names no class: a class-less local PV serves it.
    for pv in ["node-redis-data", "node-redis-data-1", "node-redis-data-2"] {
        node.add_local_pv(&cluster.client(), pv, "1Gi")
            .await
            .unwrap();
    }
    let start = Instant::now();
    apply_and_everything_ready(&cluster).await;
    if scenario_on(2) {
        claim_survives_pods_and_goes_with_claim(&cluster).await;
    }
    if scenario_on(6) || scenario_on(5) {
        scaled_one_leader_no_duplicates(&cluster).await;
    }
    if scenario_on(5) {
        standby_takes_over(&cluster).await;
    }
    if scenario_on(3) {
        hundred_pods_on_hundred_claims(&cluster).await;
    }
    if scenario_on(4) {
        redis_restart_in_a_burst(&cluster).await;
    }
    if !scenario_on(7) {
    } else if Command::new("promtool").arg("--version").output().is_ok() {
        prometheus_scrapes_and_alerts(&cluster, &node).await;
    } else {
        eprintln!("node: SKIPPED scenario 7 (no prometheus/promtool: apt-get install prometheus)");
    }
    if scenario_on(8) {
        redis_sentinel_failover_in_a_burst(&cluster).await;
    }
    if scenario_on(9) {
        class_parameters_on_the_node(&cluster).await;
    }
    eprintln!(
        "node: scenarios passed in {:.0} s",
        start.elapsed().as_secs_f64()
    );
    if std::env::var("E2E_NODE_HOLD").as_deref() == Ok("1") {
        eprintln!(
            "node: cluster kept up; export KUBECONFIG={} (Ctrl-C stops it; the next run cleans up)",
            cluster.admin_kubeconfig().display()
        );
        std::future::pending::<()>().await;
    }
    drop(_dump);
    drop(node);
    // Volumes the run made in the node's base dir (the example claim's) go with the cluster.
    for entry in base_dir_entries().difference(&before) {
        let _ = std::fs::remove_dir_all(std::path::Path::new(BASE_DIR).join(entry));
    }
}

/// On a failing scenario, prints what an operator would look at first: pods, recent
/// events, claims not Bound, PVs, Redis' endpoints, the last log lines (not debug) of the
/// services, Redis, the node's processes and the control plane, and the services' metrics.
struct DumpOnPanic<'a>(&'a RealCluster, &'a RealNode);

impl Drop for DumpOnPanic<'_> {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            return;
        }
        let kubectl = |args: &[&str]| {
            let mut cmd = Command::new("kubectl");
            cmd.arg("--kubeconfig").arg(self.0.admin_kubeconfig());
            match cmd.arg("--request-timeout=10s").args(args).output() {
                Ok(o) => {
                    String::from_utf8_lossy(&o.stdout).into_owned()
                        + &String::from_utf8_lossy(&o.stderr)
                }
                Err(e) => e.to_string(),
            }
        };
        let show = |args: &[&str], keep: fn(&str) -> bool, n: usize| {
            let shown = last_lines(&kubectl(args), n, keep);
            eprintln!("--- kubectl {} (last {n} lines)\n{shown}", args.join(" "));
        };
        show(&["get", "pods", "-A", "-o", "wide"], |_| true, 40);
        show(
            &["get", "events", "-A", "--sort-by=.lastTimestamp"],
            |_| true,
            60,
        );
        show(&["get", "pvc", "-A"], |l| !l.contains(" Bound "), 20);
        show(&["get", "pv"], |_| true, 20);
        show(&["get", "endpointslices", "-A"], |_| true, 20);
        let not_debug = |l: &str| !l.contains(" DEBUG ") && !l.contains("\"DEBUG\"");
        let logs = SERVICES
            .map(service_home)
            .map(|(ns, _)| ns)
            .into_iter()
            .zip(SERVICES);
        for (ns, prefix) in logs.chain([("split-provisioner", "redis")]) {
            for (pod, text) in pod_logs(ns, prefix) {
                eprintln!("==> {pod} <==\n{}", last_lines(&text, 60, not_debug));
            }
        }
        let jsonpath = r#"jsonpath={range .items[*]}{.metadata.name} {.status.podIP}{"\n"}{end}"#;
        for line in kubectl(&["get", "pods", "-A", "-o", jsonpath]).lines() {
            let Some((pod, ip)) = line.split_once(' ') else {
                continue;
            };
            if let Some(service) = SERVICES.into_iter().find(|s| pod.starts_with(s)) {
                eprintln!(
                    "==> {pod} /metrics <==\n{}",
                    metrics_now(ip, service_home(service).1)
                );
            }
        }
        for log in ["kube-proxy", "coredns", "kubelet"] {
            eprintln!("{}", self.1.log_tail(log, 30));
        }
        eprintln!("{}", self.0.log_tail(30));
    }
}

/// The samples of `http://ip:port/metrics` but histograms and process metrics, or why not.
fn metrics_now(ip: &str, port: u16) -> String {
    use std::io::{Read, Write};
    let fetch = || -> std::io::Result<String> {
        let addr = std::net::SocketAddr::new(ip.parse().map_err(std::io::Error::other)?, port);
        let mut s = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))?;
        s.set_read_timeout(Some(Duration::from_secs(3)))?;
        s.write_all(b"GET /metrics HTTP/1.0\r\nHost: pod\r\n\r\n")?;
        let mut body = String::new();
        s.read_to_string(&mut body)?;
        Ok(body)
    };
    match fetch() {
        Ok(reply) => {
            let body = reply.split_once("\r\n\r\n").map_or("", |(_, body)| body);
            let sample = |l: &str| {
                !l.starts_with('#') && !l.starts_with("process_") && !l.contains("_bucket{")
            };
            last_lines(body, usize::MAX, sample)
        }
        Err(e) => format!("cannot scrape: {e}"),
    }
}

fn base_dir_entries() -> std::collections::HashSet<std::ffi::OsString> {
    std::fs::read_dir(BASE_DIR)
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default()
}
