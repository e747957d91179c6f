//! `pv-writer`: drains the durable PV-write queue into the API server.
//! See the library docs (`pv_writer`) for behaviour and flags.

use clap::Parser;

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let cli = pv_writer::Cli::parse();
    common::service::telemetry::init(cli.common.log_format, &cli.common.log_level);
    match pv_writer::run(cli).await {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            tracing::error!(error = format!("{err:#}"), "pv-writer failed");
            eprintln!("pv-writer: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
