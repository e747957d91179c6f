//! The frame every service runs in ([`run_service`]): kube client, `/metrics`
//! `/healthz` `/readyz`, standby until the service's Lease is held, the work loop
//! once per leader term with a [`ServiceContext`], and graceful shutdown. A lost
//! Lease aborts the work loop (and so every task it owns) and campaigns again:
//! docs/decisions/0003-leader-election-and-the-frame.md.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use api_types::lease_name;
use kube::Client;
use prometheus::{IntGaugeVec, Registry};
use tokio_util::sync::CancellationToken;

use crate::runtime::api_reachability::log_failure;
use crate::runtime::config::{CommonArgs, ServiceSpec};
use crate::runtime::health::{Heartbeat, LeaderTerm, Liveness};
use crate::runtime::http::{self, Readiness};
use crate::runtime::leader::{self, LeadLost, LeaderElector, LeaseTiming};
use crate::runtime::metrics::{counter_vec, gauge_vec};

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
    pub spec: ServiceSpec,
    /// Address the HTTP server is bound to.
    pub http_addr: SocketAddr,
    /// Beat it while the work loop makes progress or is idle ([`crate::runtime::health`]).
    pub heartbeat: Heartbeat,
    /// This replica's leader term: check it right before an irreversible
    /// action (always current with `--leader-election=false`).
    pub term: LeaderTerm,
}

/// How [`run_service`] gets its client and shutdown signal; the default builds the
/// client from the flags and cancels on SIGTERM/SIGINT. Tests and embedders set either.
#[derive(Default)]
pub struct Launch {
    /// A client the caller built, instead of one from `--kubeconfig`/in-cluster.
    pub client: Option<Client>,
    /// Stands for SIGTERM: cancelling it starts the graceful shutdown (no signal handler then).
    pub shutdown: Option<CancellationToken>,
}

/// [`run_service`] as a service binary runs it (client from the flags, SIGTERM), with
/// `term(ctx, deps)` once per leader term. Errors: as [`run_service`].
pub async fn serve<D, Fut>(
    spec: ServiceSpec,
    args: CommonArgs,
    registry: Registry,
    deps: D,
    term: fn(ServiceContext, D) -> Fut,
) -> anyhow::Result<()>
where
    D: Clone,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    run_service(spec, args, registry, Launch::default(), move |ctx| {
        term(ctx, deps.clone())
    })
    .await
}

/// Run the service `spec` names (module docs): `work` runs once per leader term
/// with a fresh [`ServiceContext`] until `ctx.shutdown`. Errors: setup failures (such as
/// Lease timing flags client-go would refuse) or `work`'s own error; a lost Lease is not one.
pub async fn run_service<F, Fut>(
    spec: ServiceSpec,
    args: CommonArgs,
    registry: Registry,
    launch: Launch,
    work: F,
) -> anyhow::Result<()>
where
    F: Fn(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let timing = args.lease_timing();
    if args.leader_election {
        timing.validate().map_err(anyhow::Error::msg)?;
    }
    let client = match launch.client {
        Some(client) => client,
        None => {
            crate::runtime::kube_client::client_from_args(&args.cluster, Some(&registry)).await?
        }
    };
    let shutdown = launch.shutdown.unwrap_or_else(|| {
        let shutdown = CancellationToken::new();
        crate::runtime::shutdown::cancel_on_signal(shutdown.clone());
        shutdown
    });
    let readiness = Readiness::default();
    let liveness = Liveness::new(
        args.healthz_stall_timeout,
        args.renew_deadline,
        args.retry_period,
    );
    // client-go's name; 0 from the start, so replicas without a leader show as 0, not as no series.
    let help = "1 while this replica holds the named Lease, 0 otherwise.";
    let leader_gauge = gauge_vec(&registry, "leader_election_master_status", help, &["name"]);
    let server_stop = CancellationToken::new();
    let (http_addr, mut background) =
        endpoints(spec, &args, &registry, &readiness, &liveness, &server_stop).await?;

    let identity = leader::identity(args.leader_election_identity.as_deref());
    let lease = lease_name(&args.cluster.provisioner_name, spec.lease_suffix);
    leader_gauge.with_label_values(&[&lease]).set(0);
    let ctx = ServiceContext {
        client,
        args: args.clone(),
        registry,
        readiness,
        shutdown,
        identity,
        spec,
        http_addr,
        heartbeat: liveness.heartbeat().clone(),
        term: if args.leader_election {
            liveness.term(args.renew_deadline)
        } else {
            LeaderTerm::unconditional()
        },
    };

    let term = TermState {
        lease,
        gauge: leader_gauge,
        liveness,
    };
    let result = if args.leader_election {
        campaign(ctx, &term, timing, &work).await
    } else {
        work_alone(ctx, &term, &work).await
    };

    server_stop.cancel();
    // A panicked probe is not the service's result: drained, not unwrapped.
    while background.join_next().await.is_some() {}
    result
}

/// Serve `/metrics`, `/healthz` and `/readyz` on the service's HTTP address, and probe Redis
/// (`redis_reachable`) every 5 s, both until `stop`. Returns the bound address and the tasks.
/// Errors: the address cannot be bound.
async fn endpoints(
    spec: ServiceSpec,
    args: &CommonArgs,
    registry: &Registry,
    readiness: &Readiness,
    liveness: &Liveness,
    stop: &CancellationToken,
) -> anyhow::Result<(SocketAddr, tokio::task::JoinSet<()>)> {
    crate::runtime::metrics::register_process_collector(registry);
    let addr = args.http_socket_addr(spec);
    let router = http::router(
        registry.clone(),
        readiness.clone(),
        liveness.clone(),
        &args.metrics_path,
    );
    let (http_addr, server) = http::serve(addr, router, stop.clone())
        .await
        .with_context(|| format!("binding HTTP server to {addr}"))?;
    tracing::info!(service = spec.name, %http_addr, provisioner = %args.cluster.provisioner_name, "HTTP server listening (metrics, healthz, readyz)");
    let mut tasks = tokio::task::JoinSet::new();
    tasks.spawn(async move {
        let _ = server.await;
    });
    tasks.spawn(crate::handoff::reachability::watch_reachability(
        args.cluster.redis(),
        crate::handoff::reachability::reachable_gauge(registry),
        std::time::Duration::from_secs(5),
        stop.clone(),
    ));
    Ok((http_addr, tasks))
}

/// What a leader term's start and end report: the Lease's name, its
/// `leader_election_master_status` gauge and the replica's liveness.
struct TermState {
    lease: String,
    gauge: IntGaugeVec,
    liveness: Liveness,
}

impl TermState {
    /// Report a term starting (`true`: gauge, readiness, liveness) or ending (the reverse).
    fn set_leading(&self, ctx: &ServiceContext, leading: bool) {
        let gauge = self.gauge.with_label_values(&[&self.lease]);
        if leading {
            gauge.set(1);
            ctx.readiness.set_leading(true);
            self.liveness.set_leading(true);
            self.liveness.set_working(true);
        } else {
            self.liveness.set_working(false);
            self.liveness.set_leading(false);
            gauge.set(0);
            ctx.readiness.set_leading(false);
        }
    }
}

/// Campaign for the Lease and run `work` once per term held, until `ctx.shutdown`: a lost
/// Lease counts in `leader_election_lost_total`, marks the replica not ready and campaigns
/// again. Returns the last term's result.
async fn campaign<F, Fut>(
    ctx: ServiceContext,
    term: &TermState,
    timing: LeaseTiming,
    work: &F,
) -> anyhow::Result<()>
where
    F: Fn(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let (lease, shutdown, readiness) = (&term.lease, &ctx.shutdown, &ctx.readiness);
    let namespace = leader::discover_namespace(
        ctx.args.cluster.leader_election_namespace.as_deref(),
        std::env::var("POD_NAMESPACE").ok().as_deref(),
        std::path::Path::new(leader::SERVICE_ACCOUNT_NAMESPACE_FILE),
    );
    let help = "Leader terms that ended with the Lease lost (work aborted, campaigning again), by Lease name.";
    let lost_total = counter_vec(&ctx.registry, "leader_election_lost_total", help, &["name"]);
    lost_total.with_label_values(&[lease]);
    let identity = ctx.identity.as_str();
    loop {
        // A fresh elector per term: kube-lease-manager's state is not
        // trusted after we declared the lead lost.
        let elector =
            match LeaderElector::new(ctx.client.clone(), &namespace, lease, identity, timing).await
            {
                Ok(elector) => elector,
                Err(err) => {
                    let what = "cannot prepare leader election, retrying";
                    log_failure(&format!("{namespace}/{lease}"), what, err.as_ref());
                    let pause = tokio::time::sleep(timing.retry_period);
                    match shutdown.run_until_cancelled(pause).await {
                        Some(()) => continue,
                        None => return Ok(()),
                    }
                }
            };
        // The Lease could be read: a healthy standby again, not the not-ready lost term.
        readiness.set_lost(false);
        let elector = elector.on_renewed({
            let liveness = term.liveness.clone();
            move || liveness.renewed()
        });
        tracing::info!(lease = %lease, namespace, identity, "standing by for the lease");
        if !elector.acquire(shutdown).await {
            return Ok(());
        }
        tracing::info!(lease = %lease, identity, "became leader");
        term.set_leading(&ctx, true);
        let result = lead(&elector, ctx.clone(), work).await;
        term.set_leading(&ctx, false);
        match result {
            Ok(result) => return result,
            Err(reason) => {
                lost_total.with_label_values(&[lease]).inc();
                readiness.set_lost(true);
                tracing::error!(lease = %lease, %reason, "leader lease lost; all work stopped; not ready, campaigning again");
                if shutdown.is_cancelled() {
                    return Ok(());
                }
            }
        }
    }
}

/// Run `work` once as the only replica (`--leader-election=false`), reported as leader
/// though no Lease is held, until it returns or `ctx.shutdown` and the grace period end.
async fn work_alone<F, Fut>(ctx: ServiceContext, term: &TermState, work: &F) -> anyhow::Result<()>
where
    F: Fn(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    tracing::info!("leader election disabled: working as the only replica");
    term.gauge.with_label_values(&[&term.lease]).set(1);
    ctx.readiness.set_leading(true);
    term.liveness.set_working(true);
    let (shutdown, grace) = (ctx.shutdown.clone(), ctx.args.shutdown_grace_period);
    let mut handle = tokio::spawn(work(ctx));
    let result = finish_work(&mut handle, &shutdown, grace).await;
    term.liveness.set_working(false);
    result
}

/// Run `work` while holding the Lease, released (unless lost) once the work is gone.
/// `Ok`: the run is over; `Err`: the Lease was lost, the work aborted and awaited.
async fn lead<F, Fut>(
    elector: &LeaderElector,
    ctx: ServiceContext,
    work: &F,
) -> Result<anyhow::Result<()>, LeadLost>
where
    F: Fn(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let shutdown = ctx.shutdown.clone();
    let grace = ctx.args.shutdown_grace_period;
    let mut handle = tokio::spawn(work(ctx));
    // One watchdog for the whole term, polled while working and while draining
    // after SIGTERM (a lost Lease still wins), so SIGTERM does not restart the renew deadline.
    let lost = tokio::select! {
        lost = elector.hold() => lost,
        result = finish_work(&mut handle, &shutdown, grace) => {
            elector.release().await;
            return Ok(result);
        }
    };
    let draining = shutdown.is_cancelled();
    stop_work(&mut handle).await;
    if !draining {
        return Err(lost);
    }
    tracing::error!(reason = %lost, "leader lease lost while shutting down; all work stopped");
    Ok(Err(anyhow::anyhow!(
        "leader lease lost during shutdown: {lost}"
    )))
}

type Work = tokio::task::JoinHandle<anyhow::Result<()>>;

/// Abort the work task and wait until it is gone (its JoinSets dropped with it).
async fn stop_work(handle: &mut Work) {
    handle.abort();
    if let Err(join) = handle.await {
        if join.is_panic() {
            tracing::error!(error = %join, "work loop panicked while being stopped");
        }
    }
}

/// Wait for the work task; after `shutdown` fires, give it `grace` to return, then
/// abort it. Returns the work's result (a panic is an error), or `Ok` when aborted.
async fn finish_work(
    handle: &mut Work,
    shutdown: &CancellationToken,
    grace: std::time::Duration,
) -> anyhow::Result<()> {
    let finished = match shutdown.run_until_cancelled(&mut *handle).await {
        Some(joined) => Ok(joined),
        None => tokio::time::timeout(grace, &mut *handle).await,
    };
    let Ok(joined) = finished else {
        tracing::warn!(
            ?grace,
            "in-flight work did not finish within the grace period; aborting it"
        );
        stop_work(handle).await;
        return Ok(());
    };
    joined.unwrap_or_else(|join| Err(anyhow::anyhow!("work loop panicked: {join}")))
}
