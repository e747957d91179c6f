//! provision-svc: the provisioning half of the seed controller
//! (sig-storage-lib-external-provisioner v8). It watches claims, StorageClasses
//! and PVs through reflectors, decides `should_provision` as the seed does,
//! calls the backend's `provision`, and hands the finished PV to pv-writer
//! through the durable Redis queue instead of creating it.
//!
//! * [`config`] — flags ([`config::ProvisionArgs`], [`config::Cli`]);
//! * [`decision`] — the seed's decisions as pure functions (`shouldProvision`);
//! * [`operation`] — the provision operation, its error handling, `syncClaim`
//!   and the seed's `claimsInProgress`, executed through [`ports`];
//! * [`ports`] — the side effects behind traits (Kubernetes, queue, intents);
//! * [`recovery`] — the leader's start-up walk over durable intents: a function
//!   of the durable store, the caches and the backend;
//! * [`controller`] — reflectors, the claim work queue ([`common::kube::workqueue`],
//!   keyed by uid) with its per-claim retry/threshold handling, workers,
//!   resync, graceful shutdown;
//! * [`metrics`] — the seed's provisioning metrics and the service's gauges;
//! * [`api_calls`] — the Kubernetes API calls made, for RBAC checks.

pub mod api_calls;
pub mod config;
pub mod controller;
pub mod decision;
pub mod in_progress;
pub mod metrics;
pub mod operation;
pub mod ports;
pub mod recovery;

use std::sync::Arc;

use common::runtime::config::ServiceSpec;
use common::runtime::frame::{run_service, Launch};
use prometheus::Registry;
use provisioner_api::Provisioner;

/// This service as the runtime knows it: component name, Lease suffix, default
/// HTTP port, worker threads and retry intervals.
pub const SPEC: ServiceSpec = ServiceSpec::new("provision-svc", "provision", 9101).with_workers(8);

/// Run provision-svc with `backend` until SIGTERM (or a lost Lease): serves
/// `/metrics`, `/healthz`, `/readyz`, elects a leader on the
/// `<provisioner>-provision` Lease and, while leading, provisions claims.
///
/// Errors: client or HTTP setup failures. A lost Lease stops all work and the
/// replica campaigns again (see [`common::runtime::frame`]).
pub async fn run(args: config::ProvisionArgs, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    let queue_key = args.queue_key.load()?;
    let registry = Registry::new();
    let metrics = metrics::ServiceMetrics::register(&registry);
    let common_args = args.common.clone();
    // Called once per leader term: each term starts from scratch (new
    // reflectors, operation and claim queue, a new start-up walk); the metrics live on.
    run_service(SPEC, common_args, registry, Launch::default(), move |ctx| {
        controller::work(
            ctx,
            args.clone(),
            backend.clone(),
            metrics.clone(),
            queue_key.clone(),
        )
    })
    .await
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod claim_tests;
