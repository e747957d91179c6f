//! reclaim-svc: deletes released volumes of our provisioner and keeps the
//! provisioner finalizer on its PVs in line. See the library for the behaviour;
//! this binary adds `--backend` and the built-in backends' flags.

fn main() -> anyhow::Result<()> {
    backends::service_main(reclaim_svc::SPEC, reclaim_svc::run)
}
