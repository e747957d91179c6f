//! End-to-end: reclaim-svc acts on what is true when it acts, on both control
//! planes (the three real binaries, a real `redis-server`, the hostpath backend):
//!
//! * a reclaim-svc leader SIGSTOPped past its Lease while a PV it had decided
//!   to delete is set to `Retain`, then resumed, deletes nothing;
//! * the orphan sweep (`--sweep-orphans`) leaves alone a directory that a PV
//!   of another name points at (a hand-made PV restoring retained data).

use std::time::Duration;

use e2e::harness::{wait_until, ControlPlane, MetricsPage, Service, System};
use e2e::on_both_planes;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Patch, PatchParams, PostParams};
use kube::Api;

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn system(
    plane: ControlPlane,
    configure: Option<fn(&mut e2e::harness::ServiceSettings)>,
) -> System {
    System::started(plane, configure).await
}

/// The leader's first delete fails (a file stands where the directory
/// was), so the PV waits in its retry backoff with `Released`/`Delete` in
/// the leader's cache. The leader is SIGSTOPped; meanwhile the PV is set to
/// `Retain`, the directory is put back, the leader's watch connections are
/// cut (simulator: dropped; real: kube-apiserver restarted) and its Lease
/// expires. Resumed, its retry fires on the stale copy before any watch
/// event can arrive: the volume must survive and the PV stay.
async fn a_reclaim_leader_paused_past_its_lease_deletes_nothing_it_decided_before(
    plane: ControlPlane,
) {
    let mut sys = system(plane, None).await;
    check(
        &sys,
        sys.create_storage_class("hostpath", "Immediate", &[]).await,
    );
    check(&sys, sys.create_claim("data", "hostpath", &[]).await);
    let pv = check(
        &sys,
        sys.wait_pv_for_claim("data", Duration::from_secs(30)).await,
    );
    let pv_name = pv.metadata.name.clone().unwrap();
    let base = sys.base_dir().to_path_buf();
    let dir = base.join(&pv_name);
    let held = base.join("held-aside");
    std::fs::write(dir.join("data"), b"keep me").unwrap();
    std::fs::rename(&dir, &held).unwrap();
    std::fs::write(&dir, b"not a directory").unwrap();

    check(&sys, sys.delete_claims(&["data".into()]).await);
    let r = sys
        .wait_objects_with_event("VolumeFailedDelete", 1, Duration::from_secs(30))
        .await;
    check(&sys, r);

    let r = sys.service(Service::Reclaim, 0).process.pause().await;
    check(&sys, r);
    let patch = serde_json::json!({"spec": {"persistentVolumeReclaimPolicy": "Retain"}});
    let r = Api::<PersistentVolume>::all(sys.client.clone())
        .patch(&pv_name, &PatchParams::default(), &Patch::Merge(&patch))
        .await;
    check(&sys, r.map_err(anyhow::Error::from));
    std::fs::remove_file(&dir).unwrap();
    std::fs::rename(&held, &dir).unwrap();
    match sys.sim_handle() {
        Some(sim) => sim.drop_watches(),
        None => {
            let outage = sys.begin_outage().await;
            let outage = check(&sys, outage);
            let r = sys.end_outage(outage).await;
            check(&sys, r);
        }
    }
    // Past the Lease (4 s) and the retry backoff (at most 5 s).
    tokio::time::sleep(Duration::from_secs(7)).await;
    sys.service(Service::Reclaim, 0)
        .process
        .signal(libc::SIGCONT);

    let r = sys
        .wait_leader(Service::Reclaim, Duration::from_secs(30))
        .await;
    check(&sys, r);
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(
        std::fs::read(dir.join("data")).ok().as_deref(),
        Some(&b"keep me"[..]),
        "the Retain volume's directory survived the resumed leader\n{}",
        sys.log_tails(30)
    );
    let pvs = check(&sys, sys.pvs().await);
    assert!(
        pvs.iter()
            .any(|p| p.metadata.name.as_deref() == Some(pv_name.as_str())),
        "the PV set to Retain stays"
    );
}

fn sweep_archives_at_once(s: &mut e2e::harness::ServiceSettings) {
    s.extra_args.push((
        Service::Reclaim,
        vec!["--sweep-orphans=true".into(), "--sweep-min-age=0s".into()],
    ));
}

/// A retained directory `pvc-abc` that an admin bound again through a
/// hand-made PV `restore-abc` is in use: the sweep of a new leader archives
/// only the real orphan beside it.
async fn the_orphan_sweep_keeps_a_directory_a_pv_of_another_name_points_at(plane: ControlPlane) {
    let mut sys = system(plane, Some(sweep_archives_at_once)).await;
    let base = sys.base_dir().to_path_buf();
    std::fs::create_dir(base.join("pvc-abc")).unwrap();
    std::fs::write(base.join("pvc-abc/data"), b"restored").unwrap();
    std::fs::create_dir(base.join("pvc-gone")).unwrap();
    let restore: PersistentVolume = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "restore-abc"},
        "spec": {
            "capacity": {"storage": "1Mi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "hostPath": {"path": base.join("pvc-abc").display().to_string()},
        },
    }))
    .unwrap();
    let r = Api::<PersistentVolume>::all(sys.client.clone())
        .create(&PostParams::default(), &restore)
        .await;
    check(&sys, r.map_err(anyhow::Error::from));

    let r = sys.restart(Service::Reclaim, 0).await;
    check(&sys, r);
    let r = sys
        .wait_leader(Service::Reclaim, Duration::from_secs(30))
        .await;
    check(&sys, r);
    let addr = sys.service(Service::Reclaim, 0).http_addr;
    let r = wait_until(
        Duration::from_secs(30),
        "the orphan sweep",
        move || async move {
            MetricsPage::scrape(addr)
                .await
                .is_ok_and(|m| m.value("reclaim_orphan_volumes_archived", &[]) == Some(1.0))
        },
    )
    .await;
    check(&sys, r);
    let m = MetricsPage::scrape(addr).await.unwrap();
    assert_eq!(
        m.value("reclaim_orphan_volumes", &[]),
        Some(1.0),
        "only pvc-gone is an orphan\n{}",
        sys.log_tails(20)
    );
    assert!(base.join("archived-pvc-gone").is_dir());
    assert_eq!(
        std::fs::read(base.join("pvc-abc/data")).ok().as_deref(),
        Some(&b"restored"[..]),
        "the directory restore-abc points at is left in place"
    );
}

on_both_planes!(
    a_reclaim_leader_paused_past_its_lease_deletes_nothing_it_decided_before,
    the_orphan_sweep_keeps_a_directory_a_pv_of_another_name_points_at,
);
