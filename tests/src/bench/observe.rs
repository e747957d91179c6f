//! What the benchmark sees happen, timed by its own watches: when each claim
//! was created, annotated by the controller manager, Bound and deleted, and
//! when its PV appeared, was marked `Released` and was deleted. Every map is
//! keyed by claim name (PVs by their `claimRef.name`), so one batch's figures
//! are read with the batch's claim names.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::utils::Backoff;
use kube::runtime::watcher::{self, Event};
use kube::runtime::WatchStreamExt;
use kube::{Api, Client};

/// First-seen instants, by claim name.
#[derive(Default, Debug)]
pub struct Seen {
    /// Claim create request sent (filled by the creator, not the watch).
    pub claim_created: HashMap<String, Instant>,
    /// Claim first seen with the storage-provisioner annotation.
    pub claim_annotated: HashMap<String, Instant>,
    /// Claim first seen in phase `Bound`.
    pub claim_bound: HashMap<String, Instant>,
    /// Claim delete request answered (filled by the deleter).
    pub claim_delete_sent: HashMap<String, Instant>,
    /// Claim gone from the API (watch `Delete`).
    pub claim_gone: HashMap<String, Instant>,
    /// A PV naming the claim in its `claimRef` first seen.
    pub pv_added: HashMap<String, Instant>,
    /// That PV first seen in phase `Released`.
    pub pv_released: HashMap<String, Instant>,
    /// That PV gone from the API.
    pub pv_deleted: HashMap<String, Instant>,
}

/// [`Seen`] shared between the watches and the benchmark.
pub type SharedSeen = Arc<Mutex<Seen>>;

impl Seen {
    /// How many of `names` have an entry in `map`.
    pub fn count(map: &HashMap<String, Instant>, names: &[String]) -> usize {
        names.iter().filter(|n| map.contains_key(*n)).count()
    }

    /// The latest instant in `map` over `names` (`None` if none has one).
    pub fn last(map: &HashMap<String, Instant>, names: &[String]) -> Option<Instant> {
        names.iter().filter_map(|n| map.get(n)).max().copied()
    }

    /// The earliest instant in `map` over `names`.
    pub fn first(map: &HashMap<String, Instant>, names: &[String]) -> Option<Instant> {
        names.iter().filter_map(|n| map.get(n)).min().copied()
    }

    /// Sorted delays `to[name] - from[name]` over `names` present in both.
    pub fn delays(
        from: &HashMap<String, Instant>,
        to: &HashMap<String, Instant>,
        names: &[String],
    ) -> Vec<Duration> {
        let mut d: Vec<Duration> = names
            .iter()
            .filter_map(|n| Some(to.get(n)?.saturating_duration_since(*from.get(n)?)))
            .collect();
        d.sort();
        d
    }
}

/// Backoff of the benchmark's watches: 100 ms doubling to 1 s, reset by the
/// watcher on success, so a watch is back within a second of the API server's
/// return after an outage. (kube-runtime's `ExponentialBackoff` cannot be
/// built without the `backon` crate, and its default backoff waits up to 30 s.)
#[derive(Debug, Clone, Copy)]
struct QuickBackoff(Duration);

const QUICK_BACKOFF_MIN: Duration = Duration::from_millis(100);
const QUICK_BACKOFF_MAX: Duration = Duration::from_secs(1);

impl Iterator for QuickBackoff {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        let d = self.0;
        self.0 = (self.0 * 2).min(QUICK_BACKOFF_MAX);
        Some(d)
    }
}

impl Backoff for QuickBackoff {
    fn reset(&mut self) {
        self.0 = QUICK_BACKOFF_MIN;
    }
}

fn quick_backoff() -> QuickBackoff {
    QuickBackoff(QUICK_BACKOFF_MIN)
}

/// Start the claim watch (namespace `namespace`) and the PV watch (cluster
/// wide) that fill `seen`. They run until the runtime stops.
pub fn spawn_watchers(client: &Client, namespace: &str, seen: SharedSeen) {
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let s = seen.clone();
    tokio::spawn(async move {
        let mut w = watcher::watcher(pvs, Default::default())
            .backoff(quick_backoff())
            .boxed();
        while let Some(ev) = w.next().await {
            let now = Instant::now();
            let (pv, deleted) = match ev {
                Ok(Event::Apply(pv)) | Ok(Event::InitApply(pv)) => (pv, false),
                Ok(Event::Delete(pv)) => (pv, true),
                _ => continue,
            };
            let Some(claim) = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) else {
                continue;
            };
            let Some(name) = claim.name.clone() else {
                continue;
            };
            let mut g = s.lock().unwrap();
            g.pv_added.entry(name.clone()).or_insert(now);
            if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released") {
                g.pv_released.entry(name.clone()).or_insert(now);
            }
            if deleted {
                g.pv_deleted.entry(name).or_insert(now);
            }
        }
    });
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    tokio::spawn(async move {
        let mut w = watcher::watcher(claims, Default::default())
            .backoff(quick_backoff())
            .boxed();
        while let Some(ev) = w.next().await {
            let now = Instant::now();
            let (c, deleted) = match ev {
                Ok(Event::Apply(c)) | Ok(Event::InitApply(c)) => (c, false),
                Ok(Event::Delete(c)) => (c, true),
                _ => continue,
            };
            let name = c.metadata.name.clone().unwrap_or_default();
            let mut g = seen.lock().unwrap();
            if deleted {
                g.claim_gone.entry(name).or_insert(now);
                continue;
            }
            // The storage-provisioner annotation (beta key on v1.19, GA on
            // 1.23+), read as provision-svc reads it.
            if provision_svc::decision::expected_provisioner(&c).is_some() {
                g.claim_annotated.entry(name.clone()).or_insert(now);
            }
            if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                g.claim_bound.entry(name).or_insert(now);
            }
        }
    });
}

/// Wait (checking every 50 ms) until `count(&seen) >= n`; returns the time it took.
///
/// Errors: timeout, naming `what` and the last count.
pub async fn wait_seen(
    seen: &SharedSeen,
    timeout: Duration,
    what: &str,
    n: usize,
    count: impl Fn(&Seen) -> usize,
) -> anyhow::Result<Duration> {
    let start = Instant::now();
    loop {
        let c = count(&seen.lock().unwrap());
        if c >= n {
            return Ok(start.elapsed());
        }
        if start.elapsed() >= timeout {
            anyhow::bail!("timed out after {timeout:?} waiting for {what}: {c} of {n}");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The `p` quantile (0..=1, nearest rank) of sorted `sorted`; zero when empty.
pub fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// `n` per second over `d` (0 when `d` is zero).
pub fn per_sec(n: usize, d: Duration) -> f64 {
    if d.is_zero() {
        0.0
    } else {
        n as f64 / d.as_secs_f64()
    }
}

/// Watchers the API server closed because they did not keep up
/// (`apiserver_terminated_watchers_total`, by resource) since its start,
/// read from its `/metrics`. A watcher that blocks the API server's watch
/// cache delays every other watcher of the same resource (the controller
/// manager's included) until it is closed. `None` when the server does not
/// export the metric (the simulator); `Some(empty)` when none was closed.
///
/// Errors: the request failed.
pub async fn terminated_watchers(client: &Client) -> anyhow::Result<Option<Vec<(String, f64)>>> {
    let req = http::Request::get("/metrics").body(Vec::new())?;
    let text = match client.request_text(req).await {
        Ok(t) => t,
        Err(kube::Error::Api(e)) if e.code == 404 => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    Ok(parse_terminated_watchers(&text))
}

/// The `apiserver_terminated_watchers_total` samples of a Prometheus text
/// exposition, as `(resource, count)`; `None` when the metric is not
/// declared at all (a counter without samples is declared by its `# TYPE`
/// line only).
pub fn parse_terminated_watchers(text: &str) -> Option<Vec<(String, f64)>> {
    if !text.contains("# TYPE apiserver_terminated_watchers_total") {
        return None;
    }
    let samples = text
        .lines()
        .filter(|l| l.starts_with("apiserver_terminated_watchers_total{"))
        .filter_map(|l| {
            let (labels, value) = l.rsplit_once(' ')?;
            let resource = labels
                .split(['{', ',', '}'])
                .find_map(|kv| kv.strip_prefix("resource=\""))?
                .trim_end_matches('"');
            Some((resource.to_string(), value.parse().ok()?))
        })
        .collect();
    Some(samples)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn terminated_watchers_are_read_by_resource() {
        let text = "# HELP apiserver_terminated_watchers_total x\n\
                    # TYPE apiserver_terminated_watchers_total counter\n\
                    apiserver_terminated_watchers_total{resource=\"persistentvolumeclaims\"} 2\n\
                    apiserver_terminated_watchers_total{resource=\"events\"} 1\n\
                    apiserver_watch_events_total{kind=\"Pod\"} 9\n";
        assert_eq!(
            parse_terminated_watchers(text),
            Some(vec![
                ("persistentvolumeclaims".to_string(), 2.0),
                ("events".to_string(), 1.0)
            ])
        );
        let declared_only = "# TYPE apiserver_terminated_watchers_total counter\n";
        assert_eq!(parse_terminated_watchers(declared_only), Some(vec![]));
        assert_eq!(parse_terminated_watchers("up 1\n"), None);
    }
}
