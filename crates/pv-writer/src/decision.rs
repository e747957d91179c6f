//! pv-writer's rules as pure functions: the [`Verdict`] on one taken entry,
//! what an API answer to a PV create means ([`WriteResult`]), which HTTP codes
//! mean "the API server cannot serve writes now", and the jittered retry delay.

use std::time::Duration;

use api_types::queue::{DecodeError, QueuedPvWrite};
use common::kube::retry::Backoff;
use k8s_openapi::api::core::v1::PersistentVolume;
use rand::Rng;

use crate::checks::{describe, Refusal};
use crate::metrics::outcome;

/// What one taken entry comes to; the operation settles it once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to settle: no longer held by this term, fenced, or shutdown came first.
    Leave,
    /// Unreadable payload (`garbled` or `unknown_version`): dead-lettered, no event (no
    /// trusted claim).
    Unreadable(Refusal),
    /// Failed an entry check: dead-lettered, counted as refused, Warning event.
    Refused(Refusal),
    /// The claim is gone or was re-created: completed without a PV (`claim_gone`).
    ClaimGone(String),
    /// The create was attempted at `started_ms` (ms since the epoch) with `result`.
    Written {
        /// The API server's answer.
        result: WriteResult,
        /// When the write started.
        started_ms: u64,
    },
}

/// The verdict on a payload that does not decode.
pub fn unreadable(err: &DecodeError) -> Verdict {
    let kind = match err {
        DecodeError::Garbled(_) => "garbled",
        DecodeError::UnknownVersion { .. } => "unknown_version",
    };
    Verdict::Unreadable(Refusal::new(kind, format!("unreadable queue entry: {err}")))
}

/// What the API server said about one PV write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteResult {
    /// The PV is stored: `201 Created` ([`outcome::CREATED`]), or `409 AlreadyExists` with the
    /// existing PV's `claimRef.uid` the entry's claim uid ([`outcome::ALREADY_EXISTS`]).
    Stored(&'static str),
    /// Permanent refusal: `claimed_by_other`, `invalid` or `bad_request`.
    Refused(Refusal),
    /// Worth retrying.
    Transient(String),
}

/// Verdict on a `409 AlreadyExists` create given the existing PV: ours when
/// its `claimRef.uid` is the entry's claim, else refused `claimed_by_other`
/// (volume kept for an operator).
pub fn already_exists(entry: &QueuedPvWrite, existing: &PersistentVolume) -> WriteResult {
    let name = entry.pv_name();
    let claim_ref = existing.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
    let uid = claim_ref.and_then(|c| c.uid.as_deref());
    if uid == Some(entry.claim.uid.as_str()) {
        return WriteResult::Stored(outcome::ALREADY_EXISTS);
    }
    let owner = claim_ref.map_or("no claim".to_string(), |c| format!("claim {}", describe(c)));
    WriteResult::Refused(Refusal::new(
        "claimed_by_other",
        format!(
            "PV {name} already exists for {owner}, not for claim {} (uid {}); the volume is kept, requeue after resolving",
            entry.claim, entry.claim.uid
        ),
    ))
}

/// Verdict on a create refused with HTTP `code` (not 409): 422 refused as
/// `invalid`, 400 as `bad_request`, anything else transient.
pub fn refused_create(name: &str, code: u16, reason: &str, message: &str) -> WriteResult {
    let (kind, rejected_as) = match code {
        422 => ("invalid", "invalid"),
        400 => ("bad_request", "a bad request"),
        code => return WriteResult::Transient(format!("creating PV: {code} {reason}: {message}")),
    };
    let why = format!("API server rejected PV {name} as {rejected_as}: {message}");
    WriteResult::Refused(Refusal::new(kind, why))
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
    let base = Backoff::exponential(initial, max).delay(attempts);
    base.mul_f64(rand::rng().random_range(0.8..=1.0))
}

/// What a term Redis refused does next, from the epoch Redis holds now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AfterRefusal {
    /// The epoch is this term (an entry of an earlier term of ours was refused): drain on.
    GoOn,
    /// The epoch is below this term: Redis lost its data; begin a term above ours.
    BeginAbove,
    /// The epoch is a term this writer began whose reply was lost: drain on under it.
    Adopt(u64),
    /// A newer leader began a term: stop.
    Stop,
    /// Redis did not answer: ask again after a pause (not a newer leader).
    AskAgain,
}

/// [`AfterRefusal`] for term `ours` and the epoch read from Redis with whether this writer
/// began it (`None`: not read).
pub fn after_refusal(ours: u64, current: Option<(u64, bool)>) -> AfterRefusal {
    match current {
        None => AfterRefusal::AskAgain,
        Some((current, true)) if current > ours => AfterRefusal::Adopt(current),
        Some((current, false)) if current > ours => AfterRefusal::Stop,
        Some((current, _)) if current < ours => AfterRefusal::BeginAbove,
        Some(_) => AfterRefusal::GoOn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refused_term_stops_only_for_a_newer_epoch_and_asks_again_when_redis_is_silent() {
        assert_eq!(after_refusal(4, Some((5, false))), AfterRefusal::Stop);
        assert_eq!(after_refusal(4, Some((5, true))), AfterRefusal::Adopt(5));
        assert_eq!(after_refusal(4, Some((4, false))), AfterRefusal::GoOn);
        assert_eq!(after_refusal(4, Some((0, false))), AfterRefusal::BeginAbove);
        assert_eq!(after_refusal(4, None), AfterRefusal::AskAgain);
    }

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

    #[test]
    fn refusals_and_transient_codes() {
        assert_eq!(
            refused_create("pv-1", 422, "Invalid", "bad spec"),
            WriteResult::Refused(Refusal::new(
                "invalid",
                "API server rejected PV pv-1 as invalid: bad spec".into()
            ))
        );
        assert!(matches!(
            refused_create("pv-1", 400, "BadRequest", "x"),
            WriteResult::Refused(Refusal {
                kind: "bad_request",
                ..
            })
        ));
        for code in [500, 503, 429, 403, 401, 404] {
            assert!(matches!(
                refused_create("pv-1", code, "r", "m"),
                WriteResult::Transient(_)
            ));
        }
        for code in [500, 503, 429, 403, 401] {
            assert!(is_transient_code(code), "{code}");
        }
        for code in [200, 404, 409, 422, 400] {
            assert!(!is_transient_code(code), "{code}");
        }
    }
}
