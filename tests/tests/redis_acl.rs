//! The deploy's Redis ACL (`deploy/base/redis/users.acl`, rendered by
//! `deploy/base/redis/render-acl.sh`) against a private redis-server that
//! loads exactly it: every queue and intent operation each service performs
//! succeeds as that service's user, and each user is refused what it must not
//! do (another provisioner's keys, FLUSHALL, CONFIG, KEYS, the other
//! services' writes). Also: wrong or missing credentials fail at connect with
//! an error naming the cause, never the password; and the dev overlay wires
//! each service to its own user and Secret key.

use std::collections::BTreeSet;
use std::time::Duration;

use api_types::queue::{ClaimKey, ProvisionIntent, QueuedPvWrite, INTENT_VERSION, SCHEMA_VERSION};
use common::handoff::intents::IntentStore;
use common::handoff::queue::{DeadLetter, PvQueue, Settled};
use common::handoff::redis_store::{self, ConnectError, RedisConfig};
use e2e::harness::redis::{deploy_acl_template, deploy_acl_users, RedisSecurity, RedisServer};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use provision_svc::ports::{PvHandoff, QueuedState, SignedQueue};

const NAME: &str = "example.com/hostpath";

async fn acl_redis() -> (tempfile::TempDir, RedisServer) {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start_secured(
        &dir.path().join("redis"),
        &dir.path().join("redis.log"),
        RedisSecurity {
            acl: true,
            tls: false,
        },
        NAME,
    )
    .await
    .expect("redis-server with the deploy ACL");
    (dir, redis)
}

fn entry(name: &str) -> QueuedPvWrite {
    QueuedPvWrite {
        version: SCHEMA_VERSION,
        pv: PersistentVolume {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        },
        claim: ClaimKey {
            namespace: "ns".into(),
            name: format!("claim-{name}"),
            uid: format!("uid-{name}"),
        },
        class: "fast".into(),
        enqueued_at_ms: 1_000,
        first_attempt_at_ms: None,
        mac: None,
    }
}

fn intent(pv: &str) -> ProvisionIntent {
    ProvisionIntent {
        version: INTENT_VERSION,
        claim: ClaimKey {
            namespace: "ns".into(),
            name: format!("claim-{pv}"),
            uid: format!("uid-{pv}"),
        },
        pv_name: pv.into(),
        class: "fast".into(),
        recorded_at_ms: 7,
        storage_class: None,
        selected_node: None,
    }
}

fn denied<T: std::fmt::Debug, E: std::fmt::Display>(what: &str, r: Result<T, E>) {
    match r {
        Ok(v) => panic!("{what}: allowed ({v:?}) but the ACL must refuse it"),
        Err(e) => assert!(
            e.to_string().contains("NOPERM") || e.to_string().contains("permission"),
            "{what}: refused for another reason: {e}"
        ),
    }
}

/// A raw command as `config`'s user; `Err` carries the server's refusal.
async fn raw(config: &RedisConfig, args: &[&str]) -> redis::RedisResult<redis::Value> {
    let mut conn = redis_store::connect(config).await.expect("connects");
    let mut cmd = redis::cmd(args[0]);
    for a in &args[1..] {
        cmd.arg(*a);
    }
    cmd.query_async(&mut conn).await
}

/// What every user must be refused: admin commands, enumeration, and keys
/// outside its provisioner's prefix.
async fn assert_no_admin_and_no_foreign_keys(redis: &RedisServer, user: &str) {
    let c = redis.config_as(Some(user));
    denied(&format!("{user}: FLUSHALL"), raw(&c, &["FLUSHALL"]).await);
    denied(
        &format!("{user}: CONFIG SET"),
        raw(&c, &["CONFIG", "SET", "appendonly", "no"]).await,
    );
    denied(&format!("{user}: KEYS"), raw(&c, &["KEYS", "*"]).await);
    denied(
        &format!("{user}: ACL LIST"),
        raw(&c, &["ACL", "LIST"]).await,
    );
    denied(
        &format!("{user}: another provisioner's payloads"),
        raw(
            &c,
            &["HEXISTS", "provisioner:{other.io/x}:pv-queue:payloads", "a"],
        )
        .await,
    );
    denied(
        &format!("{user}: a key outside any prefix"),
        raw(&c, &["GET", "unrelated"]).await,
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_service_user_can_do_exactly_its_queue_and_intent_operations() {
    let (_dir, redis) = acl_redis().await;
    // Only commands newer than this server may be left out of the file.
    let dropped: BTreeSet<&str> = redis
        .acl()
        .unwrap()
        .dropped_rules
        .iter()
        .map(String::as_str)
        .collect();
    assert!(
        dropped.is_subset(&BTreeSet::from(["+waitaof", "+client|setinfo"])),
        "rules this redis-server refused: {dropped:?}"
    );
    assert_eq!(
        deploy_acl_users().unwrap(),
        ["provision-svc", "pv-writer", "reclaim-svc", "operator"]
    );

    // provision-svc: intents, enqueue (script + WAITAOF where known), lookups.
    let ps = redis.config_as(Some("provision-svc"));
    let ps_queue = PvQueue::connect(&ps, NAME)
        .await
        .expect("provision-svc queue");
    let ps_intents = IntentStore::connect(&ps, NAME)
        .await
        .expect("provision-svc intents");
    for pv in ["pvc-a", "pvc-b", "pvc-c"] {
        assert!(ps_intents
            .record_with_claim(&intent(pv), &PersistentVolumeClaim::default(), false)
            .await
            .unwrap());
    }
    assert!(ps_intents
        .record_with_claim(&intent("pvc-d"), &PersistentVolumeClaim::default(), true)
        .await
        .unwrap());
    assert!(ps_intents.contains("pvc-a").await.unwrap());
    assert_eq!(ps_intents.count().await.unwrap(), 4);
    assert_eq!(ps_intents.list_with_claims().await.unwrap().len(), 4);
    assert!(ps_intents.clear("pvc-d").await.unwrap());
    for pv in ["pvc-a", "pvc-b", "pvc-c"] {
        let out = ps_queue.enqueue(&entry(pv)).await.unwrap();
        assert!(out.added && out.intent_cleared, "{pv}: {out:?}");
        assert!(ps_queue.is_pending(pv).await.unwrap());
    }
    assert_eq!(ps_intents.count().await.unwrap(), 0);

    // reclaim-svc: the orphan sweep's read-only lookups.
    let rs = redis.config_as(Some("reclaim-svc"));
    let rs_queue = PvQueue::connect(&rs, NAME)
        .await
        .expect("reclaim-svc queue");
    let rs_intents = IntentStore::connect(&rs, NAME)
        .await
        .expect("reclaim-svc intents");
    assert!(rs_queue.is_pending("pvc-a").await.unwrap());
    assert!(!rs_intents.contains("pvc-a").await.unwrap());

    // pv-writer: the wake-up, a term, take, settle every way, recover, stats
    // and the `provisioner-ctl queue` subcommand's reads and requeue.
    let pw = redis.config_as(Some("pv-writer"));
    let writer = PvQueue::connect(&pw, NAME)
        .await
        .expect("provisioner-ctl queue");
    assert!(writer.wait_for_work(Duration::from_secs(2)).await.unwrap());
    let old = writer.begin_term().await.unwrap();
    let epoch = writer.begin_term().await.unwrap();
    assert_eq!(writer.current_term().await.unwrap(), epoch);
    let taken = writer
        .take_due(epoch, 10, Duration::from_secs(60))
        .await
        .unwrap()
        .expect("current term");
    assert_eq!(taken.len(), 3);
    assert_eq!(writer.holds(epoch, "pvc-a").await.unwrap(), Settled::Done);
    assert_eq!(
        writer.complete(old, "pvc-a").await.unwrap(),
        Settled::Fenced
    );
    assert_eq!(writer.fenced_operations().await.unwrap(), 1);
    assert_eq!(
        writer.complete(epoch, "pvc-a").await.unwrap(),
        Settled::Done
    );
    assert_eq!(
        writer
            .schedule_retry(epoch, "pvc-b", Duration::from_secs(600), 1)
            .await
            .unwrap(),
        Settled::Done
    );
    assert_eq!(writer.pull_forward_retries().await.unwrap(), 1);
    let letter = DeadLetter {
        pv_name: "pvc-c".into(),
        reason: "test".into(),
        dead_at_ms: 1,
        attempts: 1,
        claim: None,
    };
    assert_eq!(
        writer.dead_letter(epoch, &letter).await.unwrap(),
        Settled::Done
    );
    assert_eq!(writer.list_dead().await.unwrap().len(), 1);
    assert!(matches!(
        SignedQueue::new(ps_queue.clone(), None, NAME)
            .queued_state("pvc-c", "uid-pvc-c")
            .await
            .unwrap(),
        QueuedState::Stalled {
            kind: "dead_lettered",
            ..
        }
    ));
    assert!(writer.requeue_dead("pvc-c").await.unwrap());
    let taken = writer
        .take_due(epoch, 10, Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert_eq!(taken.len(), 2);
    let next = writer.begin_term().await.unwrap();
    assert_eq!(writer.recover_inflight(next).await.unwrap(), 2);
    let stats = writer.stats().await.unwrap();
    assert_eq!((stats.depth, stats.dead), (2, 0));
    assert_eq!(writer.list_pending().await.unwrap().len(), 2);
    assert!(writer.payload("pvc-b").await.unwrap().is_some());

    // operator: read-only status.
    let op = PvQueue::connect(&redis.config_as(Some("operator")), NAME)
        .await
        .expect("operator queue");
    assert_eq!(op.stats().await.unwrap().depth, 2);
    assert_eq!(op.list_pending().await.unwrap().len(), 2);
    assert!(op.list_dead().await.unwrap().is_empty());

    // What each user must not do.
    for user in ["provision-svc", "pv-writer", "reclaim-svc", "operator"] {
        assert_no_admin_and_no_foreign_keys(&redis, user).await;
    }
    // provision-svc's own view of its claim's entry (verified, dead letter
    // read): pvc-c was dead-lettered and requeued, pvc-b is pending.
    let handoff = SignedQueue::new(ps_queue.clone(), None, NAME);
    assert_eq!(
        handoff.queued_state("pvc-b", "uid-pvc-b").await.unwrap(),
        QueuedState::Yes
    );
    assert_eq!(
        handoff.queued_state("pvc-x", "uid-pvc-x").await.unwrap(),
        QueuedState::No
    );
    assert!(handoff.is_pending("pvc-b").await.unwrap());
    // provision-svc cannot make an entry due, re-arm or delay one by hand
    // (only the enqueue script's `incoming` push, which arms fresh entries only).
    let p = "provisioner:{example.com/hostpath}:pv-queue:";
    for (what, args) in [
        (
            "ZADD due in the future",
            vec![
                "ZADD".to_string(),
                format!("{p}due"),
                "99999999999999".into(),
                "pvc-b".into(),
            ],
        ),
        (
            "ZADD on the wake-up list's key",
            vec!["ZADD".into(), format!("{p}wakeup"), "1".into(), "x".into()],
        ),
        (
            "RPUSH on the payloads' key",
            vec!["RPUSH".into(), format!("{p}payloads"), "x".into()],
        ),
        (
            "HSETNX a dead letter",
            vec![
                "HSETNX".into(),
                format!("{p}dead"),
                "pvc-x".into(),
                "{}".into(),
            ],
        ),
    ] {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        denied(&format!("provision-svc: {what}"), raw(&ps, &args).await);
    }
    // provision-svc cannot take, settle or fence entries, nor overwrite a payload.
    denied("provision-svc: begin a term", ps_queue.begin_term().await);
    denied(
        "provision-svc: take",
        ps_queue.take_due(next, 1, Duration::from_secs(1)).await,
    );
    denied(
        "provision-svc: overwrite a payload",
        raw(
            &ps,
            &[
                "HSET",
                "provisioner:{example.com/hostpath}:pv-queue:payloads",
                "pvc-b",
                "x",
            ],
        )
        .await,
    );
    denied(
        "provision-svc: delete a payload",
        raw(
            &ps,
            &[
                "HDEL",
                "provisioner:{example.com/hostpath}:pv-queue:payloads",
                "pvc-b",
            ],
        )
        .await,
    );
    // pv-writer cannot touch the provisioning intents.
    let pw_intents = IntentStore::connect(&pw, NAME).await.unwrap();
    let (claim, pvc_x) = (PersistentVolumeClaim::default(), intent("pvc-x"));
    let record = pw_intents.record_with_claim(&pvc_x, &claim, false);
    denied("pv-writer: record an intent", record.await);
    denied(
        "pv-writer: clear an intent",
        pw_intents.clear("pvc-a").await,
    );
    denied("pv-writer: read intents", pw_intents.count().await);
    // A refusal is an error on a working connection (redis-rs 1.8 panics, breaking the
    // connection, when an ACL refuses a MULTI pipeline: the intents are scripts).
    let pong: String = redis::cmd("PING")
        .query_async(&mut pw_intents.connection())
        .await
        .expect("connection still works after the refusals");
    assert_eq!(pong, "PONG");
    let intents_key = "provisioner:{example.com/hostpath}:provision-intents";
    let record = ["HSET", intents_key, "pvc-x", "{}"];
    // reclaim-svc and operator write nothing.
    denied(
        "reclaim-svc: enqueue",
        rs_queue.enqueue(&entry("pvc-x")).await,
    );
    denied("reclaim-svc: record an intent", raw(&rs, &record).await);
    denied("operator: requeue", op.requeue_dead("pvc-b").await);
    denied("operator: begin a term", op.begin_term().await);
    assert_eq!(writer.stats().await.unwrap().depth, 2, "nothing changed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_or_missing_credentials_fail_at_connect_naming_the_cause() {
    let (dir, redis) = acl_redis().await;
    // No credentials: the default user is off.
    let err = PvQueue::connect(redis.url(), NAME)
        .await
        .err()
        .expect("refused");
    let text = err.to_string();
    assert!(
        text.contains("NOAUTH") || text.contains("WRONGPASS"),
        "{text}"
    );
    assert!(text.contains("--redis-password-file"), "{text}");

    // A wrong password: WRONGPASS, the user named, the password never shown.
    let wrong = dir.path().join("wrong");
    std::fs::write(&wrong, "not-the-password-4711\n").unwrap();
    let mut config = redis.config_as(Some("pv-writer"));
    config.auth.redis_password_file = Some(wrong.clone());
    let err = redis_store::connect(&config).await.expect_err("refused");
    assert!(
        matches!(err, ConnectError::Auth { ref code, .. } if code == "WRONGPASS"),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("\"pv-writer\"") && text.contains("WRONGPASS"),
        "{text}"
    );
    assert!(
        !text.contains("4711") && !format!("{err:?}").contains("4711"),
        "{text}"
    );
    // Same through the intent store.
    let err = IntentStore::connect(&config, NAME)
        .await
        .err()
        .expect("refused");
    assert!(err.to_string().contains("WRONGPASS"), "{err}");

    // The password file is read at every attempt: fixing it needs no restart.
    std::fs::copy(redis.password_file("pv-writer").unwrap(), &wrong).unwrap();
    redis_store::connect(&config)
        .await
        .expect("fixed password connects");
}

/// `kubectl kustomize <repo>/<dir>`, or `None` (skip) without kubectl unless
/// `CI=true`.
fn kustomize(dir: &str) -> Option<Vec<serde_yaml::Value>> {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap();
    let out = match std::process::Command::new("kubectl")
        .arg("kustomize")
        .arg(root.join(dir))
        .output()
    {
        Ok(out) => out,
        Err(e) if std::env::var("CI").as_deref() != Ok("true") => {
            eprintln!("skipping: kubectl not runnable: {e}");
            return None;
        }
        Err(e) => panic!("kubectl: {e}"),
    };
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    Some(
        serde_yaml::Deserializer::from_str(&text)
            .map(|d| serde::Deserialize::deserialize(d).unwrap())
            .collect(),
    )
}

fn find<'a>(objs: &'a [serde_yaml::Value], kind: &str, name_prefix: &str) -> &'a serde_yaml::Value {
    objs.iter()
        .find(|o| {
            o["kind"].as_str() == Some(kind)
                && o["metadata"]["name"]
                    .as_str()
                    .is_some_and(|n| n.starts_with(name_prefix))
        })
        .unwrap_or_else(|| panic!("{kind} {name_prefix}* not rendered"))
}

fn env_value<'a>(container: &'a serde_yaml::Value, name: &str) -> Option<&'a str> {
    container["env"]
        .as_sequence()?
        .iter()
        .find(|e| e["name"].as_str() == Some(name))?["value"]
        .as_str()
}

#[test]
fn dev_overlay_gives_each_service_its_own_redis_user_and_secret_key() {
    let Some(objs) = kustomize("deploy/overlays/dev") else {
        return;
    };
    let users = deploy_acl_users().unwrap();
    let secret = find(&objs, "Secret", "split-provisioner-redis-users");
    let secret_name = secret["metadata"]["name"].as_str().unwrap();
    for user in &users {
        assert!(
            secret["data"][user.as_str()].as_str().is_some(),
            "dev Secret lacks key {user}"
        );
    }
    for service in ["provision-svc", "pv-writer", "reclaim-svc"] {
        let deploy = find(&objs, "Deployment", service);
        let pod = &deploy["spec"]["template"]["spec"];
        let c = &pod["containers"][0];
        assert_eq!(env_value(c, "REDIS_USERNAME"), Some(service), "{service}");
        let file = env_value(c, "REDIS_PASSWORD_FILE").expect("REDIS_PASSWORD_FILE");
        let mount = c["volumeMounts"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|m| file.starts_with(m["mountPath"].as_str().unwrap()))
            .unwrap_or_else(|| panic!("{service}: {file} is not on a mount"));
        let volume = pod["volumes"]
            .as_sequence()
            .unwrap()
            .iter()
            .find(|v| v["name"] == mount["name"])
            .unwrap();
        assert_eq!(volume["secret"]["secretName"].as_str(), Some(secret_name));
        let items = volume["secret"]["items"]
            .as_sequence()
            .expect("only its own key");
        assert_eq!(items.len(), 1, "{service} mounts only its own password");
        assert_eq!(items[0]["key"].as_str(), Some(service));
        let path = format!(
            "{}/{}",
            mount["mountPath"].as_str().unwrap().trim_end_matches('/'),
            items[0]["path"].as_str().unwrap()
        );
        assert_eq!(path, file, "{service}");
        assert!(
            c["env"]
                .as_sequence()
                .unwrap()
                .iter()
                .all(|e| e["name"] != "REDIS_PASSWORD"),
            "{service}: the password comes from a file, not env"
        );
    }
    // Redis itself: the ACL from the ConfigMap that holds users.acl verbatim,
    // protected mode on.
    let sts = find(&objs, "StatefulSet", "redis");
    let args: Vec<&str> = sts["spec"]["template"]["spec"]["containers"][0]["args"]
        .as_sequence()
        .unwrap()
        .iter()
        .filter_map(|a| a.as_str())
        .collect();
    let opt = |name: &str| {
        args.windows(2)
            .find(|w| w[0] == format!("--{name}"))
            .map(|w| w[1])
    };
    assert_eq!(opt("protected-mode"), Some("yes"), "{args:?}");
    assert!(opt("aclfile").is_some(), "{args:?}");
    let acl_cm = find(&objs, "ConfigMap", "redis-acl");
    let template = std::fs::read_to_string(e2e::harness::redis::deploy_acl_template()).unwrap();
    assert_eq!(
        acl_cm["data"]["users.acl"].as_str(),
        Some(template.as_str())
    );
}

/// reclaim-svc's real leader-start sweep (`reclaim_svc::sweep::run_once`) as
/// its own Redis user: its lookups and the report it stores for
/// `provisioner-ctl status` (read back as `operator`) all pass the deploy ACL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reclaim_svc_sweep_runs_and_stores_its_report_under_its_own_user() {
    let (dir, redis) = acl_redis().await;
    let sim = e2e::sim::Simulator::start(e2e::sim::SimConfig::bare())
        .await
        .unwrap();
    let base = dir.path().join("volumes");
    std::fs::create_dir_all(base.join("pvc-orphan")).unwrap();
    let backend = std::sync::Arc::new(backend_hostpath::base_dirs::BaseDirs(vec![
        backend_hostpath::HostPath {
            base_dir: base,
            node_name: None,
            on_delete: backend_hostpath::OnDelete::Retain,
            capacity: None,
        },
    ]));
    let registry = prometheus::Registry::new();
    let job = reclaim_svc::sweep::SweepJob {
        redis: redis.config_as(Some("reclaim-svc")),
        provisioner_name: NAME.into(),
        pvs: kube::Api::all(sim.client().unwrap()),
        backend,
        action: reclaim_svc::sweep::SweepAction {
            archive: false,
            min_age: Duration::from_secs(3600),
            shutdown: tokio_util::sync::CancellationToken::new(),
        },
        metrics: reclaim_svc::metrics::SweepMetrics::register(&registry),
        reporter: "reclaim-svc-test".into(),
    };
    reclaim_svc::sweep::run_once(job, |_| false).await;
    let mut operator = redis_store::connect(&redis.config_as(Some("operator")))
        .await
        .unwrap();
    let report = common::handoff::orphan_report::read(&mut operator, NAME)
        .await
        .unwrap()
        .expect("the sweep stored its report under reclaim-svc's user");
    assert_eq!(report.orphans, ["pvc-orphan"]);
    assert_eq!(report.reporter, "reclaim-svc-test");
    // Its one writable key: SET anywhere else is still refused.
    let rs = redis.config_as(Some("reclaim-svc"));
    denied(
        "reclaim-svc: SET on the queue payloads",
        raw(
            &rs,
            &[
                "SET",
                "provisioner:{example.com/hostpath}:pv-queue:payloads",
                "x",
            ],
        )
        .await,
    );
}

/// The deploy ACL keeps the `default` user off. Redis 7.0 replays an AOF's MULTI/EXEC
/// blocks (each multi-write script's effects) as that user and drops those it may not run
/// (redis/redis#14541): a restart must keep what the scripts wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restart_keeps_what_the_scripts_wrote() {
    let (dir, mut redis) = acl_redis().await;
    let ps = redis.config_as(Some("provision-svc"));
    let claim = PersistentVolumeClaim::default();
    {
        let intents = IntentStore::connect(&ps, NAME).await.unwrap();
        for pv in ["pvc-a", "pvc-b"] {
            let pv = intent(pv);
            assert!(intents.record_with_claim(&pv, &claim, false).await.unwrap());
        }
        let queue = PvQueue::connect(&ps, NAME).await.unwrap();
        assert!(queue.enqueue(&entry("pvc-a")).await.unwrap().added);
    }
    redis.restart(false).await.unwrap();
    let log = std::fs::read_to_string(dir.path().join("redis.log")).expect("redis log");
    assert!(
        !log.contains("AOF-loading-client"),
        "AOF replay refused:\n{log}"
    );
    let intents = IntentStore::connect(&ps, NAME).await.unwrap();
    assert!(
        intents.contains("pvc-b").await.unwrap(),
        "recorded intent kept"
    );
    assert!(
        !intents.contains("pvc-a").await.unwrap(),
        "enqueue's clear kept"
    );
    let reader = PvQueue::connect(&redis.config_as(Some("operator")), NAME)
        .await
        .unwrap();
    assert_eq!(reader.stats().await.unwrap().depth, 1, "queued entry kept");
    // The rights do not make `default` usable: a connection without credentials writes nothing.
    let client = redis::Client::open(redis.url()).unwrap();
    let mut conn = client.get_multiplexed_async_connection().await.unwrap();
    let hset = redis::cmd("HSET")
        .arg("provisioner:{example.com/hostpath}:provision-intents")
        .arg("pvc-z")
        .arg("{}")
        .query_async::<i64>(&mut conn)
        .await;
    assert!(hset.unwrap_err().to_string().contains("NOAUTH"));
}

/// `default`'s rights (for Redis' AOF replay) are plain writes on the provisioner's keys
/// and SELECT (Redis 8 puts one inside the first MULTI block after each start): its
/// template line, loaded as a user of an open Redis, checked with `ACL DRYRUN`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replay_rights_of_default_are_plain_writes_on_the_provisioners_keys() {
    let dir = tempfile::tempdir().unwrap();
    let redis = RedisServer::start(&dir.path().join("redis"), &dir.path().join("redis.log"))
        .await
        .unwrap();
    let template = std::fs::read_to_string(deploy_acl_template()).unwrap();
    let line = template
        .lines()
        .find(|l| l.starts_with("user default "))
        .unwrap();
    let line = line
        .replace("${PROVISIONER_NAME}", NAME)
        .replace("${RANDOM_PASSWORD}", "nopass");
    let mut setuser = vec!["ACL", "SETUSER", "replay"];
    setuser.extend(line.split_whitespace().skip(2));
    let admin = redis.admin_config();
    raw(&admin, &setuser).await.unwrap();
    let may = |args: &'static [&'static str]| {
        let admin = admin.clone();
        async move {
            let cmd: Vec<&str> = ["ACL", "DRYRUN", "replay"]
                .iter()
                .chain(args)
                .copied()
                .collect();
            matches!(raw(&admin, &cmd).await.unwrap(), redis::Value::Okay)
        }
    };
    const KEY: &str = "provisioner:{example.com/hostpath}:pv-queue:payloads";
    assert!(may(&["HSET", KEY, "pvc-z", "{}"]).await);
    assert!(may(&["SELECT", "0"]).await, "a replayed block's SELECT");
    assert!(
        may(&[
            "ZADD",
            "provisioner:{example.com/hostpath}:pv-queue:due",
            "1",
            "a"
        ])
        .await
    );
    assert!(
        !may(&[
            "HSET",
            "provisioner:{other.io/x}:pv-queue:payloads",
            "a",
            "b"
        ])
        .await
    );
    for args in [
        &["FLUSHALL"][..],
        &["FLUSHDB"],
        &["SWAPDB", "0", "1"],
        &["RESTORE", KEY, "0", "x"],
    ] {
        assert!(!may(args).await, "default may run {args:?}");
    }
}
