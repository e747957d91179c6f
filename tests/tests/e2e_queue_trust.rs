//! End-to-end trust in the PV-write queue with the real binaries and a real
//! `redis-server` (AOF, `appendfsync always`):
//! * entries written into Redis behind provision-svc's back (unsigned, or
//!   signed with a guessed key) are refused: dead-lettered with their payload
//!   kept, a Warning `ProvisioningFailed` event on the claim they name,
//!   `pv_writer_refused_entries_total{reason}`, and no PV;
//! * Redis SIGKILLed inside its fsync window during a burst of claims and
//!   restarted on the same data directory: every claim still ends Bound with
//!   exactly one volume, nothing is stranded in the queue or the intents;
//! * the pv-writer leader SIGSTOPped mid-drain: the standby takes over and
//!   drains; after SIGCONT the old leader moves no entry, and each claim gets
//!   its PV once and exactly one `ProvisioningSucceeded` (the Event is named
//!   after the claim uid and reason, so a repeated announcement is refused).
//!
//! Each scenario runs on every plane (`<scenario>::sim`, `<scenario>::real_v1_19`, `::real_v1_37`): on the
//! API-server simulator and on a real kube-apiserver + kube-controller-manager
//! v1.19 with the deploy's RBAC (skipped with one line without the binaries,
//! a failure under `CI=true`: see `e2e::realkube::assets_or_skip`).
//!
//! The faults must land mid-burst. On the simulator every API request is
//! slowed down (`SimHandle::set_latency`, simulator-only); a real API server
//! cannot be slowed, so on the real plane the service under test gets a
//! client-side rate limit instead (`--kube-api-qps` with `--kube-api-burst=1`,
//! client-go's token bucket), which stretches the burst the same way.

use std::time::Duration;

use common::handoff::intents::IntentStore;
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use e2e::harness::{pv_writer, wait_eq, ControlPlane, Service, System, SystemOptions};
use e2e::on_both_planes;

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

/// Slow every API request down when running on the simulator, so a burst is
/// still in progress when the fault lands (the real plane uses [`throttle`]).
fn slow_api(sys: &System, d: Duration) {
    if let Some(sim) = &sys.sim {
        sim.set_latency(d);
    }
}

/// On a real plane, limit `service` to `qps` API requests per second with a
/// burst of one: the real-plane stand-in for [`slow_api`], set before the
/// service starts. No change on the simulator.
fn throttle(sys: &mut System, service: Service, qps: f64) {
    if sys.is_real() {
        sys.settings.kube_api_qps_of.insert(service, qps);
        sys.settings
            .extra_args
            .push((service, vec!["--kube-api-burst=1".into()]));
    }
}

async fn queue_and_intents(sys: &System) -> (PvQueue, IntentStore) {
    let url = sys.redis.url();
    let name = &sys.settings.provisioner_name;
    (
        PvQueue::connect(&url, name).await.unwrap(),
        IntentStore::connect(&url, name).await.unwrap(),
    )
}

/// `n` PVs, one per claim (distinct claim uids, each PV named `pvc-<uid>`),
/// every claim Bound, `n` directories, and exactly `n` ProvisioningSucceeded
/// events, one on each claim.
async fn assert_each_claim_once(sys: &System, n: usize) {
    check(sys, sys.wait_provisioned(n, Duration::from_secs(90)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pvs = sys.pvs().await.unwrap();
    assert_eq!(pvs.len(), n);
    let mut uids: Vec<String> = pvs
        .iter()
        .map(|pv| {
            let uid = pv
                .spec
                .as_ref()
                .and_then(|s| s.claim_ref.as_ref())
                .and_then(|r| r.uid.clone())
                .expect("claimRef uid");
            assert_eq!(
                pv.metadata.name.as_deref(),
                Some(format!("pvc-{uid}").as_str())
            );
            uid
        })
        .collect();
    uids.sort();
    uids.dedup();
    assert_eq!(uids.len(), n, "one PV per claim");
    assert_eq!(sys.dir_count(), n, "one directory per claim");
    check(
        sys,
        sys.wait_objects_with_event("ProvisioningSucceeded", n, Duration::from_secs(10))
            .await,
    );
}

async fn forged_queue_entries_are_refused_and_dead_lettered(plane: ControlPlane) {
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        ..Default::default()
    })
    .await
    .expect("system starts");
    let leaders = sys.wait_leaders(Duration::from_secs(30)).await;
    check(&sys, leaders);
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let provisioner = sys.settings.provisioner_name.clone();
    let (queue, _) = queue_and_intents(&sys).await;

    // What anyone holding Redis credentials can write, bypassing provision-svc:
    // a hostPath of / bound to a claim of their choosing, once unsigned and once
    // signed with a key they made up.
    let forge = |uid: &str| {
        let mut e = pv_writer::entry(uid);
        let spec = e.pv.spec.as_mut().unwrap();
        spec.host_path.as_mut().unwrap().path = "/".into();
        spec.storage_class_name = Some("hostpath".into());
        e.class = "hostpath".into();
        e
    };
    let unsigned = forge("forged-unsigned");
    let mut guessed = forge("forged-guessed");
    QueueKey::from_bytes(&[b'x'; 32])
        .unwrap()
        .sign(&provisioner, &mut guessed);
    for e in [&unsigned, &guessed] {
        queue.enqueue_raw(e.pv_name(), &e.encode()).await.unwrap();
    }
    // A genuine claim next to them is provisioned as usual.
    sys.create_claims("genuine", 1, "hostpath").await.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(60)).await);

    check(
        &sys,
        wait_eq(Duration::from_secs(30), "dead letters", 2, || async {
            Ok(queue.list_dead().await?.len())
        })
        .await,
    );
    let mut dead = queue.list_dead().await.unwrap();
    dead.sort_by(|a, b| a.pv_name.cmp(&b.pv_name));
    let got: Vec<_> = dead
        .iter()
        .map(|d| (d.pv_name.as_str(), d.reason.as_str()))
        .collect();
    assert!(
        got[0].0 == "pvc-forged-guessed" && got[0].1.contains("signature does not match"),
        "{got:?}"
    );
    assert!(
        got[1].0 == "pvc-forged-unsigned" && got[1].1.contains("not signed"),
        "{got:?}"
    );
    for (name, _) in &got {
        assert!(
            queue.payload(name).await.unwrap().is_some(),
            "{name}: a refused entry is kept for the operator"
        );
    }
    let stats = queue.stats().await.unwrap();
    assert_eq!((stats.depth, stats.dead), (0, 2), "{stats:?}");

    // No PV for either, only the genuine one.
    let pvs = sys.pvs().await.unwrap();
    assert_eq!(pvs.len(), 1);
    assert!(pvs[0]
        .metadata
        .name
        .as_deref()
        .is_some_and(|n| !n.starts_with("pvc-forged")));

    // A Warning ProvisioningFailed on each claim the forged entries name.
    let warned = || async {
        let mut names: Vec<String> = sys
            .event_values()
            .await?
            .iter()
            .filter(|e| e["reason"] == "ProvisioningFailed" && e["type"] == "Warning")
            .filter_map(|e| e["regarding"]["name"].as_str().map(String::from))
            .collect();
        names.sort();
        Ok(names)
    };
    check(
        &sys,
        wait_eq(
            Duration::from_secs(20),
            "claims warned about",
            vec![
                "claim-forged-guessed".to_string(),
                "claim-forged-unsigned".to_string(),
            ],
            warned,
        )
        .await,
    );

    // The refusals are counted by reason on the leader that refused them.
    let leader = sys
        .wait_leader(Service::PvWriter, Duration::from_secs(20))
        .await;
    let leader = check(&sys, leader);
    let metrics = sys.service(Service::PvWriter, leader).metrics().await;
    let metrics = check(&sys, metrics);
    for reason in ["unsigned", "bad_signature"] {
        assert_eq!(
            metrics.value("pv_writer_refused_entries_total", &[("reason", reason)]),
            Some(1.0),
            "{reason}"
        );
    }
}

async fn redis_sigkilled_in_the_fsync_window_strands_no_claim(plane: ControlPlane) {
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        // A short resync brings back a claim whose acknowledged enqueue the
        // crash lost (the seed's informer resync, here 2 s instead of 15 min).
        configure: Some(|s| {
            s.extra_args.push((
                Service::Provision,
                vec!["--resync-period".into(), "2s".into()],
            ))
        }),
        no_services: true,
        ..Default::default()
    })
    .await
    .expect("system starts");
    // Real plane: provision-svc at 20 requests/s keeps the burst going for
    // seconds, as the simulator's 10 ms per request does.
    throttle(&mut sys, Service::Provision, 20.0);
    for service in Service::ALL {
        let started = sys.start_service(service, 0).await;
        check(&sys, started);
    }
    let leaders = sys.wait_leaders(Duration::from_secs(30)).await;
    check(&sys, leaders);
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    slow_api(&sys, Duration::from_millis(10));
    let n = 60;
    sys.create_claims("burst", n, "hostpath").await.unwrap();
    // SIGKILL Redis while the burst is being provisioned and queued: commands in
    // flight get no answer, and their claims are provisioned again.
    // Five directories: early enough that even on the simulator's 10 ms per
    // request the burst is far from done when the signal lands (at 10 it
    // sometimes had 50 of 60 made).
    let started = || async { Ok(sys.dir_count() >= 5) };
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "burst under way", true, started).await,
    );
    let before = sys.dir_count();
    sys.redis.restart(true).await.expect("Redis restarts");
    let plane = if sys.is_real() { "real" } else { "sim" };
    eprintln!("{plane}: Redis SIGKILLed with {before} of {n} directories made");
    assert!(before < n, "the crash landed mid-burst");
    slow_api(&sys, Duration::ZERO);

    assert_each_claim_once(&sys, n).await;
    let (queue, intents) = queue_and_intents(&sys).await;
    check(
        &sys,
        wait_eq(
            Duration::from_secs(20),
            "(pending, dead, intents)",
            (0, 0, 0),
            || async {
                let stats = queue.stats().await?;
                Ok((stats.depth, stats.dead, intents.count().await? as u64))
            },
        )
        .await,
    );
}

async fn a_stopped_pv_writer_leader_moves_nothing_after_the_standby_took_over(plane: ControlPlane) {
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        no_services: true,
        ..Default::default()
    })
    .await
    .expect("system starts");
    // Two writer workers and a slow API keep the drain long enough (seconds)
    // for the SIGSTOP to land mid-drain on a loaded machine; with the default
    // 16 workers the whole batch was sometimes written before the signal.
    // The simulator slows every request by 100 ms; on the real plane both
    // pv-writer replicas are limited to 10 requests/s instead (a PV create and
    // its Event per claim: about 5 claims/s, 60 claims in ~12 s).
    sys.settings
        .extra_args
        .push((Service::PvWriter, vec!["--worker-threads=2".into()]));
    throttle(&mut sys, Service::PvWriter, 10.0);
    for (service, replica) in [
        (Service::Provision, 0),
        (Service::Reclaim, 0),
        (Service::PvWriter, 0),
        (Service::PvWriter, 1),
    ] {
        let started = sys.start_service(service, replica).await;
        check(&sys, started);
    }
    let leaders = sys.wait_leaders(Duration::from_secs(30)).await;
    check(&sys, leaders);
    let leader = sys
        .wait_leader(Service::PvWriter, Duration::from_secs(20))
        .await;
    let old = check(&sys, leader);
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    slow_api(&sys, Duration::from_millis(100));
    let n = 60;
    sys.create_claims("fence", n, "hostpath").await.unwrap();
    let (queue, _) = queue_and_intents(&sys).await;
    let term_before = queue.current_term().await.unwrap();
    let mid_drain = || async { Ok(sys.pvs().await?.len() >= 5) };
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "drain under way", true, mid_drain).await,
    );
    sys.service(Service::PvWriter, old)
        .process
        .signal(libc::SIGSTOP);
    let written_at_stop = sys.pvs().await.unwrap().len();
    let plane = if sys.is_real() { "real" } else { "sim" };
    eprintln!("{plane}: SIGSTOPped pv-writer-{old} with {written_at_stop} of {n} PVs written");
    assert!(written_at_stop < n, "stopped mid-drain");

    // The standby takes the Lease and drains everything, including what the
    // stopped leader had in flight.
    let standby = 1 - old;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let holder = sys.lease_holder(Service::PvWriter).await;
        if holder.as_deref() == Some(sys.service(Service::PvWriter, standby).identity().as_str()) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "standby never took the Lease\n{}",
            sys.log_tails(40)
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    slow_api(&sys, Duration::ZERO);
    assert_each_claim_once(&sys, n).await;
    assert!(
        queue.current_term().await.unwrap() > term_before,
        "a new term began"
    );
    let fenced_before = queue.fenced_operations().await.unwrap();

    // Wake the old leader: whatever it still had in flight is refused.
    sys.service(Service::PvWriter, old)
        .process
        .signal(libc::SIGCONT);
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_each_claim_once(&sys, n).await;
    let stats = queue.stats().await.unwrap();
    assert_eq!(
        (stats.depth, stats.dead),
        (0, 0),
        "no entry moved back or dead-lettered"
    );
    assert!(queue.fenced_operations().await.unwrap() >= fenced_before);
    // Exactly one ProvisioningSucceeded per claim, also for the announcements
    // the old leader had in flight when it was stopped and the standby made
    // again: the Event is named after the claim uid and reason
    // (common::kube::events::EventSink::publish_once), so the second create is an
    // AlreadyExists, not a second Event.
    let events = sys.events("ProvisioningSucceeded").await.unwrap();
    assert_eq!(
        events, n,
        "{events} ProvisioningSucceeded events for {n} claims"
    );
    eprintln!("ProvisioningSucceeded events: {events} for {n} claims");
    eprintln!(
        "refused stale operations: {}",
        queue.fenced_operations().await.unwrap()
    );
}

/// What provision-svc's own Redis user can do: put any payload under a claim's
/// PV name before provision-svc queues the real one. pv-writer dead-letters
/// it; provision-svc does not take it for "already queued" but warns on the
/// claim, naming the operator action, counts it, and retries; once the stray
/// entry is removed the claim is provisioned.
async fn a_stray_payload_under_a_claims_pv_name_is_a_warning_not_a_silent_stall(
    plane: ControlPlane,
) {
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        no_services: true,
        ..Default::default()
    })
    .await
    .expect("system starts");
    let started = sys.start_service(Service::PvWriter, 0).await;
    check(&sys, started);
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let names = sys.create_claims("stray", 1, "hostpath").await.unwrap();
    let claim = sys.claims_api().get(&names[0]).await.unwrap();
    let pv = format!("pvc-{}", claim.metadata.uid.unwrap());
    let (queue, _) = queue_and_intents(&sys).await;
    assert!(
        queue
            .enqueue_raw(&pv, b"{ not a queue entry")
            .await
            .unwrap()
            .added
    );
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "dead letters", 1, || async {
            Ok(queue.list_dead().await?.len())
        })
        .await,
    );
    let started = sys.start_service(Service::Provision, 0).await;
    check(&sys, started);
    let warned = || async {
        Ok(sys
            .event_values()
            .await?
            .iter()
            .filter(|e| {
                e["regarding"]["name"] == names[0].as_str()
                    && e["reason"] == "ProvisioningFailed"
                    && e["type"] == "Warning"
                    && e["note"].as_str().is_some_and(|n| {
                        n.contains("dead-lettered") && n.contains("provisioner-ctl queue")
                    })
            })
            .count()
            > 0)
    };
    check(
        &sys,
        wait_eq(
            Duration::from_secs(30),
            "a Warning naming the operator action",
            true,
            warned,
        )
        .await,
    );
    let metrics = sys.service(Service::Provision, 0).metrics().await;
    let metrics = check(&sys, metrics);
    assert!(
        metrics
            .value(
                "provision_svc_stalled_queue_entries_total",
                &[("reason", "dead_lettered")]
            )
            .is_some_and(|v| v >= 1.0),
        "{}",
        sys.log_tails(20)
    );
    assert!(sys.pvs().await.unwrap().is_empty());

    // The operator's action: remove the stray entry; the retry provisions.
    let mut conn = redis::Client::open(sys.redis.url())
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let prefix = format!(
        "provisioner:{{{}}}:pv-queue:",
        sys.settings.provisioner_name
    );
    let (): () = redis::pipe()
        .hdel(format!("{prefix}payloads"), &pv)
        .ignore()
        .hdel(format!("{prefix}dead"), &pv)
        .ignore()
        .query_async(&mut conn)
        .await
        .unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(60)).await);
    assert_eq!(
        sys.pvs().await.unwrap()[0].metadata.name.as_deref(),
        Some(pv.as_str())
    );
}

on_both_planes!(
    a_stray_payload_under_a_claims_pv_name_is_a_warning_not_a_silent_stall,
    forged_queue_entries_are_refused_and_dead_lettered,
    redis_sigkilled_in_the_fsync_window_strands_no_claim,
    a_stopped_pv_writer_leader_moves_nothing_after_the_standby_took_over,
);
