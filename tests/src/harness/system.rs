//! The whole system, as it runs in a cluster but on one machine: a control
//! plane (the in-process `e2e::sim` simulator with PV-controller emulation, a
//! real kube-apiserver + kube-controller-manager, or an existing cluster; see
//! [`super::plane`]), a private `redis-server` with AOF, and the
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
use super::plane::{ControlPlane, Outage, Plane, RealPlane};
use super::redis::{RedisSecurity, RedisServer};
use super::services::{Service, ServiceProcess, ServiceSettings};
use super::wait::{wait_eq, wait_for};
use crate::sim::SimHandle;

/// How to start a [`System`].
#[derive(Debug)]
pub struct SystemOptions {
    /// Replicas of each service (leader election picks one active replica).
    pub replicas: usize,
    /// Which profile's service binaries to run.
    pub profile: Profile,
    /// Run against this existing cluster instead of starting a control plane
    /// (`control_plane` is then ignored; every service uses this kubeconfig).
    pub external_kubeconfig: Option<PathBuf>,
    /// The control plane to start: the simulator (default) or a real cluster,
    /// where each service runs as its own ServiceAccount under the deploy's RBAC.
    pub control_plane: ControlPlane,
    /// Namespace of the claims (and, on the simulator, of the Leases; on a real
    /// control plane the Leases live in the deploy's namespace).
    pub namespace: String,
    /// Keep the temporary directory (logs, Redis data, base dir) after drop.
    pub keep_dir: bool,
    /// Adjust the service flags before the services start.
    pub configure: Option<fn(&mut ServiceSettings)>,
    /// Do not start the services (the caller starts them with [`System::start_service`]).
    pub no_services: bool,
    /// What the private Redis requires (default: open). With an ACL each
    /// service authenticates as its deploy user (`--redis-username`,
    /// `--redis-password-file`); with TLS each gets `--redis-ca-file`.
    pub redis_security: RedisSecurity,
    /// Options of a real control plane (ignored otherwise), e.g. the
    /// controller manager's client-side limit for the benchmark.
    pub real_cluster: crate::realkube::RealClusterOptions,
    /// Provisioner name on the simulator or an external cluster (default
    /// `example.com/hostpath`); a real control plane uses its deploy's.
    pub provisioner_name: Option<String>,
}

impl Default for SystemOptions {
    /// One replica each, on the simulator ([`ControlPlane::default`]), claims in `default`.
    fn default() -> Self {
        Self {
            replicas: 1,
            profile: Profile::current(),
            external_kubeconfig: None,
            control_plane: ControlPlane::default(),
            namespace: "default".into(),
            keep_dir: false,
            configure: None,
            no_services: false,
            redis_security: RedisSecurity::default(),
            real_cluster: Default::default(),
            provisioner_name: None,
        }
    }
}

/// A running system. Dropping it kills every service replica, Redis and the
/// control plane, and removes the temporary directory (unless kept). On a real
/// control plane, dropping it also runs [`System::finish_checks`] (no
/// `Forbidden` in any service log, every audited call declared) and panics with
/// the problems, unless they were already checked or the thread is panicking.
pub struct System {
    /// Service replicas (dropped, that is killed, first).
    pub services: Vec<ServiceProcess>,
    /// The private Redis.
    pub redis: RedisServer,
    /// The in-process simulator (`None` on a real or external cluster).
    pub sim: Option<std::sync::Arc<SimHandle>>,
    /// The control plane (dropped after the services: its drop-time audit check
    /// needs the cluster).
    pub plane: Plane,
    /// Client for the harness's own reads and writes (admin on a real cluster).
    pub client: kube::Client,
    /// The service flags in use (restarts reuse them).
    pub settings: ServiceSettings,
    /// The binaries.
    pub bins: Binaries,
    /// Namespace of the claims.
    pub namespace: String,
    /// Root of the run's files: `base/` (hostpath volumes), `logs/`, `redis/`.
    pub root: PathBuf,
    checks_done: bool,
    _dir: Option<tempfile::TempDir>,
}

impl System {
    /// A system on `plane` (one replica each; `configure` adjusts the service flags) whose
    /// services all elected a leader. Panics when it does not start (a test's set-up).
    pub async fn started(
        plane: ControlPlane,
        configure: Option<fn(&mut ServiceSettings)>,
    ) -> System {
        let mut sys = System::start(SystemOptions {
            control_plane: plane,
            configure,
            ..Default::default()
        })
        .await
        .expect("system starts");
        sys.wait_leaders(Duration::from_secs(30))
            .await
            .expect("every service elects a leader");
        sys
    }

    /// Build (if needed) and start everything; with `opts.replicas` > 0 and
    /// services enabled, waits until each replica serves `/healthz` (30 s).
    ///
    /// On a real control plane ([`ControlPlane::Real`]) the deploy's RBAC is
    /// created first, each service gets its ServiceAccount's kubeconfig, the
    /// Leases live in the deploy's namespace and the provisioner name is the
    /// deploy's `PROVISIONER_NAME` (so the Lease Roles' `resourceNames` apply).
    ///
    /// Errors: a build, Redis, control-plane or service start failure.
    pub async fn start(opts: SystemOptions) -> anyhow::Result<Self> {
        let bins = Binaries::ensure_built(opts.profile)?;
        let dir = tempfile::Builder::new()
            .prefix("split-provisioner-e2e-")
            .tempdir()?;
        let root = dir.path().to_path_buf();
        let (base_dir, log_dir) = (root.join("base"), root.join("logs"));
        std::fs::create_dir_all(&base_dir)?;
        std::fs::create_dir_all(&log_dir)?;
        let plane = match &opts.external_kubeconfig {
            Some(path) => Plane::External(path.clone()),
            None => Plane::start_with(opts.control_plane, opts.real_cluster.clone()).await?,
        };
        let provisioner_name = match plane.real() {
            Some(real) => real.rbac.provisioner_name.clone(),
            None => opts
                .provisioner_name
                .clone()
                .unwrap_or_else(|| "example.com/hostpath".into()),
        };
        let redis = RedisServer::start_secured(
            &root.join("redis"),
            &log_dir.join("redis.log"),
            opts.redis_security,
            &provisioner_name,
        )
        .await?;
        let client = plane.admin_client().await?;
        let kubeconfig = plane.kubeconfig(Service::Provision, &root)?;
        let mut settings = ServiceSettings::new(&kubeconfig, &redis.url(), &base_dir, &log_dir);
        settings.redis_password_dir = redis.acl().map(|a| a.password_dir.clone());
        settings.redis_ca_file = redis.tls().map(|t| t.ca_file.clone());
        settings.lease_namespace = opts.namespace.clone();
        if let Some(real) = plane.real() {
            for s in Service::ALL {
                settings
                    .service_kubeconfigs
                    .insert(s, real.kubeconfig(s).to_path_buf());
            }
            settings.lease_namespaces = real.rbac.namespaces.clone();
        }
        settings.provisioner_name = provisioner_name;
        if let Some(f) = opts.configure {
            f(&mut settings);
        }
        let keep = opts.keep_dir;
        let mut sys = Self {
            services: Vec::new(),
            redis,
            sim: plane.sim().cloned(),
            plane,
            client,
            settings,
            bins,
            namespace: opts.namespace.clone(),
            root,
            checks_done: false,
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

    /// The simulator, for simulator-only steps (fault injection, latency,
    /// objects created behind the API); panics on a real control plane. A
    /// scenario that runs on both planes uses [`System::sim_handle`].
    pub fn sim(&self) -> &SimHandle {
        self.sim.as_ref().expect("running against the simulator")
    }

    /// The simulator, or `None` on a real or external cluster.
    pub fn sim_handle(&self) -> Option<&SimHandle> {
        self.sim.as_deref()
    }

    /// The real control plane (cluster, deploy RBAC), or `None`.
    pub fn real(&self) -> Option<&RealPlane> {
        self.plane.real()
    }

    /// Whether the services talk to a real API server.
    pub fn is_real(&self) -> bool {
        self.plane.is_real()
    }

    /// An API outage of `duration`: on the simulator 503 to every request and
    /// every watch dropped; on a real cluster kube-apiserver is stopped, then
    /// started again with the same flags (waits until it is ready).
    ///
    /// Errors: kube-apiserver failed to stop or start; an external cluster.
    pub async fn api_outage(&mut self, duration: Duration) -> anyhow::Result<()> {
        self.plane.api_outage(duration).await
    }

    /// Begin an API outage (see [`System::api_outage`]); end it with [`System::end_outage`].
    ///
    /// Errors: as [`Plane::begin_outage`].
    pub async fn begin_outage(&mut self) -> anyhow::Result<Outage> {
        self.plane.begin_outage().await
    }

    /// End an outage begun by [`System::begin_outage`].
    ///
    /// Errors: as [`Plane::end_outage`].
    pub async fn end_outage(&mut self, outage: Outage) -> anyhow::Result<()> {
        self.plane.end_outage(outage).await
    }

    /// The checks of a finished real-plane run: no service log line reports a
    /// refused call (`Forbidden`/403), and the audit log shows each service
    /// identity made only calls its `API_CALLS` declares (see
    /// [`RealPlane::finish_checks`]). Returns the report of granted calls no
    /// real-plane run exercised yet; nothing to check on the simulator.
    ///
    /// Errors: the offending log lines and calls.
    pub fn finish_checks(&mut self) -> Result<String, String> {
        self.checks_done = true;
        let Some(real) = self.plane.real_mut() else {
            return Ok(String::new());
        };
        real.check_on_drop = false;
        let mut problems = Vec::new();
        // A line naming a call the audit log shows refused only while a
        // restarted API server's RBAC authorizer synced is not a missing grant.
        let records = real.cluster.audit_records().unwrap_or_default();
        for p in &self.services {
            let lines: Vec<String> = super::rbac::forbidden_lines(&p.process.log_text())
                .into_iter()
                .filter(|l| !super::rbac::is_transient_forbidden_line(l, &records))
                .collect();
            if !lines.is_empty() {
                problems.push(format!(
                    "{} log reports refused API calls:\n{}",
                    p.identity(),
                    lines.join("\n")
                ));
            }
        }
        let report = match self.plane.real().map(|r| r.finish_checks()) {
            Some(Ok(r)) => r,
            Some(Err(e)) => {
                problems.push(e);
                String::new()
            }
            None => String::new(),
        };
        if problems.is_empty() {
            Ok(report)
        } else {
            Err(problems.join("\n"))
        }
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

    /// The replicas whose process has exited (service, replica index).
    pub fn exited_replicas(&mut self) -> Vec<(Service, usize)> {
        self.services
            .iter_mut()
            .filter_map(|p| (!p.process.is_running()).then_some((p.service, p.replica)))
            .collect()
    }

    /// Restart every replica whose process has exited (as the kubelet restarts
    /// a container: a replica that lost its Lease exits non-zero). Returns how
    /// many were restarted.
    ///
    /// Errors: a restart failed.
    pub async fn restart_exited(&mut self) -> anyhow::Result<usize> {
        let exited = self.exited_replicas();
        for (s, r) in &exited {
            self.restart(*s, *r).await?;
        }
        Ok(exited.len())
    }

    /// Holder identity of `service`'s Lease, if any.
    pub async fn lease_holder(&self, service: Service) -> Option<String> {
        let name = service.lease_name(&self.settings.provisioner_name);
        let lease: Lease = self.read_lease(service, &name).await?;
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
        self.create_storage_class_with(name, binding_mode, parameters, &[])
            .await
    }

    /// [`System::create_storage_class`] with `mountOptions`. Errors: the API rejects it.
    pub async fn create_storage_class_with(
        &self,
        name: &str,
        binding_mode: &str,
        parameters: &[(&str, &str)],
        mount_options: &[&str],
    ) -> anyhow::Result<()> {
        let params: BTreeMap<&str, &str> = parameters.iter().copied().collect();
        let sc: StorageClass = serde_json::from_value(json!({
            "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
            "metadata": {"name": name},
            "provisioner": self.settings.provisioner_name,
            "reclaimPolicy": "Delete",
            "volumeBindingMode": binding_mode,
            "parameters": params,
            "mountOptions": mount_options,
        }))?;
        Api::<StorageClass>::all(self.client.clone())
            .create(&PostParams::default(), &sc)
            .await
            .with_context(|| format!("creating StorageClass {name}"))?;
        Ok(())
    }

    /// Set `allowVolumeExpansion: true` on the StorageClass `name`. Errors: the API rejects it.
    pub async fn allow_expansion(&self, name: &str) -> anyhow::Result<()> {
        let allow = json!({"allowVolumeExpansion": true});
        Api::<StorageClass>::all(self.client.clone())
            .patch(
                name,
                &kube::api::PatchParams::default(),
                &kube::api::Patch::Merge(&allow),
            )
            .await
            .with_context(|| format!("allowing expansion in StorageClass {name}"))?;
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

    /// The Lease `name` in `service`'s Lease namespace (simulator: read from its store,
    /// bypassing injected faults; else a GET), `None` when absent or unreadable.
    async fn read_lease(&self, service: Service, name: &str) -> Option<Lease> {
        let ns = self.settings.lease_namespace_of(service);
        match &self.sim {
            Some(sim) => {
                serde_json::from_value(sim.object("leases.coordination.k8s.io", ns, name)?).ok()
            }
            None => Api::<Lease>::namespaced(self.client.clone(), ns)
                .get_opt(name)
                .await
                .ok()?,
        }
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

    /// Events by reason (see [`System::event_values`]), e.g.
    /// `{"Provisioning": 100, "ProvisioningSucceeded": 100}`.
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

    /// The notes of the events with `reason` (events.k8s.io `note`, core `message`).
    ///
    /// Errors: the API failed.
    pub async fn event_notes(&self, reason: &str) -> anyhow::Result<Vec<String>> {
        let events = self.event_values().await?.into_iter();
        let notes = events.filter(|e| e["reason"] == reason).map(|e| {
            let note = e["note"].as_str().or(e["message"].as_str());
            note.unwrap_or_default().to_string()
        });
        Ok(notes.collect())
    }

    /// Every Event object once, as JSON in events.k8s.io/v1 field names (`regarding`,
    /// `note`, ...). A real API server stores core/v1 and events.k8s.io/v1 Events as one
    /// resource (and so does the simulator): listing both APIs would count each Event twice,
    /// so only events.k8s.io/v1, the API the services publish through, is listed.
    ///
    /// Errors: the API failed.
    pub async fn event_values(&self) -> anyhow::Result<Vec<Value>> {
        Ok(match &self.sim {
            Some(sim) => sim.objects("events.events.k8s.io"),
            None => {
                let ev: Api<k8s_openapi::api::events::v1::Event> = Api::all(self.client.clone());
                let mut v = Vec::new();
                for e in ev.list(&ListParams::default()).await?.items {
                    v.push(serde_json::to_value(e)?);
                }
                v
            }
        })
    }

    /// Wait up to `timeout` until exactly `n` objects have an event with
    /// `reason` ([`System::objects_with_event`]). Events are published after
    /// (or beside) the change they announce, so a count read right after that
    /// change may still trail it.
    ///
    /// Errors: the count is not `n` by then (naming the last count), or the
    /// events cannot be listed.
    pub async fn wait_objects_with_event(
        &self,
        reason: &str,
        n: usize,
        timeout: Duration,
    ) -> anyhow::Result<()> {
        super::wait_eq(timeout, &format!("claims with a {reason} event"), n, || {
            self.objects_with_event(reason)
        })
        .await
        .map(|_| ())
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
        self.wait_volumes((n, n, n), timeout).await
    }

    /// Wait until (our PVs, Bound claims, volume directories) are exactly `counts`.
    ///
    /// Errors: timeout (the message shows the last counts).
    pub async fn wait_volumes(
        &self,
        counts: (usize, usize, usize),
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        wait_eq(
            timeout,
            "(PVs, bound claims, directories)",
            counts,
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
        self.wait_pvs_and_dirs((0, 0), timeout).await
    }

    /// Wait until (our PVs, volume directories) are exactly `counts`.
    ///
    /// Errors: timeout (the message shows the last counts).
    pub async fn wait_pvs_and_dirs(
        &self,
        counts: (usize, usize),
        timeout: Duration,
    ) -> anyhow::Result<Duration> {
        wait_eq(timeout, "(PVs, directories)", counts, || async {
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

impl Drop for System {
    /// On a real control plane, unless already done or panicking: kill the
    /// services, then [`System::finish_checks`]; prints the report, panics
    /// with the problems (the scenario fails with the 403 lines).
    fn drop(&mut self) {
        if self.checks_done || !self.plane.is_real() || std::thread::panicking() {
            return;
        }
        for p in &mut self.services {
            p.kill();
        }
        match self.finish_checks() {
            Ok(report) => eprint!("{report}"),
            Err(problems) => panic!("real-plane RBAC check failed:\n{problems}"),
        }
    }
}

/// Number of entries directly inside `dir` (0 when it does not exist), not
/// counting the nfs-subdir backend's bookkeeping directory (`.split-provisioner`).
pub fn count_dirs(dir: &Path) -> usize {
    std::fs::read_dir(dir)
        .map(|d| {
            d.filter_map(Result::ok)
                .filter(|e| e.file_name() != backend_nfs_subdir::registry::REGISTRY_DIR)
                .count()
        })
        .unwrap_or(0)
}
