//! Test fixture: a private `redis-server` (own free port and data dir, AOF on),
//! killed on drop. Used by the queue and intent tests; never by the services.

use std::time::Duration;

/// A running private redis-server.
pub struct TestRedis {
    child: std::process::Child,
    port: u16,
    _dir: tempfile::TempDir,
}

impl TestRedis {
    /// Start one and wait until it accepts connections. Panics when
    /// `redis-server` is not on PATH or does not come up within 5 s.
    pub async fn start() -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        Self::start_on(port).await
    }

    /// [`start`](Self::start) on `port` (e.g. a stopped one's, to bring it back).
    pub async fn start_on(port: u16) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let child = std::process::Command::new("redis-server")
            .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
            .args(["--dir", dir.path().to_str().unwrap()])
            .args(["--appendonly", "yes", "--appendfsync", "always"])
            .args(["--save", ""])
            .stdout(std::process::Stdio::null())
            .spawn()
            .expect("redis-server on PATH");
        let redis = TestRedis {
            child,
            port,
            _dir: dir,
        };
        for _ in 0..100 {
            if tokio::net::TcpStream::connect(("127.0.0.1", port))
                .await
                .is_ok()
            {
                return redis;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("redis-server did not start");
    }

    /// Its TCP port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }
}

/// A connection to `url` as if Sentinels had named it, with every Sentinel unreachable.
pub async fn behind_unreachable_sentinels(url: &str) -> crate::handoff::redis_conn::RedisConn {
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = closed.local_addr().unwrap().port();
    drop(closed);
    behind_sentinel_at(url, port).await
}

/// A connection to `url` as if the Sentinel on `port` had named it.
pub async fn behind_sentinel_at(url: &str, port: u16) -> crate::handoff::redis_conn::RedisConn {
    use crate::handoff::redis_conn::{manager_config, Endpoint, RedisConn};
    use redis::sentinel::{SentinelClientBuilder, SentinelServerType};
    let client = redis::Client::open(url).unwrap();
    let manager = redis::aio::ConnectionManager::new_with_config(client.clone(), manager_config());
    let sentinel = redis::ConnectionAddr::Tcp("127.0.0.1".into(), port);
    let sentinels = SentinelClientBuilder::new([sentinel], "p", SentinelServerType::Master);
    let sentinels = sentinels.unwrap().build().unwrap();
    let endpoint = Endpoint::Sentinel(std::sync::Arc::new(tokio::sync::Mutex::new(sentinels)));
    RedisConn::new(manager.await.unwrap(), client, endpoint)
}

impl Drop for TestRedis {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
