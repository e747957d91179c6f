//! provision-svc: parse flags (the service's and `--backend` with the
//! built-in backends' flags), set up tracing, run the service with the chosen
//! backend.

fn main() -> anyhow::Result<()> {
    backends::service_main(provision_svc::SPEC, provision_svc::run)
}
