//! The effects of one PV's reconciliation, seed `syncVolume`: the finalizer
//! patch, then `deleteVolumeOperation` (backend delete, PV delete, finalizer
//! removal) with the seed's delete metrics. [`Reclaimer`] is the service's one
//! effect seam (API server, backend, events); [`SyncError`] its typed error.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use api_types::FINALIZER_PV;
use common::kube::events::{self, reason, EventSink};
use common::runtime::health::{LeaderTerm, NotCurrent};
use common::runtime::metrics::DeleteMetrics;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::runtime::events::Event;
use kube::ResourceExt;
use provisioner_api::{deadline, DeleteError, Provisioner};

use crate::decision::{self, Skip};
use crate::finalizer::update_finalizers;

/// Why syncing a PV failed (the PV name first); every variant retries the PV.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Adding or removing our finalizer failed (seed `handleProtectionFinalizer`).
    #[error("failed to modify finalizers of PV {0}: {1}")]
    Finalizer(String, #[source] kube::Error),
    /// The backend's delete failed or refused; a `VolumeFailedDelete` event was published.
    #[error("deleting the volume of PV {0} failed: {1}")]
    Backend(String, #[source] DeleteError),
    /// The asset is gone but deleting the PV object failed.
    #[error("failed to delete PV {0}: {1}")]
    DeletePv(String, #[source] kube::Error),
    /// The PV is deleted but removing our finalizer from it failed.
    #[error("failed to remove finalizer from deleted PV {0}: {1}")]
    RemoveFinalizer(String, #[source] kube::Error),
    /// Re-reading the PV right before the backend's delete failed.
    #[error("failed to re-read PV {0} before deleting its volume: {1}")]
    Reread(String, #[source] kube::Error),
    /// The leader term was not current right before the backend's delete; nothing deleted.
    #[error("not deleting the volume of PV {0}: {1}")]
    NotLeader(String, #[source] NotCurrent),
    /// The sync, other than the backend call, overran `--deletion-timeout`.
    #[error("syncing PV {0} timed out after {1:?} (context deadline exceeded)")]
    Timeout(String, std::time::Duration),
}

/// Where events about PVs go: the real [`EventSink`] in the service, a recorder in tests.
#[async_trait::async_trait]
pub trait EventPublisher: Send + Sync {
    /// Publish kube-runtime's `event` about `volume`.
    async fn publish(&self, volume: &PersistentVolume, event: Event);
}

#[async_trait::async_trait]
impl EventPublisher for EventSink {
    async fn publish(&self, volume: &PersistentVolume, event: Event) {
        EventSink::publish(self, &events::reference(volume), event).await;
    }
}

/// Reconciles PVs of one provisioner: keeps the finalizer in line and deletes
/// released volumes. Shared (`Arc`) by the workers; one PV is never synced twice at once.
pub struct Reclaimer {
    api: Api<PersistentVolume>,
    term: LeaderTerm,
    backend: Arc<dyn Provisioner>,
    events: Arc<dyn EventPublisher>,
    metrics: DeleteMetrics,
    provisioner_name: String,
    add_finalizer: bool,
    /// uids whose asset the backend deleted, until the PV is gone: never deleted twice.
    deleted_assets: Mutex<HashSet<String>>,
}

impl Reclaimer {
    /// A reclaimer for `provisioner_name`, writing PVs through `api`.
    pub fn new(
        api: Api<PersistentVolume>,
        backend: Arc<dyn Provisioner>,
        events: Arc<dyn EventPublisher>,
        metrics: DeleteMetrics,
        provisioner_name: String,
        add_finalizer: bool,
    ) -> Self {
        Self {
            term: LeaderTerm::unconditional(),
            api,
            backend,
            events,
            metrics,
            provisioner_name,
            add_finalizer,
            deleted_assets: Mutex::new(HashSet::new()),
        }
    }

    /// Check `term` right before each backend delete (default: always current).
    pub fn with_term(mut self, term: LeaderTerm) -> Self {
        self.term = term;
        self
    }

    /// Seed `syncVolume`: our finalizer in line, then the delete operation when
    /// [`decision::should_delete`] says so, with the seed's delete metrics (label `class`).
    /// Errors: [`SyncError`]; the caller retries the PV with backoff.
    pub async fn sync_volume(&self, volume: &PersistentVolume) -> Result<(), SyncError> {
        self.sync_volume_within(volume, Duration::ZERO).await
    }

    /// [`sync_volume`](Self::sync_volume) under `--deletion-timeout` ([`deadline::within`]; zero:
    /// unbounded), which bounds the whole sync as in the seed; only a delete that ran out of time
    /// is a failed delete (event, metric). Errors: as `sync_volume`, plus [`SyncError::Timeout`].
    pub async fn sync_volume_within(
        &self,
        volume: &PersistentVolume,
        timeout: Duration,
    ) -> Result<(), SyncError> {
        let deleting = AtomicBool::new(false);
        let sync = deadline::within(Some(timeout), self.sync(volume, &deleting));
        let Ok(result) = sync.await else {
            let err = SyncError::Timeout(volume.name_any(), timeout);
            if !deleting.load(Ordering::SeqCst) {
                tracing::warn!(pv = %volume.name_any(), error = %err, "PV sync timed out before any delete");
                return Err(err);
            }
            tracing::error!(pv = %volume.name_any(), error = %err, "delete timed out");
            self.failed_delete(volume, err.to_string()).await;
            self.metrics.failed(decision::storage_class(volume));
            return Err(err);
        };
        result
    }

    /// The sync; sets `deleting` as the delete operation starts.
    async fn sync(
        &self,
        volume: &PersistentVolume,
        deleting: &AtomicBool,
    ) -> Result<(), SyncError> {
        let name = volume.name_any();
        let (provisioner, add) = (self.provisioner_name.as_str(), self.add_finalizer);
        let compute = |v: &PersistentVolume| decision::finalizer_update(v, provisioner, add);
        let updated = update_finalizers(&self.api, volume, compute).await;
        let Some(volume) = updated.map_err(|e| SyncError::Finalizer(name.clone(), e))? else {
            tracing::debug!(pv = %name, "PV disappeared while updating its finalizers");
            return Ok(());
        };
        if let Err(skip) = self.should_delete(&volume) {
            if skip != Skip::NotReleased && skip != Skip::NotOurs {
                tracing::debug!(pv = %name, ?skip, "PV not deleted");
            }
            return Ok(());
        }
        let class = decision::storage_class(&volume);
        let start = Instant::now();
        deleting.store(true, Ordering::SeqCst);
        let result = self.delete_volume_operation(&volume).await;
        match &result {
            Ok(()) => self.metrics.succeeded(class, start.elapsed().as_secs_f64()),
            // Not a failed delete: this replica no longer leads.
            Err(SyncError::NotLeader(..)) => {}
            Err(_) => self.metrics.failed(class),
        }
        result
    }

    /// Seed `deleteVolumeOperation`: the backend's delete (once per PV uid),
    /// then the PV object (uid precondition), then our finalizer from the
    /// copy the delete returned. Errors: [`SyncError`].
    pub async fn delete_volume_operation(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(), SyncError> {
        let name = volume.name_any();
        let uid = volume.metadata.uid.clone().unwrap_or_default();
        tracing::info!(pv = %name, "delete started");
        if !uid.is_empty() && self.asset_deleted(&uid) {
            tracing::info!(pv = %name, %uid, "volume already deleted, deleting the PV");
        } else if !self.delete_asset(volume, &name).await? {
            return Ok(());
        } else if !uid.is_empty() {
            self.deleted_assets().insert(uid.clone());
        }
        self.delete_pv_object(&name, &uid).await?;
        tracing::info!(pv = %name, "delete succeeded");
        Ok(())
    }

    /// The backend's delete of `volume`'s asset, decided again on a quorum read
    /// and under a current leader term; `Ok(false)` when nothing more is to be done.
    async fn delete_asset(&self, volume: &PersistentVolume, name: &str) -> Result<bool, SyncError> {
        let reread = self.api.get_opt(name).await;
        let fresh = reread.map_err(|source| SyncError::Reread(name.into(), source))?;
        let fresh = match decision::still_to_delete(volume, fresh, |v| self.should_delete(v)) {
            Ok(fresh) => fresh,
            Err(stale) => {
                tracing::info!(pv = %name, ?stale, "PV changed since the decision to delete it");
                return Ok(false);
            }
        };
        let class = self.class_for(&fresh).await;
        if let Some(reason) = class.as_ref().ok().and_then(|_| self.term.check().err()) {
            tracing::warn!(pv = %name, %reason, "leader term not current, volume not deleted");
            return Err(SyncError::NotLeader(name.into(), reason));
        }
        let call = async {
            match class? {
                Some(class) => self.backend.delete_with_class(&fresh, class.as_ref()).await,
                None => self.backend.delete(&fresh).await,
            }
        };
        let deleted = deadline::bound(call).await.unwrap_or_else(|e| {
            let reason = e.to_string();
            Err(DeleteError::Failed { reason })
        });
        match deleted {
            Ok(()) => {
                tracing::info!(pv = %name, "volume deleted");
                Ok(true)
            }
            Err(DeleteError::Ignored { reason }) => {
                tracing::info!(pv = %name, %reason, "volume deletion ignored");
                Ok(false)
            }
            Err(err) => {
                tracing::error!(pv = %name, error = %err, "volume deletion failed");
                self.failed_delete(volume, err.to_string()).await;
                Err(SyncError::Backend(name.into(), err))
            }
        }
    }

    /// Delete the PV object `name` of `uid` (404, or another object of that
    /// name, is success), then remove our finalizer from what remains.
    async fn delete_pv_object(&self, name: &str, uid: &str) -> Result<(), SyncError> {
        let params = DeleteParams {
            preconditions: (!uid.is_empty()).then(|| Preconditions {
                uid: Some(uid.to_string()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let remaining = match self.api.delete(name, &params).await {
            Ok(either) => either.left(),
            Err(kube::Error::Api(status)) if status.is_not_found() => None,
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                tracing::warn!(pv = %name, %uid, "PV replaced by a same-named object, left alone");
                None
            }
            Err(source) => {
                tracing::info!(pv = %name, error = %source, "failed to delete PV");
                return Err(SyncError::DeletePv(name.into(), source));
            }
        };
        let Some(fresh) = remaining.filter(|pv| decision::has_finalizer(pv, FINALIZER_PV)) else {
            return Ok(());
        };
        // Only the PV we deleted: a same-named successor is left alone.
        let ours = |v: &PersistentVolume| {
            let ours = decision::has_finalizer(v, FINALIZER_PV);
            (ours && v.metadata.uid.as_deref() == Some(uid))
                .then(|| decision::without(decision::finalizers(v), FINALIZER_PV))
        };
        if let Err(source) = update_finalizers(&self.api, &fresh, ours).await {
            tracing::info!(pv = %name, error = %source, "failed to remove finalizer");
            return Err(SyncError::RemoveFinalizer(name.into(), source));
        }
        Ok(())
    }

    /// Publish the `VolumeFailedDelete` Warning about `volume` with `note`.
    async fn failed_delete(&self, volume: &PersistentVolume, note: String) {
        let event = events::event(true, reason::VOLUME_FAILED_DELETE, "Delete", note);
        self.events.publish(volume, event).await;
    }

    /// [`decision::should_delete`] with this reclaimer's settings and the backend's guard.
    fn should_delete(&self, volume: &PersistentVolume) -> Result<(), Skip> {
        let guard = |v: &PersistentVolume| self.backend.should_delete(v);
        decision::should_delete(volume, &self.provisioner_name, self.add_finalizer, guard)
    }

    /// For a backend that reads the class at delete, `Some(class as read now)`
    /// (inner `None`: no class); `None` for others. Errors: the read failed.
    async fn class_for(
        &self,
        volume: &PersistentVolume,
    ) -> Result<Option<Option<StorageClass>>, DeleteError> {
        if !self.backend.reads_class_at_delete(volume) {
            return Ok(None);
        }
        let name = decision::class_name(volume);
        if name.is_empty() {
            return Ok(Some(None));
        }
        let pv = volume.name_any();
        let failed = |e| DeleteError::Failed {
            reason: format!("cannot read StorageClass {name:?} of PV {pv}: {e}"),
        };
        let classes = Api::<StorageClass>::all(self.api.clone().into_client());
        classes.get_opt(name).await.map(Some).map_err(failed)
    }

    fn deleted_assets(&self) -> std::sync::MutexGuard<'_, HashSet<String>> {
        self.deleted_assets
            .lock()
            .expect("deleted-assets set poisoned")
    }

    /// Whether the backend already deleted the asset of the PV with `uid`.
    pub fn asset_deleted(&self, uid: &str) -> bool {
        self.deleted_assets().contains(uid)
    }

    /// Keep only the remembered uids for which `alive` holds (their PVs still exist).
    pub fn retain_uids(&self, alive: impl Fn(&str) -> bool) {
        self.deleted_assets().retain(|u| alive(u));
    }
}
