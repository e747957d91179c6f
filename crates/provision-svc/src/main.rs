//! provision-svc: parse flags, set up tracing, run the service with the
//! backend chosen by `--backend`.

use clap::Parser;
use provision_svc::config::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    common::service::telemetry::init(
        cli.provision.common.log_format,
        &cli.provision.common.log_level,
    );
    let backend = cli.backend.build().map_err(anyhow::Error::msg)?;
    provision_svc::run(cli.provision, backend.provisioner()).await
}
