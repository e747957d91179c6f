//! Benchmark (not a test): the three release service binaries against a
//! control plane — the in-process API-server simulator (`--control-plane
//! sim`, default), a real kube-apiserver + kube-controller-manager of
//! `--kube-version` (default 1.19; `--control-plane real`, each service as
//! its own ServiceAccount under the deploy's RBAC), or an existing cluster
//! (`--kubeconfig`) — and a private `redis-server`. Prints, in one run:
//!
//! 1. the controller manager alone (real plane; nothing of ours running):
//!    claims annotated per second, the annotation delay at the offered rate,
//!    PVs marked `Released` per second;
//! 2. a reference provisioner inside the benchmark (`e2e::bench::reference`,
//!    before the services start; `--no-reference` skips it): a burst of N
//!    claims and its reclaim, timed like the services';
//! 3. a burst of N claims (`--claims`) served by the services: claims/s to
//!    PV created and to claim Bound, p50/p99 claim created → PV created, API
//!    requests and writes per volume (real plane: the API server's audit log;
//!    simulator: its counters), the controller manager's requests meanwhile
//!    beside its limit (`--kcm-api-qps`);
//! 4. reclaim of the burst: PVs deleted per second, API cost per volume;
//! 5. an offered load (`--rate`, `--rate-claims`): p50/p99 claim created → PV created;
//! 6. peak RSS of each service (`VmHWM`), and the ratios to the controller
//!    manager's rates and to the reference provisioner's;
//! 7. with `--peer NAME` (real plane or `--kubeconfig`): the same burst,
//!    reclaim and offered load served by that Go provisioner alone (before the
//!    services start, `e2e::bench::peer`), and a side-by-side table with the
//!    ratios ours/peer.
//!
//! Every burst and reclaim also prints the CPU time each process used
//! (control plane, Redis, services, benchmark: `e2e::bench::cpu`).
//!
//! With `--outage 30s` it runs the API-server outage measurement instead
//! (see `e2e::bench::outage`).
//!
//! `cargo run --release -p e2e --bin bench -- --control-plane real --claims 1000`

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use e2e::bench::burst::{self, Burst, Reclaim};
use e2e::bench::cost::{self, ApiCost};
use e2e::bench::cpu::{self, CpuSample};
use e2e::bench::kcm::{self, KcmLoad, KcmRates};
use e2e::bench::load;
use e2e::bench::observe::{self, pct, wait_seen, Seen, SharedSeen};
use e2e::bench::outage;
use e2e::bench::peer::{self, Figures};
use e2e::bench::reference;
use e2e::harness::peers::{Peer, PeerEnv};
use e2e::harness::{ControlPlane, Profile, Service, System, SystemOptions};
use e2e::realkube::Assets;

/// Which control plane the benchmark starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PlaneChoice {
    /// The in-process simulator (PV-controller emulation on).
    Sim,
    /// A real control plane of `--kube-version` (see `e2e::realkube::Assets::locate`).
    Real,
}

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Provisioning/reclaim benchmark of the three services"
)]
struct Args {
    /// Control plane to start (ignored with `--kubeconfig`).
    #[arg(long, value_enum, default_value_t = PlaneChoice::Sim)]
    control_plane: PlaneChoice,
    /// Kubernetes releases of `--control-plane real`, comma-separated: 1.19
    /// (the release of the recorded BENCHMARKS runs), 1.37 or `1.19,1.37`
    /// (the whole run once per release, one after the other).
    #[arg(long, value_delimiter = ',', default_value = "1.19")]
    kube_version: Vec<e2e::realkube::KubeVersion>,
    /// Run against this existing cluster instead (every service uses this
    /// kubeconfig; no request counts, no controller-manager-alone phase).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Claims in the burst (created as fast as 16 requests in flight allow);
    /// also the size of the controller-manager-alone bursts.
    #[arg(long, default_value_t = 1000)]
    claims: usize,
    /// Offered load of the latency phase, claims per second.
    #[arg(long, default_value_t = 20.0)]
    rate: f64,
    /// Claims created at the offered load.
    #[arg(long, default_value_t = 200)]
    rate_claims: usize,
    /// Run with the provisioner finalizer (`--add-finalizer`).
    #[arg(long)]
    add_finalizer: bool,
    /// `--kube-api-qps` of the services: 0 (default) switches the client-side
    /// limit off (the "tuned" runs); `shipped` uses the services' own default.
    #[arg(long, default_value = "0")]
    kube_api_qps: String,
    /// Extra service flag, `SERVICE=FLAG` (`provision-svc=--worker-threads=32`); repeatable.
    #[arg(long = "service-arg", value_name = "SERVICE=FLAG")]
    service_args: Vec<String>,
    /// Skip the controller-manager-alone phase.
    #[arg(long)]
    no_kcm_phase: bool,
    /// Skip the reference-provisioner phase (a burst of `--claims` and its
    /// reclaim served by a minimal provisioner inside the benchmark, before
    /// the services start: see `e2e::bench::reference`).
    #[arg(long)]
    no_reference: bool,
    /// Instead of the phases above: an API-server outage of this length
    /// (`30s`, `2m`) in the middle of a `--claims` batch.
    #[arg(long, value_parser = humantime::parse_duration)]
    outage: Option<Duration>,
    /// kube-controller-manager's `--kube-api-qps/--kube-api-burst` on the
    /// real plane, `QPS/BURST` (default: the harness's 200/400). Every
    /// claim the controller manager annotates and binds costs its PV
    /// controller's client about five requests.
    #[arg(long, value_parser = parse_qps_burst)]
    kcm_api_qps: Option<(u32, u32)>,
    /// Also measure this Go provisioner alone (built by `tools/peers/build.sh`)
    /// and print it beside the services; repeatable. Real plane or `--kubeconfig` only.
    #[arg(long = "peer", value_enum)]
    peers: Vec<Peer>,
    /// Start a real node beside the real control plane (kubelet v1.37.2,
    /// containerd: root, `tools/node/build.sh` and `images.sh`; `--kube-version
    /// 1.37` only); every claim names it as its selected node. Needed by
    /// `--peer local-path`, whose helper pods run there.
    #[arg(long)]
    node: bool,
    /// Upper bound of each phase, seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

const CLASS: &str = "bench";

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let real = args.kubeconfig.is_none() && args.control_plane == PlaneChoice::Real;
    if !real {
        return run(&args, None).await;
    }
    for version in &args.kube_version {
        run(&args, Some(*version)).await?;
    }
    Ok(())
}

/// The whole benchmark once, on a real control plane of `version` when given.
async fn run(args: &Args, version: Option<e2e::realkube::KubeVersion>) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let control_plane = match version {
        None => ControlPlane::default(),
        Some(version) => {
            let assets = Assets::locate(version).map_err(anyhow::Error::msg)?;
            println!(
                "control plane: real {} (kube-apiserver, kube-controller-manager, etcd from {})",
                assets.version,
                assets.dir.display()
            );
            ControlPlane::Real(assets)
        }
    };
    if let Some(kc) = &args.kubeconfig {
        println!("control plane: existing cluster ({})", kc.display());
    } else if !control_plane.is_real() {
        println!("control plane: simulator");
    }
    let mut sys = System::start(SystemOptions {
        profile: Profile::current(),
        control_plane,
        external_kubeconfig: args.kubeconfig.clone(),
        no_services: true,
        real_cluster: e2e::realkube::RealClusterOptions {
            controller_manager_qps: kcm_qps(args),
            apiserver_extra_flags: if args.node {
                e2e::realkube::node::apiserver_flags()
            } else {
                Vec::new()
            },
            ..Default::default()
        },
        ..Default::default()
    })
    .await?;
    let _node = match (args.node, sys.real()) {
        (false, _) => None,
        (true, Some(real)) if version == Some(e2e::realkube::KubeVersion::V1_37) => {
            let assets = e2e::realkube::node::node_or_skip("bench --node")
                .ok_or_else(|| anyhow::anyhow!("--node: this machine cannot run the node"))?;
            let node = e2e::realkube::node::RealNode::start(&real.cluster, &assets).await?;
            load::select_node(e2e::realkube::pki::NODE_NAME);
            println!(
                "node: {} Ready (kubelet v1.37.2); claims select it",
                e2e::realkube::pki::NODE_NAME
            );
            Some(node)
        }
        (true, _) => anyhow::bail!("--node needs --control-plane real --kube-version 1.37"),
    };
    configure(&mut sys, args)?;
    println!(
        "machine: {} cores, {}; load average {}",
        nproc(),
        cpu_model(),
        loadavg()
    );
    println!(
        "service flags: {}",
        sys.settings.args(Service::Provision, 0, 0).join(" ")
    );
    if sys.is_real() {
        let (q, b) = kcm_qps(args);
        println!("controller manager: --kube-api-qps {q} --kube-api-burst {b}");
    }
    sys.create_storage_class(CLASS, "Immediate", &[]).await?;
    let seen: SharedSeen = Arc::new(Mutex::new(Seen::default()));
    observe::spawn_watchers(&sys.client, &sys.namespace, seen.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    let kcm = if args.no_kcm_phase || args.outage.is_some() {
        None
    } else if args.kubeconfig.is_some() {
        println!("controller manager alone: skipped on an existing cluster");
        None
    } else {
        let provisioner = sys.settings.provisioner_name.clone();
        let mark = cost::mark(&sys)?;
        let started = std::time::Instant::now();
        let r = kcm::measure(
            &KcmLoad {
                client: &sys.client,
                namespace: &sys.namespace,
                class: CLASS,
                provisioner: &provisioner,
                claims: args.claims,
                rate: args.rate,
                rate_claims: args.rate_claims,
                timeout,
            },
            &seen,
        )
        .await?;
        print_kcm(&r);
        print_kcm_requests(
            cost::controller_manager_since(&sys, mark)?.as_ref(),
            kcm_qps(args),
            started.elapsed(),
        );
        Some(r)
    };

    let reference = if args.no_reference || args.outage.is_some() {
        None
    } else {
        Some(measure_reference(&mut sys, args, &seen, timeout).await?)
    };

    let mut peers = Vec::new();
    for p in args.peers.iter().copied() {
        if args.outage.is_none() {
            peers.push(measure_peer(&mut sys, args, p, &seen, timeout).await?);
        }
    }

    for service in Service::ALL {
        sys.start_service(service, 0).await?;
    }
    sys.wait_leaders(Duration::from_secs(60)).await?;

    if let Some(d) = args.outage {
        let r = outage::run(&mut sys, &seen, args.claims, CLASS, d, timeout).await?;
        println!(
            "API outage {:.1?} (requested {d:?}) in a batch of {} claims ({} PVs before it): every claim Bound {:.2?} after the API's return (target <= 10 s)",
            r.api_down, r.claims, r.pvs_before, r.all_bound_after_return
        );
        if r.exited.is_empty() {
            println!("service processes exited: none");
        } else {
            for (s, replica, at) in &r.exited {
                println!(
                    "service process exited: {} replica {replica}, {at:.1?} into the outage",
                    s.binary_name()
                );
            }
            println!(
                "restarted by the benchmark after the API's return: {}",
                r.restarted
            );
        }
        let _ = print_rss(&mut sys);
        finish(&mut sys);
        return Ok(());
    }

    // ---- burst ----------------------------------------------------------------
    let n = args.claims;
    let names = load::names("burst", n);
    let mark = cost::mark(&sys)?;
    let ns = sys.namespace.clone();
    let cpu_mark = CpuSample::take(&process_ids(&mut sys));
    let ours = burst::provision(&sys.client, &ns, &names, CLASS, &seen, timeout).await?;
    let cpu_burst = cpu_mark.since();
    // The controller manager's requests over the burst's own window (the
    // same as `cpu_burst`'s), the services' after their last writes landed.
    let kcm_cost = cost::controller_manager_since(&sys, mark)?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let provision_cost = cost::since(&sys, mark)?;
    println!("claims: {n}");
    ours.print();
    println!(
        "  CPU during the burst: {}",
        cpu::format(cpu_burst.0, &cpu_burst.1, nproc())
    );
    print_cost("provisioning", provision_cost.as_ref(), n);
    print_kcm_requests(kcm_cost.as_ref(), kcm_qps(args), cpu_burst.0);
    print_terminated_watchers(&sys.client).await;

    // ---- reclaim --------------------------------------------------------------
    let mark = cost::mark(&sys)?;
    let cpu_mark = CpuSample::take(&process_ids(&mut sys));
    let ours_reclaim = burst::reclaim(&sys.client, &ns, &names, &seen, timeout).await?;
    let cpu_reclaim = cpu_mark.since();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let reclaim_cost = cost::since(&sys, mark)?;
    ours_reclaim.print();
    println!(
        "  CPU during the reclaim: {}",
        cpu::format(cpu_reclaim.0, &cpu_reclaim.1, nproc())
    );
    print_cost("reclaim", reclaim_cost.as_ref(), n);
    if let (Some(p), Some(r)) = (&provision_cost, &reclaim_cost) {
        println!(
            "API writes per volume, provisioning + reclaim: {:.2}",
            p.per(n).1 + r.per(n).1
        );
    }

    // ---- offered load ---------------------------------------------------------
    let lat = paced_latency(&sys, args, "paced", &seen, timeout).await?;

    let ours_rss = print_rss(&mut sys);
    if !peers.is_empty() {
        let ours_names = ours_process_names();
        let ours_fig = Figures {
            who: "ours".into(),
            claims: n,
            bound_per_sec: ours.bound_per_sec(),
            created_per_sec: ours.created_per_sec(),
            deleted_per_sec: ours_reclaim.deleted_per_sec(),
            paced: lat.clone(),
            cpu: peer::cpu_of(&cpu_burst.1, &ours_names)
                + peer::cpu_of(&cpu_reclaim.1, &ours_names),
            peak_rss_mib: ours_rss,
        };
        peer::print_side_by_side(&ours_fig, &peers, args.rate);
    }
    print_ratios(
        args,
        &ours,
        &ours_reclaim,
        kcm.as_ref(),
        reference.as_ref(),
        &lat,
    );
    println!("load average at the end: {}", loadavg());
    finish(&mut sys);
    Ok(())
}

/// The offered-load phase: `--rate-claims` claims named `<prefix>-NNNNN` at
/// `--rate`, each PV awaited, then deleted and their PVs awaited gone;
/// prints and returns claim created → PV created, sorted.
async fn paced_latency(
    sys: &System,
    args: &Args,
    prefix: &str,
    seen: &SharedSeen,
    timeout: Duration,
) -> anyhow::Result<Vec<Duration>> {
    let ns = &sys.namespace;
    let paced = load::names(prefix, args.rate_claims);
    load::create_claims(&sys.client, ns, &paced, CLASS, Some(args.rate), seen).await?;
    wait_seen(seen, timeout, "paced PVs", paced.len(), |s| {
        Seen::count(&s.pv_added, &paced)
    })
    .await?;
    let (lat, ann) = {
        let s = seen.lock().unwrap();
        (
            Seen::delays(&s.claim_created, &s.pv_added, &paced),
            Seen::delays(&s.claim_created, &s.claim_annotated, &paced),
        )
    };
    println!(
        "at {:.0} claims/s offered ({} claims): claim created -> PV created p50 {:.1?}, p99 {:.1?}; of which annotation (same claims) p50 {:.1?}, p99 {:.1?}",
        args.rate,
        paced.len(),
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        pct(&ann, 0.5),
        pct(&ann, 0.99),
    );
    load::delete_claims(&sys.client, ns, &paced, seen).await?;
    wait_seen(seen, timeout, "paced PVs deleted", paced.len(), |s| {
        Seen::count(&s.pv_deleted, &paced)
    })
    .await?;
    Ok(lat)
}

/// The processes whose CPU counts as ours: the three services and Redis.
fn ours_process_names() -> Vec<&'static str> {
    let mut names: Vec<&str> = Service::ALL.iter().map(|s| s.binary_name()).collect();
    names.push("redis");
    names
}

/// `peer` alone (nothing of ours running): a burst of `--claims`, its
/// reclaim and the offered load, on the benchmark's class under our
/// provisioner name. Errors: no peer binary, no kubeconfig for it (the
/// simulator), or a phase timed out.
async fn measure_peer(
    sys: &mut System,
    args: &Args,
    peer: Peer,
    seen: &SharedSeen,
    timeout: Duration,
) -> anyhow::Result<Figures> {
    let kubeconfig = match (&args.kubeconfig, sys.real()) {
        (Some(k), _) => k.clone(),
        (None, Some(r)) => r.cluster.admin_kubeconfig().to_path_buf(),
        (None, None) => anyhow::bail!(
            "--peer needs --control-plane real or --kubeconfig: the peers are client-go programs, not run on the simulator"
        ),
    };
    let name = peer.binary_name();
    let dir = tempfile::Builder::new().prefix("bench-peer-").tempdir()?;
    let provisioner = sys.settings.provisioner_name.clone();
    // The services' client limit; `shipped`: the peer's own default (client-go's 5/10).
    let qps = match (args.kube_api_qps.as_str(), sys.settings.kube_api_qps) {
        ("shipped", _) => Some((5.0, 10)),
        (_, q) if q <= 0.0 => None,
        (_, q) => Some((q as f32, 2000)),
    };
    println!("peer {name}: client limit {qps:?} (None: unlimited)");
    let env = PeerEnv {
        kubeconfig: &kubeconfig,
        client: &sys.client,
        provisioner: &provisioner,
        dir: &dir.path().join(name),
        qps,
    };
    let mut process = peer.start(&env).await?;
    let mut ids = process_ids(sys);
    ids.push((name.to_string(), process.pid()));
    let ns = sys.namespace.clone();
    let names = load::names(name, args.claims);
    let cpu_mark = CpuSample::take(&ids);
    let b = burst::provision(&sys.client, &ns, &names, CLASS, seen, timeout).await?;
    let cpu_burst = cpu_mark.since();
    let cpu_mark = CpuSample::take(&ids);
    let r = burst::reclaim(&sys.client, &ns, &names, seen, timeout).await?;
    let cpu_reclaim = cpu_mark.since();
    println!("peer {name} alone, {} claims:", args.claims);
    print_indented(&b, &r);
    println!(
        "    CPU during its burst: {}",
        cpu::format(cpu_burst.0, &cpu_burst.1, nproc())
    );
    println!(
        "    CPU during its reclaim: {}",
        cpu::format(cpu_reclaim.0, &cpu_reclaim.1, nproc())
    );
    let paced = paced_latency(sys, args, &format!("{name}-paced"), seen, timeout).await?;
    let peak_rss_mib = process.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
    println!("    peak RSS {name}: {peak_rss_mib:.1} MiB");
    drop(process);
    Ok(Figures {
        who: name.to_string(),
        claims: args.claims,
        bound_per_sec: b.bound_per_sec(),
        created_per_sec: b.created_per_sec(),
        deleted_per_sec: r.deleted_per_sec(),
        paced,
        cpu: peer::cpu_of(&cpu_burst.1, &[name]) + peer::cpu_of(&cpu_reclaim.1, &[name]),
        peak_rss_mib,
    })
}

/// The reference provisioner's burst and reclaim of `--claims` claims
/// (nothing of ours running), with the CPU each process used.
async fn measure_reference(
    sys: &mut System,
    args: &Args,
    seen: &SharedSeen,
    timeout: Duration,
) -> anyhow::Result<(Burst, Reclaim)> {
    let provisioner = sys.settings.provisioner_name.clone();
    let ns = sys.namespace.clone();
    let names = load::names("reference", args.claims);
    let running = reference::spawn(&sys.client, &ns, &provisioner);
    let mark = cost::mark(sys)?;
    let cpu_mark = CpuSample::take(&process_ids(sys));
    let b = burst::provision(&sys.client, &ns, &names, CLASS, seen, timeout).await?;
    let cpu_burst = cpu_mark.since();
    let kcm = cost::controller_manager_since(sys, mark)?;
    let cpu_mark = CpuSample::take(&process_ids(sys));
    let r = burst::reclaim(&sys.client, &ns, &names, seen, timeout).await?;
    let cpu_reclaim = cpu_mark.since();
    drop(running);
    wait_seen(seen, timeout, "reference claims gone", names.len(), |s| {
        Seen::count(&s.claim_gone, &names)
    })
    .await?;
    println!(
        "reference provisioner (inside the benchmark: PV on annotation, delete on Released, nothing else), {} claims:",
        args.claims
    );
    print_indented(&b, &r);
    println!(
        "    CPU during its burst: {}",
        cpu::format(cpu_burst.0, &cpu_burst.1, nproc())
    );
    print_kcm_requests(kcm.as_ref(), kcm_qps(args), cpu_burst.0);
    println!(
        "    CPU during its reclaim: {}",
        cpu::format(cpu_reclaim.0, &cpu_reclaim.1, nproc())
    );
    print_terminated_watchers(&sys.client).await;
    Ok((b, r))
}

fn print_indented(b: &Burst, r: &Reclaim) {
    println!(
        "    {:.0} PVs created/s ({:.2?}), {:.0} claims/s to claim Bound ({:.2?}); same run: annotated at {} claims/s; annotation -> PV p50 {:.1?}, p99 {:.1?}",
        b.created_per_sec(),
        b.to_pv,
        b.bound_per_sec(),
        b.to_bound,
        b.annotated_per_sec().map_or("?".into(), |a| format!("{a:.0}")),
        pct(&b.follow, 0.5),
        pct(&b.follow, 0.99)
    );
    println!(
        "    {:.0} PVs deleted/s ({:.2?}); same run: Released at {} PVs/s",
        r.deleted_per_sec(),
        r.to_deleted,
        r.to_released.map_or("?".into(), |(d, k)| format!(
            "{:.0}",
            e2e::bench::observe::per_sec(k, d)
        ))
    );
}

/// kube-controller-manager's requests `kcm` over `wall`, beside its
/// client-side limit: at the limit, the controller manager (not the
/// provisioner) sets the pace of annotation and binding.
fn print_kcm_requests(kcm: Option<&ApiCost>, qps: (u32, u32), wall: Duration) {
    if let Some(c) = kcm {
        let (qps, burst) = qps;
        let mut calls: Vec<_> = c.by_call.iter().collect();
        calls.sort_by(|a, b| b.1.cmp(a.1));
        calls.truncate(8);
        println!(
            "  controller manager's requests meanwhile: {} in {:.1?} = {:.0}/s (its --kube-api-qps {qps}, --kube-api-burst {burst}); most: {calls:?}",
            c.requests,
            wall,
            observe::per_sec(c.requests as usize, wall)
        );
    }
}

/// The API server's count of watchers it closed for not keeping up, since
/// it started (see `observe::terminated_watchers`).
async fn print_terminated_watchers(client: &kube::Client) {
    match observe::terminated_watchers(client).await {
        Ok(None) => {}
        Ok(Some(t)) if t.is_empty() => {
            println!("  watchers the API server closed for not keeping up, so far: none")
        }
        Ok(Some(t)) => {
            println!("  watchers the API server closed for not keeping up, so far: {t:?}")
        }
        Err(e) => println!("  watchers closed for not keeping up: unknown ({e})"),
    }
}

/// Every process sharing the machine that the benchmark can name: the real
/// control plane's, Redis, the running services and the benchmark itself.
fn process_ids(sys: &mut System) -> Vec<(String, u32)> {
    let mut ids: Vec<(String, u32)> = sys
        .real()
        .map(|r| {
            r.cluster
                .process_ids()
                .into_iter()
                .map(|(n, p)| (n.to_string(), p))
                .collect()
        })
        .unwrap_or_default();
    if let Some(p) = sys.redis.process_mut() {
        ids.push(("redis".into(), p.pid()));
    }
    for s in &sys.services {
        ids.push((s.service.binary_name().to_string(), s.process.pid()));
    }
    ids.push(("bench".into(), std::process::id()));
    ids
}

/// The ratios issue 15 asks for, against the controller manager alone and
/// against the reference provisioner of the same run.
fn print_ratios(
    args: &Args,
    ours: &Burst,
    ours_reclaim: &Reclaim,
    kcm: Option<&KcmRates>,
    reference: Option<&(Burst, Reclaim)>,
    lat: &[Duration],
) {
    let ratio = |a: f64, b: f64| a / b.max(f64::MIN_POSITIVE);
    let (created, deleted) = (ours.created_per_sec(), ours_reclaim.deleted_per_sec());
    if let Some(k) = kcm {
        println!(
            "ratios: PV created/s / annotation ceiling = {:.0}/{:.0} = {:.2} (target >= 0.95); PV deleted/s / Released rate = {:.0}/{:.0} = {:.2} (target >= 0.90); p99 at {:.0}/s {:.1?} (target <= 50 ms), annotation delay alone p99 {:.1?}",
            created,
            k.annotated_per_sec,
            ratio(created, k.annotated_per_sec),
            deleted,
            k.released_per_sec,
            ratio(deleted, k.released_per_sec),
            args.rate,
            pct(lat, 0.99),
            k.annotation_delay.1,
        );
    }
    if let Some((b, r)) = reference {
        println!(
            "ratios to the reference provisioner: PV created/s {:.0}/{:.0} = {:.2}; claims Bound/s {:.0}/{:.0} = {:.2}; PV deleted/s {:.0}/{:.0} = {:.2}",
            created,
            b.created_per_sec(),
            ratio(created, b.created_per_sec()),
            ours.bound_per_sec(),
            b.bound_per_sec(),
            ratio(ours.bound_per_sec(), b.bound_per_sec()),
            deleted,
            r.deleted_per_sec(),
            ratio(deleted, r.deleted_per_sec()),
        );
    }
}

/// Apply `--kube-api-qps`, `--add-finalizer`, `--service-arg` and a quiet log level.
fn configure(sys: &mut System, args: &Args) -> anyhow::Result<()> {
    let s = &mut sys.settings;
    s.log_level = "warn".into();
    s.add_finalizer = args.add_finalizer;
    let qps = if args.kube_api_qps == "shipped" {
        shipped_kube_api_qps()?
    } else {
        args.kube_api_qps.clone()
    };
    s.kube_api_qps = qps
        .parse()
        .map_err(|e| anyhow::anyhow!("--kube-api-qps {qps}: {e}"))?;
    for a in &args.service_args {
        let (name, flag) = a
            .split_once('=')
            .ok_or_else(|| anyhow::anyhow!("--service-arg {a}: expected SERVICE=FLAG"))?;
        let service = Service::ALL
            .into_iter()
            .find(|s| s.binary_name() == name)
            .ok_or_else(|| anyhow::anyhow!("--service-arg {a}: unknown service {name}"))?;
        s.extra_args.push((service, vec![flag.to_string()]));
    }
    Ok(())
}

fn print_kcm(r: &KcmRates) {
    println!(
        "controller manager alone: {} claims annotated in {:.2?} = {:.0} claims/s; annotation delay at {:.0} claims/s ({} claims) p50 {:.1?}, p99 {:.1?}; {} PVs marked Released in {:.2?} = {:.0} PVs/s",
        r.claims,
        r.annotation_span,
        r.annotated_per_sec,
        r.offered.0,
        r.offered.1,
        r.annotation_delay.0,
        r.annotation_delay.1,
        r.claims,
        r.released_span,
        r.released_per_sec
    );
}

fn print_cost(phase: &str, cost: Option<&ApiCost>, n: usize) {
    match cost {
        Some(c) => {
            let (req, w) = c.per(n);
            println!(
                "API requests per volume, {phase}: {req:.2} (writes {w:.2}; from the {}; Lease requests apart: {})",
                c.source, c.lease_requests
            );
            println!("  by call: {:?}", c.by_call);
        }
        None => println!("API requests per volume, {phase}: not available on an existing cluster"),
    }
}

/// Print each service's peak RSS, the three together and Redis'; returns MiB
/// of the three together.
fn print_rss(sys: &mut System) -> f64 {
    let mut total = 0.0;
    for p in sys.services.iter_mut() {
        let mib = p.process.peak_rss_kib().unwrap_or(0) as f64 / 1024.0;
        total += mib;
        println!("peak RSS {}: {mib:.1} MiB", p.service.binary_name());
    }
    println!("peak RSS, three together: {total:.1} MiB");
    let redis = sys
        .redis
        .process_mut()
        .and_then(|p| p.peak_rss_kib())
        .unwrap_or(0) as f64
        / 1024.0;
    println!("peak RSS redis-server: {redis:.1} MiB");
    total
}

/// The real plane's audit/RBAC checks, reported rather than panicking on
/// drop; then a graceful stop of the services (SIGTERM, so a heap profiler
/// wrapping them via `E2E_BIN_DIR` writes its data) and of Redis.
fn finish(sys: &mut System) {
    match sys.finish_checks() {
        Ok(report) => print!("{report}"),
        Err(problems) => eprintln!("RBAC/audit check of the run failed:\n{problems}"),
    }
    sys.shutdown();
}

/// The controller manager's client-side limit of this run.
fn kcm_qps(args: &Args) -> (u32, u32) {
    args.kcm_api_qps
        .unwrap_or(e2e::realkube::CONTROLLER_MANAGER_QPS)
}

/// `QPS/BURST`, e.g. `2000/4000`.
fn parse_qps_burst(s: &str) -> Result<(u32, u32), String> {
    let (q, b) = s
        .split_once('/')
        .ok_or_else(|| format!("{s:?}: expected QPS/BURST, e.g. 2000/4000"))?;
    let n = |v: &str| v.trim().parse::<u32>().map_err(|e| format!("{v:?}: {e}"));
    Ok((n(q)?, n(b)?))
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|t| t.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_default()
}

fn nproc() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

fn cpu_model() -> String {
    std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|t| {
            t.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split_once(':'))
                .map(|(_, m)| m.trim().to_string())
        })
        .unwrap_or_else(|| "unknown CPU".into())
}

/// The services' own `--kube-api-qps` default, read from their flag definition
/// (`common::runtime::config::CommonArgs`), so "shipped" follows the code.
fn shipped_kube_api_qps() -> anyhow::Result<String> {
    use clap::Args as _;
    let cmd = common::runtime::config::CommonArgs::augment_args(clap::Command::new("service"));
    let default = cmd
        .get_arguments()
        .find(|a| a.get_id() == "kube_api_qps")
        .and_then(|a| a.get_default_values().first())
        .map(|v| v.to_string_lossy().into_owned());
    default.ok_or_else(|| {
        anyhow::anyhow!("no --kube-api-qps default in common::runtime::config::CommonArgs")
    })
}
