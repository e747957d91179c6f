//! Finding the control-plane binaries of each tested Kubernetes version, the
//! way controller-runtime's envtest does (a folder holding `kube-apiserver`,
//! `kube-controller-manager` and `etcd`): the folder named by the version's
//! environment variable ([`KubeVersion::env_var`]), else its default folder
//! `<cargo target dir>/realkube/<version>/bin`, which `.ci/realkube-assets`
//! (v1.19.2) and `tools/realkube/build.sh` (v1.37.2) fill.

use std::path::{Path, PathBuf};

use crate::harness::binaries::target_dir;

/// envtest's variable; still accepted as the v1.19.2 folder when
/// `REALKUBE_V1_19` is unset.
pub const ASSETS_ENV: &str = "KUBEBUILDER_ASSETS";

/// A Kubernetes release the real-plane tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum KubeVersion {
    /// v1.19.2 (2020): binaries from `../shared/realkube`, Debian's etcd 3.4, no scheduler.
    V1_19,
    /// v1.37.2: built from the Go module proxy by `tools/realkube/build.sh`, etcd 3.7, with kube-scheduler.
    V1_37,
}

impl KubeVersion {
    /// Every tested version, oldest first.
    pub const ALL: [KubeVersion; 2] = [KubeVersion::V1_19, KubeVersion::V1_37];

    /// The release, e.g. `"v1.37.2"` (also the folder name under `target/realkube/`).
    pub fn release(self) -> &'static str {
        match self {
            KubeVersion::V1_19 => "v1.19.2",
            KubeVersion::V1_37 => "v1.37.2",
        }
    }

    /// The minor version (19, 37).
    pub fn minor(self) -> u32 {
        match self {
            KubeVersion::V1_19 => 19,
            KubeVersion::V1_37 => 37,
        }
    }

    /// The variable that names this version's folder (`REALKUBE_V1_19`, `REALKUBE_V1_37`).
    pub fn env_var(self) -> &'static str {
        match self {
            KubeVersion::V1_19 => "REALKUBE_V1_19",
            KubeVersion::V1_37 => "REALKUBE_V1_37",
        }
    }

    /// The command that provides this version's binaries (for skip messages).
    pub fn provided_by(self) -> &'static str {
        match self {
            KubeVersion::V1_19 => "bash .ci/realkube-assets (from ../shared/realkube)",
            KubeVersion::V1_37 => "bash tools/realkube/build.sh (Go from the Go module proxy)",
        }
    }

    /// This version's default folder: `<cargo target dir>/realkube/<release>/bin`.
    pub fn default_dir(self) -> PathBuf {
        target_dir()
            .join("realkube")
            .join(self.release())
            .join("bin")
    }
}

impl std::fmt::Display for KubeVersion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.release())
    }
}

impl std::str::FromStr for KubeVersion {
    type Err = String;

    /// `1.19`, `v1.19` or `v1.19.2` (likewise 1.37).
    ///
    /// Errors: any other text, naming the versions there are.
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.strip_prefix('v').unwrap_or(s);
        KubeVersion::ALL
            .into_iter()
            .find(|v| {
                let release = &v.release()[1..];
                s == release || s == format!("1.{}", v.minor())
            })
            .ok_or_else(|| {
                format!("unknown Kubernetes version {s:?}: the tested ones are 1.19 (v1.19.2) and 1.37 (v1.37.2)")
            })
    }
}

/// The control-plane binaries a [`RealCluster`](super::RealCluster) runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assets {
    /// The Kubernetes release they are (decides the flags the harness passes).
    pub version: KubeVersion,
    /// The folder they were found in.
    pub dir: PathBuf,
    /// `<dir>/kube-apiserver`.
    pub kube_apiserver: PathBuf,
    /// `<dir>/kube-controller-manager`.
    pub kube_controller_manager: PathBuf,
    /// `<dir>/kube-scheduler`, when there is one (required from v1.37 on; v1.19 runs without).
    pub kube_scheduler: Option<PathBuf>,
    /// `<dir>/etcd` (often a symlink).
    pub etcd: PathBuf,
}

fn is_executable(path: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(path)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

impl Assets {
    /// The binaries of `version` in `dir`, if all are executable files there
    /// (`kube-scheduler` is required from v1.37 on, optional for v1.19).
    ///
    /// Errors: the text names every missing (or non-executable) binary and the folder.
    pub fn in_dir(version: KubeVersion, dir: &Path) -> Result<Assets, String> {
        let scheduler = dir.join("kube-scheduler");
        let assets = Assets {
            version,
            dir: dir.to_path_buf(),
            kube_apiserver: dir.join("kube-apiserver"),
            kube_controller_manager: dir.join("kube-controller-manager"),
            kube_scheduler: is_executable(&scheduler).then_some(scheduler.clone()),
            etcd: dir.join("etcd"),
        };
        let mut required = vec![
            ("kube-apiserver", &assets.kube_apiserver),
            ("kube-controller-manager", &assets.kube_controller_manager),
        ];
        if version >= KubeVersion::V1_37 {
            required.push(("kube-scheduler", &scheduler));
        }
        required.push(("etcd", &assets.etcd));
        let missing: Vec<&str> = required
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

    /// Locate `version`'s binaries: the folder in its [`KubeVersion::env_var`]
    /// (for v1.19 also `$KUBEBUILDER_ASSETS`) when set (no fallback: a wrong
    /// setting is reported, not papered over), else [`KubeVersion::default_dir`].
    ///
    /// Errors: a one-line reason naming what is missing, where it looked and
    /// the command that provides the binaries.
    pub fn locate(version: KubeVersion) -> Result<Assets, String> {
        let set = |var: &str| std::env::var_os(var).filter(|v| !v.is_empty());
        let from_env = set(version.env_var())
            .map(|d| (version.env_var(), d))
            .or_else(|| {
                (version == KubeVersion::V1_19).then(|| set(ASSETS_ENV).map(|d| (ASSETS_ENV, d)))?
            });
        match from_env {
            Some((var, dir)) => {
                Assets::in_dir(version, Path::new(&dir)).map_err(|e| format!("{var}: {e}"))
            }
            None => Assets::in_dir(version, &version.default_dir())
                .map_err(|e| format!("{e}; run {}", version.provided_by())),
        }
    }
}

/// Whether this run is CI (`CI=true`, as set by CI systems and our `.ci/run` runner).
pub fn in_ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// `version`'s binaries for a real-cluster test named `test`, or `None` when
/// they are missing: then one line `skipped <test> on <release>: no real
/// control plane (<why>)` is written to stderr and the caller returns early.
/// Either way the outcome is recorded for the run's summary ([`super::summary`]).
///
/// Panics: in CI ([`in_ci`]) a missing binary is a failure, never a skip.
pub fn assets_or_skip(version: KubeVersion, test: &str) -> Option<Assets> {
    let located = skip_unless_ci(test, version, Assets::locate(version), in_ci());
    super::summary::record(
        test,
        version,
        match &located {
            Ok(_) => None,
            Err(why) => Some(why.as_str()),
        },
    );
    located.ok()
}

/// The decision of [`assets_or_skip`] for a given lookup result and CI flag:
/// the assets, or (outside CI) the reason after the one skip line.
///
/// Panics: `ci` is true and `located` is an error (the message names the test, version and why).
pub fn skip_unless_ci(
    test: &str,
    version: KubeVersion,
    located: Result<Assets, String>,
    ci: bool,
) -> Result<Assets, String> {
    match located {
        Ok(assets) => Ok(assets),
        Err(why) if ci => {
            panic!("{test}: CI=true requires the {version} control plane, but {why}")
        }
        Err(why) => {
            // Straight to the stderr stream: libtest captures `eprintln!` of
            // passing tests, and a skip must be visible in a normal run.
            use std::io::Write;
            let _ = writeln!(
                std::io::stderr().lock(),
                "skipped {test} on {version}: no real control plane ({why})"
            );
            Err(why)
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
        let err = Assets::in_dir(KubeVersion::V1_19, dir.path()).unwrap_err();
        assert!(
            err.contains("kube-apiserver, kube-controller-manager, etcd"),
            "{err}"
        );
        let err = Assets::in_dir(KubeVersion::V1_37, dir.path()).unwrap_err();
        assert!(
            err.contains("kube-apiserver, kube-controller-manager, kube-scheduler, etcd"),
            "{err}"
        );
        assert!(err.contains(&dir.path().display().to_string()), "{err}");
        use std::os::unix::fs::PermissionsExt;
        for name in ["etcd", "kube-apiserver"] {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
        }
        let err = Assets::in_dir(KubeVersion::V1_19, dir.path()).unwrap_err();
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
        let a = Assets::in_dir(KubeVersion::V1_19, dir.path()).unwrap();
        assert_eq!(a.etcd, dir.path().join("etcd"));
        assert_eq!(a.kube_scheduler, None);
        assert_eq!(
            skip_unless_ci("t", KubeVersion::V1_19, Ok(a.clone()), true),
            Ok(a)
        );
        // v1.37 needs the scheduler too.
        let err = Assets::in_dir(KubeVersion::V1_37, dir.path()).unwrap_err();
        assert_eq!(
            err,
            format!("no executable kube-scheduler in {}", dir.path().display())
        );
    }

    #[test]
    fn versions_parse_from_minor_or_release() {
        for (text, v) in [
            ("1.19", KubeVersion::V1_19),
            ("v1.19.2", KubeVersion::V1_19),
            ("1.37", KubeVersion::V1_37),
            ("v1.37", KubeVersion::V1_37),
        ] {
            assert_eq!(text.parse::<KubeVersion>(), Ok(v), "{text}");
        }
        assert!("1.20"
            .parse::<KubeVersion>()
            .unwrap_err()
            .contains("1.19 (v1.19.2)"));
    }

    #[test]
    fn missing_assets_skip_outside_ci() {
        assert_eq!(
            skip_unless_ci("t", KubeVersion::V1_37, Err("gone".into()), false),
            Err("gone".to_string())
        );
    }

    #[test]
    #[should_panic(expected = "t: CI=true requires the v1.37.2 control plane, but gone")]
    fn missing_assets_fail_in_ci() {
        let _ = skip_unless_ci("t", KubeVersion::V1_37, Err("gone".into()), true);
    }
}
