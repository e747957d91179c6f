//! Behaviour of the real API server the services rely on, pinned on the simulator and on a
//! real kube-apiserver (v1.19 and v1.37) (skipped with one line without it): every
//! object carries `managedFields` naming its writer, and a status update is a write that
//! bumps `resourceVersion`.

use e2e::realkube::{Assets, RealCluster, RealClusterOptions};
use e2e::sim::{SimConfig, Simulator};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::Client;
use serde_json::json;

async fn managed_fields_and_status_writes(client: Client) {
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client, "default");
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "facts"},
        "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "none",
                 "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    let pp = PostParams {
        field_manager: Some("facts-test".into()),
        ..Default::default()
    };
    let created = api.create(&pp, &claim).await.unwrap();
    let mf = created.metadata.managed_fields.clone().unwrap_or_default();
    assert!(
        mf.iter().any(|m| m.manager.as_deref() == Some("facts-test")
            && m.operation.as_deref() == Some("Update")),
        "managedFields name the creator: {mf:?}"
    );
    let rv0: u64 = created.metadata.resource_version.unwrap().parse().unwrap();
    let patched = api
        .patch_status(
            "facts",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"phase": "Lost"}})),
        )
        .await
        .unwrap();
    let rv1: u64 = patched.metadata.resource_version.unwrap().parse().unwrap();
    assert!(
        rv1 > rv0,
        "status write bumps resourceVersion: {rv0} -> {rv1}"
    );
    assert_eq!(patched.status.unwrap().phase.as_deref(), Some("Lost"));
}

#[tokio::test]
async fn sim_managed_fields_and_status_writes() {
    let sim = Simulator::start(SimConfig::default()).await.unwrap();
    managed_fields_and_status_writes(sim.client().unwrap()).await;
}

async fn real_managed_fields_and_status_writes(assets: Assets) {
    let opts = RealClusterOptions {
        controller_manager: false,
        ..Default::default()
    };
    let cluster = RealCluster::start(&assets, opts).await.unwrap();
    managed_fields_and_status_writes(cluster.client()).await;
}

e2e::on_each_version!(real_managed_fields_and_status_writes,);
