//! The controller toolkit: building blocks of the services' control loops.
//!
//! * [`workqueue_metrics`] — client-go's `workqueue_*` metrics for any queue of keys;
//! * [`retry`] — per-item backoff, overall token bucket and failure thresholds;
//! * [`cache`] — trimming objects before they enter reflector caches;
//! * [`events`] — Kubernetes events via kube-runtime's recorder;
//! * [`list`] — live lists in pages, as client-go's pager;
//! * [`time`] — [`time::now_ms`], the one wall-clock timestamp (ms since the Unix epoch).
//!
//! The per-operation deadline (`--provision-timeout`, `--deletion-timeout`)
//! is `provisioner_api::deadline`: backends see it too.

pub mod cache;
pub mod events;
pub mod list;
pub mod retry;
pub mod time;
pub mod workqueue_metrics;
