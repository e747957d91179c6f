//! What both backends do to an existing volume directory, relative to its parent's handle:
//! check it is a real directory, read its age, remove or archive it. `shown` names the
//! directory in the errors.

use std::io;
use std::time::Duration;

use provisioner_api::{DeleteError, OrphanOutcome};

use crate::safe_fs::{self, Dir, Entry, WalkError};
use crate::{failed, quota, refused};

/// Whether `name` in `parent` is a real directory (`true`) or absent (`false`).
/// Errors: [`DeleteError::Refused`] for a symlink or anything else there,
/// [`DeleteError::Failed`] when the lookup failed.
pub fn existing(parent: &Dir, name: &str, shown: &str) -> Result<bool, DeleteError> {
    let entry = safe_fs::entry(parent, name);
    match entry.map_err(|e| failed(format!("cannot inspect {shown}: {e}")))? {
        Entry::Absent => Ok(false),
        Entry::Directory => Ok(true),
        Entry::Symlink => {
            let target = parent.read_link_contents(name);
            let target = target.map_or_else(|_| "?".into(), |t| t.display().to_string());
            Err(refused(format!(
                "{shown} is a symlink (to {target}); refusing to follow it"
            )))
        }
        Entry::Other => Err(refused(format!("{shown} is not a directory; refusing"))),
    }
}

/// Why the sweep keeps the directory at `components` below `root` (`Absent`; `TooYoung`: its
/// [`safe_fs::age`] is below `min_age`), `None` to archive it. Errors: [`DeleteError::Refused`]
/// for a failed walk, [`DeleteError::Failed`] for a failed `fstat`.
pub fn orphan_kept(
    root: &Dir,
    components: &[String],
    shown: &str,
    min_age: Duration,
) -> Result<Option<OrphanOutcome>, DeleteError> {
    let dir = match safe_fs::open_path(root, components) {
        Ok(dir) => dir,
        Err(WalkError::Missing(_)) => return Ok(Some(OrphanOutcome::Absent)),
        Err(e) => return Err(refused(format!("{shown}: {e}"))),
    };
    let age = safe_fs::age(&dir).map_err(|e| failed(format!("cannot inspect {shown}: {e}")))?;
    Ok((age < min_age).then_some(OrphanOutcome::TooYoung(age)))
}

/// Remove `name` of `parent` (the directory of `pv_name`) with all it holds, its own size
/// limit lifted first ([`quota::lift_before_removal`]); already gone counts as removed.
/// Errors: [`DeleteError::Failed`].
pub fn remove(parent: &Dir, name: &str, pv_name: &str, shown: &str) -> Result<(), DeleteError> {
    quota::lift_before_removal(parent, name, pv_name);
    let removed = safe_fs::absent_ok(parent.remove_dir_all(name));
    removed.map_err(|e| failed(format!("cannot remove {shown}: {e}")))
}

/// Rename `name` of `parent` to the first of `targets` that is free (and at most 255 bytes
/// long); returns it. Errors: [`DeleteError::Refused`] when none is (nothing is
/// overwritten), [`DeleteError::Failed`] on I/O.
pub fn archive(
    parent: &Dir,
    name: &str,
    targets: &[String],
    shown: &str,
) -> Result<String, DeleteError> {
    let cannot = |e: io::Error| failed(format!("cannot archive {shown}: {e}"));
    for target in targets.iter().filter(|t| t.len() <= 255) {
        if safe_fs::entry(parent, target).map_err(cannot)? == Entry::Absent {
            parent.rename(name, parent, target).map_err(cannot)?;
            return Ok(target.clone());
        }
    }
    Err(refused(format!(
        "cannot archive {shown}: {} (each already exists or is too long); not overwriting it",
        targets.join(", ")
    )))
}
