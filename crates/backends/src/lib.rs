//! `--backend hostpath|nfs-subdir` (env `BACKEND`): one flag group that every
//! service flattens into its command line, and one constructor, so the
//! services share the choice instead of each wiring backends by hand.

use std::sync::Arc;

use clap::{Args, ValueEnum};

use backend_hostpath::{HostPath, HostPathArgs};
use backend_nfs_subdir::{NfsSubdir, NfsSubdirArgs};
use provisioner_api::Provisioner;

/// Which built-in backend a service runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum BackendKind {
    /// A directory per volume on one node (`hostPath` PVs).
    Hostpath,
    /// A sub-directory per volume of a mounted NFS export (`nfs` PVs).
    NfsSubdir,
}

/// The backend flags of a service: the choice and every backend's own flags
/// (only the chosen backend's are used and checked).
#[derive(Debug, Clone, Args)]
pub struct BackendArgs {
    /// Storage backend.
    #[arg(long = "backend", env = "BACKEND", value_enum, default_value_t = BackendKind::Hostpath)]
    pub kind: BackendKind,
    /// hostpath backend flags.
    #[command(flatten)]
    pub hostpath: HostPathArgs,
    /// nfs-subdir backend flags.
    #[command(flatten)]
    pub nfs: NfsSubdirArgs,
}

/// A constructed backend, keeping its concrete type for backend-specific
/// extras (such as hostpath's orphan archiving in reclaim-svc).
#[derive(Debug, Clone)]
pub enum Backend {
    /// The hostpath backend.
    HostPath(Arc<HostPath>),
    /// The nfs-subdir backend.
    NfsSubdir(Arc<NfsSubdir>),
}

impl Backend {
    /// The backend behind the common contract.
    pub fn provisioner(&self) -> Arc<dyn Provisioner> {
        match self {
            Backend::HostPath(b) => b.clone(),
            Backend::NfsSubdir(b) => b.clone(),
        }
    }
}

impl BackendArgs {
    /// Build the chosen backend from its flags.
    ///
    /// Errors: the chosen backend's flags are invalid (e.g. nfs-subdir without
    /// `--nfs-server`); the message names the flag.
    pub fn build(&self) -> Result<Backend, String> {
        match self.kind {
            BackendKind::Hostpath => Ok(Backend::HostPath(Arc::new(HostPath::from_args(
                &self.hostpath,
            )))),
            BackendKind::NfsSubdir => Ok(Backend::NfsSubdir(Arc::new(NfsSubdir::from_args(
                &self.nfs,
            )?))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        backend: BackendArgs,
    }

    #[test]
    fn hostpath_is_the_default_and_nfs_subdir_needs_its_flags() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.backend.kind, BackendKind::Hostpath);
        assert!(matches!(cli.backend.build().unwrap(), Backend::HostPath(_)));

        let cli = Cli::try_parse_from(["x", "--backend", "nfs-subdir"]).unwrap();
        assert!(cli
            .backend
            .build()
            .unwrap_err()
            .contains("--nfs-server (NFS_SERVER) is required"));

        let cli = Cli::try_parse_from([
            "x",
            "--backend=nfs-subdir",
            "--nfs-server=nfs.example",
            "--nfs-path=/srv/k8s",
            "--nfs-mount=/mnt/export",
        ])
        .unwrap();
        match cli.backend.build().unwrap() {
            Backend::NfsSubdir(b) => {
                assert_eq!(b.server, "nfs.example");
                assert_eq!(b.export_path, "/srv/k8s");
                assert_eq!(b.mount, std::path::PathBuf::from("/mnt/export"));
            }
            other => panic!("expected nfs-subdir, got {other:?}"),
        }
        assert!(Cli::try_parse_from(["x", "--backend", "nfs"]).is_err());
    }
}
