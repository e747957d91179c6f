//! Finding the control-plane binaries, the way controller-runtime's envtest
//! does: a folder named by `KUBEBUILDER_ASSETS` holding `kube-apiserver`,
//! `kube-controller-manager` and `etcd`, else the default folder
//! `<cargo target dir>/realkube/bin` that `.ci/run` fills from
//! `../shared/realkube` and Debian's `etcd-server`.

use std::path::{Path, PathBuf};

use crate::harness::binaries::target_dir;

/// Environment variable naming the folder with the three binaries (envtest's convention).
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// The control-plane binaries a [`RealCluster`](super::RealCluster) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assets {
    /// The folder they were found in.
    pub dir: PathBuf,
    /// `<dir>/kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `<dir>/kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `<dir>/etcd` (often a symlink to `/usr/bin/etcd`).
    pub etcd: PathBuf,
}

/// The folder used when `KUBEBUILDER_ASSETS` is unset: `<cargo target dir>/realkube/bin`.
pub fn default_dir() -> PathBuf {
    target_dir().join("realkube").join("bin")
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

impl Assets {
    /// The binaries in `dir`, if all three are executable files there.
    ///
    /// Errors: the text names every missing (or non-executable) binary and the folder.
    pub fn in_dir(dir: &Path) -> Result<Assets, String> {
        let assets = Assets {
            dir: dir.to_path_buf(),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            etcd: dir.join("etcd"),
        };
        let missing: Vec<&str> = [
            ("kube-apiserver", &assets.kube_apiserver),
            ("kube-controller-manager", &assets.kube_controller_manager),
            ("etcd", &assets.etcd),
        ]
        .into_iter()
        .filter(|(_, p)| !is_executable(p))
        .map(|(name, _)| name)
        .collect();
        if missing.is_empty() {
            Ok(assets)
        } else {
            Err(format!(
                "no executable {} in {}",
                missing.join(", "),
                dir.display()
            ))
        }
    }

    /// Locate the binaries: the folder in `$KUBEBUILDER_ASSETS` when set (no
    /// fallback: a wrong setting is reported, not papered over), else
    /// [`default_dir`].
    ///
    /// Errors: a one-line reason naming what is missing and where it looked.
    pub fn locate() -> Result<Assets, String> {
        match std::env::var_os(ASSETS_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => Assets::in_dir(Path::new(&dir)).map_err(|e| format!("{ASSETS_ENV}: {e}")),
            None => Assets::in_dir(&default_dir()).map_err(|e| {
                format!(
                    "{ASSETS_ENV} is unset and {e} (.ci/run unpacks them there from ../shared/realkube)"
                )
            }),
        }
    }
}

/// Whether this run is CI (`CI=true`, as set by CI systems and our `.ci/run` runner).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// The binaries for a real-cluster test named `test`, or `None` when they are
/// missing: then one line `skipped <test>: no real control plane (<why>)` is
/// written to the process's stderr (not captured by the test harness, so it
/// shows in a plain `cargo test`) and the caller returns early.
///
/// Panics: in CI ([`in_ci`]) a missing binary is a failure, never a skip.
pub fn assets_or_skip(test: &str) -> Option<Assets> {
    skip_unless_ci(test, Assets::locate(), in_ci())
}

/// The decision of [`assets_or_skip`] for a given lookup result and CI flag:
/// the assets, or (outside CI) `None` after the one skip line.
///
/// Panics: `ci` is true and `located` is an error (the message names the test and why).
pub fn skip_unless_ci(test: &str, located: Result<Assets, String>, ci: bool) -> Option<Assets> {
    match located {
        Ok(assets) => Some(assets),
        Err(why) if ci => panic!("{test}: CI=true requires a real control plane, but {why}"),
        Err(why) => {
            // Straight to the stderr stream: libtest captures `eprintln!` of
            // passing tests, and a skip must be visible in a normal run.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped {test}: no real control plane ({why})"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn in_dir_names_every_missing_binary_and_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("etcd"), "#!/bin/sh\n").unwrap();
        // Not executable yet: counts as missing.
        let err = Assets::in_dir(dir.path()).unwrap_err();
        assert!(
            err.contains("kube-apiserver, kube-controller-manager, etcd"),
            "{err}"
        );
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        use std::os::unix::fs::PermissionsExt;
        for name in ["etcd", "kube-apiserver"] {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let err = Assets::in_dir(dir.path()).unwrap_err();
        assert_eq!(
            err,
            format!(
                "no executable kube-controller-manager in {}",
                dir.path().display()
            )
        );
        let p = dir.path().join("kube-controller-manager");
        std::fs::write(&p, "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        let a = Assets::in_dir(dir.path()).unwrap();
        assert_eq!(a.etcd, dir.path().join("etcd"));
        assert_eq!(skip_unless_ci("t", Ok(a.clone()), true), Some(a));
    }

    #[test]
    fn missing_assets_skip_outside_ci() {
        assert_eq!(skip_unless_ci("t", Err("gone".into()), false), None);
    }

    #[test]
    #[should_panic(expected = "t: CI=true requires a real control plane, but gone")]
    fn missing_assets_fail_in_ci() {
        skip_unless_ci("t", Err("gone".into()), true);
    }
}
