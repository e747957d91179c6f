//! Authenticity of PV-write queue entries: an HMAC-SHA256 keyed with a secret only
//! provision-svc ([`QueueKey::sign`]) and pv-writer ([`QueueKey::verify`]) hold, over
//! a domain tag, the provisioner name and [`QueuedPvWrite::canonical_bytes`].
//! Details: docs/decisions/0004-redis-connection-signing-intents.md.

use std::path::{Path, PathBuf};

use api_types::queue::QueuedPvWrite;
use clap::Args;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Domain-separation prefix of the MAC input.
const DOMAIN: &[u8] = b"split-provisioner pv-queue v1\0";

/// Shortest accepted key, in bytes.
pub const MIN_KEY_BYTES: usize = 32;

/// Flags selecting the queue key (shared by provision-svc and pv-writer).
#[derive(Debug, Clone, Default, Args)]
pub struct QueueKeyArgs {
    /// File holding the HMAC key (at least 32 bytes; a trailing newline ignored)
    /// that provision-svc signs PV-write queue entries with and pv-writer checks.
    /// Required unless `--insecure-unsigned-queue`.
    #[arg(long, env)]
    pub queue_hmac_key_file: Option<PathBuf>,

    /// File holding the previous queue key during a key rotation: entries signed
    /// with it are still accepted, new ones are signed with the current key. A
    /// missing file means no rotation is under way.
    #[arg(long, env)]
    pub queue_hmac_previous_key_file: Option<PathBuf>,

    /// Development only: run without a queue key. provision-svc enqueues unsigned
    /// entries and pv-writer accepts them, so anyone able to write to Redis can
    /// have PVs created. Ignored when a key file is given.
    #[arg(long, env, default_value_t = false)]
    pub insecure_unsigned_queue: bool,
}

impl QueueKeyArgs {
    /// The key to use: `Some` from the key file, `None` when running unsigned on purpose. Errors:
    /// no key file and no `--insecure-unsigned-queue`; an unreadable or too short key file
    /// ([`KeyError`]).
    pub fn load(&self) -> Result<Option<QueueKey>, KeyError> {
        let Some(path) = &self.queue_hmac_key_file else {
            if !self.insecure_unsigned_queue {
                return Err(KeyError::Missing);
            }
            tracing::warn!(
                flag = "--insecure-unsigned-queue",
                at_risk = "anyone who can write to Redis can have PVs created",
                "PV-write queue entries are not authenticated"
            );
            return Ok(None);
        };
        let key = QueueKey::load(path)?;
        let previous = self.queue_hmac_previous_key_file.as_ref();
        let Some(prev) = previous.filter(|p| p.exists()) else {
            return Ok(Some(key));
        };
        let previous = QueueKey::load(prev)?;
        tracing::info!(file = %prev.display(), "accepting entries signed with the previous queue key");
        Ok(Some(QueueKey {
            previous: Some(previous.key),
            ..key
        }))
    }
}

/// Why a queue key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Neither a key file nor the insecure flag.
    #[error("no queue HMAC key: set --queue-hmac-key-file (QUEUE_HMAC_KEY_FILE), or --insecure-unsigned-queue for development only")]
    Missing,
    /// The key file cannot be read.
    #[error("reading queue HMAC key file {path}: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// The key is shorter than [`MIN_KEY_BYTES`].
    #[error("queue HMAC key is {len} bytes; at least {MIN_KEY_BYTES} are required")]
    TooShort {
        /// Its length in bytes (after dropping a trailing newline).
        len: usize,
    },
}

/// Why an entry failed [`QueueKey::verify`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    /// The entry has no `mac`.
    #[error("queue entry is not signed")]
    Unsigned,
    /// The `mac` is not hex, or does not match.
    #[error("queue entry signature does not match (forged or altered entry, or another key)")]
    BadMac,
}

impl AuthError {
    /// Metric label (`pv_writer_refused_entries_total{reason}`).
    pub fn label(&self) -> &'static str {
        match self {
            AuthError::Unsigned => "unsigned",
            AuthError::BadMac => "bad_signature",
        }
    }
}

/// The queue HMAC key, and during a rotation the previous one (accepted by
/// [`verify`](QueueKey::verify), never used to sign). Its `Debug` never shows a key.
#[derive(Clone)]
pub struct QueueKey {
    key: Vec<u8>,
    previous: Option<Vec<u8>>,
}

impl std::fmt::Debug for QueueKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "QueueKey({} bytes", self.key.len())?;
        if let Some(p) = &self.previous {
            write!(f, ", previous {} bytes", p.len())?;
        }
        f.write_str(")")
    }
}

impl QueueKey {
    /// A key from raw bytes (one trailing `\n` or `\r\n` dropped).
    ///
    /// Errors: [`KeyError::TooShort`].
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, KeyError> {
        let trimmed = bytes
            .strip_suffix(b"\n")
            .map(|b| b.strip_suffix(b"\r").unwrap_or(b))
            .unwrap_or(bytes);
        if trimmed.len() < MIN_KEY_BYTES {
            return Err(KeyError::TooShort { len: trimmed.len() });
        }
        Ok(QueueKey {
            key: trimmed.to_vec(),
            previous: None,
        })
    }

    /// Read the key from `path`.
    ///
    /// Errors: [`KeyError::Read`], [`KeyError::TooShort`].
    pub fn load(path: &Path) -> Result<Self, KeyError> {
        let bytes = std::fs::read(path).map_err(|source| KeyError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Self::from_bytes(&bytes)
    }

    fn mac(key: &[u8], provisioner_name: &str, entry: &QueuedPvWrite) -> HmacSha256 {
        let mut mac = HmacSha256::new_from_slice(key).expect("HMAC takes any key length");
        mac.update(DOMAIN);
        mac.update(provisioner_name.as_bytes());
        mac.update(b"\0");
        mac.update(&entry.canonical_bytes());
        mac
    }

    /// Set `entry.mac` for the queue of `provisioner_name`.
    pub fn sign(&self, provisioner_name: &str, entry: &mut QueuedPvWrite) {
        entry.mac = None;
        let tag = Self::mac(&self.key, provisioner_name, entry)
            .finalize()
            .into_bytes();
        entry.mac = Some(hex::encode(tag));
    }

    /// Check `entry.mac` for the queue of `provisioner_name` against the current key, then the
    /// previous one; each comparison in constant time. Errors: [`AuthError::Unsigned`],
    /// [`AuthError::BadMac`].
    pub fn verify(&self, provisioner_name: &str, entry: &QueuedPvWrite) -> Result<(), AuthError> {
        let given = entry.mac.as_deref().ok_or(AuthError::Unsigned)?;
        let given = hex::decode(given).map_err(|_| AuthError::BadMac)?;
        std::iter::once(&self.key)
            .chain(&self.previous)
            .any(|key| {
                Self::mac(key, provisioner_name, entry)
                    .verify_slice(&given)
                    .is_ok()
            })
            .then_some(())
            .ok_or(AuthError::BadMac)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::queue::{ClaimKey, SCHEMA_VERSION};

    fn entry() -> QueuedPvWrite {
        QueuedPvWrite {
            version: SCHEMA_VERSION,
            pv: Default::default(),
            claim: ClaimKey {
                namespace: "ns".into(),
                name: "c".into(),
                uid: "u".into(),
            },
            class: "fast".into(),
            enqueued_at_ms: 1,
            first_attempt_at_ms: None,
            mac: None,
        }
    }

    fn key(byte: u8) -> QueueKey {
        QueueKey::from_bytes(&[byte; 32]).unwrap()
    }

    #[test]
    fn signed_entries_verify_and_any_change_breaks_them() {
        let mut e = entry();
        key(1).sign("p", &mut e);
        assert_eq!(e.mac.as_ref().unwrap().len(), 64);
        key(1).verify("p", &e).unwrap();
        // Survives the stored round trip.
        let stored = QueuedPvWrite::decode(&e.encode()).unwrap();
        key(1).verify("p", &stored).unwrap();

        assert_eq!(key(2).verify("p", &e), Err(AuthError::BadMac));
        assert_eq!(key(1).verify("other", &e), Err(AuthError::BadMac));
        let mut altered = e.clone();
        altered.claim.uid = "v".into();
        assert_eq!(key(1).verify("p", &altered), Err(AuthError::BadMac));
        let mut garbled = e.clone();
        garbled.mac = Some("zz".into());
        assert_eq!(key(1).verify("p", &garbled), Err(AuthError::BadMac));
        assert_eq!(key(1).verify("p", &entry()), Err(AuthError::Unsigned));
    }

    #[test]
    fn a_rotation_signs_with_the_current_key_and_accepts_the_previous() {
        let rotated = QueueKey {
            previous: Some(key(1).key),
            ..key(2)
        };
        let mut before = entry();
        key(1).sign("p", &mut before);
        rotated.verify("p", &before).unwrap();
        let mut after = entry();
        rotated.sign("p", &mut after);
        key(2).verify("p", &after).unwrap();
        assert_eq!(key(1).verify("p", &after), Err(AuthError::BadMac));
        let mut stranger = entry();
        key(3).sign("p", &mut stranger);
        assert_eq!(rotated.verify("p", &stranger), Err(AuthError::BadMac));
        assert_eq!(
            format!("{rotated:?}"),
            "QueueKey(32 bytes, previous 32 bytes)"
        );

        // From the flags: the previous key file is optional and may be absent.
        let dir = tempfile::tempdir().unwrap();
        let (current, previous) = (dir.path().join("hmac-key"), dir.path().join("prev"));
        std::fs::write(&current, [2u8; 32]).unwrap();
        let args = QueueKeyArgs {
            queue_hmac_key_file: Some(current),
            queue_hmac_previous_key_file: Some(previous.clone()),
            insecure_unsigned_queue: false,
        };
        let loaded = args.load().unwrap().unwrap();
        assert_eq!(loaded.verify("p", &before), Err(AuthError::BadMac));
        std::fs::write(&previous, [1u8; 32]).unwrap();
        args.load().unwrap().unwrap().verify("p", &before).unwrap();
        std::fs::write(&previous, b"short").unwrap();
        assert!(matches!(args.load(), Err(KeyError::TooShort { len: 5 })));
    }

    #[test]
    fn keys_must_be_long_enough_and_are_not_printed() {
        assert!(matches!(
            QueueKey::from_bytes(b"short\n"),
            Err(KeyError::TooShort { len: 5 })
        ));
        let mut line = vec![b'k'; 32];
        line.push(b'\n');
        let with_newline = QueueKey::from_bytes(&line).unwrap();
        let mut e = entry();
        with_newline.sign("p", &mut e);
        key(b'k').verify("p", &e).unwrap();
        assert_eq!(format!("{with_newline:?}"), "QueueKey(32 bytes)");

        let dir = tempfile::tempdir().unwrap();
        let missing = QueueKeyArgs {
            queue_hmac_key_file: None,
            queue_hmac_previous_key_file: None,
            insecure_unsigned_queue: false,
        };
        assert!(matches!(missing.load(), Err(KeyError::Missing)));
        let insecure = QueueKeyArgs {
            queue_hmac_key_file: None,
            queue_hmac_previous_key_file: None,
            insecure_unsigned_queue: true,
        };
        assert!(insecure.load().unwrap().is_none());
        let path = dir.path().join("key");
        std::fs::write(&path, [7u8; 40]).unwrap();
        let args = QueueKeyArgs {
            queue_hmac_key_file: Some(path.clone()),
            queue_hmac_previous_key_file: None,
            insecure_unsigned_queue: true,
        };
        assert!(args.load().unwrap().is_some());
        let args = QueueKeyArgs {
            queue_hmac_key_file: Some(dir.path().join("nope")),
            queue_hmac_previous_key_file: None,
            insecure_unsigned_queue: false,
        };
        assert!(matches!(args.load(), Err(KeyError::Read { .. })));
    }
}
