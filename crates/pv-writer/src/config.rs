//! Flags of `pv-writer`, each flag with an environment twin
//! (`--write-timeout` ⇔ `WRITE_TIMEOUT`). `--worker-threads` (default 16) and
//! `--retry-interval-start`/`--retry-interval-max` (default 1s/5m; entries are
//! retried forever, with up to 20 % jitter below) are shared flags (`common::runtime::config`).

use std::time::Duration;

use clap::Args;
use common::handoff::queue_auth::QueueKeyArgs;
use common::runtime::config::{parse_duration, AdditionalProvisioners, ServiceCli};

/// The `pv-writer` command line without the backend's flags (the binary adds `--backend` and
/// the built-in backends' flags, see the `backends` crate).
pub type Cli = ServiceCli<WriterArgs>;

/// pv-writer's own flags.
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "PV writes")]
pub struct WriterArgs {
    /// Time limit of one PV create (and the `get` after `AlreadyExists`); a write
    /// taking longer counts as a transient failure.
    #[arg(long, env = "WRITE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// How long a taken entry stays invisible to other takes; a writer that hangs
    /// longer (or a previous leader that stalled) has its entry taken again.
    /// Must exceed `--write-timeout`.
    #[arg(long, env = "VISIBILITY_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub visibility_timeout: Duration,

    /// `--additional-provisioner`.
    #[command(flatten)]
    pub additional_provisioners: AdditionalProvisioners,

    /// The key that authenticates queue entries (`--queue-hmac-key-file`).
    #[command(flatten)]
    pub queue_key: QueueKeyArgs,
}

/// Tuning of the drain loop, from [`WriterArgs`] and the shared flags ([`writer_config`]).
#[derive(Debug, Clone)]
pub struct WriterConfig {
    /// Concurrent PV writes.
    pub workers: usize,
    /// First retry delay after a transient failure.
    pub retry_initial: Duration,
    /// Cap of the retry delay.
    pub retry_max: Duration,
    /// Time limit of one write.
    pub write_timeout: Duration,
    /// Visibility timeout of a taken entry.
    pub visibility_timeout: Duration,
    /// Pause between attempts while Redis is unreachable (`--redis-reconnect-period`).
    pub redis_reconnect: Duration,
}

/// The drain loop's tuning from `cli`. Errors: `--retry-interval-max` below
/// `--retry-interval-start`, or `--visibility-timeout` not above `--write-timeout`.
pub fn writer_config(cli: &Cli) -> anyhow::Result<WriterConfig> {
    let (common, args) = (&cli.common, &cli.service);
    let retry = common.retry_backoff(crate::SPEC);
    anyhow::ensure!(
        retry.max >= retry.initial,
        "--retry-interval-max ({:?}) must not be below --retry-interval-start ({:?})",
        retry.max,
        retry.initial
    );
    anyhow::ensure!(
        args.visibility_timeout > args.write_timeout,
        "--visibility-timeout ({:?}) must exceed --write-timeout ({:?})",
        args.visibility_timeout,
        args.write_timeout
    );
    Ok(WriterConfig {
        workers: common.worker_threads_for(crate::SPEC),
        retry_initial: retry.initial,
        retry_max: retry.max,
        write_timeout: args.write_timeout,
        visibility_timeout: args.visibility_timeout,
        redis_reconnect: common.redis_reconnect_period,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;
    use std::path::PathBuf;

    #[test]
    fn defaults() {
        let cli = Cli::try_parse_from(["pv-writer"]).unwrap();
        assert_eq!(cli.common.worker_threads_for(crate::SPEC), 16);
        let retry = cli.common.retry_backoff(crate::SPEC);
        assert_eq!(retry.initial, Duration::from_secs(1));
        assert_eq!(retry.max, Duration::from_secs(300));
        assert_eq!(cli.service.write_timeout, Duration::from_secs(30));
        assert_eq!(cli.service.visibility_timeout, Duration::from_secs(120));
        assert!(cli.service.queue_key.queue_hmac_key_file.is_none());
        assert!(!cli.service.queue_key.insecure_unsigned_queue);
        let config = writer_config(&cli).unwrap();
        assert_eq!(
            (config.workers, config.retry_max),
            (16, Duration::from_secs(300))
        );
        let cli = Cli::try_parse_from([
            "pv-writer",
            "--queue-hmac-key-file",
            "/k",
            "--additional-provisioner",
            "a.io/x",
        ])
        .unwrap();
        assert_eq!(
            cli.service.queue_key.queue_hmac_key_file,
            Some(PathBuf::from("/k"))
        );
        assert_eq!(cli.service.additional_provisioners.names, ["a.io/x"]);

        assert!(Cli::try_parse_from(["pv-writer", "--worker-threads", "0"]).is_err());
        assert!(Cli::try_parse_from(["pv-writer", "--worker-threads", "0"]).is_err());
        assert!(
            Cli::try_parse_from(["pv-writer", "status"]).is_err(),
            "the operator's commands are provisioner-ctl's"
        );
    }

    #[test]
    fn flag_relations_are_checked() {
        let cli = Cli::try_parse_from([
            "pv-writer",
            "--retry-interval-start",
            "10s",
            "--retry-interval-max",
            "5s",
        ])
        .unwrap();
        assert!(writer_config(&cli).is_err());
        let cli = Cli::try_parse_from(["pv-writer", "--write-timeout", "2m"]).unwrap();
        assert!(writer_config(&cli).is_err());
    }
}
