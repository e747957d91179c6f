//! A replicated Redis on loopback: a primary, one replica and three Sentinels
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

/// Two data servers (index 0 starts as primary) and three Sentinels.
pub struct RedisSentinels {
    dir: PathBuf,
    data: Vec<(u16, Option<ManagedProcess>)>,
    sentinels: Vec<(u16, ManagedProcess)>,
}

impl RedisSentinels {
    /// Start the primary, the replica (waits until it is in sync) and the
    /// Sentinels (waits until all three know the replica and each other).
    ///
    /// Errors: `redis-server` missing, or a server not answering within 15 s.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut set = RedisSentinels {
            dir: dir.to_path_buf(),
            data: Vec::new(),
            sentinels: Vec::new(),
        };
        let primary = free_port()?;
        set.start_data(primary, None).await?;
        set.start_data(free_port()?, Some(primary)).await?;
        wait_until(Duration::from_secs(15), "replica in sync", || async {
            info(set.data[1].0, "replication")
                .await
                .is_some_and(|i| i.contains("master_link_status:up"))
        })
        .await?;
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
                    info(port, "sentinel")
                        .await
                        .is_some_and(|i| i.contains("slaves=1,sentinels=3"))
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

/// The primary's port as the Sentinel on `port` names it; `None` when it does not answer.
async fn named_primary(port: u16) -> Option<u16> {
    let mut conn = connection(port).await.ok()?;
    let addr: redis::RedisResult<(String, u16)> = redis::cmd("SENTINEL")
        .arg("get-master-addr-by-name")
        .arg(PRIMARY_NAME)
        .query_async(&mut conn)
        .await;
    addr.ok().map(|(_, port)| port)
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
