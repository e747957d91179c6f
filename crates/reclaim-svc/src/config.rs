//! reclaim-svc's flags (each with an environment twin); the shared ones are in
//! `common::runtime::config`, the backend's are added by the binary.

use std::time::Duration;

use clap::Args;
use common::runtime::config::{parse_duration, RetryArgs, ServiceCli};

/// Flags of reclaim-svc itself (each with an environment twin).
#[derive(Debug, Clone, Args)]
#[command(next_help_heading = "Reclaiming")]
pub struct ReclaimArgs {
    /// Overall retry limit of the PV queue (`--retry-qps`/`--retry-burst`).
    #[command(flatten)]
    pub retry: RetryArgs,

    /// Add the provisioner finalizer to our PVs with policy `Delete` (off: remove
    /// it; seed `AddFinalizer`). Set alike with provision-svc's `--add-finalizer`.
    #[arg(long, env = "ADD_FINALIZER", default_value_t = false, action = clap::ArgAction::Set)]
    pub add_finalizer: bool,

    /// Failed syncs of one PV before it is given up until its next change
    /// (seed `FailedDeleteThreshold`). 0 retries forever.
    #[arg(long, env = "FAILED_DELETE_THRESHOLD", default_value_t = 15)]
    pub failed_delete_threshold: u32,

    /// Upper bound of one PV sync including the backend's delete; `0s`: unlimited
    /// (seed `DeletionTimeout`). The backend sees it as its deadline.
    #[arg(long, env = "DELETION_TIMEOUT", default_value = "0s", value_parser = parse_duration)]
    pub deletion_timeout: Duration,

    /// Every PV is re-examined this often even without changes (seed resync
    /// period). `0s` disables.
    #[arg(long, env = "RESYNC_PERIOD", default_value = "15m", value_parser = parse_duration)]
    pub resync_period: Duration,

    /// Archive (rename `archived-<name>`, never remove) orphans the leader-start
    /// sweep finds once older than --sweep-min-age; off: report them only.
    #[arg(long, env = "SWEEP_ORPHANS", default_value_t = false, action = clap::ArgAction::Set)]
    pub sweep_orphans: bool,

    /// Minimum age (newer of directory mtime/ctime) before --sweep-orphans
    /// archives an orphaned volume; younger orphans are only reported.
    #[arg(long, env = "SWEEP_MIN_AGE", default_value = "1h", value_parser = parse_duration)]
    pub sweep_min_age: Duration,
}

/// The `reclaim-svc` command line without the backend's flags (the binary adds `--backend` and
/// the built-in backends' flags, see the `backends` crate).
pub type Cli = ServiceCli<ReclaimArgs>;

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[test]
    fn flag_defaults_follow_the_seed() {
        let cli = Cli::try_parse_from(["reclaim-svc"]).unwrap();
        assert!(!cli.service.add_finalizer);
        assert_eq!(cli.service.failed_delete_threshold, 15);
        assert_eq!(cli.service.deletion_timeout, Duration::ZERO);
        assert_eq!(cli.service.resync_period, Duration::from_secs(15 * 60));
        assert_eq!(cli.common.worker_threads_for(crate::SPEC), 4);
        assert!(!cli.service.sweep_orphans);
        assert_eq!(cli.service.sweep_min_age, Duration::from_secs(3600));
    }

    #[test]
    fn flags_parse() {
        let cli = Cli::try_parse_from([
            "reclaim-svc",
            "--add-finalizer=true",
            "--failed-delete-threshold",
            "0",
            "--deletion-timeout",
            "2m",
            "--sweep-orphans=true",
            "--sweep-min-age",
            "6h",
        ])
        .unwrap();
        assert!(cli.service.add_finalizer);
        assert_eq!(cli.service.failed_delete_threshold, 0);
        assert_eq!(cli.service.deletion_timeout, Duration::from_secs(120));
        assert!(cli.service.sweep_orphans);
        assert_eq!(cli.service.sweep_min_age, Duration::from_secs(6 * 3600));
    }
}
