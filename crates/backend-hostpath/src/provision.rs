//! Provisioning half of the hostpath backend: create `<base-dir>/<pv name>`
//! (reused when present) and describe it as a `hostPath` PV (`DirectoryOrCreate`)
//! with the claim's request, access modes and volume mode, the class's reclaim
//! policy and mount options, and node affinity to the claim's selected node, else
//! `--node-name`. Refusals are final, except another selected node than
//! `--node-name`, which is `Reschedule`; the class may set no parameter.

use backend_kit::Refusal;
use std::path::Path;

use backend_kit::attrs::DirAttrs;
use backend_kit::capacity;
use backend_kit::quota::{self, QuotaMode};
use backend_kit::safe_fs::{self, WalkError};
use k8s_openapi::api::core::v1::{
    HostPathVolumeSource, NodeSelector, NodeSelectorRequirement, NodeSelectorTerm,
    PersistentVolume, VolumeNodeAffinity,
};
use provisioner_api::{ProvisionError, ProvisionOptions, ProvisioningState, VolumeError};

use super::base_dirs::PARAM_BASE_DIR;
use super::HostPath;

/// StorageClass `parameters` keys the hostpath backend accepts besides
/// [`backend_kit::claim::FILESYSTEM_PARAMETERS`].
pub const OWN_PARAMETERS: &[&str] = &[PARAM_BASE_DIR];

/// Node label used for the PV's node affinity.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";

/// `hostPath.type` of the PVs this backend publishes.
pub const HOST_PATH_TYPE: &str = "DirectoryOrCreate";

/// Create `<base-dir>/<pv name>` (and the base directory) and return its PV.
/// Errors: [`ProvisionError::Failed`], state `Reschedule` for another selected
/// node than `--node-name`, else `Finished` (module docs).
pub fn provision(
    backend: &HostPath,
    options: &ProvisionOptions,
) -> Result<PersistentVolume, ProvisionError> {
    let (class_name, params) =
        backend_kit::claim::checked_class("hostpath", &options.storage_class, OWN_PARAMETERS)?;
    let quota = QuotaMode::from_parameters(params)?;
    let attrs = DirAttrs::from_class(params)?;
    let base_dir = params.and_then(|p| p.get(PARAM_BASE_DIR));
    if let Some(dir) = base_dir.filter(|dir| Path::new(dir) != backend.base_dir) {
        return Err(ProvisionError::finished(format!(
            "StorageClass {class_name:?} has {PARAM_BASE_DIR}={dir:?}, which is not one of this provisioner's --base-dir"
        )));
    }
    backend_kit::single_component(&options.pv_name)?;
    let mut pv = backend_kit::claim::filesystem_pv(options, "hostpath")?;
    let spec = pv.spec.get_or_insert_with(Default::default);
    let request = &spec.capacity.as_ref().expect("filesystem_pv sets capacity")["storage"];
    if !provisioner_api::quantity::is_positive(request) {
        return Err(ProvisionError::finished(format!(
            "claim's storage request {:?} is not a positive quantity",
            request.0
        )));
    }
    let selected = options.selected_node.as_ref();
    let selected_name = selected.and_then(|n| n.metadata.name.as_ref());
    let node = match (selected_name, backend.node_name.as_ref()) {
        (Some(selected), Some(own)) if selected != own => {
            return Err(ProvisionError::Failed {
                state: ProvisioningState::Reschedule,
                reason: format!(
                    "selected node {selected:?} is not this provisioner's node {own:?}: the hostpath directory can only be created on {own:?}"
                ),
            });
        }
        (Some(node), _) | (None, Some(node)) => node.clone(),
        (None, None) => return Err(ProvisionError::finished(
            "no selected node on the claim and no --node-name (NODE_NAME) for the hostpath backend",
        )),
    };
    let bytes = provisioner_api::quantity::bytes(request).unwrap_or(u64::MAX);
    let full = match selected {
        Some(_) => ProvisioningState::Reschedule,
        None => ProvisioningState::Finished,
    };
    let path = create_volume_dir(backend, &options.pv_name, &attrs, quota, bytes, full)?;
    spec.host_path = Some(HostPathVolumeSource {
        path: path.to_string_lossy().into_owned(),
        type_: Some(HOST_PATH_TYPE.to_string()),
    });
    spec.node_affinity = Some(node_affinity(&node));
    Ok(pv)
}

/// Required node affinity `kubernetes.io/hostname In [node]`.
pub fn node_affinity(node: &str) -> VolumeNodeAffinity {
    VolumeNodeAffinity {
        required: Some(NodeSelector {
            node_selector_terms: vec![NodeSelectorTerm {
                match_expressions: Some(vec![NodeSelectorRequirement {
                    key: HOSTNAME_LABEL.to_string(),
                    operator: "In".to_string(),
                    values: Some(vec![node.to_string()]),
                }]),
                match_fields: None,
            }],
        }),
    }
}

/// Grow `volume`'s directory to `bytes`: its room in `--capacity` and its project quota
/// limit when it has one. Errors: not one of ours ([`validate_volume`]), no room, or the
/// limit could not be raised.
pub async fn expand(
    backend: &HostPath,
    volume: &PersistentVolume,
    bytes: u64,
) -> Result<(), VolumeError> {
    validate_volume(backend, volume)?;
    let name = volume.metadata.name.clone().unwrap_or_default();
    crate::delete::check_node(backend.node_name.as_deref(), &name, volume)
        .map_err(|e| VolumeError::Refused(e.to_string()))?;
    let (base, shown) = (backend.base_dir.clone(), format!("volume {name}"));
    quota::expand(
        base,
        vec![name.clone()],
        name,
        bytes,
        backend.capacity,
        shown,
    )
    .await
}

/// `validate_volume`: `pv` is one [`provision`] could have made (one-component
/// name, only `hostPath`, `DirectoryOrCreate`, path `<base-dir>/<pv name>`).
/// Errors: the first failed check, naming the PV.
pub fn validate_volume(backend: &HostPath, pv: &PersistentVolume) -> Result<(), Refusal> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    backend_kit::single_component(name)?;
    let source = backend_kit::claim::only_source(pv, "hostPath")?
        .host_path
        .as_ref()
        .ok_or_else(|| Refusal(format!("PV {name} has no hostPath volume source")))?;
    let expected = backend.base_dir.join(name);
    if source.path != expected.to_string_lossy() {
        return Err(Refusal(format!(
            "PV {name} has hostPath {:?}; this provisioner only makes {:?}",
            source.path,
            expected.display()
        )));
    }
    if source.type_.as_deref() != Some(HOST_PATH_TYPE) {
        return Err(Refusal(format!(
            "PV {name} has hostPath type {:?}; this provisioner only makes {HOST_PATH_TYPE:?}",
            source.type_
        )));
    }
    Ok(())
}

/// Create `<base-dir>/<name>` (reused when a real directory) under a handle on the base dir:
/// room in `--capacity` first (else a failure in state `full`), then the size limit and
/// `attrs`; what this call made is undone when a later step fails. Returns its path.
fn create_volume_dir(
    backend: &HostPath,
    name: &str,
    attrs: &DirAttrs,
    quota: QuotaMode,
    bytes: u64,
    full: ProvisioningState,
) -> Result<std::path::PathBuf, ProvisionError> {
    let base = &backend.base_dir;
    let io = |what: &str, e: std::io::Error| {
        ProvisionError::finished(format!("{what} {}: {e}", base.display()))
    };
    std::fs::create_dir_all(base).map_err(|e| io("cannot create base directory", e))?;
    let root = safe_fs::open_root(base).map_err(|e| io("cannot open base directory", e))?;
    let no_room = |r: Refusal| ProvisionError::Failed {
        state: full,
        reason: format!("base directory {}: {}", base.display(), r.0),
    };
    let reserve = |room| capacity::reserve(&root, name, bytes, room);
    let reserved = backend.capacity.map_or(Ok(false), reserve);
    let reserved = reserved.map_err(no_room)?;
    let undo = |created: bool| {
        if created {
            let _ = root.remove_dir(name);
        }
        if reserved {
            let _ = capacity::release(&root, name);
        }
    };
    let path = base.join(name);
    let made = safe_fs::create_path(&root, &[name.to_string()], attrs.mode);
    let (dir, created) = made.inspect_err(|_| undo(false)).map_err(|e| {
        let shown = path.display();
        ProvisionError::finished(match e {
            WalkError::NotADirectory(_) => format!("{shown} exists and is not a directory"),
            WalkError::Symlink(_) => format!("{shown} is a symlink; refusing to follow it"),
            e => format!("cannot create volume directory {shown}: {e}"),
        })
    })?;
    if created {
        tracing::info!(path = %path.display(), "created hostpath volume directory");
    } else {
        tracing::info!(path = %path.display(), "reusing existing hostpath volume directory");
    }
    let shown = path.display().to_string();
    quota::limit_and_own(&dir, name, quota, bytes, attrs, &shown).inspect_err(|_| undo(created))?;
    Ok(path)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::OnDelete;
    use k8s_openapi::api::core::v1::PersistentVolumeSpec;
    use k8s_openapi::api::core::v1::{
        Node, PersistentVolumeClaim, PersistentVolumeClaimSpec, VolumeResourceRequirements,
    };
    use k8s_openapi::api::storage::v1::StorageClass;
    use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::collections::BTreeMap;

    pub(crate) fn backend(base: &Path, node: Option<&str>) -> HostPath {
        HostPath {
            base_dir: base.to_path_buf(),
            node_name: node.map(str::to_string),
            on_delete: OnDelete::Delete,
            capacity: None,
        }
    }

    pub(crate) fn options(request: Option<&str>) -> ProvisionOptions {
        ProvisionOptions {
            storage_class: StorageClass {
                metadata: ObjectMeta {
                    name: Some("local".into()),
                    ..Default::default()
                },
                provisioner: "example.com/hostpath".into(),
                ..Default::default()
            },
            pv_name: "pvc-123".into(),
            pvc: PersistentVolumeClaim {
                metadata: ObjectMeta {
                    namespace: Some("ns".into()),
                    name: Some("data".into()),
                    uid: Some("123".into()),
                    ..Default::default()
                },
                spec: Some(PersistentVolumeClaimSpec {
                    access_modes: Some(vec!["ReadWriteOnce".into()]),
                    resources: Some(VolumeResourceRequirements {
                        requests: request
                            .map(|r| BTreeMap::from([("storage".to_string(), Quantity(r.into()))])),
                        ..Default::default()
                    }),
                    volume_mode: Some("Filesystem".into()),
                    ..Default::default()
                }),
                status: None,
            },
            selected_node: None,
        }
    }

    pub(crate) fn reason(err: ProvisionError) -> String {
        match err {
            ProvisionError::Failed {
                state: ProvisioningState::Finished,
                reason,
            } => reason,
            other => panic!("expected a Finished failure, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn validate_volume_accepts_only_what_provision_makes() {
        let tmp = tempfile::tempdir().unwrap();
        let b = backend(tmp.path(), Some("node-a"));
        let pv = provision(&b, &options(Some("1Gi"))).unwrap();
        validate_volume(&b, &pv).unwrap();

        let with = |edit: &dyn Fn(&mut PersistentVolume)| {
            let mut pv = pv.clone();
            edit(&mut pv);
            validate_volume(&b, &pv).unwrap_err().0
        };
        fn host_path(pv: &mut PersistentVolume) -> &mut HostPathVolumeSource {
            pv.spec.as_mut().unwrap().host_path.as_mut().unwrap()
        }
        assert!(with(&|pv| host_path(pv).path = "/".into()).contains("hostPath \"/\""));
        let base = tmp.path().to_string_lossy().into_owned();
        for path in [
            format!("{base}/pvc-other"),
            format!("{base}/pvc-123/"),
            format!("{base}//pvc-123"),
            format!("{base}/x/../pvc-123"),
            format!("{base}/pvc-123/../../etc"),
        ] {
            let err = with(&|pv| host_path(pv).path = path.clone());
            assert!(err.contains("only makes"), "{path}: {err}");
        }
        assert!(with(&|pv| host_path(pv).type_ = Some("Directory".into())).contains("type"));
        assert!(with(&|pv| pv.spec.as_mut().unwrap().host_path = None).contains("no hostPath"));
        assert!(with(&|pv| {
            pv.spec.as_mut().unwrap().nfs = Some(k8s_openapi::api::core::v1::NFSVolumeSource {
                server: "evil".into(),
                path: "/".into(),
                read_only: None,
            })
        })
        .contains("volume sources besides hostPath: nfs"));
        assert!(with(&|pv| pv.spec = None).contains("no spec"));
        // The name must be one path component, and the path follows the name.
        let err = with(&|pv| {
            pv.metadata.name = Some("../etc".into());
            host_path(pv).path = format!("{base}/../etc");
        });
        assert!(err.contains("single path component"), "{err}");
        let other_base = backend(&tmp.path().join("elsewhere"), None);
        assert!(validate_volume(&other_base, &pv).is_err());
    }

    #[tokio::test]
    async fn creates_directory_and_pv_pinned_to_fallback_node() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("missing/base");
        let b = backend(&base, Some("node-a"));
        let mut opts = options(Some("1Gi"));
        opts.storage_class.mount_options = Some(vec!["noatime".into()]);
        let pv = provision(&b, &opts).unwrap();

        let dir = base.join("pvc-123");
        let meta = std::fs::metadata(&dir).unwrap();
        assert!(meta.is_dir());
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(meta.permissions().mode() & 0o777, 0o777);

        let expected = PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-123".into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: dir.to_string_lossy().into_owned(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                capacity: Some(BTreeMap::from([(
                    "storage".to_string(),
                    Quantity("1Gi".into()),
                )])),
                access_modes: Some(vec!["ReadWriteOnce".into()]),
                volume_mode: Some("Filesystem".into()),
                persistent_volume_reclaim_policy: Some("Delete".into()),
                mount_options: Some(vec!["noatime".into()]),
                node_affinity: Some(node_affinity("node-a")),
                ..Default::default()
            }),
            status: None,
        };
        assert_eq!(pv, expected);
        assert_eq!(
            serde_json::to_value(pv.spec.unwrap().node_affinity).unwrap(),
            serde_json::json!({"required": {"nodeSelectorTerms": [{"matchExpressions": [
                {"key": "kubernetes.io/hostname", "operator": "In", "values": ["node-a"]}
            ]}]}})
        );
    }

    #[tokio::test]
    async fn selected_node_and_class_reclaim_policy_win_and_repeat_is_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let b = backend(tmp.path(), None);
        let mut opts = options(Some("5M"));
        opts.storage_class.reclaim_policy = Some("Retain".into());
        opts.selected_node = Some(Node {
            metadata: ObjectMeta {
                name: Some("node-b".into()),
                ..Default::default()
            },
            ..Default::default()
        });
        let first = provision(&b, &opts).unwrap();
        std::fs::write(tmp.path().join("pvc-123/data"), b"keep").unwrap();
        let second = provision(&b, &opts).unwrap();
        assert_eq!(first, second);
        assert_eq!(
            std::fs::read(tmp.path().join("pvc-123/data")).unwrap(),
            b"keep",
            "an existing volume directory is reused, not recreated"
        );
        let spec = second.spec.unwrap();
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Retain")
        );
        assert_eq!(spec.node_affinity, Some(node_affinity("node-b")));
        assert_eq!(spec.mount_options, None);
    }

    fn on_node(mut opts: ProvisionOptions, node: &str) -> ProvisionOptions {
        opts.selected_node = Some(Node {
            metadata: ObjectMeta {
                name: Some(node.into()),
                ..Default::default()
            },
            ..Default::default()
        });
        opts
    }

    #[tokio::test]
    async fn a_selected_node_other_than_node_name_reschedules_and_creates_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let b = backend(tmp.path(), Some("storage-node"));
        let e = provision(&b, &on_node(options(Some("1Gi")), "other-node")).unwrap_err();
        assert_eq!(
            e,
            ProvisionError::Failed {
                state: ProvisioningState::Reschedule,
                reason: "selected node \"other-node\" is not this provisioner's node \"storage-node\": the hostpath directory can only be created on \"storage-node\"".into(),
            }
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);

        // The same node is fine, and without --node-name any selected node is used.
        let pv = provision(&b, &on_node(options(Some("1Gi")), "storage-node")).unwrap();
        assert_eq!(
            pv.spec.unwrap().node_affinity,
            Some(node_affinity("storage-node"))
        );
        let anywhere = backend(tmp.path(), None);
        let pv = provision(&anywhere, &on_node(options(Some("1Gi")), "node-x")).unwrap();
        assert_eq!(
            pv.spec.unwrap().node_affinity,
            Some(node_affinity("node-x"))
        );
    }

    #[tokio::test]
    async fn rejections_are_final_and_create_nothing() {
        let tmp = tempfile::tempdir().unwrap();
        let b = backend(tmp.path(), Some("n"));

        let e = provision(&b, &options(None)).unwrap_err();
        assert_eq!(
            reason(e),
            "claim has no storage request (resources.requests.storage)"
        );
        for bad in ["0", "-1Gi", "0Gi", "abc", "1Qi", ""] {
            let e = provision(&b, &options(Some(bad))).unwrap_err();
            assert_eq!(
                reason(e),
                format!("claim's storage request {bad:?} is not a positive quantity")
            );
        }

        let mut block = options(Some("1Gi"));
        block.pvc.spec.as_mut().unwrap().volume_mode = Some("Block".into());
        assert_eq!(
            reason(provision(&b, &block).unwrap_err()),
            "the hostpath backend does not support volumeMode Block"
        );

        let mut vac = options(Some("1Gi"));
        vac.pvc.spec.as_mut().unwrap().volume_attributes_class_name = Some("gold".into());
        assert_eq!(
            reason(provision(&b, &vac).unwrap_err()),
            "claim names VolumeAttributesClass \"gold\", but the hostpath backend is not a CSI driver and cannot apply volume attributes; remove spec.volumeAttributesClassName"
        );

        let mut params = options(Some("1Gi"));
        params.storage_class.parameters = Some(BTreeMap::from([
            ("zz".to_string(), "1".to_string()),
            ("path".to_string(), "/x".to_string()),
        ]));
        assert_eq!(
            reason(provision(&b, &params).unwrap_err()),
            "StorageClass \"local\" has parameters the hostpath backend does not know: path, zz (it accepts baseDir, quota, directoryMode, directoryUID, directoryGID)"
        );
        // A `quota` the backend cannot honour, and one it does not know: no directory either.
        for (value, expected) in [
            ("required", "(StorageClass quota=required)"),
            (
                "yes",
                "quota=\"yes\" is not one of off, best-effort, required",
            ),
        ] {
            let mut quota = options(Some("1Gi"));
            let parameters = BTreeMap::from([("quota".to_string(), value.to_string())]);
            quota.storage_class.parameters = Some(parameters);
            let err = reason(provision(&b, &quota).unwrap_err());
            assert!(err.contains(expected), "{value}: {err}");
        }

        let mut no_modes = options(Some("1Gi"));
        no_modes.pvc.spec.as_mut().unwrap().access_modes = None;
        assert_eq!(
            reason(provision(&b, &no_modes).unwrap_err()),
            "claim has no access modes"
        );

        let no_node = backend(tmp.path(), None);
        assert_eq!(
            reason(provision(&no_node, &options(Some("1Gi"))).unwrap_err()),
            "no selected node on the claim and no --node-name (NODE_NAME) for the hostpath backend"
        );

        for bad_name in ["../escape", "a/b", "..", ""] {
            let mut o = options(Some("1Gi"));
            o.pv_name = bad_name.into();
            let r = reason(provision(&b, &o).unwrap_err());
            assert!(r.contains("is not a single path component"), "{r}");
        }

        assert_eq!(
            std::fs::read_dir(tmp.path()).unwrap().count(),
            0,
            "no directory was created by a rejected claim"
        );
    }

    /// The class's `directoryMode`/`directoryGID` on a new directory; a bad one is refused.
    #[tokio::test]
    async fn class_directory_parameters_set_mode_and_group() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let tmp = tempfile::tempdir().unwrap();
        let b = backend(tmp.path(), Some("n"));
        let gid = std::fs::metadata(tmp.path()).unwrap().gid().to_string();
        let mut opts = options(Some("1Gi"));
        let params = [("directoryMode", "0750"), ("directoryGID", gid.as_str())];
        let params = params.iter().map(|(k, v)| (k.to_string(), v.to_string()));
        opts.storage_class.parameters = Some(params.collect());
        provision(&b, &opts).unwrap();
        let meta = std::fs::metadata(tmp.path().join("pvc-123")).unwrap();
        assert_eq!(meta.permissions().mode() & 0o7777, 0o750);
        assert_eq!(meta.gid().to_string(), gid);
        let mut bad = options(Some("1Gi"));
        bad.pv_name = "pvc-456".into();
        let params = BTreeMap::from([("directoryMode".to_string(), "rwx".to_string())]);
        bad.storage_class.parameters = Some(params);
        let err = reason(provision(&b, &bad).unwrap_err());
        assert!(
            err.contains("directoryMode=\"rwx\" is not an octal permission mode"),
            "{err}"
        );
        assert!(!tmp.path().join("pvc-456").exists());
    }

    /// `--capacity`: a claim that does not fit fails (is rescheduled with a selected node)
    /// and creates nothing; a deleted volume gives its room back.
    #[tokio::test]
    async fn claims_beyond_the_capacity_fail_and_deletion_gives_room_back() {
        let tmp = tempfile::tempdir().unwrap();
        let b = HostPath {
            capacity: Some(3 << 29), // 1.5 GiB
            ..backend(tmp.path(), Some("n"))
        };
        let first = provision(&b, &options(Some("1Gi"))).unwrap();
        let mut second = options(Some("1Gi"));
        second.pv_name = "pvc-456".into();
        let err = reason(provision(&b, &second).unwrap_err());
        let dir = tmp.path().display();
        assert_eq!(
            err,
            format!("base directory {dir}: the claim's 1073741824 bytes do not fit: 1073741824 of the base directory's capacity of 1610612736 bytes are taken, 536870912 free")
        );
        match provision(&b, &on_node(second.clone(), "n")).unwrap_err() {
            ProvisionError::Failed { state, .. } => {
                assert_eq!(state, ProvisioningState::Reschedule)
            }
            other => panic!("{other:?}"),
        }
        assert!(!tmp.path().join("pvc-456").exists());
        provision(&b, &options(Some("1Gi"))).unwrap(); // the same volume again: its own room
        crate::delete::delete(&b, &first).unwrap();
        provision(&b, &second).unwrap();
    }

    #[tokio::test]
    async fn a_file_in_the_way_is_an_error() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("pvc-123"), b"").unwrap();
        let e = provision(&backend(tmp.path(), Some("n")), &options(Some("1Gi"))).unwrap_err();
        assert_eq!(
            reason(e),
            format!(
                "{} exists and is not a directory",
                tmp.path().join("pvc-123").display()
            )
        );
    }

    /// A symlink planted under the volume's name, pointing out of the base
    /// directory, is refused: nothing is created or chmod-ed through it.
    #[tokio::test]
    async fn a_symlink_in_the_way_is_refused_and_its_target_untouched() {
        use std::os::unix::fs::PermissionsExt;
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        let outside = tmp.path().join("outside");
        std::fs::create_dir_all(&base).unwrap();
        std::fs::create_dir(&outside).unwrap();
        std::fs::set_permissions(&outside, std::fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::symlink(&outside, base.join("pvc-123")).unwrap();
        let e = provision(&backend(&base, Some("n")), &options(Some("1Gi"))).unwrap_err();
        assert_eq!(
            reason(e),
            format!(
                "{} is a symlink; refusing to follow it",
                base.join("pvc-123").display()
            )
        );
        let mode = std::fs::metadata(&outside).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o700, "target's permissions unchanged");
    }

    #[test]
    fn no_parameters_pass_validation() {
        let check = |parameters| {
            let class = StorageClass {
                parameters,
                ..Default::default()
            };
            backend_kit::claim::checked_class("hostpath", &class, OWN_PARAMETERS).map(|_| ())
        };
        assert!(check(None).is_ok());
        assert!(check(Some(BTreeMap::new())).is_ok());
    }
}
