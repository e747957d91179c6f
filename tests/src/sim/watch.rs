//! Watch streams (`?watch=true`): replay from a resourceVersion out of the store's history
//! window, `410 Expired` as an in-stream `ERROR` event when that is too old, synthetic
//! `ADDED` events when starting from "now", selector transitions (an object that stops
//! matching a selector is sent as `DELETED`, one that starts matching as `ADDED`, as the
//! real watch cache does), `BOOKMARK` events, `sendInitialEvents`, server-side
//! `timeoutSeconds`, and forced disconnects (fault injection).
//!
//! Each watcher is one task reading the store's broadcast channel and filtering events for
//! itself; lines are serialized once per change by the store, and consecutive events are
//! coalesced into one HTTP chunk.

use super::errors::ApiError;
use super::resources::RESOURCES;
use super::selectors::Selectors;
use super::store::{watch_line, EventType, Store, WatchEvent, WatchFrom};
use bytes::{Bytes, BytesMut};
use futures::Stream;
use serde_json::json;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};

/// Parameters of one watch request.
#[derive(Debug, Clone)]
pub struct WatchParams {
    /// Resource index.
    pub res: usize,
    /// Namespace filter.
    pub ns: Option<String>,
    /// Label/field selectors.
    pub selectors: Selectors,
    /// Start point.
    pub from: WatchFrom,
    /// `allowWatchBookmarks=true`.
    pub bookmarks: bool,
    /// `sendInitialEvents=true` (ends the initial events with an annotated bookmark).
    pub send_initial_events: bool,
    /// Server-side timeout (`timeoutSeconds`).
    pub timeout: Duration,
    /// Interval between BOOKMARK events.
    pub bookmark_interval: Duration,
}

fn error_line(e: &ApiError) -> Bytes {
    let mut v = serde_json::to_vec(&json!({"type": "ERROR", "object": e.status()})).unwrap();
    v.push(b'\n');
    Bytes::from(v)
}

/// How long before a watch's deadline the last bookmark is sent (v1.19's cacher).
pub const PRE_DEADLINE_BOOKMARK: Duration = Duration::from_secs(2);

fn bookmark_line(res: usize, rv: u64, initial_end: bool) -> Bytes {
    let ri = &RESOURCES[res];
    let mut meta = json!({"resourceVersion": rv.to_string(), "creationTimestamp": null});
    if initial_end {
        meta["annotations"] = json!({"k8s.io/initial-events-end": "true"});
    }
    let v = json!({"type": "BOOKMARK", "object": {"kind": ri.kind, "apiVersion": ri.api_version(), "metadata": meta}});
    let mut b = serde_json::to_vec(&v).unwrap();
    b.push(b'\n');
    Bytes::from(b)
}

struct Filter {
    res: usize,
    ns: Option<String>,
    sel: Selectors,
    min_rv: u64,
}

impl Filter {
    fn push(&self, ev: &WatchEvent, buf: &mut BytesMut) {
        if ev.res != self.res
            || ev.rv <= self.min_rv
            || self.ns.as_ref().is_some_and(|n| *n != ev.ns)
        {
            return;
        }
        let now = self.sel.matches(&ev.obj);
        match (ev.etype, &ev.prev) {
            (EventType::Modified, Some(prev)) => {
                let before = self.sel.matches(prev);
                match (before, now) {
                    (true, true) => buf.extend_from_slice(&ev.line),
                    (false, true) => buf.extend_from_slice(&watch_line(EventType::Added, &ev.full)),
                    (true, false) => {
                        buf.extend_from_slice(&watch_line(EventType::Deleted, &ev.full))
                    }
                    (false, false) => {}
                }
            }
            _ => {
                if now {
                    buf.extend_from_slice(&ev.line)
                }
            }
        }
    }
}

/// Start a watch; returns the response body stream. Never fails: a too-old
/// resourceVersion yields a stream with one `ERROR` event (code 410, reason `Expired`).
pub fn start(
    store: Arc<Store>,
    p: WatchParams,
    mut dropper: watch::Receiver<u64>,
) -> impl Stream<Item = Result<Bytes, Infallible>> + Send + 'static {
    let (tx, rx) = mpsc::channel::<Bytes>(16);
    let ns = p.ns.as_deref();
    let started = store.watch_start(p.res, ns, p.from);
    dropper.borrow_and_update();
    match started {
        Err(oldest) => {
            let requested = match p.from {
                WatchFrom::Rv(r) => r,
                WatchFrom::Now => 0,
            };
            let err = ApiError::expired(requested, oldest);
            let line = error_line(&err);
            let _ = tx.try_send(line);
        }
        Ok(start) => {
            let filter = Filter {
                res: p.res,
                ns: p.ns.clone(),
                sel: p.selectors.clone(),
                min_rv: match p.from {
                    WatchFrom::Rv(r) => r,
                    WatchFrom::Now => start.rv,
                },
            };
            let mut first = BytesMut::new();
            for s in &start.initial {
                if p.selectors.matches(&s.obj) {
                    first.extend_from_slice(&watch_line(EventType::Added, &s.full));
                }
            }
            if p.send_initial_events {
                let rv = match p.from {
                    WatchFrom::Rv(r) => r.max(start.rv),
                    WatchFrom::Now => start.rv,
                };
                first.extend_from_slice(&bookmark_line(p.res, rv, true));
            }
            for ev in &start.replay {
                filter.push(ev, &mut first);
            }
            tokio::spawn(run(store, p, filter, start.rx, dropper, tx, first));
        }
    }
    futures::stream::unfold(
        rx,
        |mut rx| async move { rx.recv().await.map(|b| (Ok(b), rx)) },
    )
}

async fn run(
    store: Arc<Store>,
    p: WatchParams,
    filter: Filter,
    mut rx: broadcast::Receiver<Arc<WatchEvent>>,
    mut dropper: watch::Receiver<u64>,
    tx: mpsc::Sender<Bytes>,
    first: BytesMut,
) {
    if !first.is_empty() && tx.send(first.freeze()).await.is_err() {
        return;
    }
    let deadline = tokio::time::sleep(p.timeout);
    tokio::pin!(deadline);
    // kube-apiserver v1.19 sends a bookmark 2 s before the watch's deadline
    // (cacheWatcher.nextBookmarkTime; later versions also about once a
    // minute, which `bookmark_interval` models): a client that asked for
    // bookmarks gets one even on a quiet watch that times out.
    let before_deadline = p.timeout.checked_sub(PRE_DEADLINE_BOOKMARK);
    let last_bookmark = tokio::time::sleep(before_deadline.unwrap_or(p.timeout));
    tokio::pin!(last_bookmark);
    let mut last_bookmark_due = p.bookmarks && before_deadline.is_some();
    let mut tick = tokio::time::interval_at(
        tokio::time::Instant::now() + p.bookmark_interval,
        p.bookmark_interval.max(Duration::from_millis(10)),
    );
    loop {
        tokio::select! {
            biased;
            _ = dropper.changed() => return,
            _ = &mut deadline => return,
            _ = tx.closed() => return,
            r = rx.recv() => {
                let ev = match r {
                    Ok(ev) => ev,
                    // a watcher too slow to keep up is closed, as the real watch cache does;
                    // the client re-watches from its last resourceVersion.
                    Err(_) => return,
                };
                let mut buf = BytesMut::new();
                filter.push(&ev, &mut buf);
                while buf.len() < 256 * 1024 {
                    match rx.try_recv() {
                        Ok(ev) => filter.push(&ev, &mut buf),
                        Err(broadcast::error::TryRecvError::Empty) => break,
                        Err(_) => return,
                    }
                }
                if !buf.is_empty() && tx.send(buf.freeze()).await.is_err() {
                    return;
                }
            }
            _ = &mut last_bookmark, if last_bookmark_due => {
                last_bookmark_due = false;
                let rv = store.rv_if_drained(&rx).unwrap_or(filter.min_rv);
                if tx.send(bookmark_line(p.res, rv.max(filter.min_rv), false)).await.is_err() {
                    return;
                }
            }
            _ = tick.tick(), if p.bookmarks => {
                if let Some(rv) = store.rv_if_drained(&rx) {
                    if tx.send(bookmark_line(p.res, rv.max(filter.min_rv), false)).await.is_err() {
                        return;
                    }
                }
            }
        }
    }
}
