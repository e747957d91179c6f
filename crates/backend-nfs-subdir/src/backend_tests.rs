//! Provision → delete tests of the nfs-subdir backend against a local
//! directory standing in for the mounted export.

use std::collections::BTreeMap;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, PersistentVolume, PersistentVolumeClaim, PersistentVolumeClaimSpec,
    VolumeResourceRequirements,
};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use provisioner_api::{DeleteError, ProvisionError, ProvisionOptions, ProvisioningState};

use super::*;

struct Fixture {
    _tmp: tempfile::TempDir,
    outside: std::path::PathBuf,
    mount: std::path::PathBuf,
    backend: NfsSubdir,
}

fn fixture() -> Fixture {
    let tmp = tempfile::tempdir().unwrap();
    let mount = tmp.path().join("export");
    let outside = tmp.path().join("outside");
    std::fs::create_dir(&mount).unwrap();
    std::fs::create_dir(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    let backend = NfsSubdir {
        server: "nfs.example".into(),
        export_path: "/srv/k8s".into(),
        mount: mount.clone(),
        capacity: None,
    };
    Fixture {
        _tmp: tmp,
        outside,
        mount,
        backend,
    }
}

impl Fixture {
    /// The PV of `o`, which must be provisioned.
    async fn provision(&self, o: &ProvisionOptions) -> PersistentVolume {
        self.backend.provision(o).await.unwrap()
    }

    /// Delete `pv`, which must succeed.
    async fn delete(&self, pv: &PersistentVolume) {
        self.backend.delete(pv).await.unwrap()
    }

    /// Why provisioning `o` fails (a `Finished` failure).
    async fn refusal(&self, o: &ProvisionOptions) -> String {
        reason(self.backend.provision(o).await.unwrap_err())
    }

    /// Why deleting `pv` is refused.
    async fn delete_refusal(&self, pv: &PersistentVolume) -> String {
        match self.backend.delete(pv).await.unwrap_err() {
            DeleteError::Refused { reason } => reason,
            other => panic!("expected Refused, got {other:?}"),
        }
    }
}

fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

/// Class parameters: directories named by `pattern`, deleted on reclaim.
fn deleting(pattern: &str) -> [(&str, &str); 2] {
    [("pathPattern", pattern), ("onDelete", "delete")]
}

fn options(params: &[(&str, &str)], annotations: &[(&str, &str)]) -> ProvisionOptions {
    options_for("pvc-1", params, annotations)
}

fn options_for(
    pv_name: &str,
    params: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> ProvisionOptions {
    ProvisionOptions {
        storage_class: StorageClass {
            provisioner: "example.com/nfs".into(),
            mount_options: Some(vec!["nfsvers=4.1".into()]),
            reclaim_policy: Some("Delete".into()),
            ..class(params)
        },
        pv_name: pv_name.into(),
        pvc: PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("team-a".into()),
                name: Some("data".into()),
                labels: Some(string_map(&[("app", "web")])),
                annotations: Some(string_map(annotations)),
                ..Default::default()
            },
            spec: Some(PersistentVolumeClaimSpec {
                access_modes: Some(vec!["ReadWriteMany".into()]),
                resources: Some(VolumeResourceRequirements {
                    requests: Some(BTreeMap::from([(
                        "storage".to_string(),
                        Quantity("1Mi".into()),
                    )])),
                    ..Default::default()
                }),
                ..Default::default()
            }),
            status: None,
        },
        selected_node: None,
    }
}

fn reason(e: ProvisionError) -> String {
    match e {
        ProvisionError::Failed {
            state: ProvisioningState::Finished,
            reason,
        } => reason,
        other => panic!("expected a Finished failure, got {other:?}"),
    }
}

/// Every path below `root`, relative, sorted (symlinks not followed).
fn tree(root: &Path) -> Vec<String> {
    fn walk(root: &Path, dir: &Path, out: &mut Vec<String>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let e = e.unwrap();
            let p = e.path();
            out.push(p.strip_prefix(root).unwrap().display().to_string());
            if e.file_type().unwrap().is_dir() {
                walk(root, &p, out);
            }
        }
    }
    let mut out = Vec::new();
    walk(root, root, &mut out);
    out.retain(|p| !p.starts_with(registry::REGISTRY_DIR));
    out.sort();
    out
}

#[tokio::test]
async fn default_directory_and_pv_shape() {
    let f = fixture();
    let pv = f.provision(&options(&[], &[])).await;
    let dir = f.mount.join("team-a-data-pvc-1");
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode();
    assert_eq!(mode & 0o7777, 0o777);
    assert_eq!(
        serde_json::to_value(&pv).unwrap(),
        serde_json::json!({
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": "pvc-1", "annotations": {ANN_ON_DELETE: "archive"}},
            "spec": {
                "nfs": {"server": "nfs.example", "path": "/srv/k8s/team-a-data-pvc-1"},
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteMany"],
                "persistentVolumeReclaimPolicy": "Delete",
                "mountOptions": ["nfsvers=4.1"],
            }
        })
    );
    assert_eq!(f.backend.validate_volume(&pv), Ok(()));
    assert_eq!(
        f.backend.list_volumes().await.unwrap().unwrap(),
        vec!["pvc-1".to_string()]
    );
    // Idempotent: the same PV again, data kept.
    std::fs::write(dir.join("f"), b"keep").unwrap();
    assert_eq!(f.provision(&options(&[], &[])).await, pv);
    assert_eq!(std::fs::read(dir.join("f")).unwrap(), b"keep");
}

#[tokio::test]
async fn nested_pattern_delete_removes_exactly_that_directory() {
    let f = fixture();
    let params = deleting("${.PVC.namespace}/${.PVC.labels.app}/${.PVC.name}");
    let pv = f.provision(&options(&params, &[])).await;
    assert_eq!(
        pv.spec.as_ref().unwrap().nfs.as_ref().unwrap().path,
        "/srv/k8s/team-a/web/data"
    );
    // A sibling volume and a file in the shared parent must survive.
    let mut sibling = options_for("pvc-2", &params, &[]);
    sibling.pvc.metadata.name = Some("logs".into());
    f.provision(&sibling).await;
    std::fs::write(f.mount.join("team-a/web/data/x"), b"x").unwrap();
    std::fs::write(f.mount.join("team-a/web/keep"), b"k").unwrap();
    f.delete(&pv).await;
    assert_eq!(
        tree(&f.mount),
        ["team-a", "team-a/web", "team-a/web/keep", "team-a/web/logs"]
    );
    assert_eq!(f.backend.list_volumes().await.unwrap().unwrap(), ["pvc-2"]);
    // Already gone: success.
    f.delete(&pv).await;
}

#[tokio::test]
async fn archive_of_a_nested_path_stays_in_its_parent() {
    let f = fixture();
    let params = [("pathPattern", "${.PVC.namespace}/${.PVC.name}")];
    let pv = f.provision(&options(&params, &[])).await;
    std::fs::write(f.mount.join("team-a/data/x"), b"x").unwrap();
    f.delete(&pv).await;
    assert_eq!(
        tree(&f.mount),
        ["team-a", "team-a/archived-data", "team-a/archived-data/x"]
    );
    // The same claim name again: the second archive gets the PV name appended.
    let pv2 = f.provision(&options_for("pvc-9", &params, &[])).await;
    f.delete(&pv2).await;
    assert!(f.mount.join("team-a/archived-data-pvc-9").is_dir());
    // archiveOnDelete "false" deletes; "true" archives.
    for (value, archived) in [("false", false), ("True", true)] {
        let pv_name = format!("pvc-{value}").to_lowercase();
        let o = options_for(&pv_name, &[("archiveOnDelete", value)], &[]);
        let pv = f.provision(&o).await;
        f.delete(&pv).await;
        let name = format!("team-a-data-{}", o.pv_name);
        assert!(!f.mount.join(&name).exists());
        assert_eq!(
            f.mount.join(format!("archived-{name}")).is_dir(),
            archived,
            "{value}"
        );
    }
}

#[tokio::test]
async fn retain_leaves_the_directory() {
    let f = fixture();
    let pv = f
        .provision(&options(
            &[("onDelete", "retain"), ("archiveOnDelete", "false")],
            &[],
        ))
        .await;
    f.delete(&pv).await;
    assert_eq!(tree(&f.mount), ["team-a-data-pvc-1"]);
    assert!(f.backend.list_volumes().await.unwrap().unwrap().is_empty());
}

#[tokio::test]
async fn create_annotations_apply_and_bad_values_are_refused() {
    let f = fixture();
    let (uid, gid) = own_ids();
    let pv = f
        .provision(&options(
            &[],
            &[
                ("nfs.io/createMode", "0750"),
                ("nfs.io/createUID", &uid.to_string()),
                ("nfs.io/createGID", &gid.to_string()),
            ],
        ))
        .await;
    assert!(pv.spec.is_some());
    let meta = std::fs::metadata(f.mount.join("team-a-data-pvc-1")).unwrap();
    assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
    let (bad_mode, bad_id) = ("not an octal permission mode", "not a numeric id");
    for (k, values, msg) in [
        ("nfs.io/createMode", &["0999", "rwx", "17777"][..], bad_mode),
        ("nfs.io/createUID", &["-1", "99999999999"], bad_id),
        ("nfs.io/createGID", &["root"], bad_id),
    ] {
        for v in values {
            let r = f.refusal(&options_for("pvc-bad", &[], &[(k, v)])).await;
            assert!(r.contains(msg) && r.contains(k), "{k}={v}: {r}");
        }
    }
    assert_eq!(tree(&f.mount), ["team-a-data-pvc-1"]);

    // The class's directory parameters, and a claim annotation over them.
    let class = [
        ("directoryMode", "0700"),
        ("directoryGID", &gid.to_string()),
    ];
    f.provision(&options_for("pvc-2", &class, &[])).await;
    let mode = |dir: &str| {
        std::fs::metadata(f.mount.join(dir))
            .unwrap()
            .permissions()
            .mode()
            & 0o7777
    };
    assert_eq!(mode("team-a-data-pvc-2"), 0o700);
    let o = options_for("pvc-3", &class, &[("nfs.io/createMode", "0755")]);
    f.provision(&o).await;
    assert_eq!(mode("team-a-data-pvc-3"), 0o755);
    let r = f
        .refusal(&options_for("pvc-4", &[("directoryUID", "me")], &[]))
        .await;
    assert!(
        r.contains("StorageClass parameter directoryUID=\"me\" is not a numeric id"),
        "{r}"
    );
}

/// This process's uid and gid, as seen on a file it creates (setting them
/// with `nfs.io/createUID`/`createGID` needs no privilege).
fn own_ids() -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let probe = tempfile::tempdir().unwrap();
    let meta = std::fs::metadata(probe.path()).unwrap();
    (meta.uid(), meta.gid())
}

#[tokio::test]
async fn claim_and_class_refusals_create_nothing() {
    let f = fixture();
    let mut selector = options(&[], &[]);
    selector.pvc.spec.as_mut().unwrap().selector = Some(LabelSelector::default());
    let mut block = options(&[], &[]);
    block.pvc.spec.as_mut().unwrap().volume_mode = Some("Block".into());
    let mut no_modes = options(&[], &[]);
    no_modes.pvc.spec.as_mut().unwrap().access_modes = None;
    let mut no_request = options(&[], &[]);
    no_request.pvc.spec.as_mut().unwrap().resources = None;
    let cases = [
        (selector, "claim Selector is not supported"),
        (block, "does not support volumeMode Block"),
        (no_modes, "claim has no access modes"),
        (no_request, "claim has no storage request"),
        (options_for("../x", &[], &[]), "is not a valid object name"),
        (
            options(&[("archiveOnDelete", "yes")], &[]),
            "archiveOnDelete=\"yes\" is not a boolean",
        ),
        (
            options(&[("onDelete", "archive")], &[]),
            "onDelete=\"archive\" is neither",
        ),
        (
            options(&[("server", "x"), ("path", "/y")], &[]),
            "does not know: path, server",
        ),
        (
            options(&[("pathPattern", "../${.PVC.name}")], &[]),
            "contains a \"..\" component",
        ),
        (
            options(&[("pathPattern", "/etc/${.PVC.name}")], &[]),
            "is an absolute path",
        ),
        (
            options(
                &[("pathPattern", "${.PVC.annotations.dir}")],
                &[("dir", "../../outside")],
            ),
            "contains \"..\"",
        ),
        (
            options(&[("pathPattern", "${.PVC.labels.tier}")], &[]),
            "does not have",
        ),
        // The test's directory has no project quotas.
        (
            options(&[("quota", "required")], &[]),
            "(StorageClass quota=required)",
        ),
        (
            options(&[("quota", "yes")], &[]),
            "is not one of off, best-effort, required",
        ),
    ];
    for (o, expected) in cases {
        let r = f.refusal(&o).await;
        assert!(r.contains(expected), "{expected}: {r}");
    }
    assert!(tree(&f.mount).is_empty());
    assert_eq!(tree(&f.outside), ["secret"]);
}

#[tokio::test]
async fn symlink_escapes_are_refused_and_nothing_outside_is_touched() {
    let f = fixture();
    std::os::unix::fs::symlink(&f.outside, f.mount.join("team-a")).unwrap();
    // Provisioning through a symlinked parent.
    let params = deleting("${.PVC.namespace}/${.PVC.name}");
    let r = f.refusal(&options(&params, &[])).await;
    assert!(r.contains("\"team-a\" is a symlink"), "{r}");
    assert_eq!(tree(&f.outside), ["secret"]);
    // Deleting a PV whose path crosses the symlink: refused, target intact.
    let pv = pv_at("pvc-1", "/srv/k8s/team-a/secret", "delete");
    let r = f.delete_refusal(&pv).await;
    assert!(r.contains("symlink"), "{r}");
    // The volume directory itself a symlink: refused, not followed.
    std::os::unix::fs::symlink(&f.outside, f.mount.join("link")).unwrap();
    f.delete_refusal(&pv_at("pvc-1", "/srv/k8s/link", "delete"))
        .await;
    assert_eq!(tree(&f.outside), ["secret"]);
}

fn pv_at(name: &str, path: &str, policy: &str) -> PersistentVolume {
    PersistentVolume {
        metadata: ObjectMeta {
            name: Some(name.into()),
            annotations: Some(string_map(&[(ANN_ON_DELETE, policy)])),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::PersistentVolumeSpec {
            nfs: Some(k8s_openapi::api::core::v1::NFSVolumeSource {
                server: "nfs.example".into(),
                path: path.into(),
                read_only: None,
            }),
            ..Default::default()
        }),
        status: None,
    }
}

#[tokio::test]
async fn foreign_pvs_are_refused_and_left_alone() {
    let f = fixture();
    std::fs::create_dir(f.mount.join("victim")).unwrap();
    let cases = [
        (
            pv_at("pvc-1", "/srv/k8s", "delete"),
            "not a directory below",
        ),
        (pv_at("pvc-1", "/srv", "delete"), "not a directory below"),
        (
            pv_at("pvc-1", "/srv/k8s2/victim", "delete"),
            "not a directory below",
        ),
        (
            pv_at("pvc-1", "/srv/k8s/../k8s/victim", "delete"),
            "not a directory below",
        ),
        (
            pv_at("pvc-1", "srv/k8s/victim", "delete"),
            "not a directory below",
        ),
        (
            pv_at("pvc-1", "/srv/k8s/victim", "nuke"),
            "expected delete, retain or archive",
        ),
    ];
    for (pv, expected) in cases {
        let r = f.delete_refusal(&pv).await;
        assert!(r.contains(expected), "{r}");
        assert!(f.backend.validate_volume(&pv).is_err() || expected.starts_with("expected"));
    }
    let mut other_server = pv_at("pvc-1", "/srv/k8s/victim", "delete");
    other_server
        .spec
        .as_mut()
        .unwrap()
        .nfs
        .as_mut()
        .unwrap()
        .server = "evil".into();
    assert!(f
        .backend
        .validate_volume(&other_server)
        .unwrap_err()
        .to_string()
        .contains("not this provisioner's"));
    assert!(f.backend.delete(&other_server).await.is_err());
    let mut two_sources = pv_at("pvc-1", "/srv/k8s/victim", "delete");
    two_sources.spec.as_mut().unwrap().host_path = Some(HostPathVolumeSource {
        path: "/".into(),
        type_: None,
    });
    assert!(f
        .backend
        .validate_volume(&two_sources)
        .unwrap_err()
        .to_string()
        .contains("hostPath"));
    assert!(f.mount.join("victim").is_dir());
    // A PV without the policy annotation (provisioned by upstream) needs its
    // class: without one, nothing is touched.
    let mut migrated = pv_at("pvc-7", "/srv/k8s/victim", "delete");
    migrated.metadata.annotations = None;
    assert!(matches!(
        f.backend.delete(&migrated).await,
        Err(DeleteError::Failed { .. })
    ));
    assert_eq!(tree(&f.mount), ["victim"]);
}

fn class(params: &[(&str, &str)]) -> StorageClass {
    StorageClass {
        metadata: ObjectMeta {
            name: Some("nfs-client".into()),
            ..Default::default()
        },
        parameters: Some(string_map(params)),
        ..Default::default()
    }
}

/// A PV that upstream provisioned (no policy annotation) follows its class
/// as read at delete time, exactly as upstream; one we provisioned keeps the
/// policy recorded at provisioning whatever the class says now.
#[tokio::test]
async fn a_pv_provisioned_by_upstream_follows_its_class_at_delete_time() {
    let f = fixture();
    let upstream = |dir: &str| {
        std::fs::create_dir_all(f.mount.join(dir)).unwrap();
        std::fs::write(f.mount.join(dir).join("file"), b"data").unwrap();
        let mut pv = pv_at("pvc-9", &format!("/srv/k8s/{dir}"), "unused");
        pv.metadata.annotations = None;
        pv
    };
    type Params = &'static [(&'static str, &'static str)];
    let cases: [(Params, &[&str]); 6] = [
        (&[("onDelete", "delete")], &[]),
        (&[("archiveOnDelete", "false")], &[]),
        (&[("onDelete", "delete"), ("archiveOnDelete", "true")], &[]),
        (&[("onDelete", "retain")], &["v", "v/file"]),
        (
            &[("archiveOnDelete", "true")],
            &["archived-v", "archived-v/file"],
        ),
        (&[], &["archived-v", "archived-v/file"]),
    ];
    for (params, expected) in cases {
        let pv = upstream("v");
        assert!(f.backend.reads_class_at_delete(&pv));
        f.backend
            .delete_with_class(&pv, Some(&class(params)))
            .await
            .unwrap();
        assert_eq!(tree(&f.mount), expected, "{params:?}");
        let _ = std::fs::remove_dir_all(f.mount.join("v"));
        let _ = std::fs::remove_dir_all(f.mount.join("archived-v"));
    }
    // The class is gone, or its archiveOnDelete is no boolean: nothing touched.
    let pv = upstream("v");
    let gone = f.backend.delete_with_class(&pv, None).await.unwrap_err();
    assert!(
        matches!(&gone, DeleteError::Failed { reason } if reason.contains("does not exist")),
        "{gone:?}"
    );
    let bad = class(&[("archiveOnDelete", "maybe")]);
    assert!(f.backend.delete_with_class(&pv, Some(&bad)).await.is_err());
    assert_eq!(tree(&f.mount), ["v", "v/file"]);
    // Already absent: success without a class, as upstream.
    std::fs::remove_dir_all(f.mount.join("v")).unwrap();
    f.backend.delete_with_class(&pv, None).await.unwrap();

    // Ours: the recorded policy wins over the class.
    let o = options(&[("onDelete", "retain")], &[]);
    let ours = f.provision(&o).await;
    assert!(!f.backend.reads_class_at_delete(&ours));
    f.backend
        .delete_with_class(&ours, Some(&class(&[("onDelete", "delete")])))
        .await
        .unwrap();
    assert_eq!(tree(&f.mount), ["team-a-data-pvc-1"]);
}

/// One claim's directory inside another's (`ns/app` and `ns/app/db`) is
/// refused in either order, also while the other is still being provisioned
/// (recorded, no directory yet); a directory around another volume's is
/// never deleted or archived, and the sweep counts it as used.
#[tokio::test]
async fn volumes_nested_in_one_another_are_refused_and_never_removed_together() {
    let f = fixture();
    let pattern = deleting("${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}");
    let at = |pv: &str, path: &str| options_for(pv, &pattern, &[("nfs.io/storage-path", path)]);
    let outer = f.provision(&at("pvc-a", "app")).await;
    std::fs::write(f.mount.join("team-a/app/file"), b"a").unwrap();
    let r = f.refusal(&at("pvc-b", "app/db")).await;
    assert!(
        r.contains("\"team-a/app/db\" is inside the directory \"team-a/app\" of PV pvc-a"),
        "{r}"
    );
    assert_eq!(tree(&f.mount), ["team-a", "team-a/app", "team-a/app/file"]);
    // Refused again on retry, and the refused claim's recovery touches nothing.
    assert!(f.backend.provision(&at("pvc-b", "app/db")).await.is_err());
    f.backend
        .delete_unprovisioned(&at("pvc-b", "app/db"))
        .await
        .unwrap();

    // The other order, with the outer claim still in flight (recorded only).
    let root = backend_kit::safe_fs::open_root(&f.mount).unwrap();
    let record = |pv: &str, path: &str| {
        registry::put(&root, pv, &pattern::RelPath::parse(path).unwrap()).unwrap()
    };
    record("pvc-c", "team-a/web");
    let r = f.refusal(&at("pvc-d", "web/db")).await;
    assert!(
        r.contains("is inside the directory \"team-a/web\" of PV pvc-c"),
        "{r}"
    );
    registry::remove(&root, "pvc-c").unwrap();
    let inner = f.provision(&at("pvc-d", "web/db")).await;
    record("pvc-c", "team-a/web");
    // pvc-c retried: its directory would contain pvc-d's.
    let r = f.refusal(&at("pvc-c", "web")).await;
    assert!(
        r.contains("contains the directory \"team-a/web/db\" of PV pvc-d"),
        "{r}"
    );

    // Nested volumes left by older releases: the outer one is neither
    // deleted, archived nor swept with the inner one's data.
    record("pvc-e", "team-a");
    let around = pv_at("pvc-e", "/srv/k8s/team-a", "delete");
    for policy in ["delete", "archive"] {
        let mut pv = around.clone();
        pv.metadata.annotations = Some(string_map(&[(ANN_ON_DELETE, policy)]));
        let r = f.delete_refusal(&pv).await;
        assert!(r.contains("contains the directory"), "{r}");
    }
    assert!(delete::archive_orphan(&f.backend, "pvc-e", std::time::Duration::ZERO).is_err());
    assert!(f.mount.join("team-a/web/db").is_dir());
    assert!(f.mount.join("team-a/app/file").is_file());
    registry::remove(&root, "pvc-e").unwrap();
    registry::remove(&root, "pvc-c").unwrap();
    // Inner and outer, deleted: each removes exactly its own directory.
    f.delete(&inner).await;
    f.delete(&outer).await;
    assert_eq!(tree(&f.mount), ["team-a", "team-a/web"]);
}

/// The orphan sweep's view: a volume is in use by any PV whose `nfs.path`
/// names its directory, one inside it or one around it, whatever its name.
#[tokio::test]
async fn volumes_in_use_go_by_path_not_by_name() {
    let f = fixture();
    let pattern = [("pathPattern", "${.PVC.namespace}/${.PVC.name}")];
    f.provision(&options(&pattern, &[])).await;
    let used = |pvs: Vec<PersistentVolume>| {
        let b = f.backend.clone();
        async move {
            let mut v: Vec<String> = b.volumes_in_use(&pvs).await.unwrap().into_iter().collect();
            v.sort();
            v
        }
    };
    assert_eq!(
        used(vec![pv_at("restore-1", "/srv/k8s/team-a/data", "retain")]).await,
        ["pvc-1", "restore-1"]
    );
    assert_eq!(
        used(vec![pv_at(
            "restore-2",
            "/srv/k8s/team-a/data/sub",
            "retain"
        )])
        .await,
        ["pvc-1", "restore-2"]
    );
    assert_eq!(
        used(vec![pv_at("restore-3", "/srv/k8s/team-a", "retain")]).await,
        ["pvc-1", "restore-3"]
    );
    assert_eq!(
        used(vec![pv_at("other", "/srv/k8s/team-b", "retain")]).await,
        ["other"]
    );
}

#[tokio::test]
async fn two_claims_for_one_directory_the_second_is_refused() {
    let f = fixture();
    let params = deleting("shared/${.PVC.labels.app}");
    let first = f.provision(&options(&params, &[])).await;
    let second = options_for("pvc-2", &params, &[]);
    let r = f.refusal(&second).await;
    assert!(r.contains("already belongs to PV pvc-1"), "{r}");
    // A PV forged to name the first one's directory cannot delete it.
    f.delete_refusal(&pv_at("pvc-2", "/srv/k8s/shared/web", "delete"))
        .await;
    // Recovery of the refused claim touches nothing either.
    f.backend.delete_unprovisioned(&second).await.unwrap();
    assert!(f.mount.join("shared/web").is_dir());
    // A pre-existing directory is not adopted.
    std::fs::create_dir(f.mount.join("team-a-data-pvc-3")).unwrap();
    let r = f.refusal(&options_for("pvc-3", &[], &[])).await;
    assert!(r.contains("was not created for PV pvc-3"), "{r}");
    // The owner deletes normally.
    f.delete(&first).await;
    assert!(!f.mount.join("shared/web").exists());
}

#[tokio::test]
async fn delete_unprovisioned_follows_the_class_policy_and_needs_a_record() {
    let f = fixture();
    let o = options(&deleting("a/${.PV.name}"), &[]);
    // Nothing recorded: success, nothing created.
    f.backend.delete_unprovisioned(&o).await.unwrap();
    assert!(tree(&f.mount).is_empty());
    f.provision(&o).await;
    f.backend.delete_unprovisioned(&o).await.unwrap();
    assert_eq!(tree(&f.mount), ["a"]);
    let archive = options(&[("pathPattern", "a/${.PV.name}")], &[]);
    f.provision(&archive).await;
    f.backend.delete_unprovisioned(&archive).await.unwrap();
    assert_eq!(tree(&f.mount), ["a", "a/archived-pvc-1"]);
}

#[tokio::test]
async fn a_file_in_the_way_or_a_changed_directory_is_refused() {
    let f = fixture();
    std::fs::write(f.mount.join("team-a"), b"not a dir").unwrap();
    let params = [("pathPattern", "${.PVC.namespace}/${.PVC.name}")];
    let r = f.refusal(&options(&params, &[])).await;
    assert!(
        r.contains("\"team-a\" exists and is not a directory"),
        "{r}"
    );
    std::fs::remove_file(f.mount.join("team-a")).unwrap();

    // Provisioned once; a retry for the same PV whose claim now resolves
    // elsewhere (its labels changed) is refused instead of making a second
    // directory.
    let by_label = [("pathPattern", "${.PVC.labels.app}")];
    f.provision(&options(&by_label, &[])).await;
    let mut relabelled = options(&by_label, &[]);
    relabelled.pvc.metadata.labels = Some(string_map(&[("app", "db")]));
    let r = f.refusal(&relabelled).await;
    assert!(r.contains("was already provisioned at \"web\""), "{r}");
    assert_eq!(tree(&f.mount), ["web"]);
}

#[tokio::test]
async fn orphan_archiving_keeps_young_directories_and_archives_old_ones() {
    use provisioner_api::OrphanOutcome;
    let f = fixture();
    let o = options(&[("pathPattern", "${.PVC.namespace}/${.PVC.name}")], &[]);
    f.provision(&o).await;
    let hour = std::time::Duration::from_secs(3600);
    assert!(matches!(
        delete::archive_orphan(&f.backend, "pvc-1", hour).unwrap(),
        OrphanOutcome::TooYoung(_)
    ));
    assert_eq!(
        delete::archive_orphan(&f.backend, "pvc-unknown", hour).unwrap(),
        OrphanOutcome::Absent
    );
    assert_eq!(
        delete::archive_orphan(&f.backend, "pvc-1", std::time::Duration::ZERO).unwrap(),
        OrphanOutcome::Archived(f.mount.join("team-a/archived-data"))
    );
    assert_eq!(tree(&f.mount), ["team-a", "team-a/archived-data"]);
    assert!(f.backend.list_volumes().await.unwrap().unwrap().is_empty());
}

/// `--nfs-capacity`: a claim that does not fit beside the export's volumes fails and leaves
/// no directory; deleting a volume (or growing one) goes through the same records.
#[tokio::test]
async fn claims_beyond_the_export_capacity_fail_and_deletion_gives_room_back() {
    let mut f = fixture();
    f.backend.capacity = Some(3 << 19); // 1.5 MiB; every claim here asks for 1Mi
    let first = f.provision(&options(&[], &[])).await;
    let second = options_for("pvc-2", &[], &[]);
    let err = f.refusal(&second).await;
    assert!(
        err.contains(
            "do not fit: 1048576 of the base directory's capacity of 1572864 bytes are taken"
        ),
        "{err}"
    );
    assert!(!f.mount.join("team-a-data-pvc-2").exists());
    let pools = f.backend.capacity().await.unwrap().unwrap();
    assert_eq!((pools[0].capacity, pools[0].allocated), (3 << 19, 1 << 20));
    let err = f.backend.expand(&first, 2 << 30).await.unwrap_err();
    assert!(
        err.to_string().contains("cannot grow to 2147483648 bytes"),
        "{err}"
    );
    f.delete(&first).await;
    f.provision(&second).await;
}

#[tokio::test]
async fn a_retried_delete_never_reaches_a_directory_provisioned_again() {
    let f = fixture();
    let params = deleting("${.PVC.namespace}/${.PVC.name}");
    let first_options = options_for("pvc-a", &params, &[]);
    let first = f.provision(&first_options).await;
    // pvc-a's delete removed its directory, then stopped before forgetting its record.
    std::fs::remove_dir(f.mount.join("team-a/data")).unwrap();
    // The claim made again is refused while that record stands...
    let again = options_for("pvc-b", &params, &[]);
    let r = f.refusal(&again).await;
    assert!(r.contains("already belongs to PV pvc-a"), "{r}");
    assert!(
        r.contains("remove .split-provisioner/volumes/pvc-a on the export"),
        "{r}"
    );
    // ...and provisioned once the retried delete has finished.
    f.delete(&first).await;
    let second = f.provision(&again).await;
    std::fs::write(f.mount.join("team-a/data/keep"), b"k").unwrap();
    // Both records for the path (as an older release could leave them): the stale PV's
    // delete is refused and the live directory kept.
    let root = backend_kit::safe_fs::open_root(&f.mount).unwrap();
    let rel = pattern::RelPath::parse("team-a/data").unwrap();
    registry::put(&root, "pvc-a", &rel).unwrap();
    let r = f.delete_refusal(&first).await;
    assert!(r.contains("belongs to PV pvc-b"), "{r}");
    assert!(f.mount.join("team-a/data/keep").is_file());
    // A gone claim's cleanup with such a record is refused the same way.
    let err = f
        .backend
        .delete_unprovisioned(&first_options)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("belongs to PV pvc-b"), "{err}");
    assert!(f.mount.join("team-a/data/keep").is_file());
    registry::remove(&root, "pvc-a").unwrap();
    f.delete(&second).await;
    assert!(!f.mount.join("team-a/data").exists());
}
