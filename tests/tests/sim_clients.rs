//! Real client libraries against the simulator: kube-lease-manager (get/create, strategic
//! merge and server-side apply patches on a Lease) and kube-runtime's events Recorder
//! (create, then merge-patch of the event series).

use e2e::sim::{SimConfig, Simulator};
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube_lease_manager::LeaseManagerBuilder;
use std::time::Duration;

#[tokio::test]
async fn lease_manager_acquires_and_excludes() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let client = sim.client().unwrap();
    let m1 = LeaseManagerBuilder::new(client.clone(), "leader")
        .with_identity("one")
        .with_duration(5)
        .with_grace(1)
        .build()
        .await
        .unwrap();
    let m2 = LeaseManagerBuilder::new(client.clone(), "leader")
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
    let l = sim
        .object("leases.coordination.k8s.io", "default", "leader")
        .unwrap();
    assert_eq!(l["spec"]["holderIdentity"], "one");
    assert_eq!(l["spec"]["leaseDurationSeconds"], 5);
    m1.release().await.unwrap();
    let l = sim
        .object("leases.coordination.k8s.io", "default", "leader")
        .unwrap();
    assert!(l["spec"]["holderIdentity"].is_null());
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
    let l = sim
        .object("leases.coordination.k8s.io", "default", "leader")
        .unwrap();
    assert_eq!(l["spec"]["holderIdentity"], "two");
    let st = sim.stats();
    assert!(st.count("patch", "leases.coordination.k8s.io") >= 2);
}

#[tokio::test]
async fn events_recorder_publishes_and_patches_series() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let client = sim.client().unwrap();
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
        namespace: Some("default".into()),
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
    let events: Api<K8sEvent> = Api::namespaced(client, "default");
    let l = events.list(&ListParams::default()).await.unwrap();
    assert_eq!(l.items.len(), 1);
    let e = &l.items[0];
    assert_eq!(e.reason.as_deref(), Some("ProvisioningSucceeded"));
    assert_eq!(e.series.as_ref().map(|s| s.count), Some(2));
    assert_eq!(
        e.regarding.as_ref().unwrap().name.as_deref(),
        Some("claim-1")
    );
    let st = sim.stats();
    assert_eq!(st.count("create", "events.events.k8s.io"), 1);
    assert_eq!(st.count("patch", "events.events.k8s.io"), 1);
}
