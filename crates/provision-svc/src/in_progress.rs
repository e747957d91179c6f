//! The in-memory bookkeeping of one leader term's claims: the seed's
//! `claimsInProgress` ([`InBackground`]) and the in-flight gauge guard
//! ([`InFlight`]).

use std::collections::HashMap;
use std::sync::Mutex;

use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use prometheus::IntGauge;

/// Seed `claimsInProgress`: claim uid → claim snapshot, for the claims whose
/// provisioning went on in background (the backend may still be making the
/// volume). Kept in the `provision_svc_claims_in_background` gauge.
pub struct InBackground {
    claims: Mutex<HashMap<String, PersistentVolumeClaim>>,
    gauge: IntGauge,
}

impl InBackground {
    /// An empty set reported in `gauge`.
    pub fn new(gauge: IntGauge) -> Self {
        Self {
            claims: Mutex::default(),
            gauge,
        }
    }

    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, PersistentVolumeClaim>> {
        self.claims.lock().expect("in-background poisoned")
    }

    /// Remember `claim` (by its uid) as provisioning in background.
    pub fn insert(&self, uid: &str, claim: &PersistentVolumeClaim) {
        let mut map = self.map();
        map.insert(uid.to_string(), claim.clone());
        self.gauge.set(map.len() as i64);
    }

    /// Forget `uid`; whether it was there.
    pub fn remove(&self, uid: &str) -> bool {
        let mut map = self.map();
        let was = map.remove(uid).is_some();
        self.gauge.set(map.len() as i64);
        was
    }

    /// Whether `uid` is provisioning in background.
    pub fn contains(&self, uid: &str) -> bool {
        self.map().contains_key(uid)
    }

    /// The snapshot of `uid`'s claim, if in background.
    pub fn get(&self, uid: &str) -> Option<PersistentVolumeClaim> {
        self.map().get(uid).cloned()
    }

    /// Uids of the claims in background, for the resync.
    pub fn uids(&self) -> Vec<String> {
        self.map().keys().cloned().collect()
    }
}

/// Counts one provision operation in `provision_svc_operations_in_flight` for
/// as long as it lives: the gauge goes down on drop, so an operation cancelled
/// by `--provision-timeout` (its future dropped mid-await) is not left counted.
pub struct InFlight(prometheus::IntGauge);

impl InFlight {
    /// Count one operation in `gauge` until dropped.
    pub fn start(gauge: &prometheus::IntGauge) -> Self {
        gauge.inc();
        Self(gauge.clone())
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        self.0.dec();
    }
}
