//! End-to-end: what newer Kubernetes releases allow on claims, with the three services, on
//! the simulator (following v1.37) and the real v1.19 and v1.37 control planes: a
//! `ReadWriteOncePod` claim is provisioned with that access mode, and a claim whose
//! `storageClassName` is set after creation (1.26+) is provisioned on that update (v1.19
//! refuses both); a claim naming a VolumeAttributesClass (1.34+, for CSI drivers) gets a
//! Warning and no volume (v1.19 drops the field). Each difference is pinned.

use std::time::Duration;

use e2e::harness::{ControlPlane, System};
use e2e::on_both_planes;
use e2e::realkube::KubeVersion;
use kube::api::{Patch, PatchParams, PostParams};

async fn system(plane: ControlPlane) -> (System, KubeVersion) {
    let version = plane.version();
    (System::started(plane, None).await, version)
}

/// Panic with the service log tails when `r` is an error.
fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

fn api_status(r: Result<impl std::fmt::Debug, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

async fn read_write_once_pod_claims_are_provisioned(plane: ControlPlane) {
    let (sys, version) = system(plane).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let mut claim = sys.claim_manifest("solo", "hostpath", &[]);
    claim.spec.as_mut().unwrap().access_modes = Some(vec!["ReadWriteOncePod".into()]);
    let created = sys
        .claims_api()
        .create(&PostParams::default(), &claim)
        .await;
    if version == KubeVersion::V1_19 {
        let status = api_status(created);
        assert_eq!(status.code, 422, "{status:?}");
        assert!(
            status
                .message
                .contains("Unsupported value: \"ReadWriteOncePod\""),
            "{status:?}"
        );
        return;
    }
    created.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    let pv = sys.pvs().await.unwrap().remove(0);
    assert_eq!(
        pv.spec.unwrap().access_modes,
        Some(vec!["ReadWriteOncePod".to_string()])
    );
    sys.delete_claims(&["solo".into()]).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

async fn storage_class_set_after_creation_is_provisioned_on_the_update(plane: ControlPlane) {
    let (sys, version) = system(plane).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    // No class and no default class: nothing to provision yet.
    let mut claim = sys.claim_manifest("late", "unused", &[]);
    claim.spec.as_mut().unwrap().storage_class_name = None;
    sys.claims_api()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sys.pvs().await.unwrap().len(), 0);

    let patch = serde_json::json!({"spec": {"storageClassName": "hostpath"}});
    let patched = sys
        .claims_api()
        .patch("late", &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    if version == KubeVersion::V1_19 {
        let status = api_status(patched);
        assert_eq!(status.code, 422, "{status:?}");
        assert!(status.message.contains("spec is immutable"), "{status:?}");
        return;
    }
    patched.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    let pv = sys.pvs().await.unwrap().remove(0);
    assert_eq!(
        pv.spec.unwrap().storage_class_name.as_deref(),
        Some("hostpath")
    );
    sys.delete_claims(&["late".into()]).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

async fn a_volume_attributes_class_gets_a_warning_and_no_volume(plane: ControlPlane) {
    let (sys, version) = system(plane).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let mut claim = sys.claim_manifest("gold", "hostpath", &[]);
    claim.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
    let created = sys
        .claims_api()
        .create(&PostParams::default(), &claim)
        .await
        .unwrap();
    if version == KubeVersion::V1_19 {
        // v1.19 does not know the field and drops it: an ordinary claim.
        assert_eq!(created.spec.unwrap().volume_attributes_class_name, None);
        check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
        return;
    }
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 1, Duration::from_secs(30))
            .await,
    );
    let events = sys.event_values().await.unwrap();
    let warning = events
        .iter()
        .find(|e| e["reason"] == "ProvisioningFailed")
        .unwrap();
    assert_eq!(warning["type"], "Warning", "{warning}");
    assert!(
        warning["note"]
            .as_str()
            .unwrap_or("")
            .contains("VolumeAttributesClass \"gold\""),
        "{warning}"
    );
    assert_eq!(sys.pvs().await.unwrap().len(), 0);
    assert_eq!(sys.dir_count(), 0);
}

on_both_planes!(
    read_write_once_pod_claims_are_provisioned,
    storage_class_set_after_creation_is_provisioned_on_the_update,
    a_volume_attributes_class_gets_a_warning_and_no_volume,
);
