//! The `hostpath` backend (the default): each volume is a directory
//! `<base-dir>/<pv name>` on a node, published as a `hostPath` PV with node
//! affinity to that node: [`provision`] creates it, [`delete`] removes, retains
//! or archives it. Every filesystem access is relative to one cap-std handle on
//! `--base-dir` (docs/ARCHITECTURE.md, "Backends on the filesystem: cap-std").

pub mod base_dirs;
pub mod delete;
pub mod provision;

use std::path::PathBuf;
use std::time::Duration;

use async_trait::async_trait;
use backend_kit::{blocking, blocking_with};
use clap::Args;
use k8s_openapi::api::core::v1::PersistentVolume;
use provisioner_api::{
    DeleteError, OrphanOutcome, PoolCapacity, ProvisionError, ProvisionOptions, Provisioner,
    VolumeError,
};

pub use backend_kit::OnDelete;

/// Flags of the hostpath backend.
#[derive(Debug, Clone, Args)]
pub struct HostPathArgs {
    /// Directory under which volumes are created (created if missing); repeat it (or
    /// comma-separate the variable) for several, the first being the default and the
    /// StorageClass parameter `baseDir` choosing another.
    #[arg(
        long = "base-dir",
        env = "HOSTPATH_BASE_DIR",
        value_delimiter = ',',
        default_value = "/var/lib/hostpath-provisioner"
    )]
    pub base_dirs: Vec<PathBuf>,

    /// The node this service runs on: the PV's node affinity when the claim has no
    /// selected node; when set, a claim selected for another node is rescheduled and
    /// reclaim refuses a PV pinned to another node.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: Option<String>,

    /// What to do with a released volume's directory.
    #[arg(long, env = "ON_DELETE", value_enum, default_value_t = OnDelete::Delete)]
    pub on_delete: OnDelete,

    /// Capacity of each base directory (a quantity, e.g. `500Gi`): a claim whose request
    /// does not fit beside the volumes already there fails (is rescheduled, with a selected
    /// node). Unset: unlimited.
    #[arg(long, env = "HOSTPATH_CAPACITY", value_parser = backend_kit::capacity::parse_quantity)]
    pub capacity: Option<u64>,
}

/// The hostpath backend. Idempotent per PV name.
#[derive(Debug, Clone)]
pub struct HostPath {
    /// Directory under which volumes live.
    pub base_dir: PathBuf,
    /// The node this backend's base directory is on: fallback node for node
    /// affinity, and the only node provisioning and deletion act for (see
    /// [`HostPathArgs::node_name`]).
    pub node_name: Option<String>,
    /// Treatment of released volumes' directories.
    pub on_delete: OnDelete,
    /// Capacity of the base directory (bytes; `None`: unlimited).
    pub capacity: Option<u64>,
}

impl HostPath {
    /// The backend from its flags: one [`HostPath`] per `--base-dir`, routed by
    /// [`base_dirs::BaseDirs`] when there are several.
    pub fn from_args(args: &HostPathArgs) -> std::sync::Arc<dyn Provisioner> {
        let dirs: Vec<HostPath> = args
            .base_dirs
            .iter()
            .map(|base_dir| HostPath {
                base_dir: base_dir.clone(),
                node_name: args.node_name.clone(),
                on_delete: args.on_delete,
                capacity: args.capacity,
            })
            .collect();
        match <[HostPath; 1]>::try_from(dirs) {
            Ok([one]) => std::sync::Arc::new(one),
            Err(dirs) => std::sync::Arc::new(base_dirs::BaseDirs(dirs)),
        }
    }
}

#[async_trait]
impl Provisioner for HostPath {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        blocking_with("hostpath provision", self, options, provision::provision).await
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        blocking_with("hostpath delete", self, volume, delete::delete).await
    }

    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        let task = delete::delete_unprovisioned;
        blocking_with("hostpath delete", self, options, task).await
    }

    async fn list_volumes(&self) -> Option<Result<Vec<String>, VolumeError>> {
        let backend = self.clone();
        Some(blocking("hostpath listing", move || delete::list_volumes(&backend)).await)
    }

    async fn volumes_in_use(
        &self,
        pvs: &[PersistentVolume],
    ) -> Result<std::collections::HashSet<String>, VolumeError> {
        delete::volumes_in_use(self, pvs).await
    }

    async fn archive_orphan(
        &self,
        pv_name: &str,
        min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        let archive =
            move |backend: &Self, name: &String| delete::archive_orphan(backend, name, min_age);
        let name = pv_name.to_string();
        Some(blocking_with("hostpath orphan archive", self, &name, archive).await)
    }

    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), VolumeError> {
        Ok(provision::validate_volume(self, pv)?)
    }

    async fn expand(&self, volume: &PersistentVolume, bytes: u64) -> Result<(), VolumeError> {
        provision::expand(self, volume, bytes).await
    }

    async fn capacity(&self) -> Option<Result<Vec<PoolCapacity>, VolumeError>> {
        let capacity = self.capacity?;
        let pool = self.base_dir.display().to_string();
        Some(backend_kit::capacity::pool(self.base_dir.clone(), pool, capacity).await)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The trait's archive capability addresses `<base-dir>/<pv name>` and
    /// honours the minimum age (reclaim-svc's orphan sweep relies on both).
    #[tokio::test]
    async fn archive_orphan_renames_an_old_orphan_and_keeps_a_young_one() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("pvc-a")).unwrap();
        std::fs::write(base.join("pvc-a/f"), b"data").unwrap();
        let hp: &dyn Provisioner = &HostPath {
            base_dir: base.clone(),
            node_name: None,
            on_delete: OnDelete::Delete,
            capacity: None,
        };
        match hp.archive_orphan("pvc-a", Duration::from_secs(3600)).await {
            Some(Ok(OrphanOutcome::TooYoung(_))) => {}
            other => panic!("expected TooYoung, got {other:?}"),
        }
        assert!(base.join("pvc-a/f").exists());
        assert_eq!(
            hp.archive_orphan("pvc-a", Duration::ZERO).await,
            Some(Ok(OrphanOutcome::Archived(base.join("archived-pvc-a"))))
        );
        assert_eq!(
            std::fs::read(base.join("archived-pvc-a/f")).unwrap(),
            b"data"
        );
        assert_eq!(
            hp.archive_orphan("pvc-gone", Duration::ZERO).await,
            Some(Ok(OrphanOutcome::Absent))
        );
    }
}
