//! The service frame (`common::runtime::frame`): work starts only once the Lease is
//! held, `/readyz` follows the work loop's readiness, and a lost Lease aborts
//! the work at once; the replica then stays up, reports not ready, campaigns
//! again and restarts its work when it leads again.
//!
//! The Lease-loss scenario runs on both control planes (`on_both_planes!`):
//! on the simulator the API outage is 503 to every request with dropped
//! watches, on the real one kube-apiserver is stopped and started again, and
//! the service runs as reclaim-svc's ServiceAccount with the deploy's RBAC.
//! The scenarios that need a fault only a simulator can inject (503 on Lease
//! calls alone while SIGTERM is pending) stay simulator-only.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::runtime::config::CommonArgs;
use common::runtime::frame::{run_service, Launch};
use e2e::harness::{ControlPlane, Plane, Service};
use e2e::sim::{FaultSpec, SimConfig, Simulator};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::Api;
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

fn args(identity: &str) -> CommonArgs {
    args_in(identity, "default", "example.com/hostpath")
}

/// [`args`] with the Lease namespace and provisioner name of a plane.
fn args_in(identity: &str, namespace: &str, provisioner: &str) -> CommonArgs {
    Cli::parse_from([
        "test",
        "--http-address",
        "127.0.0.1",
        "--http-port",
        "0",
        "--leader-election-namespace",
        namespace,
        "--provisioner-name",
        provisioner,
        "--leader-election-identity",
        identity,
        "--leader-election-lease-duration",
        "3s",
        "--leader-election-renew-deadline",
        "2s",
        "--leader-election-retry-period",
        "1s",
    ])
    .common
}

/// Polls `cond` every 20 ms for at most `limit`; panics with `what` otherwise.
async fn wait_for(limit: Duration, what: &str, cond: impl Fn() -> bool) {
    tokio::time::timeout(limit, async {
        while !cond() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out after {limit:?} waiting for: {what}"));
}

async fn readyz(addr: std::net::SocketAddr) -> u16 {
    e2e::harness::metrics::http_get(addr, "/readyz")
        .await
        .map(|(code, _)| code)
        .unwrap_or(0)
}

e2e::on_both_planes!(lost_lease_aborts_work_then_the_replica_stays_up_and_leads_again);

/// The holder of the Lease `name` in `namespace`, read with the admin client.
async fn holder(plane: &Plane, namespace: &str, name: &str) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(plane.admin_client().await.unwrap(), namespace);
    leases
        .get_opt(name)
        .await
        .unwrap()
        .and_then(|l| l.spec)
        .and_then(|s| s.holder_identity)
}

async fn lost_lease_aborts_work_then_the_replica_stays_up_and_leads_again(choice: ControlPlane) {
    let mut plane = Plane::start(choice.with_sim_config(SimConfig::bare()))
        .await
        .unwrap();
    let namespace = plane.lease_namespace(Service::Reclaim);
    let provisioner = plane.provisioner_name();
    let lease_name = Service::Reclaim.lease_name(&provisioner);
    let client = plane.service_client(Service::Reclaim).await.unwrap();
    // a real API server restart takes seconds; the simulator's outage is instant
    let comeback = if plane.is_real() {
        Duration::from_secs(90)
    } else {
        Duration::from_secs(10)
    };
    let shutdown = CancellationToken::new();
    let ticks = Arc::new(AtomicU32::new(0));
    let terms = Arc::new(AtomicU32::new(0));
    let addr = Arc::new(std::sync::Mutex::new(None));
    let (t, n, ad) = (ticks.clone(), terms.clone(), addr.clone());
    let mut a = args_in("replica-a", &namespace, &provisioner);
    // The work below ignores shutdown: SIGTERM ends it after the grace period.
    a.shutdown_grace_period = Duration::from_millis(300);
    let run = tokio::spawn(run_service(
        reclaim_svc::SPEC,
        a,
        prometheus::Registry::new(),
        Launch {
            client: Some(client),
            shutdown: Some(shutdown.clone()),
        },
        move |ctx| {
            let (t, n, ad) = (t.clone(), n.clone(), ad.clone());
            async move {
                *ad.lock().unwrap() = Some(ctx.http_addr);
                n.fetch_add(1, Ordering::SeqCst);
                ctx.readiness.set_ready(true);
                loop {
                    t.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        },
    ));

    // Work starts once the Lease named after the provisioner and service is held.
    wait_for(Duration::from_secs(15), "first term", || {
        terms.load(Ordering::SeqCst) == 1
    })
    .await;
    let addr = addr.lock().unwrap().expect("work saw its HTTP address");
    assert_eq!(
        holder(&plane, &namespace, &lease_name).await.as_deref(),
        Some("replica-a")
    );
    assert_eq!(readyz(addr).await, 200);

    // The API server is gone (simulator: 503 to everything; real:
    // kube-apiserver stopped): the leader cannot renew, must stop working at
    // once, stay up, and report not ready.
    let outage = plane.begin_outage().await.unwrap();
    let mut stopped_at = ticks.load(Ordering::SeqCst);
    tokio::time::timeout(Duration::from_secs(8), async {
        loop {
            tokio::time::sleep(Duration::from_millis(200)).await;
            let now = ticks.load(Ordering::SeqCst);
            if now == stopped_at {
                return;
            }
            stopped_at = now;
        }
    })
    .await
    .expect("work aborted after the lease was lost");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks.load(Ordering::SeqCst), stopped_at, "work was aborted");
    assert!(!run.is_finished(), "the process keeps running");
    assert_eq!(readyz(addr).await, 503, "not ready after losing the lease");
    assert_eq!(terms.load(Ordering::SeqCst), 1);

    // The API server answers again: the replica campaigns, wins, and the work
    // is started again from scratch (a second call of the work function).
    plane.end_outage(outage).await.unwrap();
    wait_for(comeback, "second term", || {
        terms.load(Ordering::SeqCst) == 2
    })
    .await;
    let resumed = ticks.load(Ordering::SeqCst);
    wait_for(Duration::from_secs(2), "work ticking again", || {
        ticks.load(Ordering::SeqCst) > resumed + 2
    })
    .await;
    assert_eq!(readyz(addr).await, 200, "ready again as leader");
    assert_eq!(
        holder(&plane, &namespace, &lease_name).await.as_deref(),
        Some("replica-a")
    );

    // SIGTERM still drains and ends the run cleanly.
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run returned after SIGTERM")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
}

#[tokio::test]
async fn without_leader_election_work_runs_and_its_error_is_returned() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let mut a = args("solo");
    a.leader_election = false;
    let result = run_service(
        pv_writer::SPEC,
        a,
        prometheus::Registry::new(),
        on_sim(&sim, None),
        |_ctx| async { anyhow::bail!("backend unusable") },
    )
    .await;
    assert_eq!(result.unwrap_err().to_string(), "backend unusable");
    assert_eq!(sim.count("leases"), 0, "no Lease without leader election");
}

#[tokio::test]
async fn inconsistent_lease_timing_fails_at_start_instead_of_retrying() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let mut a = args("bad-timing");
    a.renew_deadline = a.lease_duration;
    let run = run_service(
        pv_writer::SPEC,
        a,
        prometheus::Registry::new(),
        on_sim(&sim, None),
        |_ctx| async { Ok(()) },
    );
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run_service returned at once");
    let err = result.unwrap_err().to_string();
    assert!(
        err.contains("--leader-election-lease-duration must be greater than --leader-election-renew-deadline"),
        "{err}"
    );
    assert_eq!(sim.count("leases"), 0, "no Lease touched with bad timing");
}

/// Sets `done` when dropped, after a slow synchronous clean-up (`delay`), so a
/// test can see whether the runtime waited for the work future to be gone.
struct SlowDrop {
    delay: Duration,
    done: Arc<std::sync::Mutex<Option<std::time::Instant>>>,
}

impl Drop for SlowDrop {
    fn drop(&mut self) {
        std::thread::sleep(self.delay);
        *self.done.lock().unwrap() = Some(std::time::Instant::now());
    }
}

/// First instant at which the Lease no longer names `identity`, polled every 10 ms.
fn watch_release(
    sim: &Arc<e2e::sim::SimHandle>,
    lease: &'static str,
    identity: &'static str,
) -> tokio::task::JoinHandle<std::time::Instant> {
    let sim = sim.clone();
    tokio::spawn(async move {
        loop {
            let holder = sim.object("leases", "default", lease).map(|l| {
                l["spec"]["holderIdentity"]
                    .as_str()
                    .unwrap_or("")
                    .to_string()
            });
            if holder.as_deref().is_some_and(|h| h != identity) {
                return std::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_past_the_grace_period_stops_all_work_before_releasing_the_lease() {
    let sim = Arc::new(Simulator::start(SimConfig::bare()).await.unwrap());
    let shutdown = CancellationToken::new();
    let ticks = Arc::new(AtomicU32::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(std::sync::Mutex::new(None));
    let (t, s, d) = (ticks.clone(), started.clone(), dropped.clone());
    let mut a = args("replica-a");
    a.shutdown_grace_period = Duration::from_millis(300);
    let run = tokio::spawn(run_service(
        reclaim_svc::SPEC,
        a,
        prometheus::Registry::new(),
        on_sim(&sim, Some(&shutdown)),
        move |_ctx| {
            let (t, s, d) = (t.clone(), s.clone(), d.clone());
            async move {
                let _guard = SlowDrop {
                    delay: Duration::from_millis(500),
                    done: d,
                };
                // A sub-task owned by the work future, ignoring shutdown.
                let mut tasks = tokio::task::JoinSet::new();
                tasks.spawn(async move {
                    loop {
                        t.fetch_add(1, Ordering::SeqCst);
                        tokio::time::sleep(Duration::from_millis(20)).await;
                    }
                });
                s.store(true, Ordering::SeqCst);
                std::future::pending::<()>().await;
                drop(tasks);
                Ok(())
            }
        },
    ));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("work started after acquiring the lease");
    let released = watch_release(&sim, "example.com-hostpath-reclaim", "replica-a");

    let signalled = std::time::Instant::now();
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(5), run)
        .await
        .expect("run returned after the grace period")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    let returned = std::time::Instant::now();
    let dropped_at = dropped
        .lock()
        .unwrap()
        .expect("work future dropped before run returned");
    assert!(
        dropped_at - signalled >= Duration::from_millis(300),
        "grace period honoured"
    );
    let released_at = tokio::time::timeout(Duration::from_secs(2), released)
        .await
        .expect("lease released on shutdown")
        .unwrap();
    assert!(
        released_at >= dropped_at && released_at <= returned + Duration::from_millis(50),
        "lease released {:?} after the work was gone",
        released_at.checked_duration_since(dropped_at)
    );
    // The sub-task was aborted with the work future.
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(ticks.load(Ordering::SeqCst), after, "sub-task stopped");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_does_not_restart_the_renew_deadline() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let mut a = args("replica-a");
    // Long enough that only the watchdog can end the drain.
    a.shutdown_grace_period = Duration::from_secs(20);
    let run = tokio::spawn(run_service(
        reclaim_svc::SPEC,
        a,
        prometheus::Registry::new(),
        on_sim(&sim, Some(&shutdown)),
        move |_ctx| {
            let s = s.clone();
            async move {
                s.store(true, Ordering::SeqCst);
                std::future::pending::<anyhow::Result<()>>().await
            }
        },
    ));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("work started after acquiring the lease");

    // Renewals fail from now on; SIGTERM arrives 1.8 s later, while the
    // renew deadline (2 s, checked every 1 s retry period) is running out.
    sim.inject_fault(FaultSpec::error(503, &[], &["leases"]));
    let faulted = std::time::Instant::now();
    tokio::time::sleep(Duration::from_millis(1800)).await;
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returned")
        .unwrap();
    let err = result.expect_err("a lost lease is an error");
    assert!(err.to_string().contains("lease lost"), "{err}");
    // Last confirmed renewal ≤ 1 s before the fault: lost by fault + 2 s + one
    // retry period (+ request time). A watchdog restarted at SIGTERM would
    // only give up at fault + 1.8 s + 3 s.
    let waited = faulted.elapsed();
    assert!(
        waited < Duration::from_millis(4000),
        "lead given up {waited:?} after renewals failed"
    );
}

/// A client built the way the services build theirs (`common::runtime::kube_client`).
fn client(sim: &e2e::sim::SimHandle) -> kube::Client {
    let mut config = kube::Config::new(sim.url().parse().unwrap());
    config.default_namespace = "default".into();
    common::runtime::kube_client::build_client(config, 0.0, 0, None).unwrap()
}

/// A [`Launch`] on `sim` with [`client`], shut down by `shutdown` (else by SIGTERM).
fn on_sim(sim: &e2e::sim::SimHandle, shutdown: Option<&CancellationToken>) -> Launch {
    Launch {
        client: Some(client(sim)),
        shutdown: shutdown.cloned(),
    }
}

async fn healthz(addr: std::net::SocketAddr) -> (u16, String) {
    e2e::harness::metrics::http_get(addr, "/healthz")
        .await
        .unwrap_or((0, String::new()))
}

/// `/healthz` follows the work loop's heartbeat: a loop that stops beating
/// (paused) turns it 503 after `--healthz-stall-timeout`, beating again turns
/// it 200; a replica that lost its Lease and campaigns is not ready but
/// healthy (a restart would not help it). The runtime also exports the
/// standard `process_*` metrics.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_work_loop_turns_healthz_503_a_lost_lease_does_not() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let shutdown = CancellationToken::new();
    let paused = Arc::new(AtomicBool::new(false));
    let addr = Arc::new(std::sync::Mutex::new(None));
    let (p, ad) = (paused.clone(), addr.clone());
    let mut a = args("replica-h");
    a.healthz_stall_timeout = Duration::from_millis(600);
    a.shutdown_grace_period = Duration::from_millis(300);
    let registry = prometheus::Registry::new();
    let run = tokio::spawn(run_service(
        provision_svc::SPEC,
        a,
        registry.clone(),
        on_sim(&sim, Some(&shutdown)),
        move |ctx| {
            let (p, ad) = (p.clone(), ad.clone());
            async move {
                *ad.lock().unwrap() = Some(ctx.http_addr);
                ctx.readiness.set_ready(true);
                loop {
                    if !p.load(Ordering::SeqCst) {
                        ctx.heartbeat.beat();
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        },
    ));
    wait_for(Duration::from_secs(5), "leading", || {
        addr.lock().unwrap().is_some()
    })
    .await;
    let addr = addr.lock().unwrap().unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(healthz(addr).await.0, 200, "a beating loop is healthy");

    paused.store(true, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(1000)).await;
    let (code, body) = healthz(addr).await;
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("work loop stalled"), "{body}");
    assert_eq!(
        readyz(addr).await,
        200,
        "stalled is not the same as not ready"
    );

    paused.store(false, Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(healthz(addr).await.0, 200, "beating again: healthy");

    let text = common::runtime::metrics::render(&registry);
    for family in [
        "process_cpu_seconds_total ",
        "process_resident_memory_bytes ",
        "process_open_fds ",
        "process_start_time_seconds ",
    ] {
        assert!(text.contains(family), "{family} missing from\n{text}");
    }

    // Lease calls fail: the term is lost, the work stops (no more beats), the
    // replica campaigns: not ready, but healthy.
    sim.inject_fault(FaultSpec::error(503, &[], &["leases"]));
    wait_for(
        Duration::from_secs(8),
        "not ready after the lost Lease",
        || text_is_lost(&registry),
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1000)).await;
    assert_eq!(readyz(addr).await, 503);
    assert_eq!(
        healthz(addr).await,
        (200, "ok".to_string()),
        "campaigning after a lost Lease is healthy"
    );
    shutdown.cancel();
    sim.clear_faults();
    run.await.unwrap().unwrap();
}

/// Whether the registry counted a lost leader term.
fn text_is_lost(registry: &prometheus::Registry) -> bool {
    common::runtime::metrics::render(registry)
        .lines()
        .any(|l| l.starts_with("leader_election_lost_total{") && !l.ends_with(" 0"))
}

/// Regression: SIGTERM while a Lease renewal hangs in the API server. The renewal
/// holds the lease manager's lock for the length of its request; the release
/// waited for that lock for as long as the request hung, so the Lease was not
/// released and a standby waited for it to expire (pv-writer on the node cluster).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_while_a_lease_renewal_hangs_still_releases_the_lease_at_once() {
    let sim = Arc::new(Simulator::start(SimConfig::bare()).await.unwrap());
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let run = tokio::spawn(run_service(
        pv_writer::SPEC,
        args("replica-a"),
        prometheus::Registry::new(),
        on_sim(&sim, Some(&shutdown)),
        move |ctx| {
            let s = s.clone();
            async move {
                s.store(true, Ordering::SeqCst);
                ctx.shutdown.cancelled().await;
                Ok(())
            }
        },
    ));
    wait_for(Duration::from_secs(5), "work started", || {
        started.load(Ordering::SeqCst)
    })
    .await;
    // The next Lease write (a renewal, about a second away) hangs for 30 s.
    let before = sim.stats().faults_injected;
    sim.inject_fault(FaultSpec::hang(30_000, &["patch", "update"], &["leases"]).times(1));
    wait_for(Duration::from_secs(3), "a renewal hanging", || {
        sim.stats().faults_injected > before
    })
    .await;
    let released = watch_release(&sim, "example.com-hostpath-pv-writer", "replica-a");
    shutdown.cancel();
    let result = tokio::time::timeout(Duration::from_secs(2), run)
        .await
        .expect("run returned within 2 s of SIGTERM (the renewal still hangs)")
        .unwrap();
    assert!(result.is_ok(), "{result:?}");
    tokio::time::timeout(Duration::from_millis(500), released)
        .await
        .expect("Lease released before run returned, not left to expire")
        .unwrap();
}
