//! One real control plane per test binary and Kubernetes version, shared by its tests.
//!
//! Starting etcd + kube-apiserver + kube-controller-manager costs seconds
//! (see [`RealCluster::start`]); API-behaviour tests (the differential
//! conformance suites) need only a server, a namespace of their own and
//! cluster-scoped names nobody else uses, so every test of one binary uses the
//! same [`RealCluster`] through [`shared_cluster`].
//!
//! Why a dedicated thread: the cluster's processes carry
//! `PR_SET_PDEATHSIG = SIGKILL`, which Linux ties to the *thread* that forked
//! them, and each `#[tokio::test]` runs on a thread (and runtime) of its own
//! that ends with the test. So the cluster is started on a thread that lives
//! as long as the process (parked in its own runtime), and each test builds
//! its own client from [`SharedCluster::admin_kubeconfig`] in its own runtime.
//! At process exit (`atexit`, which libtest's exit runs) the cluster is
//! dropped: processes killed, temporary directory removed.

use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::{Assets, KubeVersion, RealCluster, RealClusterOptions};

/// What a test needs of the shared cluster (the cluster itself stays with
/// this module, which drops it at process exit).
#[derive(Debug, Clone)]
pub struct SharedCluster {
    /// The Kubernetes release it runs.
    pub version: KubeVersion,
    /// Admin kubeconfig (user `admin`, group `system:masters`).
    pub admin_kubeconfig: PathBuf,
    /// The API server's URL.
    pub server_url: String,
    /// etcd's client port on 127.0.0.1 (for [`super::compact_etcd`]).
    pub etcd_port: u16,
    /// The cluster's root directory (logs, audit log).
    pub root: PathBuf,
    /// How long the start took (etcd, kube-apiserver and
    /// kube-controller-manager ready).
    pub startup: Duration,
}

impl SharedCluster {
    /// A new admin client, bound to the calling test's runtime.
    ///
    /// Errors: the kubeconfig cannot be read.
    pub async fn client(&self) -> anyhow::Result<kube::Client> {
        crate::harness::plane::client_from_kubeconfig(&self.admin_kubeconfig).await
    }

    /// Compact etcd to its current revision (see [`RealCluster::compact_etcd`]).
    ///
    /// Errors: etcd does not answer or refuses.
    pub async fn compact_etcd(&self) -> anyhow::Result<u64> {
        super::compact_etcd(self.etcd_port).await
    }
}

static CLUSTERS: Mutex<Vec<RealCluster>> = Mutex::new(Vec::new());
static STARTED: [OnceLock<Result<SharedCluster, String>>; KubeVersion::ALL.len()] =
    [const { OnceLock::new() }; KubeVersion::ALL.len()];

extern "C" fn drop_shared_clusters() {
    let taken = CLUSTERS.lock().map(|mut c| std::mem::take(&mut *c));
    drop(taken);
}

/// The test binary's shared real cluster of `assets.version`
/// (kube-controller-manager on, the default [`RealClusterOptions`]), started
/// by the first caller of that version from `assets` and reused by every later
/// one (later `assets` are ignored). Prints the start-up time to stderr once.
///
/// Errors: the start failed (every caller gets the same message).
pub fn shared_cluster(assets: &Assets) -> Result<SharedCluster, String> {
    let slot = KubeVersion::ALL
        .iter()
        .position(|v| *v == assets.version)
        .expect("every version is in KubeVersion::ALL");
    STARTED[slot]
        .get_or_init(|| {
            let assets = assets.clone();
            let (tx, rx) = std::sync::mpsc::channel();
            let spawned = std::thread::Builder::new()
                .name(format!("realkube-shared-{}", assets.version))
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => {
                            let _ = tx.send(Err(format!("building a runtime: {e}")));
                            return;
                        }
                    };
                    let t0 = Instant::now();
                    match rt.block_on(RealCluster::start(&assets, RealClusterOptions::default())) {
                        Ok(cluster) => {
                            let info = SharedCluster {
                                version: assets.version,
                                admin_kubeconfig: cluster.admin_kubeconfig().to_path_buf(),
                                server_url: cluster.server_url(),
                                etcd_port: cluster.etcd_port(),
                                root: cluster.root().to_path_buf(),
                                startup: t0.elapsed(),
                            };
                            let mut clusters = CLUSTERS.lock().unwrap_or_else(|e| e.into_inner());
                            if clusters.is_empty() {
                                // SAFETY: registers a plain `extern "C" fn()` with libc.
                                unsafe {
                                    libc::atexit(drop_shared_clusters);
                                }
                            }
                            clusters.push(cluster);
                            drop(clusters);
                            let _ = tx.send(Ok(info));
                            // Keep this thread (the processes' parent for
                            // PR_SET_PDEATHSIG) and its runtime alive.
                            rt.block_on(std::future::pending::<()>());
                        }
                        Err(e) => {
                            let _ = tx.send(Err(format!("{e:#}")));
                        }
                    }
                });
            if let Err(e) = spawned {
                return Err(format!("spawning the cluster thread: {e}"));
            }
            let info = rx
                .recv()
                .map_err(|_| "the cluster thread ended without an answer".to_string())?;
            if let Ok(i) = &info {
                eprintln!(
                    "realkube: shared {} cluster {} started in {:.1} s (load average {})",
                    i.version,
                    i.server_url,
                    i.startup.as_secs_f64(),
                    std::fs::read_to_string("/proc/loadavg")
                        .ok()
                        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
                        .unwrap_or_else(|| "?".into())
                );
            }
            info
        })
        .clone()
}
