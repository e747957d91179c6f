//! The seed's operation for pv-writer: write one taken entry's PV and settle
//! the entry atomically in Redis ([`Writer::process`]), deciding with the pure
//! rules of [`crate::decision`]. The drain loop that takes due entries and
//! runs `--worker-threads` writes at once is in [`crate::controller`].
//!
//! Per entry (seed: `provisionClaimOperation`'s PV save, made durable):
//! * created, or `AlreadyExists` with `claimRef.uid` equal to the entry's claim
//!   uid → [`PvQueue::complete`] and a Normal `ProvisioningSucceeded` event on the claim;
//! * `AlreadyExists` for another claim, `422 Invalid` or `400 BadRequest` → the
//!   dead-letter set, a Warning `ProvisioningFailed` event on the claim and
//!   `pv_writer_dead_letters_total`; never retried blindly, and the storage
//!   asset is never deleted (an operator decides, then requeues);
//! * anything else (5xx, 429, 403/401 while RBAC is fixed, timeouts, connection
//!   errors) → retry after `initial · 2^(attempts-1)` capped at
//!   `--retry-interval-max`, less up to 20 % jitter, forever. While failures
//!   happen, a probe (`get` of the last failed PV, every
//!   `--retry-interval-start` clamped to 100 ms..5 s) watches
//!   the API server; when a probe fails the API server counts as down, and the
//!   first probe or write that succeeds afterwards pulls every waiting retry
//!   forward to now, so the queue starts again as soon as the API server is back.
//!   A write that failed while the API server was down but settles after it came
//!   back is retried at once too. One entry failing on its own (API server up)
//!   keeps its backoff;
//! * a garbled or unknown-version payload → dead-lettered with an error log line
//!   naming the PV; the worker carries on;
//! * an entry provision-svc could not have produced (no or a bad HMAC, PV name,
//!   claimRef, provisioned-by annotation or volume source not ours: see
//!   [`crate::checks`]) → refused before any API call: dead-lettered,
//!   `pv_writer_refused_entries_total{reason}` and a Warning event on the claim.
//!
//! * before the create, the entry must still be in flight under this term
//!   ([`PvQueue::holds`]) and its claim must exist with the entry's uid (a live
//!   GET, [`claim_live`]); a claim that is gone or was re-created → the entry
//!   is dropped, no PV written, counted in
//!   `pv_writer_refused_entries_total{reason="claim_gone"}`: a replayed entry
//!   re-creates no PV, and provision-svc deletes the volume of a claim deleted
//!   while its write was queued (else the orphan sweep reports it).
//!
//! Redis failures while settling an entry are retried every
//! `--redis-reconnect-period` (default 500 ms) until they
//! succeed or shutdown; an unsettled entry stays in flight and is taken again
//! by the next leader, and the repeated create answers `AlreadyExists` for the
//! same claim, so no PV is written twice.
//!
//! Metrics: the seed's `controller_persistentvolumeclaim_provision_*` families
//! are counted here, where the PV is stored (see [`crate::metrics`]). Logs:
//! each entry is processed in one `pv_write` span carrying `pv`, `claim`
//! (namespace/name), `claim_uid`, `class` and `attempt`, the same field names
//! provision-svc's `claim` span uses, so one claim can be followed across both
//! services' logs (`--log-format json` shows them on every line).
//!
//! Health: the dispatcher beats the runtime's heartbeat while it loops (idle
//! polls included) or while Redis is unreachable (not ready, which a restart
//! would not fix); it stops beating when it has been stuck, with Redis up, for
//! `--healthz-stall-timeout` ([`common::runtime::health`]).
//!
//! Fencing: [`Writer::run`] starts a leader term ([`PvQueue::begin_term`]) and
//! every take and settlement carries its epoch. Once a newer term exists (this
//! replica was paused past its Lease and another took over), Redis refuses
//! them ([`Settled::Fenced`]): the stale replica moves no entry, counts
//! `pv_writer_fenced_operations_total` and its drain loop ends with an error
//! (the process exits and restarts as a standby). Before announcing a written
//! PV (`ProvisioningSucceeded`) a worker asks Redis whether its term still holds
//! the entry ([`PvQueue::holds`]), so a replica that wakes up superseded
//! announces nothing. The event itself is idempotent
//! ([`EventSink::publish_once`]: one Event named `<claim uid>.provisioningsucceeded`),
//! so a replica stopped between that check and the event reaching the API
//! server, or a write retried after a crash, finds the Event already there and
//! adds none: exactly one `ProvisioningSucceeded` per claim.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use api_types::queue::{DecodeError, QueuedPvWrite};
use common::handoff::queue::{DeadLetter, PvQueue, QueueError, Settled, TakenEntry};
use common::kube::events::{claim_reference, reason, EventSink};
use common::kube::retry::Backoff;
use common::kube::time::now_ms;
use common::runtime::health::Heartbeat;
use common::runtime::http::Readiness;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::checks::EntryChecks;
use crate::decision::{already_exists, refused_create, retry_delay, WriteResult};
use crate::metrics::{outcome, WriterMetrics};

/// Longest a worker waits for the API server to take a claim event
/// (`ProvisioningSucceeded`, `ProvisioningFailed`). Bounded so a slow API server
/// (client read timeout ~295 s) cannot hold a taken entry past its
/// `--visibility-timeout`; an event not accepted in time is logged and dropped.
pub const EVENT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Tuning of the drain loop (from [`crate::config::WriterArgs`] and the shared flags).
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Concurrent PV writes.
    pub workers: usize,
    /// First retry delay after a transient failure.
    pub retry_initial: Duration,
    /// Cap of the retry delay.
    pub retry_max: Duration,
    /// Time limit of one write.
    pub write_timeout: Duration,
    /// Visibility timeout of a taken entry.
    pub visibility_timeout: Duration,
    /// Pause between attempts while Redis is unreachable
    /// (`--redis-reconnect-period`).
    pub redis_reconnect: Duration,
}

/// `pv_writer_refused_entries_total` reason of an entry dropped because its
/// claim no longer exists with the entry's uid.
pub const CLAIM_GONE: &str = "claim_gone";

/// Whether an entry's claim still exists with the entry's uid.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClaimLive {
    /// It does.
    Yes,
    /// It is gone (404) or was re-created (another uid): the reason.
    Gone(String),
    /// The API server did not answer (transient): the reason.
    Unknown(String),
}

/// GET `entry`'s claim within `timeout` (never a cache) and compare its uid.
pub async fn claim_live(client: &Client, entry: &QueuedPvWrite, timeout: Duration) -> ClaimLive {
    let claim = &entry.claim;
    let api: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &claim.namespace);
    match tokio::time::timeout(timeout, api.get_opt(&claim.name)).await {
        Err(_) => ClaimLive::Unknown(format!("reading claim {claim} timed out after {timeout:?}")),
        Ok(Err(err)) => ClaimLive::Unknown(format!("reading claim {claim}: {err}")),
        Ok(Ok(None)) => ClaimLive::Gone(format!(
            "claim {claim} (uid {}) no longer exists; PV {} not created",
            claim.uid,
            entry.pv_name()
        )),
        Ok(Ok(Some(live))) if live.metadata.uid.as_deref() != Some(claim.uid.as_str()) => {
            ClaimLive::Gone(format!(
                "claim {claim} has uid {}, not the entry's {}: the entry's claim was deleted; PV {} not created",
                live.metadata.uid.as_deref().unwrap_or("<none>"),
                claim.uid,
                entry.pv_name()
            ))
        }
        Ok(Ok(Some(_))) => ClaimLive::Yes,
    }
}

/// Create `entry`'s PV through `api` within `timeout` and classify the answer.
pub async fn write_pv(
    api: &Api<PersistentVolume>,
    entry: &QueuedPvWrite,
    timeout: Duration,
) -> WriteResult {
    let name = entry.pv_name();
    let created =
        match tokio::time::timeout(timeout, api.create(&PostParams::default(), &entry.pv)).await {
            Err(_) => {
                return WriteResult::Transient(format!("creating PV timed out after {timeout:?}"))
            }
            Ok(r) => r,
        };
    let status = match created {
        Ok(_) => return WriteResult::Created,
        Err(kube::Error::Api(status)) => status,
        Err(other) => return WriteResult::Transient(format!("creating PV: {other}")),
    };
    if status.is_already_exists() || (status.code == 409 && status.reason == "AlreadyExists") {
        let existing = match tokio::time::timeout(timeout, api.get(name)).await {
            Err(_) => {
                return WriteResult::Transient(format!(
                    "reading existing PV timed out after {timeout:?}"
                ))
            }
            Ok(Err(err)) => return WriteResult::Transient(format!("reading existing PV: {err}")),
            Ok(Ok(pv)) => pv,
        };
        return already_exists(entry, &existing);
    }
    refused_create(name, status.code, &status.reason, &status.message)
}

/// The PV writer of one leader term: the operation ([`process`](Self::process))
/// and, in [`crate::controller`], the drain loop ([`run`](Self::run)). Cheap
/// to share (`Arc`).
pub struct Writer {
    pub(crate) queue: PvQueue,
    checks: EntryChecks,
    /// This replica's leader term ([`PvQueue::begin_term`]); 0 before `run`.
    pub(crate) epoch: AtomicU64,
    /// Set once Redis refused an operation of this term: a newer leader runs.
    pub(crate) superseded: AtomicBool,
    pub(crate) api: Api<PersistentVolume>,
    /// For the live claim lookup before each create.
    client: Client,
    events: EventSink,
    pub(crate) metrics: WriterMetrics,
    pub(crate) config: WriterConfig,
    /// A transient failure happened since the last probe.
    pub(crate) degraded: AtomicBool,
    /// A probe failed and nothing succeeded since: the API server is down.
    pub(crate) api_down: AtomicBool,
    /// When (ms) the API server was last seen coming back.
    pub(crate) recovered_at_ms: AtomicU64,
    /// PV name of the last transient failure, probed with `get`.
    pub(crate) probe_name: std::sync::Mutex<String>,
    /// `/readyz` of the running drain ([`run`](Self::run) sets it), so a worker
    /// that cannot settle an entry in Redis reports not-ready too — the
    /// dispatcher may be waiting for that worker's permit and see nothing.
    pub(crate) readiness: std::sync::OnceLock<Readiness>,
    /// Beaten by the dispatcher at each turn of its loop.
    pub(crate) dispatched: Heartbeat,
}

impl Writer {
    /// A writer creating PVs with `client`, publishing events as `pv-writer` from
    /// `identity`, writing only entries that pass `checks`.
    pub fn new(
        queue: PvQueue,
        checks: EntryChecks,
        client: Client,
        identity: &str,
        metrics: WriterMetrics,
        config: WriterConfig,
    ) -> Self {
        Writer {
            queue,
            checks,
            epoch: AtomicU64::new(0),
            superseded: AtomicBool::new(false),
            api: Api::all(client.clone()),
            client: client.clone(),
            events: EventSink::new(client, "pv-writer", identity),
            metrics,
            config,
            degraded: AtomicBool::new(false),
            api_down: AtomicBool::new(false),
            recovered_at_ms: AtomicU64::new(0),
            probe_name: std::sync::Mutex::new(String::new()),
            readiness: std::sync::OnceLock::new(),
            dispatched: Heartbeat::default(),
        }
    }

    /// Work under the term `epoch` (from [`PvQueue::begin_term`]) instead of
    /// beginning a new one in [`run`](Self::run); for driving
    /// [`process`](Self::process) directly (embedding, tests).
    pub fn set_term(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::SeqCst);
    }

    /// The API server answered: if it was down, pull every waiting retry forward.
    pub(crate) async fn api_is_up(&self) {
        if self.api_down.swap(false, Ordering::SeqCst) {
            self.recovered_at_ms.store(now_ms(), Ordering::SeqCst);
            match self.queue.pull_forward_retries().await {
                Ok(n) => tracing::info!(
                    entries = n,
                    "API server accepts requests again; retrying waiting PV writes now"
                ),
                Err(err) => tracing::warn!(error = %err, "could not pull waiting retries forward"),
            }
        }
    }

    /// Redis refused `operation` because a newer term began: stop draining.
    pub(crate) fn fenced(&self, operation: &str) {
        self.metrics.fenced_operations_total.inc();
        if !self.superseded.swap(true, Ordering::SeqCst) {
            tracing::error!(
                term = self.epoch.load(Ordering::SeqCst),
                operation,
                "a newer pv-writer leader term began (this replica was paused or lost its Lease); Redis refused this replica's queue operations, stopping"
            );
        }
    }

    /// Write one taken entry and settle it in Redis (complete, retry or
    /// dead-letter), in a `pv_write` span carrying `pv`, `attempt` and, once
    /// the entry is read, `claim`, `claim_uid` and `class`. Never panics on
    /// bad input.
    pub async fn process(&self, taken: TakenEntry, shutdown: &CancellationToken) {
        let span = tracing::info_span!(
            "pv_write",
            pv = %taken.pv_name,
            attempt = taken.attempts.saturating_add(1),
            claim = tracing::field::Empty,
            claim_uid = tracing::field::Empty,
            class = tracing::field::Empty,
        );
        self.process_entry(taken, shutdown).instrument(span).await
    }

    async fn process_entry(&self, taken: TakenEntry, shutdown: &CancellationToken) {
        let pv_name = taken.pv_name.clone();
        let entry = match QueuedPvWrite::decode(&taken.payload) {
            Ok(entry) => entry,
            Err(err) => {
                let kind = match err {
                    DecodeError::Garbled(_) => "garbled",
                    DecodeError::UnknownVersion { .. } => "unknown_version",
                };
                tracing::error!(error = %err, "unreadable PV write in the queue; moving it to the dead-letter set");
                self.dead_letter(
                    &taken,
                    None,
                    kind,
                    format!("unreadable queue entry: {err}"),
                    shutdown,
                )
                .await;
                return;
            }
        };
        let span = tracing::Span::current();
        span.record("claim", tracing::field::display(&entry.claim));
        span.record("claim_uid", entry.claim.uid.as_str());
        span.record("class", entry.class.as_str());
        if let Err(refusal) = self.checks.check(&pv_name, &entry) {
            tracing::error!(reason = %refusal.reason, kind = refusal.kind, "refusing a queue entry provision-svc could not have produced; moving it to the dead-letter set");
            if self
                .dead_letter(
                    &taken,
                    Some(&entry),
                    refusal.kind,
                    refusal.reason.clone(),
                    shutdown,
                )
                .await
            {
                self.metrics
                    .refused_entries_total
                    .with_label_values(&[refusal.kind])
                    .inc();
                publish_bounded(
                    EVENT_PUBLISH_TIMEOUT,
                    &pv_name,
                    self.events.publish(
                        &claim_reference(&entry.claim),
                        true,
                        reason::PROVISIONING_FAILED,
                        "Provision",
                        refusal.reason,
                    ),
                )
                .await;
            }
            return;
        }

        // Before the create: this term still holds the entry, and the claim
        // still exists with the entry's uid (a replayed entry of a deleted
        // claim, or a paused ex-leader, creates nothing).
        let epoch = self.epoch.load(Ordering::SeqCst);
        match self
            .settle("holds", shutdown, || self.queue.holds(epoch, &pv_name))
            .await
        {
            Some(Settled::Done) => {}
            Some(Settled::Fenced) => return self.fenced("holds"),
            Some(Settled::NotInFlight) => {
                tracing::warn!("queue entry no longer in flight under this term (taken again after its visibility timeout); not writing it");
                return;
            }
            None => return,
        }
        let claim_state = claim_live(&self.client, &entry, self.config.write_timeout).await;
        let result = match claim_state {
            ClaimLive::Yes => None,
            ClaimLive::Unknown(reason) => Some(WriteResult::Transient(reason)),
            ClaimLive::Gone(reason) => {
                // Dropped, not dead-lettered: provision-svc deletes the volume of
                // a claim deleted while its PV write was queued (or the orphan
                // sweep reports it); a dead letter would keep it accounted for.
                match self
                    .settle("complete", shutdown, || {
                        self.queue.complete(epoch, &pv_name)
                    })
                    .await
                {
                    Some(Settled::Done) => {
                        tracing::warn!(%reason, "dropped a queue entry whose claim is gone; no PV written");
                        self.metrics
                            .refused_entries_total
                            .with_label_values(&[CLAIM_GONE])
                            .inc();
                    }
                    Some(Settled::Fenced) => self.fenced("complete"),
                    Some(Settled::NotInFlight) | None => {}
                }
                return;
            }
        };
        let started_ms = now_ms();
        let started = Instant::now();
        let result = match result {
            Some(r) => r,
            None => write_pv(&self.api, &entry, self.config.write_timeout).await,
        };
        self.metrics
            .write_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        match result {
            WriteResult::Created | WriteResult::AlreadyExists => {
                let label = if result == WriteResult::Created {
                    outcome::CREATED
                } else {
                    outcome::ALREADY_EXISTS
                };
                self.api_is_up().await;
                // Announce only while this term still holds the entry: a
                // superseded writer (paused past its Lease) announces nothing;
                // the new leader re-takes the entry, finds the PV and announces.
                // The event goes out before the completion, so a writer killed
                // in between announces again on the retried write; the Event's
                // name is fixed by the claim uid (publish_once), so the repeat
                // finds it and the claim keeps one. Bounded by EVENT_PUBLISH_TIMEOUT so the
                // entry is completed well within its visibility timeout.
                let epoch = self.epoch.load(Ordering::SeqCst);
                match self
                    .settle("holds", shutdown, || self.queue.holds(epoch, &pv_name))
                    .await
                {
                    Some(Settled::Done) => {}
                    Some(Settled::Fenced) => return self.fenced("holds"),
                    Some(Settled::NotInFlight) => {
                        tracing::warn!("PV written but its queue entry is no longer in flight under this term (taken again after its visibility timeout); the other take settles it");
                        return;
                    }
                    None => return,
                }
                publish_bounded(
                    EVENT_PUBLISH_TIMEOUT,
                    &pv_name,
                    self.events.publish_once(
                        &claim_reference(&entry.claim),
                        false,
                        reason::PROVISIONING_SUCCEEDED,
                        "Provision",
                        format!("Successfully provisioned volume {pv_name}"),
                    ),
                )
                .await;
                match self
                    .settle("complete", shutdown, || {
                        self.queue.complete(epoch, &pv_name)
                    })
                    .await
                {
                    Some(Settled::Done) => {}
                    Some(Settled::Fenced) => return self.fenced("complete"),
                    Some(Settled::NotInFlight) | None => return,
                }
                self.metrics.writes_total.with_label_values(&[label]).inc();
                let provisioning_seconds =
                    now_ms().saturating_sub(entry.provisioning_started_ms()) as f64 / 1000.0;
                self.metrics
                    .provision
                    .total
                    .with_label_values(&[&entry.class])
                    .inc();
                self.metrics
                    .provision
                    .duration_seconds
                    .with_label_values(&[&entry.class])
                    .observe(provisioning_seconds);
                tracing::info!(outcome = label, provisioning_seconds, "PV written");
            }
            WriteResult::Refused { kind, reason } => {
                tracing::warn!(%reason, "PV write refused; moving it to the dead-letter set");
                if self
                    .dead_letter(&taken, Some(&entry), kind, reason.clone(), shutdown)
                    .await
                {
                    publish_bounded(
                        EVENT_PUBLISH_TIMEOUT,
                        &pv_name,
                        self.events.publish(
                            &claim_reference(&entry.claim),
                            true,
                            reason::PROVISIONING_FAILED,
                            "Provision",
                            reason,
                        ),
                    )
                    .await;
                }
            }
            WriteResult::Transient(reason) => {
                *self.probe_name.lock().expect("probe name poisoned") = pv_name.clone();
                self.degraded.store(true, Ordering::SeqCst);
                let attempts = taken.attempts.saturating_add(1);
                // Sent while the API server was down, and it is back now: retry at
                // once instead of waiting out the backoff.
                let delay = if started_ms < self.recovered_at_ms.load(Ordering::SeqCst) {
                    Duration::ZERO
                } else {
                    retry_delay(self.config.retry_initial, self.config.retry_max, attempts)
                };
                let settled = self
                    .settle("schedule_retry", shutdown, || {
                        self.queue.schedule_retry(
                            self.epoch.load(Ordering::SeqCst),
                            &pv_name,
                            delay,
                            attempts,
                        )
                    })
                    .await;
                if settled == Some(Settled::Fenced) {
                    self.fenced("schedule_retry");
                }
                if settled == Some(Settled::Done) {
                    self.metrics.retries_total.inc();
                    self.metrics
                        .writes_total
                        .with_label_values(&[outcome::RETRY])
                        .inc();
                    tracing::warn!(attempts, retry_in = ?delay, %reason, "PV write failed; will retry");
                }
            }
        }
    }

    /// Dead-letter `taken`; returns whether it was moved (false: Redis gave up
    /// at shutdown, the entry was gone, or this term is stale).
    async fn dead_letter(
        &self,
        taken: &TakenEntry,
        entry: Option<&QueuedPvWrite>,
        kind: &'static str,
        reason: String,
        shutdown: &CancellationToken,
    ) -> bool {
        let letter = DeadLetter {
            pv_name: taken.pv_name.clone(),
            reason,
            dead_at_ms: now_ms(),
            attempts: taken.attempts,
            claim: entry.map(|e| e.claim.clone()),
        };
        let settled = self
            .settle("dead_letter", shutdown, || {
                self.queue
                    .dead_letter(self.epoch.load(Ordering::SeqCst), &letter)
            })
            .await;
        if settled == Some(Settled::Fenced) {
            self.fenced("dead_letter");
        }
        let moved = settled == Some(Settled::Done);
        if moved {
            // The class of an entry whose MAC failed is attacker-chosen: not a label.
            let class = match (entry, kind) {
                (Some(e), k) if k != "unsigned" && k != "bad_signature" => e.class.as_str(),
                _ => "",
            };
            self.metrics
                .provision
                .failed_total
                .with_label_values(&[class])
                .inc();
            self.metrics
                .writes_total
                .with_label_values(&[outcome::DEAD_LETTER])
                .inc();
            self.metrics
                .dead_lettered_total
                .with_label_values(&[kind])
                .inc();
        }
        moved
    }

    /// Run a Redis settle operation until it succeeds; `None` if shutdown came
    /// first (the entry then stays in flight for the next leader).
    async fn settle<T, F, Fut>(
        &self,
        operation: &str,
        shutdown: &CancellationToken,
        op: F,
    ) -> Option<T>
    where
        F: Fn() -> Fut,
        Fut: std::future::Future<Output = Result<T, QueueError>>,
    {
        let mut failed = false;
        let settled = self
            .redis_retry()
            .retry(shutdown, op, |err, _, _| {
                failed = true;
                if let Some(r) = self.readiness.get() {
                    r.set_ready(false);
                }
                tracing::warn!(operation, error = %err, "Redis unreachable while settling a PV write; not ready, retrying");
            })
            .await;
        if failed && settled.is_some() {
            if let Some(r) = self.readiness.get() {
                r.set_ready(true);
            }
        }
        settled
    }

    /// How Redis calls are repeated while Redis is unreachable.
    pub(crate) fn redis_retry(&self) -> Backoff {
        Backoff::constant(self.config.redis_reconnect)
    }
}

/// Await `publish` (an [`EventSink::publish`] future) for at most `limit`;
/// returns whether it finished. A timeout is logged with the PV name and the
/// event is dropped (events are informative; the write is what counts).
pub async fn publish_bounded(
    limit: Duration,
    pv_name: &str,
    publish: impl std::future::Future<Output = ()>,
) -> bool {
    match tokio::time::timeout(limit, publish).await {
        Ok(()) => true,
        Err(_) => {
            tracing::warn!(pv = %pv_name, ?limit, "API server did not take the claim event in time; dropping it");
            false
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An [`EventSink`] whose API server takes requests but never answers.
    fn silent_api_sink() -> (
        EventSink,
        tower_test::mock::Handle<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >,
    ) {
        let (svc, handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let client = Client::new(svc, "default");
        (EventSink::new(client, "pv-writer", "test"), handle)
    }

    #[tokio::test]
    async fn a_claim_event_the_api_server_does_not_take_is_dropped_after_the_limit() {
        let (sink, mut handle) = silent_api_sink();
        let claim = api_types::queue::ClaimKey {
            namespace: "ns".into(),
            name: "data".into(),
            uid: "uid-1".into(),
        };
        let object = claim_reference(&claim);
        let started = Instant::now();
        let publish = sink.publish(
            &object,
            false,
            reason::PROVISIONING_SUCCEEDED,
            "Provision",
            "Successfully provisioned volume pvc-uid-1".into(),
        );
        let (finished, request) = tokio::join!(
            publish_bounded(Duration::from_millis(300), "pvc-uid-1", publish),
            handle.next_request()
        );
        let elapsed = started.elapsed();
        assert!(!finished, "the publish was cut off");
        assert!(
            elapsed >= Duration::from_millis(300) && elapsed < Duration::from_secs(3),
            "{elapsed:?}"
        );
        // The request did reach the API server; it just never answered.
        let (request, _pending_answer) = request.expect("event request sent");
        assert_eq!(request.method(), http::Method::POST);
        assert!(
            request.uri().path().ends_with("/namespaces/ns/events"),
            "{}",
            request.uri()
        );
    }

    #[tokio::test]
    async fn publish_bounded_reports_a_publish_that_finishes_in_time() {
        assert!(publish_bounded(Duration::from_secs(1), "pvc-x", async {}).await);
    }
}
