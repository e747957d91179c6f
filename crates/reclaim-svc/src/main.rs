//! reclaim-svc: deletes released volumes of our provisioner and keeps the
//! provisioner finalizer on its PVs in line. See the library for the behaviour;
//! this binary adds `--backend` and the built-in backends' flags.

fn main() -> anyhow::Result<()> {
    common::runtime::alloc::block_on_service(async {
        let (cli, backend) = backends::parse::<reclaim_svc::Cli>();
        common::runtime::telemetry::init(cli.common.log_format, &cli.common.log_level);
        let backend = backend.build().map_err(anyhow::Error::msg)?;
        reclaim_svc::run(cli, backend).await
    })
}
