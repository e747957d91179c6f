//! The deploy manifests against a real API server: `kubectl apply -k <dir> --dry-run=server`
//! for every overlay in `deploy/overlays`, for `deploy/examples` and for the optional
//! `deploy/components/servicemonitor`, on a real kube-apiserver (v1.19 and v1.37) (the oldest supported
//! Kubernetes; `KUBEBUILDER_ASSETS`, see `e2e::realkube`). The server runs full admission and
//! validation on each object without storing it; any rejected object fails the test.
//!
//! * The namespaces a rendering declares are created for real first: a server dry run of a
//!   Namespace does not create it, so every namespaced object after it would get `404`.
//! * The ServiceMonitor and PrometheusRule (Prometheus Operator) need their CRDs: minimal
//!   `servicemonitors`/`prometheusrules.monitoring.coreos.com` CRDs (schema: any fields) are
//!   installed first, so the objects are checked for kind, scope and metadata, not for the
//!   operator's schema.
//!   The v1.19.2 build in `../shared/realkube` rejects *every* custom resource create
//!   (`metadata.name: Required value` even for a minimal object with a name, and a handler
//!   panic under `fieldValidation=Strict`): a server bug, not ours. A probe creates a minimal
//!   ServiceMonitor first; when that fails this way, exactly the ServiceMonitor object is
//!   skipped with that reason printed, and it is dry-run normally on a server that works.
//! * `policy/v1` PodDisruptionBudgets (the `ha` overlay) are not served before Kubernetes
//!   1.21, while 1.25+ serves only `policy/v1`: on a server without `policy/v1` the test
//!   asserts that exactly the rendered PodDisruptionBudgets, and nothing else, are rejected
//!   (the README's version promise for the `ha` overlay is 1.21+; see deploy/README.md).
//!
//! Skipped with one line without the binaries or `kubectl` (a failure when `CI=true`).

use e2e::realkube::{Assets, RealCluster, RealClusterOptions};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use serde_json::{json, Value};
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn kubectl_or_skip(test: &str) -> bool {
    let ok = Command::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        assert!(
            std::env::var("CI").as_deref() != Ok("true"),
            "{test}: kubectl not found (CI=true)"
        );
        eprintln!("skipped {test}: kubectl not found on PATH");
    }
    ok
}

/// `kubectl kustomize dir`, parsed into JSON objects. Panics with kubectl's stderr on failure.
fn render(dir: &Path) -> Vec<Value> {
    let out = Command::new("kubectl")
        .arg("kustomize")
        .arg(dir)
        .output()
        .expect("run kubectl kustomize");
    assert!(
        out.status.success(),
        "kubectl kustomize {}: {}",
        dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).expect("utf-8");
    serde_yaml::Deserializer::from_str(&text)
        .filter_map(|doc| {
            let v: Value = serde::Deserialize::deserialize(doc).expect("YAML document");
            (!v.is_null()).then_some(v)
        })
        .collect()
}

/// Install a minimal `monitoring.coreos.com/v1` CRD for `kind` (plural `plural`, any
/// fields) and wait until it is Established.
async fn install_monitoring_crd(client: kube::Client, kind: &str, plural: &str) {
    let crd_name = format!("{plural}.monitoring.coreos.com");
    let crds: Api<CustomResourceDefinition> = Api::all(client);
    let crd: CustomResourceDefinition = serde_json::from_value(json!({
        "metadata": {"name": crd_name},
        "spec": {
            "group": "monitoring.coreos.com",
            "scope": "Namespaced",
            "names": {"plural": plural, "singular": kind.to_lowercase(),
                      "kind": kind, "listKind": format!("{kind}List")},
            "versions": [{"name": "v1", "served": true, "storage": true,
                          "schema": {"openAPIV3Schema": {"type": "object",
                                     "x-kubernetes-preserve-unknown-fields": true}}}]
        }
    }))
    .unwrap();
    crds.create(&PostParams::default(), &crd).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let c = crds.get(&crd_name).await.unwrap();
        let established = c.status.and_then(|s| s.conditions).is_some_and(|cs| {
            cs.iter()
                .any(|c| c.type_ == "Established" && c.status == "True")
        });
        if established {
            return;
        }
        assert!(Instant::now() < deadline, "CRD not Established within 30 s");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether the server accepts a minimal ServiceMonitor (see the module docs); `Err` holds
/// the server's answer when it does not.
async fn custom_resources_work(client: kube::Client) -> Result<(), String> {
    let ar = kube::api::ApiResource {
        group: "monitoring.coreos.com".into(),
        version: "v1".into(),
        api_version: "monitoring.coreos.com/v1".into(),
        kind: "ServiceMonitor".into(),
        plural: "servicemonitors".into(),
    };
    let api: Api<kube::api::DynamicObject> = Api::namespaced_with(client, "default", &ar);
    let probe: kube::api::DynamicObject = serde_json::from_value(json!({
        "apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor",
        "metadata": {"name": "probe"}, "spec": {}
    }))
    .unwrap();
    // A real create (this server's dry-run path for custom resources can crash it).
    api.create(&PostParams::default(), &probe)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

/// Result of one `kubectl apply -k dir --dry-run=server`.
struct DryRun {
    success: bool,
    /// Lines of kubectl's stderr reporting a rejected object (server errors and unknown kinds).
    rejections: Vec<String>,
    output: String,
}

fn dry_run(kubeconfig: &Path, dir: &Path) -> DryRun {
    let out = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(["apply", "--dry-run=server", "-k"])
        .arg(dir)
        .output()
        .expect("run kubectl apply");
    let stderr = String::from_utf8_lossy(&out.stderr).to_string();
    let rejections = stderr
        .lines()
        .filter(|l| {
            l.starts_with("Error from server")
                || l.starts_with("resource mapping not found")
                || l.starts_with("error:")
        })
        .map(str::to_string)
        .collect();
    DryRun {
        success: out.status.success(),
        rejections,
        output: format!("{}{}", String::from_utf8_lossy(&out.stdout), stderr),
    }
}

async fn every_overlay_and_example_is_accepted_by_the_real_server(assets: Assets) {
    let test = "every_overlay_and_example_is_accepted_by_the_real_server";
    if !kubectl_or_skip(test) {
        return;
    }
    let cluster = RealCluster::start(
        &assets,
        RealClusterOptions {
            controller_manager: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    let client = cluster.client();
    install_monitoring_crd(client.clone(), "ServiceMonitor", "servicemonitors").await;
    install_monitoring_crd(client.clone(), "PrometheusRule", "prometheusrules").await;
    let serves_policy_v1 = client
        .request_text(
            http::Request::get("/apis/policy/v1")
                .body(Vec::new())
                .unwrap(),
        )
        .await
        .is_ok();

    let root = repo_root().join("deploy");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join("overlays"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.join("kustomization.yaml").exists())
        .collect();
    dirs.sort();
    assert!(dirs.len() >= 2, "overlays found: {dirs:?}");
    dirs.push(root.join("examples"));
    let servicemonitor = root.join("components/servicemonitor");
    dirs.push(servicemonitor.clone());

    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut problems = Vec::new();
    for dir in &dirs {
        // Last in the list, so a server that crashes on it has checked everything else.
        if *dir == servicemonitor {
            if let Err(why) = custom_resources_work(client.clone()).await {
                eprintln!(
                    "skipped components/servicemonitor (ServiceMonitor, PrometheusRule, dashboard ConfigMap): this \
                     API server rejects every custom resource, even a minimal one: {why}"
                );
                continue;
            }
        }
        let objects = render(dir);
        for ns in objects.iter().filter(|o| o["kind"] == "Namespace") {
            let ns: Namespace = serde_json::from_value(ns.clone()).unwrap();
            match namespaces.create(&PostParams::default(), &ns).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.code == 409 => {}
                Err(e) => panic!("create namespace: {e}"),
            }
        }
        // policy/v1 PodDisruptionBudgets: the one documented exception on servers < 1.21.
        let expected: BTreeSet<String> = if serves_policy_v1 {
            BTreeSet::new()
        } else {
            objects
                .iter()
                .filter(|o| o["kind"] == "PodDisruptionBudget" && o["apiVersion"] == "policy/v1")
                .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
                .collect()
        };
        let r = dry_run(cluster.admin_kubeconfig(), dir);
        let pdb_rejected: BTreeSet<String> = r
            .rejections
            .iter()
            .filter(|l| {
                l.contains("no matches for kind \"PodDisruptionBudget\" in version \"policy/v1\"")
            })
            .filter_map(|l| l.split('"').nth(1).map(str::to_string))
            .collect();
        let other: Vec<&String> = r
            .rejections
            .iter()
            .filter(|l| !l.contains("kind \"PodDisruptionBudget\" in version \"policy/v1\""))
            .collect();
        let name = dir.strip_prefix(&root).unwrap().display().to_string();
        if !other.is_empty() || pdb_rejected != expected || (expected.is_empty() && !r.success) {
            problems.push(format!(
                "{name}: rejected {other:?}, PDBs rejected {pdb_rejected:?} (expected {expected:?})\n{}",
                r.output
            ));
        }
        eprintln!(
            "{name}: {} objects, server dry run ok{}",
            objects.len(),
            if expected.is_empty() {
                String::new()
            } else {
                format!(" except the policy/v1 PodDisruptionBudgets {expected:?} (server < 1.21)")
            }
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

e2e::on_each_version!(every_overlay_and_example_is_accepted_by_the_real_server,);
