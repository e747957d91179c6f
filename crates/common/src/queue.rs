//! The durable PV-write queue in Redis: provision-svc enqueues the PVs it
//! provisioned, pv-writer drains them into the API server.
//!
//! The seed keeps a PV the API server refused in memory only, so a restart loses
//! it and the storage asset leaks. Here the PV is stored in Redis (AOF on) before
//! provision-svc forgets it and is removed only once the PV object exists.
//!
//! # Redis layout
//!
//! Every key lives under [`key_prefix`](crate::redis_store::key_prefix)`(provisioner name)`,
//! i.e. `provisioner:{<name>}:` (a Redis Cluster hash tag, so every multi-key
//! script below stays on one shard). With `P` that prefix:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `P pv-queue:payloads` | hash | PV name → the stored [`QueuedPvWrite`] JSON, exactly as enqueued. A field here **is** the "pending" marker ([`PvQueue::is_pending`]); it is removed only when the PV exists. |
//! | `P pv-queue:due` | sorted set | PV name, score = time it may be taken next (ms since the Unix epoch). Entries waiting for a worker or for a retry. |
//! | `P pv-queue:inflight` | sorted set | PV name, score = end of the visibility timeout (ms). Entries a worker has taken; an entry still here after its timeout (worker killed) goes back to `due`. |
//! | `P pv-queue:attempts` | hash | PV name → failed write attempts so far (drives the backoff). |
//! | `P pv-queue:enqueued` | sorted set | PV name, score = enqueue (or requeue) time (ms); its minimum is the oldest pending age. |
//! | `P pv-queue:dead` | hash | PV name → [`DeadLetter`] JSON (reason, time, attempts). The payload stays in `payloads`, so a dead letter is never lost and can be requeued. |
//! | `P pv-queue:wakeup` | list | At most one token, pushed by an enqueue; the writer blocks on it ([`PvQueue::wait_for_work`]) instead of polling, so a new entry is taken within a round trip. Losing it only costs one poll interval. |
//!
//! Every entry is in exactly one of `due`, `inflight` or `dead`, and in
//! `payloads` for as long as it is in any of them. Every change touching more
//! than one key is one Lua script (atomic in Redis), keyed by PV name, so a crash
//! of either side between two commands cannot leave a half-made entry.
//!
//! # Delivery
//!
//! At least once: an entry leaves the queue only through [`PvQueue::complete`],
//! which the writer calls after the PV exists. A writer killed between the
//! create and the completion leaves the entry in `inflight`; the next leader
//! takes it again ([`PvQueue::recover_inflight`] on start, or the visibility
//! timeout), and the repeated create answers `AlreadyExists` for the same claim
//! uid, which the writer treats as success — so no PV is ever written twice.
//!
//! Times are passed in by the caller (milliseconds since the Unix epoch, from
//! [`now_ms`]) so tests can control them; only the pv-writer leader consumes.

use std::sync::LazyLock;
use std::time::Duration;

use api_types::queue::{ClaimKey, QueuedPvWrite};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use crate::redis_store;

/// Failure of a queue operation. Every variant is transient from the caller's
/// point of view: retry later (and report not-ready while it lasts).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// Redis could not be reached at the first connection, or the URL is invalid.
    #[error("cannot connect to Redis at {url}: {source}")]
    Connect {
        /// The Redis URL, without credentials.
        url: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
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

/// Re-exported for callers that already import it from here; the one
/// definition is [`crate::time::now_ms`].
pub use crate::time::now_ms;

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

/// Where a pending (not dead) entry stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PendingState {
    /// Waiting to be taken at `.0` (ms since the Unix epoch; in the past = now).
    Due(u64),
    /// Taken by a writer; returns to `Due` at `.0` (ms) unless completed first.
    InFlight(u64),
}

/// One pending entry as [`PvQueue::list_pending`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingEntry {
    /// The PV name.
    pub pv_name: String,
    /// Due or in flight, with the time.
    pub state: PendingState,
    /// Failed write attempts so far.
    pub attempts: u32,
    /// The decoded payload, or the decode error's message when garbled.
    pub entry: Result<QueuedPvWrite, String>,
}

/// Counts for the queue metrics, read in one round trip ([`PvQueue::stats`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct QueueStats {
    /// Pending entries (due + in flight), dead letters excluded.
    pub depth: u64,
    /// Dead-lettered entries.
    pub dead: u64,
    /// Enqueue time of the oldest pending entry (ms), if any.
    pub oldest_enqueued_ms: Option<u64>,
}

impl QueueStats {
    /// Age of the oldest pending entry at `now_ms`, in seconds (0 when empty).
    pub fn oldest_age_seconds(&self, now_ms: u64) -> f64 {
        self.oldest_enqueued_ms
            .map(|t| now_ms.saturating_sub(t) as f64 / 1000.0)
            .unwrap_or(0.0)
    }
}

/// Handle on one provisioner's queue; cheap to clone (shares one reconnecting
/// connection).
#[derive(Clone)]
pub struct PvQueue {
    conn: ConnectionManager,
    keys: Keys,
    /// Client for the dedicated connection that blocks on the wake-up list
    /// (a blocking command would stall every other command on `conn`).
    waker: Option<Waker>,
}

#[derive(Clone)]
struct Waker {
    client: redis::Client,
    conn: std::sync::Arc<tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>>,
}

#[derive(Clone)]
struct Keys {
    payloads: String,
    due: String,
    inflight: String,
    attempts: String,
    enqueued: String,
    dead: String,
    wakeup: String,
}

impl Keys {
    fn new(provisioner_name: &str) -> Self {
        let p = redis_store::key_prefix(provisioner_name);
        Keys {
            payloads: format!("{p}pv-queue:payloads"),
            due: format!("{p}pv-queue:due"),
            inflight: format!("{p}pv-queue:inflight"),
            attempts: format!("{p}pv-queue:attempts"),
            enqueued: format!("{p}pv-queue:enqueued"),
            dead: format!("{p}pv-queue:dead"),
            wakeup: format!("{p}pv-queue:wakeup"),
        }
    }
}

// KEYS: payloads, due, enqueued, wakeup. ARGV: pv name, payload, now ms, enqueued ms.
// Returns 1 when newly queued, 0 when the PV name was already in the queue.
static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('ZADD', KEYS[2], ARGV[3], ARGV[1])
  redis.call('ZADD', KEYS[3], ARGV[4], ARGV[1])
  if redis.call('LLEN', KEYS[4]) == 0 then
    redis.call('RPUSH', KEYS[4], '1')
  end
  return 1
end
return 0
"#,
    )
});

// KEYS: payloads, due, inflight, attempts, enqueued. ARGV: now ms, visibility
// deadline ms, limit.
// Moves expired in-flight entries back to due, then moves up to `limit` due
// entries to in-flight and returns {name, payload, attempts} triples. A due
// name without a payload (the payload hash was edited by hand) is dropped from
// every index, so it cannot pin the oldest-pending age.
static TAKE_DUE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', ARGV[1])
for _, name in ipairs(expired) do
  redis.call('ZREM', KEYS[3], name)
  redis.call('ZADD', KEYS[2], ARGV[1], name)
end
local names = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, name in ipairs(names) do
  redis.call('ZREM', KEYS[2], name)
  local payload = redis.call('HGET', KEYS[1], name)
  if payload then
    redis.call('ZADD', KEYS[3], ARGV[2], name)
    local attempts = redis.call('HGET', KEYS[4], name) or '0'
    table.insert(out, {name, payload, attempts})
  else
    redis.call('ZREM', KEYS[5], name)
    redis.call('HDEL', KEYS[4], name)
  end
end
return out
"#,
    )
});

// KEYS: due, inflight. ARGV: now ms. Every in-flight entry becomes due now.
static RECOVER_INFLIGHT: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local names = redis.call('ZRANGE', KEYS[2], 0, -1)
for _, name in ipairs(names) do
  redis.call('ZREM', KEYS[2], name)
  redis.call('ZADD', KEYS[1], ARGV[1], name)
end
return #names
"#,
    )
});

// KEYS: payloads, due, inflight, attempts, enqueued, dead. ARGV: pv name.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local existed = redis.call('HDEL', KEYS[1], ARGV[1])
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('HDEL', KEYS[4], ARGV[1])
redis.call('ZREM', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
return existed
"#,
    )
});

// KEYS: payloads, due, inflight, attempts. ARGV: pv name, due ms, attempts.
// Only for an entry still in flight (not completed, not dead-lettered meanwhile).
static RETRY: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
if redis.call('ZREM', KEYS[3], ARGV[1]) == 0 then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('HSET', KEYS[4], ARGV[1], ARGV[3])
return 1
"#,
    )
});

// KEYS: payloads, due, inflight, enqueued, dead. ARGV: pv name, dead-letter JSON.
static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('ZREM', KEYS[2], ARGV[1])
redis.call('ZREM', KEYS[3], ARGV[1])
redis.call('ZREM', KEYS[4], ARGV[1])
redis.call('HSET', KEYS[5], ARGV[1], ARGV[2])
return 1
"#,
    )
});

// KEYS: payloads, due, attempts, enqueued, dead. ARGV: pv name, now ms.
static REQUEUE_DEAD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
if redis.call('HDEL', KEYS[5], ARGV[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('ZADD', KEYS[4], ARGV[2], ARGV[1])
return 1
"#,
    )
});

// KEYS: due. ARGV: now ms. Entries scheduled later than now become due now.
static PULL_FORWARD: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        r#"
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. ARGV[1], '+inf')
for _, name in ipairs(names) do
  redis.call('ZADD', KEYS[1], ARGV[1], name)
end
return #names
"#,
    )
});

impl PvQueue {
    /// Connect to `redis_url` ([`redis_store::connect`]) and use the keys of
    /// `provisioner_name` (see the module docs for the layout).
    ///
    /// Errors: [`QueueError::Connect`] for a bad URL or Redis unreachable now.
    pub async fn connect(redis_url: &str, provisioner_name: &str) -> Result<Self, QueueError> {
        let conn = redis_store::connect(redis_url)
            .await
            .map_err(|source| QueueError::Connect {
                url: redact(redis_url),
                source,
            })?;
        let mut queue = Self::with_connection(conn, provisioner_name);
        queue.waker = redis::Client::open(redis_url).ok().map(|client| Waker {
            client,
            conn: Default::default(),
        });
        Ok(queue)
    }

    /// A queue over an existing connection (embedding, tests).
    pub fn with_connection(conn: ConnectionManager, provisioner_name: &str) -> Self {
        PvQueue {
            conn,
            keys: Keys::new(provisioner_name),
            waker: None,
        }
    }

    /// Atomically store the payload and the pending marker for
    /// `entry.pv_name()`, due now. Idempotent: while the PV name is in the queue
    /// (pending or dead-lettered) a second enqueue changes nothing.
    ///
    /// Errors: [`QueueError::Command`]; the entry is then not queued.
    pub async fn enqueue(&self, entry: &QueuedPvWrite) -> Result<(), QueueError> {
        self.enqueue_at(entry, now_ms()).await.map(|_| ())
    }

    /// [`enqueue`](Self::enqueue) with an explicit "now" (ms); returns `true`
    /// when the entry was newly queued, `false` when the PV name was already there.
    pub async fn enqueue_at(&self, entry: &QueuedPvWrite, now_ms: u64) -> Result<bool, QueueError> {
        self.enqueue_raw(
            entry.pv_name(),
            &entry.encode(),
            now_ms,
            entry.enqueued_at_ms,
        )
        .await
    }

    /// Store a raw payload under `pv_name` (operators' repair tools and tests of
    /// garbled entries); same atomicity and idempotence as [`enqueue`](Self::enqueue).
    pub async fn enqueue_raw(
        &self,
        pv_name: &str,
        payload: &[u8],
        now_ms: u64,
        enqueued_at_ms: u64,
    ) -> Result<bool, QueueError> {
        let enqueued = if enqueued_at_ms == 0 {
            now_ms
        } else {
            enqueued_at_ms
        };
        let added: i64 = ENQUEUE
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.enqueued)
            .key(&self.keys.wakeup)
            .arg(pv_name)
            .arg(payload)
            .arg(now_ms)
            .arg(enqueued)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("enqueue"))?;
        Ok(added == 1)
    }

    /// Wait until an enqueue signals new work, or `timeout` passes (the caller
    /// then polls anyway, so a lost signal costs at most `timeout`). Blocks on
    /// the wake-up list over a dedicated connection; a queue made with
    /// [`with_connection`](Self::with_connection) just sleeps `timeout`.
    ///
    /// Returns `true` when woken by an enqueue.
    ///
    /// Errors: [`QueueError::Command`] when Redis cannot be reached; the
    /// connection is re-made on the next call.
    pub async fn wait_for_work(&self, timeout: Duration) -> Result<bool, QueueError> {
        let Some(waker) = &self.waker else {
            tokio::time::sleep(timeout).await;
            return Ok(false);
        };
        let mut slot = waker.conn.lock().await;
        if slot.is_none() {
            let config = redis::AsyncConnectionConfig::new()
                .set_connection_timeout(Some(Duration::from_secs(2)))
                .set_response_timeout(Some(timeout + Duration::from_secs(2)));
            let conn = waker
                .client
                .get_multiplexed_async_connection_with_config(&config)
                .await
                .map_err(cmd("wait_for_work"))?;
            *slot = Some(conn);
        }
        let conn = slot.as_mut().expect("connection just made");
        let popped: Result<Option<(String, String)>, _> = conn
            .blpop(&self.keys.wakeup, timeout.as_secs_f64().max(0.01))
            .await;
        match popped {
            Ok(token) => Ok(token.is_some()),
            Err(err) => {
                *slot = None;
                Err(cmd("wait_for_work")(err))
            }
        }
    }

    /// True while `pv_name` is in the queue: pending, in flight or dead-lettered.
    /// provision-svc treats such a PV as existing (seed: "skip if the PV exists").
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn is_pending(&self, pv_name: &str) -> Result<bool, QueueError> {
        self.conn
            .clone()
            .hexists(&self.keys.payloads, pv_name)
            .await
            .map_err(cmd("is_pending"))
    }

    /// Take up to `limit` entries due at `now_ms`, marking them in flight until
    /// `now_ms + visibility`. Entries whose earlier visibility timeout has passed
    /// (a killed writer) are due again first. Oldest due time first.
    ///
    /// Errors: [`QueueError::Command`]; nothing is taken then.
    pub async fn take_due(
        &self,
        now_ms: u64,
        limit: usize,
        visibility: Duration,
    ) -> Result<Vec<TakenEntry>, QueueError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let deadline = now_ms.saturating_add(visibility.as_millis() as u64);
        let raw: Vec<(String, Vec<u8>, String)> = TAKE_DUE
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .arg(now_ms)
            .arg(deadline)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("take_due"))?;
        Ok(raw
            .into_iter()
            .map(|(pv_name, payload, attempts)| TakenEntry {
                attempts: attempts.parse().unwrap_or(0),
                pv_name,
                payload,
            })
            .collect())
    }

    /// Make every in-flight entry due at `now_ms`. The pv-writer leader calls
    /// this when it starts: as the only consumer, anything in flight belongs to
    /// a previous leader that is gone. Returns how many entries were recovered.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn recover_inflight(&self, now_ms: u64) -> Result<u64, QueueError> {
        RECOVER_INFLIGHT
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .arg(now_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("recover_inflight"))
    }

    /// Remove `pv_name` entirely (payload, pending marker, retry and dead-letter
    /// state): the PV exists. Returns `false` when it was not queued.
    ///
    /// Errors: [`QueueError::Command`]; the entry stays queued and is written again
    /// (idempotently) later.
    pub async fn complete(&self, pv_name: &str) -> Result<bool, QueueError> {
        let existed: i64 = COMPLETE
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(pv_name)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("complete"))?;
        Ok(existed == 1)
    }

    /// Put an in-flight entry back, due at `due_ms`, recording `attempts` failed
    /// attempts so far. Returns `false` (and changes nothing) when the entry is no
    /// longer in flight.
    ///
    /// Errors: [`QueueError::Command`]; the visibility timeout then retries it.
    pub async fn schedule_retry(
        &self,
        pv_name: &str,
        due_ms: u64,
        attempts: u32,
    ) -> Result<bool, QueueError> {
        let moved: i64 = RETRY
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .arg(pv_name)
            .arg(due_ms)
            .arg(attempts)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("schedule_retry"))?;
        Ok(moved == 1)
    }

    /// Move `pv_name` to the dead-letter set with `letter`. Its payload stays
    /// stored (and [`is_pending`](Self::is_pending) stays true, so the claim is not
    /// provisioned again) until an operator requeues it. Returns `false` when the
    /// entry is not queued.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn dead_letter(&self, letter: &DeadLetter) -> Result<bool, QueueError> {
        let json = serde_json::to_vec(letter).expect("DeadLetter always serializes");
        let moved: i64 = DEAD_LETTER
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(&letter.pv_name)
            .arg(json)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("dead_letter"))?;
        Ok(moved == 1)
    }

    /// Move a dead letter back to the pending queue, due at `now_ms` with its
    /// attempt count reset. Returns `false` when `pv_name` is not dead-lettered.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn requeue_dead(&self, pv_name: &str, now_ms: u64) -> Result<bool, QueueError> {
        let moved: i64 = REQUEUE_DEAD
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(pv_name)
            .arg(now_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("requeue_dead"))?;
        Ok(moved == 1)
    }

    /// Make every entry waiting for a later retry due at `now_ms` (the API server
    /// is back). Returns how many were pulled forward.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn pull_forward_retries(&self, now_ms: u64) -> Result<u64, QueueError> {
        PULL_FORWARD
            .key(&self.keys.due)
            .arg(now_ms)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("pull_forward_retries"))
    }

    /// Depth, dead-letter count and oldest enqueue time, in one pipeline.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let (due, inflight, dead, oldest): (u64, u64, u64, Vec<(String, f64)>) = redis::pipe()
            .zcard(&self.keys.due)
            .zcard(&self.keys.inflight)
            .hlen(&self.keys.dead)
            .zrange_withscores(&self.keys.enqueued, 0, 0)
            .query_async(&mut self.conn.clone())
            .await
            .map_err(cmd("stats"))?;
        Ok(QueueStats {
            depth: due + inflight,
            dead,
            oldest_enqueued_ms: oldest.first().map(|(_, t)| *t as u64),
        })
    }

    /// Every pending (not dead) entry, sorted by PV name.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn list_pending(&self) -> Result<Vec<PendingEntry>, QueueError> {
        let mut conn = self.conn.clone();
        let (due, inflight, attempts): PendingScan = redis::pipe()
            .zrange_withscores(&self.keys.due, 0, -1)
            .zrange_withscores(&self.keys.inflight, 0, -1)
            .hgetall(&self.keys.attempts)
            .query_async(&mut conn)
            .await
            .map_err(cmd("list_pending"))?;
        let mut states: Vec<(String, PendingState)> = due
            .into_iter()
            .map(|(n, t)| (n, PendingState::Due(t as u64)))
            .chain(
                inflight
                    .into_iter()
                    .map(|(n, t)| (n, PendingState::InFlight(t as u64))),
            )
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        let mut out = Vec::with_capacity(states.len());
        for chunk in states.chunks(500) {
            let names: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
            let payloads: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                .arg(&self.keys.payloads)
                .arg(&names)
                .query_async(&mut conn)
                .await
                .map_err(cmd("list_pending"))?;
            for ((name, state), payload) in chunk.iter().zip(payloads) {
                let entry = match payload {
                    Some(bytes) => QueuedPvWrite::decode(&bytes).map_err(|e| e.to_string()),
                    None => Err("payload missing".to_string()),
                };
                out.push(PendingEntry {
                    pv_name: name.clone(),
                    state: *state,
                    attempts: attempts.get(name).copied().unwrap_or(0),
                    entry,
                });
            }
        }
        Ok(out)
    }

    /// Every dead letter, sorted by PV name.
    ///
    /// Errors: [`QueueError::Command`], [`QueueError::Corrupt`] for an unreadable record.
    pub async fn list_dead(&self) -> Result<Vec<DeadLetter>, QueueError> {
        let raw: Vec<(String, Vec<u8>)> = self
            .conn
            .clone()
            .hgetall(&self.keys.dead)
            .await
            .map_err(cmd("list_dead"))?;
        let mut out = raw
            .into_iter()
            .map(|(pv_name, bytes)| {
                serde_json::from_slice::<DeadLetter>(&bytes).map_err(|e| QueueError::Corrupt {
                    pv_name,
                    detail: e.to_string(),
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        out.sort_by(|a, b| a.pv_name.cmp(&b.pv_name));
        Ok(out)
    }

    /// The stored payload of `pv_name` (pending or dead), if any.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn payload(&self, pv_name: &str) -> Result<Option<Vec<u8>>, QueueError> {
        self.conn
            .clone()
            .hget(&self.keys.payloads, pv_name)
            .await
            .map_err(cmd("payload"))
    }
}

/// `ZRANGE due`, `ZRANGE inflight` (with scores) and `HGETALL attempts`.
type PendingScan = (
    Vec<(String, f64)>,
    Vec<(String, f64)>,
    std::collections::HashMap<String, u32>,
);

fn cmd(operation: &'static str) -> impl Fn(redis::RedisError) -> QueueError {
    move |source| QueueError::Command { operation, source }
}

/// `url` with any password replaced by `***`, for error messages and logs.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            let userinfo = &url[scheme + 3..at];
            match userinfo.find(':') {
                Some(colon) => format!(
                    "{}{}:***{}",
                    &url[..scheme + 3],
                    &userinfo[..colon],
                    &url[at..]
                ),
                None => url.to_string(),
            }
        }
        _ => url.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::queue::SCHEMA_VERSION;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::test_redis::TestRedis as Redis;

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
        }
    }

    const VIS: Duration = Duration::from_secs(60);

    #[tokio::test]
    async fn enqueue_is_atomic_idempotent_and_drains() {
        let redis = Redis::start().await;
        let q = PvQueue::connect(&redis.url(), "example.com/hostpath")
            .await
            .unwrap();
        let other = PvQueue::connect(&redis.url(), "other.io/x").await.unwrap();
        assert!(q.enqueue_at(&entry("pvc-a"), 5_000).await.unwrap());
        assert!(!q.enqueue_at(&entry("pvc-a"), 6_000).await.unwrap());
        q.enqueue(&entry("pvc-b")).await.unwrap();
        assert!(q.is_pending("pvc-a").await.unwrap());
        assert!(!q.is_pending("pvc-c").await.unwrap());
        assert!(
            !other.is_pending("pvc-a").await.unwrap(),
            "keys are per provisioner"
        );
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.depth, stats.dead, stats.oldest_enqueued_ms),
            (2, 0, Some(1_000))
        );
        assert_eq!(stats.oldest_age_seconds(3_500), 2.5);

        // pvc-a is due at 5000, pvc-b now (> 5000): a take at 5000 sees only pvc-a.
        let taken = q.take_due(5_000, 10, VIS).await.unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].pv_name, "pvc-a");
        assert_eq!(taken[0].attempts, 0);
        assert_eq!(
            QueuedPvWrite::decode(&taken[0].payload).unwrap(),
            entry("pvc-a")
        );
        assert!(
            q.take_due(5_000, 10, VIS).await.unwrap().is_empty(),
            "in flight is invisible"
        );
        assert!(
            q.is_pending("pvc-a").await.unwrap(),
            "in flight is still pending"
        );
        assert!(q.complete("pvc-a").await.unwrap());
        assert!(!q.complete("pvc-a").await.unwrap());
        assert!(!q.is_pending("pvc-a").await.unwrap());
        let names: Vec<_> = q
            .take_due(now_ms(), 10, VIS)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.pv_name)
            .collect();
        assert_eq!(names, ["pvc-b"]);
        q.complete("pvc-b").await.unwrap();
        assert_eq!(q.stats().await.unwrap(), QueueStats::default());
        // Once completed, the same PV name may be queued again.
        assert!(q.enqueue_at(&entry("pvc-a"), 7_000).await.unwrap());
    }

    #[tokio::test]
    async fn an_enqueue_wakes_a_waiting_writer_at_once() {
        let redis = Redis::start().await;
        let q = PvQueue::connect(&redis.url(), "example.com/hostpath")
            .await
            .unwrap();
        // Idle: the wait runs to its timeout and reports no signal.
        let started = std::time::Instant::now();
        assert!(!q.wait_for_work(Duration::from_millis(200)).await.unwrap());
        assert!(started.elapsed() >= Duration::from_millis(190));

        let waiter = {
            let q = q.clone();
            tokio::spawn(async move {
                let started = std::time::Instant::now();
                let woken = q.wait_for_work(Duration::from_secs(5)).await.unwrap();
                (woken, started.elapsed())
            })
        };
        tokio::time::sleep(Duration::from_millis(100)).await;
        q.enqueue(&entry("pvc-w")).await.unwrap();
        let (woken, waited) = waiter.await.unwrap();
        assert!(woken);
        assert!(waited < Duration::from_secs(1), "woken late: {waited:?}");

        // Several enqueues leave a single token; a re-enqueue of a queued PV none.
        q.enqueue(&entry("pvc-x")).await.unwrap();
        q.enqueue(&entry("pvc-y")).await.unwrap();
        assert!(q.wait_for_work(Duration::from_millis(100)).await.unwrap());
        q.enqueue(&entry("pvc-x")).await.unwrap();
        assert!(!q.wait_for_work(Duration::from_millis(100)).await.unwrap());
    }

    #[tokio::test]
    async fn retries_visibility_timeout_and_recovery() {
        let redis = Redis::start().await;
        let q = PvQueue::connect(&redis.url(), "p").await.unwrap();
        q.enqueue_at(&entry("pvc-a"), 1_000).await.unwrap();
        q.enqueue_at(&entry("pvc-b"), 1_000).await.unwrap();
        assert_eq!(q.take_due(1_000, 1, VIS).await.unwrap()[0].pv_name, "pvc-a");
        // Retry pvc-a at 9000 with 3 attempts; pulled forward it is due at 2000.
        assert!(q.schedule_retry("pvc-a", 9_000, 3).await.unwrap());
        assert!(
            !q.schedule_retry("pvc-a", 9_000, 4).await.unwrap(),
            "not in flight any more"
        );
        let pending = q.list_pending().await.unwrap();
        assert_eq!(pending.len(), 2);
        assert_eq!(
            (
                pending[0].pv_name.as_str(),
                pending[0].state,
                pending[0].attempts
            ),
            ("pvc-a", PendingState::Due(9_000), 3)
        );
        assert_eq!(pending[1].state, PendingState::Due(1_000));
        assert_eq!(pending[0].entry.as_ref().unwrap(), &entry("pvc-a"));
        assert_eq!(q.pull_forward_retries(2_000).await.unwrap(), 1);
        let taken = q
            .take_due(2_000, 10, Duration::from_millis(500))
            .await
            .unwrap();
        let got: Vec<_> = taken
            .iter()
            .map(|t| (t.pv_name.as_str(), t.attempts))
            .collect();
        assert_eq!(got, [("pvc-b", 0), ("pvc-a", 3)]);
        // A killed writer: after the visibility timeout (2500) both are taken again.
        assert!(q.take_due(2_499, 10, VIS).await.unwrap().is_empty());
        assert_eq!(q.take_due(2_500, 10, VIS).await.unwrap().len(), 2);
        // A new leader recovers in-flight entries at once.
        assert_eq!(q.recover_inflight(3_000).await.unwrap(), 2);
        assert_eq!(q.take_due(3_000, 10, VIS).await.unwrap().len(), 2);
    }

    #[tokio::test]
    async fn dead_letters_keep_the_payload_and_can_be_requeued() {
        let redis = Redis::start().await;
        let q = PvQueue::connect(&redis.url(), "p").await.unwrap();
        q.enqueue_raw("pvc-x", b"{garbled", 1_000, 0).await.unwrap();
        let taken = q.take_due(1_000, 10, VIS).await.unwrap();
        assert_eq!(taken[0].payload, b"{garbled");
        let letter = DeadLetter {
            pv_name: "pvc-x".into(),
            reason: "unreadable".into(),
            dead_at_ms: 1_500,
            attempts: 0,
            claim: None,
        };
        assert!(q.dead_letter(&letter).await.unwrap());
        assert!(
            q.is_pending("pvc-x").await.unwrap(),
            "a dead letter blocks re-provisioning"
        );
        assert_eq!(q.list_dead().await.unwrap(), vec![letter.clone()]);
        assert!(q.list_pending().await.unwrap().is_empty());
        assert_eq!(
            q.stats().await.unwrap(),
            QueueStats {
                depth: 0,
                dead: 1,
                oldest_enqueued_ms: None
            }
        );
        assert!(q.take_due(u64::MAX / 2, 10, VIS).await.unwrap().is_empty());
        assert!(q.recover_inflight(2_000).await.unwrap() == 0);
        assert_eq!(q.payload("pvc-x").await.unwrap().unwrap(), b"{garbled");

        assert!(!q.requeue_dead("pvc-nope", 3_000).await.unwrap());
        assert!(q.requeue_dead("pvc-x", 3_000).await.unwrap());
        assert!(!q.requeue_dead("pvc-x", 3_000).await.unwrap());
        assert!(q.list_dead().await.unwrap().is_empty());
        let pending = q.list_pending().await.unwrap();
        assert_eq!(pending[0].state, PendingState::Due(3_000));
        assert!(pending[0].entry.as_ref().unwrap_err().contains("garbled"));
        assert_eq!(q.stats().await.unwrap().oldest_enqueued_ms, Some(3_000));
    }

    #[tokio::test]
    async fn a_due_name_without_payload_is_dropped_from_every_index() {
        let redis = Redis::start().await;
        let q = PvQueue::connect(&redis.url(), "p").await.unwrap();
        q.enqueue_raw("pvc-lost", b"{}", 1_000, 500).await.unwrap();
        q.enqueue_at(&entry("pvc-kept"), 2_000).await.unwrap();
        // A failed attempt leaves a count in `attempts`; then the payload is
        // removed behind the queue's back.
        assert_eq!(q.take_due(1_000, 1, VIS).await.unwrap().len(), 1);
        assert!(q.schedule_retry("pvc-lost", 1_500, 3).await.unwrap());
        let mut conn = q.conn.clone();
        let removed: i64 = conn.hdel(&q.keys.payloads, "pvc-lost").await.unwrap();
        assert_eq!(removed, 1);

        let taken: Vec<_> = q
            .take_due(3_000, 10, VIS)
            .await
            .unwrap()
            .into_iter()
            .map(|t| t.pv_name)
            .collect();
        assert_eq!(taken, ["pvc-kept"]);
        let enqueued: Vec<String> = conn.zrange(&q.keys.enqueued, 0, -1).await.unwrap();
        assert_eq!(enqueued, ["pvc-kept"]);
        let attempts: Option<String> = conn.hget(&q.keys.attempts, "pvc-lost").await.unwrap();
        assert_eq!(attempts, None);
        assert_eq!(
            q.stats().await.unwrap(),
            QueueStats {
                depth: 1,
                dead: 0,
                oldest_enqueued_ms: Some(1_000)
            },
            "pvc-lost (enqueued at 500) no longer counts as the oldest pending entry"
        );
    }

    #[tokio::test]
    async fn unreachable_redis_is_a_clear_error() {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = PvQueue::connect(&format!("redis://u:secret@127.0.0.1:{port}/0"), "p")
            .await
            .err()
            .expect("nothing listens");
        let text = err.to_string();
        assert!(
            text.contains("cannot connect to Redis at redis://u:***@127.0.0.1"),
            "{text}"
        );
        assert!(!text.contains("secret"));
    }
}
