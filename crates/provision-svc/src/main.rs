//! provision-svc: parse flags, set up tracing, run the service with the hostpath backend.

use std::sync::Arc;

use clap::Parser;
use common::backend::hostpath::HostPath;
use provision_svc::config::Cli;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    common::telemetry::init(
        cli.provision.common.log_format,
        &cli.provision.common.log_level,
    );
    let backend = Arc::new(HostPath::from_args(&cli.hostpath));
    provision_svc::run(cli.provision, backend).await
}
