//! Volume expansion, as kubernetes-csi/external-resizer does it for our PVs: a Bound claim
//! of ours whose request grew past its capacity gets its volume grown by the backend
//! (`Provisioner::expand`: quota raised, room reserved), the PV's capacity, then the claim's
//! status capacity; the claim's `Resizing` condition meanwhile; events `Resizing`, then
//! `VolumeResizeSuccessful` or `VolumeResizeFailed`.
//! No node-side step: a directory needs no filesystem resize. Why here: docs/ARCHITECTURE.md.

use std::collections::BTreeMap;

use api_types::ANN_DYNAMICALLY_PROVISIONED;
use common::kube::events::reason::{RESIZING, VOLUME_RESIZE_FAILED, VOLUME_RESIZE_SUCCESSFUL};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::runtime::reflector::ObjectRef;
use kube::ResourceExt;
use provisioner_api::quantity;
use serde_json::json;

use crate::decision::{self, ProvisionerNames};
use crate::operation::{OpError, Operation};

/// What a claim asks of its volume's size.
#[derive(Debug, Clone, PartialEq)]
pub struct Wanted {
    /// The bound PV.
    pub pv: String,
    /// The claim's request.
    pub request: Quantity,
    /// The request in bytes.
    pub bytes: u64,
}

/// The growth `claim` asks for: Bound to a PV, expected from one of `names`, with a request
/// larger than its status capacity. `None` otherwise (nothing to do).
pub fn wanted(claim: &PersistentVolumeClaim, names: &ProvisionerNames) -> Option<Wanted> {
    let status = claim.status.as_ref()?;
    if status.phase.as_deref() != Some("Bound") || !names.expected_by(claim) {
        return None;
    }
    let spec = claim.spec.as_ref()?;
    let pv = spec.volume_name.clone().filter(|v| !v.is_empty())?;
    let request = storage(spec.resources.as_ref()?.requests.as_ref())?.clone();
    let bytes = quantity::bytes(&request)?;
    let capacity = storage(status.capacity.as_ref()).and_then(quantity::bytes);
    (capacity.is_none_or(|c| bytes > c)).then_some(Wanted { pv, request, bytes })
}

/// Grow the volume of `claim` as [`wanted`] says; a refusal (the class does not allow
/// expansion, a smaller request than the PV has, a PV that is not this claim's) is a
/// Warning and final. Errors: the backend or an API call failed (retried).
pub async fn resize(
    op: &Operation,
    claim: &PersistentVolumeClaim,
    want: Wanted,
) -> Result<(), OpError> {
    let resized = grow(op, claim, &want).await;
    resized.map_err(|e| OpError::Failed(format!("resizing volume {}: {e}", want.pv)))
}

async fn grow(op: &Operation, claim: &PersistentVolumeClaim, want: &Wanted) -> anyhow::Result<()> {
    let cluster = &op.ports.cluster;
    let refuse = |note: String| {
        tracing::warn!(pv = %want.pv, %note, "volume not resized");
        cluster.claim_event(claim, true, VOLUME_RESIZE_FAILED, note);
        Ok(())
    };
    let class_name = decision::claim_class(claim);
    let class = op.caches.classes.get(&ObjectRef::new(&class_name));
    let allowed = class.is_some_and(|c| c.allow_volume_expansion == Some(true));
    if !allowed {
        return refuse(format!(
            "StorageClass {class_name:?} does not allow volume expansion"
        ));
    }
    let Some(pv) = cluster.get_pv(&want.pv).await? else {
        return Ok(());
    };
    if let Some(why) = not_this_claims(&pv, claim, &op.settings.names) {
        return refuse(why);
    }
    let pv_capacity = storage(pv.spec.as_ref().and_then(|s| s.capacity.as_ref()));
    let pv_bytes = pv_capacity.and_then(quantity::bytes).unwrap_or(0);
    if want.bytes < pv_bytes {
        let note = format!(
            "shrinking volume {} from {} to {} is not supported",
            want.pv, pv_bytes, want.bytes
        );
        return refuse(note);
    }
    // The claim's other conditions, kept in both status patches (merge patches replace lists).
    let others: Vec<_> = claim
        .status
        .iter()
        .flat_map(|s| s.conditions.iter().flatten())
        .filter(|c| c.type_ != RESIZING)
        .map(|c| serde_json::to_value(c).unwrap_or_default())
        .collect();
    // Not grown here: the PV has the size already (a pass on a claim from a cache that has
    // not seen the status patch yet, or after a crash between the two patches).
    let grown = want.bytes > pv_bytes;
    if grown {
        let now = serde_json::to_value(Time(k8s_openapi::jiff::Timestamp::now()));
        let resizing = json!({"type": RESIZING, "status": "True",
            "lastTransitionTime": now.unwrap_or_default()});
        let conditions: Vec<_> = others.iter().cloned().chain([resizing]).collect();
        let status = json!({"status": {"conditions": conditions}});
        cluster.patch_claim_status(claim, &status).await?;
        let note = format!("External resizer is resizing volume {}", want.pv);
        cluster.claim_event(claim, false, RESIZING, note);
        if let Err(e) = op.ports.backend.expand(&pv, want.bytes).await {
            let note = format!("resize volume {} failed: {e}", want.pv);
            cluster.claim_event(claim, true, VOLUME_RESIZE_FAILED, note);
            return Err(e.into());
        }
        let patch = json!({"spec": {"capacity": {"storage": want.request}}});
        cluster.patch_pv(&want.pv, &patch).await?;
    }
    let status = json!({"status": {"capacity": {"storage": want.request}, "conditions": others}});
    cluster.patch_claim_status(claim, &status).await?;
    tracing::info!(pv = %want.pv, bytes = want.bytes, grown, "volume resized");
    if grown {
        let note = "Resize volume succeeded".to_string();
        cluster.claim_event(claim, false, VOLUME_RESIZE_SUCCESSFUL, note);
    }
    Ok(())
}

/// Why `pv` is not `claim`'s volume of ours (provisioned by one of `names`, bound to the
/// claim's uid), if it is not.
fn not_this_claims(
    pv: &PersistentVolume,
    claim: &PersistentVolumeClaim,
    names: &ProvisionerNames,
) -> Option<String> {
    let name = pv.metadata.name.as_deref().unwrap_or_default();
    let by = pv.annotations().get(ANN_DYNAMICALLY_PROVISIONED);
    if !by.is_some_and(|p| names.is_known(p)) {
        return Some(format!(
            "PV {name} was not provisioned by this provisioner; not resizing it"
        ));
    }
    let claim_ref = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let bound_uid = claim_ref.and_then(|r| r.uid.as_deref());
    (bound_uid != claim.metadata.uid.as_deref())
        .then(|| format!("PV {name} is not bound to this claim; not resizing it"))
}

/// The `storage` entry of a resource list (a request or a capacity).
fn storage(list: Option<&BTreeMap<String, Quantity>>) -> Option<&Quantity> {
    list?.get("storage")
}
