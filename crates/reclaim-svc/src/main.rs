//! reclaim-svc: deletes released volumes of our provisioner and keeps the
//! provisioner finalizer on its PVs in line. See the library for the behaviour.

use std::sync::Arc;

use clap::Parser;
use common::backend::hostpath::delete::volume_for_directory;
use common::backend::hostpath::HostPath;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let cli = reclaim_svc::Cli::parse();
    common::telemetry::init(cli.common.log_format, &cli.common.log_level);
    let backend = Arc::new(HostPath::from_args(&cli.hostpath));
    let for_orphans = Arc::clone(&backend);
    let orphan_pv: reclaim_svc::sweep::OrphanPvFn =
        Arc::new(move |name: &str| volume_for_directory(&for_orphans, name));
    reclaim_svc::run_with_orphan_pv(cli.common, cli.retry, cli.reclaim, backend, Some(orphan_pv))
        .await
}
