//! provision-svc's flags (each with an environment-variable twin).

use std::time::Duration;

use clap::Args;
use common::handoff::queue::ReplicaAcks;
use common::handoff::queue_auth::QueueKeyArgs;
use common::runtime::config::{parse_duration, AdditionalProvisioners, RetryArgs, ServiceCli};

/// Flags of the provisioning controller (without the backend's).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Provisioning")]
pub struct ProvisionArgs {
    /// Overall retry limit of the claim queue (the per-claim backoff is
    /// `--retry-interval-start`/`--retry-interval-max` of the shared flags).
    #[command(flatten)]
    pub retry: RetryArgs,

    /// The key that signs PV-write queue entries (`--queue-hmac-key-file`).
    #[command(flatten, next_help_heading = "Provisioning")]
    pub queue_key: QueueKeyArgs,

    /// `--additional-provisioner`.
    #[command(flatten)]
    pub additional_provisioners: AdditionalProvisioners,

    /// Add `external-provisioner.volume.kubernetes.io/finalizer` to provisioned
    /// PVs (seed `AddFinalizer`); set it as reclaim-svc's `--add-finalizer`, or
    /// reclaim-svc removes it again.
    #[arg(long, env = "ADD_FINALIZER", default_value_t = false, action = clap::ArgAction::Set)]
    pub add_finalizer: bool,

    /// Failed provisioning attempts per claim before giving up; 0 retries forever.
    #[arg(long, env = "FAILED_PROVISION_THRESHOLD", default_value_t = 15)]
    pub failed_provision_threshold: u32,

    /// Bound on one claim's provisioning attempt (e.g. `2m`); unset: unbounded
    /// (seed). The backend sees the deadline; a timed-out attempt fails, is kept
    /// in background and retried.
    #[arg(long, env = "PROVISION_TIMEOUT", value_parser = parse_duration)]
    pub provision_timeout: Option<Duration>,

    /// Replicas that must acknowledge each PV-write enqueue (Redis `WAIT`) before the
    /// claim counts as queued: `auto` (1 while the primary has a replica, else 0) or N.
    #[arg(long, env = "REDIS_WAIT_REPLICAS", default_value = "auto")]
    pub redis_wait_replicas: ReplicaAcks,

    /// Longest wait for `--redis-wait-replicas` (1ms to 4s: below the 5 s Redis answer
    /// timeout); a shortfall is logged, not fatal.
    #[arg(long, env = "REDIS_WAIT_TIMEOUT", default_value = "1s", value_parser = parse_wait_timeout)]
    pub redis_wait_timeout: Duration,

    /// How often every cached claim is queued again (the seed's informer
    /// resync). `0s` disables.
    #[arg(long, env = "RESYNC_PERIOD", default_value = "15m", value_parser = parse_duration)]
    pub resync_period: Duration,
}

/// The `provision-svc` command line without the backend's flags (the binary adds `--backend` and
/// the built-in backends' flags, see the `backends` crate).
pub type Cli = ServiceCli<ProvisionArgs>;

/// Parse `--redis-wait-timeout`: 1 ms to 4 s (`WAIT` with 0 ms blocks for good; one wait stays
/// below the 5 s answer timeout). Errors: out of range.
pub fn parse_wait_timeout(s: &str) -> Result<Duration, String> {
    let wait = parse_duration(s)?;
    if wait < Duration::from_millis(1) || wait > Duration::from_secs(4) {
        return Err(format!("{s:?} is out of range: want 1ms to 4s"));
    }
    Ok(wait)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn defaults_follow_the_seed() {
        let cli = Cli::try_parse_from(["provision-svc"]).unwrap();
        let p = cli.service;
        assert!(p.additional_provisioners.names.is_empty());
        assert!(!p.add_finalizer);
        assert_eq!(p.failed_provision_threshold, 15);
        assert_eq!(p.provision_timeout, None);
        assert_eq!(p.resync_period, Duration::from_secs(15 * 60));
        assert_eq!(cli.common.worker_threads_for(crate::SPEC), 8);
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "provision-svc",
            "--additional-provisioner",
            "a.io/x",
            "--additional-provisioner=b.io/y",
            "--add-finalizer=true",
            "--failed-provision-threshold",
            "0",
            "--provision-timeout",
            "2m",
            "--worker-threads",
            "32",
        ])
        .unwrap();
        assert_eq!(
            cli.service.additional_provisioners.names,
            vec!["a.io/x", "b.io/y"]
        );
        assert!(cli.service.add_finalizer);
        assert_eq!(cli.service.failed_provision_threshold, 0);
        assert_eq!(
            cli.service.provision_timeout,
            Some(Duration::from_secs(120))
        );
        assert_eq!(cli.common.worker_threads_for(crate::SPEC), 32);
        assert!(Cli::try_parse_from(["provision-svc", "--worker-threads", "0"]).is_err());
    }

    #[test]
    fn the_replica_wait_is_above_zero_and_below_the_answer_timeout() {
        assert_eq!(parse_wait_timeout("1s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse_wait_timeout("4s"), Ok(Duration::from_secs(4)));
        for bad in ["0s", "500us", "5s", "1m"] {
            let err = parse_wait_timeout(bad).unwrap_err();
            assert!(err.contains("out of range"), "{bad}: {err}");
        }
        assert!(parse_wait_timeout("soon")
            .unwrap_err()
            .contains("invalid duration"));
    }
}
