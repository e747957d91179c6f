//! The Lua scripts of the queue and the intents, each bound once to the keys it reads as
//! `KEYS[1..n]`.

use std::sync::OnceLock;

use redis::aio::ConnectionLike;
use redis::{FromRedisValue, RedisResult, Script, ToRedisArgs};

use crate::handoff::redis_store;
use Key::*;

/// One Redis key of a provisioner's queue or intents (docs/ARCHITECTURE.md, "The durable store").
#[derive(Debug, Clone, Copy)]
pub(crate) enum Key {
    Payloads,
    Incoming,
    Due,
    InFlight,
    Attempts,
    Enqueued,
    Dead,
    Wakeup,
    Epoch,
    EpochOwner,
    Owners,
    Fenced,
    Intents,
    IntentClaims,
}

/// The key names of one provisioner, indexed by [`Key`].
#[derive(Debug, Clone)]
pub(crate) struct Keys([String; 14]);

impl Keys {
    /// The keys under `provisioner_name`'s prefix (`provisioner:{<name>}:`).
    pub(crate) fn new(provisioner_name: &str) -> Self {
        let p = redis_store::key_prefix(provisioner_name);
        let q = |suffix: &str| format!("{p}pv-queue:{suffix}");
        Keys([
            q("payloads"),
            q("incoming"),
            q("due"),
            q("inflight"),
            q("attempts"),
            q("enqueued"),
            q("dead"),
            q("wakeup"),
            q("epoch"),
            q("epoch-owner"),
            q("owners"),
            q("fenced"),
            format!("{p}provision-intents"),
            format!("{p}provision-intent-claims"),
        ])
    }

    /// The name of `key`.
    pub(crate) fn get(&self, key: Key) -> &str {
        &self.0[key as usize]
    }
}

/// A Lua script: its operation name (in errors), the keys it takes in `KEYS`
/// order, and its preludes and body (joined and hashed once, on first use).
pub(crate) struct QueueScript {
    pub(crate) name: &'static str,
    keys: &'static [Key],
    preludes: &'static [&'static str],
    body: &'static str,
    script: OnceLock<Script>,
}

impl QueueScript {
    const fn new(
        name: &'static str,
        keys: &'static [Key],
        preludes: &'static [&'static str],
        body: &'static str,
    ) -> Self {
        let script = OnceLock::new();
        QueueScript {
            name,
            keys,
            preludes,
            body,
            script,
        }
    }

    /// Run this script on `conn` with its keys of `keys` as `KEYS` and `args` as `ARGV`.
    /// Errors: Redis' (unreachable, refused by the ACL, a script error).
    pub(crate) async fn invoke<T: FromRedisValue>(
        &self,
        conn: &mut (impl ConnectionLike + Send),
        keys: &Keys,
        args: impl ToRedisArgs,
    ) -> RedisResult<T> {
        let lua = || Script::new(&(self.preludes.concat() + self.body));
        let mut invocation = self.script.get_or_init(lua).prepare_invoke();
        for key in self.keys {
            invocation.key(keys.get(*key));
        }
        invocation.arg(args);
        invocation.invoke_async(conn).await
    }
}

/// Lua prelude of every script that needs "now": Redis' own `TIME` in ms, so a
/// pod's clock cannot shorten a visibility timeout or misplace a due time
/// (scripts calling `TIME` are replicated by effects).
const NOW_LUA: &str = r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
"#;

/// Lua prelude after `NOW_LUA`: `requeue(due, inflight, owners, name)` makes an in-flight
/// entry due now and forgets its owner.
const REQUEUE_LUA: &str = r#"
local function requeue(due, inflight, owners, name)
  redis.call('ZREM', inflight, name)
  redis.call('HDEL', owners, name)
  redis.call('ZADD', due, now, name)
end
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

// ARGV: pv name, payload. Returns {added, intent cleared}: added = 1 when newly
// queued, 0 when the PV name was already in the queue (then an intent is set and
// removed again: writes that change nothing, so this connection's WAIT and WAITAOF
// cover the entry on Redis >= 7.2, which count from a connection's last write). The provisioning intent of the
// PV is removed in the same script either way: the PV is durably queued, so the
// intent has done its job. A new entry goes to `incoming`, never to `due`: the next
// take makes it due.
pub(super) static ENQUEUE: QueueScript = QueueScript::new(
    "enqueue",
    &[Payloads, Incoming, Enqueued, Wakeup, Intents, IntentClaims],
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
if added == 0 then
  redis.call('HSET', KEYS[5], ARGV[1], '')
  redis.call('HDEL', KEYS[5], ARGV[1])
end
return {added, cleared}
"#,
);

// ARGV: pv name, intent, claim snapshot. Records both (a script, not MULTI: redis-rs 1.8
// panics when an ACL refuses a MULTI pipeline); returns 1 when no intent existed.
pub(crate) static RECORD_INTENT: QueueScript = QueueScript::new(
    "record_intent",
    &[Intents, IntentClaims],
    &[],
    r#"
local added = redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
redis.call('HSET', KEYS[2], ARGV[1], ARGV[3])
return added
"#,
);

// ARGV: pv name. Removes the intent and its claim snapshot; returns 1 when an intent went.
pub(crate) static CLEAR_INTENT: QueueScript = QueueScript::new(
    "clear_intent",
    &[Intents, IntentClaims],
    &[],
    r#"
redis.call('HDEL', KEYS[2], ARGV[1])
return redis.call('HDEL', KEYS[1], ARGV[1])
"#,
);

// ARGV: floor, owner. Starts a new term above both the current epoch and `floor` (a term
// this caller held before Redis lost the counter), records `owner` as the one who began
// it, and returns the new epoch.
pub(super) static BEGIN_TERM: QueueScript = QueueScript::new(
    "begin_term",
    &[Epoch, EpochOwner],
    &[],
    r#"
local current = tonumber(redis.call('GET', KEYS[1]) or '0')
local floor = tonumber(ARGV[1])
local epoch = redis.call('INCRBY', KEYS[1], math.max(floor - current, 0) + 1)
redis.call('SET', KEYS[2], ARGV[2])
return epoch
"#,
);

// Returns {epoch, owner}: the current term and the owner that began it (nil if unknown).
pub(super) static CURRENT_TERM: QueueScript = QueueScript::new(
    "current_term",
    &[Epoch, EpochOwner],
    &[],
    r#"
return {tonumber(redis.call('GET', KEYS[1]) or '0'), redis.call('GET', KEYS[2])}
"#,
);

// ARGV: epoch, visibility ms, limit. Returns {1, triples} or {0, {}} when `epoch` is
// stale (a newer term exists). Makes up to 1000 incoming names due (at their enqueue
// time, never later than now), each only when it has a payload and is in no other
// state (so a pushed name re-arms nothing and delays nothing); moves expired in-
// flight entries back to due, then moves up to `limit` due entries to in-flight
// (owned by `epoch`) and returns {name, payload, attempts} triples. A due name
// without a payload (the payload hash was edited by hand) is dropped from every
// index, so it cannot pin the oldest-pending age.
pub(super) static TAKE_DUE: QueueScript = QueueScript::new(
    "take_due",
    &[
        Payloads, Due, InFlight, Attempts, Enqueued, Epoch, Owners, Fenced, Incoming, Dead,
    ],
    &[NOW_LUA, REQUEUE_LUA, TERM_LUA],
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
for _, name in ipairs(expired) do requeue(KEYS[2], KEYS[3], KEYS[7], name) end
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
);

// ARGV: epoch. In-flight entries owned by an earlier term (or by none: the previous
// layout) become due now; entries of this term or a later one are left alone. Returns
// how many were recovered.
pub(super) static RECOVER_INFLIGHT: QueueScript = QueueScript::new(
    "recover_inflight",
    &[Due, InFlight, Owners],
    &[NOW_LUA, REQUEUE_LUA],
    r#"
local names = redis.call('ZRANGE', KEYS[2], 0, -1)
local n = 0
for _, name in ipairs(names) do
  local owner = tonumber(redis.call('HGET', KEYS[3], name) or '0')
  if owner < tonumber(ARGV[1]) then
    requeue(KEYS[1], KEYS[2], KEYS[3], name)
    n = n + 1
  end
end
return n
"#,
);

// ARGV: epoch, then the PV names this term's workers hold. Returns -1 when `epoch` is
// stale, else how many entries in flight under `epoch` but not held were made due
// now.
pub(super) static REQUEUE_UNHELD: QueueScript = QueueScript::new(
    "requeue_unheld",
    &[Epoch, Fenced, Due, InFlight, Owners],
    &[NOW_LUA, REQUEUE_LUA, TERM_LUA],
    r#"
if not term_ok(KEYS[1], KEYS[2], ARGV[1]) then return -1 end
local held = {}
for i = 2, #ARGV do held[ARGV[i]] = true end
local n = 0
for _, name in ipairs(redis.call('ZRANGE', KEYS[4], 0, -1)) do
  if not held[name] and redis.call('HGET', KEYS[5], name) == ARGV[1] then
    requeue(KEYS[3], KEYS[4], KEYS[5], name)
    n = n + 1
  end
end
return n
"#,
);

/// Lua check shared by the settle scripts: -1 for a stale term, 0 when `name`
/// is not in flight under `epoch`. KEYS[1..3] of the settle scripts are always
/// epoch, fenced, owners, and ARGV[1..2] epoch, name.
const SETTLE_CHECK_LUA: &str = r#"
if not term_ok(KEYS[1], KEYS[2], ARGV[1]) then return -1 end
if redis.call('HGET', KEYS[3], ARGV[2]) ~= ARGV[1] then return 0 end
"#;

// ARGV: epoch, pv name. Changes nothing but the fenced counter: 1 while the entry is
// in flight under the current term `epoch`.
pub(super) static HOLDS: QueueScript = QueueScript::new(
    "holds",
    &[Epoch, Fenced, Owners],
    &[TERM_LUA, SETTLE_CHECK_LUA],
    "return 1",
);

// ARGV: epoch, pv name. Removes the entry everywhere.
pub(super) static COMPLETE: QueueScript = QueueScript::new(
    "complete",
    &[
        Epoch, Fenced, Owners, Payloads, Due, InFlight, Attempts, Enqueued, Dead,
    ],
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
);

// ARGV: epoch, pv name, delay ms, attempts. Due at Redis' now + delay.
pub(super) static RETRY: QueueScript = QueueScript::new(
    "schedule_retry",
    &[Epoch, Fenced, Owners, Payloads, Due, InFlight, Attempts],
    &[NOW_LUA, TERM_LUA, SETTLE_CHECK_LUA],
    r#"
if redis.call('HEXISTS', KEYS[4], ARGV[2]) == 0 then return 0 end
if redis.call('ZREM', KEYS[6], ARGV[2]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[2])
redis.call('ZADD', KEYS[5], now + tonumber(ARGV[3]), ARGV[2])
redis.call('HSET', KEYS[7], ARGV[2], ARGV[4])
return 1
"#,
);

// ARGV: epoch, pv name, dead-letter JSON.
pub(super) static DEAD_LETTER: QueueScript = QueueScript::new(
    "dead_letter",
    &[
        Epoch, Fenced, Owners, Payloads, Due, InFlight, Enqueued, Dead,
    ],
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
);

// ARGV: pv name.
pub(super) static REQUEUE_DEAD: QueueScript = QueueScript::new(
    "requeue_dead",
    &[Payloads, Due, Attempts, Enqueued, Dead],
    &[NOW_LUA],
    r#"
if redis.call('HDEL', KEYS[5], ARGV[1]) == 0 then return 0 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('HDEL', KEYS[3], ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[1])
redis.call('ZADD', KEYS[4], now, ARGV[1])
return 1
"#,
);

// Entries scheduled later than Redis' now become due now.
pub(super) static PULL_FORWARD: QueueScript = QueueScript::new(
    "pull_forward_retries",
    &[Due],
    &[NOW_LUA],
    r#"
local names = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. now, '+inf')
for _, name in ipairs(names) do
  redis.call('ZADD', KEYS[1], now, name)
end
return #names
"#,
);
