//! Durable provisioning intents in Redis: before a backend's `provision`,
//! provision-svc records a [`ProvisionIntent`] and a claim snapshot
//! ([`IntentClaim`]); both go when the PV is queued (in the enqueue script) or the
//! outcome is final. Details: docs/decisions/0004-redis-connection-signing-intents.md.

use std::collections::HashMap;

use crate::handoff::redis_conn::RedisConn;
pub use api_types::queue::IntentClaim;
use api_types::queue::{DecodeError, ProvisionIntent, SCHEMA_VERSION};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use redis::AsyncCommands;

use crate::handoff::queue::{Key, Keys, CLEAR_INTENT, RECORD_INTENT};
use crate::handoff::redis_store;

/// Failure of an [`IntentStore`] operation.
#[derive(Debug, thiserror::Error)]
pub enum IntentError {
    /// Redis unreachable or the command failed; callers retry.
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    /// No connection (configuration, credentials, TLS, unreachable).
    #[error(transparent)]
    Connect(#[from] redis_store::ConnectError),
    /// A stored record could not be decoded (garbled, or from a newer release).
    #[error("provisioning intent record of PV {pv_name:?}: {source}")]
    Decode {
        /// The hash field (PV name) of the bad record.
        pv_name: String,
        /// Why it could not be read.
        source: DecodeError,
    },
}

/// One recorded intent with its claim snapshot, as [`IntentStore::list_with_claims`] returns it.
#[derive(Debug, Clone, PartialEq)]
pub struct IntentEntry {
    /// The intent.
    pub intent: ProvisionIntent,
    /// The claim snapshot, `None` when it is missing or unreadable (logged).
    pub claim: Option<IntentClaim>,
}

/// Durable provisioning intents of one provisioner; cheap to clone. Every method
/// fails with [`IntentError::Redis`] when a Redis command fails.
#[derive(Clone)]
pub struct IntentStore {
    conn: RedisConn,
    keys: Keys,
}

impl IntentStore {
    /// Connect as `redis` describes (a URL, or a [`RedisConfig`](redis_store::RedisConfig) with
    /// credentials and TLS) for the intents of `provisioner_name`. Errors: [`IntentError::Connect`]
    /// naming the cause (configuration, credentials, TLS, unreachable).
    pub async fn connect(
        redis: impl Into<redis_store::RedisConfig>,
        provisioner_name: &str,
    ) -> Result<Self, IntentError> {
        let conn = redis_store::connect(redis).await?;
        Ok(Self::with_connection(conn, provisioner_name))
    }

    /// A store over an existing connection.
    pub fn with_connection(conn: RedisConn, provisioner_name: &str) -> Self {
        let keys = Keys::new(provisioner_name);
        Self { conn, keys }
    }

    /// The store's Redis connection (shared, e.g. with the [`DataMarker`](super::data_marker::DataMarker)).
    pub fn connection(&self) -> RedisConn {
        self.conn.clone()
    }

    /// Record `intent` together with a snapshot of `claim` and whether it is
    /// provisioning in background, atomically. Returns true when no intent
    /// existed for that PV before.
    pub async fn record_with_claim(
        &self,
        intent: &ProvisionIntent,
        claim: &PersistentVolumeClaim,
        in_background: bool,
    ) -> Result<bool, IntentError> {
        let snapshot = IntentClaim {
            version: SCHEMA_VERSION,
            in_background,
            claim: claim.clone(),
        };
        let args = (&intent.pv_name, intent.encode(), snapshot.encode());
        let added: i64 = RECORD_INTENT
            .invoke(&mut self.conn.clone(), &self.keys, args)
            .await?;
        Ok(added == 1)
    }

    /// Remove the intent and claim snapshot of `pv_name`. Returns true when an
    /// intent was removed. Clearing an absent intent succeeds.
    pub async fn clear(&self, pv_name: &str) -> Result<bool, IntentError> {
        let removed: i64 = CLEAR_INTENT
            .invoke(&mut self.conn.clone(), &self.keys, pv_name)
            .await?;
        Ok(removed == 1)
    }

    /// Whether an intent is recorded for `pv_name` (readable or not — a garbled
    /// record still protects its asset from the orphan sweep).
    pub async fn contains(&self, pv_name: &str) -> Result<bool, IntentError> {
        let mut conn = self.conn.clone();
        Ok(conn.hexists(self.keys.get(Key::Intents), pv_name).await?)
    }

    /// Number of recorded intents (readable or not).
    pub async fn count(&self) -> Result<usize, IntentError> {
        let mut conn = self.conn.clone();
        Ok(conn.hlen(self.keys.get(Key::Intents)).await?)
    }

    /// All readable intents with their claim snapshots, sorted by PV name.
    /// Unreadable intents are logged and skipped (they stay stored; [`contains`](Self::contains)
    /// still sees them); an unreadable snapshot is logged and reported as `None`.
    pub async fn list_with_claims(&self) -> Result<Vec<IntentEntry>, IntentError> {
        let (intents, mut claims): (HashMap<String, Vec<u8>>, HashMap<String, Vec<u8>>) =
            redis::pipe()
                .hgetall(self.keys.get(Key::Intents))
                .hgetall(self.keys.get(Key::IntentClaims))
                .query_async(&mut self.conn.clone())
                .await?;
        let mut out: Vec<IntentEntry> = intents
            .into_iter()
            .filter_map(|(pv_name, bytes)| {
                let intent = decode_logged(&pv_name, &bytes, ProvisionIntent::decode)?;
                let claim = claims.remove(&pv_name);
                let claim = claim.and_then(|b| decode_logged(&pv_name, &b, IntentClaim::decode));
                Some(IntentEntry { intent, claim })
            })
            .collect();
        out.sort_by(|a, b| a.intent.pv_name.cmp(&b.intent.pv_name));
        Ok(out)
    }

    /// The intent of `pv_name` with its claim snapshot (an unreadable snapshot is
    /// logged and `None`); `None` without an intent. Errors: Redis, or
    /// [`IntentError::Decode`] for an unreadable intent.
    pub async fn entry(&self, pv_name: &str) -> Result<Option<IntentEntry>, IntentError> {
        let (intent, claim): (Option<Vec<u8>>, Option<Vec<u8>>) = redis::pipe()
            .hget(self.keys.get(Key::Intents), pv_name)
            .hget(self.keys.get(Key::IntentClaims), pv_name)
            .query_async(&mut self.conn.clone())
            .await?;
        let Some(bytes) = intent else {
            return Ok(None);
        };
        let intent = ProvisionIntent::decode(&bytes).map_err(|source| IntentError::Decode {
            pv_name: pv_name.to_string(),
            source,
        })?;
        let claim = claim.and_then(|bytes| decode_logged(pv_name, &bytes, IntentClaim::decode));
        Ok(Some(IntentEntry { intent, claim }))
    }
}

fn decode_logged<T>(
    pv_name: &str,
    bytes: &[u8],
    decode: fn(&[u8]) -> Result<T, DecodeError>,
) -> Option<T> {
    match decode(bytes) {
        Ok(v) => Some(v),
        Err(err) => {
            tracing::error!(pv = pv_name, error = %err, "skipping unreadable provisioning intent record");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use api_types::queue::ClaimKey;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use crate::handoff::test_redis::TestRedis;

    async fn start_redis() -> TestRedis {
        TestRedis::start().await
    }

    /// The intents `store` lists, without their claims.
    async fn intents_of(store: &IntentStore) -> Vec<ProvisionIntent> {
        let entries = store.list_with_claims().await.unwrap();
        entries.into_iter().map(|e| e.intent).collect()
    }

    fn intent(uid: &str) -> ProvisionIntent {
        ProvisionIntent {
            version: SCHEMA_VERSION,
            claim: ClaimKey {
                namespace: "ns".into(),
                name: format!("claim-{uid}"),
                uid: uid.into(),
            },
            pv_name: format!("pvc-{uid}"),
            class: "fast".into(),
            recorded_at_ms: 7,
            storage_class: None,
            selected_node: None,
        }
    }

    fn claim(uid: &str) -> PersistentVolumeClaim {
        PersistentVolumeClaim {
            metadata: ObjectMeta {
                namespace: Some("ns".into()),
                name: Some(format!("claim-{uid}")),
                uid: Some(uid.into()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn record_list_contains_clear_round_trip() {
        let redis = start_redis().await;
        let store = IntentStore::connect(&redis.url(), "example.com/hostpath")
            .await
            .unwrap();
        let other = IntentStore::connect(&redis.url(), "other.io/x")
            .await
            .unwrap();

        assert!(store
            .record_with_claim(&intent("b"), &claim("b"), false)
            .await
            .unwrap());
        assert!(store
            .record_with_claim(&intent("a"), &claim("a"), true)
            .await
            .unwrap());
        assert!(
            !store
                .record_with_claim(&intent("a"), &claim("a"), false)
                .await
                .unwrap(),
            "second record of one PV replaces, is not new"
        );
        assert_eq!(intents_of(&store).await, vec![intent("a"), intent("b")]);
        assert_eq!(store.count().await.unwrap(), 2);
        assert!(store.contains("pvc-a").await.unwrap());
        assert!(!store.contains("pvc-z").await.unwrap());
        assert!(intents_of(&other).await.is_empty(), "per-provisioner keys");

        let entries = store.list_with_claims().await.unwrap();
        assert_eq!(entries.len(), 2);
        assert_eq!(
            entries[0].claim,
            Some(IntentClaim {
                version: SCHEMA_VERSION,
                in_background: false,
                claim: claim("a")
            })
        );
        assert_eq!(entries[1].claim.as_ref().unwrap().claim, claim("b"));
        assert_eq!(
            store
                .entry("pvc-a")
                .await
                .unwrap()
                .unwrap()
                .claim
                .unwrap()
                .claim,
            claim("a")
        );
        let b = store.entry("pvc-b").await.unwrap().unwrap();
        assert_eq!(
            (b.intent, b.claim.unwrap().claim),
            (intent("b"), claim("b"))
        );

        assert!(store.clear("pvc-a").await.unwrap());
        assert!(!store.clear("pvc-a").await.unwrap());
        assert_eq!(store.entry("pvc-a").await.unwrap(), None);
        assert_eq!(intents_of(&store).await, vec![intent("b")]);
    }

    #[tokio::test]
    async fn garbled_records_are_skipped_but_still_contained() {
        let redis = start_redis().await;
        let store = IntentStore::connect(&redis.url(), "p").await.unwrap();
        store
            .record_with_claim(&intent("ok"), &claim("ok"), false)
            .await
            .unwrap();
        let mut conn = redis_store::connect(&redis.url()).await.unwrap();
        let _: () = conn
            .hset("provisioner:{p}:provision-intents", "pvc-bad", "{oops")
            .await
            .unwrap();
        let _: () = conn
            .hset(
                "provisioner:{p}:provision-intent-claims",
                "pvc-ok",
                r#"{"version":9}"#,
            )
            .await
            .unwrap();
        assert_eq!(intents_of(&store).await, vec![intent("ok")]);
        assert!(store.contains("pvc-bad").await.unwrap());
        assert_eq!(store.count().await.unwrap(), 2);
        let entries = store.list_with_claims().await.unwrap();
        assert_eq!(entries.len(), 1);
        assert_eq!(entries[0].claim, None);
        let ok = store.entry("pvc-ok").await.unwrap().unwrap();
        assert_eq!((ok.intent, ok.claim), (intent("ok"), None));
        assert!(matches!(
            store.entry("pvc-bad").await,
            Err(IntentError::Decode {
                source: DecodeError::Garbled(_),
                ..
            })
        ));
    }
}
