//! The drain loop: take due entries from the durable queue, create their PVs
//! with `--workers` concurrency, and settle each entry atomically in Redis.
//!
//! Per entry (seed: `provisionClaimOperation`'s PV save, made durable):
//! * created, or `AlreadyExists` with `claimRef.uid` equal to the entry's claim
//!   uid → [`PvQueue::complete`] and a Normal `ProvisioningSucceeded` event on the claim;
//! * `AlreadyExists` for another claim, `422 Invalid` or `400 BadRequest` → the
//!   dead-letter set, a Warning `ProvisioningFailed` event on the claim and
//!   `pv_writer_dead_letters_total`; never retried blindly, and the storage
//!   asset is never deleted (an operator decides, then requeues);
//! * anything else (5xx, 429, 403/401 while RBAC is fixed, timeouts, connection
//!   errors) → retry after `initial · 2^(attempts-1)` capped at `--retry-max`,
//!   less up to 20 % jitter, forever. While failures happen, a probe (`get` of
//!   the last failed PV, every `--retry-initial` clamped to 100 ms..5 s) watches
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
//! Redis failures while settling an entry are retried every 500 ms until they
//! succeed or shutdown; an unsettled entry stays in flight and is taken again
//! by the next leader, and the repeated create answers `AlreadyExists` for the
//! same claim, so no PV is written twice.
//!
//! Fencing: [`Writer::run`] starts a leader term ([`PvQueue::begin_term`]) and
//! every take and settlement carries its epoch. Once a newer term exists (this
//! replica was paused past its Lease and another took over), Redis refuses
//! them ([`Settled::Fenced`]): the stale replica moves no entry, counts
//! `pv_writer_fenced_operations_total` and its drain loop ends with an error
//! (the process exits and restarts as a standby). Before announcing a written
//! PV (`ProvisioningSucceeded`) a worker asks Redis whether its term still holds
//! the entry ([`PvQueue::holds`]), so a replica that wakes up superseded
//! announces nothing; only one stopped in the few milliseconds between that
//! check and the event reaching the API server can add a second event.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use api_types::queue::{DecodeError, QueuedPvWrite};
use common::events::{claim_reference, reason, EventSink};
use common::http::Readiness;
use common::queue::{DeadLetter, PvQueue, QueueError, Settled, TakenEntry};
use common::retry::backoff;
use common::time::now_ms;
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::api::{Api, PostParams};
use kube::Client;
use rand::Rng;
use tokio::sync::Semaphore;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use crate::checks::EntryChecks;
use crate::metrics::{outcome, WriterMetrics};

/// Longest the idle dispatcher waits before looking for due entries again;
/// an enqueue wakes it at once ([`common::queue::PvQueue::wait_for_work`]), so
/// this only bounds how late a retry that comes due is picked up.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);
/// Pause between attempts while Redis is unreachable.
pub const REDIS_RETRY_INTERVAL: Duration = Duration::from_millis(500);
/// Longest a worker waits for the API server to take a claim event
/// (`ProvisioningSucceeded`, `ProvisioningFailed`). Bounded so a slow API server
/// (client read timeout ~295 s) cannot hold a taken entry past its
/// `--visibility-timeout`; an event not accepted in time is logged and dropped.
pub const EVENT_PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// Tuning of the drain loop (from [`crate::cli::WriterArgs`]).
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
}

/// What the API server said about one PV write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteResult {
    /// `201 Created`.
    Created,
    /// `409 AlreadyExists` and the existing PV's `claimRef.uid` is the entry's claim uid.
    AlreadyExists,
    /// Permanent refusal; `kind` is the `pv_writer_dead_letters_total` reason label.
    Refused {
        /// `claimed_by_other`, `invalid` or `bad_request`.
        kind: &'static str,
        /// Human-readable reason (event note, dead-letter record).
        reason: String,
    },
    /// Worth retrying.
    Transient(String),
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
        let claim_ref = existing.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let uid = claim_ref.and_then(|c| c.uid.as_deref());
        if uid == Some(entry.claim.uid.as_str()) {
            return WriteResult::AlreadyExists;
        }
        let owner = claim_ref
            .map(|c| {
                format!(
                    "claim {}/{} (uid {})",
                    c.namespace.as_deref().unwrap_or(""),
                    c.name.as_deref().unwrap_or(""),
                    c.uid.as_deref().unwrap_or("none")
                )
            })
            .unwrap_or_else(|| "no claim".to_string());
        return WriteResult::Refused {
            kind: "claimed_by_other",
            reason: format!(
                "PV {name} already exists for {owner}, not for claim {} (uid {}); the volume is kept, requeue after resolving",
                entry.claim, entry.claim.uid
            ),
        };
    }
    match status.code {
        422 => WriteResult::Refused {
            kind: "invalid",
            reason: format!(
                "API server rejected PV {name} as invalid: {}",
                status.message
            ),
        },
        400 => WriteResult::Refused {
            kind: "bad_request",
            reason: format!(
                "API server rejected PV {name} as a bad request: {}",
                status.message
            ),
        },
        code => WriteResult::Transient(format!(
            "creating PV: {code} {}: {}",
            status.reason, status.message
        )),
    }
}

/// Whether an API answer with HTTP `code` means the API server cannot serve
/// writes right now: 5xx, 429 Too Many Requests, 401/403 (credentials or RBAC
/// being fixed). Used by the probe; a 404 means the API server is up.
pub fn is_transient_code(code: u16) -> bool {
    code >= 500 || code == 429 || code == 401 || code == 403
}

/// Retry delay after the `attempts`-th consecutive failure (1-based):
/// `initial · 2^(attempts-1)` capped at `max`, times a random factor in [0.8, 1].
pub fn retry_delay(initial: Duration, max: Duration, attempts: u32) -> Duration {
    let base = backoff(initial, max, attempts);
    base.mul_f64(rand::rng().random_range(0.8..=1.0))
}

/// The drain loop of the leader. Cheap to share (`Arc`).
pub struct Writer {
    queue: PvQueue,
    checks: EntryChecks,
    /// This replica's leader term ([`PvQueue::begin_term`]); 0 before `run`.
    epoch: AtomicU64,
    /// Set once Redis refused an operation of this term: a newer leader runs.
    superseded: AtomicBool,
    api: Api<PersistentVolume>,
    events: EventSink,
    metrics: WriterMetrics,
    config: WriterConfig,
    /// A transient failure happened since the last probe.
    degraded: AtomicBool,
    /// A probe failed and nothing succeeded since: the API server is down.
    api_down: AtomicBool,
    /// When (ms) the API server was last seen coming back.
    recovered_at_ms: AtomicU64,
    /// PV name of the last transient failure, probed with `get`.
    probe_name: std::sync::Mutex<String>,
    /// `/readyz` of the running drain ([`run`](Self::run) sets it), so a worker
    /// that cannot settle an entry in Redis reports not-ready too — the
    /// dispatcher may be waiting for that worker's permit and see nothing.
    readiness: std::sync::OnceLock<Readiness>,
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
            events: EventSink::new(client, "pv-writer", identity),
            metrics,
            config,
            degraded: AtomicBool::new(false),
            api_down: AtomicBool::new(false),
            recovered_at_ms: AtomicU64::new(0),
            probe_name: std::sync::Mutex::new(String::new()),
            readiness: std::sync::OnceLock::new(),
        }
    }

    /// The API server answered: if it was down, pull every waiting retry forward.
    async fn api_is_up(&self) {
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

    /// While transient failures happen, probe the API server every `interval`.
    async fn probe_loop(self: Arc<Self>, shutdown: CancellationToken) {
        let interval = self
            .config
            .retry_initial
            .clamp(Duration::from_millis(100), Duration::from_secs(5));
        let timeout = self.config.write_timeout.min(Duration::from_secs(5));
        loop {
            if sleep_or_cancel(interval, &shutdown).await {
                return;
            }
            if !self.degraded.swap(false, Ordering::SeqCst) && !self.api_down.load(Ordering::SeqCst)
            {
                continue;
            }
            let name = self.probe_name.lock().expect("probe name poisoned").clone();
            match tokio::time::timeout(timeout, self.api.get_opt(&name)).await {
                Ok(Ok(_)) => self.api_is_up().await,
                Ok(Err(kube::Error::Api(s))) if !is_transient_code(s.code) => {
                    self.api_is_up().await
                }
                Ok(Err(err)) => {
                    if !self.api_down.swap(true, Ordering::SeqCst) {
                        tracing::warn!(error = %err, "API server unavailable; PV writes wait for it");
                    }
                }
                Err(_) => {
                    if !self.api_down.swap(true, Ordering::SeqCst) {
                        tracing::warn!(?timeout, "API server not answering; PV writes wait for it");
                    }
                }
            }
        }
    }

    /// Drain until `shutdown` fires, then wait for in-flight writes to settle.
    /// Calls `readiness.set_ready(false)` while Redis is unreachable and `true`
    /// while it answers. Returns only on shutdown.
    pub async fn run(
        self: Arc<Self>,
        shutdown: CancellationToken,
        readiness: Readiness,
    ) -> anyhow::Result<()> {
        let _ = self.readiness.set(readiness.clone());
        // A new term; anything in flight under an earlier one belongs to a
        // previous leader that is gone or fenced.
        loop {
            let started = async {
                let epoch = match self.epoch.load(Ordering::SeqCst) {
                    0 => self.queue.begin_term().await?,
                    epoch => epoch,
                };
                self.epoch.store(epoch, Ordering::SeqCst);
                let recovered = self.queue.recover_inflight(epoch).await?;
                Ok::<_, QueueError>((epoch, recovered))
            };
            match started.await {
                Ok((epoch, n)) => {
                    tracing::info!(
                        term = epoch,
                        recovered = n,
                        "began a pv-writer term; took over PV writes left in flight by earlier terms"
                    );
                    break;
                }
                Err(err) => {
                    readiness.set_ready(false);
                    tracing::warn!(error = %err, "Redis unreachable; not ready, retrying");
                    if sleep_or_cancel(REDIS_RETRY_INTERVAL, &shutdown).await {
                        return Ok(());
                    }
                }
            }
        }
        readiness.set_ready(true);
        // Every task below is owned by a JoinSet held by this future: when the
        // runtime aborts the work loop (lost Lease, grace period over), dropping
        // the sets aborts them, so nothing writes after the Lease is released.
        let mut background = JoinSet::new();
        background.spawn(self.clone().refresh_stats(shutdown.clone()));
        background.spawn(self.clone().probe_loop(shutdown.clone()));

        let permits = Arc::new(Semaphore::new(self.config.workers));
        let mut tasks = JoinSet::new();
        let mut redis_down = false;
        while !shutdown.is_cancelled() && !self.superseded.load(Ordering::SeqCst) {
            while tasks.try_join_next().is_some() {}
            let permit = tokio::select! {
                p = permits.clone().acquire_owned() => p.expect("semaphore never closed"),
                _ = shutdown.cancelled() => break,
            };
            let limit = permits.available_permits() + 1;
            let epoch = self.epoch.load(Ordering::SeqCst);
            let batch = match self
                .queue
                .take_due(epoch, limit, self.config.visibility_timeout)
                .await
            {
                Ok(None) => {
                    drop(permit);
                    self.fenced("take_due");
                    break;
                }
                Ok(Some(batch)) => {
                    if redis_down {
                        tracing::info!("Redis reachable again; draining");
                        redis_down = false;
                    }
                    readiness.set_ready(true);
                    batch
                }
                Err(err) => {
                    if !redis_down {
                        tracing::warn!(error = %err, "Redis unreachable; not ready, retrying");
                    }
                    redis_down = true;
                    readiness.set_ready(false);
                    drop(permit);
                    sleep_or_cancel(REDIS_RETRY_INTERVAL, &shutdown).await;
                    continue;
                }
            };
            if batch.is_empty() {
                drop(permit);
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    woken = self.queue.wait_for_work(POLL_INTERVAL) => {
                        if woken.is_err() {
                            sleep_or_cancel(POLL_INTERVAL, &shutdown).await;
                        }
                    }
                }
                continue;
            }
            let mut first = Some(permit);
            for taken in batch {
                let permit = first.take().unwrap_or_else(|| {
                    permits
                        .clone()
                        .try_acquire_owned()
                        .expect("only the dispatcher acquires permits")
                });
                let writer = self.clone();
                let shutdown = shutdown.clone();
                tasks.spawn(async move {
                    writer.process(taken, &shutdown).await;
                    drop(permit);
                });
            }
        }
        tracing::info!(
            in_flight = tasks.len(),
            "shutting down: waiting for in-flight PV writes"
        );
        while tasks.join_next().await.is_some() {}
        background.shutdown().await;
        if self.superseded.load(Ordering::SeqCst) {
            readiness.set_ready(false);
            anyhow::bail!(
                "pv-writer term {} was superseded by a newer leader; stopped draining",
                self.epoch.load(Ordering::SeqCst)
            );
        }
        Ok(())
    }

    /// Redis refused `operation` because a newer term began: stop draining.
    fn fenced(&self, operation: &str) {
        self.metrics.fenced_operations_total.inc();
        if !self.superseded.swap(true, Ordering::SeqCst) {
            tracing::error!(
                term = self.epoch.load(Ordering::SeqCst),
                operation,
                "a newer pv-writer leader term began (this replica was paused or lost its Lease); Redis refused this replica's queue operations, stopping"
            );
        }
    }

    async fn refresh_stats(self: Arc<Self>, shutdown: CancellationToken) {
        loop {
            if let Ok(stats) = self.queue.stats().await {
                self.metrics.depth.set(stats.depth as i64);
                self.metrics.dead_letters.set(stats.dead as i64);
                self.metrics
                    .oldest_age_seconds
                    .set(stats.oldest_age_seconds(stats.redis_now_ms));
            }
            if sleep_or_cancel(Duration::from_secs(1), &shutdown).await {
                return;
            }
        }
    }

    /// Write one taken entry and settle it in Redis (complete, retry or
    /// dead-letter). Never panics on bad input.
    pub async fn process(&self, taken: TakenEntry, shutdown: &CancellationToken) {
        let pv_name = taken.pv_name.clone();
        let entry = match QueuedPvWrite::decode(&taken.payload) {
            Ok(entry) => entry,
            Err(err) => {
                let kind = match err {
                    DecodeError::Garbled(_) => "garbled",
                    DecodeError::UnknownVersion { .. } => "unknown_version",
                };
                tracing::error!(pv = %pv_name, error = %err, "unreadable PV write in the queue; moving it to the dead-letter set");
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
        if let Err(refusal) = self.checks.check(&pv_name, &entry) {
            tracing::error!(pv = %pv_name, claim = %entry.claim, reason = %refusal.reason, kind = refusal.kind, "refusing a queue entry provision-svc could not have produced; moving it to the dead-letter set");
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

        let started_ms = now_ms();
        let started = Instant::now();
        let result = write_pv(&self.api, &entry, self.config.write_timeout).await;
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
                // in between announces again on the retried write (at least once,
                // like the write itself). Bounded by EVENT_PUBLISH_TIMEOUT so the
                // entry is completed well within its visibility timeout.
                let epoch = self.epoch.load(Ordering::SeqCst);
                match self
                    .settle("holds", shutdown, || self.queue.holds(epoch, &pv_name))
                    .await
                {
                    Some(Settled::Done) => {}
                    Some(Settled::Fenced) => return self.fenced("holds"),
                    Some(Settled::NotInFlight) => {
                        tracing::warn!(pv = %pv_name, "PV written but its queue entry is no longer in flight under this term (taken again after its visibility timeout); the other take settles it");
                        return;
                    }
                    None => return,
                }
                publish_bounded(
                    EVENT_PUBLISH_TIMEOUT,
                    &pv_name,
                    self.events.publish(
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
                tracing::info!(pv = %pv_name, claim = %entry.claim, outcome = label, attempts = taken.attempts + 1, "PV written");
            }
            WriteResult::Refused { kind, reason } => {
                tracing::warn!(pv = %pv_name, claim = %entry.claim, %reason, "PV write refused; moving it to the dead-letter set");
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
                    tracing::warn!(pv = %pv_name, claim = %entry.claim, attempts, retry_in = ?delay, %reason, "PV write failed; will retry");
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
        loop {
            match op().await {
                Ok(v) => {
                    if failed {
                        if let Some(r) = self.readiness.get() {
                            r.set_ready(true);
                        }
                    }
                    return Some(v);
                }
                Err(err) => {
                    failed = true;
                    if let Some(r) = self.readiness.get() {
                        r.set_ready(false);
                    }
                    tracing::warn!(operation, error = %err, "Redis unreachable while settling a PV write; not ready, retrying");
                    if sleep_or_cancel(REDIS_RETRY_INTERVAL, shutdown).await {
                        return None;
                    }
                }
            }
        }
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

/// Sleep `d`; true if `token` fired first.
async fn sleep_or_cancel(d: Duration, token: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = token.cancelled() => true,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_delay_doubles_with_at_most_20_percent_jitter_and_caps() {
        let i = Duration::from_secs(1);
        let m = Duration::from_secs(300);
        for (attempts, full) in [
            (1u32, 1.0f64),
            (2, 2.0),
            (4, 8.0),
            (9, 256.0),
            (10, 300.0),
            (40, 300.0),
        ] {
            for _ in 0..50 {
                let d = retry_delay(i, m, attempts).as_secs_f64();
                assert!(
                    d <= full + 1e-9 && d >= 0.8 * full - 1e-9,
                    "attempts {attempts}: {d}"
                );
            }
        }
    }

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
