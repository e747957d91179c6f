//! The real-plane RBAC check itself, on a real kube-apiserver (v1.19 and v1.37) with the
//! RBAC rendered from `deploy/base`: a service identity's call that the deploy
//! does not grant is refused with a 403, and the end-of-run check
//! (`RealPlane::finish_checks`, run by every real-plane scenario) fails on it
//! naming the service and the call. Real plane only (the simulator enforces
//! no RBAC); skipped with one line without the binaries.

use e2e::harness::{ControlPlane, Plane, Service};
use e2e::realkube::Assets;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{Api, PostParams};

async fn an_ungranted_call_is_refused_and_fails_the_audit_check(assets: Assets) {
    let mut plane = Plane::start(ControlPlane::Real(assets)).await.unwrap();
    let writer = plane.service_client(Service::PvWriter).await.unwrap();

    // Granted: pv-writer creates PVs.
    let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "pvc-granted"},
        "spec": {
            "capacity": {"storage": "1Mi"}, "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": "/tmp/pvc-granted"},
        }
    }))
    .unwrap();
    Api::<PersistentVolume>::all(writer.clone())
        .create(&PostParams::default(), &pv)
        .await
        .expect("the deploy grants pv-writer create on PVs");
    assert!(
        plane.real().unwrap().finish_checks().is_ok(),
        "a granted, declared call passes the check"
    );

    // Not granted: pv-writer creating a Node.
    let node: Node =
        serde_json::from_value(serde_json::json!({"metadata": {"name": "intruder"}})).unwrap();
    match Api::<Node>::all(writer)
        .create(&PostParams::default(), &node)
        .await
    {
        Err(kube::Error::Api(e)) => assert_eq!(e.code, 403, "{e:?}"),
        other => panic!("expected a 403, got {other:?}"),
    }
    let real = plane.real_mut().unwrap();
    let problems = real
        .finish_checks()
        .expect_err("the refused call fails the check");
    real.check_on_drop = false;
    assert!(
        problems.contains("pv-writer") && problems.contains("refused (403)"),
        "{problems}"
    );
    assert!(
        problems.contains("made create on /nodes"),
        "an undeclared call is named: {problems}"
    );
}

e2e::on_each_version!(an_ungranted_call_is_refused_and_fails_the_audit_check,);
