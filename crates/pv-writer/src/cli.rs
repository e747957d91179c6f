//! Flags and subcommands of `pv-writer`, each flag with an environment twin
//! (`--retry-initial` ⇔ `RETRY_INITIAL`).

use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use common::config::{parse_duration, CommonArgs};
use common::queue_auth::QueueKeyArgs;

/// `pv-writer [FLAGS] [run | queue list | queue dead | queue requeue <PV> | status [-o json] [NAMES]]`.
///
/// Without a subcommand (or with `run`) it runs the service. The `queue`
/// subcommands only talk to Redis: give `--redis-url` / `--provisioner-name`
/// (or `REDIS_URL` / `PROVISIONER_NAME`) before the subcommand.
#[derive(Debug, Clone, Parser)]
#[command(
    name = "pv-writer",
    version,
    about = "Drains the durable Redis PV-write queue and creates the PersistentVolumes"
)]
pub struct Cli {
    /// Flags shared by every service.
    #[command(flatten)]
    pub common: CommonArgs,
    /// pv-writer's own flags.
    #[command(flatten)]
    pub writer: WriterArgs,
    /// What to do; default: run the service.
    #[command(subcommand)]
    pub command: Option<Command>,
}

/// pv-writer's own flags.
#[derive(Debug, Clone, Args)]
pub struct WriterArgs {
    /// How many PV writes run at once.
    #[arg(long, env = "WORKERS", default_value_t = 16, value_parser = clap::value_parser!(u32).range(1..=1024))]
    pub workers: u32,

    /// First retry delay of an entry after a transient failure; doubles per
    /// consecutive failure of that entry (with up to 20 % jitter below).
    #[arg(long, env = "RETRY_INITIAL", default_value = "1s", value_parser = parse_duration)]
    pub retry_initial: Duration,

    /// Cap of an entry's retry delay. Entries are retried forever.
    #[arg(long, env = "RETRY_MAX", default_value = "5m", value_parser = parse_duration)]
    pub retry_max: Duration,

    /// Time limit of one PV create (and the `get` after `AlreadyExists`); a write
    /// taking longer counts as a transient failure.
    #[arg(long, env = "WRITE_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub write_timeout: Duration,

    /// How long a taken entry stays invisible to other takes; a writer that hangs
    /// longer (or a previous leader that stalled) has its entry taken again.
    /// Must exceed `--write-timeout`.
    #[arg(long, env = "VISIBILITY_TIMEOUT", default_value = "2m", value_parser = parse_duration)]
    pub visibility_timeout: Duration,

    /// The backend whose own check a queued PV's volume source must pass
    /// (same `--backend` and backend flags as provision-svc's; hostpath: a
    /// queued PV is written only when its `hostPath` is exactly
    /// `<base-dir>/<pv name>`; nfs-subdir: our server, a path below our export).
    #[command(flatten)]
    pub backend: common::backend::select::BackendArgs,

    /// Further provisioner names accepted in a queued PV's
    /// `pv.kubernetes.io/provisioned-by` annotation besides `--provisioner-name`
    /// (same as provision-svc's; comma-separated in the environment variable).
    #[arg(
        long = "additional-provisioner",
        env = "ADDITIONAL_PROVISIONERS",
        value_delimiter = ','
    )]
    pub additional_provisioners: Vec<String>,

    /// The key that authenticates queue entries (`--queue-hmac-key-file`).
    #[command(flatten)]
    pub queue_key: QueueKeyArgs,
}

/// Subcommands.
#[derive(Debug, Clone, Subcommand)]
pub enum Command {
    /// Run the service (the default).
    Run,
    /// Inspect or repair the queue (Redis only, no Kubernetes access).
    Queue {
        /// The queue operation.
        #[command(subcommand)]
        action: QueueCommand,
    },
    /// Operator's overview per provisioner name: queue depth and oldest
    /// pending age, in-flight entries and their owner term, dead letters and
    /// reasons, provisioning intents, the last orphan sweep's report and the
    /// three Leases' holders (read-only; Redis, and the API server with
    /// `--kubeconfig` for the Leases in `--leader-election-namespace`).
    Status(StatusArgs),
}

/// `pv-writer status` flags.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// `table` (for a terminal) or `json` (for scripts; the shape of
    /// `pv_writer::status::Status`).
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Skip the Leases (no API-server access needed).
    #[arg(long)]
    pub no_leases: bool,
    /// Provisioner names to report on; default: `--provisioner-name`.
    pub provisioner_names: Vec<String>,
}

/// Output format of `pv-writer status`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned tables.
    Table,
    /// One JSON document.
    Json,
}

/// `pv-writer queue ...` operations.
#[derive(Debug, Clone, Subcommand)]
pub enum QueueCommand {
    /// List pending entries (due or in flight): PV, claim, class, state, attempts, age.
    List,
    /// List dead-lettered entries with their reason.
    Dead,
    /// Move a dead letter back to the pending queue (attempts reset).
    Requeue {
        /// The PV name, e.g. `pvc-0b6f...`.
        pv_name: String,
    },
}

impl WriterArgs {
    /// Check relations between flags.
    ///
    /// Errors: `--retry-max` below `--retry-initial`, or `--visibility-timeout`
    /// not above `--write-timeout`.
    pub fn validate(&self) -> anyhow::Result<()> {
        self.backend.build().map_err(anyhow::Error::msg)?;
        if self.retry_max < self.retry_initial {
            anyhow::bail!(
                "--retry-max ({:?}) must not be below --retry-initial ({:?})",
                self.retry_max,
                self.retry_initial
            );
        }
        if self.visibility_timeout <= self.write_timeout {
            anyhow::bail!(
                "--visibility-timeout ({:?}) must exceed --write-timeout ({:?})",
                self.visibility_timeout,
                self.write_timeout
            );
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::PathBuf;

    #[test]
    fn defaults_and_subcommands() {
        let cli = Cli::try_parse_from(["pv-writer"]).unwrap();
        assert_eq!(cli.writer.workers, 16);
        assert_eq!(cli.writer.retry_initial, Duration::from_secs(1));
        assert_eq!(cli.writer.retry_max, Duration::from_secs(300));
        assert_eq!(cli.writer.write_timeout, Duration::from_secs(30));
        assert_eq!(cli.writer.visibility_timeout, Duration::from_secs(120));
        assert!(cli.command.is_none());
        assert_eq!(
            cli.writer.backend.hostpath.base_dir,
            PathBuf::from("/var/lib/hostpath-provisioner")
        );
        assert!(cli.writer.queue_key.queue_hmac_key_file.is_none());
        assert!(!cli.writer.queue_key.insecure_unsigned_queue);
        cli.writer.validate().unwrap();
        let cli = Cli::try_parse_from([
            "pv-writer",
            "--base-dir",
            "/data",
            "--queue-hmac-key-file",
            "/k",
            "--additional-provisioner",
            "a.io/x",
        ])
        .unwrap();
        assert_eq!(cli.writer.backend.hostpath.base_dir, PathBuf::from("/data"));
        assert_eq!(
            cli.writer.queue_key.queue_hmac_key_file,
            Some(PathBuf::from("/k"))
        );
        assert_eq!(cli.writer.additional_provisioners, ["a.io/x"]);

        let cli = Cli::try_parse_from([
            "pv-writer",
            "--redis-url",
            "redis://r:1/0",
            "queue",
            "requeue",
            "pvc-1",
        ])
        .unwrap();
        assert_eq!(cli.common.redis_url, "redis://r:1/0");
        match cli.command {
            Some(Command::Queue {
                action: QueueCommand::Requeue { pv_name },
            }) => assert_eq!(pv_name, "pvc-1"),
            other => panic!("unexpected {other:?}"),
        }
        assert!(matches!(
            Cli::try_parse_from(["pv-writer", "queue", "list"])
                .unwrap()
                .command,
            Some(Command::Queue {
                action: QueueCommand::List
            })
        ));
        assert!(Cli::try_parse_from(["pv-writer", "--workers", "0"]).is_err());
        match Cli::try_parse_from(["pv-writer", "status", "-o", "json", "a.io/x", "b.io/y"])
            .unwrap()
            .command
        {
            Some(Command::Status(args)) => {
                assert_eq!(args.output, OutputFormat::Json);
                assert_eq!(args.provisioner_names, ["a.io/x", "b.io/y"]);
                assert!(!args.no_leases);
            }
            other => panic!("unexpected {other:?}"),
        }
        assert!(Cli::try_parse_from(["pv-writer", "status", "--output", "yaml"]).is_err());
    }

    #[test]
    fn flag_relations_are_checked() {
        let cli = Cli::try_parse_from(["pv-writer", "--retry-initial", "10s", "--retry-max", "5s"])
            .unwrap();
        assert!(cli.writer.validate().is_err());
        let cli = Cli::try_parse_from(["pv-writer", "--write-timeout", "2m"]).unwrap();
        assert!(cli.writer.validate().is_err());
    }
}
