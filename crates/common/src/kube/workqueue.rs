//! A de-duplicating work queue with client-go workqueue semantics, as the seed's
//! claim queue relies on them (provision-svc's claims; reclaim-svc runs on
//! kube-runtime's `Controller` instead, see below):
//!
//! * a key queued twice before a worker takes it is processed once;
//! * a key is never handed to two workers at once — a key added while it is
//!   being processed is queued again when its worker calls [`WorkQueue::done`];
//! * [`WorkQueue::add_after`] queues a key after a delay (the retry path);
//! * after [`WorkQueue::shut_down`], [`WorkQueue::get`] returns `None` and adds
//!   are ignored, so workers finish their in-flight item and stop;
//! * with [`WorkQueue::with_metrics`], it reports client-go's `workqueue_*`
//!   families ([`crate::kube::workqueue_metrics`]), and [`WorkQueue::stalled_for`]
//!   tells a liveness heartbeat whether workers still take keys.
//!
//! Why hand-written, and only for provision-svc: the seed keys claims by uid
//! and keeps processing a claim that is provisioning in the background after
//! the claim object is gone from the cache (seed `claimsInProgress`);
//! kube-runtime's `Controller` drops every request whose object is missing
//! from its store. That is right for PVs, which are keyed by name and have
//! nothing left to do once gone, so reclaim-svc uses `Controller`
//! (reconcile + error policy). provision-svc still feeds this queue from
//! kube-runtime's watcher and reflector stores.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio::time::Instant;

use crate::kube::workqueue_metrics::{Processing, WorkQueueMetrics};

struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    /// Keys being processed, with their work-duration guard (metrics only).
    processing: HashMap<String, Option<Processing>>,
    /// When each waiting key was added (queue duration, stall detection).
    added_at: HashMap<String, Instant>,
    /// When a worker last took a key (or the queue was created).
    last_taken: Instant,
    shutting_down: bool,
}

impl Default for State {
    fn default() -> Self {
        Self {
            queue: VecDeque::new(),
            dirty: HashSet::new(),
            processing: HashMap::new(),
            added_at: HashMap::new(),
            last_taken: Instant::now(),
            shutting_down: false,
        }
    }
}

#[derive(Default)]
struct Inner {
    state: Mutex<State>,
    notify: Notify,
    metrics: Option<WorkQueueMetrics>,
}

/// The queue; cheap to clone (all clones share one queue).
#[derive(Clone, Default)]
pub struct WorkQueue {
    inner: Arc<Inner>,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty queue reporting to `metrics` (see [`crate::kube::workqueue_metrics`]).
    pub fn with_metrics(metrics: WorkQueueMetrics) -> Self {
        Self {
            inner: Arc::new(Inner {
                metrics: Some(metrics),
                ..Inner::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.inner.state.lock().expect("work queue poisoned")
    }

    /// Queue `key` at the tail and record when it was added.
    fn push(&self, s: &mut State, key: &str) {
        s.queue.push_back(key.to_string());
        s.added_at
            .entry(key.to_string())
            .or_insert_with(Instant::now);
        if let Some(m) = &self.inner.metrics {
            m.set_depth(s.queue.len());
        }
    }

    /// Queue `key` unless it is already waiting; if a worker holds it, it is
    /// queued again once that worker calls [`done`](Self::done).
    pub fn add(&self, key: &str) {
        let mut s = self.state();
        if s.shutting_down || !s.dirty.insert(key.to_string()) {
            return;
        }
        if let Some(m) = &self.inner.metrics {
            m.add();
        }
        if s.processing.contains_key(key) {
            return;
        }
        self.push(&mut s, key);
        drop(s);
        self.inner.notify.notify_one();
    }

    /// Re-queue a key that failed, after its backoff `delay` (client-go
    /// `AddRateLimited`): as [`add_after`](Self::add_after), and counted in
    /// `workqueue_retries_total`.
    pub fn add_rate_limited(&self, key: &str, delay: Duration) {
        if let Some(m) = &self.inner.metrics {
            m.retry();
        }
        self.add_after(key, delay);
    }

    /// Queue `key` after `delay` (immediately when zero). Dropped if the queue
    /// shuts down meanwhile.
    pub fn add_after(&self, key: &str, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            queue.add(&key);
        });
    }

    /// Wait for the next key and mark it as being processed; `None` once the
    /// queue is shut down.
    pub async fn get(&self) -> Option<String> {
        loop {
            let notified = self.inner.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state();
                if s.shutting_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    let now = Instant::now();
                    s.last_taken = now;
                    let added = s.added_at.remove(&key).unwrap_or(now);
                    let guard = self.inner.metrics.as_ref().map(|m| {
                        m.set_depth(s.queue.len());
                        m.queued_for(now.saturating_duration_since(added));
                        m.start_processing()
                    });
                    s.processing.insert(key.clone(), guard);
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        // Pass the wake-up on so idle workers pick up the rest.
                        self.inner.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Mark `key` as no longer being processed; re-queue it if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut s = self.state();
        s.processing.remove(key);
        if s.dirty.contains(key) && !s.shutting_down {
            self.push(&mut s, key);
            drop(s);
            self.inner.notify.notify_one();
        }
    }

    /// Stop handing out keys; waiting [`get`](Self::get) calls return `None`.
    pub fn shut_down(&self) {
        self.state().shutting_down = true;
        self.inner.notify.notify_waiters();
    }

    /// Keys waiting to be processed (not counting those being processed).
    pub fn len(&self) -> usize {
        self.state().queue.len()
    }

    /// Whether no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// How long keys have been waiting without any worker taking one: zero
    /// when no key waits (an idle queue is not stalled), else the time since
    /// the later of the last take and the oldest waiting key's add. A growing
    /// value means every worker is stuck on its current key.
    pub fn stalled_for(&self) -> Duration {
        let s = self.state();
        let Some(oldest) = s.queue.front().and_then(|k| s.added_at.get(k)) else {
            return Duration::ZERO;
        };
        Instant::now().saturating_duration_since((*oldest).max(s.last_taken))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn duplicates_are_collapsed() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("a");
        q.add("b");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        assert_eq!(q.get().await.as_deref(), Some("b"));
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn a_key_added_while_processing_is_requeued_on_done() {
        let q = WorkQueue::new();
        q.add("a");
        let k = q.get().await.unwrap();
        q.add("a");
        q.add("a");
        assert_eq!(q.len(), 0, "not handed out twice concurrently");
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_waits_and_shutdown_releases_waiters() {
        let q = WorkQueue::new();
        q.add_after("late", Duration::from_secs(15));
        assert!(q.is_empty());
        let start = tokio::time::Instant::now();
        assert_eq!(q.get().await.as_deref(), Some("late"));
        assert_eq!(start.elapsed(), Duration::from_secs(15));

        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
        q.add("ignored");
        assert!(q.is_empty());
        assert_eq!(q.get().await, None);
    }

    #[tokio::test(start_paused = true)]
    async fn stalled_for_grows_only_while_keys_wait_untaken_and_metrics_follow() {
        let registry = prometheus::Registry::new();
        let q = WorkQueue::with_metrics(WorkQueueMetrics::register(&registry, "claims"));
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(q.stalled_for(), Duration::ZERO, "idle is not stalled");
        q.add("a");
        q.add("a");
        q.add("b");
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(q.stalled_for(), Duration::from_secs(5));
        let a = q.get().await.unwrap();
        assert_eq!(q.stalled_for(), Duration::ZERO, "a worker just took a key");
        tokio::time::advance(Duration::from_secs(7)).await;
        assert_eq!(q.stalled_for(), Duration::from_secs(7), "b waits untaken");
        q.done(&a);
        q.add_rate_limited("a", Duration::ZERO);
        let text = crate::runtime::metrics::render(&registry);
        let value = |family: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix(&format!("{family}{{name=\"claims\"}} ")))
                .unwrap_or_else(|| panic!("{family} in\n{text}"))
                .to_string()
        };
        assert_eq!(value("workqueue_adds_total"), "3", "a, b, then a again");
        assert_eq!(value("workqueue_retries_total"), "1");
        assert_eq!(value("workqueue_depth"), "2");
        assert_eq!(value("workqueue_queue_duration_seconds_sum"), "5");
        assert_eq!(value("workqueue_work_duration_seconds_sum"), "7");
        assert_eq!(value("workqueue_longest_running_processor_seconds"), "0");
    }

    #[tokio::test]
    async fn many_workers_drain_each_key_once() {
        let q = WorkQueue::new();
        for i in 0..200 {
            q.add(&format!("k{i}"));
        }
        let seen = Arc::new(Mutex::new(Vec::new()));
        let workers: Vec<_> = (0..4)
            .map(|_| {
                let (q, seen) = (q.clone(), seen.clone());
                tokio::spawn(async move {
                    while let Ok(Some(k)) =
                        tokio::time::timeout(Duration::from_millis(100), q.get()).await
                    {
                        seen.lock().unwrap().push(k.clone());
                        q.done(&k);
                    }
                })
            })
            .collect();
        for w in workers {
            w.await.unwrap();
        }
        // Count every hand-out: a key handed to two workers (or twice to one)
        // must fail here, so nothing is deduplicated before counting.
        let seen = seen.lock().unwrap().clone();
        let mut counts = std::collections::BTreeMap::new();
        for k in &seen {
            *counts.entry(k.clone()).or_insert(0usize) += 1;
        }
        let twice: Vec<_> = counts.iter().filter(|(_, n)| **n > 1).collect();
        assert!(
            twice.is_empty(),
            "keys handed out more than once: {twice:?}"
        );
        assert_eq!(counts.len(), 200, "every key handed out");
        assert_eq!(seen.len(), 200, "exactly one hand-out per key");
    }
}
