//! The backend contract: what a storage backend implements so the services can provision
//! and delete its volumes. Mirrors the seed's `Provisioner` interface and its optional
//! `Qualifier`, `DeletionGuard` and `BlockProvisioner` capabilities (the defaults are the
//! seed's behaviour without them), plus the orphan sweep's listing and archiving,
//! provision-svc's delete-by-PV-name recovery and pv-writer's check of a queued PV.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Duration;

use crate::{DeleteError, ProvisionError, ProvisionOptions, VolumeError};
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

/// How full one storage pool of a backend is (hostpath: a base directory), for the
/// capacity metrics.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolCapacity {
    /// The pool's name (hostpath: the base directory's path).
    pub pool: String,
    /// Its capacity, bytes.
    pub capacity: u64,
    /// The bytes its volumes' requests take.
    pub allocated: u64,
}

/// A storage backend (seed `Provisioner` plus its optional interfaces); the
/// optional capabilities have defaults.
#[async_trait]
pub trait Provisioner: Send + Sync + 'static {
    /// Create the asset for `options.pvc` and return its PV (seed `Provision`);
    /// idempotent per PV name. Errors: [`ProvisionError`] with its state.
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError>;

    /// Delete the asset behind `volume` (seed `Delete`); idempotent.
    /// Errors: [`DeleteError`]; `Ignored` leaves the PV alone.
    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError>;

    /// Whether deleting `volume` needs its StorageClass as read now (then reclaim-svc
    /// calls [`Provisioner::delete_with_class`]). Default: false.
    fn reads_class_at_delete(&self, _volume: &PersistentVolume) -> bool {
        false
    }

    /// [`Provisioner::delete`] given the volume's StorageClass as just read (`None`:
    /// none). Default: `delete`. Errors: as `delete`.
    async fn delete_with_class(
        &self,
        volume: &PersistentVolume,
        _class: Option<&StorageClass>,
    ) -> Result<(), DeleteError> {
        self.delete(volume).await
    }

    /// Delete what `provision(options)` may have made for a claim deleted while it
    /// was provisioned; creates nothing. Default: refused (cannot delete by PV name).
    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        Err(DeleteError::Refused {
            reason: format!(
                "this backend cannot delete by PV name the volume {:?} of a claim deleted while it was being provisioned",
                options.pv_name
            ),
        })
    }

    /// pv-writer's check that a queued PV is one this backend could have produced;
    /// required, so no unchecked volume source is written. Errors: the reason.
    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), VolumeError>;

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

    /// Names of the PVs whose assets exist, for the orphan sweep; `None` (default):
    /// cannot list. Errors: the listing failed.
    async fn list_volumes(&self) -> Option<Result<Vec<String>, VolumeError>> {
        None
    }

    /// The listed names whose data any of `pvs` uses, whatever the PV is called, for
    /// the orphan sweep. Default: the PVs' names. Errors: the records are unreadable.
    async fn volumes_in_use(
        &self,
        pvs: &[PersistentVolume],
    ) -> Result<HashSet<String>, VolumeError> {
        Ok(pvs
            .iter()
            .filter_map(|pv| pv.metadata.name.clone())
            .collect())
    }

    /// Grow `volume` to `bytes` (its claim's new request, more than its capacity): raise its
    /// size limit and reserve the room. Default: nothing to do (a volume without a size of
    /// its own). Errors: not ours, no room, or the limit could not be raised.
    async fn expand(&self, _volume: &PersistentVolume, _bytes: u64) -> Result<(), VolumeError> {
        Ok(())
    }

    /// Capacity of each pool the backend provisions from; `None` (default): not limited.
    /// Errors: the pool's records are unreadable.
    async fn capacity(&self) -> Option<Result<Vec<PoolCapacity>, VolumeError>> {
        None
    }

    /// Archive (never remove) the orphaned volume of `pv_name` once at least
    /// `min_age` old; `None` (default): cannot archive. Errors: refused or failed.
    async fn archive_orphan(
        &self,
        _pv_name: &str,
        _min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        None
    }
}
