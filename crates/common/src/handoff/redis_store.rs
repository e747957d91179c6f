//! The Redis connection shared by the queue and the intents: the `--redis-*` flags
//! (ACL user, password, TLS) turned into a client that [`connect`] checks with
//! `PING`, and the per-provisioner [`key_prefix`]. Passwords never reach logs
//! ([`redact_url`]). Details: docs/decisions/0004-redis-connection-signing-intents.md.

use std::path::{Path, PathBuf};

use clap::Args;
use redis::aio::ConnectionManager;
use redis::sentinel::SentinelClientBuilder;
use redis::IntoConnectionInfo;

use super::redis_conn::{manager_config, parse_sentinel_url, Endpoint, RedisConn};

/// Key prefix of everything stored for `provisioner_name`, e.g.
/// `provisioner:{example.com/hostpath}:`.
pub fn key_prefix(provisioner_name: &str) -> String {
    format!("provisioner:{{{provisioner_name}}}:")
}

/// `url` with any password replaced by `***`, for errors and logs, e.g.
/// `redis://user:***@host:6379/0`. A URL without a password is returned as is.
pub fn redact_url(url: &str) -> String {
    // The password sits between the userinfo's first ':' and the last '@'.
    let password = url.find("://").and_then(|scheme| {
        let at = url.rfind('@').filter(|&at| at > scheme)?;
        let colon = url[scheme + 3..at].find(':')?;
        Some((scheme + 3 + colon, at))
    });
    match password {
        Some((colon, at)) => format!("{}:***{}", &url[..colon], &url[at..]),
        None => url.to_string(),
    }
}

/// Authentication and TLS flags of the Redis connection, flattened into
/// the runtime's common flags next to `--redis-url` (see the module docs).
#[derive(Debug, Clone, Default, PartialEq, Eq, Args)]
pub struct RedisAuthArgs {
    /// Redis ACL user to authenticate as (`AUTH <user> <password>`). Default:
    /// the URL's user, else Redis' `default` user.
    #[arg(long, env)]
    pub redis_username: Option<String>,

    /// File whose first line is the Redis password (e.g. a key of a mounted
    /// Secret); read at every connection attempt. Env `REDIS_PASSWORD` (the
    /// password itself) is accepted instead; never pass it as a flag.
    #[arg(long, env)]
    pub redis_password_file: Option<PathBuf>,

    /// PEM bundle of the CA(s) that sign the Redis server certificate; only
    /// these are trusted. Needs a `rediss://` URL. Default: the system roots.
    #[arg(long, env)]
    pub redis_ca_file: Option<PathBuf>,

    /// PEM client certificate (chain) for mutual TLS; needs
    /// `--redis-client-key-file` and a `rediss://` URL.
    #[arg(long, env, requires = "redis_client_key_file")]
    pub redis_client_cert_file: Option<PathBuf>,

    /// PEM private key of `--redis-client-cert-file`.
    #[arg(long, env, requires = "redis_client_cert_file")]
    pub redis_client_key_file: Option<PathBuf>,

    /// File whose first line is the Sentinels' password (`requirepass` of a
    /// `redis+sentinel://` URL's Sentinels). Default: Sentinels without a password.
    #[arg(long, env)]
    pub redis_sentinel_password_file: Option<PathBuf>,
}

/// A password kept out of `Debug` output and logs.
#[derive(Clone, PartialEq, Eq)]
pub struct Password(String);

impl Password {
    /// Wrap a password.
    pub fn new(password: impl Into<String>) -> Self {
        Password(password.into())
    }
}

impl std::fmt::Debug for Password {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("<redacted>")
    }
}

/// How to open a Redis connection: URL (one server, or `redis+sentinel://` Sentinels naming
/// the primary), credentials, TLS files; from the flags ([`RedisConfig::from_args`]) or a
/// bare URL (`"redis://…".into()`). `Debug` hides the password.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RedisConfig {
    /// `redis://[user[:password]@]host:port[/db]`, `rediss://…` for TLS, or
    /// `redis+sentinel://HOST[:PORT],…/PRIMARY_NAME[/DB]`.
    pub url: String,
    /// ACL user (conflicts with a different URL user), password, TLS and Sentinel files.
    pub auth: RedisAuthArgs,
    /// The password itself (env `REDIS_PASSWORD`).
    pub password: Option<Password>,
}

impl<S: AsRef<str>> From<S> for RedisConfig {
    fn from(url: S) -> Self {
        RedisConfig {
            url: url.as_ref().to_string(),
            ..Default::default()
        }
    }
}

impl From<&RedisConfig> for RedisConfig {
    fn from(config: &RedisConfig) -> Self {
        config.clone()
    }
}

/// Why a Redis connection could not be made. Every variant names the cause
/// and what to check; none contains a password.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    /// The flags, URL or a credential/certificate file are unusable.
    #[error("Redis connection to {url} misconfigured: {detail}")]
    Config {
        /// The URL, redacted.
        url: String,
        /// What is wrong.
        detail: String,
    },
    /// Redis refused the credentials or the `PING` (`code`).
    #[error("Redis at {url} refused authentication as user {user:?} ({code}): check --redis-username and --redis-password-file (and the server's ACL): {source}")]
    Auth {
        /// The URL, redacted.
        url: String,
        /// The user the client authenticated as (`default` without one).
        user: String,
        /// `WRONGPASS` (unknown user or wrong password), `NOAUTH` (no
        /// credentials given), or `NOPERM` (the user may not run `PING`).
        code: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
    /// The TLS handshake failed (typically an untrusted server certificate).
    #[error("TLS with Redis at {url} failed (server certificate not trusted by --redis-ca-file, wrong host name, or a non-TLS port): {source}")]
    Tls {
        /// The URL, redacted.
        url: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
    /// Redis could not be reached or did not answer.
    #[error("cannot connect to Redis at {url}: {source}")]
    Unreachable {
        /// The URL, redacted.
        url: String,
        /// The client error.
        #[source]
        source: redis::RedisError,
    },
}

impl RedisConfig {
    /// The connection the flags describe: `url` plus `auth`, and the password
    /// from env `REDIS_PASSWORD` when set (read here, once).
    pub fn from_args(url: &str, auth: &RedisAuthArgs) -> Self {
        let mut auth = auth.clone();
        auth.redis_username = auth.redis_username.filter(|u| !u.is_empty());
        RedisConfig {
            url: url.to_string(),
            auth,
            password: std::env::var("REDIS_PASSWORD")
                .ok()
                .filter(|p| !p.is_empty())
                .map(Password::new),
        }
    }

    fn config_error(&self, detail: impl std::fmt::Display) -> ConnectError {
        ConnectError::Config {
            url: redact_url(&self.url),
            detail: detail.to_string(),
        }
    }

    /// The first line of the password file `path` given by `flag`, without its line ending.
    fn read_password_file(&self, flag: &str, path: &Path) -> Result<String, ConnectError> {
        let file = path.display();
        let text = std::fs::read_to_string(path)
            .map_err(|e| self.config_error(format!("reading {flag} {file}: {e}")))?;
        let first = text.lines().next().filter(|line| !line.is_empty());
        let empty = || self.config_error(format!("{flag} {file} is empty"));
        first.map(str::to_string).ok_or_else(empty)
    }

    /// The password from `--redis-password-file` or `REDIS_PASSWORD` (read now).
    fn password(&self) -> Result<Option<String>, ConnectError> {
        let both = "both --redis-password-file and REDIS_PASSWORD are set; use one";
        match (&self.auth.redis_password_file, &self.password) {
            (Some(_), Some(_)) => Err(self.config_error(both)),
            (Some(file), None) => self
                .read_password_file("--redis-password-file", file)
                .map(Some),
            (None, Some(p)) => Ok(Some(p.0.clone())),
            (None, None) => Ok(None),
        }
    }

    /// The CA and client certificate files read, `None` without any; `tls_url`
    /// says whether the URL asks for TLS (the files need it).
    fn tls_files(&self, tls_url: bool) -> Result<Option<redis::TlsCertificates>, ConnectError> {
        let auth = &self.auth;
        if auth.redis_ca_file.is_none() && auth.redis_client_cert_file.is_none() {
            return Ok(None);
        }
        if !tls_url {
            return Err(
                self.config_error("--redis-ca-file/--redis-client-cert-file need a rediss:// URL")
            );
        }
        let read = |what: &str, path: &Path| {
            std::fs::read(path)
                .map_err(|e| self.config_error(format!("reading {what} {}: {e}", path.display())))
        };
        let root_cert = auth.redis_ca_file.as_deref().map(|p| read("CA file", p));
        let root_cert = root_cert.transpose()?;
        let client_tls = match (&auth.redis_client_cert_file, &auth.redis_client_key_file) {
            (Some(cert), Some(key)) => Some(redis::ClientTlsConfig {
                client_cert: read("client certificate", cert)?,
                client_key: read("client key", key)?,
            }),
            (None, None) => None,
            _ => {
                return Err(self.config_error(
                    "--redis-client-cert-file and --redis-client-key-file go together",
                ))
            }
        };
        Ok(Some(redis::TlsCertificates {
            client_tls,
            root_cert,
        }))
    }

    /// Where the primary is: one server, or the Sentinels of a `redis+sentinel://`
    /// URL (same user, password and TLS files for the primary). Errors: as [`Self::client`].
    pub fn endpoint(&self) -> Result<Endpoint, ConnectError> {
        let Some(url) = parse_sentinel_url(&self.url).map_err(|e| self.config_error(e))? else {
            return Ok(Endpoint::Fixed(Box::new(self.client()?)));
        };
        let tls_mode = url.tls.then_some(redis::TlsMode::Secure);
        let addrs = url.sentinels.iter().map(|(host, port)| match tls_mode {
            Some(_) => redis::ConnectionAddr::TcpTls {
                host: host.clone(),
                port: *port,
                insecure: false,
                tls_params: None,
            },
            None => redis::ConnectionAddr::Tcp(host.clone(), *port),
        });
        let mut builder = SentinelClientBuilder::new(
            addrs,
            &url.primary_name,
            redis::sentinel::SentinelServerType::Master,
        )
        .map_err(|e| self.config_error(e))?
        .set_client_to_redis_db(url.db);
        if let Some(user) = &self.auth.redis_username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = self.password()? {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(file) = &self.auth.redis_sentinel_password_file {
            let flag = "--redis-sentinel-password-file";
            builder = builder.set_client_to_sentinel_password(self.read_password_file(flag, file)?);
        }
        if let Some(mode) = tls_mode {
            builder = builder
                .set_client_to_redis_tls_mode(mode)
                .set_client_to_sentinel_tls_mode(mode);
        }
        if let Some(certs) = self.tls_files(url.tls)? {
            builder = builder
                .set_client_to_redis_certificates(certs.clone())
                .set_client_to_sentinel_certificates(certs);
        }
        let client = builder.build().map_err(|e| self.config_error(e))?;
        Ok(Endpoint::Sentinel(std::sync::Arc::new(
            tokio::sync::Mutex::new(client),
        )))
    }

    /// A redis-rs client for one server (the password file is read now). Errors:
    /// [`ConnectError::Config`]: bad URL, two password sources, conflicting users,
    /// unreadable or empty files, TLS files without `rediss://`, bad PEM.
    pub fn client(&self) -> Result<redis::Client, ConnectError> {
        let info = self.url.as_str().into_connection_info();
        let info = info.map_err(|e| self.config_error(format!("invalid Redis URL: {e}")))?;
        let mut settings = info.redis_settings().clone();
        if let Some(user) = &self.auth.redis_username {
            match settings.username() {
                Some(url_user) if url_user != user => {
                    return Err(self.config_error(format!(
                        "--redis-username {user:?} differs from the URL's user {url_user:?}"
                    )))
                }
                _ => settings = settings.set_username(user),
            }
        }
        if let Some(password) = self.password()? {
            if settings.password().is_some() {
                return Err(self.config_error(
                    "the URL carries a password and --redis-password-file/REDIS_PASSWORD gives another; use one",
                ));
            }
            settings = settings.set_password(password);
        }
        let tls_url = matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let info = info.set_redis_settings(settings);
        match self.tls_files(tls_url)? {
            None => redis::Client::open(info).map_err(|e| self.config_error(e)),
            Some(certs) => redis::Client::build_with_tls(info, certs)
                .map_err(|e| self.config_error(format!("TLS files: {e}"))),
        }
    }

    /// Map a failed connection attempt or first command to the cause.
    pub fn classify(&self, err: redis::RedisError) -> ConnectError {
        let url = redact_url(&self.url);
        // redis-rs reports a refused `AUTH` at connect as AuthenticationFailed
        // without the server's code; Redis >= 6 answers it with WRONGPASS.
        let code = err.code().map(str::to_string).or_else(|| {
            (err.kind() == redis::ErrorKind::AuthenticationFailed).then(|| "WRONGPASS".to_string())
        });
        if let Some(code) = code.filter(|c| matches!(c.as_str(), "WRONGPASS" | "NOAUTH" | "NOPERM"))
        {
            // The user this configuration authenticates as (`default` without one).
            let info = self.url.as_str().into_connection_info().ok();
            let url_user = info.and_then(|i| i.redis_settings().username().map(str::to_string));
            let user = self.auth.redis_username.clone().or(url_user);
            let user = user.unwrap_or_else(|| "default".into());
            return ConnectError::Auth {
                url,
                user,
                code,
                source: err,
            };
        }
        let text = format!("{err} {err:?}").to_ascii_lowercase();
        if ["certificate", "tls", "handshake", "unknownissuer"]
            .iter()
            .any(|w| text.contains(w))
        {
            return ConnectError::Tls { url, source: err };
        }
        ConnectError::Unreachable { url, source: err }
    }
}

/// A reconnecting connection to the primary of `config`, checked with `PING`;
/// commands fail fast while Redis is down. Errors: [`ConnectError`] naming the
/// cause (configuration, credentials, TLS, unreachable).
pub async fn connect(config: impl Into<RedisConfig>) -> Result<RedisConn, ConnectError> {
    let config = config.into();
    let endpoint = config.endpoint()?;
    let client = endpoint.primary().await.map_err(|e| config.classify(e))?;
    let mut conn = ConnectionManager::new_with_config(client.clone(), manager_config())
        .await
        .map_err(|e| config.classify(e))?;
    // Authentication errors surface on the first command, not at connect.
    redis::cmd("PING")
        .query_async::<()>(&mut conn)
        .await
        .map_err(|e| config.classify(e))?;
    Ok(RedisConn::new(conn, client, endpoint))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_is_a_cluster_hash_tag_per_provisioner() {
        assert_eq!(
            super::key_prefix("example.com/hostpath"),
            "provisioner:{example.com/hostpath}:"
        );
    }

    #[test]
    fn redaction_hides_only_the_password() {
        assert_eq!(
            redact_url("rediss://pv-writer:s3cret@redis:6380/0"),
            "rediss://pv-writer:***@redis:6380/0"
        );
        assert_eq!(
            redact_url("redis://:s3cret@redis:6379"),
            "redis://:***@redis:6379"
        );
        assert_eq!(redact_url("redis://redis:6379/0"), "redis://redis:6379/0");
    }

    #[test]
    fn debug_output_never_shows_the_password() {
        let config = RedisConfig {
            password: Some(Password::new("s3cret")),
            ..RedisConfig::from("redis://u:urlpass@h:1/0")
        };
        let shown = format!("{config:?}");
        assert!(!shown.contains("s3cret"), "{shown}");
        assert!(redact_url(&config.url).ends_with("u:***@h:1/0"));
    }

    /// `url`'s config changed by `set`.
    fn config(url: &str, set: impl FnOnce(&mut RedisConfig)) -> RedisConfig {
        let mut config = RedisConfig::from(url);
        set(&mut config);
        config
    }

    /// The error building a client of `url`'s config changed by `set`.
    fn refusal(url: &str, set: impl FnOnce(&mut RedisConfig)) -> String {
        config(url, set).client().unwrap_err().to_string()
    }

    #[test]
    fn password_comes_from_the_first_line_of_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "p4ss\n").unwrap();
        let config = config("redis://127.0.0.1:1/0", |c| {
            c.auth.redis_username = Some("pv-writer".into());
            c.auth.redis_password_file = Some(file.clone());
        });
        let client = config.client().unwrap();
        let settings = client.get_connection_info().redis_settings();
        assert_eq!(settings.username(), Some("pv-writer"));
        assert_eq!(settings.password(), Some("p4ss"));

        std::fs::write(&file, "\n").unwrap();
        let err = config.client().unwrap_err().to_string();
        assert!(err.contains("is empty"), "{err}");
        let absent = dir.path().join("absent");
        let err = refusal("redis://127.0.0.1:1/0", |c| {
            c.auth.redis_password_file = Some(absent)
        });
        assert!(err.contains("reading --redis-password-file"), "{err}");
    }

    #[test]
    fn a_sentinel_password_file_error_names_its_own_flag() {
        let dir = tempfile::tempdir().unwrap();
        let absent = dir.path().join("absent");
        let config = config("redis+sentinel://127.0.0.1:1/primary", |c| {
            c.auth.redis_sentinel_password_file = Some(absent)
        });
        let err = config.endpoint().err().expect("refused").to_string();
        assert!(
            err.contains("reading --redis-sentinel-password-file"),
            "{err}"
        );
    }

    #[test]
    fn conflicting_sources_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("pw");
        std::fs::write(&file, "a").unwrap();
        refusal("redis://127.0.0.1:1/0", |c| {
            c.auth.redis_password_file = Some(file.clone());
            c.password = Some(Password::new("b"));
        });
        let err = refusal("redis://u:c@127.0.0.1:1/0", |c| {
            c.auth.redis_password_file = Some(file)
        });
        assert!(err.contains("use one") && !err.contains(":c@"), "{err}");
        refusal("redis://y@127.0.0.1:1/0", |c| {
            c.auth.redis_username = Some("x".into())
        });
    }

    #[test]
    fn tls_files_need_a_rediss_url_and_valid_pem() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        std::fs::write(&ca, "not a certificate").unwrap();
        let err = refusal("redis://127.0.0.1:1/0", |c| {
            c.auth.redis_ca_file = Some(ca.clone())
        });
        assert!(err.contains("rediss://"), "{err}");
        let absent = dir.path().join("absent.pem");
        let err = refusal("rediss://127.0.0.1:1/0", |c| {
            c.auth.redis_ca_file = Some(absent)
        });
        assert!(err.contains("CA file"), "{err}");
        refusal("rediss://127.0.0.1:1/0", |c| {
            c.auth.redis_client_cert_file = Some(ca)
        });
    }
}
