//! Shared runtime of the provisioner services.
//!
//! * [`provisioner`] — the backend contract ([`Provisioner`]) and its optional
//!   capabilities, with the seed's defaults;
//! * [`backend`] — built-in backends (`hostpath`);
//! * [`cache`] — trimming objects before they enter reflector caches;
//! * [`config`] — flags shared by all services, with environment twins;
//! * [`api_metrics`] — client-go's `rest_client_*` API request metrics (tower layer);
//! * [`kube_client`] — client from kubeconfig/in-cluster with a client-side rate limit;
//! * [`leader`] — Lease leader election with a renew-deadline watchdog;
//! * [`http`], [`metrics`] — `/metrics`, `/healthz`, `/readyz` and the seed's metric families;
//! * [`retry`] — per-item backoff, overall token bucket and failure thresholds;
//! * [`events`] — Kubernetes events via kube-runtime's recorder;
//! * [`queue`] — the durable Redis PV-write queue shared by provision-svc and pv-writer;
//! * [`queue_auth`] — HMAC authenticity of queue entries and the queue-key flags;
//! * [`intents`] — durable provisioning intents in Redis;
//! * [`orphan_report`] — the last orphan sweep's report in Redis (for `pv-writer status`);
//! * [`runtime`] — the service frame: leader election, HTTP, signals, graceful shutdown;
//! * [`time`] — [`time::now_ms`], the one wall-clock timestamp (ms since the Unix epoch);
//! * [`workqueue`] — the de-duplicating claim/volume work queue (client-go semantics).

pub mod api_metrics;
pub mod backend;
pub mod cache;
pub mod config;
pub mod deadline;
pub mod events;
pub mod http;
pub mod intents;
pub mod kube_client;
pub mod leader;
pub mod metrics;
pub mod orphan_report;
pub mod provisioner;
pub mod queue;
pub mod queue_auth;
pub mod redis_store;
pub mod retry;
pub mod runtime;
pub mod shutdown;
pub mod telemetry;
#[cfg(test)]
mod test_redis;
pub mod time;
pub mod workqueue;

pub use provisioner::Provisioner;
