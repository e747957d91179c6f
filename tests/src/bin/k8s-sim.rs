//! Serve the Kubernetes API-server simulator on a loopback port.
//!
//! Prints the chosen address (`127.0.0.1:PORT`) as the first line of stdout, writes a
//! kubeconfig if asked, and serves until SIGTERM/SIGINT. Control endpoints: `/_sim/...`
//! (see `e2e::sim::http`).

use clap::Parser;
use e2e::sim::{PvControllerConfig, SimConfig, Simulator};
use std::io::Write;
use std::time::Duration;

#[derive(Parser, Debug)]
#[command(
    name = "k8s-sim",
    about = "Kubernetes API-server simulator for end-to-end tests"
)]
struct Args {
    /// TCP port on 127.0.0.1 (0 = pick a free one).
    #[arg(long, env = "K8S_SIM_PORT", default_value_t = 0)]
    port: u16,
    /// Write a kubeconfig pointing at the simulator to this path.
    #[arg(long, env = "K8S_SIM_KUBECONFIG_OUT")]
    kubeconfig_out: Option<std::path::PathBuf>,
    /// Changes kept for watch replay (older resourceVersions get 410 Expired).
    #[arg(long, env = "K8S_SIM_HISTORY_WINDOW", default_value_t = 100_000)]
    history_window: usize,
    /// Seconds between watch BOOKMARK events.
    #[arg(long, env = "K8S_SIM_BOOKMARK_INTERVAL_SECS", default_value_t = 60.0)]
    bookmark_interval_secs: f64,
    /// Disable the kube-controller-manager PV controller emulation entirely.
    #[arg(long, env = "K8S_SIM_NO_PV_CONTROLLER")]
    no_pv_controller: bool,
    /// Do not set the storage-provisioner annotations on claims.
    #[arg(long)]
    no_annotate_provisioner: bool,
    /// Do not bind volumes and claims.
    #[arg(long)]
    no_bind: bool,
    /// Do not move volumes to Released when their claim is deleted.
    #[arg(long)]
    no_release: bool,
    /// Do not add kubernetes.io/pvc-protection and pv-protection finalizers.
    #[arg(long)]
    no_protection_finalizers: bool,
    /// Do not require namespaces to exist.
    #[arg(long)]
    no_namespace_lifecycle: bool,
    /// Log filter (tracing EnvFilter syntax), to stderr.
    #[arg(long, env = "RUST_LOG", default_value = "warn")]
    log: String,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new(&a.log))
        .with_writer(std::io::stderr)
        .init();
    let cfg = SimConfig {
        port: a.port,
        history_window: a.history_window,
        bookmark_interval: Duration::from_secs_f64(a.bookmark_interval_secs),
        enforce_namespace_exists: !a.no_namespace_lifecycle,
        protection_finalizers: !a.no_protection_finalizers,
        pv_controller: PvControllerConfig {
            enabled: !a.no_pv_controller,
            annotate_provisioner: !a.no_annotate_provisioner,
            bind: !a.no_bind,
            release: !a.no_release,
            remove_protection_finalizers: true,
            set_available: true,
        },
        ..SimConfig::default()
    };
    let sim = Simulator::start(cfg).await?;
    {
        let mut out = std::io::stdout().lock();
        writeln!(out, "{}", sim.addr())?;
        out.flush()?;
    }
    if let Some(p) = &a.kubeconfig_out {
        sim.write_kubeconfig(p)?;
    }
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = term.recv() => {}
    }
    sim.shutdown();
    Ok(())
}
