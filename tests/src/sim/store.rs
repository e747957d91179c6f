//! The object store: one map per resource, one global resourceVersion counter shared by
//! all kinds (like etcd's revision), a bounded history of changes for watch replay, and a
//! broadcast channel that fans every change out to watchers. A single mutex guards it all;
//! every critical section is short (one map operation plus one serialization).

use super::apply::ManagedEntry;
use super::errors::ApiError;
use super::event_api;
use super::resources::RESOURCES;
use bytes::{Bytes, BytesMut};
use serde_json::Value;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::broadcast;

/// Object key inside one resource: `(namespace, name)`; namespace is `""` when cluster-scoped.
pub type Key = (String, String);

/// A stored object and its serialized forms.
#[derive(Clone, Debug)]
pub struct Stored {
    /// The object without `kind`/`apiVersion` (metadata.resourceVersion is set).
    pub obj: Arc<Value>,
    /// JSON of `obj` (the form the real server uses for list items).
    pub item: Bytes,
    /// JSON with `kind` and `apiVersion` (the form of get/create responses).
    pub full: Bytes,
    /// resourceVersion of the last write.
    pub rv: u64,
    /// Server-side-apply field ownership.
    pub managed: Arc<Vec<ManagedEntry>>,
}

/// Watch event type.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EventType {
    /// `ADDED`
    Added,
    /// `MODIFIED`
    Modified,
    /// `DELETED`
    Deleted,
}

impl EventType {
    /// Wire name.
    pub fn as_str(self) -> &'static str {
        match self {
            EventType::Added => "ADDED",
            EventType::Modified => "MODIFIED",
            EventType::Deleted => "DELETED",
        }
    }
}

/// One change, as broadcast to watchers and kept in the history window.
#[derive(Debug)]
pub struct WatchEvent {
    /// resourceVersion of the change.
    pub rv: u64,
    /// Resource index into [`RESOURCES`].
    pub res: usize,
    /// Change type.
    pub etype: EventType,
    /// Namespace (`""` for cluster-scoped).
    pub ns: String,
    /// Object name.
    pub name: String,
    /// Object after the change (for DELETED: the last state, with the deletion's RV).
    pub obj: Arc<Value>,
    /// Object before the change (MODIFIED only); used for selector transitions.
    pub prev: Option<Arc<Value>>,
    /// Object JSON with kind/apiVersion.
    pub full: Bytes,
    /// Ready-made watch line: `{"type":"...","object":{...}}\n`.
    pub line: Bytes,
}

/// What a write closure decided.
pub enum Outcome {
    /// Store this object (without kind/apiVersion) with this field ownership.
    Put(Value, Vec<ManagedEntry>),
    /// Remove the object (DELETED event carries the old state).
    Delete,
    /// No change: no new resourceVersion, no event.
    Unchanged,
}

/// Result of a write.
#[derive(Clone, Debug)]
pub struct WriteResult {
    /// Stored state after the write (for Delete: the last state, with the deletion RV).
    pub stored: Stored,
    /// `None` when nothing changed.
    pub etype: Option<EventType>,
}

struct Inner {
    rv: u64,
    objects: Vec<BTreeMap<Key, Stored>>,
    history: VecDeque<Arc<WatchEvent>>,
    /// Every change with rv > history_start is in `history`.
    history_start: u64,
}

/// Where a new watch starts.
#[derive(Clone, Copy, Debug)]
pub enum WatchFrom {
    /// Synthetic ADDED events for all current objects, then changes (`resourceVersion` unset or `0`).
    Now,
    /// Replay changes after this resourceVersion.
    Rv(u64),
}

/// Initial data of a new watch, taken atomically with its subscription.
pub struct WatchStart {
    /// Current objects (for [`WatchFrom::Now`]).
    pub initial: Vec<Stored>,
    /// History events to replay (for [`WatchFrom::Rv`]).
    pub replay: Vec<Arc<WatchEvent>>,
    /// Live changes after the snapshot.
    pub rx: broadcast::Receiver<Arc<WatchEvent>>,
    /// Store resourceVersion at subscription time.
    pub rv: u64,
}

/// The store. Cheap to share behind an `Arc`.
pub struct Store {
    inner: Mutex<Inner>,
    tx: broadcast::Sender<Arc<WatchEvent>>,
    history_window: usize,
    prefixes: Vec<Vec<u8>>,
}

fn render_full(prefix: &[u8], item: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(prefix.len() + item.len());
    b.extend_from_slice(prefix);
    if item.len() > 2 {
        b.extend_from_slice(b",");
    }
    b.extend_from_slice(&item[1..]);
    b.freeze()
}

fn render_line(etype: &str, full: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(full.len() + 32);
    b.extend_from_slice(b"{\"type\":\"");
    b.extend_from_slice(etype.as_bytes());
    b.extend_from_slice(b"\",\"object\":");
    b.extend_from_slice(full);
    b.extend_from_slice(b"}\n");
    b.freeze()
}

/// Build a watch line for an event type and object JSON (used for selector transitions).
pub fn watch_line(etype: EventType, full: &[u8]) -> Bytes {
    render_line(etype.as_str(), full)
}

fn set_rv(v: &mut Value, rv: u64) {
    if let Some(m) = v.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        m.insert("resourceVersion".into(), Value::String(rv.to_string()));
    }
}

impl Store {
    /// New empty store keeping `history_window` changes for replay; the broadcast channel
    /// holds `channel_capacity` events per lagging watcher.
    pub fn new(history_window: usize, channel_capacity: usize) -> Self {
        let (tx, _) = broadcast::channel(channel_capacity.max(16));
        let prefixes = RESOURCES
            .iter()
            .map(|r| {
                format!(
                    "{{\"apiVersion\":\"{}\",\"kind\":\"{}\"",
                    r.api_version(),
                    r.kind
                )
                .into_bytes()
            })
            .collect();
        Self {
            inner: Mutex::new(Inner {
                rv: 1,
                objects: RESOURCES.iter().map(|_| BTreeMap::new()).collect(),
                history: VecDeque::new(),
                history_start: 1,
            }),
            tx,
            history_window: history_window.max(1),
            prefixes,
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Current (latest) resourceVersion.
    pub fn current_rv(&self) -> u64 {
        self.lock().rv
    }

    /// Oldest resourceVersion a watch may start from without `410 Gone`.
    pub fn oldest_watchable_rv(&self) -> u64 {
        self.lock().history_start
    }

    /// Render the full JSON (with kind/apiVersion) of an object of resource `res`.
    pub fn render(&self, res: usize, obj: &Value) -> Bytes {
        let item = serde_json::to_vec(obj).expect("serialize");
        render_full(&self.prefixes[res], &item)
    }

    /// Get one object.
    pub fn get(&self, res: usize, ns: &str, name: &str) -> Option<Stored> {
        self.lock().objects[res]
            .get(&(ns.to_string(), name.to_string()))
            .cloned()
    }

    /// List objects of `res` (in namespace `ns` if given), in key order, starting after
    /// `after`, keeping those `keep` accepts, at most `limit`. Returns the page, the store
    /// resourceVersion, and how many matching objects remain after the page.
    pub fn list(
        &self,
        res: usize,
        ns: Option<&str>,
        after: Option<&Key>,
        keep: &dyn Fn(&Value) -> bool,
        limit: Option<usize>,
    ) -> (Vec<Stored>, u64, usize) {
        let inner = self.lock();
        let map = &inner.objects[res];
        let mut out = Vec::new();
        let mut remaining = 0usize;
        let iter: Box<dyn Iterator<Item = (&Key, &Stored)>> = match (after, ns) {
            (Some(k), _) => Box::new(map.range::<Key, _>((
                std::ops::Bound::Excluded(k.clone()),
                std::ops::Bound::Unbounded,
            ))),
            (None, Some(ns)) => Box::new(map.range::<Key, _>((ns.to_string(), String::new())..)),
            (None, None) => Box::new(map.iter()),
        };
        for (k, s) in iter {
            if let Some(ns) = ns {
                if k.0 != ns {
                    if k.0.as_str() > ns {
                        break;
                    }
                    continue;
                }
            }
            if !keep(&s.obj) {
                continue;
            }
            if limit.is_some_and(|l| out.len() >= l) {
                remaining += 1;
                continue;
            }
            out.push(s.clone());
        }
        (out, inner.rv, remaining)
    }

    /// Atomically read-modify-write one object. `f` gets the current object (if any) and
    /// the resourceVersion the write will get.
    pub fn write(
        &self,
        res: usize,
        ns: &str,
        name: &str,
        f: impl FnOnce(Option<&Stored>, u64) -> Result<Outcome, ApiError>,
    ) -> Result<WriteResult, ApiError> {
        let key = (ns.to_string(), name.to_string());
        let mut inner = self.lock();
        let next = inner.rv + 1;
        let old = inner.objects[res].get(&key);
        let outcome = f(old, next)?;
        let (stored, etype, prev) = match outcome {
            Outcome::Unchanged => {
                return Ok(WriteResult {
                    stored: old
                        .cloned()
                        .ok_or_else(|| ApiError::internal("no object"))?,
                    etype: None,
                })
            }
            Outcome::Put(v, managed) => {
                let mut v = match event_api::twin(res) {
                    Some(_) => event_api::view(res, &v),
                    None => v,
                };
                set_rv(&mut v, next);
                let item = Bytes::from(serde_json::to_vec(&v).expect("serialize"));
                let full = render_full(&self.prefixes[res], &item);
                let prev = old.map(|o| o.obj.clone());
                let etype = if old.is_some() {
                    EventType::Modified
                } else {
                    EventType::Added
                };
                let s = Stored {
                    obj: Arc::new(v),
                    item,
                    full,
                    rv: next,
                    managed: Arc::new(managed),
                };
                inner.objects[res].insert(key.clone(), s.clone());
                (s, etype, prev)
            }
            Outcome::Delete => {
                let Some(old) = inner.objects[res].remove(&key) else {
                    return Err(ApiError::internal("delete of missing object"));
                };
                let mut v = (*old.obj).clone();
                set_rv(&mut v, next);
                let item = Bytes::from(serde_json::to_vec(&v).expect("serialize"));
                let full = render_full(&self.prefixes[res], &item);
                (
                    Stored {
                        obj: Arc::new(v),
                        item,
                        full,
                        rv: next,
                        managed: old.managed.clone(),
                    },
                    EventType::Deleted,
                    None,
                )
            }
        };
        inner.rv = next;
        let twin_ev = event_api::twin(res)
            .map(|t| self.write_twin(&mut inner, t, &key, &stored, etype, next));
        let ev = Arc::new(WatchEvent {
            rv: next,
            res,
            etype,
            ns: ns.to_string(),
            name: name.to_string(),
            obj: stored.obj.clone(),
            prev,
            line: render_line(etype.as_str(), &stored.full),
            full: stored.full.clone(),
        });
        inner.history.push_back(ev.clone());
        while inner.history.len() > self.history_window {
            if let Some(e) = inner.history.pop_front() {
                inner.history_start = e.rv;
            }
        }
        let _ = self.tx.send(ev);
        if let Some(twin) = twin_ev {
            inner.history.push_back(twin.clone());
            let _ = self.tx.send(twin);
        }
        drop(inner);
        Ok(WriteResult {
            stored,
            etype: Some(etype),
        })
    }

    /// Mirror a change of one Event view into the other view `twin` (same key, uid and
    /// resourceVersion; see [`event_api`]); returns the twin's watch event, which the caller
    /// records right after the original's.
    fn write_twin(
        &self,
        inner: &mut Inner,
        twin: usize,
        key: &Key,
        stored: &Stored,
        etype: EventType,
        rv: u64,
    ) -> Arc<WatchEvent> {
        let v = event_api::view(twin, &stored.obj);
        let item = Bytes::from(serde_json::to_vec(&v).expect("serialize"));
        let full = render_full(&self.prefixes[twin], &item);
        let s = Stored {
            obj: Arc::new(v),
            item,
            full,
            rv,
            managed: stored.managed.clone(),
        };
        let prev = match etype {
            EventType::Deleted => {
                inner.objects[twin].remove(key);
                None
            }
            _ => inner.objects[twin]
                .insert(key.clone(), s.clone())
                .map(|o| o.obj),
        };
        Arc::new(WatchEvent {
            rv,
            res: twin,
            etype,
            ns: key.0.clone(),
            name: key.1.clone(),
            obj: s.obj.clone(),
            prev: if etype == EventType::Modified {
                prev
            } else {
                None
            },
            line: render_line(etype.as_str(), &s.full),
            full: s.full,
        })
    }

    /// Subscribe to all changes from now on (used by the PV controller emulation).
    pub fn subscribe(&self) -> (broadcast::Receiver<Arc<WatchEvent>>, u64) {
        let inner = self.lock();
        (self.tx.subscribe(), inner.rv)
    }

    /// Start a watch on `res` (namespace `ns` if given). `Err(oldest)` when `from` is older
    /// than the history window (the caller answers `410 Expired`).
    pub fn watch_start(
        &self,
        res: usize,
        ns: Option<&str>,
        from: WatchFrom,
    ) -> Result<WatchStart, u64> {
        let inner = self.lock();
        let rx = self.tx.subscribe();
        let mut initial = Vec::new();
        let mut replay = Vec::new();
        match from {
            WatchFrom::Now => {
                initial = inner.objects[res]
                    .iter()
                    .filter(|(k, _)| ns.is_none_or(|n| k.0 == n))
                    .map(|(_, s)| s.clone())
                    .collect();
            }
            WatchFrom::Rv(rv) => {
                if rv < inner.history_start {
                    return Err(inner.history_start + 1);
                }
                // history is sorted by rv: binary search the first event after rv.
                let idx = inner.history.partition_point(|e| e.rv <= rv);
                replay = inner
                    .history
                    .range(idx..)
                    .filter(|e| e.res == res && ns.is_none_or(|n| e.ns == n))
                    .cloned()
                    .collect();
            }
        }
        Ok(WatchStart {
            initial,
            replay,
            rx,
            rv: inner.rv,
        })
    }

    /// Number of pending (undelivered) events in a receiver's queue, and the current RV,
    /// read atomically (for bookmarks: a bookmark at the current RV is only safe when the
    /// watcher has consumed every event).
    pub fn rv_if_drained(&self, rx: &broadcast::Receiver<Arc<WatchEvent>>) -> Option<u64> {
        let inner = self.lock();
        if rx.is_empty() {
            Some(inner.rv)
        } else {
            None
        }
    }

    /// Number of objects of a resource.
    pub fn count(&self, res: usize) -> usize {
        self.lock().objects[res].len()
    }
}
