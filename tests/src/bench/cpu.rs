//! CPU time of the processes that share the machine in a benchmark phase
//! (control plane, Redis, the services, the benchmark itself), read from
//! `/proc/<pid>/stat` (`utime + stime`, the process's own threads, children
//! not included). On a machine with few cores this says who the burst's CPU
//! went to: what the services cost beside the API server, etcd and the
//! controller manager they share it with.

use std::time::{Duration, Instant};

/// CPU time used so far by each named process, and when it was read.
#[derive(Debug, Clone)]
pub struct CpuSample {
    at: Instant,
    used: Vec<(String, u32, Option<Duration>)>,
}

/// CPU time (user + system) of process `pid` so far; `None` when it is gone
/// or its stat line cannot be read.
pub fn process_cpu(pid: u32) -> Option<Duration> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Field 2 (comm) may hold spaces and parentheses: fields after it start
    // after the last ')'. utime and stime are fields 14 and 15, i.e. the
    // 12th and 13th after comm.
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace().skip(11);
    let utime: u64 = fields.next()?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    // SAFETY: sysconf has no preconditions.
    let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    let ticks = if ticks > 0 { ticks as u64 } else { 100 };
    Some(Duration::from_nanos(
        (utime + stime) * 1_000_000_000 / ticks,
    ))
}

impl CpuSample {
    /// Read the CPU time of every `(name, pid)` now.
    pub fn take(processes: &[(String, u32)]) -> Self {
        Self {
            at: Instant::now(),
            used: processes
                .iter()
                .map(|(n, pid)| (n.clone(), *pid, process_cpu(*pid)))
                .collect(),
        }
    }

    /// CPU time each process used since `self` (same processes, read now),
    /// and the wall time between: `(wall, [(name, cpu)])`. A process that
    /// was gone at either reading is left out.
    pub fn since(&self) -> (Duration, Vec<(String, Duration)>) {
        let used = self
            .used
            .iter()
            .filter_map(|(n, pid, before)| {
                let now = process_cpu(*pid)?;
                Some((n.clone(), now.saturating_sub((*before)?)))
            })
            .collect();
        (self.at.elapsed(), used)
    }
}

/// One line: `wall 4.10 s, 2 cores: etcd 1.20 s (15 %), ...`, each share
/// relative to the `cores × wall` the machine had.
pub fn format(wall: Duration, used: &[(String, Duration)], cores: usize) -> String {
    let capacity = wall.as_secs_f64() * cores.max(1) as f64;
    let total: f64 = used.iter().map(|(_, d)| d.as_secs_f64()).sum();
    let parts: Vec<String> = used
        .iter()
        .map(|(n, d)| {
            format!(
                "{n} {:.2} s ({:.0} %)",
                d.as_secs_f64(),
                100.0 * d.as_secs_f64() / capacity.max(f64::MIN_POSITIVE)
            )
        })
        .collect();
    format!(
        "wall {:.2} s × {cores} cores: {}; all of these {:.2} s ({:.0} % of the machine)",
        wall.as_secs_f64(),
        parts.join(", "),
        total,
        100.0 * total / capacity.max(f64::MIN_POSITIVE)
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn own_cpu_time_grows_with_work() {
        let me = std::process::id();
        let before = process_cpu(me).expect("own stat");
        let start = Instant::now();
        let mut x = 0u64;
        while start.elapsed() < Duration::from_millis(200) {
            x = std::hint::black_box(x.wrapping_mul(31).wrapping_add(7));
        }
        let after = process_cpu(me).expect("own stat");
        assert!(after > before, "{before:?} -> {after:?}");
        assert!(process_cpu(u32::MAX).is_none());
    }
}
