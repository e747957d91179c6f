//! Watch conformance: replay from a resourceVersion, 410 Expired inside the stream,
//! bookmarks, server-side timeout, selector transitions, forced disconnects, and
//! kube-runtime's watcher/reflector staying in sync.

use e2e::sim::{SimConfig, Simulator};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::runtime::{reflector, watcher, WatchStreamExt};
use serde_json::json;
use std::time::Duration;

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

async fn next<T>(s: &mut (impl futures::Stream<Item = T> + Unpin)) -> Option<T> {
    tokio::time::timeout(Duration::from_secs(5), s.next())
        .await
        .expect("watch event within 5s")
}

#[tokio::test]
async fn watch_replays_changes_after_rv() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    let a = pvs.create(&PostParams::default(), &pv("a")).await.unwrap();
    pvs.create(&PostParams::default(), &pv("b")).await.unwrap();
    pvs.patch(
        "a",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "1"}}})),
    )
    .await
    .unwrap();
    pvs.delete("b", &DeleteParams::default()).await.unwrap();
    let from = a.metadata.resource_version.unwrap();
    let mut w = pvs
        .watch(&WatchParams::default(), &from)
        .await
        .unwrap()
        .boxed();
    let mut seen = Vec::new();
    for _ in 0..3 {
        match next(&mut w).await.unwrap().unwrap() {
            WatchEvent::Added(o) => seen.push(format!("ADDED {}", o.metadata.name.unwrap())),
            WatchEvent::Modified(o) => seen.push(format!("MODIFIED {}", o.metadata.name.unwrap())),
            WatchEvent::Deleted(o) => seen.push(format!("DELETED {}", o.metadata.name.unwrap())),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(seen, ["ADDED b", "MODIFIED a", "DELETED b"]);
    // live events continue after the replay
    pvs.create(&PostParams::default(), &pv("c")).await.unwrap();
    match next(&mut w).await.unwrap().unwrap() {
        WatchEvent::Added(o) => assert_eq!(o.metadata.name.as_deref(), Some("c")),
        other => panic!("{other:?}"),
    }
    // resourceVersion "0": synthetic ADDED for current objects
    let mut w0 = pvs
        .watch(&WatchParams::default(), "0")
        .await
        .unwrap()
        .boxed();
    let mut names = Vec::new();
    for _ in 0..2 {
        if let WatchEvent::Added(o) = next(&mut w0).await.unwrap().unwrap() {
            names.push(o.metadata.name.unwrap());
        }
    }
    names.sort();
    assert_eq!(names, ["a", "c"]);
}

#[tokio::test]
async fn watch_from_too_old_rv_gets_410_expired_in_stream() {
    let sim = Simulator::start(SimConfig {
        history_window: 5,
        ..SimConfig::bare()
    })
    .await
    .unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    let first = pvs.create(&PostParams::default(), &pv("p0")).await.unwrap();
    for i in 1..20 {
        pvs.create(&PostParams::default(), &pv(&format!("p{i}")))
            .await
            .unwrap();
    }
    let mut w = pvs
        .watch(
            &WatchParams::default(),
            &first.metadata.resource_version.unwrap(),
        )
        .await
        .unwrap()
        .boxed();
    match next(&mut w).await.unwrap().unwrap() {
        WatchEvent::Error(e) => {
            assert_eq!((e.code, e.reason.as_str()), (410, "Expired"));
            assert!(
                e.message.starts_with("too old resource version: "),
                "{}",
                e.message
            );
        }
        other => panic!("expected ERROR 410, got {other:?}"),
    }
    assert!(next(&mut w).await.is_none(), "stream ends after the error");
    // raw shape of the error event, as the real server sends it
    let r = e2e::sim::raw::request(
        sim.addr(),
        "GET",
        "/api/v1/persistentvolumes?watch=true&resourceVersion=2",
        None,
        b"",
    )
    .await
    .unwrap();
    assert_eq!(r.status, 200);
    let line: serde_json::Value =
        serde_json::from_slice(r.body.split(|b| *b == b'\n').next().unwrap()).unwrap();
    assert_eq!(line["type"], "ERROR");
    assert_eq!(line["object"]["kind"], "Status");
    assert_eq!(line["object"]["status"], "Failure");
    assert_eq!(line["object"]["code"], 410);
    assert_eq!(line["object"]["reason"], "Expired");
}

#[tokio::test]
async fn bookmarks_timeout_and_drop() {
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
    match next(&mut w).await.unwrap().unwrap() {
        WatchEvent::Bookmark(b) => assert!(
            b.metadata.resource_version.parse::<u64>().unwrap() >= cur.parse::<u64>().unwrap()
        ),
        other => panic!("expected BOOKMARK, got {other:?}"),
    }
    // without allowWatchBookmarks: none
    let mut nb = pvs
        .watch(&WatchParams::default().disable_bookmarks().timeout(1), &cur)
        .await
        .unwrap()
        .boxed();
    let t0 = std::time::Instant::now();
    assert!(
        next(&mut nb).await.is_none(),
        "no events, stream ends at timeoutSeconds"
    );
    let el = t0.elapsed();
    assert!(
        el >= Duration::from_millis(900) && el < Duration::from_secs(3),
        "{el:?}"
    );
    // drop all watches
    sim.drop_watches();
    loop {
        match next(&mut w).await {
            None => break,
            Some(Ok(WatchEvent::Bookmark(_))) => continue,
            Some(other) => panic!("{other:?}"),
        }
    }
}

#[tokio::test]
async fn selector_transitions_in_watch() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let pvs: Api<PersistentVolume> = Api::all(sim.client().unwrap());
    let cur = sim.resource_version().to_string();
    let mut w = pvs
        .watch(&WatchParams::default().labels("team=a"), &cur)
        .await
        .unwrap()
        .boxed();
    pvs.create(&PostParams::default(), &pv("x")).await.unwrap();
    let lab = |v: &str| Patch::Merge(json!({"metadata": {"labels": {"team": v}}}));
    pvs.patch("x", &PatchParams::default(), &lab("a"))
        .await
        .unwrap();
    pvs.patch("x", &PatchParams::default(), &lab("b"))
        .await
        .unwrap();
    let kinds: Vec<&str> = vec![
        match next(&mut w).await.unwrap().unwrap() {
            WatchEvent::Added(_) => "ADDED",
            _ => "other",
        },
        match next(&mut w).await.unwrap().unwrap() {
            WatchEvent::Deleted(_) => "DELETED",
            _ => "other",
        },
    ];
    assert_eq!(kinds, ["ADDED", "DELETED"]);
}

#[tokio::test]
async fn kube_runtime_watcher_and_reflector_stay_in_sync() {
    let sim = Simulator::start(SimConfig::bare()).await.unwrap();
    let client = sim.client().unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
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
            for _ in 0..500 {
                if reader.state().len() == n {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("reflector has {} objects, want {n}", reader.state().len());
        }
    };
    wait(50).await;
    // watches dropped: the watcher re-watches from its last RV and sees later changes
    sim.drop_watches();
    tokio::time::sleep(Duration::from_millis(50)).await;
    for i in 0..5 {
        pvcs.create(&PostParams::default(), &pvc(&format!("late-{i}")))
            .await
            .unwrap();
    }
    wait(55).await;
    assert!(sim.stats().verb("watch") >= 2);
    task.abort();
}

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
