//! Operating it: the Grafana dashboard and the PrometheusRule alerts of
//! `deploy/components/servicemonitor` name only metrics the services really
//! export, and `provisioner-ctl status` reports the running system.
//!
//! The component is rendered with `kubectl kustomize` (base + servicemonitor),
//! the dashboard JSON is taken from its ConfigMap and every panel query,
//! template query and alert expression is scanned for metric names (a small
//! PromQL identifier scan: functions, aggregation keywords, label matchers,
//! `by (...)` label lists, range durations, strings and Grafana `$variables`
//! are skipped; `_bucket`/`_sum`/`_count` of a histogram count as the
//! histogram). Then the three service binaries run on a control plane through
//! a provisioning, a provisioning failure, a dead-lettered queue entry, an
//! orphaned volume, a failing delete and a reclaim — so every labelled family
//! has at least one series — and each `/metrics` page is scraped. The test
//! fails on any name no service exports (`up`, Prometheus' own scrape metric,
//! is the one exception).
//!
//! On the same run `provisioner-ctl status --output json` is checked: with pv-writer
//! stopped it shows the queue depth and the oldest pending age; after
//! pv-writer's restart it shows the garbled entry as a dead letter with its
//! reason, the orphan sweep's report, and the three Leases with the running
//! replicas as holders.
//!
//! Without `kubectl` the test is skipped with a message (a failure with `CI` set).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::Command as Process;
use std::time::Duration;

use common::handoff::queue::PvQueue;
use e2e::harness::{ControlPlane, Service, System, SystemOptions};
use e2e::on_both_planes;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::{json, Value};

// ---------------------------------------------------------------- PromQL scan

/// Keywords that are followed by a parenthesised *label* list.
const LABEL_LIST_KEYWORDS: &[&str] = &[
    "by",
    "without",
    "on",
    "ignoring",
    "group_left",
    "group_right",
];
/// Other PromQL keywords, aggregation operators (which may be followed by
/// `by (...)` instead of their argument) and literals: not metric names.
const KEYWORDS: &[&str] = &[
    "bool",
    "and",
    "or",
    "unless",
    "offset",
    "inf",
    "nan",
    "atan2",
    "sum",
    "min",
    "max",
    "avg",
    "group",
    "stddev",
    "stdvar",
    "count",
    "count_values",
    "bottomk",
    "topk",
    "quantile",
    "limitk",
    "limit_ratio",
];

/// Every metric name `expr` selects.
fn metric_names(expr: &str) -> BTreeSet<String> {
    let chars: Vec<char> = expr.chars().collect();
    let mut names = BTreeSet::new();
    let mut skip_next_paren = false;
    let mut i = 0;
    let skip_to = |i: &mut usize, close: char| {
        let mut quote: Option<char> = None;
        while *i < chars.len() {
            let c = chars[*i];
            match quote {
                Some(_) if c == '\\' => *i += 1,
                Some(q) if c == q => quote = None,
                Some(_) => {}
                None if c == '"' || c == '\'' || c == '`' => quote = Some(c),
                None if c == close => return,
                None => {}
            }
            *i += 1;
        }
    };
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':';
    while i < chars.len() {
        let c = chars[i];
        if c == '"' || c == '\'' || c == '`' {
            i += 1;
            let mut j = i;
            while j < chars.len() && chars[j] != c {
                if chars[j] == '\\' {
                    j += 1;
                }
                j += 1;
            }
            i = j + 1;
        } else if c == '{' {
            i += 1;
            skip_to(&mut i, '}');
            i += 1;
        } else if c == '[' {
            i += 1;
            skip_to(&mut i, ']');
            i += 1;
        } else if c == '(' && skip_next_paren {
            skip_next_paren = false;
            i += 1;
            skip_to(&mut i, ')');
            i += 1;
        } else if c == '$' {
            // Grafana variable: $name, ${name}, $__rate_interval.
            i += 1;
            if i < chars.len() && chars[i] == '{' {
                skip_to(&mut i, '}');
                i += 1;
            } else {
                while i < chars.len() && is_ident(chars[i]) {
                    i += 1;
                }
            }
        } else if c.is_ascii_digit()
            || (c == '.' && chars.get(i + 1).is_some_and(char::is_ascii_digit))
        {
            while i < chars.len() && (is_ident(chars[i]) || chars[i] == '.') {
                i += 1;
            }
        } else if is_ident(c) {
            let start = i;
            while i < chars.len() && is_ident(chars[i]) {
                i += 1;
            }
            let word: String = chars[start..i].iter().collect();
            let mut j = i;
            while j < chars.len() && chars[j].is_whitespace() {
                j += 1;
            }
            let lower = word.to_ascii_lowercase();
            if LABEL_LIST_KEYWORDS.contains(&lower.as_str()) {
                skip_next_paren = true;
            } else if chars.get(j) == Some(&'(') || KEYWORDS.contains(&lower.as_str()) {
                // A function or aggregation, or a keyword.
            } else {
                names.insert(word);
            }
        } else {
            i += 1;
        }
    }
    names
}

#[test]
fn promql_scan_finds_metrics_and_skips_the_rest() {
    let got = metric_names(
        r#"histogram_quantile(0.99, sum by (le, job) (rate(a_seconds_bucket{namespace="$namespace", job=~"x|y"}[$__rate_interval])))
           / on (job) group_left(pod) (b_total offset 5m) > bool 1e3 and max without (c) (d{l="}{"}) unless ${x} + e:recorded"#,
    );
    let want: BTreeSet<String> = ["a_seconds_bucket", "b_total", "d", "e:recorded"]
        .map(String::from)
        .into();
    assert_eq!(got, want);
}

/// `label_values(metric{...}, label)` of a Grafana template query → `metric`.
fn template_metric(query: &str) -> Option<String> {
    let rest = query.trim().strip_prefix("label_values(")?;
    let name: String = rest
        .chars()
        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
        .collect();
    (!name.is_empty()).then_some(name)
}

// ------------------------------------------------------------ the component

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// Whether `kubectl` runs; without it skip (with a message), or fail under `CI`.
fn kubectl_available(test: &str) -> bool {
    let ok = Process::new("kubectl")
        .args(["version", "--client"])
        .output()
        .is_ok_and(|o| o.status.success());
    if !ok {
        if std::env::var_os("CI").is_some() {
            panic!("{test}: kubectl is not on PATH, and CI is set");
        }
        eprintln!("SKIPPED {test}: kubectl is not on PATH (set CI=1 to make this a failure)");
    }
    ok
}

/// The objects of `kubectl kustomize` of base + the servicemonitor component.
fn render_monitoring() -> Vec<Value> {
    let tmp = tempfile::tempdir().unwrap();
    let up = "../".repeat(tmp.path().components().count() - 1);
    let root = repo_root().canonicalize().unwrap();
    let rel = |p: &str| {
        format!(
            "{up}{}",
            root.join(p).to_string_lossy().trim_start_matches('/')
        )
    };
    std::fs::write(
        tmp.path().join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\nresources:\n  - {}\ncomponents:\n  - {}\n",
            rel("deploy/base"),
            rel("deploy/components/servicemonitor")
        ),
    )
    .unwrap();
    let out = Process::new("kubectl")
        .arg("kustomize")
        .arg(tmp.path())
        .output()
        .expect("running kubectl");
    assert!(
        out.status.success(),
        "kubectl kustomize failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    serde_yaml::Deserializer::from_str(&text)
        .map(|d| <Value as serde::Deserialize>::deserialize(d).unwrap())
        .filter(|v| !v.is_null())
        .collect()
}

/// What the dashboard and the alerts query: (where, expression) pairs, and
/// the alert names.
struct Monitoring {
    queries: Vec<(String, String)>,
    alerts: Vec<String>,
}

fn monitoring() -> Monitoring {
    let objects = render_monitoring();
    let find = |kind: &str, name: &str| {
        objects
            .iter()
            .find(|o| o["kind"] == kind && o["metadata"]["name"] == name)
            .unwrap_or_else(|| panic!("no {kind} {name} rendered"))
            .clone()
    };
    let cm = find("ConfigMap", "split-provisioner-dashboard");
    assert_eq!(
        cm["metadata"]["labels"]["grafana_dashboard"], "1",
        "the Grafana sidecar label"
    );
    assert_eq!(cm["metadata"]["namespace"], "split-provisioner");
    let dashboard: Value = serde_json::from_str(
        cm["data"]["split-provisioner.json"]
            .as_str()
            .expect("dashboard JSON in the ConfigMap"),
    )
    .expect("dashboard is JSON");
    let mut queries = Vec::new();
    fn walk(v: &Value, path: &str, out: &mut Vec<(String, String)>) {
        match v {
            Value::Object(m) => {
                if let Some(Value::String(e)) = m.get("expr") {
                    out.push((path.to_string(), e.clone()));
                }
                for (k, child) in m {
                    let title = m.get("title").and_then(Value::as_str).unwrap_or(k);
                    walk(child, &format!("{path}/{title}"), out);
                }
            }
            Value::Array(a) => a.iter().for_each(|c| walk(c, path, out)),
            _ => {}
        }
    }
    walk(&dashboard["panels"], "dashboard", &mut queries);
    let vars = dashboard["templating"]["list"].as_array().unwrap();
    let var_names: Vec<&str> = vars.iter().filter_map(|v| v["name"].as_str()).collect();
    for want in ["datasource", "namespace", "job"] {
        assert!(
            var_names.contains(&want),
            "template variable {want}: {var_names:?}"
        );
    }
    for v in vars {
        if let Some(q) = v["query"]["query"].as_str() {
            let m = template_metric(q).unwrap_or_else(|| panic!("template query {q}"));
            queries.push((format!("dashboard/variable {}", v["name"]), m));
        }
    }
    assert!(queries.len() > 20, "dashboard queries: {queries:?}");
    for (where_, e) in &queries {
        if where_.starts_with("dashboard/") && !where_.contains("variable") {
            assert!(
                e.contains("namespace=\"$namespace\"") && e.contains("job=~\"$job\""),
                "{where_}: query not filtered by $namespace/$job: {e}"
            );
        }
    }

    let rule = find("PrometheusRule", "split-provisioner");
    assert_eq!(rule["metadata"]["namespace"], "split-provisioner");
    let mut alerts = Vec::new();
    for group in rule["spec"]["groups"].as_array().unwrap() {
        for r in group["rules"].as_array().unwrap() {
            let name = r["alert"]
                .as_str()
                .expect("alerting rules only")
                .to_string();
            for key in ["summary", "description", "runbook"] {
                assert!(
                    r["annotations"][key]
                        .as_str()
                        .is_some_and(|s| !s.is_empty()),
                    "alert {name} lacks annotation {key}"
                );
            }
            let runbook = r["annotations"]["runbook"].as_str().unwrap();
            assert!(runbook.contains(&name), "alert {name}: runbook {runbook}");
            queries.push((
                format!("alert {name}"),
                r["expr"].as_str().unwrap().to_string(),
            ));
            alerts.push(name);
        }
    }
    Monitoring { queries, alerts }
}

/// Every alert has its runbook section in deploy/README.md.
#[test]
fn every_alert_has_a_runbook_section() {
    if !kubectl_available("every_alert_has_a_runbook_section") {
        return;
    }
    let m = monitoring();
    for want in [
        "SplitProvisionerServiceDown",
        "SplitProvisionerNoLeader",
        "SplitProvisionerDeadLetters",
        "SplitProvisionerPendingWriteTooOld",
        "SplitProvisionerProvisioningFailureRatioHigh",
        "SplitProvisionerOrphanVolumes",
        "SplitProvisionerRedisUnreachable",
    ] {
        assert!(
            m.alerts.iter().any(|a| a == want),
            "alert {want} missing: {:?}",
            m.alerts
        );
    }
    let readme = std::fs::read_to_string(repo_root().join("deploy/README.md")).unwrap();
    let runbook = readme
        .split_once("## Runbook")
        .expect("deploy/README.md has a Runbook section")
        .1;
    for a in &m.alerts {
        assert!(
            runbook.contains(&format!("### {a}")),
            "no runbook entry ### {a}"
        );
    }
}

// ------------------------------------------------------------- the system

/// Sample and family names of a text exposition page: (samples, histograms).
fn exported(text: &str) -> (BTreeSet<String>, BTreeSet<String>) {
    let mut samples = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split_whitespace();
            if let (Some(name), Some("histogram" | "summary")) = (it.next(), it.next()) {
                histograms.insert(name.to_string());
            }
        } else if !line.starts_with('#') && !line.trim().is_empty() {
            let name: String = line
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_' || *c == ':')
                .collect();
            samples.insert(name);
        }
    }
    (samples, histograms)
}

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

/// The kubeconfig an operator would use: admin on a real plane.
fn operator_kubeconfig(sys: &System) -> PathBuf {
    match sys.real() {
        Some(r) => r.cluster.admin_kubeconfig().to_path_buf(),
        None => sys.settings.kubeconfig.clone(),
    }
}

/// `provisioner-ctl status --output json` against the system; (exit success, JSON).
fn status_json(sys: &System) -> (bool, Value) {
    let out = Process::new(&sys.bins.ctl)
        .args(["status", "--output", "json"])
        .arg("--redis-url")
        .arg(sys.redis.url())
        .arg("--provisioner-name")
        .arg(&sys.settings.provisioner_name)
        .arg("--kubeconfig")
        .arg(operator_kubeconfig(sys))
        // No --leader-election-namespace: as an operator runs it, the command
        // finds each service's Lease by name (the deploy keeps them in two
        // namespaces).
        .env_remove("POD_NAMESPACE")
        .output()
        .expect("running provisioner-ctl status");
    let stdout = String::from_utf8_lossy(&out.stdout);
    let json = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "status output is not JSON ({e}):\n{stdout}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.success(), json)
}

async fn wait_until<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !f().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

async fn dashboard_alerts_and_status_match_the_running_services(plane: ControlPlane) {
    if !kubectl_available("dashboard_alerts_and_status_match_the_running_services") {
        return;
    }
    let wanted = monitoring();
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        ..Default::default()
    })
    .await
    .expect("system starts");
    let r = sys.wait_leaders(Duration::from_secs(30)).await;
    check(&sys, r);
    let queue = PvQueue::connect(&sys.redis.url(), &sys.settings.provisioner_name)
        .await
        .unwrap();
    let queue = &queue;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    sys.create_storage_class("bad", "Immediate", &[("path", "/etc")])
        .await
        .unwrap();

    // pv-writer down: a provisioned claim and a garbled entry stay pending.
    sys.kill(Service::PvWriter, 0);
    sys.create_claim("data", "hostpath", &[]).await.unwrap();
    wait_until(
        "the claim's PV queued",
        Duration::from_secs(30),
        move || async move { queue.stats().await.is_ok_and(|s| s.depth == 1) },
    )
    .await;
    queue
        .enqueue_raw("pvc-garbled", b"{ not a queue entry")
        .await
        .unwrap();
    sys.create_claim("broken", "bad", &[]).await.unwrap();
    tokio::time::sleep(Duration::from_millis(1500)).await;

    let (ok, s) = status_json(&sys);
    assert!(ok, "status reports no error: {s:#}");
    let p = &s["provisioners"][0];
    assert_eq!(
        p["provisioner_name"],
        sys.settings.provisioner_name.as_str()
    );
    assert_eq!(p["queue"]["depth"], 2, "{s:#}");
    assert!(
        p["queue"]["oldest_pending_age_seconds"].as_f64().unwrap() >= 1.0,
        "{s:#}"
    );
    assert_eq!(p["queue"]["dead_letters"], json!([]), "{s:#}");
    assert!(p["queue"]["current_term"].as_u64().unwrap() >= 1, "{s:#}");

    // pv-writer back: the claim's PV is written, the garbled entry dead-lettered.
    let r = sys.restart(Service::PvWriter, 0).await;
    check(&sys, r);
    let r = sys
        .wait_leader(Service::PvWriter, Duration::from_secs(30))
        .await;
    check(&sys, r);
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    wait_until(
        "the garbled entry dead-lettered",
        Duration::from_secs(30),
        move || async move {
            queue
                .stats()
                .await
                .is_ok_and(|s| s.depth == 0 && s.dead == 1)
        },
    )
    .await;

    // An orphaned volume, found by the sweep of a new reclaim-svc leader.
    std::fs::create_dir(sys.base_dir().join("pvc-orphaned-by-test")).unwrap();
    let r = sys.restart(Service::Reclaim, 0).await;
    check(&sys, r);
    let r = sys
        .wait_leader(Service::Reclaim, Duration::from_secs(30))
        .await;
    check(&sys, r);
    let reclaim_addr = sys.service(Service::Reclaim, 0).http_addr;
    wait_until(
        "the orphan sweep",
        Duration::from_secs(30),
        move || async move {
            e2e::harness::MetricsPage::scrape(reclaim_addr)
                .await
                .is_ok_and(|m| m.value("reclaim_orphan_volumes", &[]) == Some(1.0))
        },
    )
    .await;

    let (ok, s) = status_json(&sys);
    let p = &s["provisioners"][0];
    assert!(ok, "status reports no error: {s:#}");
    assert_eq!(p["queue"]["depth"], 0, "{s:#}");
    let dead = p["queue"]["dead_letters"].as_array().unwrap();
    assert_eq!(dead.len(), 1, "{s:#}");
    assert_eq!(dead[0]["pv_name"], "pvc-garbled");
    assert!(
        !dead[0]["reason"].as_str().unwrap().is_empty(),
        "a dead letter has its reason: {s:#}"
    );
    assert_eq!(
        p["orphan_report"]["orphans"],
        json!(["pvc-orphaned-by-test"]),
        "{s:#}"
    );
    let leases = p["leases"].as_array().unwrap();
    assert_eq!(leases.len(), 3, "{s:#}");
    for (lease, service) in leases.iter().zip(Service::ALL) {
        assert_eq!(lease["service"], service.binary_name(), "{s:#}");
        assert_eq!(
            lease["name"],
            service.lease_name(&sys.settings.provisioner_name).as_str()
        );
        let holder = sys.lease_holder(service).await;
        assert!(holder.is_some(), "{service:?} has a leader");
        assert_eq!(lease["holder"].as_str(), holder.as_deref(), "{s:#}");
        assert_eq!(lease["expired"], false, "{s:#}");
    }

    // A released PV whose volume reclaim-svc refuses to delete (outside the base dir).
    let foreign: PersistentVolume = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": "pvc-foreign", "annotations": {
            "pv.kubernetes.io/provisioned-by": sys.settings.provisioner_name}},
        "spec": {
            "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": "hostpath",
            "hostPath": {"path": "/nonexistent-outside-base/pvc-foreign"},
            "claimRef": {"namespace": sys.namespace, "name": "ghost", "uid": "00000000-0000-0000-0000-000000000001"}
        }
    }))
    .unwrap();
    let pvs = Api::<PersistentVolume>::all(sys.client.clone());
    pvs.create(&PostParams::default(), &foreign).await.unwrap();
    // Its claim never existed: Released, as the PV controller would find it.
    pvs.patch_status(
        "pvc-foreign",
        &PatchParams::default(),
        &Patch::Merge(json!({"status": {"phase": "Released"}})),
    )
    .await
    .unwrap();
    sys.delete_claims(&["data".into(), "broken".into()])
        .await
        .unwrap();
    let reclaim_addr = sys.service(Service::Reclaim, 0).http_addr;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let m = check(&sys, e2e::harness::MetricsPage::scrape(reclaim_addr).await);
        let (ok, failed) = (
            m.sum("controller_persistentvolume_delete_total"),
            m.sum("controller_persistentvolume_delete_failed_total"),
        );
        if ok >= 1.0 && failed >= 1.0 {
            break;
        }
        if tokio::time::Instant::now() > deadline {
            let foreign = pvs.get_opt("pvc-foreign").await;
            panic!(
                "no reclaim and failed delete: deleted {ok}, failed {failed}; foreign PV {foreign:?}\n{}",
                sys.log_tails(30)
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    // Let each service's periodic gauges tick once more.
    tokio::time::sleep(Duration::from_secs(6)).await;

    let mut samples = BTreeSet::new();
    let mut histograms = BTreeSet::new();
    for p in &sys.services {
        let page = check(&sys, p.metrics().await);
        let (s, h) = exported(&page.text);
        samples.extend(s);
        histograms.extend(h);
    }
    let mut missing = BTreeSet::new();
    for (where_, expr) in &wanted.queries {
        for name in metric_names(expr) {
            let base = ["_bucket", "_sum", "_count"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| histograms.contains(*b));
            let known = name == "up" || samples.contains(&name) || base.is_some();
            if !known {
                missing.insert(format!("{name} (used by {where_})"));
            }
        }
    }
    assert!(
        missing.is_empty(),
        "{} metric name(s) used by the dashboard or alerts are exported by no service:\n  {}\nexported: {samples:?}",
        missing.len(),
        missing.into_iter().collect::<Vec<_>>().join("\n  ")
    );
    sys.shutdown();
}

on_both_planes!(dashboard_alerts_and_status_match_the_running_services);
