//! Every Event the services publish (through `common::kube::events::EventSink`), about claims and
//! about PersistentVolumes, is accepted by the API server; and core/v1 and events.k8s.io/v1
//! Events are one resource seen through two APIs. Each scenario runs on the simulator and
//! on a real kube-apiserver (v1.19 and v1.37) (skipped with one line without it,
//! a failure in CI): the real server is the reference the simulator must agree with.

use common::kube::events::{event, once_event_name, reason, EventSink, CLUSTER_SCOPED_NAMESPACE};
use e2e::realkube::{Assets, KubeVersion, RealCluster, RealClusterOptions};
use e2e::sim::{SimConfig, Simulator};
use k8s_openapi::api::core::v1::{Event as CoreEvent, ObjectReference};
use k8s_openapi::api::events::v1::Event as K8sEvent;
use kube::api::{Api, ListParams, PostParams};
use kube::Client;
use serde_json::json;

fn pv_ref() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolume".into()),
        name: Some("pvc-0000-event-test".into()),
        uid: Some("6a1e0a51-0000-4000-8000-000000000001".into()),
        ..Default::default()
    }
}

fn claim_ref() -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("PersistentVolumeClaim".into()),
        namespace: Some("default".into()),
        name: Some("data".into()),
        uid: Some("6a1e0a51-0000-4000-8000-000000000002".into()),
        ..Default::default()
    }
}

/// Publish a claim event three times and a PV warning twice (two series), then check both
/// APIs show each Event exactly once with the same content and its series count.
async fn sink_events_are_accepted_and_seen_once_through_each_api(client: Client) {
    let sink = EventSink::new(client.clone(), "reclaim-svc", "reclaim-svc-0");
    for _ in 0..3 {
        sink.try_publish(
            &claim_ref(),
            &event(
                false,
                reason::PROVISIONING,
                "Provision",
                "External provisioner is provisioning volume for claim \"default/data\"".into(),
            ),
        )
        .await
        .expect("claim event (and its series patches) accepted");
    }
    for _ in 0..2 {
        sink.try_publish(
            &pv_ref(),
            &event(
                true,
                reason::VOLUME_FAILED_DELETE,
                "Delete",
                "backend refused".into(),
            ),
        )
        .await
        .expect("PV event (and its series patch) accepted");
    }

    let v1: Api<K8sEvent> = Api::all(client.clone());
    let core: Api<CoreEvent> = Api::all(client.clone());
    let v1 = v1.list(&ListParams::default()).await.unwrap().items;
    let core = core.list(&ListParams::default()).await.unwrap().items;
    for r in [reason::PROVISIONING, reason::VOLUME_FAILED_DELETE] {
        let a: Vec<_> = v1
            .iter()
            .filter(|e| e.reason.as_deref() == Some(r))
            .collect();
        let b: Vec<_> = core
            .iter()
            .filter(|e| e.reason.as_deref() == Some(r))
            .collect();
        assert_eq!(a.len(), 1, "{r} through events.k8s.io/v1: {a:?}");
        assert_eq!(b.len(), 1, "{r} through core/v1: {b:?}");
        assert_eq!(a[0].metadata.uid, b[0].metadata.uid, "one object");
        assert_eq!(
            a[0].metadata.resource_version,
            b[0].metadata.resource_version
        );
        assert_eq!(a[0].note, b[0].message, "note <-> message");
        assert_eq!(a[0].regarding.as_ref(), Some(&b[0].involved_object));
        assert_eq!(a[0].reporting_controller, b[0].reporting_component);
    }
    let pv_event = v1
        .iter()
        .find(|e| e.reason.as_deref() == Some(reason::VOLUME_FAILED_DELETE))
        .unwrap();
    assert_eq!(
        pv_event.metadata.namespace.as_deref(),
        Some(CLUSTER_SCOPED_NAMESPACE)
    );
    assert_eq!(pv_event.regarding.as_ref().unwrap().namespace, None);
    assert_eq!(pv_event.series.as_ref().map(|s| s.count), Some(2));
    let claim_event = v1
        .iter()
        .find(|e| e.reason.as_deref() == Some(reason::PROVISIONING))
        .unwrap();
    assert_eq!(claim_event.metadata.namespace.as_deref(), Some("default"));
    assert_eq!(claim_event.series.as_ref().map(|s| s.count), Some(3));
}

/// `publish_once` twice, from two sinks (a deposed leader and its successor), for the same
/// claim: one Event, with the deterministic name, accepted by the server; the second publish
/// reports it existed. A different reason on the same claim is its own Event.
async fn publish_once_creates_one_named_event(client: Client) {
    let first = EventSink::new(client.clone(), "pv-writer", "pv-writer-0");
    let second = EventSink::new(client.clone(), "pv-writer", "pv-writer-1");
    let claim = ObjectReference {
        uid: Some("6a1e0a51-0000-4000-8000-000000000003".into()),
        name: Some("once".into()),
        ..claim_ref()
    };
    let publish = |sink: &EventSink| {
        let sink = sink.clone();
        let claim = claim.clone();
        async move {
            sink.try_publish_once(
                &claim,
                &event(
                    false,
                    reason::PROVISIONING_SUCCEEDED,
                    "Provision",
                    "Successfully provisioned volume pvc-6a1e0a51-0000-4000-8000-000000000003"
                        .into(),
                ),
            )
            .await
        }
    };
    assert!(publish(&first).await.expect("accepted"), "created");
    assert!(!publish(&second).await.expect("AlreadyExists is success"));
    assert!(!publish(&first).await.expect("AlreadyExists is success"));
    let v1: Api<K8sEvent> = Api::namespaced(client.clone(), "default");
    let ours: Vec<K8sEvent> = v1
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| {
            e.reason.as_deref() == Some(reason::PROVISIONING_SUCCEEDED)
                && e.regarding.as_ref().and_then(|r| r.uid.as_deref()) == claim.uid.as_deref()
        })
        .collect();
    assert_eq!(ours.len(), 1, "{ours:?}");
    assert_eq!(
        ours[0].metadata.name,
        once_event_name(&claim, reason::PROVISIONING_SUCCEEDED)
    );
    assert_eq!(ours[0].reporting_instance.as_deref(), Some("pv-writer-0"));
    assert!(second
        .try_publish_once(
            &claim,
            &event(
                true,
                reason::PROVISIONING_FAILED,
                "Provision",
                "a failure is another Event".into()
            )
        )
        .await
        .unwrap());
}

/// What kube-runtime's Recorder does for a cluster-scoped object (an events.k8s.io/v1 Event
/// in `default`) is rejected by v1.19 with exactly this error, and accepted from 1.23 on.
async fn pv_event_in_default(client: Client, version: KubeVersion) {
    let api: Api<K8sEvent> = Api::namespaced(client, "default");
    let ev: K8sEvent = serde_json::from_value(json!({
        "metadata": {"name": "pv.rejected", "namespace": "default"},
        "eventTime": "2026-01-01T00:00:00.000000Z",
        "reportingController": "reclaim-svc", "reportingInstance": "r-0",
        "action": "Delete", "reason": "VolumeFailedDelete", "type": "Warning",
        "regarding": serde_json::to_value(pv_ref()).unwrap(),
    }))
    .unwrap();
    if version >= KubeVersion::V1_37 {
        let created = api.create(&PostParams::default(), &ev).await.unwrap();
        assert_eq!(created.metadata.namespace.as_deref(), Some("default"));
        return;
    }
    let err = api.create(&PostParams::default(), &ev).await.unwrap_err();
    let kube::Error::Api(status) = err else {
        panic!("expected an API error, got {err:?}")
    };
    assert_eq!(status.code, 422, "{status:?}");
    assert!(
        status.message.contains(
            "involvedObject.namespace: Invalid value: \"\": does not match event.namespace"
        ),
        "{status:?}"
    );
}

#[tokio::test]
async fn sim_sink_events_are_accepted_and_seen_once_through_each_api() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    sink_events_are_accepted_and_seen_once_through_each_api(sim.client().unwrap()).await;
}

#[tokio::test]
async fn sim_publish_once_creates_one_named_event() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    publish_once_creates_one_named_event(sim.client().unwrap()).await;
}

#[tokio::test]
async fn sim_pv_event_in_default_is_rejected_as_on_1_19_and_accepted_as_on_1_37() {
    for version in KubeVersion::ALL {
        let sim = Simulator::start(SimConfig {
            kube_version: version,
            ..Default::default()
        })
        .await
        .unwrap();
        pv_event_in_default(sim.client().unwrap(), version).await;
    }
}

async fn real_events_are_accepted_and_rejected_like_the_simulator(assets: Assets) {
    let cluster = RealCluster::start(
        &assets,
        RealClusterOptions {
            controller_manager: false,
            ..Default::default()
        },
    )
    .await
    .unwrap();
    sink_events_are_accepted_and_seen_once_through_each_api(cluster.client()).await;
    pv_event_in_default(cluster.client(), assets.version).await;
    publish_once_creates_one_named_event(cluster.client()).await;
}

e2e::on_each_version!(real_events_are_accepted_and_rejected_like_the_simulator,);
