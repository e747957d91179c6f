//! The last orphan sweep's report, kept in Redis for operators: reclaim-svc stores an
//! [`OrphanReport`] under `<prefix>orphan-report` after every completed sweep (an abandoned
//! or skipped sweep leaves the previous one), and `provisioner-ctl status` reads it.

use crate::handoff::redis_conn::RedisConn;
use redis::AsyncCommands;
use serde::{Deserialize, Serialize};

use crate::handoff::redis_store;
use api_types::queue::{decode_versions, DecodeError};

/// The record version this release writes.
pub const REPORT_VERSION: u32 = 1;

/// The report key of `provisioner_name`: `<prefix>orphan-report`.
pub fn report_key(provisioner_name: &str) -> String {
    format!("{}orphan-report", redis_store::key_prefix(provisioner_name))
}

/// What one completed orphan sweep found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OrphanReport {
    /// Always [`REPORT_VERSION`] when written by this release.
    pub version: u32,
    /// When the sweep finished, ms since the Unix epoch (reclaim-svc's clock).
    pub swept_at_ms: u64,
    /// Lease holder identity of the reclaim-svc replica that swept.
    pub reporter: String,
    /// PV names of the volumes with no PV, no pending PV write and no
    /// provisioning intent, sorted.
    pub orphans: Vec<String>,
    /// How many of them were archived (`--sweep-orphans`; 0 otherwise).
    pub archived: u64,
}

/// Failure to read or write the report.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// Redis unreachable or the command failed.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// The stored value is not a report this release can read (garbled JSON,
    /// or a version other than [`REPORT_VERSION`]).
    #[error("unreadable orphan report at {key}: {detail}")]
    Corrupt {
        /// The Redis key.
        key: String,
        /// What is wrong.
        detail: DecodeError,
    },
}

/// Replace the report of `provisioner_name` with `report`.
///
/// Errors: [`ReportError::Redis`].
pub async fn write(
    conn: &mut RedisConn,
    provisioner_name: &str,
    report: &OrphanReport,
) -> Result<(), ReportError> {
    let json = serde_json::to_string(report).expect("OrphanReport always serializes");
    let () = conn.set(report_key(provisioner_name), json).await?;
    Ok(())
}

/// The report of `provisioner_name`, `None` when no sweep has completed yet. Errors:
/// [`ReportError::Redis`]; [`ReportError::Corrupt`] for a value that does not decode or has another
/// version (never guessed at).
pub async fn read(
    conn: &mut RedisConn,
    provisioner_name: &str,
) -> Result<Option<OrphanReport>, ReportError> {
    let key = report_key(provisioner_name);
    let raw: Option<Vec<u8>> = conn.get(&key).await?;
    let report = raw.map(|bytes| decode_versions(&bytes, REPORT_VERSION..=REPORT_VERSION));
    report
        .transpose()
        .map_err(|detail| ReportError::Corrupt { key, detail })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_is_under_the_provisioner_prefix() {
        assert_eq!(
            report_key("example.com/hostpath"),
            "provisioner:{example.com/hostpath}:orphan-report"
        );
    }

    fn decode(bytes: &[u8]) -> Result<OrphanReport, DecodeError> {
        decode_versions(bytes, REPORT_VERSION..=REPORT_VERSION)
    }

    #[test]
    fn decode_round_trips_and_refuses_garbage_and_other_versions() {
        let report = OrphanReport {
            version: REPORT_VERSION,
            swept_at_ms: 5,
            reporter: "reclaim-0".into(),
            orphans: vec!["pvc-a".into()],
            archived: 0,
        };
        let json = serde_json::to_vec(&report).unwrap();
        assert_eq!(decode(&json).unwrap(), report);
        assert!(decode(b"not json").is_err());
        let mut v2 = report.clone();
        v2.version = 2;
        let err = decode(&serde_json::to_vec(&v2).unwrap()).unwrap_err();
        assert_eq!(err, DecodeError::UnknownVersion { found: 2 });
    }
}
