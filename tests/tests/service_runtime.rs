//! The service frame (`common::runtime`) on both control planes: work starts
//! only once the Lease is held, `/readyz` follows the work loop's readiness,
//! and a lost Lease aborts the work at once and fails the run (non-zero exit).
//! On the real API server the frame runs as the service's ServiceAccount under
//! the deploy's RBAC, and "the API fails" is a stopped kube-apiserver (the
//! simulator answers 503 to everything instead).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::config::{CommonArgs, ServiceKind};
use common::runtime::{run_service_with_client, run_service_with_shutdown};
use e2e::harness::{ControlPlane, Plane, Service};
use e2e::on_both_planes;
use e2e::sim::SimConfig;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Api, ListParams};
use tokio_util::sync::CancellationToken;

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

async fn start(plane: ControlPlane) -> Plane {
    Plane::start(plane.with_sim_config(SimConfig::bare()))
        .await
        .expect("control plane starts")
}

/// Leases of the plane's Lease namespace, read as admin.
async fn leases(plane: &Plane) -> Api<Lease> {
    Api::namespaced(
        plane.admin_client().await.unwrap(),
        &plane.lease_namespace(),
    )
}

/// Holder of the Lease `name`, read as admin (`None` while absent or unreadable).
async fn holder(plane: &Plane, name: &str) -> Option<String> {
    leases(plane)
        .await
        .get_opt(name)
        .await
        .ok()??
        .spec?
        .holder_identity
}

fn args(plane: &Plane, identity: &str) -> CommonArgs {
    let ns = plane.lease_namespace();
    let provisioner = plane.provisioner_name();
    Cli::parse_from([
        "test",
        "--provisioner-name",
        provisioner.as_str(),
        "--http-address",
        "127.0.0.1",
        "--http-port",
        "0",
        "--leader-election-namespace",
        ns.as_str(),
        "--leader-election-identity",
        identity,
        "--lease-duration",
        "3s",
        "--renew-deadline",
        "2s",
        "--retry-period",
        "1s",
    ])
    .common
}

async fn lost_lease_aborts_work_and_fails_the_run(plane: ControlPlane) {
    let mut sim = start(plane).await;
    let ticks = Arc::new(AtomicU32::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let (t, s) = (ticks.clone(), started.clone());
    let run = tokio::spawn(run_service_with_client(
        ServiceKind::Reclaim,
        args(&sim, "replica-a"),
        prometheus::Registry::new(),
        sim.service_client(Service::Reclaim).await.unwrap(),
        move |ctx| async move {
            s.store(true, Ordering::SeqCst);
            ctx.readiness.set_ready(true);
            loop {
                t.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        },
    ));

    // Work starts once the Lease named after the provisioner and service is held.
    tokio::time::timeout(Duration::from_secs(5), async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("work started after acquiring the lease");
    assert_eq!(
        holder(&sim, "example.com-hostpath-reclaim")
            .await
            .as_deref(),
        Some("replica-a"),
        "lease created and held"
    );

    // The API server fails every call: the leader must stop working.
    let (outage, result) = tokio::join!(
        sim.begin_outage(),
        tokio::time::timeout(Duration::from_secs(8), run)
    );
    let _outage = outage.expect("outage begins");
    let result = result
        .expect("run returned after losing the lease")
        .unwrap();
    let err = result.expect_err("a lost lease is an error (non-zero exit)");
    assert!(err.to_string().contains("lease lost"), "{err}");
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks.load(Ordering::SeqCst), after, "work was aborted");
}

async fn without_leader_election_work_runs_and_its_error_is_returned(plane: ControlPlane) {
    let sim = start(plane).await;
    let mut a = args(&sim, "solo");
    a.leader_election = false;
    let result = run_service_with_client(
        ServiceKind::PvWriter,
        a,
        prometheus::Registry::new(),
        sim.service_client(Service::PvWriter).await.unwrap(),
        |_ctx| async { anyhow::bail!("backend unusable") },
    )
    .await;
    assert_eq!(result.unwrap_err().to_string(), "backend unusable");
    let leases = leases(&sim)
        .await
        .list(&ListParams::default())
        .await
        .unwrap();
    assert_eq!(leases.items.len(), 0, "no Lease without leader election");
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
async fn watch_release(
    plane: &Plane,
    lease: &'static str,
    identity: &'static str,
) -> tokio::task::JoinHandle<std::time::Instant> {
    let api = leases(plane).await;
    tokio::spawn(async move {
        loop {
            let holder = api
                .get_opt(lease)
                .await
                .ok()
                .flatten()
                .map(|l| l.spec.and_then(|s| s.holder_identity).unwrap_or_default());
            if holder.as_deref().is_some_and(|h| h != identity) {
                return std::time::Instant::now();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    })
}

async fn sigterm_past_the_grace_period_stops_all_work_before_releasing_the_lease(
    plane: ControlPlane,
) {
    let sim = start(plane).await;
    let shutdown = CancellationToken::new();
    let ticks = Arc::new(AtomicU32::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(std::sync::Mutex::new(None));
    let (t, s, d) = (ticks.clone(), started.clone(), dropped.clone());
    let mut a = args(&sim, "replica-a");
    a.shutdown_grace_period = Duration::from_millis(300);
    let run = tokio::spawn(run_service_with_shutdown(
        ServiceKind::Reclaim,
        a,
        prometheus::Registry::new(),
        sim.service_client(Service::Reclaim).await.unwrap(),
        shutdown.clone(),
        move |_ctx| async move {
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
        },
    ));
    tokio::time::timeout(Duration::from_secs(5), async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("work started after acquiring the lease");
    let released = watch_release(&sim, "example.com-hostpath-reclaim", "replica-a").await;

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

async fn sigterm_does_not_restart_the_renew_deadline(plane: ControlPlane) {
    let mut sim = start(plane).await;
    let shutdown = CancellationToken::new();
    let started = Arc::new(AtomicBool::new(false));
    let s = started.clone();
    let mut a = args(&sim, "replica-a");
    // Long enough that only the watchdog can end the drain.
    a.shutdown_grace_period = Duration::from_secs(20);
    let frame = run_service_with_shutdown(
        ServiceKind::Reclaim,
        a,
        prometheus::Registry::new(),
        sim.service_client(Service::Reclaim).await.unwrap(),
        shutdown.clone(),
        move |_ctx| async move {
            s.store(true, Ordering::SeqCst);
            std::future::pending::<anyhow::Result<()>>().await
        },
    );
    // The instant the run returned, taken as it returns (the outage below may
    // keep the test busy for a while after).
    let run = tokio::spawn(async move { (frame.await, std::time::Instant::now()) });
    tokio::time::timeout(Duration::from_secs(5), async {
        while !started.load(Ordering::SeqCst) {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("work started after acquiring the lease");

    // Renewals fail from now on; SIGTERM arrives 1.8 s later, while the
    // renew deadline (2 s, checked every 1 s retry period) is running out.
    // (A real kube-apiserver stops listening at once but may take up to 3 s
    // to exit, hence the SIGTERM timer runs alongside the stop.)
    let faulted = std::time::Instant::now();
    let (outage, ()) = tokio::join!(sim.begin_outage(), async {
        tokio::time::sleep(Duration::from_millis(1800)).await;
        shutdown.cancel();
    });
    let _outage = outage.expect("outage begins");
    let (result, returned) = tokio::time::timeout(Duration::from_secs(10), run)
        .await
        .expect("run returned")
        .unwrap();
    let err = result.expect_err("a lost lease is an error");
    assert!(err.to_string().contains("lease lost"), "{err}");
    // Last confirmed renewal ≤ 1 s before the fault: lost by fault + 2 s + one
    // retry period (+ request time). A watchdog restarted at SIGTERM would
    // only give up at fault + 1.8 s + 3 s.
    let waited = returned - faulted;
    assert!(
        waited < Duration::from_millis(4000),
        "lead given up {waited:?} after renewals failed"
    );
}

on_both_planes!(
    lost_lease_aborts_work_and_fails_the_run,
    without_leader_election_work_runs_and_its_error_is_returned,
    sigterm_past_the_grace_period_stops_all_work_before_releasing_the_lease,
    sigterm_does_not_restart_the_renew_deadline,
);
