//! provision-svc: parse flags (the service's and `--backend` with the
//! built-in backends' flags), set up tracing, run the service with the chosen
//! backend.

use provision_svc::config::Cli;

fn main() -> anyhow::Result<()> {
    common::runtime::alloc::block_on_service(async {
        let (cli, backend) = backends::parse::<Cli>();
        common::runtime::telemetry::init(
            cli.provision.common.log_format,
            &cli.provision.common.log_level,
        );
        let backend = backend.build().map_err(anyhow::Error::msg)?;
        provision_svc::run(cli.provision, backend).await
    })
}
