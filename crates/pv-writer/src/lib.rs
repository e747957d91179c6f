//! pv-writer: drains the durable Redis PV-write queue ([`common::handoff::queue`])
//! and creates the PersistentVolumes that provision-svc provisioned, retrying
//! transient failures forever and dead-lettering only what the API server
//! refuses for good; a volume is never deleted.
//!
//! [`config`] flags, [`controller`] the drain loop and leader term,
//! [`operation`] the effects, [`decision`] and [`checks`] the rules,
//! [`metrics`], [`api_calls`] (RBAC); the operator's commands are `provisioner-ctl`'s.

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
use common::runtime::frame::{run_service, Launch};
use provisioner_api::Provisioner;

use crate::controller::TermDeps;

/// This service as the runtime knows it: component name, Lease suffix, default
/// HTTP port, worker threads and retry intervals.
pub const SPEC: ServiceSpec = ServiceSpec::new("pv-writer", "pv-writer", 9102)
    .with_workers(16)
    .with_retry(Duration::from_secs(1), Duration::from_secs(300));

pub use api_calls::API_CALLS;
pub use config::{Cli, WriterArgs};

/// Run pv-writer with `backend` until SIGTERM: HTTP endpoints, and as leader
/// of the `<provisioner>-pv-writer` Lease one [`controller::run_term`] per
/// term. Errors: invalid flags, setup failures.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    cli.validate()?;
    let registry = prometheus::Registry::new();
    let deps = TermDeps {
        key: cli.writer.queue_key.load()?,
        metrics: metrics::WriterMetrics::register(&registry),
        args: cli.writer,
        backend,
    };
    run_service(SPEC, cli.common, registry, Launch::default(), move |ctx| {
        controller::run_term(ctx, deps.clone())
    })
    .await
}
