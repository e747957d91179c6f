//! A private `redis-server` for one run: free loopback port, its own data
//! directory, AOF on with `appendfsync everysec` (the durability the services
//! are designed for), RDB snapshots off. Never port 6379.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;

use super::process::{free_port, ManagedProcess};
use super::wait::wait_until;

/// A `redis-server` child process and its data directory.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    log: PathBuf,
    process: Option<ManagedProcess>,
    restarts: u32,
}

impl RedisServer {
    /// Start `redis-server` (from `PATH`) on a free port with data under `dir`
    /// and log to `log`; waits (up to 10 s) until it answers `PING`.
    ///
    /// Errors: `redis-server` missing or not answering in time.
    pub async fn start(dir: &Path, log: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let mut s = Self {
            port: free_port()?,
            dir: dir.to_path_buf(),
            log: log.to_path_buf(),
            process: None,
            restarts: 0,
        };
        s.spawn().await?;
        Ok(s)
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        let args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--dir",
            &self.dir.display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "everysec",
            "--save",
            "",
            "--protected-mode",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let program = which("redis-server")
            .context("redis-server not found on PATH (apt-get install redis-server)")?;
        self.process = Some(ManagedProcess::spawn(
            "redis-server",
            &program,
            &args,
            &[],
            &self.log,
        )?);
        let url = self.url();
        wait_until(Duration::from_secs(10), "redis-server answers PING", || {
            let url = url.clone();
            async move { ping(&url).await }
        })
        .await
    }

    /// `redis://127.0.0.1:<port>/0`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// The port it listens on (kept across restarts).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// How many times [`RedisServer::restart`] ran.
    pub fn restarts(&self) -> u32 {
        self.restarts
    }

    /// The running process, if any.
    pub fn process_mut(&mut self) -> Option<&mut ManagedProcess> {
        self.process.as_mut()
    }

    /// Stop Redis: SIGKILL when `crash` (data since the last AOF fsync, at most
    /// about one second, may be lost, as in a node failure), else SIGTERM (Redis
    /// flushes the AOF and exits).
    pub fn stop(&mut self, crash: bool) {
        if let Some(mut p) = self.process.take() {
            if crash {
                p.kill();
            } else {
                p.terminate(Duration::from_secs(10));
            }
        }
    }

    /// Stop (see [`RedisServer::stop`]) and start again on the same port and
    /// data directory, so the AOF is replayed.
    ///
    /// Errors: the new process does not answer `PING` within 10 s.
    pub async fn restart(&mut self, crash: bool) -> anyhow::Result<()> {
        self.stop(crash);
        self.restarts += 1;
        self.spawn().await
    }

    /// Number of keys in database 0 (`DBSIZE`).
    ///
    /// Errors: Redis unreachable.
    pub async fn dbsize(&self) -> anyhow::Result<u64> {
        let client = redis::Client::open(self.url())?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        Ok(redis::cmd("DBSIZE").query_async(&mut conn).await?)
    }
}

async fn ping(url: &str) -> bool {
    let Ok(client) = redis::Client::open(url) else {
        return false;
    };
    let Ok(Ok(mut conn)) = tokio::time::timeout(
        Duration::from_secs(1),
        client.get_multiplexed_async_connection(),
    )
    .await
    else {
        return false;
    };
    redis::cmd("PING")
        .query_async::<String>(&mut conn)
        .await
        .is_ok()
}

/// First `name` found in the directories of `PATH`.
pub fn which(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
