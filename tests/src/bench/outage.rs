//! An API-server outage in the middle of a batch (issue 12: "survive an
//! API-server outage without restarting"): claims are created, kube-apiserver
//! is stopped once a quarter of their PVs exist (the simulator answers 503
//! instead), started again after the outage, and the benchmark reports how
//! long after the API's return every claim was Bound, and whether any service
//! process exited on the way.
//!
//! A service that exits is restarted only once the API is back (the best a
//! kubelet does; its growing restart back-off would make it later), so the
//! batch still completes and the time is reported either way.

use std::time::{Duration, Instant};

use crate::harness::{Service, System};

use super::load;
use super::observe::{wait_seen, Seen, SharedSeen};

/// Result of one outage run.
#[derive(Debug, Clone)]
pub struct OutageReport {
    /// Claims in the batch.
    pub claims: usize,
    /// PVs that existed when the API went down.
    pub pvs_before: usize,
    /// How long the API was unreachable (stop begun → ready again).
    pub api_down: Duration,
    /// API ready again → every claim of the batch Bound (listed by the harness).
    pub all_bound_after_return: Duration,
    /// Service replicas whose process exited during the run, with the time
    /// after the outage began at which the exit was first seen.
    pub exited: Vec<(Service, usize, Duration)>,
    /// Replicas the benchmark restarted after the API's return.
    pub restarted: usize,
}

/// Run the outage of `duration` over a batch of `claims` claims of class `class`.
///
/// Errors: the API server does not stop or start, an API error outside the
/// outage, a restart fails, or the batch is not Bound within `timeout` of
/// the API's return.
pub async fn run(
    sys: &mut System,
    seen: &SharedSeen,
    claims: usize,
    class: &str,
    duration: Duration,
    timeout: Duration,
) -> anyhow::Result<OutageReport> {
    let names = load::names("outage", claims);
    let ns = sys.namespace.clone();
    load::create_claims(&sys.client, &ns, &names, class, None, seen).await?;
    let quarter = claims.div_ceil(4);
    wait_seen(seen, timeout, "a quarter of the PVs", quarter, |s| {
        Seen::count(&s.pv_added, &names)
    })
    .await?;
    let pvs_before = Seen::count(&seen.lock().unwrap().pv_added, &names);

    let began = Instant::now();
    let outage = sys.begin_outage().await?;
    let mut exited: Vec<(Service, usize, Duration)> = Vec::new();
    let mut note_exits = |sys: &mut System| {
        for (s, r) in sys.exited_replicas() {
            if !exited.iter().any(|(es, er, _)| (*es, *er) == (s, r)) {
                exited.push((s, r, began.elapsed()));
            }
        }
    };
    while began.elapsed() < duration {
        note_exits(sys);
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    sys.end_outage(outage).await?;
    let back = Instant::now();
    let api_down = back - began;
    note_exits(sys);
    let restarted = sys.restart_exited().await?;

    loop {
        if let Ok(bound) = sys.bound_claims().await {
            if bound >= claims {
                break;
            }
        }
        note_exits(sys);
        anyhow::ensure!(
            back.elapsed() < timeout,
            "not every claim Bound {timeout:?} after the API's return"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let all_bound_after_return = back.elapsed();
    note_exits(sys);
    Ok(OutageReport {
        claims,
        pvs_before,
        api_down,
        all_bound_after_return,
        exited,
        restarted,
    })
}
