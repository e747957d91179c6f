//! The `nfs-subdir` backend: a drop-in replacement for
//! kubernetes-sigs/nfs-subdir-external-provisioner. One NFS export is mounted
//! into the provision-svc and reclaim-svc pods (`--nfs-mount`, default
//! `/persistentvolumes`); each claim gets one sub-directory of it, published as
//! an `nfs` PV `{server: --nfs-server, path: <--nfs-path>/<sub-directory>}`.
//!
//! * [`pattern`] — the sub-directory's name (default
//!   `<namespace>-<claim name>-<pv name>`, or the class's `pathPattern`);
//! * [`provision`] — parameters, claim annotations, creating the directory, the PV;
//! * [`delete`] — `onDelete` / `archiveOnDelete`, and the checks that a PV is ours;
//! * [`registry`] — the record of created directories kept on the export;
//! * [`safe_fs`] — directory-handle-relative (`cap-std`) operations that never
//!   cross a symlink or leave the mount.
//!
//! # StorageClass parameters (as upstream)
//!
//! | parameter         | meaning                                                       |
//! |-------------------|---------------------------------------------------------------|
//! | `pathPattern`     | sub-directory template, see [`pattern`]                        |
//! | `onDelete`        | `delete` or `retain`; overrides `archiveOnDelete`              |
//! | `archiveOnDelete` | `"false"` deletes the directory; default (and `"true"`) archives it |
//!
//! Any other parameter, an `onDelete` other than `delete`/`retain`, or an
//! `archiveOnDelete` that is not a Go boolean (`1 t T TRUE true True 0 f F
//! FALSE false False`) is refused with a `ProvisioningFailed` event (upstream
//! ignores unknown parameters and fails only at delete time).
//!
//! # Claim annotations (as upstream)
//!
//! `nfs.io/createMode` (octal permission bits of the new directory, e.g.
//! `"0770"`, default `0777`), `nfs.io/createUID` and `nfs.io/createGID`
//! (numeric owner and group set with `fchown`). A value that does not parse is
//! a `ProvisioningFailed` event, never a silent default.
//!
//! # Two claims resolving to the same directory
//!
//! Upstream silently gives the second claim the first one's data, and deleting
//! either volume destroys both. Here a directory belongs to exactly one PV:
//! the second claim is refused (`ProvisioningFailed`, naming the directory),
//! and so is any claim whose directory already exists without having been
//! created for that PV (pre-existing data is never adopted by a dynamic
//! volume: bind it with a static PV instead). Once the first volume has been
//! deleted or archived (renamed away), the name is free for a new claim; a
//! retained directory stays, so a new claim resolving to it is refused until
//! an admin moves it away or binds it with a static PV.
//!
//! # Where the delete policy comes from
//!
//! The class's policy is resolved at provisioning time and recorded on the PV
//! as annotation [`ANN_ON_DELETE`] (`delete`, `retain` or `archive`), so
//! reclaim does not depend on the class still existing or being unchanged. A
//! PV without it (one provisioned by upstream before a migration) follows its
//! class as read right before the delete, as upstream
//! ([`delete::upstream_policy`]); when that class is gone the delete fails
//! (`VolumeFailedDelete`, retried) and nothing is touched.
//!
//! # Volumes nested in one another
//!
//! A volume's directory is never inside or around another live volume's
//! (one the registry records): such a claim is refused (`ProvisioningFailed`,
//! no directory made), and a directory containing another volume's is never
//! deleted or archived (`VolumeFailedDelete`).

pub mod delete;
pub mod pattern;
pub mod provision;
pub mod registry;


use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use provisioner_api::{DeleteError, OrphanOutcome, ProvisionError, ProvisionOptions, Provisioner};

/// PV annotation recording the delete policy resolved at provisioning time:
/// `delete`, `retain` or `archive`.
pub const ANN_ON_DELETE: &str = "nfs-subdir.split-provisioner.io/on-delete";

/// Default mount point of the export inside the pod (upstream's `mountPath`).
pub const DEFAULT_MOUNT: &str = "/persistentvolumes";

/// Flags of the nfs-subdir backend (same environment names as upstream).
#[derive(Debug, Clone, Args)]
pub struct NfsSubdirArgs {
    /// NFS server that exports the volumes (host name or IP), written into
    /// every PV's `nfs.server`. Required with `--backend nfs-subdir`.
    #[arg(long, env = "NFS_SERVER")]
    pub nfs_server: Option<String>,

    /// Exported path on the NFS server (absolute), the prefix of every PV's
    /// `nfs.path`. Required with `--backend nfs-subdir`.
    #[arg(long, env = "NFS_PATH")]
    pub nfs_path: Option<String>,

    /// Where the export is mounted in this pod; the backend never acts outside it.
    #[arg(long, env = "NFS_MOUNT", default_value = DEFAULT_MOUNT)]
    pub nfs_mount: PathBuf,
}

/// What reclaim does with a released volume's directory.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeletePolicy {
    /// Remove the directory and its contents (`onDelete: delete`, `archiveOnDelete: "false"`).
    Delete,
    /// Leave it in place (`onDelete: retain`).
    Retain,
    /// Rename it to `archived-<name>` in its parent directory (the default).
    Archive,
}

impl DeletePolicy {
    /// The value stored in [`ANN_ON_DELETE`].
    pub fn as_str(self) -> &'static str {
        match self {
            DeletePolicy::Delete => "delete",
            DeletePolicy::Retain => "retain",
            DeletePolicy::Archive => "archive",
        }
    }

    /// Parse an [`ANN_ON_DELETE`] value.
    pub fn from_annotation(value: &str) -> Option<Self> {
        match value {
            "delete" => Some(DeletePolicy::Delete),
            "retain" => Some(DeletePolicy::Retain),
            "archive" => Some(DeletePolicy::Archive),
            _ => None,
        }
    }
}

/// The nfs-subdir backend. Idempotent per PV name.
#[derive(Debug, Clone)]
pub struct NfsSubdir {
    /// `nfs.server` of our PVs.
    pub server: String,
    /// The export path on the server, normalized: absolute, no trailing `/`
    /// (except the root `/`), no `.`/`..`/empty components.
    pub export_path: String,
    /// Where the export is mounted in this process's filesystem.
    pub mount: PathBuf,
}

impl NfsSubdir {
    /// A backend from its flags.
    ///
    /// Errors: `--nfs-server` or `--nfs-path` missing or empty, or the path not
    /// absolute or containing `..`.
    pub fn from_args(args: &NfsSubdirArgs) -> Result<Self, String> {
        let server = args
            .nfs_server
            .as_deref()
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .ok_or("--nfs-server (NFS_SERVER) is required by the nfs-subdir backend")?;
        let path = args
            .nfs_path
            .as_deref()
            .filter(|s| !s.is_empty())
            .ok_or("--nfs-path (NFS_PATH) is required by the nfs-subdir backend")?;
        Ok(Self {
            server: server.to_string(),
            export_path: normalize_export(path)?,
            mount: args.nfs_mount.clone(),
        })
    }
}

/// Normalize an export path: absolute, `.`/empty components dropped, no `..`.
///
/// Errors: relative or containing `..`.
pub fn normalize_export(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("--nfs-path {path:?} must be an absolute path"));
    }
    let mut comps = Vec::new();
    for c in path.split('/') {
        match c {
            "" | "." => {}
            ".." => return Err(format!("--nfs-path {path:?} must not contain \"..\"")),
            c => comps.push(c),
        }
    }
    Ok(format!("/{}", comps.join("/")))
}

#[async_trait]
impl Provisioner for NfsSubdir {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        provision::provision(self, options).await
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        delete::delete(self, volume).await
    }

    fn reads_class_at_delete(&self, volume: &PersistentVolume) -> bool {
        delete::reads_class_at_delete(volume)
    }

    async fn delete_with_class(
        &self,
        volume: &PersistentVolume,
        class: Option<&StorageClass>,
    ) -> Result<(), DeleteError> {
        delete::delete_with_class(self, volume, class).await
    }

    async fn list_volumes(&self) -> Option<Result<Vec<String>, String>> {
        Some(delete::list_volumes(self).await)
    }

    async fn volumes_in_use(&self, pvs: &[PersistentVolume]) -> Result<HashSet<String>, String> {
        delete::volumes_in_use(self, pvs).await
    }

    async fn archive_orphan(
        &self,
        pv_name: &str,
        min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        Some(delete::archive_orphan(self, pv_name, min_age).await)
    }

    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        delete::delete_unprovisioned(self, options).await
    }

    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), String> {
        delete::volume_directory(self, pv).map(|_| ())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_and_their_checks() {
        let args = |s: Option<&str>, p: Option<&str>| NfsSubdirArgs {
            nfs_server: s.map(str::to_string),
            nfs_path: p.map(str::to_string),
            nfs_mount: PathBuf::from(DEFAULT_MOUNT),
        };
        let b = NfsSubdir::from_args(&args(Some("10.0.0.5"), Some("/exports//k8s/"))).unwrap();
        assert_eq!(b.server, "10.0.0.5");
        assert_eq!(b.export_path, "/exports/k8s");
        assert_eq!(
            NfsSubdir::from_args(&args(Some("s"), Some("/")))
                .unwrap()
                .export_path,
            "/"
        );
        assert!(NfsSubdir::from_args(&args(None, Some("/x")))
            .unwrap_err()
            .contains("--nfs-server"));
        assert!(NfsSubdir::from_args(&args(Some(" "), Some("/x")))
            .unwrap_err()
            .contains("--nfs-server"));
        assert!(NfsSubdir::from_args(&args(Some("s"), None))
            .unwrap_err()
            .contains("--nfs-path"));
        assert!(NfsSubdir::from_args(&args(Some("s"), Some("x")))
            .unwrap_err()
            .contains("absolute"));
        assert!(NfsSubdir::from_args(&args(Some("s"), Some("/a/../b")))
            .unwrap_err()
            .contains(".."));
    }

    #[test]
    fn policy_annotation_round_trips() {
        for p in [
            DeletePolicy::Delete,
            DeletePolicy::Retain,
            DeletePolicy::Archive,
        ] {
            assert_eq!(DeletePolicy::from_annotation(p.as_str()), Some(p));
        }
        assert_eq!(DeletePolicy::from_annotation("Delete"), None);
    }
}

#[cfg(test)]
mod backend_tests;
