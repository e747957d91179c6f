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
        if conn.is_none() {
            conn = tokio::time::timeout(PROBE_TIMEOUT, connect(&url))
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
        gauge.set(i64::from(up));
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn prefix_is_a_cluster_hash_tag_per_provisioner() {
        assert_eq!(
            super::key_prefix("example.com/hostpath"),
            "provisioner:{example.com/hostpath}:"
        );
    }
}
