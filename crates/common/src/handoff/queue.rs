//! The durable PV-write queue in Redis: provision-svc enqueues the PVs it
//! provisioned, pv-writer drains them into the API server.
//!
//! The seed keeps a PV the API server refused in memory only, so a restart loses
//! it and the storage asset leaks. Here the PV is stored in Redis (AOF on) before
//! provision-svc forgets it and is removed only once the PV object exists.
//!
//! # Redis layout
//!
//! Every key lives under [`key_prefix`](crate::handoff::redis_store::key_prefix)`(provisioner name)`,
//! i.e. `provisioner:{<name>}:` (a Redis Cluster hash tag, so every multi-key
//! script below stays on one shard). With `P` that prefix:
//!
//! | key | type | holds |
//! | --- | --- | --- |
//! | `P pv-queue:payloads` | hash | PV name → the stored [`QueuedPvWrite`] JSON (HMAC-signed, [`crate::handoff::queue_auth`]), exactly as enqueued. A field here **is** the "pending" marker ([`PvQueue::is_pending`]); it is removed only when the PV exists. |
//! | `P pv-queue:incoming` | list | PV names just enqueued, not yet due: provision-svc's only way to make an entry due. The next take moves each name that has a payload and is in no other state (not due, in flight or dead) to `due`, at its enqueue time but never later than Redis' now; any other name is dropped. |
//! | `P pv-queue:due` | sorted set | PV name, score = time it may be taken next (ms since the Unix epoch, Redis' clock). Entries waiting for a worker or for a retry. Written by pv-writer's scripts only. |
//! | `P pv-queue:inflight` | sorted set | PV name, score = end of the visibility timeout (ms, Redis' clock). Entries a worker has taken; an entry still here after its timeout (worker killed or stalled) goes back to `due`. |
//! | `P pv-queue:owners` | hash | PV name → epoch of the pv-writer term that took it; set exactly while the entry is in `inflight`. |
//! | `P pv-queue:epoch` | string | The current pv-writer term, an integer `INCR`ed by each new leader ([`PvQueue::begin_term`]). |
//! | `P pv-queue:fenced` | string | Count of takes and settlements refused because their term was stale ([`PvQueue::fenced_operations`]). |
//! | `P pv-queue:attempts` | hash | PV name → failed write attempts so far (drives the backoff). |
//! | `P pv-queue:enqueued` | sorted set | PV name, score = enqueue (or requeue) time (ms, Redis' clock); its minimum is the oldest pending age. |
//! | `P pv-queue:dead` | hash | PV name → [`DeadLetter`] JSON (reason, time, attempts). The payload stays in `payloads`, so a dead letter is never lost and can be requeued. |
//! | `P pv-queue:wakeup` | list | At most one token, pushed by an enqueue; the writer blocks on it ([`PvQueue::wait_for_work`]) instead of polling, so a new entry is taken within a round trip. Losing it only costs one poll interval. |
//!
//! The enqueue script also removes the PV's fields from the provisioning-intent
//! hashes `P provision-intents` and `P provision-intent-claims`
//! ([`crate::handoff::intents`]) in the same atomic step.
//!
//! Every entry is in exactly one of `incoming`, `due`, `inflight` or `dead`,
//! and in `payloads` for as long as it is in any of them. Every change touching more
//! than one key is one Lua script (atomic in Redis), keyed by PV name, so a crash
//! of either side between two commands cannot leave a half-made entry. Every
//! time inside a script (due times, visibility deadlines, enqueue times) is
//! Redis' own `TIME`, never the pod's clock.
//!
//! # Delivery
//!
//! At least once: an entry leaves the queue only through [`PvQueue::complete`],
//! which the writer calls after the PV exists. A writer killed between the
//! create and the completion leaves the entry in `inflight`; the next leader
//! takes it again ([`PvQueue::recover_inflight`] on start, or the visibility
//! timeout), and the repeated create answers `AlreadyExists` for the same claim
//! uid, which the writer treats as success — so no PV is ever written twice.
//! A take whose reply is lost (Redis shut down after running the script) leaves
//! entries in flight under the live term with no worker on them; the writer
//! hands them back with [`PvQueue::requeue_unheld`] once its connection to
//! Redis has failed, and every 30 s, instead of waiting out the visibility timeout.
//!
//! # Fencing
//!
//! Each pv-writer leader term starts with [`PvQueue::begin_term`] (`INCR` of
//! `epoch`); the returned epoch is the term's token. A take records the token as
//! the entry's owner; [`complete`](PvQueue::complete),
//! [`schedule_retry`](PvQueue::schedule_retry) and
//! [`dead_letter`](PvQueue::dead_letter) are refused ([`Settled::Fenced`],
//! counted in `fenced`) when the caller's token is not the current epoch, and do
//! nothing ([`Settled::NotInFlight`]) when the entry is not in flight under that
//! token. A leader paused past its Lease (SIGSTOP, a long GC-like stall) that
//! wakes up therefore cannot move any entry; [`recover_inflight`](PvQueue::recover_inflight)
//! reclaims only entries owned by earlier terms.
//!
//! # Durability
//!
//! The deploy runs Redis with AOF and `appendfsync everysec`: a Redis crash can
//! lose up to ~1 s of acknowledged writes. Where the server has `WAITAOF`
//! (Redis ≥ 7.2) an enqueue waits until the local AOF is fsynced
//! ([`EnqueueOutcome::fsynced`]). On older servers (Debian 12 ships 7.0) this is
//! detected at the first enqueue and logged once; a lost enqueue is then repaired
//! by provision-svc: the intent it atomically cleared is lost with it (or was
//! never written), the claim stays unbound with no PV and nothing queued, and the
//! next sync or resync of the claim provisions it again — the backend is
//! idempotent per PV name, so the claim still gets exactly one volume.
//!
//! # Upgrading from the unfenced layout
//!
//! Entries of the previous layout have no owner and are recovered as "earlier
//! term" by the first leader. Their payloads carry no HMAC and are refused
//! (dead-lettered as `unsigned`) by a pv-writer with a key: drain the queue
//! (`pv-writer queue list` empty) before upgrading.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::LazyLock;
use std::time::Duration;

use api_types::queue::{ClaimKey, QueuedPvWrite};
use redis::aio::ConnectionManager;
use redis::{AsyncCommands, Script};
use serde::{Deserialize, Serialize};

use crate::handoff::redis_store::{self, RedisConfig};

/// Failure of a queue operation. Every variant is transient from the caller's
/// point of view: retry later (and report not-ready while it lasts).
#[derive(Debug, thiserror::Error)]
pub enum QueueError {
    /// No connection: bad configuration, refused credentials, failed TLS, or
    /// Redis unreachable at the first connection ([`redis_store::ConnectError`]
    /// names which).
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

/// Re-exported for callers that already import it from here; the one
/// definition is [`crate::kube::time::now_ms`].
pub use crate::kube::time::now_ms;

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
    /// Enqueue time of the oldest pending entry (ms, Redis' clock), if any.
    pub oldest_enqueued_ms: Option<u64>,
    /// Redis' clock when the counts were read (ms since the Unix epoch); age
    /// the oldest entry against this, not the pod's clock.
    pub redis_now_ms: u64,
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
    /// Whether the server answers `WAITAOF` (0 unknown, 1 yes, 2 no).
    waitaof: std::sync::Arc<AtomicU8>,
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

impl Settled {
    fn from_code(code: i64) -> Self {
        match code {
            1 => Settled::Done,
            -1 => Settled::Fenced,
            _ => Settled::NotInFlight,
        }
    }
}

#[derive(Clone)]
struct Waker {
    client: redis::Client,
    conn: std::sync::Arc<tokio::sync::Mutex<Option<redis::aio::MultiplexedConnection>>>,
}

#[derive(Clone)]
struct Keys {
    payloads: String,
    incoming: String,
    due: String,
    inflight: String,
    attempts: String,
    enqueued: String,
    dead: String,
    wakeup: String,
    epoch: String,
    owners: String,
    fenced: String,
    intents: String,
    intent_claims: String,
}

impl Keys {
    fn new(provisioner_name: &str) -> Self {
        let p = redis_store::key_prefix(provisioner_name);
        Keys {
            payloads: format!("{p}pv-queue:payloads"),
            incoming: format!("{p}pv-queue:incoming"),
            due: format!("{p}pv-queue:due"),
            inflight: format!("{p}pv-queue:inflight"),
            attempts: format!("{p}pv-queue:attempts"),
            enqueued: format!("{p}pv-queue:enqueued"),
            dead: format!("{p}pv-queue:dead"),
            wakeup: format!("{p}pv-queue:wakeup"),
            epoch: format!("{p}pv-queue:epoch"),
            owners: format!("{p}pv-queue:owners"),
            fenced: format!("{p}pv-queue:fenced"),
            intents: crate::handoff::intents::intents_key(provisioner_name),
            intent_claims: crate::handoff::intents::intent_claims_key(provisioner_name),
        }
    }
}

/// Lua prelude of every script that needs "now": Redis' own clock (`TIME`), in
/// ms since the Unix epoch, so a pod whose clock is off cannot shorten a
/// visibility timeout or misplace a due time. (Scripts calling `TIME` are
/// replicated by effects, the only mode since Redis 7.0 and the default since 5.)
const NOW_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#;

/// Lua prelude of every writer-side script: `term_ok(epoch_key, fenced_key, epoch)`
/// is false (and counts a fenced operation) when `epoch` is not the current term.
const TERM_LUA: &str = r#"
local function term_ok(epoch_key, fenced_key, epoch)
  local current = tonumber(redis.call('GET', epoch_key) or '0')
  if current ~= tonumber(epoch) then
    redis.call('INCR', fenced_key)
    return false
  end
  return true
end
"#;

fn script(preludes: &[&str], body: &str) -> Script {
    let mut code = preludes.concat();
    code.push_str(body);
    Script::new(&code)
}

// KEYS: payloads, incoming, enqueued, wakeup, intents, intent claims. ARGV: pv name, payload.
// Returns {added, intent cleared}: added = 1 when newly queued, 0 when the PV name
// was already in the queue. The provisioning intent of the PV is removed in the
// same script either way: the PV is durably queued, so the intent has done its job.
// A new entry goes to `incoming`, never to `due`: the next take makes it due.
static ENQUEUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA],
        r#"
local added = 0
if redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2]) == 1 then
  redis.call('RPUSH', KEYS[2], ARGV[1])
  redis.call('ZADD', KEYS[3], now, ARGV[1])
  if redis.call('LLEN', KEYS[4]) == 0 then
    redis.call('RPUSH', KEYS[4], '1')
  end
  added = 1
end
local cleared = redis.call('HDEL', KEYS[5], ARGV[1])
redis.call('HDEL', KEYS[6], ARGV[1])
return {added, cleared}
"#,
    )
});

// KEYS: epoch. Starts a new term: returns the new epoch.
static BEGIN_TERM: LazyLock<Script> =
    LazyLock::new(|| script(&[], "return redis.call('INCR', KEYS[1])"));

// KEYS: payloads, due, inflight, attempts, enqueued, epoch, owners, fenced,
// incoming, dead. ARGV: epoch, visibility ms, limit.
// Returns {1, triples} or {0, {}} when `epoch` is stale (a newer term exists).
// Makes up to 1000 incoming names due (at their enqueue time, never later than
// now), each only when it has a payload and is in no other state (so a pushed
// name re-arms nothing and delays nothing);
// moves expired in-flight entries back to due, then moves up to `limit` due
// entries to in-flight (owned by `epoch`) and returns {name, payload, attempts}
// triples. A due name without a payload (the payload hash was edited by hand)
// is dropped from every index, so it cannot pin the oldest-pending age.
static TAKE_DUE: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA, TERM_LUA],
        r#"
if not term_ok(KEYS[6], KEYS[8], ARGV[1]) then return {0, {}} end
local incoming = redis.call('LPOP', KEYS[9], 1000)
if incoming then
  for _, name in ipairs(incoming) do
    if redis.call('HEXISTS', KEYS[1], name) == 1
      and not redis.call('ZSCORE', KEYS[2], name)
      and not redis.call('ZSCORE', KEYS[3], name)
      and redis.call('HEXISTS', KEYS[10], name) == 0 then
      local at = tonumber(redis.call('ZSCORE', KEYS[5], name) or now)
      if at > now then at = now end
      redis.call('ZADD', KEYS[2], at, name)
    end
  end
end
local expired = redis.call('ZRANGEBYSCORE', KEYS[3], '-inf', now)
for _, name in ipairs(expired) do
  redis.call('ZREM', KEYS[3], name)
  redis.call('HDEL', KEYS[7], name)
  redis.call('ZADD', KEYS[2], now, name)
end
local names = redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now, 'LIMIT', 0, tonumber(ARGV[3]))
local out = {}
for _, name in ipairs(names) do
  redis.call('ZREM', KEYS[2], name)
  local payload = redis.call('HGET', KEYS[1], name)
  if payload then
    redis.call('ZADD', KEYS[3], now + tonumber(ARGV[2]), name)
    redis.call('HSET', KEYS[7], name, ARGV[1])
    local attempts = redis.call('HGET', KEYS[4], name) or '0'
    table.insert(out, {name, payload, attempts})
  else
    redis.call('ZREM', KEYS[5], name)
    redis.call('HDEL', KEYS[4], name)
  end
end
return {1, out}
"#,
    )
});

// KEYS: due, inflight, owners. ARGV: epoch. In-flight entries owned by an
// earlier term (or by none: the previous layout) become due now; entries of
// this term or a later one are left alone. Returns how many were recovered.
static RECOVER_INFLIGHT: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA],
        r#"
local names = redis.call('ZRANGE', KEYS[2], 0, -1)
local n = 0
for _, name in ipairs(names) do
  local owner = tonumber(redis.call('HGET', KEYS[3], name) or '0')
  if owner < tonumber(ARGV[1]) then
    redis.call('ZREM', KEYS[2], name)
    redis.call('HDEL', KEYS[3], name)
    redis.call('ZADD', KEYS[1], now, name)
    n = n + 1
  end
end
return n
"#,
    )
});

// KEYS: epoch, fenced, due, inflight, owners. ARGV: epoch, then the PV names
// this term's workers hold. Returns -1 when `epoch` is stale, else how many
// entries in flight under `epoch` but not held were made due now.
static REQUEUE_UNHELD: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA, TERM_LUA],
        r#"
if not term_ok(KEYS[1], KEYS[2], ARGV[1]) then return -1 end
local held = {}
for i = 2, #ARGV do held[ARGV[i]] = true end
local n = 0
for _, name in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if not held[name] and redis.call('HGET', KEYS[5], name) == ARGV[1] then
    redis.call('ZREM', KEYS[4], name)
    redis.call('HDEL', KEYS[5], name)
    redis.call('ZADD', KEYS[3], now, name)
    n = n + 1
  end
end
return n
"#,
    )
});

/// Lua check shared by the settle scripts: -1 for a stale term, 0 when `name`
/// is not in flight under `epoch`. KEYS[1..3] of the settle scripts are always
/// epoch, fenced, owners, and ARGV[1..2] epoch, name.
const SETTLE_CHECK_LUA: &str = r#"
if not term_ok(KEYS[1], KEYS[2], ARGV[1]) then return -1 end
if redis.call('HGET', KEYS[3], ARGV[2]) ~= ARGV[1] then return 0 end
"#;

// KEYS: epoch, fenced, owners. ARGV: epoch, pv name. Changes nothing but the
// fenced counter: 1 while the entry is in flight under the current term `epoch`.
static HOLDS: LazyLock<Script> =
    LazyLock::new(|| script(&[TERM_LUA, SETTLE_CHECK_LUA], "return 1"));

// KEYS: epoch, fenced, owners, payloads, due, inflight, attempts, enqueued, dead.
// ARGV: epoch, pv name. Removes the entry everywhere.
static COMPLETE: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[TERM_LUA, SETTLE_CHECK_LUA],
        r#"
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('HDEL', KEYS[4], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[2])
redis.call('HDEL', KEYS[7], ARGV[2])
redis.call('ZREM', KEYS[8], ARGV[2])
redis.call('HDEL', KEYS[9], ARGV[2])
return 1
"#,
    )
});

// KEYS: epoch, fenced, owners, payloads, due, inflight, attempts.
// ARGV: epoch, pv name, delay ms, attempts. Due at Redis' now + delay.
static RETRY: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA, TERM_LUA, SETTLE_CHECK_LUA],
        r#"
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 0 then return 0 end
if redis.call('ZREM', KEYS[6], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[3]), ARGV[2])
redis.call('HSET', KEYS[7], ARGV[2], ARGV[4])
return 1
"#,
    )
});

// KEYS: epoch, fenced, owners, payloads, due, inflight, enqueued, dead.
// ARGV: epoch, pv name, dead-letter JSON.
static DEAD_LETTER: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[TERM_LUA, SETTLE_CHECK_LUA],
        r#"
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('ZREM', KEYS[5], ARGV[2])
redis.call('ZREM', KEYS[6], ARGV[2])
redis.call('ZREM', KEYS[7], ARGV[2])
redis.call('HSET', KEYS[8], ARGV[2], ARGV[3])
return 1
"#,
    )
});

// KEYS: payloads, due, attempts, enqueued, dead. ARGV: pv name.
static REQUEUE_DEAD: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA],
        r#"
if redis.call('HDEL', KEYS[5], ARGV[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
return 1
"#,
    )
});

// KEYS: due. Entries scheduled later than Redis' now become due now.
static PULL_FORWARD: LazyLock<Script> = LazyLock::new(|| {
    script(
        &[NOW_LUA],
        r#"
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, name in ipairs(names) do
  redis.call('ZADD', KEYS[1], now, name)
end
return #names
"#,
    )
});

impl PvQueue {
    /// Connect as `redis` describes (a URL, or [`RedisConfig`] with
    /// credentials and TLS; [`redis_store::connect`]) and use the keys of
    /// `provisioner_name` (see the module docs for the layout). The wake-up
    /// connection of [`wait_for_work`](Self::wait_for_work) uses the same
    /// credentials and TLS.
    ///
    /// Errors: [`QueueError::Connect`] naming the cause (configuration,
    /// credentials, TLS, unreachable).
    pub async fn connect(
        redis: impl Into<RedisConfig>,
        provisioner_name: &str,
    ) -> Result<Self, QueueError> {
        let redis = redis.into();
        let conn = redis_store::connect(&redis).await?;
        let mut queue = Self::with_connection(conn, provisioner_name);
        queue.waker = Some(Waker {
            client: redis.client()?,
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
            waitaof: Default::default(),
        }
    }

    /// Atomically store the payload and the pending marker for
    /// `entry.pv_name()`, in `incoming` (made due, at Redis' now, by the next
    /// [`take_due`](Self::take_due)), and remove the PV's
    /// provisioning intent ([`crate::handoff::intents`]) in the same script. Idempotent:
    /// while the PV name is in the queue (pending or dead-lettered) a second
    /// enqueue changes nothing but the intent. Then waits for the local AOF
    /// fsync where the server has `WAITAOF` (see [`EnqueueOutcome::fsynced`]).
    ///
    /// Errors: [`QueueError::Command`]; the entry is then not queued and the
    /// intent stays.
    pub async fn enqueue(&self, entry: &QueuedPvWrite) -> Result<EnqueueOutcome, QueueError> {
        self.enqueue_raw(entry.pv_name(), &entry.encode()).await
    }

    /// Store a raw payload under `pv_name` (operators' repair tools and tests of
    /// garbled entries); same atomicity, idempotence and fsync wait as
    /// [`enqueue`](Self::enqueue).
    pub async fn enqueue_raw(
        &self,
        pv_name: &str,
        payload: &[u8],
    ) -> Result<EnqueueOutcome, QueueError> {
        let (added, cleared): (i64, i64) = ENQUEUE
            .key(&self.keys.payloads)
            .key(&self.keys.incoming)
            .key(&self.keys.enqueued)
            .key(&self.keys.wakeup)
            .key(&self.keys.intents)
            .key(&self.keys.intent_claims)
            .arg(pv_name)
            .arg(payload)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("enqueue"))?;
        let fsynced = self.wait_aof().await;
        Ok(EnqueueOutcome {
            added: added == 1,
            intent_cleared: cleared == 1,
            fsynced,
        })
    }

    /// `WAITAOF 1 0 1000` when the server supports it (Redis ≥ 7.2): true once the
    /// local AOF holds every write so far. An older server (unknown command) or
    /// one without AOF is remembered and logged once; the enqueue is then only as
    /// durable as `appendfsync` makes it (`everysec`: up to ~1 s of acknowledged
    /// writes lost on a Redis crash, which the intents and the resync repair).
    async fn wait_aof(&self) -> bool {
        const UNKNOWN: u8 = 0;
        const SUPPORTED: u8 = 1;
        const UNSUPPORTED: u8 = 2;
        if self.waitaof.load(Ordering::Relaxed) == UNSUPPORTED {
            return false;
        }
        let answer: Result<(i64, i64), _> = redis::cmd("WAITAOF")
            .arg(1)
            .arg(0)
            .arg(1000)
            .query_async(&mut self.conn.clone())
            .await;
        match answer {
            Ok((local, _)) => {
                self.waitaof.store(SUPPORTED, Ordering::Relaxed);
                if local < 1 {
                    tracing::warn!("Redis did not fsync its AOF within 1 s of an enqueue");
                }
                local >= 1
            }
            Err(err) => {
                let text = err.to_string().to_ascii_lowercase();
                if text.contains("unknown command") || text.contains("appendonly") {
                    if self.waitaof.swap(UNSUPPORTED, Ordering::Relaxed) == UNKNOWN {
                        tracing::warn!(error = %err, "Redis cannot confirm AOF fsyncs (WAITAOF needs Redis >= 7.2 with appendonly yes): an acknowledged enqueue can be lost in a Redis crash within the appendfsync window (everysec: ~1 s); the provisioning intent and the claim resync provision such a claim again");
                    }
                } else {
                    tracing::warn!(error = %err, "WAITAOF failed; the enqueue is stored but its fsync is unconfirmed");
                }
                false
            }
        }
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

    /// Start a new pv-writer term: `INCR` the epoch and return it. The leader
    /// calls this once when it takes the Lease; from then on every take and
    /// settlement of an older term is refused ([`Settled::Fenced`]), so a
    /// paused ex-leader that wakes up cannot move an entry.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn begin_term(&self) -> Result<u64, QueueError> {
        BEGIN_TERM
            .key(&self.keys.epoch)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("begin_term"))
    }

    /// The current term (0 before the first [`begin_term`](Self::begin_term)).
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn current_term(&self) -> Result<u64, QueueError> {
        let epoch: Option<u64> = self
            .conn
            .clone()
            .get(&self.keys.epoch)
            .await
            .map_err(cmd("current_term"))?;
        Ok(epoch.unwrap_or(0))
    }

    /// How many takes and settlements were refused because their term was stale
    /// (a counter kept in Redis, for tests and operators).
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn fenced_operations(&self) -> Result<u64, QueueError> {
        let n: Option<u64> = self
            .conn
            .clone()
            .get(&self.keys.fenced)
            .await
            .map_err(cmd("fenced_operations"))?;
        Ok(n.unwrap_or(0))
    }

    /// Take up to `limit` due entries for term `epoch`, marking them in flight
    /// (owned by `epoch`) until Redis' now + `visibility`. Entries whose earlier
    /// visibility timeout has passed (a killed or stalled writer) are due again
    /// first. Oldest due time first. All times come from Redis (`TIME`).
    ///
    /// Returns `None` when `epoch` is not the current term (this writer was
    /// superseded and must stop taking).
    ///
    /// Errors: [`QueueError::Command`]; nothing is taken then.
    pub async fn take_due(
        &self,
        epoch: u64,
        limit: usize,
        visibility: Duration,
    ) -> Result<Option<Vec<TakenEntry>>, QueueError> {
        if limit == 0 {
            return Ok(Some(Vec::new()));
        }
        let (current, raw): (i64, Vec<(String, Vec<u8>, String)>) = TAKE_DUE
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .key(&self.keys.epoch)
            .key(&self.keys.owners)
            .key(&self.keys.fenced)
            .key(&self.keys.incoming)
            .key(&self.keys.dead)
            .arg(epoch)
            .arg(visibility.as_millis() as u64)
            .arg(limit)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("take_due"))?;
        if current != 1 {
            return Ok(None);
        }
        Ok(Some(
            raw.into_iter()
                .map(|(pv_name, payload, attempts)| TakenEntry {
                    attempts: attempts.parse().unwrap_or(0),
                    pv_name,
                    payload,
                })
                .collect(),
        ))
    }

    /// Make every in-flight entry owned by a term before `epoch` (or by none:
    /// entries of the previous queue layout) due now. The pv-writer leader calls
    /// this right after [`begin_term`](Self::begin_term): such entries belong
    /// to a previous leader that is gone or fenced. Entries of `epoch` itself
    /// are never taken back. Returns how many entries were recovered.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn recover_inflight(&self, epoch: u64) -> Result<u64, QueueError> {
        RECOVER_INFLIGHT
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.owners)
            .arg(epoch)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("recover_inflight"))
    }

    /// Make every entry in flight under the current term `epoch` that none of
    /// this term's workers holds (`held`: the PV names they are working on) due
    /// now. Such an entry was taken by a [`take_due`](Self::take_due) whose
    /// reply never arrived: Redis ran the script, then the connection broke
    /// (Redis shutting down answers nothing more). Without this it would wait
    /// out its whole visibility timeout. The writer calls it from its
    /// dispatcher, never while a take is outstanding.
    ///
    /// Returns `None` when `epoch` is stale (counted as fenced), else how many
    /// entries were made due.
    ///
    /// Errors: [`QueueError::Command`]; nothing changed then.
    pub async fn requeue_unheld(
        &self,
        epoch: u64,
        held: &[String],
    ) -> Result<Option<u64>, QueueError> {
        let n: i64 = REQUEUE_UNHELD
            .key(&self.keys.epoch)
            .key(&self.keys.fenced)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.owners)
            .arg(epoch)
            .arg(held)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("requeue_unheld"))?;
        Ok(u64::try_from(n).ok())
    }

    /// Whether `pv_name` is still in flight under the current term `epoch`
    /// ([`Settled::Done`]); [`Settled::Fenced`] (counted) when `epoch` is stale.
    /// Changes no entry. The writer asks this before it announces a written PV,
    /// so a superseded writer announces nothing.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn holds(&self, epoch: u64, pv_name: &str) -> Result<Settled, QueueError> {
        let code: i64 = HOLDS
            .key(&self.keys.epoch)
            .key(&self.keys.fenced)
            .key(&self.keys.owners)
            .arg(epoch)
            .arg(pv_name)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("holds"))?;
        Ok(Settled::from_code(code))
    }

    /// Remove `pv_name` entirely (payload, pending marker, retry and dead-letter
    /// state): the PV exists. Only for an entry in flight under `epoch`.
    ///
    /// Errors: [`QueueError::Command`]; the entry stays queued and is written again
    /// (idempotently) later.
    pub async fn complete(&self, epoch: u64, pv_name: &str) -> Result<Settled, QueueError> {
        let code: i64 = COMPLETE
            .key(&self.keys.epoch)
            .key(&self.keys.fenced)
            .key(&self.keys.owners)
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(epoch)
            .arg(pv_name)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("complete"))?;
        Ok(Settled::from_code(code))
    }

    /// Put an entry in flight under `epoch` back, due `delay` after Redis' now,
    /// recording `attempts` failed attempts so far.
    ///
    /// Errors: [`QueueError::Command`]; the visibility timeout then retries it.
    pub async fn schedule_retry(
        &self,
        epoch: u64,
        pv_name: &str,
        delay: Duration,
        attempts: u32,
    ) -> Result<Settled, QueueError> {
        let code: i64 = RETRY
            .key(&self.keys.epoch)
            .key(&self.keys.fenced)
            .key(&self.keys.owners)
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.attempts)
            .arg(epoch)
            .arg(pv_name)
            .arg(delay.as_millis() as u64)
            .arg(attempts)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("schedule_retry"))?;
        Ok(Settled::from_code(code))
    }

    /// Move an entry in flight under `epoch` to the dead-letter set with
    /// `letter`. Its payload stays stored (and [`is_pending`](Self::is_pending)
    /// stays true, so the claim is not provisioned again) until an operator
    /// requeues it.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn dead_letter(
        &self,
        epoch: u64,
        letter: &DeadLetter,
    ) -> Result<Settled, QueueError> {
        let json = serde_json::to_vec(letter).expect("DeadLetter always serializes");
        let code: i64 = DEAD_LETTER
            .key(&self.keys.epoch)
            .key(&self.keys.fenced)
            .key(&self.keys.owners)
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.inflight)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(epoch)
            .arg(&letter.pv_name)
            .arg(json)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("dead_letter"))?;
        Ok(Settled::from_code(code))
    }

    /// Move a dead letter back to the pending queue, due now (Redis' clock) with
    /// its attempt count reset. Returns `false` when `pv_name` is not dead-lettered.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn requeue_dead(&self, pv_name: &str) -> Result<bool, QueueError> {
        let moved: i64 = REQUEUE_DEAD
            .key(&self.keys.payloads)
            .key(&self.keys.due)
            .key(&self.keys.attempts)
            .key(&self.keys.enqueued)
            .key(&self.keys.dead)
            .arg(pv_name)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("requeue_dead"))?;
        Ok(moved == 1)
    }

    /// Make every entry waiting for a later retry due now (Redis' clock; the API
    /// server is back). Returns how many were pulled forward.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn pull_forward_retries(&self) -> Result<u64, QueueError> {
        PULL_FORWARD
            .key(&self.keys.due)
            .invoke_async(&mut self.conn.clone())
            .await
            .map_err(cmd("pull_forward_retries"))
    }

    /// Redis' clock (`TIME`), in ms since the Unix epoch.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn redis_time_ms(&self) -> Result<u64, QueueError> {
        let (secs, micros): (u64, u64) = redis::cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(cmd("time"))?;
        Ok(secs * 1000 + micros / 1000)
    }

    /// Depth (incoming, due and in flight), dead-letter count and oldest
    /// enqueue time, in one pipeline.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let (incoming, due, inflight, dead, oldest, (secs, micros)): StatsScan = redis::pipe()
            .llen(&self.keys.incoming)
            .zcard(&self.keys.due)
            .zcard(&self.keys.inflight)
            .hlen(&self.keys.dead)
            .zrange_withscores(&self.keys.enqueued, 0, 0)
            .cmd("TIME")
            .query_async(&mut self.conn.clone())
            .await
            .map_err(cmd("stats"))?;
        Ok(QueueStats {
            depth: incoming + due + inflight,
            dead,
            oldest_enqueued_ms: oldest.first().map(|(_, t)| *t as u64),
            redis_now_ms: secs * 1000 + micros / 1000,
        })
    }

    /// Every pending (not dead) entry, sorted by PV name.
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn list_pending(&self) -> Result<Vec<PendingEntry>, QueueError> {
        let mut conn = self.conn.clone();
        let (incoming, due, inflight, attempts, enqueued): PendingScan = redis::pipe()
            .lrange(&self.keys.incoming, 0, -1)
            .zrange_withscores(&self.keys.due, 0, -1)
            .zrange_withscores(&self.keys.inflight, 0, -1)
            .hgetall(&self.keys.attempts)
            .zrange_withscores(&self.keys.enqueued, 0, -1)
            .query_async(&mut conn)
            .await
            .map_err(cmd("list_pending"))?;
        // An incoming name is due from its enqueue; the next take makes it so.
        let incoming = incoming.into_iter().map(|n| {
            let t = enqueued.get(&n).copied().unwrap_or(0.0);
            (n, t)
        });
        let mut states: Vec<(String, PendingState)> = due
            .into_iter()
            .chain(incoming)
            .map(|(n, t)| (n, PendingState::Due(t as u64)))
            .chain(
                inflight
                    .into_iter()
                    .map(|(n, t)| (n, PendingState::InFlight(t as u64))),
            )
            .collect();
        states.sort_by(|a, b| a.0.cmp(&b.0));
        states.dedup_by(|a, b| a.0 == b.0);
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

    /// Owner of every in-flight entry: PV name → epoch of the pv-writer term
    /// that took it (`pv-queue:owners`), for operators (`pv-writer status`).
    ///
    /// Errors: [`QueueError::Command`].
    pub async fn inflight_owners(&self) -> Result<HashMap<String, u64>, QueueError> {
        self.conn
            .clone()
            .hgetall(&self.keys.owners)
            .await
            .map_err(cmd("inflight_owners"))
    }

    /// The dead letter of `pv_name`, if it is dead-lettered.
    ///
    /// Errors: [`QueueError::Command`], [`QueueError::Corrupt`] for an unreadable record.
    pub async fn dead_letter_of(&self, pv_name: &str) -> Result<Option<DeadLetter>, QueueError> {
        let raw: Option<Vec<u8>> = self
            .conn
            .clone()
            .hget(&self.keys.dead, pv_name)
            .await
            .map_err(cmd("dead_letter_of"))?;
        raw.map(|bytes| {
            serde_json::from_slice(&bytes).map_err(|e| QueueError::Corrupt {
                pv_name: pv_name.to_string(),
                detail: e.to_string(),
            })
        })
        .transpose()
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

/// `LLEN incoming`, `ZCARD due`, `ZCARD inflight`, `HLEN dead`, oldest of
/// `enqueued`, `TIME`.
type StatsScan = (u64, u64, u64, u64, Vec<(String, f64)>, (u64, u64));

/// `LRANGE incoming`, `ZRANGE due`, `ZRANGE inflight` (with scores),
/// `HGETALL attempts` and `ZRANGE enqueued` (with scores).
type PendingScan = (
    Vec<String>,
    Vec<(String, f64)>,
    Vec<(String, f64)>,
    std::collections::HashMap<String, u32>,
    HashMap<String, f64>,
);

fn cmd(operation: &'static str) -> impl Fn(redis::RedisError) -> QueueError {
    move |source| QueueError::Command { operation, source }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::queue::SCHEMA_VERSION;
    use k8s_openapi::api::core::v1::PersistentVolume;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::handoff::test_redis::TestRedis as Redis;

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

    const VIS: Duration = Duration::from_secs(60);

    async fn queue(redis: &Redis, provisioner: &str) -> PvQueue {
        PvQueue::connect(&redis.url(), provisioner).await.unwrap()
    }

    fn names(taken: Option<Vec<TakenEntry>>) -> Vec<String> {
        taken
            .expect("current term")
            .into_iter()
            .map(|t| t.pv_name)
            .collect()
    }

    async fn inflight_deadline(q: &PvQueue, name: &str) -> u64 {
        let score: Option<f64> = q.conn.clone().zscore(&q.keys.inflight, name).await.unwrap();
        score.expect("in flight") as u64
    }

    #[tokio::test]
    async fn enqueue_is_idempotent_and_drains() {
        let redis = Redis::start().await;
        let q = queue(&redis, "example.com/hostpath").await;
        let other = queue(&redis, "other.io/x").await;
        let term = q.begin_term().await.unwrap();
        assert!(q.enqueue(&entry("pvc-a")).await.unwrap().added);
        assert!(!q.enqueue(&entry("pvc-a")).await.unwrap().added);
        q.enqueue(&entry("pvc-b")).await.unwrap();
        assert!(q.is_pending("pvc-a").await.unwrap());
        assert!(!q.is_pending("pvc-c").await.unwrap());
        assert!(
            !other.is_pending("pvc-a").await.unwrap(),
            "keys are per provisioner"
        );
        let stats = q.stats().await.unwrap();
        assert_eq!((stats.depth, stats.dead), (2, 0));
        let oldest = stats.oldest_enqueued_ms.unwrap();
        assert!(oldest <= stats.redis_now_ms && stats.redis_now_ms - oldest < 5_000);

        let taken = q.take_due(term, 1, VIS).await.unwrap().unwrap();
        assert_eq!(taken.len(), 1);
        assert_eq!(taken[0].pv_name, "pvc-a");
        assert_eq!(taken[0].attempts, 0);
        assert_eq!(
            QueuedPvWrite::decode(&taken[0].payload).unwrap(),
            entry("pvc-a")
        );
        assert_eq!(names(q.take_due(term, 10, VIS).await.unwrap()), ["pvc-b"]);
        assert!(
            q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty(),
            "in flight is invisible"
        );
        assert!(q.is_pending("pvc-a").await.unwrap());
        assert_eq!(q.complete(term, "pvc-a").await.unwrap(), Settled::Done);
        assert_eq!(
            q.complete(term, "pvc-a").await.unwrap(),
            Settled::NotInFlight
        );
        assert!(!q.is_pending("pvc-a").await.unwrap());
        q.complete(term, "pvc-b").await.unwrap();
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.depth, stats.dead, stats.oldest_enqueued_ms),
            (0, 0, None)
        );
        // Once completed, the same PV name may be queued again.
        assert!(q.enqueue(&entry("pvc-a")).await.unwrap().added);
        assert_eq!(q.fenced_operations().await.unwrap(), 0);
    }

    #[tokio::test]
    async fn enqueue_clears_the_provisioning_intent_in_the_same_script() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let intents = crate::handoff::intents::IntentStore::connect(&redis.url(), "p")
            .await
            .unwrap();
        let claim = k8s_openapi::api::core::v1::PersistentVolumeClaim::default();
        intents
            .record_with_claim(&intent_for("pvc-a"), &claim, true)
            .await
            .unwrap();
        intents.record(&intent_for("pvc-b")).await.unwrap();

        // An observer polling both hashes atomically never sees the PV neither
        // queued nor covered by its intent.
        let observer = {
            let q = q.clone();
            tokio::spawn(async move {
                let mut gaps = 0;
                for _ in 0..400 {
                    let (queued, intent): (bool, bool) = redis::pipe()
                        .atomic()
                        .hexists(&q.keys.payloads, "pvc-a")
                        .hexists(&q.keys.intents, "pvc-a")
                        .query_async(&mut q.conn.clone())
                        .await
                        .unwrap();
                    if !queued && !intent {
                        gaps += 1;
                    }
                }
                gaps
            })
        };
        let outcome = q.enqueue(&entry("pvc-a")).await.unwrap();
        assert!(outcome.added && outcome.intent_cleared, "{outcome:?}");
        assert_eq!(observer.await.unwrap(), 0);
        assert!(!intents.contains("pvc-a").await.unwrap());
        assert_eq!(intents.claim("pvc-a").await.unwrap(), None);
        assert!(
            intents.contains("pvc-b").await.unwrap(),
            "only the queued PV's intent"
        );
        // A repeated enqueue clears nothing more and adds nothing.
        let again = q.enqueue(&entry("pvc-a")).await.unwrap();
        assert!(!again.added && !again.intent_cleared);
    }

    fn intent_for(pv_name: &str) -> api_types::queue::ProvisionIntent {
        api_types::queue::ProvisionIntent {
            version: api_types::queue::INTENT_VERSION,
            claim: entry(pv_name).claim,
            pv_name: pv_name.into(),
            class: "fast".into(),
            storage_class: None,
            selected_node: None,
            recorded_at_ms: 1,
        }
    }

    #[tokio::test]
    async fn enqueue_reports_the_aof_fsync_only_where_waitaof_exists() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut q.conn.clone())
            .await
            .unwrap();
        let version: Vec<u32> = info
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap()
            .trim()
            .split('.')
            .map(|p| p.parse().unwrap())
            .collect();
        let has_waitaof = (version[0], version[1]) >= (7, 2);
        for name in ["pvc-a", "pvc-b"] {
            let outcome = q.enqueue(&entry(name)).await.unwrap();
            assert!(outcome.added);
            assert_eq!(outcome.fsynced, has_waitaof, "Redis {version:?}");
        }
    }

    #[tokio::test]
    async fn an_enqueue_wakes_a_waiting_writer_at_once() {
        let redis = Redis::start().await;
        let q = queue(&redis, "example.com/hostpath").await;
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
    async fn a_stale_term_cannot_take_complete_retry_or_dead_letter() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let old = q.begin_term().await.unwrap();
        q.enqueue(&entry("pvc-a")).await.unwrap();
        q.enqueue(&entry("pvc-b")).await.unwrap();
        assert_eq!(names(q.take_due(old, 1, VIS).await.unwrap()), ["pvc-a"]);
        // A new leader begins while the old one is paused.
        let new = q.begin_term().await.unwrap();
        assert!(new > old);
        assert_eq!(q.current_term().await.unwrap(), new);

        assert_eq!(q.holds(old, "pvc-a").await.unwrap(), Settled::Fenced);
        assert_eq!(q.complete(old, "pvc-a").await.unwrap(), Settled::Fenced);
        assert_eq!(
            q.schedule_retry(old, "pvc-a", Duration::ZERO, 1)
                .await
                .unwrap(),
            Settled::Fenced
        );
        let letter = DeadLetter {
            pv_name: "pvc-a".into(),
            reason: "x".into(),
            dead_at_ms: 1,
            attempts: 0,
            claim: None,
        };
        assert_eq!(q.dead_letter(old, &letter).await.unwrap(), Settled::Fenced);
        assert_eq!(q.take_due(old, 10, VIS).await.unwrap(), None);
        assert_eq!(q.fenced_operations().await.unwrap(), 5);
        // Nothing moved: pvc-a is still in flight, pvc-b still due, no dead letter.
        let pending = q.list_pending().await.unwrap();
        assert!(matches!(pending[0].state, PendingState::InFlight(_)));
        assert!(matches!(pending[1].state, PendingState::Due(_)));
        assert!(q.list_dead().await.unwrap().is_empty());

        // The new term owns the work from here.
        assert_eq!(q.recover_inflight(new).await.unwrap(), 1);
        let mut taken = names(q.take_due(new, 10, VIS).await.unwrap());
        taken.sort();
        assert_eq!(taken, ["pvc-a", "pvc-b"]);
        assert_eq!(q.holds(new, "pvc-a").await.unwrap(), Settled::Done);
        assert_eq!(q.complete(new, "pvc-a").await.unwrap(), Settled::Done);
        assert_eq!(q.holds(new, "pvc-a").await.unwrap(), Settled::NotInFlight);
        assert_eq!(
            q.dead_letter(new, &letter.clone()).await.unwrap(),
            Settled::NotInFlight
        );
        let letter_b = DeadLetter {
            pv_name: "pvc-b".into(),
            ..letter
        };
        assert_eq!(q.dead_letter(new, &letter_b).await.unwrap(), Settled::Done);
        assert_eq!(q.fenced_operations().await.unwrap(), 5);
    }

    #[tokio::test]
    async fn recovery_takes_only_entries_of_earlier_terms() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        // An in-flight entry of the previous layout (no owner recorded).
        q.enqueue(&entry("pvc-legacy")).await.unwrap();
        let _: () = q
            .conn
            .clone()
            .zrem(&q.keys.due, "pvc-legacy")
            .await
            .unwrap();
        let _: () = q
            .conn
            .clone()
            .zadd(&q.keys.inflight, "pvc-legacy", u64::MAX / 4)
            .await
            .unwrap();
        let first = q.begin_term().await.unwrap();
        q.enqueue(&entry("pvc-old")).await.unwrap();
        assert_eq!(
            names(q.take_due(first, 10, VIS).await.unwrap()),
            ["pvc-old"]
        );
        let second = q.begin_term().await.unwrap();
        q.enqueue(&entry("pvc-mine")).await.unwrap();
        assert_eq!(
            names(q.take_due(second, 10, VIS).await.unwrap()),
            ["pvc-mine"]
        );
        // Recovery hands back pvc-legacy (no owner) and pvc-old (first term),
        // never this term's own pvc-mine.
        assert_eq!(q.recover_inflight(second).await.unwrap(), 2);
        let mut taken = names(q.take_due(second, 10, VIS).await.unwrap());
        taken.sort();
        assert_eq!(taken, ["pvc-legacy", "pvc-old"]);
        assert_eq!(q.recover_inflight(second).await.unwrap(), 0);
        for name in ["pvc-legacy", "pvc-mine", "pvc-old"] {
            assert_eq!(q.complete(second, name).await.unwrap(), Settled::Done);
        }
    }

    #[tokio::test]
    async fn a_take_whose_reply_was_lost_is_requeued_unless_a_worker_holds_it() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let old = q.begin_term().await.unwrap();
        q.enqueue(&entry("pvc-old-term")).await.unwrap();
        assert_eq!(
            names(q.take_due(old, 10, VIS).await.unwrap()),
            ["pvc-old-term"]
        );
        let term = q.begin_term().await.unwrap();
        for name in ["pvc-held", "pvc-lost"] {
            q.enqueue(&entry(name)).await.unwrap();
        }
        let mut taken = names(q.take_due(term, 10, VIS).await.unwrap());
        taken.sort();
        assert_eq!(taken, ["pvc-held", "pvc-lost"]);
        // A worker holds pvc-held; pvc-lost's take reply never reached anyone.
        assert_eq!(
            q.requeue_unheld(term, &["pvc-held".into()]).await.unwrap(),
            Some(1)
        );
        // pvc-lost is due again at once (not after the 60 s visibility timeout);
        // the held entry and the earlier term's entry are left alone.
        assert_eq!(
            names(q.take_due(term, 10, VIS).await.unwrap()),
            ["pvc-lost"]
        );
        assert_eq!(q.inflight_owners().await.unwrap().len(), 3);
        assert_eq!(
            q.requeue_unheld(term, &["pvc-held".into(), "pvc-lost".into()])
                .await
                .unwrap(),
            Some(0)
        );
        // A stale term changes nothing and is counted as fenced.
        let fenced = q.fenced_operations().await.unwrap();
        assert_eq!(q.requeue_unheld(old, &[]).await.unwrap(), None);
        assert_eq!(q.fenced_operations().await.unwrap(), fenced + 1);
        assert_eq!(q.inflight_owners().await.unwrap().len(), 3);
        for name in ["pvc-held", "pvc-lost"] {
            assert_eq!(q.complete(term, name).await.unwrap(), Settled::Done);
        }
    }

    #[tokio::test]
    async fn visibility_and_retry_times_come_from_redis_not_the_callers_clock() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let term = q.begin_term().await.unwrap();
        q.enqueue(&entry("pvc-a")).await.unwrap();
        let before = q.redis_time_ms().await.unwrap();
        assert_eq!(
            names(
                q.take_due(term, 10, Duration::from_millis(600))
                    .await
                    .unwrap()
            ),
            ["pvc-a"]
        );
        let deadline = inflight_deadline(&q, "pvc-a").await;
        assert!(
            deadline >= before + 600 && deadline < before + 600 + 2_000,
            "deadline {deadline} vs Redis now {before}"
        );
        // Not taken again before the timeout, whatever the caller's clock says.
        assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
        tokio::time::sleep(Duration::from_millis(700)).await;
        assert_eq!(names(q.take_due(term, 10, VIS).await.unwrap()), ["pvc-a"]);

        // A retry is due Redis' now + delay; pulled forward it is due at once.
        let before = q.redis_time_ms().await.unwrap();
        assert_eq!(
            q.schedule_retry(term, "pvc-a", Duration::from_secs(60), 3)
                .await
                .unwrap(),
            Settled::Done
        );
        let pending = q.list_pending().await.unwrap();
        let PendingState::Due(due) = pending[0].state else {
            panic!("{pending:?}")
        };
        assert!(
            due >= before + 60_000 && due < before + 62_000,
            "{due} vs {before}"
        );
        assert_eq!(pending[0].attempts, 3);
        assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
        assert_eq!(q.pull_forward_retries().await.unwrap(), 1);
        let taken = q.take_due(term, 10, VIS).await.unwrap().unwrap();
        assert_eq!((taken[0].pv_name.as_str(), taken[0].attempts), ("pvc-a", 3));
    }

    #[tokio::test]
    async fn dead_letters_keep_the_payload_and_can_be_requeued() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let term = q.begin_term().await.unwrap();
        q.enqueue_raw("pvc-x", b"{garbled").await.unwrap();
        let taken = q.take_due(term, 10, VIS).await.unwrap().unwrap();
        assert_eq!(taken[0].payload, b"{garbled");
        let letter = DeadLetter {
            pv_name: "pvc-x".into(),
            reason: "unreadable".into(),
            dead_at_ms: 1_500,
            attempts: 0,
            claim: None,
        };
        assert_eq!(q.dead_letter(term, &letter).await.unwrap(), Settled::Done);
        assert!(
            q.is_pending("pvc-x").await.unwrap(),
            "a dead letter blocks re-provisioning"
        );
        assert_eq!(q.list_dead().await.unwrap(), vec![letter.clone()]);
        assert!(q.list_pending().await.unwrap().is_empty());
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.depth, stats.dead, stats.oldest_enqueued_ms),
            (0, 1, None)
        );
        assert!(q.take_due(term, 10, VIS).await.unwrap().unwrap().is_empty());
        assert_eq!(q.recover_inflight(term + 1).await.unwrap(), 0);
        assert_eq!(q.payload("pvc-x").await.unwrap().unwrap(), b"{garbled");

        assert!(!q.requeue_dead("pvc-nope").await.unwrap());
        assert!(q.requeue_dead("pvc-x").await.unwrap());
        assert!(!q.requeue_dead("pvc-x").await.unwrap());
        assert!(q.list_dead().await.unwrap().is_empty());
        let pending = q.list_pending().await.unwrap();
        assert!(matches!(pending[0].state, PendingState::Due(_)));
        assert!(pending[0].entry.as_ref().unwrap_err().contains("garbled"));
        assert_eq!(q.stats().await.unwrap().depth, 1);
    }

    /// A name pushed to `incoming` (provision-svc's only way to make an entry
    /// due) arms only an entry in no other state: it re-arms nothing in
    /// flight or dead, delays no retry and ignores names without a payload.
    #[tokio::test]
    async fn incoming_names_arm_only_fresh_entries() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let term = q.begin_term().await.unwrap();
        for name in ["pvc-flying", "pvc-dead", "pvc-later"] {
            q.enqueue(&entry(name)).await.unwrap();
        }
        assert_eq!(
            q.stats().await.unwrap().depth,
            3,
            "incoming counts as pending"
        );
        assert_eq!(names(q.take_due(term, 10, VIS).await.unwrap()).len(), 3);
        let letter = DeadLetter {
            pv_name: "pvc-dead".into(),
            reason: "test".into(),
            dead_at_ms: 1,
            attempts: 0,
            claim: None,
        };
        assert_eq!(q.dead_letter(term, &letter).await.unwrap(), Settled::Done);
        let later = Duration::from_secs(600);
        assert_eq!(
            q.schedule_retry(term, "pvc-later", later, 1).await.unwrap(),
            Settled::Done
        );
        let mut conn = q.conn.clone();
        let later_at: f64 = conn.zscore(&q.keys.due, "pvc-later").await.unwrap();
        for name in ["pvc-flying", "pvc-dead", "pvc-later", "pvc-ghost"] {
            let _: i64 = conn.rpush(&q.keys.incoming, name).await.unwrap();
        }
        assert!(names(q.take_due(term, 10, VIS).await.unwrap()).is_empty());
        let still: f64 = conn.zscore(&q.keys.due, "pvc-later").await.unwrap();
        assert_eq!(
            still, later_at,
            "a retry is neither delayed nor pulled forward"
        );
        assert_eq!(q.list_dead().await.unwrap().len(), 1);
        let due: Vec<String> = conn.zrange(&q.keys.due, 0, -1).await.unwrap();
        assert_eq!(due, ["pvc-later"]);
        let left: i64 = conn.llen(&q.keys.incoming).await.unwrap();
        assert_eq!(left, 0);
        // A fresh enqueue is armed by the next take, in enqueue order.
        q.enqueue(&entry("pvc-new1")).await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        q.enqueue(&entry("pvc-new0")).await.unwrap();
        assert_eq!(names(q.take_due(term, 1, VIS).await.unwrap()), ["pvc-new1"]);
    }

    #[tokio::test]
    async fn a_due_name_without_payload_is_dropped_from_every_index() {
        let redis = Redis::start().await;
        let q = queue(&redis, "p").await;
        let term = q.begin_term().await.unwrap();
        q.enqueue_raw("pvc-lost", b"{}").await.unwrap();
        tokio::time::sleep(Duration::from_millis(5)).await;
        q.enqueue(&entry("pvc-kept")).await.unwrap();
        // A failed attempt leaves a count in `attempts`; then the payload is
        // removed behind the queue's back.
        assert_eq!(names(q.take_due(term, 1, VIS).await.unwrap()), ["pvc-lost"]);
        assert_eq!(
            q.schedule_retry(term, "pvc-lost", Duration::ZERO, 3)
                .await
                .unwrap(),
            Settled::Done
        );
        let mut conn = q.conn.clone();
        let removed: i64 = conn.hdel(&q.keys.payloads, "pvc-lost").await.unwrap();
        assert_eq!(removed, 1);
        let kept_at: f64 = conn.zscore(&q.keys.enqueued, "pvc-kept").await.unwrap();

        let mut taken = names(q.take_due(term, 10, VIS).await.unwrap());
        taken.sort();
        assert_eq!(taken, ["pvc-kept"]);
        let enqueued: Vec<String> = conn.zrange(&q.keys.enqueued, 0, -1).await.unwrap();
        assert_eq!(enqueued, ["pvc-kept"]);
        let attempts: Option<String> = conn.hget(&q.keys.attempts, "pvc-lost").await.unwrap();
        assert_eq!(attempts, None);
        let stats = q.stats().await.unwrap();
        assert_eq!(
            (stats.depth, stats.oldest_enqueued_ms),
            (1, Some(kept_at as u64)),
            "pvc-lost no longer counts as the oldest pending entry"
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
