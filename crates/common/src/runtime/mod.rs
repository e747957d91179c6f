//! The service runtime every service binary is built on.
//!
//! * [`config`] — flags shared by all services, with environment twins;
//! * [`api_metrics`] — client-go's `rest_client_*` API request metrics (tower layer);
//! * [`api_reachability`] — the API server unreachable / reachable again, logged once per change;
//! * [`kube_client`] — client from kubeconfig/in-cluster with a client-side rate limit;
//! * [`leader`] — Lease leader election with a renew-deadline watchdog;
//! * [`http`], [`metrics`] — `/metrics`, `/healthz`, `/readyz` and the seed's metric families;
//! * [`telemetry`] — tracing subscriber set-up (`--log-format`, `--log-level`);
//! * [`shutdown`] — SIGTERM/SIGINT to a cancellation token;
//! * [`health`] — the work-loop heartbeat and Lease-renewal checks behind `/healthz`;
//! * [`frame`] — the service frame: leader election, HTTP, signals, graceful shutdown;
//! * [`control`] — the one control-loop shape: kube-runtime's `Controller` over a reflector;
//! * [`alloc`] — process start-up: glibc malloc arenas capped, then the tokio runtime.

pub mod alloc;
pub mod api_metrics;
pub mod api_reachability;
pub mod config;
pub mod control;
pub mod frame;
pub mod health;
pub mod http;
pub mod kube_client;
pub mod leader;
pub mod metrics;
pub mod shutdown;
pub mod telemetry;
