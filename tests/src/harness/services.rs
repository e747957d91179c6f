//! The three service processes: their command lines (the flags documented in
//! `common::runtime::config` and each service's `--help`), log files, HTTP ports and
//! lifecycle (start, SIGKILL, SIGTERM, restart).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::binaries::Binaries;
use super::metrics::{http_get, MetricsPage};
use super::process::{free_port, ManagedProcess};
use super::wait::wait_until;

/// One of the three services.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Service {
    /// `provision-svc`: claims → volumes → durable queue.
    Provision,
    /// `pv-writer`: durable queue → PV objects.
    PvWriter,
    /// `reclaim-svc`: released PVs → backend delete → PV deletion.
    Reclaim,
}

impl Service {
    /// All three, in pipeline order.
    pub const ALL: [Service; 3] = [Service::Provision, Service::PvWriter, Service::Reclaim];

    /// Binary name, e.g. `provision-svc`.
    pub fn binary_name(self) -> &'static str {
        match self {
            Service::Provision => "provision-svc",
            Service::PvWriter => "pv-writer",
            Service::Reclaim => "reclaim-svc",
        }
    }

    /// Lease name suffix (design: `<provisioner name, / → ->-<suffix>`).
    pub fn lease_suffix(self) -> &'static str {
        match self {
            Service::Provision => "provision",
            Service::PvWriter => "pv-writer",
            Service::Reclaim => "reclaim",
        }
    }

    /// This service's Lease name for `provisioner_name`.
    pub fn lease_name(self, provisioner_name: &str) -> String {
        api_types::lease_name(provisioner_name, self.lease_suffix())
    }

    /// Path of this service's binary in `bins`.
    pub fn binary(self, bins: &Binaries) -> &Path {
        match self {
            Service::Provision => &bins.provision,
            Service::PvWriter => &bins.pv_writer,
            Service::Reclaim => &bins.reclaim,
        }
    }

    /// Whether the service runs the hostpath backend (takes `--base-dir`,
    /// `--node-name`): provision-svc creates directories, reclaim-svc removes them.
    pub fn uses_backend(self) -> bool {
        matches!(self, Service::Provision | Service::Reclaim)
    }
}

/// `--nfs-server` of [`ServiceSettings::use_nfs_subdir`].
pub const NFS_TEST_SERVER: &str = "nfs.test";
/// `--nfs-path` (the export path written into PVs) of [`ServiceSettings::use_nfs_subdir`].
pub const NFS_TEST_EXPORT: &str = "/srv/k8s";

/// Settings every service process of one system shares.
#[derive(Debug, Clone)]
pub struct ServiceSettings {
    /// Kubeconfig the services use (unless `service_kubeconfigs` names one).
    pub kubeconfig: PathBuf,
    /// Per-service kubeconfig overrides: on a real control plane each service
    /// runs as its own ServiceAccount (see `harness::plane::RealPlane`).
    pub service_kubeconfigs: std::collections::BTreeMap<Service, PathBuf>,
    /// Redis URL of the durable queue and intents.
    pub redis_url: String,
    /// Provisioner name (StorageClass `provisioner`).
    pub provisioner_name: String,
    /// Hostpath backend base directory.
    pub base_dir: PathBuf,
    /// Hostpath backend node name (PV node affinity).
    pub node_name: String,
    /// Run leader election (needed with more than one replica).
    pub leader_election: bool,
    /// Namespace of the Leases (of every service without an entry in
    /// [`lease_namespaces`](Self::lease_namespaces)).
    pub lease_namespace: String,
    /// Per-service Lease namespace (the real plane: each service's namespace in the
    /// deploy, where its Lease Role grants it the Lease).
    pub lease_namespaces: std::collections::BTreeMap<Service, String>,
    /// `--leader-election-lease-duration`.
    pub lease_duration: Duration,
    /// `--leader-election-renew-deadline`.
    pub renew_deadline: Duration,
    /// `--leader-election-retry-period`.
    pub retry_period: Duration,
    /// `--kube-api-qps` (0 = no client-side limit).
    pub kube_api_qps: f64,
    /// Per-service `--kube-api-qps` replacing [`kube_api_qps`](Self::kube_api_qps)
    /// for that service (e.g. a throttled pv-writer, the real-plane stand-in for
    /// the simulator's API latency). Pair it with `--kube-api-burst` in
    /// [`extra_args`](Self::extra_args), or the default burst of 400 absorbs it.
    pub kube_api_qps_of: std::collections::BTreeMap<Service, f64>,
    /// provision-svc/reclaim-svc `--add-finalizer`.
    pub add_finalizer: bool,
    /// First per-item retry delay (claims, volumes and queued PV writes).
    pub retry_initial: Duration,
    /// Cap of the per-item retry delay.
    pub retry_max: Duration,
    /// `--log-level`.
    pub log_level: String,
    /// Directory of the per-process log files.
    pub log_dir: PathBuf,
    /// Extra flags per service, appended last.
    pub extra_args: Vec<(Service, Vec<String>)>,
    /// The queue HMAC key file given to provision-svc and pv-writer
    /// (`--queue-hmac-key-file`); [`new`](Self::new) writes a fresh random key.
    pub queue_key_file: PathBuf,
    /// With an ACL'd Redis: the directory of per-user password files; each
    /// service then runs with `--redis-username <binary name>` and
    /// `--redis-password-file <dir>/<binary name>` (the deploy's users).
    pub redis_password_dir: Option<PathBuf>,
    /// With a TLS Redis: `--redis-ca-file` of every service.
    pub redis_ca_file: Option<PathBuf>,
}

impl ServiceSettings {
    /// The Lease namespace of `service`: its [`lease_namespaces`](Self::lease_namespaces)
    /// entry, else [`lease_namespace`](Self::lease_namespace).
    pub fn lease_namespace_of(&self, service: Service) -> &str {
        self.lease_namespaces
            .get(&service)
            .unwrap_or(&self.lease_namespace)
    }

    /// Test-friendly defaults: leader election on with short timings (lease 4 s,
    /// renew deadline 3 s, retry period 1 s), client rate limit off, retries
    /// from 500 ms capped at 5 s, provisioner `example.com/hostpath`, node `node-1`,
    /// and a random queue HMAC key written to `<log_dir>/queue-hmac-key`.
    pub fn new(kubeconfig: &Path, redis_url: &str, base_dir: &Path, log_dir: &Path) -> Self {
        let queue_key_file = write_queue_key(log_dir);
        Self {
            queue_key_file,
            kubeconfig: kubeconfig.to_path_buf(),
            service_kubeconfigs: Default::default(),
            redis_url: redis_url.to_string(),
            provisioner_name: "example.com/hostpath".into(),
            base_dir: base_dir.to_path_buf(),
            node_name: "node-1".into(),
            leader_election: true,
            lease_namespace: "default".into(),
            lease_namespaces: Default::default(),
            lease_duration: Duration::from_secs(4),
            renew_deadline: Duration::from_secs(3),
            retry_period: Duration::from_secs(1),
            kube_api_qps: 0.0,
            kube_api_qps_of: Default::default(),
            add_finalizer: false,
            retry_initial: Duration::from_millis(500),
            retry_max: Duration::from_secs(5),
            log_level: std::env::var("E2E_SERVICE_LOG_LEVEL").unwrap_or_else(|_| "info".into()),
            log_dir: log_dir.to_path_buf(),
            extra_args: Vec::new(),
            redis_password_dir: None,
            redis_ca_file: None,
        }
    }

    /// Switch provision-svc and reclaim-svc to the nfs-subdir backend, with
    /// the base directory standing in for the mounted export
    /// (`--nfs-mount=<base_dir>`, `--nfs-server=`[`NFS_TEST_SERVER`],
    /// `--nfs-path=`[`NFS_TEST_EXPORT`]). Usable as
    /// `SystemOptions::configure`.
    pub fn use_nfs_subdir(&mut self) {
        let mount = self.base_dir.display().to_string();
        for service in [Service::Provision, Service::PvWriter, Service::Reclaim] {
            self.extra_args.push((
                service,
                vec![
                    "--backend=nfs-subdir".into(),
                    format!("--nfs-server={NFS_TEST_SERVER}"),
                    format!("--nfs-path={NFS_TEST_EXPORT}"),
                    format!("--nfs-mount={mount}"),
                ],
            ));
        }
    }

    /// The command line of `service` replica `replica` serving HTTP on `http_port`.
    pub fn args(&self, service: Service, replica: usize, http_port: u16) -> Vec<String> {
        let secs = |d: Duration| format!("{}ms", d.as_millis());
        let kubeconfig = self
            .service_kubeconfigs
            .get(&service)
            .unwrap_or(&self.kubeconfig);
        let mut a: Vec<String> = vec![
            "--kubeconfig".into(),
            kubeconfig.display().to_string(),
            "--redis-url".into(),
            self.redis_url.clone(),
            "--provisioner-name".into(),
            self.provisioner_name.clone(),
            "--http-address".into(),
            "127.0.0.1".into(),
            "--http-port".into(),
            http_port.to_string(),
            format!("--leader-election={}", self.leader_election),
            "--leader-election-namespace".into(),
            self.lease_namespace_of(service).to_string(),
            "--leader-election-identity".into(),
            identity(service, replica),
            "--leader-election-lease-duration".into(),
            secs(self.lease_duration),
            "--leader-election-renew-deadline".into(),
            secs(self.renew_deadline),
            "--leader-election-retry-period".into(),
            secs(self.retry_period),
            "--kube-api-qps".into(),
            self.kube_api_qps_of
                .get(&service)
                .unwrap_or(&self.kube_api_qps)
                .to_string(),
            "--log-level".into(),
            self.log_level.clone(),
            "--shutdown-grace-period".into(),
            "5s".into(),
        ];
        if let Some(dir) = &self.redis_password_dir {
            a.extend([
                "--redis-username".into(),
                service.binary_name().into(),
                "--redis-password-file".into(),
                dir.join(service.binary_name()).display().to_string(),
            ]);
        }
        if let Some(ca) = &self.redis_ca_file {
            a.extend(["--redis-ca-file".into(), ca.display().to_string()]);
        }
        if matches!(service, Service::Provision | Service::PvWriter) {
            a.extend([
                "--queue-hmac-key-file".into(),
                self.queue_key_file.display().to_string(),
            ]);
        }
        if service == Service::PvWriter {
            a.extend(["--base-dir".into(), self.base_dir.display().to_string()]);
        }
        if service.uses_backend() {
            a.extend([
                "--base-dir".into(),
                self.base_dir.display().to_string(),
                "--node-name".into(),
                self.node_name.clone(),
            ]);
            if self.add_finalizer {
                a.push("--add-finalizer=true".into());
            }
        }
        // The same shared flags in all three services (common::runtime::config).
        a.extend([
            "--retry-interval-start".into(),
            secs(self.retry_initial),
            "--retry-interval-max".into(),
            secs(self.retry_max),
        ]);
        for (s, extra) in &self.extra_args {
            if *s == service {
                a.extend(extra.iter().cloned());
            }
        }
        a
    }
}

/// Write a fresh random queue HMAC key (64 hex characters) to
/// `<dir>/queue-hmac-key` (mode 0600) and return its path. Panics when the
/// directory cannot be written.
pub fn write_queue_key(dir: &Path) -> PathBuf {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    std::fs::create_dir_all(dir).expect("key directory");
    let path = dir.join("queue-hmac-key");
    let key = format!(
        "{}{}",
        uuid::Uuid::new_v4().simple(),
        uuid::Uuid::new_v4().simple()
    );
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .expect("queue key file");
    file.write_all(key.as_bytes()).expect("queue key written");
    path
}

/// The Lease holder identity the harness gives replica `replica` of `service`,
/// e.g. `provision-svc-1`.
pub fn identity(service: Service, replica: usize) -> String {
    format!("{}-{replica}", service.binary_name())
}

/// One running replica of a service.
#[derive(Debug)]
pub struct ServiceProcess {
    /// Which service.
    pub service: Service,
    /// Replica index (0, 1, ...); part of the identity and log file name.
    pub replica: usize,
    /// `127.0.0.1:<port>` of its `/metrics`, `/healthz`, `/readyz`.
    pub http_addr: SocketAddr,
    /// The process.
    pub process: ManagedProcess,
    /// How many times this replica was (re)started.
    pub starts: u32,
}

impl ServiceProcess {
    /// Start replica `replica` of `service` with `settings`; its log goes to
    /// `<log_dir>/<binary>-<replica>.log` (appended across restarts).
    ///
    /// Errors: no free port, or the binary cannot be executed.
    pub fn start(
        service: Service,
        replica: usize,
        bins: &Binaries,
        settings: &ServiceSettings,
    ) -> anyhow::Result<Self> {
        let port = free_port()?;
        let args = settings.args(service, replica, port);
        let log = settings
            .log_dir
            .join(format!("{}.log", identity(service, replica)));
        let process = ManagedProcess::spawn(
            &identity(service, replica),
            service.binary(bins),
            &args,
            &[("RUST_BACKTRACE".into(), "1".into())],
            &log,
        )?;
        Ok(Self {
            service,
            replica,
            http_addr: SocketAddr::from(([127, 0, 0, 1], port)),
            process,
            starts: 1,
        })
    }

    /// Whether the process is running (no reaping; a zombie counts as exited
    /// only once [`ManagedProcess::is_running`] reaped it).
    pub fn process_running(&self) -> bool {
        std::path::Path::new(&format!("/proc/{}", self.process.pid())).exists()
            && !self.process.has_exited()
    }

    /// This replica's Lease identity.
    pub fn identity(&self) -> String {
        identity(self.service, self.replica)
    }

    /// Wait until `/healthz` answers 200.
    ///
    /// Errors: timeout, or the process exited (its log tail is in the message).
    pub async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let addr = self.http_addr;
        let r = wait_until(
            timeout,
            &format!("{} serves /healthz", self.identity()),
            || async move { matches!(http_get(addr, "/healthz").await, Ok((200, _))) },
        )
        .await;
        if r.is_err() && !self.process.is_running() {
            anyhow::bail!(
                "{} exited ({:?}); log tail:\n{}",
                self.identity(),
                self.process.exit_status(),
                self.log_tail(30)
            );
        }
        r
    }

    /// Whether `/readyz` answers 200 now.
    pub async fn is_ready(&self) -> bool {
        matches!(http_get(self.http_addr, "/readyz").await, Ok((200, _)))
    }

    /// Whether this replica reports holding its Lease
    /// (`leader_election_master_status` = 1).
    pub async fn is_leader(&self) -> bool {
        match MetricsPage::scrape(self.http_addr).await {
            Ok(p) => p.sum("leader_election_master_status") >= 1.0,
            Err(_) => false,
        }
    }

    /// Scrape its `/metrics`.
    ///
    /// Errors: see [`MetricsPage::scrape`].
    pub async fn metrics(&self) -> anyhow::Result<MetricsPage> {
        MetricsPage::scrape(self.http_addr).await
    }

    /// SIGKILL it (a crash).
    pub fn kill(&mut self) {
        self.process.kill();
    }

    /// Start it again with the same identity and flags (a new HTTP port).
    ///
    /// Errors: as [`ServiceProcess::start`].
    pub fn restart(&mut self, bins: &Binaries, settings: &ServiceSettings) -> anyhow::Result<()> {
        self.process.kill();
        let starts = self.starts;
        *self = Self::start(self.service, self.replica, bins, settings)?;
        self.starts = starts + 1;
        Ok(())
    }

    /// The last `lines` lines of its log.
    pub fn log_tail(&self, lines: usize) -> String {
        crate::harness::process::last_lines(&self.process.log_text(), lines, |_| true)
    }
}
