//! The side-by-side figures of `bench --peer`: one [`Figures`] per provisioner
//! (ours, each peer of [`crate::harness::peers`]) and the table with the ratios.

use std::time::Duration;

use super::observe::pct;

/// One provisioner's figures in a run, as the side-by-side table prints them.
#[derive(Debug, Clone)]
pub struct Figures {
    /// Who: `ours` or a peer's binary name.
    pub who: String,
    /// Claims in the burst.
    pub claims: usize,
    /// Claims Bound per second in the burst.
    pub bound_per_sec: f64,
    /// PVs created per second in the burst.
    pub created_per_sec: f64,
    /// PVs deleted per second in the burst's reclaim.
    pub deleted_per_sec: f64,
    /// Claim created → PV created at the offered rate, sorted.
    pub paced: Vec<Duration>,
    /// CPU time of the provisioner's own processes (ours: the three services
    /// and Redis) over the burst and its reclaim.
    pub cpu: Duration,
    /// Peak RSS, MiB: ours the three services together (Redis apart), a peer its process.
    pub peak_rss_mib: f64,
}

impl Figures {
    /// CPU-seconds per 1,000 volumes provisioned and reclaimed.
    pub fn cpu_per_1000(&self) -> f64 {
        self.cpu.as_secs_f64() * 1000.0 / self.claims.max(1) as f64
    }
}

/// The CPU time of the processes named in `names` in a [`super::cpu::CpuSample::since`] list.
pub fn cpu_of(used: &[(String, Duration)], names: &[&str]) -> Duration {
    used.iter()
        .filter(|(n, _)| names.iter().any(|want| n == want))
        .map(|(_, d)| *d)
        .sum()
}

/// A table row: its name, the figure, whether higher is better.
type Row = (&'static str, fn(&Figures) -> f64, bool);

/// Print `ours` beside each peer: one row per figure, then ours/peer ratios
/// with the targets (higher is better for rates, lower for the rest).
pub fn print_side_by_side(ours: &Figures, peers: &[Figures], rate: f64) {
    let p = |f: &Figures, q: f64| pct(&f.paced, q).as_secs_f64() * 1000.0;
    let rows: [Row; 5] = [
        ("claims Bound/s", |f| f.bound_per_sec, true),
        ("PVs created/s", |f| f.created_per_sec, true),
        ("PVs deleted/s", |f| f.deleted_per_sec, true),
        ("CPU-s per 1,000 volumes", Figures::cpu_per_1000, false),
        ("peak RSS MiB (no Redis)", |f| f.peak_rss_mib, false),
    ];
    print!("{:<28}{:>12}", "side by side", ours.who);
    for peer in peers {
        print!("{:>24}{:>16}", peer.who, "ours/peer");
    }
    println!();
    let line = |name: &str, ours_v: f64, peer_v: &dyn Fn(&Figures) -> f64, higher_better: bool| {
        print!("{name:<28}{ours_v:>12.1}");
        for peer in peers {
            let v = peer_v(peer);
            let verdict = if (ours_v >= v) == higher_better || ours_v == v {
                "met"
            } else {
                "missed"
            };
            let ratio = ours_v / v.max(f64::MIN_POSITIVE);
            print!("{v:>24.1}{:>16}", format!("{ratio:.2} {verdict}"));
        }
        println!();
    };
    for (name, get, higher_better) in rows {
        line(name, get(ours), &get, higher_better);
    }
    line(
        &format!("p50 ms at {rate:.0}/s"),
        p(ours, 0.5),
        &|f| p(f, 0.5),
        false,
    );
    line(
        &format!("p99 ms at {rate:.0}/s"),
        p(ours, 0.99),
        &|f| p(f, 0.99),
        false,
    );
    println!(
        "(claims per burst: {}; ratio = ours / peer; met = ours at least as good)",
        ours.claims
    );
}
