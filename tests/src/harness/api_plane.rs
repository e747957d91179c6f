//! The API server an API-behaviour test talks to: the simulator or a real
//! kube-apiserver v1.19 or v1.37 (the test binary's shared cluster of that release, see
//! [`crate::realkube::shared`]), behind one type, so a conformance test is
//! written once and run on both by [`on_both_servers!`](crate::on_both_servers).
//! The real server is the reference: a test that passes there and fails on
//! the simulator shows a simulator bug.
//!
//! Tests share the real cluster, so each [`ApiPlane`] gets a namespace of its
//! own ([`ApiPlane::namespace`]) and names its cluster-scoped objects
//! (PersistentVolumes, StorageClasses, Nodes) through [`ApiPlane::name`],
//! which makes them unique in the process. The simulator gets the same
//! treatment so both variants run the very same requests.

use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::{Api, PostParams};

use crate::realkube::shared::{shared_cluster, SharedCluster};
use crate::realkube::{Assets, KubeVersion};
use crate::sim::{SimConfig, SimHandle, Simulator};

/// A started server with a client, a namespace and a name prefix for one test.
pub struct ApiPlane {
    server: Server,
    client: kube::Client,
    namespace: String,
    prefix: String,
}

enum Server {
    Sim(SimHandle),
    Real(SharedCluster),
}

static NEXT: AtomicU64 = AtomicU64::new(1);

impl ApiPlane {
    /// A new simulator with `config`, a fresh namespace and name prefix.
    ///
    /// Errors: the simulator does not start or refuses the namespace.
    pub async fn start_sim(config: SimConfig) -> anyhow::Result<Self> {
        let sim = Simulator::start(config).await?;
        let client = sim.client()?;
        Self::with(Server::Sim(sim), client).await
    }

    /// The test binary's shared real cluster (started on first use from
    /// `assets`, with kube-controller-manager), a new admin client on the
    /// caller's runtime, a fresh namespace and name prefix.
    ///
    /// Errors: the cluster does not start or refuses the namespace.
    pub async fn start_real(assets: &Assets) -> anyhow::Result<Self> {
        let shared = shared_cluster(assets).map_err(|e| anyhow::anyhow!(e))?;
        let client = shared.client().await?;
        Self::with(Server::Real(shared), client).await
    }

    async fn with(server: Server, client: kube::Client) -> anyhow::Result<Self> {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let namespace = format!("conf-{n}");
        let ns: Namespace = serde_json::from_value(serde_json::json!({
            "metadata": {"name": namespace}
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .with_context(|| format!("creating namespace {namespace}"))?;
        Ok(Self {
            server,
            client,
            namespace,
            prefix: format!("t{n}-"),
        })
    }

    /// The client (admin on the real server).
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// This test's namespace (`conf-<n>`, created at start).
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// A name for a cluster-scoped object that no other test of the process
    /// uses: `t<n>-<base>`.
    pub fn name(&self, base: &str) -> String {
        format!("{}{base}", self.prefix)
    }

    /// `"sim"` or `"real"`.
    pub fn plane(&self) -> &'static str {
        match self.server {
            Server::Sim(_) => "sim",
            Server::Real(_) => "real",
        }
    }

    /// The Kubernetes release the server is (the real one) or follows (the
    /// simulator, [`SimConfig::kube_version`]).
    pub fn version(&self) -> KubeVersion {
        match &self.server {
            Server::Sim(s) => s.kube_version(),
            Server::Real(r) => r.version,
        }
    }

    /// Whether this is the real API server.
    pub fn is_real(&self) -> bool {
        matches!(self.server, Server::Real(_))
    }

    /// The simulator, for simulator-only steps (`None` on the real server).
    pub fn sim(&self) -> Option<&SimHandle> {
        match &self.server {
            Server::Sim(s) => Some(s),
            Server::Real(_) => None,
        }
    }

    /// The shared real cluster (`None` on the simulator).
    pub fn real(&self) -> Option<&SharedCluster> {
        match &self.server {
            Server::Sim(_) => None,
            Server::Real(r) => Some(r),
        }
    }

    /// Send a raw request `method path` through the client (the real
    /// server's TLS and token included), with `body` sent as `content_type`
    /// (default `application/json`), and return the HTTP status and the body
    /// parsed as JSON (`Null` when it is not JSON).
    ///
    /// Errors: the request could not be sent or read.
    pub async fn raw(
        &self,
        method: &str,
        path: &str,
        content_type: Option<&str>,
        body: Option<Vec<u8>>,
    ) -> anyhow::Result<(u16, serde_json::Value)> {
        let mut req = http::Request::builder().method(method).uri(path);
        if body.is_some() {
            req = req.header("content-type", content_type.unwrap_or("application/json"));
        }
        let res = self
            .client
            .send(req.body(kube::client::Body::from(body.unwrap_or_default()))?)
            .await?;
        let status = res.status().as_u16();
        let body = res.into_body().collect_bytes().await?;
        Ok((
            status,
            serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null),
        ))
    }
}

/// Instantiate an async API-behaviour test `fn name(plane: ApiPlane)` once
/// per server: `name::sim` (a simulator with [`SimConfig::default`]: every
/// emulation on, like a real server with its controller manager),
/// `name::real_v1_19` and `name::real_v1_37` (the test binary's shared real
/// cluster of that release; skipped with one stderr line without its binaries,
/// a failure under `CI=true`: see `e2e::realkube::assets_or_skip`).
///
/// `on_both_servers!(name => config_expr)` gives the simulator variant that
/// configuration instead (e.g. a short bookmark interval).
#[macro_export]
macro_rules! on_both_servers {
    ($name:ident) => {
        $crate::on_both_servers!($name => $crate::sim::SimConfig::default());
    };
    ($name:ident => $config:expr) => {
        mod $name {
            // the configuration expression is written in the caller's scope
            #[allow(unused_imports)]
            use super::*;

            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sim() {
                let plane = $crate::harness::ApiPlane::start_sim($config)
                    .await
                    .expect("starting the simulator");
                super::$name(plane).await
            }

            $crate::on_both_servers!(@real $name, real_v1_19, V1_19);
            $crate::on_both_servers!(@real $name, real_v1_37, V1_37);
        }
    };
    (@real $name:ident, $test:ident, $version:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some(assets) = $crate::realkube::assets_or_skip(
                $crate::realkube::KubeVersion::$version,
                concat!(module_path!(), "::", stringify!($test)),
            ) else {
                return;
            };
            let plane = $crate::harness::ApiPlane::start_real(&assets)
                .await
                .expect("the shared real control plane");
            super::$name(plane).await
        }
    };
    ($($name:ident),+ $(,)?) => {
        $( $crate::on_both_servers!($name); )+
    };
}
