//! Versioned schema of the records the services keep in Redis.
//!
//! Every record is JSON with a top-level numeric `version` field. Readers call
//! the `decode` functions, which tell a garbled record ([`DecodeError::Garbled`])
//! from one written by a newer release ([`DecodeError::UnknownVersion`]) so the
//! caller can dead-letter it with a precise log line instead of crashing.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use serde::{Deserialize, Serialize};

/// The only schema version this release writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// Identity of the claim a record is about.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ClaimKey {
    /// Claim namespace.
    pub namespace: String,
    /// Claim name.
    pub name: String,
    /// Claim `metadata.uid`; a claim re-created under the same name has a new uid.
    pub uid: String,
}

impl ClaimKey {
    /// The key of `claim`, or `None` if it lacks a namespace, name or uid
    /// (objects from the API server always carry all three).
    pub fn of(claim: &PersistentVolumeClaim) -> Option<Self> {
        Some(ClaimKey {
            namespace: claim.metadata.namespace.clone()?,
            name: claim.metadata.name.clone()?,
            uid: claim.metadata.uid.clone()?,
        })
    }
}

impl std::fmt::Display for ClaimKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A PV that provision-svc provisioned and pv-writer must create.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedPvWrite {
    /// Always [`SCHEMA_VERSION`] when written by this release.
    pub version: u32,
    /// The complete PV to create (name `pvc-<claim uid>`, claimRef, annotations).
    pub pv: PersistentVolume,
    /// The claim the PV is for; events go to it.
    pub claim: ClaimKey,
    /// StorageClass name, for metrics labels.
    pub class: String,
    /// When provision-svc enqueued it, in milliseconds since the Unix epoch.
    pub enqueued_at_ms: u64,
    /// Lower-case hex HMAC-SHA256 of the record without this field, keyed with
    /// the queue key only provision-svc and pv-writer hold (see
    /// `common::queue_auth`). Absent in records of earlier releases and in
    /// records written with the insecure unsigned-queue dev flag.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// A durable note that provision-svc is about to call the backend for a claim.
/// It is cleared once the PV is queued or the outcome is final; a leader finding
/// one on start either provisions again (claim present) or deletes the asset.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ProvisionIntent {
    /// Always [`SCHEMA_VERSION`] when written by this release.
    pub version: u32,
    /// The claim being provisioned.
    pub claim: ClaimKey,
    /// The PV name the backend was asked for.
    pub pv_name: String,
    /// StorageClass name.
    pub class: String,
    /// When the intent was recorded, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
}

/// The claim snapshot stored next to a [`ProvisionIntent`], so a claim deleted
/// mid-provisioning can still be found again and its asset cleaned up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntentClaim {
    /// Always [`SCHEMA_VERSION`] when written by this release.
    pub version: u32,
    /// True when the backend's last answer was `InBackground`: the claim is in the
    /// seed's "claims in progress" and is retried even after its PVC was deleted.
    pub in_background: bool,
    /// The claim as it was when the backend was called.
    pub claim: PersistentVolumeClaim,
}

/// Why a stored record could not be read.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or JSON of the wrong shape for its version.
    #[error("garbled record: {0}")]
    Garbled(String),
    /// A well-formed record of a version this release does not know.
    #[error("unknown record version {found} (this release reads version {SCHEMA_VERSION})")]
    UnknownVersion {
        /// The version field found in the record.
        found: u64,
    },
}

fn decode<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, DecodeError> {
    let value: serde_json::Value =
        serde_json::from_slice(bytes).map_err(|e| DecodeError::Garbled(e.to_string()))?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if v == u64::from(SCHEMA_VERSION) => {
            serde_json::from_value(value).map_err(|e| DecodeError::Garbled(e.to_string()))
        }
        Some(found) => Err(DecodeError::UnknownVersion { found }),
        None => Err(DecodeError::Garbled(
            "missing numeric `version` field".to_string(),
        )),
    }
}

impl QueuedPvWrite {
    /// Serialize to the stored JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("QueuedPvWrite always serializes")
    }

    /// Parse a stored record. Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }

    /// The bytes an HMAC covers: the stored JSON form with `mac` left out.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        if self.mac.is_none() {
            return self.encode();
        }
        let mut unsigned = self.clone();
        unsigned.mac = None;
        unsigned.encode()
    }

    /// The PV name, or `""` if the PV has none (never the case for valid entries).
    pub fn pv_name(&self) -> &str {
        self.pv.metadata.name.as_deref().unwrap_or_default()
    }
}

impl ProvisionIntent {
    /// Serialize to the stored JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("ProvisionIntent always serializes")
    }

    /// Parse a stored record. Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }
}

impl IntentClaim {
    /// Serialize to the stored JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("IntentClaim always serializes")
    }

    /// Parse a stored record. Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode(bytes)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    fn entry() -> QueuedPvWrite {
        QueuedPvWrite {
            version: SCHEMA_VERSION,
            pv: PersistentVolume {
                metadata: ObjectMeta {
                    name: Some("pvc-1".into()),
                    ..Default::default()
                },
                ..Default::default()
            },
            claim: ClaimKey {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "1".into(),
            },
            class: "fast".into(),
            enqueued_at_ms: 42,
            mac: None,
        }
    }

    #[test]
    fn round_trips() {
        let e = entry();
        assert_eq!(QueuedPvWrite::decode(&e.encode()).unwrap(), e);
        assert_eq!(e.pv_name(), "pvc-1");
    }

    #[test]
    fn garbled_and_unknown_versions_are_told_apart() {
        assert!(matches!(
            QueuedPvWrite::decode(b"{not json"),
            Err(DecodeError::Garbled(_))
        ));
        assert!(matches!(
            QueuedPvWrite::decode(br#"{"pv":{}}"#),
            Err(DecodeError::Garbled(_))
        ));
        let mut v = serde_json::to_value(entry()).unwrap();
        v["version"] = 7.into();
        assert!(matches!(
            QueuedPvWrite::decode(&serde_json::to_vec(&v).unwrap()),
            Err(DecodeError::UnknownVersion { found: 7 })
        ));
        let mut v = serde_json::to_value(entry()).unwrap();
        v["claim"] = 3.into();
        assert!(matches!(
            QueuedPvWrite::decode(&serde_json::to_vec(&v).unwrap()),
            Err(DecodeError::Garbled(_))
        ));
    }
}
