//! Cleanup after claims that are gone (deleted, or absent from a (re)list):
//! the walk over the recorded intents at every claims (re)list, and one
//! cleanup per gone claim. A gone claim's volume is kept while its PV write is
//! pending or a PV (live) carries it, and otherwise deleted through the backend's
//! `delete_unprovisioned`, described by its intent, else its queued write, else (the
//! write dropped by pv-writer) the claim's last state: ours, never bound, a `Delete`
//! class, no PV using the volume. Lookup errors keep the intent; poisoned intents are
//! counted and left for an operator. Rationale: docs/ARCHITECTURE.md, "Gone claims".

use std::collections::HashSet;

use api_types::pv_name_for_claim_uid;
use api_types::queue::ClaimKey;
use common::handoff::intents::IntentEntry;
use common::kube::retry::Backoff;
use k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use provisioner_api::{DeleteError, ProvisionOptions};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;

use crate::decision;
use crate::operation::Operation;
use crate::ports::Effect;

/// How many cleanup attempts run at once.
pub const CLEANUP_CONCURRENCY: usize = 8;

/// The uids of claims with an intent but not in the claims cache; a term's
/// first walk (`count_unreadable`) counts unreadable intents as poisoned.
/// Errors: the intents cannot be listed.
pub async fn walk(op: &Operation, count_unreadable: bool) -> Effect<Vec<String>> {
    let (entries, stored) = op.ports.intents.list().await?;
    let unreadable = stored.saturating_sub(entries.len());
    if unreadable > 0 && count_unreadable {
        op.metrics.poisoned_intents.inc_by(unreadable as u64);
        tracing::error!(
            unreadable,
            "provisioning intents in Redis cannot be read; kept for an operator"
        );
    }
    let state = op.caches.claims.state();
    let cached: HashSet<_> = state.iter().filter_map(|c| c.meta().uid.clone()).collect();
    let mut gone: Vec<_> = entries.into_iter().map(|e| e.intent.claim.uid).collect();
    gone.retain(|uid| !cached.contains(uid));
    tracing::info!(
        intents = stored,
        gone = gone.len(),
        "walked the provisioning intents"
    );
    Ok(gone)
}

/// Clean up after the claim `uid` (`deleted`: a Delete event's last state) under its lock: with
/// no intent [`cleanup_unwritten_volume`], else [`cleanup_gone_claim`] under `policy`, a `limit`
/// permit per attempt. True when the intent or `deleted` decided (a later Delete is not needed).
pub async fn claim_gone(
    op: &Operation,
    uid: &str,
    deleted: Option<&PersistentVolumeClaim>,
    limit: &Semaphore,
    policy: Backoff,
    shutdown: &CancellationToken,
) -> bool {
    let _claim = op.locks.lock(uid).await;
    if op
        .caches
        .claims
        .find(|c| c.meta().uid.as_deref() == Some(uid))
        .is_some()
    {
        return false;
    }
    let pv_name = pv_name_for_claim_uid(uid);
    let entry = match op.ports.intents.entry(&pv_name).await {
        Ok(Some(entry)) => entry,
        Ok(None) => {
            let _permit = tokio::select! {
                _ = shutdown.cancelled() => return false,
                p = limit.acquire() => p.expect("semaphore never closed"),
            };
            return cleanup_unwritten_volume(op, uid, deleted).await;
        }
        Err(e) => {
            tracing::warn!(pv = %pv_name, claim_uid = uid, error = %e, left_to = "the next walk", "cannot read a gone claim's provisioning intent");
            return false;
        }
    };
    // Ok(None): done (or shut down while waiting for a permit); Ok(Some):
    // poisoned, not retried; Err: retried under `policy`.
    let attempt = || async {
        let _permit = tokio::select! {
            _ = shutdown.cancelled() => return Ok(None),
            p = limit.acquire() => p.expect("semaphore never closed"),
        };
        match cleanup_gone_claim(op, &entry).await {
            CleanupOutcome::Done => Ok(None),
            CleanupOutcome::Poisoned(e) => Ok(Some(e)),
            CleanupOutcome::Retry(e) => Err(e),
        }
    };
    let claim = &entry.intent.claim;
    let outcome = policy
        .retry(shutdown, attempt, |e, _, delay| {
            tracing::warn!(pv = %pv_name, %claim, claim_uid = %claim.uid, error = %e, ?delay, "cleaning up a deleted claim's volume failed");
        })
        .await;
    if let Some(Some(reason)) = outcome {
        op.metrics.poisoned_intents.inc();
        tracing::error!(pv = %pv_name, %claim, %reason, kept_for = "an operator, until the next walk", "cannot clean up a deleted claim's volume");
    }
    true
}

/// Whether a queued PV write or a PV (live GET) carries `pv_name`'s volume,
/// checked in that order. Errors: a lookup failed (keep the intent).
async fn pv_accounted_for(op: &Operation, pv_name: &str) -> Effect<bool> {
    Ok(op.ports.handoff.is_pending(pv_name).await? || op.ports.cluster.pv_exists(pv_name).await?)
}

/// Outcome of one cleanup attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupOutcome {
    /// The volume was deleted (or never made, or is carried by a PV) and the
    /// intent cleared.
    Done,
    /// Try again later (lookup or backend failure); intent and volume kept.
    Retry(String),
    /// Cannot be done from the record (see module docs): reported, intent kept
    /// for an operator, not retried in this leader term.
    Poisoned(String),
}

/// An intent without a StorageClass whose class of that name is gone too.
#[derive(Debug, thiserror::Error)]
#[error("the intent (version {version}) records no StorageClass and StorageClass {class:?} no longer exists; cannot tell the backend how the volume was made")]
struct NoClassRecorded {
    version: u32,
    class: String,
}

/// The options `provision` was called with, from the intent: its StorageClass
/// (v1 records: the cached one of that name), claim snapshot (or identity) and
/// selected node. Errors: no StorageClass is recorded nor cached.
fn options_from_intent(
    op: &Operation,
    entry: &IntentEntry,
) -> Result<ProvisionOptions, NoClassRecorded> {
    let intent = &entry.intent;
    let cached = || op.caches.classes.get(&ObjectRef::new(&intent.class));
    let storage_class = intent
        .storage_class
        .clone()
        .or_else(|| cached().map(|c| c.as_ref().clone()))
        .ok_or_else(|| NoClassRecorded {
            version: intent.version,
            class: intent.class.clone(),
        })?;
    let pvc = entry
        .claim
        .as_ref()
        .map_or_else(|| claim_from_key(&intent.claim), |snap| snap.claim.clone());
    let node = intent.selected_node.as_deref();
    let selected_node = node_named(node.or_else(|| decision::selected_node(&pvc)));
    Ok(ProvisionOptions {
        storage_class,
        pv_name: intent.pv_name.clone(),
        pvc,
        selected_node,
    })
}

/// A Node object carrying only `name`, as `ProvisionOptions::selected_node` wants it.
fn node_named(name: Option<&str>) -> Option<Node> {
    let metadata = ObjectMeta {
        name: Some(name?.to_string()),
        ..Default::default()
    };
    Some(Node {
        metadata,
        ..Default::default()
    })
}

fn claim_from_key(key: &ClaimKey) -> PersistentVolumeClaim {
    PersistentVolumeClaim {
        metadata: ObjectMeta {
            namespace: Some(key.namespace.clone()),
            name: Some(key.name.clone()),
            uid: Some(key.uid.clone()),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// The claim `uid` is gone without an intent: if its PV write is queued (or was dropped and
/// `deleted`, its last state, is a claim we provision), the claim is confirmed gone and no PV
/// exists, delete its volume (failures logged). True when the write or `deleted` decided.
pub async fn cleanup_unwritten_volume(
    op: &Operation,
    uid: &str,
    deleted: Option<&PersistentVolumeClaim>,
) -> bool {
    let pv_name = pv_name_for_claim_uid(uid);
    let (key, class, pvc, queued) = match op.ports.handoff.queued_entry(&pv_name, uid).await {
        Ok(Some(entry)) => {
            let pvc = claim_from_key(&entry.claim);
            (entry.claim, entry.class, pvc, true)
        }
        Ok(None) => match deleted.filter(|c| op.should_provision(c) == Ok(true)) {
            Some(claim) => match ClaimKey::of(claim) {
                Some(key) => (key, decision::claim_class(claim), claim.clone(), false),
                None => return true,
            },
            None => return deleted.is_some(),
        },
        Err(e) => {
            tracing::warn!(pv = %pv_name, error = %e, left_to = "the orphan sweep", "cannot read a deleted claim's queued PV write");
            return false;
        }
    };
    let key = &key;
    let cluster = &op.ports.cluster;
    match cluster.claim_exists(&key.namespace, &key.name, uid).await {
        Ok(false) => {}
        Ok(true) => return true,
        Err(e) => {
            tracing::warn!(pv = %pv_name, error = %e, left_to = "the orphan sweep", "cannot confirm a deleted claim is gone");
            return true;
        }
    }
    let Some(storage_class) = op.caches.classes.get(&ObjectRef::new(&class)) else {
        tracing::warn!(pv = %pv_name, %class, left_to = "the orphan sweep", "the StorageClass of a deleted claim's unwritten PV is gone");
        return true;
    };
    let kept = match queued {
        true => cluster.pv_exists(&pv_name).await,
        false => still_wanted(op, &pv_name, &storage_class).await,
    };
    match kept {
        Ok(false) => {}
        Ok(true) => return true,
        Err(e) => {
            tracing::warn!(pv = %pv_name, error = %e, left_to = "reclaim or the orphan sweep", "cannot tell whether a PV uses a deleted claim's volume");
            return true;
        }
    }
    let options = ProvisionOptions {
        storage_class: storage_class.as_ref().clone(),
        pv_name: pv_name.clone(),
        selected_node: node_named(decision::selected_node(&pvc)),
        pvc,
    };
    match op.ports.backend.delete_unprovisioned(&options).await {
        Ok(()) => {
            tracing::info!(pv = %pv_name, claim = %key, claim_uid = uid, "cleaned up after a claim deleted before its PV was written (its volume, if one was made)")
        }
        Err(e) => {
            tracing::warn!(pv = %pv_name, claim = %key, claim_uid = uid, error = %e, left_to = "the orphan sweep", "cannot delete a deleted claim's unwritten volume")
        }
    }
    true
}

/// Whether the volume `pv_name` of a deleted claim that no record names must stay: its class
/// keeps released volumes (`reclaimPolicy` other than `Delete`), or a live PV of any name
/// uses it (as the orphan sweep asks the backend). Errors: listing the PVs failed.
async fn still_wanted(op: &Operation, pv_name: &str, class: &StorageClass) -> Effect<bool> {
    if class
        .reclaim_policy
        .as_deref()
        .is_some_and(|p| p != "Delete")
    {
        tracing::info!(pv = %pv_name, class = %class.name_any(), left_to = "the orphan sweep", "a deleted claim's volume is kept: its class retains released volumes");
        return Ok(true);
    }
    let pvs = op.ports.cluster.list_pvs().await?;
    match op.ports.backend.volumes_in_use(&pvs).await {
        Ok(in_use) if in_use.contains(pv_name) => {
            tracing::info!(pv = %pv_name, "a deleted claim's volume is kept: a PV uses it");
            Ok(true)
        }
        Ok(_) => Ok(false),
        Err(e) => {
            tracing::warn!(pv = %pv_name, error = %e, left_to = "the orphan sweep", "cannot tell which volumes the PVs use; a deleted claim's volume is kept");
            Ok(true)
        }
    }
}

/// Delete the volume of a claim deleted mid-provisioning (see module docs),
/// after re-checking the queue and the live PV; a lookup error is a `Retry`
/// (intent and volume kept).
pub async fn cleanup_gone_claim(op: &Operation, entry: &IntentEntry) -> CleanupOutcome {
    let (pv_name, claim) = (&entry.intent.pv_name, &entry.intent.claim);
    // Intents carry no MAC: act only on the PV name provision-svc gives that claim uid.
    let expected = pv_name_for_claim_uid(&claim.uid);
    if *pv_name != expected {
        return CleanupOutcome::Poisoned(format!(
            "the intent names PV {pv_name:?}, not {expected:?} of its claim uid; deleting nothing by it"
        ));
    }
    // Re-check right before deleting: the PV may have been written meanwhile.
    match pv_accounted_for(op, pv_name).await {
        Ok(true) => {
            tracing::info!(pv = %pv_name, %claim, claim_uid = %claim.uid, left_to = "reclaim", "a PV or a queued PV write carries a deleted claim's volume");
        }
        Ok(false) => {
            let options = match options_from_intent(op, entry) {
                Ok(o) => o,
                Err(e) => return CleanupOutcome::Poisoned(e.to_string()),
            };
            match op.ports.backend.delete_unprovisioned(&options).await {
                Ok(()) => {
                    tracing::info!(pv = %pv_name, %claim, claim_uid = %claim.uid, "deleted the volume of a claim deleted while it was being provisioned");
                }
                Err(DeleteError::Ignored { reason }) => {
                    tracing::info!(pv = %pv_name, %claim, claim_uid = %claim.uid, %reason, "the backend ignores a deleted claim's volume");
                }
                Err(e @ DeleteError::Failed { .. }) => {
                    return CleanupOutcome::Retry(format!("backend delete: {e}"));
                }
                Err(e @ DeleteError::Refused { .. }) => {
                    return CleanupOutcome::Poisoned(format!("backend delete: {e}"));
                }
            }
        }
        Err(e) => return CleanupOutcome::Retry(e.to_string()),
    }
    op.clear_intent(pv_name).await;
    CleanupOutcome::Done
}
