//! The frame every service runs in: client, HTTP server, leader election,
//! signal handling and graceful shutdown around a service-specific work loop.
//!
//! Life of a replica:
//! 1. build the kube client and serve `/metrics`, `/healthz`, `/readyz`;
//! 2. stand by (ready) until it holds the service's Lease (skipped with
//!    `--leader-election=false`);
//! 3. run the work loop with a [`ServiceContext`] whose `shutdown` token fires on
//!    SIGTERM;
//! 4. losing the Lease aborts the work loop at once and the process exits
//!    non-zero (the pod restarts and competes again, as the seed does);
//!    SIGTERM lets the loop finish in-flight work for `--shutdown-grace-period`,
//!    then aborts it and releases the Lease so a standby takes over at once.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use api_types::lease_name;
use kube::Client;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::config::{CommonArgs, ServiceKind};
use crate::http::{self, Readiness};
use crate::leader::{self, LeaderElector, LeaseTiming};

/// What a work loop gets from the runtime.
#[derive(Clone)]
pub struct ServiceContext {
    /// Kubernetes client (rate-limited per `--kube-api-qps`/`--kube-api-burst`).
    pub client: Client,
    /// The shared flags.
    pub args: CommonArgs,
    /// The service's metrics registry, served on the metrics path.
    pub registry: Registry,
    /// Report readiness here once caches are synced (and while dependencies are reachable).
    pub readiness: Readiness,
    /// Fires on SIGTERM/SIGINT: stop taking new work and return.
    pub shutdown: CancellationToken,
    /// This replica's identity (Lease holder, event reporter instance).
    pub identity: String,
    /// Which service this is.
    pub kind: ServiceKind,
    /// Address the HTTP server is bound to.
    pub http_addr: SocketAddr,
}

/// Run a service: see the module docs. `work` is called once, when this replica
/// starts leading, and should return when `ctx.shutdown` fires.
///
/// Errors: client or HTTP setup failures, a lost Lease, or `work`'s own error.
pub async fn run_service<F, Fut>(
    kind: ServiceKind,
    args: CommonArgs,
    registry: Registry,
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let client = crate::kube_client::client_from_args(&args).await?;
    run_service_with_client(kind, args, registry, client, work).await
}

/// [`run_service`] with a client the caller built (tests, embedding).
pub async fn run_service_with_client<F, Fut>(
    kind: ServiceKind,
    args: CommonArgs,
    registry: Registry,
    client: Client,
    work: F,
) -> anyhow::Result<()>
where
    F: FnOnce(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let shutdown = CancellationToken::new();
    crate::shutdown::cancel_on_signal(shutdown.clone());
    let server_stop = CancellationToken::new();
    let readiness = Readiness::default();
    let leader_gauge = crate::metrics::leader_gauge(&registry);
    let addr = SocketAddr::new(args.http_address, args.http_port_for(kind));
    let (http_addr, server) = http::serve(
        addr,
        http::router(registry.clone(), readiness.clone(), &args.metrics_path),
        server_stop.clone(),
    )
    .await
    .with_context(|| format!("binding HTTP server to {addr}"))?;
    tracing::info!(service = kind.component(), %http_addr, provisioner = %args.provisioner_name, "HTTP server listening (metrics, healthz, readyz)");

    let identity = leader::identity(args.leader_election_identity.as_deref());
    let lease = lease_name(&args.provisioner_name, kind.lease_suffix());
    let ctx = ServiceContext {
        client: client.clone(),
        args: args.clone(),
        registry,
        readiness: readiness.clone(),
        shutdown: shutdown.clone(),
        identity: identity.clone(),
        kind,
        http_addr,
    };

    let result = if args.leader_election {
        let namespace = leader::discover_namespace(
            args.leader_election_namespace.as_deref(),
            std::env::var("POD_NAMESPACE").ok().as_deref(),
            std::path::Path::new(leader::SERVICE_ACCOUNT_NAMESPACE_FILE),
        );
        let timing = LeaseTiming {
            lease_duration: args.lease_duration,
            renew_deadline: args.renew_deadline,
            retry_period: args.retry_period,
        };
        let elector = loop {
            match LeaderElector::new(client.clone(), &namespace, &lease, &identity, timing).await {
                Ok(e) => break Some(e),
                Err(err) => {
                    tracing::warn!(lease = %lease, namespace, error = %err, "cannot prepare leader election, retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break None,
                        _ = tokio::time::sleep(args.retry_period) => {}
                    }
                }
            }
        };
        match elector {
            None => Ok(()),
            Some(elector) => {
                tracing::info!(lease = %lease, namespace, identity, "standing by for the lease");
                if elector.acquire(&shutdown).await {
                    tracing::info!(lease = %lease, identity, "became leader");
                    leader_gauge.with_label_values(&[&lease]).set(1);
                    readiness.set_leading(true);
                    let result = lead(&elector, ctx, work).await;
                    leader_gauge.with_label_values(&[&lease]).set(0);
                    readiness.set_leading(false);
                    result
                } else {
                    Ok(())
                }
            }
        }
    } else {
        tracing::info!("leader election disabled: working as the only replica");
        readiness.set_leading(true);
        let grace = args.shutdown_grace_period;
        let handle = tokio::spawn(work(ctx));
        finish_work(handle, &shutdown, grace).await
    };

    server_stop.cancel();
    let _ = server.await;
    result
}

async fn lead<F, Fut>(elector: &LeaderElector, ctx: ServiceContext, work: F) -> anyhow::Result<()>
where
    F: FnOnce(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let shutdown = ctx.shutdown.clone();
    let grace = ctx.args.shutdown_grace_period;
    let mut handle = tokio::spawn(work(ctx));
    let abort = handle.abort_handle();
    tokio::select! {
        lost = elector.hold() => {
            handle.abort();
            let _ = handle.await;
            tracing::error!(reason = %lost, "leader lease lost; all work stopped");
            anyhow::bail!("leader lease lost: {lost}")
        }
        res = &mut handle => {
            elector.release().await;
            match res {
                Ok(r) => r,
                Err(join) => Err(anyhow::anyhow!("work loop panicked: {join}")),
            }
        }
        _ = shutdown.cancelled() => {
            // Keep renewing while in-flight work drains; a lost lease still wins.
            let result = tokio::select! {
                lost = elector.hold() => {
                    abort.abort();
                    Err(anyhow::anyhow!("leader lease lost during shutdown: {lost}"))
                }
                r = finish_work(handle, &shutdown, grace) => r,
            };
            elector.release().await;
            result
        }
    }
}

/// Wait for the work task; after `shutdown` fires, give it `grace` to return,
/// then abort it.
async fn finish_work(
    mut handle: tokio::task::JoinHandle<anyhow::Result<()>>,
    shutdown: &CancellationToken,
    grace: std::time::Duration,
) -> anyhow::Result<()> {
    let joined = tokio::select! {
        r = &mut handle => Some(r),
        _ = shutdown.cancelled() => None,
    };
    let joined = match joined {
        Some(r) => r,
        None => match tokio::time::timeout(grace, &mut handle).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "in-flight work did not finish within the grace period; abandoning it"
                );
                handle.abort();
                return Ok(());
            }
        },
    };
    match joined {
        Ok(r) => r,
        Err(join) => Err(anyhow::anyhow!("work loop panicked: {join}")),
    }
}
