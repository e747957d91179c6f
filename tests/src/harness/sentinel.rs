//! A replicated Redis on loopback: a primary, one or two replicas and three Sentinels
//! (quorum 2, a primary down after 1 s), all `redis-server` children (a Sentinel
//! is `redis-server <conf> --sentinel`). Open: no password, protected mode off.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context as _;

use super::process::{free_port, ManagedProcess};
use super::redis::which;
use super::wait::{wait_for, wait_until};

/// The name the Sentinels monitor the primary under.
pub const PRIMARY_NAME: &str = "provisioner";

/// Data servers (index 0 starts as primary) and three Sentinels.
pub struct RedisSentinels {
    dir: PathBuf,
    data: Vec<(u16, Option<ManagedProcess>)>,
    sentinels: Vec<(u16, ManagedProcess)>,
    guard: Vec<String>,
}

/// The write guard and resync delay `deploy/components/redis-sentinel/start-redis.sh`
/// gives each data server (`--min-replicas-to-write N --min-replicas-max-lag S
/// --repl-diskless-sync-delay S`). Errors: the script is missing or lacks a flag.
fn deployed_guard() -> anyhow::Result<Vec<String>> {
    let script = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/components/redis-sentinel/start-redis.sh");
    let text = std::fs::read_to_string(&script)?;
    let words: Vec<&str> = text.split_whitespace().collect();
    let mut guard = Vec::new();
    let flags = [
        "--min-replicas-to-write",
        "--min-replicas-max-lag",
        "--repl-diskless-sync-delay",
    ];
    for flag in flags {
        let at = words.iter().position(|w| *w == flag);
        let value = at.and_then(|i| words.get(i + 1)).context(flag)?;
        guard.extend([flag.to_string(), value.to_string()]);
    }
    Ok(guard)
}

impl RedisSentinels {
    /// Start the primary, one replica (waits until it is in sync) and the
    /// Sentinels (waits until all three know the replica and each other).
    ///
    /// Errors: `redis-server` missing, or a server not answering within 15 s.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        Self::start_with(dir, 1, Vec::new()).await
    }

    /// As deployed by `deploy/components/redis-sentinel`: two replicas, and every data
    /// server with the component's write guard (a primary refuses writes without a replica
    /// keeping up). Errors: as [`start`](Self::start), or the guard is not in the component.
    pub async fn start_as_deployed(dir: &Path) -> anyhow::Result<Self> {
        Self::start_with(dir, 2, deployed_guard()?).await
    }

    async fn start_with(dir: &Path, replicas: usize, guard: Vec<String>) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut set = RedisSentinels {
            dir: dir.to_path_buf(),
            data: Vec::new(),
            sentinels: Vec::new(),
            guard,
        };
        let primary = free_port()?;
        set.start_data(primary, None).await?;
        for i in 1..=replicas {
            set.start_data(free_port()?, Some(primary)).await?;
            let port = set.data[i].0;
            wait_until(Duration::from_secs(15), "replica in sync", || async move {
                info(port, "replication")
                    .await
                    .is_some_and(|i| i.contains("master_link_status:up"))
            })
            .await?;
        }
        for i in 0..3 {
            let port = free_port()?;
            let conf = set.dir.join(format!("sentinel-{i}.conf"));
            std::fs::write(
                &conf,
                format!(
                    "port {port}\nbind 127.0.0.1\nprotected-mode no\ndir {dir}\n\
                     sentinel monitor {PRIMARY_NAME} 127.0.0.1 {primary} 2\n\
                     sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
                     sentinel failover-timeout {PRIMARY_NAME} 5000\n",
                    dir = set.dir.display()
                ),
            )?;
            let process = spawn(
                &format!("sentinel-{i}"),
                &[conf.display().to_string(), "--sentinel".into()],
                &set.dir.join(format!("sentinel-{i}.log")),
            )?;
            set.sentinels.push((port, process));
        }
        for (port, _) in &set.sentinels {
            let port = *port;
            wait_until(
                Duration::from_secs(15),
                "Sentinel sees replica and peers",
                || async move {
                    let want = format!("slaves={replicas},sentinels=3");
                    info(port, "sentinel")
                        .await
                        .is_some_and(|i| i.contains(&want))
                },
            )
            .await?;
        }
        Ok(set)
    }

    async fn start_data(&mut self, port: u16, replica_of: Option<u16>) -> anyhow::Result<()> {
        let i = self.data.len();
        let dir = self.dir.join(format!("data-{i}"));
        std::fs::create_dir_all(&dir)?;
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--protected-mode",
            "no",
            "--dir",
            &dir.display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ]
        .map(String::from)
        .to_vec();
        args.extend(self.guard.iter().cloned());
        if let Some(primary) = replica_of {
            args.extend([
                "--replicaof".into(),
                "127.0.0.1".into(),
                primary.to_string(),
            ]);
        }
        let log = self.dir.join(format!("data-{i}.log"));
        let process = spawn(&format!("redis-{i}"), &args, &log)?;
        self.data.push((port, Some(process)));
        wait_until(
            Duration::from_secs(15),
            "redis-server answers PING",
            || async move { info(port, "server").await.is_some() },
        )
        .await
    }

    /// `redis+sentinel://127.0.0.1:<s1>,…/provisioner/0`, the services' `--redis-url`.
    pub fn url(&self) -> String {
        let hosts: Vec<String> = self
            .sentinels
            .iter()
            .map(|(port, _)| format!("127.0.0.1:{port}"))
            .collect();
        format!("redis+sentinel://{}/{PRIMARY_NAME}/0", hosts.join(","))
    }

    /// Plain URL of data server `i` (0 started as primary), e.g. for `FLUSHALL`.
    pub fn data_url(&self, i: usize) -> String {
        format!("redis://127.0.0.1:{}/0", self.data[i].0)
    }

    /// The port the Sentinels name as primary now.
    ///
    /// Errors: no Sentinel answers.
    pub async fn primary_port(&self) -> anyhow::Result<u16> {
        for (port, _) in &self.sentinels {
            if let Some(primary) = named_primary(*port).await {
                return Ok(primary);
            }
        }
        anyhow::bail!("no Sentinel answered")
    }

    /// Index of the data server listening on `port`.
    fn index_of(&self, port: u16) -> anyhow::Result<usize> {
        self.data
            .iter()
            .position(|(p, _)| *p == port)
            .context("the Sentinels name an unknown server")
    }

    /// Ask a Sentinel to fail over (`SENTINEL FAILOVER`) while the primary runs; returns
    /// the old primary's port. It stays a primary, without replicas, until the Sentinels
    /// reconfigure it (10–11 s after the failover with redis 7.0).
    ///
    /// Errors: no Sentinel answers, or it refuses.
    pub async fn fail_over_by_hand(&self) -> anyhow::Result<u16> {
        let old = self.primary_port().await?;
        let mut conn = connection(self.sentinels[0].0).await?;
        let _: () = redis::cmd("SENTINEL")
            .arg("FAILOVER")
            .arg(PRIMARY_NAME)
            .query_async(&mut conn)
            .await?;
        Ok(old)
    }

    /// SIGKILL the current primary, then wait (30 s) until the Sentinels promote
    /// the other server and it answers as master; returns the new primary's port.
    ///
    /// Errors: no failover within 30 s.
    pub async fn kill_primary_and_fail_over(&mut self) -> anyhow::Result<u16> {
        let old = self.kill_primary().await?;
        self.wait_failover(old).await
    }

    /// SIGKILL the current primary; returns its port.
    ///
    /// Errors: no Sentinel answers.
    pub async fn kill_primary(&mut self) -> anyhow::Result<u16> {
        let old = self.primary_port().await?;
        let i = self.index_of(old)?;
        if let Some(mut p) = self.data[i].1.take() {
            p.kill();
        }
        Ok(old)
    }

    /// Wait (30 s) until every Sentinel names the same primary other than `old`, and it
    /// answers as master; returns its port.
    ///
    /// Errors: no failover within 30 s.
    pub async fn wait_failover(&self, old: u16) -> anyhow::Result<u16> {
        wait_for(Duration::from_secs(30), "Sentinel failover", || async {
            let mut named = Vec::new();
            for (port, _) in &self.sentinels {
                named.push(named_primary(*port).await?);
            }
            let port = named[0];
            if port == old || named.iter().any(|p| *p != port) {
                return None;
            }
            info(port, "replication")
                .await
                .filter(|i| i.contains("role:master"))
                .map(|_| port)
        })
        .await
    }

    /// Freeze (SIGSTOP) or thaw (SIGCONT) data server `i`: a frozen replica
    /// misses every write until thawed.
    pub fn freeze(&self, i: usize, frozen: bool) {
        if let Some(p) = &self.data[i].1 {
            p.signal(if frozen { libc::SIGSTOP } else { libc::SIGCONT });
        }
    }

    /// Port of data server `i`.
    pub fn data_port(&self, i: usize) -> u16 {
        self.data[i].0
    }
}

fn spawn(name: &str, args: &[String], log: &Path) -> anyhow::Result<ManagedProcess> {
    let program = which("redis-server")
        .context("redis-server not found on PATH (apt-get install redis-server)")?;
    ManagedProcess::spawn(name, &program, args, &[], log)
}

async fn connection(port: u16) -> anyhow::Result<redis::aio::MultiplexedConnection> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}"))?;
    let conn = tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await??;
    Ok(conn)
}

/// The primary's port in the Sentinel's table on `port` (`SENTINEL MASTER`, which clients
/// read through `SENTINEL MASTERS`); `None` when it does not answer. During a failover,
/// `get-master-addr-by-name` names the promoted replica before this table does.
async fn named_primary(port: u16) -> Option<u16> {
    let mut conn = connection(port).await.ok()?;
    let table: redis::RedisResult<std::collections::HashMap<String, String>> =
        redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(PRIMARY_NAME)
            .query_async(&mut conn)
            .await;
    table.ok()?.get("port")?.parse().ok()
}

/// `INFO <section>` of the server on `port`, `None` when it does not answer.
pub async fn info(port: u16, section: &str) -> Option<String> {
    let mut conn = connection(port).await.ok()?;
    let mut cmd = redis::cmd("INFO");
    let answer = cmd.arg(section).query_async(&mut conn);
    tokio::time::timeout(Duration::from_secs(1), answer)
        .await
        .ok()?
        .ok()
}
