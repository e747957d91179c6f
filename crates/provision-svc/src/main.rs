//! provision-svc: parse flags (the service's and `--backend` with the
//! built-in backends' flags), set up tracing, run the service with the chosen
//! backend.

fn main() -> anyhow::Result<()> {
    common::runtime::alloc::block_on_service(async {
        let (cli, backend) = backends::parse::<provision_svc::Cli>();
        common::runtime::telemetry::init(cli.common.log_format, &cli.common.log_level);
        let backend = backend.build().map_err(anyhow::Error::msg)?;
        provision_svc::run(cli, backend).await
    })
}
