//! pv-writer: drains the durable Redis PV-write queue ([`common::queue`]) and
//! creates the PersistentVolumes that provision-svc provisioned.
//!
//! The seed saves a provisioned PV from memory and, after a few failed saves,
//! deletes the storage asset; a restart loses it. pv-writer instead keeps every
//! PV in Redis (AOF) until the PV object exists, retries transient failures
//! forever with per-entry backoff, and dead-letters only what the API server
//! refuses for good — never deleting a volume. See [`writer`] for the per-entry
//! rules and [`common::queue`] for the Redis layout and delivery guarantees.
//!
//! Usage: `pv-writer [FLAGS]` runs the service (leader election on the
//! `<provisioner>-pv-writer` Lease, `/metrics`, `/healthz`, `/readyz` on port
//! 9102); `pv-writer queue list|dead|requeue <PV>` inspects and repairs the
//! queue with Redis access only. Flags: [`cli::Cli`].
//!
//! Metrics ([`metrics::WriterMetrics`]): `pv_writer_queue_depth`,
//! `pv_writer_queue_oldest_pending_age_seconds`, `pv_writer_queue_dead_letters`,
//! `pv_writer_dead_letters_total{reason}`, `pv_writer_writes_total{outcome}`,
//! `pv_writer_write_duration_seconds`, `pv_writer_retries_total`,
//! `pv_writer_refused_entries_total{reason}`, `pv_writer_fenced_operations_total`.
//!
//! Every entry is checked before it is written ([`checks`]): HMAC with the
//! queue key (`--queue-hmac-key-file`; refusing to start without one unless
//! `--insecure-unsigned-queue`), PV name, claimRef, provisioned-by annotation and
//! the hostpath backend's volume-source check (`--base-dir`).

pub mod api_calls;
pub mod checks;
pub mod cli;
pub mod metrics;
pub mod queue_cmd;
pub mod writer;

use std::sync::Arc;

use anyhow::Context;
use common::config::ServiceKind;
use common::queue::PvQueue;
use common::queue_auth::QueueKey;
use common::runtime::{run_service, ServiceContext};
use prometheus::Registry;

pub use api_calls::API_CALLS;
pub use cli::{Cli, Command, QueueCommand, WriterArgs};

/// Run what `cli` asks: the service (default) or a `queue` subcommand.
///
/// Errors: invalid flag combinations, client/HTTP setup failures; for `queue`
/// subcommands, Redis failures and unknown PV names.
pub async fn run(cli: Cli) -> anyhow::Result<()> {
    cli.writer.validate()?;
    match &cli.command {
        Some(Command::Queue { action }) => {
            let queue = PvQueue::connect(cli.common.redis(), &cli.common.provisioner_name)
                .await
                .context("connecting to the queue")?;
            let text = queue_cmd::run_queue_command(&queue, action).await?;
            print!("{text}");
            Ok(())
        }
        None | Some(Command::Run) => {
            let key = cli.writer.queue_key.load()?;
            let registry = Registry::new();
            // Registered once; the work function runs once per leader term.
            let metrics = metrics::WriterMetrics::register(&registry);
            let writer_args = cli.writer.clone();
            run_service(
                ServiceKind::PvWriter,
                cli.common.clone(),
                registry,
                move |ctx| {
                    serve_with_metrics(ctx, writer_args.clone(), metrics.clone(), key.clone())
                },
            )
            .await
        }
    }
}

/// The leader's work loop: connect to Redis (not ready until it answers,
/// retrying every 500 ms), then drain with [`writer::Writer`] until shutdown,
/// writing only entries that pass [`checks::EntryChecks`] with `key` (`None`:
/// `--insecure-unsigned-queue`) and the backend of `args.backend` (`--backend` and its flags).
/// Embedders with their own [`ServiceContext`] may call it directly.
///
/// Errors: this replica's term was superseded by a newer leader (see
/// [`writer`]); otherwise returns `Ok` on shutdown.
pub async fn serve(
    ctx: ServiceContext,
    args: WriterArgs,
    key: Option<QueueKey>,
) -> anyhow::Result<()> {
    let metrics = metrics::WriterMetrics::register(&ctx.registry);
    serve_with_metrics(ctx, args, metrics, key).await
}

/// [`serve`] with metrics already registered in `ctx.registry`, for a work
/// function called once per leader term (registering twice would panic).
///
/// Errors: as [`serve`].
pub async fn serve_with_metrics(
    ctx: ServiceContext,
    args: WriterArgs,
    metrics: metrics::WriterMetrics,
    key: Option<QueueKey>,
) -> anyhow::Result<()> {
    ctx.readiness.set_ready(false);
    let queue = loop {
        match PvQueue::connect(ctx.args.redis(), &ctx.args.provisioner_name).await {
            Ok(q) => break q,
            Err(err) => {
                tracing::warn!(error = %err, "cannot connect to Redis; not ready, retrying");
                tokio::select! {
                    _ = ctx.shutdown.cancelled() => return Ok(()),
                    _ = tokio::time::sleep(writer::REDIS_RETRY_INTERVAL) => {}
                }
            }
        }
    };
    let config = writer::WriterConfig {
        workers: args.workers as usize,
        retry_initial: args.retry_initial,
        retry_max: args.retry_max,
        write_timeout: args.write_timeout,
        visibility_timeout: args.visibility_timeout,
    };
    tracing::info!(workers = config.workers, provisioner = %ctx.args.provisioner_name, "draining the PV write queue");
    let backend = args
        .backend
        .build()
        .map_err(anyhow::Error::msg)?
        .provisioner();
    let names = std::iter::once(ctx.args.provisioner_name.clone())
        .chain(args.additional_provisioners.iter().cloned())
        .collect();
    let checks = checks::EntryChecks::new(names, key, backend);
    let writer = Arc::new(writer::Writer::new(
        queue,
        checks,
        ctx.client.clone(),
        &ctx.identity,
        metrics,
        config,
    ));
    writer
        .run(ctx.shutdown.clone(), ctx.readiness.clone())
        .await
}
