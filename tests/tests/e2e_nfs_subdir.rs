//! End-to-end scenarios of the nfs-subdir backend with the real binaries, a
//! real `redis-server`, on both control planes (the API-server simulator and a
//! real kube-apiserver + kube-controller-manager, `on_both_planes!`); a local directory (the
//! harness's base directory) stands in for the mounted export
//! (`--nfs-mount`). Only harness calls that work against a real control plane
//! too are used (the simulator's latency is set only when there is one).
//!
//! * nested `pathPattern`: provision → delete removes exactly that directory;
//! * archive of a nested path (same parent, `archived-<name>`);
//! * `onDelete: retain`;
//! * `..` (through an annotation) and symlink escapes refused with a
//!   `ProvisioningFailed` event, nothing touched outside the mount;
//! * SIGKILL of each service in the middle of a batch loses nothing;
//! * a claim whose directory nests in another volume's is refused;
//! * PVs made by upstream follow their class at delete time.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use e2e::harness::{wait_eq, ControlPlane, Service, ServiceSettings, System};
use e2e::on_both_planes;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Patch, PatchParams, PostParams};

use backend_nfs_subdir::registry::REGISTRY_DIR as REGISTRY;
use e2e::harness::{NFS_TEST_EXPORT as EXPORT, NFS_TEST_SERVER as SERVER};

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn system(plane: ControlPlane) -> System {
    System::started(plane, Some(ServiceSettings::use_nfs_subdir)).await
}

/// nfs-subdir with `--nfs-capacity 1536Ki` (the harness's claims ask for 1Mi).
fn nfs_with_capacity(s: &mut ServiceSettings) {
    ServiceSettings::use_nfs_subdir(s);
    for service in [Service::Provision, Service::Reclaim] {
        s.extra_args
            .push((service, vec!["--nfs-capacity".into(), "1536Ki".into()]));
    }
}

/// The filesystem capabilities through nfs-subdir: `directoryMode` on the directory,
/// `quota=required` refused (no project quotas here), `--nfs-capacity` refusing a claim
/// that does not fit, and a grown claim's PV and status capacity raised.
async fn directory_mode_quota_capacity_and_expansion_through_nfs_subdir(plane: ControlPlane) {
    use std::os::unix::fs::PermissionsExt;
    let sys = System::started(plane, Some(nfs_with_capacity)).await;
    sys.create_storage_class("private", "Immediate", &[("directoryMode", "0750")])
        .await
        .unwrap();
    sys.create_storage_class("strict", "Immediate", &[("quota", "required")])
        .await
        .unwrap();
    sys.allow_expansion("private").await.unwrap();
    let strict = sys.create_claims("strict", 1, "strict").await.unwrap();
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 1, Duration::from_secs(30))
            .await,
    );
    let first = sys.create_claims("first", 1, "private").await.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    let second = sys.create_claims("second", 1, "private").await.unwrap();
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 2, Duration::from_secs(30))
            .await,
    );
    let notes = sys.event_notes("ProvisioningFailed").await.unwrap();
    assert!(
        notes.iter().any(|n| n.contains("quota=required")),
        "{notes:?}"
    );
    assert!(notes.iter().any(|n| n.contains("do not fit")), "{notes:?}");
    let pv = sys.pvs().await.unwrap().remove(0);
    let dir = sys
        .base_dir()
        .join(nfs_path(&pv).trim_start_matches(&format!("{EXPORT}/")));
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "{}", dir.display());
    // Growing within the export's room: 1Mi to 1.25Mi.
    let bigger = serde_json::json!({"spec": {"resources": {"requests": {"storage": "1280Ki"}}}});
    sys.claims_api()
        .patch(&first[0], &PatchParams::default(), &Patch::Merge(&bigger))
        .await
        .unwrap();
    check(
        &sys,
        sys.wait_objects_with_event("VolumeResizeSuccessful", 1, Duration::from_secs(30))
            .await,
    );
    let pv = sys.pvs().await.unwrap().remove(0);
    let size = pv
        .spec
        .and_then(|s| s.capacity)
        .and_then(|c| c.get("storage").cloned());
    assert_eq!(size.map(|q| q.0).as_deref(), Some("1280Ki"));
    for claims in [&first, &strict, &second] {
        sys.delete_claims(claims).await.unwrap();
    }
    // The class's default policy archives: the PVs go, archived directories stay.
    let pvs = || async { Ok(sys.pvs().await?.len()) };
    check(&sys, wait_eq(Duration::from_secs(30), "PVs", 0, pvs).await);
}

/// A claim with labels and annotations, created; returns it.
async fn claim(
    sys: &System,
    name: &str,
    class: &str,
    labels: &[(&str, &str)],
    annotations: &[(&str, &str)],
) -> PersistentVolumeClaim {
    let mut c = sys.claim_manifest(name, class, annotations);
    c.metadata.labels = Some(
        labels
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    check(
        sys,
        sys.claims_api()
            .create(&PostParams::default(), &c)
            .await
            .map_err(anyhow::Error::from),
    )
}

/// Every path below `root` (relative, sorted, symlinks not followed), without
/// the bookkeeping directory.
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
    if root.exists() {
        walk(root, root, &mut out);
    }
    out.retain(|p| !p.starts_with(REGISTRY));
    out.sort();
    out
}

fn nfs_path(pv: &PersistentVolume) -> String {
    pv.spec.as_ref().unwrap().nfs.as_ref().unwrap().path.clone()
}

async fn wait_pv_gone(sys: &System, pv_name: &str) {
    let r = wait_eq(
        Duration::from_secs(30),
        &format!("PV {pv_name} deleted"),
        false,
        || async {
            Ok(sys
                .pvs()
                .await?
                .iter()
                .any(|p| p.metadata.name.as_deref() == Some(pv_name)))
        },
    )
    .await;
    check(sys, r);
}

async fn nested_path_pattern_delete_removes_exactly_that_directory_and_archive_and_retain_keep_it(
    plane: ControlPlane,
) {
    let sys = system(plane).await;
    let nested = "${.PVC.namespace}/${.PVC.labels.app}/${.PVC.name}";
    for (class, params) in [
        (
            "nfs-delete",
            vec![("pathPattern", nested), ("onDelete", "delete")],
        ),
        (
            "nfs-archive",
            vec![("pathPattern", "${.PVC.namespace}/archive/${.PVC.name}")],
        ),
        (
            "nfs-retain",
            vec![
                ("pathPattern", "${.PVC.namespace}/retain/${.PVC.name}"),
                ("onDelete", "retain"),
            ],
        ),
    ] {
        check(
            &sys,
            sys.create_storage_class(class, "Immediate", &params).await,
        );
    }
    claim(&sys, "data", "nfs-delete", &[("app", "web")], &[]).await;
    claim(&sys, "logs", "nfs-delete", &[("app", "web")], &[]).await;
    claim(&sys, "old", "nfs-archive", &[], &[]).await;
    claim(&sys, "kept", "nfs-retain", &[], &[]).await;
    let mut pvs = Vec::new();
    for name in ["data", "logs", "old", "kept"] {
        pvs.push(check(
            &sys,
            sys.wait_pv_for_claim(name, Duration::from_secs(30)).await,
        ));
    }
    assert_eq!(
        pvs.iter().map(nfs_path).collect::<Vec<_>>(),
        [
            "/srv/k8s/default/web/data",
            "/srv/k8s/default/web/logs",
            "/srv/k8s/default/archive/old",
            "/srv/k8s/default/retain/kept",
        ]
    );
    for pv in &pvs {
        assert_eq!(
            pv.spec.as_ref().unwrap().nfs.as_ref().unwrap().server,
            SERVER
        );
    }
    let base = sys.base_dir().to_path_buf();
    for dir in [
        "default/web/data",
        "default/archive/old",
        "default/retain/kept",
    ] {
        std::fs::write(base.join(dir).join("file"), b"payload").unwrap();
    }

    sys.delete_claims(&["data".into(), "old".into(), "kept".into()])
        .await
        .unwrap();
    for pv in [&pvs[0], &pvs[2], &pvs[3]] {
        wait_pv_gone(&sys, pv.metadata.name.as_deref().unwrap()).await;
    }
    assert_eq!(
        tree(&base),
        [
            "default",
            "default/archive",
            "default/archive/archived-old",
            "default/archive/archived-old/file",
            "default/retain",
            "default/retain/kept",
            "default/retain/kept/file",
            "default/web",
            "default/web/logs",
        ],
        "delete removed exactly default/web/data; archive renamed in its parent; retain kept\n{}",
        sys.log_tails(20)
    );
}

async fn dot_dot_and_symlink_escapes_are_refused_and_nothing_outside_is_touched(
    plane: ControlPlane,
) {
    let sys = system(plane).await;
    let outside: PathBuf = sys.root.join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    std::fs::write(outside.join("secret"), b"s").unwrap();
    // `default` in the export is a symlink to a directory outside it.
    std::os::unix::fs::symlink(&outside, sys.base_dir().join("default")).unwrap();
    check(
        &sys,
        sys.create_storage_class(
            "by-annotation",
            "Immediate",
            &[("pathPattern", "${.PVC.annotations.dir}")],
        )
        .await,
    );
    check(
        &sys,
        sys.create_storage_class(
            "by-namespace",
            "Immediate",
            &[("pathPattern", "${.PVC.namespace}/${.PVC.name}")],
        )
        .await,
    );
    claim(
        &sys,
        "dotdot",
        "by-annotation",
        &[],
        &[("dir", "../outside/x")],
    )
    .await;
    claim(&sys, "through-link", "by-namespace", &[], &[]).await;
    let failed = sys
        .wait_objects_with_event("ProvisioningFailed", 2, Duration::from_secs(30))
        .await;
    check(&sys, failed);
    // Give a retry the chance to do damage, then look.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(sys.pvs().await.unwrap().is_empty());
    let mut outside_tree = BTreeSet::new();
    for e in std::fs::read_dir(&outside).unwrap() {
        outside_tree.insert(e.unwrap().file_name().to_string_lossy().into_owned());
    }
    assert_eq!(outside_tree, BTreeSet::from(["secret".to_string()]));
    assert_eq!(tree(sys.base_dir()), ["default"], "only the symlink itself");
    let messages = sys.event_notes("ProvisioningFailed").await.unwrap();
    assert!(
        messages.iter().any(|m| m.contains("contains \"..\"")),
        "{messages:?}"
    );
    assert!(
        messages.iter().any(|m| m.contains("is a symlink")),
        "{messages:?}"
    );
}

async fn sigkill_of_each_service_in_the_middle_of_a_batch_loses_nothing(plane: ControlPlane) {
    let mut sys = system(plane).await;
    if let Some(sim) = &sys.sim {
        // 20 ms per API request keeps a batch in flight long enough to interrupt.
        sim.set_latency(Duration::from_millis(20));
    }
    check(
        &sys,
        sys.create_storage_class("nfs", "Immediate", &[("onDelete", "delete")])
            .await,
    );
    let mut all = Vec::new();
    for (round, victim) in [Service::Provision, Service::PvWriter]
        .into_iter()
        .enumerate()
    {
        let batch = sys
            .create_claims(&format!("kill{round}"), 30, "nfs")
            .await
            .unwrap();
        all.extend(batch);
        let done_before = all.len() - 30;
        let progress = || async {
            Ok(match victim {
                Service::Provision => sys.dir_count(),
                _ => sys.pvs().await?.len(),
            } > done_before + 3)
        };
        check(
            &sys,
            wait_eq(Duration::from_secs(30), "batch started", true, progress).await,
        );
        sys.kill(victim, 0);
        {
            let r = sys.restart(victim, 0).await;
            check(&sys, r)
        };
        let n = all.len();
        let r = sys.wait_provisioned(n, Duration::from_secs(60)).await;
        check(&sys, r);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(sys.pvs().await.unwrap().len(), n, "no PV provisioned twice");
        assert_eq!(sys.dir_count(), n, "one directory per claim");
    }
    // Every PV names its own directory: <namespace>-<claim>-<pv name>.
    for pv in sys.pvs().await.unwrap() {
        let claim = pv.spec.as_ref().unwrap().claim_ref.as_ref().unwrap();
        assert_eq!(
            nfs_path(&pv),
            format!(
                "{EXPORT}/default-{}-{}",
                claim.name.as_deref().unwrap(),
                pv.metadata.name.as_deref().unwrap()
            )
        );
    }

    // reclaim-svc killed in the middle of deleting the volumes.
    sys.delete_claims(&all).await.unwrap();
    let n = all.len();
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "reclaim started", true, || async {
            Ok(sys.pvs().await?.len() < n - 3)
        })
        .await,
    );
    sys.kill(Service::Reclaim, 0);
    {
        let r = sys.restart(Service::Reclaim, 0).await;
        check(&sys, r)
    };
    let r = wait_eq(
        Duration::from_secs(60),
        "(PVs, volume directories)",
        (0, 0),
        || async { Ok((sys.pvs().await?.len(), sys.dir_count())) },
    )
    .await;
    check(&sys, r);
    assert!(tree(sys.base_dir()).is_empty());
}

/// Upstream's documented pattern with claims at `app` and `app/db`: the
/// inner one is refused (`ProvisioningFailed`, no directory), so deleting
/// the outer one (`onDelete: delete`) removes no other volume's data.
async fn a_claim_whose_directory_nests_in_another_volume_is_refused(plane: ControlPlane) {
    let sys = system(plane).await;
    let params = [
        (
            "pathPattern",
            "${.PVC.namespace}/${.PVC.annotations.nfs.io/storage-path}",
        ),
        ("onDelete", "delete"),
    ];
    check(
        &sys,
        sys.create_storage_class("nfs-nest", "Immediate", &params)
            .await,
    );
    claim(
        &sys,
        "outer",
        "nfs-nest",
        &[],
        &[("nfs.io/storage-path", "app")],
    )
    .await;
    let outer = check(
        &sys,
        sys.wait_pv_for_claim("outer", Duration::from_secs(30))
            .await,
    );
    let base = sys.base_dir().to_path_buf();
    std::fs::write(base.join("default/app/file"), b"outer").unwrap();
    claim(
        &sys,
        "inner",
        "nfs-nest",
        &[],
        &[("nfs.io/storage-path", "app/db")],
    )
    .await;
    let r = sys
        .wait_objects_with_event("ProvisioningFailed", 1, Duration::from_secs(30))
        .await;
    check(&sys, r);
    assert_eq!(
        sys.pvs().await.unwrap().len(),
        1,
        "only the outer claim has a volume"
    );
    assert_eq!(tree(&base), ["default", "default/app", "default/app/file"]);

    sys.delete_claims(&["outer".into()]).await.unwrap();
    wait_pv_gone(&sys, outer.metadata.name.as_deref().unwrap()).await;
    assert_eq!(tree(&base), ["default"], "{}", sys.log_tails(20));
}

/// PVs that upstream nfs-subdir-external-provisioner made (no policy
/// annotation) follow their StorageClass as read at delete time: `onDelete:
/// retain` leaves the directory where it was, `archiveOnDelete: "false"`
/// removes it, and with the class gone nothing is touched
/// (`VolumeFailedDelete`, the PV stays).
async fn volumes_provisioned_by_upstream_follow_their_class_at_delete(plane: ControlPlane) {
    let sys = system(plane).await;
    let classes: [(&str, &[(&str, &str)]); 3] = [
        ("up-retain", &[("onDelete", "retain")]),
        ("up-delete", &[("archiveOnDelete", "false")]),
        ("up-gone", &[]),
    ];
    let base = sys.base_dir().to_path_buf();
    for (class, params) in classes {
        check(
            &sys,
            sys.create_storage_class(class, "Immediate", params).await,
        );
        let dir = format!("default-{class}-pvc-{class}");
        std::fs::create_dir(base.join(&dir)).unwrap();
        std::fs::write(base.join(&dir).join("file"), b"data").unwrap();
        // As upstream wrote it: pre-bound, provisioned-by, no policy annotation.
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "metadata": {
                "name": format!("pvc-{class}"),
                "annotations": {"pv.kubernetes.io/provisioned-by": sys.settings.provisioner_name},
            },
            "spec": {
                "capacity": {"storage": "1Mi"},
                "accessModes": ["ReadWriteOnce"],
                "persistentVolumeReclaimPolicy": "Delete",
                "storageClassName": class,
                "claimRef": {"namespace": "default", "name": class},
                "nfs": {"server": SERVER, "path": format!("{EXPORT}/{dir}")},
            },
        }))
        .unwrap();
        let r = kube::Api::<PersistentVolume>::all(sys.client.clone())
            .create(&PostParams::default(), &pv)
            .await;
        check(&sys, r.map_err(anyhow::Error::from));
        let mut c = sys.claim_manifest(class, class, &[]);
        c.spec.as_mut().unwrap().volume_name = Some(format!("pvc-{class}"));
        let r = sys.claims_api().create(&PostParams::default(), &c).await;
        check(&sys, r.map_err(anyhow::Error::from));
    }
    let r = wait_eq(Duration::from_secs(30), "claims bound", 3, || {
        sys.bound_claims()
    })
    .await;
    check(&sys, r);
    let r = kube::Api::<k8s_openapi::api::storage::v1::StorageClass>::all(sys.client.clone())
        .delete("up-gone", &Default::default())
        .await;
    check(&sys, r.map_err(anyhow::Error::from));

    sys.delete_claims(&["up-retain".into(), "up-delete".into(), "up-gone".into()])
        .await
        .unwrap();
    wait_pv_gone(&sys, "pvc-up-retain").await;
    wait_pv_gone(&sys, "pvc-up-delete").await;
    let r = sys
        .wait_objects_with_event("VolumeFailedDelete", 1, Duration::from_secs(30))
        .await;
    check(&sys, r);
    assert!(
        sys.pvs()
            .await
            .unwrap()
            .iter()
            .any(|p| p.metadata.name.as_deref() == Some("pvc-up-gone")),
        "the PV whose class is gone stays"
    );
    assert_eq!(
        tree(&base),
        [
            "default-up-gone-pvc-up-gone",
            "default-up-gone-pvc-up-gone/file",
            "default-up-retain-pvc-up-retain",
            "default-up-retain-pvc-up-retain/file",
        ],
        "retain kept the directory in place, archiveOnDelete \"false\" removed it, the class gone touched nothing\n{}",
        sys.log_tails(20)
    );
}

on_both_planes!(
    a_claim_whose_directory_nests_in_another_volume_is_refused,
    volumes_provisioned_by_upstream_follow_their_class_at_delete,
    nested_path_pattern_delete_removes_exactly_that_directory_and_archive_and_retain_keep_it,
    dot_dot_and_symlink_escapes_are_refused_and_nothing_outside_is_touched,
    sigkill_of_each_service_in_the_middle_of_a_batch_loses_nothing,
    directory_mode_quota_capacity_and_expansion_through_nfs_subdir,
);
