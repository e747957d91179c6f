//! provision-svc: claims → backend volumes → PVs queued in Redis for pv-writer (the seed's
//! provisioning half), and claims that grow. Layout: docs/ARCHITECTURE.md.

pub mod api_calls;
#[cfg(test)]
mod claim_tests;
pub mod config;
pub mod controller;
pub mod decision;
pub mod locks;
pub mod metrics;
pub mod operation;
pub mod ports;
pub mod recovery;
pub mod resize;

use std::sync::Arc;

use common::runtime::{config::ServiceSpec, frame::serve};
use provisioner_api::Provisioner;

pub use crate::config::Cli;

/// provision-svc as the runtime knows it: name, Lease suffix, HTTP port, workers.
pub const SPEC: ServiceSpec = ServiceSpec::new("provision-svc", "provision", 9101)
    .with_workers(8)
    .with_about("Provisions volumes for PersistentVolumeClaims and hands their PVs to pv-writer");

/// Run with `backend` until SIGTERM: HTTP endpoints, and as leader of the
/// `<provisioner>-provision` Lease one [`controller::run_term`] per term. Errors: setup failures.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    let deps = controller::TermDeps {
        queue_key: cli.service.queue_key.load()?,
        metrics: metrics::ServiceMetrics::register(&registry),
        backend,
        args: cli.service,
    };
    serve(SPEC, cli.common, registry, deps, controller::run_term).await
}
