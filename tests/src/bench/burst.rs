//! One provisioning burst and its reclaim, measured through the benchmark's
//! own watches ([`Seen`]): used for the services and for the reference
//! provisioner ([`super::reference`]) alike, so both are timed the same way.

use std::time::Duration;

use kube::Client;

use super::load;
use super::observe::{pct, per_sec, wait_seen, Seen, SharedSeen};

/// Figures of one burst of claims.
#[derive(Debug, Clone)]
pub struct Burst {
    /// Claims in the burst.
    pub claims: usize,
    /// First claim create to last PV seen.
    pub to_pv: Duration,
    /// First claim create to last claim `Bound`.
    pub to_bound: Duration,
    /// Claim created → PV seen, sorted.
    pub latency: Vec<Duration>,
    /// First claim create to last annotation, when every claim was seen
    /// annotated (a PV can appear before the benchmark's watch sees the
    /// annotation event).
    pub to_annotated: Option<Duration>,
    /// Claims seen annotated.
    pub annotated: usize,
    /// Annotation seen → PV seen, sorted.
    pub follow: Vec<Duration>,
}

impl Burst {
    /// PVs created per second.
    pub fn created_per_sec(&self) -> f64 {
        per_sec(self.claims, self.to_pv)
    }

    /// Claims `Bound` per second (first create to last `Bound`).
    pub fn bound_per_sec(&self) -> f64 {
        per_sec(self.claims, self.to_bound)
    }

    /// Claims annotated per second in the same burst.
    pub fn annotated_per_sec(&self) -> Option<f64> {
        self.to_annotated.map(|d| per_sec(self.annotated, d))
    }

    /// Print the burst's lines (throughput, latency, same-run annotation).
    pub fn print(&self) {
        println!(
            "provisioning throughput: {:.0} claims/s to PV created ({:.2?}), {:.0} claims/s to claim Bound ({:.2?})",
            self.created_per_sec(),
            self.to_pv,
            self.bound_per_sec(),
            self.to_bound
        );
        println!(
            "burst latency claim created -> PV created: p50 {:.1?}, p99 {:.1?}, max {:.1?}",
            pct(&self.latency, 0.5),
            pct(&self.latency, 0.99),
            self.latency.last().copied().unwrap_or_default()
        );
        if let (Some(rate), Some(span)) = (self.annotated_per_sec(), self.to_annotated) {
            println!(
                "  same run: claims annotated at {rate:.0} claims/s ({span:.2?}); annotation -> PV created p50 {:.1?}, p99 {:.1?}",
                pct(&self.follow, 0.5),
                pct(&self.follow, 0.99)
            );
        }
    }
}

/// Create claims `names` of class `class` as fast as the load allows and
/// wait until each is `Bound` and has its PV.
///
/// Errors: an API error, or a wait longer than `timeout`.
pub async fn provision(
    client: &Client,
    namespace: &str,
    names: &[String],
    class: &str,
    seen: &SharedSeen,
    timeout: Duration,
) -> anyhow::Result<Burst> {
    let n = names.len();
    load::create_claims(client, namespace, names, class, None, seen).await?;
    wait_seen(seen, timeout, "burst claims Bound", n, |s| {
        Seen::count(&s.claim_bound, names)
    })
    .await?;
    wait_seen(seen, timeout, "burst PVs", n, |s| {
        Seen::count(&s.pv_added, names)
    })
    .await?;
    let s = seen.lock().unwrap();
    let first = Seen::first(&s.claim_created, names).expect("created");
    let annotated = Seen::count(&s.claim_annotated, names);
    Ok(Burst {
        claims: n,
        to_pv: Seen::last(&s.pv_added, names).expect("PVs") - first,
        to_bound: Seen::last(&s.claim_bound, names).expect("Bound") - first,
        latency: Seen::delays(&s.claim_created, &s.pv_added, names),
        to_annotated: Seen::last(&s.claim_annotated, names).map(|l| l - first),
        annotated,
        follow: Seen::delays(&s.claim_annotated, &s.pv_added, names),
    })
}

/// Figures of one reclaim (claims deleted, PVs deleted by a provisioner).
#[derive(Debug, Clone)]
pub struct Reclaim {
    /// Volumes.
    pub volumes: usize,
    /// First claim delete to last PV gone.
    pub to_deleted: Duration,
    /// First claim delete to last PV seen `Released`, and how many were seen
    /// `Released` (a PV can be deleted before the watch sees the phase).
    pub to_released: Option<(Duration, usize)>,
    /// Released seen → PV gone, sorted.
    pub follow: Vec<Duration>,
}

impl Reclaim {
    /// PVs deleted per second.
    pub fn deleted_per_sec(&self) -> f64 {
        per_sec(self.volumes, self.to_deleted)
    }

    /// Print the reclaim's lines.
    pub fn print(&self) {
        println!(
            "reclaim throughput: {:.0} volumes/s ({:.2?} from first claim deletion to last PV deleted)",
            self.deleted_per_sec(),
            self.to_deleted
        );
        if let Some((span, seen)) = self.to_released {
            println!(
                "  same run: PVs marked Released at {:.0} PVs/s ({span:.2?}, {seen} seen Released); Released -> PV deleted p50 {:.1?}, p99 {:.1?}",
                per_sec(seen, span),
                pct(&self.follow, 0.5),
                pct(&self.follow, 0.99)
            );
        }
    }
}

/// Delete claims `names` and wait until every PV of theirs is gone.
///
/// Errors: an API error, or a wait longer than `timeout`.
pub async fn reclaim(
    client: &Client,
    namespace: &str,
    names: &[String],
    seen: &SharedSeen,
    timeout: Duration,
) -> anyhow::Result<Reclaim> {
    load::delete_claims(client, namespace, names, seen).await?;
    wait_seen(seen, timeout, "burst PVs deleted", names.len(), |s| {
        Seen::count(&s.pv_deleted, names)
    })
    .await?;
    let s = seen.lock().unwrap();
    let first = Seen::first(&s.claim_delete_sent, names).expect("deleted");
    Ok(Reclaim {
        volumes: names.len(),
        to_deleted: Seen::last(&s.pv_deleted, names).expect("PVs deleted") - first,
        to_released: Seen::last(&s.pv_released, names)
            .map(|l| (l - first, Seen::count(&s.pv_released, names))),
        follow: Seen::delays(&s.pv_released, &s.pv_deleted, names),
    })
}
