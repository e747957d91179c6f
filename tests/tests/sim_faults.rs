//! Fault injection, request counters and the control endpoints, through the library API
//! and through the `k8s-sim` binary.
//!
//! Simulator-only, every test: injected 5xx/429 answers, hanging requests, added
//! latency, dropped watches, request statistics and the `/_sim/*` endpoints are
//! the simulator's own features, with no counterpart on a real kube-apiserver
//! (its API behaviour is compared with the real server's in `sim_conformance.rs`,
//! `sim_watch.rs`, `sim_controller.rs` and `sim_clients.rs`).

use e2e::sim::raw;
use e2e::sim::{FaultSpec, SimConfig, Simulator};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::time::{Duration, Instant};

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"}}
    }))
    .unwrap()
}

fn code(e: kube::Error) -> (u16, String) {
    match e {
        kube::Error::Api(s) => (s.code, s.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn error_faults_by_count_and_duration() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    sim.inject_fault(FaultSpec::error(500, &["create"], &["persistentvolumes"]).times(2));
    assert_eq!(
        code(
            pvs.create(&PostParams::default(), &pv("a"))
                .await
                .unwrap_err()
        ),
        (500, "InternalError".into())
    );
    assert_eq!(
        code(
            pvs.create(&PostParams::default(), &pv("a"))
                .await
                .unwrap_err()
        )
        .0,
        500
    );
    pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    // other verbs are unaffected
    sim.inject_fault(
        FaultSpec::error(500, &["list"], &[]).for_duration(Duration::from_millis(300)),
    );
    pvs.get("a").await.unwrap();
    assert_eq!(
        code(pvs.list(&ListParams::default()).await.unwrap_err()).0,
        500
    );
    tokio::time::sleep(Duration::from_millis(350)).await;
    pvs.list(&ListParams::default()).await.unwrap();
    // 503 (raw: kube's client retries 503/429 by itself)
    sim.inject_fault(FaultSpec::error(503, &["list"], &[]).times(1));
    let r = raw::request(sim.addr(), "GET", "/api/v1/persistentvolumes", None, b"")
        .await
        .unwrap();
    assert_eq!(
        (r.status, r.json()["reason"].as_str()),
        (503, Some("ServiceUnavailable"))
    );
    // 429 with Retry-After (raw HTTP to see the header)
    let id = sim.inject_fault(FaultSpec::error(429, &["get"], &["persistentvolumes"]));
    let r = raw::request(sim.addr(), "GET", "/api/v1/persistentvolumes/a", None, b"")
        .await
        .unwrap();
    assert_eq!(r.status, 429);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(r.json()["reason"], "TooManyRequests");
    assert_eq!(r.json()["kind"], "Status");
    sim.remove_fault(id);
    pvs.get("a").await.unwrap();
    let st = sim.stats();
    assert_eq!(st.faults_injected, 5);
    assert_eq!(st.count("create", "persistentvolumes"), 3);
}

#[tokio::test]
async fn hang_latency_and_drop_watches() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    sim.inject_fault(FaultSpec::hang(300, &["get"], &[]).times(1));
    pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    let t = Instant::now();
    pvs.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(300));
    let t = Instant::now();
    pvs.get("a").await.unwrap();
    assert!(t.elapsed() < Duration::from_millis(200));
    sim.set_latency(Duration::from_millis(100));
    let t = Instant::now();
    pvs.get("a").await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(100));
    sim.clear_faults();
    let mut w = futures::StreamExt::boxed(
        pvs.watch(&WatchParams::default().disable_bookmarks(), "0")
            .await
            .unwrap(),
    );
    assert!(matches!(
        futures::StreamExt::next(&mut w).await,
        Some(Ok(WatchEvent::Added(_)))
    ));
    sim.drop_watches();
    let end = tokio::time::timeout(Duration::from_secs(2), futures::StreamExt::next(&mut w))
        .await
        .unwrap();
    assert!(end.is_none(), "watch closed");
}

#[tokio::test]
async fn control_endpoints_over_http() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let a = sim.addr();
    let r = raw::request(
        a,
        "POST",
        "/_sim/faults",
        Some("application/json"),
        br#"{"verbs":["create"],"resources":["persistentvolumes"],"action":{"type":"error","code":500},"count":1}"#,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 201);
    let body = serde_json::to_vec(&pv("x")).unwrap();
    let r = raw::request(
        a,
        "POST",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 500);
    assert_eq!(r.json()["reason"], "InternalError");
    let r = raw::request(
        a,
        "POST",
        "/api/v1/persistentvolumes",
        Some("application/json"),
        &body,
    )
    .await
    .unwrap();
    assert_eq!(r.status, 201);
    raw::request(
        a,
        "POST",
        "/_sim/faults",
        Some("application/json"),
        br#"{"action":{"type":"error","code":503}}"#,
    )
    .await
    .unwrap();
    assert_eq!(
        raw::request(a, "GET", "/api/v1/persistentvolumes", None, b"")
            .await
            .unwrap()
            .status,
        503
    );
    assert_eq!(
        raw::request(a, "DELETE", "/_sim/faults", None, b"")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        raw::request(a, "GET", "/api/v1/persistentvolumes", None, b"")
            .await
            .unwrap()
            .status,
        200
    );
    let s = raw::request(a, "GET", "/_sim/stats", None, b"")
        .await
        .unwrap()
        .json();
    assert_eq!(s["by_resource"]["persistentvolumes"]["create"], 2);
    assert_eq!(s["by_verb"]["list"], 2);
    let o = raw::request(a, "GET", "/_sim/objects/persistentvolumes", None, b"")
        .await
        .unwrap()
        .json();
    assert_eq!(o["items"][0]["metadata"]["name"], "x");
    assert_eq!(o["items"][0]["kind"], "PersistentVolume");
    assert_eq!(
        raw::request(a, "POST", "/_sim/latency", None, br#"{"ms":0}"#)
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        raw::request(a, "POST", "/_sim/drop-watches", None, b"")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(
        raw::request(a, "DELETE", "/_sim/stats", None, b"")
            .await
            .unwrap()
            .status,
        200
    );
    assert_eq!(sim.stats().total, 0);
}

#[tokio::test]
async fn binary_serves_and_writes_kubeconfig() {
    use tokio::io::AsyncBufReadExt;
    let dir = tempfile::tempdir().unwrap();
    let kc = dir.path().join("kubeconfig");
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_k8s-sim"))
        .args(["--port", "0", "--kubeconfig-out"])
        .arg(&kc)
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    let mut lines = tokio::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let addr = tokio::time::timeout(Duration::from_secs(10), lines.next_line())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert!(addr.starts_with("127.0.0.1:"), "{addr}");
    for _ in 0..100 {
        if kc.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let kubeconfig = kube::config::Kubeconfig::read_from(&kc).unwrap();
    let cfg = kube::Config::from_custom_kubeconfig(kubeconfig, &Default::default())
        .await
        .unwrap();
    assert_eq!(cfg.cluster_url.to_string(), format!("http://{addr}/"));
    let client = kube::Client::try_from(cfg).unwrap();
    let pvs: Api<PersistentVolume> = Api::all(client);
    pvs.create(&PostParams::default(), &pv("via-binary"))
        .await
        .unwrap();
    let s = raw::request(addr.parse().unwrap(), "GET", "/_sim/stats", None, b"")
        .await
        .unwrap()
        .json();
    assert_eq!(s["by_resource"]["persistentvolumes"]["create"], 1);
    child.start_kill().unwrap();
    let _ = child.wait().await;
}

/// The services' control loop (`common::runtime::control`) after a run of
/// failing watches: back at the watcher's own pace (800 ms doubling, capped at
/// 2 s), not also held by `Controller`'s trigger backoff (800 ms doubling to
/// 30 s), which once kept provision-svc from seeing new claims for over a
/// minute after an API-server restart.
#[tokio::test]
async fn the_control_loop_recovers_from_failing_watches_at_the_watchers_pace() {
    use common::runtime::control::{self, LoopSettings};
    use kube::runtime::controller::Action;
    use std::sync::{Arc, Mutex};

    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let client = sim.client().unwrap();
    sim.inject_fault(FaultSpec::error(500, &["watch"], &["persistentvolumes"]).times(8));
    let (store, writer) = kube::runtime::reflector::store::<PersistentVolume>();
    let metrics = common::kube::workqueue_metrics::WorkQueueMetrics::new("volumes");
    let trigger = control::trigger(Api::all(client.clone()), writer, metrics.clone(), |_, _| {});
    let shutdown = tokio_util::sync::CancellationToken::new();
    let settings = LoopSettings {
        workers: 1,
        resync_period: Duration::ZERO,
        stall: Duration::from_secs(60),
        heartbeat: Default::default(),
        metrics,
        shutdown: shutdown.clone(),
        reconcile_all: None,
    };
    let seen = Arc::new(Mutex::new(Vec::<String>::new()));
    let reconcile = |pv: Arc<PersistentVolume>, seen: Arc<Mutex<Vec<String>>>| async move {
        seen.lock().unwrap().push(pv.metadata.name.clone().unwrap());
        Ok::<_, std::io::Error>(Action::await_change())
    };
    let policy = |_: Arc<PersistentVolume>, _: &std::io::Error, _| Action::await_change();
    let run = tokio::spawn(control::run(
        trigger,
        store,
        settings,
        reconcile,
        policy,
        seen.clone(),
    ));
    let started = Instant::now();
    while sim.stats().faults_injected < 8 {
        assert!(
            started.elapsed() < Duration::from_secs(40),
            "the watch is retried"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let pvs: Api<PersistentVolume> = Api::all(client);
    pvs.create(&PostParams::default(), &pv("after"))
        .await
        .unwrap();
    let created = Instant::now();
    while !seen.lock().unwrap().contains(&"after".to_string()) {
        assert!(
            created.elapsed() < Duration::from_secs(8),
            "a PV created after the failing watches is reconciled within the watcher's backoff"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    shutdown.cancel();
    run.await.unwrap();
}
