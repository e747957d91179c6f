//! provisioner-ctl: the operator's commands for a split-provisioner, reading
//! Redis (and the Leases) directly: [`status`] and [`queue`] (`list`, `dead`,
//! `requeue <PV>`); flags in [`cli`].

pub mod cli;
pub mod queue;
pub mod status;
