//! Benchmark (not a test): the three release service binaries against the
//! in-process API-server simulator and a private `redis-server`, client-side
//! API limits off. Prints, for N claims (default 1,000, `--claims`):
//! provisioning throughput (claims/s from creation to PV created and to claim
//! Bound), p50/p99 claim-created → PV-created latency for the burst and at a
//! fixed offered load (default 20 claims/s), reclaim throughput, peak RSS of
//! each service (`VmHWM`) and API requests (and writes) per provisioned volume
//! from the simulator's counters.
//!
//! `cargo run --release -p e2e --bin bench -- --claims 1000`

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clap::Parser;
use e2e::harness::{Profile, System, SystemOptions};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::runtime::watcher::{self, Event};
use kube::Api;

#[derive(Parser, Debug)]
#[command(
    name = "bench",
    about = "Provisioning/reclaim benchmark of the three services"
)]
struct Args {
    /// Claims in the burst (created as fast as the client can, 16 in flight).
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
    /// Upper bound of each phase, seconds.
    #[arg(long, default_value_t = 300)]
    timeout_secs: u64,
}

/// First-seen times of PVs (by name, added and deleted) and Bound claims (by name).
#[derive(Default)]
struct Seen {
    pv_added: HashMap<String, Instant>,
    pv_deleted: HashMap<String, Instant>,
    claim_bound: HashMap<String, Instant>,
}

fn pct(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 * p).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let timeout = Duration::from_secs(args.timeout_secs);
    let mut sys = System::start(SystemOptions {
        profile: Profile::current(),
        configure: Some(if args.add_finalizer {
            |s| {
                s.log_level = "warn".into();
                s.add_finalizer = true;
            }
        } else {
            |s| s.log_level = "warn".into()
        }),
        ..Default::default()
    })
    .await?;
    sys.wait_leaders(Duration::from_secs(30)).await?;
    sys.create_storage_class("bench", "Immediate", &[]).await?;

    let seen = Arc::new(Mutex::new(Seen::default()));
    spawn_watchers(&sys, seen.clone());
    tokio::time::sleep(Duration::from_millis(500)).await;

    // ---- burst: N claims as fast as possible --------------------------------
    sys.sim().reset_stats();
    let (created, names) = create_timed(&sys, "burst", args.claims, None).await?;
    sys.wait_provisioned(args.claims, timeout).await?;
    let stats = sys.sim().stats();
    let first = created.values().min().copied().unwrap();
    let (lat, last_pv, last_bound) = latencies(&seen, &created);
    let n = args.claims as f64;
    println!("machine: {} cores, {}", nproc(), cpu_model());
    println!("claims: {}", args.claims);
    println!(
        "provisioning throughput: {:.0} claims/s to PV created ({:.2?}), {:.0} claims/s to claim Bound ({:.2?})",
        n / (last_pv - first).as_secs_f64(),
        last_pv - first,
        n / (last_bound - first).as_secs_f64(),
        last_bound - first
    );
    println!(
        "burst latency claim created -> PV created: p50 {:.1?}, p99 {:.1?}, max {:.1?}",
        pct(&lat, 0.5),
        pct(&lat, 0.99),
        lat.last().copied().unwrap_or_default()
    );
    // Service requests: everything except the benchmark's own claim creates
    // and its two list+watch pairs; leases shown apart.
    let own = stats.count("create", "persistentvolumeclaims") + 4;
    let leases: u64 = stats
        .by_resource
        .iter()
        .filter(|(r, _)| r.starts_with("leases"))
        .flat_map(|(_, v)| v.values())
        .sum();
    let writes: u64 = stats
        .by_resource
        .iter()
        .filter(|(r, _)| !r.starts_with("leases"))
        .flat_map(|(r, v)| v.iter().map(move |(verb, c)| (r, verb, c)))
        .filter(|(r, verb, _)| {
            matches!(verb.as_str(), "create" | "update" | "patch" | "delete")
                && !(r.as_str() == "persistentvolumeclaims" && verb.as_str() == "create")
        })
        .map(|(_, _, c)| *c)
        .sum();
    println!(
        "API requests per provisioned volume: {:.2} (writes {:.2}; Lease requests excluded: {leases})",
        (stats.total.saturating_sub(own + leases)) as f64 / n,
        writes as f64 / n
    );
    println!("  by resource: {:?}", stats.by_resource);

    // ---- reclaim ------------------------------------------------------------
    let t = Instant::now();
    sys.delete_claims(&names).await?;
    sys.wait_reclaimed(timeout).await?;
    let last_del = seen
        .lock()
        .unwrap()
        .pv_deleted
        .values()
        .max()
        .copied()
        .unwrap_or(t);
    println!(
        "reclaim throughput: {:.0} volumes/s ({:.2?} from first claim deletion to last PV deleted)",
        n / (last_del - t).as_secs_f64(),
        last_del - t
    );

    // ---- offered load -------------------------------------------------------
    let (created, names) = create_timed(&sys, "paced", args.rate_claims, Some(args.rate)).await?;
    sys.wait_provisioned(args.rate_claims, timeout).await?;
    let (lat, _, _) = latencies(&seen, &created);
    println!(
        "at {:.0} claims/s offered ({} claims): claim created -> PV created p50 {:.1?}, p99 {:.1?}",
        args.rate,
        args.rate_claims,
        pct(&lat, 0.5),
        pct(&lat, 0.99)
    );
    sys.delete_claims(&names).await?;
    sys.wait_reclaimed(timeout).await?;

    for p in sys.services.iter_mut() {
        let rss = p.process.peak_rss_kib().unwrap_or(0);
        println!(
            "peak RSS {}: {:.1} MiB",
            p.service.binary_name(),
            rss as f64 / 1024.0
        );
    }
    sys.shutdown();
    Ok(())
}

async fn create_timed(
    sys: &System,
    prefix: &str,
    n: usize,
    rate: Option<f64>,
) -> anyhow::Result<(HashMap<String, Instant>, Vec<String>)> {
    let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:05}")).collect();
    let created = Arc::new(Mutex::new(HashMap::new()));
    let start = Instant::now();
    let stream = futures::stream::iter(names.clone().into_iter().enumerate()).map(|(i, name)| {
        let created = created.clone();
        async move {
            if let Some(r) = rate {
                let at = start + Duration::from_secs_f64(i as f64 / r);
                tokio::time::sleep_until(at.into()).await;
            }
            let t = Instant::now();
            sys.create_claim(&name, "bench", &[]).await?;
            created.lock().unwrap().insert(name, t);
            anyhow::Ok(())
        }
    });
    let results: Vec<_> = stream
        .buffer_unordered(if rate.is_some() { 64 } else { 16 })
        .collect()
        .await;
    for r in results {
        r?;
    }
    let created = std::mem::take(&mut *created.lock().unwrap());
    Ok((created, names))
}

/// Sorted claim-created → PV-added latencies, the last PV-added and last
/// claim-Bound instants of the claims in `created`.
fn latencies(
    seen: &Mutex<Seen>,
    created: &HashMap<String, Instant>,
) -> (Vec<Duration>, Instant, Instant) {
    let s = seen.lock().unwrap();
    let mut lat = Vec::new();
    let mut last_pv = None::<Instant>;
    let mut last_bound = None::<Instant>;
    for (name, t) in created {
        // PV names are pvc-<uid>; the watcher records the claim name for them.
        if let Some(a) = s.pv_added.get(name) {
            lat.push(a.saturating_duration_since(*t));
            last_pv = Some(last_pv.map_or(*a, |l| l.max(*a)));
        }
        if let Some(b) = s.claim_bound.get(name) {
            last_bound = Some(last_bound.map_or(*b, |l| l.max(*b)));
        }
    }
    lat.sort();
    let now = Instant::now();
    (lat, last_pv.unwrap_or(now), last_bound.unwrap_or(now))
}

fn spawn_watchers(sys: &System, seen: Arc<Mutex<Seen>>) {
    let pvs: Api<PersistentVolume> = Api::all(sys.client.clone());
    let s = seen.clone();
    tokio::spawn(async move {
        let mut w = watcher::watcher(pvs, Default::default()).boxed();
        while let Some(ev) = w.next().await {
            let now = Instant::now();
            let mut g = s.lock().unwrap();
            match ev {
                Ok(Event::Apply(pv)) | Ok(Event::InitApply(pv)) => {
                    if let Some(claim) = pv.spec.and_then(|s| s.claim_ref).and_then(|r| r.name) {
                        g.pv_added.entry(claim).or_insert(now);
                    }
                }
                Ok(Event::Delete(pv)) => {
                    g.pv_deleted
                        .entry(pv.metadata.name.unwrap_or_default())
                        .or_insert(now);
                }
                _ => {}
            }
        }
    });
    let claims: Api<PersistentVolumeClaim> = sys.claims_api();
    tokio::spawn(async move {
        let mut w = watcher::watcher(claims, Default::default()).boxed();
        while let Some(ev) = w.next().await {
            let now = Instant::now();
            if let Ok(Event::Apply(c)) | Ok(Event::InitApply(c)) = ev {
                if c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound") {
                    seen.lock()
                        .unwrap()
                        .claim_bound
                        .entry(c.metadata.name.unwrap_or_default())
                        .or_insert(now);
                }
            }
        }
    });
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
