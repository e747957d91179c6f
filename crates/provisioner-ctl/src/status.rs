//! `provisioner-ctl status`: one operator's view of a provisioner name across the
//! three services — the PV-write queue (depth, oldest pending age, dead letters,
//! in-flight entries and their owner term), provisioning intents, the last
//! orphan sweep's report and the three Leases. Read-only; each part is read on
//! its own, and one that fails is reported in `errors` while the rest is shown.

use std::fmt::Display;

use api_types::lease_name;
use common::handoff::intents::IntentStore;
use common::handoff::orphan_report::{self, OrphanReport};
use common::handoff::queue::{PendingState, PvQueue};
use common::handoff::redis_store::RedisConfig;
use common::runtime::telemetry::error_chain;
use k8s_openapi::api::coordination::v1::Lease;
use kube::{Api, Client};
use serde::Serialize;

/// The status of every requested provisioner name.
#[derive(Debug, Clone, Serialize)]
pub struct Status {
    /// One entry per provisioner name, in the order asked.
    pub provisioners: Vec<ProvisionerStatus>,
}

/// Everything about one provisioner name.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ProvisionerStatus {
    /// The provisioner name (StorageClass `provisioner`).
    pub provisioner_name: String,
    /// The PV-write queue; `None` when Redis could not be read.
    pub queue: Option<QueueStatus>,
    /// Provisioning intents: volumes provision-svc is making whose PV is not
    /// queued yet, sorted by PV name.
    pub intents: Vec<IntentStatus>,
    /// Sections whose source could not be read (`queue`, `intents`, `orphan sweep`):
    /// the table says `unavailable` instead of empty; the cause is in `errors`.
    #[serde(skip)]
    pub unavailable: Vec<&'static str>,
    /// The last completed orphan sweep; `None` before the first one (or when
    /// unreadable, then see `errors`).
    pub orphan_report: Option<OrphanReport>,
    /// Seconds since that sweep finished.
    pub orphan_report_age_seconds: Option<f64>,
    /// The three services' Leases: provision-svc, pv-writer, reclaim-svc.
    pub leases: Vec<LeaseStatus>,
    /// Parts that could not be read.
    pub errors: Vec<String>,
}

/// The durable PV-write queue.
#[derive(Debug, Clone, Serialize)]
pub struct QueueStatus {
    /// Pending entries (due + in flight), dead letters excluded.
    pub depth: u64,
    /// Seconds since the oldest pending entry was enqueued (0 when empty), by Redis' clock.
    pub oldest_pending_age_seconds: f64,
    /// The current pv-writer leader term (fencing token; 0 before the first leader).
    pub current_term: u64,
    /// Entries a writer has taken.
    pub in_flight: Vec<InFlightStatus>,
    /// Dead letters, waiting for an operator (`provisioner-ctl queue requeue <PV>`).
    pub dead_letters: Vec<DeadLetterStatus>,
}

/// One in-flight entry.
#[derive(Debug, Clone, Serialize)]
pub struct InFlightStatus {
    /// PV name.
    pub pv_name: String,
    /// `namespace/name` of the claim (`None` when the payload is unreadable).
    pub claim: Option<String>,
    /// The pv-writer term that took it (`pv-queue:owners`).
    pub owner_term: Option<u64>,
    /// True when the owner is an earlier term than the current one: the next
    /// leader's recovery (or the visibility timeout) gives it back to the queue.
    pub stale_owner: bool,
    /// Seconds until the visibility timeout returns it to the queue.
    pub visible_again_in_seconds: f64,
    /// Failed write attempts so far.
    pub attempts: u32,
}

/// One dead letter.
#[derive(Debug, Clone, Serialize)]
pub struct DeadLetterStatus {
    /// PV name.
    pub pv_name: String,
    /// `namespace/name` of the claim, when known.
    pub claim: Option<String>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Failed attempts before it was dead-lettered.
    pub attempts: u32,
    /// Seconds since it was dead-lettered.
    pub dead_for_seconds: f64,
}

/// One provisioning intent.
#[derive(Debug, Clone, Serialize)]
pub struct IntentStatus {
    /// PV name the backend was asked for.
    pub pv_name: String,
    /// `namespace/name` of the claim.
    pub claim: String,
    /// StorageClass name.
    pub class: String,
    /// Seconds since the intent was recorded.
    pub age_seconds: f64,
    /// The backend answered `InBackground` (the seed's "claims in progress").
    pub in_background: bool,
}

/// One service's Lease as the API server has it.
#[derive(Debug, Clone, Default, Serialize)]
pub struct LeaseStatus {
    /// `provision-svc`, `pv-writer` or `reclaim-svc`.
    pub service: String,
    /// Lease name (`<provisioner name with / → ->-<suffix>`).
    pub name: String,
    /// Lease namespace: where it was found, else the namespace asked for;
    /// `None` when none was asked for and no namespace has it.
    pub namespace: Option<String>,
    /// Whether the Lease exists (false before the service's first start).
    pub found: bool,
    /// `spec.holderIdentity`; `None` when the Lease does not exist, is
    /// released, or could not be read (see `error`).
    pub holder: Option<String>,
    /// Seconds since `spec.renewTime` (the holder's last renewal).
    pub renewed_seconds_ago: Option<f64>,
    /// `spec.leaseDurationSeconds`.
    pub lease_duration_seconds: Option<i32>,
    /// The holder has not renewed within the lease duration (expired Lease).
    pub expired: bool,
    /// `spec.leaseTransitions`.
    pub transitions: Option<i32>,
    /// Why the Lease could not be read, if so.
    pub error: Option<String>,
}

/// The status of `names` from Redis at `redis` and, with `leases` (client and
/// namespace, `None`: search every namespace), the Leases; `now_ms` ages
/// intents and Leases. Never fails: unreadable parts go to `errors`.
pub async fn gather(
    names: &[String],
    redis: &RedisConfig,
    leases: Option<(&Client, Option<&str>)>,
    now_ms: u64,
) -> Status {
    let mut provisioners = Vec::with_capacity(names.len());
    for name in names {
        let mut status = ProvisionerStatus {
            provisioner_name: name.to_string(),
            ..Default::default()
        };
        match common::handoff::redis_store::connect(redis).await {
            Ok(conn) => {
                let queue = queue_status(&PvQueue::with_connection(conn.clone(), name)).await;
                status.queue = status.read("queue", queue);
                let intents = IntentStore::with_connection(conn.clone(), name);
                if let Some(entries) = status.read("intents", intents.list_with_claims().await) {
                    status.intents = entries
                        .into_iter()
                        .map(|e| IntentStatus {
                            claim: e.intent.claim.to_string(),
                            pv_name: e.intent.pv_name,
                            class: e.intent.class,
                            age_seconds: age_seconds(now_ms, e.intent.recorded_at_ms),
                            in_background: e.claim.is_some_and(|c| c.in_background),
                        })
                        .collect();
                    status.intents.sort_by(|a, b| a.pv_name.cmp(&b.pv_name));
                }
                let report = orphan_report::read(&mut conn.clone(), name).await;
                if let Some(report) = status.read("orphan sweep", report) {
                    status.orphan_report_age_seconds =
                        report.as_ref().map(|r| age_seconds(now_ms, r.swept_at_ms));
                    status.orphan_report = report;
                }
            }
            // The error names the (redacted) URL; once, for the three parts it hides.
            Err(e) => {
                status.errors.push(format!("redis: {e}"));
                status.unavailable = vec!["queue", "intents", "orphan sweep"];
            }
        }
        if let Some((client, namespace)) = leases {
            for (service, lease_suffix) in SERVICES {
                let lease =
                    lease_status(client, service, lease_suffix, name, namespace, now_ms).await;
                if let Some(e) = &lease.error {
                    status.errors.push(format!("lease {}: {e}", lease.name));
                }
                status.leases.push(lease);
            }
        }
        provisioners.push(status);
    }
    Status { provisioners }
}

impl ProvisionerStatus {
    /// `result`'s value; on an error, `None` with `part` noted in `errors` and `unavailable`.
    fn read<T>(&mut self, part: &'static str, result: Result<T, impl Display>) -> Option<T> {
        result
            .map_err(|e| {
                self.errors.push(format!("{part}: {e}"));
                self.unavailable.push(part);
            })
            .ok()
    }
}

async fn queue_status(queue: &PvQueue) -> Result<QueueStatus, common::handoff::queue::QueueError> {
    let stats = queue.stats().await?;
    let now = stats.redis_now_ms;
    let current_term = queue.current_term().await?;
    let in_flight = queue
        .list_pending()
        .await?
        .into_iter()
        .filter_map(|e| match e.state {
            PendingState::InFlight(until) => Some(InFlightStatus {
                claim: e.entry.as_ref().ok().map(|w| w.claim.to_string()),
                stale_owner: e.owner_term.is_some_and(|t| t < current_term),
                owner_term: e.owner_term,
                visible_again_in_seconds: age_seconds(until, now),
                attempts: e.attempts,
                pv_name: e.pv_name,
            }),
            PendingState::Due(_) => None,
        })
        .collect();
    let dead_letters = queue
        .list_dead()
        .await?
        .into_iter()
        .map(|d| DeadLetterStatus {
            claim: d.claim.as_ref().map(|c| c.to_string()),
            dead_for_seconds: age_seconds(now, d.dead_at_ms),
            pv_name: d.pv_name,
            reason: d.reason,
            attempts: d.attempts,
        })
        .collect();
    Ok(QueueStatus {
        depth: stats.depth,
        oldest_pending_age_seconds: stats.oldest_age_seconds(now),
        current_term,
        in_flight,
        dead_letters,
    })
}

/// The Lease `name` in `namespace` (without one: in any namespace), `None` if
/// absent. Errors: the call failed, or several namespaces hold it.
async fn find_lease(
    client: &Client,
    name: &str,
    namespace: Option<&str>,
) -> anyhow::Result<Option<Lease>> {
    if let Some(ns) = namespace {
        let api: Api<Lease> = Api::namespaced(client.clone(), ns);
        return Ok(api.get_opt(name).await?);
    }
    let api: Api<Lease> = Api::all(client.clone());
    let by_name = kube::api::ListParams::default().fields(&format!("metadata.name={name}"));
    let found = api.list(&by_name).await?.items;
    anyhow::ensure!(
        found.len() <= 1,
        "a Lease {name} exists in several namespaces ({}); give --leader-election-namespace",
        found
            .iter()
            .filter_map(|l| l.metadata.namespace.clone())
            .collect::<Vec<_>>()
            .join(", ")
    );
    Ok(found.into_iter().next())
}

/// The services' component names and Lease suffixes (`<provisioner>-<suffix>`).
const SERVICES: [(&str, &str); 3] = [
    ("provision-svc", "provision"),
    ("pv-writer", "pv-writer"),
    ("reclaim-svc", "reclaim"),
];

async fn lease_status(
    client: &Client,
    service: &str,
    lease_suffix: &str,
    provisioner_name: &str,
    namespace: Option<&str>,
    now_ms: u64,
) -> LeaseStatus {
    let name = lease_name(provisioner_name, lease_suffix);
    let found = find_lease(client, &name, namespace).await;
    let mut status = LeaseStatus {
        service: service.to_string(),
        name,
        namespace: namespace.map(str::to_string),
        error: found.as_ref().err().map(|e| error_chain(e.as_ref())),
        ..Default::default()
    };
    let Ok(Some(lease)) = found else {
        return status;
    };
    status.found = true;
    status.namespace = lease.metadata.namespace.or(status.namespace);
    let spec = lease.spec.unwrap_or_default();
    status.holder = spec.holder_identity.filter(|h| !h.is_empty());
    status.renewed_seconds_ago = spec
        .renew_time
        .map(|t| age_seconds(now_ms, t.0.as_millisecond().max(0) as u64));
    status.lease_duration_seconds = spec.lease_duration_seconds;
    status.transitions = spec.lease_transitions;
    status.expired = match (status.renewed_seconds_ago, spec.lease_duration_seconds) {
        (Some(ago), Some(d)) => ago > f64::from(d),
        _ => status.holder.is_some(),
    };
    status
}

/// `later - earlier` in seconds, 0 when `earlier` is later.
fn age_seconds(later_ms: u64, earlier_ms: u64) -> f64 {
    later_ms.saturating_sub(earlier_ms) as f64 / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::table::render_table;

    fn sample() -> Status {
        Status {
            provisioners: vec![ProvisionerStatus {
                provisioner_name: "example.com/hostpath".into(),
                queue: Some(QueueStatus {
                    depth: 2,
                    oldest_pending_age_seconds: 12.4,
                    current_term: 3,
                    in_flight: vec![InFlightStatus {
                        pv_name: "pvc-a".into(),
                        claim: Some("default/a".into()),
                        owner_term: Some(2),
                        stale_owner: true,
                        visible_again_in_seconds: 30.0,
                        attempts: 1,
                    }],
                    dead_letters: vec![DeadLetterStatus {
                        pv_name: "pvc-b".into(),
                        claim: None,
                        reason: "refused: bad signature".into(),
                        attempts: 0,
                        dead_for_seconds: 5.0,
                    }],
                }),
                intents: vec![],
                orphan_report: None,
                orphan_report_age_seconds: None,
                leases: vec![LeaseStatus {
                    service: "pv-writer".into(),
                    name: "example.com-hostpath-pv-writer".into(),
                    namespace: Some("split-provisioner".into()),
                    found: true,
                    holder: Some("pv-writer-0".into()),
                    renewed_seconds_ago: Some(1.0),
                    lease_duration_seconds: Some(15),
                    expired: false,
                    transitions: Some(0),
                    error: None,
                }],
                errors: vec!["intents: redis: boom".into()],
                unavailable: vec![],
            }],
        }
    }

    #[test]
    fn table_shows_every_part_aligned() {
        let text = render_table(&sample());
        assert!(
            text.contains("PROVISIONER example.com/hostpath\n"),
            "{text}"
        );
        assert!(
            text.contains(
                "queue: depth 2, oldest pending 12s, in flight 1, dead letters 1, pv-writer term 3"
            ),
            "{text}"
        );
        assert!(text.contains("pvc-a  default/a  2 (stale)"), "{text}");
        assert!(text.contains("refused: bad signature"), "{text}");
        assert!(
            text.contains(
                "split-provisioner/example.com-hostpath-pv-writer  pv-writer-0  1s ago   held"
            ),
            "{text}"
        );
        assert!(
            text.contains("intents (volumes being made): none"),
            "{text}"
        );
        assert!(text.contains("orphan sweep: no report yet"), "{text}");
        assert!(text.contains("ERROR intents: redis: boom"), "{text}");
    }

    #[test]
    fn a_missing_lease_shows_its_name_alone_and_not_found() {
        let mut status = sample();
        status.provisioners[0].leases.push(LeaseStatus {
            service: "reclaim-svc".into(),
            name: "example.com-hostpath-reclaim".into(),
            ..Default::default()
        });
        let text = render_table(&status);
        let line = text
            .lines()
            .find(|l| l.contains("reclaim-svc"))
            .unwrap_or_else(|| panic!("{text}"));
        assert!(!line.contains("/example.com-hostpath-reclaim"), "{line}");
        assert!(line.contains(" example.com-hostpath-reclaim "), "{line}");
        assert!(line.trim_end().ends_with("not found"), "{line}");
        let json = serde_json::to_value(&status).unwrap();
        let lease = &json["provisioners"][0]["leases"][1];
        assert_eq!(lease["namespace"], serde_json::Value::Null, "{lease}");
        assert_eq!(lease["found"], false, "{lease}");
    }

    #[tokio::test]
    async fn unreadable_redis_shows_each_part_unavailable_with_the_cause_once() {
        let redis = RedisConfig::from("redis://127.0.0.1:1/0");
        let status = gather(&["a.io/x".into()], &redis, None, 0).await;
        let text = render_table(&status);
        for line in [
            "queue: unavailable",
            "intents (volumes being made): unavailable",
            "orphan sweep: unavailable",
        ] {
            assert!(text.contains(line), "{text}");
        }
        assert!(
            !text.contains("none") && !text.contains("no report yet"),
            "{text}"
        );
        assert_eq!(text.matches("ERROR").count(), 1, "{text}");
        assert_eq!(text.matches("127.0.0.1:1").count(), 1, "{text}");
    }

    #[tokio::test]
    async fn an_unreachable_api_server_names_the_cause() {
        let config = kube::Config::new("http://127.0.0.1:1".parse().unwrap());
        let client = Client::try_from(config).unwrap();
        let lease = lease_status(&client, "pv-writer", "pv-writer", "a.io/x", Some("ns"), 0).await;
        let error = lease.error.expect("unreadable");
        assert!(
            error.to_lowercase().contains("connection refused"),
            "{error}"
        );
    }

    #[tokio::test]
    async fn a_missing_kubeconfig_names_its_path_and_cause_once() {
        use clap::Parser;
        let cli = crate::cli::Cli::parse_from([
            "provisioner-ctl",
            "status",
            "--kubeconfig",
            "/nonexistent/kc",
        ]);
        let crate::cli::Command::Status { common, .. } = &cli.command else {
            panic!("status")
        };
        let Err(err) = common::runtime::kube_client::client_from_args(common, None).await else {
            panic!("no kubeconfig there");
        };
        let text = error_chain(err.as_ref());
        assert_eq!(text.matches("/nonexistent/kc").count(), 1, "{text}");
        assert_eq!(text.matches("os error 2").count(), 1, "{text}");
    }
}
