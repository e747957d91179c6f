//! Watch conformance, on the simulator and on a real kube-apiserver (v1.19 and v1.37)
//! (`on_both_servers!`; the real one is the test binary's shared cluster):
//! replay from a resourceVersion, `410 Gone` (`Expired`) for a resourceVersion
//! whose history is gone, bookmarks, server-side timeout, selector
//! transitions, and kube-runtime's watcher/reflector staying in sync. Forced
//! disconnects and streaming lists are simulator-only (see each test).
//!
//! Watches here are on Leases and claims in the test's own namespace: the
//! real controller manager writes PersistentVolumes on its own, which would
//! add events to a PV watch.

use e2e::harness::ApiPlane;
use e2e::on_both_servers;
use e2e::realkube::KubeVersion;
use e2e::sim::{SimConfig, Simulator};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Event as CoreEvent, PersistentVolume, PersistentVolumeClaim};
use kube::api::{
    Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams,
};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;
use std::time::{Duration, Instant};

fn pv(name: &str) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"}}
    }))
    .unwrap()
}

fn pvc(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": "x"}
    }))
    .unwrap()
}

fn lease(name: &str) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": "h", "leaseDurationSeconds": 10}
    }))
    .unwrap()
}

async fn next<T>(s: &mut (impl futures::Stream<Item = T> + Unpin)) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(10), s.next())
        .await
        .expect("watch event within 10s")
}

/// The next event that is not a BOOKMARK.
async fn next_change<K>(
    s: &mut (impl futures::Stream<Item = kube::Result<WatchEvent<K>>> + Unpin),
) -> Option<WatchEvent<K>> {
    loop {
        match next(s).await? {
            Ok(WatchEvent::Bookmark(_)) => continue,
            Ok(ev) => return Some(ev),
            Err(e) => panic!("watch error {e:?}"),
        }
    }
}

/// The current resourceVersion of the server (a list's).
async fn current_rv<K>(api: &Api<K>) -> String
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    api.list(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
}

on_both_servers!(
    watch_replays_changes_after_rv,
    selector_transitions_in_watch,
    kube_runtime_watcher_and_reflector_stay_in_sync,
);
// A history window of 5 changes on the simulator; the real server's history
// is cut by compacting etcd.
on_both_servers!(expired_resource_version_is_410_gone => SimConfig {
    history_window: 5,
    ..SimConfig::default()
});
// The simulator's periodic bookmarks (every 60 s by default) are too slow
// to matter here: what is pinned is the one before the timeout.
on_both_servers!(bookmarks_and_server_side_timeout);

async fn watch_replays_changes_after_rv(t: ApiPlane) {
    let leases: Api<Lease> = Api::namespaced(t.client(), t.namespace());
    let a = leases
        .create(&PostParams::default(), &lease("a"))
        .await
        .unwrap();
    leases
        .create(&PostParams::default(), &lease("b"))
        .await
        .unwrap();
    leases
        .patch(
            "a",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
        )
        .await
        .unwrap();
    leases.delete("b", &DeleteParams::default()).await.unwrap();
    let from = a.metadata.resource_version.unwrap();
    let mut w = leases
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    for _ in 0..3 {
        match next_change(&mut w).await.unwrap() {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.metadata.name.unwrap())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.metadata.name.unwrap())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.metadata.name.unwrap())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED a", "DELETED b"]);
    // live events continue after the replay
    leases
        .create(&PostParams::default(), &lease("c"))
        .await
        .unwrap();
    match next_change(&mut w).await.unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
    // resourceVersion "0": synthetic ADDED for current objects
    let mut w0 = leases
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        if let WatchEvent::Added(o) = next_change(&mut w0).await.unwrap() {
            names.push(o.metadata.name.unwrap());
        }
    }
    names.sort();
    assert_eq!(names, ["a", "c"]);
}

/// `410 Gone` with reason `Expired` once the history behind a resourceVersion
/// is gone: kube's watcher and pager relist on it. On the real v1.19 server the
/// history is cut by compacting etcd (as kube-apiserver does every 5 min; v1.37
/// answers from its watch cache instead, pinned below),
/// which answers a list at an old resourceVersion with `limit` (served from
/// etcd) and a `continue` token from before the compaction with 410; the
/// simulator's watch from before its history window too (see below why that
/// step is simulator-only).
async fn expired_resource_version_is_410_gone(t: ApiPlane) {
    let leases: Api<Lease> = Api::namespaced(t.client(), t.namespace());
    let events: Api<CoreEvent> = Api::namespaced(t.client(), t.namespace());
    let event: CoreEvent = serde_json::from_value(json!({
        "metadata": {"name": "e0"},
        "involvedObject": {"kind": "Lease", "namespace": t.namespace(), "name": "p0"},
        "reason": "Test", "message": "m", "type": "Normal"
    }))
    .unwrap();
    let first_event = events.create(&PostParams::default(), &event).await.unwrap();
    let first = leases
        .create(&PostParams::default(), &lease("p0"))
        .await
        .unwrap();
    for i in 1..20 {
        leases
            .create(&PostParams::default(), &lease(&format!("p{i}")))
            .await
            .unwrap();
    }
    let page = leases.list(&ListParams::default().limit(5)).await.unwrap();
    let token = page.metadata.continue_.clone().expect("a continue token");
    let first_rv = first.metadata.resource_version.unwrap();
    // one more write, so the history cut below is past the token's resourceVersion
    leases
        .create(&PostParams::default(), &lease("after"))
        .await
        .unwrap();
    if let Some(real) = t.real() {
        // the history up to now is gone
        real.compact_etcd().await.unwrap();
    } else {
        for i in 20..30 {
            leases
                .create(&PostParams::default(), &lease(&format!("p{i}")))
                .await
                .unwrap();
        }
    }
    let expired = |what: &str, r: kube::Result<kube::api::ObjectList<Lease>>| match r {
        Err(kube::Error::Api(s)) => {
            assert_eq!(
                (s.code, s.reason.as_str()),
                (410, "Expired"),
                "{what}: {s:?}"
            );
            s.message
        }
        other => panic!("{what}: expected 410 Expired, got {other:?}"),
    };
    // a list at an exact resourceVersion and a continue token whose history is
    // gone in etcd: v1.19 reads both from etcd (`limit`) and answers 410; v1.37
    // serves both from the watch cache's snapshots (ListFromCacheSnapshot,
    // 1.34+), which etcd's compaction does not touch (its 410 comes when the
    // cache's own window is passed, as the simulator's history window does)
    let old_list = leases
        .list(&ListParams::default().limit(5).at(&first_rv))
        .await;
    let continued = leases
        .list(&ListParams::default().limit(5).continue_token(&token))
        .await;
    if t.real().is_some() && t.version() >= KubeVersion::V1_37 {
        let names = |l: kube::api::ObjectList<Lease>| -> Vec<String> {
            l.items
                .into_iter()
                .filter_map(|l| l.metadata.name)
                .collect()
        };
        let list = old_list.expect("v1.37 serves the old resourceVersion from its watch cache");
        assert_eq!(
            list.metadata.resource_version.as_deref(),
            Some(first_rv.as_str())
        );
        assert_eq!(names(list), ["p0"]);
        let next = continued.expect("v1.37 serves an old continue token from its watch cache");
        assert_eq!(names(next), ["p13", "p14", "p15", "p16", "p17"]);
    } else {
        let msg = expired("list at an old resourceVersion", old_list);
        assert_eq!(msg, "The resourceVersion for the provided list is too old.");
        let msg = expired("continue token from before", continued);
        assert!(
            msg.starts_with(
                "The provided continue parameter is too old to display a consistent list result."
            ),
            "{msg}"
        );
    }
    // A watch from a resourceVersion whose history is gone. Simulator only:
    // v1.19 serves every watch (Events included) from the API server's watch
    // cache, which is not cut by etcd's compaction: it keeps every change
    // since the API server started (sized dynamically, up to 102,400 events
    // per kind), so the real server answers such a watch with 410 only after
    // an API-server restart or a cache overflow, neither of which a shared
    // test cluster can do (measured on v1.19: a Lease watch from
    // resourceVersion 1 and an Event watch from a compacted resourceVersion
    // both get no 410).
    let Some(_) = t.sim() else {
        return;
    };
    let event_rv = first_event.metadata.resource_version.unwrap();
    let mut w = events
        .watch(&WatchParams::default(), &event_rv)
        .await
        .unwrap()
        .boxed();
    match next(&mut w).await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"), "{e:?}");
            assert!(
                e.message.starts_with("too old resource version: "),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    assert!(next(&mut w).await.is_none(), "stream ends after the error");
    // raw shape of the error event
    let (status, body) = t
        .raw(
            "GET",
            &format!(
                "/api/v1/namespaces/{}/events?watch=true&resourceVersion={event_rv}&timeoutSeconds=5",
                t.namespace()
            ),
            None,
            None,
        )
        .await
        .unwrap();
    assert_eq!(status, 200);
    // one JSON line: the ERROR event, then the stream ends
    assert_eq!(body["type"], "ERROR", "{body}");
    assert_eq!(body["object"]["kind"], "Status");
    assert_eq!(body["object"]["status"], "Failure");
    assert_eq!(body["object"]["code"], 410);
    assert_eq!(body["object"]["reason"], "Expired");
}

/// `allowWatchBookmarks=true` yields a BOOKMARK carrying a resourceVersion
/// no older than the watch's start (kube's watcher resumes from it); v1.19
/// sends it 2 s before the watch's `timeoutSeconds` ends it (later versions
/// also about once a minute). Without the flag no BOOKMARK comes, and the
/// server ends the watch at `timeoutSeconds`. v1.19's watch cache stamps a
/// BOOKMARK with the resourceVersion of the last event *of that resource* it
/// processed, and sends it only when that is newer than what the watch has
/// delivered: on a quiet cluster (no Lease written since the watch began)
/// there is none. The test failed so whenever no other test happened to write
/// a Lease in those seconds; it now writes one after the watch has started
/// (the watch sees it ADDED). The simulator sends its pre-deadline BOOKMARK
/// either way: Kubernetes promises clients no BOOKMARK at all, so a client
/// that works with one and without one works with both servers.
async fn bookmarks_and_server_side_timeout(t: ApiPlane) {
    let leases: Api<Lease> = Api::namespaced(t.client(), t.namespace());
    let cur = current_rv(&leases).await;
    let t0 = Instant::now();
    let mut w = leases
        .watch(&WatchParams::default().timeout(5), &cur)
        .await
        .unwrap()
        .boxed();
    leases
        .create(&PostParams::default(), &lease("seen"))
        .await
        .unwrap();
    let mut bookmarks = Vec::new();
    let mut added = 0;
    while let Some(ev) = next(&mut w).await {
        match ev.unwrap() {
            WatchEvent::Bookmark(b) => {
                bookmarks.push((t0.elapsed(), b.metadata.resource_version.clone()))
            }
            WatchEvent::Added(l) if l.metadata.name.as_deref() == Some("seen") => added += 1,
            other => panic!("expected the Lease written and BOOKMARKs, got {other:?}"),
        }
    }
    assert_eq!(added, 1, "the Lease written after the watch's start");
    let ended = t0.elapsed();
    assert!(
        !bookmarks.is_empty(),
        "a BOOKMARK before the timeout (stream ended after {ended:?})"
    );
    for (_, rv) in &bookmarks {
        assert!(
            rv.parse::<u64>().unwrap() >= cur.parse::<u64>().unwrap(),
            "bookmark {rv} older than the watch's start {cur}"
        );
    }
    assert!(
        ended >= Duration::from_millis(4500) && ended < Duration::from_secs(8),
        "the server ends the watch at timeoutSeconds=5: {ended:?}"
    );
    // without allowWatchBookmarks: none, and the stream ends at timeoutSeconds
    let after = current_rv(&leases).await;
    let mut nb = leases
        .watch(
            &WatchParams::default().disable_bookmarks().timeout(2),
            &after,
        )
        .await
        .unwrap()
        .boxed();
    let t0 = Instant::now();
    assert!(
        next(&mut nb).await.is_none(),
        "no events, stream ends at timeoutSeconds"
    );
    let el = t0.elapsed();
    assert!(
        el >= Duration::from_millis(1900) && el < Duration::from_secs(4),
        "{el:?}"
    );
}

async fn selector_transitions_in_watch(t: ApiPlane) {
    let leases: Api<Lease> = Api::namespaced(t.client(), t.namespace());
    let cur = current_rv(&leases).await;
    let mut w = leases
        .watch(&WatchParams::default().labels("team=a"), &cur)
        .await
        .unwrap()
        .boxed();
    leases
        .create(&PostParams::default(), &lease("x"))
        .await
        .unwrap();
    let lab = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"team": v}}}));
    leases
        .patch("x", &PatchParams::default(), &lab("a"))
        .await
        .unwrap();
    leases
        .patch("x", &PatchParams::default(), &lab("b"))
        .await
        .unwrap();
    let kinds: Vec<&str> = vec![
        match next_change(&mut w).await.unwrap() {
            WatchEvent::Added(_) => "ADDED",
            _ => "other",
        },
        match next_change(&mut w).await.unwrap() {
            WatchEvent::Deleted(_) => "DELETED",
            _ => "other",
        },
    ];
    assert_eq!(kinds, ["ADDED", "DELETED"]);
}

/// A reflector over claims: listed in pages, then kept in sync by the watch,
/// deletions included (the claims' `kubernetes.io/pvc-protection` finalizer is
/// removed by the controller manager, or its emulation, before they go). On
/// the simulator the watches are also dropped once (fault injection): the
/// watcher re-watches from its last resourceVersion.
async fn kube_runtime_watcher_and_reflector_stay_in_sync(t: ApiPlane) {
    let client = t.client();
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), t.namespace());
    for i in 0..30 {
        pvcs.create(&PostParams::default(), &pvc(&format!("pre-{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let cfg = watcher::Config::default().page_size(7);
    let stream = reflector(writer, watcher(pvcs.clone(), cfg))
        .applied_objects()
        .boxed();
    let task = tokio::spawn(async move {
        let _ = stream.try_for_each(|_| async { Ok(()) }).await;
    });
    reader.wait_until_ready().await.unwrap();
    assert_eq!(reader.state().len(), 30);
    for i in 0..30 {
        pvcs.create(&PostParams::default(), &pvc(&format!("post-{i}")))
            .await
            .unwrap();
    }
    for i in 0..10 {
        pvcs.delete(&format!("pre-{i}"), &DeleteParams::default())
            .await
            .unwrap();
    }
    let wait = |n: usize| {
        let reader = reader.clone();
        async move {
            for _ in 0..300 {
                if reader.state().len() == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            panic!("reflector has {} objects, want {n}", reader.state().len());
        }
    };
    wait(50).await;
    if let Some(sim) = t.sim() {
        // simulator-only: a forced disconnect of every watch
        sim.drop_watches();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for i in 0..5 {
        pvcs.create(&PostParams::default(), &pvc(&format!("late-{i}")))
            .await
            .unwrap();
    }
    wait(55).await;
    if let Some(sim) = t.sim() {
        assert!(sim.stats().verb("watch") >= 2);
    }
    task.abort();
}

/// Simulator-only: dropping every watch (fault injection) ends the streams.
#[tokio::test]
async fn dropped_watches_end_the_stream() {
    let sim = Simulator::start(SimConfig {
        bookmark_interval: Duration::from_millis(100),
        ..SimConfig::bare()
    })
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    let cur = sim.resource_version().to_string();
    let mut w = pvs
        .watch(&WatchParams::default(), &cur)
        .await
        .unwrap()
        .boxed();
    // periodic bookmarks at the configured interval
    match next(&mut w).await.unwrap().unwrap() {
        WatchEvent::Bookmark(b) => assert!(
            b.metadata.resource_version.parse::<u64>().unwrap() >= cur.parse::<u64>().unwrap()
        ),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    sim.drop_watches();
    loop {
        match next(&mut w).await {
            None => break,
            Some(Ok(WatchEvent::Bookmark(_))) => continue,
            Some(other) => panic!("{other:?}"),
        }
    }
}

/// Simulator-only: streaming lists (`sendInitialEvents`, the WatchList
/// feature, alpha in v1.27) do not exist on the real v1.19 server.
#[tokio::test]
async fn streaming_list_watcher() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    for i in 0..5 {
        pvs.create(&PostParams::default(), &pv(&format!("s{i}")))
            .await
            .unwrap();
    }
    let (reader, writer) = reflector::store();
    let stream = reflector(
        writer,
        watcher(pvs.clone(), watcher::Config::default().streaming_lists()),
    )
    .boxed();
    let task = tokio::spawn(async move {
        let _ = stream.try_for_each(|_| async { Ok(()) }).await;
    });
    tokio::time::timeout(Duration::from_secs(5), reader.wait_until_ready())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(reader.state().len(), 5);
    task.abort();
}
