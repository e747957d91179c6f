//! provision-svc: the provisioning half of the seed controller
//! (sig-storage-lib-external-provisioner v8). It watches claims, StorageClasses
//! and PVs through reflectors, decides `should_provision` as the seed does,
//! calls the backend's `provision`, and hands the finished PV to pv-writer
//! through the durable Redis queue instead of creating it. [`config`] flags,
//! [`controller`] the loop and leader term, [`operation`] the effects through
//! [`ports`], [`decision`] pure rules, [`recovery`] gone claims, [`locks`] one
//! sync per claim, [`metrics`], [`api_calls`] (RBAC).

pub mod api_calls;
pub mod config;
pub mod controller;
pub mod decision;
pub mod locks;
pub mod metrics;
pub mod operation;
pub mod ports;
pub mod recovery;

use std::sync::Arc;

use common::runtime::config::ServiceSpec;
use common::runtime::frame::{run_service, Launch};
use prometheus::Registry;
use provisioner_api::Provisioner;

use crate::controller::TermDeps;

/// This service as the runtime knows it: component name, Lease suffix, default
/// HTTP port, worker threads.
pub const SPEC: ServiceSpec = ServiceSpec::new("provision-svc", "provision", 9101).with_workers(8);

/// Run provision-svc with `backend` until SIGTERM: `/metrics`, `/healthz`,
/// `/readyz`, and as leader of the `<provisioner>-provision` Lease one
/// [`controller::run_term`] per term. Errors: setup failures (queue key, client, HTTP).
pub async fn run(args: config::ProvisionArgs, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    let registry = Registry::new();
    let deps = TermDeps {
        queue_key: args.queue_key.load()?,
        metrics: metrics::ServiceMetrics::register(&registry),
        backend,
        args: args.clone(),
    };
    run_service(SPEC, args.common, registry, Launch::default(), move |ctx| {
        controller::run_term(ctx, deps.clone())
    })
    .await
}

#[cfg(test)]
#[path = "claim_tests.rs"]
mod claim_tests;
