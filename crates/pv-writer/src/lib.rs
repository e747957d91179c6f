//! pv-writer: drains the durable Redis PV-write queue ([`common::handoff::queue`])
//! and creates the PersistentVolumes that provision-svc provisioned, retrying
//! transient failures forever and dead-lettering only what the API server
//! refuses for good; a volume is never deleted.
//!
//! `pv-writer [FLAGS]` runs the service (Lease `<provisioner>-pv-writer`,
//! `/metrics`, `/healthz`, `/readyz` on port 9102); the operator's commands are
//! `provisioner-ctl`'s. Flags: [`config::Cli`]; metrics: [`metrics::WriterMetrics`];
//! checks before a write: [`checks`]; per-entry rules: [`operation`].

pub mod api_calls;
pub mod checks;
pub mod config;
pub mod controller;
pub mod decision;
pub mod metrics;
pub mod operation;

use std::sync::Arc;
use std::time::Duration;

use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::runtime::config::ServiceSpec;
use common::runtime::frame::{run_service, Launch, ServiceContext};
use prometheus::Registry;
use provisioner_api::Provisioner;

/// This service as the runtime knows it: component name, Lease suffix, default
/// HTTP port, worker threads and retry intervals.
pub const SPEC: ServiceSpec = ServiceSpec::new("pv-writer", "pv-writer", 9102)
    .with_workers(16)
    .with_retry(Duration::from_secs(1), Duration::from_secs(300));

pub use api_calls::API_CALLS;
pub use config::{Cli, WriterArgs};

/// Run the service, writing only PVs that pass `backend`'s own check.
///
/// Errors: invalid flag combinations, client/HTTP setup failures.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    cli.validate()?;
    let key = cli.writer.queue_key.load()?;
    let registry = Registry::new();
    // Registered once; the work function runs once per leader term.
    let metrics = metrics::WriterMetrics::register(&registry);
    let writer_args = cli.writer.clone();
    run_service(
        SPEC,
        cli.common.clone(),
        registry,
        Launch::default(),
        move |ctx| {
            serve_with_metrics(
                ctx,
                writer_args.clone(),
                metrics.clone(),
                key.clone(),
                backend.clone(),
            )
        },
    )
    .await
}

/// The leader's work loop: connect to Redis (not ready until it answers), then
/// drain with [`operation::Writer`] until shutdown, writing only entries that pass
/// [`checks::EntryChecks`] with `key` (`None`: unsigned). Errors: a newer leader term.
pub async fn serve(
    ctx: ServiceContext,
    args: WriterArgs,
    key: Option<QueueKey>,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    let metrics = metrics::WriterMetrics::register(&ctx.registry);
    serve_with_metrics(ctx, args, metrics, key, backend).await
}

/// [`serve`] with metrics already registered in `ctx.registry` (a work function
/// runs once per leader term). Errors: as [`serve`].
pub async fn serve_with_metrics(
    ctx: ServiceContext,
    args: WriterArgs,
    metrics: metrics::WriterMetrics,
    key: Option<QueueKey>,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    ctx.readiness.set_ready(false);
    let Some(queue) = ctx
        .args
        .redis_reconnect()
        .retry(
            &ctx.shutdown,
            || {
                // Waiting for Redis is not a stall (/readyz reports it).
                ctx.heartbeat.beat();
                PvQueue::connect(ctx.args.redis(), &ctx.args.provisioner_name)
            },
            |err, _, _| tracing::warn!(error = %err, "cannot connect to Redis; not ready, retrying"),
        )
        .await
    else {
        return Ok(());
    };
    let retry = ctx.args.retry_backoff(SPEC);
    let config = operation::WriterConfig {
        workers: ctx.args.worker_threads_for(SPEC),
        retry_initial: retry.initial,
        retry_max: retry.max,
        redis_reconnect: ctx.args.redis_reconnect_period,
        write_timeout: args.write_timeout,
        visibility_timeout: args.visibility_timeout,
    };
    tracing::info!(workers = config.workers, provisioner = %ctx.args.provisioner_name, "draining the PV write queue");
    let names = std::iter::once(ctx.args.provisioner_name.clone())
        .chain(args.additional_provisioners.iter().cloned())
        .collect();
    let checks = checks::EntryChecks::new(names, key, backend);
    let writer = Arc::new(operation::Writer::new(
        queue,
        checks,
        ctx.client.clone(),
        &ctx.identity,
        metrics,
        config,
    ));
    Ok(writer
        .run_term(
            ctx.shutdown.clone(),
            ctx.readiness.clone(),
            ctx.heartbeat.clone(),
            ctx.args.healthz_stall_timeout,
        )
        .await?)
}
