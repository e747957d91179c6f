//! Kubernetes client construction: kubeconfig or in-cluster config, with a
//! client-side token bucket (client-go's `flowcontrol` semantics, `governor`'s GCRA
//! limiter; tower's `RateLimit` is a fixed window that lets `2 × burst` through at
//! an edge) put in front of the client by [`TokenBucket`].

use std::future::Future;
use std::num::NonZeroU32;
use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};
use std::time::Duration;

use anyhow::Context;
use governor::clock::{Clock, DefaultClock};
use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::layer::layer_fn;
use tower::util::option_layer;
use tower::Service;

use crate::runtime::api_metrics::ApiMetrics;
use crate::runtime::config::ClusterArgs;

/// The token bucket of `--kube-api-qps`/`--kube-api-burst` (client-go's semantics:
/// `burst` at once, `qps` per second long-run); `None` when `qps <= 0`, not finite
/// or above 10⁹.
pub fn token_bucket_quota(qps: f64, burst: u32) -> Option<Quota> {
    if qps <= 0.0 || !qps.is_finite() {
        return None;
    }
    let burst = NonZeroU32::new(burst.max(1))?;
    Some(Quota::with_period(Duration::from_secs_f64(1.0 / qps))?.allow_burst(burst))
}

/// A service that is ready only once the token bucket granted a token (one per request)
/// and the inner service is ready. Waiting is a tokio timer until governor's earliest
/// conforming instant, so no task spins.
pub struct TokenBucket<S> {
    inner: S,
    limiter: DefaultDirectRateLimiter,
    wait: Option<Pin<Box<tokio::time::Sleep>>>,
    /// A token was taken for the next `call`.
    permitted: bool,
}

impl<S> TokenBucket<S> {
    /// `inner` behind a token bucket enforcing `quota` (see [`token_bucket_quota`]).
    pub fn new(inner: S, quota: Quota) -> Self {
        Self {
            inner,
            limiter: RateLimiter::direct(quota),
            wait: None,
            permitted: false,
        }
    }
}

impl<S, R> Service<R> for TokenBucket<S>
where
    S: Service<R>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut TaskContext<'_>) -> Poll<Result<(), S::Error>> {
        while !self.permitted {
            if let Some(sleep) = self.wait.as_mut() {
                std::task::ready!(sleep.as_mut().poll(cx));
                self.wait = None;
            }
            match self.limiter.check() {
                Ok(()) => self.permitted = true,
                Err(not_until) => {
                    let wait = not_until.wait_time_from(DefaultClock::default().now());
                    self.wait = Some(Box::pin(tokio::time::sleep(wait)));
                }
            }
        }
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: R) -> S::Future {
        debug_assert!(self.permitted, "call without poll_ready");
        self.permitted = false;
        self.inner.call(request)
    }
}

/// Build a client from `config` with the [`token_bucket_quota`] limit, kube's retry layer
/// off (every caller retries itself) and, when given, `metrics` on every request inside the
/// limit, as client-go does. Errors: TLS or connector setup.
pub fn build_client(
    mut config: Config,
    qps: f64,
    burst: u32,
    metrics: Option<ApiMetrics>,
) -> anyhow::Result<Client> {
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config).context("building Kubernetes client")?;
    let rate_limit = token_bucket_quota(qps, burst)
        .map(|quota| layer_fn(move |inner| TokenBucket::new(inner, quota)));
    Ok(builder
        .with_layer(&option_layer(metrics))
        .with_layer(&option_layer(rate_limit))
        .build())
}

/// A client from `--kubeconfig`, else `KUBECONFIG`, `~/.kube/config`, then in-cluster, built
/// by [`build_client`] with the flags' limits and, with a `registry`, the request metrics in it.
/// Errors: unreadable or invalid kubeconfig, none found, or as [`build_client`].
pub async fn client_from_args(
    args: &ClusterArgs,
    registry: Option<&prometheus::Registry>,
) -> anyhow::Result<Client> {
    let config = match &args.kubeconfig {
        Some(path) => {
            // kube's error names the path already.
            let kubeconfig = Kubeconfig::read_from(path).context("reading kubeconfig")?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))?
        }
        None => Config::infer()
            .await
            .context("no kubeconfig found and not running in a cluster")?,
    };
    let metrics = registry.map(|r| ApiMetrics::register(r, &config.cluster_url.to_string()));
    build_client(config, args.kube_api_qps, args.kube_api_burst, metrics)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;
    use tower::ServiceExt;

    fn limited(
        qps: f64,
        burst: u32,
    ) -> impl Service<(), Response = (), Error = std::convert::Infallible> {
        let quota = token_bucket_quota(qps, burst).expect("limit on");
        let svc = tower::service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
        TokenBucket::new(svc, quota)
    }

    /// Time for `n` requests through `svc`, one after the other.
    async fn time_requests<S: Service<(), Error = std::convert::Infallible>>(
        svc: &mut S,
        n: usize,
    ) -> Duration {
        let start = Instant::now();
        for _ in 0..n {
            svc.ready().await.unwrap().call(()).await.ok();
        }
        start.elapsed()
    }

    #[test]
    fn quota_is_qps_with_burst_and_off_at_zero() {
        let q = token_bucket_quota(200.0, 400).unwrap();
        assert_eq!(q.replenish_interval(), Duration::from_millis(5));
        assert_eq!(q.burst_size().get(), 400);
        assert_eq!(token_bucket_quota(5.0, 0).unwrap().burst_size().get(), 1);
        assert!(token_bucket_quota(0.0, 400).is_none());
        assert!(token_bucket_quota(-1.0, 400).is_none());
        assert!(token_bucket_quota(f64::NAN, 400).is_none());
    }

    /// A full bucket lets `burst` through at once, then the steady rate is `qps`.
    #[tokio::test]
    async fn burst_then_steady_rate() {
        let (qps, burst) = (50.0, 10);
        let mut svc = limited(qps, burst);
        let t = time_requests(&mut svc, burst as usize).await;
        assert!(t < Duration::from_millis(100), "burst took {t:?}");
        // 20 more need 20 tokens at 50/s: 400 ms (not faster, whatever the load).
        let t = time_requests(&mut svc, 20).await;
        assert!(
            t >= Duration::from_millis(380),
            "20 beyond the burst took {t:?}"
        );
        assert!(t < Duration::from_secs(3), "20 beyond the burst took {t:?}");
    }

    /// The fixed-window defect this replaces: `2 × burst` requests sent at a window edge all
    /// went through at once (two windows' quotas). A token bucket holds at most `burst`, so
    /// the second half waits `burst / qps`.
    #[tokio::test]
    async fn never_more_than_burst_at_a_window_edge() {
        let (qps, burst) = (50.0, 10);
        let period = Duration::from_secs_f64(f64::from(burst) / qps); // 200 ms
        let mut svc = limited(qps, burst);
        tokio::time::sleep(period.mul_f64(0.9)).await;
        let t = time_requests(&mut svc, 2 * burst as usize).await;
        assert!(
            t >= period.mul_f64(0.95),
            "{} requests after an idle period took {t:?}: more than the burst of {burst} went at once",
            2 * burst
        );
    }
}
