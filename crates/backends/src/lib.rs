//! The built-in storage backends behind one flag group: `--backend
//! hostpath|nfs-subdir` (env `BACKEND`) and each backend's own flags (the
//! backend crates' clap `Args`). Only the services' binaries depend on this
//! crate: each `main.rs` is one [`service_main`] call, which parses its service's command
//! line plus [`BackendArgs`], builds the chosen backend and hands it to the service
//! library, which knows only the `provisioner-api` trait.
//!
//! Adding a built-in backend: a [`BackendKind`] variant, its flags flattened
//! into [`BackendArgs`], its constructor in [`BackendArgs::build`].

use std::sync::Arc;

use backend_hostpath::{HostPath, HostPathArgs};
use backend_nfs_subdir::{NfsSubdir, NfsSubdirArgs};
use clap::{Args, CommandFactory, FromArgMatches, ValueEnum};
use common::runtime::config::{ServiceCli, ServiceSpec};
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
#[command(next_help_heading = "Backend")]
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

impl BackendArgs {
    /// Build the chosen backend from its flags.
    /// Errors: the chosen backend's flags are invalid (e.g. nfs-subdir without
    /// `--nfs-server`); the message names the flag.
    pub fn build(&self) -> Result<Arc<dyn Provisioner>, String> {
        Ok(match self.kind {
            BackendKind::Hostpath => HostPath::from_args(&self.hostpath),
            BackendKind::NfsSubdir => Arc::new(NfsSubdir::from_args(&self.nfs)?),
        })
    }
}

/// The command line of a service binary: `C` plus [`BackendArgs`] (so `--help` lists
/// both), named and described as `spec` says.
pub fn command<C: CommandFactory>(spec: ServiceSpec) -> clap::Command {
    // Flattening `BackendArgs` sets its doc comment as the description: set ours after.
    BackendArgs::augment_args(C::command())
        .name(spec.name)
        .bin_name(spec.name)
        .about(spec.about)
        .long_about(None::<&str>)
}

/// Parse `args` (program name first) as [`command`]`::<C>(spec)`.
/// Errors: clap's usage error, formatted for the whole command.
pub fn try_parse_from<C, I, T>(spec: ServiceSpec, args: I) -> Result<(C, BackendArgs), clap::Error>
where
    C: CommandFactory + FromArgMatches,
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let matches = command::<C>(spec).try_get_matches_from(args)?;
    let format = |e: clap::Error| e.format(&mut command::<C>(spec));
    Ok((
        C::from_arg_matches(&matches).map_err(format)?,
        BackendArgs::from_arg_matches(&matches).map_err(format)?,
    ))
}

/// A service binary's whole `main`: `spec`'s command line (exits on a usage error, `--help`,
/// `--version`), tracing, the chosen backend, then `run` until SIGTERM. Errors: invalid
/// backend flags (naming the flag), else `run`'s.
pub fn service_main<S, Fut>(
    spec: ServiceSpec,
    run: fn(ServiceCli<S>, Arc<dyn Provisioner>) -> Fut,
) -> anyhow::Result<()>
where
    S: Args + FromArgMatches,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    common::runtime::alloc::block_on_service(async {
        let parsed = try_parse_from::<ServiceCli<S>, _, _>(spec, std::env::args_os());
        let (cli, backend) = parsed.unwrap_or_else(|e| e.exit());
        common::runtime::telemetry::init(cli.common.log_format, &cli.common.log_level);
        let backend = backend.build().map_err(anyhow::Error::msg)?;
        run(cli, backend).await
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use backend_hostpath::OnDelete;
    use clap::Parser;
    use std::path::PathBuf;

    const SPEC: ServiceSpec = ServiceSpec::new("svc", "svc", 0);

    /// A service command line without backend flags, as the service libraries have.
    #[derive(Debug, Parser)]
    #[command(name = "svc")]
    struct Cli {
        #[arg(long, default_value_t = 1)]
        workers: u32,
    }

    #[test]
    fn hostpath_is_the_default_and_nfs_subdir_needs_its_flags() {
        let (cli, backend) = try_parse_from::<Cli, _, _>(SPEC, ["svc"]).unwrap();
        assert_eq!(cli.workers, 1);
        assert_eq!(backend.kind, BackendKind::Hostpath);
        assert_eq!(
            backend.hostpath.base_dirs,
            [PathBuf::from("/var/lib/hostpath-provisioner")]
        );
        let pv = k8s_pv("pvc-1", "/var/lib/hostpath-provisioner/pvc-1");
        backend.build().unwrap().validate_volume(&pv).unwrap();

        let (_, backend) =
            try_parse_from::<Cli, _, _>(SPEC, ["svc", "--backend", "nfs-subdir"]).unwrap();
        assert!(backend
            .build()
            .err()
            .unwrap()
            .contains("--nfs-server (NFS_SERVER) is required"));

        let (_, backend) = try_parse_from::<Cli, _, _>(
            SPEC,
            [
                "svc",
                "--backend=nfs-subdir",
                "--nfs-server=nfs.example",
                "--nfs-path=/srv/k8s",
                "--nfs-mount=/mnt/export",
            ],
        )
        .unwrap();
        assert_eq!(backend.kind, BackendKind::NfsSubdir);
        assert_eq!(backend.nfs.nfs_server.as_deref(), Some("nfs.example"));
        assert_eq!(backend.nfs.nfs_mount, PathBuf::from("/mnt/export"));
        // The built backend is nfs-subdir: a hostPath PV is not one it produced.
        let err = backend
            .build()
            .unwrap()
            .validate_volume(&pv)
            .unwrap_err()
            .to_string();
        assert!(err.contains("nfs"), "{err}");
        assert!(try_parse_from::<Cli, _, _>(SPEC, ["svc", "--backend", "nfs"]).is_err());
    }

    #[test]
    fn backend_flags_sit_beside_the_service_flags() {
        let (cli, backend) = try_parse_from::<Cli, _, _>(
            SPEC,
            [
                "svc",
                "--workers=3",
                "--base-dir",
                "/data",
                "--node-name=n1",
                "--on-delete",
                "archive",
            ],
        )
        .unwrap();
        assert_eq!(cli.workers, 3);
        assert_eq!(backend.hostpath.base_dirs, [PathBuf::from("/data")]);
        assert_eq!(backend.hostpath.node_name.as_deref(), Some("n1"));
        assert_eq!(backend.hostpath.on_delete, OnDelete::Archive);
        let help = command::<Cli>(SPEC).render_long_help().to_string();
        for flag in [
            "--workers",
            "--backend",
            "--base-dir",
            "--on-delete",
            "--nfs-server",
        ] {
            assert!(help.contains(flag), "{flag} missing from --help:\n{help}");
        }
        let err = try_parse_from::<Cli, _, _>(SPEC, ["svc", "--on-delete", "shred"]).unwrap_err();
        assert_eq!(err.kind(), clap::error::ErrorKind::InvalidValue);
    }

    fn k8s_pv(name: &str, path: &str) -> k8s_openapi::api::core::v1::PersistentVolume {
        serde_json::from_value(serde_json::json!({
            "metadata": {"name": name},
            "spec": {"hostPath": {"path": path, "type": "DirectoryOrCreate"}}
        }))
        .unwrap()
    }
}
