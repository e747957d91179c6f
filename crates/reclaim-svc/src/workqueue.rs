//! A de-duplicating work queue keyed by PV name, with client-go's workqueue
//! semantics as the seed relies on them:
//!
//! * a key queued twice is processed once;
//! * a key is never handed to two workers at once — a key added while it is
//!   being processed is queued again when the worker calls [`WorkQueue::done`];
//! * [`WorkQueue::add_after`] queues a key after a delay (the retry path);
//! * after [`WorkQueue::shut_down`], [`WorkQueue::get`] returns `None` and adds
//!   are ignored, so workers finish their in-flight item and stop.

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

/// The queue; share it as `Arc<WorkQueue>`.
#[derive(Default)]
pub struct WorkQueue {
    state: Mutex<State>,
    notify: Notify,
}

impl WorkQueue {
    /// An empty queue.
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// Queue `key` unless it is already waiting; if a worker holds it, it is
    /// queued again once that worker calls [`done`](Self::done).
    pub fn add(&self, key: &str) {
        let mut s = self.state.lock().expect("work queue poisoned");
        if s.shutting_down || !s.dirty.insert(key.to_string()) {
            return;
        }
        if s.processing.contains(key) {
            return;
        }
        s.queue.push_back(key.to_string());
        drop(s);
        self.notify.notify_one();
    }

    /// Queue `key` after `delay` (immediately when zero). Dropped if the queue
    /// shuts down meanwhile.
    pub fn add_after(self: &Arc<Self>, key: &str, delay: Duration) {
        if delay.is_zero() {
            self.add(key);
            return;
        }
        let queue = Arc::clone(self);
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
            let notified = self.notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            {
                let mut s = self.state.lock().expect("work queue poisoned");
                if s.shutting_down {
                    return None;
                }
                if let Some(key) = s.queue.pop_front() {
                    s.dirty.remove(&key);
                    s.processing.insert(key.clone());
                    let more = !s.queue.is_empty();
                    drop(s);
                    if more {
                        // Pass the wake-up on so idle workers pick up the rest.
                        self.notify.notify_one();
                    }
                    return Some(key);
                }
            }
            notified.await;
        }
    }

    /// Mark `key` as no longer being processed; re-queue it if it was added meanwhile.
    pub fn done(&self, key: &str) {
        let mut s = self.state.lock().expect("work queue poisoned");
        s.processing.remove(key);
        if s.dirty.contains(key) && !s.shutting_down {
            s.queue.push_back(key.to_string());
            drop(s);
            self.notify.notify_one();
        }
    }

    /// Stop handing out keys; waiting [`get`](Self::get) calls return `None`.
    pub fn shut_down(&self) {
        self.state
            .lock()
            .expect("work queue poisoned")
            .shutting_down = true;
        self.notify.notify_waiters();
    }

    /// Keys waiting to be processed.
    pub fn len(&self) -> usize {
        self.state.lock().expect("work queue poisoned").queue.len()
    }

    /// Whether no key is waiting.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn duplicates_are_collapsed() {
        let q = WorkQueue::new();
        q.add("a");
        q.add("b");
        q.add("a");
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
        assert_eq!(q.len(), 0, "not handed out twice concurrently");
        q.done(&k);
        assert_eq!(q.len(), 1);
        assert_eq!(q.get().await.as_deref(), Some("a"));
        q.done("a");
        assert!(q.is_empty());
    }

    #[tokio::test]
    async fn add_after_delays_and_shutdown_releases_waiters() {
        let q = WorkQueue::new();
        q.add_after("late", Duration::from_millis(30));
        assert!(q.is_empty());
        let got = tokio::time::timeout(Duration::from_secs(2), q.get())
            .await
            .unwrap();
        assert_eq!(got.as_deref(), Some("late"));

        let waiter = {
            let q = Arc::clone(&q);
            tokio::spawn(async move { q.get().await })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        q.shut_down();
        assert_eq!(waiter.await.unwrap(), None);
        q.add("ignored");
        assert!(q.is_empty());
    }
}
