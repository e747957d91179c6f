//! API requests the three services made during a phase, from the control
//! plane's own records: on a real cluster its audit log
//! ([`RealCluster::audit_records`](crate::realkube::RealCluster::audit_records),
//! requests by each service's ServiceAccount user), on the simulator its
//! request counters (all requests except the benchmark's own claim creates
//! and deletes). Lease traffic is counted apart (it does not grow with the
//! number of volumes).

use std::collections::BTreeMap;

use crate::harness::{Service, System};

/// Verbs that change an object.
const WRITE_VERBS: [&str; 5] = ["create", "update", "patch", "delete", "deletecollection"];

/// Requests of one phase.
#[derive(Debug, Default, Clone)]
pub struct ApiCost {
    /// Service requests, Lease requests excluded.
    pub requests: u64,
    /// Of those, writes (create/update/patch/delete).
    pub writes: u64,
    /// Lease requests (leader election).
    pub lease_requests: u64,
    /// `verb resource[/subresource]` → count (Leases excluded).
    pub by_call: BTreeMap<String, u64>,
    /// Where the figures come from (`audit log` or `simulator counters`).
    pub source: &'static str,
}

impl ApiCost {
    /// Requests per volume for `n` volumes.
    pub fn per(&self, n: usize) -> (f64, f64) {
        let n = n.max(1) as f64;
        (self.requests as f64 / n, self.writes as f64 / n)
    }
}

/// A phase's start mark: the audit-log length or a reset of the simulator's counters.
#[derive(Debug, Clone, Copy)]
pub enum CostMark {
    /// Audit records before the phase.
    Audit(usize),
    /// Simulator counters reset.
    Sim,
    /// An external cluster: no request records available.
    Unavailable,
}

/// Start measuring a phase on `sys`'s control plane.
///
/// Errors: the audit log cannot be read.
pub fn mark(sys: &System) -> anyhow::Result<CostMark> {
    if let Some(real) = sys.real() {
        return Ok(CostMark::Audit(real.cluster.audit_records()?.len()));
    }
    if let Some(sim) = sys.sim_handle() {
        sim.reset_stats();
        return Ok(CostMark::Sim);
    }
    Ok(CostMark::Unavailable)
}

/// The services' requests since `mark` (`None` on an external cluster).
///
/// Errors: the audit log cannot be read.
pub fn since(sys: &System, mark: CostMark) -> anyhow::Result<Option<ApiCost>> {
    match mark {
        CostMark::Audit(from) => {
            let real = sys.real().expect("an audit mark comes from a real plane");
            let users: Vec<String> = Service::ALL
                .iter()
                .map(|s| {
                    format!(
                        "system:serviceaccount:{}:{}",
                        real.rbac.namespace(*s),
                        s.binary_name()
                    )
                })
                .collect();
            Ok(Some(audited(sys, from, &users)?))
        }
        CostMark::Sim => Ok(Some(simulated(sys))),
        CostMark::Unavailable => Ok(None),
    }
}

/// kube-controller-manager's requests since `mark` (user
/// [`KCM_USER`](crate::realkube::KCM_USER); all its controllers share it and
/// its client-side `--kube-api-qps`): `None` unless the plane is the real one
/// the harness started.
///
/// Errors: the audit log cannot be read.
pub fn controller_manager_since(sys: &System, mark: CostMark) -> anyhow::Result<Option<ApiCost>> {
    match mark {
        CostMark::Audit(from) => Ok(Some(audited(
            sys,
            from,
            &[crate::realkube::KCM_USER.to_string()],
        )?)),
        _ => Ok(None),
    }
}

/// Requests by `users` in the audit log after its first `from` records.
fn audited(sys: &System, from: usize, users: &[String]) -> anyhow::Result<ApiCost> {
    let real = sys.real().expect("an audit mark comes from a real plane");
    let mut cost = ApiCost {
        source: "kube-apiserver audit log",
        ..Default::default()
    };
    for r in real.cluster.audit_records()?.iter().skip(from) {
        if !users.contains(&r.user) {
            continue;
        }
        if r.resource == "leases" {
            cost.lease_requests += 1;
            continue;
        }
        let what = match &r.subresource {
            Some(sub) => format!("{} {}/{}", r.verb, r.resource, sub),
            None if r.resource.is_empty() => format!("{} {}", r.verb, r.request_uri),
            None => format!("{} {}", r.verb, r.resource),
        };
        cost.requests += 1;
        if WRITE_VERBS.contains(&r.verb.as_str()) {
            cost.writes += 1;
        }
        *cost.by_call.entry(what).or_default() += 1;
    }
    Ok(cost)
}

/// The simulator's counters since the last reset, less the benchmark's own
/// claim creates and deletes.
fn simulated(sys: &System) -> ApiCost {
    let mut cost = ApiCost {
        source: "simulator counters",
        ..Default::default()
    };
    for (resource, verbs) in &sys.sim().stats().by_resource {
        for (verb, c) in verbs {
            if resource.starts_with("leases") {
                cost.lease_requests += c;
                continue;
            }
            // The benchmark's own claim creates and deletes.
            if resource == "persistentvolumeclaims" && (verb == "create" || verb == "delete") {
                continue;
            }
            cost.requests += c;
            if WRITE_VERBS.contains(&verb.as_str()) {
                cost.writes += c;
            }
            *cost
                .by_call
                .entry(format!("{verb} {resource}"))
                .or_default() += c;
        }
    }
    cost
}
