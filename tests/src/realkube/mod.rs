//! A real Kubernetes control plane for tests, the way controller-runtime's
//! envtest provides one: etcd, kube-apiserver, kube-controller-manager and
//! (from v1.37 on) kube-scheduler of one [`KubeVersion`] (upstream binaries,
//! found by [`Assets::locate`]) started on free loopback
//! ports in a temporary directory, with generated certificates, token
//! authentication, RBAC authorization and an audit log.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use e2e::realkube::{assets_or_skip, RealCluster, RealClusterOptions};
//! use e2e::realkube::KubeVersion;
//! let Some(assets) = assets_or_skip(KubeVersion::V1_37, "my_test") else { return Ok(()) };
//! let cluster = RealCluster::start(&assets, RealClusterOptions::default()).await?;
//! let client = cluster.client(); // admin, in system:masters
//! let sa_kubeconfig = cluster.service_account_kubeconfig("ns", "provisioner").await?;
//! # Ok(()) }
//! ```
//!
//! # What runs, and where
//!
//! The cluster's root directory ([`RealCluster::root`]) is a fresh temporary
//! directory (under `/dev/shm` when that is writable with 1 GiB free, so
//! etcd's fsyncs cost nothing, else the system temp dir) holding:
//!
//! | path | what |
//! | --- | --- |
//! | `pki/` | CA, API-server serving certificate, service-account key pair (see [`pki`]) |
//! | `tokens.csv` | `--token-auth-file`: user `admin` (group `system:masters`), users `system:kube-controller-manager` and `system:kube-scheduler` (group `system:masters`; `--use-service-account-credentials=false`) |
//! | `admin.kubeconfig`, `kube-controller-manager.kubeconfig`, `kube-scheduler.kubeconfig` | kubeconfigs with those tokens and the CA |
//! | `audit-policy.yaml`, `audit.log` | audit policy (everything at `Metadata`) and its JSON-lines log (see [`audit`]) |
//! | `etcd-data/` | etcd's data directory |
//! | `etcd.log`, `kube-apiserver.log`, `kube-controller-manager.log`, `kube-scheduler.log` | each process's stdout and stderr (appended across restarts) |
//! | `sa/<ns>_<name>.kubeconfig` | written by [`RealCluster::service_account_kubeconfig`] |
//!
//! Ports are picked free on 127.0.0.1 (etcd client and peer, API server
//! secure port, controller-manager and scheduler secure ports; nothing listens
//! elsewhere and the API server's insecure port is off), so several clusters can run at
//! once. If another process grabs a port between the pick and the bind, the
//! start is retried with new ports (up to three attempts).
//!
//! There is no kubelet or cloud provider: Nodes are plain objects that a test
//! creates and that stay `NotReady` (so the scheduler, where it runs, places
//! no Pod and never sets a claim's selected node). The controller manager runs
//! with `--controllers '*'` (PV binder, pvc/pv-protection, namespace, garbage
//! collector, service-account and token controllers, ...) and
//! `--leader-elect=false`.

pub mod assets;
pub mod audit;
pub mod node;
pub mod pki;
pub mod shared;
pub mod summary;

pub use assets::{assets_or_skip, Assets, KubeVersion};
pub use audit::AuditRecord;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Namespace, Secret, ServiceAccount};
use kube::api::{Api, PostParams};

use crate::harness::ManagedProcess;

/// How long [`RealCluster::start`] waits for etcd's `/health`.
pub const ETCD_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`RealCluster::start`] and [`RealCluster::start_apiserver`] wait for `/readyz`.
pub const APISERVER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// How long [`RealCluster::start`] waits for the controller manager's (and scheduler's) `/healthz`.
pub const CONTROLLER_MANAGER_READY_TIMEOUT: Duration = Duration::from_secs(60);
/// How long [`RealCluster::service_account_kubeconfig`] waits for the token Secret.
pub const SA_TOKEN_TIMEOUT: Duration = Duration::from_secs(60);
/// Grace between SIGTERM and SIGKILL in [`RealCluster::stop_apiserver`]: the
/// API server stops listening at once but lingers on open watches.
pub const APISERVER_STOP_GRACE: Duration = Duration::from_secs(3);

const START_ATTEMPTS: usize = 3;
const ADMIN_USER: &str = "admin";
/// kube-controller-manager's client-side `--kube-api-qps` and
/// `--kube-api-burst` in the harness (its own defaults are 20 and 30): each
/// controller's client has such a token bucket, and the PV controller's
/// annotations, bindings and events share one.
pub const CONTROLLER_MANAGER_QPS: (u32, u32) = (200, 400);
/// The user kube-controller-manager authenticates as (one user for all its
/// controllers: `--use-service-account-credentials=false`).
pub const KCM_USER: &str = "system:kube-controller-manager";
/// The user kube-scheduler authenticates as.
pub const SCHEDULER_USER: &str = "system:kube-scheduler";
const SA_ISSUER: &str = "https://kubernetes.default.svc.cluster.local";

/// Options of [`RealCluster::start`]. `Default`: temp dir removed on drop,
/// no extra API-server flags, controller manager on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RealClusterOptions {
    /// Keep the root directory (certificates, logs, audit log, etcd data) after
    /// drop; its path is printed to stderr when the cluster stops.
    pub keep_dir: bool,
    /// Extra kube-apiserver flags, appended after the harness's own (a later
    /// flag wins), e.g. `--feature-gates=...` or `--watch-cache=false`. Kept for
    /// [`RealCluster::start_apiserver`].
    pub apiserver_extra_flags: Vec<String>,
    /// Run kube-controller-manager (default `true`). Without it nothing binds
    /// claims, no protection finalizers are removed, namespaces never finish
    /// terminating and ServiceAccounts get no token Secret.
    pub controller_manager: bool,
    /// kube-controller-manager's `--kube-api-qps` and `--kube-api-burst`
    /// (default [`CONTROLLER_MANAGER_QPS`]).
    pub controller_manager_qps: (u32, u32),
}

impl Default for RealClusterOptions {
    fn default() -> Self {
        Self {
            keep_dir: false,
            apiserver_extra_flags: Vec::new(),
            controller_manager: true,
            controller_manager_qps: CONTROLLER_MANAGER_QPS,
        }
    }
}

/// Ports of one cluster, all on 127.0.0.1.
#[derive(Debug, Clone, Copy)]
struct Ports {
    etcd_client: u16,
    etcd_peer: u16,
    apiserver: u16,
    controller_manager: u16,
    scheduler: u16,
}

/// Ports handed out by this process (never reused by it, so two clusters in
/// one test binary cannot be given the same port).
static HANDED_OUT: Mutex<Option<HashSet<u16>>> = Mutex::new(None);

impl Ports {
    /// Five distinct ports that were free a moment ago: all probe sockets are
    /// held open together, so the kernel hands out five different ones.
    fn pick() -> anyhow::Result<Ports> {
        let mut handed = HANDED_OUT.lock().unwrap_or_else(|e| e.into_inner());
        let handed = handed.get_or_insert_with(HashSet::new);
        let mut held = Vec::new();
        let mut ports = Vec::new();
        while ports.len() < 5 {
            let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a probe socket")?;
            let port = l.local_addr()?.port();
            held.push(l);
            if handed.insert(port) {
                ports.push(port);
            }
            anyhow::ensure!(held.len() < 256, "no free loopback ports");
        }
        Ok(Ports {
            etcd_client: ports[0],
            etcd_peer: ports[1],
            apiserver: ports[2],
            controller_manager: ports[3],
            scheduler: ports[4],
        })
    }
}

/// A running etcd + kube-apiserver (+ kube-controller-manager, + kube-scheduler) on loopback.
///
/// Dropping it SIGKILLs every process's group (scheduler, controller manager,
/// API server, etcd, in that order), reaps them and removes the root directory
/// unless [`RealClusterOptions::keep_dir`].
pub struct RealCluster {
    // Field order is drop order: processes first, then the directory.
    scheduler: Option<ManagedProcess>,
    controller_manager: Option<ManagedProcess>,
    apiserver: Option<ManagedProcess>,
    etcd: ManagedProcess,
    client: kube::Client,
    assets: Assets,
    apiserver_args: Vec<String>,
    ports: Ports,
    root: PathBuf,
    admin_kubeconfig: PathBuf,
    ca_cert: PathBuf,
    audit_log: PathBuf,
    keep_dir: bool,
    _dir: Option<tempfile::TempDir>,
}

impl std::fmt::Debug for RealCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealCluster")
            .field("root", &self.root)
            .field("server", &self.server_url())
            .field("version", &self.assets.version)
            .field("assets", &self.assets.dir)
            .finish_non_exhaustive()
    }
}

fn log_file_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    crate::harness::process::last_lines(&text, lines, |_| true)
}

fn tail_of(root: &Path, lines: usize) -> String {
    [
        "etcd",
        "kube-apiserver",
        "kube-controller-manager",
        "kube-scheduler",
    ]
    .iter()
    .filter_map(|name| {
        let path = root.join(format!("{name}.log"));
        path.exists()
            .then(|| format!("==> {name}.log <==\n{}", log_file_tail(&path, lines)))
    })
    .collect::<Vec<_>>()
    .join("\n")
}

/// Space a temporary-directory parent must have free: etcd preallocates 64 MiB
/// WAL segments, and the API server's audit log grows with every request.
const MIN_FREE_BYTES: u64 = 1 << 30;

/// Root of the temporary directories: `/dev/shm` when it is a writable
/// directory with at least 1 GiB free (tmpfs: etcd's fsyncs are free; a
/// container's default 64 MiB `/dev/shm` is too small), else the system temp dir.
fn temp_parent() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && free_bytes(shm).is_some_and(|b| b >= MIN_FREE_BYTES)
        && tempfile::tempdir_in(shm).is_ok()
    {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// Bytes available to an unprivileged user on the filesystem holding `path`.
fn free_bytes(path: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c` is a valid NUL-terminated path and `st` is written by statvfs on success.
    let rc = unsafe { libc::statvfs(c.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    // `fsblkcnt_t` and `c_ulong` are u64 on 64-bit Linux but not on every target.
    #[allow(clippy::unnecessary_cast)]
    Some((st.f_bavail as u64).saturating_mul(st.f_frsize as u64))
}

/// Write a kubeconfig for `server` trusting `ca` and authenticating with `token`.
fn write_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    user: &str,
    token: &str,
    namespace: &str,
) -> anyhow::Result<()> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "realkube", "cluster": {
            "server": server,
            "certificate-authority": ca.display().to_string(),
        }}],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": "realkube", "context": {
            "cluster": "realkube", "user": user, "namespace": namespace,
        }}],
        "current-context": "realkube",
    });
    let text = serde_yaml::to_string(&doc)?;
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("writing kubeconfig {}", path.display()))?;
    f.write_all(text.as_bytes())?;
    Ok(())
}

/// A kube client from a kubeconfig file.
async fn client_from_kubeconfig(path: &Path) -> anyhow::Result<kube::Client> {
    let kc = kube::config::Kubeconfig::read_from(path)
        .with_context(|| format!("reading {}", path.display()))?;
    let cfg = kube::Config::from_custom_kubeconfig(kc, &Default::default()).await?;
    Ok(kube::Client::try_from(cfg)?)
}

/// GET `path` with `client`; `true` when the answer is 2xx with body `ok`.
async fn probe_ok(client: &kube::Client, path: &str) -> bool {
    let Ok(req) = http::Request::get(path).body(Vec::new()) else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), client.request_text(req)).await,
        Ok(Ok(body)) if body.trim() == "ok"
    )
}

/// Whether the API server's RBAC authorizer answers from synced informers: a
/// SubjectAccessReview for a plain authenticated user creating a
/// SelfSubjectAccessReview (granted only by the bootstrap ClusterRoleBinding
/// `system:basic-user`) comes back allowed.
async fn rbac_authorizes(client: &kube::Client) -> bool {
    let review = serde_json::json!({
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": "realkube-rbac-probe",
            "groups": ["system:authenticated"],
            "resourceAttributes": {
                "group": "authorization.k8s.io",
                "resource": "selfsubjectaccessreviews",
                "verb": "create"
            }
        }
    });
    let Ok(req) = http::Request::post("/apis/authorization.k8s.io/v1/subjectaccessreviews")
        .header("content-type", "application/json")
        .body(review.to_string().into_bytes())
    else {
        return false;
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), client.request::<serde_json::Value>(req)).await,
        Ok(Ok(answer)) if answer["status"]["allowed"] == true
    )
}

/// Whether the namespaces the API server's bootstrap controller creates
/// (`default`, `kube-system`) exist yet.
async fn system_namespaces_exist(client: &kube::Client) -> bool {
    let api: Api<Namespace> = Api::all(client.clone());
    for name in ["default", "kube-system"] {
        if !matches!(api.get_opt(name).await, Ok(Some(_))) {
            return false;
        }
    }
    true
}

/// Compact the etcd listening on 127.0.0.1:`port` to its current revision
/// (see [`RealCluster::compact_etcd`]); returns that revision.
///
/// Errors: etcd does not answer, or answers with an error.
pub async fn compact_etcd(port: u16) -> anyhow::Result<u64> {
    let range = etcd_post(
        port,
        "/v3/kv/range",
        // key "\0", one key, keys only: cheap, and the header carries the revision.
        &serde_json::json!({"key": "AA==", "limit": 1, "keys_only": true}),
    )
    .await?;
    let revision: u64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .with_context(|| format!("no header.revision in etcd's answer {range}"))?;
    let answer = etcd_post(
        port,
        "/v3/kv/compaction",
        &serde_json::json!({"revision": revision.to_string(), "physical": true}),
    )
    .await?;
    anyhow::ensure!(
        answer.get("error").is_none(),
        "etcd refused the compaction: {answer}"
    );
    Ok(revision)
}

/// POST `body` as JSON to etcd's v3 gateway at `path` on the client port
/// (HTTP/1.0, one request per connection) and parse the JSON answer.
async fn etcd_post(
    port: u16,
    path: &str,
    body: &serde_json::Value,
) -> anyhow::Result<serde_json::Value> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.to_string();
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        let head = format!(
            "POST {path} HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n",
            body.len()
        );
        s.write_all(head.as_bytes()).await?;
        s.write_all(body.as_bytes()).await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    let text = tokio::time::timeout(Duration::from_secs(10), attempt)
        .await
        .context("etcd did not answer in 10 s")??;
    let (_, json) = text
        .split_once("\r\n\r\n")
        .with_context(|| format!("no HTTP body in etcd's answer {text:?}"))?;
    serde_json::from_str(json).with_context(|| format!("etcd's answer to {path}: {json:?}"))
}

/// etcd's `/health` over plain HTTP/1.0 on the client port.
async fn etcd_healthy(port: u16) -> bool {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port)).await?;
        s.write_all(b"GET /health HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n")
            .await?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await?;
        Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(3), attempt).await,
        Ok(Ok(text)) if text.starts_with("HTTP/1.") && text.contains("\"health\":\"true\"")
    )
}

/// Wait until `ready` holds, failing early when `process` exits; errors carry
/// the root's log tail.
async fn wait_ready<F, Fut>(
    what: &str,
    process: &mut ManagedProcess,
    root: &Path,
    timeout: Duration,
    mut ready: F,
) -> anyhow::Result<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if ready().await {
            return Ok(start.elapsed());
        }
        if !process.is_running() {
            bail!(
                "{what} exited ({:?}) before it was ready\n{}",
                process.exit_status(),
                tail_of(root, 30)
            );
        }
        if start.elapsed() >= timeout {
            bail!("{what} not ready after {timeout:?}\n{}", tail_of(root, 30));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

impl RealCluster {
    /// Start etcd, kube-apiserver and (unless switched off) kube-controller-manager
    /// from `assets` on free loopback ports in a new temporary directory, and
    /// wait (bounded, see the `*_TIMEOUT` constants) until etcd's `/health`,
    /// the API server's `/readyz` and the controller manager's `/healthz`
    /// answer `ok`, the namespaces `default` and `kube-system` exist, and the
    /// controller manager's controllers run (ServiceAccount `default/default`
    /// exists; before that an API outage would make it exit).
    /// Takes about 5 s on an idle two-core machine.
    ///
    /// kube-apiserver runs with `--insecure-port 0`, token authentication
    /// (`tokens.csv`), `--authorization-mode Node,RBAC`, service-account keys,
    /// issuer and audiences (`https://kubernetes.default.svc.cluster.local`),
    /// service range `10.0.0.0/24`, and the audit log; then
    /// [`RealClusterOptions::apiserver_extra_flags`].
    ///
    /// Errors: the directory, certificates or files cannot be made, a binary
    /// cannot be run, or a process exits or is not ready in time (the error
    /// carries the tail of every log). A port lost to another process between
    /// pick and bind is retried with new ports.
    pub async fn start(assets: &Assets, opts: RealClusterOptions) -> anyhow::Result<Self> {
        let mut attempt = 1;
        loop {
            match Self::start_once(assets, &opts).await {
                Ok(c) => return Ok(c),
                Err(e)
                    if attempt < START_ATTEMPTS
                        && format!("{e:#}").contains("address already in use") =>
                {
                    eprintln!("realkube: port taken during start-up, retrying with new ports");
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn start_once(assets: &Assets, opts: &RealClusterOptions) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new()
            .prefix("realkube-")
            .tempdir_in(temp_parent())
            .context("creating the cluster's temporary directory")?;
        let root = dir.path().to_path_buf();
        let ports = Ports::pick()?;
        let pki = pki::generate(&root.join("pki"))?;
        let server = format!("https://127.0.0.1:{}", ports.apiserver);

        let admin_token = uuid::Uuid::new_v4().simple().to_string();
        let kcm_token = uuid::Uuid::new_v4().simple().to_string();
        let scheduler_token = uuid::Uuid::new_v4().simple().to_string();
        let tokens = root.join("tokens.csv");
        std::fs::write(
            &tokens,
            format!(
                "{admin_token},{ADMIN_USER},uid-admin,\"system:masters\"\n\
                 {kcm_token},{KCM_USER},uid-kcm,\"system:masters\"\n\
                 {scheduler_token},{SCHEDULER_USER},uid-scheduler,\"system:masters\"\n"
            ),
        )?;
        let admin_kubeconfig = root.join("admin.kubeconfig");
        write_kubeconfig(
            &admin_kubeconfig,
            &server,
            &pki.ca_cert,
            ADMIN_USER,
            &admin_token,
            "default",
        )?;
        let kcm_kubeconfig = root.join("kube-controller-manager.kubeconfig");
        write_kubeconfig(
            &kcm_kubeconfig,
            &server,
            &pki.ca_cert,
            KCM_USER,
            &kcm_token,
            "kube-system",
        )?;
        let scheduler_kubeconfig = root.join("kube-scheduler.kubeconfig");
        write_kubeconfig(
            &scheduler_kubeconfig,
            &server,
            &pki.ca_cert,
            SCHEDULER_USER,
            &scheduler_token,
            "kube-system",
        )?;
        let audit_policy = root.join("audit-policy.yaml");
        std::fs::write(&audit_policy, audit::POLICY)?;
        let audit_log = root.join("audit.log");

        // etcd
        let etcd_data = root.join("etcd-data");
        let etcd_client_url = format!("http://127.0.0.1:{}", ports.etcd_client);
        let etcd_peer_url = format!("http://127.0.0.1:{}", ports.etcd_peer);
        let etcd_args: Vec<String> = vec![
            "--name".into(),
            "realkube".into(),
            "--data-dir".into(),
            etcd_data.display().to_string(),
            "--listen-client-urls".into(),
            etcd_client_url.clone(),
            "--advertise-client-urls".into(),
            etcd_client_url.clone(),
            "--listen-peer-urls".into(),
            etcd_peer_url.clone(),
            "--initial-advertise-peer-urls".into(),
            etcd_peer_url.clone(),
            "--initial-cluster".into(),
            format!("realkube={etcd_peer_url}"),
            "--initial-cluster-state".into(),
            "new".into(),
            "--quota-backend-bytes".into(),
            "8589934592".into(),
        ];
        let mut etcd = ManagedProcess::spawn(
            "etcd",
            &assets.etcd,
            &etcd_args,
            &[],
            &root.join("etcd.log"),
        )?;
        wait_ready("etcd", &mut etcd, &root, ETCD_READY_TIMEOUT, || {
            etcd_healthy(ports.etcd_client)
        })
        .await?;

        // kube-apiserver
        let p = |p: &Path| p.display().to_string();
        let mut apiserver_args: Vec<String> = [
            "--etcd-servers",
            &etcd_client_url,
            "--bind-address",
            "127.0.0.1",
            "--secure-port",
            &ports.apiserver.to_string(),
            "--advertise-address",
            "127.0.0.1",
            "--endpoint-reconciler-type",
            "none",
            "--cert-dir",
            &p(&root.join("pki")),
            "--tls-cert-file",
            &p(&pki.serving_cert),
            "--tls-private-key-file",
            &p(&pki.serving_key),
            "--client-ca-file",
            &p(&pki.ca_cert),
            "--token-auth-file",
            &p(&tokens),
            "--authorization-mode",
            "Node,RBAC",
            "--service-account-key-file",
            &p(&pki.sa_pub),
            "--service-account-signing-key-file",
            &p(&pki.sa_key),
            "--service-account-issuer",
            SA_ISSUER,
            "--api-audiences",
            SA_ISSUER,
            "--service-cluster-ip-range",
            "10.0.0.0/24",
            "--allow-privileged=true",
            "--audit-policy-file",
            &p(&audit_policy),
            "--audit-log-path",
            &p(&audit_log),
            "--audit-log-format",
            "json",
            "--audit-log-mode",
            "blocking",
            "--audit-log-maxsize",
            "1000",
            "--v",
            "1",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        apiserver_args.extend(apiserver_version_flags(assets.version));
        apiserver_args.extend(opts.apiserver_extra_flags.iter().cloned());
        let mut apiserver = spawn_apiserver(assets, &apiserver_args, &root)?;
        let client = client_from_kubeconfig(&admin_kubeconfig).await?;
        wait_ready(
            "kube-apiserver",
            &mut apiserver,
            &root,
            APISERVER_READY_TIMEOUT,
            || probe_ok(&client, "/readyz"),
        )
        .await?;
        // `/readyz` does not cover the bootstrap controller's first pass: the
        // system namespaces appear a moment later, and tests expect `default`.
        wait_ready(
            "the default and kube-system namespaces",
            &mut apiserver,
            &root,
            APISERVER_READY_TIMEOUT,
            || system_namespaces_exist(&client),
        )
        .await?;

        // kube-controller-manager
        let controller_manager = if opts.controller_manager {
            let kc = p(&kcm_kubeconfig);
            let mut args: Vec<String> = [
                "--kubeconfig",
                &kc,
                "--authentication-kubeconfig",
                &kc,
                "--authorization-kubeconfig",
                &kc,
                "--authentication-skip-lookup",
                "--bind-address",
                "127.0.0.1",
                "--secure-port",
                &ports.controller_manager.to_string(),
                "--cert-dir",
                &p(&root.join("kcm-certs")),
                "--controllers",
                "*",
                "--leader-elect=false",
                "--use-service-account-credentials=false",
                "--kube-api-qps",
                &opts.controller_manager_qps.0.to_string(),
                "--kube-api-burst",
                &opts.controller_manager_qps.1.to_string(),
                "--service-account-private-key-file",
                &p(&pki.sa_key),
                "--root-ca-file",
                &p(&pki.ca_cert),
                "--cluster-signing-cert-file",
                &p(&pki.ca_cert),
                "--cluster-signing-key-file",
                &p(&pki.ca_key),
                "--v",
                "1",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            if assets.version < KubeVersion::V1_37 {
                // v1.19's insecure port is on by default (the flag is gone in 1.24).
                args.extend(["--port".to_string(), "0".to_string()]);
            }
            let mut kcm = ManagedProcess::spawn(
                "kube-controller-manager",
                &assets.kube_controller_manager,
                &args,
                &[],
                &root.join("kube-controller-manager.log"),
            )?;
            // Its serving certificate is self-signed (in --cert-dir): the probe
            // does not verify it; it only asks whether the process is healthy.
            let mut cfg = kube::Config::new(
                format!("https://127.0.0.1:{}", ports.controller_manager).parse()?,
            );
            cfg.accept_invalid_certs = true;
            let probe = kube::Client::try_from(cfg)?;
            wait_ready(
                "kube-controller-manager",
                &mut kcm,
                &root,
                CONTROLLER_MANAGER_READY_TIMEOUT,
                || probe_ok(&probe, "/healthz"),
            )
            .await?;
            // `/healthz` answers before the controllers start, and until they
            // have started an API outage is fatal to the controller manager
            // ("error building controller context"). The ServiceAccount
            // controller's `default/default` shows they run.
            let service_accounts: Api<ServiceAccount> = Api::namespaced(client.clone(), "default");
            wait_ready(
                "kube-controller-manager's controllers (ServiceAccount default/default)",
                &mut kcm,
                &root,
                CONTROLLER_MANAGER_READY_TIMEOUT,
                || async { matches!(service_accounts.get_opt("default").await, Ok(Some(_))) },
            )
            .await?;
            Some(kcm)
        } else {
            None
        };

        // kube-scheduler, where the release has one in the assets.
        let scheduler = match &assets.kube_scheduler {
            Some(binary) => {
                let kc = p(&scheduler_kubeconfig);
                let args: Vec<String> = [
                    "--kubeconfig",
                    &kc,
                    "--authentication-kubeconfig",
                    &kc,
                    "--authorization-kubeconfig",
                    &kc,
                    "--bind-address",
                    "127.0.0.1",
                    "--secure-port",
                    &ports.scheduler.to_string(),
                    "--cert-dir",
                    &p(&root.join("scheduler-certs")),
                    "--leader-elect=false",
                    "--v",
                    "1",
                ]
                .iter()
                .map(|s| s.to_string())
                .collect();
                let mut sched = ManagedProcess::spawn(
                    "kube-scheduler",
                    binary,
                    &args,
                    &[],
                    &root.join("kube-scheduler.log"),
                )?;
                let mut cfg =
                    kube::Config::new(format!("https://127.0.0.1:{}", ports.scheduler).parse()?);
                cfg.accept_invalid_certs = true;
                let probe = kube::Client::try_from(cfg)?;
                wait_ready(
                    "kube-scheduler",
                    &mut sched,
                    &root,
                    CONTROLLER_MANAGER_READY_TIMEOUT,
                    || probe_ok(&probe, "/healthz"),
                )
                .await?;
                Some(sched)
            }
            None => None,
        };

        let (dir, keep_dir) = if opts.keep_dir {
            (None, {
                let _ = dir.keep();
                true
            })
        } else {
            (Some(dir), false)
        };
        Ok(RealCluster {
            scheduler,
            controller_manager,
            apiserver: Some(apiserver),
            etcd,
            client,
            assets: assets.clone(),
            apiserver_args,
            ports,
            root,
            admin_kubeconfig,
            ca_cert: pki.ca_cert,
            audit_log,
            keep_dir,
            _dir: dir,
        })
    }

    /// The Kubernetes release this cluster runs.
    pub fn version(&self) -> KubeVersion {
        self.assets.version
    }

    /// An admin client (user `admin`, group `system:masters`; default
    /// namespace `default`). Cheap: a clone of one client.
    pub fn client(&self) -> kube::Client {
        self.client.clone()
    }

    /// Path of the admin kubeconfig (`<root>/admin.kubeconfig`; token
    /// authentication, the CA as a file path).
    pub fn admin_kubeconfig(&self) -> &Path {
        &self.admin_kubeconfig
    }

    /// Process ids of the running control-plane processes, named `etcd`,
    /// `kube-apiserver`, `kube-controller-manager` (a stopped one is left
    /// out): the benchmark's CPU accounting reads them.
    pub fn process_ids(&self) -> Vec<(&'static str, u32)> {
        let mut ids = vec![("etcd", self.etcd.pid())];
        if let Some(p) = &self.apiserver {
            ids.push(("kube-apiserver", p.pid()));
        }
        if let Some(p) = &self.controller_manager {
            ids.push(("kube-controller-manager", p.pid()));
        }
        if let Some(p) = &self.scheduler {
            ids.push(("kube-scheduler", p.pid()));
        }
        ids
    }

    /// The API server's URL, `https://127.0.0.1:<port>`.
    pub fn server_url(&self) -> String {
        format!("https://127.0.0.1:{}", self.ports.apiserver)
    }

    /// A kubeconfig with the identity of ServiceAccount `namespace/name`
    /// (user `system:serviceaccount:<namespace>:<name>`, groups
    /// `system:serviceaccounts` and `system:serviceaccounts:<namespace>`), so a
    /// process runs with exactly the RBAC granted to it.
    ///
    /// Creates the namespace and the ServiceAccount if missing, waits (at most
    /// [`SA_TOKEN_TIMEOUT`]) for a token Secret the controller manager's
    /// token controller fills (v1.19 creates one per ServiceAccount; from 1.24
    /// on the harness creates `<name>-token` of type
    /// `kubernetes.io/service-account-token` for it), and writes
    /// `<root>/sa/<namespace>_<name>.kubeconfig` (mode 0600, default namespace
    /// `namespace`). Returns its path.
    ///
    /// Errors: the cluster runs without a controller manager, an API call
    /// fails, or no token appears in time.
    pub async fn service_account_kubeconfig(
        &self,
        namespace: &str,
        name: &str,
    ) -> anyhow::Result<PathBuf> {
        anyhow::ensure!(
            self.controller_manager.is_some(),
            "service-account tokens come from kube-controller-manager, which this cluster does not run"
        );
        let client = self.client();
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces.get_opt(namespace).await?.is_none() {
            let ns: Namespace =
                serde_json::from_value(serde_json::json!({"metadata": {"name": namespace}}))?;
            ignore_conflict(namespaces.create(&PostParams::default(), &ns).await)
                .with_context(|| format!("creating namespace {namespace}"))?;
        }
        let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), namespace);
        if sas.get_opt(name).await?.is_none() {
            let sa: ServiceAccount =
                serde_json::from_value(serde_json::json!({"metadata": {"name": name}}))?;
            ignore_conflict(sas.create(&PostParams::default(), &sa).await)
                .with_context(|| format!("creating ServiceAccount {namespace}/{name}"))?;
        }
        let secrets: Api<Secret> = Api::namespaced(client, namespace);
        if self.version() >= KubeVersion::V1_37 {
            let secret: Secret = serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": format!("{name}-token"),
                    "annotations": {"kubernetes.io/service-account.name": name},
                },
                "type": "kubernetes.io/service-account-token",
            }))?;
            ignore_conflict(secrets.create(&PostParams::default(), &secret).await)
                .with_context(|| format!("creating the token Secret of {namespace}/{name}"))?;
        }
        let deadline = Instant::now() + SA_TOKEN_TIMEOUT;
        let token = loop {
            if let Some(token) = sa_token(&sas, &secrets, name, self.version()).await? {
                break token;
            }
            if Instant::now() >= deadline {
                bail!(
                    "no token Secret for ServiceAccount {namespace}/{name} after {SA_TOKEN_TIMEOUT:?}\n{}",
                    self.log_tail(20)
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let dir = self.root.join("sa");
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{namespace}_{name}.kubeconfig"));
        write_kubeconfig(
            &path,
            &self.server_url(),
            &self.ca_cert,
            &format!("system:serviceaccount:{namespace}:{name}"),
            &token,
            namespace,
        )?;
        Ok(path)
    }

    /// A real API outage: SIGTERM kube-apiserver (it stops listening at once),
    /// wait up to [`APISERVER_STOP_GRACE`] for it to exit, then SIGKILL its
    /// process group. etcd and the controller manager keep running. A no-op
    /// when it is already stopped.
    ///
    /// Errors: none so far (the `Result` leaves room for checks).
    pub async fn stop_apiserver(&mut self) -> anyhow::Result<()> {
        let Some(mut p) = self.apiserver.take() else {
            return Ok(());
        };
        p.signal(libc::SIGTERM);
        let deadline = Instant::now() + APISERVER_STOP_GRACE;
        while p.is_running() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        p.kill();
        Ok(())
    }

    /// Start kube-apiserver again with the same flags and port, and wait (at
    /// most [`APISERVER_READY_TIMEOUT`]) for `/readyz`. Objects survive in
    /// etcd. A no-op when it is running.
    ///
    /// Errors: it cannot be started, exits, or is not ready in time (with the
    /// log tail).
    pub async fn start_apiserver(&mut self) -> anyhow::Result<()> {
        if self.apiserver.as_mut().is_some_and(|p| p.is_running()) {
            return Ok(());
        }
        let mut p = spawn_apiserver(&self.assets, &self.apiserver_args, &self.root)?;
        let client = self.client();
        wait_ready(
            "kube-apiserver",
            &mut p,
            &self.root,
            APISERVER_READY_TIMEOUT,
            || probe_ok(&client, "/readyz"),
        )
        .await?;
        // `/readyz` answers before the RBAC authorizer's informers have
        // synced: until then a restarted v1.19 server refuses (403) requests
        // that only RBAC allows, which a client would see as a missing grant.
        wait_ready(
            "kube-apiserver RBAC authorizer",
            &mut p,
            &self.root,
            APISERVER_READY_TIMEOUT,
            || rbac_authorizes(&client),
        )
        .await?;
        self.apiserver = Some(p);
        Ok(())
    }

    /// Every request the API server has answered so far, one [`AuditRecord`]
    /// per request in log order (across API-server restarts), from
    /// `<root>/audit.log`. Includes the harness's own requests (user `admin`)
    /// and the controller manager's (`system:kube-controller-manager`).
    ///
    /// Errors: the log cannot be read or holds a line that is not an audit event.
    pub fn audit_records(&self) -> anyhow::Result<Vec<AuditRecord>> {
        audit::read(&self.audit_log)
    }

    /// etcd's client port on 127.0.0.1 (plain HTTP, loopback only).
    pub fn etcd_port(&self) -> u16 {
        self.ports.etcd_client
    }

    /// Compact etcd's history up to its current revision (physically, as
    /// `etcdctl compact --physical` does), through etcd's v3 JSON gateway
    /// (`POST /v3/kv/range` for the revision, `POST /v3/kv/compaction`). Every
    /// resourceVersion below the returned revision is then gone from etcd: a
    /// list at such a resourceVersion that the API server delegates to etcd
    /// (one with `limit`) and a `continue` token taken before the compaction
    /// answer `410 Gone` (reason `Expired`). kube-apiserver does the same on
    /// its own every `--etcd-compaction-interval` (5 min by default).
    ///
    /// Returns the revision compacted to.
    ///
    /// Errors: etcd does not answer, or answers with an error.
    pub async fn compact_etcd(&self) -> anyhow::Result<u64> {
        compact_etcd(self.ports.etcd_client).await
    }

    /// The cluster's root directory (see the module docs for its layout).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The last `lines` lines of each process's log, each under a
    /// `==> <name>.log <==` header.
    pub fn log_tail(&self, lines: usize) -> String {
        tail_of(&self.root, lines)
    }
}

impl Drop for RealCluster {
    fn drop(&mut self) {
        if let Some(p) = self.scheduler.as_mut() {
            p.kill();
        }
        if let Some(p) = self.controller_manager.as_mut() {
            p.kill();
        }
        if let Some(p) = self.apiserver.as_mut() {
            p.kill();
        }
        self.etcd.kill();
        if self.keep_dir {
            eprintln!("realkube: kept {}", self.root.display());
        }
    }
}

/// kube-apiserver flags that differ by release.
fn apiserver_version_flags(version: KubeVersion) -> Vec<String> {
    let flags: &[&str] = match version {
        // The insecure port (gone in 1.24) is on by default in 1.19.
        KubeVersion::V1_19 => &["--insecure-port", "0"],
        // Pod Security admission is on by default from 1.25; named here so the
        // two namespaces' `pod-security.kubernetes.io/enforce` labels are enforced.
        KubeVersion::V1_37 => &[
            "--enable-admission-plugins",
            "NamespaceLifecycle,ServiceAccount,DefaultStorageClass,StorageObjectInUseProtection,PodSecurity",
        ],
    };
    flags.iter().map(|s| s.to_string()).collect()
}

fn spawn_apiserver(
    assets: &Assets,
    args: &[String],
    root: &Path,
) -> anyhow::Result<ManagedProcess> {
    ManagedProcess::spawn(
        "kube-apiserver",
        &assets.kube_apiserver,
        args,
        &[],
        &root.join("kube-apiserver.log"),
    )
}

fn ignore_conflict<T>(r: Result<T, kube::Error>) -> Result<(), kube::Error> {
    match r {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(e),
    }
}

/// The token of ServiceAccount `name`'s first token Secret (v1.19: those the
/// ServiceAccount lists; later: `<name>-token`), once it is filled.
async fn sa_token(
    sas: &Api<ServiceAccount>,
    secrets: &Api<Secret>,
    name: &str,
    version: KubeVersion,
) -> anyhow::Result<Option<String>> {
    let names: Vec<String> = if version >= KubeVersion::V1_37 {
        vec![format!("{name}-token")]
    } else {
        let Some(sa) = sas.get_opt(name).await? else {
            return Ok(None);
        };
        sa.secrets
            .unwrap_or_default()
            .into_iter()
            .filter_map(|r| r.name)
            .collect()
    };
    for secret_name in names {
        let Some(secret) = secrets.get_opt(&secret_name).await? else {
            continue;
        };
        if let Some(token) = secret.data.as_ref().and_then(|d| d.get("token")) {
            let token =
                String::from_utf8(token.0.clone()).context("service-account token is not UTF-8")?;
            if !token.is_empty() {
                return Ok(Some(token));
            }
        }
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn free_bytes_of_an_existing_and_a_missing_path() {
        assert!(free_bytes(&std::env::temp_dir()).is_some_and(|b| b > 0));
        assert_eq!(free_bytes(Path::new("/nonexistent/realkube")), None);
    }

    #[test]
    fn ports_are_distinct_within_and_across_picks() {
        let a = Ports::pick().unwrap();
        let b = Ports::pick().unwrap();
        let all = [
            a.etcd_client,
            a.etcd_peer,
            a.apiserver,
            a.controller_manager,
            a.scheduler,
            b.etcd_client,
            b.etcd_peer,
            b.apiserver,
            b.controller_manager,
            b.scheduler,
        ];
        let set: HashSet<u16> = all.iter().copied().collect();
        assert_eq!(set.len(), 10, "{all:?}");
    }
}
