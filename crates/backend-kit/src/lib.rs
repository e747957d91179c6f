//! The toolkit of the built-in filesystem backends (hostpath, nfs-subdir):
//! [`safe_fs`] (cap-std operations relative to one handle on the backend's
//! root), [`claim`] (claim checks) and the helpers both delete paths share.
//! Only backends depend on it; it depends on no backend.

pub mod attrs;
pub mod capacity;
pub mod claim;
pub mod quota;
pub mod safe_fs;
pub mod volume_dir;

use std::borrow::Borrow;
use std::collections::HashSet;

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeSpec};
use provisioner_api::{DeleteError, ProvisionError, VolumeError};

/// Name prefix of archived volume directories.
pub const ARCHIVE_PREFIX: &str = "archived-";

/// What reclaim does with a released volume's directory (`--on-delete`, nfs-subdir's policy).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OnDelete {
    /// Remove the directory and its contents.
    Delete,
    /// Leave the directory in place.
    Retain,
    /// Rename it to `archived-<name>` beside it.
    Archive,
}

impl OnDelete {
    /// The flag and annotation value: `delete`, `retain` or `archive`.
    pub fn as_str(self) -> &'static str {
        match self {
            OnDelete::Delete => "delete",
            OnDelete::Retain => "retain",
            OnDelete::Archive => "archive",
        }
    }

    /// Parse [`as_str`](Self::as_str)'s values (case-sensitive).
    pub fn from_annotation(value: &str) -> Option<Self> {
        <Self as clap::ValueEnum>::from_str(value, false).ok()
    }
}

/// Why a backend refuses a claim, StorageClass or PV, or which step of its filesystem work
/// failed: one message naming the object and the cause. Becomes a `Finished` provisioning
/// failure, a refused delete or a PV that is not the backend's.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct Refusal(pub String);

impl From<Refusal> for ProvisionError {
    fn from(e: Refusal) -> Self {
        ProvisionError::finished(e.0)
    }
}

impl From<Refusal> for DeleteError {
    fn from(e: Refusal) -> Self {
        DeleteError::Refused { reason: e.0 }
    }
}

impl From<Refusal> for VolumeError {
    fn from(e: Refusal) -> Self {
        VolumeError::NotOurs(e.0)
    }
}

/// A backend task on the blocking pool panicked or was cancelled.
#[derive(Debug, thiserror::Error)]
#[error("{what} task failed: {source}")]
pub struct TaskFailed {
    what: &'static str,
    source: tokio::task::JoinError,
}

impl From<TaskFailed> for DeleteError {
    fn from(e: TaskFailed) -> Self {
        failed(e.to_string())
    }
}

impl From<TaskFailed> for VolumeError {
    fn from(e: TaskFailed) -> Self {
        VolumeError::Unreadable(e.to_string())
    }
}

impl From<TaskFailed> for ProvisionError {
    fn from(e: TaskFailed) -> Self {
        ProvisionError::finished(e.to_string())
    }
}

/// Run the filesystem work `f` on the blocking pool; `what` names it if the task fails.
/// Errors: `f`'s error, or [`TaskFailed`] converted into it.
pub async fn blocking<T, E>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    T: Send + 'static,
    E: From<TaskFailed> + Send + 'static,
{
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|source| TaskFailed { what, source })?
}

/// [`blocking`] of `f(&backend, &input)` on owned copies of both (the pool takes owned values).
/// Errors: as [`blocking`].
pub async fn blocking_with<B, I, T, E>(
    what: &'static str,
    backend: &B,
    input: &I,
    f: impl FnOnce(&B, &I) -> Result<T, E> + Send + 'static,
) -> Result<T, E>
where
    B: Clone + Send + 'static,
    I: ToOwned + ?Sized,
    I::Owned: Send + 'static,
    T: Send + 'static,
    E: From<TaskFailed> + Send + 'static,
{
    let (backend, input) = (backend.clone(), input.to_owned());
    blocking(what, move || f(&backend, input.borrow())).await
}

/// A [`DeleteError::Refused`] with `reason`.
pub fn refused(reason: String) -> DeleteError {
    DeleteError::Refused { reason }
}

/// A [`DeleteError::Failed`] with `reason`.
pub fn failed(reason: String) -> DeleteError {
    DeleteError::Failed { reason }
}

/// The start of `volumes_in_use`: the PVs' own names, and the paths `paths`
/// picks from each PV's spec (the caller maps those to volumes).
pub fn names_and_paths<I: IntoIterator>(
    pvs: &[PersistentVolume],
    paths: impl Fn(&PersistentVolumeSpec) -> I,
) -> (HashSet<String>, Vec<I::Item>) {
    let names = pvs.iter().filter_map(|pv| pv.metadata.name.clone());
    let picked = pvs.iter().filter_map(|pv| pv.spec.as_ref()).flat_map(paths);
    (names.collect(), picked.collect())
}

/// `name` when it is one plain path component (not empty, no `/`, not `.` or `..`).
/// Errors: a refusal naming the PV name.
pub fn single_component(name: &str) -> Result<&str, Refusal> {
    let mut components = std::path::Path::new(name).components();
    match (components.next(), components.next()) {
        (Some(std::path::Component::Normal(c)), None) if c == name => Ok(name),
        _ => Err(Refusal(format!(
            "PV name {name:?} is not a single path component"
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn single_components_and_on_delete_values() {
        for ok in ["pvc-1", "a.b"] {
            assert!(single_component(ok).is_ok(), "{ok}");
        }
        for bad in ["", ".", "..", "a/b", "a/", "/a", "./a"] {
            assert!(single_component(bad).is_err(), "{bad}");
        }
        for p in [OnDelete::Delete, OnDelete::Retain, OnDelete::Archive] {
            assert_eq!(OnDelete::from_annotation(p.as_str()), Some(p));
        }
        assert_eq!(OnDelete::from_annotation("Delete"), None);
    }
}
