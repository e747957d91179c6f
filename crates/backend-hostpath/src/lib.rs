//! The `hostpath` backend (the default): each volume is a directory
//! `<base-dir>/<pv name>` on a node, published as a `hostPath` PV with node
//! affinity to that node: [`provision`] creates it, [`delete`] removes, retains
//! or archives it. Every filesystem access is relative to one cap-std handle on
//! `--base-dir` (docs/ARCHITECTURE.md, "Backends on the filesystem: cap-std").

pub mod base_dirs;
pub mod delete;
pub mod provision;

use std::path::PathBuf;

use clap::Args;
use provisioner_api::Provisioner;

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
    /// [`base_dirs::BaseDirs`].
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
        std::sync::Arc::new(base_dirs::BaseDirs(dirs))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use provisioner_api::OrphanOutcome;
    use std::time::Duration;

    /// The trait's archive capability addresses `<base-dir>/<pv name>` and
    /// honours the minimum age (reclaim-svc's orphan sweep relies on both).
    #[tokio::test]
    async fn archive_orphan_renames_an_old_orphan_and_keeps_a_young_one() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().canonicalize().unwrap();
        std::fs::create_dir(base.join("pvc-a")).unwrap();
        std::fs::write(base.join("pvc-a/f"), b"data").unwrap();
        let hp: &dyn Provisioner = &base_dirs::BaseDirs(vec![HostPath {
            base_dir: base.clone(),
            node_name: None,
            on_delete: OnDelete::Delete,
            capacity: None,
        }]);
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
