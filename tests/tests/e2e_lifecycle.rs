//! End-to-end: the three real service binaries, a real `redis-server` and a
//! control plane. Lifecycle scenarios without failures: a batch of 100
//! claims provisioned and reclaimed, `WaitForFirstConsumer`, reschedule when
//! the selected node does not exist, bad StorageClass parameters, and a claim
//! deleted while its volume is being provisioned. Every wait is bounded.
//!
//! Each scenario runs on every plane (`<scenario>::sim`, `<scenario>::real_v1_19`, `::real_v1_37`): on the
//! API-server simulator and on a real kube-apiserver + kube-controller-manager
//! v1.19 where each service runs as its own ServiceAccount under the RBAC
//! rendered from `deploy/base` (the real variant is skipped with one line
//! without the binaries, see `e2e::realkube::assets_or_skip`).

use std::time::Duration;

use e2e::harness::{ControlPlane, Service, ServiceSettings, System};
use e2e::on_both_planes;
use e2e::sim::FaultSpec;
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use kube::api::{Patch, PatchParams};

const SELECTED_NODE: &str = "volume.kubernetes.io/selected-node";

async fn system(plane: ControlPlane) -> System {
    System::started(plane, None).await
}

/// Panic with the service log tails when `r` is an error.
fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn hundred_claims_are_provisioned_bound_and_reclaimed(plane: ControlPlane) {
    let sys = system(plane).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let claims = sys.create_claims("data", 100, "hostpath").await.unwrap();

    check(
        &sys,
        sys.wait_provisioned(100, Duration::from_secs(60)).await,
    );
    // Every PV is pvc-<claim uid>, points back at its claim, and its directory
    // is <base>/<pv name>.
    let pvs = sys.pvs().await.unwrap();
    for claim in sys.claims().await.unwrap() {
        let uid = claim.metadata.uid.clone().unwrap();
        let pv_name = format!("pvc-{uid}");
        let pv = pvs
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(pv_name.as_str()))
            .unwrap_or_else(|| panic!("no PV {pv_name}"));
        let spec = pv.spec.as_ref().unwrap();
        let claim_ref = spec.claim_ref.as_ref().unwrap();
        assert_eq!(claim_ref.uid.as_deref(), Some(uid.as_str()));
        assert_eq!(claim_ref.name, claim.metadata.name);
        assert_eq!(spec.storage_class_name.as_deref(), Some("hostpath"));
        assert_eq!(
            spec.persistent_volume_reclaim_policy.as_deref(),
            Some("Delete")
        );
        assert!(sys.base_dir().join(&pv_name).is_dir(), "{pv_name} dir");
        assert_eq!(
            claim.spec.as_ref().unwrap().volume_name.as_deref(),
            Some(pv_name.as_str())
        );
    }
    // One Provisioning and one ProvisioningSucceeded event per claim, no failure.
    // pv-writer announces a PV after creating it: the last events may trail the PVs.
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningSucceeded", 100, Duration::from_secs(10))
            .await,
    );
    // provision-svc's Provisioning events are published off the claim's path.
    check(
        &sys,
        sys.wait_objects_with_event("Provisioning", 100, Duration::from_secs(10))
            .await,
    );
    let events = sys.events_by_reason().await.unwrap();
    assert_eq!(
        events.get("ProvisioningSucceeded"),
        Some(&100),
        "{events:?}"
    );
    assert_eq!(events.get("ProvisioningFailed"), None, "{events:?}");

    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
    assert_eq!(sys.claims().await.unwrap().len(), 0);
    let reclaim = sys
        .services
        .iter()
        .find(|p| p.service == Service::Reclaim)
        .unwrap();
    // reclaim-svc counts a deletion once the API server's answer is back,
    // which may trail the PV's disappearance from the test's list.
    check(
        &sys,
        e2e::harness::wait_eq(
            Duration::from_secs(10),
            "controller_persistentvolume_delete_total{class=hostpath}",
            Some(100.0),
            || async {
                Ok(reclaim.metrics().await?.value(
                    "controller_persistentvolume_delete_total",
                    &[("class", "hostpath")],
                ))
            },
        )
        .await,
    );
    let m = reclaim.metrics().await.unwrap();
    assert_eq!(
        m.sum("controller_persistentvolume_delete_failed_total"),
        0.0
    );
}

async fn wait_for_first_consumer_waits_for_the_selected_node(plane: ControlPlane) {
    let sys = system(plane).await;
    sys.create_node("node-1").await.unwrap();
    sys.create_storage_class("wffc", "WaitForFirstConsumer", &[])
        .await
        .unwrap();
    let claims = sys.create_claims("late", 5, "wffc").await.unwrap();

    // No selected node: nothing may happen.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(sys.pvs().await.unwrap().len(), 0);
    assert_eq!(sys.dir_count(), 0);
    assert_eq!(sys.events("Provisioning").await.unwrap(), 0);

    // The scheduler picks node-1 for every claim.
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: "node-1"}}});
    for name in &claims {
        sys.claims_api()
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .unwrap();
    }
    check(&sys, sys.wait_provisioned(5, Duration::from_secs(30)).await);
    for pv in sys.pvs().await.unwrap() {
        let affinity = serde_json::to_value(pv.spec.unwrap().node_affinity).unwrap();
        assert_eq!(
            affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"],
            serde_json::json!(["node-1"]),
            "{affinity}"
        );
    }
    // pv-writer announces a PV after creating it: the event may trail the PV.
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningSucceeded", 5, Duration::from_secs(10))
            .await,
    );

    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

async fn missing_selected_node_reschedules_the_claim(plane: ControlPlane) {
    let sys = system(plane).await;
    sys.create_storage_class("wffc", "WaitForFirstConsumer", &[])
        .await
        .unwrap();
    for i in 0..3 {
        sys.create_claim(
            &format!("orphan-{i}"),
            "wffc",
            &[(SELECTED_NODE, "gone-node")],
        )
        .await
        .unwrap();
    }
    // provision-svc removes the selected-node annotation so the scheduler picks again.
    let r = e2e::harness::wait_eq(
        Duration::from_secs(30),
        "claims still carrying the selected-node annotation",
        0,
        || async {
            let claims: Vec<PersistentVolumeClaim> = sys.claims().await?;
            Ok(claims
                .iter()
                .filter(|c| {
                    c.metadata
                        .annotations
                        .as_ref()
                        .is_some_and(|a| a.contains_key(SELECTED_NODE))
                })
                .count())
        },
    )
    .await;
    check(&sys, r);
    assert_eq!(sys.claims().await.unwrap().len(), 3);
    // The Warning is published after the claim update that drops the
    // annotation: it may trail it (seen on the real API server).
    let r = sys
        .wait_objects_with_event("ProvisioningFailed", 3, Duration::from_secs(10))
        .await;
    check(&sys, r);
    // Nothing was provisioned and nothing is in flight.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sys.pvs().await.unwrap().len(), 0);
    assert_eq!(sys.dir_count(), 0);
    assert_eq!(sys.events("Provisioning").await.unwrap(), 0);
    assert_eq!(sys.events("ProvisioningSucceeded").await.unwrap(), 0);
}

async fn bad_storage_class_parameters_fail_with_an_event_and_create_nothing(plane: ControlPlane) {
    let sys = system(plane).await;
    sys.create_storage_class("bad", "Immediate", &[("path", "/etc")])
        .await
        .unwrap();
    sys.create_storage_class("good", "Immediate", &[])
        .await
        .unwrap();
    let bad = sys.create_claims("bad", 3, "bad").await.unwrap();
    let good = sys.create_claims("good", 2, "good").await.unwrap();

    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 3, Duration::from_secs(30))
            .await,
    );
    // The good class is unaffected: exactly its 2 claims are provisioned.
    check(
        &sys,
        e2e::harness::wait_eq(
            Duration::from_secs(30),
            "(PVs, directories)",
            (2, 2),
            || async { Ok((sys.pvs().await?.len(), sys.dir_count())) },
        )
        .await,
    );
    let failed = sys.event_notes("ProvisioningFailed").await.unwrap();
    assert!(
        failed.iter().all(|m| m.contains("path")),
        "the event names the bad parameter: {failed:?}"
    );
    // pv-writer announces a PV after creating it: the event may trail the PV.
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningSucceeded", 2, Duration::from_secs(10))
            .await,
    );
    assert!(!sys.base_dir().join("etc").exists());

    sys.delete_claims(&bad).await.unwrap();
    sys.delete_claims(&good).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

async fn claim_deleted_while_provisioning_leaves_no_volume(plane: ControlPlane) {
    let mut sys = system(plane).await;
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    // The volume must exist in the backend with its PV waiting in the durable
    // queue when the claim is deleted. On the simulator PV creation fails
    // (500) for 4 s; a real API server cannot be told to fail, so there
    // pv-writer is down (SIGKILL) until the claims are gone.
    let fault = sys.sim_handle().map(|sim| {
        sim.inject_fault(
            FaultSpec::error(500, &["create"], &["persistentvolumes"])
                .for_duration(Duration::from_secs(4)),
        )
    });
    if fault.is_none() {
        sys.kill(Service::PvWriter, 0);
    }
    let claims = sys.create_claims("brief", 3, "hostpath").await.unwrap();
    check(
        &sys,
        e2e::harness::wait_eq(Duration::from_secs(10), "volume directories", 3, || async {
            Ok(sys.dir_count())
        })
        .await,
    );
    assert_eq!(sys.pvs().await.unwrap().len(), 0);
    sys.delete_claims(&claims).await.unwrap();
    match fault {
        Some(id) => sys.sim().remove_fault(id),
        None => {
            let r = sys.restart(Service::PvWriter, 0).await;
            check(&sys, r)
        }
    }

    // Whatever path the services take (PV written then released, or the
    // pending write abandoned), no PV and no directory remain.
    check(&sys, sys.wait_reclaimed(Duration::from_secs(40)).await);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(sys.pvs().await.unwrap().len(), 0);
    assert_eq!(sys.dir_count(), 0);
    assert_eq!(sys.claims().await.unwrap().len(), 0);
}

/// The `quota` class parameter on a base directory without project quotas (this host's
/// kernel has no quota support; real limits are checked in `quota_vm`): `required` fails
/// each claim with a Warning naming the cause and leaves no directory, `best-effort`
/// provisions without a limit, a value that is not a mode is refused.
async fn quota_classes_without_project_quotas(plane: ControlPlane) {
    let sys = system(plane).await;
    let scratch = tempfile::tempdir_in(sys.base_dir()).unwrap();
    let probe = std::fs::File::open(scratch.path()).unwrap();
    let has_quotas = backend_kit::quota::limit(&probe, 1 << 20, 1 << 20).is_ok();
    drop(scratch);
    if has_quotas {
        eprintln!("skipped: the base directory has project quotas here");
        return;
    }
    for (class, quota) in [
        ("strict", "required"),
        ("loose", "best-effort"),
        ("typo", "yes"),
    ] {
        sys.create_storage_class(class, "Immediate", &[("quota", quota)])
            .await
            .unwrap();
    }
    let strict = sys.create_claims("strict", 2, "strict").await.unwrap();
    let loose = sys.create_claims("loose", 2, "loose").await.unwrap();
    let typo = sys.create_claims("typo", 1, "typo").await.unwrap();

    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 3, Duration::from_secs(30))
            .await,
    );
    check(
        &sys,
        sys.wait_pvs_and_dirs((2, 2), Duration::from_secs(30)).await,
    );
    let notes = sys.event_notes("ProvisioningFailed").await.unwrap();
    assert!(
        notes
            .iter()
            .any(|n| n.contains("project quota") && n.contains("(StorageClass quota=required)")),
        "{notes:?}"
    );
    assert!(
        notes
            .iter()
            .any(|n| n.contains("quota=\"yes\" is not one of off, best-effort, required")),
        "{notes:?}"
    );
    for pv in sys.pvs().await.unwrap() {
        let class = pv.spec.unwrap().storage_class_name.unwrap_or_default();
        assert_eq!(class, "loose", "only the best-effort class has volumes");
    }

    for claims in [&strict, &loose, &typo] {
        sys.delete_claims(claims).await.unwrap();
    }
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

/// The class's `directoryMode` and `mountOptions` reach the volume: its directory has the
/// mode, its PV the mount options; a bad mode is refused with a Warning.
async fn class_directory_mode_and_mount_options_reach_the_volume(plane: ControlPlane) {
    use std::os::unix::fs::PermissionsExt;
    let sys = system(plane).await;
    let mode = [("directoryMode", "0750")];
    sys.create_storage_class_with("private", "Immediate", &mode, &["noatime"])
        .await
        .unwrap();
    sys.create_storage_class("wrong", "Immediate", &[("directoryMode", "rwx")])
        .await
        .unwrap();
    let private = sys.create_claims("private", 1, "private").await.unwrap();
    let wrong = sys.create_claims("wrong", 1, "wrong").await.unwrap();
    check(
        &sys,
        sys.wait_pvs_and_dirs((1, 1), Duration::from_secs(30)).await,
    );
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 1, Duration::from_secs(30))
            .await,
    );
    let pv = sys.pvs().await.unwrap().remove(0);
    let spec = pv.spec.unwrap();
    assert_eq!(spec.mount_options, Some(vec!["noatime".to_string()]));
    let dir = spec.host_path.unwrap().path;
    let mode = std::fs::metadata(&dir).unwrap().permissions().mode() & 0o7777;
    assert_eq!(mode, 0o750, "{dir}");
    sys.delete_claims(&private).await.unwrap();
    sys.delete_claims(&wrong).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

/// A second `--base-dir` for all three services, beside the harness's own.
fn with_second_base_dir(s: &mut ServiceSettings) {
    let second = s.base_dir.with_file_name("base-2").display().to_string();
    for service in [Service::Provision, Service::PvWriter, Service::Reclaim] {
        s.extra_args
            .push((service, vec!["--base-dir".into(), second.clone()]));
    }
}

/// Two `--base-dir`s: the class's `baseDir` puts its volumes in the second, a class without
/// it in the first; pv-writer accepts both paths and reclaim-svc deletes each volume from
/// where its PV says.
async fn a_class_picks_one_of_several_base_dirs(plane: ControlPlane) {
    let sys = System::started(plane, Some(with_second_base_dir)).await;
    let second = sys.base_dir().with_file_name("base-2");
    let second_param = second.display().to_string();
    sys.create_storage_class("second", "Immediate", &[("baseDir", &second_param)])
        .await
        .unwrap();
    sys.create_storage_class("first", "Immediate", &[])
        .await
        .unwrap();
    let in_second = sys.create_claims("two", 2, "second").await.unwrap();
    let in_first = sys.create_claims("one", 1, "first").await.unwrap();
    let counts = || async {
        let in_second = std::fs::read_dir(&second).map_or(0, |d| d.count());
        Ok((sys.pvs().await?.len(), sys.dir_count(), in_second))
    };
    let timeout = Duration::from_secs(30);
    check(
        &sys,
        e2e::harness::wait_eq(timeout, "(PVs, first, second)", (3, 1, 2), counts).await,
    );
    for pv in sys.pvs().await.unwrap() {
        let spec = pv.spec.unwrap();
        let path = std::path::PathBuf::from(spec.host_path.unwrap().path);
        let expected = if spec.storage_class_name.as_deref() == Some("second") {
            second.as_path()
        } else {
            sys.base_dir()
        };
        assert_eq!(path.parent(), Some(expected), "{path:?}");
    }
    sys.delete_claims(&in_second).await.unwrap();
    sys.delete_claims(&in_first).await.unwrap();
    check(
        &sys,
        e2e::harness::wait_eq(timeout, "(PVs, first, second)", (0, 0, 0), counts).await,
    );
}

/// `--capacity 1536Ki` for the services running the backend (the harness's claims ask for 1Mi).
fn with_capacity(s: &mut ServiceSettings) {
    for service in [Service::Provision, Service::Reclaim] {
        s.extra_args
            .push((service, vec!["--capacity".into(), "1536Ki".into()]));
    }
}

/// A base directory of 1.5 MiB: of two 1 MiB claims one is provisioned and the other fails
/// with a Warning; with a selected node it is rescheduled (the annotation removed); the free
/// room is a metric; deleting the first volume makes room for the second.
async fn claims_beyond_the_capacity_fail_until_room_is_freed(plane: ControlPlane) {
    let mut sys = System::started(plane, Some(with_capacity)).await;
    sys.create_storage_class("small", "Immediate", &[])
        .await
        .unwrap();
    let first = sys.create_claims("first", 1, "small").await.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    let second = sys.create_claims("second", 1, "small").await.unwrap();
    check(
        &sys,
        sys.wait_objects_with_event("ProvisioningFailed", 1, Duration::from_secs(30))
            .await,
    );
    let notes = sys.event_notes("ProvisioningFailed").await.unwrap();
    assert!(notes.iter().any(|n| n.contains("do not fit")), "{notes:?}");
    let pool = sys.base_dir().display().to_string();
    let addr = sys.service(Service::Provision, 0).http_addr;
    let free = || async {
        let page = e2e::harness::MetricsPage::scrape(addr).await?;
        Ok(page.value("provision_svc_capacity_free_bytes", &[("pool", &pool)]))
    };
    check(
        &sys,
        e2e::harness::wait_eq(
            Duration::from_secs(20),
            "free bytes",
            Some(512.0 * 1024.0),
            free,
        )
        .await,
    );

    // With a selected node, the claim is rescheduled: the annotation is removed.
    sys.create_storage_class("small-wffc", "WaitForFirstConsumer", &[])
        .await
        .unwrap();
    let late = sys.create_claims("late", 1, "small-wffc").await.unwrap();
    let patch = serde_json::json!({"metadata": {"annotations": {SELECTED_NODE: "node-1"}}});
    sys.claims_api()
        .patch(&late[0], &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let selected = || async {
        let claim = sys.claims_api().get(&late[0]).await?;
        Ok(claim
            .metadata
            .annotations
            .unwrap_or_default()
            .contains_key(SELECTED_NODE))
    };
    check(
        &sys,
        e2e::harness::wait_eq(
            Duration::from_secs(30),
            "selected node kept",
            false,
            selected,
        )
        .await,
    );
    sys.delete_claims(&late).await.unwrap();

    sys.delete_claims(&first).await.unwrap();
    check(
        &sys,
        sys.wait_pvs_and_dirs((1, 1), Duration::from_secs(90)).await,
    );
    sys.delete_claims(&second).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

/// Expansion: a Bound claim of a class with `allowVolumeExpansion` asks for more; its PV and
/// then its status capacity follow, with the resizer's events (no node step: a directory).
async fn a_grown_claim_gets_its_pv_and_status_capacity_raised(plane: ControlPlane) {
    let sys = system(plane).await;
    sys.create_storage_class("grow", "Immediate", &[])
        .await
        .unwrap();
    sys.allow_expansion("grow").await.unwrap();
    let claims = sys.create_claims("grow", 1, "grow").await.unwrap();
    check(&sys, sys.wait_provisioned(1, Duration::from_secs(30)).await);
    let bigger = serde_json::json!({"spec": {"resources": {"requests": {"storage": "3Mi"}}}});
    sys.claims_api()
        .patch(&claims[0], &PatchParams::default(), &Patch::Merge(&bigger))
        .await
        .unwrap();
    let sizes = || async {
        let claim = sys.claims_api().get(&claims[0]).await?;
        let status = claim
            .status
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned());
        let pv = sys.pvs().await?.remove(0);
        let pv_size = pv
            .spec
            .and_then(|s| s.capacity)
            .and_then(|c| c.get("storage").cloned());
        Ok((pv_size.map(|q| q.0), status.map(|q| q.0)))
    };
    let three = Some("3Mi".to_string());
    let r = e2e::harness::wait_eq(
        Duration::from_secs(30),
        "(PV, claim status) capacity",
        (three.clone(), three),
        sizes,
    )
    .await;
    check(&sys, r);
    check(
        &sys,
        sys.wait_objects_with_event("VolumeResizeSuccessful", 1, Duration::from_secs(10))
            .await,
    );
    assert_eq!(sys.events("Resizing").await.unwrap(), 1);
    let claim = sys.claims_api().get(&claims[0]).await.unwrap();
    let conditions = claim.status.and_then(|s| s.conditions).unwrap_or_default();
    assert!(
        conditions.iter().all(|c| c.type_ != "Resizing"),
        "the Resizing condition is gone once resized: {conditions:?}"
    );
    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(30)).await);
}

on_both_planes!(
    hundred_claims_are_provisioned_bound_and_reclaimed,
    wait_for_first_consumer_waits_for_the_selected_node,
    missing_selected_node_reschedules_the_claim,
    bad_storage_class_parameters_fail_with_an_event_and_create_nothing,
    claim_deleted_while_provisioning_leaves_no_volume,
    quota_classes_without_project_quotas,
    class_directory_mode_and_mount_options_reach_the_volume,
    a_class_picks_one_of_several_base_dirs,
    claims_beyond_the_capacity_fail_until_room_is_freed,
    a_grown_claim_gets_its_pv_and_status_capacity_raised,
);
