//! The backend contract: what a storage backend implements so the services can
//! provision and delete its volumes. Mirrors the seed's `Provisioner` interface
//! and its optional `Qualifier`, `DeletionGuard` and `BlockProvisioner`
//! capabilities; the optional methods' defaults are the seed's behaviour when a
//! provisioner does not implement the capability. Beyond the seed: listing and
//! archiving a backend's volumes (reclaim-svc's orphan sweep), deleting the
//! volume of a claim deleted mid-provisioning by PV name (provision-svc's
//! recovery), and validating a queued PV (pv-writer).

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::{DeleteError, ProvisionError, ProvisionOptions};
use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;

/// What [`Provisioner::archive_orphan`] did with an orphaned volume.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OrphanOutcome {
    /// Renamed to `archived-<name>` (the new path given).
    Archived(PathBuf),
    /// Younger than the minimum age (its age given, whole seconds): left alone.
    TooYoung(Duration),
    /// The volume is already gone: nothing to do.
    Absent,
}

/// A storage backend.
///
/// Implementations must be idempotent per PV name: `provision` called twice for
/// the same `options.pv_name` (after a crash, or by a new leader) must return the
/// same volume and not create a second asset; `delete` of an asset that no longer
/// exists must succeed.
#[async_trait]
pub trait Provisioner: Send + Sync + 'static {
    /// Create the storage asset for `options.pvc` and return the PV describing it
    /// (named `options.pv_name`). The caller fills in `claimRef`, the finalizer,
    /// `pv.kubernetes.io/provisioned-by` and `storageClassName`.
    ///
    /// Errors: [`ProvisionError::Ignored`] to leave the claim to another
    /// provisioner; [`ProvisionError::Failed`] with the [`crate::ProvisioningState`]
    /// that tells the caller whether to retry, remember the claim, or reschedule.
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError>;

    /// Delete the storage asset behind `volume`.
    ///
    /// Errors: [`DeleteError::Ignored`] (nothing is done), [`DeleteError::Failed`]
    /// (retried with backoff), [`DeleteError::Refused`] (unsafe: reported, never forced).
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError>;

    /// Whether deleting `volume` depends on its StorageClass as it is now
    /// (nfs-subdir: a PV provisioned before a migration, with no recorded
    /// policy). reclaim-svc then reads the class right before the delete and
    /// calls [`Provisioner::delete_with_class`]. Default: false.
    fn reads_class_at_delete(&self, _volume: &PersistentVolume) -> bool {
        false
    }

    /// [`Provisioner::delete`] given the volume's StorageClass as just read
    /// from the API server (`None`: the PV names no class, or it does not
    /// exist). Default: `delete(volume)`.
    ///
    /// Errors: as [`Provisioner::delete`].
    async fn delete_with_class(
        &self,
        volume: &PersistentVolume,
        _class: Option<&StorageClass>,
    ) -> Result<(), DeleteError> {
        self.delete(volume).await
    }

    /// Recovery of a claim deleted mid-provisioning (provision-svc's start-up
    /// walk, beyond the seed): remove, per the backend's delete policy, the
    /// asset that `provision(options)` created or would have created, from the
    /// recorded `options` alone (class as recorded in the intent, claim
    /// snapshot or a claim carrying only its namespace, name and uid, selected
    /// node). Never creates anything; an asset that does not exist is success.
    ///
    /// Errors: [`DeleteError::Failed`] (retried with backoff),
    /// [`DeleteError::Refused`] (unsafe or impossible: reported, the intent is
    /// kept for an operator, never retried in a loop). Default:
    /// `Refused` — the backend cannot delete by PV name.
    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        Err(DeleteError::Refused {
            reason: format!(
                "this backend cannot delete by PV name the volume {:?} of a claim deleted while it was being provisioned",
                options.pv_name
            ),
        })
    }

    /// pv-writer's check that a PV taken from the queue is one this backend could
    /// have produced (hostpath: the only volume source is `hostPath` and its path
    /// is exactly `<base-dir>/<pv name>`). Required (no default): an unchecked
    /// volume source is never written.
    ///
    /// Errors: a human-readable reason, which pv-writer puts in the dead letter
    /// and the claim's Warning event.
    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), String>;

    /// Seed `Qualifier.ShouldProvision`: a cheap, synchronous pre-check that may
    /// decline a claim before any other work. Default: accept every claim.
    fn should_provision(&self, _claim: &PersistentVolumeClaim) -> bool {
        true
    }

    /// Seed `DeletionGuard.ShouldDelete`: may veto deleting a released volume.
    /// Default: allow.
    fn should_delete(&self, _volume: &PersistentVolume) -> bool {
        true
    }

    /// Seed `BlockProvisioner.SupportsBlock`: whether `volumeMode: Block` claims
    /// can be provisioned. Default: false, as in the seed.
    fn supports_block(&self) -> bool {
        false
    }

    /// Names of the PVs whose assets exist in the backend, for reclaim-svc's
    /// orphan sweep. `None` (the default) means the backend cannot list its
    /// assets and the sweep is skipped.
    async fn list_volumes(&self) -> Option<Result<Vec<String>, String>> {
        None
    }

    /// The names among [`Provisioner::list_volumes`]' whose data any of `pvs`
    /// uses, whatever the PV is called (a hand-made PV pointing at a retained
    /// volume's directory included), for the orphan sweep. Default: the PVs'
    /// names.
    ///
    /// Errors: the backend's own records cannot be read (the sweep is then
    /// abandoned: "unknown" is never "orphan").
    async fn volumes_in_use(&self, pvs: &[PersistentVolume]) -> Result<HashSet<String>, String> {
        Ok(pvs
            .iter()
            .filter_map(|pv| pv.metadata.name.clone())
            .collect())
    }

    /// reclaim-svc's orphan sweep with `--sweep-orphans` (beyond the seed):
    /// archive the volume of `pv_name`, one of [`Provisioner::list_volumes`]'
    /// names that nothing accounts for (no PV, no pending PV write, no
    /// provisioning intent), if its data is at least `min_age` old (the newer
    /// of its mtime and ctime). Archiving renames it to `archived-<name>` and
    /// never removes data, whatever the backend's delete policy says.
    /// `None` (the default) means the backend cannot archive: the sweep only
    /// reports orphans.
    ///
    /// Errors: [`DeleteError::Refused`] (unsafe: a check failed or the archive
    /// destination exists), [`DeleteError::Failed`] (filesystem errors); the
    /// sweep logs them and leaves the volume in place.
    async fn archive_orphan(
        &self,
        _pv_name: &str,
        _min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        None
    }
}
