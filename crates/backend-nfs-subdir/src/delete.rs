//! Deletion half of the nfs-subdir backend: the directory a PV's `nfs.path`
//! names, after [`volume_directory`]'s checks (only source `nfs`, our server,
//! strictly below `--nfs-path`, a valid PV name), walked from the mount without
//! crossing a symlink, and not recorded for another PV. Policies: `delete`,
//! `retain`, `archive` (rename to `archived-<name>`, else
//! `archived-<name>-<pv name>`, in the same parent). A directory holding
//! another recorded volume is never deleted or archived; an absent one counts
//! as deleted. Rationale: docs/ARCHITECTURE.md, "nfs-subdir".

use backend_kit::Refusal;
use std::collections::HashSet;
use std::io;

use cap_std::fs::Dir;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use provisioner_api::{DeleteError, ProvisionOptions, VolumeError};
use VolumeError::Unreadable as unreadable;

use super::pattern::RelPath;
use super::provision::{class_policy, parameters_policy, PARAM_ARCHIVE_ON_DELETE};
use super::{registry, NfsSubdir, OnDelete, ANN_ON_DELETE};
use backend_kit::safe_fs::{self, WalkError};
use backend_kit::volume_dir;
use backend_kit::{blocking, failed, refused, ARCHIVE_PREFIX};
use provisioner_api::OrphanOutcome;

/// The sub-directory (below the mount) that `pv` names, after the module
/// docs' checks; also pv-writer's `validate_volume`.
/// Errors: a message naming the failed check.
pub fn volume_directory(backend: &NfsSubdir, pv: &PersistentVolume) -> Result<RelPath, Refusal> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    registry::check_pv_name(name)?;
    let spec = backend_kit::claim::only_source(pv, "nfs")?;
    let nfs = spec.nfs.as_ref().ok_or_else(|| {
        Refusal(format!(
            "PV {name} has no spec.nfs; it is not an nfs-subdir volume"
        ))
    })?;
    if nfs.server != backend.server {
        return Err(Refusal(format!(
            "PV {name} is on NFS server {:?}, not this provisioner's {:?}",
            nfs.server, backend.server
        )));
    }
    let Some(rest) = below_export(backend, &nfs.path) else {
        return Err(Refusal(format!(
            "PV {name} has nfs.path {:?}, which is not a directory below this provisioner's export {:?}",
            nfs.path, backend.export_path
        )));
    };
    RelPath::parse(&rest).map_err(|e| Refusal(format!("PV {name}: {e}")))
}

/// `path` relative to the export (`a/b`), when it is absolute, has no `..`
/// and lies strictly below `--nfs-path`.
fn below_export(backend: &NfsSubdir, path: &str) -> Option<String> {
    let path = super::normalize_export(path).ok()?;
    let rest = path
        .strip_prefix(backend.export_prefix())?
        .strip_prefix('/')?;
    (!rest.is_empty()).then(|| rest.to_string())
}

/// The value of `volume`'s [`ANN_ON_DELETE`] annotation; without it (provisioned by upstream
/// before a migration) deleting `volume` needs its StorageClass.
pub fn recorded_policy(volume: &PersistentVolume) -> Option<&String> {
    volume.metadata.annotations.as_ref()?.get(ANN_ON_DELETE)
}

/// Upstream's delete policy from the class read at delete time: `onDelete` wins,
/// else `archiveOnDelete` (`false` deletes), else archive. Errors:
/// [`DeleteError::Failed`] without a class or for a non-boolean `archiveOnDelete`.
pub fn upstream_policy(
    pv_name: &str,
    class: Option<&StorageClass>,
) -> Result<OnDelete, DeleteError> {
    let Some(class) = class else {
        return Err(failed(format!(
            "PV {pv_name} has no {ANN_ON_DELETE} annotation (provisioned before a migration), so its delete policy comes from its StorageClass, which does not exist (or the PV names none); nothing touched (recreate the class, or set the PV's reclaim policy to Retain)"
        )));
    };
    parameters_policy(class.parameters.as_ref()).map_err(|v| {
        failed(format!(
            "StorageClass {:?} of PV {pv_name} has {PARAM_ARCHIVE_ON_DELETE}={v:?}, not a boolean; nothing touched",
            class.metadata.name.as_deref().unwrap_or_default()
        ))
    })
}

/// Delete, archive or retain the directory behind `volume` (module docs); a PV without
/// [`ANN_ON_DELETE`] follows [`upstream_policy`] of `class`, its class as just read.
/// Errors: [`DeleteError::Refused`] when a check fails, [`DeleteError::Failed`] on I/O.
pub fn delete(
    backend: &NfsSubdir,
    volume: &PersistentVolume,
    class: Option<&StorageClass>,
) -> Result<(), DeleteError> {
    let rel = volume_directory(backend, volume)?;
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let policy = match recorded_policy(volume) {
        // Provisioned before a migration from upstream: the class decides.
        None => upstream_policy(name, class),
        Some(v) => Ok(OnDelete::from_annotation(v).ok_or_else(|| {
            refused(format!(
                "PV {name} has annotation {ANN_ON_DELETE}={v:?}; expected delete, retain or archive"
            ))
        })?),
    };
    let (root, record) = recorded(backend, name)?;
    if let Some(r) = record.filter(|r| *r != rel) {
        return Err(refused(format!(
            "PV {name} names directory \"{rel}\" but was provisioned at \"{r}\"; refusing"
        )));
    }
    not_shared(&root, name, &rel)?;
    apply_policy(&root, name, &rel, policy).map(|_| ())
}

/// Refuses when another PV's record names `rel` too: checked with a record of `name`'s own,
/// so a retried delete never reaches a directory provisioned again for another PV.
/// Errors: [`DeleteError::Refused`], or the records cannot be read.
fn not_shared(root: &Dir, name: &str, rel: &RelPath) -> Result<(), DeleteError> {
    let others =
        registry::other_owners(root, name, rel).map_err(io_failed("read the volume records"))?;
    if others.is_empty() {
        return Ok(());
    }
    Err(refused(format!(
        "directory \"{rel}\" named by PV {name} belongs to PV {}; refusing",
        others.join(", ")
    )))
}

/// The recorded PVs whose directory any of `pvs` uses (an `nfs.path` equal to,
/// inside or around it), plus the PVs' names. Errors: unreadable mount or records.
pub async fn volumes_in_use(
    backend: &NfsSubdir,
    pvs: &[PersistentVolume],
) -> Result<HashSet<String>, VolumeError> {
    let (mut used, paths) = backend_kit::names_and_paths(pvs, |spec| {
        let rest = below_export(backend, &spec.nfs.as_ref()?.path)?;
        RelPath::parse(&rest).ok()
    });
    if paths.is_empty() {
        return Ok(used);
    }
    let mount = backend.mount.clone();
    let (_, records) = blocking("nfs-subdir listing", move || records_at(&mount)).await?;
    let overlapped =
        |(name, rel): (String, RelPath)| paths.iter().any(|p| p.overlaps(&rel)).then_some(name);
    used.extend(records.into_iter().filter_map(overlapped));
    Ok(used)
}

/// `delete_unprovisioned`: the class's policy on the directory recorded for
/// `options.pv_name` only (recorded before creation); never creates. Errors: as [`delete`].
pub fn delete_unprovisioned(
    backend: &NfsSubdir,
    options: &ProvisionOptions,
) -> Result<(), DeleteError> {
    // A class failing the checks made provision refuse before recording anything;
    // archive keeps the data if it changed since.
    let policy = class_policy(&options.storage_class).unwrap_or(OnDelete::Archive);
    let name = &options.pv_name;
    if !registry::valid_pv_name(name) {
        return Ok(());
    }
    let (root, Some(rel)) = recorded(backend, name)? else {
        return Ok(());
    };
    not_shared(&root, name, &rel)?;
    apply_policy(&root, name, &rel, Ok(policy)).map(|_| ())
}

/// PV names whose recorded directory exists (a real directory reached without
/// crossing a symlink), sorted.
/// Errors: the mount or the records cannot be read.
pub fn list_volumes(backend: &NfsSubdir) -> Result<Vec<String>, VolumeError> {
    let (root, records) = records_at(&backend.mount)?;
    Ok(records
        .into_iter()
        .filter(|(_, rel)| safe_fs::open_path(&root, rel.components()).is_ok())
        .map(|(name, _)| name)
        .collect())
}

/// A handle on the export at `mount` and every (PV name, directory) its registry records.
fn records_at(mount: &std::path::Path) -> Result<(Dir, Vec<(String, RelPath)>), VolumeError> {
    let root = safe_fs::open_root(mount).map_err(|e| unreadable(mount_error(mount, e)))?;
    let records = registry::all(&root)
        .map_err(|e| unreadable(format!("cannot read the volume records: {e}")))?;
    Ok((root, records))
}

/// Why the NFS mount at `mount` could not be opened.
pub(crate) fn mount_error(mount: &std::path::Path, e: io::Error) -> String {
    format!("cannot open the NFS mount {}: {e}", mount.display())
}

/// A handle on the mount and the directory recorded for `pv_name`.
/// Errors: the mount or the record cannot be read.
fn recorded(backend: &NfsSubdir, pv_name: &str) -> Result<(Dir, Option<RelPath>), DeleteError> {
    let mount = &backend.mount;
    let root = safe_fs::open_root(mount).map_err(|e| failed(mount_error(mount, e)))?;
    let rel = registry::get(&root, pv_name).map_err(io_failed("read the record of PV"))?;
    Ok((root, rel))
}

fn io_failed(what: &'static str) -> impl Fn(io::Error) -> DeleteError {
    move |e| failed(format!("cannot {what}: {e}"))
}

/// Apply `policy` to `rel` (an unresolved one fails only when the directory
/// exists), refusing a directory holding another volume's; returns an archive's path.
fn apply_policy(
    root: &Dir,
    pv_name: &str,
    rel: &RelPath,
    policy: Result<OnDelete, DeleteError>,
) -> Result<Option<String>, DeleteError> {
    // The size record goes with the registry record: a retained directory is no longer ours.
    let forget = || {
        backend_kit::capacity::release_logged(root, pv_name);
        registry::remove(root, pv_name)
            .map(|()| None)
            .map_err(io_failed("remove the record of PV"))
    };
    if matches!(policy, Ok(OnDelete::Retain)) {
        tracing::info!(pv = pv_name, directory = %rel, "retaining nfs-subdir directory");
        return forget();
    }
    let (parent_comps, last) = rel.split_last();
    let Some(parent) = existing_parent(root, pv_name, rel)? else {
        tracing::info!(pv = pv_name, directory = %rel, "nfs-subdir directory already absent");
        return forget();
    };
    let policy = policy?;
    let nested =
        registry::nested_with(root, pv_name, rel).map_err(io_failed("read the volume records"))?;
    if let Some((other_pv, other)) = nested.iter().find(|(_, other)| rel.contains(other)) {
        return Err(refused(format!(
            "directory \"{rel}\" of PV {pv_name} contains the directory \"{other}\" of PV {other_pv}; refusing to {} it with the other volume's data",
            if policy == OnDelete::Delete { "delete" } else { "archive" }
        )));
    }
    let shown = shown(pv_name, rel);
    let archived = if policy == OnDelete::Delete {
        volume_dir::remove(&parent, last, pv_name, &shown)?;
        tracing::info!(pv = pv_name, directory = %rel, "deleted nfs-subdir directory");
        None
    } else {
        let targets = [
            format!("{ARCHIVE_PREFIX}{last}"),
            format!("{ARCHIVE_PREFIX}{last}-{pv_name}"),
        ];
        let target = volume_dir::archive(&parent, last, &targets, &shown)?;
        tracing::info!(pv = pv_name, directory = %rel, archived_as = %target, "archived nfs-subdir directory");
        Some([parent_comps, &[target]].concat().join("/"))
    };
    forget()?;
    Ok(archived)
}

/// How errors name the directory `rel` of `pv_name`.
fn shown(pv_name: &str, rel: &RelPath) -> String {
    format!("directory \"{rel}\" of PV {pv_name}")
}

/// The parent of `rel` when `rel` is a real directory reached without crossing
/// a symlink; `None` when absent. Errors: a symlink or a file there, or I/O.
fn existing_parent(root: &Dir, pv_name: &str, rel: &RelPath) -> Result<Option<Dir>, DeleteError> {
    let (parent_comps, last) = rel.split_last();
    let parent = match safe_fs::open_path(root, parent_comps) {
        Ok(p) => p,
        Err(WalkError::Missing(_)) => return Ok(None),
        Err(WalkError::Io(p, e)) => {
            return Err(failed(format!(
                "cannot open \"{p}\" below the NFS mount: {e}"
            )))
        }
        Err(e) => return Err(refused(format!("{}: {e}", shown(pv_name, rel)))),
    };
    let existing = volume_dir::existing(&parent, last, &shown(pv_name, rel))?;
    Ok(existing.then_some(parent))
}

/// The orphan sweep's archive of the directory recorded for `pv_name`, with
/// every check, once its age is at least `min_age`. Errors: as [`delete`].
pub fn archive_orphan(
    backend: &NfsSubdir,
    pv_name: &str,
    min_age: std::time::Duration,
) -> Result<OrphanOutcome, DeleteError> {
    registry::check_pv_name(pv_name)?;
    let (root, Some(rel)) = recorded(backend, pv_name)? else {
        return Ok(OrphanOutcome::Absent);
    };
    let shown = shown(pv_name, &rel);
    if let Some(kept) = volume_dir::orphan_kept(&root, rel.components(), &shown, min_age)? {
        return Ok(kept);
    }
    let archived = apply_policy(&root, pv_name, &rel, Ok(OnDelete::Archive))?;
    let in_mount = |a| OrphanOutcome::Archived(backend.mount.join(a));
    Ok(archived.map_or(OrphanOutcome::Absent, in_mount))
}
