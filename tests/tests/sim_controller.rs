//! The kube-controller-manager emulation: storage-provisioner annotations, binding,
//! Available/Released phases, pvc-/pv-protection finalizers.

use e2e::sim::{SimConfig, SimHandle, Simulator};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::time::Duration;

async fn wait_for(
    sim: &SimHandle,
    res: &str,
    ns: &str,
    name: &str,
    what: &str,
    f: impl Fn(Option<&Value>) -> bool,
) -> Option<Value> {
    for _ in 0..300 {
        let o = sim.object(res, ns, name);
        if f(o.as_ref()) {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    panic!(
        "timed out waiting for {res} {ns}/{name}: {what}; now {:?}",
        sim.object(res, ns, name)
    );
}

fn sc(name: &str, prov: &str, mode: &str) -> StorageClass {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "provisioner": prov, "volumeBindingMode": mode}),
    )
    .unwrap()
}

fn pvc(name: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": class}
    }))
    .unwrap()
}

fn pv_for(name: &str, claim: &PersistentVolumeClaim) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name, "annotations": {"pv.kubernetes.io/provisioned-by": "example.com/hostpath"}},
        "spec": {
            "capacity": {"storage": "2Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"},
            "persistentVolumeReclaimPolicy": "Delete", "storageClassName": claim.spec.as_ref().unwrap().storage_class_name,
            "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": claim.metadata.namespace,
                         "name": claim.metadata.name, "uid": claim.metadata.uid}
        }
    }))
    .unwrap()
}

fn ann<'a>(o: &'a Value, k: &str) -> Option<&'a str> {
    o["metadata"]["annotations"][k].as_str()
}

#[tokio::test]
async fn provisioning_annotation_binding_and_release() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let c = sim.client().unwrap();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    scs.create(
        &PostParams::default(),
        &sc("ext", "example.com/hostpath", "Immediate"),
    )
    .await
    .unwrap();
    scs.create(
        &PostParams::default(),
        &sc("intree", "kubernetes.io/no-provisioner", "Immediate"),
    )
    .await
    .unwrap();

    let claim = pvcs
        .create(&PostParams::default(), &pvc("c1", "ext"))
        .await
        .unwrap();
    // admission adds pvc-protection
    assert_eq!(
        claim.metadata.finalizers.as_deref().unwrap(),
        ["kubernetes.io/pvc-protection".to_string()]
    );
    let o = wait_for(
        &sim,
        "persistentvolumeclaims",
        "default",
        "c1",
        "annotated",
        |o| o.is_some_and(|o| ann(o, "volume.kubernetes.io/storage-provisioner").is_some()),
    )
    .await
    .unwrap();
    assert_eq!(
        ann(&o, "volume.kubernetes.io/storage-provisioner"),
        Some("example.com/hostpath")
    );
    assert_eq!(
        ann(&o, "volume.beta.kubernetes.io/storage-provisioner"),
        Some("example.com/hostpath")
    );
    // in-tree provisioner: not annotated
    pvcs.create(&PostParams::default(), &pvc("c2", "intree"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(ann(
        &sim.object("persistentvolumeclaims", "default", "c2")
            .unwrap(),
        "volume.kubernetes.io/storage-provisioner"
    )
    .is_none());

    // a PV pre-bound to the claim (as a provisioner creates it) gets bound
    let pv = pvs
        .create(&PostParams::default(), &pv_for("pvc-1", &claim))
        .await
        .unwrap();
    assert_eq!(
        pv.metadata.finalizers.as_deref().unwrap(),
        ["kubernetes.io/pv-protection".to_string()]
    );
    let o = wait_for(
        &sim,
        "persistentvolumeclaims",
        "default",
        "c1",
        "bound",
        |o| o.is_some_and(|o| o["status"]["phase"] == "Bound"),
    )
    .await
    .unwrap();
    assert_eq!(o["spec"]["volumeName"], "pvc-1");
    assert_eq!(ann(&o, "pv.kubernetes.io/bind-completed"), Some("yes"));
    assert_eq!(ann(&o, "pv.kubernetes.io/bound-by-controller"), Some("yes"));
    assert_eq!(o["status"]["capacity"]["storage"], "2Gi");
    assert_eq!(o["status"]["accessModes"], json!(["ReadWriteOnce"]));
    let p = wait_for(&sim, "persistentvolumes", "", "pvc-1", "bound", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Bound")
    })
    .await
    .unwrap();
    // the PV's claimRef was set by the provisioner, so no bound-by-controller on it
    assert!(ann(&p, "pv.kubernetes.io/bound-by-controller").is_none());

    // deleting the claim: pvc-protection removed (no pods), claim gone, PV Released
    pvcs.delete("c1", &DeleteParams::default()).await.unwrap();
    wait_for(
        &sim,
        "persistentvolumeclaims",
        "default",
        "c1",
        "gone",
        |o| o.is_none(),
    )
    .await;
    wait_for(&sim, "persistentvolumes", "", "pvc-1", "released", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Released")
    })
    .await;
    // deleting a Released PV: pv-protection removed, then gone
    pvs.delete("pvc-1", &DeleteParams::default()).await.unwrap();
    wait_for(&sim, "persistentvolumes", "", "pvc-1", "gone", |o| {
        o.is_none()
    })
    .await;
}

#[tokio::test]
async fn wait_for_first_consumer_needs_selected_node() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let c = sim.client().unwrap();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    scs.create(
        &PostParams::default(),
        &sc("wffc", "example.com/hostpath", "WaitForFirstConsumer"),
    )
    .await
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc("w", "wffc"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    let o = sim
        .object("persistentvolumeclaims", "default", "w")
        .unwrap();
    assert!(ann(&o, "volume.kubernetes.io/storage-provisioner").is_none());
    pvcs.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}}),
        ),
    )
    .await
    .unwrap();
    wait_for(
        &sim,
        "persistentvolumeclaims",
        "default",
        "w",
        "annotated",
        |o| {
            o.is_some_and(|o| {
                ann(o, "volume.kubernetes.io/storage-provisioner") == Some("example.com/hostpath")
            })
        },
    )
    .await;
}

#[tokio::test]
async fn available_volumes_default_class_and_switches() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    let free: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": "free"},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &free).await.unwrap();
    wait_for(&sim, "persistentvolumes", "", "free", "available", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Available")
    })
    .await;
    // an Available PV being deleted loses pv-protection and disappears
    pvs.delete("free", &DeleteParams::default()).await.unwrap();
    wait_for(&sim, "persistentvolumes", "", "free", "gone", |o| {
        o.is_none()
    })
    .await;

    // DefaultStorageClass admission
    let mut d = sc("default-sc", "example.com/hostpath", "Immediate");
    d.metadata.annotations = Some(
        [(
            "storageclass.kubernetes.io/is-default-class".to_string(),
            "true".to_string(),
        )]
        .into(),
    );
    scs.create(&PostParams::default(), &d).await.unwrap();
    let mut q = pvc("nocls", "");
    q.spec.as_mut().unwrap().storage_class_name = None;
    let q = pvcs.create(&PostParams::default(), &q).await.unwrap();
    assert_eq!(
        q.spec.unwrap().storage_class_name.as_deref(),
        Some("default-sc")
    );

    // switched off: nothing happens
    let off = Simulator::start(SimConfig {
        pv_controller: e2e::sim::PvControllerConfig {
            enabled: false,
            ..Default::default()
        },
        ..SimConfig::default()
    })
    .await
    .unwrap();
    let c2 = off.client().unwrap();
    Api::<StorageClass>::all(c2.clone())
        .create(
            &PostParams::default(),
            &sc("ext", "example.com/hostpath", "Immediate"),
        )
        .await
        .unwrap();
    Api::<PersistentVolumeClaim>::default_namespaced(c2.clone())
        .create(&PostParams::default(), &pvc("x", "ext"))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert!(ann(
        &off.object("persistentvolumeclaims", "default", "x")
            .unwrap(),
        "volume.kubernetes.io/storage-provisioner"
    )
    .is_none());
}

#[tokio::test]
async fn many_claims_bind_quickly() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    let c = sim.client().unwrap();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    scs.create(
        &PostParams::default(),
        &sc("ext", "example.com/hostpath", "Immediate"),
    )
    .await
    .unwrap();
    let t0 = std::time::Instant::now();
    let n = 200;
    let mut claims = Vec::new();
    for i in 0..n {
        claims.push(
            pvcs.create(&PostParams::default(), &pvc(&format!("m{i}"), "ext"))
                .await
                .unwrap(),
        );
    }
    for cl in &claims {
        let name = format!("pvc-{}", cl.metadata.uid.as_ref().unwrap());
        pvs.create(&PostParams::default(), &pv_for(&name, cl))
            .await
            .unwrap();
    }
    for _ in 0..500 {
        let bound = sim
            .objects("persistentvolumeclaims")
            .iter()
            .filter(|o| o["status"]["phase"] == "Bound")
            .count();
        if bound == n {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let bound = sim
        .objects("persistentvolumeclaims")
        .iter()
        .filter(|o| o["status"]["phase"] == "Bound")
        .count();
    assert_eq!(bound, n, "all claims bound");
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
}
