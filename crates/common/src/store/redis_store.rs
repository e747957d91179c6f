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
