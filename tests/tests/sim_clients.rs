//! Real client libraries against the simulator and a real kube-apiserver (v1.19 and v1.37)
//! (`on_both_servers!`): kube-lease-manager (get/create, strategic merge and
//! server-side apply patches on a Lease) and kube-runtime's events Recorder
//! (create, then merge-patch of the event series). Request counts are read
//! from the simulator's statistics only (a simulator feature).

use e2e::harness::ApiPlane;
use e2e::on_both_servers;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube_lease_manager::LeaseManagerBuilder;
use std::time::Duration;

on_both_servers!(
    lease_manager_acquires_and_excludes,
    events_recorder_publishes_and_patches_series
);

async fn lease_manager_acquires_and_excludes(t: ApiPlane) {
    let client = t.client();
    let leases: Api<Lease> = Api::namespaced(client.clone(), t.namespace());
    let spec = |l: Lease| serde_json::to_value(l.spec.unwrap()).unwrap();
    let m1 = LeaseManagerBuilder::new(client.clone(), "leader")
        .with_namespace(t.namespace())
        .with_identity("one")
        .with_duration(5)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let m2 = LeaseManagerBuilder::new(client.clone(), "leader")
        .with_namespace(t.namespace())
        .with_identity("two")
        .with_duration(5)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    assert!(m1.changed().await.unwrap(), "first manager takes the lease");
    let got2 = tokio::time::timeout(Duration::from_millis(1500), m2.changed()).await;
    assert!(
        got2.is_err() || !got2.unwrap().unwrap(),
        "second manager must not take a held lease"
    );
    let l = spec(leases.get("leader").await.unwrap());
    assert_eq!(l["holderIdentity"], "one");
    assert_eq!(l["leaseDurationSeconds"], 5);
    m1.release().await.unwrap();
    let l = spec(leases.get("leader").await.unwrap());
    assert!(l["holderIdentity"].is_null(), "{l}");
    // after release the other one gets it
    let ok = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            if m2.changed().await.unwrap() {
                return;
            }
        }
    })
    .await;
    assert!(ok.is_ok());
    let l = spec(leases.get("leader").await.unwrap());
    assert_eq!(l["holderIdentity"], "two");
    if let Some(sim) = t.sim() {
        assert!(sim.stats().count("patch", "leases.coordination.k8s.io") >= 2);
    }
}

async fn events_recorder_publishes_and_patches_series(t: ApiPlane) {
    let client = t.client();
    let rec = Recorder::new(
        client.clone(),
        Reporter {
            controller: "test-provisioner".into(),
            instance: Some("pod-1".into()),
        },
    );
    let reference = ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        name: Some("claim-1".into()),
        namespace: Some(t.namespace().into()),
        uid: Some("1234".into()),
        ..Default::default()
    };
    let ev = Event {
        type_: EventType::Normal,
        reason: "ProvisioningSucceeded".into(),
        note: Some("Successfully provisioned volume pvc-1234".into()),
        action: "Provisioning".into(),
        secondary: None,
    };
    rec.publish(&ev, &reference).await.unwrap();
    rec.publish(&ev, &reference).await.unwrap();
    let events: Api<K8sEvent> = Api::namespaced(client, t.namespace());
    let l = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    let e = &l.items[0];
    assert_eq!(e.reason.as_deref(), Some("ProvisioningSucceeded"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        e.regarding.as_ref().unwrap().name.as_deref(),
        Some("claim-1")
    );
    if let Some(sim) = t.sim() {
        let st = sim.stats();
        assert_eq!(st.count("create", "events.events.k8s.io"), 1);
        assert_eq!(st.count("patch", "events.events.k8s.io"), 1);
    }
}
