//! The Go provisioners users would run instead of ours, built by
//! `tools/peers/build.sh` from the Go module proxy: the benchmark measures them
//! beside the services (`bench --peer`) and the drop-in tests hand volumes
//! between them and the services. Each runs as one process against the
//! control plane, as the provisioner name it is given.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;

use super::process::ManagedProcess;

/// A peer provisioner the harness can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// The seed library (sig-storage-lib-external-provisioner v8.0.0) with a
    /// hostPath backend laid out as its examples/hostpath-provisioner.
    Seed,
}

impl Peer {
    /// The peer's binary in `<target>/peers/bin` (`tools/peers/build.sh`).
    pub fn binary_name(self) -> &'static str {
        match self {
            Peer::Seed => "seed-hostpath",
        }
    }

    /// Path of the built binary. Errors: not built (run `tools/peers/build.sh`).
    pub fn locate(self) -> anyhow::Result<PathBuf> {
        let path = crate::harness::binaries::target_dir()
            .join("peers/bin")
            .join(self.binary_name());
        anyhow::ensure!(
            path.exists(),
            "{} is not built: run `bash tools/peers/build.sh`",
            path.display()
        );
        Ok(path)
    }

    /// Start the peer with `kubeconfig` as provisioner `provisioner`, its
    /// volumes under `dir`, its log in `<dir>.log`, its client limited to
    /// `qps` requests/s (`None`: unlimited, as the services' `--kube-api-qps 0`);
    /// returns once it leads and runs its controller. Errors: no binary, exit
    /// or 60 s without that log line.
    pub async fn start(
        self,
        kubeconfig: &Path,
        provisioner: &str,
        dir: &Path,
        qps: Option<(f32, u32)>,
    ) -> anyhow::Result<ManagedProcess> {
        std::fs::create_dir_all(dir)?;
        let log = dir.with_extension("log");
        let mut args = vec![
            format!("--kubeconfig={}", kubeconfig.display()),
            format!("--provisioner={provisioner}"),
            format!("--dir={}", dir.display()),
            "--identity=bench-node".to_string(),
        ];
        let (qps, burst) = qps.unwrap_or((-1.0, 0));
        args.extend([
            format!("--kube-api-qps={qps}"),
            format!("--kube-api-burst={burst}"),
        ]);
        let mut process =
            ManagedProcess::spawn(self.binary_name(), &self.locate()?, &args, &[], &log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Started provisioner controller") {
                return Ok(process);
            }
            anyhow::ensure!(
                process.is_running(),
                "{} exited: see {}",
                self.binary_name(),
                log.display()
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not start its controller in 60 s: see {}",
                self.binary_name(),
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// The binary of `peer` for test `test`, or `None` after one stderr line when
/// it is not built. Panics under `CI=true` (`.ci/run` builds the peers).
pub fn binary_or_skip(peer: Peer, test: &str) -> Option<PathBuf> {
    match peer.locate() {
        Ok(path) => Some(path),
        Err(why) if crate::realkube::assets::in_ci() => panic!("{test}: {why:#}"),
        Err(why) => {
            eprintln!("skipping {test}: {why:#}");
            None
        }
    }
}
