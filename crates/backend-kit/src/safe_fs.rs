//! Directory-handle-relative filesystem operations below one trusted root
//! (hostpath's `--base-dir`, nfs-subdir's `--nfs-mount`), on `cap-std`:
//! [`open_root`] is the only ambient-authority call; every walk opens one
//! component at a time without following a symlink ([`WalkError::Symlink`]),
//! relative to its parent's handle. Callers pass plain components (no `/`, `.`, `..`).

use std::io::{self, Write};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

use cap_fs_ext::DirExt;
use cap_std::ambient_authority;
pub use cap_std::fs::Dir;

/// Why a walk below the mount failed.
#[derive(Debug, thiserror::Error)]
pub enum WalkError {
    /// The component at this prefix of the path is a symlink (never crossed).
    #[error("{0:?} is a symlink; refusing to cross it")]
    Symlink(String),
    /// The component at this prefix exists and is not a directory.
    #[error("{0:?} exists and is not a directory")]
    NotADirectory(String),
    /// The component at this prefix does not exist (only when not creating).
    #[error("{0:?} does not exist")]
    Missing(String),
    /// Any other I/O error, with the prefix it happened at.
    #[error("{0:?}: {1}")]
    Io(String, io::Error),
}

/// Open the root itself (`--base-dir`, `--nfs-mount`), the only ambient-authority
/// call; a symlink in the configured path is followed. Errors: cannot open it.
pub fn open_root(root: &Path) -> io::Result<Dir> {
    Dir::open_ambient_dir(root, ambient_authority())
}

/// Open the sub-directory `name` of `dir` without following a symlink,
/// classifying failures.
fn step(dir: &Dir, name: &str, shown: &str) -> Result<Dir, WalkError> {
    let shown = shown.to_string();
    dir.open_dir_nofollow(name)
        .map_err(|e| match entry(dir, name) {
            Ok(Entry::Symlink) => WalkError::Symlink(shown),
            Ok(Entry::Other) => WalkError::NotADirectory(shown),
            Ok(Entry::Absent) => WalkError::Missing(shown),
            _ => WalkError::Io(shown, e),
        })
}

/// Open the directory at `components` below `root` (every component a real
/// directory, none a symlink). An empty slice opens `root` again.
/// Errors: [`WalkError`] naming the first offending prefix.
pub fn open_path(root: &Dir, components: &[String]) -> Result<Dir, WalkError> {
    let mut dir = reopen(root)?;
    for (i, name) in components.iter().enumerate() {
        dir = step(&dir, name, &components[..=i].join("/"))?;
    }
    Ok(dir)
}

fn reopen(root: &Dir) -> Result<Dir, WalkError> {
    root.try_clone()
        .map_err(|e| WalkError::Io(String::new(), e))
}

/// Open (creating missing ones with `mode`, despite the umask) the directory at
/// `components` below `root`; returns it and whether the last was created.
/// Errors: [`WalkError`] at the first offending prefix (nothing is replaced).
pub fn create_path(root: &Dir, components: &[String], mode: u32) -> Result<(Dir, bool), WalkError> {
    let mut dir = reopen(root)?;
    let mut created_last = false;
    for (i, name) in components.iter().enumerate() {
        let shown = components[..=i].join("/");
        created_last = match dir.create_dir(name) {
            Ok(()) => true,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => false,
            Err(e) => return Err(WalkError::Io(shown, e)),
        };
        let next = step(&dir, name, &shown)?;
        if created_last {
            set_mode(&next, mode).map_err(|e| WalkError::Io(shown.clone(), e))?;
        }
        dir = next;
    }
    Ok((dir, created_last))
}

/// Set the permission bits of the directory behind `dir` (`fchmod`).
/// Errors: the underlying `fchmod` failed.
pub fn set_mode(dir: &Dir, mode: u32) -> io::Result<()> {
    as_file(dir)?.set_permissions(std::fs::Permissions::from_mode(mode))
}

/// A readable descriptor of the directory behind `dir` (handles from
/// `open_dir_nofollow` are `O_PATH`, on which `fchmod`, `fchown` and ioctls fail).
/// Errors: reopening `.` failed.
pub fn as_file(dir: &Dir) -> io::Result<std::fs::File> {
    Ok(dir.open(".")?.into_std())
}

/// Time since the directory behind `dir` last changed: now minus the newer of
/// its mtime and ctime, in whole seconds (zero if in the future).
/// Errors: `fstat` failed.
pub fn age(dir: &Dir) -> io::Result<std::time::Duration> {
    use std::os::unix::fs::MetadataExt;
    let meta = as_file(dir)?.metadata()?;
    let changed = meta.mtime().max(meta.ctime());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs() as i64)
        .unwrap_or(0);
    Ok(std::time::Duration::from_secs(
        now.saturating_sub(changed).max(0) as u64,
    ))
}

/// Write `name` in `dir` whole: a temporary `.<name>.tmp`, synced, renamed over it (a crash
/// never leaves a half-written file).
pub fn replace(dir: &Dir, name: &str, contents: &[u8]) -> io::Result<()> {
    let tmp = format!(".{name}.tmp");
    let mut file = dir.create(&tmp)?;
    file.write_all(contents)?;
    file.sync_all()?;
    dir.rename(&tmp, dir, name)
}

/// `removal` with "not found" counted as done.
pub fn absent_ok(removal: io::Result<()>) -> io::Result<()> {
    removal.or_else(|e| match e.kind() {
        io::ErrorKind::NotFound => Ok(()),
        _ => Err(e),
    })
}

/// What is at `name` inside `dir`, without following a symlink.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Entry {
    /// Nothing.
    Absent,
    /// A real directory.
    Directory,
    /// A symlink (to anything).
    Symlink,
    /// A file or anything else.
    Other,
}

/// Classify `name` inside `dir` (`lstat`-style).
/// Errors: the lookup failed for another reason than "not found".
pub fn entry(dir: &Dir, name: &str) -> io::Result<Entry> {
    match dir.symlink_metadata(name) {
        Ok(m) if m.file_type().is_symlink() => Ok(Entry::Symlink),
        Ok(m) if m.is_dir() => Ok(Entry::Directory),
        Ok(_) => Ok(Entry::Other),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Entry::Absent),
        Err(e) => Err(e),
    }
}
