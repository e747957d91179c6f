//! Leader election (`common::leader`) against the API-server simulator:
//! acquire, stand by, renew, release on shutdown, and lose the lead (renew
//! deadline exceeded while the API fails; another holder takes over).

use std::time::Duration;

use common::leader::{LeadLost, LeaderElector, LeaseTiming};
use e2e::sim::{FaultSpec, SimConfig, SimHandle, Simulator};
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::Api;
use tokio_util::sync::CancellationToken;

const LEASE: &str = "example.com-hostpath-provision";
const NS: &str = "default";

fn timing() -> LeaseTiming {
    LeaseTiming {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_secs(1),
    }
}

async fn sim() -> SimHandle {
    Simulator::start(SimConfig::bare())
        .await
        .expect("simulator starts")
}

async fn elector(sim: &SimHandle, id: &str) -> LeaderElector {
    LeaderElector::new(client(sim), NS, LEASE, id, timing())
        .await
        .expect("lease prepared")
}

async fn holder(sim: &SimHandle) -> Option<String> {
    let leases: Api<Lease> = Api::namespaced(client(sim), NS);
    leases
        .get(LEASE)
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

async fn renew_time(sim: &SimHandle) -> String {
    let leases: Api<Lease> = Api::namespaced(client(sim), NS);
    let spec = leases.get(LEASE).await.unwrap().spec.unwrap();
    format!("{:?}", spec.renew_time.expect("renewTime set").0)
}

#[tokio::test]
async fn acquires_renews_and_releases_to_a_standby() {
    let sim = sim().await;
    let a = elector(&sim, "replica-a").await;
    let b = elector(&sim, "replica-b").await;
    let never = CancellationToken::new();

    assert!(
        tokio::time::timeout(Duration::from_secs(5), a.acquire(&never))
            .await
            .unwrap()
    );
    assert_eq!(holder(&sim).await.as_deref(), Some("replica-a"));

    // While A holds and renews, B stands by and A's hold never reports a loss.
    let first_renew = renew_time(&sim).await;
    tokio::select! {
        lost = a.hold() => panic!("lead lost while healthy: {lost}"),
        won = b.acquire(&never) => panic!("standby acquired a held lease: {won}"),
        _ = tokio::time::sleep(Duration::from_secs(4)) => {}
    }
    assert_eq!(holder(&sim).await.as_deref(), Some("replica-a"));
    assert_ne!(
        renew_time(&sim).await,
        first_renew,
        "the leader renews its lease"
    );

    // Release on shutdown: B takes over well within the lease duration.
    a.release().await;
    let started = std::time::Instant::now();
    assert!(
        tokio::time::timeout(Duration::from_secs(3), b.acquire(&never))
            .await
            .unwrap()
    );
    assert!(
        started.elapsed() < timing().lease_duration,
        "took {:?}",
        started.elapsed()
    );
    assert_eq!(holder(&sim).await.as_deref(), Some("replica-b"));
}

#[tokio::test]
async fn a_standby_takes_over_an_expired_lease_after_the_leader_dies() {
    let sim = sim().await;
    let never = CancellationToken::new();
    {
        let a = elector(&sim, "replica-a").await;
        assert!(a.acquire(&never).await);
        // `a` is dropped without releasing: the process "died".
    }
    let b = elector(&sim, "replica-b").await;
    let started = std::time::Instant::now();
    assert!(
        tokio::time::timeout(Duration::from_secs(8), b.acquire(&never))
            .await
            .unwrap()
    );
    let waited = started.elapsed();
    assert!(
        waited <= timing().lease_duration + Duration::from_secs(2),
        "took {waited:?}"
    );
    assert_eq!(holder(&sim).await.as_deref(), Some("replica-b"));
}

#[tokio::test]
async fn leader_gives_up_when_renewals_fail_past_the_renew_deadline() {
    let sim = sim().await;
    let a = elector(&sim, "replica-a").await;
    assert!(a.acquire(&CancellationToken::new()).await);
    sim.inject_fault(FaultSpec::error(500, &[], &["leases"]));
    let started = std::time::Instant::now();
    let lost = tokio::time::timeout(Duration::from_secs(6), a.hold())
        .await
        .expect("lead reported lost");
    assert_eq!(lost, LeadLost::RenewDeadlineExceeded);
    // Given up after the renew deadline but before the lease expires for standbys.
    let waited = started.elapsed();
    assert!(
        waited >= timing().renew_deadline,
        "gave up too early: {waited:?}"
    );
    assert!(
        waited < timing().lease_duration + timing().retry_period,
        "gave up too late: {waited:?}"
    );
}

#[tokio::test]
async fn leader_stops_at_once_when_another_holder_appears() {
    let sim = sim().await;
    let a = elector(&sim, "replica-a").await;
    assert!(a.acquire(&CancellationToken::new()).await);
    let leases: Api<Lease> = Api::namespaced(client(&sim), NS);
    leases
        .patch(
            LEASE,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({"spec": {"holderIdentity": "intruder"}})),
        )
        .await
        .unwrap();
    let lost = tokio::time::timeout(Duration::from_secs(4), a.hold())
        .await
        .expect("lead reported lost");
    assert_eq!(lost, LeadLost::OtherHolder("intruder".into()));
}

/// A client built the way the services build theirs (`common::kube_client`).
fn client(sim: &e2e::sim::SimHandle) -> kube::Client {
    let mut config = kube::Config::new(sim.url().parse().unwrap());
    config.default_namespace = "default".into();
    common::kube_client::build_client(config, 0.0, 0).unwrap()
}
