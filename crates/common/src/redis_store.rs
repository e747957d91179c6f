//! Redis connection shared by the durable queue and the provisioning intents.
//!
//! All keys of one provisioner live under one prefix, `provisioner:{<name>}:`,
//! where `<name>` is the provisioner name. The braces make it a Redis Cluster
//! hash tag, so multi-key transactions (MULTI/EXEC, Lua) on one provisioner's
//! keys stay on one shard.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// Key prefix of everything stored for `provisioner_name`, e.g.
/// `provisioner:{example.com/hostpath}:`.
pub fn key_prefix(provisioner_name: &str) -> String {
    format!("provisioner:{{{provisioner_name}}}:")
}

/// A reconnecting connection to `url` (`redis://host:port/db`, `rediss://` for TLS).
/// Commands fail fast while Redis is down (the manager reconnects in the
/// background); callers retry.
///
/// Errors: an invalid URL, or Redis unreachable at the first connection.
pub async fn connect(url: &str) -> redis::RedisResult<ConnectionManager> {
    let client = redis::Client::open(url)?;
    let config = ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(Duration::from_secs(5)))
        .set_number_of_retries(2);
    ConnectionManager::new_with_config(client, config).await
}

/// Name of the gauge [`watch_reachability`] sets: `redis_reachable`, 1 while
/// Redis answered the last `PING`, 0 otherwise.
pub const REACHABLE_GAUGE: &str = "redis_reachable";

/// Register the `redis_reachable` gauge into `registry` (starting at 0: not
/// known to be reachable yet).
pub fn reachable_gauge(registry: &prometheus::Registry) -> prometheus::IntGauge {
    crate::metrics::gauge(
        registry,
        REACHABLE_GAUGE,
        "1 while Redis (--redis-url) answered the last PING (probed every 5 s, 2 s timeout), 0 otherwise.",
    )
}

/// Probe `url` every `interval` until `stop` fires: connect (once, then the
/// manager reconnects by itself) and `PING`, each bounded by 2 s, and set
/// `gauge` to 1 on a `PONG`, 0 on any failure. Never returns an error: an
/// unreachable or invalid URL is exactly what the gauge reports. Runs in every
/// replica, leader or not, so a standby that cannot reach Redis is seen before
/// it takes over.
pub async fn watch_reachability(
    url: String,
    gauge: prometheus::IntGauge,
    interval: Duration,
    stop: tokio_util::sync::CancellationToken,
) {
    const PROBE_TIMEOUT: Duration = Duration::from_secs(2);
    let mut conn: Option<ConnectionManager> = None;
    loop {
        let probe = async {
            if conn.is_none() {
                conn = tokio::time::timeout(PROBE_TIMEOUT, connect(&url))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            match conn.as_mut() {
                Some(c) => {
                    let cmd = redis::cmd("PING");
                    let ping = cmd.query_async::<String>(c);
                    matches!(tokio::time::timeout(PROBE_TIMEOUT, ping).await, Ok(Ok(p)) if p == "PONG")
                }
                None => false,
            }
        };
        let up = tokio::select! {
            _ = stop.cancelled() => return,
            up = probe => up,
        };
        gauge.set(i64::from(up));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::test_redis::TestRedis;

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
    async fn reachability_follows_redis_up_and_down() {
        let redis = TestRedis::start().await;
        let registry = prometheus::Registry::new();
        let gauge = reachable_gauge(&registry);
        assert_eq!(gauge.get(), 0, "unknown until the first probe");
        let stop = tokio_util::sync::CancellationToken::new();
        let probe = tokio::spawn(watch_reachability(
            redis.url(),
            gauge.clone(),
            Duration::from_millis(50),
            stop.clone(),
        ));
        wait_gauge(&gauge, 1).await;
        drop(redis);
        wait_gauge(&gauge, 0).await;
        stop.cancel();
        probe.await.unwrap();
        assert!(crate::metrics::render(&registry).contains("redis_reachable 0\n"));
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
    #[test]
    fn prefix_is_a_cluster_hash_tag_per_provisioner() {
        assert_eq!(
            super::key_prefix("example.com/hostpath"),
            "provisioner:{example.com/hostpath}:"
        );
    }
}
