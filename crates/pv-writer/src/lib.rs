//! pv-writer: drains the durable Redis PV-write queue ([`common::handoff::queue`]) and
//! creates the PersistentVolumes that provision-svc provisioned.
//!
//! The seed saves a provisioned PV from memory and, after a few failed saves,
//! deletes the storage asset; a restart loses it. pv-writer instead keeps every
//! PV in Redis (AOF) until the PV object exists, retries transient failures
//! forever with per-entry backoff, and dead-letters only what the API server
//! refuses for good — never deleting a volume. See [`operation`] for the per-entry
//! rules and [`common::handoff::queue`] for the Redis layout and delivery guarantees.
//!
//! Usage: `pv-writer [FLAGS]` runs the service (leader election on the
//! `<provisioner>-pv-writer` Lease, `/metrics`, `/healthz`, `/readyz` on port
//! 9102); `pv-writer queue list|dead|requeue <PV>` inspects and repairs the
//! queue with Redis access only; `pv-writer status [-o json]` is the operator's
//! overview of a provisioner name across the three services ([`status`]).
//! Flags: [`config::Cli`].
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
//! the backend's own volume-source check ([`provisioner_api::Provisioner::validate_volume`],
//! e.g. hostpath's `hostPath` = `<--base-dir>/<pv name>`).

pub mod api_calls;
pub mod checks;
pub mod config;
pub mod controller;
pub mod decision;
pub mod metrics;
pub mod operation;
pub mod queue_cmd;
pub mod status;

use std::sync::Arc;

use anyhow::Context;
use common::handoff::queue::PvQueue;
use common::handoff::queue_auth::QueueKey;
use common::runtime::config::ServiceKind;
use common::runtime::frame::{run_service, ServiceContext};
use prometheus::Registry;
use provisioner_api::Provisioner;

pub use api_calls::API_CALLS;
pub use config::{Cli, Command, OutputFormat, QueueCommand, StatusArgs, WriterArgs};

/// Run what `cli` asks: the service (default), writing only PVs that pass
/// `backend`'s own check, or a `queue` subcommand.
///
/// Errors: invalid flag combinations, client/HTTP setup failures; for `queue`
/// subcommands, Redis failures and unknown PV names.
pub async fn run(cli: Cli, backend: Arc<dyn Provisioner>) -> anyhow::Result<()> {
    cli.validate()?;
    match &cli.command {
        Some(Command::Queue { action }) => {
            let queue = PvQueue::connect(cli.common.redis(), &cli.common.provisioner_name)
                .await
                .context("connecting to the queue")?;
            let text = queue_cmd::run_queue_command(&queue, action).await?;
            print!("{text}");
            Ok(())
        }
        Some(Command::Status(args)) => run_status(&cli.common, args).await,
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
    }
}

/// The leader's work loop: connect to Redis (not ready until it answers,
/// retrying every `--redis-reconnect-period`), then drain with [`operation::Writer`] until shutdown,
/// writing only entries that pass [`checks::EntryChecks`] with `key` (`None`:
/// `--insecure-unsigned-queue`) and `backend`'s own check.
/// Embedders with their own [`ServiceContext`] may call it directly.
///
/// Errors: this replica's term was superseded by a newer leader (see
/// [`operation`]); otherwise returns `Ok` on shutdown.
pub async fn serve(
    ctx: ServiceContext,
    args: WriterArgs,
    key: Option<QueueKey>,
    backend: Arc<dyn Provisioner>,
) -> anyhow::Result<()> {
    let metrics = metrics::WriterMetrics::register(&ctx.registry);
    serve_with_metrics(ctx, args, metrics, key, backend).await
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
    let retry = ctx.args.retry_backoff(ServiceKind::PvWriter);
    let config = operation::WriterConfig {
        workers: ctx.args.worker_threads_for(ServiceKind::PvWriter),
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

/// `pv-writer status`: gather ([`status::gather`]) and print as a table or
/// JSON. Redis is read with the `--redis-*` flags (the deploy's read-only
/// `operator` ACL user); the Leases with `--kubeconfig` (or the inferred
/// config) in `--leader-election-namespace`, else found by name in every
/// namespace (the deploy splits the services over two), unless `--no-leases`;
/// a client that cannot be built is reported as an error of the Lease part.
///
/// Errors: after printing, when any part could not be read (exit status 1).
async fn run_status(
    common_args: &common::runtime::config::CommonArgs,
    args: &StatusArgs,
) -> anyhow::Result<()> {
    let names = if args.provisioner_names.is_empty() {
        vec![common_args.provisioner_name.clone()]
    } else {
        args.provisioner_names.clone()
    };
    let namespace = common_args.leader_election_namespace.as_deref();
    let mut client_error = None;
    let client = if args.no_leases {
        None
    } else {
        match common::runtime::kube_client::client_from_args(common_args).await {
            Ok(c) => Some(c),
            Err(e) => {
                let cause = common::runtime::telemetry::error_chain(e.as_ref());
                client_error = Some(format!("leases: {cause}"));
                None
            }
        }
    };
    let mut status = status::gather(
        &names,
        &common_args.redis(),
        client.as_ref().map(|c| (c, namespace)),
        common::kube::time::now_ms(),
    )
    .await;
    if let Some(e) = client_error {
        for p in &mut status.provisioners {
            p.errors.push(e.clone());
        }
    }
    match args.output {
        OutputFormat::Table => print!("{}", status::render_table(&status)),
        OutputFormat::Json => println!(
            "{}",
            serde_json::to_string_pretty(&status).expect("status always serializes")
        ),
    }
    // The causes are in the output already; the exit error only counts them.
    let errors = status.errors().len();
    anyhow::ensure!(errors == 0, "{errors} part(s) could not be read");
    Ok(())
}
