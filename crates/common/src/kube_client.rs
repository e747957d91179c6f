//! Kubernetes client construction: kubeconfig or in-cluster config, with a
//! client-side request rate limit applied as a tower layer.

use std::time::Duration;

use anyhow::Context;
use kube::client::ClientBuilder;
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};
use tower::limit::RateLimitLayer;
use tower::util::option_layer;

use crate::api_metrics::ApiMetrics;
use crate::config::CommonArgs;

/// The window of the client-side limit: at most `burst` requests per
/// `burst / qps` seconds, which averages `qps` requests per second and lets
/// `burst` requests through at once (client-go's token bucket allows the same
/// long-run rate and burst). `None` when `qps <= 0` (limit disabled).
///
/// The default 200 qps / 400 burst lets one service sustain 100 volumes/s at
/// ~2 requests per volume; client-go's 5 / 10 is what caps the seed at ~4 volumes/s.
pub fn rate_limit_window(qps: f64, burst: u32) -> Option<(u64, Duration)> {
    if qps <= 0.0 || !qps.is_finite() {
        return None;
    }
    let burst = u64::from(burst.max(1));
    Some((burst, Duration::from_secs_f64(burst as f64 / qps)))
}

/// Load the client configuration: `--kubeconfig` if given, else the usual
/// inference (`KUBECONFIG`, `~/.kube/config`, then the in-cluster service account).
///
/// Errors: unreadable or invalid kubeconfig, or no configuration found.
pub async fn load_config(args: &CommonArgs) -> anyhow::Result<Config> {
    match &args.kubeconfig {
        Some(path) => {
            let kubeconfig = Kubeconfig::read_from(path)
                .with_context(|| format!("reading kubeconfig {}", path.display()))?;
            Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
                .await
                .with_context(|| format!("loading kubeconfig {}", path.display()))
        }
        None => Config::infer()
            .await
            .context("no kubeconfig found and not running in a cluster"),
    }
}

/// Build a client from `config` with the `--kube-api-qps`/`--kube-api-burst`
/// limit (see [`rate_limit_window`]) as a [`RateLimitLayer`].
///
/// Errors: TLS or connector setup failures from kube.
///
/// kube's built-in retry layer (`Config::default_retry`: up to 15 retries of
/// 429/503/504 with backoff growing to 1000 s) is switched off: every caller
/// here has its own retry policy (work-queue backoff, pv-writer's per-entry
/// backoff, the Lease retry period), and a request hidden in minutes of retries
/// would blind the leader's renew-deadline watchdog.
pub fn build_client(config: Config, qps: f64, burst: u32) -> anyhow::Result<Client> {
    build_client_with_metrics(config, qps, burst, None)
}

/// [`build_client`] that also records every request in `metrics`
/// (`rest_client_requests_total`, `rest_client_request_duration_seconds`,
/// see [`crate::api_metrics`]), measured inside the rate limit as client-go does.
///
/// Errors: as [`build_client`].
pub fn build_client_with_metrics(
    mut config: Config,
    qps: f64,
    burst: u32,
    metrics: Option<&ApiMetrics>,
) -> anyhow::Result<Client> {
    config.default_retry = false;
    let builder = ClientBuilder::try_from(config).context("building Kubernetes client")?;
    let rate_limit = rate_limit_window(qps, burst).map(|(num, per)| RateLimitLayer::new(num, per));
    Ok(builder
        .with_layer(&option_layer(metrics.cloned()))
        .with_layer(&option_layer(rate_limit))
        .build())
}

/// [`load_config`] then [`build_client`] with the flags' limits.
pub async fn client_from_args(args: &CommonArgs) -> anyhow::Result<Client> {
    let config = load_config(args).await?;
    build_client(config, args.kube_api_qps, args.kube_api_burst)
}

/// [`client_from_args`] with the API request metrics registered into `registry`
/// (what [`crate::runtime::run_service`] uses).
///
/// Errors: as [`client_from_args`].
pub async fn client_from_args_with_metrics(
    args: &CommonArgs,
    registry: &prometheus::Registry,
) -> anyhow::Result<Client> {
    let config = load_config(args).await?;
    let metrics = ApiMetrics::register(registry);
    build_client_with_metrics(
        config,
        args.kube_api_qps,
        args.kube_api_burst,
        Some(&metrics),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_averages_qps_and_allows_burst() {
        assert_eq!(
            rate_limit_window(200.0, 400),
            Some((400, Duration::from_secs(2)))
        );
        assert_eq!(
            rate_limit_window(5.0, 10),
            Some((10, Duration::from_secs(2)))
        );
        assert_eq!(rate_limit_window(0.0, 400), None);
        assert_eq!(rate_limit_window(-1.0, 400), None);
    }

    #[tokio::test(start_paused = true)]
    async fn layer_holds_requests_beyond_the_burst() {
        use tower::{Service, ServiceExt};
        let (num, per) = rate_limit_window(2.0, 2).unwrap();
        let mut svc = tower::ServiceBuilder::new()
            .layer(RateLimitLayer::new(num, per))
            .service_fn(|_: ()| async { Ok::<_, std::convert::Infallible>(()) });
        let start = tokio::time::Instant::now();
        for _ in 0..2 {
            svc.ready().await.unwrap().call(()).await.unwrap();
        }
        assert_eq!(start.elapsed(), Duration::ZERO);
        svc.ready().await.unwrap().call(()).await.unwrap();
        assert_eq!(start.elapsed(), Duration::from_secs(1));
    }
}
