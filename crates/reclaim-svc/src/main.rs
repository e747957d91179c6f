//! reclaim-svc: deletes released volumes of our provisioner and keeps the
//! provisioner finalizer on its PVs in line. See the library for the behaviour.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reclaim_svc::Cli::parse();
    common::service::telemetry::init(cli.common.log_format, &cli.common.log_level);
    let backend = cli.backend.build().map_err(anyhow::Error::msg)?;
    reclaim_svc::run_with_backend(cli.common, cli.retry, cli.reclaim, backend).await
}
