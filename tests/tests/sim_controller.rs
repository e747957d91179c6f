//! The PV binder the services rely on, pinned on the real
//! kube-controller-manager (v1.19 and v1.37) and on the simulator's emulation of it
//! (`on_both_servers!`: `name::sim` and `name::real_v1_19`, `name::real_v1_37`, the latter on the test
//! binary's shared real cluster): the storage-provisioner annotation on claims
//! of an external provisioner's class, binding of a volume pre-bound by a
//! provisioner (`pv.kubernetes.io/bind-completed`,
//! `pv.kubernetes.io/bound-by-controller`, our `pv.kubernetes.io/provisioned-by`
//! kept), phases (claim Pending → Bound; volume Available, Bound → Released
//! when the claim is deleted, with reclaim policy Delete left to the external
//! provisioner), pvc-/pv-protection finalizers, WaitForFirstConsumer and the
//! DefaultStorageClass admission. Switching the emulation off and its speed
//! are simulator-only.

use e2e::harness::ApiPlane;
use e2e::on_both_servers;
use e2e::realkube::KubeVersion;
use e2e::sim::{SimConfig, Simulator};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::{json, Value};
use std::time::Duration;

/// Poll `api` (every 100 ms, at most 60 s) until `f` holds for object `name`
/// (as JSON; `None` when it does not exist) and return that state.
async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    f: impl Fn(Option<&Value>) -> bool,
) -> Option<Value>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let get = || async {
        api.get_opt(name)
            .await
            .unwrap()
            .map(|o| serde_json::to_value(o).unwrap())
    };
    for _ in 0..600 {
        let o = get().await;
        if f(o.as_ref()) {
            return o;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "timed out waiting for {name}: {what}; now {:?}",
        get().await
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

const BETA_PROVISIONER: &str = "volume.beta.kubernetes.io/storage-provisioner";
const GA_PROVISIONER: &str = "volume.kubernetes.io/storage-provisioner";

on_both_servers!(
    provisioning_annotation_binding_and_release,
    wait_for_first_consumer_needs_selected_node,
    available_volumes_and_default_class,
);

async fn provisioning_annotation_binding_and_release(t: ApiPlane) {
    let c = t.client();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let (ext, intree, pv_name) = (t.name("ext"), t.name("intree"), t.name("pvc-1"));
    scs.create(
        &PostParams::default(),
        &sc(&ext, "example.com/hostpath", "Immediate"),
    )
    .await
    .unwrap();
    scs.create(
        &PostParams::default(),
        &sc(&intree, "kubernetes.io/no-provisioner", "Immediate"),
    )
    .await
    .unwrap();

    let claim = pvcs
        .create(&PostParams::default(), &pvc("c1", &ext))
        .await
        .unwrap();
    // admission adds pvc-protection
    assert_eq!(
        claim.metadata.finalizers.as_deref().unwrap(),
        ["kubernetes.io/pvc-protection".to_string()]
    );
    let o = wait_for(&pvcs, "c1", "annotated", |o| {
        o.is_some_and(|o| ann(o, BETA_PROVISIONER).is_some())
    })
    .await
    .unwrap();
    // the beta annotation is what v1.19 sets; the GA one came with v1.23,
    // which sets both (as the simulator does)
    assert_eq!(ann(&o, BETA_PROVISIONER), Some("example.com/hostpath"));
    match t.version() {
        KubeVersion::V1_19 => assert_eq!(ann(&o, GA_PROVISIONER), None, "{o}"),
        KubeVersion::V1_37 => assert_eq!(ann(&o, GA_PROVISIONER), Some("example.com/hostpath")),
    }
    assert_eq!(o["status"]["phase"], "Pending");
    // in-tree provisioner: not annotated
    pvcs.create(&PostParams::default(), &pvc("c2", &intree))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let c2 = serde_json::to_value(pvcs.get("c2").await.unwrap()).unwrap();
    assert!(ann(&c2, BETA_PROVISIONER).is_none(), "{c2}");
    assert!(ann(&c2, GA_PROVISIONER).is_none(), "{c2}");

    // a PV pre-bound to the claim (as a provisioner creates it) gets bound
    let pv = pvs
        .create(&PostParams::default(), &pv_for(&pv_name, &claim))
        .await
        .unwrap();
    assert_eq!(
        pv.metadata.finalizers.as_deref().unwrap(),
        ["kubernetes.io/pv-protection".to_string()]
    );
    let o = wait_for(&pvcs, "c1", "bound", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Bound")
    })
    .await
    .unwrap();
    assert_eq!(o["spec"]["volumeName"], pv_name.as_str());
    assert_eq!(ann(&o, "pv.kubernetes.io/bind-completed"), Some("yes"));
    assert_eq!(ann(&o, "pv.kubernetes.io/bound-by-controller"), Some("yes"));
    assert_eq!(o["status"]["capacity"]["storage"], "2Gi");
    assert_eq!(o["status"]["accessModes"], json!(["ReadWriteOnce"]));
    let p = wait_for(&pvs, &pv_name, "bound", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Bound")
    })
    .await
    .unwrap();
    // the PV's claimRef was set by the provisioner, so no bound-by-controller
    // on it, and its provisioned-by annotation stays ours
    assert!(
        ann(&p, "pv.kubernetes.io/bound-by-controller").is_none(),
        "{p}"
    );
    assert_eq!(
        ann(&p, "pv.kubernetes.io/provisioned-by"),
        Some("example.com/hostpath")
    );

    // deleting the claim: pvc-protection removed (no pods), claim gone, PV Released
    pvcs.delete("c1", &DeleteParams::default()).await.unwrap();
    wait_for(&pvcs, "c1", "gone", |o| o.is_none()).await;
    wait_for(&pvs, &pv_name, "released", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Released")
    })
    .await;
    // reclaim policy Delete of an externally provisioned volume is left to
    // the provisioner: the controller manager neither deletes nor fails it
    tokio::time::sleep(Duration::from_secs(2)).await;
    let p = serde_json::to_value(pvs.get(&pv_name).await.unwrap()).unwrap();
    assert_eq!(p["status"]["phase"], "Released", "{p}");
    assert!(p["metadata"]["deletionTimestamp"].is_null(), "{p}");
    assert_eq!(
        ann(&p, "pv.kubernetes.io/provisioned-by"),
        Some("example.com/hostpath")
    );
    // deleting a Released PV: pv-protection removed, then gone
    pvs.delete(&pv_name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&pvs, &pv_name, "gone", |o| o.is_none()).await;
}

async fn wait_for_first_consumer_needs_selected_node(t: ApiPlane) {
    let c = t.client();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    let wffc = t.name("wffc");
    scs.create(
        &PostParams::default(),
        &sc(&wffc, "example.com/hostpath", "WaitForFirstConsumer"),
    )
    .await
    .unwrap();
    pvcs.create(&PostParams::default(), &pvc("w", &wffc))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let o = serde_json::to_value(pvcs.get("w").await.unwrap()).unwrap();
    assert!(ann(&o, BETA_PROVISIONER).is_none(), "{o}");
    pvcs.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(
            json!({"metadata": {"annotations": {"volume.kubernetes.io/selected-node": "node-1"}}}),
        ),
    )
    .await
    .unwrap();
    wait_for(&pvcs, "w", "annotated", |o| {
        o.is_some_and(|o| ann(o, BETA_PROVISIONER) == Some("example.com/hostpath"))
    })
    .await;
}

async fn available_volumes_and_default_class(t: ApiPlane) {
    let c = t.client();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    let free_name = t.name("free");
    let free: PersistentVolume = serde_json::from_value(json!({
        "metadata": {"name": free_name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/x"}}
    }))
    .unwrap();
    pvs.create(&PostParams::default(), &free).await.unwrap();
    wait_for(&pvs, &free_name, "available", |o| {
        o.is_some_and(|o| o["status"]["phase"] == "Available")
    })
    .await;
    // an Available PV being deleted loses pv-protection and disappears
    pvs.delete(&free_name, &DeleteParams::default())
        .await
        .unwrap();
    wait_for(&pvs, &free_name, "gone", |o| o.is_none()).await;

    // DefaultStorageClass admission (the only default class of the shared
    // server: no other test creates one)
    let default_sc = t.name("default-sc");
    let mut d = sc(&default_sc, "example.com/hostpath", "Immediate");
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
    // not a default for later tests
    scs.delete(&default_sc, &DeleteParams::default())
        .await
        .unwrap();
    assert_eq!(
        q.spec.unwrap().storage_class_name.as_deref(),
        Some(default_sc.as_str())
    );
}

/// Simulator-only: the emulation switched off annotates nothing.
#[tokio::test]
async fn switched_off_emulation_does_nothing() {
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
    let o = off
        .object("persistentvolumeclaims", "default", "x")
        .unwrap();
    assert!(ann(&o, GA_PROVISIONER).is_none());
    assert!(ann(&o, BETA_PROVISIONER).is_none());
}

/// Simulator-only: the emulation's speed (a real controller manager binds at
/// its own pace, with its own rate limits).
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
