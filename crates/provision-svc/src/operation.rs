//! The seed's claim operation: `provisionClaimOperation`,
//! `provisionVolumeErrorHandling`, `rescheduleProvisioning` and `syncClaim`,
//! executing the decisions of [`decision`] over reflector caches and the
//! ports traits; the seed's `claimsInProgress` is the intent's in-background
//! flag in Redis.
//! Where it differs from the seed (durable hand-off, intents, stalled queue
//! entries): docs/ARCHITECTURE.md, "provision-svc beyond the seed".

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use api_types::queue::{
    ClaimKey, ProvisionIntent, QueuedPvWrite, INTENT_VERSION, QUEUE_ENTRY_VERSION,
};
use api_types::{pv_name_for_claim_uid, ANN_SELECTED_NODE};
use common::kube::cache::{Compact, NameSet};
use common::kube::events::reason;
use common::kube::retry::FailureThreshold;
use common::kube::time::now_ms;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::runtime::reflector::{ObjectRef, Store};
use provisioner_api::ProvisioningState::{self, Finished, InBackground, NoChange, Reschedule};
use provisioner_api::{deadline, ProvisionError, ProvisionOptions, Provisioner};

use crate::decision::{self, ClassNotFound, ProvisionerNames};
use crate::locks::ClaimLocks;
use crate::metrics::{InFlight, ServiceMetrics};
use crate::ports::{self, ClusterApi, Effect, IntentLog, PvHandoff, QueuedState};

/// Why a provision operation did not produce a queued PV.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OpError {
    /// Seed `errStopProvision`: provisioning is impossible or already done; do
    /// not retry.
    #[error("stop provisioning")]
    Stop,
    /// A failure to retry (with backoff, up to the failure threshold).
    #[error("{0}")]
    Failed(String),
    /// The backend made the volume but handing the PV to pv-writer failed:
    /// retried like [`OpError::Failed`], and the intent is kept.
    #[error("{0}")]
    NotQueued(String),
}

/// How one provision attempt ended: the seed's `ProvisioningState` and error.
pub type Attempt = (ProvisioningState, Result<(), OpError>);

/// The attempt's end when provisioning is impossible or already done (seed
/// `errStopProvision`).
const STOP: Attempt = (Finished, Err(OpError::Stop));

/// A failed attempt in `state`, to be retried.
fn failed(state: ProvisioningState, msg: String) -> Attempt {
    (state, Err(OpError::Failed(msg)))
}

/// The intent recorded for `claim` (identity `key`): its PV name, class name,
/// the StorageClass when known and the selected node, stamped now.
fn intent_of(
    claim: &PersistentVolumeClaim,
    key: ClaimKey,
    class: Option<&StorageClass>,
) -> ProvisionIntent {
    ProvisionIntent {
        version: INTENT_VERSION,
        pv_name: pv_name_for_claim_uid(&key.uid),
        claim: key,
        class: decision::claim_class(claim),
        recorded_at_ms: now_ms(),
        storage_class: class.cloned(),
        selected_node: decision::selected_node(claim).map(str::to_string),
    }
}

/// Settings of the claim logic (from the flags).
#[derive(Debug, Clone)]
pub struct Settings {
    /// Our provisioner name and the additional ones.
    pub names: ProvisionerNames,
    /// Add the provisioner's PV finalizer to provisioned PVs (`--add-finalizer`).
    pub add_finalizer: bool,
    /// Failed attempts per claim before giving up (`--failed-provision-threshold`).
    pub failure_threshold: FailureThreshold,
    /// Bound on one claim's sync (`--provision-timeout`); `None` = unbounded.
    pub provision_timeout: Option<Duration>,
}

/// A claim as the claims cache holds it: its identity typed, the rest as
/// compact JSON ([`Compact`]), decoded when worked on.
pub type CachedClaim = Compact<PersistentVolumeClaim>;

/// The reflector caches the claim logic reads.
#[derive(Clone)]
pub struct Caches {
    /// Claims, all namespaces, compact ([`CachedClaim`]).
    pub claims: Store<CachedClaim>,
    /// StorageClasses.
    pub classes: Store<StorageClass>,
    /// The names of all PVs, from a metadata-only watch (the claim logic
    /// only asks whether `pvc-<uid>` exists).
    pub volumes: NameSet,
}

/// The side effects the operation works through.
#[derive(Clone)]
pub struct Ports {
    /// The storage backend.
    pub backend: Arc<dyn Provisioner>,
    /// Kubernetes calls (node and live PV lookups, reschedule, events).
    pub cluster: Arc<dyn ClusterApi>,
    /// The durable PV hand-off to pv-writer.
    pub handoff: Arc<dyn PvHandoff>,
    /// The durable provisioning intents.
    pub intents: Arc<dyn IntentLog>,
}

/// The claim operation: one per leader term, shared by all workers.
pub struct Operation {
    /// Settings from the flags.
    pub settings: Settings,
    /// The reflector caches it reads.
    pub caches: Caches,
    /// Backend, Kubernetes, hand-off and intents.
    pub ports: Ports,
    /// The service's metrics.
    pub metrics: ServiceMetrics,
    /// One sync or cleanup at a time per claim uid.
    pub locks: ClaimLocks,
    /// uid → this term's first provision attempt (ms since the Unix epoch),
    /// carried in the queue entry for pv-writer's provision duration.
    first_attempts: Mutex<HashMap<String, u64>>,
}

impl Operation {
    /// An operation over `caches` and `ports`.
    pub fn new(settings: Settings, caches: Caches, ports: Ports, metrics: ServiceMetrics) -> Self {
        Self {
            settings,
            caches,
            ports,
            metrics,
            locks: ClaimLocks::default(),
            first_attempts: Mutex::default(),
        }
    }

    fn first_attempts(&self) -> MutexGuard<'_, HashMap<String, u64>> {
        self.first_attempts.lock().expect("first attempts poisoned")
    }

    /// When the claim `uid`'s first provision attempt began (recorded now if
    /// this is the first), in milliseconds since the Unix epoch.
    pub fn first_attempt_ms(&self, uid: &str) -> u64 {
        let mut attempts = self.first_attempts();
        *attempts.entry(uid.into()).or_insert_with(now_ms)
    }

    /// The claim `uid` is done (provisioned, stopped, gone or given up on).
    pub fn forget_first_attempt(&self, uid: &str) {
        self.first_attempts().remove(uid);
    }

    fn class(&self, name: &str) -> Result<Arc<StorageClass>, ClassNotFound> {
        let class = self.caches.classes.get(&ObjectRef::new(name));
        class.ok_or_else(|| ClassNotFound(name.to_string()))
    }

    /// Seed `shouldProvision` ([`decision::should_provision`]) over the backend's
    /// qualifier and the class cache. Errors: our claim's class is not cached.
    pub fn should_provision(&self, claim: &PersistentVolumeClaim) -> Result<bool, ClassNotFound> {
        let backend_accepts = |c: &_| self.ports.backend.should_provision(c);
        let class = |name: &str| self.class(name).ok();
        decision::should_provision(claim, &self.settings.names, backend_accepts, class)
    }

    /// Seed `provisionClaimOperation`: provision a volume for `claim` and queue
    /// its PV. `Ok` only when the PV was queued (state `Finished`).
    pub async fn provision_claim_operation(&self, claim: &PersistentVolumeClaim) -> Attempt {
        tracing::info!("provision operation started");
        match self.provision(claim).await {
            Ok(()) => (Finished, Ok(())),
            Err(attempt) => attempt,
        }
    }

    /// The seed's checks in its order (identity, PV already there or queued, Block
    /// support, the class and its provisioner, the selected node), then the intent, the
    /// backend and the hand-off to pv-writer. `Err` is the attempt's end.
    async fn provision(&self, claim: &PersistentVolumeClaim) -> Result<(), Attempt> {
        let cluster = &self.ports.cluster;
        let key = ClaimKey::of(claim).ok_or_else(|| {
            let msg = "claim lacks a namespace, name or uid".to_string();
            failed(NoChange, msg)
        })?;
        let pv_name = pv_name_for_claim_uid(&key.uid);
        self.not_yet_made(claim, &pv_name, &key.uid).await?;
        if decision::is_block(claim) && !self.ports.backend.supports_block() {
            let name = &self.settings.names.name;
            let msg = format!("{name} does not support block volume provisioning");
            tracing::error!(pv = %pv_name, error = %msg, "failed to provision volume");
            cluster.claim_event(claim, true, reason::PROVISIONING_FAILED, msg);
            return Err(STOP);
        }
        // A missing class is retried: it can be (re)created independently of the claim.
        let class = self.class(&decision::claim_class(claim)).map_err(|e| {
            tracing::error!(error = %e, "error getting claim's StorageClass's fields");
            failed(Finished, e.to_string())
        })?;
        if !self.settings.names.is_known(&class.provisioner) {
            tracing::error!(provisioner = %class.provisioner, "unknown provisioner requested in claim's StorageClass");
            return Err(STOP);
        }
        let selected_node = self.selected_node(claim).await?;
        let intent = intent_of(claim, key.clone(), Some(&class));
        if let Err(e) = self.ports.intents.record(&intent, claim, None).await {
            let msg = format!("recording the provisioning intent of {pv_name:?}: {e}");
            return Err(failed(NoChange, msg));
        }
        let options = ProvisionOptions {
            storage_class: class.as_ref().clone(),
            pv_name: pv_name.clone(),
            pvc: claim.clone(),
            selected_node,
        };
        let claim_key = decision::claim_key(claim);
        let note = format!("External provisioner is provisioning volume for claim {claim_key:?}");
        cluster.claim_event(claim, false, reason::PROVISIONING, note);

        let volume = self.call_backend(&options, &intent.class).await?;
        tracing::info!(pv = %pv_name, "volume provisioned; queueing the PV for pv-writer");
        let finalizer = self.settings.add_finalizer;
        let pv = decision::complete_pv(volume, claim, &intent.class, &class.provisioner, finalizer);
        // The enqueue script also clears the intent.
        let entry = QueuedPvWrite {
            version: QUEUE_ENTRY_VERSION,
            pv,
            first_attempt_at_ms: Some(self.first_attempt_ms(&key.uid)),
            claim: key,
            class: intent.class,
            enqueued_at_ms: now_ms(),
            mac: None,
        };
        self.ports.handoff.enqueue(&entry).await.map_err(|e| {
            let msg = format!("queueing PV {pv_name:?} for pv-writer: {e}");
            (Finished, Err(OpError::NotQueued(msg)))
        })
    }

    /// The backend's `Provision` of `options` (a claim of class `class`), its failure handled
    /// as the seed's. A backend overrunning the deadline is abandoned: the attempt fails as
    /// `InBackground`, as a cancelled context does for the seed's provisioners.
    async fn call_backend(
        &self,
        options: &ProvisionOptions,
        class: &str,
    ) -> Result<PersistentVolume, Attempt> {
        let provisioned = deadline::bound(self.ports.backend.provision(options))
            .await
            .unwrap_or_else(|e| {
                Err(ProvisionError::Failed {
                    state: InBackground,
                    reason: e.to_string(),
                })
            });
        match provisioned {
            Ok(volume) => Ok(volume),
            Err(ProvisionError::Ignored { reason }) => {
                tracing::info!(pv = %options.pv_name, %reason, "volume provision ignored");
                Err(STOP)
            }
            Err(ProvisionError::Failed { state, reason }) => {
                let err =
                    format!("failed to provision volume with StorageClass {class:?}: {reason}");
                Err(self.error_handling(state, err, &options.pvc).await)
            }
        }
    }

    /// Stop when the PV `pv_name` exists or is queued ("queued?" is always asked
    /// of Redis); something queued that pv-writer will never write is a Warning
    /// naming the operator action and a retry, never a silent skip.
    async fn not_yet_made(
        &self,
        claim: &PersistentVolumeClaim,
        pv_name: &str,
        uid: &str,
    ) -> Result<(), Attempt> {
        if self.caches.volumes.contains(pv_name) {
            tracing::info!(pv = %pv_name, "PV already exists, skipping");
            return Err(STOP);
        }
        match self.ports.handoff.queued_state(pv_name, uid).await {
            Ok(QueuedState::No) => Ok(()),
            Ok(QueuedState::Yes) => {
                tracing::info!(pv = %pv_name, "PV already queued for pv-writer, skipping");
                Err(STOP)
            }
            Ok(QueuedState::Stalled { kind, reason }) => {
                let msg = format!(
                    "{reason}; the claim stays Pending until an operator acts: inspect it with `provisioner-ctl queue dead` / `provisioner-ctl queue list`; requeue it (`provisioner-ctl queue requeue {pv_name}`) if it is this claim's own entry, otherwise remove field {pv_name} from the queue's payloads and dead-letter hashes in Redis, and the claim is provisioned again"
                );
                tracing::warn!(pv = %pv_name, kind, error = %msg, "the claim's queued PV write will never be written");
                let stalled = &self.metrics.stalled_queue_entries;
                stalled.with_label_values(&[kind]).inc();
                Err(self.error_handling(Finished, msg, claim).await)
            }
            Err(e) => {
                let msg = format!("checking pv-writer's queue for {pv_name:?}: {e}");
                Err(failed(NoChange, msg))
            }
        }
    }

    /// The selected node's object, if the claim names one. A node that does
    /// not exist asks for rescheduling; a failed lookup is an event and a retry.
    async fn selected_node(&self, claim: &PersistentVolumeClaim) -> Result<Option<Node>, Attempt> {
        let Some(node_name) = decision::selected_node(claim) else {
            return Ok(None);
        };
        let (state, err) = match self.ports.cluster.get_node(node_name).await {
            Ok(Some(node)) => return Ok(Some(node)),
            Ok(None) => (Reschedule, format!("nodes {node_name:?} not found")),
            Err(e) => (NoChange, format!("failed to get target node: {e}")),
        };
        Err(self.error_handling(state, err, claim).await)
    }

    /// Seed `provisionVolumeErrorHandling`: a `ProvisioningFailed` Warning saying `err`, then
    /// `rescheduleProvisioning` (`Reschedule` with a selected node: the annotation is removed),
    /// or the failed attempt in `state` (`Reschedule` without one becomes `Finished`).
    async fn error_handling(
        &self,
        state: ProvisioningState,
        err: String,
        claim: &PersistentVolumeClaim,
    ) -> Attempt {
        let cluster = &self.ports.cluster;
        cluster.claim_event(claim, true, reason::PROVISIONING_FAILED, err.clone());
        if state != Reschedule {
            return failed(state, err);
        }
        if decision::annotation(claim, ANN_SELECTED_NODE).is_none() {
            return failed(Finished, err);
        }
        match cluster.remove_selected_node(claim).await {
            Ok(()) => {
                tracing::info!(operation = "provision", reason = %err, "volume rescheduled");
                STOP
            }
            Err(e) => {
                tracing::info!(operation = "provision", error = %e, "volume rescheduling failed");
                failed(Finished, err)
            }
        }
    }

    /// Seed `syncClaim`: decide, provision, count, and keep the in-background
    /// state. `Err` means the claim is to be retried (never [`OpError::Stop`]).
    pub async fn sync_claim(&self, claim: &PersistentVolumeClaim) -> Result<(), OpError> {
        let class = decision::metrics_class(claim);
        let should = self.should_provision(claim).map_err(|e| {
            self.metrics.provision.failed(&class);
            OpError::Failed(e.to_string())
        })?;
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let pv_name = pv_name_for_claim_uid(&uid);
        if !should {
            // Bound to the PV made for it: the PV is the record now, an intent left by a
            // Redis crash between an enqueue and a retry would never be cleared otherwise.
            let volume = claim.spec.as_ref().and_then(|s| s.volume_name.as_deref());
            if !uid.is_empty() && volume == Some(pv_name.as_str()) {
                self.clear_intent(&pv_name).await;
            }
            return Ok(());
        }
        self.first_attempt_ms(&uid);
        let start = Instant::now();
        let in_flight = InFlight::start(&self.metrics.in_flight);
        let (state, result) = self.provision_claim_operation(claim).await;
        drop(in_flight);
        let Err(e) = result else {
            // The enqueue script cleared the intent.
            let seconds = start.elapsed().as_secs_f64();
            self.metrics.provision.succeeded(&class, seconds);
            return Ok(());
        };
        self.metrics.provision.failed(&class);
        match (&e, state) {
            // The volume exists but its PV write is not queued: intent kept.
            (OpError::NotQueued(_), _) => self.flag_in_background(claim, false).await,
            (_, Finished) => self.clear_intent(&pv_name).await,
            (_, InBackground) => {
                tracing::info!("temporary error; claim is provisioning in background");
                self.flag_in_background(claim, true).await;
            }
            // NoChange: the recorded flag stays.
            _ => {}
        }
        match e {
            OpError::Stop => Ok(()),
            e => Err(e),
        }
    }

    /// Seed: giving up on a claim drops it from `claimsInProgress`; here its
    /// intent (kept for the start-up walk) loses the in-background flag.
    pub async fn give_up(&self, claim: &PersistentVolumeClaim) {
        let uid = claim.metadata.uid.as_deref().unwrap_or_default();
        self.forget_first_attempt(uid);
        let recorded = self.ports.intents.entry(&pv_name_for_claim_uid(uid)).await;
        if matches!(&recorded, Ok(Some(e)) if ports::is_in_background(e)) {
            self.flag_in_background(claim, false).await;
        }
    }

    /// Record `claim`'s intent with the given in-background flag; a Redis
    /// failure is logged (the intent is re-recorded at the next attempt).
    async fn flag_in_background(&self, claim: &PersistentVolumeClaim, in_background: bool) {
        let Some(key) = ClaimKey::of(claim) else {
            return;
        };
        let class = self.class(&decision::claim_class(claim)).ok();
        let intent = intent_of(claim, key, class.as_deref());
        let intents = &self.ports.intents;
        if let Err(e) = intents.record(&intent, claim, Some(in_background)).await {
            tracing::warn!(pv = %intent.pv_name, in_background, error = %e, "cannot record the in-background flag of the provisioning intent");
        }
    }

    /// Set `provision_svc_intents` and `provision_svc_claims_in_background`
    /// from the recorded intents. Errors: Redis.
    pub async fn refresh_intent_gauges(&self) -> Effect<()> {
        let (entries, stored) = self.ports.intents.list().await?;
        let in_background = entries
            .iter()
            .filter(|e| ports::is_in_background(e))
            .count();
        self.metrics.intents.set(stored as i64);
        self.metrics.claims_in_background.set(in_background as i64);
        Ok(())
    }

    /// Set the capacity gauges from the backend's pools (none when it limits none).
    pub async fn refresh_capacity_gauges(&self) {
        let pools = match self.ports.backend.capacity().await {
            None => return,
            Some(Ok(pools)) => pools,
            Some(Err(e)) => {
                tracing::warn!(error = %e, "cannot read the backend's capacity");
                return;
            }
        };
        for p in pools {
            let gauge = |g: &prometheus::IntGaugeVec, v: u64| {
                g.with_label_values(&[&p.pool])
                    .set(v.min(i64::MAX as u64) as i64)
            };
            let free = p.capacity.saturating_sub(p.allocated);
            gauge(&self.metrics.capacity, p.capacity);
            gauge(&self.metrics.capacity_free, free);
        }
    }

    /// Clear the intent of `pv_name`; failures are logged (a stale intent is re-checked by the next leader's start-up walk).
    pub async fn clear_intent(&self, pv_name: &str) {
        if let Err(e) = self.ports.intents.clear(pv_name).await {
            tracing::warn!(pv = pv_name, error = %e, "cannot clear the provisioning intent")
        }
    }

    /// [`sync_claim`](Self::sync_claim) under `--provision-timeout` ([`deadline::within`]); a
    /// sync stopped at the deadline is failed and kept in background.
    pub async fn sync(&self, claim: &PersistentVolumeClaim) -> Result<(), OpError> {
        let err =
            match deadline::within(self.settings.provision_timeout, self.sync_claim(claim)).await {
                Ok(result) => return result,
                Err(exceeded) => exceeded.to_string(),
            };
        let cluster = &self.ports.cluster;
        cluster.claim_event(claim, true, reason::PROVISIONING_FAILED, err.clone());
        let class = decision::metrics_class(claim);
        self.metrics.provision.failed(&class);
        self.flag_in_background(claim, true).await;
        Err(OpError::Failed(err))
    }
}
