//! The frame every service runs in ([`run_service`]): kube client, `/metrics`
//! `/healthz` `/readyz`, standby until the service's Lease is held, the work loop
//! once per leader term with a [`ServiceContext`], and graceful shutdown.
//!
//! A lost Lease aborts the work loop and awaits it; the process stays up, not
//! ready, and campaigns again. SIGTERM lets the loop finish for
//! `--shutdown-grace-period`, then aborts it and releases the Lease. A service
//! owns every task it spawns (a `JoinSet` held by the work future), so the abort
//! stops them all. Details: docs/decisions/0003-leader-election-and-the-frame.md.

use std::future::Future;
use std::net::SocketAddr;

use anyhow::Context;
use api_types::lease_name;
use kube::Client;
use prometheus::Registry;
use tokio_util::sync::CancellationToken;

use crate::runtime::api_reachability::log_failure;
use crate::runtime::config::{CommonArgs, ServiceSpec};
use crate::runtime::health::{self, Heartbeat, LeaderTerm, Liveness};
use crate::runtime::http::{self, Readiness};
use crate::runtime::leader::{self, LeadLost, LeaderElector, LeaseTiming};

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
    /// Beat it while the work loop makes progress or is idle; `/healthz` fails
    /// once it has not beaten for `--healthz-stall-timeout` ([`crate::runtime::health`]).
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
/// with a fresh [`ServiceContext`] until `ctx.shutdown`. Errors: setup failures
/// or `work`'s own error; a lost Lease is not one (the replica campaigns again).
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
    let client = match launch.client {
        Some(client) => client,
        None => crate::runtime::kube_client::client_from_args(&args, Some(&registry)).await?,
    };
    let shutdown = launch.shutdown.unwrap_or_else(|| {
        let shutdown = CancellationToken::new();
        crate::runtime::shutdown::cancel_on_signal(shutdown.clone());
        shutdown
    });
    let server_stop = CancellationToken::new();
    let readiness = Readiness::default();
    let liveness = Liveness::new(
        Heartbeat::default(),
        args.healthz_stall_timeout,
        health::renew_tolerance(args.renew_deadline, args.retry_period),
    );
    let leader_gauge = crate::runtime::metrics::leader_gauge(&registry);
    crate::runtime::metrics::register_process_collector(&registry);
    let addr = args.http_socket_addr(spec);
    let (http_addr, server) = http::serve(
        addr,
        http::router(
            registry.clone(),
            readiness.clone(),
            liveness.clone(),
            &args.metrics_path,
        ),
        server_stop.clone(),
    )
    .await
    .with_context(|| format!("binding HTTP server to {addr}"))?;
    tracing::info!(service = spec.name, %http_addr, provisioner = %args.provisioner_name, "HTTP server listening (metrics, healthz, readyz)");
    let redis_probe = tokio::spawn(crate::handoff::reachability::watch_reachability(
        args.redis(),
        crate::handoff::reachability::reachable_gauge(&registry),
        std::time::Duration::from_secs(5),
        server_stop.clone(),
    ));

    let identity = leader::identity(args.leader_election_identity.as_deref());
    let lease = lease_name(&args.provisioner_name, spec.lease_suffix);
    // Exported from the start (0 = standing by), so a service with replicas
    // up but no leader shows as 0 rather than as no series at all.
    leader_gauge.with_label_values(&[&lease]).set(0);
    let ctx = ServiceContext {
        client: client.clone(),
        args: args.clone(),
        registry,
        readiness: readiness.clone(),
        shutdown: shutdown.clone(),
        identity: identity.clone(),
        spec,
        http_addr,
        heartbeat: liveness.heartbeat().clone(),
        term: if args.leader_election {
            liveness.term(args.renew_deadline)
        } else {
            LeaderTerm::unconditional()
        },
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
        let lost_total = crate::runtime::metrics::counter_vec(
            &ctx.registry,
            "leader_election_lost_total",
            "Leader terms that ended with the Lease lost (work aborted, campaigning again), by Lease name.",
            &["name"],
        );
        lost_total.with_label_values(&[&lease]);
        let campaign = Campaign {
            client: &client,
            namespace: &namespace,
            lease: &lease,
            identity: &identity,
            timing,
            shutdown: &shutdown,
        };
        loop {
            // A fresh elector per term: kube-lease-manager's state is not
            // trusted after we declared the lead lost.
            let Some(elector) = campaign.elector(&readiness).await else {
                break Ok(());
            };
            let elector = elector.on_renewed({
                let liveness = liveness.clone();
                move || liveness.renewed()
            });
            tracing::info!(lease = %lease, namespace, identity, "standing by for the lease");
            if !elector.acquire(&shutdown).await {
                break Ok(());
            }
            tracing::info!(lease = %lease, identity, "became leader");
            leader_gauge.with_label_values(&[&lease]).set(1);
            readiness.set_leading(true);
            readiness.set_lost(false);
            liveness.set_leading(true);
            liveness.set_working(true);
            let term = lead(&elector, ctx.clone(), &work).await;
            liveness.set_working(false);
            liveness.set_leading(false);
            leader_gauge.with_label_values(&[&lease]).set(0);
            readiness.set_leading(false);
            match term {
                Term::Ended(result) => break result,
                Term::Lost(reason) => {
                    lost_total.with_label_values(&[&lease]).inc();
                    readiness.set_lost(true);
                    tracing::error!(lease = %lease, %reason, "leader lease lost; all work stopped; not ready, campaigning again");
                    if shutdown.is_cancelled() {
                        break Ok(());
                    }
                }
            }
        }
    } else {
        tracing::info!("leader election disabled: working as the only replica");
        // The only replica works as leader: report it so (no Lease is held).
        leader_gauge.with_label_values(&[&lease]).set(1);
        readiness.set_leading(true);
        liveness.set_working(true);
        let grace = args.shutdown_grace_period;
        let mut handle = tokio::spawn(work(ctx));
        let result = finish_work(&mut handle, &shutdown, grace).await;
        liveness.set_working(false);
        result
    };

    server_stop.cancel();
    let _ = server.await;
    let _ = redis_probe.await;
    result
}

/// How one leader term ended.
enum Term {
    /// The work returned, or SIGTERM drained it; the Lease was released.
    /// The run is over with this result.
    Ended(anyhow::Result<()>),
    /// The Lease was lost; the work was aborted and awaited.
    Lost(LeadLost),
}

/// What a replica needs to campaign for its Lease.
struct Campaign<'a> {
    client: &'a Client,
    namespace: &'a str,
    lease: &'a str,
    identity: &'a str,
    timing: LeaseTiming,
    shutdown: &'a CancellationToken,
}

impl Campaign<'_> {
    /// Prepare an elector, retrying every retry period while the API server cannot be reached
    /// (`None` on shutdown). Once the Lease could be read the replica is a healthy standby again:
    /// the not-ready state left by a lost term is cleared.
    async fn elector(&self, readiness: &Readiness) -> Option<LeaderElector> {
        loop {
            match LeaderElector::new(
                self.client.clone(),
                self.namespace,
                self.lease,
                self.identity,
                self.timing,
            )
            .await
            {
                Ok(e) => {
                    readiness.set_lost(false);
                    return Some(e);
                }
                Err(err) => {
                    let lease = format!("{}/{}", self.namespace, self.lease);
                    log_failure(
                        &lease,
                        "cannot prepare leader election, retrying",
                        err.as_ref(),
                    );
                    tokio::select! {
                        _ = self.shutdown.cancelled() => return None,
                        _ = tokio::time::sleep(self.timing.retry_period) => {}
                    }
                }
            }
        }
    }
}

/// Run `work` while holding the Lease; release it only after the work and the
/// renewal loop are gone (the loop may hold the lease manager's lock). A lost
/// Lease is not released.
async fn lead<F, Fut>(elector: &LeaderElector, ctx: ServiceContext, work: &F) -> Term
where
    F: Fn(ServiceContext) -> Fut,
    Fut: Future<Output = anyhow::Result<()>> + Send + 'static,
{
    let shutdown = ctx.shutdown.clone();
    let grace = ctx.args.shutdown_grace_period;
    let mut handle = tokio::spawn(work(ctx));
    // One watchdog for the whole term: polled while working and while draining,
    // so SIGTERM does not restart the renew deadline.
    let mut hold = Box::pin(elector.hold());
    let end = tokio::select! {
        lost = &mut hold => TermEnd::Lost(lost),
        res = &mut handle => TermEnd::Returned(joined(res)),
        _ = shutdown.cancelled() => {
            // Keep renewing while in-flight work drains; a lost lease still wins.
            tokio::select! {
                lost = &mut hold => TermEnd::LostDraining(lost),
                r = finish_work(&mut handle, &shutdown, grace) => TermEnd::Returned(r),
            }
        }
    };
    drop(hold);
    match end {
        TermEnd::Returned(result) => {
            elector.release().await;
            Term::Ended(result)
        }
        TermEnd::Lost(lost) => {
            stop_work(handle).await;
            Term::Lost(lost)
        }
        TermEnd::LostDraining(lost) => {
            stop_work(handle).await;
            tracing::error!(reason = %lost, "leader lease lost while shutting down; all work stopped");
            Term::Ended(Err(anyhow::anyhow!(
                "leader lease lost during shutdown: {lost}"
            )))
        }
    }
}

/// How a term's work and Lease watch ended, before the Lease is released.
enum TermEnd {
    /// The work returned (by itself or drained after SIGTERM).
    Returned(anyhow::Result<()>),
    /// The Lease was lost while working.
    Lost(LeadLost),
    /// The Lease was lost while draining after SIGTERM.
    LostDraining(LeadLost),
}

/// Abort the work task and wait until it is gone (its future dropped, so its
/// JoinSets are aborted too). A task that had already finished is just reaped.
async fn stop_work(handle: tokio::task::JoinHandle<anyhow::Result<()>>) {
    handle.abort();
    match handle.await {
        Err(join) if join.is_panic() => {
            tracing::error!(error = %join, "work loop panicked while being stopped")
        }
        _ => {}
    }
}

/// The work loop's result from its join result (a panic becomes an error).
fn joined(res: Result<anyhow::Result<()>, tokio::task::JoinError>) -> anyhow::Result<()> {
    match res {
        Ok(r) => r,
        Err(join) => Err(anyhow::anyhow!("work loop panicked: {join}")),
    }
}

/// Wait for the work task; after `shutdown` fires, give it `grace` to return,
/// then abort it and wait until it is gone. Returns the work's result, or `Ok`
/// when it was aborted.
async fn finish_work(
    handle: &mut tokio::task::JoinHandle<anyhow::Result<()>>,
    shutdown: &CancellationToken,
    grace: std::time::Duration,
) -> anyhow::Result<()> {
    let res = tokio::select! {
        r = &mut *handle => Some(r),
        _ = shutdown.cancelled() => None,
    };
    let res = match res {
        Some(r) => r,
        None => match tokio::time::timeout(grace, &mut *handle).await {
            Ok(r) => r,
            Err(_) => {
                tracing::warn!(
                    ?grace,
                    "in-flight work did not finish within the grace period; aborting it"
                );
                handle.abort();
                if let Err(join) = handle.await {
                    if join.is_panic() {
                        tracing::error!(error = %join, "work loop panicked while being aborted");
                    }
                }
                return Ok(());
            }
        },
    };
    joined(res)
}
