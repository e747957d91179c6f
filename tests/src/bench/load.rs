//! The benchmark's load: claims created in a burst (16 requests in flight) or
//! at an offered rate, claims deleted, and pre-bound claim/PV pairs for the
//! controller-manager-alone Released measurement. Send times go into
//! [`Seen`](super::observe::Seen).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, PostParams};
use kube::Client;
use serde_json::json;

use super::observe::SharedSeen;

/// Requests in flight for a burst of creates or deletes.
pub const BURST_IN_FLIGHT: usize = 16;

/// Names `<prefix>-00000` … for `n` claims.
pub fn names(prefix: &str, n: usize) -> Vec<String> {
    (0..n).map(|i| format!("{prefix}-{i:05}")).collect()
}

/// The node every claim of this process names as its selected node
/// (`bench --node`: provisioners such as local-path act only on claims with one).
static SELECTED_NODE: std::sync::OnceLock<String> = std::sync::OnceLock::new();

/// Make every claim [`claim`] builds from now on carry the selected-node
/// annotation `node` (the first call wins).
pub fn select_node(node: &str) {
    let _ = SELECTED_NODE.set(node.to_string());
}

/// A `ReadWriteOnce`, `1Mi` claim of class `class`, bound in advance to PV
/// `volume_name` when given, with the selected node of [`select_node`].
pub fn claim(
    name: &str,
    namespace: &str,
    class: &str,
    volume_name: Option<&str>,
) -> PersistentVolumeClaim {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": class,
        "resources": {"requests": {"storage": "1Mi"}},
    });
    if let Some(v) = volume_name {
        spec["volumeName"] = json!(v);
    }
    let mut metadata = json!({"name": name, "namespace": namespace});
    if let Some(node) = SELECTED_NODE.get() {
        metadata["annotations"][api_types::annotations::ANN_SELECTED_NODE] = json!(node);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": metadata,
        "spec": spec,
    }))
    .expect("valid claim manifest")
}

/// Create claims `names` of class `class` in `namespace`: as fast as
/// [`BURST_IN_FLIGHT`] requests allow, or the i-th at `i / rate` seconds.
/// Records each request's send time in `seen.claim_created`.
///
/// Errors: the first API rejection.
pub async fn create_claims(
    client: &Client,
    namespace: &str,
    names: &[String],
    class: &str,
    rate: Option<f64>,
    seen: &SharedSeen,
) -> anyhow::Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let start = Instant::now();
    futures::stream::iter(names.iter().enumerate())
        .map(|(i, name)| {
            let api = api.clone();
            async move {
                if let Some(r) = rate {
                    let at = start + Duration::from_secs_f64(i as f64 / r);
                    tokio::time::sleep_until(at.into()).await;
                }
                let t = Instant::now();
                api.create(&PostParams::default(), &claim(name, namespace, class, None))
                    .await
                    .with_context(|| format!("creating claim {name}"))?;
                seen.lock().unwrap().claim_created.insert(name.clone(), t);
                anyhow::Ok(())
            }
        })
        .buffer_unordered(if rate.is_some() { 64 } else { BURST_IN_FLIGHT })
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Delete claims `names` ([`BURST_IN_FLIGHT`] in flight); a missing claim is
/// fine. Records each request's send time in `seen.claim_delete_sent`.
///
/// Errors: any other API error.
pub async fn delete_claims(
    client: &Client,
    namespace: &str,
    names: &[String],
    seen: &SharedSeen,
) -> anyhow::Result<()> {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    futures::stream::iter(names.iter())
        .map(|name| {
            let api = api.clone();
            async move {
                let t = Instant::now();
                match api.delete(name, &DeleteParams::default()).await {
                    Ok(_) => {}
                    Err(kube::Error::Api(e)) if e.code == 404 => {}
                    Err(e) => {
                        return Err(anyhow::Error::from(e).context(format!("deleting claim {name}")))
                    }
                }
                seen.lock()
                    .unwrap()
                    .claim_delete_sent
                    .insert(name.clone(), t);
                Ok(())
            }
        })
        .buffer_unordered(BURST_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// A `1Mi`, `ReadWriteOnce` PV `name` with reclaim policy `Delete`, class
/// `class`, hostPath `/nonexistent/<claim>` (no volume behind it),
/// `pv.kubernetes.io/provisioned-by: <provisioner>` and `claimRef` to claim
/// `namespace/claim` (with `uid` when given): pre-bound, so the controller
/// manager binds it to that claim.
pub fn prebound_pv(
    name: &str,
    namespace: &str,
    claim: &str,
    uid: Option<&str>,
    class: &str,
    provisioner: &str,
) -> PersistentVolume {
    let ann: BTreeMap<&str, &str> = [(api_types::ANN_DYNAMICALLY_PROVISIONED, provisioner)].into();
    let mut claim_ref = json!({"kind": "PersistentVolumeClaim", "apiVersion": "v1",
                               "namespace": namespace, "name": claim});
    if let Some(uid) = uid {
        claim_ref["uid"] = json!(uid);
    }
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolume",
        "metadata": {"name": name, "annotations": ann},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Delete",
            "storageClassName": class,
            "hostPath": {"path": format!("/nonexistent/{claim}")},
            "claimRef": claim_ref,
        },
    }))
    .expect("valid PV manifest")
}

/// PV name of the pre-bound pair of claim `claim`.
pub fn paired_pv_name(claim: &str) -> String {
    format!("{claim}-pv")
}

/// Create, for each claim name, a PV `<claim>-pv` (hostPath
/// `/nonexistent/<claim>`, reclaim policy `Delete`, class `class`,
/// `pv.kubernetes.io/provisioned-by: <provisioner>`, `claimRef` to the claim)
/// and the claim itself with `volumeName` set, so the controller manager binds
/// the pair without any provisioner. No volume exists behind these PVs:
/// remove them with [`delete_pvs`] before a provisioner's reclaim side runs.
///
/// Errors: the first API rejection.
pub async fn create_bound_pairs(
    client: &Client,
    namespace: &str,
    names: &[String],
    class: &str,
    provisioner: &str,
) -> anyhow::Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    futures::stream::iter(names.iter())
        .map(|name| {
            let (pvs, claims) = (pvs.clone(), claims.clone());
            async move {
                let pv_name = paired_pv_name(name);
                let pv = prebound_pv(&pv_name, namespace, name, None, class, provisioner);
                pvs.create(&PostParams::default(), &pv)
                    .await
                    .with_context(|| format!("creating PV {pv_name}"))?;
                claims
                    .create(
                        &PostParams::default(),
                        &claim(name, namespace, class, Some(&pv_name)),
                    )
                    .await
                    .with_context(|| format!("creating claim {name}"))?;
                anyhow::Ok(())
            }
        })
        .buffer_unordered(BURST_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}

/// Delete the PVs of [`create_bound_pairs`] for `names`; a missing PV is fine.
///
/// Errors: any other API error.
pub async fn delete_pvs(client: &Client, names: &[String]) -> anyhow::Result<()> {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    futures::stream::iter(names.iter())
        .map(|name| {
            let pvs = pvs.clone();
            async move {
                let pv_name = paired_pv_name(name);
                match pvs.delete(&pv_name, &DeleteParams::default()).await {
                    Ok(_) => Ok(()),
                    Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                    Err(e) => Err(anyhow::Error::from(e).context(format!("deleting PV {pv_name}"))),
                }
            }
        })
        .buffer_unordered(BURST_IN_FLIGHT)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(())
}
