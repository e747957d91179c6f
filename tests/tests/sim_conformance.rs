//! Conformance of the API-server simulator with kube-apiserver, run on both:
//! every test is `async fn name(t: ApiPlane)` instantiated by `on_both_servers!`
//! as `name::sim` (the simulator, every emulation on) and `name::real_v1_19`, `name::real_v1_37` (the
//! test binary's shared real kube-apiserver (v1.19 and v1.37) with its controller manager;
//! skipped with one line without the binaries, a failure under `CI=true`).
//! The real server is the reference: expected values are what it answers, and
//! a difference is fixed in the simulator.
//!
//! Covered: resourceVersions, server-assigned metadata and defaults, errors
//! (reasons, codes, messages, raw Status bodies), validation, patch types and
//! server-side apply, the status subresource, deletion with finalizers and
//! preconditions, selectors and pagination.
//!
//! The real cluster runs a controller manager that writes PersistentVolumes
//! and claims on its own (PV binder phases, protection finalizers added back),
//! so steps that need an object nobody else writes use a Lease or a
//! StorageClass; PV/claim behaviour of the controllers is pinned in
//! `sim_controller.rs`.

use e2e::harness::ApiPlane;
use e2e::on_both_servers;
use e2e::realkube::KubeVersion;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, Preconditions};
use kube::core::Status as ErrorResponse;
use serde_json::json;

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

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "h", "leaseDurationSeconds": 10}
    }))
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

on_both_servers!(
    discovery_and_version,
    server_assigned_metadata_and_monotonic_rv_across_kinds,
    error_statuses_match_real_server,
    validation_rejects_what_the_real_server_rejects,
    patch_types,
    status_subresource,
    deletion_with_finalizers_and_preconditions,
    list_selectors_and_pagination,
);

async fn discovery_and_version(t: ApiPlane) {
    let client = t.client();
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

async fn server_assigned_metadata_and_monotonic_rv_across_kinds(t: ApiPlane) {
    let c = t.client();
    let scs: Api<StorageClass> = Api::all(c.clone());
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    let (a_name, b_name) = (t.name("a"), t.name("b"));
    let a = scs
        .create(&PostParams::default(), &sc(&a_name, "example.com/x"))
        .await
        .unwrap();
    let b = pvs
        .create(&PostParams::default(), &pv(&b_name))
        .await
        .unwrap();
    let d = pvcs
        .create(&PostParams::default(), &pvc("d", &a_name))
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
    // StorageObjectInUseProtection admission
    assert_eq!(
        b.metadata.finalizers.as_deref(),
        Some(&["kubernetes.io/pv-protection".to_string()][..])
    );
    assert_eq!(
        d.metadata.finalizers.as_deref(),
        Some(&["kubernetes.io/pvc-protection".to_string()][..])
    );
    // a list's resourceVersion is the server's latest (others may have written since)
    let l = pvs.list(&ListParams::default()).await.unwrap();
    let list_rv: u64 = l.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        list_rv >= rv(&d),
        "list RV {list_rv} < last write {}",
        rv(&d)
    );
    // generateName: the prefix and five random characters
    let mut g = pv("");
    g.metadata.name = None;
    let prefix = t.name("gen-");
    g.metadata.generate_name = Some(prefix.clone());
    let g = pvs.create(&PostParams::default(), &g).await.unwrap();
    let n = g.metadata.name.unwrap();
    assert!(n.starts_with(&prefix) && n.len() == prefix.len() + 5, "{n}");
    // an update with no change keeps the resourceVersion (no-op write); a
    // StorageClass, which no controller writes
    let cur = scs.get(&a_name).await.unwrap();
    let same = scs
        .replace(&a_name, &PostParams::default(), &cur)
        .await
        .unwrap();
    assert_eq!(rv(&same), rv(&cur));
}

async fn error_statuses_match_real_server(t: ApiPlane) {
    let c = t.client();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let scs: Api<StorageClass> = Api::all(c.clone());
    let nope = t.name("nope");

    let e = api_err(pvs.get(&nope).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (404, "NotFound"));
    assert_eq!(e.message, format!("persistentvolumes \"{nope}\" not found"));
    let e = api_err(scs.get(&nope).await.unwrap_err());
    assert_eq!(
        e.message,
        format!("storageclasses.storage.k8s.io \"{nope}\" not found")
    );

    let x = t.name("x");
    pvs.create(&PostParams::default(), &pv(&x)).await.unwrap();
    let e = api_err(
        pvs.create(&PostParams::default(), &pv(&x))
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "AlreadyExists"));
    assert_eq!(
        e.message,
        format!("persistentvolumes \"{x}\" already exists")
    );

    // optimistic concurrency, on a StorageClass (no controller writes it)
    scs.create(&PostParams::default(), &sc(&x, "example.com/x"))
        .await
        .unwrap();
    let mut stale = scs.get(&x).await.unwrap();
    let mut fresh = stale.clone();
    fresh.metadata.labels = Some([("a".to_string(), "1".to_string())].into());
    scs.replace(&x, &PostParams::default(), &fresh)
        .await
        .unwrap();
    stale.metadata.labels = Some([("a".to_string(), "2".to_string())].into());
    let e = api_err(
        scs.replace(&x, &PostParams::default(), &stale)
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert_eq!(
        e.message,
        format!("Operation cannot be fulfilled on storageclasses.storage.k8s.io \"{x}\": the object has been modified; please apply your changes to the latest version and try again")
    );
    // PUT without resourceVersion is unconditional for these kinds
    stale.metadata.resource_version = None;
    let ok = scs
        .replace(&x, &PostParams::default(), &stale)
        .await
        .unwrap();
    assert_eq!(ok.metadata.labels.unwrap()["a"], "2");
    // PUT of a missing object: 404 (no create-on-update)
    let missing = t.name("missing");
    let e = api_err(
        pvs.replace(&missing, &PostParams::default(), &pv(&missing))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // raw Status body shape
    let (status, body) = t
        .raw(
            "GET",
            &format!("/api/v1/persistentvolumes/{nope}"),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 404);
    assert_eq!(
        body,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("persistentvolumes \"{nope}\" not found"), "reason": "NotFound",
               "details": {"name": nope, "kind": "persistentvolumes"}, "code": 404})
    );
    let (_, body) = t
        .raw(
            "GET",
            &format!("/apis/storage.k8s.io/v1/storageclasses/{nope}"),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(
        body["details"],
        json!({"name": nope, "group": "storage.k8s.io", "kind": "storageclasses"})
    );
}

async fn validation_rejects_what_the_real_server_rejects(t: ApiPlane) {
    let c = t.client();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    let scs: Api<StorageClass> = Api::all(c.clone());

    let name = t.name("nocap");
    let mut p = pv(&name);
    p.spec.as_mut().unwrap().capacity = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    // v1.19 renders the missing map as Go does, v1.37 as JSON
    let nil = match t.version() {
        KubeVersion::V1_19 => "core.ResourceList(nil)",
        KubeVersion::V1_37 => "null",
    };
    assert_eq!(
        e.message,
        format!("PersistentVolume \"{name}\" is invalid: [spec.capacity: Required value, spec.capacity: Unsupported value: {nil}: supported values: \"storage\"]")
    );

    let name = t.name("nomodes");
    let mut p = pv(&name);
    p.spec.as_mut().unwrap().access_modes = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!(
        e.message,
        format!("PersistentVolume \"{name}\" is invalid: spec.accessModes: Required value")
    );

    let name = t.name("nosource");
    let mut p = pv(&name);
    p.spec.as_mut().unwrap().host_path = None;
    let e = api_err(pvs.create(&PostParams::default(), &p).await.unwrap_err());
    assert_eq!(
        e.message,
        format!("PersistentVolume \"{name}\" is invalid: spec: Required value: must specify a volume type")
    );

    let name = t.name("Bad_Name");
    let e = api_err(
        pvs.create(&PostParams::default(), &pv(&name))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);
    // v1.19 says "a DNS-1123 subdomain must consist of ...", later versions
    // "a lowercase RFC 1123 subdomain must consist of ..."
    let prefix = format!(
        "PersistentVolume \"{name}\" is invalid: metadata.name: Invalid value: \"{name}\": a "
    );
    assert!(
        e.message.starts_with(&prefix) && e.message.contains("1123 subdomain must consist of"),
        "{}",
        e.message
    );

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

    let name = t.name("noprov");
    let e = api_err(
        scs.create(&PostParams::default(), &sc(&name, ""))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        e.message,
        format!("StorageClass.storage.k8s.io \"{name}\" is invalid: provisioner: Required value")
    );

    // immutable fields
    let fixed = t.name("fixed");
    scs.create(&PostParams::default(), &sc(&fixed, "example.com/a"))
        .await
        .unwrap();
    let e = api_err(
        scs.patch(
            &fixed,
            &PatchParams::default(),
            &Patch::Merge(json!({"provisioner": "example.com/b", "parameters": {"a": "c"}})),
        )
        .await
        .unwrap_err(),
    );
    // v1.37's declarative validation words it differently, in declaration order
    let expected = match t.version() {
        KubeVersion::V1_19 => "[parameters: Forbidden: updates to parameters are forbidden., provisioner: Forbidden: updates to provisioner are forbidden.]",
        KubeVersion::V1_37 => "[provisioner: Invalid value: null: field is immutable, parameters: Invalid value: null: field is immutable]",
    };
    assert_eq!(
        e.message,
        format!("StorageClass.storage.k8s.io \"{fixed}\" is invalid: {expected}")
    );
    let src = t.name("src");
    pvs.create(&PostParams::default(), &pv(&src)).await.unwrap();
    let e = api_err(
        pvs.patch(
            &src,
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
    let missing_ns = t.name("nope");
    let other: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), &missing_ns);
    let e = api_err(
        other
            .create(&PostParams::default(), &pvc("a", "x"))
            .await
            .unwrap_err(),
    );
    assert_eq!(
        (e.code, e.message.as_str()),
        (
            404,
            format!("namespaces \"{missing_ns}\" not found").as_str()
        )
    );
    let nss: Api<Namespace> = Api::all(c.clone());
    let e = api_err(
        nss.create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": t.name("a.b")}})).unwrap(),
        )
        .await
        .unwrap_err(),
    );
    assert_eq!(e.code, 422, "namespace names are DNS labels");
}

/// Patch semantics on a Lease (no controller writes it, unlike a PV whose
/// protection finalizer the controller manager adds back).
async fn patch_types(t: ApiPlane) {
    let c = t.client();
    let ns = t.namespace();
    let leases: Api<Lease> = Api::namespaced(c.clone(), ns);
    let mut p = lease("p");
    p.metadata.finalizers = Some(vec!["example.com/a".into(), "example.com/b".into()]);
    p.metadata.annotations = Some([("keep".to_string(), "1".to_string())].into());
    leases.create(&PostParams::default(), &p).await.unwrap();
    let fins = |o: &Lease| o.metadata.finalizers.clone().unwrap_or_default();

    // merge patch: annotations merge, null removes, lists replace
    let o = leases
        .patch("p", &PatchParams::default(), &Patch::Merge(json!({"metadata": {"annotations": {"new": "2", "keep": null}, "finalizers": ["example.com/c"]}})))
        .await
        .unwrap();
    let ann = o.metadata.annotations.clone().unwrap();
    assert_eq!(
        (ann.get("new").map(|s| s.as_str()), ann.get("keep")),
        (Some("2"), None)
    );
    assert_eq!(fins(&o), ["example.com/c"]);

    // strategic merge: finalizers (patchStrategy merge) are a union, the
    // patch's items first; labels merge
    let o = leases
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"labels": {"l": "1"}, "finalizers": ["example.com/d", "example.com/e"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        fins(&o),
        ["example.com/d", "example.com/e", "example.com/c"]
    );
    assert_eq!(o.metadata.labels.unwrap()["l"], "1");
    // strategic $deleteFromPrimitiveList
    let o = leases
        .patch(
            "p",
            &PatchParams::default(),
            &Patch::Strategic(
                json!({"metadata": {"$deleteFromPrimitiveList/finalizers": ["example.com/d"]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(fins(&o), ["example.com/e", "example.com/c"]);

    // json patch, with test op
    let jp: json_patch_ops::Ops = json_patch_ops::ops(json!([
        {"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/e"},
        {"op": "add", "path": "/metadata/finalizers/-", "value": "example.com/f"},
        {"op": "replace", "path": "/spec/leaseDurationSeconds", "value": 20}
    ]));
    let o = leases
        .patch("p", &PatchParams::default(), &jp.0)
        .await
        .unwrap();
    assert_eq!(
        fins(&o),
        ["example.com/e", "example.com/c", "example.com/f"]
    );
    assert_eq!(o.spec.unwrap().lease_duration_seconds, Some(20));
    let bad: json_patch_ops::Ops =
        json_patch_ops::ops(json!([{"op": "test", "path": "/metadata/name", "value": "other"}]));
    let e = api_err(
        leases
            .patch("p", &PatchParams::default(), &bad.0)
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 422);

    // optimistic concurrency inside a patch
    let e = api_err(
        leases
            .patch(
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
        leases
            .patch("missing", &PatchParams::default(), &Patch::Merge(json!({})))
            .await
            .unwrap_err(),
    );
    assert_eq!(e.code, 404);

    // server-side apply: creates, then conflicts for another manager, force wins
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
    let (status, _) = t
        .raw(
            "PATCH",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/l"),
            Some("application/apply-patch+yaml"),
            Some(cfg("x").to_string().into_bytes()),
        )
        .await
        .unwrap();
    assert_eq!(status, 422);
    // unknown patch content type
    let (status, _) = t
        .raw(
            "PATCH",
            &format!("/apis/coordination.k8s.io/v1/namespaces/{ns}/leases/l"),
            Some("text/plain"),
            Some(b"{}".to_vec()),
        )
        .await
        .unwrap();
    assert_eq!(status, 415);
}

/// `Patch::Json` needs a `json_patch::Patch`; build one from JSON through serde.
mod json_patch_ops {
    pub struct Ops(pub kube::api::Patch<()>);
    pub fn ops(v: serde_json::Value) -> Ops {
        Ops(kube::api::Patch::Json(serde_json::from_value(v).unwrap()))
    }
}

/// The status subresource of a claim. The real PV binder may write the
/// claim's status concurrently (it keeps unbound claims `Pending`), so each
/// check reads the answer to its own write, and the PUT retries on a conflict.
async fn status_subresource(t: ApiPlane) {
    let c = t.client();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
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
    let mut attempts = 0;
    let o3 = loop {
        let mut o2 = pvcs.get_status("s").await.unwrap();
        o2.status.get_or_insert_with(Default::default).phase = Some("Lost".into());
        o2.spec.as_mut().unwrap().volume_name = Some("qqq".into());
        match pvcs.replace_status("s", &PostParams::default(), &o2).await {
            Ok(o3) => break o3,
            Err(kube::Error::Api(e)) if e.code == 409 && attempts < 5 => attempts += 1,
            Err(e) => panic!("replace_status: {e:?}"),
        }
    };
    assert_eq!(o3.status.unwrap().phase.as_deref(), Some("Lost"));
    assert_eq!(o3.spec.unwrap().volume_name, None);
    let got = pvcs.get_status("s").await.unwrap();
    assert_eq!(got.metadata.name.as_deref(), Some("s"));
}

/// Deletion semantics on a Lease (no admission or controller finalizers);
/// an immediate delete answers a Success Status, a delete with finalizers
/// the object with its deletionTimestamp.
async fn deletion_with_finalizers_and_preconditions(t: ApiPlane) {
    use futures::StreamExt;
    use kube::api::{WatchEvent, WatchParams};
    let leases: Api<Lease> = Api::namespaced(t.client(), t.namespace());

    // no finalizers: deleted at once, the response is a Success Status
    leases
        .create(&PostParams::default(), &lease("plain"))
        .await
        .unwrap();
    let r = leases
        .delete("plain", &DeleteParams::default())
        .await
        .unwrap();
    let st = r.right().expect("Status for an immediate delete");
    assert_eq!(
        st.status,
        Some(kube::core::response::StatusSummary::Success)
    );
    assert_eq!(st.details.unwrap().name, "plain");
    assert_eq!(api_err(leases.get("plain").await.unwrap_err()).code, 404);
    assert_eq!(
        api_err(
            leases
                .delete("plain", &DeleteParams::default())
                .await
                .unwrap_err()
        )
        .code,
        404
    );

    let mut p = lease("fin");
    p.metadata.finalizers = Some(vec!["example.com/f".into()]);
    let created = leases.create(&PostParams::default(), &p).await.unwrap();
    let mut w = leases
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
    let e = api_err(leases.delete("fin", &bad_uid).await.unwrap_err());
    assert_eq!((e.code, e.reason.as_str()), (409, "Conflict"));
    assert!(
        e.message.starts_with(
            "Operation cannot be fulfilled on Lease.coordination.k8s.io \"fin\": the UID in the precondition (wrong) does not match the UID in record ("
        ),
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
    let e = api_err(leases.delete("fin", &bad_rv).await.unwrap_err());
    assert_eq!(e.code, 409);
    assert!(
        e.message.contains(
            "the ResourceVersion in the precondition (1) does not match the ResourceVersion in record ("
        ),
        "{}",
        e.message
    );

    let r = leases
        .delete("fin", &DeleteParams::default())
        .await
        .unwrap();
    let obj = r.left().expect("object with deletionTimestamp");
    assert!(obj.metadata.deletion_timestamp.is_some());
    assert_eq!(obj.metadata.deletion_grace_period_seconds, Some(0));
    // deleting again returns it unchanged
    let again = leases
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
        leases
            .patch(
                "fin",
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"finalizers": ["example.com/f", "example.com/g"]}}),
                ),
            )
            .await
            .unwrap_err(),
    );
    assert_eq!((e.code, e.reason.as_str()), (422, "Invalid"));
    assert!(e.message.contains("metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted"), "{}", e.message);
    // removing the last finalizer deletes it
    leases
        .patch(
            "fin",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"finalizers": null}})),
        )
        .await
        .unwrap();
    assert_eq!(api_err(leases.get("fin").await.unwrap_err()).code, 404);
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
            WatchEvent::Bookmark(_) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(seen, vec![("MODIFIED", true), ("DELETED", true)]);
}

async fn list_selectors_and_pagination(t: ApiPlane) {
    let c = t.client();
    let pvs: Api<PersistentVolume> = Api::all(c.clone());
    // every PV of this test carries `test=<prefix>`, so other tests' PVs on a
    // shared server stay out of the lists
    let mine = t.name("pv");
    for i in 0..25 {
        let mut p = pv(&format!("{mine}-{i:02}"));
        p.metadata.labels = Some(
            [
                (
                    "parity".to_string(),
                    if i % 2 == 0 { "even" } else { "odd" }.to_string(),
                ),
                ("test".to_string(), mine.clone()),
            ]
            .into(),
        );
        pvs.create(&PostParams::default(), &p).await.unwrap();
    }
    let sel = |s: &str| format!("test={mine},{s}");
    let l = pvs
        .list(&ListParams::default().labels(&sel("parity=even")))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 13);
    let l = pvs
        .list(&ListParams::default().labels(&sel("parity in (odd),parity!=even")))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 12);
    let l = pvs
        .list(&ListParams::default().fields(&format!("metadata.name={mine}-03")))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let l = pvs
        .list(
            &ListParams::default()
                .labels(&format!("test={mine}"))
                .fields(&format!("metadata.name!={mine}-03")),
        )
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
        (
            400,
            "\"spec.foo\" is not a known field selector: only \"metadata.name\", \"metadata.namespace\""
        )
    );
    // pagination
    let mut names = Vec::new();
    let mut lp = ListParams::default()
        .labels(&format!("test={mine}"))
        .limit(10);
    let mut pages = 0;
    loop {
        let page = pvs.list(&lp).await.unwrap();
        pages += 1;
        assert!(page.items.len() <= 10);
        names.extend(page.items.iter().map(|p| p.metadata.name.clone().unwrap()));
        match page.metadata.continue_ {
            Some(t) if !t.is_empty() => lp = lp.continue_token(&t),
            _ => break,
        }
    }
    assert_eq!(names.len(), 25);
    assert!(pages >= 3, "{pages} pages of at most 10");
    let mut sorted = names.clone();
    sorted.sort();
    sorted.dedup();
    assert_eq!(sorted.len(), 25);
    // namespaced list across namespaces
    let pvcs_all: Api<PersistentVolumeClaim> = Api::all(c.clone());
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), t.namespace());
    pvcs.create(&PostParams::default(), &pvc("c1", "x"))
        .await
        .unwrap();
    let l = pvcs_all
        .list(&ListParams::default().fields(&format!("metadata.namespace={}", t.namespace())))
        .await
        .unwrap();
    assert_eq!(l.items.len(), 1);
    let sys: Api<PersistentVolumeClaim> = Api::namespaced(c.clone(), "kube-system");
    assert_eq!(
        sys.list(&ListParams::default()).await.unwrap().items.len(),
        0
    );
}

on_both_servers!(namespace_name_label_follows_the_release);

/// From 1.21 on the server labels every Namespace `kubernetes.io/metadata.name: <name>`
/// (what the deploy's NetworkPolicy could select on), also when an update drops or
/// changes it; v1.19 adds no such label.
async fn namespace_name_label_follows_the_release(t: ApiPlane) {
    const LABEL: &str = "kubernetes.io/metadata.name";
    let api: Api<Namespace> = Api::all(t.client());
    let label = |ns: &Namespace| {
        ns.metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(LABEL))
            .cloned()
    };
    let current = api.get(t.namespace()).await.unwrap();
    let name = t.namespace().to_string();
    let mut changed = current.clone();
    changed
        .metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert(LABEL.into(), "forged".into());
    changed.metadata.managed_fields = None;
    let updated = api
        .replace(&name, &PostParams::default(), &changed)
        .await
        .unwrap();
    match t.version() {
        KubeVersion::V1_19 => {
            assert_eq!(label(&current), None, "{current:?}");
            assert_eq!(label(&updated).as_deref(), Some("forged"));
        }
        KubeVersion::V1_37 => {
            assert_eq!(label(&current), Some(name.clone()), "{current:?}");
            assert_eq!(label(&updated), Some(name), "{updated:?}");
        }
    }
}

on_both_servers!(pv_last_phase_transition_time_follows_the_release);

/// `status.lastPhaseTransitionTime` of a PersistentVolume (GA in 1.31): the server sets it
/// when the phase changes and keeps it otherwise, so no writer clobbers it (an update of
/// the main resource cannot touch status; a status write without it keeps it); v1.19 has
/// no such field.
async fn pv_last_phase_transition_time_follows_the_release(t: ApiPlane) {
    let api: Api<PersistentVolume> = Api::all(t.client());
    let name = t.name("lptt");
    api.create(&PostParams::default(), &pv(&name))
        .await
        .unwrap();
    let time = |pv: &PersistentVolume| {
        pv.status
            .as_ref()
            .and_then(|s| s.last_phase_transition_time.clone())
    };
    // the controller manager makes the unbound volume Available
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let available = loop {
        let pv = api.get(&name).await.unwrap();
        if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available") {
            break pv;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not Available: {pv:?}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    let t1 = time(&available);
    assert_eq!(
        t1.is_some(),
        t.version() >= KubeVersion::V1_37,
        "{available:?}"
    );

    // a main-resource update that drops status, and a status write without the time
    let mut main = available.clone();
    main.metadata.managed_fields = None;
    main.metadata
        .labels
        .get_or_insert_with(Default::default)
        .insert("touched".into(), "yes".into());
    main.status = None;
    let after_main = api
        .replace(&name, &PostParams::default(), &main)
        .await
        .unwrap();
    assert_eq!(time(&after_main), t1);
    let mut same_phase = after_main.clone();
    same_phase.metadata.managed_fields = None;
    same_phase
        .status
        .as_mut()
        .unwrap()
        .last_phase_transition_time = None;
    same_phase.status.as_mut().unwrap().message = Some("kept".into());
    let after_status = api
        .replace_status(&name, &PostParams::default(), &same_phase)
        .await
        .unwrap();
    assert_eq!(time(&after_status), t1);

    // a phase change sent with the old time gets a new one
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let mut failed = after_status.clone();
    failed.metadata.managed_fields = None;
    failed.status.as_mut().unwrap().phase = Some("Failed".into());
    let after_change = api
        .replace_status(&name, &PostParams::default(), &failed)
        .await
        .unwrap();
    match t.version() {
        KubeVersion::V1_19 => assert_eq!(time(&after_change), None),
        KubeVersion::V1_37 => {
            let t2 = time(&after_change).expect("a new transition time");
            assert!(
                Some(&t2) != t1.as_ref() && t2.0 > t1.unwrap().0,
                "{after_change:?}"
            );
        }
    }
}
