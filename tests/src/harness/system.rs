//! The whole system, as it runs in a cluster but on one machine: an
//! API-server simulator (in-process `e2e::sim`, with PV-controller
//! emulation) or a real cluster, a private `redis-server` with AOF, and the
//! three service binaries as separate processes, plus helpers to create
//! StorageClasses, claims and nodes and to count PVs, directories and events.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{json, Value};

use super::binaries::{Binaries, Profile};
use super::redis::RedisServer;
use super::services::{Service, ServiceProcess, ServiceSettings};
use super::wait::{wait_eq, wait_for};
use crate::sim::{SimConfig, SimHandle, Simulator};

/// How to start a [`System`].
#[derive(Debug, Clone)]
pub struct SystemOptions {
    /// Replicas of each service (leader election picks one active replica).
    pub replicas: usize,
    /// Which profile's service binaries to run.
    pub profile: Profile,
    /// Run against this cluster instead of the in-process simulator.
    pub external_kubeconfig: Option<PathBuf>,
    /// Simulator configuration (ignored with `external_kubeconfig`).
    pub sim: SimConfig,
    /// Namespace of the claims (and the Leases).
    pub namespace: String,
    /// Keep the temporary directory (logs, Redis data, base dir) after drop.
    pub keep_dir: bool,
    /// Adjust the service flags before the services start.
    pub configure: Option<fn(&mut ServiceSettings)>,
    /// Do not start the services (the caller starts them with [`System::start_service`]).
    pub no_services: bool,
}

impl Default for SystemOptions {
    fn default() -> Self {
        Self {
            replicas: 1,
            profile: Profile::current(),
            external_kubeconfig: None,
            sim: SimConfig::default(),
            namespace: "default".into(),
            keep_dir: false,
            configure: None,
            no_services: false,
        }
    }
}

/// A running system. Dropping it kills every service replica, Redis and the
/// simulator, and removes the temporary directory (unless kept).
pub struct System {
    /// Service replicas (dropped, that is killed, first).
    pub services: Vec<ServiceProcess>,
    /// The private Redis.
    pub redis: RedisServer,
    /// The in-process simulator (`None` against a real cluster).
    pub sim: Option<SimHandle>,
    /// Client for the harness's own reads and writes.
    pub client: kube::Client,
    /// The service flags in use (restarts reuse them).
    pub settings: ServiceSettings,
    /// The binaries.
    pub bins: Binaries,
    /// Namespace of the claims.
    pub namespace: String,
    /// Root of the run's files: `base/` (hostpath volumes), `logs/`, `redis/`.
    pub root: PathBuf,
    _dir: Option<tempfile::TempDir>,
}

impl System {
    /// Build (if needed) and start everything; with `opts.replicas` > 0 and
    /// services enabled, waits until each replica serves `/healthz` (30 s).
    ///
    /// Errors: a build, Redis, simulator or service start failure.
    pub async fn start(opts: SystemOptions) -> anyhow::Result<Self> {
        let bins = Binaries::ensure_built(opts.profile)?;
        let dir = tempfile::Builder::new()
            .prefix("split-provisioner-e2e-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let (base_dir, log_dir) = (root.join("base"), root.join("logs"));
        std::fs::create_dir_all(&base_dir)?;
        std::fs::create_dir_all(&log_dir)?;
        let redis = RedisServer::start(&root.join("redis"), &log_dir.join("redis.log")).await?;
        let (sim, kubeconfig, client) = match &opts.external_kubeconfig {
            Some(path) => {
                let kc = kube::config::Kubeconfig::read_from(path)
                    .with_context(|| format!("reading kubeconfig {}", path.display()))?;
                let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
                (None, path.clone(), kube::Client::try_from(cfg)?)
            }
            None => {
                let sim = Simulator::start(opts.sim.clone()).await?;
                let kc = root.join("kubeconfig");
                sim.write_kubeconfig(&kc)?;
                let client = sim.client()?;
                (Some(sim), kc, client)
            }
        };
        let mut settings = ServiceSettings::new(&kubeconfig, &redis.url(), &base_dir, &log_dir);
        settings.lease_namespace = opts.namespace.clone();
        if let Some(f) = opts.configure {
            f(&mut settings);
        }
        let keep = opts.keep_dir;
        let mut sys = Self {
            services: Vec::new(),
            redis,
            sim,
            client,
            settings,
            bins,
            namespace: opts.namespace.clone(),
            root,
            _dir: if keep {
                let _ = dir.keep();
                None
            } else {
                Some(dir)
            },
        };
        if !opts.no_services {
            for service in Service::ALL {
                for replica in 0..opts.replicas {
                    sys.start_service(service, replica).await?;
                }
            }
        }
        Ok(sys)
    }

    /// Start replica `replica` of `service` and wait until it is healthy (30 s).
    ///
    /// Errors: see [`ServiceProcess::start`] and [`ServiceProcess::wait_healthy`].
    pub async fn start_service(&mut self, service: Service, replica: usize) -> anyhow::Result<()> {
        let mut p = ServiceProcess::start(service, replica, &self.bins, &self.settings)?;
        p.wait_healthy(Duration::from_secs(30)).await?;
        self.services.push(p);
        Ok(())
    }

    /// The hostpath backend's base directory.
    pub fn base_dir(&self) -> &Path {
        &self.settings.base_dir
    }

    /// The directory of the log files.
    pub fn log_dir(&self) -> &Path {
        &self.settings.log_dir
    }

    /// The simulator; panics against a real cluster.
    pub fn sim(&self) -> &SimHandle {
        self.sim.as_ref().expect("running against the simulator")
    }

    /// Replica `replica` of `service`.
    pub fn service(&mut self, service: Service, replica: usize) -> &mut ServiceProcess {
        self.services
            .iter_mut()
            .find(|p| p.service == service && p.replica == replica)
            .unwrap_or_else(|| panic!("no replica {replica} of {service:?}"))
    }

    /// SIGKILL replica `replica` of `service`.
    pub fn kill(&mut self, service: Service, replica: usize) {
        self.service(service, replica).kill();
    }

    /// Restart replica `replica` of `service` (SIGKILL if running) and wait until healthy.
    ///
    /// Errors: see [`System::start_service`].
    pub async fn restart(&mut self, service: Service, replica: usize) -> anyhow::Result<()> {
        let (bins, settings) = (self.bins.clone(), self.settings.clone());
        let p = self.service(service, replica);
        p.restart(&bins, &settings)?;
        p.wait_healthy(Duration::from_secs(30)).await
    }

    /// Restart every replica whose process has exited (as the kubelet restarts
    /// a container: a replica that lost its Lease exits non-zero). Returns how
    /// many were restarted.
    ///
    /// Errors: a restart failed.
    pub async fn restart_exited(&mut self) -> anyhow::Result<usize> {
        let exited: Vec<(Service, usize)> = self
            .services
            .iter_mut()
            .filter_map(|p| (!p.process.is_running()).then_some((p.service, p.replica)))
            .collect();
        for (s, r) in &exited {
            self.restart(*s, *r).await?;
        }
        Ok(exited.len())
    }

    /// Holder identity of `service`'s Lease, if any.
    pub async fn lease_holder(&self, service: Service) -> Option<String> {
        let name = service.lease_name(&self.settings.provisioner_name);
        let lease: Lease = self.read_one("leases.coordination.k8s.io", &name).await?;
        lease.spec?.holder_identity
    }

    /// Wait until `service`'s Lease is held by one of the running replicas and
    /// that replica reports itself leader; returns its replica index.
    ///
    /// Errors: timeout.
    pub async fn wait_leader(
        &mut self,
        service: Service,
        timeout: Duration,
    ) -> anyhow::Result<usize> {
        let what = format!("a running {} replica to lead", service.binary_name());
        let start = std::time::Instant::now();
        loop {
            if let Some(holder) = self.lease_holder(service).await {
                let found = self
                    .services
                    .iter_mut()
                    .filter(|p| p.service == service)
                    .find(|p| p.identity() == holder)
                    .filter(|p| p.process_running())
                    .map(|p| (p.replica, p.http_addr));
                if let Some((replica, addr)) = found {
                    if let Ok(m) = super::metrics::MetricsPage::scrape(addr).await {
                        if m.sum("leader_election_master_status") >= 1.0 {
                            return Ok(replica);
                        }
                    }
                }
            }
            if start.elapsed() > timeout {
                anyhow::bail!("timed out after {timeout:?} waiting for {what}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Wait until every service has a leader.
    ///
    /// Errors: timeout.
    pub async fn wait_leaders(&mut self, timeout: Duration) -> anyhow::Result<()> {
        for s in Service::ALL {
            self.wait_leader(s, timeout).await?;
        }
        Ok(())
    }

    // ----- objects -------------------------------------------------------

    /// Create a StorageClass `name` for our provisioner with `binding_mode`
    /// (`Immediate`/`WaitForFirstConsumer`), reclaim policy `Delete` and `parameters`.
    ///
    /// Errors: the API rejects it.
    pub async fn create_storage_class(
        &self,
        name: &str,
        binding_mode: &str,
        parameters: &[(&str, &str)],
    ) -> anyhow::Result<()> {
        let params: BTreeMap<&str, &str> = parameters.iter().copied().collect();
        let sc: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": self.settings.provisioner_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": binding_mode,
            "parameters": params,
        }))?;
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &sc)
            .await
            .with_context(|| format!("creating StorageClass {name}"))?;
        Ok(())
    }

    /// Create a Node object `name` (the hostpath backend's selected-node checks
    /// and the reschedule scenario read Nodes).
    ///
    /// Errors: the API rejects it.
    pub async fn create_node(&self, name: &str) -> anyhow::Result<()> {
        let node: Node = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}},
        }))?;
        Api::<Node>::all(self.client.clone())
            .create(&PostParams::default(), &node)
            .await
            .with_context(|| format!("creating Node {name}"))?;
        Ok(())
    }

    /// A claim manifest: `ReadWriteOnce`, `1Mi`, class `class`, with extra
    /// annotations (e.g. the selected node).
    pub fn claim_manifest(
        &self,
        name: &str,
        class: &str,
        annotations: &[(&str, &str)],
    ) -> PersistentVolumeClaim {
        let ann: BTreeMap<&str, &str> = annotations.iter().copied().collect();
        serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "metadata": {"name": name, "namespace": self.namespace, "annotations": ann},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": class,
                "resources": {"requests": {"storage": "1Mi"}},
            },
        }))
        .expect("valid claim manifest")
    }

    /// Create one claim; returns its UID.
    ///
    /// Errors: the API rejects it.
    pub async fn create_claim(
        &self,
        name: &str,
        class: &str,
        annotations: &[(&str, &str)],
    ) -> anyhow::Result<String> {
        let c = self
            .claims_api()
            .create(
                &PostParams::default(),
                &self.claim_manifest(name, class, annotations),
            )
            .await
            .with_context(|| format!("creating claim {name}"))?;
        Ok(c.metadata.uid.unwrap_or_default())
    }

    /// Create claims `<prefix>-0000` … `<prefix>-<n-1>` (16 in flight); returns
    /// their names in order.
    ///
    /// Errors: the first API rejection.
    pub async fn create_claims(
        &self,
        prefix: &str,
        n: usize,
        class: &str,
    ) -> anyhow::Result<Vec<String>> {
        let names: Vec<String> = (0..n).map(|i| format!("{prefix}-{i:04}")).collect();
        futures::stream::iter(names.clone())
            .map(|name| async move { self.create_claim(&name, class, &[]).await })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(names)
    }

    /// Delete claims by name (16 in flight); a missing claim is fine.
    ///
    /// Errors: any other API error.
    pub async fn delete_claims(&self, names: &[String]) -> anyhow::Result<()> {
        let api = self.claims_api();
        futures::stream::iter(names.to_vec())
            .map(|name| {
                let api = api.clone();
                async move {
                    match api.delete(&name, &DeleteParams::default()).await {
                        Ok(_) => Ok(()),
                        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
                        Err(e) => {
                            Err(anyhow::Error::from(e).context(format!("deleting claim {name}")))
                        }
                    }
                }
            })
            .buffer_unordered(16)
            .try_collect::<Vec<_>>()
            .await?;
        Ok(())
    }

    /// Claims API in the system's namespace.
    pub fn claims_api(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn read_all<T>(&self, sim_resource: &str) -> anyhow::Result<Vec<T>>
    where
        T: DeserializeOwned
            + Clone
            + std::fmt::Debug
            + kube::Resource<DynamicType = (), Scope = k8s_openapi::ClusterResourceScope>,
    {
        match &self.sim {
            Some(sim) => sim
                .objects(sim_resource)
                .into_iter()
                .map(|v| Ok(serde_json::from_value(v)?))
                .collect(),
            None => Ok(Api::<T>::all(self.client.clone())
                .list(&ListParams::default())
                .await?
                .items),
        }
    }

    async fn read_one<T: DeserializeOwned>(&self, sim_resource: &str, name: &str) -> Option<T> {
        let v: Value = match &self.sim {
            Some(sim) => sim.object(sim_resource, &self.namespace, name)?,
            None => {
                let api: Api<kube::api::DynamicObject> = Api::namespaced_with(
                    self.client.clone(),
                    &self.namespace,
                    &kube::api::ApiResource::erase::<Lease>(&()),
                );
                serde_json::to_value(api.get_opt(name).await.ok()??).ok()?
            }
        };
        serde_json::from_value(v).ok()
    }

    /// PVs provisioned by our provisioner name (`pv.kubernetes.io/provisioned-by`).
    ///
    /// Errors: the API or decoding failed.
    pub async fn pvs(&self) -> anyhow::Result<Vec<PersistentVolume>> {
        let ours = self.settings.provisioner_name.clone();
        Ok(self
            .read_all::<PersistentVolume>("persistentvolumes")
            .await?
            .into_iter()
            .filter(|pv| {
                pv.metadata
                    .annotations
                    .as_ref()
                    .and_then(|a| a.get(api_types::ANN_DYNAMICALLY_PROVISIONED))
                    == Some(&ours)
            })
            .collect())
    }

    /// Claims in the system's namespace.
    ///
    /// Errors: the API or decoding failed.
    pub async fn claims(&self) -> anyhow::Result<Vec<PersistentVolumeClaim>> {
        match &self.sim {
            Some(sim) => sim
                .objects("persistentvolumeclaims")
                .into_iter()
                .filter(|v| v["metadata"]["namespace"] == json!(self.namespace))
                .map(|v| Ok(serde_json::from_value(v)?))
                .collect(),
            None => Ok(self.claims_api().list(&ListParams::default()).await?.items),
        }
    }

    /// Number of claims in phase `Bound`.
    ///
    /// Errors: see [`System::claims`].
    pub async fn bound_claims(&self) -> anyhow::Result<usize> {
        Ok(self
            .claims()
            .await?
            .iter()
            .filter(|c| c.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound"))
            .count())
    }

    /// Number of entries (volume directories) in the hostpath base directory.
    pub fn dir_count(&self) -> usize {
        count_dirs(self.base_dir())
    }

    /// Events by reason (core/v1 and events.k8s.io/v1 together), e.g.
    /// `{"Provisioning": 100, "ProvisioningSucceeded": 100}`. For the simulator
    /// only; against a real cluster this lists both APIs.
    ///
    /// Errors: the API failed.
    pub async fn events_by_reason(&self) -> anyhow::Result<BTreeMap<String, usize>> {
        let mut out = BTreeMap::new();
        for e in self.event_values().await? {
            if let Some(r) = e["reason"].as_str() {
                *out.entry(r.to_string()).or_default() += 1;
            }
        }
        Ok(out)
    }

    /// Every event object (core/v1 and events.k8s.io/v1) as JSON.
    ///
    /// Errors: the API failed.
    pub async fn event_values(&self) -> anyhow::Result<Vec<Value>> {
        Ok(match &self.sim {
            Some(sim) => {
                let mut v = sim.objects("events");
                v.extend(sim.objects("events.events.k8s.io"));
                v
            }
            None => {
                let mut v = Vec::new();
                let core: Api<k8s_openapi::api::core::v1::Event> = Api::all(self.client.clone());
                for e in core.list(&ListParams::default()).await?.items {
                    v.push(serde_json::to_value(e)?);
                }
                let ev: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
                for e in ev.list(&ListParams::default()).await?.items {
                    v.push(serde_json::to_value(e)?);
                }
                v
            }
        })
    }

    /// Number of distinct objects (claims) that have at least one event with
    /// `reason` (`regarding` of events.k8s.io/v1, `involvedObject` of core/v1).
    /// Unlike [`System::events`], a retried emission after a crash does not
    /// change it.
    ///
    /// Errors: see [`System::events_by_reason`].
    pub async fn objects_with_event(&self, reason: &str) -> anyhow::Result<usize> {
        let mut names = std::collections::BTreeSet::new();
        for e in self.event_values().await? {
            if e["reason"].as_str() == Some(reason) {
                let obj = if e["regarding"].is_object() {
                    &e["regarding"]
                } else {
                    &e["involvedObject"]
                };
                names.insert(format!(
                    "{}/{}/{}",
                    obj["kind"].as_str().unwrap_or(""),
                    obj["namespace"].as_str().unwrap_or(""),
                    obj["name"].as_str().unwrap_or("")
                ));
            }
        }
        Ok(names.len())
    }

    /// Count of events with `reason`.
    ///
    /// Errors: see [`System::events_by_reason`].
    pub async fn events(&self, reason: &str) -> anyhow::Result<usize> {
        Ok(self
            .events_by_reason()
            .await?
            .get(reason)
            .copied()
            .unwrap_or(0))
    }

    /// Wait until exactly `n` of our PVs exist, `n` claims are Bound and `n`
    /// volume directories exist; returns the time it took.
    ///
    /// Errors: timeout (the message shows the last counts).
    pub async fn wait_provisioned(&self, n: usize, timeout: Duration) -> anyhow::Result<Duration> {
        wait_eq(
            timeout,
            "(PVs, bound claims, directories)",
            (n, n, n),
            || async {
                Ok((
                    self.pvs().await?.len(),
                    self.bound_claims().await?,
                    self.dir_count(),
                ))
            },
        )
        .await
    }

    /// Wait until none of our PVs and no volume directories remain.
    ///
    /// Errors: timeout (the message shows the last counts).
    pub async fn wait_reclaimed(&self, timeout: Duration) -> anyhow::Result<Duration> {
        wait_eq(timeout, "(PVs, directories)", (0, 0), || async {
            Ok((self.pvs().await?.len(), self.dir_count()))
        })
        .await
    }

    /// Wait until the claim `name` exists and has a PV named `pvc-<uid>`; returns the PV.
    ///
    /// Errors: timeout.
    pub async fn wait_pv_for_claim(
        &self,
        name: &str,
        timeout: Duration,
    ) -> anyhow::Result<PersistentVolume> {
        wait_for(timeout, &format!("the PV of claim {name}"), || async {
            let claim = self
                .claims()
                .await
                .ok()?
                .into_iter()
                .find(|c| c.metadata.name.as_deref() == Some(name))?;
            let pv_name = api_types::pv_name_for_claim_uid(claim.metadata.uid.as_deref()?);
            self.pvs()
                .await
                .ok()?
                .into_iter()
                .find(|p| p.metadata.name.as_deref() == Some(pv_name.as_str()))
        })
        .await
    }

    /// Log tails of every replica (for failure messages).
    pub fn log_tails(&self, lines: usize) -> String {
        self.services
            .iter()
            .map(|p| format!("==== {} ====\n{}\n", p.identity(), p.log_tail(lines)))
            .collect()
    }

    /// Stop every replica with SIGTERM (5 s grace, then SIGKILL), then Redis.
    pub fn shutdown(&mut self) {
        for p in &mut self.services {
            p.process.terminate(Duration::from_secs(5));
        }
        self.redis.stop(false);
        if let Some(sim) = &self.sim {
            sim.shutdown();
        }
    }
}

/// Number of entries directly inside `dir` (0 when it does not exist), not
/// counting the nfs-subdir backend's bookkeeping directory (`.split-provisioner`).
pub fn count_dirs(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name() != common::backend::nfs_subdir::registry::REGISTRY_DIR)
                .count()
        })
        .unwrap_or(0)
}
