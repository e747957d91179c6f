//! Command-line flags shared by every service, each with an environment twin
//! (`--kube-api-qps` ⇔ `KUBE_API_QPS`), flattened into each service's parser.
//! Names follow kubernetes-csi/external-provisioner where it has the flag.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

use crate::kube::retry::WORK;

/// Parse a human duration such as `15s`, `2m`, `1h30m` or `500ms`.
/// Errors: a message naming the bad input, for clap to print.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Parse `--http-endpoint`: `host:port` with an IP host (IPv6 in brackets), or
/// `:port` for all IPv4 interfaces. Errors: a message naming the bad input.
pub fn parse_http_endpoint(s: &str) -> Result<SocketAddr, String> {
    let bad = |e: &dyn std::fmt::Display| {
        format!("invalid HTTP endpoint {s:?} (want HOST:PORT or :PORT): {e}")
    };
    match s.strip_prefix(':') {
        Some(port) => port
            .parse::<u16>()
            .map(|p| SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), p))
            .map_err(|e| bad(&e)),
        None => s.parse::<SocketAddr>().map_err(|e| bad(&e)),
    }
}

/// Check a Redis URL as redis-rs reads it: `redis://`, `rediss://`, `redis+unix://`,
/// `unix://` (or `valkey` twins), host and numeric port; or a `redis+sentinel://`
/// URL. Errors: what is wrong.
pub fn check_redis_url(url: &str) -> Result<(), String> {
    use redis::IntoConnectionInfo as _;
    let shown = crate::handoff::redis_store::redact_url(url);
    let sentinel = crate::handoff::redis_conn::parse_sentinel_url(url)
        .map_err(|e| format!("{shown:?} is not a valid Sentinel URL: {e}"))?;
    if sentinel.is_some() {
        return Ok(());
    }
    let scheme = url.split_once("://").map(|(scheme, _)| scheme);
    let known = [
        "redis",
        "rediss",
        "redis+unix",
        "unix",
        "valkey",
        "valkeys",
        "valkey+unix",
    ];
    if !scheme.is_some_and(|s| known.contains(&s)) {
        return Err(format!(
            "{shown:?} is not a Redis URL: want redis://HOST:PORT/DB, rediss://HOST:PORT/DB (TLS), redis+sentinel://HOST:PORT,…/PRIMARY_NAME[/DB] or redis+unix:///PATH"
        ));
    }
    // redis-rs' own message ("Redis URL did not parse") adds nothing.
    url.into_connection_info().map(|_| ()).map_err(|_| {
        format!("{shown:?} is not a valid Redis URL: check the host, the port (a number up to 65535) and the database number")
    })
}

/// clap parser of `--redis-url` ([`check_redis_url`]). Unlike a plain
/// function parser, its error does not echo the raw value, which may carry a
/// password.
#[derive(Clone, Debug)]
pub struct RedisUrlParser;

impl clap::builder::TypedValueParser for RedisUrlParser {
    type Value = String;

    fn parse_ref(
        &self,
        cmd: &clap::Command,
        arg: Option<&clap::Arg>,
        value: &std::ffi::OsStr,
    ) -> Result<String, clap::Error> {
        let flag = arg.map_or_else(|| "--redis-url".to_string(), ToString::to_string);
        let bad = |msg: String| {
            let msg = format!("invalid value for '{flag}': {msg}\n");
            clap::Error::raw(clap::error::ErrorKind::ValueValidation, msg).with_cmd(cmd)
        };
        let url = value.to_str().ok_or_else(|| bad("not UTF-8".to_string()))?;
        check_redis_url(url).map_err(bad)?;
        Ok(url.to_string())
    }
}

/// The `--resync-period` ticker: `None` for `0s` (off, as the seed), else an
/// interval whose first tick is one `period` from now and that delays missed ticks.
pub fn resync_interval(period: Duration) -> Option<tokio::time::Interval> {
    if period.is_zero() {
        return None;
    }
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Some(tick)
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// What a service passes to the runtime: its name, Lease, default port and defaults.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServiceSpec {
    /// Binary / component name, e.g. `provision-svc`; used as the event reporter.
    pub name: &'static str,
    /// Suffix of the service's Lease name (`<provisioner>-<suffix>`).
    pub lease_suffix: &'static str,
    /// Default HTTP port for `/metrics`, `/healthz`, `/readyz`.
    pub http_port: u16,
    /// Default `--worker-threads`.
    pub worker_threads: u32,
    /// Default `--retry-interval-start` / `--retry-interval-max`.
    pub retry_intervals: (Duration, Duration),
    /// One-line description in `--help`.
    pub about: &'static str,
}

impl ServiceSpec {
    /// A service with the seed's defaults: 4 workers (threadiness), retries 15s doubling to 1000s.
    pub const fn new(name: &'static str, lease_suffix: &'static str, http_port: u16) -> Self {
        ServiceSpec {
            name,
            lease_suffix,
            http_port,
            worker_threads: 4,
            retry_intervals: (Duration::from_secs(15), Duration::from_secs(1000)),
            about: "",
        }
    }

    /// This spec with the `--help` description `about`.
    pub const fn with_about(self, about: &'static str) -> Self {
        ServiceSpec { about, ..self }
    }

    /// This spec with `n` default workers.
    pub const fn with_workers(self, n: u32) -> Self {
        ServiceSpec {
            worker_threads: n,
            ..self
        }
    }

    /// This spec with default retry intervals `start` doubling to `max`.
    pub const fn with_retry(self, start: Duration, max: Duration) -> Self {
        ServiceSpec {
            retry_intervals: (start, max),
            ..self
        }
    }
}

/// A service's command line: the shared flags and the service's own `S` (its name and
/// description are its [`ServiceSpec`]'s, set by the binary).
#[derive(Debug, Clone, clap::Parser)]
#[command(version)]
pub struct ServiceCli<S: Args> {
    /// Flags shared by every service.
    #[command(flatten)]
    pub common: CommonArgs,
    /// The service's own flags.
    #[command(flatten)]
    pub service: S,
}

/// `--help` sections of the shared flags.
const KUBE: &str = "Kubernetes";
const REDIS: &str = "Redis";
const LEADER: &str = "Leader election";
const HTTP: &str = "HTTP";
const LOGS: &str = "Logging";

/// Flags naming the deployment: the provisioner, the API server, Redis, the Leases'
/// namespace. The services and `provisioner-ctl` take them.
#[derive(Debug, Clone, Args)]
pub struct ClusterArgs {
    /// Provisioner name: matched against StorageClass `provisioner` and written to
    /// `pv.kubernetes.io/provisioned-by`.
    #[arg(
        long,
        env,
        default_value = "example.com/hostpath",
        help_heading = KUBE
    )]
    pub provisioner_name: String,

    /// Path to a kubeconfig. Without it: `KUBECONFIG`/`~/.kube/config`, then the
    /// in-cluster service account.
    #[arg(long, env, help_heading = KUBE)]
    pub kubeconfig: Option<PathBuf>,

    /// Client-side limit on API requests per second (token bucket refill);
    /// 0 disables it. A backstop against a runaway loop, above what the
    /// control plane allows (BENCHMARKS.md); the API server's fairness binds first.
    #[arg(
        long,
        env,
        default_value_t = 1000.0,
        help_heading = KUBE
    )]
    pub kube_api_qps: f64,

    /// Client-side burst of API requests above `--kube-api-qps`. Ignored when the
    /// QPS limit is disabled.
    #[arg(
        long,
        env,
        default_value_t = 2000,
        help_heading = KUBE
    )]
    pub kube_api_burst: u32,

    /// Redis URL of the durable queue and provisioning intents, e.g.
    /// `redis://127.0.0.1:6379/0`, `rediss://user:pass@host:6380`, or
    /// `redis+sentinel://HOST:26379,…/PRIMARY_NAME/DB` (no credentials in it).
    #[arg(
        long,
        env,
        default_value = "redis://127.0.0.1:6379/0",
        value_parser = RedisUrlParser,
        help_heading = REDIS
    )]
    pub redis_url: String,

    /// Redis ACL user, password file and TLS files (`--redis-username`, ...;
    /// [`crate::handoff::redis_store`]), combined with `redis_url` by [`CommonArgs::redis`].
    #[command(flatten, next_help_heading = REDIS)]
    pub redis_auth: crate::handoff::redis_store::RedisAuthArgs,

    /// Namespace of the Lease. Default: `POD_NAMESPACE`, else the service
    /// account's namespace file, else `default`.
    #[arg(long, env, help_heading = LEADER)]
    pub leader_election_namespace: Option<String>,
}

/// Flags every service takes: [`ClusterArgs`] plus leader election timing, HTTP,
/// logging and shutdown.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// The deployment's names and connections.
    #[command(flatten)]
    pub cluster: ClusterArgs,

    /// Elect a leader through a `coordination.k8s.io/v1` Lease; only the leader
    /// works. Disable only when exactly one replica runs.
    #[arg(long, env, default_value_t = true, action = clap::ArgAction::Set, help_heading = LEADER)]
    pub leader_election: bool,

    /// This replica's identity in the Lease (`holderIdentity`). Default:
    /// `POD_NAME`, else the host name, plus a random suffix.
    #[arg(long, env, help_heading = LEADER)]
    pub leader_election_identity: Option<String>,

    /// How long a Lease is valid without renewal; a standby takes over after it.
    #[arg(
        long = "leader-election-lease-duration",
        env = "LEADER_ELECTION_LEASE_DURATION",
        default_value = "15s",
        value_parser = parse_duration,
        help_heading = LEADER
    )]
    pub lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(
        long = "leader-election-renew-deadline",
        env = "LEADER_ELECTION_RENEW_DEADLINE",
        default_value = "10s",
        value_parser = parse_duration,
        help_heading = LEADER
    )]
    pub renew_deadline: Duration,

    /// How often candidates try to acquire, and the leader to renew, the Lease
    /// (Redis reconnects wait `--redis-reconnect-period`).
    #[arg(
        long = "leader-election-retry-period",
        env = "LEADER_ELECTION_RETRY_PERIOD",
        default_value = "2s",
        value_parser = parse_duration,
        help_heading = LEADER
    )]
    pub retry_period: Duration,

    /// Wait between attempts to (re)connect to Redis, or to repeat a Redis call
    /// that failed for want of a connection.
    #[arg(long, env, default_value = "500ms", value_parser = parse_duration, help_heading = REDIS)]
    pub redis_reconnect_period: Duration,

    /// `HOST:PORT` (or `:PORT`) of the HTTP server (metrics, health), as
    /// external-provisioner's `--http-endpoint`. Default: `--http-address`:
    /// `--http-port` (9101 provision-svc, 9102 pv-writer, 9103 reclaim-svc); port 0 picks one.
    #[arg(
        long,
        env,
        value_parser = parse_http_endpoint,
        conflicts_with_all = ["http_address", "http_port"],
        help_heading = HTTP
    )]
    pub http_endpoint: Option<SocketAddr>,

    /// Address the HTTP server listens on when `--http-endpoint` is not given.
    #[arg(
        long,
        env,
        default_value = "0.0.0.0",
        help_heading = HTTP
    )]
    pub http_address: IpAddr,

    /// Port of the HTTP server when `--http-endpoint` is not given. Default:
    /// 9101 provision-svc, 9102 pv-writer, 9103 reclaim-svc. 0 picks a free
    /// port (logged).
    #[arg(long, env, help_heading = HTTP)]
    pub http_port: Option<u16>,

    /// First retry delay of a failed item (claim, queue entry, PV), doubling up to
    /// `--retry-interval-max`. Default: 15s provision-svc and reclaim-svc (the
    /// seed's), 1s pv-writer.
    #[arg(
        long = "retry-interval-start",
        env,
        value_parser = parse_duration,
        help_heading = WORK
    )]
    pub retry_interval_start: Option<Duration>,

    /// Cap of a failed work item's retry delay. Default: 1000s provision-svc
    /// and reclaim-svc (the seed's), 5m pv-writer.
    #[arg(
        long = "retry-interval-max",
        env,
        value_parser = parse_duration,
        help_heading = WORK
    )]
    pub retry_interval_max: Option<Duration>,

    /// Work items handled concurrently: claims (provision-svc, default 8), PV
    /// writes (pv-writer, default 16), PVs (reclaim-svc, default 4). 1–1024.
    #[arg(
        long = "worker-threads",
        env,
        value_parser = clap::value_parser!(u32).range(1..=1024),
        help_heading = WORK
    )]
    pub worker_threads: Option<u32>,

    /// Path of the Prometheus metrics endpoint.
    #[arg(
        long,
        env,
        default_value = "/metrics",
        help_heading = HTTP
    )]
    pub metrics_path: String,

    /// Log format.
    #[arg(long, env, value_enum, default_value_t = LogFormat::Text, help_heading = LOGS)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` EnvFilter syntax (e.g. `info`, `debug,kube=info`).
    #[arg(long, env, default_value = "info", help_heading = LOGS)]
    pub log_level: String,

    /// On SIGTERM/SIGINT, how long in-flight work may take to finish before it is
    /// abandoned and the Lease released. Keep below the pod's
    /// `terminationGracePeriodSeconds`.
    #[arg(long, env, default_value = "20s", value_parser = parse_duration, help_heading = WORK)]
    pub shutdown_grace_period: Duration,

    /// `/healthz` fails once the work loop made no progress for this long (keys
    /// waiting, no worker free; idle is healthy). Keep above the longest
    /// legitimate backend call (`--provision-timeout`).
    #[arg(long, env, default_value = "5m", value_parser = parse_duration, help_heading = HTTP)]
    pub healthz_stall_timeout: Duration,
}

pub use crate::kube::retry::RetryArgs;

/// `--additional-provisioner` of provision-svc and pv-writer (seed: a controller's
/// additional provisioner names).
#[derive(Debug, Clone, Default, Args)]
pub struct AdditionalProvisioners {
    /// Further provisioner names served besides `--provisioner-name`: provision-svc
    /// provisions their claims, pv-writer accepts their PVs (repeatable; comma-separated in
    /// the environment variable).
    #[arg(
        long = "additional-provisioner",
        env = "ADDITIONAL_PROVISIONERS",
        value_delimiter = ','
    )]
    pub names: Vec<String>,
}

impl ClusterArgs {
    /// The Redis connection of `--redis-url` and the `--redis-*` credential and
    /// TLS flags (plus env `REDIS_PASSWORD`), for [`crate::handoff::queue::PvQueue::connect`]
    /// and [`crate::handoff::intents::IntentStore::connect`].
    pub fn redis(&self) -> crate::handoff::redis_store::RedisConfig {
        crate::handoff::redis_store::RedisConfig::from_args(&self.redis_url, &self.redis_auth)
    }
}

impl CommonArgs {
    /// The HTTP server's address: `--http-endpoint`, else `--http-address`:`--http-port`
    /// (default: the service's port).
    pub fn http_socket_addr(&self, spec: ServiceSpec) -> SocketAddr {
        let port = self.http_port.unwrap_or(spec.http_port);
        self.http_endpoint
            .unwrap_or(SocketAddr::new(self.http_address, port))
    }

    /// `--worker-threads`, else the service's default; at least 1.
    pub fn worker_threads_for(&self, spec: ServiceSpec) -> usize {
        self.worker_threads.unwrap_or(spec.worker_threads).max(1) as usize
    }

    /// The per-item retry backoff: `--retry-interval-start` doubling up to
    /// `--retry-interval-max`, each defaulting per service.
    pub fn retry_backoff(&self, spec: ServiceSpec) -> crate::kube::retry::Backoff {
        let (start, max) = spec.retry_intervals;
        crate::kube::retry::Backoff::exponential(
            self.retry_interval_start.unwrap_or(start),
            self.retry_interval_max.unwrap_or(max),
        )
    }

    /// The `--leader-election-*` timing flags, unchecked ([`crate::runtime::leader::LeaseTiming::validate`]).
    pub fn lease_timing(&self) -> crate::runtime::leader::LeaseTiming {
        crate::runtime::leader::LeaseTiming {
            lease_duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    /// How Redis (re)connections are retried: every `--redis-reconnect-period`
    /// until they succeed or the service shuts down.
    pub fn redis_reconnect(&self) -> crate::kube::retry::Backoff {
        crate::kube::retry::Backoff::constant(self.redis_reconnect_period)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    /// Specs shaped like the services' own (ports 9101-9103, the seed's backoff).
    const PROVISION: ServiceSpec =
        ServiceSpec::new("provision-svc", "provision", 9101).with_workers(8);
    const PV_WRITER: ServiceSpec = ServiceSpec::new("pv-writer", "pv-writer", 9102)
        .with_workers(16)
        .with_retry(Duration::from_secs(1), Duration::from_secs(300));
    const RECLAIM: ServiceSpec = ServiceSpec::new("reclaim-svc", "reclaim", 9103);

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        retry: RetryArgs,
    }

    #[test]
    fn lease_timing_errors_name_the_flags_that_exist() {
        use clap::CommandFactory;
        let longs: Vec<String> = Cli::command()
            .get_arguments()
            .filter_map(|a| Some(format!("--{}", a.get_long()?)))
            .collect();
        for bad in [
            "--leader-election-retry-period=0s",
            "--leader-election-renew-deadline=2s",
            "--leader-election-lease-duration=10s",
        ] {
            let cli = Cli::try_parse_from(["x", bad]).unwrap();
            let err = cli.common.lease_timing().validate().unwrap_err();
            let named: Vec<&str> = err
                .split_whitespace()
                .filter(|w| w.starts_with("--"))
                .collect();
            assert!(
                named.contains(&bad.split('=').next().unwrap()),
                "{bad}: {err}"
            );
            assert!(named.iter().all(|f| longs.iter().any(|l| l == f)), "{err}");
        }
    }

    #[test]
    fn defaults_match_the_seed_and_design() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.common.lease_duration, Duration::from_secs(15));
        assert_eq!(cli.common.renew_deadline, Duration::from_secs(10));
        assert_eq!(cli.common.retry_period, Duration::from_secs(2));
        assert_eq!(
            cli.common.redis_reconnect_period,
            Duration::from_millis(500)
        );
        assert_eq!(cli.common.cluster.kube_api_qps, 1000.0);
        assert_eq!(cli.common.cluster.kube_api_burst, 2000);
        assert!(cli.common.leader_election);
        let seed = crate::kube::retry::Backoff::exponential(
            Duration::from_secs(15),
            Duration::from_secs(1000),
        );
        assert_eq!(cli.common.retry_backoff(PROVISION), seed);
        assert_eq!(cli.common.retry_backoff(RECLAIM), seed);
        assert_eq!(
            cli.common.retry_backoff(PV_WRITER),
            crate::kube::retry::Backoff::exponential(
                Duration::from_secs(1),
                Duration::from_secs(300)
            )
        );
        assert_eq!(cli.common.worker_threads_for(PROVISION), 8);
        assert_eq!(cli.common.worker_threads_for(PV_WRITER), 16);
        assert_eq!(cli.common.worker_threads_for(RECLAIM), 4);
        assert_eq!(cli.retry.retry_qps, 10.0);
        assert_eq!(cli.retry.retry_burst, 100);
        assert_eq!(cli.common.http_socket_addr(PV_WRITER).port(), 9102);
        assert_eq!(
            cli.common.http_socket_addr(RECLAIM),
            "0.0.0.0:9103".parse().unwrap()
        );
    }

    #[test]
    fn flags_parse_durations_and_booleans() {
        let cli = Cli::try_parse_from([
            "x",
            "--leader-election=false",
            "--leader-election-lease-duration",
            "1m30s",
            "--http-port",
            "0",
        ])
        .unwrap();
        assert!(!cli.common.leader_election);
        assert_eq!(cli.common.lease_duration, Duration::from_secs(90));
        assert_eq!(cli.common.http_socket_addr(PROVISION).port(), 0);
        assert!(Cli::try_parse_from(["x", "--leader-election-lease-duration", "soon"]).is_err());
        assert!(Cli::try_parse_from(["x", "--worker-threads", "0"]).is_err());
        assert!(Cli::try_parse_from(["x", "--worker-threads", "1025"]).is_err());
    }

    /// Parse `args` and return what the leader-election, retry and worker flags parsed to.
    fn parsed(args: &[&str]) -> (Duration, Duration, Duration, Duration, Duration, usize) {
        let cli = Cli::try_parse_from(std::iter::once("x").chain(args.iter().copied())).unwrap();
        let c = cli.common;
        let b = c.retry_backoff(PROVISION);
        (
            c.lease_duration,
            c.renew_deadline,
            c.retry_period,
            b.initial,
            b.max,
            c.worker_threads_for(PROVISION),
        )
    }

    #[test]
    fn external_provisioner_flag_names_parse() {
        let new = parsed(&[
            "--leader-election-lease-duration=31s",
            "--leader-election-renew-deadline=21s",
            "--leader-election-retry-period=3s",
            "--retry-interval-start=2s",
            "--retry-interval-max=7m",
            "--worker-threads=12",
        ]);
        let expected = (
            Duration::from_secs(31),
            Duration::from_secs(21),
            Duration::from_secs(3),
            Duration::from_secs(2),
            Duration::from_secs(420),
            12,
        );
        assert_eq!(new, expected);
        assert!(
            Cli::try_parse_from(["x", "--workers=2"]).is_err(),
            "never-released aliases are gone"
        );
    }

    #[test]
    fn http_endpoint_or_address_and_port() {
        let cli = Cli::try_parse_from(["x", "--http-endpoint", ":8080"]).unwrap();
        assert_eq!(
            cli.common.http_socket_addr(PROVISION),
            "0.0.0.0:8080".parse().unwrap()
        );
        assert_eq!(cli.common.http_socket_addr(PROVISION).port(), 8080);
        let cli = Cli::try_parse_from(["x", "--http-endpoint=127.0.0.1:0"]).unwrap();
        assert_eq!(
            cli.common.http_socket_addr(RECLAIM),
            "127.0.0.1:0".parse().unwrap()
        );
        let cli = Cli::try_parse_from(["x", "--http-endpoint=[::1]:9"]).unwrap();
        assert_eq!(
            cli.common.http_socket_addr(RECLAIM),
            "[::1]:9".parse().unwrap()
        );
        let split =
            Cli::try_parse_from(["x", "--http-address", "127.0.0.1", "--http-port", "8080"])
                .unwrap();
        assert_eq!(
            split.common.http_socket_addr(PV_WRITER),
            "127.0.0.1:8080".parse().unwrap()
        );
        assert!(Cli::try_parse_from(["x", "--http-endpoint=:1", "--http-port=2"]).is_err());
        assert!(Cli::try_parse_from(["x", "--http-endpoint=localhost"]).is_err());
        assert!(Cli::try_parse_from(["x", "--http-endpoint=:99999"]).is_err());
    }

    #[test]
    fn bad_redis_urls_are_refused_at_parse_time_without_the_password() {
        for ok in [
            "redis://127.0.0.1:6379/0",
            "rediss://user:pass@redis.example:6380",
            "redis+unix:///run/redis.sock",
        ] {
            let cli = Cli::try_parse_from(["x", "--redis-url", ok]).unwrap();
            assert_eq!(cli.common.cluster.redis_url, ok);
        }
        for (bad, why) in [
            ("http://nowhere", "is not a Redis URL"),
            ("redis://127.0.0.1:notaport/0", "is not a valid Redis URL"),
            ("127.0.0.1:6379", "is not a Redis URL"),
            (
                "redis://u:hunter2@127.0.0.1:99999/0",
                "is not a valid Redis URL",
            ),
        ] {
            let err = match Cli::try_parse_from(["x", "--redis-url", bad]) {
                Ok(_) => panic!("{bad} accepted"),
                Err(e) => e,
            };
            assert_eq!(err.exit_code(), 2, "{bad}");
            let text = err.to_string();
            assert!(text.contains("--redis-url"), "{text}");
            assert!(text.contains(why), "{text}");
            assert!(!text.contains("hunter2"), "password echoed: {text}");
        }
    }

    #[test]
    fn redis_reconnect_period_is_its_own_flag() {
        let cli = Cli::try_parse_from([
            "x",
            "--leader-election-retry-period=5s",
            "--redis-reconnect-period=250ms",
        ])
        .unwrap();
        assert_eq!(cli.common.retry_period, Duration::from_secs(5));
        assert_eq!(
            cli.common.redis_reconnect(),
            crate::kube::retry::Backoff::constant(Duration::from_millis(250))
        );
    }

    #[tokio::test(start_paused = true)]
    async fn resync_period_zero_is_off() {
        assert!(resync_interval(Duration::ZERO).is_none());
        let start = tokio::time::Instant::now();
        let mut tick = resync_interval(Duration::from_secs(60)).unwrap();
        tick.tick().await;
        assert_eq!(
            start.elapsed(),
            Duration::from_secs(60),
            "first tick one period out"
        );
        tick.tick().await;
        assert_eq!(start.elapsed(), Duration::from_secs(120));
    }

    #[test]
    fn redis_credential_and_tls_flags_reach_the_connection() {
        let cli = Cli::try_parse_from([
            "x",
            "--redis-url",
            "rediss://redis:6380/0",
            "--redis-username",
            "pv-writer",
            "--redis-password-file",
            "/etc/redis-password/pv-writer",
            "--redis-ca-file",
            "/etc/redis-tls/ca.crt",
        ])
        .unwrap();
        let redis = cli.common.cluster.redis();
        assert_eq!(redis.url, "rediss://redis:6380/0");
        assert_eq!(redis.auth.redis_username.as_deref(), Some("pv-writer"));
        assert_eq!(
            redis.auth.redis_password_file.as_deref(),
            Some(std::path::Path::new("/etc/redis-password/pv-writer"))
        );
        assert_eq!(
            redis.auth.redis_ca_file.as_deref(),
            Some(std::path::Path::new("/etc/redis-tls/ca.crt"))
        );
        // A client certificate without its key is refused by the parser.
        assert!(Cli::try_parse_from(["x", "--redis-client-cert-file", "c.pem"]).is_err());
    }
}
