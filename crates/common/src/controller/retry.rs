//! Retry policy of the work queues: client-go's default controller rate limiter
//! as the seed uses it — the larger of a per-item exponential backoff
//! (`initial · 2^(failures-1)`, capped) and an overall token bucket shared by
//! all items — plus the failed-attempt threshold after which an item is given up.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::service::config::RetryArgs;

/// How many failed attempts an item gets (seed `failedProvisionThreshold` /
/// `failedDeleteThreshold`, default 15). `0` means retry forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FailureThreshold(pub u32);

impl FailureThreshold {
    /// Whether an item whose previous requeues number `requeues` (failures before
    /// the current one) may be requeued again. Seed rule: retry while
    /// `NumRequeues < threshold`, always when the threshold is 0.
    pub fn allows_retry(self, requeues: u32) -> bool {
        self.0 == 0 || requeues < self.0
    }
}

/// A token bucket that hands out *reservations*: each call takes a token now or
/// at the earliest future time one is available (Go's `rate.Limiter.Reserve`).
#[derive(Debug)]
struct Bucket {
    qps: f64,
    burst: f64,
    tokens: f64,
    last: Instant,
}

impl Bucket {
    fn reserve(&mut self, now: Instant) -> Duration {
        if self.qps <= 0.0 {
            return Duration::ZERO;
        }
        let elapsed = now.saturating_duration_since(self.last).as_secs_f64();
        self.tokens = (self.tokens + elapsed * self.qps).min(self.burst);
        self.last = now;
        self.tokens -= 1.0;
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.qps)
        }
    }
}

/// Per-item exponential backoff combined with an overall token bucket.
///
/// Keys are whatever identifies a work item (claim uid, PV name). Thread-safe.
#[derive(Debug)]
pub struct RetryPolicy<K> {
    initial: Duration,
    max: Duration,
    failures: Mutex<HashMap<K, u32>>,
    bucket: Mutex<Bucket>,
}

impl<K: Eq + Hash + Clone> RetryPolicy<K> {
    /// Policy with per-item delays from `initial` doubling up to `max`, and an
    /// overall limit of `qps` retries per second with `burst` (qps ≤ 0 disables it).
    pub fn new(initial: Duration, max: Duration, qps: f64, burst: u32) -> Self {
        RetryPolicy {
            initial,
            max,
            failures: Mutex::new(HashMap::new()),
            bucket: Mutex::new(Bucket {
                qps,
                burst: f64::from(burst.max(1)),
                tokens: f64::from(burst.max(1)),
                last: Instant::now(),
            }),
        }
    }

    /// Policy from the shared `--retry-*` flags.
    pub fn from_args(args: &RetryArgs) -> Self {
        Self::new(
            args.retry_initial_delay,
            args.retry_max_delay,
            args.retry_qps,
            args.retry_burst,
        )
    }

    /// Record one more failure of `key` and return how long to wait before
    /// retrying it: max(per-item backoff, overall bucket delay).
    pub fn next_delay(&self, key: &K) -> Duration {
        let failures = {
            let mut map = self.failures.lock().expect("retry map poisoned");
            let n = map.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let per_item = backoff(self.initial, self.max, failures);
        let overall = self
            .bucket
            .lock()
            .expect("retry bucket poisoned")
            .reserve(Instant::now());
        per_item.max(overall)
    }

    /// Failures recorded for `key` since it last succeeded (seed `NumRequeues`).
    pub fn requeues(&self, key: &K) -> u32 {
        self.failures
            .lock()
            .expect("retry map poisoned")
            .get(key)
            .copied()
            .unwrap_or(0)
    }

    /// Forget `key`'s failures (on success, or when the object is gone).
    pub fn forget(&self, key: &K) {
        self.failures
            .lock()
            .expect("retry map poisoned")
            .remove(key);
    }
}

/// `initial · 2^(failures-1)` capped at `max`; `failures` counts from 1.
pub fn backoff(initial: Duration, max: Duration, failures: u32) -> Duration {
    let exp = failures.saturating_sub(1).min(63);
    let factor = 2f64.powi(exp as i32);
    let secs = initial.as_secs_f64() * factor;
    if !secs.is_finite() || secs >= max.as_secs_f64() {
        max
    } else {
        Duration::from_secs_f64(secs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let i = Duration::from_secs(15);
        let m = Duration::from_secs(1000);
        assert_eq!(backoff(i, m, 1), Duration::from_secs(15));
        assert_eq!(backoff(i, m, 2), Duration::from_secs(30));
        assert_eq!(backoff(i, m, 3), Duration::from_secs(60));
        assert_eq!(backoff(i, m, 7), Duration::from_secs(960));
        assert_eq!(backoff(i, m, 8), m);
        assert_eq!(backoff(i, m, 500), m);
    }

    #[test]
    fn per_item_counts_are_independent_and_forgotten() {
        let p = RetryPolicy::new(Duration::from_millis(5), Duration::from_secs(1), 0.0, 1);
        assert_eq!(p.next_delay(&"a"), Duration::from_millis(5));
        assert_eq!(p.next_delay(&"a"), Duration::from_millis(10));
        assert_eq!(p.next_delay(&"b"), Duration::from_millis(5));
        assert_eq!(p.requeues(&"a"), 2);
        p.forget(&"a");
        assert_eq!(p.requeues(&"a"), 0);
        assert_eq!(p.next_delay(&"a"), Duration::from_millis(5));
    }

    #[test]
    fn bucket_limits_overall_rate_after_burst() {
        // 10 qps, burst 3: three retries pass at once, the fourth waits ~100ms.
        let p = RetryPolicy::new(Duration::ZERO, Duration::from_secs(1), 10.0, 3);
        for k in 0..3 {
            assert_eq!(p.next_delay(&k), Duration::ZERO);
        }
        let d = p.next_delay(&3);
        assert!(
            d > Duration::from_millis(90) && d <= Duration::from_millis(100),
            "{d:?}"
        );
        let d = p.next_delay(&4);
        assert!(
            d > Duration::from_millis(190) && d <= Duration::from_millis(200),
            "{d:?}"
        );
    }

    #[test]
    fn threshold_follows_the_seed() {
        let t = FailureThreshold(15);
        assert!(t.allows_retry(0));
        assert!(t.allows_retry(14));
        assert!(!t.allows_retry(15));
        assert!(FailureThreshold(0).allows_retry(u32::MAX));
    }
}
