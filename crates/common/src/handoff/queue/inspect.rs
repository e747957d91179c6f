//! Reads for metrics and operators: counts, pending entries, dead letters, owners.

use std::collections::{BTreeMap, HashMap};

use api_types::queue::{DecodeError, QueuedPvWrite};
use redis::AsyncCommands;

use super::{cmd, DeadLetter, Key, PvQueue, QueueError};

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
    /// Epoch of the pv-writer term that took it (`pv-queue:owners`), if in flight.
    pub owner_term: Option<u64>,
    /// The decoded payload, or why there is none.
    pub entry: Result<QueuedPvWrite, Unreadable>,
}

/// Why a pending entry's payload cannot be shown.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unreadable {
    /// No payload stored under the PV name.
    #[error("payload missing")]
    Missing,
    /// The payload does not decode.
    #[error(transparent)]
    Decode(#[from] DecodeError),
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

impl PvQueue {
    /// Depth (incoming, due and in flight), dead-letter count and oldest
    /// enqueue time, in one pipeline.
    pub async fn stats(&self) -> Result<QueueStats, QueueError> {
        let (incoming, due, inflight, dead, oldest, (secs, micros)): StatsScan = redis::pipe()
            .llen(self.keys.get(Key::Incoming))
            .zcard(self.keys.get(Key::Due))
            .zcard(self.keys.get(Key::InFlight))
            .hlen(self.keys.get(Key::Dead))
            .zrange_withscores(self.keys.get(Key::Enqueued), 0, 0)
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
    pub async fn list_pending(&self) -> Result<Vec<PendingEntry>, QueueError> {
        let mut conn = self.conn.clone();
        let (incoming, due, inflight, attempts, enqueued, owners): PendingScan = redis::pipe()
            .lrange(self.keys.get(Key::Incoming), 0, -1)
            .zrange_withscores(self.keys.get(Key::Due), 0, -1)
            .zrange_withscores(self.keys.get(Key::InFlight), 0, -1)
            .hgetall(self.keys.get(Key::Attempts))
            .zrange_withscores(self.keys.get(Key::Enqueued), 0, -1)
            .hgetall(self.keys.get(Key::Owners))
            .query_async(&mut conn)
            .await
            .map_err(cmd("list_pending"))?;
        // An incoming name is due from its enqueue; the next take makes it so.
        let incoming = incoming.into_iter().map(|n| {
            let t = enqueued.get(&n).copied().unwrap_or(0.0);
            (n, t)
        });
        // A name in several states shows the first: due, incoming, in flight.
        let mut states = BTreeMap::new();
        for (n, t) in due.into_iter().chain(incoming) {
            states.entry(n).or_insert(PendingState::Due(t as u64));
        }
        for (n, t) in inflight {
            states.entry(n).or_insert(PendingState::InFlight(t as u64));
        }
        let states: Vec<_> = states.into_iter().collect();
        let mut out = Vec::with_capacity(states.len());
        for chunk in states.chunks(500) {
            let names: Vec<&str> = chunk.iter().map(|(n, _)| n.as_str()).collect();
            let payloads: Vec<Option<Vec<u8>>> = redis::cmd("HMGET")
                .arg(self.keys.get(Key::Payloads))
                .arg(&names)
                .query_async(&mut conn)
                .await
                .map_err(cmd("list_pending"))?;
            for ((name, state), payload) in chunk.iter().zip(payloads) {
                let entry = payload.ok_or(Unreadable::Missing);
                let entry = entry.and_then(|bytes| Ok(QueuedPvWrite::decode(&bytes)?));
                out.push(PendingEntry {
                    pv_name: name.clone(),
                    state: *state,
                    attempts: attempts.get(name).copied().unwrap_or(0),
                    owner_term: owners.get(name).copied(),
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
        let raw: BTreeMap<String, Vec<u8>> = self
            .conn
            .clone()
            .hgetall(self.keys.get(Key::Dead))
            .await
            .map_err(cmd("list_dead"))?;
        let dead = raw
            .iter()
            .map(|(pv_name, bytes)| decode_dead(pv_name, bytes));
        dead.collect()
    }

    /// The dead letter of `pv_name`, if it is dead-lettered.
    ///
    /// Errors: [`QueueError::Command`], [`QueueError::Corrupt`] for an unreadable record.
    pub async fn dead_letter_of(&self, pv_name: &str) -> Result<Option<DeadLetter>, QueueError> {
        let raw: Option<Vec<u8>> = self
            .conn
            .clone()
            .hget(self.keys.get(Key::Dead), pv_name)
            .await
            .map_err(cmd("dead_letter_of"))?;
        raw.map(|bytes| decode_dead(pv_name, &bytes)).transpose()
    }

    /// The stored payload of `pv_name` (pending or dead), if any.
    pub async fn payload(&self, pv_name: &str) -> Result<Option<Vec<u8>>, QueueError> {
        self.conn
            .clone()
            .hget(self.keys.get(Key::Payloads), pv_name)
            .await
            .map_err(cmd("payload"))
    }
}

/// A stored dead letter; [`QueueError::Corrupt`] when it does not decode.
fn decode_dead(pv_name: &str, bytes: &[u8]) -> Result<DeadLetter, QueueError> {
    serde_json::from_slice(bytes).map_err(|e| QueueError::Corrupt {
        pv_name: pv_name.to_string(),
        detail: e.to_string(),
    })
}

/// `LLEN incoming`, `ZCARD due`, `ZCARD inflight`, `HLEN dead`, oldest of
/// `enqueued`, `TIME`.
type StatsScan = (u64, u64, u64, u64, Vec<(String, f64)>, (u64, u64));

/// `LRANGE incoming`, `ZRANGE due`, `ZRANGE inflight` (with scores),
/// `HGETALL attempts`, `ZRANGE enqueued` (with scores) and `HGETALL owners`.
type PendingScan = (
    Vec<String>,
    Vec<(String, f64)>,
    Vec<(String, f64)>,
    HashMap<String, u32>,
    HashMap<String, f64>,
    HashMap<String, u64>,
);
