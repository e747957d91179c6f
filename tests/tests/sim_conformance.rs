//! Conformance of the API-server simulator with kube-apiserver: resourceVersions, errors
//! (reasons, codes, messages), validation, patch types, status subresource, deletion with
//! finalizers and preconditions. Expected values are the real server's.

use e2e::sim::{SimConfig, SimHandle, Simulator};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Status as ErrorResponse;
use serde_json::{json, Value};

async fn bare() -> SimHandle {
    Simulator::start(SimConfig::bare()).await.unwrap()
}

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"}}
    }))
    .unwrap()
}

fn pvc(name: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": class}
    }))
    .unwrap()
}

fn sc(name: &str, prov: &str) -> StorageClass {
    serde_json::from_value(
        json!({"metadata": {"name": name}, "provisioner": prov, "parameters": {"a": "b"}}),
    )
    .unwrap()
}

fn api_err(e: kube::Error) -> ErrorResponse {
    match e {
        kube::Error::Api(s) => *s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

fn rv<K: kube::Resource>(o: &K) -> u64 {
    o.meta().resource_version.as_ref().unwrap().parse().unwrap()
}

#[tokio::test]
async fn discovery_and_version() {
    let sim = bare().await;
    let client = sim.client().unwrap();
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");
    let d = kube::discovery::Discovery::new(client.clone())
        .run()
        .await
        .unwrap();
    let mut found = Vec::new();
    for g in d.groups() {
        for (ar, caps) in g.recommended_resources() {
            found.push((
                ar.group.clone(),
                ar.plural.clone(),
                caps.scope == kube::discovery::Scope::Namespaced,
            ));
        }
    }
    for (g, p, namespaced) in [
        ("", "persistentvolumes", false),
        ("", "persistentvolumeclaims", true),
        ("", "nodes", false),
        ("", "namespaces", false),
        ("", "events", true),
        ("storage.k8s.io", "storageclasses", false),
        ("coordination.k8s.io", "leases", true),
        ("events.k8s.io", "events", true),
    ] {
        assert!(
            found.contains(&(g.to_string(), p.to_string(), namespaced)),
            "{g}/{p} missing in {found:?}"
        );
    }
}

#[tokio::test]
async fn server_assigned_metadata_and_monotonic_rv_across_kinds() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    let a = scs
        .create(&PostParams::default(), &sc("a", "example.com/x"))
        .await
        .unwrap();
    let b = pvs.create(&PostParams::default(), &pv("b")).await.unwrap();
    let d = pvcs
        .create(&PostParams::default(), &pvc("d", "a"))
        .await
        .unwrap();
    assert!(rv(&a) < rv(&b) && rv(&b) < rv(&d));
    for m in [&a.metadata, &b.metadata, &d.metadata] {
        assert_eq!(m.uid.as_ref().unwrap().len(), 36);
        assert!(m.creation_timestamp.is_some());
        assert!(m.deletion_timestamp.is_none());
    }
    // defaults applied as the real server does
    assert_eq!(a.reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(a.volume_binding_mode.as_deref(), Some("Immediate"));
    let bs = b.spec.as_ref().unwrap();
    assert_eq!(
        bs.persistent_volume_reclaim_policy.as_deref(),
        Some("Retain")
    );
    assert_eq!(bs.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(b.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(d.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
    // list RV is the store's latest
    let l = pvs.list(&ListParams::default()).await.unwrap();
    assert_eq!(
        l.metadata
            .resource_version
            .as_deref()
            .unwrap()
            .parse::<u64>()
            .unwrap(),
        rv(&d)
    );
    // generateName
    let mut g = pv("");
    g.metadata.name = None;
    g.metadata.generate_name = Some("gen-".into());
    let g = pvs.create(&PostParams::default(), &g).await.unwrap();
    let n = g.metadata.name.unwrap();
    assert!(n.starts_with("gen-") && n.len() == 9, "{n}");
    // an update with no change keeps the resourceVersion (no-op write)
    let cur = pvs.get("b").await.unwrap();
    let same = pvs
        .replace("b", &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&cur));
}

#[tokio::test]
async fn error_statuses_match_real_server() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let scs: Api<StorageClass> = Api::all(c.clone());

    let e = api_err(pvs.get("nope").await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, "persistentvolumes \"nope\" not found");
    let e = api_err(scs.get("nope").await.unwrap_err());
    assert_eq!(
        e.message,
        "storageclasses.storage.k8s.io \"nope\" not found"
    );

    pvs.create(&PostParams::default(), &pv("x")).await.unwrap();
    let e = api_err(
        pvs.create(&PostParams::default(), &pv("x"))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(e.message, "persistentvolumes \"x\" already exists");

    let mut stale = pvs.get("x").await.unwrap();
    let mut fresh = stale.clone();
    fresh.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    pvs.replace("x", &PostParams::default(), &fresh)
        .await
        .unwrap();
    stale.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
    let e = api_err(
        pvs.replace("x", &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        "Operation cannot be fulfilled on persistentvolumes \"x\": the object has been modified; please apply your changes to the latest version and try again"
    );
    // PUT without resourceVersion is unconditional for these kinds
    stale.metadata.resource_version = None;
    let ok = pvs
        .replace("x", &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(ok.metadata.labels.unwrap()["a"], "2");
    // PUT of a missing object: 404 (no create-on-update)
    let e = api_err(
        pvs.replace("missing", &PostParams::default(), &pv("missing"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // raw Status body shape
    let r = e2e::sim::raw::request(
        sim.addr(),
        "GET",
        "/api/v1/persistentvolumes/nope",
        None,
        b"",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 404);
    assert_eq!(
        r.json(),
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": "persistentvolumes \"nope\" not found", "reason": "NotFound",
               "details": {"name": "nope", "kind": "persistentvolumes"}, "code": 404})
    );
    let r = e2e::sim::raw::request(
        sim.addr(),
        "GET",
        "/apis/storage.k8s.io/v1/storageclasses/nope",
        None,
        b"",
    )
    .await
    .unwrap();
    assert_eq!(
        r.json()["details"],
        json!({"name": "nope", "group": "storage.k8s.io", "kind": "storageclasses"})
    );
}

#[tokio::test]
async fn validation_rejects_what_the_real_server_rejects() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    let scs: Api<StorageClass> = Api::all(c.clone());

    let mut p = pv("nocap");
    p.spec.as_mut().unwrap().capacity = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert_eq!(
        e.message,
        "PersistentVolume \"nocap\" is invalid: spec.capacity: Required value"
    );

    let mut p = pv("nomodes");
    p.spec.as_mut().unwrap().access_modes = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!(
        e.message,
        "PersistentVolume \"nomodes\" is invalid: spec.accessModes: Required value"
    );

    let mut p = pv("nosource");
    p.spec.as_mut().unwrap().host_path = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!(e.message, "PersistentVolume \"nosource\" is invalid: spec: Required value: must specify a volume type");

    let e = api_err(
        pvs.create(&PostParams::default(), &pv("Bad_Name"))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.starts_with("PersistentVolume \"Bad_Name\" is invalid: metadata.name: Invalid value: \"Bad_Name\": a lowercase RFC 1123 subdomain"), "{}", e.message);

    let mut q = pvc("nomodes", "x");
    q.spec.as_mut().unwrap().access_modes = None;
    let e = api_err(pvcs.create(&PostParams::default(), &q).await.unwrap_err());
    assert_eq!(
        e.message,
        "PersistentVolumeClaim \"nomodes\" is invalid: spec.accessModes: Required value: at least 1 access mode is required"
    );
    let mut q = pvc("nostorage", "x");
    q.spec.as_mut().unwrap().resources = None;
    let e = api_err(pvcs.create(&PostParams::default(), &q).await.unwrap_err());
    assert_eq!(
        e.message,
        "PersistentVolumeClaim \"nostorage\" is invalid: spec.resources[storage]: Required value"
    );

    let e = api_err(
        scs.create(&PostParams::default(), &sc("noprov", ""))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e.message,
        "StorageClass.storage.k8s.io \"noprov\" is invalid: provisioner: Required value"
    );

    // immutable fields
    scs.create(&PostParams::default(), &sc("fixed", "example.com/a"))
        .await
        .unwrap();
    let e = api_err(
        scs.patch(
            "fixed",
            &PatchParams::default(),
            &Patch::Merge(json!({"provisioner": "example.com/b", "parameters": {"a": "c"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(
        e.message,
        "StorageClass.storage.k8s.io \"fixed\" is invalid: [parameters: Forbidden: updates to parameters are forbidden., provisioner: Forbidden: updates to provisioner are forbidden.]"
    );
    pvs.create(&PostParams::default(), &pv("src"))
        .await
        .unwrap();
    let e = api_err(
        pvs.patch(
            "src",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hostPath": {"path": "/other"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(e.message.contains("spec.persistentvolumesource: Forbidden: spec.persistentvolumesource is immutable after creation"), "{}", e.message);
    // claim spec is immutable (except requests)
    pvcs.create(&PostParams::default(), &pvc("imm", "x"))
        .await
        .unwrap();
    let e = api_err(
        pvcs.patch(
            "imm",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"storageClassName": "y"}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    assert!(
        e.message
            .contains("spec: Forbidden: spec is immutable after creation"),
        "{}",
        e.message
    );

    // namespace must exist (NamespaceLifecycle)
    let other: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "nope");
    let e = api_err(
        other
            .create(&PostParams::default(), &pvc("a", "x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (404, "namespaces \"nope\" not found")
    );
    let nss: Api<Namespace> = Api::all(c.clone());
    let e = api_err(
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": "a.b"}})).unwrap(),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422, "namespace names are DNS labels");
}

#[tokio::test]
async fn patch_types() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let mut p = pv("p");
    p.metadata.finalizers = Some(vec!["a".into(), "b".into()]);
    p.metadata.annotations = Some([("keep".to_string(), "1".to_string())].into());
    pvs.create(&PostParams::default(), &p).await.unwrap();

    // merge patch: annotations merge, null removes, lists replace
    let o = pvs
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"new": "2", "keep": null}, "finalizers": ["c"]}})))
        .await
        .unwrap();
    let ann = o.metadata.annotations.clone().unwrap();
    assert_eq!(
        (ann.get("new").map(|s| s.as_str()), ann.get("keep")),
        (Some("2"), None)
    );
    assert_eq!(o.metadata.finalizers.as_deref().unwrap(), ["c".to_string()]);

    // strategic merge: finalizers (no patch strategy) replace; labels merge
    let o = pvs
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"labels": {"l": "1"}, "finalizers": ["d", "e"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        o.metadata.finalizers.as_deref().unwrap(),
        ["d".to_string(), "e".to_string()]
    );
    assert_eq!(o.metadata.labels.unwrap()["l"], "1");
    // strategic $deleteFromPrimitiveList
    let o = pvs
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["d"]}})),
        )
        .await
        .unwrap();
    assert_eq!(o.metadata.finalizers.as_deref().unwrap(), ["e".to_string()]);

    // json patch, with test op
    let jp: json_patch_ops::Ops = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "e"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "f"},
        {"op": "replace", "path": "/spec/capacity/storage", "value": "2Gi"}
    ]));
    let o = pvs
        .patch("p", &PatchParams::default(), &jp.0)
        .await
        .unwrap();
    assert_eq!(
        o.metadata.finalizers.as_deref().unwrap(),
        ["e".to_string(), "f".to_string()]
    );
    assert_eq!(o.spec.unwrap().capacity.unwrap()["storage"].0, "2Gi");
    let bad: json_patch_ops::Ops =
        json_patch_ops::ops(json!([{"op": "test", "path": "/metadata/name", "value": "other"}]));
    let e = api_err(
        pvs.patch("p", &PatchParams::default(), &bad.0)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    // optimistic concurrency inside a patch
    let e = api_err(
        pvs.patch(
            "p",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"resourceVersion": "1", "labels": {"x": "y"}}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));

    // patch of a missing object
    let e = api_err(
        pvs.patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // server-side apply: creates, then conflicts for another manager, force wins
    let leases: Api<Lease> = Api::default_namespaced(c.clone());
    let cfg = |holder: &str| json!({"apiVersion": "coordination.k8s.io/v1", "kind": "Lease", "metadata": {"name": "l"}, "spec": {"holderIdentity": holder, "leaseDurationSeconds": 10}});
    let l = leases
        .patch("l", &PatchParams::apply("m1"), &Patch::Apply(cfg("one")))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("one"));
    let mf = l.metadata.managed_fields.unwrap();
    assert_eq!(
        (mf[0].manager.as_deref(), mf[0].operation.as_deref()),
        (Some("m1"), Some("Apply"))
    );
    let e = api_err(
        leases
            .patch("l", &PatchParams::apply("m2"), &Patch::Apply(cfg("two")))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .starts_with("Apply failed with 1 conflict: conflict with \"m1\""),
        "{}",
        e.message
    );
    assert!(e.message.ends_with(".spec.holderIdentity"), "{}", e.message);
    // same value: shared ownership, no conflict
    leases
        .patch("l", &PatchParams::apply("m2"), &Patch::Apply(cfg("one")))
        .await
        .unwrap();
    let l = leases
        .patch(
            "l",
            &PatchParams::apply("m2").force(),
            &Patch::Apply(cfg("two")),
        )
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("two"));
    // an Update that removes the field frees it: then another applier does not conflict
    leases
        .patch(
            "l",
            &PatchParams::default(),
            &Patch::Strategic(json!({"spec": {"holderIdentity": null}})),
        )
        .await
        .unwrap();
    let l = leases
        .patch("l", &PatchParams::apply("m3"), &Patch::Apply(cfg("three")))
        .await
        .unwrap();
    assert_eq!(l.spec.unwrap().holder_identity.as_deref(), Some("three"));
    // apply without fieldManager is rejected
    let r = e2e::sim::raw::request(
        sim.addr(),
        "PATCH",
        "/apis/coordination.k8s.io/v1/namespaces/default/leases/l",
        Some("application/apply-patch+yaml"),
        cfg("x").to_string().as_bytes(),
    )
    .await
    .unwrap();
    assert_eq!(r.status, 422);
    // unknown patch content type
    let r = e2e::sim::raw::request(
        sim.addr(),
        "PATCH",
        "/api/v1/persistentvolumes/p",
        Some("text/plain"),
        b"{}",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 415);
}

/// `Patch::Json` needs a `json_patch::Patch`; build one from JSON through serde.
mod json_patch_ops {
    pub struct Ops(pub kube::api::Patch<()>);
    pub fn ops(v: serde_json::Value) -> Ops {
        Ops(kube::api::Patch::Json(serde_json::from_value(v).unwrap()))
    }
}

#[tokio::test]
async fn status_subresource() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    pvcs.create(&PostParams::default(), &pvc("s", "x"))
        .await
        .unwrap();
    // main endpoint ignores status
    let o = pvcs
        .patch(
            "s",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"a": "b"}}, "status": {"phase": "Bound"}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(o.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(o.metadata.labels.unwrap()["a"], "b");
    // status endpoint changes only status
    let o = pvcs
        .patch_status(
            "s",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumeName": "zzz"}, "status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();
    assert_eq!(o.status.as_ref().unwrap().phase.as_deref(), Some("Lost"));
    assert_eq!(o.spec.as_ref().unwrap().volume_name, None);
    let mut o2 = o.clone();
    o2.status.as_mut().unwrap().phase = Some("Pending".into());
    o2.spec.as_mut().unwrap().volume_name = Some("qqq".into());
    let o3 = pvcs
        .replace_status("s", &PostParams::default(), &o2)
        .await
        .unwrap();
    assert_eq!(o3.status.unwrap().phase.as_deref(), Some("Pending"));
    assert_eq!(o3.spec.unwrap().volume_name, None);
    let got = pvcs.get_status("s").await.unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("s"));
}

#[tokio::test]
async fn deletion_with_finalizers_and_preconditions() {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());

    // no finalizers: deleted at once, the response is a Success Status
    pvs.create(&PostParams::default(), &pv("plain"))
        .await
        .unwrap();
    let r = pvs.delete("plain", &DeleteParams::default()).await.unwrap();
    let st = r.right().expect("Status for an immediate delete");
    assert_eq!(
        st.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    assert_eq!(st.details.unwrap().name, "plain");
    assert_eq!(api_err(pvs.get("plain").await.unwrap_err()).code, 404);
    assert_eq!(
        api_err(
            pvs.delete("plain", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .code,
        404
    );

    let mut p = pv("fin");
    p.metadata.finalizers = Some(vec!["example.com/f".into()]);
    let created = pvs.create(&PostParams::default(), &p).await.unwrap();
    let mut w = pvs
        .watch(
            &WatchParams::default().fields("metadata.name=fin"),
            &created.metadata.resource_version.clone().unwrap(),
        )
        .await
        .unwrap()
        .boxed();

    // preconditions
    let bad_uid = DeleteParams {
        preconditions: Some(Preconditions {
            uid: Some("wrong".into()),
            resource_version: None,
        }),
        ..Default::default()
    };
    let e = api_err(pvs.delete("fin", &bad_uid).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message
            .contains("Precondition failed: UID in precondition: wrong, UID in object meta: "),
        "{}",
        e.message
    );
    let bad_rv = DeleteParams {
        preconditions: Some(Preconditions {
            uid: None,
            resource_version: Some("1".into()),
        }),
        ..Default::default()
    };
    assert_eq!(
        api_err(pvs.delete("fin", &bad_rv).await.unwrap_err()).code,
        409
    );

    let r = pvs.delete("fin", &DeleteParams::default()).await.unwrap();
    let obj = r.left().expect("object with deletionTimestamp");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.deletion_grace_period_seconds, Some(0));
    // deleting again returns it unchanged
    let again = pvs
        .delete("fin", &DeleteParams::default())
        .await
        .unwrap()
        .left()
        .unwrap();
    assert_eq!(
        again.metadata.resource_version,
        obj.metadata.resource_version
    );
    // new finalizers are forbidden while deleting
    let e = api_err(
        pvs.patch(
            "fin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": ["example.com/f", "example.com/g"]}})),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"), "{}", e.message);
    // removing the last finalizer deletes it
    pvs.patch(
        "fin",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    assert_eq!(api_err(pvs.get("fin").await.unwrap_err()).code, 404);
    let mut seen = Vec::new();
    while let Some(ev) = tokio::time::timeout(std::time::Duration::from_secs(5), w.next())
        .await
        .unwrap()
    {
        match ev.unwrap() {
            WatchEvent::Modified(o) => {
                seen.push(("MODIFIED", o.metadata.deletion_timestamp.is_some()))
            }
            WatchEvent::Deleted(o) => {
                seen.push(("DELETED", o.metadata.deletion_timestamp.is_some()));
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec![("MODIFIED", true), ("DELETED", true)]);
}

#[tokio::test]
async fn list_selectors_and_pagination() {
    let sim = bare().await;
    let c = sim.client().unwrap();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    for i in 0..25 {
        let mut p = pv(&format!("pv-{i:02}"));
        p.metadata.labels = Some(
            [(
                "parity".to_string(),
                if i % 2 == 0 { "even" } else { "odd" }.to_string(),
            )]
            .into(),
        );
        pvs.create(&PostParams::default(), &p).await.unwrap();
    }
    let l = pvs
        .list(&ListParams::default().labels("parity=even"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 13);
    let l = pvs
        .list(&ListParams::default().labels("parity in (odd),parity!=even"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 12);
    let l = pvs
        .list(&ListParams::default().fields("metadata.name=pv-03"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let l = pvs
        .list(&ListParams::default().fields("metadata.name!=pv-03"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 24);
    let e = api_err(
        pvs.list(&ListParams::default().fields("spec.foo=bar"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (400, "field label not supported: spec.foo")
    );
    // pagination
    let mut names = Vec::new();
    let mut lp = ListParams::default().limit(10);
    loop {
        let page = pvs.list(&lp).await.unwrap();
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(names.len(), 25);
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 25);
    // namespaced list across namespaces
    let pvcs_all: Api<PersistentVolumeClaim> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(c.clone());
    pvcs.create(&PostParams::default(), &pvc("c1", "x"))
        .await
        .unwrap();
    let l = pvcs_all
        .list(&ListParams::default().fields("metadata.namespace=default"))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let sys: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "kube-system");
    assert_eq!(
        sys.list(&ListParams::default()).await.unwrap().items.len(),
        0
    );
    let _ = Value::Null;
}
