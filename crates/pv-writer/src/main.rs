//! pv-writer: drains the durable PV-write queue into the API server. See the
//! library for the behaviour; this binary adds `--backend` and the built-in
//! backends' flags (the backend whose own check every queued PV must pass).

fn main() -> anyhow::Result<()> {
    common::runtime::alloc::block_on_service(async {
        let (cli, backend) = backends::parse::<pv_writer::Cli>();
        common::runtime::telemetry::init(cli.common.log_format, &cli.common.log_level);
        let backend = backend.build().map_err(anyhow::Error::msg)?;
        pv_writer::run(cli, backend).await
    })
}
