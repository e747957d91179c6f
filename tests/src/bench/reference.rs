//! A reference external provisioner inside the benchmark: the least any
//! external provisioner must do on this control plane, at no cost of its own.
//! It watches the benchmark's claims and, as soon as the controller manager
//! has annotated one with our provisioner name, creates its PV
//! (`pvc-<claim uid>`, pre-bound through `claimRef`, hostPath
//! `/nonexistent/<claim>`); it deletes each of those PVs as soon as the
//! controller manager marks it `Released`. No backend, no Redis, no events,
//! no leader election, one write per volume each way.
//!
//! What it reaches in the same run as the services is the figure the
//! services can be held to: the controller manager's annotation rate measured
//! alone leaves out the binding work and the PV writes that any provisioner's
//! PVs cause, on the same cores.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher::{self, Event};
use kube::Client;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

use super::load::{self, BURST_IN_FLIGHT};

/// The running reference provisioner; dropping it stops it.
pub struct Reference {
    tasks: JoinSet<()>,
}

impl Drop for Reference {
    fn drop(&mut self) {
        self.tasks.abort_all();
    }
}

/// Whether `claim` asks provisioner `provisioner` for a volume now: annotated
/// with its name (GA key, else beta: provision-svc's
/// `decision::expected_provisioner`) and not yet bound to a volume.
pub fn wants_volume(claim: &PersistentVolumeClaim, provisioner: &str) -> bool {
    let annotated = provision_svc::decision::expected_provisioner(claim) == Some(provisioner);
    let unbound = claim
        .spec
        .as_ref()
        .is_none_or(|s| s.volume_name.as_deref().unwrap_or("").is_empty());
    annotated && unbound && claim.metadata.deletion_timestamp.is_none()
}

/// The PV the reference provisioner creates for `claim`: `pvc-<uid>`, the
/// claim's class, pre-bound to the claim by name and uid
/// ([`load::prebound_pv`]).
///
/// Errors: the claim has no name, namespace or uid.
pub fn volume_for(
    claim: &PersistentVolumeClaim,
    provisioner: &str,
) -> anyhow::Result<PersistentVolume> {
    let m = &claim.metadata;
    let (Some(name), Some(ns), Some(uid)) = (&m.name, &m.namespace, &m.uid) else {
        anyhow::bail!("claim without name, namespace or uid");
    };
    let class = claim
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.clone())
        .unwrap_or_default();
    Ok(load::prebound_pv(
        &api_types::pv_name_for_claim_uid(uid),
        ns,
        name,
        Some(uid),
        &class,
        provisioner,
    ))
}

/// Start the reference provisioner for claims in `namespace` annotated with
/// `provisioner` (at most [`BURST_IN_FLIGHT`] requests in flight). Failed
/// requests are printed and not retried: the benchmark's waits time out.
pub fn spawn(client: &Client, namespace: &str, provisioner: &str) -> Reference {
    let mut tasks = JoinSet::new();
    let limit = Arc::new(Semaphore::new(BURST_IN_FLIGHT));
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);

    let (p, l, api) = (provisioner.to_string(), limit.clone(), pvs.clone());
    tasks.spawn(async move {
        let mut started = HashSet::new();
        // Requests in flight belong to this task: aborted with it.
        let mut inflight = JoinSet::new();
        let mut w = watcher::watcher(claims, Default::default()).boxed();
        while let Some(ev) = w.next().await {
            let (Ok(Event::Apply(c)) | Ok(Event::InitApply(c))) = ev else {
                continue;
            };
            if !wants_volume(&c, &p) || !started.insert(c.metadata.uid.clone()) {
                continue;
            }
            let pv = match volume_for(&c, &p) {
                Ok(pv) => pv,
                Err(e) => {
                    eprintln!("reference provisioner: {e}");
                    continue;
                }
            };
            let (api, permit) = (api.clone(), l.clone().acquire_owned().await);
            while inflight.try_join_next().is_some() {}
            inflight.spawn(async move {
                let _permit = permit;
                if let Err(e) = api.create(&PostParams::default(), &pv).await {
                    eprintln!("reference provisioner: creating a PV: {e}");
                }
            });
        }
    });

    let p = provisioner.to_string();
    let mut deleting = HashSet::new();
    let watched = pvs.clone();
    tasks.spawn(async move {
        let mut inflight = JoinSet::new();
        let mut w = watcher::watcher(watched, Default::default()).boxed();
        while let Some(ev) = w.next().await {
            let (Ok(Event::Apply(pv)) | Ok(Event::InitApply(pv))) = ev else {
                continue;
            };
            let ours = pv
                .metadata
                .annotations
                .as_ref()
                .and_then(|a| a.get(api_types::ANN_DYNAMICALLY_PROVISIONED))
                .is_some_and(|v| *v == p);
            let released = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released");
            let name = pv.metadata.name.clone().unwrap_or_default();
            if !ours || !released || !name.starts_with("pvc-") || !deleting.insert(name.clone()) {
                continue;
            }
            let (api, permit) = (pvs.clone(), limit.clone().acquire_owned().await);
            while inflight.try_join_next().is_some() {}
            inflight.spawn(async move {
                let _permit = permit;
                match api.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => eprintln!("reference provisioner: deleting PV {name}: {e}"),
                }
            });
        }
    });
    Reference { tasks }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::{ANN_BETA_STORAGE_PROVISIONER, ANN_STORAGE_PROVISIONER};
    use serde_json::json;

    fn claim(annotations: serde_json::Value, volume_name: Option<&str>) -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "c1", "namespace": "ns", "uid": "u-1",
                         "annotations": annotations},
            "spec": {"storageClassName": "bench", "volumeName": volume_name},
        }))
        .unwrap()
    }

    #[test]
    fn only_a_pending_claim_annotated_with_our_name_wants_a_volume() {
        let ours = "example.com/hostpath";
        assert!(wants_volume(
            &claim(json!({ANN_BETA_STORAGE_PROVISIONER: ours}), None),
            ours
        ));
        assert!(wants_volume(
            &claim(json!({ANN_STORAGE_PROVISIONER: ours}), None),
            ours
        ));
        assert!(
            !wants_volume(&claim(json!({}), None), ours),
            "not annotated yet"
        );
        assert!(
            !wants_volume(
                &claim(json!({ANN_BETA_STORAGE_PROVISIONER: "other.io/x"}), None),
                ours
            ),
            "another provisioner's claim"
        );
        assert!(
            !wants_volume(
                &claim(json!({ANN_BETA_STORAGE_PROVISIONER: ours}), Some("pv-1")),
                ours
            ),
            "already bound to a volume"
        );
    }

    #[test]
    fn the_volume_is_pre_bound_to_the_claim_by_uid() {
        let pv = volume_for(&claim(json!({}), None), "example.com/hostpath").unwrap();
        assert_eq!(pv.metadata.name.as_deref(), Some("pvc-u-1"));
        let spec = pv.spec.unwrap();
        let r = spec.claim_ref.unwrap();
        assert_eq!(
            (r.namespace.as_deref(), r.name.as_deref(), r.uid.as_deref()),
            (Some("ns"), Some("c1"), Some("u-1"))
        );
        assert_eq!(spec.storage_class_name.as_deref(), Some("bench"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert_eq!(
            pv.metadata.annotations.unwrap()[api_types::ANN_DYNAMICALLY_PROVISIONED],
            "example.com/hostpath"
        );
        let mut nameless = claim(json!({}), None);
        nameless.metadata.uid = None;
        assert!(volume_for(&nameless, "x").is_err());
    }
}
