//! The deploy manifests against a real API server: `kubectl apply -k <dir> --dry-run=server`
//! for every overlay in `deploy/overlays`, for `deploy/examples` and for the optional
//! `deploy/components/servicemonitor`, on real kube-apiservers v1.19 (the oldest supported
//! Kubernetes) and v1.37 (see `e2e::realkube`). The server runs full admission and
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
//! * `policy/v1` PodDisruptionBudgets (`ha`, `redis-sentinel`) are not served before Kubernetes
//!   1.21, while 1.25+ serves only `policy/v1` (`overlays/ha-1.19` has `policy/v1beta1`):
//!   the test asserts that exactly the rendered PodDisruptionBudgets of a version the
//!   server does not serve, and nothing else, are rejected (see deploy/README.md).
//!
//! * `deploy/README.md`'s "Production install" block (after the `production-install`
//!   marker) runs verbatim with `bash -eu`, `KUBECONFIG` the cluster's admin kubeconfig:
//!   namespaces, Secrets, overlay, check; then the Secrets, workloads and everything
//!   their pod templates name are checked on the server.
//!
//! Skipped with one line without the binaries or `kubectl` (a failure when `CI=true`).

use e2e::realkube::{Assets, KubeVersion, RealCluster, RealClusterOptions};
use k8s_openapi::api::core::v1::{Namespace, Pod};
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
    // PodDisruptionBudget apiVersions this server serves (policy/v1 from 1.21,
    // policy/v1beta1 up to 1.24).
    let mut served_pdb_versions = BTreeSet::new();
    for version in ["policy/v1", "policy/v1beta1"] {
        let served = client
            .request_text(
                http::Request::get(format!("/apis/{version}"))
                    .body(Vec::new())
                    .unwrap(),
            )
            .await
            .is_ok();
        if served {
            served_pdb_versions.insert(version.to_string());
        }
    }

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
        // PodDisruptionBudgets of a version the server does not serve: the one documented
        // exception (overlays/ha and components/redis-sentinel before 1.21, overlays/ha-1.19 from 1.25).
        let expected: BTreeSet<String> = objects
            .iter()
            .filter(|o| {
                o["kind"] == "PodDisruptionBudget"
                    && !served_pdb_versions.contains(o["apiVersion"].as_str().unwrap_or(""))
            })
            .map(|o| o["metadata"]["name"].as_str().unwrap_or("").to_string())
            .collect();
        let r = dry_run(cluster.admin_kubeconfig(), dir);
        let unserved_pdb = |l: &str| {
            l.contains("no matches for kind \"PodDisruptionBudget\" in version \"policy/v1")
        };
        let pdb_rejected: BTreeSet<String> = r
            .rejections
            .iter()
            .filter(|l| unserved_pdb(l))
            .filter_map(|l| l.split('"').nth(1).map(str::to_string))
            .collect();
        let other: Vec<&String> = r.rejections.iter().filter(|l| !unserved_pdb(l)).collect();
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
                format!(" except the PodDisruptionBudgets {expected:?} (a version this server does not serve)")
            }
        );
    }
    assert!(problems.is_empty(), "{}", problems.join("\n\n"));
}

/// The shell block of `deploy/README.md` that follows the `<!-- production-install` marker.
fn production_install_block() -> String {
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    let after = readme
        .split_once("<!-- production-install")
        .expect("deploy/README.md has the production-install marker")
        .1;
    let body = after
        .split_once("```sh\n")
        .expect("a ```sh block after the marker")
        .1;
    body.split_once("\n```")
        .expect("the block is closed")
        .0
        .to_string()
}

/// Runs the production install block with `bash -eu` from the repository root, kubectl
/// pointed at `kubeconfig` through `KUBECONFIG` only. Returns success and the output.
fn run_install(kubeconfig: &Path, block: &str) -> (bool, String) {
    let out = Command::new("bash")
        .args(["-eu", "-c", block])
        .current_dir(repo_root())
        .env("KUBECONFIG", kubeconfig)
        .output()
        .expect("run bash");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Every Secret and ConfigMap (and key) a pod template names exists in `ns`.
async fn missing_references(
    client: &kube::Client,
    ns: &str,
    owner: &str,
    pod: &k8s_openapi::api::core::v1::PodSpec,
) -> Vec<String> {
    use k8s_openapi::api::core::v1::{ConfigMap, Secret};
    let secrets: Api<Secret> = Api::namespaced(client.clone(), ns);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), ns);
    // (kind, name, keys the pod reads)
    let mut refs: Vec<(&str, String, Vec<String>)> = Vec::new();
    for v in pod.volumes.iter().flatten() {
        if let Some(s) = &v.secret {
            let keys = s.items.iter().flatten().map(|i| i.key.clone()).collect();
            refs.push(("Secret", s.secret_name.clone().unwrap_or_default(), keys));
        }
        if let Some(c) = &v.config_map {
            let keys = c.items.iter().flatten().map(|i| i.key.clone()).collect();
            refs.push(("ConfigMap", c.name.clone(), keys));
        }
    }
    for c in pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
    {
        for f in c.env_from.iter().flatten() {
            if let Some(r) = &f.config_map_ref {
                refs.push(("ConfigMap", r.name.clone(), vec![]));
            }
            if let Some(r) = &f.secret_ref {
                refs.push(("Secret", r.name.clone(), vec![]));
            }
        }
        for e in c.env.iter().flatten() {
            let from = e.value_from.as_ref();
            if let Some(r) = from.and_then(|f| f.config_map_key_ref.as_ref()) {
                refs.push(("ConfigMap", r.name.clone(), vec![r.key.clone()]));
            }
            if let Some(r) = from.and_then(|f| f.secret_key_ref.as_ref()) {
                refs.push(("Secret", r.name.clone(), vec![r.key.clone()]));
            }
        }
    }
    let mut missing = Vec::new();
    for (kind, name, keys) in refs {
        let present: Option<BTreeSet<String>> = if kind == "Secret" {
            secrets
                .get_opt(&name)
                .await
                .unwrap()
                .map(|s| s.data.unwrap_or_default().into_keys().collect())
        } else {
            maps.get_opt(&name)
                .await
                .unwrap()
                .map(|c| c.data.unwrap_or_default().into_keys().collect())
        };
        match present {
            None => missing.push(format!("{owner}: {kind} {ns}/{name} does not exist")),
            Some(have) => {
                for k in keys.iter().filter(|k| !have.contains(*k)) {
                    missing.push(format!("{owner}: {kind} {ns}/{name} has no key {k}"));
                }
            }
        }
    }
    missing
}

/// `deploy/README.md`'s "Production install" block, run verbatim against a real API
/// server: it succeeds, leaves the namespaces, the same Secrets in both namespaces, the
/// workloads and their PodDisruptionBudgets, and everything a pod template names exists
/// (no node here: nothing runs). A second run fails without touching the Secrets.
async fn the_production_install_in_the_deploy_readme_runs_on_the_real_server(assets: Assets) {
    use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
    use k8s_openapi::api::core::v1::Secret;
    let test = "the_production_install_in_the_deploy_readme_runs_on_the_real_server";
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
    let block = production_install_block();
    let (ok, output) = run_install(cluster.admin_kubeconfig(), &block);
    assert!(ok, "the production install failed:\n{output}");
    eprintln!("production install output:\n{output}");

    // The same Secrets in both namespaces, with real values.
    let secret = |ns: &str, name: &str| {
        let api: Api<Secret> = Api::namespaced(client.clone(), ns);
        let name = name.to_string();
        async move {
            let s = api.get(&name).await.unwrap();
            s.data
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, String::from_utf8(v.0).unwrap()))
                .collect::<std::collections::BTreeMap<String, String>>()
        }
    };
    let key = secret("split-provisioner", "split-provisioner-queue-key").await;
    assert_eq!(
        key,
        secret("split-provisioner-volumes", "split-provisioner-queue-key").await
    );
    let hmac = &key["hmac-key"];
    assert!(
        hmac.len() >= 32 && hmac.chars().all(|c| c.is_ascii_hexdigit()),
        "queue key {} bytes",
        hmac.len()
    );
    let users = secret("split-provisioner", "split-provisioner-redis-users").await;
    assert_eq!(
        users,
        secret("split-provisioner-volumes", "split-provisioner-redis-users").await
    );
    assert_eq!(
        users.keys().map(String::as_str).collect::<Vec<_>>(),
        ["operator", "provision-svc", "pv-writer", "reclaim-svc"]
    );
    let distinct: BTreeSet<&String> = users.values().collect();
    assert!(
        distinct.len() == 4 && distinct.iter().all(|p| p.len() >= 32),
        "four distinct passwords of at least 32 characters"
    );

    // The workloads, and everything their pods name.
    let mut missing = Vec::new();
    for (ns, name) in [
        ("split-provisioner", "pv-writer"),
        ("split-provisioner-volumes", "provision-svc"),
        ("split-provisioner-volumes", "reclaim-svc"),
    ] {
        let d = Api::<Deployment>::namespaced(client.clone(), ns)
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("Deployment {ns}/{name}: {e}"));
        let pod = d.spec.template.spec.unwrap();
        missing.extend(missing_references(&client, ns, name, &pod).await);
    }
    let redis = Api::<StatefulSet>::namespaced(client.clone(), "split-provisioner")
        .get("redis")
        .await
        .unwrap();
    let pod = redis.spec.template.spec.unwrap();
    missing.extend(missing_references(&client, "split-provisioner", "redis", &pod).await);
    assert!(missing.is_empty(), "{}", missing.join("\n"));
    let pdbs = Command::new("kubectl")
        .arg("--kubeconfig")
        .arg(cluster.admin_kubeconfig())
        .args([
            "get",
            "poddisruptionbudgets",
            "--all-namespaces",
            "-o",
            "name",
        ])
        .output()
        .unwrap();
    assert_eq!(
        String::from_utf8_lossy(&pdbs.stdout).lines().count(),
        3,
        "one PodDisruptionBudget per service: {}",
        String::from_utf8_lossy(&pdbs.stderr)
    );

    // Once per install: a second run stops at the Secrets and changes none.
    let (again, output) = run_install(cluster.admin_kubeconfig(), &block);
    assert!(!again, "a second run must not succeed:\n{output}");
    assert!(output.contains("already exists"), "{output}");
    assert_eq!(
        key,
        secret("split-provisioner-volumes", "split-provisioner-queue-key").await
    );
    assert_eq!(
        users,
        secret("split-provisioner-volumes", "split-provisioner-redis-users").await
    );
}
/// A Pod from `workload`'s pod template (a Deployment or StatefulSet as rendered), named
/// `<workload>-probe`; a StatefulSet's volumeClaimTemplates become claim volumes.
fn pod_of(workload: &Value) -> Pod {
    let mut spec = workload["spec"]["template"]["spec"].clone();
    for t in workload["spec"]["volumeClaimTemplates"]
        .as_array()
        .into_iter()
        .flatten()
    {
        let name = t["metadata"]["name"].clone();
        let volumes = spec["volumes"].as_array().cloned().unwrap_or_default();
        let mut volumes = volumes;
        volumes.push(json!({"name": name, "persistentVolumeClaim": {"claimName": name}}));
        spec["volumes"] = json!(volumes);
    }
    serde_json::from_value(json!({
        "metadata": {
            "name": format!("{}-probe", workload["metadata"]["name"].as_str().unwrap()),
            "namespace": workload["metadata"]["namespace"],
        },
        "spec": spec,
    }))
    .unwrap()
}

/// Pod Security admission on the deploy's two namespaces: every workload's pod (server dry
/// run of a Pod from its template) is admitted in its namespace on both versions, and a
/// privileged Pod in the `restricted` namespace is refused from 1.25 on (v1.37: enforced;
/// v1.19 has no Pod Security admission and admits it, which is why `deploy_manifests`
/// also checks the standards statically).
async fn pod_security_admits_the_deploys_pods_and_refuses_a_privileged_one(assets: Assets) {
    let test = "pod_security_admits_the_deploys_pods_and_refuses_a_privileged_one";
    if !kubectl_or_skip(test) {
        return;
    }
    let cluster = RealCluster::start(&assets, RealClusterOptions::default())
        .await
        .unwrap();
    let client = cluster.client();
    let objects = render(&repo_root().join("deploy/base"));
    let namespaces: Api<Namespace> = Api::all(client.clone());
    let mut restricted = Vec::new();
    for ns in objects.iter().filter(|o| o["kind"] == "Namespace") {
        let ns: Namespace = serde_json::from_value(ns.clone()).unwrap();
        let level =
            ns.metadata.labels.as_ref().unwrap()["pod-security.kubernetes.io/enforce"].clone();
        if level == "restricted" {
            restricted.push(ns.metadata.name.clone().unwrap());
        }
        namespaces
            .create(&PostParams::default(), &ns)
            .await
            .unwrap();
    }
    assert_eq!(
        restricted.len(),
        1,
        "one restricted namespace: {restricted:?}"
    );
    // The ServiceAccounts (with a token on v1.19, whose admission wants one).
    for sa in objects.iter().filter(|o| o["kind"] == "ServiceAccount") {
        cluster
            .service_account_kubeconfig(
                sa["metadata"]["namespace"].as_str().unwrap(),
                sa["metadata"]["name"].as_str().unwrap(),
            )
            .await
            .unwrap();
    }
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let mut admitted = Vec::new();
    for w in objects
        .iter()
        .filter(|o| o["kind"] == "Deployment" || o["kind"] == "StatefulSet")
    {
        let pod = pod_of(w);
        let ns = pod.metadata.namespace.clone().unwrap();
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        match pods.create(&dry_run, &pod).await {
            Ok(_) => admitted.push(format!("{ns}/{}", w["metadata"]["name"].as_str().unwrap())),
            Err(e) => panic!("{ns}: the pod of {} is refused: {e}", w["metadata"]["name"]),
        }
    }
    assert_eq!(admitted.len(), 4, "{admitted:?}");

    let privileged: Pod = serde_json::from_value(json!({
        "metadata": {"name": "privileged-probe"},
        "spec": {"containers": [{"name": "c", "image": "busybox",
                                 "securityContext": {"privileged": true}}]},
    }))
    .unwrap();
    let pods: Api<Pod> = Api::namespaced(client, &restricted[0]);
    let answer = pods.create(&dry_run, &privileged).await;
    match assets.version {
        KubeVersion::V1_19 => {
            answer.expect("v1.19 has no Pod Security admission");
        }
        KubeVersion::V1_37 => {
            let Err(kube::Error::Api(status)) = answer else {
                panic!(
                    "a privileged pod is admitted in {}: {answer:?}",
                    restricted[0]
                )
            };
            assert_eq!(status.code, 403, "{status:?}");
            assert!(
                status
                    .message
                    .contains("violates PodSecurity \"restricted:latest\"")
                    && status.message.contains("privileged"),
                "{status:?}"
            );
        }
    }
}

e2e::on_each_version!(
    every_overlay_and_example_is_accepted_by_the_real_server,
    the_production_install_in_the_deploy_readme_runs_on_the_real_server,
    pod_security_admits_the_deploys_pods_and_refuses_a_privileged_one,
);
