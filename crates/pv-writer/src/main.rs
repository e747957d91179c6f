//! pv-writer: drains the durable PV-write queue into the API server. See the
//! library for the behaviour; this binary adds `--backend` and the built-in
//! backends' flags (the backend whose own check every queued PV must pass).

fn main() -> anyhow::Result<()> {
    backends::service_main(pv_writer::SPEC, pv_writer::run)
}
