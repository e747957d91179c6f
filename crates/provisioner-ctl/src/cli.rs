//! Flags and subcommands of `provisioner-ctl`. Each command takes the deployment
//! flags the services share after it (`--redis-url`, `--provisioner-name`, `--kubeconfig`,
//! ..., each with its environment twin, so it runs as is inside a service's pod).

use clap::{Args, Parser, Subcommand};
use common::runtime::config::ClusterArgs;

#[derive(Debug, Parser)]
#[command(
    name = "provisioner-ctl",
    version,
    about = "The operator's view and repairs of a split-provisioner: status, the PV-write queue"
)]
pub struct Cli {
    /// What to do.
    #[command(subcommand)]
    pub command: Command,
}

/// The operator's commands.
#[derive(Debug, Subcommand)]
pub enum Command {
    /// The queue (depth, oldest pending, dead letters, in-flight entries), the
    /// provisioning intents, the last orphan sweep and the three Leases.
    Status {
        #[command(flatten)]
        args: StatusArgs,
        #[command(flatten)]
        common: ClusterArgs,
    },
    /// The PV-write queue's entries, and requeueing a dead letter.
    Queue {
        #[command(subcommand)]
        action: QueueCommand,
    },
}

/// `status` options.
#[derive(Debug, Clone, Args)]
pub struct StatusArgs {
    /// Output format.
    #[arg(long, short = 'o', value_enum, default_value_t = OutputFormat::Table)]
    pub output: OutputFormat,
    /// Do not read the Leases (no Kubernetes client needed).
    #[arg(long)]
    pub no_leases: bool,
    /// Provisioner names to report (default: `--provisioner-name`).
    pub provisioner_names: Vec<String>,
}

/// `status --output`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum OutputFormat {
    /// Aligned text.
    Table,
    /// One JSON document.
    Json,
}

/// `queue` actions, each with the shared flags.
#[derive(Debug, Subcommand)]
pub enum QueueCommand {
    /// Entries waiting to be written (due, retrying or in flight).
    List(ClusterArgs),
    /// Dead-lettered entries and why they were refused.
    Dead(ClusterArgs),
    /// Move a dead-lettered entry back to the queue.
    Requeue {
        /// The PV name of the entry.
        pv_name: String,
        #[command(flatten)]
        common: ClusterArgs,
    },
}

/// What a `queue` command does.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Action<'a> {
    /// List pending entries.
    List,
    /// List dead letters.
    Dead,
    /// Requeue the dead letter of this PV name.
    Requeue(&'a str),
}

impl QueueCommand {
    /// What this command does, and its shared flags.
    pub fn parts(&self) -> (Action<'_>, &ClusterArgs) {
        match self {
            QueueCommand::List(common) => (Action::List, common),
            QueueCommand::Dead(common) => (Action::Dead, common),
            QueueCommand::Requeue { pv_name, common } => (Action::Requeue(pv_name), common),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn shared_flags_come_after_the_command() {
        let cli = Cli::try_parse_from([
            "provisioner-ctl",
            "queue",
            "requeue",
            "pvc-1",
            "--redis-url",
            "redis://r:1/0",
        ])
        .unwrap();
        let Command::Queue { action } = &cli.command else {
            panic!("queue")
        };
        let (action, common) = action.parts();
        assert_eq!(action, Action::Requeue("pvc-1"));
        assert_eq!(common.redis_url.as_str(), "redis://r:1/0");
        let cli = Cli::try_parse_from([
            "provisioner-ctl",
            "status",
            "-o",
            "json",
            "--provisioner-name",
            "a.io/x",
            "b.io/y",
        ])
        .unwrap();
        let Command::Status { args, common } = &cli.command else {
            panic!("status")
        };
        assert_eq!(args.output, OutputFormat::Json);
        assert_eq!(args.provisioner_names, ["b.io/y"]);
        assert_eq!(common.provisioner_name, "a.io/x");
    }

    #[test]
    fn only_the_deployment_flags_are_offered() {
        use clap::CommandFactory;
        let mut cli = Cli::command();
        let status = cli.find_subcommand_mut("status").unwrap();
        let help = status.render_long_help().to_string();
        for flag in [
            "--redis-url",
            "--redis-username",
            "--kubeconfig",
            "--leader-election-namespace",
        ] {
            assert!(
                help.contains(flag),
                "{flag} missing from status --help:\n{help}"
            );
        }
        for flag in [
            "--http-port",
            "--leader-election-lease-duration",
            "--log-format",
            "--worker-threads",
        ] {
            assert!(
                !help.contains(flag),
                "service-only {flag} in status --help:\n{help}"
            );
        }
        let err = Cli::try_parse_from(["provisioner-ctl", "queue", "list", "--http-port", "1"]);
        assert_eq!(
            err.unwrap_err().kind(),
            clap::error::ErrorKind::UnknownArgument
        );
    }
}
