//! End-to-end with the Redis the deploy runs: the ACL of
//! `deploy/base/redis/users.acl` (default user off, one user per service),
//! each service connecting with `--redis-username` and
//! `--redis-password-file`, optionally over TLS (`rediss://` with
//! `--redis-ca-file`):
//! * claims are provisioned, Bound and reclaimed (both control planes);
//! * a service given a wrong password stays up, reports not ready on
//!   `/readyz`, logs the cause (`WRONGPASS`), never the password, and
//!   recovers once the mounted password file is corrected, without a restart;
//! * over TLS claims end Bound; a service trusting the wrong CA stays up,
//!   not ready, and logs a certificate error.

use std::time::Duration;

use common::handoff::{orphan_report, redis_store};
use e2e::harness::{wait_until, ControlPlane, RedisSecurity, Service, System, SystemOptions};
use e2e::on_both_planes;

/// Panic with the service log tails when `r` is an error.
fn check<T>(sys: &System, r: anyhow::Result<T>) -> T {
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", sys.log_tails(40)))
}

async fn system(plane: ControlPlane, security: RedisSecurity, no_services: bool) -> System {
    let mut sys = System::start(SystemOptions {
        control_plane: plane,
        redis_security: security,
        no_services,
        ..Default::default()
    })
    .await
    .expect("system starts");
    if !no_services {
        let r = sys.wait_leaders(Duration::from_secs(30)).await;
        check(&sys, r);
    }
    sys
}

/// No service log holds any of the Redis passwords.
fn assert_no_password_logged(sys: &System) {
    let dir = sys.redis.acl().expect("ACL in force").password_dir.clone();
    for entry in std::fs::read_dir(&dir).unwrap() {
        let password = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        let password = password.trim();
        for p in &sys.services {
            assert!(
                !p.process.log_text().contains(password),
                "{} logged a Redis password",
                p.identity()
            );
        }
    }
}

async fn claims_are_bound_and_reclaimed_with_acl_users(plane: ControlPlane) {
    let security = RedisSecurity {
        acl: true,
        tls: false,
    };
    let sys = system(plane, security, false).await;
    // The services really authenticate as their own users.
    let args = sys.settings.args(Service::PvWriter, 0, 0);
    assert!(
        args.windows(2)
            .any(|w| w[0] == "--redis-username" && w[1] == "pv-writer"),
        "{args:?}"
    );
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    let claims = sys.create_claims("acl", 10, "hostpath").await.unwrap();
    check(
        &sys,
        sys.wait_provisioned(10, Duration::from_secs(60)).await,
    );
    sys.delete_claims(&claims).await.unwrap();
    check(&sys, sys.wait_reclaimed(Duration::from_secs(60)).await);
    // reclaim-svc's leader-start sweep stored its report under its own user
    // (provisioner-ctl status reads it as operator).
    let name = sys.settings.provisioner_name.clone();
    let operator = redis_store::connect(&sys.redis.config_as(Some("operator")))
        .await
        .unwrap();
    let stored = wait_until(Duration::from_secs(20), "the orphan report", || {
        let (mut conn, name) = (operator.clone(), name.clone());
        async move {
            orphan_report::read(&mut conn, &name)
                .await
                .is_ok_and(|r| r.is_some())
        }
    })
    .await;
    check(&sys, stored);
    for p in &sys.services {
        // redis-rs spells the refusal `NoPerm`, the server `NOPERM`.
        let log = p.process.log_text().to_ascii_uppercase();
        assert!(
            !log.contains("NOPERM") && !log.contains("WRONGPASS") && !log.contains("NOAUTH"),
            "{}: an ACL refusal in the log:\n{}",
            p.identity(),
            p.log_tail(40)
        );
    }
    assert_no_password_logged(&sys);
}

on_both_planes!(claims_are_bound_and_reclaimed_with_acl_users);

/// Wait until `service`'s leader (replica 0) reports ready on `/readyz`, or,
/// when `ready` is false, check that it stays up and not ready for `hold`.
async fn readiness(sys: &mut System, service: Service, ready: bool, hold: Duration) {
    let r = sys.wait_leader(service, Duration::from_secs(30)).await;
    check(sys, r.map(|_| ()));
    let sys: &System = sys;
    let p = sys
        .services
        .iter()
        .find(|p| p.service == service && p.replica == 0)
        .expect("replica 0");
    if ready {
        let r = wait_until(Duration::from_secs(15), "the service reports ready", || {
            p.is_ready()
        })
        .await;
        check(sys, r);
        return;
    }
    let start = std::time::Instant::now();
    while start.elapsed() < hold {
        assert!(
            p.process_running(),
            "{} exited:\n{}",
            p.identity(),
            p.log_tail(30)
        );
        assert!(!p.is_ready().await, "{} ready without Redis", p.identity());
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_leaves_the_service_up_and_not_ready_until_the_file_is_fixed() {
    let security = RedisSecurity {
        acl: true,
        tls: false,
    };
    let mut sys = system(ControlPlane::default(), security, true).await;
    // pv-writer's mounted password file holds a wrong password.
    let good = sys.redis.password_file("pv-writer").unwrap();
    let mounted = sys.root.join("mounted-redis-users");
    std::fs::create_dir_all(&mounted).unwrap();
    for user in ["provision-svc", "reclaim-svc"] {
        std::fs::copy(sys.redis.password_file(user).unwrap(), mounted.join(user)).unwrap();
    }
    std::fs::write(mounted.join("pv-writer"), "wrong-password-0815\n").unwrap();
    sys.settings.redis_password_dir = Some(mounted.clone());
    for service in Service::ALL {
        let r = sys.start_service(service, 0).await;
        check(&sys, r);
    }
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    sys.create_claims("pw", 3, "hostpath").await.unwrap();

    readiness(&mut sys, Service::PvWriter, false, Duration::from_secs(4)).await;
    let p = sys.service(Service::PvWriter, 0);
    let log = p.process.log_text();
    assert!(
        log.contains("WRONGPASS")
            && log.contains("pv-writer")
            && log.contains("--redis-password-file"),
        "pv-writer does not log the cause:\n{}",
        p.log_tail(20)
    );
    assert!(!log.contains("0815"), "the password is logged");
    assert_eq!(sys.pvs().await.unwrap().len(), 0, "no PV without pv-writer");

    // The Secret is corrected (kubelet updates the mounted file): the running
    // process picks it up at its next retry.
    std::fs::copy(&good, mounted.join("pv-writer")).unwrap();
    readiness(&mut sys, Service::PvWriter, true, Duration::ZERO).await;
    check(&sys, sys.wait_provisioned(3, Duration::from_secs(60)).await);
    let p = sys.service(Service::PvWriter, 0);
    assert_eq!(p.starts, 1, "pv-writer was restarted");
    assert!(p.process_running());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_with_the_ca_file_binds_claims_and_a_wrong_ca_is_named() {
    let security = RedisSecurity {
        acl: true,
        tls: true,
    };
    let mut sys = system(ControlPlane::default(), security, false).await;
    assert!(sys.redis.url().starts_with("rediss://"));
    sys.create_storage_class("hostpath", "Immediate", &[])
        .await
        .unwrap();
    sys.create_claims("tls", 3, "hostpath").await.unwrap();
    check(&sys, sys.wait_provisioned(3, Duration::from_secs(60)).await);

    // pv-writer restarted trusting another CA: up, not ready, certificate error.
    let other = e2e::realkube::pki::generate(&sys.root.join("other-ca")).unwrap();
    sys.settings.redis_ca_file = Some(other.ca_cert);
    let r = sys.restart(Service::PvWriter, 0).await;
    check(&sys, r);
    readiness(&mut sys, Service::PvWriter, false, Duration::from_secs(3)).await;
    let p = sys.service(Service::PvWriter, 0);
    let log = p.process.log_text();
    assert!(
        log.contains("TLS with Redis") && log.to_ascii_lowercase().contains("certificate"),
        "pv-writer does not name the TLS failure:\n{}",
        p.log_tail(20)
    );
}
