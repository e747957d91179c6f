//! reclaim-svc, the reclaim half of the seed controller: the provisioner finalizer, and
//! `Released` volumes with policy `Delete` deleted. Layout: docs/ARCHITECTURE.md.

pub mod api_calls;
pub mod config;
pub mod controller;
pub mod decision;
pub mod finalizer;
pub mod metrics;
pub mod operation;
pub mod sweep;

use std::sync::Arc;

use common::kube::workqueue_metrics::WorkQueueMetrics;
use common::runtime::{config::ServiceSpec, frame::serve, metrics::DeleteMetrics};
use provisioner_api::Provisioner;

pub use crate::config::Cli;
use crate::{controller::TermDeps, metrics::SweepMetrics};

/// reclaim-svc as the runtime knows it: name, Lease suffix, HTTP port.
pub const SPEC: ServiceSpec = ServiceSpec::new("reclaim-svc", "reclaim", 9103).with_about(
    "Deletes released volumes of a Kubernetes external provisioner and manages its PV finalizer",
);

/// Run with `backend` until SIGTERM: HTTP endpoints, and as leader of the
/// `<provisioner>-reclaim` Lease one [`controller::run_term`] per term. Errors: setup failures.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    let deps = TermDeps {
        delete: DeleteMetrics::delete(&registry),
        sweep: SweepMetrics::register(&registry),
        queue: WorkQueueMetrics::register(&registry, "volumes"),
        backend,
        args: cli.service,
    };
    serve(SPEC, cli.common, registry, deps, controller::run_term).await
}
