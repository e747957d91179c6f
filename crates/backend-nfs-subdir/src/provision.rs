//! Provisioning half of the nfs-subdir backend: check the class and the claim,
//! create the sub-directory below the mount, and describe it as an `nfs` PV.
//!
//! The PV has `nfs: {server: --nfs-server, path: <--nfs-path>/<sub-directory>}`,
//! `capacity.storage` = the claim's request (verbatim), the claim's access
//! modes, the class's reclaim policy (`Delete` when unset, as Kubernetes
//! defaults it) and `mountOptions`, and annotation [`super::ANN_ON_DELETE`].
//!
//! Every refusal is a [`ProvisionError::Failed`] with state `Finished` (a
//! `ProvisioningFailed` event) and leaves the filesystem untouched.
//! Idempotent per PV name (see [`super::registry`]).

use backend_kit::Refusal;
use std::collections::BTreeMap;

use cap_std::fs::Dir;
use k8s_openapi::api::core::v1::{NFSVolumeSource, PersistentVolume};
use k8s_openapi::api::storage::v1::StorageClass;
use provisioner_api::{ProvisionError, ProvisionOptions};

use super::delete::mount_error;
use super::pattern::{volume_path, RelPath};
use super::{registry, NfsSubdir, OnDelete, ANN_ON_DELETE};
use backend_kit::attrs::DirAttrs;
use backend_kit::capacity;
use backend_kit::quota::{self, QuotaMode};
use backend_kit::safe_fs::{self, Entry, WalkError};

/// StorageClass parameters the backend accepts (upstream's names) besides
/// [`backend_kit::claim::FILESYSTEM_PARAMETERS`].
pub const OWN_PARAMETERS: &[&str] = &[PARAM_PATH_PATTERN, PARAM_ON_DELETE, PARAM_ARCHIVE_ON_DELETE];
/// Parameter: sub-directory template.
pub const PARAM_PATH_PATTERN: &str = "pathPattern";
/// Parameter: `delete` or `retain`.
pub const PARAM_ON_DELETE: &str = "onDelete";
/// Parameter: Go boolean; `false` deletes, `true` (default) archives.
pub const PARAM_ARCHIVE_ON_DELETE: &str = "archiveOnDelete";

/// Claim annotation: octal permission bits of the new directory.
pub const ANN_CREATE_MODE: &str = "nfs.io/createMode";
/// Claim annotation: numeric owner of the new directory.
pub const ANN_CREATE_UID: &str = "nfs.io/createUID";
/// Claim annotation: numeric group of the new directory.
pub const ANN_CREATE_GID: &str = "nfs.io/createGID";

/// Permissions of intermediate directories of a nested `pathPattern`.
pub const PARENT_MODE: u32 = 0o755;

/// Check the class's parameters and resolve its delete policy (as
/// [`upstream_policy`](super::delete::upstream_policy)). Errors: an unknown
/// parameter, a bad `onDelete` or a non-boolean `archiveOnDelete`.
pub fn class_policy(class: &StorageClass) -> Result<OnDelete, Refusal> {
    let (class_name, parameters) =
        backend_kit::claim::checked_class("nfs-subdir", class, OWN_PARAMETERS)?;
    let on_delete = parameters.and_then(|p| p.get(PARAM_ON_DELETE));
    if let Some(other) = on_delete.filter(|v| !matches!(v.as_str(), "delete" | "retain")) {
        return Err(Refusal(format!(
            "StorageClass {class_name:?} parameter onDelete={other:?} is neither \"delete\" nor \"retain\""
        )));
    }
    parameters_policy(parameters).map_err(|v| {
        Refusal(format!(
            "StorageClass {class_name:?} parameter archiveOnDelete={v:?} is not a boolean"
        ))
    })
}

/// Upstream's delete policy from class `params`: `onDelete` `delete`/`retain` wins (another
/// value is ignored), else `archiveOnDelete` (`false` deletes), else archive.
/// Errors: the value of a non-boolean `archiveOnDelete`.
pub fn parameters_policy(params: Option<&BTreeMap<String, String>>) -> Result<OnDelete, &str> {
    let get = |key| params.and_then(|p| p.get(key)).map(String::as_str);
    // `archiveOnDelete` is read as Go's `strconv.ParseBool` reads it, as upstream does.
    match (get(PARAM_ON_DELETE), get(PARAM_ARCHIVE_ON_DELETE)) {
        (Some("delete"), _) => Ok(OnDelete::Delete),
        (Some("retain"), _) => Ok(OnDelete::Retain),
        (_, None | Some("1" | "t" | "T" | "TRUE" | "true" | "True")) => Ok(OnDelete::Archive),
        (_, Some("0" | "f" | "F" | "FALSE" | "false" | "False")) => Ok(OnDelete::Delete),
        (_, Some(v)) => Err(v),
    }
}

/// Create the claim's sub-directory and return its PV (module docs).
/// Errors: [`ProvisionError::Failed`] (state `Finished`) for every refusal of
/// the backend docs and for filesystem errors.
pub fn provision(
    backend: &NfsSubdir,
    options: &ProvisionOptions,
) -> Result<PersistentVolume, ProvisionError> {
    let policy = class_policy(&options.storage_class)?;
    let params = options.storage_class.parameters.as_ref();
    let quota = QuotaMode::from_parameters(params)?;
    let claim_spec = options.pvc.spec.as_ref();
    if claim_spec.is_some_and(|spec| spec.selector.is_some()) {
        return Err(ProvisionError::finished(
            "claim Selector is not supported by the nfs-subdir backend",
        ));
    }
    let mut pv = backend_kit::claim::filesystem_pv(options, "nfs-subdir")?;
    registry::check_pv_name(&options.pv_name)?;
    // The class's `directory*` parameters, then the claim's `nfs.io/create*` annotations.
    let annotations = options.pvc.metadata.annotations.as_ref();
    let keys = [ANN_CREATE_MODE, ANN_CREATE_UID, ANN_CREATE_GID];
    let attrs = DirAttrs::from_class(params)?.overridden(annotations, keys, "claim annotation")?;
    let pattern = params
        .and_then(|p| p.get(PARAM_PATH_PATTERN))
        .map(String::as_str);
    let rel = volume_path(pattern, &options.pvc.metadata, &options.pv_name)?;
    let annotation = (ANN_ON_DELETE.to_string(), policy.as_str().to_string());
    pv.metadata.annotations = Some(BTreeMap::from([annotation]));
    let spec = pv.spec.get_or_insert_with(Default::default);
    let storage = &spec.capacity.as_ref().expect("filesystem_pv sets capacity")["storage"];
    let bytes = provisioner_api::quantity::bytes(storage).unwrap_or(u64::MAX);

    let room = (quota, bytes, backend.capacity);
    create_dir(&backend.mount, &options.pv_name, &rel, attrs, room)?;

    spec.nfs = Some(NFSVolumeSource {
        server: backend.server.clone(),
        path: format!("{}/{rel}", backend.export_prefix()),
        read_only: None,
    });
    Ok(pv)
}

/// Make PV `pv_name`'s directory `rel` below `mount`, recorded first ([`record`]), with its
/// attributes, quota and capacity reservation; a refusal undoes what this try made.
fn create_dir(
    mount: &std::path::Path,
    pv_name: &str,
    rel: &RelPath,
    attrs: DirAttrs,
    (quota, bytes, room): (QuotaMode, u64, Option<u64>),
) -> Result<(), Refusal> {
    let root = safe_fs::open_root(mount).map_err(|e| Refusal(mount_error(mount, e)))?;
    let (parent_comps, last) = rel.split_last();
    let refusing = refusing(rel);
    let retry = record(&root, pv_name, rel)?;
    let forget = undo_record(&root, pv_name, retry);
    let (parent, _) =
        safe_fs::create_path(&root, parent_comps, PARENT_MODE).map_err(|e| forget(refusing(e)))?;
    let created = match parent.create_dir(last) {
        Ok(()) => true,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => false,
        Err(e) => return Err(forget(Refusal(format!("cannot create \"{rel}\": {e}")))),
    };
    if !created && !retry {
        return Err(forget(taken(&root, pv_name, rel)));
    }
    let dir = safe_fs::open_path(&parent, &[last.to_string()]).map_err(|e| forget(refusing(e)))?;
    let reserved = room.map_or(Ok(false), |room| {
        capacity::reserve(&root, pv_name, bytes, room)
    });
    let shown = format!("\"{rel}\"");
    let finished = reserved
        .clone()
        .and_then(|_| quota::limit_and_own(&dir, pv_name, quota, bytes, &attrs, &shown));
    if let Err(refusal) = finished {
        if created {
            let _ = parent.remove_dir(last);
        }
        if reserved == Ok(true) {
            let _ = capacity::release(&root, pv_name);
        }
        return Err(forget(refusal));
    }
    tracing::info!(pv = pv_name, directory = %rel, created, "nfs-subdir volume directory ready");
    Ok(())
}

/// Record `rel` as PV `pv_name`'s directory, or find it recorded by an earlier try
/// (`Ok(true)`); refuses a directory that exists unrecorded, nests with or belongs to another
/// volume, and then removes a first try's record again.
fn record(root: &Dir, pv_name: &str, rel: &RelPath) -> Result<bool, Refusal> {
    let (parent_comps, last) = rel.split_last();
    let refusing = refusing(rel);
    // Record-then-check below; serialized within this process so two
    // nesting claims provisioned at once never both refuse.
    let _guard = RECORDING.lock().unwrap_or_else(|e| e.into_inner());
    let recorded = registry::get(root, pv_name)
        .map_err(|e| Refusal(format!("cannot read the record of PV {pv_name}: {e}")))?;
    let retry = match recorded {
        Some(r) if &r != rel => {
            return Err(Refusal(format!(
                "PV {pv_name} was already provisioned at \"{r}\", but the claim now resolves to \"{rel}\" (its labels, annotations or the class's pathPattern changed); refusing"
            )))
        }
        Some(_) => true,
        None => {
            // A directory that exists without having been created for this
            // PV is never adopted.
            match safe_fs::open_path(root, parent_comps) {
                Ok(parent) => match safe_fs::entry(&parent, last) {
                    Ok(Entry::Absent) => {}
                    Ok(_) => return Err(taken(root, pv_name, rel)),
                    Err(e) => return Err(Refusal(format!("cannot inspect \"{rel}\": {e}"))),
                },
                Err(WalkError::Missing(_)) => {}
                Err(e) => return Err(refusing(e)),
            }
            registry::put(root, pv_name, rel)
                .map_err(|e| Refusal(format!("cannot record PV {pv_name}: {e}")))?;
            false
        }
    };
    let forget = undo_record(root, pv_name, retry);
    // Checked after recording ours, so of two claims whose directories nest
    // (provisioned at once, by any replica) at least one sees the other.
    registry::nested_with(root, pv_name, rel)
        .map_err(|e| Refusal(format!("cannot read the volume records: {e}")))
        .and_then(|nested| nesting(rel, &nested))
        .map_err(&forget)?;
    // Another PV's record for this path (say one whose delete has not finished):
    // never share it, even while the directory is absent.
    let others = registry::other_owners(root, pv_name, rel)
        .map_err(|e| forget(Refusal(format!("cannot read the volume records: {e}"))))?;
    if !others.is_empty() {
        return Err(forget(taken(root, pv_name, rel)));
    }
    Ok(retry)
}

/// A failed walk to `rel`'s directory as a refusal naming it.
fn refusing(rel: &RelPath) -> impl Fn(WalkError) -> Refusal + '_ {
    move |e| Refusal(format!("refusing directory \"{rel}\": {e}"))
}

/// What a refusal does to PV `pv_name`'s record: removes it after a first try (`retry` false),
/// which made nothing, and keeps an earlier try's.
fn undo_record<'a>(
    root: &'a Dir,
    pv_name: &'a str,
    retry: bool,
) -> impl Fn(Refusal) -> Refusal + 'a {
    move |refusal| {
        if !retry {
            let _ = registry::remove(root, pv_name);
        }
        refusal
    }
}

/// Held while a provisioning records its directory and checks for nesting.
static RECORDING: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// Refuses `rel` when it is inside or contains any of the `nested` volumes.
fn nesting(rel: &RelPath, nested: &[(String, RelPath)]) -> Result<(), Refusal> {
    let Some((pv, other)) = nested.first() else {
        return Ok(());
    };
    let relation = if other.contains(rel) {
        "is inside"
    } else {
        "contains"
    };
    Err(Refusal(format!(
        "directory \"{rel}\" {relation} the directory \"{other}\" of PV {pv}; a volume's directory must neither be inside nor contain another's (check the class's pathPattern and the claim's annotations), refusing"
    )))
}

fn taken(root: &Dir, pv_name: &str, rel: &RelPath) -> Refusal {
    let owners = registry::other_owners(root, pv_name, rel).unwrap_or_default();
    Refusal(if owners.is_empty() {
        format!(
            "directory \"{rel}\" already exists on the export and was not created for PV {pv_name}; refusing to share it (move it away, or bind it with a static PV)"
        )
    } else {
        format!(
            "directory \"{rel}\" already belongs to PV {}; two claims resolve to the same directory (check the class's pathPattern), refusing to share it (a record left by a PV deleted by hand, whose directory is gone: remove .split-provisioner/volumes/{} on the export)",
            owners.join(", "),
            owners.join(", .split-provisioner/volumes/")
        )
    })
}
