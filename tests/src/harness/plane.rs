//! The control plane an end-to-end scenario runs on: the in-process API-server
//! simulator (`e2e::sim`) or a real kube-apiserver (v1.19 or v1.37) with its
//! kube-controller-manager (`e2e::realkube::RealCluster`), behind one type so a
//! scenario is written once. What differs by plane lives here: the clients
//! (admin for the harness, one identity per service), where the Leases live,
//! and an API outage (simulator: 503 to every request and dropped watches;
//! real: kube-apiserver stopped and started again).
//!
//! On the real plane every service runs as its own ServiceAccount, bound to
//! exactly the RBAC rendered from `deploy/base` ([`super::rbac`]); dropping a
//! [`RealPlane`] checks the audit log against each service's `API_CALLS`
//! (see [`RealPlane::finish_checks`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;

use super::rbac::{self, DeployRbac};
use super::services::Service;
use crate::realkube::{Assets, KubeVersion, RealCluster, RealClusterOptions};
use crate::sim::{FaultSpec, SimConfig, SimHandle, Simulator};

/// Which control plane to start.
pub enum ControlPlane {
    /// The in-process simulator with this configuration.
    Sim(SimConfig),
    /// A real kube-apiserver + kube-controller-manager from these binaries
    /// (see `e2e::realkube::assets_or_skip`).
    Real(Assets),
}

impl Default for ControlPlane {
    /// The simulator with [`SimConfig::default`] (PV-controller emulation on).
    fn default() -> Self {
        ControlPlane::Sim(SimConfig::default())
    }
}

impl std::fmt::Debug for ControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ControlPlane::Sim(c) => f.debug_tuple("Sim").field(c).finish(),
            ControlPlane::Real(a) => write!(f, "Real({}, {})", a.version, a.dir.display()),
        }
    }
}

impl ControlPlane {
    /// `"sim"` or `"real"`.
    pub fn name(&self) -> &'static str {
        match self {
            ControlPlane::Sim(_) => "sim",
            ControlPlane::Real(_) => "real",
        }
    }

    /// The Kubernetes release the plane is (real) or follows (the simulator's
    /// `SimConfig::kube_version`).
    pub fn version(&self) -> KubeVersion {
        match self {
            ControlPlane::Sim(c) => c.kube_version,
            ControlPlane::Real(a) => a.version,
        }
    }

    /// Whether this is a real API server.
    pub fn is_real(&self) -> bool {
        matches!(self, ControlPlane::Real(_))
    }

    /// The same choice with simulator configuration `config` (no change for a real plane).
    pub fn with_sim_config(self, config: SimConfig) -> Self {
        match self {
            ControlPlane::Sim(_) => ControlPlane::Sim(config),
            real => real,
        }
    }
}

/// A running real control plane with the deploy's RBAC applied and one
/// kubeconfig per service identity.
pub struct RealPlane {
    /// The cluster (etcd, kube-apiserver, kube-controller-manager).
    pub cluster: RealCluster,
    /// The rendered deploy RBAC (namespace, provisioner name, objects).
    pub rbac: DeployRbac,
    kubeconfigs: BTreeMap<Service, PathBuf>,
    /// Skip the drop-time audit check (the demo reports it itself).
    pub check_on_drop: bool,
}

impl RealPlane {
    /// Start a real cluster from `assets`, create the RBAC rendered from
    /// `deploy/base`, and write a kubeconfig for each service's ServiceAccount.
    ///
    /// Errors: the cluster does not start, kubectl kustomize fails, the API
    /// rejects an RBAC object, or a ServiceAccount token does not appear.
    pub async fn start(assets: &Assets) -> anyhow::Result<Self> {
        Self::start_with(assets, RealClusterOptions::default()).await
    }

    /// [`start`](Self::start) with these cluster options (the controller
    /// manager is started whatever `opts.controller_manager` says).
    ///
    /// Errors: as [`start`](Self::start).
    pub async fn start_with(assets: &Assets, opts: RealClusterOptions) -> anyhow::Result<Self> {
        let rbac = DeployRbac::render()?;
        let cluster = RealCluster::start(
            assets,
            RealClusterOptions {
                controller_manager: true,
                ..opts
            },
        )
        .await
        .context("starting the real control plane")?;
        rbac.apply(&cluster.client()).await?;
        let mut kubeconfigs = BTreeMap::new();
        for s in Service::ALL {
            let kc = cluster
                .service_account_kubeconfig(rbac.namespace(s), s.binary_name())
                .await
                .with_context(|| format!("kubeconfig of ServiceAccount {}", s.binary_name()))?;
            kubeconfigs.insert(s, kc);
        }
        Ok(Self {
            cluster,
            rbac,
            kubeconfigs,
            check_on_drop: true,
        })
    }

    /// Kubeconfig of `service`'s ServiceAccount identity.
    pub fn kubeconfig(&self, service: Service) -> &Path {
        &self.kubeconfigs[&service]
    }

    /// The audit and RBAC checks of a finished real-plane run: for each
    /// service, every call its identity made must be declared in its
    /// `API_CALLS` and none refused; returns the report of granted calls that
    /// no real-plane run (recorded in [`rbac::exercised_file`]) exercised yet,
    /// also written to `unexercised.txt` beside that file.
    ///
    /// Errors: the undeclared or refused calls, one a line.
    pub fn finish_checks(&self) -> Result<String, String> {
        let records = self
            .cluster
            .audit_records()
            .map_err(|e| format!("reading the audit log: {e:#}"))?;
        let mut problems = Vec::new();
        let mut report = String::new();
        for s in Service::ALL {
            match rbac::check_audit(&self.rbac, s, rbac::declared(s), &records) {
                Ok(calls) => {
                    let unexercised = rbac::record_exercised(&self.rbac, s, &calls);
                    if !unexercised.is_empty() {
                        report.push_str(&format!(
                            "{}: granted but not exercised by any real-plane run so far: {}\n",
                            s.binary_name(),
                            unexercised
                                .iter()
                                .map(|(g, r, v)| format!("{v} {g}/{r}"))
                                .collect::<Vec<_>>()
                                .join(", ")
                        ));
                    }
                }
                Err(e) => problems.push(e),
            }
        }
        // The latest view, for a reader of a captured test run.
        let _ = std::fs::write(
            rbac::exercised_file().with_file_name("unexercised.txt"),
            &report,
        );
        if problems.is_empty() {
            Ok(report)
        } else {
            Err(problems.join("\n"))
        }
    }
}

impl Drop for RealPlane {
    /// Runs [`RealPlane::finish_checks`] while the cluster still runs; prints
    /// the report and panics with the problems (unless already panicking).
    fn drop(&mut self) {
        if !self.check_on_drop || std::thread::panicking() {
            return;
        }
        match self.finish_checks() {
            Ok(report) => eprint!("{report}"),
            Err(problems) => panic!("RBAC audit of the real-plane run failed:\n{problems}"),
        }
    }
}

/// A started control plane.
pub enum Plane {
    /// The in-process simulator (shared with [`super::System::sim`]).
    Sim(Arc<SimHandle>),
    /// A real cluster.
    Real(Box<RealPlane>),
    /// An existing cluster reached through a kubeconfig (every identity is the kubeconfig's).
    External(PathBuf),
}

/// Namespace of the claims and Leases on the simulator and an external cluster.
pub const SIM_NAMESPACE: &str = "default";

impl Plane {
    /// Start `choice` (a real plane: see [`RealPlane::start`]).
    ///
    /// Errors: the simulator or the real cluster fails to start.
    pub async fn start(choice: ControlPlane) -> anyhow::Result<Self> {
        Self::start_with(choice, RealClusterOptions::default()).await
    }

    /// [`start`](Self::start); a real cluster with `real` options.
    ///
    /// Errors: as [`start`](Self::start).
    pub async fn start_with(
        choice: ControlPlane,
        real: RealClusterOptions,
    ) -> anyhow::Result<Self> {
        Ok(match choice {
            ControlPlane::Sim(config) => Plane::Sim(Arc::new(Simulator::start(config).await?)),
            ControlPlane::Real(assets) => {
                Plane::Real(Box::new(RealPlane::start_with(&assets, real).await?))
            }
        })
    }

    /// The simulator, when this is one.
    pub fn sim(&self) -> Option<&Arc<SimHandle>> {
        match self {
            Plane::Sim(s) => Some(s),
            _ => None,
        }
    }

    /// The real cluster, when this is one.
    pub fn real(&self) -> Option<&RealPlane> {
        match self {
            Plane::Real(r) => Some(r),
            _ => None,
        }
    }

    /// The real cluster, mutably.
    pub fn real_mut(&mut self) -> Option<&mut RealPlane> {
        match self {
            Plane::Real(r) => Some(r),
            _ => None,
        }
    }

    /// The Kubernetes release the plane is or follows (`None` for an external cluster).
    pub fn version(&self) -> Option<KubeVersion> {
        match self {
            Plane::Sim(s) => Some(s.kube_version()),
            Plane::Real(r) => Some(r.cluster.version()),
            Plane::External(_) => None,
        }
    }

    /// Whether this is a real API server (a [`RealCluster`] or an external one).
    pub fn is_real(&self) -> bool {
        !matches!(self, Plane::Sim(_))
    }

    /// Client for the harness's own reads and writes (admin on a real cluster).
    ///
    /// Errors: an unreadable kubeconfig.
    pub async fn admin_client(&self) -> anyhow::Result<kube::Client> {
        match self {
            Plane::Sim(s) => Ok(s.client()?),
            Plane::Real(r) => Ok(r.cluster.client()),
            Plane::External(kc) => client_from_kubeconfig(kc).await,
        }
    }

    /// The kubeconfig `service` runs with; the simulator's is written to `dir`.
    ///
    /// Errors: writing the simulator's kubeconfig failed.
    pub fn kubeconfig(&self, service: Service, dir: &Path) -> anyhow::Result<PathBuf> {
        match self {
            Plane::Sim(s) => {
                let kc = dir.join("kubeconfig");
                if !kc.exists() {
                    s.write_kubeconfig(&kc)?;
                }
                Ok(kc)
            }
            Plane::Real(r) => Ok(r.kubeconfig(service).to_path_buf()),
            Plane::External(kc) => Ok(kc.clone()),
        }
    }

    /// A client with `service`'s identity, built the way the services build
    /// theirs (`common::runtime::kube_client::build_client`, no client rate limit).
    ///
    /// Errors: an unreadable kubeconfig.
    pub async fn service_client(&self, service: Service) -> anyhow::Result<kube::Client> {
        let config = match self {
            Plane::Sim(s) => {
                let mut c = kube::Config::new(s.url().parse()?);
                c.default_namespace = SIM_NAMESPACE.into();
                c
            }
            Plane::Real(r) => config_from_kubeconfig(r.kubeconfig(service)).await?,
            Plane::External(kc) => config_from_kubeconfig(kc).await?,
        };
        common::runtime::kube_client::build_client(config, 0.0, 0, None)
    }

    /// Namespace of `service`'s Lease: the service's namespace in the deploy on a real
    /// cluster (its Lease Role is namespaced there), else [`SIM_NAMESPACE`].
    pub fn lease_namespace(&self, service: Service) -> String {
        match self {
            Plane::Real(r) => r.rbac.namespace(service).to_string(),
            _ => SIM_NAMESPACE.into(),
        }
    }

    /// Provisioner name: the deploy's `PROVISIONER_NAME` on a real cluster
    /// (the Lease Roles' `resourceNames` are derived from it), else `example.com/hostpath`.
    pub fn provisioner_name(&self) -> String {
        match self {
            Plane::Real(r) => r.rbac.provisioner_name.clone(),
            _ => "example.com/hostpath".into(),
        }
    }

    /// Begin an API outage: on the simulator every request gets 503 and every
    /// watch is dropped; on a real cluster kube-apiserver is stopped.
    ///
    /// Errors: stopping kube-apiserver failed; an external cluster cannot be stopped.
    pub async fn begin_outage(&mut self) -> anyhow::Result<Outage> {
        match self {
            Plane::Sim(s) => {
                let id = s.inject_fault(FaultSpec::error(503, &[], &[]));
                s.drop_watches();
                Ok(Outage(Some(id)))
            }
            Plane::Real(r) => {
                r.cluster.stop_apiserver().await?;
                Ok(Outage(None))
            }
            Plane::External(_) => anyhow::bail!("an external cluster cannot be stopped"),
        }
    }

    /// End the outage `outage` (remove the fault, or start kube-apiserver and
    /// wait until it is ready).
    ///
    /// Errors: kube-apiserver did not come back.
    pub async fn end_outage(&mut self, outage: Outage) -> anyhow::Result<()> {
        match (self, outage.0) {
            (Plane::Sim(s), Some(id)) => {
                s.remove_fault(id);
                Ok(())
            }
            (Plane::Real(r), _) => r.cluster.start_apiserver().await,
            _ => Ok(()),
        }
    }

    /// An API outage of `duration`: [`Plane::begin_outage`], wait, [`Plane::end_outage`].
    ///
    /// Errors: as those two.
    pub async fn api_outage(&mut self, duration: Duration) -> anyhow::Result<()> {
        let started = std::time::Instant::now();
        let o = self.begin_outage().await?;
        tokio::time::sleep(duration.saturating_sub(started.elapsed())).await;
        self.end_outage(o).await
    }
}

/// An outage begun by [`Plane::begin_outage`] (the simulator fault's id).
#[derive(Debug)]
#[must_use = "end the outage with Plane::end_outage"]
pub struct Outage(Option<u64>);

async fn config_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Config> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading kubeconfig {}", path.display()))?;
    Ok(kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?)
}

/// A plain client from the kubeconfig at `path`.
///
/// Errors: unreadable or invalid kubeconfig.
pub async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    Ok(kube::Client::try_from(config_from_kubeconfig(path).await?)?)
}

/// Instantiate an async scenario `fn name(plane: ControlPlane)` once per
/// plane: the tests `name::sim` (the simulator, [`ControlPlane::default`]),
/// `name::real_v1_19` and `name::real_v1_37` (a real control plane of that
/// release; skipped with one stderr line without its binaries, a failure under
/// `CI=true`: see `e2e::realkube::assets_or_skip`).
///
/// ```ignore
/// async fn provisions(plane: ControlPlane) { /* … */ }
/// e2e::on_both_planes!(provisions);
/// ```
#[macro_export]
macro_rules! on_both_planes {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn sim() {
                super::$name($crate::harness::ControlPlane::default()).await
            }

            $crate::on_both_planes!(@real $name, real_v1_19, V1_19);
            $crate::on_both_planes!(@real $name, real_v1_37, V1_37);
        }
    )+};
    (@real $name:ident, $test:ident, $version:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some(assets) = $crate::realkube::assets_or_skip(
                $crate::realkube::KubeVersion::$version,
                concat!(module_path!(), "::", stringify!($test)),
            ) else {
                return;
            };
            super::$name($crate::harness::ControlPlane::Real(assets)).await
        }
    };
}

/// Instantiate an async real-cluster test `fn name(assets: Assets)` once per
/// Kubernetes release, as `name::v1_19` and `name::v1_37` (skipped with one
/// stderr line without that release's binaries, a failure under `CI=true`).
///
/// ```ignore
/// async fn starts(assets: e2e::realkube::Assets) { /* RealCluster::start(&assets, ..) */ }
/// e2e::on_each_version!(starts);
/// ```
#[macro_export]
macro_rules! on_each_version {
    ($($name:ident),+ $(,)?) => {$(
        mod $name {
            $crate::on_each_version!(@one $name, v1_19, V1_19);
            $crate::on_each_version!(@one $name, v1_37, V1_37);
        }
    )+};
    (@one $name:ident, $test:ident, $version:ident) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
        async fn $test() {
            let Some(assets) = $crate::realkube::assets_or_skip(
                $crate::realkube::KubeVersion::$version,
                concat!(module_path!(), "::", stringify!($test)),
            ) else {
                return;
            };
            super::$name(assets).await
        }
    };
}
