//! Throughput of the API-server simulator on this machine: creates per second over HTTP
//! (kube-rs clients), watch events delivered per second, and the PV-controller emulation
//! binding rate. Run in release mode: `cargo run -p e2e --release --bin sim-bench`.

use clap::Parser;
use e2e::sim::{SimConfig, Simulator};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams, WatchEvent, WatchParams};
use serde_json::json;
use std::time::{Duration, Instant};

#[derive(Parser, Debug)]
struct Args {
    /// Objects to create in the create benchmark.
    #[arg(long, default_value_t = 5000)]
    creates: usize,
    /// Concurrent create requests.
    #[arg(long, default_value_t = 32)]
    concurrency: usize,
    /// Concurrent watchers in the watch benchmark.
    #[arg(long, default_value_t = 10)]
    watchers: usize,
    /// Objects created while watchers watch.
    #[arg(long, default_value_t = 2000)]
    watch_objects: usize,
    /// Claims (and volumes) in the binding benchmark.
    #[arg(long, default_value_t = 1000)]
    claims: usize,
}

fn pvc(name: &str, class: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}, "storageClassName": class}
    }))
    .unwrap()
}

fn pv_for(c: &PersistentVolumeClaim) -> PersistentVolume {
    serde_json::from_value(json!({
        "metadata": {"name": format!("pvc-{}", c.metadata.uid.as_ref().unwrap())},
        "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"], "hostPath": {"path": "/tmp/x"},
                 "storageClassName": c.spec.as_ref().unwrap().storage_class_name,
                 "claimRef": {"kind": "PersistentVolumeClaim", "apiVersion": "v1", "namespace": "default",
                              "name": c.metadata.name, "uid": c.metadata.uid}}
    }))
    .unwrap()
}

async fn bench_creates(a: &Args) -> anyhow::Result<f64> {
    let sim = Simulator::start(SimConfig::bare()).await?;
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(sim.client()?);
    let t = Instant::now();
    futures::stream::iter(0..a.creates)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pvc(&format!("c-{i}"), "x"))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(a.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let el = t.elapsed();
    Ok(a.creates as f64 / el.as_secs_f64())
}

async fn bench_watch(a: &Args) -> anyhow::Result<(f64, Duration)> {
    let sim = Simulator::start(SimConfig::bare()).await?;
    let client = sim.client()?;
    let api: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let rv = sim.resource_version().to_string();
    let mut tasks = Vec::new();
    let n = a.watch_objects;
    for _ in 0..a.watchers {
        let stream = api
            .watch(&WatchParams::default().disable_bookmarks(), &rv)
            .await?;
        tasks.push(tokio::spawn(async move {
            let mut s = stream.boxed();
            let mut got = 0;
            while got < n {
                match s.next().await {
                    Some(Ok(WatchEvent::Added(_))) => got += 1,
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return Err(anyhow::anyhow!("watch error: {e}")),
                    None => return Err(anyhow::anyhow!("watch ended early")),
                }
            }
            Ok(Instant::now())
        }));
    }
    let t = Instant::now();
    futures::stream::iter(0..n)
        .map(|i| {
            let api = api.clone();
            async move {
                api.create(&PostParams::default(), &pvc(&format!("w-{i}"), "x"))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(a.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let create_done = t.elapsed();
    let mut last = t;
    for task in tasks {
        last = last.max(task.await??);
    }
    let el = last - t;
    Ok((
        (n * a.watchers) as f64 / el.as_secs_f64(),
        el.saturating_sub(create_done),
    ))
}

async fn bench_binding(a: &Args) -> anyhow::Result<(Duration, Duration)> {
    let sim = Simulator::start(SimConfig::default()).await?;
    let client = sim.client()?;
    let sc: StorageClass = serde_json::from_value(
        json!({"metadata": {"name": "ext"}, "provisioner": "example.com/x"}),
    )?;
    Api::<StorageClass>::all(client.clone())
        .create(&PostParams::default(), &sc)
        .await?;
    let claims: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let t = Instant::now();
    let created: Vec<PersistentVolumeClaim> = futures::stream::iter(0..a.claims)
        .map(|i| {
            let claims = claims.clone();
            async move {
                claims
                    .create(&PostParams::default(), &pvc(&format!("b-{i}"), "ext"))
                    .await
            }
        })
        .buffer_unordered(a.concurrency)
        .try_collect()
        .await?;
    futures::stream::iter(created.iter())
        .map(|c| {
            let pvs = pvs.clone();
            async move {
                pvs.create(&PostParams::default(), &pv_for(c))
                    .await
                    .map(|_| ())
            }
        })
        .buffer_unordered(a.concurrency)
        .try_collect::<Vec<_>>()
        .await?;
    let api_time = t.elapsed();
    loop {
        let bound = sim
            .objects("persistentvolumeclaims")
            .iter()
            .filter(|o| o["status"]["phase"] == "Bound")
            .count();
        if bound == a.claims {
            break;
        }
        if t.elapsed() > Duration::from_secs(120) {
            anyhow::bail!("only {bound} of {} claims bound", a.claims);
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    Ok((api_time, t.elapsed()))
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    let a = Args::parse();
    let creates = bench_creates(&a).await?;
    println!(
        "creates: {:.0} req/s ({} PVC creates over HTTP by kube-rs, {} in flight)",
        creates, a.creates, a.concurrency
    );
    let (events, lag) = bench_watch(&a).await?;
    println!(
        "watch delivery: {:.0} events/s ({} watchers x {} objects; last event {} ms after the last create)",
        events,
        a.watchers,
        a.watch_objects,
        lag.as_millis()
    );
    let (api, total) = bench_binding(&a).await?;
    println!(
        "binding: {} claims + {} volumes created in {} ms, all claims Bound by the PV-controller emulation after {} ms",
        a.claims,
        a.claims,
        api.as_millis(),
        total.as_millis()
    );
    Ok(())
}
