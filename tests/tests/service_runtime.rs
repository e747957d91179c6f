//! The service frame (`common::runtime`) against the simulator: work starts only
//! once the Lease is held, `/readyz` follows the work loop's readiness, and a
//! lost Lease aborts the work at once and fails the run (non-zero exit).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use common::config::{CommonArgs, ServiceKind};
use common::runtime::run_service_with_client;
use e2e::sim::{FaultSpec, SimConfig, Simulator};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    common: CommonArgs,
}

fn args(identity: &str) -> CommonArgs {
    Cli::parse_from([
        "test",
        "--http-address",
        "127.0.0.1",
        "--http-port",
        "0",
        "--leader-election-namespace",
        "default",
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

#[tokio::test]
async fn lost_lease_aborts_work_and_fails_the_run() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let ticks = Arc::new(AtomicU32::new(0));
    let started = Arc::new(AtomicBool::new(false));
    let (t, s) = (ticks.clone(), started.clone());
    let run = tokio::spawn(run_service_with_client(
        ServiceKind::Reclaim,
        args("replica-a"),
        prometheus::Registry::new(),
        client(&sim),
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
    let lease = sim
        .object("leases", "default", "example.com-hostpath-reclaim")
        .expect("lease created");
    assert_eq!(lease["spec"]["holderIdentity"], "replica-a");

    // The API server refuses every Lease call: the leader must stop working.
    sim.inject_fault(FaultSpec::error(503, &[], &["leases"]));
    let result = tokio::time::timeout(Duration::from_secs(8), run)
        .await
        .expect("run returned after losing the lease")
        .unwrap();
    let err = result.expect_err("a lost lease is an error (non-zero exit)");
    assert!(err.to_string().contains("lease lost"), "{err}");
    let after = ticks.load(Ordering::SeqCst);
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(ticks.load(Ordering::SeqCst), after, "work was aborted");
}

#[tokio::test]
async fn without_leader_election_work_runs_and_its_error_is_returned() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let mut a = args("solo");
    a.leader_election = false;
    let result = run_service_with_client(
        ServiceKind::PvWriter,
        a,
        prometheus::Registry::new(),
        client(&sim),
        |_ctx| async { anyhow::bail!("backend unusable") },
    )
    .await;
    assert_eq!(result.unwrap_err().to_string(), "backend unusable");
    assert_eq!(sim.count("leases"), 0, "no Lease without leader election");
}

/// A client built the way the services build theirs (`common::kube_client`).
fn client(sim: &e2e::sim::SimHandle) -> kube::Client {
    let mut config = kube::Config::new(sim.url().parse().unwrap());
    config.default_namespace = "default".into();
    common::kube_client::build_client(config, 0.0, 0).unwrap()
}
