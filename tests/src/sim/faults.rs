//! Fault injection (error answers, hangs, latency, dropped watches) and request counting.

use super::errors::ApiError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// What a matching request gets.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum FaultAction {
    /// Answer with this HTTP code and a `Status` body (500 `InternalError`, 429
    /// `TooManyRequests` with `Retry-After`, 503 `ServiceUnavailable`, 504 `Timeout`, ...).
    Error {
        /// HTTP status code.
        code: u16,
        /// `Retry-After` seconds (429 defaults to 1).
        #[serde(default)]
        retry_after_seconds: Option<u64>,
    },
    /// Hold the request this long (milliseconds), then serve it normally.
    Hang {
        /// Milliseconds.
        ms: u64,
    },
}

/// A fault rule. JSON form (`POST /_sim/faults`):
/// `{"verbs":["create"],"resources":["persistentvolumes"],"action":{"type":"error","code":500},"count":3}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
pub struct FaultSpec {
    /// Verbs to match (`get`, `list`, `watch`, `create`, `update`, `patch`, `delete`,
    /// `deletecollection`); empty = all.
    #[serde(default)]
    pub verbs: Vec<String>,
    /// Resources to match: `persistentvolumes`, `persistentvolumes/status`,
    /// `events.events.k8s.io`, ...; a plain plural matches the resource in any group and
    /// its subresources. Empty = all.
    #[serde(default)]
    pub resources: Vec<String>,
    /// What to do.
    pub action: FaultAction,
    /// Apply to at most this many requests (then the rule is removed).
    #[serde(default)]
    pub count: Option<u64>,
    /// Apply for this long from injection (milliseconds).
    #[serde(default)]
    pub duration_ms: Option<u64>,
}

impl FaultSpec {
    /// Error `code` for `verbs` on `resources` (empty = all), unlimited.
    pub fn error(code: u16, verbs: &[&str], resources: &[&str]) -> Self {
        Self {
            verbs: verbs.iter().map(|s| s.to_string()).collect(),
            resources: resources.iter().map(|s| s.to_string()).collect(),
            action: FaultAction::Error {
                code,
                retry_after_seconds: None,
            },
            count: None,
            duration_ms: None,
        }
    }
    /// Hang `ms` milliseconds for `verbs` on `resources`.
    pub fn hang(ms: u64, verbs: &[&str], resources: &[&str]) -> Self {
        Self {
            action: FaultAction::Hang { ms },
            ..Self::error(0, verbs, resources)
        }
    }
    /// Limit to `n` requests.
    pub fn times(mut self, n: u64) -> Self {
        self.count = Some(n);
        self
    }
    /// Limit to a duration.
    pub fn for_duration(mut self, d: Duration) -> Self {
        self.duration_ms = Some(d.as_millis() as u64);
        self
    }
}

struct Rule {
    id: u64,
    spec: FaultSpec,
    remaining: Option<u64>,
    until: Option<Instant>,
}

/// Request counters. JSON form of `GET /_sim/stats`:
/// `{"total":N,"by_verb":{"create":..},"by_resource":{"persistentvolumes":{"create":..}},"faults_injected":N}`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct Stats {
    /// All counted API requests (discovery and `/_sim` excluded).
    pub total: u64,
    /// Per verb.
    pub by_verb: BTreeMap<String, u64>,
    /// Per resource (`persistentvolumes`, `persistentvolumes/status`,
    /// `events.events.k8s.io`, ...) then verb.
    pub by_resource: BTreeMap<String, BTreeMap<String, u64>>,
    /// Requests answered by a fault rule (error or hang).
    pub faults_injected: u64,
}

impl Stats {
    /// Count for `verb` on `resource`.
    pub fn count(&self, verb: &str, resource: &str) -> u64 {
        self.by_resource
            .get(resource)
            .and_then(|m| m.get(verb))
            .copied()
            .unwrap_or(0)
    }
    /// Count for a verb over all resources.
    pub fn verb(&self, verb: &str) -> u64 {
        self.by_verb.get(verb).copied().unwrap_or(0)
    }
}

/// Fault rules, latency, the watch-drop signal and counters.
pub struct Faults {
    rules: Mutex<(u64, Vec<Rule>)>,
    latency: Mutex<Duration>,
    stats: Mutex<Stats>,
    drop_tx: watch::Sender<u64>,
}

impl Default for Faults {
    fn default() -> Self {
        Self::new()
    }
}

fn matches_resource(pattern: &str, resource: &str, group: &str) -> bool {
    let base = resource.split('/').next().unwrap_or(resource);
    let qualified = if group.is_empty() {
        resource.to_string()
    } else {
        match resource.split_once('/') {
            Some((r, s)) => format!("{r}.{group}/{s}"),
            None => format!("{resource}.{group}"),
        }
    };
    let qbase = qualified.split('/').next().unwrap_or("").to_string();
    pattern == resource || pattern == base || pattern == qualified || pattern == qbase
}

impl Faults {
    /// No faults.
    pub fn new() -> Self {
        Self {
            rules: Mutex::new((0, Vec::new())),
            latency: Mutex::new(Duration::ZERO),
            stats: Mutex::new(Stats::default()),
            drop_tx: watch::channel(0).0,
        }
    }

    /// Add a rule; returns its id.
    pub fn inject(&self, spec: FaultSpec) -> u64 {
        let mut r = self.rules.lock().unwrap();
        r.0 += 1;
        let id = r.0;
        r.1.push(Rule {
            id,
            remaining: spec.count,
            until: spec
                .duration_ms
                .map(|ms| Instant::now() + Duration::from_millis(ms)),
            spec,
        });
        id
    }

    /// Remove one rule.
    pub fn remove(&self, id: u64) {
        self.rules.lock().unwrap().1.retain(|r| r.id != id);
    }

    /// Remove all rules and latency.
    pub fn clear(&self) {
        self.rules.lock().unwrap().1.clear();
        *self.latency.lock().unwrap() = Duration::ZERO;
    }

    /// Active rules.
    pub fn list(&self) -> Vec<(u64, FaultSpec)> {
        let now = Instant::now();
        self.rules
            .lock()
            .unwrap()
            .1
            .iter()
            .filter(|r| r.until.is_none_or(|u| u > now))
            .map(|r| (r.id, r.spec.clone()))
            .collect()
    }

    /// Extra latency added to every API request.
    pub fn set_latency(&self, d: Duration) {
        *self.latency.lock().unwrap() = d;
    }

    /// Current latency.
    pub fn latency(&self) -> Duration {
        *self.latency.lock().unwrap()
    }

    /// Close every open watch connection now.
    pub fn drop_watches(&self) {
        self.drop_tx.send_modify(|v| *v += 1);
    }

    /// Receiver watches use to notice drops.
    pub fn drop_receiver(&self) -> watch::Receiver<u64> {
        self.drop_tx.subscribe()
    }

    /// Find the action for a request (consuming one count of the rule).
    pub fn check(&self, verb: &str, resource: &str, group: &str) -> Option<FaultAction> {
        let now = Instant::now();
        let mut g = self.rules.lock().unwrap();
        g.1.retain(|r| r.until.is_none_or(|u| u > now) && r.remaining != Some(0));
        let rule = g.1.iter_mut().find(|r| {
            (r.spec.verbs.is_empty() || r.spec.verbs.iter().any(|v| v == verb))
                && (r.spec.resources.is_empty()
                    || r.spec
                        .resources
                        .iter()
                        .any(|p| matches_resource(p, resource, group)))
        })?;
        if let Some(n) = rule.remaining.as_mut() {
            *n -= 1;
        }
        let a = rule.spec.action.clone();
        drop(g);
        self.stats.lock().unwrap().faults_injected += 1;
        Some(a)
    }

    /// Count one API request.
    pub fn count(&self, verb: &str, resource: &str) {
        let mut s = self.stats.lock().unwrap();
        s.total += 1;
        *s.by_verb.entry(verb.to_string()).or_default() += 1;
        *s.by_resource
            .entry(resource.to_string())
            .or_default()
            .entry(verb.to_string())
            .or_default() += 1;
    }

    /// Snapshot of the counters.
    pub fn stats(&self) -> Stats {
        self.stats.lock().unwrap().clone()
    }

    /// Zero the counters.
    pub fn reset_stats(&self) {
        *self.stats.lock().unwrap() = Stats::default();
    }
}

/// Error for an injected `Error` action.
pub fn fault_error(code: u16, retry_after: Option<u64>) -> ApiError {
    ApiError::from_code(code, retry_after)
}
