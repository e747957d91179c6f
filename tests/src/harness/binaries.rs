//! Locating the three service binaries and `provisioner-ctl` (and building them
//! with cargo when missing or stale). Integration tests of the `e2e` package cannot use
//! `env!("CARGO_BIN_EXE_...")` for binaries of other packages, so the harness
//! runs `cargo build [--release] -p e2e -p provision-svc -p pv-writer -p reclaim-svc
//! -p provisioner-ctl --bin ...` (those four binaries) once per process, in
//! the same target directory and profile as the program that asks; cargo
//! itself decides what is stale and is a no-op (about a second) when
//! everything is fresh.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

use anyhow::Context;

/// Cargo profile the service binaries are taken from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Profile {
    /// `target/debug` (what `cargo test` builds).
    Debug,
    /// `target/release` (the demo and the benchmark).
    Release,
}

impl Profile {
    /// The profile this code was compiled with: `Release` without debug assertions.
    pub fn current() -> Self {
        if cfg!(debug_assertions) {
            Profile::Debug
        } else {
            Profile::Release
        }
    }

    fn dir_name(self) -> &'static str {
        match self {
            Profile::Debug => "debug",
            Profile::Release => "release",
        }
    }
}

/// The service binaries the system runs, as separate processes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binaries {
    /// `provision-svc`.
    pub provision: PathBuf,
    /// `pv-writer`.
    pub pv_writer: PathBuf,
    /// `reclaim-svc`.
    pub reclaim: PathBuf,
    /// `provisioner-ctl`, the operator's commands.
    pub ctl: PathBuf,
}

/// The workspace root (the directory holding the root `Cargo.toml`).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests/ lives inside the workspace")
        .to_path_buf()
}

/// The cargo target directory: `CARGO_TARGET_DIR`, else `<workspace>/target`.
pub fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .map(|p| {
            if p.is_relative() {
                workspace_root().join(p)
            } else {
                p
            }
        })
        .unwrap_or_else(|| workspace_root().join("target"))
}

static BUILT: Mutex<Vec<(Profile, Binaries)>> = Mutex::new(Vec::new());

impl Binaries {
    /// The binaries in `dir` (no existence check).
    pub fn in_dir(dir: &Path) -> Self {
        Self {
            provision: dir.join("provision-svc"),
            pv_writer: dir.join("pv-writer"),
            reclaim: dir.join("reclaim-svc"),
            ctl: dir.join("provisioner-ctl"),
        }
    }

    /// Whether the three service binaries exist.
    pub fn exist(&self) -> bool {
        [&self.provision, &self.pv_writer, &self.reclaim]
            .iter()
            .all(|p| p.is_file())
    }

    /// Binaries of `profile`, built first with cargo (once per process).
    ///
    /// The build runs in the workspace's target directory ([`target_dir`]),
    /// in `target/<profile>`, and names `e2e` among its packages although it
    /// builds only the three service binaries: cargo unifies dependency
    /// features over the selected packages, so with `e2e` selected every
    /// dependency resolves to the same features, hence the same artefacts, as
    /// in `cargo run --release -p e2e --bin demo` (without it `fastrand`, and
    /// what depends on it, would resolve differently and build twice). On a
    /// fresh clone the demo's first run therefore compiles the dependency tree
    /// once and then only the three service binaries
    /// (`cargo build --unit-graph`: 3 extra units instead of 355 with the
    /// former separate target directory). Debug binaries (tests) share
    /// `target/debug` with `cargo test` the same way.
    ///
    /// `E2E_BIN_DIR` overrides: the binaries are taken from that directory and
    /// nothing is built. If cargo is not available but the binaries exist, they
    /// are used as they are.
    ///
    /// Errors: the build fails, or the binaries are missing afterwards.
    pub fn ensure_built(profile: Profile) -> anyhow::Result<Self> {
        if let Some(dir) = std::env::var_os("E2E_BIN_DIR") {
            let b = Self::in_dir(Path::new(&dir));
            anyhow::ensure!(
                b.exist(),
                "E2E_BIN_DIR={} lacks provision-svc, pv-writer or reclaim-svc",
                Path::new(&dir).display()
            );
            return Ok(b);
        }
        let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, b)) = built.iter().find(|(p, _)| *p == profile) {
            return Ok(b.clone());
        }
        let root = build_root(profile);
        let bins = Self::in_dir(&root.join(profile.dir_name()));
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let mut cmd = Command::new(&cargo);
        // Not the variables cargo sets for the running binary (`cargo run`,
        // `cargo test`): build scripts such as ring's track CARGO_MANIFEST_DIR,
        // so inheriting it made this build see a changed environment and
        // rebuild ring and everything above it, and the caller's next cargo
        // run rebuild it all again (the demo compiled the tree twice).
        for (key, _) in std::env::vars_os() {
            if key.to_str().is_some_and(inherited_from_cargo_run) {
                cmd.env_remove(&key);
            }
        }
        cmd.current_dir(workspace_root())
            .args(["build", "--quiet"])
            .args(build_args())
            .arg("--target-dir")
            .arg(&root);
        if profile == Profile::Release {
            cmd.arg("--release");
        }
        match cmd.status() {
            Ok(status) if status.success() => {}
            Ok(status) => anyhow::bail!("building the service binaries failed: cargo {status}"),
            Err(e) if bins.exist() => {
                eprintln!("cargo not runnable ({e}); using the existing service binaries");
            }
            Err(e) => {
                return Err(e).context("running cargo to build the service binaries");
            }
        }
        anyhow::ensure!(
            bins.exist(),
            "service binaries missing under {} after the build",
            root.join(profile.dir_name()).display()
        );
        built.push((profile, bins.clone()));
        Ok(bins)
    }
}

/// Target directory the service binaries of `profile` are built in: the
/// workspace's [`target_dir`] for both profiles (see [`Binaries::ensure_built`]).
pub fn build_root(_profile: Profile) -> PathBuf {
    target_dir()
}

/// The package and target selection of the service build (after `cargo build`):
/// `e2e`, the three services and `provisioner-ctl` selected, so features unify
/// as in a build of `e2e`, and only their four binaries built.
pub fn build_args() -> [&'static str; 18] {
    [
        "-p",
        "e2e",
        "-p",
        "provision-svc",
        "-p",
        "pv-writer",
        "-p",
        "reclaim-svc",
        "-p",
        "provisioner-ctl",
        "--bin",
        "provision-svc",
        "--bin",
        "pv-writer",
        "--bin",
        "reclaim-svc",
        "--bin",
        "provisioner-ctl",
    ]
}

/// Whether `name` is an environment variable cargo sets for the binary it
/// runs (`cargo run`, `cargo test`), which a nested cargo must not inherit.
/// `CARGO` (cargo's own path) and the user's configuration (`CARGO_HOME`,
/// `CARGO_TARGET_DIR`, `CARGO_PROFILE_*`, ...) are kept.
pub fn inherited_from_cargo_run(name: &str) -> bool {
    name.starts_with("CARGO_PKG_")
        || matches!(
            name,
            "CARGO_MANIFEST_DIR"
                | "CARGO_MANIFEST_PATH"
                | "CARGO_MANIFEST_LINKS"
                | "CARGO_CRATE_NAME"
                | "CARGO_BIN_NAME"
                | "CARGO_PRIMARY_PACKAGE"
                | "CARGO_TARGET_TMPDIR"
                | "CARGO_RUSTC_CURRENT_DIR"
                | "OUT_DIR"
        )
}

#[cfg(test)]
mod tests {
    use super::inherited_from_cargo_run;

    #[test]
    fn only_the_running_binarys_cargo_variables_are_dropped() {
        for dropped in [
            "CARGO_MANIFEST_DIR",
            "CARGO_PKG_NAME",
            "CARGO_PKG_VERSION",
            "CARGO_CRATE_NAME",
            "CARGO_BIN_NAME",
            "CARGO_PRIMARY_PACKAGE",
            "OUT_DIR",
        ] {
            assert!(inherited_from_cargo_run(dropped), "{dropped}");
        }
        for kept in [
            "CARGO",
            "CARGO_HOME",
            "CARGO_TARGET_DIR",
            "CARGO_PROFILE_RELEASE_LTO",
            "CARGO_BUILD_JOBS",
            "PATH",
        ] {
            assert!(!inherited_from_cargo_run(kept), "{kept}");
        }
    }
}
