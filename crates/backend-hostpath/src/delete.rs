//! Deletion half of the hostpath backend: removal, retention or archival of
//! `<base-dir>/<pv name>`, and the listing of reclaim-svc's orphan sweep.
//!
//! A directory is touched only when every rule holds, else
//! [`DeleteError::Refused`] names the failed one (docs/ARCHITECTURE.md,
//! "Backends' path safety"): 0. a `--node-name` matches the PV's hostname
//! affinity; 1. the PV name is one path component; 2. `spec.hostPath.path` is
//! `<base-dir>/<name>` (as configured or resolved); 3. the entry is no symlink;
//! 4. it is a directory. Every check and action is relative to one cap-std
//! handle on `--base-dir`. An absent directory counts as deleted; a missing
//! base directory is a [`DeleteError::Failed`].

use std::collections::{BTreeSet, HashSet};
use std::io;
use std::path::{Component, Path, PathBuf};

use backend_kit::capacity::release_logged;
use backend_kit::safe_fs;
use backend_kit::volume_dir;
use backend_kit::{blocking, failed, refused, ARCHIVE_PREFIX};
use cap_std::fs::Dir;
use k8s_openapi::api::core::v1::PersistentVolume;
use provisioner_api::{DeleteError, OrphanOutcome, ProvisionOptions, VolumeError};

use super::{HostPath, OnDelete};

/// Name prefix of volume directories, as provisioned (`pvc-<claim uid>`).
pub const VOLUME_PREFIX: &str = "pvc-";

/// Remove (`delete`), rename to `archived-<name>` (`archive`) or leave
/// (`retain`) the directory behind `volume`, per `--on-delete`.
/// Errors: [`DeleteError::Refused`] when a rule fails; [`DeleteError::Failed`] on I/O errors.
pub fn delete(backend: &HostPath, volume: &PersistentVolume) -> Result<(), DeleteError> {
    let name = checked_name(&backend.base_dir, volume)?;
    check_node(backend.node_name.as_deref(), name, volume)?;
    delete_dir(backend, name)
}

/// `--on-delete` applied to `<base-dir>/<name>` (a name checked by the caller), rules 3–4.
fn delete_dir(backend: &HostPath, name: &str) -> Result<(), DeleteError> {
    let dir = backend.base_dir.join(name);
    if backend.on_delete == OnDelete::Retain {
        tracing::info!(pv = name, path = %dir.display(), "retaining hostpath volume directory");
        return Ok(());
    }
    let root = open_base(&backend.base_dir)?;
    if !volume_dir::existing(&root, name, &shown(&dir))? {
        tracing::info!(pv = name, path = %dir.display(), "hostpath volume directory already absent");
        release_logged(&root, name);
        return Ok(());
    }
    act(&root, &dir, name, backend.on_delete == OnDelete::Archive)
}

/// `--on-delete` applied to `<base-dir>/<options.pv_name>` with the checks of [`delete`];
/// never creates. Errors: [`DeleteError::Refused`] when the claim's selected node is not
/// `--node-name`, else as [`delete`].
pub fn delete_unprovisioned(
    backend: &HostPath,
    options: &ProvisionOptions,
) -> Result<(), DeleteError> {
    let selected = options.selected_node.as_ref();
    let selected = selected.and_then(|n| n.metadata.name.as_deref());
    let own = backend.node_name.as_deref();
    if let Some((selected, own)) = selected.zip(own).filter(|(s, o)| s != o) {
        return Err(refused(format!(
            "volume {} was provisioned for node {selected:?} but this service runs on node {own:?} (--node-name); its directory can only be removed on that node",
            options.pv_name
        )));
    }
    delete_dir(backend, backend_kit::single_component(&options.pv_name)?)
}

/// The volume directories `pvs` use (a `hostPath`/`local` path at, below or
/// above them, as written and resolved), plus the PVs' names. Errors: listing failed.
pub async fn volumes_in_use(
    backend: &HostPath,
    pvs: &[PersistentVolume],
) -> Result<HashSet<String>, VolumeError> {
    let (mut used, paths) = backend_kit::names_and_paths(pvs, |spec| {
        let local = spec.local.as_ref().map(|l| l.path.clone());
        let host = spec.host_path.as_ref().map(|h| h.path.clone());
        host.into_iter().chain(local)
    });
    if paths.is_empty() {
        return Ok(used);
    }
    let backend = backend.clone();
    used.extend(blocking("hostpath listing", move || names_under(&backend, &paths)).await?);
    Ok(used)
}

/// The base directory's entries that `paths` lie in (all of them for a path at or above it).
fn names_under(backend: &HostPath, paths: &[String]) -> Result<Vec<String>, VolumeError> {
    let resolved = |p: &Path| {
        [lexical(p)]
            .into_iter()
            .chain(std::fs::canonicalize(p).ok())
    };
    let bases: Vec<PathBuf> = resolved(&backend.base_dir).collect();
    let (mut names, mut all) = (Vec::new(), false);
    for form in paths.iter().flat_map(|p| resolved(Path::new(p))) {
        for b in &bases {
            match form.strip_prefix(b) {
                Ok(rest) => match rest.components().next() {
                    Some(Component::Normal(n)) => names.push(n.to_string_lossy().into_owned()),
                    _ => all = true,
                },
                Err(_) => all |= b.starts_with(&form),
            }
        }
    }
    if all {
        names.extend(list_volumes(backend)?);
    }
    Ok(names)
}

/// `path` with `.` and empty components dropped and `..` applied, without touching the filesystem.
fn lexical(path: &Path) -> PathBuf {
    path.components().fold(PathBuf::new(), |mut out, c| {
        match c {
            Component::CurDir => {}
            Component::ParentDir => _ = out.pop(),
            c => out.push(c),
        }
        out
    })
}

/// The orphan sweep's archive: `<base-dir>/<pv_name>` renamed `archived-<pv_name>`
/// (rules 1, 3, 4) once its age is at least `min_age`. Errors: as [`delete`].
pub fn archive_orphan(
    backend: &HostPath,
    pv_name: &str,
    min_age: std::time::Duration,
) -> Result<OrphanOutcome, DeleteError> {
    let base = &backend.base_dir;
    let name = backend_kit::single_component(pv_name)?;
    let root = open_base(base)?;
    let dir = base.join(name);
    // A symlink or a file there is refused by the walk.
    if let Some(kept) = volume_dir::orphan_kept(&root, &[name.into()], &shown(&dir), min_age)? {
        return Ok(kept);
    }
    act(&root, &dir, name, true)?;
    let real_base = std::fs::canonicalize(base).unwrap_or_else(|_| base.to_path_buf());
    Ok(OrphanOutcome::Archived(
        real_base.join(format!("{ARCHIVE_PREFIX}{name}")),
    ))
}

/// Names of the real directories (not symlinks) starting with `pvc-` in the base directory, sorted.
/// Errors: the base directory cannot be opened or read.
pub fn list_volumes(backend: &HostPath) -> Result<Vec<String>, VolumeError> {
    let base = &backend.base_dir;
    let base_shown = base.display();
    let shown = |e: io::Error| {
        VolumeError::Unreadable(format!("cannot list base directory {base_shown}: {e}"))
    };
    let root = safe_fs::open_root(base).map_err(shown)?;
    let mut names = Vec::new();
    for entry in root.entries().map_err(shown)? {
        let entry = entry.map_err(shown)?;
        // cap-std's DirEntry::file_type does not follow symlinks.
        let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
        let name = entry.file_name().into_string().ok();
        names.extend(name.filter(|n| is_dir && n.starts_with(VOLUME_PREFIX)));
    }
    names.sort();
    Ok(names)
}

/// Rule 0: with a `--node-name`, a PV pinned (required `kubernetes.io/hostname In` node
/// affinity) to other node(s) only is refused.
pub(crate) fn check_node(
    node_name: Option<&str>,
    name: &str,
    volume: &PersistentVolume,
) -> Result<(), DeleteError> {
    let Some(own) = node_name else {
        return Ok(());
    };
    let nodes: BTreeSet<&String> = volume
        .spec
        .as_ref()
        .and_then(|s| s.node_affinity.as_ref())
        .and_then(|a| a.required.as_ref())
        .into_iter()
        .flat_map(|r| r.node_selector_terms.iter())
        .flat_map(|t| t.match_expressions.iter().flatten())
        .filter(|e| e.key == super::provision::HOSTNAME_LABEL && e.operator == "In")
        .flat_map(|e| e.values.iter().flatten())
        .collect();
    if nodes.is_empty() || nodes.iter().any(|n| n.as_str() == own) {
        return Ok(());
    }
    Err(refused(format!(
        "PV {name} is pinned to node {} but this reclaimer runs on node {own:?} (--node-name); its directory can only be removed on that node",
        nodes.iter().map(|n| format!("{n:?}")).collect::<Vec<_>>().join(", ")
    )))
}

/// Rules 1 and 2 against the configured base directory `base`; returns the PV name.
pub(crate) fn checked_name<'a>(
    base: &Path,
    volume: &'a PersistentVolume,
) -> Result<&'a str, DeleteError> {
    let name = volume.metadata.name.as_deref().unwrap_or_default();
    let name = backend_kit::single_component(name)?;
    let spec = volume.spec.as_ref();
    let path = spec.and_then(|s| s.host_path.as_ref()).ok_or_else(|| {
        refused(format!(
            "PV {name} has no spec.hostPath; it is not a hostpath volume"
        ))
    })?;
    let path = PathBuf::from(&path.path);
    let expected = base.join(name);
    let resolved_expected = std::fs::canonicalize(base).ok().map(|b| b.join(name));
    if path != expected && Some(&path) != resolved_expected.as_ref() {
        return Err(refused(format!(
            "PV {name} has spec.hostPath.path {} but its directory must be {} (<--base-dir>/<PV name>); refusing to touch it",
            path.display(),
            expected.display()
        )));
    }
    Ok(name)
}

fn open_base(base: &Path) -> Result<Dir, DeleteError> {
    let shown = base.display();
    safe_fs::open_root(base).map_err(|e| failed(format!("cannot open base directory {shown}: {e}")))
}

/// How errors name the volume directory `dir`.
fn shown(dir: &Path) -> String {
    format!("volume path {}", dir.display())
}

/// Archive (`archive`) or remove the directory `name` of `root` at `dir` (checked by the
/// caller), forgetting its size record.
fn act(root: &Dir, dir: &Path, name: &str, archive: bool) -> Result<(), DeleteError> {
    if archive {
        let targets = [format!("{ARCHIVE_PREFIX}{name}")];
        let target = volume_dir::archive(root, name, &targets, &shown(dir))?;
        let archive = dir.with_file_name(target);
        tracing::info!(pv = name, path = %dir.display(), archive = %archive.display(), "archived hostpath volume directory");
    } else {
        volume_dir::remove(root, name, name, &shown(dir))?;
        tracing::info!(pv = name, path = %dir.display(), "deleted hostpath volume directory");
    }
    release_logged(root, name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{HostPathVolumeSource, PersistentVolumeSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use std::os::unix::fs::symlink;
    use std::time::Duration;

    fn pinned(mut pv: PersistentVolume, node: &str) -> PersistentVolume {
        pv.spec.as_mut().unwrap().node_affinity = Some(crate::provision::node_affinity(node));
        pv
    }

    #[tokio::test]
    async fn a_pv_pinned_to_another_node_is_refused_with_node_name() {
        let (_tmp, base) = setup();
        let mut b = backend(&base, OnDelete::Delete);
        b.node_name = Some("node-1".into());
        // Directory absent here: still refused, not "already deleted".
        let reason = is_refused(delete(&b, &pinned(pv_at(&base, "pvc-9"), "node-2")));
        assert_eq!(
            reason,
            "PV pvc-9 is pinned to node \"node-2\" but this reclaimer runs on node \"node-1\" (--node-name); its directory can only be removed on that node"
        );
        // Directory present here (same name on a shared base): left in place.
        is_refused(delete(&b, &pinned(pv_at(&base, "pvc-1"), "node-2")));
        assert!(base.join("pvc-1/data/file").exists());
        // Pinned to this node: removed.
        delete(&b, &pinned(pv_at(&base, "pvc-1"), "node-1")).unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn without_node_name_the_affinity_is_not_checked() {
        let (_tmp, base) = setup();
        delete(
            &backend(&base, OnDelete::Delete),
            &pinned(pv_at(&base, "pvc-1"), "node-2"),
        )
        .unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    fn backend(base: &Path, on_delete: OnDelete) -> HostPath {
        HostPath {
            base_dir: base.to_path_buf(),
            node_name: None,
            on_delete,
            capacity: None,
        }
    }

    fn pv(name: &str, path: &str) -> PersistentVolume {
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                host_path: Some(HostPathVolumeSource {
                    path: path.into(),
                    type_: Some("DirectoryOrCreate".into()),
                }),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn pv_at(base: &Path, name: &str) -> PersistentVolume {
        pv(name, &base.join(name).to_string_lossy())
    }

    /// A base dir with `pvc-1/data/file` in it.
    fn setup() -> (tempfile::TempDir, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("base");
        std::fs::create_dir_all(base.join("pvc-1/data")).unwrap();
        std::fs::write(base.join("pvc-1/data/file"), b"x").unwrap();
        (tmp, base)
    }

    /// [`delete`] of `<base>/<name>` by a backend that deletes.
    fn delete_at(base: &Path, name: &str) -> Result<(), DeleteError> {
        delete(&backend(base, OnDelete::Delete), &pv_at(base, name))
    }

    /// `dir`, created with a file `keep` in it that a test checks survives ([`assert_kept`]).
    fn with_keep(dir: PathBuf) -> PathBuf {
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("keep"), b"keep").unwrap();
        dir
    }

    /// `<tmp>/outside` ([`with_keep`]), linked to from `link`.
    fn linked_outside(tmp: &Path, link: PathBuf) -> PathBuf {
        let outside = with_keep(tmp.join("outside"));
        symlink(&outside, link).unwrap();
        outside
    }

    fn assert_kept(dir: &Path) {
        assert_eq!(std::fs::read(dir.join("keep")).unwrap(), b"keep");
    }

    fn assert_refused<T: std::fmt::Debug>(r: Result<T, DeleteError>, expected: &str) {
        let reason = is_refused(r);
        assert!(reason.contains(expected), "{reason}");
    }

    fn is_refused<T: std::fmt::Debug>(r: Result<T, DeleteError>) -> String {
        match r {
            Err(DeleteError::Refused { reason }) => reason,
            other => panic!("expected Refused, got {other:?}"),
        }
    }

    /// The orphan sweep's view: `pvc-1` is in use by a PV of any name whose
    /// path is it, inside it, or around the base directory (as written or
    /// through a symlink); a PV elsewhere uses nothing but its own name.
    #[tokio::test]
    async fn volumes_in_use_go_by_path_not_by_name() {
        let (tmp, base) = setup();
        std::fs::create_dir(base.join("pvc-2")).unwrap();
        symlink(&base, tmp.path().join("link")).unwrap();
        let b = backend(&base, OnDelete::Delete);
        let used = |pvs: Vec<PersistentVolume>| {
            let b = b.clone();
            async move {
                let mut v: Vec<String> = volumes_in_use(&b, &pvs)
                    .await
                    .unwrap()
                    .into_iter()
                    .collect();
                v.sort();
                v
            }
        };
        let at = |name: &str, path: &Path| pv(name, &path.to_string_lossy());
        assert_eq!(
            used(vec![at("restore-abc", &base.join("pvc-1"))]).await,
            ["pvc-1", "restore-abc"]
        );
        assert_eq!(
            used(vec![at("r", &base.join("pvc-1/data/"))]).await,
            ["pvc-1", "r"]
        );
        assert_eq!(
            used(vec![at("r", &base.join("x/../pvc-1"))]).await,
            ["pvc-1", "r"]
        );
        assert_eq!(
            used(vec![at("r", &tmp.path().join("link/pvc-1"))]).await,
            ["pvc-1", "r"]
        );
        assert_eq!(
            used(vec![at("r", tmp.path())]).await,
            ["pvc-1", "pvc-2", "r"]
        );
        assert_eq!(
            used(vec![at("r", &tmp.path().join("elsewhere"))]).await,
            ["r"]
        );
        let mut local = at("l", &base.join("pvc-2"));
        let spec = local.spec.as_mut().unwrap();
        spec.host_path = None;
        spec.local = Some(k8s_openapi::api::core::v1::LocalVolumeSource {
            path: base.join("pvc-2").to_string_lossy().into_owned(),
            fs_type: None,
        });
        assert_eq!(used(vec![local]).await, ["l", "pvc-2"]);
    }

    #[tokio::test]
    async fn deletes_the_volume_directory_and_is_idempotent() {
        let (_tmp, base) = setup();
        delete_at(&base, "pvc-1").unwrap();
        assert!(!base.join("pvc-1").exists());
        assert!(base.exists());
        // Already absent: success.
        delete_at(&base, "pvc-1").unwrap();
    }

    #[tokio::test]
    async fn accepts_a_trailing_slash_in_the_pv_path() {
        let (_tmp, base) = setup();
        let path = format!("{}/", base.join("pvc-1").display());
        delete(&backend(&base, OnDelete::Delete), &pv("pvc-1", &path)).unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn symlinks_inside_the_volume_are_removed_not_followed() {
        let (tmp, base) = setup();
        let outside = linked_outside(tmp.path(), base.join("pvc-1/link-dir"));
        symlink(outside.join("keep"), base.join("pvc-1/data/link-file")).unwrap();
        delete_at(&base, "pvc-1").unwrap();
        assert!(!base.join("pvc-1").exists());
        assert_kept(&outside);
    }

    #[tokio::test]
    async fn nested_links_to_the_base_and_other_volumes_are_not_followed() {
        let (_tmp, base) = setup();
        std::fs::create_dir_all(base.join("pvc-2/inner")).unwrap();
        std::fs::write(base.join("pvc-2/inner/keep"), b"other").unwrap();
        std::fs::create_dir_all(base.join("pvc-1/a/b/c")).unwrap();
        symlink(&base, base.join("pvc-1/a/b/c/to-base")).unwrap();
        symlink(base.join("pvc-2"), base.join("pvc-1/a/to-pvc-2")).unwrap();
        symlink("/nonexistent/dangling", base.join("pvc-1/a/b/dangling")).unwrap();
        delete_at(&base, "pvc-1").unwrap();
        assert!(!base.join("pvc-1").exists());
        assert_eq!(
            std::fs::read(base.join("pvc-2/inner/keep")).unwrap(),
            b"other"
        );
        let mut left: Vec<String> = std::fs::read_dir(&base)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .collect();
        left.sort();
        assert_eq!(left, vec!["pvc-2"]);
    }

    #[tokio::test]
    async fn a_volume_path_that_is_a_symlink_out_of_the_base_is_refused() {
        let (tmp, base) = setup();
        let outside = linked_outside(tmp.path(), base.join("pvc-2"));
        assert_refused(delete_at(&base, "pvc-2"), "is a symlink");
        assert!(outside.join("keep").exists());
        assert!(base.join("pvc-2").symlink_metadata().is_ok());
    }

    #[tokio::test]
    async fn a_symlink_to_another_pvs_directory_is_refused() {
        let (_tmp, base) = setup();
        symlink(base.join("pvc-1"), base.join("pvc-2")).unwrap();
        is_refused(delete_at(&base, "pvc-2"));
        assert!(base.join("pvc-1/data/file").exists());
    }

    #[tokio::test]
    async fn dot_dot_paths_and_names_are_refused() {
        let (_tmp, base) = setup();
        let b = backend(&base, OnDelete::Delete);
        // Path with `..` that lexically ends at the right place.
        let sneaky = format!("{}/x/../pvc-1", base.display());
        assert_refused(delete(&b, &pv("pvc-1", &sneaky)), "must be");
        // Names that are not a single component.
        for name in ["..", ".", "", "a/b", "../base"] {
            let p = pv(name, &base.join(name).to_string_lossy());
            let reason = is_refused(delete(&b, &p));
            assert!(reason.contains("single path component"), "{name}: {reason}");
        }
        assert!(base.join("pvc-1/data/file").exists());
    }

    #[tokio::test]
    async fn a_path_of_another_pv_or_outside_the_base_is_refused() {
        let (tmp, base) = setup();
        let b = backend(&base, OnDelete::Delete);
        let other = base.join("pvc-1").to_string_lossy().into_owned();
        is_refused(delete(&b, &pv("pvc-2", &other)));
        is_refused(delete(&b, &pv("pvc-1", "/etc")));
        is_refused(delete(
            &b,
            &pv("pvc-1", &tmp.path().join("pvc-1").to_string_lossy()),
        ));
        let mut no_host_path = pv_at(&base, "pvc-1");
        no_host_path.spec.as_mut().unwrap().host_path = None;
        assert_refused(delete(&b, &no_host_path), "no spec.hostPath");
        assert!(base.join("pvc-1/data/file").exists());
    }

    #[tokio::test]
    async fn a_regular_file_is_refused() {
        let (_tmp, base) = setup();
        std::fs::write(base.join("pvc-3"), b"f").unwrap();
        assert_refused(delete_at(&base, "pvc-3"), "not a directory");
        assert!(base.join("pvc-3").exists());
    }

    #[tokio::test]
    async fn a_missing_base_directory_fails_instead_of_succeeding() {
        let tmp = tempfile::tempdir().unwrap();
        let base = tmp.path().join("unmounted");
        let r = delete_at(&base, "pvc-1");
        assert!(matches!(r, Err(DeleteError::Failed { .. })), "{r:?}");
    }

    #[tokio::test]
    async fn a_symlinked_base_directory_is_resolved() {
        let (tmp, base) = setup();
        let alias = tmp.path().join("alias");
        symlink(&base, &alias).unwrap();
        // PV written with the configured (symlinked) base.
        delete_at(&alias, "pvc-1").unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn archive_renames_and_never_overwrites() {
        let (_tmp, base) = setup();
        let (b, pv) = (backend(&base, OnDelete::Archive), pv_at(&base, "pvc-1"));
        delete(&b, &pv).unwrap();
        assert!(!base.join("pvc-1").exists());
        assert_eq!(
            std::fs::read(base.join("archived-pvc-1/data/file")).unwrap(),
            b"x"
        );
        // Second delivery: directory absent, archive present → success.
        delete(&b, &pv).unwrap();
        // A new directory of the same name with an archive already there → refused.
        std::fs::create_dir(base.join("pvc-1")).unwrap();
        assert_refused(delete(&b, &pv), "already exists");
        assert!(base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn delete_dir_addresses_the_orphan() {
        let (_tmp, base) = setup();
        let b = backend(&base, OnDelete::Delete);
        delete_dir(&b, "pvc-1").unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn orphans_are_archived_only_when_old_enough() {
        let (_tmp, base) = setup();
        let b = backend(&base, OnDelete::Delete);
        let orphan = "pvc-1";
        // Just created: too young for a one-hour minimum age, left in place.
        match archive_orphan(&b, orphan, Duration::from_secs(3600)).unwrap() {
            OrphanOutcome::TooYoung(age) => assert!(age < Duration::from_secs(60)),
            other => panic!("expected TooYoung, got {other:?}"),
        }
        assert!(base.join("pvc-1/data/file").exists());
        // Old enough: archived (never removed), even though --on-delete is delete.
        let outcome = archive_orphan(&b, orphan, Duration::ZERO).unwrap();
        let archived = std::fs::canonicalize(&base).unwrap().join("archived-pvc-1");
        assert_eq!(outcome, OrphanOutcome::Archived(archived));
        assert!(!base.join("pvc-1").exists());
        assert_eq!(
            std::fs::read(base.join("archived-pvc-1/data/file")).unwrap(),
            b"x"
        );
        // Gone now.
        assert_eq!(
            archive_orphan(&b, orphan, Duration::ZERO).unwrap(),
            OrphanOutcome::Absent
        );
        // A symlinked orphan is refused and its target kept.
        symlink(base.join("archived-pvc-1"), base.join("pvc-2")).unwrap();
        is_refused(archive_orphan(&b, "pvc-2", Duration::ZERO));
        assert!(base.join("archived-pvc-1/data/file").exists());
    }

    /// archive_orphan addresses `<--base-dir>/<name>` only: a name that is not one path
    /// component is refused and a directory of the same name elsewhere is left alone.
    #[tokio::test]
    async fn archive_orphan_refuses_a_name_that_leaves_the_base_dir() {
        let (tmp, base) = setup();
        let elsewhere = tmp.path().join("elsewhere");
        with_keep(elsewhere.join("pvc-1"));
        let b = backend(&base, OnDelete::Delete);
        for name in ["../elsewhere/pvc-1", "x/../pvc-1", "/pvc-1", ".."] {
            let reason = is_refused(archive_orphan(&b, name, Duration::ZERO));
            assert!(reason.contains("single path component"), "{name}: {reason}");
        }
        assert!(elsewhere.join("pvc-1/keep").exists());
        assert!(!elsewhere.join("archived-pvc-1").exists());
        assert!(base.join("pvc-1/data/file").exists());
        assert!(!base.join("archived-pvc-1").exists());
    }

    /// A symlink named like the volume, pointing out of the base directory:
    /// delete and archive_orphan refuse it and leave its target alone.
    #[tokio::test]
    async fn a_planted_volume_symlink_is_refused_by_delete_archive_and_orphan_archive() {
        let (tmp, base) = setup();
        let outside = linked_outside(tmp.path(), base.join("pvc-7"));
        for on_delete in [OnDelete::Delete, OnDelete::Archive] {
            assert_refused(
                delete(&backend(&base, on_delete), &pv_at(&base, "pvc-7")),
                "is a symlink",
            );
        }
        let b = backend(&base, OnDelete::Delete);
        is_refused(archive_orphan(&b, "pvc-7", Duration::ZERO));
        assert_kept(&outside);
        assert!(base
            .join("pvc-7")
            .symlink_metadata()
            .unwrap()
            .file_type()
            .is_symlink());
        assert!(!base.join("archived-pvc-7").exists());
    }

    /// The race: checks pass on a real directory, then a symlink out of the base directory is
    /// swapped in. The action, relative to the base directory's handle, never follows it:
    /// delete unlinks the link, archive renames it; the target is untouched.
    #[test]
    fn a_symlink_swapped_in_after_the_check_never_redirects_the_action() {
        let (tmp, base) = setup();
        let outside = tmp.path().join("outside");
        let sub = with_keep(outside.join("sub"));
        let root = open_base(&base).unwrap();
        let dir = base.join("pvc-1");
        assert!(volume_dir::existing(&root, "pvc-1", &shown(&dir)).unwrap());
        // Swap: the checked directory is replaced by a symlink to `outside`.
        std::fs::rename(base.join("pvc-1"), tmp.path().join("moved")).unwrap();
        symlink(&outside, base.join("pvc-1")).unwrap();
        act(&root, &dir, "pvc-1", false).unwrap();
        assert!(
            base.join("pvc-1").symlink_metadata().is_err(),
            "link removed"
        );
        assert_kept(&sub);

        symlink(&outside, base.join("pvc-1")).unwrap();
        act(&root, &dir, "pvc-1", true).unwrap();
        let archived = base.join("archived-pvc-1").symlink_metadata().unwrap();
        assert!(
            archived.file_type().is_symlink(),
            "the link itself was renamed"
        );
        assert_kept(&sub);
        assert!(!outside.join("archived-pvc-1").exists());
    }

    /// A symlinked base directory swapped for another directory after the
    /// backend opened its handle: the action still happens in the directory
    /// that was opened, not in whatever the path names now.
    #[test]
    fn actions_stay_in_the_opened_base_directory_when_its_path_is_swapped() {
        let (tmp, base) = setup();
        let alias = tmp.path().join("alias");
        symlink(&base, &alias).unwrap();
        let root = open_base(&alias).unwrap();
        let decoy = tmp.path().join("decoy");
        with_keep(decoy.join("pvc-1"));
        std::fs::remove_file(&alias).unwrap();
        symlink(&decoy, &alias).unwrap();
        act(&root, &alias.join("pvc-1"), "pvc-1", false).unwrap();
        assert!(!base.join("pvc-1").exists());
        assert!(decoy.join("pvc-1/keep").exists());
    }

    fn unprovisioned(name: &str, node: Option<&str>) -> ProvisionOptions {
        use k8s_openapi::api::core::v1::Node;
        ProvisionOptions {
            storage_class: Default::default(),
            pv_name: name.into(),
            pvc: Default::default(),
            selected_node: node.map(|n| Node {
                metadata: ObjectMeta {
                    name: Some(n.into()),
                    ..Default::default()
                },
                ..Default::default()
            }),
        }
    }

    #[tokio::test]
    async fn delete_unprovisioned_removes_only_the_named_directory_and_creates_nothing() {
        let (_tmp, base) = setup();
        std::fs::create_dir_all(base.join("pvc-1/data")).unwrap();
        std::fs::create_dir_all(base.join("pvc-2")).unwrap();
        let b = backend(&base, OnDelete::Delete);
        delete_unprovisioned(&b, &unprovisioned("pvc-1", None)).unwrap();
        assert!(!base.join("pvc-1").exists());
        assert!(base.join("pvc-2").exists(), "other volumes untouched");
        // Absent: success, and nothing is created.
        delete_unprovisioned(&b, &unprovisioned("pvc-3", None)).unwrap();
        assert!(!base.join("pvc-3").exists());
        // Unsafe names are refused.
        is_refused(delete_unprovisioned(&b, &unprovisioned("../x", None)));
    }

    #[tokio::test]
    async fn delete_unprovisioned_for_another_node_is_refused_with_node_name() {
        let (_tmp, base) = setup();
        std::fs::create_dir_all(base.join("pvc-1")).unwrap();
        let mut b = backend(&base, OnDelete::Delete);
        b.node_name = Some("node-a".into());
        let msg = is_refused(delete_unprovisioned(
            &b,
            &unprovisioned("pvc-1", Some("node-b")),
        ));
        assert!(msg.contains("node-b"), "{msg}");
        assert!(base.join("pvc-1").exists());
        delete_unprovisioned(&b, &unprovisioned("pvc-1", Some("node-a"))).unwrap();
        assert!(!base.join("pvc-1").exists());
    }

    #[tokio::test]
    async fn retain_leaves_the_directory() {
        let (_tmp, base) = setup();
        delete(&backend(&base, OnDelete::Retain), &pv_at(&base, "pvc-1")).unwrap();
        assert!(base.join("pvc-1/data/file").exists());
    }

    #[tokio::test]
    async fn list_volumes_returns_pvc_directories_only() {
        let (tmp, base) = setup();
        std::fs::create_dir(base.join("pvc-0")).unwrap();
        std::fs::create_dir(base.join("archived-pvc-9")).unwrap();
        std::fs::create_dir(base.join("lost+found")).unwrap();
        std::fs::write(base.join("pvc-file"), b"").unwrap();
        symlink(tmp.path(), base.join("pvc-link")).unwrap();
        let b = backend(&base, OnDelete::Delete);
        assert_eq!(list_volumes(&b).unwrap(), vec!["pvc-0", "pvc-1"]);
        let missing = backend(&tmp.path().join("nope"), OnDelete::Delete);
        assert!(list_volumes(&missing)
            .unwrap_err()
            .to_string()
            .contains("nope"));
    }
}
