//! One PV's reconciliation: the seed's `syncVolume` (finalizer handling, then
//! `shouldDelete`, then `deleteVolumeOperation` with delete metrics).

use std::collections::HashSet;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use api_types::FINALIZER_PV;
use common::kube::events::{self, reason, EventSink};
use common::runtime::health::LeaderTerm;
use common::runtime::metrics::DeleteMetrics;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, Preconditions};
use kube::ResourceExt;
use provisioner_api::deadline::{self, Deadline};
use provisioner_api::DeleteError;
use provisioner_api::Provisioner;

use crate::decision::{self, Skip};
use crate::finalizer::update_finalizers;

/// Why syncing a PV failed; every variant makes the work queue retry the PV.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// Adding or removing our finalizer failed (seed `handleProtectionFinalizer` error).
    #[error("failed to modify finalizers of PV {pv}: {source}")]
    Finalizer {
        /// PV name.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
    /// The backend's delete failed or refused; a `VolumeFailedDelete` event was published.
    #[error("deleting the volume of PV {pv} failed: {source}")]
    Backend {
        /// PV name.
        pv: String,
        /// The backend's error ([`DeleteError::Failed`] or [`DeleteError::Refused`]).
        source: DeleteError,
    },
    /// The asset is gone but deleting the PV object failed.
    #[error("failed to delete PV {pv}: {source}")]
    DeletePv {
        /// PV name.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
    /// The PV is deleted but removing our finalizer from it failed.
    #[error("failed to remove finalizer from deleted PV {pv}: {source}")]
    RemoveFinalizer {
        /// PV name.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
    /// Re-reading the PV right before the backend's delete failed.
    #[error("failed to re-read PV {pv} before deleting its volume: {source}")]
    Reread {
        /// PV name.
        pv: String,
        /// The API error.
        source: kube::Error,
    },
    /// This replica's leader term was not current right before the backend's
    /// delete (e.g. paused past its Lease); nothing was deleted.
    #[error("not deleting the volume of PV {pv}: {reason}")]
    NotLeader {
        /// PV name.
        pv: String,
        /// Why the term is not current.
        reason: String,
    },
    /// The sync (other than the backend call, which fails as
    /// [`SyncError::Backend`]) overran `--deletion-timeout` and was stopped.
    #[error("syncing PV {pv} timed out after {timeout:?} (context deadline exceeded)")]
    Timeout {
        /// PV name.
        pv: String,
        /// The configured `--deletion-timeout`.
        timeout: std::time::Duration,
    },
}

/// Where events go: the real [`EventSink`] in the service, a recorder in tests.
#[async_trait::async_trait]
pub trait EventPublisher: Send + Sync {
    /// Publish a Warning event with `reason` and `note` about `volume`.
    async fn warn(&self, volume: &PersistentVolume, reason: &str, note: String);
}

#[async_trait::async_trait]
impl EventPublisher for EventSink {
    async fn warn(&self, volume: &PersistentVolume, reason: &str, note: String) {
        self.publish(&events::reference(volume), true, reason, "Delete", note)
            .await;
    }
}

/// Reconciles PVs of one provisioner: keeps the finalizer in line and deletes
/// released volumes. Cheap to share (`Arc`) between workers; the work queue
/// guarantees one PV is never synced by two workers at once.
pub struct Reclaimer {
    api: Api<PersistentVolume>,
    classes: Api<StorageClass>,
    term: LeaderTerm,
    backend: Arc<dyn Provisioner>,
    events: Arc<dyn EventPublisher>,
    metrics: DeleteMetrics,
    provisioner_name: String,
    add_finalizer: bool,
    /// uids of PVs whose asset the backend deleted successfully; kept until the
    /// PV is gone so a second delivery never calls the backend's delete again.
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
            classes: Api::all(api.clone().into_client()),
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

    /// The provisioner name this reclaimer acts for.
    pub fn provisioner_name(&self) -> &str {
        &self.provisioner_name
    }

    /// Seed `syncVolume`: bring our finalizer in line ([`decision::finalizer_update`]),
    /// then, if [`decision::should_delete`] says so, run the delete operation and
    /// record the seed's delete metrics (`class` = `spec.storageClassName`;
    /// failures count in `..._failed_total`; duration and total only on success —
    /// including an `Ignored` backend answer, as in the seed).
    ///
    /// Errors: [`SyncError`]; the caller retries the PV with backoff.
    pub async fn sync_volume(&self, volume: &PersistentVolume) -> Result<(), SyncError> {
        let name = volume.name_any();
        let provisioner = self.provisioner_name.as_str();
        let add = self.add_finalizer;
        let volume = match update_finalizers(&self.api, volume, |v| {
            decision::finalizer_update(v, provisioner, add)
        })
        .await
        {
            Ok(Some(v)) => v,
            Ok(None) => {
                tracing::debug!(pv = %name, "PV disappeared while updating its finalizers");
                return Ok(());
            }
            Err(source) => return Err(SyncError::Finalizer { pv: name, source }),
        };

        match decision::should_delete(&volume, provisioner, add, |v| self.backend.should_delete(v))
        {
            Ok(()) => {}
            Err(skip) => {
                if skip != Skip::NotReleased && skip != Skip::NotOurs {
                    tracing::debug!(pv = %name, ?skip, "PV not deleted");
                }
                return Ok(());
            }
        }

        let class = decision::storage_class(&volume).to_string();
        let start = Instant::now();
        let result = self.delete_volume_operation(&volume).await;
        match &result {
            Ok(()) => {
                self.metrics
                    .duration_seconds
                    .with_label_values(&[&class])
                    .observe(start.elapsed().as_secs_f64());
                self.metrics.total.with_label_values(&[&class]).inc();
            }
            // Not a failed delete: this replica no longer leads.
            Err(SyncError::NotLeader { .. }) => {}
            Err(_) => self.metrics.failed_total.with_label_values(&[&class]).inc(),
        }
        result
    }

    /// [`sync_volume`](Self::sync_volume) under `--deletion-timeout`, as the
    /// seed's `context.WithTimeout`: the backend's delete sees `deadline`
    /// (see [`provisioner_api::deadline`]) and, if it overruns it, is abandoned and
    /// fails like any backend error (`VolumeFailedDelete` event, failure
    /// metric, retry). Should anything else of the sync (an API call) still
    /// hang [`deadline::ABANDON_GRACE`] after that, it is stopped and counted
    /// here the same way.
    ///
    /// Errors: as [`sync_volume`](Self::sync_volume), plus [`SyncError::Timeout`].
    pub async fn sync_volume_within(
        &self,
        volume: &PersistentVolume,
        deadline: Deadline,
    ) -> Result<(), SyncError> {
        let hard_stop = deadline.at() + 2 * deadline::ABANDON_GRACE;
        let sync = deadline::scope(Some(deadline), self.sync_volume(volume));
        match tokio::time::timeout_at(hard_stop, sync).await {
            Ok(result) => result,
            Err(_) => {
                let err = SyncError::Timeout {
                    pv: volume.name_any(),
                    timeout: deadline.timeout(),
                };
                tracing::error!(pv = %volume.name_any(), error = %err, "delete: timed out");
                self.events
                    .warn(volume, reason::VOLUME_FAILED_DELETE, err.to_string())
                    .await;
                self.metrics
                    .failed_total
                    .with_label_values(&[decision::storage_class(volume)])
                    .inc();
                Err(err)
            }
        }
    }

    /// Seed `deleteVolumeOperation`: the backend's delete (`Ignored` → done,
    /// nothing else happens; `Failed`/`Refused` → `VolumeFailedDelete` Warning
    /// event on the PV and an error), then delete the PV object (uid
    /// precondition, so a re-created PV of the same name is never hit; 404 is
    /// success), then remove our finalizer from the freshest copy — the one the
    /// delete call returns — with a conflict-safe patch (404 is success).
    ///
    /// Beyond the seed: after the backend's delete succeeded for a PV uid, a
    /// second delivery of that PV (e.g. after the PV delete failed) skips the
    /// backend and goes straight to deleting the PV. Right before the
    /// backend's delete the PV is read again (quorum GET) and the delete goes
    /// ahead only if it is the same object, bound to the same claim, and
    /// still to be deleted (else `Ok`, nothing done), the StorageClass is read
    /// for a backend that needs it, and the leader term must be current
    /// ([`SyncError::NotLeader`] otherwise).
    pub async fn delete_volume_operation(
        &self,
        volume: &PersistentVolume,
    ) -> Result<(), SyncError> {
        let name = volume.name_any();
        let uid = volume.metadata.uid.clone().unwrap_or_default();
        tracing::info!(pv = %name, "delete: started");

        let already_deleted = !uid.is_empty() && self.asset_deleted(&uid);
        if already_deleted {
            tracing::info!(pv = %name, %uid, "delete: volume already deleted by the backend; deleting the PV");
        } else {
            // Decide again on the PV as the API server holds it now (a quorum
            // read): the cache, or a leader paused since it decided, may be stale.
            let Some(fresh) = self.reread_for_delete(volume).await? else {
                return Ok(());
            };
            let deleted = match self.class_for(&fresh).await {
                Err(err) => Err(err),
                Ok(class) => {
                    if let Err(reason) = self.term.check() {
                        tracing::warn!(pv = %name, %reason, "delete: leader term not current; volume not deleted");
                        return Err(SyncError::NotLeader { pv: name, reason });
                    }
                    // The backend sees the sync's deadline; one that overruns it is
                    // abandoned and fails like a backend error (seed: the context
                    // cancellation reaches `Delete`, which returns an error).
                    let call = async {
                        match class {
                            Some(class) => {
                                self.backend.delete_with_class(&fresh, class.as_ref()).await
                            }
                            None => self.backend.delete(&fresh).await,
                        }
                    };
                    deadline::bound(call).await.unwrap_or_else(|e| {
                        Err(DeleteError::Failed {
                            reason: e.to_string(),
                        })
                    })
                }
            };
            match deleted {
                Ok(()) => {
                    tracing::info!(pv = %name, "delete: volume deleted");
                    if !uid.is_empty() {
                        self.deleted_assets
                            .lock()
                            .expect("deleted-assets set poisoned")
                            .insert(uid.clone());
                    }
                }
                Err(DeleteError::Ignored { reason }) => {
                    tracing::info!(pv = %name, %reason, "delete: volume deletion ignored");
                    return Ok(());
                }
                Err(err) => {
                    tracing::error!(pv = %name, error = %err, "delete: volume deletion failed");
                    self.events
                        .warn(volume, reason::VOLUME_FAILED_DELETE, err.to_string())
                        .await;
                    return Err(SyncError::Backend {
                        pv: name,
                        source: err,
                    });
                }
            }
        }

        let params = DeleteParams {
            preconditions: (!uid.is_empty()).then(|| Preconditions {
                uid: Some(uid.clone()),
                resource_version: None,
            }),
            ..Default::default()
        };
        let remaining = match self.api.delete(&name, &params).await {
            Ok(either) => either.left(),
            Err(kube::Error::Api(status)) if status.is_not_found() => None,
            Err(kube::Error::Api(status)) if status.is_conflict() => {
                // uid precondition failed: the PV we saw is gone and another
                // object now has its name. Never touch that one.
                tracing::warn!(pv = %name, %uid, "delete: PV was replaced by a new object of the same name; leaving it");
                None
            }
            Err(source) => {
                tracing::info!(pv = %name, error = %source, "delete: failed to delete PV");
                return Err(SyncError::DeletePv { pv: name, source });
            }
        };

        if let Some(fresh) = remaining {
            if decision::has_finalizer(&fresh, FINALIZER_PV) {
                let result = update_finalizers(&self.api, &fresh, |v| {
                    let (list, modified) = decision::remove_finalizer(
                        v.metadata.finalizers.as_deref().unwrap_or(&[]),
                        FINALIZER_PV,
                    );
                    // Only the PV we deleted: a same-named successor is left alone.
                    (modified && v.metadata.uid.as_deref() == Some(uid.as_str())).then_some(list)
                })
                .await;
                if let Err(source) = result {
                    tracing::info!(pv = %name, error = %source, "delete: failed to remove finalizer");
                    return Err(SyncError::RemoveFinalizer { pv: name, source });
                }
            }
        }
        tracing::info!(pv = %name, "delete: succeeded");
        Ok(())
    }

    /// `volume` as the API server holds it now, if it should still be
    /// deleted: the same object (uid), bound to the same claim, and
    /// [`decision::should_delete`] still true; `None` (logged) otherwise.
    ///
    /// Errors: [`SyncError::Reread`].
    async fn reread_for_delete(
        &self,
        volume: &PersistentVolume,
    ) -> Result<Option<PersistentVolume>, SyncError> {
        let name = volume.name_any();
        let fresh = match self.api.get_opt(&name).await {
            Ok(Some(pv)) if pv.metadata.uid == volume.metadata.uid => pv,
            Ok(_) => {
                tracing::info!(pv = %name, "delete: PV gone or replaced since the decision; volume not deleted");
                return Ok(None);
            }
            Err(source) => return Err(SyncError::Reread { pv: name, source }),
        };
        let claim_uid = |pv: &PersistentVolume| pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone();
        if claim_uid(&fresh) != claim_uid(volume) {
            tracing::info!(pv = %name, "delete: PV bound to another claim since the decision; volume not deleted");
            return Ok(None);
        }
        if let Err(skip) =
            decision::should_delete(&fresh, &self.provisioner_name, self.add_finalizer, |v| {
                self.backend.should_delete(v)
            })
        {
            tracing::info!(pv = %name, ?skip, "delete: PV changed since the decision; volume not deleted");
            return Ok(None);
        }
        Ok(Some(fresh))
    }

    /// For a backend that [reads the class at delete](Provisioner::reads_class_at_delete):
    /// `Some(class)` as the API server holds it now (`None` inside: the PV
    /// names no class, or it does not exist). `None` for other backends.
    ///
    /// Errors: the class cannot be read, as a [`DeleteError::Failed`].
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
        self.classes
            .get_opt(name)
            .await
            .map(Some)
            .map_err(|e| DeleteError::Failed {
                reason: format!(
                    "cannot read StorageClass {name:?} of PV {}: {e}",
                    volume.name_any()
                ),
            })
    }

    /// Whether the backend already deleted the asset of the PV with `uid`.
    pub fn asset_deleted(&self, uid: &str) -> bool {
        self.deleted_assets
            .lock()
            .expect("deleted-assets set poisoned")
            .contains(uid)
    }

    /// Forget `uid` (its PV is gone from the API server).
    pub fn forget_uid(&self, uid: &str) {
        self.deleted_assets
            .lock()
            .expect("deleted-assets set poisoned")
            .remove(uid);
    }

    /// Keep only the remembered uids for which `alive` holds (after a re-list,
    /// PVs deleted while the watch was down produce no delete event).
    pub fn retain_uids(&self, alive: impl Fn(&str) -> bool) {
        self.deleted_assets
            .lock()
            .expect("deleted-assets set poisoned")
            .retain(|u| alive(u));
    }
}
