//! Retrying, in one place: the delay policy ([`Backoff`]: exponential and capped, or
//! constant), the loop that retries an operation until it succeeds or the service shuts
//! down ([`Backoff::retry`]), and the work queues' [`RetryPolicy`] (client-go's default
//! controller rate limiter: the larger of a per-item [`Backoff`] and a token bucket shared
//! by all items, plus the failed-attempt threshold). Why not a crate: docs/ARCHITECTURE.md.

use std::collections::HashMap;
use std::hash::Hash;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use clap::Args;

/// The `--help` section of the worker and retry flags.
pub(crate) const WORK: &str = "Workers and retries";

/// The overall retry limit of the claim/PV work queues (seed: 10 retries/s with
/// burst 100 across all items); the per-item backoff is
/// `--retry-interval-start`/`--retry-interval-max` of the runtime's common flags.
#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    /// Overall retries per second across all items (token bucket refill). 0 disables.
    #[arg(long, env, default_value_t = 10.0, help_heading = WORK)]
    pub retry_qps: f64,

    /// Overall retry burst (token bucket size).
    #[arg(long, env, default_value_t = 100, help_heading = WORK)]
    pub retry_burst: u32,
}

/// A retry delay policy: after the `n`-th consecutive failure (1-based) wait
/// `initial · 2^(n-1)`, capped at `max` (a constant policy has
/// `initial == max`). Callers that want jitter scale [`delay`](Self::delay).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// Delay after the first failure.
    pub initial: Duration,
    /// Cap of the delay.
    pub max: Duration,
}

impl Backoff {
    /// `initial` doubling per failure up to `max`, no jitter.
    pub fn exponential(initial: Duration, max: Duration) -> Self {
        Backoff { initial, max }
    }

    /// The same `period` after every failure.
    pub fn constant(period: Duration) -> Self {
        Self::exponential(period, period)
    }

    /// The delay after the `failures`-th consecutive failure, `initial · 2^(failures-1)` capped
    /// at `max` (counted from 1; 0 is treated as 1).
    pub fn delay(&self, failures: u32) -> Duration {
        let factor = 1u32
            .checked_shl(failures.saturating_sub(1))
            .unwrap_or(u32::MAX);
        self.initial.saturating_mul(factor).min(self.max)
    }

    /// Run `op` until `Ok`, waiting [`delay`](Self::delay)`(n)` after the `n`-th
    /// failure (`on_error(&error, n, delay)` sees each); `None` once an attempt
    /// failed after `shutdown`. The first attempt always runs, even after shutdown.
    pub async fn retry<T, E, F, Fut>(
        &self,
        shutdown: &CancellationToken,
        mut op: F,
        mut on_error: impl FnMut(&E, u32, Duration),
    ) -> Option<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = Result<T, E>>,
    {
        let mut failures = 0u32;
        loop {
            let error = match op().await {
                Ok(v) => return Some(v),
                Err(e) => e,
            };
            failures = failures.saturating_add(1);
            let delay = self.delay(failures);
            on_error(&error, failures, delay);
            shutdown
                .run_until_cancelled(tokio::time::sleep(delay))
                .await?;
        }
    }
}

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
    per_item: Backoff,
    failures: Mutex<HashMap<K, u32>>,
    bucket: Mutex<Bucket>,
}

impl<K: Eq + Hash + Clone> RetryPolicy<K> {
    /// Policy with per-item delays from `initial` doubling up to `max`, and an
    /// overall limit of `qps` retries per second with `burst` (qps ≤ 0 disables it).
    pub fn new(initial: Duration, max: Duration, qps: f64, burst: u32) -> Self {
        RetryPolicy {
            per_item: Backoff::exponential(initial, max),
            failures: Mutex::new(HashMap::new()),
            bucket: Mutex::new(Bucket {
                qps,
                burst: f64::from(burst.max(1)),
                tokens: f64::from(burst.max(1)),
                last: Instant::now(),
            }),
        }
    }

    /// Policy from the per-item `per_item` backoff (`--retry-interval-start`/`-max`)
    /// and the `--retry-qps`/`--retry-burst` flags.
    pub fn from_args(per_item: Backoff, args: &RetryArgs) -> Self {
        Self::new(
            per_item.initial,
            per_item.max,
            args.retry_qps,
            args.retry_burst,
        )
    }

    /// Record one more failure of `key` and return how long to wait before
    /// retrying it: max(per-item backoff, overall bucket delay).
    pub fn next_delay(&self, key: &K) -> Duration {
        let failures = {
            let mut map = self.failures();
            let n = map.entry(key.clone()).or_insert(0);
            *n = n.saturating_add(1);
            *n
        };
        let mut bucket = self.bucket.lock().expect("retry bucket poisoned");
        self.per_item
            .delay(failures)
            .max(bucket.reserve(Instant::now()))
    }

    /// Failures recorded for `key` since it last succeeded (seed `NumRequeues`).
    pub fn requeues(&self, key: &K) -> u32 {
        self.failures().get(key).copied().unwrap_or(0)
    }

    /// Forget `key`'s failures (on success, or when the object is gone).
    pub fn forget(&self, key: &K) {
        self.failures().remove(key);
    }

    fn failures(&self) -> std::sync::MutexGuard<'_, HashMap<K, u32>> {
        self.failures.lock().expect("retry map poisoned")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_and_caps() {
        let m = Duration::from_secs(1000);
        let b = Backoff::exponential(Duration::from_secs(15), m);
        assert_eq!(b.delay(1), Duration::from_secs(15));
        assert_eq!(b.delay(2), Duration::from_secs(30));
        assert_eq!(b.delay(3), Duration::from_secs(60));
        assert_eq!(b.delay(7), Duration::from_secs(960));
        assert_eq!(b.delay(8), m);
        assert_eq!(b.delay(500), m);
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
    fn constant_and_exponential_backoff() {
        let c = Backoff::constant(Duration::from_millis(500));
        assert_eq!(c.delay(1), Duration::from_millis(500));
        assert_eq!(c.delay(40), Duration::from_millis(500));
        let e = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(300));
        assert_eq!(e.delay(0), Duration::from_secs(1));
        assert_eq!(e.delay(3), Duration::from_secs(4));
        assert_eq!(e.delay(10), Duration::from_secs(300));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_backs_off_until_ok() {
        let stop = CancellationToken::new();
        let policy = Backoff::exponential(Duration::from_secs(1), Duration::from_secs(4));
        let mut calls = 0u32;
        let mut seen = Vec::new();
        let start = tokio::time::Instant::now();
        let got = policy
            .retry(
                &stop,
                || {
                    calls += 1;
                    let n = calls;
                    async move {
                        if n < 5 {
                            Err(n)
                        } else {
                            Ok("done")
                        }
                    }
                },
                |e: &u32, failures, delay| seen.push((*e, failures, delay)),
            )
            .await;
        assert_eq!(got, Some("done"));
        let secs = |s| Duration::from_secs(s);
        assert_eq!(
            seen,
            vec![
                (1, 1, secs(1)),
                (2, 2, secs(2)),
                (3, 3, secs(4)),
                (4, 4, secs(4))
            ]
        );
        assert_eq!(start.elapsed(), secs(11));
    }

    #[tokio::test(start_paused = true)]
    async fn retry_stops_on_shutdown() {
        let stop = CancellationToken::new();
        let policy = Backoff::constant(Duration::from_secs(3600));
        let canceller = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::time::sleep(Duration::from_secs(10)).await;
                stop.cancel();
            })
        };
        let start = tokio::time::Instant::now();
        let got: Option<()> = policy
            .retry(&stop, || async { Err::<(), _>("down") }, |_, _, _| {})
            .await;
        assert_eq!(got, None);
        assert_eq!(start.elapsed(), Duration::from_secs(10));
        canceller.await.unwrap();
        // Already shut down: one attempt is still made (a graceful shutdown
        // settles in-flight work), but a failure is not retried.
        let start = tokio::time::Instant::now();
        assert_eq!(
            policy
                .retry(&stop, || async { Ok::<_, ()>("settled") }, |_, _, _| {})
                .await,
            Some("settled")
        );
        let mut calls = 0;
        let got: Option<()> = policy
            .retry(
                &stop,
                || {
                    calls += 1;
                    async { Err::<(), _>("down") }
                },
                |_, _, _| {},
            )
            .await;
        assert_eq!(got, None);
        assert_eq!(calls, 1);
        assert_eq!(start.elapsed(), Duration::ZERO, "no wait after shutdown");
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
