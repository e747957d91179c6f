//! The durable PV-write queue in Redis: provision-svc enqueues the PVs it
//! provisioned, pv-writer drains them into the API server.
//!
//! Keys: docs/ARCHITECTURE.md ("The durable store"); delivery (at least once),
//! fencing by term ([`PvQueue::begin_term`]), durability and upgrades:
//! docs/decisions/0002-pv-write-queue.md. Every change touching more than one
//! key is one Lua script (module `scripts`), timed by Redis' own `TIME`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::handoff::redis_conn::{failover_like, RedisConn};
use api_types::queue::{ClaimKey, QueuedPvWrite};
use redis::aio::ConnectionLike;
use redis::{AsyncCommands, ToRedisArgs};
use serde::{Deserialize, Serialize};

use crate::handoff::redis_store::{self, RedisConfig};
use pool::Dedicated;
pub(crate) use scripts::{Key, Keys, CLEAR_INTENT, RECORD_INTENT};
use scripts::{
    QueueScript, BEGIN_TERM, COMPLETE, CURRENT_TERM, DEAD_LETTER, ENQUEUE, HOLDS, PULL_FORWARD,
    RECOVER_INFLIGHT, REQUEUE_DEAD, REQUEUE_UNHELD, RETRY, TAKE_DUE,
};

mod inspect;
mod pool;
mod scripts;

pub use inspect::{PendingEntry, PendingState, QueueStats};

/// Failure of a queue operation. Every variant is transient from the caller's
/// point of view: retry later (and report not-ready while it lasts).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// No connection ([`redis_store::ConnectError`] names the cause).
    #[error(transparent)]
    Connect(#[from] redis_store::ConnectError),
    /// A command or script failed (Redis down, timeout, wrong key type, ...).
    #[error("Redis command {operation} failed: {source}")]
    Command {
        /// The queue operation, e.g. `enqueue`.
        operation: &'static str,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
    /// A stored record the queue itself maintains (not a payload) is unreadable.
    #[error("corrupt queue record for PV {pv_name}: {detail}")]
    Corrupt {
        /// The PV name whose record is unreadable.
        pv_name: String,
        /// What is wrong with it.
        detail: String,
    },
}

/// An entry taken by [`PvQueue::take_due`]: the raw payload (decoded by the
/// writer, which dead-letters it when garbled) and its failure count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TakenEntry {
    /// The PV name (the queue key), known even when the payload is garbled.
    pub pv_name: String,
    /// The stored [`QueuedPvWrite`] JSON, as enqueued.
    pub payload: Vec<u8>,
    /// Failed write attempts before this one.
    pub attempts: u32,
}

/// Why and when an entry was dead-lettered (stored JSON in `pv-queue:dead`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeadLetter {
    /// The PV name.
    pub pv_name: String,
    /// Human-readable reason, e.g. `PV "pvc-1" already exists for claim uid 9`.
    pub reason: String,
    /// When it was dead-lettered, ms since the Unix epoch.
    pub dead_at_ms: u64,
    /// Failed write attempts before it was dead-lettered.
    pub attempts: u32,
    /// The claim, when the payload could be decoded.
    pub claim: Option<ClaimKey>,
}

/// Handle on one provisioner's queue; cheap to clone (one reconnecting connection).
/// Every method fails with [`QueueError::Command`] when a Redis command fails.
#[derive(Clone)]
pub struct PvQueue {
    conn: RedisConn,
    keys: Keys,
    /// Connections of the queue's own, for commands that would stall `conn`.
    dedicated: Option<Dedicated>,
    /// Set once the server turned out not to answer `WAITAOF`.
    no_waitaof: Arc<AtomicBool>,
    /// Replicas that must acknowledge an enqueue (`WAIT`), and for how long.
    replica_acks: ReplicaAcks,
    replica_timeout: Duration,
    /// The primary's replica count (`ROLE`), when it was read, and the number of the shared
    /// connection the reading connection followed ([`RedisConn::primary`]), for `Auto`.
    replicas_seen: Arc<Mutex<Option<(Instant, u64, u32)>>>,
    /// Random, per handle (and its clones): recorded with each term this handle begins.
    term_owner: Arc<str>,
}

/// How many replicas must acknowledge an enqueue (`WAIT`) before it counts as
/// queued: `auto` (1 while the primary has a replica, else 0) or a number.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ReplicaAcks {
    /// 1 while the primary reports a connected replica (`ROLE`, read every 5 s), else 0.
    #[default]
    Auto,
    /// Exactly this many (0: no `WAIT`).
    Count(u32),
}

impl std::str::FromStr for ReplicaAcks {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(ReplicaAcks::Auto),
            n => n
                .parse()
                .map(ReplicaAcks::Count)
                .map_err(|_| format!("{n:?} is neither `auto` nor a replica count")),
        }
    }
}

/// What [`PvQueue::enqueue`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EnqueueOutcome {
    /// True when the entry was newly queued, false when the PV name was already
    /// in the queue (pending or dead-lettered).
    pub added: bool,
    /// True when the same script removed a provisioning intent of the PV.
    pub intent_cleared: bool,
    /// True when Redis confirmed (`WAITAOF`, Redis ≥ 7.2) that its AOF holds the
    /// entry on disk; false on older servers or without AOF.
    pub fsynced: bool,
    /// Replicas asked to acknowledge the entry (`WAIT`), and how many did in time.
    pub replicas: (u32, u32),
}

/// Result of settling an entry ([`PvQueue::complete`], [`PvQueue::schedule_retry`],
/// [`PvQueue::dead_letter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Settled {
    /// The entry moved as asked.
    Done,
    /// The entry is not in flight under this term (already settled, or taken
    /// again after its visibility timeout); nothing changed.
    NotInFlight,
    /// The caller's term is stale (a newer pv-writer leader began); nothing
    /// changed, and the refusal was counted ([`PvQueue::fenced_operations`]).
    Fenced,
}

impl PvQueue {
    /// Connect as `redis` describes (the wake-up connection too) and use the keys of
    /// `provisioner_name`. Errors: [`QueueError::Connect`] naming the cause.
    pub async fn connect(
        redis: impl Into<RedisConfig>,
        provisioner_name: &str,
    ) -> Result<Self, QueueError> {
        let redis = redis.into();
        let conn = redis_store::connect(redis).await?;
        let mut queue = Self::with_connection(conn, provisioner_name);
        queue.dedicated = Some(Dedicated::default());
        Ok(queue)
    }

    /// A queue over an existing connection (embedding, tests).
    pub fn with_connection(conn: RedisConn, provisioner_name: &str) -> Self {
        PvQueue {
            conn,
            keys: Keys::new(provisioner_name),
            dedicated: None,
            no_waitaof: Default::default(),
            replica_acks: ReplicaAcks::Auto,
            replica_timeout: Duration::from_secs(1),
            replicas_seen: Default::default(),
            term_owner: uuid::Uuid::new_v4().to_string().into(),
        }
    }

    /// The queue's shared Redis connection (e.g. for the intents, so both follow one primary).
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// The same queue waiting for `acks` replicas (at most `timeout`) after each enqueue.
    pub fn with_replica_acks(mut self, acks: ReplicaAcks, timeout: Duration) -> Self {
        self.replica_acks = acks;
        self.replica_timeout = timeout;
        self
    }

    /// Atomically queue `entry` and clear the PV's intent (idempotent while the PV name is
    /// queued or dead), then `WAITAOF` (where Redis has it) and `WAIT` ([`ReplicaAcks`]), on a
    /// connection of its own. Errors: `Command`; nothing queued, the intent stays.
    pub async fn enqueue(&self, entry: &QueuedPvWrite) -> Result<EnqueueOutcome, QueueError> {
        self.enqueue_raw(entry.pv_name(), &entry.encode()).await
    }

    /// [`enqueue`](Self::enqueue) a raw payload under `pv_name` (operators' repair
    /// tools and tests of garbled entries).
    pub async fn enqueue_raw(
        &self,
        pv_name: &str,
        payload: &[u8],
    ) -> Result<EnqueueOutcome, QueueError> {
        let Some(dedicated) = &self.dedicated else {
            let (mut conn, number) = (self.conn.clone(), self.conn.primary().0);
            return Ok(self
                .enqueue_on((&mut conn, number), pv_name, payload)
                .await?
                .0);
        };
        match self.enqueue_dedicated(dedicated, pv_name, payload).await {
            Ok(outcome) => Ok(outcome),
            Err((_, true)) => {
                let again = self.enqueue_dedicated(dedicated, pv_name, payload).await;
                again.map_err(|(err, _)| err)
            }
            Err((err, false)) => Err(err),
        }
    }

    /// One enqueue on a pool connection; after a timeout or failover-like error the pool is
    /// dropped, the shared connection reacts, and the error says whether to enqueue once
    /// more (not after a timeout; when the connection was idle or the shared one replaced).
    async fn enqueue_dedicated(
        &self,
        dedicated: &Dedicated,
        pv_name: &str,
        payload: &[u8],
    ) -> Result<EnqueueOutcome, (QueueError, bool)> {
        let primary = self.conn.primary();
        let (source, reused) = match dedicated.take(primary.clone()).await {
            Ok(((number, mut conn), reused, generation)) => {
                match self.enqueue_on((&mut conn, number), pv_name, payload).await {
                    Ok((outcome, answered)) => {
                        if answered {
                            dedicated.give_back((number, conn), generation);
                        }
                        return Ok(outcome);
                    }
                    Err(QueueError::Command { source, .. }) => (source, reused),
                    Err(err) => return Err((err, false)),
                }
            }
            Err(source) => (source, false),
        };
        let mut again = false;
        if source.is_timeout() || failover_like(&source) {
            dedicated.drop_all();
            self.conn.clone().saw_error(&source).await;
            let replaced = self.conn.primary().0 != primary.0;
            again = !source.is_timeout() && (reused || replaced);
        }
        Err((cmd(ENQUEUE.name)(source), again))
    }

    /// The enqueue script, `WAITAOF` and `WAIT`, all on `conn` (both waits cover the
    /// writes of their own connection only), which followed shared connection `number`.
    async fn enqueue_on(
        &self,
        (conn, number): (&mut (impl ConnectionLike + Send), u64),
        pv_name: &str,
        payload: &[u8],
    ) -> Result<(EnqueueOutcome, bool), QueueError> {
        let script = ENQUEUE.invoke(conn, &self.keys, (pv_name, payload)).await;
        let (added, cleared): (i64, i64) = script.map_err(cmd(ENQUEUE.name))?;
        let (fsynced, aof_answered) = self.wait_aof(conn).await;
        let (replicas, replicas_answered) = self.wait_replicas((conn, number), pv_name).await;
        let outcome = EnqueueOutcome {
            added: added == 1,
            intent_cleared: cleared == 1,
            fsynced,
            replicas,
        };
        Ok((outcome, aof_answered && replicas_answered))
    }

    /// `WAIT` for the replicas [`ReplicaAcks`] asks: ((asked, acknowledged), no command
    /// failed). A shortfall is logged: the entry may be lost by a failover to a replica.
    async fn wait_replicas(
        &self,
        (conn, number): (&mut (impl ConnectionLike + Send), u64),
        pv_name: &str,
    ) -> ((u32, u32), bool) {
        let (wanted, role_answered) = match self.replica_acks {
            ReplicaAcks::Count(n) => (n, true),
            ReplicaAcks::Auto => match self.connected_replicas((conn, number)).await {
                Some(n) => (n.min(1), true),
                None => (0, false),
            },
        };
        if wanted == 0 {
            return ((0, 0), role_answered);
        }
        let acked: Result<u32, _> = redis::cmd("WAIT")
            .arg(wanted)
            .arg(self.replica_timeout.as_millis() as u64)
            .query_async(conn)
            .await;
        let answered = acked.is_ok();
        let acked = acked.unwrap_or_else(|err| {
            tracing::warn!(error = %err, "WAIT failed");
            0
        });
        if acked < wanted {
            tracing::warn!(
                pv = pv_name,
                wanted,
                acked,
                at_risk =
                    "this enqueue, if Redis fails over now (provisioned again from the claim)",
                "replicas did not acknowledge an enqueue in time"
            );
        }
        ((wanted, acked), answered)
    }

    /// The primary's connected replicas (`ROLE` on `conn`, which followed shared connection
    /// `number`), read at most every 5 s and again for another number; `None` when `ROLE`
    /// failed or `conn` is not to a primary (not remembered).
    async fn connected_replicas(
        &self,
        (conn, number): (&mut (impl ConnectionLike + Send), u64),
    ) -> Option<u32> {
        let seen = *self.replicas_seen.lock().expect("not poisoned");
        let fresh = |(at, of, _): &(Instant, u64, u32)| {
            *of == number && at.elapsed() < Duration::from_secs(5)
        };
        if let Some((_, _, n)) = seen.filter(fresh) {
            return Some(n);
        }
        // A primary answers `[master, offset, [replica...]]`; a replica's answer is not kept.
        let role: Result<redis::Value, _> = redis::cmd("ROLE").query_async(conn).await;
        type Role = (String, redis::Value, Vec<redis::Value>);
        let (role, _, replicas) = redis::from_redis_value::<Role>(role.ok()?).ok()?;
        if role != "master" {
            return None;
        }
        let n = replicas.len() as u32;
        *self.replicas_seen.lock().expect("not poisoned") = Some((Instant::now(), number, n));
        Some(n)
    }

    /// `WAITAOF 1 0 1000` (Redis ≥ 7.2): (the local AOF holds every write so far, no command
    /// failed); an older server or one without AOF is remembered and logged once.
    async fn wait_aof(&self, conn: &mut (impl ConnectionLike + Send)) -> (bool, bool) {
        if self.no_waitaof.load(Ordering::Relaxed) {
            return (false, true);
        }
        let answer: Result<(i64, i64), _> = redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(1000)
            .query_async(conn)
            .await;
        match answer {
            Ok((local, _)) => {
                if local < 1 {
                    tracing::warn!(
                        likely_cause = "appendfsync everysec (use always)",
                        "Redis did not fsync its AOF within 1 s of an enqueue"
                    );
                }
                (local >= 1, true)
            }
            Err(err) => {
                let text = err.to_string().to_ascii_lowercase();
                if text.contains("unknown command") || text.contains("appendonly") {
                    if !self.no_waitaof.swap(true, Ordering::Relaxed) {
                        tracing::warn!(error = %err, needs = "Redis >= 7.2 with appendonly yes", at_risk = "enqueues within the appendfsync window (provisioned again from their intent)", "Redis cannot confirm AOF fsyncs");
                    }
                    return (false, true);
                }
                tracing::warn!(error = %err, "WAITAOF failed; the enqueue is stored but its fsync is unconfirmed");
                (false, false)
            }
        }
    }

    /// Wait until an enqueue signals new work (true) or `timeout` passes (false),
    /// blocking on the wake-up list over a dedicated connection (a queue made with
    /// [`with_connection`](Self::with_connection) just sleeps).
    pub async fn wait_for_work(&self, timeout: Duration) -> Result<bool, QueueError> {
        let Some(dedicated) = &self.dedicated else {
            tokio::time::sleep(timeout).await;
            return Ok(false);
        };
        let mut slot = dedicated.waker.lock().await;
        let (primary, answer) = (self.conn.primary(), timeout + Duration::from_secs(2));
        let popped = async {
            let stale = slot
                .as_ref()
                .is_none_or(|((number, _), within)| *number != primary.0 || *within < answer);
            if stale {
                *slot = Some((pool::open(primary, answer).await?, answer));
            }
            let conn = &mut slot.as_mut().expect("connection just made").0 .1;
            let wakeup = self.keys.get(Key::Wakeup);
            conn.blpop::<_, Option<(String, String)>>(wakeup, timeout.as_secs_f64().max(0.01))
                .await
        };
        match popped.await {
            Ok(token) => Ok(token.is_some()),
            Err(err) => {
                *slot = None;
                self.conn.clone().saw_error(&err).await;
                Err(cmd("wait_for_work")(err))
            }
        }
    }

    /// True while `pv_name` is in the queue: pending, in flight or dead-lettered
    /// (provision-svc treats such a PV as existing).
    pub async fn is_pending(&self, pv_name: &str) -> Result<bool, QueueError> {
        self.conn
            .clone()
            .hexists(self.keys.get(Key::Payloads), pv_name)
            .await
            .map_err(cmd("is_pending"))
    }

    /// Start a new pv-writer term: `INCR` the epoch and return it; from then on every
    /// take and settlement of an older term is refused ([`Settled::Fenced`]).
    pub async fn begin_term(&self) -> Result<u64, QueueError> {
        self.begin_term_above(0).await
    }

    /// [`begin_term`](Self::begin_term) with a new epoch above `floor` too: after
    /// Redis lost the counter, the caller's old term still orders the new one.
    pub async fn begin_term_above(&self, floor: u64) -> Result<u64, QueueError> {
        self.run(&BEGIN_TERM, (floor, &*self.term_owner)).await
    }

    /// The current term and whether this handle began it (true also when its
    /// [`begin_term_above`](Self::begin_term_above) ran but the reply was lost).
    pub async fn current_term_and_ours(&self) -> Result<(u64, bool), QueueError> {
        let (epoch, owner): (u64, Option<String>) = self.run(&CURRENT_TERM, &[] as &[&str]).await?;
        Ok((epoch, owner.as_deref() == Some(&*self.term_owner)))
    }

    /// The current term (0 before the first [`begin_term`](Self::begin_term)).
    pub async fn current_term(&self) -> Result<u64, QueueError> {
        self.counter("current_term", Key::Epoch).await
    }

    /// How many takes and settlements were refused because their term was stale.
    pub async fn fenced_operations(&self) -> Result<u64, QueueError> {
        self.counter("fenced_operations", Key::Fenced).await
    }

    /// Take up to `limit` due entries (oldest first, expired in-flight ones due again
    /// first) for term `epoch`, in flight until Redis' now + `visibility`; `None` when
    /// `epoch` is not the current term.
    pub async fn take_due(
        &self,
        epoch: u64,
        limit: usize,
        visibility: Duration,
    ) -> Result<Option<Vec<TakenEntry>>, QueueError> {
        if limit == 0 {
            return Ok(Some(Vec::new()));
        }
        let args = (epoch, visibility.as_millis() as u64, limit);
        let (current, raw): (i64, Vec<(String, Vec<u8>, String)>) =
            self.run(&TAKE_DUE, args).await?;
        let taken = raw
            .into_iter()
            .map(|(pv_name, payload, attempts)| TakenEntry {
                attempts: attempts.parse().unwrap_or(0),
                pv_name,
                payload,
            });
        Ok((current == 1).then(|| taken.collect()))
    }

    /// Make every in-flight entry owned by a term before `epoch` (or by none) due now;
    /// returns how many. The leader calls it right after [`begin_term`](Self::begin_term).
    pub async fn recover_inflight(&self, epoch: u64) -> Result<u64, QueueError> {
        self.run(&RECOVER_INFLIGHT, epoch).await
    }

    /// Make due now every entry in flight under `epoch` that no worker holds (`held`):
    /// taken by a take whose reply was lost. `None` when `epoch` is stale (counted),
    /// else how many; called only while no take is outstanding.
    pub async fn requeue_unheld(
        &self,
        epoch: u64,
        held: &[String],
    ) -> Result<Option<u64>, QueueError> {
        let n: i64 = self.run(&REQUEUE_UNHELD, (epoch, held)).await?;
        Ok(u64::try_from(n).ok())
    }

    /// Whether `pv_name` is still in flight under the current term `epoch`
    /// ([`Settled::Done`]; [`Settled::Fenced`], counted, when stale). Changes no entry.
    pub async fn holds(&self, epoch: u64, pv_name: &str) -> Result<Settled, QueueError> {
        self.settle(&HOLDS, (epoch, pv_name)).await
    }

    /// Remove `pv_name` everywhere (the PV exists); only for an entry in flight under
    /// `epoch`. On `Command` the entry stays queued and is written again later.
    pub async fn complete(&self, epoch: u64, pv_name: &str) -> Result<Settled, QueueError> {
        self.settle(&COMPLETE, (epoch, pv_name)).await
    }

    /// Put an entry in flight under `epoch` back, due `delay` after Redis' now, with
    /// `attempts` failed attempts so far.
    pub async fn schedule_retry(
        &self,
        epoch: u64,
        pv_name: &str,
        delay: Duration,
        attempts: u32,
    ) -> Result<Settled, QueueError> {
        let delay_ms = delay.as_millis() as u64;
        self.settle(&RETRY, (epoch, pv_name, delay_ms, attempts))
            .await
    }

    /// Move an entry in flight under `epoch` to the dead letters with `letter`; its
    /// payload stays (so [`is_pending`](Self::is_pending) stays true) until requeued.
    pub async fn dead_letter(
        &self,
        epoch: u64,
        letter: &DeadLetter,
    ) -> Result<Settled, QueueError> {
        let json = serde_json::to_vec(letter).expect("DeadLetter always serializes");
        self.settle(&DEAD_LETTER, (epoch, &letter.pv_name, json))
            .await
    }

    /// Move a dead letter back to pending, due now with its attempts reset; `false`
    /// when `pv_name` is not dead-lettered.
    pub async fn requeue_dead(&self, pv_name: &str) -> Result<bool, QueueError> {
        let moved: i64 = self.run(&REQUEUE_DEAD, pv_name).await?;
        Ok(moved == 1)
    }

    /// Make every entry waiting for a later retry due now; returns how many.
    pub async fn pull_forward_retries(&self) -> Result<u64, QueueError> {
        self.run(&PULL_FORWARD, None::<u64>).await
    }

    /// Run `script` with this queue's keys and `args` (a value or a tuple; `None`: no `ARGV`).
    async fn run<T: redis::FromRedisValue>(
        &self,
        script: &QueueScript,
        args: impl ToRedisArgs,
    ) -> Result<T, QueueError> {
        let result = script
            .invoke(&mut self.conn.clone(), &self.keys, args)
            .await;
        result.map_err(cmd(script.name))
    }

    /// The integer at `key` (0 when absent).
    async fn counter(&self, operation: &'static str, key: Key) -> Result<u64, QueueError> {
        let n: Option<u64> = self
            .conn
            .clone()
            .get(self.keys.get(key))
            .await
            .map_err(cmd(operation))?;
        Ok(n.unwrap_or(0))
    }

    /// [`run`](Self::run) a script answering a settlement code (1, 0 or -1).
    async fn settle(
        &self,
        script: &QueueScript,
        args: impl ToRedisArgs,
    ) -> Result<Settled, QueueError> {
        Ok(match self.run::<i64>(script, args).await? {
            1 => Settled::Done,
            -1 => Settled::Fenced,
            _ => Settled::NotInFlight,
        })
    }
}

fn cmd(operation: &'static str) -> impl Fn(redis::RedisError) -> QueueError {
    move |source| QueueError::Command { operation, source }
}

#[cfg(test)]
mod tests;
