//! A private `redis-server` for one run: free loopback port, its own data
//! directory, AOF on with `appendfsync always` (the durability the services
//! are designed for), RDB snapshots off. Never port 6379.
//!
//! By default it is open (no password, protected mode off), as most tests
//! want. [`RedisSecurity`] asks for the deploy's security instead: the ACL of
//! `deploy/base/redis/users.acl` rendered by `deploy/base/redis/render-acl.sh`
//! (random passwords, one file per user; see [`RedisAcl`]) and protected mode
//! on, and/or TLS only (`rediss://`, certificates from
//! [`crate::realkube::pki`]).

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use common::handoff::redis_store::{RedisAuthArgs, RedisConfig};

use super::process::{free_port, ManagedProcess};
use super::wait::wait_until;

/// What a [`RedisServer`] requires of its clients.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RedisSecurity {
    /// Load the deploy's ACL (default user off; one user per service plus
    /// `operator`) and turn protected mode on.
    pub acl: bool,
    /// Serve TLS only (`--port 0 --tls-port`), with a server certificate for
    /// `127.0.0.1` from a fresh CA.
    pub tls: bool,
}

/// The deploy ACL as a harness Redis runs it.
#[derive(Debug, Clone)]
pub struct RedisAcl {
    /// The ACL file redis-server loads (`--aclfile`).
    pub file: PathBuf,
    /// One password file per user (`<dir>/<user>`), as the services mount them.
    pub password_dir: PathBuf,
    /// Rules of the deploy ACL this redis-server does not know (commands newer
    /// than it, e.g. `+waitaof` and `+client|setinfo` on Redis 7.0), left out
    /// so the file loads; every other rule is loaded exactly as rendered.
    /// Only top-level `+<command>` tokens are probed; a selector's tokens
    /// (`(+hset … ~key)`, commands first) are kept as they are.
    pub dropped_rules: Vec<String>,
}

/// TLS files of a harness Redis (see [`crate::realkube::pki::Pki`]).
#[derive(Debug, Clone)]
pub struct RedisTls {
    /// CA that signed the server certificate: the clients' `--redis-ca-file`.
    pub ca_file: PathBuf,
    /// Server certificate (`127.0.0.1`, `localhost`).
    pub cert_file: PathBuf,
    /// Its key.
    pub key_file: PathBuf,
}

/// Repository root (the parent of the `tests` crate).
fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate has a parent")
        .to_path_buf()
}

/// The deploy's ACL template, `deploy/base/redis/users.acl`.
pub fn deploy_acl_template() -> PathBuf {
    repo_root().join("deploy/base/redis/users.acl")
}

/// Users the deploy ACL defines a password for (all but `default`), read from
/// the template's `user <name> on ${PASSWORDS}` lines.
///
/// Errors: the template cannot be read.
pub fn deploy_acl_users() -> anyhow::Result<Vec<String>> {
    let text = std::fs::read_to_string(deploy_acl_template())?;
    Ok(text
        .lines()
        .filter(|l| l.starts_with("user ") && l.contains("${PASSWORDS}"))
        .filter_map(|l| l.split_whitespace().nth(1).map(str::to_string))
        .collect())
}

/// Render the deploy ACL for `provisioner_name` with the deploy's own script
/// into `out`, taking passwords from `password_dir`.
///
/// Errors: the script fails (missing password, bad name) or `sh` is missing.
pub fn render_deploy_acl(
    password_dir: &Path,
    provisioner_name: &str,
    out: &Path,
) -> anyhow::Result<()> {
    let output = std::process::Command::new("sh")
        .arg(repo_root().join("deploy/base/redis/render-acl.sh"))
        .arg(deploy_acl_template())
        .arg(password_dir)
        .arg(out)
        .env("PROVISIONER_NAME", provisioner_name)
        .output()
        .context("running deploy/base/redis/render-acl.sh")?;
    anyhow::ensure!(
        output.status.success(),
        "render-acl.sh failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    Ok(())
}

/// A `redis-server` child process and its data directory.
pub struct RedisServer {
    port: u16,
    dir: PathBuf,
    log: PathBuf,
    process: Option<ManagedProcess>,
    restarts: u32,
    acl: Option<RedisAcl>,
    tls: Option<RedisTls>,
}

impl RedisServer {
    /// Start `redis-server` (from `PATH`) on a free port with data under `dir`
    /// and log to `log`; waits (up to 10 s) until it answers `PING`. Open: no
    /// password, protected mode off.
    ///
    /// Errors: `redis-server` missing or not answering in time.
    pub async fn start(dir: &Path, log: &Path) -> anyhow::Result<Self> {
        Self::start_secured(dir, log, RedisSecurity::default(), "example.com/hostpath").await
    }

    /// [`start`](Self::start) with `security`; the ACL's key patterns are
    /// those of `provisioner_name`. With an ACL the harness itself connects
    /// as `operator` (read-only), so [`dbsize`](Self::dbsize) is refused.
    ///
    /// Errors: as [`start`](Self::start); rendering or loading the ACL fails;
    /// certificates cannot be made.
    pub async fn start_secured(
        dir: &Path,
        log: &Path,
        security: RedisSecurity,
        provisioner_name: &str,
    ) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir)?;
        let tls = if security.tls {
            let pki = crate::realkube::pki::generate(&dir.join("tls"))?;
            Some(RedisTls {
                ca_file: pki.ca_cert,
                cert_file: pki.serving_cert,
                key_file: pki.serving_key,
            })
        } else {
            None
        };
        let mut s = Self {
            port: free_port()?,
            dir: dir.to_path_buf(),
            log: log.to_path_buf(),
            process: None,
            restarts: 0,
            acl: None,
            tls,
        };
        if !security.acl {
            s.spawn().await?;
            return Ok(s);
        }
        // Render the deploy ACL, start on a bootstrap file (default user open),
        // leave out the rules this server does not know, then ACL LOAD the
        // result: from then on only the deploy's users exist.
        let password_dir = dir.join("redis-users");
        std::fs::create_dir_all(&password_dir)?;
        for user in deploy_acl_users()? {
            std::fs::write(
                password_dir.join(&user),
                format!("{}\n", uuid::Uuid::new_v4().simple()),
            )?;
        }
        let rendered = dir.join("users.acl.rendered");
        render_deploy_acl(&password_dir, provisioner_name, &rendered)?;
        let file = dir.join("users.acl");
        std::fs::write(&file, "user default on nopass ~* &* +@all\n")?;
        s.acl = Some(RedisAcl {
            file: file.clone(),
            password_dir,
            dropped_rules: Vec::new(),
        });
        s.spawn_with(false).await?;
        let mut conn = common::handoff::redis_store::connect(s.config_as(None)).await?;
        let text = std::fs::read_to_string(&rendered)?;
        let mut dropped = Vec::new();
        let mut kept_lines = Vec::new();
        for line in text.lines() {
            let mut kept = Vec::new();
            for rule in line.split(' ') {
                if rule.starts_with('+') && !rule.starts_with("+@") {
                    let probe: redis::RedisResult<()> = redis::cmd("ACL")
                        .arg("SETUSER")
                        .arg("harness-acl-probe")
                        .arg(rule)
                        .query_async(&mut conn)
                        .await;
                    if let Err(e) = probe {
                        anyhow::ensure!(
                            e.to_string().contains("Unknown command"),
                            "ACL rule {rule}: {e}"
                        );
                        if !dropped.contains(&rule.to_string()) {
                            dropped.push(rule.to_string());
                        }
                        continue;
                    }
                }
                kept.push(rule);
            }
            kept_lines.push(kept.join(" "));
        }
        std::fs::write(&file, kept_lines.join("\n") + "\n")?;
        redis::cmd("ACL")
            .arg("LOAD")
            .query_async::<()>(&mut conn)
            .await
            .context("ACL LOAD of the rendered deploy ACL")?;
        if let Some(acl) = &mut s.acl {
            acl.dropped_rules = dropped;
        }
        let admin = s.admin_config();
        wait_until(
            Duration::from_secs(10),
            "redis-server answers PING as operator",
            || {
                let admin = admin.clone();
                async move { ping(&admin).await }
            },
        )
        .await?;
        Ok(s)
    }

    /// The ACL in force, when started with [`RedisSecurity::acl`].
    pub fn acl(&self) -> Option<&RedisAcl> {
        self.acl.as_ref()
    }

    /// The TLS files, when started with [`RedisSecurity::tls`].
    pub fn tls(&self) -> Option<&RedisTls> {
        self.tls.as_ref()
    }

    /// The password file of ACL user `user` (`None` without an ACL).
    pub fn password_file(&self, user: &str) -> Option<PathBuf> {
        self.acl.as_ref().map(|a| a.password_dir.join(user))
    }

    /// The connection a client authenticating as `user` uses: URL, user and
    /// password file (with an ACL), CA file (with TLS).
    pub fn config_as(&self, user: Option<&str>) -> RedisConfig {
        RedisConfig {
            url: self.url(),
            auth: RedisAuthArgs {
                redis_username: user.filter(|_| self.acl.is_some()).map(str::to_string),
                redis_password_file: user.and_then(|u| self.password_file(u)),
                redis_ca_file: self.tls.as_ref().map(|t| t.ca_file.clone()),
                ..Default::default()
            },
            ..Default::default()
        }
    }

    /// The harness's own connection: `operator` with an ACL, else anonymous.
    pub fn admin_config(&self) -> RedisConfig {
        self.config_as(self.acl.as_ref().map(|_| "operator"))
    }

    async fn spawn(&mut self) -> anyhow::Result<()> {
        self.spawn_with(true).await
    }

    async fn spawn_with(&mut self, wait_as_admin: bool) -> anyhow::Result<()> {
        let port = self.port.to_string();
        let mut args: Vec<String> = [
            "--bind",
            "127.0.0.1",
            "--dir",
            &self.dir.display().to_string(),
            "--appendonly",
            "yes",
            "--appendfsync",
            "always",
            "--save",
            "",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        match &self.tls {
            Some(tls) => args.extend([
                "--port".into(),
                "0".into(),
                "--tls-port".into(),
                port,
                "--tls-cert-file".into(),
                tls.cert_file.display().to_string(),
                "--tls-key-file".into(),
                tls.key_file.display().to_string(),
                "--tls-ca-cert-file".into(),
                tls.ca_file.display().to_string(),
                "--tls-auth-clients".into(),
                "no".into(),
            ]),
            None => args.extend(["--port".into(), port]),
        }
        match &self.acl {
            Some(acl) => args.extend([
                "--aclfile".into(),
                acl.file.display().to_string(),
                "--protected-mode".into(),
                "yes".into(),
            ]),
            None => args.extend(["--protected-mode".into(), "no".into()]),
        }
        let program = which("redis-server")
            .context("redis-server not found on PATH (apt-get install redis-server)")?;
        self.process = Some(ManagedProcess::spawn(
            "redis-server",
            &program,
            &args,
            &[],
            &self.log,
        )?);
        let config = if wait_as_admin {
            self.admin_config()
        } else {
            self.config_as(None)
        };
        wait_until(Duration::from_secs(10), "redis-server answers PING", || {
            let config = config.clone();
            async move { ping(&config).await }
        })
        .await
    }

    /// `redis://127.0.0.1:<port>/0`, or `rediss://…` with TLS.
    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/0", self.port)
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
        let client = self.admin_config().client()?;
        let mut conn = client.get_multiplexed_async_connection().await?;
        Ok(redis::cmd("DBSIZE").query_async(&mut conn).await?)
    }
}

async fn ping(config: &RedisConfig) -> bool {
    let Ok(client) = config.client() else {
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
