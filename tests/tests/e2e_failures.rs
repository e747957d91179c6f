//! End-to-end failure scenarios with the real binaries, a real `redis-server`
//! and a control plane: SIGKILL of each service in the middle of a batch, a
//! Redis restart, two replicas per service with the leaders killed, and a
//! 30 s API outage. Each asserts exact PV, directory and event counts: no
//! claim is lost, no volume is provisioned twice, nothing leaks.
//!
//! Each scenario runs on the simulator (`<scenario>::sim`) and on a real
//! kube-apiserver + kube-controller-manager (v1.19 and v1.37) (`<scenario>::real_v1_19`, `::real_v1_37`, each
//! service under its own ServiceAccount and the deploy's RBAC). What only the
//! simulator can do stays simulator-only and is marked: added request latency
//! (keeps a batch in flight longer; on the real server the kills may land
//! later in the batch, the end state asserted is the same) and claims created
//! behind the API during the outage.

use std::time::{Duration, Instant};

use common::handoff::orphan_report;
use e2e::harness::wait::wait_for;
use e2e::harness::{wait_eq, ControlPlane, RedisSentinels, Service, System, SystemOptions};
use e2e::on_both_planes;

fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn system(plane: ControlPlane, replicas: usize) -> System {
    system_on(plane, replicas, None).await
}

/// [`system`] with every service on `redis_url` instead of the private Redis.
async fn system_on(plane: ControlPlane, replicas: usize, redis_url: Option<String>) -> System {
    let mut sys = System::start(SystemOptions {
        replicas,
        control_plane: plane,
        no_services: redis_url.is_some(),
        ..Default::default()
    })
    .await
    .expect("system starts");
    if let Some(url) = redis_url {
        sys.settings.redis_url = url;
        for service in Service::ALL {
            for replica in 0..replicas {
                let r = sys.start_service(service, replica).await;
                check(&sys, r);
            }
        }
    }
    sys.wait_leaders(Duration::from_secs(30))
        .await
        .expect("every service elects a leader");
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    sys
}

/// Simulator only: delay every API request by `d` (a real server cannot be slowed).
fn set_sim_latency(sys: &System, d: Duration) {
    if let Some(sim) = sys.sim_handle() {
        sim.set_latency(d);
    }
}

/// Assert the exact end state of `n` provisioned claims: `n` PVs, `n` Bound
/// claims, `n` directories and a ProvisioningSucceeded event on every claim
/// (pv-writer publishes it before completing the queue entry, so a writer
/// killed in between publishes it again on the retried write).
async fn assert_provisioned(sys: &System, n: usize) {
    check(sys, sys.wait_provisioned(n, Duration::from_secs(120)).await);
    // Settle, then re-check that nothing extra appeared (no double provisioning).
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert_eq!(sys.pvs().await.unwrap().len(), n);
    assert_eq!(sys.dir_count(), n, "one directory per claim");
    // pv-writer announces a PV after creating it: the last events may trail the PVs.
    check(
        sys,
        sys.wait_objects_with_event("ProvisioningSucceeded", n, Duration::from_secs(10))
            .await,
    );
}

async fn sigkill_of_each_service_in_the_middle_of_a_batch_loses_nothing(plane: ControlPlane) {
    let mut sys = system(plane, 1).await;
    // 20 ms per API request keeps a batch in flight long enough to interrupt.
    set_sim_latency(&sys, Duration::from_millis(20));
    let mut all = Vec::new();
    for (round, victim) in [Service::Provision, Service::PvWriter]
        .into_iter()
        .enumerate()
    {
        let batch = sys
            .create_claims(&format!("kill{round}"), 40, "hostpath")
            .await
            .unwrap();
        all.extend(batch);
        let done_before = all.len() - 40;
        // Kill once the batch has started: some of it done, not all.
        let progress = || async {
            Ok(match victim {
                Service::Provision => sys.dir_count(),
                _ => sys.pvs().await?.len(),
            } > done_before + 3)
        };
        check(
            &sys,
            wait_eq(Duration::from_secs(30), "batch started", true, progress).await,
        );
        sys.kill(victim, 0);
        let at_kill = (sys.dir_count(), sys.pvs().await.unwrap().len());
        eprintln!(
            "killed {victim:?} at (dirs, PVs) = {at_kill:?} of {}",
            all.len()
        );
        {
            let r = sys.restart(victim, 0).await;
            check(&sys, r)
        };
        assert_provisioned(&sys, all.len()).await;
    }

    // reclaim-svc killed in the middle of deleting the volumes.
    sys.delete_claims(&all).await.unwrap();
    let n = all.len();
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "reclaim started", true, || async {
            Ok(sys.pvs().await?.len() < n - 3)
        })
        .await,
    );
    sys.kill(Service::Reclaim, 0);
    eprintln!(
        "killed reclaim-svc at {} PVs of {n}",
        sys.pvs().await.unwrap().len()
    );
    {
        let r = sys.restart(Service::Reclaim, 0).await;
        check(&sys, r)
    };
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
    assert_eq!(sys.claims().await.unwrap().len(), 0);
}

async fn redis_restart_loses_no_queued_pv_write(plane: ControlPlane) {
    let mut sys = system(plane, 1).await;
    set_sim_latency(&sys, Duration::from_millis(20));
    let mut claims = sys.create_claims("before", 30, "hostpath").await.unwrap();
    // Restart Redis (SIGTERM: the AOF is flushed) while the batch is in flight.
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "batch started", true, || async {
            Ok(sys.dir_count() > 3)
        })
        .await,
    );
    {
        let r = sys.redis.restart(false).await;
        check(&sys, r)
    };
    claims.extend(sys.create_claims("after", 10, "hostpath").await.unwrap());
    set_sim_latency(&sys, Duration::ZERO);
    assert_provisioned(&sys, 40).await;
    for p in sys.services.iter_mut() {
        assert!(
            p.process.is_running(),
            "{} survived the Redis restart",
            p.identity()
        );
    }

    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
}

/// [`system`] on a fresh primary, replica and three Sentinels (kept in the returned dir).
async fn system_on_sentinels(plane: ControlPlane) -> (tempfile::TempDir, RedisSentinels, System) {
    let root = tempfile::tempdir().unwrap();
    let redis = RedisSentinels::start(root.path()).await.unwrap();
    let sys = system_on(plane, 1, Some(redis.url())).await;
    (root, redis, sys)
}

/// FLUSHALL of the Redis at `url` (an operator's mistake, or a wiped volume).
async fn flushall(url: &str) {
    let client = redis::Client::open(url).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let _: () = redis::cmd("FLUSHALL").query_async(&mut conn).await.unwrap();
}

/// Wait until `n` claims are being provisioned (their directories exist).
async fn wait_dirs(sys: &System, n: usize) {
    let r = wait_eq(Duration::from_secs(60), "burst under way", true, || async {
        Ok(sys.dir_count() >= n)
    })
    .await;
    check(sys, r);
}

async fn redis_flushall_mid_burst_binds_every_claim_once(plane: ControlPlane) {
    let mut sys = system(plane, 1).await;
    set_sim_latency(&sys, Duration::from_millis(20));
    let claims = sys.create_claims("flush", 60, "hostpath").await.unwrap();
    wait_dirs(&sys, 10).await;
    flushall(&sys.redis.url()).await;
    set_sim_latency(&sys, Duration::ZERO);
    assert_provisioned(&sys, 60).await;
    // Once things settled, every claim is reconciled once more (the first pass may have
    // read a demoted primary during a failover).
    let again = "every claim reconciled once more after the Redis data loss";
    let deadline = Instant::now() + Duration::from_secs(60);
    while !sys
        .service(Service::Provision, 0)
        .process
        .log_text()
        .contains(again)
    {
        assert!(
            Instant::now() < deadline,
            "no second pass\n{}",
            sys.log_tails(40)
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
}

async fn sentinel_primary_killed_mid_burst_binds_every_claim_once(plane: ControlPlane) {
    let (_root, mut redis, sys) = system_on_sentinels(plane).await;
    set_sim_latency(&sys, Duration::from_millis(20));
    let claims = sys
        .create_claims("failover", 200, "hostpath")
        .await
        .unwrap();
    wait_dirs(&sys, 20).await;
    let primary = check(&sys, redis.kill_primary_and_fail_over().await);
    eprintln!(
        "failed over to :{primary} at {} directories",
        sys.dir_count()
    );
    set_sim_latency(&sys, Duration::ZERO);
    assert_provisioned(&sys, 200).await;
    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(120)).await);
}

async fn failover_to_a_stale_replica_binds_every_claim_once(plane: ControlPlane) {
    let (_root, mut redis, mut sys) = system_on_sentinels(plane).await;
    // Every PV write stays queued (pv-writer is down) on a primary whose only
    // replica misses them all (frozen); then the primary dies.
    sys.kill(Service::PvWriter, 0);
    redis.freeze(1, true);
    let mut claims = sys.create_claims("stale", 30, "hostpath").await.unwrap();
    wait_dirs(&sys, 30).await;
    let old = check(&sys, redis.kill_primary().await);
    // Claims deleted meanwhile: their records die with the primary, so their
    // volumes are left for the orphan sweep to name.
    let gone: Vec<String> = claims.drain(..3).collect();
    let mut leaked = Vec::new();
    for name in &gone {
        let claim = sys.claims_api().get(name).await.unwrap();
        leaked.push(format!("pvc-{}", claim.metadata.uid.unwrap()));
    }
    sys.delete_claims(&gone).await.unwrap();
    redis.freeze(1, false);
    let primary = check(&sys, redis.wait_failover(old).await);
    assert_eq!(primary, redis.data_port(1));
    let r = sys.restart(Service::PvWriter, 0).await;
    check(&sys, r);
    // Every live claim Bound once; a leaked volume whose intent the replica did receive
    // (replication already in its socket when it froze) is deleted by the intent walk that
    // follows Redis' return, the others stay for the sweep.
    let base = sys.base_dir().to_path_buf();
    let exists = |pv: &String| base.join(pv).exists();
    let r = wait_eq(
        Duration::from_secs(120),
        "(PVs, Bound)",
        (27, 27),
        || async {
            let pvs = sys.pvs().await?.len();
            let bound = sys
                .claims()
                .await?
                .iter()
                .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
                .count();
            Ok((pvs, bound))
        },
    )
    .await;
    check(&sys, r);
    // A new reclaim-svc leader sweeps: exactly the leaked volumes still there, by name.
    let r = sys.restart(Service::Reclaim, 0).await;
    check(&sys, r);
    let conn = common::handoff::redis_store::connect(redis.url())
        .await
        .unwrap();
    let name = sys.settings.provisioner_name.clone();
    let mut reported = check(
        &sys,
        wait_for(Duration::from_secs(60), "the orphan report", || async {
            let report = orphan_report::read(&mut conn.clone(), &name).await.ok()??;
            let left: Vec<&String> = leaked.iter().filter(|pv| exists(pv)).collect();
            (report.reporter.starts_with("reclaim-svc") && report.orphans.len() == left.len())
                .then_some(report.orphans)
        })
        .await,
    );
    reported.sort();
    let mut left: Vec<String> = leaked.iter().filter(|pv| exists(pv)).cloned().collect();
    left.sort();
    assert_eq!(reported, left, "leaked {leaked:?}");
    sys.delete_claims(&claims).await.unwrap();
    let r = sys
        .wait_pvs_and_dirs((0, left.len()), Duration::from_secs(60))
        .await;
    check(&sys, r);
}

async fn two_replicas_fail_over_within_the_lease_duration(plane: ControlPlane) {
    let mut sys = system(plane, 2).await;
    let lease = sys.settings.lease_duration;
    let retry = sys.settings.retry_period;
    set_sim_latency(&sys, Duration::from_millis(20));
    let claims = sys.create_claims("ha", 40, "hostpath").await.unwrap();
    check(
        &sys,
        wait_eq(Duration::from_secs(30), "batch started", true, || async {
            Ok(sys.dir_count() > 3)
        })
        .await,
    );
    // Kill every service's leader at once, mid-batch.
    let mut leaders = Vec::new();
    for s in Service::ALL {
        let l = {
            let r = sys.wait_leader(s, Duration::from_secs(5)).await;
            check(&sys, r)
        };
        leaders.push((s, l));
    }
    for (s, l) in &leaders {
        sys.kill(*s, *l);
    }
    let killed = Instant::now();
    for (s, l) in &leaders {
        let new = {
            let r = sys.wait_leader(*s, lease + retry * 3).await;
            check(&sys, r)
        };
        assert_ne!(new, *l, "{s:?}: the standby leads");
        eprintln!(
            "{s:?} failed over to replica {new} after {:?}",
            killed.elapsed()
        );
    }
    assert!(
        killed.elapsed() <= lease + retry * 3,
        "failover took {:?} (lease {lease:?})",
        killed.elapsed()
    );
    set_sim_latency(&sys, Duration::ZERO);
    // Backend volume count equals claim count: no double provisioning, no leak.
    assert_provisioned(&sys, 40).await;

    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
}

async fn thirty_second_api_outage_is_survived(plane: ControlPlane) {
    let mut sys = system(plane, 1).await;
    let first = sys.create_claims("pre", 20, "hostpath").await.unwrap();
    assert_provisioned(&sys, 20).await;

    // The API server is gone for 30 s: on the simulator it answers 503 to
    // everything and drops every watch; a real kube-apiserver is stopped.
    let outage = Duration::from_secs(30);
    let started = Instant::now();
    let down = {
        let r = sys.begin_outage().await;
        check(&sys, r)
    };
    // Simulator only: claims created behind the API (etcd restore, another
    // apiserver) that the services must pick up once the API answers again.
    // A stopped real API server takes no writes: there they are created as
    // soon as it is back, while the services are still reconnecting.
    let during =
        |sys: &System, i: usize| sys.claim_manifest(&format!("during-{i:02}"), "hostpath", &[]);
    let behind_the_api = sys.sim_handle().is_some();
    if let Some(sim) = sys.sim_handle() {
        for i in 0..10 {
            sim.create_object(
                "persistentvolumeclaims",
                "default",
                serde_json::to_value(during(&sys, i)).unwrap(),
            )
            .unwrap();
        }
    }
    tokio::time::sleep(outage.saturating_sub(started.elapsed())).await;
    {
        let r = sys.end_outage(down).await;
        check(&sys, r)
    };
    if !behind_the_api {
        for i in 0..10 {
            sys.claims_api()
                .create(&Default::default(), &during(&sys, i))
                .await
                .unwrap();
        }
    }

    // Leaders that could not renew stopped their work but stayed up and
    // campaign again: no process exits, nothing is restarted. A real
    // kube-controller-manager must annotate the new claims and bind them first;
    // its client-go reflectors back off up to 30 s (jitter 1.0: up to 60 s) while
    // the API server is down, so the new claims may wait that long for it.
    let converge = if behind_the_api { 60 } else { 150 };
    let deadline = Instant::now() + Duration::from_secs(converge);
    loop {
        let exited = sys.exited_replicas();
        assert!(
            exited.is_empty(),
            "no process may exit during or after an API outage: {exited:?}\n{}",
            sys.log_tails(40)
        );
        let counts = (
            sys.pvs().await.unwrap().len(),
            sys.bound_claims().await.unwrap(),
            sys.dir_count(),
        );
        if counts == (30, 30, 30) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not converged after the outage: {counts:?}\n{}",
            sys.log_tails(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_provisioned(&sys, 30).await;

    let mut all = first;
    all.extend((0..10).map(|i| format!("during-{i:02}")));
    sys.delete_claims(&all).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let exited = sys.exited_replicas();
        assert!(exited.is_empty(), "{exited:?}\n{}", sys.log_tails(40));
        if (sys.pvs().await.unwrap().len(), sys.dir_count()) == (0, 0) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "not reclaimed\n{}",
            sys.log_tails(40)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

on_both_planes!(
    sigkill_of_each_service_in_the_middle_of_a_batch_loses_nothing,
    redis_restart_loses_no_queued_pv_write,
    redis_flushall_mid_burst_binds_every_claim_once,
    sentinel_primary_killed_mid_burst_binds_every_claim_once,
    failover_to_a_stale_replica_binds_every_claim_once,
    two_replicas_fail_over_within_the_lease_duration,
    thirty_second_api_outage_is_survived,
);
