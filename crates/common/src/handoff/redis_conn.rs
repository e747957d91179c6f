//! The connection every Redis user shares ([`RedisConn`]): a reconnecting
//! `ConnectionManager` to the primary, replaced by a new one after a command timed out
//! (redis-rs keeps a connection that stopped answering). With a `redis+sentinel://` URL
//! the Sentinels name the primary, and are asked again after an error that suggests a
//! failover (connection lost or refused, a timeout, `READONLY`, `NOREPLICAS`), without a
//! restart.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::sentinel::SentinelClient;
use redis::{Cmd, Pipeline, RedisFuture, RedisResult, Value};

/// Default Sentinel port when a `redis+sentinel://` host names none.
pub const SENTINEL_PORT: u16 = 26379;

/// A parsed `redis+sentinel://HOST[:PORT][,HOST[:PORT]…]/PRIMARY_NAME[/DB]`
/// (`rediss+sentinel://` for TLS to the Sentinels and the primary).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SentinelUrl {
    /// TLS to the Sentinels and to the primary.
    pub tls: bool,
    /// The Sentinels' host and port, in the URL's order.
    pub sentinels: Vec<(String, u16)>,
    /// The primary's name as the Sentinels know it (`sentinel monitor <name> …`).
    pub primary_name: String,
    /// Database number on the primary (default 0).
    pub db: i64,
}

/// `Ok(None)` for a URL of another scheme; errors say what is wrong with a
/// Sentinel URL (credentials belong in the password-file flags, not the URL).
pub fn parse_sentinel_url(url: &str) -> Result<Option<SentinelUrl>, String> {
    let (tls, rest) = match url.split_once("://") {
        Some(("redis+sentinel", rest)) => (false, rest),
        Some(("rediss+sentinel", rest)) => (true, rest),
        _ => return Ok(None),
    };
    let (hosts, path) = rest.split_once('/').unwrap_or((rest, ""));
    if hosts.contains('@') {
        return Err("a Sentinel URL carries no credentials: use --redis-username/--redis-password-file (primary) and --redis-sentinel-password-file".into());
    }
    let sentinels = hosts
        .split(',')
        .map(|host| match host.rsplit_once(':') {
            Some((h, p)) => p
                .parse::<u16>()
                .map(|p| (h.to_string(), p))
                .map_err(|_| format!("Sentinel port {p:?} is not a number up to 65535")),
            None => Ok((host.to_string(), SENTINEL_PORT)),
        })
        .collect::<Result<Vec<_>, _>>()?;
    if sentinels.iter().any(|(h, _)| h.is_empty()) {
        return Err("a Sentinel host is empty: want HOST[:PORT],HOST[:PORT]…".into());
    }
    let mut parts = path.split('/').filter(|p| !p.is_empty());
    let primary_name = parts
        .next()
        .ok_or("the URL names no primary: want redis+sentinel://HOSTS/PRIMARY_NAME[/DB]")?
        .to_string();
    let db = match parts.next() {
        Some(db) => db
            .parse()
            .map_err(|_| format!("database {db:?} is not a number"))?,
        None => 0,
    };
    if parts.next().is_some() {
        return Err("too many path segments: want /PRIMARY_NAME[/DB]".into());
    }
    Ok(Some(SentinelUrl {
        tls,
        sentinels,
        primary_name,
        db,
    }))
}

/// Where the primary is: a fixed address, or asked of the Sentinels.
#[derive(Clone)]
pub enum Endpoint {
    /// `redis://`, `rediss://`, `unix://`: one server.
    Fixed(Box<redis::Client>),
    /// `redis+sentinel://`: the Sentinels name the current primary.
    Sentinel(Arc<tokio::sync::Mutex<SentinelClient>>),
}

impl Endpoint {
    /// A client for the current primary (for Sentinels: the server they name,
    /// checked to answer `ROLE` as a master). Errors: no Sentinel or primary answered.
    pub async fn primary(&self) -> RedisResult<redis::Client> {
        match self {
            Endpoint::Fixed(client) => Ok((**client).clone()),
            Endpoint::Sentinel(sentinels) => sentinels.lock().await.async_get_client().await,
        }
    }
}

/// Longest wait for one command's answer before it fails as a timeout.
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

/// The reconnect policy of every `ConnectionManager`: 2 s to connect, 5 s per
/// answer, 2 retries, so commands fail fast while Redis is down.
pub fn manager_config() -> ConnectionManagerConfig {
    ConnectionManagerConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(ANSWER_TIMEOUT))
        .set_number_of_retries(2)
}

/// Whether `err` suggests the primary moved or its connection died: lost or refused,
/// `READONLY` (a demoted primary), `MASTERDOWN`, `NOREPLICAS` (a primary cut off from its
/// replicas, with `min-replicas-to-write`).
pub fn failover_like(err: &redis::RedisError) -> bool {
    err.is_io_error()
        || err.is_connection_dropped()
        || err.is_connection_refusal()
        || matches!(err.code(), Some("READONLY" | "MASTERDOWN" | "NOREPLICAS"))
}

/// A cheap-to-clone connection to the Redis primary; implements redis-rs'
/// `ConnectionLike`, so commands and scripts run on it as on a `ConnectionManager`.
#[derive(Clone)]
pub struct RedisConn {
    manager: ConnectionManager,
    failover: Arc<Failover>,
}

/// The shared side of a [`RedisConn`]: the newest primary connection and who may
/// look the primary up (Sentinels) or connect to it again.
struct Failover {
    endpoint: Endpoint,
    primary: Mutex<Primary>,
    resolving: tokio::sync::Mutex<Instant>,
    reconnected: Mutex<Option<Instant>>,
    switches: std::sync::atomic::AtomicU64,
}

/// The primary commands go to: its address, connection and client (to connect again),
/// and the connection's number (one more after each move or new connection).
struct Primary {
    addr: String,
    manager: ConnectionManager,
    client: redis::Client,
    number: u64,
}

/// Least time between two lookups of the primary.
const LOOKUP_INTERVAL: Duration = Duration::from_millis(500);
/// Bound of one lookup (Sentinels, then the new primary's connection).
const LOOKUP_TIMEOUT: Duration = Duration::from_secs(2);
/// Least time between two new connections to the same primary after timeouts.
const RECONNECT_INTERVAL: Duration = Duration::from_secs(5);

impl std::fmt::Debug for RedisConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConn")
            .field("primary", &self.primary_addr())
            .finish_non_exhaustive()
    }
}

impl RedisConn {
    /// A connection over `manager`, made by `client` to the primary of `endpoint`
    /// (with Sentinels, they are asked again after a failover-like error).
    pub fn new(manager: ConnectionManager, client: redis::Client, endpoint: Endpoint) -> Self {
        let addr = client.get_connection_info().addr().to_string();
        let primary = Primary {
            addr,
            manager: manager.clone(),
            client,
            number: 0,
        };
        let failover = Arc::new(Failover {
            endpoint,
            primary: Mutex::new(primary),
            resolving: tokio::sync::Mutex::new(Instant::now() - LOOKUP_INTERVAL),
            reconnected: Mutex::new(None),
            switches: Default::default(),
        });
        RedisConn { manager, failover }
    }

    /// The address commands go to now (`host:port`, or the socket path) when Sentinels
    /// name it; `None` for a fixed address.
    pub fn primary_addr(&self) -> Option<String> {
        self.failover.sentinels().then(|| {
            self.failover
                .primary
                .lock()
                .expect("not poisoned")
                .addr
                .clone()
        })
    }

    /// The primary commands go to now: the shared connection's number (one more after
    /// each move or new connection, also to the same address) and a client to connect to it.
    pub fn primary(&self) -> (u64, redis::Client) {
        let primary = self.failover.primary.lock().expect("not poisoned");
        (primary.number, primary.client.clone())
    }

    /// How many times this connection moved to another primary (0 without
    /// Sentinels); the new primary may lack the last writes of the old one.
    pub fn primary_switches(&self) -> u64 {
        self.failover
            .switches
            .load(std::sync::atomic::Ordering::SeqCst)
    }

    /// A caller's own deadline passed before an answer: connect again, as after a
    /// command's timeout (at most once per 5 s).
    pub async fn timed_out(&mut self) {
        self.failover.look_up(true, false).await;
        self.refresh();
    }

    /// Use the newest primary connection (after another clone's lookup or reconnect).
    fn refresh(&mut self) {
        self.manager = self
            .failover
            .primary
            .lock()
            .expect("not poisoned")
            .manager
            .clone();
    }

    /// `result` of a command, after reacting to its error as [`saw_error`](Self::saw_error)
    /// does, but without waiting for another clone's lookup.
    async fn after<T>(&mut self, result: RedisResult<T>) -> RedisResult<T> {
        if let Err(err) = &result {
            self.react(err, false).await;
        }
        result
    }

    /// `err` of a command to this primary on another connection to it: as after an error
    /// here, and waiting for a lookup another clone is running, so that the primary is
    /// current when this returns (e.g. to retry on it).
    pub async fn saw_error(&mut self, err: &redis::RedisError) {
        self.react(err, true).await;
    }

    /// After a timeout, connect again (redis-rs would keep the silent connection); with
    /// Sentinels, after any [`failover_like`] error, look the primary up (`wait`: also
    /// when another lookup is running, for its end).
    async fn react(&mut self, err: &redis::RedisError, wait: bool) {
        if err.is_timeout() || self.failover.sentinels() && failover_like(err) {
            self.failover.look_up(err.is_timeout(), wait).await;
            self.refresh();
        }
    }
}

impl Failover {
    /// Whether Sentinels name the primary (else its address is fixed).
    fn sentinels(&self) -> bool {
        matches!(self.endpoint, Endpoint::Sentinel(_))
    }

    /// [`look_up_now`](Self::look_up_now) unless one ran within [`LOOKUP_INTERVAL`] of its
    /// end; one at a time (`wait`: waiting for a running one, whose result then stands).
    async fn look_up(&self, fresh: bool, wait: bool) {
        let idle = match wait {
            true => Some(self.resolving.lock().await),
            false => self.resolving.try_lock().ok(),
        };
        let Some(mut last) = idle.filter(|last| last.elapsed() >= LOOKUP_INTERVAL) else {
            return;
        };
        self.look_up_now(fresh).await;
        *last = Instant::now();
    }

    /// Ask the endpoint for the primary and switch when it names another, or with `fresh`
    /// (a timeout) connect to the same one again, also when no Sentinel answers.
    async fn look_up_now(&self, fresh: bool) {
        let named = match tokio::time::timeout(LOOKUP_TIMEOUT, self.endpoint.primary()).await {
            Ok(Ok(client)) => Some(client),
            Ok(Err(err)) => {
                tracing::warn!(error = %err, "no Sentinel names a primary that answers");
                None
            }
            Err(_) => {
                tracing::warn!("Sentinels did not name a primary within 2 s");
                None
            }
        };
        let (old, known, number) = {
            let primary = self.primary.lock().expect("not poisoned");
            (primary.addr.clone(), primary.client.clone(), primary.number)
        };
        let client = match named {
            Some(client) => client,
            None if fresh => known,
            None => return,
        };
        let addr = client.get_connection_info().addr().to_string();
        if addr == old {
            let mut reconnected = self.reconnected.lock().expect("not poisoned");
            if !fresh || reconnected.is_some_and(|at| at.elapsed() < RECONNECT_INTERVAL) {
                return;
            }
            *reconnected = Some(Instant::now());
        }
        let manager = ConnectionManager::new_with_config(client.clone(), manager_config());
        match tokio::time::timeout(LOOKUP_TIMEOUT, manager).await {
            Ok(Ok(manager)) => {
                if addr == old {
                    tracing::warn!(primary = %addr, "Redis did not answer in time; connected again");
                } else {
                    tracing::warn!(from = %old, to = %addr, "Redis primary changed");
                    self.switches
                        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                let primary = Primary {
                    addr,
                    manager,
                    client,
                    number: number + 1,
                };
                *self.primary.lock().expect("not poisoned") = primary;
            }
            Ok(Err(err)) => {
                tracing::warn!(primary = %addr, error = %err, "cannot connect to the Redis primary")
            }
            Err(_) => {
                tracing::warn!(primary = %addr, "the Redis primary did not answer within 2 s")
            }
        }
    }
}

impl ConnectionLike for RedisConn {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            self.refresh();
            let result = self.manager.req_packed_command(cmd).await;
            self.after(result).await
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            self.refresh();
            let result = self
                .manager
                .req_packed_commands(pipeline, offset, count)
                .await;
            self.after(result).await
        })
    }

    fn get_db(&self) -> i64 {
        self.manager.get_db()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::handoff::test_redis::{Proxy, TestRedis};

    /// A Redis behind a [`Proxy`] and a connection through it.
    async fn through_proxy() -> (TestRedis, Proxy, RedisConn) {
        let redis = TestRedis::start().await;
        let proxy = Proxy::start(redis.port()).await;
        let url = proxy.url();
        let conn = crate::handoff::redis_store::connect(url.as_str()).await;
        (redis, proxy, conn.unwrap())
    }

    /// `PING` over a clone of `conn`, given up after `within`.
    async fn ping(conn: &RedisConn, within: Duration) -> Result<RedisResult<String>, ()> {
        let mut conn = conn.clone();
        let ping = async move { redis::cmd("PING").query_async(&mut conn).await };
        tokio::time::timeout(within, ping).await.map_err(|_| ())
    }

    #[tokio::test]
    async fn a_connection_that_stops_answering_is_replaced_by_a_new_one() {
        let (_redis, proxy, conn) = through_proxy().await;
        let long = Duration::from_secs(8);
        assert_eq!(ping(&conn, long).await.unwrap().unwrap(), "PONG");
        proxy.silence();
        let err = ping(&conn, long).await.unwrap().unwrap_err();
        assert!(err.is_timeout(), "{err}");
        // redis-rs keeps a connection that times out; ours connects again.
        let answer = ping(&conn, long).await.expect("answered within 8 s");
        assert_eq!(answer.unwrap(), "PONG");
        assert_eq!(conn.primary_switches(), 0, "the same primary: no switch");
    }

    #[tokio::test]
    async fn a_callers_own_deadline_makes_a_silent_connection_connect_again() {
        let (_redis, proxy, mut conn) = through_proxy().await;
        proxy.silence();
        assert!(ping(&conn, Duration::from_millis(300)).await.is_err());
        conn.timed_out().await;
        let answer = ping(&conn, Duration::from_secs(3)).await;
        assert_eq!(answer.expect("answered within 3 s").unwrap(), "PONG");
    }

    #[tokio::test]
    async fn with_no_sentinel_answering_a_silent_primary_is_connected_to_again() {
        let redis = TestRedis::start().await;
        let proxy = Proxy::start(redis.port()).await;
        let url = proxy.url();
        let conn = crate::handoff::test_redis::behind_unreachable_sentinels(&url).await;
        let long = Duration::from_secs(8);
        proxy.silence();
        assert!(ping(&conn, long).await.unwrap().unwrap_err().is_timeout());
        let answer = ping(&conn, long).await.expect("answered within 8 s");
        assert_eq!(answer.unwrap(), "PONG");
        assert_eq!(conn.primary_switches(), 0, "the same primary: no switch");
    }

    #[tokio::test]
    async fn errors_seen_during_a_slow_lookup_wait_for_it_instead_of_each_looking_up() {
        let redis = TestRedis::start().await;
        // A Sentinel that accepts and never answers: each lookup takes its whole 2 s.
        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = silent.local_addr().unwrap().port();
        tokio::spawn(async move {
            let mut held = Vec::new();
            while let Ok((conn, _)) = silent.accept().await {
                held.push(conn);
            }
        });
        let conn = crate::handoff::test_redis::behind_sentinel_at(&redis.url(), port).await;
        let refused =
            redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        let started = Instant::now();
        let errors = (0..4).map(|_| {
            let (mut conn, err) = (conn.clone(), refused.clone());
            async move { conn.saw_error(&err).await }
        });
        futures::future::join_all(errors).await;
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(4),
            "4 errors took {took:?}: one lookup each"
        );
    }

    #[test]
    fn sentinel_urls_name_hosts_primary_and_db() {
        let url = parse_sentinel_url("redis+sentinel://s1,s2:26380,10.0.0.3:1/mymaster/2")
            .unwrap()
            .unwrap();
        assert_eq!(
            url,
            SentinelUrl {
                tls: false,
                sentinels: vec![
                    ("s1".into(), 26379),
                    ("s2".into(), 26380),
                    ("10.0.0.3".into(), 1)
                ],
                primary_name: "mymaster".into(),
                db: 2,
            }
        );
        let tls = parse_sentinel_url("rediss+sentinel://s/p")
            .unwrap()
            .unwrap();
        assert!(tls.tls);
        assert_eq!(tls.db, 0);
        assert_eq!(parse_sentinel_url("redis://h:6379/0").unwrap(), None);
    }

    #[test]
    fn bad_sentinel_urls_say_what_is_wrong() {
        for (url, says) in [
            ("redis+sentinel://s1:26379", "names no primary"),
            ("redis+sentinel://u:pw@s1/p", "no credentials"),
            ("redis+sentinel://s1:x/p", "not a number"),
            ("redis+sentinel://s1,,s2/p", "empty"),
            ("redis+sentinel://s1/p/zero", "not a number"),
            ("redis+sentinel://s1/p/0/x", "too many"),
        ] {
            let err = parse_sentinel_url(url).unwrap_err();
            assert!(err.contains(says), "{url}: {err}");
        }
    }
}
