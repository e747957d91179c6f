//! pv-writer's operation: each taken entry gets a [`Verdict`] (decode, the
//! entry checks, this term's hold, the claim's liveness, the create) and one
//! settle applies it in Redis (complete, retry or dead-letter) with its event
//! and metrics. Every settlement carries the leader term's epoch (fencing).
//! Rules and rationale: docs/decisions/0009-pv-writer-entry-rules.md.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use api_types::queue::QueuedPvWrite;
use common::handoff::queue::{DeadLetter, PvQueue, QueueError, Settled, TakenEntry};
use common::kube::events::reason::{PROVISIONING_FAILED, PROVISIONING_SUCCEEDED};
use common::kube::events::{claim_reference, event, EventSink};
use common::kube::retry::Backoff;
use common::kube::time::now_ms;
use common::runtime::health::Heartbeat;
use common::runtime::http::Readiness;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, PostParams};
use kube::Client;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::Instrument;

use crate::checks::{EntryChecks, Refusal};
use crate::config::WriterConfig;
use crate::decision::{
    already_exists, refused_create, retry_delay, unreadable, Verdict, WriteResult,
};
use crate::metrics::{inc, outcome, WriterMetrics};

/// Longest a worker waits for the API server to take a claim event, so a slow
/// API server cannot hold a taken entry past its `--visibility-timeout`.
pub const EVENT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// `pv_writer_refused_entries_total` reason of an entry dropped because its
/// claim no longer exists with the entry's uid.
pub const CLAIM_GONE: &str = "claim_gone";

/// The drain loop's failure.
#[derive(Debug, thiserror::Error)]
pub enum WriterError {
    /// Redis refused this replica's term: a newer leader runs.
    #[error("pv-writer term {0} was superseded by a newer leader; stopped draining")]
    Superseded(u64),
}

/// `call` within `timeout`; Err: [`WriteResult::Transient`], "`what` timed out …" or "`what`: …".
async fn within<T>(
    timeout: Duration,
    what: &str,
    call: impl Future<Output = kube::Result<T>>,
) -> Result<T, WriteResult> {
    let answer = tokio::time::timeout(timeout, call).await;
    let timed_out = |_| WriteResult::Transient(format!("{what} timed out after {timeout:?}"));
    answer
        .map_err(timed_out)?
        .map_err(|err| WriteResult::Transient(format!("{what}: {err}")))
}

/// Create `entry`'s PV through `api` within `timeout` and classify the answer.
pub async fn write_pv(
    api: &Api<PersistentVolume>,
    entry: &QueuedPvWrite,
    timeout: Duration,
) -> WriteResult {
    let name = entry.pv_name();
    match tokio::time::timeout(timeout, api.create(&PostParams::default(), &entry.pv)).await {
        Err(_) => WriteResult::Transient(format!("creating PV timed out after {timeout:?}")),
        Ok(Ok(_)) => WriteResult::Stored(outcome::CREATED),
        Ok(Err(kube::Error::Api(s))) if s.is_already_exists() => {
            let existing = within(timeout, "reading existing PV", api.get(name)).await;
            existing.map_or_else(|transient| transient, |pv| already_exists(entry, &pv))
        }
        Ok(Err(kube::Error::Api(s))) => refused_create(name, s.code, &s.reason, &s.message),
        Ok(Err(other)) => WriteResult::Transient(format!("creating PV: {other}")),
    }
}

/// The PV writer of one leader term: [`process`](Self::process) per entry and
/// the drain loop ([`run`](Self::run)). Cheap to share (`Arc`).
pub struct Writer {
    pub(crate) queue: PvQueue,
    checks: EntryChecks,
    /// This replica's leader term ([`PvQueue::begin_term`]); 0 before `run`.
    pub(crate) epoch: AtomicU64,
    /// Set once Redis refused an operation of this term: a newer leader runs.
    pub(crate) superseded: AtomicBool,
    pub(crate) api: Api<PersistentVolume>,
    events: EventSink,
    pub(crate) metrics: WriterMetrics,
    pub(crate) config: WriterConfig,
    /// PV name of the last transient failure, probed with `get`; changed = failed since the probe.
    pub(crate) failed_write: watch::Sender<String>,
    /// A probe failed and nothing succeeded since: the API server is down.
    pub(crate) api_down: AtomicBool,
    /// When (ms) the API server was last seen coming back.
    pub(crate) recovered_at_ms: AtomicU64,
    /// `/readyz` of the drain, which a worker stuck on Redis clears too.
    pub(crate) readiness: Readiness,
    /// Beaten by the dispatcher at each turn of its loop.
    pub(crate) dispatched: Heartbeat,
}

impl Writer {
    /// A writer creating PVs with `client`, publishing events as `pv-writer` from
    /// `identity`, writing only entries that pass `checks`, reporting Redis on `readiness`.
    pub fn new(
        queue: PvQueue,
        checks: EntryChecks,
        client: Client,
        identity: &str,
        metrics: WriterMetrics,
        readiness: Readiness,
        config: WriterConfig,
    ) -> Self {
        Writer {
            queue,
            checks,
            epoch: AtomicU64::new(0),
            superseded: AtomicBool::new(false),
            api: Api::all(client.clone()),
            events: EventSink::new(client, "pv-writer", identity),
            metrics,
            config,
            failed_write: watch::Sender::default(),
            api_down: AtomicBool::new(false),
            recovered_at_ms: AtomicU64::new(0),
            readiness,
            dispatched: Heartbeat::default(),
        }
    }

    /// Work under the term `epoch` (from [`PvQueue::begin_term`]) instead of
    /// beginning a new one in [`run`](Self::run); for driving
    /// [`process`](Self::process) directly (embedding, tests).
    pub fn set_term(&self, epoch: u64) {
        self.epoch.store(epoch, Ordering::SeqCst);
    }

    pub(crate) fn term(&self) -> u64 {
        self.epoch.load(Ordering::SeqCst)
    }

    /// The API server answered: if it was down, pull every waiting retry forward.
    pub(crate) async fn api_is_up(&self) {
        if self.api_down.swap(false, Ordering::SeqCst) {
            self.recovered_at_ms.store(now_ms(), Ordering::SeqCst);
            match self.queue.pull_forward_retries().await {
                Ok(n) => tracing::info!(
                    entries = n,
                    "API server is back; retrying waiting PV writes now"
                ),
                Err(err) => tracing::warn!(error = %err, "could not pull waiting retries forward"),
            }
        }
    }

    /// Redis refused `operation` under this term (a newer term began, or Redis
    /// lost the epoch): stop draining until the dispatcher tells which.
    pub(crate) fn fenced(&self, operation: &str) {
        self.metrics.fenced_operations_total.inc();
        if !self.superseded.swap(true, Ordering::SeqCst) {
            tracing::warn!(
                term = self.term(),
                operation,
                "Redis refused this pv-writer term"
            );
        }
    }

    /// Write one taken entry and settle it in Redis (complete, retry or
    /// dead-letter), in a `pv_write` span carrying `pv`, `attempt` and, once
    /// the entry is read, `claim`, `claim_uid` and `class`. Never panics on bad input.
    pub async fn process(&self, taken: TakenEntry, shutdown: &CancellationToken) {
        let span = tracing::info_span!(
            "pv_write",
            pv = %taken.pv_name,
            attempt = taken.attempts.saturating_add(1),
            claim = tracing::field::Empty,
            claim_uid = tracing::field::Empty,
            class = tracing::field::Empty,
        );
        async {
            let entry = QueuedPvWrite::decode(&taken.payload);
            let verdict = match &entry {
                Err(err) => {
                    tracing::error!(error = %err, "unreadable PV write in the queue; moving it to the dead-letter set");
                    unreadable(err)
                }
                Ok(entry) => {
                    let span = tracing::Span::current();
                    span.record("claim", tracing::field::display(&entry.claim));
                    span.record("claim_uid", entry.claim.uid.as_str());
                    span.record("class", entry.class.as_str());
                    match self.checks.check(&taken.pv_name, entry) {
                        Err(refusal) => Verdict::Refused(refusal),
                        Ok(()) => self.write(&taken.pv_name, entry, shutdown).await,
                    }
                }
            };
            self.settle(&taken, entry.as_ref().ok(), verdict, shutdown)
                .await
        }
        .instrument(span)
        .await
    }

    /// The create of a checked entry, made only while this term holds it and
    /// its claim exists with the entry's uid (read live, never from a cache).
    async fn write(
        &self,
        pv_name: &str,
        entry: &QueuedPvWrite,
        shutdown: &CancellationToken,
    ) -> Verdict {
        if !self.still_holds(pv_name, "before create", shutdown).await {
            return Verdict::Leave;
        }
        let (claim, timeout) = (&entry.claim, self.config.write_timeout);
        let claims =
            Api::<PersistentVolumeClaim>::namespaced(self.api.clone().into(), &claim.namespace);
        let what = format!("reading claim {claim}");
        let live = within(timeout, &what, claims.get_opt(&claim.name)).await;
        let (started_ms, started) = (now_ms(), Instant::now());
        let result = match live {
            Ok(None) => {
                return Verdict::ClaimGone(format!(
                    "claim {claim} (uid {}) no longer exists; PV {pv_name} not created",
                    claim.uid
                ))
            }
            Ok(Some(live)) if live.metadata.uid.as_deref() != Some(claim.uid.as_str()) => {
                return Verdict::ClaimGone(format!(
                    "claim {claim} has uid {}, not the entry's {}: the entry's claim was deleted; PV {pv_name} not created",
                    live.metadata.uid.as_deref().unwrap_or("<none>"),
                    claim.uid
                ))
            }
            Err(transient) => transient,
            Ok(Some(_)) => write_pv(&self.api, entry, timeout).await,
        };
        self.metrics
            .write_duration_seconds
            .observe(started.elapsed().as_secs_f64());
        Verdict::Written { result, started_ms }
    }

    /// Apply `verdict` to `taken` once: Redis, then events and metrics.
    async fn settle(
        &self,
        taken: &TakenEntry,
        entry: Option<&QueuedPvWrite>,
        verdict: Verdict,
        shutdown: &CancellationToken,
    ) {
        let (refusal, refused) = match (verdict, entry) {
            (Verdict::Unreadable(refusal), _) => (refusal, false),
            (Verdict::Refused(refusal), _) => {
                let Refusal { kind, reason } = &refusal;
                tracing::error!(%reason, kind, "refusing a queue entry provision-svc could not have produced");
                (refusal, true)
            }
            (Verdict::ClaimGone(reason), _) => {
                if self.complete(&taken.pv_name, shutdown).await {
                    tracing::warn!(%reason, "dropped a queue entry whose claim is gone; no PV written");
                    inc(&self.metrics.refused_entries_total, CLAIM_GONE);
                }
                return;
            }
            (Verdict::Written { result, started_ms }, Some(entry)) => match result {
                WriteResult::Stored(label) => {
                    return self.complete_written(taken, entry, label, shutdown).await
                }
                WriteResult::Transient(reason) => {
                    return self.retry(taken, reason, started_ms, shutdown).await
                }
                WriteResult::Refused(refusal) => {
                    let reason = &refusal.reason;
                    tracing::warn!(%reason, "PV write refused; moving it to the dead-letter set");
                    (refusal, false)
                }
            },
            (Verdict::Leave | Verdict::Written { .. }, _) => return,
        };
        self.dead_letter(taken, entry, refusal, refused, shutdown)
            .await
    }

    /// Complete `pv_name` under this term; whether it was done.
    async fn complete(&self, pv_name: &str, shutdown: &CancellationToken) -> bool {
        let epoch = self.term();
        let completed = self.redis("complete", shutdown, || self.queue.complete(epoch, pv_name));
        completed.await == Some(Settled::Done)
    }

    /// A stored PV: announce it (`ProvisioningSucceeded` once per claim and PV; only while
    /// this term holds the entry), then complete the entry and count the provisioning.
    async fn complete_written(
        &self,
        taken: &TakenEntry,
        entry: &QueuedPvWrite,
        label: &'static str,
        shutdown: &CancellationToken,
    ) {
        let pv_name = taken.pv_name.as_str();
        self.api_is_up().await;
        let holds = self.still_holds(pv_name, "after create", shutdown).await;
        // Not held: announce only if Redis lost the entry (no take left to announce the PV).
        if holds || matches!(self.queue.is_pending(pv_name).await, Ok(false)) {
            let note = format!("Successfully provisioned volume {pv_name}");
            let succeeded = event(false, PROVISIONING_SUCCEEDED, "Provision", note);
            let claim = claim_reference(&entry.claim);
            let publish = self.events.publish_once(&claim, succeeded);
            publish_bounded(EVENT_PUBLISH_TIMEOUT, pv_name, publish).await;
        }
        if !holds || !self.complete(pv_name, shutdown).await {
            return;
        }
        inc(&self.metrics.writes_total, label);
        let seconds = now_ms().saturating_sub(entry.provisioning_started_ms()) as f64 / 1000.0;
        self.metrics.provision.succeeded(&entry.class, seconds);
        tracing::info!(
            outcome = label,
            provisioning_seconds = seconds,
            "PV written"
        );
    }

    /// A transient failure: schedule the retry (at once when the write started
    /// before the API server came back) and mark the API server degraded.
    async fn retry(
        &self,
        taken: &TakenEntry,
        reason: String,
        started_ms: u64,
        shutdown: &CancellationToken,
    ) {
        let pv_name = taken.pv_name.as_str();
        self.failed_write.send_replace(pv_name.to_string());
        let attempts = taken.attempts.saturating_add(1);
        let delay = if started_ms < self.recovered_at_ms.load(Ordering::SeqCst) {
            Duration::ZERO
        } else {
            retry_delay(self.config.retry_initial, self.config.retry_max, attempts)
        };
        let retried = self.redis("schedule_retry", shutdown, || {
            self.queue
                .schedule_retry(self.term(), pv_name, delay, attempts)
        });
        if retried.await == Some(Settled::Done) {
            self.metrics.retries_total.inc();
            inc(&self.metrics.writes_total, outcome::RETRY);
            tracing::warn!(attempts, retry_in = ?delay, %reason, "PV write failed; will retry");
        }
    }

    /// Dead-letter `taken` under `kind`; once moved, count it (as refused too when
    /// `refused`) and put a Warning `ProvisioningFailed` with `reason` on the entry's
    /// claim. Not moved: Redis gave up at shutdown, the entry was gone, or this term is stale.
    async fn dead_letter(
        &self,
        taken: &TakenEntry,
        entry: Option<&QueuedPvWrite>,
        Refusal { kind, reason }: Refusal,
        refused: bool,
        shutdown: &CancellationToken,
    ) {
        let letter = DeadLetter {
            pv_name: taken.pv_name.clone(),
            reason,
            dead_at_ms: now_ms(),
            attempts: taken.attempts,
            claim: entry.map(|e| e.claim.clone()),
        };
        let moved = self.redis("dead_letter", shutdown, || {
            self.queue.dead_letter(self.term(), &letter)
        });
        if moved.await != Some(Settled::Done) {
            return;
        }
        // The class of an entry whose MAC failed is attacker-chosen: not a label.
        let trusted = entry.filter(|_| kind != "unsigned" && kind != "bad_signature");
        let class = trusted.map_or("", |e| e.class.as_str());
        self.metrics.provision.failed(class);
        inc(&self.metrics.writes_total, outcome::DEAD_LETTER);
        inc(&self.metrics.dead_lettered_total, kind);
        if refused {
            inc(&self.metrics.refused_entries_total, kind);
        }
        if let Some(entry) = entry {
            let claim = claim_reference(&entry.claim);
            let failed = event(true, PROVISIONING_FAILED, "Provision", letter.reason);
            let publish = self.events.publish(&claim, failed);
            publish_bounded(EVENT_PUBLISH_TIMEOUT, entry.pv_name(), publish).await;
        }
    }

    /// Whether this term still holds `pv_name` in flight (asked at `stage`).
    async fn still_holds(
        &self,
        pv_name: &str,
        stage: &'static str,
        shutdown: &CancellationToken,
    ) -> bool {
        let epoch = self.term();
        let held = self
            .redis("holds", shutdown, || self.queue.holds(epoch, pv_name))
            .await;
        if held == Some(Settled::NotInFlight) {
            tracing::warn!(
                stage,
                "queue entry no longer in flight under this term; the other take settles it"
            );
        }
        held == Some(Settled::Done)
    }

    /// Run settlement `operation` until Redis answers, counting a fenced one; `None`
    /// if shutdown came first (the entry then stays in flight for the next leader).
    async fn redis<F, Fut>(
        &self,
        operation: &'static str,
        shutdown: &CancellationToken,
        op: F,
    ) -> Option<Settled>
    where
        F: Fn() -> Fut,
        Fut: Future<Output = Result<Settled, QueueError>>,
    {
        let mut failed = false;
        let settled = Backoff::constant(self.config.redis_reconnect)
            .retry(shutdown, op, |err, _, _| {
                failed = true;
                self.readiness.set_ready(false);
                tracing::warn!(operation, error = %err, "Redis command failed while settling a PV write; not ready, retrying");
            })
            .await;
        if failed && settled.is_some() {
            self.readiness.set_ready(true);
        }
        if settled == Some(Settled::Fenced) {
            self.fenced(operation);
        }
        settled
    }
}

/// Await `publish` for at most `limit`; returns whether it finished. A timeout
/// is logged with the PV name and the event dropped (the write is what counts).
pub async fn publish_bounded(
    limit: Duration,
    pv_name: &str,
    publish: impl Future<Output = ()>,
) -> bool {
    let finished = tokio::time::timeout(limit, publish).await.is_ok();
    if !finished {
        tracing::warn!(pv = %pv_name, ?limit, "API server did not take the claim event in time; dropping it");
    }
    finished
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
            event(
                false,
                PROVISIONING_SUCCEEDED,
                "Provision",
                "Successfully provisioned volume pvc-uid-1".into(),
            ),
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
