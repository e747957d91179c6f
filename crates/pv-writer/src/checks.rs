//! What pv-writer checks before it writes a queued PV: the entry must be one
//! provision-svc could have produced (else anyone able to write to Redis could
//! have an arbitrary PV created). In order, the first failure refuses it:
//! 1. the HMAC verifies with the queue key — `unsigned`, `bad_signature`;
//! 2. the PV name is the entry's queue key — `name_mismatch`;
//! 3. the PV name is `pvc-<claim uid>` — `pv_name`;
//! 4. `spec.claimRef` names the entry's claim (namespace, name, uid) — `claim_ref`;
//! 5. `pv.kubernetes.io/provisioned-by` is one of our names — `provisioned_by`;
//! 6. the backend's `validate_volume` accepts the volume source — `volume_source`.

use std::sync::Arc;

use api_types::annotations::{pv_name_for_claim_uid, ANN_DYNAMICALLY_PROVISIONED};
use api_types::queue::QueuedPvWrite;
use common::handoff::queue_auth::QueueKey;
use k8s_openapi::api::core::v1::ObjectReference;
use provisioner_api::Provisioner;

/// Why an entry was refused: `kind` is the metric label, `reason` the sentence
/// for the dead letter, the log and the event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    /// `unsigned`, `bad_signature`, `name_mismatch`, `pv_name`, `claim_ref`,
    /// `provisioned_by` or `volume_source`.
    pub kind: &'static str,
    /// Human-readable reason.
    pub reason: String,
}

impl Refusal {
    pub(crate) fn new(kind: &'static str, reason: String) -> Self {
        Refusal { kind, reason }
    }
}

/// The checks of one pv-writer: provisioner names, queue key and backend.
#[derive(Clone)]
pub struct EntryChecks {
    provisioner_names: Vec<String>,
    key: Option<QueueKey>,
    backend: Arc<dyn Provisioner>,
}

impl EntryChecks {
    /// Checks for the queue of `provisioner_names[0]` (the MAC's binding), any of
    /// them accepted as provisioned-by; `key: None` skips the MAC check. Panics:
    /// `provisioner_names` is empty.
    pub fn new(
        provisioner_names: Vec<String>,
        key: Option<QueueKey>,
        backend: Arc<dyn Provisioner>,
    ) -> Self {
        assert!(!provisioner_names.is_empty(), "a provisioner name");
        EntryChecks {
            provisioner_names,
            key,
            backend,
        }
    }

    /// Check `entry`, taken from the queue under the key `queue_key` (its PV name).
    ///
    /// Errors: the first failed check, see the module docs.
    pub fn check(&self, queue_key: &str, entry: &QueuedPvWrite) -> Result<(), Refusal> {
        if let Some(key) = &self.key {
            key.verify(&self.provisioner_names[0], entry).map_err(|e| {
                Refusal::new(e.label(), format!("queue entry {queue_key} refused: {e}"))
            })?;
        }
        let name = entry.pv_name();
        require(name == queue_key, "name_mismatch", || {
            format!("queue entry {queue_key} holds a PV named {name:?}")
        })?;
        let expected = pv_name_for_claim_uid(&entry.claim.uid);
        require(name == expected, "pv_name", || {
            let claim = &entry.claim;
            format!("PV {name} is not named after its claim {claim} (expected {expected})")
        })?;
        let claim_ref = entry.pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let matches = claim_ref.is_some_and(|r| {
            r.namespace.as_deref() == Some(entry.claim.namespace.as_str())
                && r.name.as_deref() == Some(entry.claim.name.as_str())
                && r.uid.as_deref() == Some(entry.claim.uid.as_str())
                && r.kind.as_deref().unwrap_or("PersistentVolumeClaim") == "PersistentVolumeClaim"
        });
        require(matches, "claim_ref", || {
            let got = claim_ref.map_or("none".to_string(), |r| {
                format!("{} {}", r.kind.as_deref().unwrap_or("?"), describe(r))
            });
            let (claim, uid) = (&entry.claim, &entry.claim.uid);
            format!("PV {name} has claimRef {got}, not its claim {claim} (uid {uid})")
        })?;
        let annotations = entry.pv.metadata.annotations.as_ref();
        let provisioned_by = annotations.and_then(|a| a.get(ANN_DYNAMICALLY_PROVISIONED));
        let ours = provisioned_by.is_some_and(|p| self.provisioner_names.contains(p));
        require(ours, "provisioned_by", || {
            format!(
                "PV {name} has {ANN_DYNAMICALLY_PROVISIONED}={provisioned_by:?}, not this provisioner ({})",
                self.provisioner_names.join(", ")
            )
        })?;
        self.backend
            .validate_volume(&entry.pv)
            .map_err(|e| Refusal::new("volume_source", format!("{e}; refusing to write it")))
    }
}

/// Unless `ok`, a refusal under `kind`: "`what`; refusing to write it".
fn require(ok: bool, kind: &'static str, what: impl FnOnce() -> String) -> Result<(), Refusal> {
    ok.then_some(())
        .ok_or_else(|| Refusal::new(kind, format!("{}; refusing to write it", what())))
}

/// `namespace/name (uid …)` of a claim reference.
pub(crate) fn describe(r: &ObjectReference) -> String {
    let (namespace, name) = (r.namespace.as_deref(), r.name.as_deref());
    format!(
        "{}/{} (uid {})",
        namespace.unwrap_or(""),
        name.unwrap_or(""),
        r.uid.as_deref().unwrap_or("none")
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::queue::{ClaimKey, SCHEMA_VERSION};
    use backend_hostpath::{base_dirs::BaseDirs, HostPath, OnDelete};
    use serde_json::json;

    const P: &str = "example.com/hostpath";

    fn backend() -> Arc<dyn Provisioner> {
        Arc::new(BaseDirs(vec![HostPath {
            base_dir: "/var/lib/hp".into(),
            node_name: None,
            on_delete: OnDelete::Retain,
            capacity: None,
        }]))
    }

    fn key() -> QueueKey {
        QueueKey::from_bytes(&[9u8; 32]).unwrap()
    }

    fn entry(uid: &str) -> QueuedPvWrite {
        let name = format!("pvc-{uid}");
        QueuedPvWrite {
            version: SCHEMA_VERSION,
            pv: serde_json::from_value(json!({
                "metadata": {"name": name, "annotations": {ANN_DYNAMICALLY_PROVISIONED: P}},
                "spec": {
                    "hostPath": {"path": format!("/var/lib/hp/{name}"), "type": "DirectoryOrCreate"},
                    "claimRef": {"apiVersion": "v1", "kind": "PersistentVolumeClaim", "namespace": "ns", "name": "data", "uid": uid},
                }
            }))
            .unwrap(),
            claim: ClaimKey {
                namespace: "ns".into(),
                name: "data".into(),
                uid: uid.into(),
            },
            class: "fast".into(),
            enqueued_at_ms: 1,
            first_attempt_at_ms: None,
            mac: None,
        }
    }

    fn checks() -> EntryChecks {
        EntryChecks::new(
            vec![P.into(), "other.io/extra".into()],
            Some(key()),
            backend(),
        )
    }

    /// `edit` applied to a valid entry, then signed with the real key: only the
    /// structural check under test can refuse it.
    fn refusal(edit: impl Fn(&mut QueuedPvWrite)) -> Refusal {
        let mut e = entry("u1");
        edit(&mut e);
        key().sign(P, &mut e);
        checks().check("pvc-u1", &e).unwrap_err()
    }

    #[test]
    fn a_signed_entry_as_provision_svc_makes_it_passes() {
        let mut e = entry("u1");
        key().sign(P, &mut e);
        checks().check("pvc-u1", &e).unwrap();
        // The additional provisioner name is accepted in the annotation.
        let mut e = entry("u1");
        e.pv.metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_DYNAMICALLY_PROVISIONED.into(), "other.io/extra".into());
        key().sign(P, &mut e);
        checks().check("pvc-u1", &e).unwrap();
        // Without a key (insecure dev flag) an unsigned entry passes the rest.
        EntryChecks::new(vec![P.into()], None, backend())
            .check("pvc-u1", &entry("u1"))
            .unwrap();
    }

    #[test]
    fn unsigned_forged_and_altered_entries_are_refused() {
        assert_eq!(
            checks().check("pvc-u1", &entry("u1")).unwrap_err().kind,
            "unsigned"
        );
        let mut forged = entry("u1");
        QueueKey::from_bytes(&[1u8; 32])
            .unwrap()
            .sign(P, &mut forged);
        assert_eq!(
            checks().check("pvc-u1", &forged).unwrap_err().kind,
            "bad_signature"
        );
        let mut altered = entry("u1");
        key().sign(P, &mut altered);
        altered
            .pv
            .spec
            .as_mut()
            .unwrap()
            .host_path
            .as_mut()
            .unwrap()
            .path = "/".into();
        let r = checks().check("pvc-u1", &altered).unwrap_err();
        assert_eq!(r.kind, "bad_signature");
        assert!(r.reason.contains("pvc-u1"), "{}", r.reason);
        // Signed for another provisioner's queue.
        let mut elsewhere = entry("u1");
        key().sign("other.io/extra", &mut elsewhere);
        assert_eq!(
            checks().check("pvc-u1", &elsewhere).unwrap_err().kind,
            "bad_signature"
        );
    }

    #[test]
    fn every_structural_refusal() {
        let mut e = entry("u1");
        key().sign(P, &mut e);
        assert_eq!(
            checks().check("pvc-u2", &e).unwrap_err().kind,
            "name_mismatch"
        );

        let r = refusal(|e| e.claim.uid = "u2".into());
        assert_eq!(r.kind, "pv_name", "{}", r.reason);
        for edit in [
            (|e: &mut QueuedPvWrite| e.claim.namespace = "kube-system".into())
                as fn(&mut QueuedPvWrite),
            |e| e.claim.name = "other".into(),
            |e| e.pv.spec.as_mut().unwrap().claim_ref = None,
            |e| e.pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().uid = Some("u9".into()),
            |e| e.pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().name = Some("x".into()),
            |e| {
                e.pv.spec
                    .as_mut()
                    .unwrap()
                    .claim_ref
                    .as_mut()
                    .unwrap()
                    .namespace = None
            },
            |e| e.pv.spec.as_mut().unwrap().claim_ref.as_mut().unwrap().kind = Some("Pod".into()),
        ] {
            let r = refusal(edit);
            assert_eq!(r.kind, "claim_ref", "{}", r.reason);
        }
        let r = refusal(|e| e.pv.metadata.annotations = None);
        assert_eq!(r.kind, "provisioned_by");
        let r = refusal(|e| {
            e.pv.metadata
                .annotations
                .as_mut()
                .unwrap()
                .insert(ANN_DYNAMICALLY_PROVISIONED.into(), "evil.io/x".into());
        });
        assert_eq!(r.kind, "provisioned_by");
        assert!(r.reason.contains("evil.io/x"), "{}", r.reason);
        let r =
            refusal(|e| e.pv.spec.as_mut().unwrap().host_path.as_mut().unwrap().path = "/".into());
        assert_eq!(r.kind, "volume_source");
        assert!(r.reason.contains("/var/lib/hp/pvc-u1"), "{}", r.reason);
        let r = refusal(|e| e.pv.spec.as_mut().unwrap().host_path = None);
        assert_eq!(r.kind, "volume_source");
    }
}
