//! client-go's `workqueue_*` metrics (const label `name`) for any queue of keys: call
//! [`WorkQueueMetrics::add`] when a key is scheduled, hold [`WorkQueueMetrics::start_processing`]
//! while working on it and call [`WorkQueueMetrics::retry`] on a requeue. Families and their
//! meanings: docs/decisions/0005-events-and-client-go-metrics.md.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use prometheus::core::{Collector, Desc};
use prometheus::proto::MetricFamily;
use prometheus::{Gauge, Histogram, HistogramOpts, IntCounter, IntGauge, Opts, Registry};
use tokio::time::Instant;

struct Inner {
    depth: IntGauge,
    adds: IntCounter,
    retries: IntCounter,
    queue_duration: Histogram,
    work_duration: Histogram,
    unfinished: Gauge,
    longest: Gauge,
    /// When each piece of work in progress started.
    running: Mutex<Vec<Instant>>,
    /// Keys added and not yet picked up, with when they were added.
    waiting: Mutex<HashMap<String, Instant>>,
}

/// The metrics of one named queue; cheap to clone (clones share the series).
#[derive(Clone)]
pub struct WorkQueueMetrics {
    inner: Arc<Inner>,
}

impl WorkQueueMetrics {
    /// Series for the queue `name`, not registered anywhere (tests; a queue
    /// nobody scrapes). See [`register`](Self::register).
    pub fn new(name: &str) -> Self {
        let opts = |n: &str, help: &str| Opts::new(n, help).const_label("name", name);
        // client-go's buckets for the queue and work durations: 10 ns · 10^i for i in 0..12
        // (10 ns to about 17 minutes).
        let buckets = prometheus::exponential_buckets(1e-8, 10.0, 12).expect("valid buckets");
        let hist = |n: &str, help: &str| {
            let opts = HistogramOpts::new(n, help).const_label("name", name);
            Histogram::with_opts(opts.buckets(buckets.clone())).expect("valid metric")
        };
        Self {
            inner: Arc::new(Inner {
                depth: IntGauge::with_opts(opts("workqueue_depth", "Current depth of workqueue")).expect("valid metric"),
                adds: IntCounter::with_opts(opts("workqueue_adds_total", "Total number of adds handled by workqueue")).expect("valid metric"),
                retries: IntCounter::with_opts(opts("workqueue_retries_total", "Total number of retries handled by workqueue")).expect("valid metric"),
                queue_duration: hist("workqueue_queue_duration_seconds", "How long in seconds an item stays in workqueue before being requested."),
                work_duration: hist("workqueue_work_duration_seconds", "How long in seconds processing an item from workqueue takes."),
                unfinished: Gauge::with_opts(opts("workqueue_unfinished_work_seconds", "How many seconds of work has done that is in progress and hasn't been observed by work_duration. Large values indicate stuck threads. One can deduce the number of stuck threads by observing the rate at which this increases.")).expect("valid metric"),
                longest: Gauge::with_opts(opts("workqueue_longest_running_processor_seconds", "How many seconds has the longest running processor for workqueue been running.")).expect("valid metric"),
                running: Mutex::default(),
                waiting: Mutex::default(),
            }),
        }
    }

    /// [`new`](Self::new) and register the series into `registry`. Panics if a queue of the same
    /// `name` is already registered there (a programming error caught by every test that builds the
    /// service).
    pub fn register(registry: &Registry, name: &str) -> Self {
        let metrics = Self::new(name);
        registry
            .register(Box::new(metrics.clone()))
            .expect("work-queue metrics registered twice");
        metrics
    }

    /// `key` was scheduled; counted once until it is picked up (client-go
    /// collapses a key already waiting).
    pub fn add(&self, key: &str) {
        let mut waiting = self.inner.waiting.lock().expect("not poisoned");
        if waiting.contains_key(key) {
            return;
        }
        waiting.insert(key.to_string(), Instant::now());
        self.inner.depth.set(waiting.len() as i64);
        self.inner.adds.inc();
    }

    /// `key` left the queue without being worked on (its object is gone), or a
    /// worker took it; returns when it was added.
    pub fn forget(&self, key: &str) -> Option<Instant> {
        let mut waiting = self.inner.waiting.lock().expect("not poisoned");
        let added = waiting.remove(key);
        self.inner.depth.set(waiting.len() as i64);
        added
    }

    /// A failed key was re-added with backoff (client-go `AddRateLimited`).
    pub fn retry(&self) {
        self.inner.retries.inc();
    }

    /// A worker starts on `key`: its wait since [`add`](Self::add) is observed, and
    /// the returned guard counts it as work in progress until dropped, then
    /// observes `workqueue_work_duration_seconds`.
    pub fn start_processing(&self, key: &str) -> Processing {
        if let Some(added) = self.forget(key) {
            self.inner
                .queue_duration
                .observe(added.elapsed().as_secs_f64());
        }
        let started = Instant::now();
        self.running().push(started);
        Processing {
            metrics: self.clone(),
            started,
        }
    }

    /// For a loop with `slots` concurrent workers that cannot see its own queue (kube-runtime's
    /// `Controller`): how long every slot has been busy, i.e. the age of the youngest running item
    /// when all `slots` run, else zero (a free slot means nothing waits for one).
    pub fn stalled_when_busy(&self, slots: usize) -> Duration {
        let running = self.running();
        if slots == 0 || running.len() < slots {
            return Duration::ZERO;
        }
        running.iter().max().map_or(Duration::ZERO, |s| s.elapsed())
    }

    fn running(&self) -> std::sync::MutexGuard<'_, Vec<Instant>> {
        self.inner.running.lock().expect("not poisoned")
    }

    /// Refresh the unfinished-work gauges from the work in progress.
    fn update_unfinished(&self) {
        let now = Instant::now();
        let (sum, longest) = self
            .running()
            .iter()
            .map(|s| now.saturating_duration_since(*s).as_secs_f64())
            .fold((0.0, 0.0_f64), |(sum, max), age| (sum + age, max.max(age)));
        self.inner.unfinished.set(sum);
        self.inner.longest.set(longest);
    }

    /// The seven client-go series, as collectors.
    fn parts(&self) -> [&dyn Collector; 7] {
        let i = &*self.inner;
        [
            &i.depth,
            &i.adds,
            &i.retries,
            &i.queue_duration,
            &i.work_duration,
            &i.unfinished,
            &i.longest,
        ]
    }
}

/// One key being processed; see [`WorkQueueMetrics::start_processing`].
pub struct Processing {
    metrics: WorkQueueMetrics,
    started: Instant,
}

impl Drop for Processing {
    fn drop(&mut self) {
        let mut running = self.metrics.running();
        // Equal start times are interchangeable: removing any one of them is exact.
        if let Some(i) = running.iter().position(|s| *s == self.started) {
            running.swap_remove(i);
        }
        let worked = self.started.elapsed().as_secs_f64();
        self.metrics.inner.work_duration.observe(worked);
    }
}

impl Collector for WorkQueueMetrics {
    fn desc(&self) -> Vec<&Desc> {
        self.parts().into_iter().flat_map(|c| c.desc()).collect()
    }

    fn collect(&self) -> Vec<MetricFamily> {
        self.update_unfinished();
        self.parts().into_iter().flat_map(|c| c.collect()).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::metrics::render;

    fn line<'a>(text: &'a str, prefix: &str) -> &'a str {
        text.lines()
            .find(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in\n{text}"))
    }

    /// The value of each series `<name>{name="claims"}` in `text`.
    fn values(text: &str, names: &[&str]) -> Vec<String> {
        let value = |name: &str| {
            let l = line(text, &format!("{name}{{name=\"claims\"}} "));
            l.rsplit(' ').next().unwrap().to_string()
        };
        names.iter().map(|n| value(n)).collect()
    }

    #[tokio::test(start_paused = true)]
    async fn client_go_names_with_the_queue_name_label() {
        let registry = Registry::new();
        let m = WorkQueueMetrics::register(&registry, "claims");
        m.add("a");
        m.add("b");
        m.add("a"); // collapsed: "a" is still waiting
        m.add("c");
        m.forget("c");
        m.retry();
        assert_eq!(
            line(&render(&registry), "workqueue_depth{"),
            r#"workqueue_depth{name="claims"} 2"#
        );
        tokio::time::advance(Duration::from_millis(250)).await;
        let first = m.start_processing("a");
        tokio::time::advance(Duration::from_secs(3)).await;
        let _second = m.start_processing("resynced, never added");
        tokio::time::advance(Duration::from_secs(1)).await;
        let text = render(&registry);
        // 4 s + 1 s of work in progress, the oldest running for 4 s.
        assert_eq!(
            values(
                &text,
                &[
                    "workqueue_depth",
                    "workqueue_adds_total",
                    "workqueue_retries_total",
                    "workqueue_queue_duration_seconds_sum",
                    "workqueue_unfinished_work_seconds",
                    "workqueue_longest_running_processor_seconds"
                ]
            ),
            ["1", "3", "1", "0.25", "5", "4"]
        );
        drop(first);
        let text = render(&registry);
        assert_eq!(
            values(
                &text,
                &[
                    "workqueue_work_duration_seconds_sum",
                    "workqueue_longest_running_processor_seconds"
                ]
            ),
            ["4", "1"]
        );
    }
}
