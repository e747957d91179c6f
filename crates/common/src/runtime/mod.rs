//! The service runtime every service binary is built on: shared flags ([`config`]),
//! the kube client, Lease election, `/metrics` `/healthz` `/readyz`, telemetry, the
//! service frame ([`frame`]) and the one control-loop shape ([`control`]).

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
