//! Command-line flags shared by every service, each with an environment-variable
//! twin (flag `--kube-api-qps` ⇔ env `KUBE_API_QPS`). Services `#[command(flatten)]`
//! [`CommonArgs`] into their own clap parser.

use std::net::IpAddr;
use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};

/// Parse a human duration such as `15s`, `2m`, `1h30m` or `500ms`.
///
/// Errors: a message naming the bad input, for clap to print.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("invalid duration {s:?}: {e}"))
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    /// Human-readable lines.
    Text,
    /// One JSON object per line, for log shippers.
    Json,
}

/// The service a process runs; fixes its Lease suffix and default HTTP port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ServiceKind {
    /// Claims → volumes.
    Provision,
    /// Durable queue → PV objects.
    PvWriter,
    /// Released volumes → deletion.
    Reclaim,
}

impl ServiceKind {
    /// Binary / component name, e.g. `provision-svc`; used as the event reporter.
    pub fn component(self) -> &'static str {
        match self {
            ServiceKind::Provision => "provision-svc",
            ServiceKind::PvWriter => "pv-writer",
            ServiceKind::Reclaim => "reclaim-svc",
        }
    }

    /// Suffix of the service's Lease name (`<provisioner>-<suffix>`).
    pub fn lease_suffix(self) -> &'static str {
        match self {
            ServiceKind::Provision => "provision",
            ServiceKind::PvWriter => "pv-writer",
            ServiceKind::Reclaim => "reclaim",
        }
    }

    /// Default HTTP port for `/metrics`, `/healthz`, `/readyz`: 9101, 9102, 9103,
    /// distinct so all three services can run on one host.
    pub fn default_http_port(self) -> u16 {
        match self {
            ServiceKind::Provision => 9101,
            ServiceKind::PvWriter => 9102,
            ServiceKind::Reclaim => 9103,
        }
    }
}

/// Flags every service takes.
#[derive(Debug, Clone, Args)]
pub struct CommonArgs {
    /// Provisioner name: matched against StorageClass `provisioner` and written to
    /// `pv.kubernetes.io/provisioned-by`.
    #[arg(long, env = "PROVISIONER_NAME", default_value = "example.com/hostpath")]
    pub provisioner_name: String,

    /// Path to a kubeconfig. Without it: `KUBECONFIG`/`~/.kube/config`, then the
    /// in-cluster service account.
    #[arg(long, env = "KUBECONFIG")]
    pub kubeconfig: Option<PathBuf>,

    /// Client-side limit on API requests per second (token bucket refill rate).
    /// 0 disables the limit.
    ///
    /// Default 1000: a backstop against a runaway loop, sized so it never binds
    /// below what the control plane itself allows. kube-controller-manager
    /// annotates claims for an external provisioner at about 150–220 claims/s
    /// on a two-core machine (`bench --control-plane real`, BENCHMARKS.md), and
    /// a volume costs pv-writer two requests (PV create, `ProvisioningSucceeded`)
    /// and provision-svc one (`Provisioning`): at most about 450 requests/s per
    /// process, where the former default of 200 capped pv-writer near 100 PVs/s.
    /// The API server's own protection (priority and fairness, 429s) is what
    /// should bound a healthy provisioner.
    #[arg(long, env = "KUBE_API_QPS", default_value_t = 1000.0)]
    pub kube_api_qps: f64,

    /// Client-side burst of API requests above `--kube-api-qps`. Ignored when the
    /// QPS limit is disabled.
    #[arg(long, env = "KUBE_API_BURST", default_value_t = 2000)]
    pub kube_api_burst: u32,

    /// Redis URL of the durable queue and provisioning intents, e.g.
    /// `redis://127.0.0.1:6379/0` or `rediss://user:pass@host:6380`.
    #[arg(long, env = "REDIS_URL", default_value = "redis://127.0.0.1:6379/0")]
    pub redis_url: String,

    /// Elect a leader through a `coordination.k8s.io/v1` Lease; only the leader
    /// works. Disable only when exactly one replica runs.
    #[arg(long, env = "LEADER_ELECTION", default_value_t = true, action = clap::ArgAction::Set)]
    pub leader_election: bool,

    /// Namespace of the Lease. Default: `POD_NAMESPACE`, else the service
    /// account's namespace file, else `default`.
    #[arg(long, env = "LEADER_ELECTION_NAMESPACE")]
    pub leader_election_namespace: Option<String>,

    /// This replica's identity in the Lease (`holderIdentity`). Default:
    /// `POD_NAME`, else the host name, plus a random suffix.
    #[arg(long, env = "LEADER_ELECTION_IDENTITY")]
    pub leader_election_identity: Option<String>,

    /// How long a Lease is valid without renewal; a standby takes over after it.
    #[arg(long, env = "LEASE_DURATION", default_value = "15s", value_parser = parse_duration)]
    pub lease_duration: Duration,

    /// How long the leader keeps trying to renew before it gives up leadership.
    #[arg(long, env = "RENEW_DEADLINE", default_value = "10s", value_parser = parse_duration)]
    pub renew_deadline: Duration,

    /// How often candidates try to acquire, and the leader to renew, the Lease.
    #[arg(long, env = "RETRY_PERIOD", default_value = "2s", value_parser = parse_duration)]
    pub retry_period: Duration,

    /// Address the HTTP server (metrics, health) listens on.
    #[arg(long, env = "HTTP_ADDRESS", default_value = "0.0.0.0")]
    pub http_address: IpAddr,

    /// Port of the HTTP server. Default: 9101 provision-svc, 9102 pv-writer,
    /// 9103 reclaim-svc. 0 picks a free port (logged).
    #[arg(long, env = "HTTP_PORT")]
    pub http_port: Option<u16>,

    /// Path of the Prometheus metrics endpoint.
    #[arg(long, env = "METRICS_PATH", default_value = "/metrics")]
    pub metrics_path: String,

    /// Log format.
    #[arg(long, env = "LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,

    /// Log filter in `tracing` EnvFilter syntax (e.g. `info`, `debug,kube=info`).
    #[arg(long, env = "LOG_LEVEL", default_value = "info")]
    pub log_level: String,

    /// On SIGTERM/SIGINT, how long in-flight work may take to finish before it is
    /// abandoned and the Lease released. Keep below the pod's
    /// `terminationGracePeriodSeconds`.
    #[arg(long, env = "SHUTDOWN_GRACE_PERIOD", default_value = "20s", value_parser = parse_duration)]
    pub shutdown_grace_period: Duration,
}

/// Per-item retry flags of the claim/volume work queues (seed defaults: per item
/// 15s doubling to 1000s, overall 10 retries/s with burst 100).
#[derive(Debug, Clone, Args)]
pub struct RetryArgs {
    /// First retry delay of a failed item; doubles per consecutive failure.
    #[arg(long, env = "RETRY_INITIAL_DELAY", default_value = "15s", value_parser = parse_duration)]
    pub retry_initial_delay: Duration,

    /// Cap of a failed item's retry delay.
    #[arg(long, env = "RETRY_MAX_DELAY", default_value = "1000s", value_parser = parse_duration)]
    pub retry_max_delay: Duration,

    /// Overall retries per second across all items (token bucket refill). 0 disables.
    #[arg(long, env = "RETRY_QPS", default_value_t = 10.0)]
    pub retry_qps: f64,

    /// Overall retry burst (token bucket size).
    #[arg(long, env = "RETRY_BURST", default_value_t = 100)]
    pub retry_burst: u32,
}

impl CommonArgs {
    /// The HTTP port to bind: `--http-port`, else the service's default.
    pub fn http_port_for(&self, kind: ServiceKind) -> u16 {
        self.http_port.unwrap_or_else(|| kind.default_http_port())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        common: CommonArgs,
        #[command(flatten)]
        retry: RetryArgs,
    }

    #[test]
    fn defaults_match_the_seed_and_design() {
        let cli = Cli::try_parse_from(["x"]).unwrap();
        assert_eq!(cli.common.lease_duration, Duration::from_secs(15));
        assert_eq!(cli.common.renew_deadline, Duration::from_secs(10));
        assert_eq!(cli.common.retry_period, Duration::from_secs(2));
        assert_eq!(cli.common.kube_api_qps, 1000.0);
        assert_eq!(cli.common.kube_api_burst, 2000);
        assert!(cli.common.leader_election);
        assert_eq!(cli.retry.retry_initial_delay, Duration::from_secs(15));
        assert_eq!(cli.retry.retry_max_delay, Duration::from_secs(1000));
        assert_eq!(cli.common.http_port_for(ServiceKind::PvWriter), 9102);
    }

    #[test]
    fn flags_parse_durations_and_booleans() {
        let cli = Cli::try_parse_from([
            "x",
            "--leader-election=false",
            "--lease-duration",
            "1m30s",
            "--http-port",
            "0",
        ])
        .unwrap();
        assert!(!cli.common.leader_election);
        assert_eq!(cli.common.lease_duration, Duration::from_secs(90));
        assert_eq!(cli.common.http_port_for(ServiceKind::Provision), 0);
        assert!(Cli::try_parse_from(["x", "--lease-duration", "soon"]).is_err());
    }
}
