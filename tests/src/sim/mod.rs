//! A Kubernetes API-server simulator for end-to-end tests.
//!
//! Serves, over plain HTTP on loopback, the resources a storage provisioner touches
//! (core/v1 PersistentVolume, PersistentVolumeClaim, Node, Namespace, Event;
//! storage.k8s.io/v1 StorageClass; coordination.k8s.io/v1 Lease; events.k8s.io/v1 Event)
//! with kube-apiserver semantics, plus an emulation of kube-controller-manager's PV
//! controller, fault injection and request counters.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use e2e::sim::{SimConfig, Simulator};
//! let sim = Simulator::start(SimConfig::default()).await?;
//! let client = sim.client()?;
//! # let _ = client; Ok(()) }
//! ```
//!
//! Modules, one concern each: [`store`] (objects, resourceVersions, history, broadcast),
//! [`watch`] (watch streams), [`http`] (routes and control endpoints), [`registry`]
//! (REST semantics and admission), [`validation`] (validation and defaults), [`patch`]
//! and [`apply`] (patch types, field ownership), [`pv_controller`] (controller
//! emulation), [`faults`] (fault injection and counters), [`resources`] (kinds and
//! discovery), [`selectors`], [`errors`].

pub mod apply;
pub mod errors;
pub mod event_api;
pub mod faults;
pub mod http;
pub mod patch;
pub mod pv_controller;
pub mod raw;
pub mod registry;
pub mod resources;
pub mod selectors;
pub mod store;
pub mod validation;
pub mod watch;

pub use errors::ApiError;
pub use faults::{FaultAction, FaultSpec, Stats};
pub use pv_controller::PvControllerConfig;

use registry::{AdmissionConfig, Registry};
use serde_json::Value;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use store::Store;
use tokio_util::sync::CancellationToken;

/// Simulator configuration. `Default` gives real-server behaviour with every emulation on.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// TCP port on 127.0.0.1 (0 = pick a free one).
    pub port: u16,
    /// Number of changes (all kinds together) kept for watch replay; a watch from an
    /// older resourceVersion gets `410 Expired`. Default 100 000 (the real watch cache keeps
    /// a time-bounded window of comparable size).
    pub history_window: usize,
    /// Broadcast buffer per watcher; a watcher further behind is disconnected (the client
    /// re-watches from its last resourceVersion). Default 262 144.
    pub watch_channel_capacity: usize,
    /// Interval between BOOKMARK events on watches with `allowWatchBookmarks=true`.
    /// Default 60 s (the real server's period); tests may shorten it.
    pub bookmark_interval: Duration,
    /// Watch duration when the client sends no `timeoutSeconds`. Default 1800 s.
    pub default_watch_timeout: Duration,
    /// Create `default`, `kube-system`, `kube-public`, `kube-node-lease` at start. Default true.
    pub create_default_namespaces: bool,
    /// NamespaceLifecycle admission: namespaced creates in a missing namespace get 404. Default true.
    pub enforce_namespace_exists: bool,
    /// StorageObjectInUseProtection admission: add `kubernetes.io/pvc-protection` /
    /// `kubernetes.io/pv-protection` on create. Default true.
    pub protection_finalizers: bool,
    /// DefaultStorageClass admission. Default true.
    pub default_storage_class: bool,
    /// kube-controller-manager PV controller emulation.
    pub pv_controller: PvControllerConfig,
    /// The Kubernetes release whose behaviour the simulator follows where
    /// releases differ (Event namespaces, `kubernetes.io/metadata.name`).
    /// Default v1.37.
    pub kube_version: crate::realkube::KubeVersion,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            port: 0,
            history_window: 100_000,
            watch_channel_capacity: 262_144,
            bookmark_interval: Duration::from_secs(60),
            default_watch_timeout: Duration::from_secs(1800),
            create_default_namespaces: true,
            enforce_namespace_exists: true,
            protection_finalizers: true,
            default_storage_class: true,
            pv_controller: PvControllerConfig::default(),
            kube_version: crate::realkube::KubeVersion::V1_37,
        }
    }
}

impl SimConfig {
    /// Default config with the PV controller emulation and protection finalizers off
    /// (a "bare" API server).
    pub fn bare() -> Self {
        Self {
            protection_finalizers: false,
            pv_controller: PvControllerConfig {
                enabled: false,
                ..Default::default()
            },
            ..Default::default()
        }
    }
}

/// Entry point.
pub struct Simulator;

/// A running simulator. Dropping it stops the server and background tasks.
pub struct SimHandle {
    addr: SocketAddr,
    registry: Arc<Registry>,
    faults: Arc<faults::Faults>,
    shutdown: CancellationToken,
}

impl Simulator {
    /// Bind 127.0.0.1:`config.port` and start serving. Must be called inside a Tokio runtime.
    pub async fn start(config: SimConfig) -> std::io::Result<SimHandle> {
        let store = Arc::new(Store::new(
            config.history_window,
            config.watch_channel_capacity,
        ));
        let registry = Arc::new(Registry {
            store,
            admission: AdmissionConfig {
                enforce_namespace_exists: config.enforce_namespace_exists,
                protection_finalizers: config.protection_finalizers,
                default_storage_class: config.default_storage_class,
                kube_version: config.kube_version,
            },
        });
        if config.create_default_namespaces {
            for ns in ["default", "kube-system", "kube-public", "kube-node-lease"] {
                let _ = registry.create(
                    resources::NAMESPACE,
                    "",
                    serde_json::json!({"metadata": {"name": ns, "labels": {"kubernetes.io/metadata.name": ns}}}),
                    "kube-apiserver",
                );
            }
        }
        let faults = Arc::new(faults::Faults::new());
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", config.port)).await?;
        let addr = listener.local_addr()?;
        let shutdown = CancellationToken::new();
        if config.pv_controller.enabled {
            pv_controller::spawn(
                registry.clone(),
                config.pv_controller.clone(),
                shutdown.clone(),
            );
        }
        let state = Arc::new(http::AppState {
            registry: registry.clone(),
            faults: faults.clone(),
            bookmark_interval: config.bookmark_interval,
            default_watch_timeout: config.default_watch_timeout,
            address: addr.to_string(),
        });
        let app = http::router(state);
        let sd = shutdown.clone();
        let drop_on_stop = faults.clone();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    sd.cancelled().await;
                    drop_on_stop.drop_watches();
                })
                .await;
        });
        Ok(SimHandle {
            addr,
            registry,
            faults,
            shutdown,
        })
    }
}

impl Drop for SimHandle {
    fn drop(&mut self) {
        self.shutdown.cancel();
        self.faults.drop_watches();
    }
}

impl SimHandle {
    /// Bound address.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The release whose behaviour the simulator follows ([`SimConfig::kube_version`]).
    pub fn kube_version(&self) -> crate::realkube::KubeVersion {
        self.registry.admission.kube_version
    }

    /// `http://127.0.0.1:PORT`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Kubeconfig YAML pointing at [`SimHandle::url`] (no auth, namespace `default`).
    pub fn kubeconfig_yaml(&self) -> String {
        format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: sim\n  cluster:\n    server: {}\ncontexts:\n- name: sim\n  context:\n    cluster: sim\n    user: sim\n    namespace: default\ncurrent-context: sim\nusers:\n- name: sim\n  user: {{}}\n",
            self.url()
        )
    }

    /// Write [`SimHandle::kubeconfig_yaml`] to `path`, whole (a temporary file renamed).
    pub fn write_kubeconfig(&self, path: impl AsRef<Path>) -> std::io::Result<()> {
        // Whole or not at all: a reader polling for the file never sees it half written.
        let path = path.as_ref();
        let partial = path.with_extension("partial");
        std::fs::write(&partial, self.kubeconfig_yaml())?;
        std::fs::rename(partial, path)
    }

    /// A kube client for this simulator (default namespace `default`). Needs a Tokio runtime.
    pub fn client(&self) -> Result<kube::Client, kube::Error> {
        let url: ::http::Uri = self.url().parse().expect("valid url");
        let mut cfg = kube::Config::new(url);
        cfg.default_namespace = "default".into();
        cfg.read_timeout = None;
        kube::Client::try_from(cfg)
    }

    /// Add a fault rule; returns its id.
    pub fn inject_fault(&self, spec: FaultSpec) -> u64 {
        self.faults.inject(spec)
    }

    /// Remove one fault rule.
    pub fn remove_fault(&self, id: u64) {
        self.faults.remove(id)
    }

    /// Remove all fault rules and added latency.
    pub fn clear_faults(&self) {
        self.faults.clear()
    }

    /// Add `d` of latency to every API request (0 = none).
    pub fn set_latency(&self, d: Duration) {
        self.faults.set_latency(d)
    }

    /// Close every open watch connection now (clients see the stream end).
    pub fn drop_watches(&self) {
        self.faults.drop_watches()
    }

    /// Request counters (API requests only; the controller emulation and direct store
    /// access are not counted).
    pub fn stats(&self) -> Stats {
        self.faults.stats()
    }

    /// Zero the request counters.
    pub fn reset_stats(&self) {
        self.faults.reset_stats()
    }

    /// Current (latest) resourceVersion.
    pub fn resource_version(&self) -> u64 {
        self.registry.store.current_rv()
    }

    /// All objects of a resource (`persistentvolumes`, `events.events.k8s.io`, ... see
    /// [`resources::by_name`]), with kind/apiVersion, without counting as API requests.
    /// Panics on an unknown resource name.
    pub fn objects(&self, resource: &str) -> Vec<Value> {
        let res =
            resources::by_name(resource).unwrap_or_else(|| panic!("unknown resource {resource}"));
        let (items, _, _) = self.registry.store.list(res, None, None, &|_| true, None);
        items
            .iter()
            .map(|s| serde_json::from_slice(&s.full).unwrap())
            .collect()
    }

    /// One object (namespace `""` for cluster-scoped), without counting as an API request.
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        let res =
            resources::by_name(resource).unwrap_or_else(|| panic!("unknown resource {resource}"));
        self.registry
            .store
            .get(res, namespace, name)
            .map(|s| serde_json::from_slice(&s.full).unwrap())
    }

    /// Number of objects of a resource.
    pub fn count(&self, resource: &str) -> usize {
        let res =
            resources::by_name(resource).unwrap_or_else(|| panic!("unknown resource {resource}"));
        self.registry.store.count(res)
    }

    /// Create an object directly (same semantics as `POST`, not counted), keeping
    /// a given `metadata.uid` (the API always assigns one).
    pub fn create_object(
        &self,
        resource: &str,
        namespace: &str,
        obj: Value,
    ) -> Result<Value, ApiError> {
        let res =
            resources::by_name(resource).unwrap_or_else(|| panic!("unknown resource {resource}"));
        let s = self
            .registry
            .create(res, namespace, obj, registry::DIRECT_MANAGER)?;
        Ok(serde_json::from_slice(&s.full).unwrap())
    }

    /// Stop serving (also happens on drop).
    pub fn shutdown(&self) {
        self.shutdown.cancel();
        self.faults.drop_watches();
    }
}
