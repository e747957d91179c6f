//! [`FakeProvisioner`]: the one scriptable fake backend of the services'
//! tests (feature `testing`, enabled by the services' dev-dependencies), so
//! every test double of the [`Provisioner`] contract behaves the same way and
//! follows the trait when it grows.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::{
    deadline, DeleteError, OrphanOutcome, ProvisionError, ProvisionOptions, Provisioner,
    ProvisioningState, VolumeError,
};

/// A backend whose answers are scripted by its public fields and which records
/// every call. `FakeProvisioner::default()` provisions every claim (a PV with
/// only its name), deletes everything, cannot list or archive its volumes and
/// refuses to validate queued PVs.
#[derive(Debug, Default)]
pub struct FakeProvisioner {
    /// Answers of [`Provisioner::provision`], taken in order; once empty, a PV
    /// named `options.pv_name` with no spec.
    pub results: Mutex<Vec<Result<PersistentVolume, ProvisionError>>>,
    /// `provision` calls, as `"<pv name> node=<selected node or empty>"`.
    pub calls: Mutex<Vec<String>>,
    /// [`Provisioner::should_provision`] declines every claim (seed `Qualifier`).
    pub decline: bool,
    /// `provision` and `delete` sleep this long before answering.
    pub delay: Option<Duration>,
    /// `provision` waits for the operation's deadline
    /// ([`deadline::cancelled`]) and fails with this state, as a backend that
    /// honours the seed's context cancellation; it panics when called without
    /// a deadline.
    pub cooperative: Option<ProvisioningState>,
    /// `delete` waits for the operation's deadline and fails with
    /// "delete cancelled at the deadline".
    pub cooperative_delete: bool,
    /// Timeout of the deadline the last `provision` or `delete` call saw
    /// ([`deadline::current`]), `None` if it saw none.
    pub saw_deadline: Mutex<Option<Duration>>,
    /// Answer of every `delete` (`None`: success).
    pub delete_error: Option<DeleteError>,
    /// Names of the PVs passed to `delete`.
    pub deleted: Mutex<Vec<String>>,
    /// `delete_unprovisioned` calls, as `"<pv name> node=<node> class=<class>"`.
    pub unprovisioned: Mutex<Vec<String>>,
    /// PV names whose `delete_unprovisioned` is refused (`DeleteError::Refused`).
    pub refuse: HashSet<String>,
    /// PV names whose `delete_unprovisioned` fails (`DeleteError::Failed`).
    pub fail: HashSet<String>,
    /// Answer of [`Provisioner::list_volumes`] (`None`: cannot list).
    pub volumes: Option<Vec<String>>,
    /// Answers of `list_volumes` taken in order before `volumes` (a listing that changes
    /// between two calls).
    pub volume_listings: Mutex<Vec<Vec<String>>>,
    /// Whether [`Provisioner::archive_orphan`] is supported; when it is, a name
    /// in `archive_outcomes` gets that outcome, any other is archived to
    /// `/base/archived-<name>`.
    pub can_archive: bool,
    /// Scripted `archive_orphan` outcomes by PV name.
    pub archive_outcomes: HashMap<String, OrphanOutcome>,
    /// `archive_orphan` calls: PV name and minimum age.
    pub archived: Mutex<Vec<(String, Duration)>>,
    /// [`Provisioner::reads_class_at_delete`] answers true for every PV.
    pub reads_class: bool,
    /// `delete_with_class` calls: PV name and the class's name (`None`: no class).
    pub deleted_with_class: Mutex<Vec<(String, Option<String>)>>,
    /// [`Provisioner::volumes_in_use`]: PV name → the listed volume it uses
    /// (besides its own name).
    pub uses: BTreeMap<String, String>,
}

impl FakeProvisioner {
    /// A fake whose `provision` answers `results` in order.
    pub fn answering(results: Vec<Result<PersistentVolume, ProvisionError>>) -> Self {
        Self {
            results: Mutex::new(results),
            ..Default::default()
        }
    }

    /// A fake whose every `delete` answers `answer`.
    pub fn deleting(answer: Result<(), DeleteError>) -> Self {
        Self {
            delete_error: answer.err(),
            ..Default::default()
        }
    }

    /// The `provision` calls so far (see [`FakeProvisioner::calls`] field).
    pub fn calls(&self) -> Vec<String> {
        self.calls.lock().unwrap().clone()
    }

    /// The PV names passed to `delete` so far.
    pub fn deleted(&self) -> Vec<String> {
        self.deleted.lock().unwrap().clone()
    }

    /// The `archive_orphan` calls so far.
    pub fn archived(&self) -> Vec<(String, Duration)> {
        self.archived.lock().unwrap().clone()
    }

    fn record_deadline(&self) {
        *self.saw_deadline.lock().unwrap() = deadline::current().map(|d| d.timeout);
    }
}

fn node_of(options: &ProvisionOptions) -> String {
    options
        .selected_node
        .as_ref()
        .and_then(|n| n.metadata.name.clone())
        .unwrap_or_default()
}

#[async_trait]
impl Provisioner for FakeProvisioner {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        self.calls
            .lock()
            .unwrap()
            .push(format!("{} node={}", options.pv_name, node_of(options)));
        self.record_deadline();
        if let Some(state) = self.cooperative {
            assert!(
                deadline::current().is_some(),
                "the backend sees the deadline"
            );
            deadline::cancelled().await;
            return Err(ProvisionError::Failed {
                state,
                reason: "stopped at the deadline".into(),
            });
        }
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        let mut results = self.results.lock().unwrap();
        if results.is_empty() {
            Ok(PersistentVolume {
                metadata: ObjectMeta {
                    name: Some(options.pv_name.clone()),
                    ..Default::default()
                },
                ..Default::default()
            })
        } else {
            results.remove(0)
        }
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        self.deleted
            .lock()
            .unwrap()
            .push(volume.metadata.name.clone().unwrap_or_default());
        self.record_deadline();
        if self.cooperative_delete {
            deadline::cancelled().await;
            return Err(DeleteError::Failed {
                reason: "delete cancelled at the deadline".into(),
            });
        }
        if let Some(d) = self.delay {
            tokio::time::sleep(d).await;
        }
        match &self.delete_error {
            Some(e) => Err(e.clone()),
            None => Ok(()),
        }
    }

    fn reads_class_at_delete(&self, _volume: &PersistentVolume) -> bool {
        self.reads_class
    }

    async fn delete_with_class(
        &self,
        volume: &PersistentVolume,
        class: Option<&StorageClass>,
    ) -> Result<(), DeleteError> {
        self.deleted_with_class.lock().unwrap().push((
            volume.metadata.name.clone().unwrap_or_default(),
            class.and_then(|c| c.metadata.name.clone()),
        ));
        self.delete(volume).await
    }

    async fn volumes_in_use(
        &self,
        pvs: &[PersistentVolume],
    ) -> Result<HashSet<String>, VolumeError> {
        let names = pvs.iter().filter_map(|pv| pv.metadata.name.clone());
        Ok(names
            .flat_map(|n| [self.uses.get(&n).cloned(), Some(n)])
            .flatten()
            .collect())
    }

    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        self.unprovisioned.lock().unwrap().push(format!(
            "{} node={} class={}",
            options.pv_name,
            node_of(options),
            options
                .storage_class
                .metadata
                .name
                .clone()
                .unwrap_or_default()
        ));
        if self.refuse.contains(&options.pv_name) {
            return Err(DeleteError::Refused {
                reason: "unsafe".into(),
            });
        }
        if self.fail.contains(&options.pv_name) {
            return Err(DeleteError::Failed {
                reason: "busy".into(),
            });
        }
        Ok(())
    }

    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), VolumeError> {
        Err(VolumeError::NotOurs(format!(
            "the fake backend validates no PV ({:?})",
            pv.metadata.name
        )))
    }

    fn should_provision(&self, _claim: &PersistentVolumeClaim) -> bool {
        !self.decline
    }

    async fn list_volumes(&self) -> Option<Result<Vec<String>, VolumeError>> {
        let mut listings = self.volume_listings.lock().unwrap();
        if !listings.is_empty() {
            return Some(Ok(listings.remove(0)));
        }
        self.volumes.clone().map(Ok)
    }

    async fn archive_orphan(
        &self,
        pv_name: &str,
        min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        if !self.can_archive {
            return None;
        }
        self.archived
            .lock()
            .unwrap()
            .push((pv_name.to_string(), min_age));
        Some(Ok(self
            .archive_outcomes
            .get(pv_name)
            .cloned()
            .unwrap_or_else(|| {
                OrphanOutcome::Archived(format!("/base/archived-{pv_name}").into())
            })))
    }
}
