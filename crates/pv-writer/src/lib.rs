//! pv-writer: drains the durable Redis PV-write queue into PersistentVolumes; it never
//! deletes a volume. Layout: docs/ARCHITECTURE.md.

pub mod api_calls;
pub mod checks;
pub mod config;
pub mod controller;
pub mod decision;
pub mod metrics;
pub mod operation;

use std::sync::Arc;
use std::time::Duration;

use common::runtime::config::ServiceSpec;
use common::runtime::frame::serve;
use provisioner_api::Provisioner;

use crate::checks::EntryChecks;

/// pv-writer as the runtime knows it: name, Lease suffix, HTTP port, workers, retry intervals.
pub const SPEC: ServiceSpec = ServiceSpec::new("pv-writer", "pv-writer", 9102)
    .with_workers(16)
    .with_retry(Duration::from_secs(1), Duration::from_secs(300))
    .with_about("Drains the durable Redis PV-write queue and creates the PersistentVolumes");

pub use config::Cli;

/// Run with `backend` until SIGTERM: HTTP endpoints, and as leader of the
/// `<provisioner>-pv-writer` Lease one [`controller::run_term`] per term. Errors: setup failures.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    let config = config::writer_config(&cli)?;
    let (common, args) = (&cli.common, &cli.service);
    let mut names = vec![common.cluster.provisioner_name.clone()];
    names.extend_from_slice(&args.additional_provisioners.names);
    let checks = EntryChecks::new(names, args.queue_key.load()?, backend);
    let registry = prometheus::Registry::new();
    let deps = (config, metrics::WriterMetrics::register(&registry), checks);
    serve(SPEC, cli.common, registry, deps, controller::run_term).await
}
