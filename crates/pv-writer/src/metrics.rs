//! pv-writer's Prometheus families, with the seed's provisioning families
//! (`controller_persistentvolumeclaim_provision_*`): pv-writer stores the PV.

use common::runtime::metrics::{
    counter, counter_vec, gauge, register, seconds_histogram, ProvisionMetrics,
};
use prometheus::{Gauge, Histogram, IntCounter, IntCounterVec, IntGauge};

/// The registry type [`WriterMetrics::register`] takes (re-exported for embedders).
pub use prometheus::Registry;

/// Outcome label values of `pv_writer_writes_total`.
pub mod outcome {
    /// The PV was created.
    pub const CREATED: &str = "created";
    /// The PV already existed for the same claim uid (an earlier attempt's write).
    pub const ALREADY_EXISTS: &str = "already_exists";
    /// The entry was dead-lettered (refused by the API server, or unreadable).
    pub const DEAD_LETTER: &str = "dead_letter";
    /// A transient failure; the entry is retried.
    pub const RETRY: &str = "retry";
}

/// The queue and write metrics.
#[derive(Clone)]
pub struct WriterMetrics {
    /// The seed's families by `class`: PVs stored, time from the claim's first
    /// provision attempt to the PV stored, entries dead-lettered (`class=""`
    /// when the class is not trusted: unreadable or failed the HMAC check).
    pub provision: ProvisionMetrics,
    /// `pv_writer_queue_depth`: pending entries (due + in flight), dead letters excluded.
    pub depth: IntGauge,
    /// `pv_writer_queue_oldest_pending_age_seconds`: age of the oldest pending entry.
    pub oldest_age_seconds: Gauge,
    /// `pv_writer_queue_dead_letters`: entries in the dead-letter set.
    pub dead_letters: IntGauge,
    /// `pv_writer_dead_letters_total{reason}`: entries dead-lettered by this replica.
    pub dead_lettered_total: IntCounterVec,
    /// `pv_writer_writes_total{outcome}`: processed entries by outcome (see [`outcome`]).
    pub writes_total: IntCounterVec,
    /// `pv_writer_write_duration_seconds`: duration of one PV write (create, and
    /// the `get` after `AlreadyExists`), every outcome.
    pub write_duration_seconds: Histogram,
    /// `pv_writer_retries_total`: retries scheduled after transient failures.
    pub retries_total: IntCounter,
    /// `pv_writer_refused_entries_total{reason}`: queue entries refused by the
    /// checks of [`crate::checks`] (never written, dead-lettered).
    pub refused_entries_total: IntCounterVec,
    /// `pv_writer_fenced_operations_total`: takes and settlements this replica
    /// attempted after a newer leader term began (refused by Redis).
    pub fenced_operations_total: IntCounter,
}

impl WriterMetrics {
    /// Create and register every family into `registry`.
    pub fn register(registry: &Registry) -> Self {
        Self {
            provision: ProvisionMetrics::provision(registry),
            depth: gauge(registry, "pv_writer_queue_depth", "Pending PV writes in the durable queue (due or in flight), dead letters excluded."),
            oldest_age_seconds: register(registry, Gauge::new("pv_writer_queue_oldest_pending_age_seconds", "Seconds since the oldest pending PV write was enqueued (0 when the queue is empty).").expect("valid metric")),
            dead_letters: gauge(registry, "pv_writer_queue_dead_letters", "PV writes in the dead-letter set, waiting for an operator."),
            dead_lettered_total: counter_vec(registry, "pv_writer_dead_letters_total", "PV writes moved to the dead-letter set by this replica, by reason.", &["reason"]),
            writes_total: counter_vec(registry, "pv_writer_writes_total", "Processed PV writes by outcome: created, already_exists, dead_letter, retry.", &["outcome"]),
            write_duration_seconds: seconds_histogram(registry, "pv_writer_write_duration_seconds", "Duration in seconds of one PV write against the API server, every outcome."),
            retries_total: counter(registry, "pv_writer_retries_total", "Retries scheduled after transient PV write failures."),
            refused_entries_total: counter_vec(registry, "pv_writer_refused_entries_total", "Queue entries refused before writing (not signed, bad signature, PV not one provision-svc makes), by reason.", &["reason"]),
            fenced_operations_total: counter(registry, "pv_writer_fenced_operations_total", "Queue takes and settlements refused because a newer pv-writer leader term began."),
        }
    }
}

/// Add one to `family`'s series `label`.
pub(crate) fn inc(family: &IntCounterVec, label: &str) {
    family.with_label_values(&[label]).inc();
}
