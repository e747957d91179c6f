//! Versioned schema of the records the services keep in Redis.
//!
//! Every record is JSON with a top-level numeric `version` field. Readers call
//! the `decode` functions, which tell a garbled record ([`DecodeError::Garbled`])
//! from one written by a newer release ([`DecodeError::UnknownVersion`]) so the
//! caller can dead-letter it with a precise log line instead of crashing.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use serde::{Deserialize, Serialize};

/// The schema version of queue entries and claim snapshots this release
/// writes and reads.
pub const SCHEMA_VERSION: u32 = 1;

/// The version of [`QueuedPvWrite`] entries this release writes; 2 added
/// `first_attempt_at_ms`, 1 is still read (upgrade pv-writer before provision-svc).
pub const QUEUE_ENTRY_VERSION: u32 = 2;

/// The version of [`ProvisionIntent`] records this release writes; 2 added the
/// StorageClass and selected node, 1 is still read.
pub const INTENT_VERSION: u32 = 2;

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
/// Versions: 1 and 2 (adds `first_attempt_at_ms`); this release writes
/// [`QUEUE_ENTRY_VERSION`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QueuedPvWrite {
    /// [`QUEUE_ENTRY_VERSION`] when written by this release's provision-svc.
    pub version: u32,
    /// The complete PV to create (name `pvc-<claim uid>`, claimRef, annotations).
    pub pv: PersistentVolume,
    /// The claim the PV is for; events go to it.
    pub claim: ClaimKey,
    /// StorageClass name, for metrics labels.
    pub class: String,
    /// When provision-svc enqueued it, in milliseconds since the Unix epoch.
    pub enqueued_at_ms: u64,
    /// When provision-svc first attempted the claim (this term), in ms since the
    /// Unix epoch: the start of the provision duration metric; `None` in version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_attempt_at_ms: Option<u64>,
    /// Lower-case hex HMAC-SHA256 of the record without this field, keyed with the
    /// queue key (`common::handoff::queue_auth`); absent when unsigned.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mac: Option<String>,
}

/// A durable note that provision-svc is about to call the backend for a claim,
/// cleared once the PV is queued or the outcome is final. Versions 1 and 2
/// (adds `storage_class`, `selected_node`); this release writes [`INTENT_VERSION`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ProvisionIntent {
    /// Always [`INTENT_VERSION`] when written by this release.
    pub version: u32,
    /// The claim being provisioned.
    pub claim: ClaimKey,
    /// The PV name the backend was asked for.
    pub pv_name: String,
    /// StorageClass name.
    pub class: String,
    /// When the intent was recorded, in milliseconds since the Unix epoch.
    pub recorded_at_ms: u64,
    /// The StorageClass (parameters, reclaim policy, mount options) as the
    /// backend was given it, so the volume can be deleted from the intent
    /// alone even after the class is gone. `None` in version-1 records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_class: Option<StorageClass>,
    /// The node the scheduler selected (`volume.kubernetes.io/selected-node`)
    /// when the backend was called, if any. `None` in version-1 records.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selected_node: Option<String>,
}

/// The claim snapshot stored next to a [`ProvisionIntent`], so a claim deleted
/// mid-provisioning can still be found again and its asset cleaned up.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntentClaim {
    /// Always [`SCHEMA_VERSION`] when written by this release.
    pub version: u32,
    /// True when the backend's last answer was `InBackground` (the seed's "claims in
    /// progress"); a deleted claim's half-made volume is cleaned up, not provisioned.
    pub in_background: bool,
    /// The claim as it was when the backend was called.
    pub claim: PersistentVolumeClaim,
}

/// Why a stored record could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// Not JSON, or JSON of the wrong shape for its version.
    #[error("garbled record: {0}")]
    Garbled(String),
    /// A well-formed record of a version this release does not know.
    #[error("unknown record version {found}")]
    UnknownVersion {
        /// The version field found in the record.
        found: u64,
    },
}

/// Decode a record whose `version` lies in `known`.
pub fn decode_versions<T: for<'de> Deserialize<'de>>(
    bytes: &[u8],
    known: std::ops::RangeInclusive<u32>,
) -> Result<T, DecodeError> {
    let garbled = |e: serde_json::Error| DecodeError::Garbled(e.to_string());
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(garbled)?;
    match value.get("version").and_then(serde_json::Value::as_u64) {
        Some(v) if u32::try_from(v).is_ok_and(|v| known.contains(&v)) => {
            serde_json::from_value(value).map_err(garbled)
        }
        Some(found) => Err(DecodeError::UnknownVersion { found }),
        None => Err(DecodeError::Garbled(
            "missing numeric `version` field".into(),
        )),
    }
}

impl QueuedPvWrite {
    /// Serialize to the stored JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("QueuedPvWrite always serializes")
    }

    /// Parse a stored entry of version 1 or 2 (see the type docs).
    /// Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_versions(bytes, 1..=QUEUE_ENTRY_VERSION)
    }

    /// When the claim's provisioning started, in ms since the Unix epoch: the
    /// earlier of `first_attempt_at_ms` (if any) and `enqueued_at_ms`.
    pub fn provisioning_started_ms(&self) -> u64 {
        self.first_attempt_at_ms
            .map_or(self.enqueued_at_ms, |t| t.min(self.enqueued_at_ms))
    }

    /// The bytes an HMAC covers: the stored JSON form with `mac` left out.
    pub fn canonical_bytes(&self) -> Vec<u8> {
        QueuedPvWrite {
            mac: None,
            ..self.clone()
        }
        .encode()
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

    /// Parse a stored record of version 1 or 2 (see the type docs).
    /// Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_versions(bytes, 1..=INTENT_VERSION)
    }
}

impl IntentClaim {
    /// Serialize to the stored JSON form.
    pub fn encode(&self) -> Vec<u8> {
        serde_json::to_vec(self).expect("IntentClaim always serializes")
    }

    /// Parse a stored record. Errors: [`DecodeError`].
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        decode_versions(bytes, SCHEMA_VERSION..=SCHEMA_VERSION)
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
            first_attempt_at_ms: None,
            mac: None,
        }
    }

    #[test]
    fn version_1_entries_still_decode_and_version_2_carries_the_first_attempt() {
        // A version-1 entry as earlier releases wrote it: no first attempt.
        let v1 = entry();
        let bytes = v1.encode();
        assert!(!String::from_utf8_lossy(&bytes).contains("first_attempt"));
        let old = QueuedPvWrite::decode(&bytes).unwrap();
        assert_eq!(old.first_attempt_at_ms, None);
        assert_eq!(old.provisioning_started_ms(), 42);

        let mut v2 = entry();
        v2.version = QUEUE_ENTRY_VERSION;
        v2.first_attempt_at_ms = Some(40);
        let back = QueuedPvWrite::decode(&v2.encode()).unwrap();
        assert_eq!(back, v2);
        assert_eq!(back.provisioning_started_ms(), 40);
        // The HMAC input changes with the first attempt: it is authenticated.
        let mut other = v2.clone();
        other.first_attempt_at_ms = Some(1);
        assert_ne!(other.canonical_bytes(), v2.canonical_bytes());
        // A first attempt after the enqueue (clock step) is capped at the enqueue.
        other.first_attempt_at_ms = Some(99);
        assert_eq!(other.provisioning_started_ms(), 42);

        let mut v = serde_json::to_value(&v2).unwrap();
        v["version"] = 3.into();
        assert!(matches!(
            QueuedPvWrite::decode(&serde_json::to_vec(&v).unwrap()),
            Err(DecodeError::UnknownVersion { found: 3 })
        ));
    }

    #[test]
    fn round_trips() {
        let e = entry();
        assert_eq!(QueuedPvWrite::decode(&e.encode()).unwrap(), e);
        assert_eq!(e.pv_name(), "pvc-1");
    }

    #[test]
    fn version_1_intents_are_still_read_and_version_2_round_trips() {
        let v1 = br#"{"version":1,"claim":{"namespace":"ns","name":"c","uid":"1"},"pv_name":"pvc-1","class":"fast","recorded_at_ms":5}"#;
        let old = ProvisionIntent::decode(v1).unwrap();
        assert_eq!(old.version, 1);
        assert_eq!(old.class, "fast");
        assert_eq!(old.storage_class, None);
        assert_eq!(old.selected_node, None);

        let mut new = old.clone();
        new.version = INTENT_VERSION;
        new.storage_class = Some(StorageClass {
            provisioner: "example.com/hostpath".into(),
            reclaim_policy: Some("Retain".into()),
            ..Default::default()
        });
        new.selected_node = Some("node-a".into());
        assert_eq!(ProvisionIntent::decode(&new.encode()).unwrap(), new);

        let mut v = serde_json::to_value(&new).unwrap();
        v["version"] = 3.into();
        assert!(matches!(
            ProvisionIntent::decode(&serde_json::to_vec(&v).unwrap()),
            Err(DecodeError::UnknownVersion { found: 3 })
        ));
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
