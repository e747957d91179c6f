//! A de-duplicating work queue with client-go workqueue semantics, keyed by
//! claim uid.
//!
//! * a key added while already queued is queued once;
//! * a key added while a worker processes it is queued again only after that
//!   worker calls [`WorkQueue::done`], so one key is never processed by two
//!   workers at once;
//! * [`WorkQueue::add_after`] adds a key after a delay (per-item backoff);
//! * [`WorkQueue::shutdown`] makes [`WorkQueue::get`] return `None` and drops
//!   later adds.

use std::collections::{HashSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

#[derive(Default)]
struct State {
    queue: VecDeque<String>,
    dirty: HashSet<String>,
    processing: HashSet<String>,
    shutting_down: bool,
}

/// The claim work queue; cheap to clone (all clones share one queue).
#[derive(Clone, Default)]
pub struct WorkQueue {
    state: Arc<Mutex<State>>,
    notify: Arc<Notify>,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Self {
        Self::default()
    }

    /// Queue `key` unless it is already queued; if it is being processed it is
    /// queued again when its worker calls [`done`](Self::done).
    pub fn add(&self, key: &str) {
        let mut s = self.state.lock().expect("work queue poisoned");
        if s.shutting_down || s.dirty.contains(key) {
            return;
        }
        s.dirty.insert(key.to_string());
        if s.processing.contains(key) {
            return;
        }
        s.queue.push_back(key.to_string());
        drop(s);
        self.notify.notify_one();
    }

    /// [`add`](Self::add) `key` after `delay` (immediately for a zero delay).
    pub fn add_after(&self, key: &str, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let this = self.clone();
        let key = key.to_string();
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            this.add(&key);
        });
    }

    /// Wait for the next key and mark it as being processed; `None` once the
    /// queue is shut down.
    pub async fn get(&self) -> Option<String> {
        loop {
            let notified = self.notify.notified();
            {
                let mut s = self.state.lock().expect("work queue poisoned");
                if s.shutting_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    if !s.queue.is_empty() {
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// The worker finished `key`; re-queue it if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut s = self.state.lock().expect("work queue poisoned");
        s.processing.remove(key);
        if s.dirty.contains(key) && !s.shutting_down {
            s.queue.push_back(key.to_string());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Number of keys waiting (not counting those being processed).
    pub fn len(&self) -> usize {
        self.state.lock().expect("work queue poisoned").queue.len()
    }

    /// Whether no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Stop handing out keys: every pending and later [`get`](Self::get) returns `None`.
    pub fn shutdown(&self) {
        self.state
            .lock()
            .expect("work queue poisoned")
            .shutting_down = true;
        self.notify.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn dedups_and_requeues_keys_added_while_processing() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
        assert_eq!(q.len(), 2);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.add("a"); // while processing: held back
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await.as_deref(), Some("b"));
        q.done("a");
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        q.done("b");
        assert!(q.is_empty());
    }

    #[tokio::test(start_paused = true)]
    async fn add_after_waits_and_shutdown_releases_waiters() {
        let q = WorkQueue::new();
        q.add_after("late", Duration::from_secs(15));
        let start = tokio::time::Instant::now();
        assert_eq!(q.get().await.as_deref(), Some("late"));
        assert_eq!(start.elapsed(), Duration::from_secs(15));

        let waiter = tokio::spawn({
            let q = q.clone();
            async move { q.get().await }
        });
        tokio::task::yield_now().await;
        q.shutdown();
        assert_eq!(waiter.await.unwrap(), None);
        q.add("x");
        assert_eq!(q.get().await, None);
    }
}
