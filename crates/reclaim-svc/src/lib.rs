//! reclaim-svc, the reclaim half of the seed controller
//! (sig-storage-lib-external-provisioner v8): for each PV of our provisioner,
//! keeps the provisioner finalizer in line with `--add-finalizer` and, when the
//! PV is `Released` with policy `Delete`, deletes the asset through the
//! backend, then the PV, then our finalizer. [`config`] flags, [`controller`]
//! the loop and leader term, [`operation`] the effects, [`decision`] pure
//! rules, [`finalizer`] the conflict-safe patch, [`sweep`] the orphan sweep,
//! [`metrics`], [`api_calls`] (RBAC).

pub mod api_calls;
pub mod config;
pub mod controller;
pub mod decision;
pub mod finalizer;
pub mod metrics;
pub mod operation;
pub mod sweep;

use std::sync::Arc;

use common::runtime::config::{CommonArgs, RetryArgs, ServiceSpec};
use common::runtime::frame::{run_service, Launch};
use provisioner_api::Provisioner;

pub use crate::config::{Cli, ReclaimArgs};
use crate::controller::TermDeps;
use crate::metrics::ReclaimMetrics;

/// This service as the runtime knows it: name, Lease suffix, default HTTP port.
pub const SPEC: ServiceSpec = ServiceSpec::new("reclaim-svc", "reclaim", 9103);

/// Run reclaim-svc with `backend` until SIGTERM: `/metrics`, `/healthz`,
/// `/readyz`, and as leader of the `<provisioner>-reclaim` Lease one
/// [`controller::run_term`] per term. Errors: setup failures.
pub async fn run(
    common: CommonArgs,
    retry: RetryArgs,
    reclaim: ReclaimArgs,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    let registry = prometheus::Registry::new();
    let metrics = ReclaimMetrics::register(&registry);
    let deps = TermDeps {
        backend,
        metrics,
        retry,
        reclaim,
    };
    run_service(SPEC, common, registry, Launch::default(), move |ctx| {
        controller::run_term(ctx, deps.clone())
    })
    .await
}
