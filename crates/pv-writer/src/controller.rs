//! pv-writer's drain loop, the only place that spawns: [`run_term`] connects
//! to Redis and begins a leader term, then takes due entries and runs
//! [`Writer::process`] on each with `--worker-threads` concurrency, probes the
//! API server while writes fail and keeps the queue gauges fresh.

use std::collections::HashMap;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use common::handoff::queue::{PvQueue, QueueError, TakenEntry};
use common::kube::retry::Backoff;
use common::runtime::frame::ServiceContext;
use common::runtime::health;
use tokio::sync::watch;
use tokio::task::{Id, JoinSet};
use tokio::time::{sleep, Instant};
use tokio_util::sync::CancellationToken;

use crate::checks::EntryChecks;
use crate::config::WriterConfig;
use crate::decision::{after_refusal, is_transient_code, AfterRefusal};
use crate::metrics::WriterMetrics;
use crate::operation::{Writer, WriterError};

/// Longest the idle dispatcher waits before looking for due entries again;
/// an enqueue wakes it at once ([`common::handoff::queue::PvQueue::wait_for_work`]), so
/// this only bounds how late a retry that comes due is picked up.
pub const POLL_INTERVAL: Duration = Duration::from_millis(100);

/// One leader term: connect to Redis (not ready until it answers), then drain
/// with a new [`Writer`] until shutdown, writing only entries that pass
/// [`EntryChecks`]. Errors: a newer leader term ([`WriterError::Superseded`]).
pub async fn run_term(
    ctx: ServiceContext,
    (config, metrics, checks): (WriterConfig, WriterMetrics, EntryChecks),
) -> anyhow::Result<()> {
    ctx.readiness.set_ready(false);
    let Some(queue) = ctx
        .args
        .redis_reconnect()
        .retry(
            &ctx.shutdown,
            || {
                // Waiting for Redis is not a stall (/readyz reports it).
                ctx.heartbeat.beat();
                PvQueue::connect(ctx.args.cluster.redis(), &ctx.args.cluster.provisioner_name)
            },
            |err, _, _| tracing::warn!(error = %err, "cannot connect to Redis; not ready, retrying"),
        )
        .await
    else {
        return Ok(());
    };
    tracing::info!(workers = config.workers, provisioner = %ctx.args.cluster.provisioner_name, "draining the PV write queue");
    let readiness = ctx.readiness.clone();
    let writer = Writer::new(
        queue,
        checks,
        ctx.client,
        &ctx.identity,
        metrics,
        readiness,
        config,
    );
    // Beats /healthz while the dispatcher progresses, idles or waits for Redis,
    // until stuck with Redis up for --healthz-stall-timeout; aborted with this future.
    let (dispatched, ready) = (writer.dispatched.clone(), ctx.readiness.clone());
    let stall_timeout = ctx.args.healthz_stall_timeout;
    let mut watchdog = JoinSet::new();
    watchdog.spawn(health::beat_while_progressing(
        ctx.heartbeat,
        health::beat_period(stall_timeout),
        stall_timeout,
        move || {
            if ready.is_ready() {
                dispatched.age()
            } else {
                Duration::ZERO
            }
        },
        ctx.shutdown.clone(),
    ));
    Ok(Arc::new(writer).run(ctx.shutdown).await?)
}

impl Writer {
    /// While transient failures happen (`failed_write` changes), probe the API server every
    /// `interval`.
    async fn probe_loop(
        self: Arc<Self>,
        mut failed_write: watch::Receiver<String>,
        shutdown: CancellationToken,
    ) {
        let interval = self
            .config
            .retry_initial
            .clamp(Duration::from_millis(100), Duration::from_secs(5));
        let timeout = self.config.write_timeout.min(Duration::from_secs(5));
        while shutdown
            .run_until_cancelled(sleep(interval))
            .await
            .is_some()
        {
            if !failed_write.has_changed().unwrap_or(false) && !self.api_down.load(Ordering::SeqCst)
            {
                continue;
            }
            let name = failed_write.borrow_and_update().clone();
            match tokio::time::timeout(timeout, self.api.get_opt(&name)).await {
                Ok(Ok(_)) => self.api_is_up().await,
                Ok(Err(kube::Error::Api(s))) if !is_transient_code(s.code) => {
                    self.api_is_up().await
                }
                // Down: logged when it goes down.
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

    /// Drain until `shutdown` fires, then wait for in-flight writes to settle;
    /// readiness follows Redis. Errors: [`WriterError::Superseded`].
    pub async fn run(self: Arc<Self>, shutdown: CancellationToken) -> Result<(), WriterError> {
        if !self.begin(&shutdown).await {
            return Ok(());
        }
        // Every task below is owned by a JoinSet held by this future: when the
        // runtime aborts the work loop (lost Lease, grace period over), dropping
        // the sets aborts them, so nothing writes after the Lease is released.
        let mut background = JoinSet::new();
        background.spawn(self.clone().refresh_stats(shutdown.clone()));
        // Subscribed here, not in the task: a failure before its first poll is still seen.
        let failed_write = self.failed_write.subscribe();
        background.spawn(self.clone().probe_loop(failed_write, shutdown.clone()));

        let mut tasks = JoinSet::new();
        // The PV name each worker task holds, from the take to the settle.
        let mut held = HashMap::new();
        let (mut redis_down, mut newer_leader) = (false, false);
        // Next look for entries of this term that no worker holds: soon after
        // any failed Redis call of the dispatcher (its take may have run without
        // its reply arriving), else every ORPHAN_CHECK_PERIOD.
        let mut orphan_check_at = Instant::now() + ORPHAN_CHECK_PERIOD;
        'drain: while !shutdown.is_cancelled() {
            if self.superseded.load(Ordering::SeqCst) {
                match self.check_refused_term(&mut redis_down, &shutdown).await {
                    Some(true) => {}
                    Some(false) => {
                        newer_leader = true;
                        break;
                    }
                    None => continue,
                }
            }
            self.dispatched.beat();
            // Reap finished workers; with none free, wait for one.
            loop {
                let done = if tasks.len() < self.config.workers {
                    tasks.try_join_next_with_id()
                } else {
                    tokio::select! {
                        done = tasks.join_next_with_id() => done,
                        _ = shutdown.cancelled() => break 'drain,
                    }
                };
                let Some(done) = done else { break };
                held.remove(&done.map_or_else(|err| err.id(), |(id, ())| id));
            }
            let limit = self.config.workers - tasks.len();
            let batch = self.take(
                limit,
                &held,
                &mut redis_down,
                &mut orphan_check_at,
                &shutdown,
            );
            for taken in batch.await {
                let (writer, shutdown) = (self.clone(), shutdown.clone());
                let pv_name = taken.pv_name.clone();
                let task = tasks.spawn(async move { writer.process(taken, &shutdown).await });
                held.insert(task.id(), pv_name);
            }
        }
        tracing::info!(
            in_flight = tasks.len(),
            "shutting down: waiting for in-flight PV writes"
        );
        while tasks.join_next().await.is_some() {}
        background.shutdown().await;
        if newer_leader {
            self.readiness.set_ready(false);
            return Err(WriterError::Superseded(self.term()));
        }
        Ok(())
    }

    /// Begin a term (or go on with [`set_term`](Self::set_term)'s) and take over what earlier,
    /// gone or fenced terms left in flight; retried while Redis is unreachable (not ready
    /// until done). False if shutdown came first.
    async fn begin(&self, shutdown: &CancellationToken) -> bool {
        let started = || async {
            let epoch = match self.term() {
                0 => self.queue.begin_term().await?,
                epoch => epoch,
            };
            self.set_term(epoch);
            let recovered = self.queue.recover_inflight(epoch).await?;
            Ok::<_, QueueError>((epoch, recovered))
        };
        let Some((epoch, n)) = Backoff::constant(self.config.redis_reconnect)
            .retry(shutdown, started, |err, _, _| {
                self.readiness.set_ready(false);
                tracing::warn!(error = %err, "Redis command failed; not ready, retrying");
            })
            .await
        else {
            return false;
        };
        tracing::info!(
            term = epoch,
            recovered = n,
            "began a pv-writer term; took over PV writes left in flight by earlier terms"
        );
        self.readiness.set_ready(true);
        true
    }

    /// Up to `limit` due entries, first requeueing those no worker `held` when `orphan_check_at`
    /// is due. Empty when Redis refused this term ([`fenced`](Self::fenced)), after a pause
    /// while it is unreachable (`redis_down`, not ready), or after waiting for work.
    async fn take(
        &self,
        limit: usize,
        held: &HashMap<Id, String>,
        redis_down: &mut bool,
        orphan_check_at: &mut Instant,
        shutdown: &CancellationToken,
    ) -> Vec<TakenEntry> {
        let epoch = self.term();
        let taken = async {
            if Instant::now() >= *orphan_check_at {
                let held: Vec<String> = held.values().cloned().collect();
                match self.queue.requeue_unheld(epoch, &held).await? {
                    None => return Ok(Err("requeue_unheld")),
                    Some(0) => {}
                    Some(n) => tracing::warn!(
                        entries = n,
                        "requeued PV writes taken under this term whose take never reached a worker (reply lost with the Redis connection)"
                    ),
                }
                *orphan_check_at = Instant::now() + ORPHAN_CHECK_PERIOD;
            }
            let visibility = self.config.visibility_timeout;
            let taken = self.queue.take_due(epoch, limit, visibility).await?;
            Ok::<_, QueueError>(taken.ok_or("take_due"))
        };
        match taken.await {
            Ok(Err(fenced_at)) => self.fenced(fenced_at),
            Ok(Ok(batch)) => {
                if std::mem::take(redis_down) {
                    tracing::info!("Redis reachable again; draining");
                }
                self.readiness.set_ready(true);
                if !batch.is_empty() {
                    return batch;
                }
                let woken = self.queue.wait_for_work(POLL_INTERVAL);
                if let Some(Err(_)) = shutdown.run_until_cancelled(woken).await {
                    *orphan_check_at = Instant::now();
                    shutdown.run_until_cancelled(sleep(POLL_INTERVAL)).await;
                }
            }
            Err(err) => {
                if !std::mem::replace(redis_down, true) {
                    tracing::warn!(error = %err, "Redis command failed; not ready, retrying");
                }
                self.readiness.set_ready(false);
                *orphan_check_at = Instant::now();
                let reconnect = sleep(self.config.redis_reconnect);
                shutdown.run_until_cancelled(reconnect).await;
            }
        }
        Vec::new()
    }

    /// With this term refused: drain on (`Some(true)`; a term above ours begins when Redis
    /// lost its data, [`after_refusal`]), stop for a newer leader (`Some(false)`), or `None`
    /// after a pause when Redis failed the check (not ready; sets `take`'s `redis_down`).
    async fn check_refused_term(
        &self,
        redis_down: &mut bool,
        shutdown: &CancellationToken,
    ) -> Option<bool> {
        let ours = self.term();
        let mut failed = |err: QueueError| {
            if !std::mem::replace(redis_down, true) {
                tracing::warn!(error = %err, "Redis command failed during the pv-writer term check; not ready, retrying");
            }
        };
        let current = self.queue.current_term_and_ours().await;
        let current = current.map_err(&mut failed).ok();
        let mut decided = after_refusal(ours, current);
        if decided == AfterRefusal::BeginAbove {
            match self.queue.begin_term_above(ours).await {
                Ok(epoch) => {
                    self.set_term(epoch);
                    tracing::error!(
                        lost_term = ours,
                        term = epoch,
                        "Redis lost the pv-writer term with its data; began a term above it"
                    );
                }
                Err(err) => {
                    failed(err);
                    decided = AfterRefusal::AskAgain;
                }
            }
        }
        if let AfterRefusal::Adopt(epoch) = decided {
            self.set_term(epoch);
            tracing::warn!(
                term = epoch,
                "the current pv-writer term is one this writer began (its reply was lost); draining on under it"
            );
        }
        match decided {
            AfterRefusal::GoOn | AfterRefusal::BeginAbove | AfterRefusal::Adopt(_) => {
                self.superseded.store(false, Ordering::SeqCst);
                Some(true)
            }
            AfterRefusal::Stop => {
                tracing::error!(term = ours, "a newer pv-writer leader term began; stopping");
                Some(false)
            }
            AfterRefusal::AskAgain => {
                self.readiness.set_ready(false);
                self.dispatched.beat();
                let pause = sleep(self.config.redis_reconnect);
                shutdown.run_until_cancelled(pause).await;
                None
            }
        }
    }

    /// Every second, the queue gauges from Redis.
    async fn refresh_stats(self: Arc<Self>, shutdown: CancellationToken) {
        let mut every = tokio::time::interval(Duration::from_secs(1));
        every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while shutdown.run_until_cancelled(every.tick()).await.is_some() {
            if let Ok(stats) = self.queue.stats().await {
                self.metrics.depth.set(stats.depth as i64);
                self.metrics.dead_letters.set(stats.dead as i64);
                self.metrics
                    .oldest_age_seconds
                    .set(stats.oldest_age_seconds(stats.redis_now_ms));
            }
        }
    }
}

/// How often the dispatcher hands back entries of its own term that no worker
/// holds ([`common::handoff::queue::PvQueue::requeue_unheld`]) when none of its
/// Redis calls failed; after a failure it does so at its next turn.
pub const ORPHAN_CHECK_PERIOD: Duration = Duration::from_secs(30);
