//! The leader's start-up walk over the recorded provisioning intents (beyond
//! the seed, which forgets everything on restart):
//!
//! * a claim flagged as provisioning in background is remembered again (seed
//!   `claimsInProgress`) and queued, so it is retried even if its PVC is gone;
//! * a claim still present is queued: it is provisioned again, which the
//!   backend answers idempotently for the same PV name;
//! * a claim that is gone: if its PV write is queued or its PV exists, the PV
//!   carries the volume from here and the intent is cleared; otherwise the
//!   backend is asked for the volume again from the claim snapshot (idempotent,
//!   so it returns the half-made one) and then deletes it, and the intent is
//!   cleared.
//!
//! "Queued or exists" is checked in the order a volume moves — the durable
//! queue first, then a **live** GET of the PV (never the reflector cache, which
//! may lag) — so a PV that pv-writer creates and completes between the two
//! reads is still seen. Any lookup error keeps the intent and the volume: the
//! check is retried (the cleanup re-checks before every delete attempt), never
//! treated as "absent".

use std::sync::Arc;
use std::time::Duration;

use api_types::{ProvisionError, ProvisionOptions, ProvisioningState, ANN_SELECTED_NODE};
use common::intents::IntentEntry;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::StorageClass;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::runtime::reflector::ObjectRef;
use tokio_util::sync::CancellationToken;

use crate::decision;
use crate::engine::Engine;

/// What the walk decided for one intent.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Recovery {
    /// Queued again as a claim provisioning in background.
    InBackground,
    /// The claim exists: queued for provisioning.
    Requeued,
    /// The claim is gone but its PV exists or is queued: intent cleared.
    PvPresent,
    /// The claim is gone: the volume must be deleted through the backend.
    Cleanup,
    /// The claim is gone and no snapshot was recorded: left for an operator.
    Stuck,
    /// The claim is gone, no snapshot was recorded and the queue/PV lookup
    /// failed: intent kept for the next leader's walk.
    Unknown(String),
}

/// Whether the volume `pv_name` is carried by a queued PV write or a PV:
/// the durable queue first, then a live GET of the PV (see module docs).
///
/// Errors: either lookup failed (the caller must keep the intent).
pub async fn pv_accounted_for(engine: &Engine, pv_name: &str) -> Result<bool, String> {
    if engine
        .handoff()
        .is_pending(pv_name)
        .await
        .map_err(|e| format!("PV-write queue lookup: {e}"))?
    {
        return Ok(true);
    }
    engine.cluster().pv_exists(pv_name).await
}

/// Decide and apply the walk for the `entries` listed at start; returns each
/// PV name with its decision. `Cleanup` entries are returned for
/// [`cleanup_gone_claim`] to work through.
pub async fn walk(engine: &Engine, entries: &[IntentEntry]) -> Vec<(String, Recovery)> {
    let mut out = Vec::new();
    for entry in entries {
        let pv_name = entry.intent.pv_name.clone();
        let uid = &entry.intent.claim.uid;
        let decision = match &entry.claim {
            Some(snap) if snap.in_background => {
                engine.restore_in_background(snap.claim.clone());
                Recovery::InBackground
            }
            _ if engine.claim_by_uid(uid).is_some() => {
                engine.queue().add(uid);
                Recovery::Requeued
            }
            claim => match pv_accounted_for(engine, &pv_name).await {
                Ok(true) => {
                    engine.clear_intent(&pv_name).await;
                    Recovery::PvPresent
                }
                // On a lookup error the cleanup re-checks (with backoff) before
                // it deletes anything; the intent is kept until then.
                Ok(false) | Err(_) if claim.is_some() => Recovery::Cleanup,
                Ok(false) => {
                    tracing::error!(pv = %pv_name, claim = %entry.intent.claim, "provisioning intent of a deleted claim has no claim snapshot; cannot ask the backend to delete its volume, leaving the intent for an operator");
                    Recovery::Stuck
                }
                Err(e) => {
                    tracing::warn!(pv = %pv_name, claim = %entry.intent.claim, error = %e, "cannot tell whether the volume of a deleted claim has a PV; keeping its intent for the next leader's walk");
                    Recovery::Unknown(e)
                }
            },
        };
        tracing::info!(pv = %pv_name, claim = %entry.intent.claim, decision = ?decision, "provisioning intent found at start");
        out.push((pv_name, decision));
    }
    out
}

/// Outcome of one cleanup attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CleanupOutcome {
    /// The volume was deleted (or never made) and the intent cleared.
    Done,
    /// Try again later.
    Retry(String),
}

/// Delete the volume of a claim deleted mid-provisioning (see module docs),
/// after re-checking the queue and the live PV; a lookup error is a `Retry`
/// (intent and volume kept).
pub async fn cleanup_gone_claim(engine: &Engine, entry: &IntentEntry) -> CleanupOutcome {
    let Some(snapshot) = &entry.claim else {
        return CleanupOutcome::Retry("no claim snapshot".into());
    };
    let pv_name = &entry.intent.pv_name;
    // Re-check right before deleting: the PV may have been written meanwhile.
    match pv_accounted_for(engine, pv_name).await {
        Ok(true) => {
            tracing::info!(pv = %pv_name, claim = %entry.intent.claim, "the volume of a deleted claim has a queued PV write or a PV; leaving it to reclaim");
            engine.clear_intent(pv_name).await;
            return CleanupOutcome::Done;
        }
        Ok(false) => {}
        Err(e) => return CleanupOutcome::Retry(e),
    }
    let class = engine
        .caches()
        .classes
        .get(&ObjectRef::new(&entry.intent.class))
        .map(|c| c.as_ref().clone())
        .unwrap_or_else(|| StorageClass {
            metadata: ObjectMeta {
                name: Some(entry.intent.class.clone()),
                ..Default::default()
            },
            provisioner: engine.settings().names.name.clone(),
            ..Default::default()
        });
    let selected_node = decision::annotation(&snapshot.claim, ANN_SELECTED_NODE).map(|n| Node {
        metadata: ObjectMeta {
            name: Some(n.to_string()),
            ..Default::default()
        },
        ..Default::default()
    });
    let options = ProvisionOptions {
        storage_class: class,
        pv_name: pv_name.clone(),
        pvc: snapshot.claim.clone(),
        selected_node,
    };
    let outcome = match engine.backend().provision(&options).await {
        Ok(volume) => match engine.backend().delete(&volume).await {
            Ok(()) => {
                tracing::info!(pv = %pv_name, claim = %entry.intent.claim, "deleted the volume of a claim deleted while it was being provisioned");
                CleanupOutcome::Done
            }
            Err(e) => CleanupOutcome::Retry(format!("backend delete: {e}")),
        },
        Err(ProvisionError::Ignored { .. })
        | Err(ProvisionError::Failed {
            state: ProvisioningState::Finished,
            ..
        }) => CleanupOutcome::Done,
        Err(e) => CleanupOutcome::Retry(format!("backend provision: {e}")),
    };
    if outcome == CleanupOutcome::Done {
        engine.clear_intent(pv_name).await;
    }
    outcome
}

/// Work through `entries` with [`cleanup_gone_claim`], retrying each failed one
/// with a delay doubling from `initial` up to `max`, until done or `shutdown`.
pub async fn cleanup_all(
    engine: Arc<Engine>,
    entries: Vec<IntentEntry>,
    initial: Duration,
    max: Duration,
    shutdown: CancellationToken,
) {
    for entry in entries {
        let mut failures = 0u32;
        loop {
            match cleanup_gone_claim(&engine, &entry).await {
                CleanupOutcome::Done => break,
                CleanupOutcome::Retry(e) => {
                    failures += 1;
                    let delay = common::retry::backoff(initial, max, failures);
                    tracing::warn!(pv = %entry.intent.pv_name, error = %e, ?delay, "cleaning up the volume of a deleted claim failed; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => return,
                        _ = tokio::time::sleep(delay) => {}
                    }
                }
            }
        }
    }
}
