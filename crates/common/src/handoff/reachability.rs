//! The `redis_reachable` gauge: every replica of every service probes Redis
//! (`PING`, with the same settings as its work) so a standby that cannot
//! reach Redis is seen before it takes over.

use std::time::Duration;

use super::redis_conn::RedisConn;
use super::redis_store::{connect, RedisConfig};

/// Register the `redis_reachable` gauge ([`watch_reachability`] sets it) into
/// `registry`, starting at 0: not known to be reachable yet.
pub fn reachable_gauge(registry: &prometheus::Registry) -> prometheus::IntGauge {
    prometheus::register_int_gauge_with_registry!(
        "redis_reachable",
        "1 while Redis (--redis-url, with the service's credentials) answered the last PING (probed every 5 s, 2 s timeout), 0 otherwise.",
        registry
    )
    .expect("redis_reachable registered once")
}

/// Until `stop`: every `interval`, `PING` Redis at `config` (2 s bound) and set
/// `gauge` to 1 on `PONG`, else 0 and connect afresh for the next probe. Runs in
/// every replica, so a standby that cannot reach Redis is seen before it takes over.
pub async fn watch_reachability(
    config: RedisConfig,
    gauge: prometheus::IntGauge,
    interval: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
    let mut conn: Option<RedisConn> = None;
    loop {
        let probe = async {
            if conn.is_none() {
                conn = tokio::time::timeout(PROBE_TIMEOUT, connect(&config))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let up = match conn.as_mut() {
                Some(c) => {
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<String>(c);
                    matches!(tokio::time::timeout(PROBE_TIMEOUT, ping).await, Ok(Ok(p)) if p == "PONG")
                }
                None => false,
            };
            // A failed probe's connection is not reused: the next probe connects afresh.
            if !up {
                conn = None;
            }
            up
        };
        let Some(up) = stop.run_until_cancelled(probe).await else {
            return;
        };
        gauge.set(i64::from(up));
        let pause = tokio::time::sleep(interval);
        if stop.run_until_cancelled(pause).await.is_none() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::test_redis::TestRedis;

    async fn wait_gauge(gauge: &prometheus::IntGauge, want: i64) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while gauge.get() != want {
            assert!(
                tokio::time::Instant::now() < deadline,
                "gauge stays {}",
                gauge.get()
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    #[tokio::test]
    async fn reachability_follows_redis_down_and_back_up() {
        let redis = TestRedis::start().await;
        let registry = prometheus::Registry::new();
        let gauge = reachable_gauge(&registry);
        assert_eq!(gauge.get(), 0, "unknown until the first probe");
        let stop = tokio_util::sync::CancellationToken::new();
        let probe = tokio::spawn(watch_reachability(
            redis.url().into(),
            gauge.clone(),
            Duration::from_millis(50),
            stop.clone(),
        ));
        wait_gauge(&gauge, 1).await;
        let port = redis.port();
        drop(redis);
        wait_gauge(&gauge, 0).await;
        let _back = TestRedis::start_on(port).await;
        wait_gauge(&gauge, 1).await;
        stop.cancel();
        probe.await.unwrap();
        assert!(crate::runtime::metrics::render(&registry).contains("redis_reachable 1\n"));
    }

    #[tokio::test]
    async fn an_unreachable_or_invalid_url_reads_zero() {
        let gauge = reachable_gauge(&prometheus::Registry::new());
        for url in ["not a url", "redis://127.0.0.1:1/0"] {
            gauge.set(1);
            let stop = tokio_util::sync::CancellationToken::new();
            let probe = tokio::spawn(watch_reachability(
                url.into(),
                gauge.clone(),
                Duration::from_secs(60),
                stop.clone(),
            ));
            wait_gauge(&gauge, 0).await;
            stop.cancel();
            // Stops promptly while sleeping between probes.
            tokio::time::timeout(Duration::from_secs(1), probe)
                .await
                .expect("probe stops on cancel")
                .unwrap();
        }
    }
}
