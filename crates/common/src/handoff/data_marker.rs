//! Redis data-loss detection: a marker key (`provisioner:{<name>}:data-marker`, a
//! random id created once) that vanishes or changes when Redis loses its data (a
//! wiped volume, `FLUSHALL`), and a move to another primary (Sentinel failover: the
//! new one may lack the last writes).

use super::redis_conn::RedisConn;
use super::redis_store::key_prefix;

/// One service's view of the marker; [`DataMarker::lost`] compares with the last look.
pub struct DataMarker {
    conn: RedisConn,
    key: String,
    seen: Option<String>,
    switches: u64,
}

impl DataMarker {
    /// The marker of `provisioner_name` on `conn`; nothing is read yet.
    pub fn new(conn: RedisConn, provisioner_name: &str) -> Self {
        DataMarker {
            key: format!("{}data-marker", key_prefix(provisioner_name)),
            seen: None,
            switches: conn.primary_switches(),
            conn,
        }
    }

    /// Read the marker, creating it when absent (`SET NX GET`, Redis ≥ 7.0). True when it
    /// vanished or changed, or the connection moved to another primary, since the last look
    /// that succeeded (or [`new`](Self::new)). Errors: the command failed (nothing forgotten).
    pub async fn lost(&mut self) -> redis::RedisResult<bool> {
        let switches = self.conn.primary_switches();
        let fresh = uuid::Uuid::new_v4().to_string();
        let old: Option<String> = redis::cmd("SET")
            .arg(&self.key)
            .arg(&fresh)
            .arg("NX")
            .arg("GET")
            .query_async(&mut self.conn)
            .await?;
        let moved = std::mem::replace(&mut self.switches, switches) != switches;
        let now = old.unwrap_or(fresh);
        let lost = self.seen.as_ref().is_some_and(|seen| *seen != now);
        self.seen = Some(now);
        Ok(lost || moved)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::redis_store::connect;
    use crate::handoff::test_redis::TestRedis;

    #[tokio::test]
    async fn the_marker_reports_a_flush_once_and_a_restart_never() {
        let redis = TestRedis::start().await;
        let conn = connect(&redis.url()).await.unwrap();
        let mut mine = DataMarker::new(conn.clone(), "p");
        let mut other = DataMarker::new(conn.clone(), "p");
        assert!(!mine.lost().await.unwrap(), "first look");
        assert!(!other.lost().await.unwrap(), "another service adopts it");
        assert!(!mine.lost().await.unwrap(), "unchanged");
        let _: () = redis::cmd("FLUSHALL")
            .query_async(&mut conn.clone())
            .await
            .unwrap();
        assert!(other.lost().await.unwrap(), "gone: lost, and made again");
        assert!(mine.lost().await.unwrap(), "remade by another: lost too");
        assert!(!mine.lost().await.unwrap(), "reported once");
        let mut third = DataMarker::new(conn, "other/name");
        assert!(!third.lost().await.unwrap(), "per provisioner");
    }
}
