//! Leader election (`common::runtime::leader`) on both control planes: acquire, stand
//! by, renew, release on shutdown, and lose the lead (renew deadline exceeded
//! while the API fails; another holder takes over). On the real API server the
//! electors run as provision-svc's ServiceAccount, so the deploy's Lease Role
//! (`resourceNames` = this Lease) is what allows them.

use std::time::Duration;

use common::runtime::leader::{LeadLost, LeaderElector, LeaseTiming};
use e2e::harness::{ControlPlane, Plane, Service};
use e2e::on_both_planes;
use e2e::sim::SimConfig;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::{Patch, PatchParams};
use kube::Api;
use tokio_util::sync::CancellationToken;

/// provision-svc's Lease for the plane's provisioner name.
fn lease_name(plane: &Plane) -> String {
    Service::Provision.lease_name(&plane.provisioner_name())
}

fn timing() -> LeaseTiming {
    LeaseTiming {
        lease_duration: Duration::from_secs(3),
        renew_deadline: Duration::from_secs(2),
        retry_period: Duration::from_secs(1),
    }
}

async fn start(plane: ControlPlane) -> Plane {
    Plane::start(plane.with_sim_config(SimConfig::bare()))
        .await
        .expect("control plane starts")
}

/// An elector with provision-svc's identity (built as the services build their client).
async fn elector(plane: &Plane, id: &str) -> LeaderElector {
    let client = plane.service_client(Service::Provision).await.unwrap();
    LeaderElector::new(
        client,
        &plane.lease_namespace(Service::Provision),
        &lease_name(plane),
        id,
        timing(),
    )
    .await
    .expect("lease prepared")
}

/// The Lease, read as admin.
async fn leases(plane: &Plane) -> Api<Lease> {
    Api::namespaced(
        plane.admin_client().await.unwrap(),
        &plane.lease_namespace(Service::Provision),
    )
}

async fn holder(plane: &Plane) -> Option<String> {
    leases(plane)
        .await
        .get(&lease_name(plane))
        .await
        .unwrap()
        .spec
        .and_then(|s| s.holder_identity)
}

async fn renew_time(plane: &Plane) -> String {
    let spec = leases(plane)
        .await
        .get(&lease_name(plane))
        .await
        .unwrap()
        .spec
        .unwrap();
    format!("{:?}", spec.renew_time.expect("renewTime set").0)
}

async fn acquires_renews_and_releases_to_a_standby(plane: ControlPlane) {
    let sim = start(plane).await;
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

async fn a_standby_takes_over_an_expired_lease_after_the_leader_dies(plane: ControlPlane) {
    let sim = start(plane).await;
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

async fn leader_gives_up_when_renewals_fail_past_the_renew_deadline(plane: ControlPlane) {
    let mut sim = start(plane).await;
    let a = elector(&sim, "replica-a").await;
    assert!(a.acquire(&CancellationToken::new()).await);
    // The API fails from now on: 503 to everything on the simulator, a
    // stopped kube-apiserver on the real plane (stopping takes up to 3 s, so
    // the leader holds meanwhile).
    let started = std::time::Instant::now();
    let (outage, lost) = tokio::join!(
        sim.begin_outage(),
        tokio::time::timeout(Duration::from_secs(6), a.hold())
    );
    let _outage = outage.expect("outage begins");
    let lost = lost.expect("lead reported lost");
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

async fn leader_stops_at_once_when_another_holder_appears(plane: ControlPlane) {
    let sim = start(plane).await;
    let a = elector(&sim, "replica-a").await;
    assert!(a.acquire(&CancellationToken::new()).await);
    leases(&sim)
        .await
        .patch(
            &lease_name(&sim),
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

on_both_planes!(
    acquires_renews_and_releases_to_a_standby,
    a_standby_takes_over_an_expired_lease_after_the_leader_dies,
    leader_gives_up_when_renewals_fail_past_the_renew_deadline,
    leader_stops_at_once_when_another_holder_appears,
);
