//! The main job on one machine: starts the API-server simulator (with
//! PV-controller emulation), a private `redis-server` with AOF and the three
//! service binaries as separate processes; creates a StorageClass and a batch
//! of claims; shows them provisioned and Bound with their directories; deletes
//! them; shows the volumes reclaimed; prints a summary and stops everything.
//!
//! `cargo run --release -p e2e --bin demo -- [--claims N] [--control-plane real]
//! [--kubeconfig PATH] [--backend nfs-subdir] [--keep-logs] [--pause]`.
//! With `--control-plane real` it starts a real kube-apiserver +
//! kube-controller-manager (`--kube-version`, default 1.37; found by
//! `e2e::realkube::Assets::locate`) and runs each service as its own ServiceAccount
//! under the RBAC rendered from `deploy/base`, then reports any refused call
//! and checks the audit log against each service's declared API calls.
//! With `--kubeconfig` the services run against that existing cluster instead
//! (the directories are created on this machine). With `--backend
//! nfs-subdir` a local directory stands in for the mounted NFS export and the
//! StorageClass gets `onDelete: delete`.

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use backends::BackendKind;
use clap::{Parser, ValueEnum};
use e2e::harness::{ControlPlane, Profile, Service, ServiceSettings, System, SystemOptions};

/// Which control plane the demo starts (without `--kubeconfig`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum PlaneArg {
    /// The built-in API-server simulator (in-process, PV-controller emulation).
    Sim,
    /// A real control plane of `--kube-version` (see `e2e::realkube::Assets::locate`).
    Real,
}

#[derive(Parser, Debug)]
#[command(
    name = "demo",
    about = "Provision and reclaim a batch of claims with the three services, end to end"
)]
struct Args {
    /// Number of claims to create.
    #[arg(long, default_value_t = 20)]
    claims: usize,
    /// Control plane to start: `sim` (the built-in simulator) or `real`
    /// (kube-apiserver, kube-controller-manager and etcd of `--kube-version`
    /// from `REALKUBE_V1_<minor>`, else `<target>/realkube/<release>/bin`).
    #[arg(long, value_enum, default_value_t = PlaneArg::Sim)]
    control_plane: PlaneArg,
    /// Kubernetes release of `--control-plane real`: 1.37 or 1.19.
    #[arg(long, default_value = "1.37")]
    kube_version: e2e::realkube::KubeVersion,
    /// Run against this existing cluster instead (overrides `--control-plane`).
    #[arg(long)]
    kubeconfig: Option<PathBuf>,
    /// Namespace of the claims; on a real cluster it must exist.
    #[arg(long, default_value = "default")]
    namespace: String,
    /// Storage backend of provision-svc and reclaim-svc.
    #[arg(long, value_enum, default_value_t = BackendKind::Hostpath)]
    backend: BackendKind,
    /// Name of the StorageClass to create (default `demo-hostpath`, or
    /// `demo-nfs-subdir` with `--backend nfs-subdir`).
    #[arg(long)]
    storage_class: Option<String>,
    /// Upper bound of each phase (provisioning, reclaiming), in seconds.
    #[arg(long, default_value_t = 120)]
    timeout_secs: u64,
    /// Keep the run directory (service logs, Redis AOF) and print its path.
    #[arg(long)]
    keep_logs: bool,
    /// Once the claims are Bound, print how to look at the running system
    /// (`provisioner-ctl status`, the kubeconfig) and wait for Enter before deleting them.
    #[arg(long)]
    pause: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    let mut args = Args::parse();
    if args.storage_class.is_none() {
        args.storage_class = Some(match args.backend {
            BackendKind::Hostpath => "demo-hostpath".into(),
            BackendKind::NfsSubdir => "demo-nfs-subdir".into(),
        });
    }
    match run(&args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("\ndemo FAILED: {e:#}");
            ExitCode::FAILURE
        }
    }
}

async fn run(args: &Args) -> anyhow::Result<()> {
    let timeout = Duration::from_secs(args.timeout_secs);
    let (target, control_plane) = match (&args.kubeconfig, args.control_plane) {
        (Some(p), _) => (
            format!("cluster from {}", p.display()),
            ControlPlane::default(),
        ),
        (None, PlaneArg::Sim) => (
            "API-server simulator (in-process, PV-controller emulation)".into(),
            ControlPlane::default(),
        ),
        (None, PlaneArg::Real) => {
            let assets = e2e::realkube::Assets::locate(args.kube_version).map_err(|e| {
                anyhow::anyhow!(
                    "--control-plane real: no Kubernetes {} binaries ({e})",
                    args.kube_version
                )
            })?;
            println!(
                "real control plane {} binaries from {} (kube-apiserver {}, kube-controller-manager {}, etcd {})",
                assets.version,
                assets.dir.display(),
                assets.kube_apiserver.display(),
                assets.kube_controller_manager.display(),
                assets.etcd.display()
            );
            (
                "real kube-apiserver + kube-controller-manager (each service as its own ServiceAccount, deploy/base RBAC)".into(),
                ControlPlane::Real(assets),
            )
        }
    };
    println!(
        "split-provisioner demo: {} claims against the {target}, backend {}",
        args.claims,
        args.backend
            .to_possible_value()
            .map_or_else(String::new, |v| v.get_name().to_string())
    );
    println!(
        "building/locating the service binaries (cargo build --release {}; on a first run one to two minutes without output) ...",
        e2e::harness::binaries::build_args().join(" ")
    );
    let t0 = Instant::now();
    // Built (or found) here, so the start-up time below is the start-up alone;
    // `System::start` reuses this build.
    e2e::harness::Binaries::ensure_built(Profile::current())?;
    let built = t0.elapsed();
    let t0 = Instant::now();
    let mut sys = System::start(SystemOptions {
        profile: Profile::current(),
        external_kubeconfig: args.kubeconfig.clone(),
        control_plane,
        namespace: args.namespace.clone(),
        keep_dir: args.keep_logs,
        configure: match args.backend {
            BackendKind::Hostpath => None,
            BackendKind::NfsSubdir => Some(ServiceSettings::use_nfs_subdir),
        },
        // nfs-subdir-external-provisioner's name (the deploy's nfs overlay uses it too).
        provisioner_name: (args.backend == BackendKind::NfsSubdir)
            .then(|| "k8s-sigs.io/nfs-subdir-external-provisioner".into()),
        ..Default::default()
    })
    .await?;
    let pids: Vec<u32> = sys.services.iter().map(|p| p.process.pid()).collect();
    println!(
        "{}",
        startup_line(sys.redis.port(), &pids, built, t0.elapsed())
    );
    let kept = if args.keep_logs {
        "kept"
    } else {
        "removed at exit; --keep-logs keeps it"
    };
    println!("run directory: {} ({kept})", sys.root.display());

    let result = phases(&mut sys, args, timeout).await;
    if result.is_err() {
        eprintln!("\nservice log tails:\n{}", sys.log_tails(20));
    }
    // Stop everything (SIGTERM with a grace period) whatever happened.
    sys.shutdown();
    let exits: Vec<String> = sys
        .services
        .iter_mut()
        .map(|p| {
            let status = match p.process.exit_status() {
                Some(s) => match s.code() {
                    Some(code) => format!("exit {code}"),
                    None => format!("{s}"),
                },
                None => "still running".to_string(),
            };
            format!("{} ({status})", p.identity())
        })
        .collect();
    println!("stopped: {}", exits.join("; "));
    // On a real control plane: no refused call in the logs, every audited
    // call declared (nothing to check on the simulator).
    let real = sys.real().is_some();
    let result = match (result, sys.finish_checks()) {
        (Ok(()), Ok(report)) => {
            if real {
                println!("RBAC: no refused call in any service log; every audited call is declared in its service's API_CALLS");
                print!("{report}");
            }
            Ok(())
        }
        (Ok(()), Err(problems)) => Err(anyhow::anyhow!("RBAC check failed:\n{problems}")),
        (Err(e), Err(problems)) => {
            eprintln!("RBAC check failed too:\n{problems}");
            Err(e)
        }
        (Err(e), Ok(_)) => Err(e),
    };
    if args.kubeconfig.is_some() {
        use k8s_openapi::api::storage::v1::StorageClass;
        let _ = kube::Api::<StorageClass>::all(sys.client.clone())
            .delete(class_name(args), &Default::default())
            .await;
    }
    result
}

fn class_name(args: &Args) -> &str {
    args.storage_class.as_deref().unwrap_or("demo-hostpath")
}

async fn phases(sys: &mut System, args: &Args, timeout: Duration) -> anyhow::Result<()> {
    let n = args.claims;
    for s in Service::ALL {
        let r = sys.wait_leader(s, Duration::from_secs(30)).await?;
        println!(
            "{} replica {r} holds Lease {}",
            s.binary_name(),
            s.lease_name(&sys.settings.provisioner_name)
        );
    }

    let class = class_name(args);
    let params: &[(&str, &str)] = match args.backend {
        BackendKind::Hostpath => &[],
        // nfs-subdir archives released directories by default; the demo
        // shows them removed.
        BackendKind::NfsSubdir => &[("onDelete", "delete")],
    };
    sys.create_storage_class(class, "Immediate", params).await?;
    let shown: Vec<String> = params.iter().map(|(k, v)| format!("{k}={v}")).collect();
    println!(
        "created StorageClass {class} (provisioner {}, reclaimPolicy Delete, parameters: {})",
        sys.settings.provisioner_name,
        if shown.is_empty() {
            "none".to_string()
        } else {
            shown.join(", ")
        }
    );

    let t = Instant::now();
    let claims = sys.create_claims("demo", n, class).await?;
    println!(
        "created {n} claims in namespace {} ({:.1?})",
        args.namespace,
        t.elapsed()
    );
    sys.wait_provisioned(n, timeout).await?;
    let provision_time = t.elapsed();
    let pvs = sys.pvs().await?;
    let dirs_created = sys.dir_count();
    let bound = sys.bound_claims().await?;
    println!(
        "provisioned: {} PVs, {bound} claims Bound, {dirs_created} directories under {} ({:.2?})",
        pvs.len(),
        sys.base_dir().display(),
        provision_time
    );
    let mut claims_view = sys.claims().await?;
    claims_view.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
    println!(
        "  {:<12} {:<8} {:<44} directory",
        "CLAIM", "STATUS", "VOLUME"
    );
    for c in claims_view.iter().take(5) {
        let volume = c
            .spec
            .as_ref()
            .and_then(|s| s.volume_name.clone())
            .unwrap_or_default();
        let dir = pvs
            .iter()
            .find(|p| p.metadata.name.as_deref() == Some(volume.as_str()))
            .and_then(|p| {
                p.spec
                    .as_ref()?
                    .host_path
                    .as_ref()
                    .map(|h| h.path.clone())
                    .or_else(|| p.spec.as_ref()?.local.as_ref().map(|l| l.path.clone()))
                    .or_else(|| {
                        let nfs = p.spec.as_ref()?.nfs.as_ref()?;
                        Some(format!("{}:{}", nfs.server, nfs.path))
                    })
            })
            .unwrap_or_default();
        let phase = c
            .status
            .as_ref()
            .and_then(|s| s.phase.clone())
            .unwrap_or_default();
        println!(
            "  {:<12} {:<8} {:<44} {dir}",
            c.metadata.name.as_deref().unwrap_or(""),
            phase,
            volume
        );
    }
    if n > 5 {
        println!("  ... and {} more", n - 5);
    }
    if args.pause {
        pause(sys).await;
    }
    // One count per Event: `events_by_reason` lists only events.k8s.io/v1, since a real server
    // (and the simulator) shows every Event through both Event APIs.
    let events = sys.events_by_reason().await?;

    let t = Instant::now();
    sys.delete_claims(&claims).await?;
    println!("deleted {n} claims");
    sys.wait_reclaimed(timeout).await?;
    let reclaim_time = t.elapsed();
    println!(
        "reclaimed: 0 PVs and {} directories left ({:.2?})",
        sys.dir_count(),
        reclaim_time
    );

    let rate = |d: Duration| n as f64 / d.as_secs_f64().max(1e-9);
    println!("\nsummary");
    println!("  {:<40} {:>10}", "claims created", n);
    println!(
        "  {:<40} {:>10}",
        "PVs created / claims Bound",
        format!("{} / {bound}", pvs.len())
    );
    println!("  {:<40} {:>10}", "directories created", dirs_created);
    println!(
        "  {:<40} {:>10}",
        "Provisioning events",
        events.get("Provisioning").copied().unwrap_or(0)
    );
    println!(
        "  {:<40} {:>10}",
        "ProvisioningSucceeded events",
        events.get("ProvisioningSucceeded").copied().unwrap_or(0)
    );
    println!(
        "  {:<40} {:>10.2?}",
        "creation -> all Bound", provision_time
    );
    println!(
        "  {:<40} {:>10.1}",
        "provisioning throughput (claims/s)",
        rate(provision_time)
    );
    println!(
        "  {:<40} {:>10.2?}",
        "deletion -> all reclaimed", reclaim_time
    );
    println!(
        "  {:<40} {:>10.1}",
        "reclaim throughput (volumes/s)",
        rate(reclaim_time)
    );
    println!(
        "  {:<40} {:>10}",
        "PVs / directories left",
        format!("{} / {}", sys.pvs().await?.len(), sys.dir_count())
    );
    if let Some(sim) = &sys.sim {
        println!(
            "  {:<40} {:>10}",
            "API requests served by the simulator",
            sim.stats().total
        );
    }
    anyhow::ensure!(
        pvs.len() == n && bound == n && dirs_created == n,
        "not every claim was provisioned"
    );
    anyhow::ensure!(sys.dir_count() == 0, "directories left after reclaim");
    Ok(())
}

/// `kubectl -o custom-columns` for claims: the simulator serves no kubectl tables.
const CLAIM_COLUMNS: &str =
    "NAME:.metadata.name,STATUS:.status.phase,VOLUME:.spec.volumeName,CLASS:.spec.storageClassName";

/// Print how to look at the running system, then wait for Enter (or stdin's end).
async fn pause(sys: &System) {
    let kubeconfig = match sys.real() {
        Some(r) => r.cluster.admin_kubeconfig().to_path_buf(),
        None => sys.settings.kubeconfig.clone(),
    };
    println!(
        "\npaused (--pause): everything keeps running until you press Enter. In another shell:\n  \
         {} status --redis-url {} --provisioner-name {} --kubeconfig {}\n  \
         KUBECONFIG={} kubectl get pvc -o custom-columns={CLAIM_COLUMNS}\n",
        sys.bins.ctl.display(),
        sys.redis.url(),
        sys.settings.provisioner_name,
        kubeconfig.display(),
        kubeconfig.display()
    );
    let enter = tokio::task::spawn_blocking(|| std::io::stdin().read_line(&mut String::new()));
    if let Ok(Ok(0)) = enter.await {
        println!("stdin is closed: going on");
    }
}

/// The start-up summary: where Redis listens, the services' pids, and the
/// service build apart from the start-up (a first run's build takes minutes).
fn startup_line(redis_port: u16, pids: &[u32], built: Duration, started: Duration) -> String {
    let pids: Vec<String> = pids.iter().map(u32::to_string).collect();
    format!(
        "service binaries built in {built:.1?}; started redis-server (AOF) on port {redis_port} and provision-svc, pv-writer, reclaim-svc (pids {}) in {started:.1?}",
        pids.join(", ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn startup_line_keeps_the_build_out_of_the_start_up_time() {
        let line = startup_line(
            6380,
            &[11, 12, 13],
            Duration::from_secs(180),
            Duration::from_millis(2500),
        );
        assert!(
            line.starts_with("service binaries built in 180.0s; "),
            "{line}"
        );
        assert!(line.ends_with("(pids 11, 12, 13) in 2.5s"), "{line}");
    }
}
