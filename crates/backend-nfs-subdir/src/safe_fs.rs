//! Directory-handle-relative filesystem operations inside the mounted export:
//! the shared cap-std helpers of [`provisioner_api::safe_fs`] (one handle on
//! `--nfs-mount`, every walk `O_NOFOLLOW` and relative to its parent's handle;
//! see there), plus what is specific to nfs-subdir's [`RelPath`]s.

pub use provisioner_api::safe_fs::{
    age, create_path, entry, open_path, open_root as open_mount, set_mode, set_owner, Entry,
    WalkError,
};

use super::pattern::RelPath;

/// Split a relative path into (parent components, last component).
///
/// Panics never: a [`RelPath`] always has at least one component.
pub fn split_last(path: &RelPath) -> (&[String], &str) {
    let comps = path.components();
    let (last, parent) = comps.split_last().expect("RelPath is never empty");
    (parent, last.as_str())
}
