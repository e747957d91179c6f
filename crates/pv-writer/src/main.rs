//! `pv-writer`: drains the durable PV-write queue into the API server.
//! See the library docs (`pv_writer`) for behaviour and flags; this binary
//! adds `--backend` and the built-in backends' flags (the backend whose own
//! check every queued PV must pass).

fn main() -> std::process::ExitCode {
    common::runtime::alloc::block_on_service(async_main())
}

async fn async_main() -> std::process::ExitCode {
    let (cli, backend) = backends::parse::<pv_writer::Cli>();
    common::runtime::telemetry::init(cli.common.log_format, &cli.common.log_level);
    let service = matches!(cli.command, None | Some(pv_writer::Command::Run));
    let result = match backend.build() {
        Ok(backend) => pv_writer::run(cli, backend).await,
        Err(err) => Err(anyhow::Error::msg(err)),
    };
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            let error = common::runtime::telemetry::error_chain(err.as_ref());
            // Once: a log line for the service, a plain line for an operator's command.
            if service {
                tracing::error!(error, "pv-writer failed");
            } else {
                eprintln!("pv-writer: {error}");
            }
            std::process::ExitCode::FAILURE
        }
    }
}
