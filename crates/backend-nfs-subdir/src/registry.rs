//! The record of the directories this backend created, kept on the export so
//! every replica and service sees it: one file per PV at
//! `<mount>/.split-provisioner/volumes/<pv name>` holding the directory relative
//! to the mount, written atomically before the directory is created. PV names
//! are checked as Kubernetes object names before they become file names.

use std::io::{self, Read};

use cap_std::fs::Dir;

use super::pattern::RelPath;
use backend_kit::{safe_fs, Refusal};

/// Top-level bookkeeping directory in the mount (never a volume directory).
pub const REGISTRY_DIR: &str = backend_kit::capacity::BOOKKEEPING_DIR;
/// Sub-directory of [`REGISTRY_DIR`] holding one file per PV.
pub const VOLUMES_DIR: &str = "volumes";

/// Whether `name` is a valid Kubernetes object name usable as a file name.
pub fn valid_pv_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 253
        && name != "."
        && name != ".."
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Refuse a `pv_name` that is not [`valid_pv_name`].
pub fn check_pv_name(pv_name: &str) -> Result<(), Refusal> {
    let refusal = || Refusal(format!("PV name {pv_name:?} is not a valid object name"));
    valid_pv_name(pv_name).then_some(()).ok_or_else(refusal)
}

fn check_name(pv_name: &str) -> io::Result<()> {
    check_pv_name(pv_name).map_err(|r| io::Error::new(io::ErrorKind::InvalidInput, r.0))
}

fn open_volumes(root: &Dir, create: bool) -> io::Result<Option<Dir>> {
    backend_kit::capacity::bookkeeping(root, VOLUMES_DIR, create)
        .map_err(|e| io::Error::other(format!("bookkeeping directory: {e}")))
}

/// The directory recorded for `pv_name`, if any.
/// Errors: I/O, an invalid PV name, or a record that does not parse as a
/// [`RelPath`] (reported, never guessed at).
pub fn get(root: &Dir, pv_name: &str) -> io::Result<Option<RelPath>> {
    check_name(pv_name)?;
    let Some(dir) = open_volumes(root, false)? else {
        return Ok(None);
    };
    read_record(&dir, pv_name)
}

fn read_record(dir: &Dir, pv_name: &str) -> io::Result<Option<RelPath>> {
    let file = match dir.open(pv_name) {
        Ok(f) => f,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    let mut text = String::new();
    file.take(64 * 1024).read_to_string(&mut text)?;
    RelPath::parse(text.trim_end_matches('\n'))
        .map(Some)
        .map_err(|e| {
            io::Error::new(
                io::ErrorKind::InvalidData,
                format!("record of PV {pv_name} is corrupt: {e}"),
            )
        })
}

/// Record `path` for `pv_name` (replacing any previous record atomically).
/// Errors: I/O or an invalid PV name.
pub fn put(root: &Dir, pv_name: &str, path: &RelPath) -> io::Result<()> {
    check_name(pv_name)?;
    let dir = open_volumes(root, true)?.expect("created above");
    safe_fs::replace(&dir, pv_name, format!("{path}\n").as_bytes())
}

/// Forget `pv_name` (absent is fine). Errors: I/O or an invalid PV name.
pub fn remove(root: &Dir, pv_name: &str) -> io::Result<()> {
    check_name(pv_name)?;
    let Some(dir) = open_volumes(root, false)? else {
        return Ok(());
    };
    safe_fs::absent_ok(dir.remove_file(pv_name))
}

/// Every record as (PV name, directory), sorted; non-PV file names (temporaries)
/// skipped. Errors: I/O or a corrupt record.
pub fn all(root: &Dir) -> io::Result<Vec<(String, RelPath)>> {
    let Some(dir) = open_volumes(root, false)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for entry in dir.entries()? {
        let entry = entry?;
        let Ok(name) = entry.file_name().into_string() else {
            continue;
        };
        if !valid_pv_name(&name) || name.starts_with('.') {
            continue;
        }
        if let Some(path) = read_record(&dir, &name)? {
            out.push((name, path));
        }
    }
    out.sort();
    Ok(out)
}

/// The PVs other than `pv_name` whose record names `path`. Errors: as [`all`].
pub fn other_owners(root: &Dir, pv_name: &str, path: &RelPath) -> io::Result<Vec<String>> {
    Ok(all(root)?
        .into_iter()
        .filter(|(name, p)| name != pv_name && p == path)
        .map(|(name, _)| name)
        .collect())
}

/// The records of PVs other than `pv_name` whose directory lies strictly
/// inside `path` or strictly contains it, as (PV name, directory).
/// Errors: as [`all`].
pub fn nested_with(
    root: &Dir,
    pv_name: &str,
    path: &RelPath,
) -> io::Result<Vec<(String, RelPath)>> {
    Ok(all(root)?
        .into_iter()
        .filter(|(name, p)| name != pv_name && p != path && p.overlaps(path))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A temporary directory and a handle on it, as the export's root.
    fn temp_root() -> (tempfile::TempDir, Dir) {
        let tmp = tempfile::tempdir().unwrap();
        let root = safe_fs::open_root(tmp.path()).unwrap();
        (tmp, root)
    }

    #[test]
    fn put_get_remove_and_list() {
        let (tmp, root) = temp_root();
        assert_eq!(get(&root, "pvc-1").unwrap(), None);
        assert!(all(&root).unwrap().is_empty());
        let p = RelPath::parse("a/b").unwrap();
        put(&root, "pvc-1", &p).unwrap();
        put(&root, "pvc-2", &p).unwrap();
        assert_eq!(get(&root, "pvc-1").unwrap(), Some(p.clone()));
        assert_eq!(
            std::fs::read_to_string(tmp.path().join(".split-provisioner/volumes/pvc-1")).unwrap(),
            "a/b\n"
        );
        assert_eq!(other_owners(&root, "pvc-1", &p).unwrap(), ["pvc-2"]);
        assert!(nested_with(&root, "pvc-1", &p).unwrap().is_empty());
        let inner = RelPath::parse("a/b/c").unwrap();
        put(&root, "pvc-3", &inner).unwrap();
        assert_eq!(
            nested_with(&root, "pvc-1", &p).unwrap(),
            [("pvc-3".to_string(), inner.clone())]
        );
        assert_eq!(
            nested_with(&root, "pvc-3", &inner).unwrap(),
            [
                ("pvc-1".to_string(), p.clone()),
                ("pvc-2".to_string(), p.clone())
            ]
        );
        assert!(
            nested_with(&root, "pvc-1", &RelPath::parse("a/bc").unwrap())
                .unwrap()
                .is_empty()
        );
        remove(&root, "pvc-3").unwrap();
        remove(&root, "pvc-2").unwrap();
        remove(&root, "pvc-2").unwrap();
        assert_eq!(all(&root).unwrap(), vec![("pvc-1".to_string(), p)]);
        assert!(get(&root, "../x").is_err());
        assert!(put(&root, "A/b", &RelPath::parse("x").unwrap()).is_err());
    }

    #[test]
    fn a_corrupt_record_is_an_error_not_a_guess() {
        let (tmp, root) = temp_root();
        let dir = tmp.path().join(".split-provisioner/volumes");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("pvc-1"), "../../etc\n").unwrap();
        assert!(get(&root, "pvc-1")
            .unwrap_err()
            .to_string()
            .contains("corrupt"));
        assert!(all(&root).is_err());
    }
}
