//! Test fixtures: a private `redis-server` (own free port and data dir, AOF on), killed on
//! drop, and a TCP proxy that can go silent. Used by common's tests and, with the `testing`
//! feature, by the e2e tests; never by the services.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::SeqCst};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};

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

    /// SIGSTOP the server: it holds its connections open and answers nothing.
    pub fn hang(&self) {
        // SAFETY: kill(2) on our own child's pid; no memory is touched.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGSTOP) };
    }

    /// Make this server a replica of `primary` and wait (up to 5 s) until the primary
    /// lists it online.
    pub async fn replicate(&self, primary: &TestRedis) {
        let mut to_replica = redis::Client::open(self.url()).unwrap();
        let _: () = redis::cmd("REPLICAOF")
            .arg("127.0.0.1")
            .arg(primary.port())
            .query(&mut to_replica)
            .unwrap();
        let mut to_primary = redis::Client::open(primary.url()).unwrap();
        for _ in 0..100 {
            let info: String = redis::cmd("INFO")
                .arg("replication")
                .query(&mut to_primary)
                .unwrap();
            if info.contains("state=online") {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        panic!("the replica did not come online");
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

/// A TCP proxy to `upstream`; [`Proxy::silence`] makes every connection open then stop
/// forwarding without closing (a peer gone without a reset), while new ones forward;
/// [`Proxy::lose_reply_of`] does that to one connection after one request.
pub struct Proxy {
    port: u16,
    opened: Arc<AtomicU64>,
    silenced_below: Arc<AtomicU64>,
    trap: Arc<Mutex<Option<Vec<u8>>>>,
    armed: AtomicBool,
}

/// What the two pumps of one proxied connection share.
#[derive(Clone)]
struct Link {
    id: u64,
    silenced_below: Arc<AtomicU64>,
    /// Set once a request matched the trap: this connection forwards nothing more.
    lost: Arc<AtomicBool>,
    /// Only the client-to-server pump looks for the trap.
    trap: Option<Arc<Mutex<Option<Vec<u8>>>>>,
}

impl Link {
    fn silenced(&self) -> bool {
        self.id < self.silenced_below.load(SeqCst) || self.lost.load(SeqCst)
    }

    /// Whether `request` holds the armed trap's bytes (disarming it).
    fn springs(&self, request: &[u8]) -> bool {
        let Some(trap) = &self.trap else { return false };
        let mut trap = trap.lock().unwrap();
        let hit = trap
            .as_ref()
            .is_some_and(|t| request.windows(t.len()).any(|w| w == t.as_slice()));
        if hit {
            *trap = None;
        }
        hit
    }
}

/// Copy `from` to `to` while the link is not silenced; then hold both open. A request
/// that springs the trap is forwarded, then the link goes silent (its reply is lost).
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    link: Link,
) {
    let mut buf = [0u8; 4096];
    while let Ok(n @ 1..) = from.read(&mut buf).await {
        if link.silenced() {
            std::future::pending::<()>().await;
        }
        if link.springs(&buf[..n]) {
            link.lost.store(true, SeqCst);
        }
        if to.write_all(&buf[..n]).await.is_err() {
            return;
        }
    }
}

impl Proxy {
    /// Listen on a free loopback port and forward each connection to `upstream`.
    pub async fn start(upstream: u16) -> Self {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let opened = Arc::new(AtomicU64::new(0));
        let silenced_below = Arc::new(AtomicU64::new(0));
        let trap = Arc::new(Mutex::new(None));
        let (count, silenced, armed) = (opened.clone(), silenced_below.clone(), trap.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let link = Link {
                    id: count.fetch_add(1, SeqCst),
                    silenced_below: silenced.clone(),
                    lost: Arc::new(AtomicBool::new(false)),
                    trap: None,
                };
                let server = tokio::net::TcpStream::connect(("127.0.0.1", upstream));
                let ((cr, cw), (sr, sw)) =
                    (client.into_split(), server.await.unwrap().into_split());
                let requests = Link {
                    trap: Some(armed.clone()),
                    ..link.clone()
                };
                tokio::spawn(pump(cr, sw, requests));
                tokio::spawn(pump(sr, cw, link));
            }
        });
        Proxy {
            port,
            opened,
            silenced_below,
            trap,
            armed: AtomicBool::new(false),
        }
    }

    /// Forward the next request whose bytes contain `pattern`, then silence its
    /// connection: the command runs on the server but its reply never arrives.
    pub fn lose_reply_of(&self, pattern: &[u8]) {
        *self.trap.lock().unwrap() = Some(pattern.to_vec());
        self.armed.store(true, SeqCst);
    }

    /// Whether a request sprang the trap [`lose_reply_of`](Self::lose_reply_of) set.
    pub fn sprung(&self) -> bool {
        self.armed.load(SeqCst) && self.trap.lock().unwrap().is_none()
    }

    /// `redis://127.0.0.1:<port>/0` through the proxy.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Make every connection open now stop forwarding (new ones still forward).
    pub fn silence(&self) {
        self.silenced_below.store(self.opened.load(SeqCst), SeqCst);
    }
}
