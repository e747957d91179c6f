//! `provisioner-ctl`: see the library (`provisioner_ctl`) for the commands.

use clap::Parser;
use provisioner_ctl::{cli, queue, run_status};

#[tokio::main(flavor = "current_thread")]
async fn main() -> std::process::ExitCode {
    let cli = cli::Cli::parse();
    let result = match &cli.command {
        cli::Command::Status { args, common } => run_status(common, args).await,
        cli::Command::Queue { action } => queue::run(action).await,
    };
    if let Err(err) = result {
        eprintln!(
            "provisioner-ctl: {}",
            common::runtime::telemetry::error_chain(err.as_ref())
        );
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}
