//! Volumes handed between the seed's Go provisioner (sig-storage-lib-external-provisioner
//! v8.0.0 with the hostPath layout of its example, `tools/peers/build.sh`) and our
//! services under one provisioner name, on the real control planes (the peer is a
//! client-go program; the simulator is not its reference):
//!
//! * seed → ours: volumes the seed made (`<dir>/<PV name>`, no node affinity) are
//!   reclaimed by ours exactly: the directories of `Delete` PVs go, `Retain` ones stay;
//! * ours → seed: the seed refuses to delete volumes ours made (they lack its
//!   `hostPathProvisionerIdentity` annotation), so nothing is lost; ours, started
//!   again, reclaims them.

use std::path::Path;
use std::time::Duration;

use e2e::harness::peers::{self, Peer, PeerEnv};
use e2e::harness::{wait_eq, ControlPlane, Service, System, SystemOptions};
use e2e::realkube::Assets;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::Api;

const WAIT: Duration = Duration::from_secs(60);

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

/// A real plane with nothing of ours running, and each `(class, reclaim policy)`
/// of our provisioner name.
async fn plane(assets: Assets, classes: &[(&str, &str)]) -> System {
    let sys = System::start(SystemOptions {
        control_plane: ControlPlane::Real(assets),
        no_services: true,
        ..Default::default()
    })
    .await
    .expect("system starts");
    for (class, reclaim) in classes {
        let r = sys.create_storage_class(class, "Immediate", &[]).await;
        check(&sys, r);
        if *reclaim != "Delete" {
            // reclaimPolicy is immutable: replace the class.
            let api = Api::<StorageClass>::all(sys.client.clone());
            let mut sc = api.get(class).await.unwrap();
            api.delete(class, &Default::default()).await.unwrap();
            sc.reclaim_policy = Some(reclaim.to_string());
            sc.metadata.resource_version = None;
            sc.metadata.uid = None;
            api.create(&Default::default(), &sc).await.unwrap();
        }
    }
    sys
}

/// The seed as our provisioner name, its volumes in our base directory.
async fn start_seed(sys: &System) -> e2e::harness::process::ManagedProcess {
    let kubeconfig = sys.real().expect("real plane").cluster.admin_kubeconfig();
    let env = PeerEnv {
        kubeconfig,
        client: &sys.client,
        provisioner: &sys.settings.provisioner_name,
        dir: sys.base_dir(),
        qps: None,
    };
    let r = Peer::Seed.start(&env).await;
    check(sys, r)
}

/// Start (or, after a kill, restart) replica 0 of each service; wait for the leaders.
async fn start_ours(sys: &mut System) {
    for service in Service::ALL {
        let r = if sys.services.iter().any(|p| p.service == service) {
            sys.restart(service, 0).await
        } else {
            sys.start_service(service, 0).await
        };
        check(sys, r);
    }
    let r = sys.wait_leaders(Duration::from_secs(30)).await;
    check(sys, r);
}

async fn pv_names(sys: &System) -> Vec<String> {
    let mut names: Vec<String> = check(sys, sys.pvs().await)
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}

fn dirs(base: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(base)
        .map(|rd| {
            rd.filter_map(|e| e.ok())
                .filter(|e| e.path().is_dir())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn seed_volumes_are_reclaimed_by_ours(assets: Assets) {
    let Some(_) = peers::binary_or_skip(Peer::Seed, module_path!()) else {
        return;
    };
    let mut sys = plane(
        assets,
        &[("seed-delete", "Delete"), ("seed-retain", "Retain")],
    )
    .await;
    let seed = start_seed(&sys).await;
    let deleted = check(&sys, sys.create_claims("del", 3, "seed-delete").await);
    let retained = check(&sys, sys.create_claims("ret", 2, "seed-retain").await);
    check(&sys, sys.wait_provisioned(5, WAIT).await);
    let made = pv_names(&sys).await;
    assert_eq!(dirs(sys.base_dir()), made, "the seed makes <dir>/<PV name>");
    let pvs = check(&sys, sys.pvs().await);
    let annotated = |p: &PersistentVolume| {
        p.metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key("hostPathProvisionerIdentity"))
    };
    assert!(pvs.iter().all(annotated), "every PV is the seed's");
    drop(seed);

    start_ours(&mut sys).await;
    check(&sys, sys.delete_claims(&deleted).await);
    check(&sys, sys.delete_claims(&retained).await);
    let retained_pvs: Vec<String> = pvs
        .iter()
        .filter(|p| {
            p.spec
                .as_ref()
                .and_then(|s| s.storage_class_name.as_deref())
                == Some("seed-retain")
        })
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    let r = wait_eq(
        WAIT,
        "(PVs left, directories left)",
        (retained_pvs.clone(), retained_pvs.clone()),
        || async { Ok((pv_names(&sys).await, dirs(sys.base_dir()))) },
    )
    .await;
    check(&sys, r);
}

async fn our_volumes_are_left_alone_by_the_seed(assets: Assets) {
    let Some(_) = peers::binary_or_skip(Peer::Seed, module_path!()) else {
        return;
    };
    let mut sys = plane(assets, &[("ours", "Delete")]).await;
    start_ours(&mut sys).await;
    let claims = check(&sys, sys.create_claims("ours", 3, "ours").await);
    check(&sys, sys.wait_provisioned(3, WAIT).await);
    let made = pv_names(&sys).await;
    for service in Service::ALL {
        sys.kill(service, 0);
    }
    let seed = start_seed(&sys).await;
    check(&sys, sys.delete_claims(&claims).await);
    // Each PV Released; the seed ignores them (identity annotation missing).
    let released = || async {
        let pvs = sys.pvs().await?;
        Ok(pvs
            .iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released"))
            .count())
    };
    check(&sys, wait_eq(WAIT, "Released PVs", 3, released).await);
    tokio::time::sleep(Duration::from_secs(10)).await;
    assert_eq!(
        pv_names(&sys).await,
        made,
        "the seed deleted none of our PVs"
    );
    assert_eq!(
        dirs(sys.base_dir()),
        made,
        "the seed removed none of our directories"
    );
    drop(seed);

    start_ours(&mut sys).await;
    check(&sys, sys.wait_reclaimed(WAIT).await);
}

e2e::on_each_version!(
    seed_volumes_are_reclaimed_by_ours,
    our_volumes_are_left_alone_by_the_seed,
);
