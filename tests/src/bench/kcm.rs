//! kube-controller-manager alone (no service running): the two rates that
//! bound what any external provisioner can reach on this control plane.
//!
//! * **Annotation rate**: claims of a class with an external provisioner
//!   become visible to a provisioner only once the PV controller has set the
//!   storage-provisioner annotation on them. Claims created in a burst,
//!   annotated per second (first create to last annotation) — the ceiling of
//!   "PV created/s".
//! * **Annotation delay** at an offered rate: claim created → annotated, p50/p99.
//! * **Released-marking rate**: bound PVs whose claims are deleted, marked
//!   `Released` per second (first claim delete to last `Released`) — the
//!   ceiling of "PV deleted/s" for a provisioner that deletes on `Released`.

use std::time::Duration;

use kube::Client;

use super::load;
use super::observe::{pct, per_sec, wait_seen, Seen, SharedSeen};

/// The controller manager's figures of one run.
#[derive(Debug, Clone)]
pub struct KcmRates {
    /// Claims in the annotation burst.
    pub claims: usize,
    /// Claims annotated per second in the burst.
    pub annotated_per_sec: f64,
    /// First create to last annotation.
    pub annotation_span: Duration,
    /// Offered rate of the delay measurement (claims/s) and claims.
    pub offered: (f64, usize),
    /// Claim created → annotated at the offered rate: p50, p99.
    pub annotation_delay: (Duration, Duration),
    /// PVs marked Released per second.
    pub released_per_sec: f64,
    /// First claim delete to last Released.
    pub released_span: Duration,
}

/// Where and how much to measure.
#[derive(Clone)]
pub struct KcmLoad<'a> {
    /// Admin client.
    pub client: &'a Client,
    /// Namespace of the claims.
    pub namespace: &'a str,
    /// StorageClass naming our provisioner.
    pub class: &'a str,
    /// Our provisioner name (the pre-bound PVs' `provisioned-by`).
    pub provisioner: &'a str,
    /// Claims in each burst.
    pub claims: usize,
    /// Offered rate and claims of the delay measurement.
    pub rate: f64,
    /// Claims at the offered rate.
    pub rate_claims: usize,
    /// Bound on each wait.
    pub timeout: Duration,
}

/// Measure the controller manager's annotation rate, annotation delay at
/// the offered rate and Released-marking rate. Nothing of ours may run:
/// every object it creates is removed before it returns (claims deleted and
/// gone, pre-bound PVs deleted and gone).
///
/// Errors: an API error, or a wait timed out.
pub async fn measure(l: &KcmLoad<'_>, seen: &SharedSeen) -> anyhow::Result<KcmRates> {
    // Annotation burst.
    let burst = load::names("kcm-annotate", l.claims);
    load::create_claims(l.client, l.namespace, &burst, l.class, None, seen).await?;
    wait_seen(seen, l.timeout, "claims annotated", burst.len(), |s| {
        Seen::count(&s.claim_annotated, &burst)
    })
    .await?;
    let (first, last) = {
        let s = seen.lock().unwrap();
        (
            Seen::first(&s.claim_created, &burst).expect("created"),
            Seen::last(&s.claim_annotated, &burst).expect("annotated"),
        )
    };
    let annotation_span = last.saturating_duration_since(first);

    // Annotation delay at the offered rate.
    let paced = load::names("kcm-paced", l.rate_claims);
    load::create_claims(l.client, l.namespace, &paced, l.class, Some(l.rate), seen).await?;
    wait_seen(
        seen,
        l.timeout,
        "paced claims annotated",
        paced.len(),
        |s| Seen::count(&s.claim_annotated, &paced),
    )
    .await?;
    let delays = {
        let s = seen.lock().unwrap();
        Seen::delays(&s.claim_created, &s.claim_annotated, &paced)
    };

    let all: Vec<String> = burst.iter().chain(&paced).cloned().collect();
    load::delete_claims(l.client, l.namespace, &all, seen).await?;
    wait_seen(
        seen,
        l.timeout,
        "unprovisioned claims gone",
        all.len(),
        |s| Seen::count(&s.claim_gone, &all),
    )
    .await?;

    // Released marking.
    let pairs = load::names("kcm-release", l.claims);
    load::create_bound_pairs(l.client, l.namespace, &pairs, l.class, l.provisioner).await?;
    wait_seen(
        seen,
        l.timeout,
        "pre-bound claims Bound",
        pairs.len(),
        |s| Seen::count(&s.claim_bound, &pairs),
    )
    .await?;
    load::delete_claims(l.client, l.namespace, &pairs, seen).await?;
    wait_seen(seen, l.timeout, "PVs Released", pairs.len(), |s| {
        Seen::count(&s.pv_released, &pairs)
    })
    .await?;
    let (first, last) = {
        let s = seen.lock().unwrap();
        (
            Seen::first(&s.claim_delete_sent, &pairs).expect("deleted"),
            Seen::last(&s.pv_released, &pairs).expect("released"),
        )
    };
    let released_span = last.saturating_duration_since(first);
    load::delete_pvs(l.client, &pairs).await?;
    wait_seen(seen, l.timeout, "pre-bound PVs gone", pairs.len(), |s| {
        Seen::count(&s.pv_deleted, &pairs)
    })
    .await?;
    wait_seen(seen, l.timeout, "pre-bound claims gone", pairs.len(), |s| {
        Seen::count(&s.claim_gone, &pairs)
    })
    .await?;

    Ok(KcmRates {
        claims: l.claims,
        annotated_per_sec: per_sec(burst.len(), annotation_span),
        annotation_span,
        offered: (l.rate, l.rate_claims),
        annotation_delay: (pct(&delays, 0.5), pct(&delays, 0.99)),
        released_per_sec: per_sec(pairs.len(), released_span),
        released_span,
    })
}
