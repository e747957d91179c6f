//! The Go provisioners users would run instead of ours, built by
//! `tools/peers/build.sh` from the Go module proxy: the benchmark measures them
//! beside the services (`bench --peer`) and the drop-in tests hand volumes
//! between them and the services. Each runs as one process against the
//! control plane, as the provisioner name it is given.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use clap::ValueEnum;
use serde_json::json;

use super::process::ManagedProcess;

/// A peer provisioner the harness can start.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Peer {
    /// The seed library (sig-storage-lib-external-provisioner v8.0.0) with a
    /// hostPath backend laid out as its examples/hostpath-provisioner.
    Seed,
    /// rancher/local-path-provisioner v0.0.30: a helper pod on the claim's
    /// selected node makes and removes each directory (needs a real node).
    LocalPath,
}

/// Where and how a peer runs.
pub struct PeerEnv<'a> {
    /// Its kubeconfig (admin of the control plane).
    pub kubeconfig: &'a Path,
    /// A client for the objects it needs before starting (local-path's namespace,
    /// ServiceAccount and ConfigMap).
    pub client: &'a kube::Client,
    /// The provisioner name it serves.
    pub provisioner: &'a str,
    /// Its volumes' directory (on the node for local-path); its log is `<dir>.log`.
    pub dir: &'a Path,
    /// Client limit, requests/s and burst; `None`: unlimited. The seed only
    /// (local-path has no flag for it: client-go's default 5/10).
    pub qps: Option<(f32, u32)>,
}

/// The namespace of local-path's helper pods, ServiceAccount and ConfigMap.
pub const LOCAL_PATH_NAMESPACE: &str = "local-path-storage";
/// The image local-path's helper pods run (`tools/node/images.sh`; it has `sh`).
pub const LOCAL_PATH_HELPER_IMAGE: &str = "docker.io/library/redis:node-test";

impl Peer {
    /// The peer's binary in `<target>/peers/bin` (`tools/peers/build.sh`).
    pub fn binary_name(self) -> &'static str {
        match self {
            Peer::Seed => "seed-hostpath",
            Peer::LocalPath => "local-path-provisioner",
        }
    }

    /// Path of the built binary. Errors: not built (run `tools/peers/build.sh`).
    pub fn locate(self) -> anyhow::Result<PathBuf> {
        let path = crate::harness::binaries::target_dir()
            .join("peers/bin")
            .join(self.binary_name());
        anyhow::ensure!(
            path.exists(),
            "{} is not built: run `bash tools/peers/build.sh`",
            path.display()
        );
        Ok(path)
    }

    /// Start the peer in `env`; returns once it runs its controller (its log says
    /// so). Errors: no binary, an object it needs rejected, exit, or 60 s
    /// without that log line.
    pub async fn start(self, env: &PeerEnv<'_>) -> anyhow::Result<ManagedProcess> {
        std::fs::create_dir_all(env.dir)?;
        let log = env.dir.with_extension("log");
        let (qps, burst) = env.qps.unwrap_or((-1.0, 0));
        let args = match self {
            Peer::Seed => vec![
                format!("--kubeconfig={}", env.kubeconfig.display()),
                format!("--provisioner={}", env.provisioner),
                format!("--dir={}", env.dir.display()),
                "--identity=bench-node".to_string(),
                format!("--kube-api-qps={qps}"),
                format!("--kube-api-burst={burst}"),
            ],
            Peer::LocalPath => local_path_args(env).await?,
        };
        let mut process =
            ManagedProcess::spawn(self.binary_name(), &self.locate()?, &args, &[], &log)?;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            if text.contains("Started provisioner controller") {
                return Ok(process);
            }
            anyhow::ensure!(
                process.is_running(),
                "{} exited: see {}",
                self.binary_name(),
                log.display()
            );
            anyhow::ensure!(
                Instant::now() < deadline,
                "{} did not start its controller in 60 s: see {}",
                self.binary_name(),
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// local-path's objects (namespace, helper ServiceAccount, the ConfigMap with its
/// setup and teardown scripts) and files (config.json with `env.dir` for every node,
/// the helper pod template), then its `start` arguments.
async fn local_path_args(env: &PeerEnv<'_>) -> anyhow::Result<Vec<String>> {
    let ns = LOCAL_PATH_NAMESPACE;
    let apply = |value: serde_json::Value| async move {
        let obj: kube::api::DynamicObject = serde_json::from_value(value)?;
        let kind = obj
            .types
            .as_ref()
            .map(|t| t.kind.clone())
            .unwrap_or_default();
        let (api, name) = match kind.as_str() {
            "Namespace" => (
                kube::Api::<kube::api::DynamicObject>::all_with(
                    env.client.clone(),
                    &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::Namespace>(&()),
                ),
                obj.metadata.name.clone().unwrap_or_default(),
            ),
            "ServiceAccount" => (
                kube::Api::namespaced_with(
                    env.client.clone(),
                    ns,
                    &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ServiceAccount>(
                        &(),
                    ),
                ),
                obj.metadata.name.clone().unwrap_or_default(),
            ),
            _ => (
                kube::Api::namespaced_with(
                    env.client.clone(),
                    ns,
                    &kube::api::ApiResource::erase::<k8s_openapi::api::core::v1::ConfigMap>(&()),
                ),
                obj.metadata.name.clone().unwrap_or_default(),
            ),
        };
        let params = kube::api::PatchParams::apply("e2e-peers").force();
        api.patch(&name, &params, &kube::api::Patch::Apply(&obj))
            .await?;
        anyhow::Ok(())
    };
    apply(json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})).await?;
    apply(json!({"apiVersion": "v1", "kind": "ServiceAccount",
        "metadata": {"name": "local-path-provisioner-service-account", "namespace": ns}}))
    .await?;
    apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
    "metadata": {"name": "local-path-config", "namespace": ns},
    "data": {
        "setup": "#!/bin/sh\nset -eu\nmkdir -m 0777 -p \"$VOL_DIR\"\n",
        "teardown": "#!/bin/sh\nset -eu\nrm -rf \"$VOL_DIR\"\n",
    }}))
    .await?;
    let config = env.dir.with_extension("config.json");
    std::fs::write(
        &config,
        json!({"nodePathMap": [{"node": "DEFAULT_PATH_FOR_NON_LISTED_NODES",
            "paths": [env.dir.display().to_string()]}]})
        .to_string(),
    )?;
    let helper = env.dir.with_extension("helper-pod.yaml");
    std::fs::write(
        &helper,
        serde_yaml::to_string(&json!({
            "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "helper-pod"},
            "spec": {"containers": [{"name": "helper-pod", "image": LOCAL_PATH_HELPER_IMAGE,
                "imagePullPolicy": "IfNotPresent",
                "securityContext": {"runAsUser": 0}}]}
        }))?,
    )?;
    Ok(vec![
        "start".to_string(),
        format!("--config={}", config.display()),
        format!("--provisioner-name={}", env.provisioner),
        format!("--namespace={ns}"),
        format!("--helper-image={LOCAL_PATH_HELPER_IMAGE}"),
        format!("--kubeconfig={}", env.kubeconfig.display()),
        format!("--helper-pod-file={}", helper.display()),
    ])
}

/// The binary of `peer` for test `test`, or `None` after one stderr line when
/// it is not built. Panics under `CI=true` (`.ci/run` builds the peers).
pub fn binary_or_skip(peer: Peer, test: &str) -> Option<PathBuf> {
    match peer.locate() {
        Ok(path) => Some(path),
        Err(why) if crate::realkube::assets::in_ci() => panic!("{test}: {why:#}"),
        Err(why) => {
            eprintln!("skipping {test}: {why:#}");
            None
        }
    }
}
