//! reclaim-svc: deletes released volumes of our provisioner and keeps the
//! provisioner finalizer on its PVs in line. See the library for the behaviour;
//! this binary adds `--backend` and the built-in backends' flags.

fn main() -> anyhow::Result<()> {
    backends::service_main(|cli: &reclaim_svc::Cli| &cli.common, reclaim_svc::run)
}
