//! Prometheus metrics shared by the services. The provision and delete families
//! keep the seed's names and `class` label so existing dashboards keep working.

use prometheus::{
    Encoder, Histogram, HistogramOpts, HistogramVec, IntCounter, IntCounterVec, IntGauge,
    IntGaugeVec, Opts, Registry, TextEncoder,
};

/// Register `collector` into `registry`, panicking on a duplicate name (a
/// programming error caught by every test that builds the service).
pub fn register<C: prometheus::core::Collector + Clone + 'static>(
    registry: &Registry,
    collector: C,
) -> C {
    registry
        .register(Box::new(collector.clone()))
        .expect("metric registered twice");
    collector
}

/// The seed's three families of one operation, by StorageClass (`class`): successes, failed
/// attempts and the seconds a successful one took (`controller_persistentvolumeclaim_provision_*`,
/// `controller_persistentvolume_delete_*`).
#[derive(Clone)]
pub struct SeedMetrics {
    /// Operations that succeeded.
    pub total: IntCounterVec,
    /// Failed attempts.
    pub failed_total: IntCounterVec,
    /// Seconds a successful operation took.
    pub duration_seconds: HistogramVec,
}

/// The provisioning families ([`SeedMetrics`]).
pub type ProvisionMetrics = SeedMetrics;
/// The deletion families ([`SeedMetrics`]).
pub type DeleteMetrics = SeedMetrics;

impl SeedMetrics {
    /// Register the three families as `names` (name, help) of total, failed total and duration.
    pub fn with_names(registry: &Registry, names: [(&str, &str); 3]) -> Self {
        let [(total, total_help), (failed, failed_help), (duration, duration_help)] = names;
        Self {
            total: counter_vec(registry, total, total_help, &["class"]),
            failed_total: counter_vec(registry, failed, failed_help, &["class"]),
            duration_seconds: histogram_vec(registry, duration, duration_help, &["class"]),
        }
    }

    /// The seed's `<prefix>_total`, `_failed_total` and `_duration_seconds` with its help texts
    /// (`verb`: provision/delete, `done`: provisioned/deleted, `noun`: provisioning/deletion).
    fn seed(registry: &Registry, prefix: &str, [verb, done, noun]: [&str; 3]) -> Self {
        let by_class = "Broken down by storage class name.";
        Self::with_names(
            registry,
            [
                (&format!("{prefix}_total"), &format!("Total number of persistent volumes {done} successfully. {by_class}")),
                (&format!("{prefix}_failed_total"), &format!("Total number of persistent volume {verb} failed attempts. {by_class}")),
                (&format!("{prefix}_duration_seconds"), &format!("Latency in seconds to {verb} persistent volumes. Failed {noun} attempts are ignored. {by_class}")),
            ],
        )
    }

    /// The provisioning families, registered into `registry`.
    pub fn provision(registry: &Registry) -> Self {
        let prefix = "controller_persistentvolumeclaim_provision";
        let words = ["provision", "provisioned", "provisioning"];
        Self::seed(registry, prefix, words)
    }

    /// The deletion families, registered into `registry`.
    pub fn delete(registry: &Registry) -> Self {
        let words = ["delete", "deleted", "deletion"];
        Self::seed(registry, "controller_persistentvolume_delete", words)
    }

    /// Count a success of `class` that took `seconds`.
    pub fn succeeded(&self, class: &str, seconds: f64) {
        self.total.with_label_values(&[class]).inc();
        let duration = self.duration_seconds.with_label_values(&[class]);
        duration.observe(seconds);
    }

    /// Count a failed attempt of `class`.
    pub fn failed(&self, class: &str) {
        self.failed_total.with_label_values(&[class]).inc();
    }
}

/// A gauge family with `labels`, registered into `registry`.
pub fn gauge_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntGaugeVec {
    let family = IntGaugeVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, family)
}

/// A counter registered into `registry`.
pub fn counter(registry: &Registry, name: &str, help: &str) -> IntCounter {
    register(registry, IntCounter::new(name, help).expect("valid metric"))
}

/// A counter family with `labels`, registered into `registry`.
pub fn counter_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> IntCounterVec {
    let family = IntCounterVec::new(Opts::new(name, help), labels).expect("valid metric");
    register(registry, family)
}

/// A histogram family (default buckets, seconds) with `labels`, registered into `registry`.
pub fn histogram_vec(registry: &Registry, name: &str, help: &str, labels: &[&str]) -> HistogramVec {
    let family = HistogramVec::new(HistogramOpts::new(name, help), labels).expect("valid metric");
    register(registry, family)
}

/// Register the `process_*` families (CPU, memory, fds, start time, threads), read
/// from `/proc` at each scrape (Linux only), into `registry`.
pub fn register_process_collector(registry: &Registry) {
    #[cfg(target_os = "linux")]
    registry
        .register(Box::new(
            prometheus::process_collector::ProcessCollector::for_self(),
        ))
        .expect("process collector registered twice");
    #[cfg(not(target_os = "linux"))]
    let _ = registry;
}

/// A plain gauge registered into `registry`.
pub fn gauge(registry: &Registry, name: &str, help: &str) -> IntGauge {
    register(registry, IntGauge::new(name, help).expect("valid metric"))
}

/// A plain histogram (default buckets, seconds) registered into `registry`.
pub fn seconds_histogram(registry: &Registry, name: &str, help: &str) -> Histogram {
    let histogram = Histogram::with_opts(HistogramOpts::new(name, help)).expect("valid metric");
    register(registry, histogram)
}

/// Render `registry` in the Prometheus text exposition format (version 0.0.4).
pub fn render(registry: &Registry) -> String {
    let mut buf = Vec::new();
    TextEncoder::new()
        .encode(&registry.gather(), &mut buf)
        .expect("text encoding never fails");
    String::from_utf8(buf).expect("prometheus text is UTF-8")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seed_names_and_class_label_are_exposed() {
        let registry = Registry::new();
        let p = SeedMetrics::provision(&registry);
        let d = SeedMetrics::delete(&registry);
        p.total.with_label_values(&["fast"]).inc();
        p.duration_seconds
            .with_label_values(&["fast"])
            .observe(0.25);
        d.failed_total.with_label_values(&["slow"]).inc_by(2);
        for m in [&p, &d] {
            m.total.with_label_values(&["slow"]);
            m.failed_total.with_label_values(&["slow"]);
            m.duration_seconds.with_label_values(&["slow"]);
        }
        let text = render(&registry);
        assert!(
            text.contains("controller_persistentvolumeclaim_provision_total{class=\"fast\"} 1\n"),
            "{text}"
        );
        assert!(text.contains("controller_persistentvolumeclaim_provision_duration_seconds_sum{class=\"fast\"} 0.25\n"), "{text}");
        assert!(
            text.contains("controller_persistentvolume_delete_failed_total{class=\"slow\"} 2\n"),
            "{text}"
        );
        assert!(text.contains(
            "# TYPE controller_persistentvolumeclaim_provision_duration_seconds histogram"
        ));
        // The seed's help texts, word for word.
        for help in [
            "controller_persistentvolumeclaim_provision_total Total number of persistent volumes provisioned successfully. Broken down by storage class name.",
            "controller_persistentvolumeclaim_provision_failed_total Total number of persistent volume provision failed attempts. Broken down by storage class name.",
            "controller_persistentvolumeclaim_provision_duration_seconds Latency in seconds to provision persistent volumes. Failed provisioning attempts are ignored. Broken down by storage class name.",
            "controller_persistentvolume_delete_total Total number of persistent volumes deleted successfully. Broken down by storage class name.",
            "controller_persistentvolume_delete_failed_total Total number of persistent volume delete failed attempts. Broken down by storage class name.",
            "controller_persistentvolume_delete_duration_seconds Latency in seconds to delete persistent volumes. Failed deletion attempts are ignored. Broken down by storage class name.",
        ] {
            assert!(text.contains(&format!("# HELP {help}\n")), "{help}\n{text}");
        }
    }

    #[cfg(target_os = "linux")]
    #[test]
    fn process_families_are_exported() {
        let registry = Registry::new();
        register_process_collector(&registry);
        let text = render(&registry);
        for family in [
            "process_cpu_seconds_total",
            "process_resident_memory_bytes",
            "process_open_fds",
            "process_start_time_seconds",
        ] {
            let value: f64 = text
                .lines()
                .find_map(|l| l.strip_prefix(&format!("{family} ")))
                .unwrap_or_else(|| panic!("no {family} in\n{text}"))
                .parse()
                .unwrap();
            assert!(value >= 0.0, "{family} {value}");
        }
        let rss: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("process_resident_memory_bytes "))
            .unwrap()
            .parse()
            .unwrap();
        assert!(
            rss > 1e6,
            "a test process has more than 1 MB resident: {rss}"
        );
    }
}
