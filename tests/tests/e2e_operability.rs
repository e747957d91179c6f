//! What an operator's probes and logs show, with the real binaries, a real
//! `redis-server` and a control plane (each scenario on the simulator and on a
//! real kube-apiserver + kube-controller-manager v1.19):
//!
//! * Redis stopped: `/readyz` of provision-svc and pv-writer (whose work needs
//!   Redis) turns 503 and back to 200 once Redis returns, while `/healthz`
//!   stays 200 (a restart would not bring Redis back); claims made meanwhile
//!   are provisioned afterwards;
//! * `--log-format json`: the lines of one claim carry its `claim_uid` in both
//!   provision-svc's and pv-writer's output, so one claim can be followed
//!   across the services;
//! * provision-svc's workers wedged in a backend call that never returns (a
//!   FIFO as the nfs-subdir backend's volume record, blocking its read as a
//!   hung NFS mount would): `/healthz` turns 503 while claims wait, and 200
//!   again once the call returns;
//! * a claim deleted while its PV write is queued, pv-writer dropping the entry before
//!   provision-svc sees the deletion: the volume is still deleted;
//! * a claim deleted while its volume is made in background (the same FIFO,
//!   under `--provision-timeout`): its intent is cleaned up and no PV is ever
//!   made for it (the seed would provision it again).

use std::os::unix::fs::OpenOptionsExt as _;
use std::time::Duration;

use common::handoff::queue::PvQueue;
use e2e::harness::metrics::http_get;
use e2e::harness::{wait_until, ControlPlane, Service, ServiceSettings, System};
use e2e::on_both_planes;
use serde_json::Value;

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn system(plane: ControlPlane, configure: Option<fn(&mut ServiceSettings)>) -> System {
    let sys = System::started(plane, configure).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    sys
}

/// The status code of `path` on `service`'s replica 0 (0 when it does not answer).
async fn status(sys: &mut System, service: Service, path: &str) -> u16 {
    let addr = sys.service(service, 0).http_addr;
    http_get(addr, path).await.map(|(c, _)| c).unwrap_or(0)
}

async fn wait_status(sys: &mut System, service: Service, path: &str, want: u16) {
    let addr = sys.service(service, 0).http_addr;
    let r = wait_until(
        Duration::from_secs(20),
        &format!("{path} of {service:?} answers {want}"),
        || async move { http_get(addr, path).await.map(|(c, _)| c).unwrap_or(0) == want },
    )
    .await;
    check(sys, r);
}

async fn redis_outage_turns_readyz_false_and_back(plane: ControlPlane) {
    let mut sys = system(plane, None).await;
    sys.create_claims("before", 2, "hostpath").await.unwrap();
    check(&sys, sys.wait_provisioned(2, Duration::from_secs(60)).await);
    for s in [Service::Provision, Service::PvWriter, Service::Reclaim] {
        assert_eq!(status(&mut sys, s, "/readyz").await, 200, "{s:?} ready");
    }

    sys.redis.stop(false);
    for s in [Service::Provision, Service::PvWriter] {
        wait_status(&mut sys, s, "/readyz", 503).await;
    }
    // Not a stall: nothing for the kubelet to restart.
    for s in [Service::Provision, Service::PvWriter, Service::Reclaim] {
        assert_eq!(status(&mut sys, s, "/healthz").await, 200, "{s:?} healthy");
    }
    // Claims made while Redis is down wait for it.
    sys.create_claims("during", 2, "hostpath").await.unwrap();

    let restarted = sys.redis.restart(false).await;
    check(&sys, restarted);
    for s in [Service::Provision, Service::PvWriter] {
        wait_status(&mut sys, s, "/readyz", 200).await;
    }
    check(&sys, sys.wait_provisioned(4, Duration::from_secs(60)).await);
    sys.shutdown();
}

fn json_logs(settings: &mut ServiceSettings) {
    for s in [Service::Provision, Service::PvWriter] {
        settings
            .extra_args
            .push((s, vec!["--log-format".into(), "json".into()]));
    }
}

/// Whether `v` (an event line: its fields, its span and span list) has
/// `key` = `want` anywhere.
fn has_field(v: &Value, key: &str, want: &str) -> bool {
    match v {
        Value::Object(map) => map
            .iter()
            .any(|(k, x)| (k == key && x.as_str() == Some(want)) || has_field(x, key, want)),
        Value::Array(items) => items.iter().any(|x| has_field(x, key, want)),
        _ => false,
    }
}

/// The JSON lines of `service`'s log whose message is `message`.
fn lines_with_message(sys: &mut System, service: Service, message: &str) -> Vec<Value> {
    let text = sys.service(service, 0).process.log_text();
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|v| v["message"].as_str() == Some(message))
        .collect()
}

async fn json_logs_carry_the_claim_uid_in_both_services(plane: ControlPlane) {
    let mut sys = system(plane, Some(json_logs)).await;
    let uid = check(&sys, sys.create_claim("traced", "hostpath", &[]).await);
    let pv = check(
        &sys,
        sys.wait_pv_for_claim("traced", Duration::from_secs(60))
            .await,
    );
    let pv_name = pv.metadata.name.unwrap();
    let claim = format!("{}/traced", sys.namespace);

    // provision-svc: every line of the claim operation carries the claim's
    // fields (from its `claim` span).
    let started = lines_with_message(&mut sys, Service::Provision, "provision operation started");
    let ours: Vec<_> = started
        .iter()
        .filter(|v| has_field(v, "claim_uid", &uid))
        .collect();
    // One operation at least: a claim update racing the first sync (the
    // controller manager annotating it again) starts another, which finds the
    // PV queued.
    assert!(!ours.is_empty(), "{started:#?}\n{}", sys.log_tails(40));
    for line in &ours {
        assert!(has_field(line, "claim", &claim), "{line:#}");
        assert!(has_field(line, "class", "hostpath"), "{line:#}");
    }
    let queued = lines_with_message(
        &mut sys,
        Service::Provision,
        "volume provisioned; queueing the PV for pv-writer",
    );
    assert!(
        queued
            .iter()
            .any(|v| has_field(v, "claim_uid", &uid) && has_field(v, "pv", &pv_name)),
        "{queued:#?}"
    );

    // pv-writer: the write of the same claim's PV carries the same uid. The
    // line follows the PV's creation (after the event and the queue entry's
    // completion), so it may not be in the log yet when the PV is seen.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let written = loop {
        let written = lines_with_message(&mut sys, Service::PvWriter, "PV written");
        if written.iter().any(|v| has_field(v, "claim_uid", &uid))
            || std::time::Instant::now() >= deadline
        {
            break written;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let ours: Vec<_> = written
        .iter()
        .filter(|v| has_field(v, "claim_uid", &uid))
        .collect();
    assert_eq!(ours.len(), 1, "{written:#?}\n{}", sys.log_tails(40));
    assert!(has_field(ours[0], "pv", &pv_name), "{:#}", ours[0]);
    assert!(has_field(ours[0], "claim", &claim), "{:#}", ours[0]);
    assert!(has_field(ours[0], "class", "hostpath"), "{:#}", ours[0]);
    sys.shutdown();
}

/// provision-svc on the nfs-subdir backend with one worker and a 2 s stall timeout.
fn one_worker_short_stall_timeout(settings: &mut ServiceSettings) {
    settings.use_nfs_subdir();
    settings.extra_args.push((
        Service::Provision,
        vec![
            "--worker-threads=1".into(),
            "--healthz-stall-timeout=2s".into(),
        ],
    ));
}

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

/// Create claim `name` of the WaitForFirstConsumer `class` with its nfs-subdir
/// volume record made a FIFO, then select `node-1`: the backend's read of the
/// record blocks until [`unwedge`]. Returns the FIFO's path.
async fn wedged_claim(sys: &System, name: &str, class: &str) -> std::path::PathBuf {
    let uid = check(sys, sys.create_claim(name, class, &[]).await);
    let records = sys
        .base_dir()
        .join(backend_nfs_subdir::registry::REGISTRY_DIR)
        .join(backend_nfs_subdir::registry::VOLUMES_DIR);
    std::fs::create_dir_all(&records).unwrap();
    let fifo = records.join(format!("pvc-{uid}"));
    let c_path = std::ffi::CString::new(fifo.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: plain syscall with a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o600) }, 0, "mkfifo");
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: "node-1"}}});
    sys.claims_api()
        .patch(
            name,
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(&patch),
        )
        .await
        .unwrap();
    fifo
}

/// Let the backend's blocked read of `fifo` return (end of file) and remove it.
fn unwedge(fifo: &std::path::Path) {
    let writer = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(fifo)
        .expect("the backend holds the FIFO open for reading");
    std::fs::remove_file(fifo).unwrap();
    drop(writer);
}

async fn wedged_provision_workers_turn_healthz_503_and_back(plane: ControlPlane) {
    let mut sys = system(plane, Some(one_worker_short_stall_timeout)).await;
    sys.create_node("node-1").await.unwrap();
    sys.create_storage_class("wffc", "WaitForFirstConsumer", &[])
        .await
        .unwrap();
    let fifo = wedged_claim(&sys, "wedged", "wffc").await;
    // The only worker hangs in the backend; another claim waits untaken.
    sys.create_claim("waiting", "hostpath", &[]).await.unwrap();
    wait_status(&mut sys, Service::Provision, "/healthz", 503).await;
    let (_, body) = http_get(sys.service(Service::Provision, 0).http_addr, "/healthz")
        .await
        .unwrap();
    assert!(body.contains("work loop stalled"), "{body}");
    assert_eq!(status(&mut sys, Service::PvWriter, "/healthz").await, 200);

    // The call returns (end of file: a corrupt record, so that attempt
    // fails and is retried without the FIFO); the worker takes the next claim.
    unwedge(&fifo);
    wait_status(&mut sys, Service::Provision, "/healthz", 200).await;
    check(&sys, sys.wait_provisioned(2, Duration::from_secs(60)).await);
    sys.shutdown();
}

/// provision-svc on the nfs-subdir backend abandoning a backend call after
/// 2 s, and retrying a claim only after a minute.
fn short_provision_timeout(settings: &mut ServiceSettings) {
    settings.use_nfs_subdir();
    settings.retry_initial = Duration::from_secs(60);
    settings.retry_max = Duration::from_secs(60);
    let args = vec!["--provision-timeout=2s".into()];
    settings.extra_args.push((Service::Provision, args));
}

/// Wait (at most 40 s) until provision-svc's gauge `name` (read from Redis
/// every 5 s) is `want`.
async fn wait_gauge(sys: &mut System, name: &str, want: f64) {
    let addr = sys.service(Service::Provision, 0).http_addr;
    let r = wait_until(
        Duration::from_secs(40),
        &format!("{name} is {want}"),
        || async move {
            let page = e2e::harness::metrics::MetricsPage::scrape(addr).await.ok();
            page.and_then(|p| p.value(name, &[])) == Some(want)
        },
    )
    .await;
    check(sys, r);
}

async fn a_claim_deleted_while_in_background_is_cleaned_up_not_provisioned(plane: ControlPlane) {
    let mut sys = system(plane, Some(short_provision_timeout)).await;
    sys.create_node("node-1").await.unwrap();
    sys.create_storage_class("wffc", "WaitForFirstConsumer", &[("onDelete", "delete")])
        .await
        .unwrap();
    let fifo = wedged_claim(&sys, "abandoned", "wffc").await;
    // The attempt overruns --provision-timeout: abandoned, in background.
    wait_gauge(&mut sys, "provision_svc_claims_in_background", 1.0).await;
    // Unblock the abandoned read and drop the FIFO; let the abandoned call
    // end (it may still make the directory), then delete the claim.
    unwedge(&fifo);
    let base = sys.base_dir().to_path_buf();
    let made = || async { e2e::harness::system::count_dirs(&base) > 0 };
    // Not an error when none appears: the call may end without one.
    let _ = wait_until(
        Duration::from_secs(3),
        "the abandoned call made its directory",
        made,
    )
    .await;
    sys.delete_claims(&["abandoned".to_string()]).await.unwrap();
    wait_gauge(&mut sys, "provision_svc_intents", 0.0).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(
        sys.pvs().await.unwrap().is_empty(),
        "no PV for a claim deleted in background\n{}",
        sys.log_tails(40)
    );
    let left: Vec<_> = std::fs::read_dir(sys.base_dir())
        .unwrap()
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != backend_nfs_subdir::registry::REGISTRY_DIR)
        .collect();
    assert!(
        left.is_empty(),
        "no volume directory left: {left:?}\n{}",
        sys.log_tails(60)
    );
    sys.shutdown();
}

/// Leases that outlast the pauses below, so neither paused leader loses its term (and
/// its watch) meanwhile.
fn long_leases(settings: &mut ServiceSettings) {
    settings.lease_duration = Duration::from_secs(40);
    settings.renew_deadline = Duration::from_secs(30);
}

async fn a_claim_deleted_while_queued_keeps_no_volume_when_pv_writer_drops_it_first(
    plane: ControlPlane,
) {
    let mut sys = system(plane, Some(long_leases)).await;
    let queue = PvQueue::connect(&sys.redis.url(), &sys.settings.provisioner_name).await;
    let queue = &queue.unwrap();
    let depth_is =
        |want: u64| move || async move { queue.stats().await.is_ok_and(|s| s.depth == want) };
    // pv-writer stopped: the claim's volume is made and its PV write stays queued.
    let paused = sys.service(Service::PvWriter, 0).process.pause().await;
    check(&sys, paused);
    sys.create_claim("raced", "hostpath", &[]).await.unwrap();
    check(
        &sys,
        wait_until(Duration::from_secs(30), "the PV write queued", depth_is(1)).await,
    );
    assert_eq!(sys.dir_count(), 1, "{}", sys.log_tails(40));
    // provision-svc stopped before it sees the deletion; pv-writer drops the entry of the
    // gone claim (`claim_gone`) first.
    let paused = sys.service(Service::Provision, 0).process.pause().await;
    check(&sys, paused);
    sys.delete_claims(&["raced".to_string()]).await.unwrap();
    let gone = || async { sys.claims().await.is_ok_and(|c| c.is_empty()) };
    check(
        &sys,
        wait_until(Duration::from_secs(30), "the claim gone", gone).await,
    );
    sys.service(Service::PvWriter, 0)
        .process
        .signal(libc::SIGCONT);
    let dropped = wait_until(Duration::from_secs(30), "the entry dropped", depth_is(0)).await;
    check(&sys, dropped);
    // provision-svc then handles the deletion with no intent and no queued write left.
    sys.service(Service::Provision, 0)
        .process
        .signal(libc::SIGCONT);
    let removed = || async { sys.dir_count() == 0 };
    let r = wait_until(
        Duration::from_secs(30),
        "the volume directory removed",
        removed,
    )
    .await;
    check(&sys, r);
    assert!(sys.pvs().await.unwrap().is_empty(), "{}", sys.log_tails(40));
    sys.shutdown();
}

on_both_planes!(
    a_claim_deleted_while_in_background_is_cleaned_up_not_provisioned,
    a_claim_deleted_while_queued_keeps_no_volume_when_pv_writer_drops_it_first,
    redis_outage_turns_readyz_false_and_back,
    json_logs_carry_the_claim_uid_in_both_services,
    wedged_provision_workers_turn_healthz_503_and_back,
);
