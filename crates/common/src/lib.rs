//! Shared runtime of the provisioner services, organised by concern (each
//! module imports only the ones below it: `runtime` → `handoff` → `kube`):
//!
//! * [`handoff`] — the Redis hand-off: the Redis PV-write queue, provisioning
//!   intents, queue-entry authenticity and the Redis connection (the only code
//!   that touches Redis);
//! * [`runtime`] — the service runtime: flags, kube client, Lease leader
//!   election, `/metrics`/`/healthz`/`/readyz`, telemetry, signals and the
//!   service frame;
//! * [`kube`] — the controller toolkit: the de-duplicating work queue,
//!   retry policy, cache trimming, events, the wall clock.
//!
//! The backend contract (the `Provisioner` trait, options, states, errors, the
//! per-operation deadline) is the `provisioner-api` crate; the built-in
//! backends are their own crates, wired in by each service's `main.rs`.

pub mod handoff;
pub mod kube;
pub mod runtime;
