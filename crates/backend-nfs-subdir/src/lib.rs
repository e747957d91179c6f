//! The `nfs-subdir` backend, a drop-in for kubernetes-sigs/nfs-subdir-external-provisioner:
//! one sub-directory of the mounted export (`--nfs-mount`) per claim, published
//! as an `nfs` PV `{server: --nfs-server, path: <--nfs-path>/<sub-directory>}`.
//! Class parameters `pathPattern`, `onDelete`, `archiveOnDelete` and claim
//! annotations `nfs.io/createMode`/`createUID`/`createGID` are upstream's; where
//! upstream is silent this backend refuses (docs/ARCHITECTURE.md, "nfs-subdir").
//!
//! [`pattern`] names the directory, [`provision`] creates it, [`delete`] applies
//! the policy recorded on the PV ([`ANN_ON_DELETE`]), [`registry`] records the
//! directories on the export.

pub mod delete;
pub mod pattern;
pub mod provision;
pub mod registry;

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use backend_kit::{blocking, blocking_with};
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use provisioner_api::{
    DeleteError, OrphanOutcome, PoolCapacity, ProvisionError, ProvisionOptions, Provisioner,
    VolumeError,
};

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

    /// Capacity of the export (a quantity, e.g. `2Ti`): a claim whose request does not fit
    /// beside the volumes already there fails. Unset: unlimited.
    #[arg(long, env = "NFS_CAPACITY", value_parser = backend_kit::capacity::parse_quantity)]
    pub nfs_capacity: Option<u64>,
}

pub use backend_kit::OnDelete;

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
    /// Capacity of the export (bytes; `None`: unlimited).
    pub capacity: Option<u64>,
}

impl NfsSubdir {
    /// A backend from its flags.
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
            capacity: args.nfs_capacity,
        })
    }

    /// The export path without a trailing `/` (empty for the root `/`).
    pub fn export_prefix(&self) -> &str {
        self.export_path.trim_end_matches('/')
    }
}

/// Normalize an export path: absolute, `.`/empty components dropped, no `..`.
/// Errors: relative or containing `..`.
pub fn normalize_export(path: &str) -> Result<String, String> {
    if !path.starts_with('/') {
        return Err(format!("--nfs-path {path:?} must be an absolute path"));
    }
    let comps: Vec<&str> = path
        .split('/')
        .filter(|c| !matches!(*c, "" | "."))
        .collect();
    if comps.contains(&"..") {
        return Err(format!("--nfs-path {path:?} must not contain \"..\""));
    }
    Ok(format!("/{}", comps.join("/")))
}

#[async_trait]
impl Provisioner for NfsSubdir {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        blocking_with("nfs-subdir provision", self, options, provision::provision).await
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        self.delete_with_class(volume, None).await
    }

    fn reads_class_at_delete(&self, volume: &PersistentVolume) -> bool {
        delete::recorded_policy(volume).is_none()
    }

    async fn delete_with_class(
        &self,
        volume: &PersistentVolume,
        class: Option<&StorageClass>,
    ) -> Result<(), DeleteError> {
        let class = class.cloned();
        let task =
            move |backend: &Self, volume: &_| delete::delete(backend, volume, class.as_ref());
        blocking_with("nfs-subdir delete", self, volume, task).await
    }

    async fn list_volumes(&self) -> Option<Result<Vec<String>, VolumeError>> {
        let backend = self.clone();
        Some(blocking("nfs-subdir listing", move || delete::list_volumes(&backend)).await)
    }

    async fn volumes_in_use(
        &self,
        pvs: &[PersistentVolume],
    ) -> Result<HashSet<String>, VolumeError> {
        delete::volumes_in_use(self, pvs).await
    }

    async fn archive_orphan(
        &self,
        pv_name: &str,
        min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        let archive =
            move |backend: &Self, name: &str| delete::archive_orphan(backend, name, min_age);
        Some(blocking_with("nfs-subdir orphan archive", self, pv_name, archive).await)
    }

    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        let task = delete::delete_unprovisioned;
        blocking_with("nfs-subdir delete", self, options, task).await
    }

    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), VolumeError> {
        delete::volume_directory(self, pv)
            .map(|_| ())
            .map_err(VolumeError::from)
    }

    async fn capacity(&self) -> Option<Result<Vec<PoolCapacity>, VolumeError>> {
        let capacity = self.capacity?;
        let pool = format!("{}:{}", self.server, self.export_path);
        Some(backend_kit::capacity::pool(self.mount.clone(), pool, capacity).await)
    }

    /// Raises the directory's project quota limit when it has one (the mount is a local
    /// XFS/ext4 with project quotas); otherwise nothing limits the directory's size.
    async fn expand(&self, volume: &PersistentVolume, bytes: u64) -> Result<(), VolumeError> {
        let rel = delete::volume_directory(self, volume)?;
        let pv = volume.metadata.name.clone().unwrap_or_default();
        let (components, shown) = (rel.components().to_vec(), format!("directory \"{rel}\""));
        let mount = self.mount.clone();
        backend_kit::quota::expand(mount, components, pv, bytes, self.capacity, shown).await
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
            nfs_capacity: None,
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
        for p in [OnDelete::Delete, OnDelete::Retain, OnDelete::Archive] {
            assert_eq!(OnDelete::from_annotation(p.as_str()), Some(p));
        }
        assert_eq!(OnDelete::from_annotation("Delete"), None);
    }
}

#[cfg(test)]
mod backend_tests;
