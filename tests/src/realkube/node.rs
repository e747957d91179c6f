//! One real node for a [`RealCluster`]: Debian's containerd and runc, the CNI bridge,
//! kubelet and kube-proxy v1.37.2 and CoreDNS (built by `tools/node/build.sh`), with the
//! images of `tools/node/images.sh` imported, all under `<target dir>/node/run`.
//!
//! The node is `node-1` at [`NODE_IP`] on the bridge [`BRIDGE`] (pods in [`POD_CIDR`]);
//! CoreDNS answers on [`NODE_IP`]:53 for `cluster.local`; the API server must listen
//! there too ([`apiserver_flags`]) so that kube-proxy can route the `kubernetes` Service.
//! Needs root; [`node_or_skip`] says why a machine cannot run it. Dropping the node kills
//! every container, process, mount, network namespace and iptables rule it made; the
//! containers' logs stay in `<target dir>/node/pod-logs`.
//! Choices and versions: docs/decisions/0010-real-node-versions.md.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use kube::api::{Api, PostParams};

use super::pki::NODE_NAME;
use super::RealCluster;
use crate::harness::binaries::target_dir;
use crate::harness::ManagedProcess;

/// The node's address: the bridge's, the API server's advertised one and CoreDNS's.
pub const NODE_IP: &str = "10.244.0.1";
/// The pods' range (host-local IPAM on the bridge).
pub const POD_CIDR: &str = "10.244.0.0/24";
/// The Linux bridge the pods attach to.
pub const BRIDGE: &str = "spnode0";
/// How long [`RealNode::start`] waits for the Node to be `Ready`.
pub const NODE_READY_TIMEOUT: Duration = Duration::from_secs(180);
/// The release the node's binaries are (the folder under `<target dir>/node/`).
pub const NODE_RELEASE: &str = "v1.37.2";

/// Where the node's binaries and image archives are.
#[derive(Debug, Clone)]
pub struct NodeAssets {
    /// `<target dir>/node/v1.37.2/bin` (kubelet, kube-proxy, coredns, pause).
    pub bin: PathBuf,
    /// The OCI archives to import (`<target dir>/node/images/*.tar`).
    pub images: Vec<PathBuf>,
}

/// Where the node's container logs go (`<target dir>/node/pod-logs`, one directory per pod).
fn pod_logs_dir() -> PathBuf {
    target_dir().join("node").join("pod-logs")
}

/// The logs of the pods in `namespace` whose name starts with `prefix`, by directory
/// name (`<namespace>_<pod>_<uid>`): that name and its containers' log files concatenated.
pub fn pod_logs(namespace: &str, prefix: &str) -> Vec<(String, String)> {
    let files_in = |dir: &Path| {
        let entries = std::fs::read_dir(dir).into_iter().flatten().flatten();
        let mut paths: Vec<PathBuf> = entries.map(|e| e.path()).collect();
        paths.sort();
        paths
    };
    let name = |p: &Path| {
        p.file_name()
            .unwrap_or_default()
            .to_string_lossy()
            .into_owned()
    };
    let mut dirs = files_in(&pod_logs_dir());
    dirs.retain(|d| name(d).starts_with(&format!("{namespace}_{prefix}")));
    dirs.iter()
        .map(|dir| {
            let logs = files_in(dir).into_iter().flat_map(|c| files_in(&c));
            let text = logs
                .map(|l| {
                    String::from_utf8_lossy(&std::fs::read(l).unwrap_or_default()).into_owned()
                })
                .collect();
            (name(dir), text)
        })
        .collect()
}

/// The kube-apiserver flags a cluster with a real node needs: listen beyond loopback and
/// advertise [`NODE_IP`] in the `kubernetes` Service's endpoints.
pub fn apiserver_flags() -> Vec<String> {
    [
        "--bind-address",
        "0.0.0.0",
        "--advertise-address",
        NODE_IP,
        "--endpoint-reconciler-type",
        "lease",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}

fn on_path(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|paths| std::env::split_paths(&paths).any(|dir| dir.join(program).is_file()))
}

/// The node's assets, or `None` after printing `node: SKIPPED <test> (why)` when this
/// machine cannot run a node (not root, a binary, plugin or image archive missing).
pub fn node_or_skip(test: &str) -> Option<NodeAssets> {
    match locate() {
        Ok(a) => Some(a),
        Err(why) => {
            eprintln!("node: SKIPPED {test} ({why})");
            None
        }
    }
}

fn locate() -> Result<NodeAssets, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Err("needs root".into());
    }
    let mut missing = Vec::new();
    for program in [
        "containerd",
        "containerd-shim-runc-v2",
        "ctr",
        "runc",
        "iptables",
        "ip",
    ] {
        if !on_path(program) {
            missing.push(format!(
                "{program} (apt-get install containerd runc iptables iproute2)"
            ));
        }
    }
    for plugin in ["bridge", "host-local", "loopback", "portmap"] {
        if !Path::new("/usr/lib/cni").join(plugin).is_file() {
            missing.push(format!(
                "/usr/lib/cni/{plugin} (apt-get install containernetworking-plugins)"
            ));
        }
    }
    let bin = target_dir().join("node").join(NODE_RELEASE).join("bin");
    for tool in ["kubelet", "kube-proxy", "coredns", "pause"] {
        if !bin.join(tool).is_file() {
            missing.push(format!(
                "{} (bash tools/node/build.sh)",
                bin.join(tool).display()
            ));
        }
    }
    let dir = target_dir().join("node").join("images");
    let images: Vec<PathBuf> = ["split-provisioner.tar", "redis.tar", "pause.tar"]
        .iter()
        .map(|f| dir.join(f))
        .collect();
    for image in &images {
        if !image.is_file() {
            missing.push(format!("{} (bash tools/node/images.sh)", image.display()));
        }
    }
    if missing.is_empty() {
        Ok(NodeAssets { bin, images })
    } else {
        Err(format!("missing: {}", missing.join(", ")))
    }
}

/// Run `program args`; errors carry its stderr.
fn run(program: &str, args: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(program)
        .args(args)
        .output()
        .with_context(|| format!("running {program}"))?;
    if !out.status.success() {
        bail!(
            "{program} {} failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// A kubeconfig authenticating with a client certificate.
fn write_cert_kubeconfig(
    path: &Path,
    server: &str,
    ca: &Path,
    (cert, key): &(PathBuf, PathBuf),
) -> anyhow::Result<()> {
    let doc = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "realkube", "cluster": {
            "server": server, "certificate-authority": ca.display().to_string()}}],
        "users": [{"name": "node", "user": {
            "client-certificate": cert.display().to_string(),
            "client-key": key.display().to_string()}}],
        "contexts": [{"name": "realkube", "context": {"cluster": "realkube", "user": "node"}}],
        "current-context": "realkube",
    });
    std::fs::write(path, serde_yaml::to_string(&doc)?)
        .with_context(|| format!("writing {}", path.display()))
}

/// A running node registered with a [`RealCluster`]. Dropping it tears everything down.
pub struct RealNode {
    kubelet: Option<ManagedProcess>,
    kube_proxy: Option<ManagedProcess>,
    coredns: Option<ManagedProcess>,
    containerd: Option<ManagedProcess>,
    kube_proxy_bin: PathBuf,
    root: PathBuf,
    socket: PathBuf,
}

impl std::fmt::Debug for RealNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RealNode")
            .field("root", &self.root)
            .finish_non_exhaustive()
    }
}

impl RealNode {
    /// Start containerd, import the images, start CoreDNS, kube-proxy and the kubelet
    /// for `cluster` (started with [`apiserver_flags`]) and wait until Node `node-1` is
    /// `Ready` (bounded by [`NODE_READY_TIMEOUT`]). Leftovers of an earlier run in
    /// `<target dir>/node/run` are torn down first.
    ///
    /// Errors: a command or process fails, or the node is not ready in time (with the
    /// kubelet's log tail).
    pub async fn start(cluster: &RealCluster, assets: &NodeAssets) -> anyhow::Result<Self> {
        let root = target_dir().join("node").join("run");
        teardown(&root, &assets.bin.join("kube-proxy"));
        std::fs::create_dir_all(&root)?;
        // Containers' logs, kept after the node stops (cleared at the next start).
        let logs = pod_logs_dir();
        let _ = std::fs::remove_dir_all(&logs);
        std::fs::create_dir_all(&logs)?;
        let socket = root.join("containerd.sock");
        let mut node = RealNode {
            kubelet: None,
            kube_proxy: None,
            coredns: None,
            containerd: None,
            kube_proxy_bin: assets.bin.join("kube-proxy"),
            root: root.clone(),
            socket: socket.clone(),
        };
        let p = |p: &Path| p.display().to_string();

        // The bridge with the node's address (the CNI bridge plugin reuses it).
        run("ip", &["link", "add", BRIDGE, "type", "bridge"])?;
        run(
            "ip",
            &["addr", "add", &format!("{NODE_IP}/24"), "dev", BRIDGE],
        )?;
        run("ip", &["link", "set", BRIDGE, "up"])?;
        let cni = root.join("cni");
        std::fs::create_dir_all(&cni)?;
        let conflist = serde_json::json!({
            "cniVersion": "0.4.0", "name": "node", "plugins": [
                {"type": "bridge", "bridge": BRIDGE, "isGateway": true, "ipMasq": true,
                 "hairpinMode": true, "ipam": {"type": "host-local",
                 "ranges": [[{"subnet": POD_CIDR, "gateway": NODE_IP}]],
                 "routes": [{"dst": "0.0.0.0/0"}], "dataDir": p(&root.join("cni-ipam"))}},
                {"type": "portmap", "capabilities": {"portMappings": true}}]});
        std::fs::write(cni.join("10-bridge.conflist"), conflist.to_string())?;
        std::fs::write(
            cni.join("99-loopback.conf"),
            r#"{"cniVersion":"0.4.0","name":"lo","type":"loopback"}"#,
        )?;

        // containerd: its own root, state and socket; the kubelet may not lower
        // oom_score_adj without CAP_SYS_RESOURCE (docs/decisions/0010).
        let config = format!(
            "version = 2\nroot = \"{}\"\nstate = \"{}\"\n[grpc]\n  address = \"{}\"\n\
             [plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"registry.k8s.io/pause:3.10\"\n\
             \x20 restrict_oom_score_adj = true\n\
             \x20 [plugins.\"io.containerd.grpc.v1.cri\".cni]\n    bin_dir = \"/usr/lib/cni\"\n    conf_dir = \"{}\"\n",
            p(&root.join("containerd")),
            p(&root.join("containerd-state")),
            p(&socket),
            p(&cni),
        );
        std::fs::write(root.join("containerd.toml"), config)?;
        let containerd = ManagedProcess::spawn(
            "containerd",
            Path::new("containerd"),
            &["--config".into(), p(&root.join("containerd.toml"))],
            &[],
            &root.join("containerd.log"),
        )?;
        node.containerd = Some(containerd);
        let start = Instant::now();
        while node.ctr(&["version"]).is_err() {
            if start.elapsed() > Duration::from_secs(30) {
                bail!(
                    "containerd did not answer in 30 s: {}",
                    node.log_tail("containerd", 20)
                );
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for image in &assets.images {
            node.ctr(&["images", "import", &p(image)])?;
        }

        // Client identities.
        let pki = root.join("pki");
        let ca = cluster.root().join("pki").join("ca.crt");
        let cluster_pki = cluster.root().join("pki");
        let server = cluster.server_url();
        std::fs::create_dir_all(&pki)?;
        let kubelet_kc = root.join("kubelet.kubeconfig");
        write_cert_kubeconfig(
            &kubelet_kc,
            &server,
            &ca,
            &(
                cluster_pki.join("kubelet.crt"),
                cluster_pki.join("kubelet.key"),
            ),
        )?;
        let proxy_kc = root.join("kube-proxy.kubeconfig");
        write_cert_kubeconfig(
            &proxy_kc,
            &server,
            &ca,
            &(
                cluster_pki.join("kube-proxy.crt"),
                cluster_pki.join("kube-proxy.key"),
            ),
        )?;

        // CoreDNS on the node's address, watching the cluster as admin.
        let corefile = format!(
            ".:53 {{\n  bind {NODE_IP}\n  errors\n  kubernetes cluster.local in-addr.arpa ip6.arpa {{\n    \
             kubeconfig {} realkube\n    pods insecure\n    fallthrough in-addr.arpa ip6.arpa\n  }}\n  \
             forward . /etc/resolv.conf\n  cache 30\n}}\n",
            p(cluster.admin_kubeconfig())
        );
        std::fs::write(root.join("Corefile"), corefile)?;
        node.coredns = Some(ManagedProcess::spawn(
            "coredns",
            &assets.bin.join("coredns"),
            &["-conf".into(), p(&root.join("Corefile"))],
            &[],
            &root.join("coredns.log"),
        )?);

        node.kube_proxy = Some(ManagedProcess::spawn(
            "kube-proxy",
            &assets.bin.join("kube-proxy"),
            &[
                "--kubeconfig".into(),
                p(&proxy_kc),
                "--hostname-override".into(),
                NODE_NAME.into(),
                "--proxy-mode".into(),
                "iptables".into(),
                "--cluster-cidr".into(),
                POD_CIDR.into(),
                "--conntrack-max-per-core".into(),
                "0".into(),
                "--metrics-bind-address".into(),
                "127.0.0.1:10249".into(),
                "--healthz-bind-address".into(),
                "127.0.0.1:10256".into(),
                "--v".into(),
                "1".into(),
            ],
            &[],
            &root.join("kube-proxy.log"),
        )?);

        let kubelet_config = format!(
            "apiVersion: kubelet.config.k8s.io/v1beta1\nkind: KubeletConfiguration\n\
             failCgroupV1: false\ncgroupDriver: cgroupfs\n\
             containerRuntimeEndpoint: unix://{}\n\
             authentication:\n  anonymous: {{enabled: false}}\n  webhook: {{enabled: true}}\n  x509: {{clientCAFile: {}}}\n\
             authorization: {{mode: Webhook}}\n\
             clusterDNS: [{NODE_IP}]\nclusterDomain: cluster.local\n\
             failSwapOn: false\nmaxPods: 300\nreadOnlyPort: 0\nhealthzPort: 10248\n\
             serializeImagePulls: false\n\
             evictionHard: {{memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%}}\n\
             imageGCHighThresholdPercent: 100\nimageGCLowThresholdPercent: 99\n\
             podLogsDir: {}\n",
            p(&socket),
            p(&ca),
            p(&logs),
        );
        std::fs::write(root.join("kubelet.yaml"), kubelet_config)?;
        node.kubelet = Some(ManagedProcess::spawn(
            "kubelet",
            &assets.bin.join("kubelet"),
            &[
                "--config".into(),
                p(&root.join("kubelet.yaml")),
                "--kubeconfig".into(),
                p(&kubelet_kc),
                "--root-dir".into(),
                p(&root.join("kubelet")),
                "--hostname-override".into(),
                NODE_NAME.into(),
                "--node-ip".into(),
                NODE_IP.into(),
                "--v".into(),
                "1".into(),
            ],
            &[],
            &root.join("kubelet.log"),
        )?);

        let nodes: Api<Node> = Api::all(cluster.client());
        let start = Instant::now();
        loop {
            let ready = nodes
                .get_opt(NODE_NAME)
                .await
                .ok()
                .flatten()
                .is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                });
            if ready {
                break;
            }
            let exited = [&mut node.kubelet, &mut node.kube_proxy, &mut node.coredns]
                .into_iter()
                .flatten()
                .find_map(|proc| (!proc.is_running()).then(|| proc.name().to_string()));
            if let Some(name) = exited {
                bail!("{name} exited: {}", node.log_tail(&name, 30));
            }
            if start.elapsed() > NODE_READY_TIMEOUT {
                bail!(
                    "node {NODE_NAME} not Ready after {NODE_READY_TIMEOUT:?}: {}",
                    node.log_tail("kubelet", 30)
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        eprintln!(
            "node: {NODE_NAME} Ready in {:.1} s (root {})",
            start.elapsed().as_secs_f64(),
            root.display()
        );
        Ok(node)
    }

    /// The node's directory (`<target dir>/node/run`: logs, containerd, kubelet, CNI).
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Run `ctr -n k8s.io ARGS` against the node's containerd; stdout on success.
    ///
    /// Errors: ctr fails (with its stderr).
    pub fn ctr(&self, args: &[&str]) -> anyhow::Result<String> {
        let sock = self.socket.display().to_string();
        let mut all = vec!["-a", sock.as_str(), "-n", "k8s.io"];
        all.extend_from_slice(args);
        run("ctr", &all)
    }

    /// The last `lines` lines of a node process's log (`kubelet`, `containerd`, ...).
    pub fn log_tail(&self, name: &str, lines: usize) -> String {
        let tail = super::log_file_tail(&self.root.join(format!("{name}.log")), lines);
        format!("==> {name}.log <==\n{tail}")
    }

    /// Create a `hostPath` PV `name` of `size` (e.g. `1Gi`) with no class, ReadWriteOnce,
    /// at `<root>/pv/<name>` (mode 0777), as a cluster's default storage would provide.
    ///
    /// Errors: the directory or the PV cannot be created.
    pub async fn add_local_pv(
        &self,
        client: &kube::Client,
        name: &str,
        size: &str,
    ) -> anyhow::Result<PathBuf> {
        use std::os::unix::fs::PermissionsExt;
        let dir = self.root.join("pv").join(name);
        std::fs::create_dir_all(&dir)?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
        let pv: PersistentVolume = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "PersistentVolume",
            "metadata": {"name": name},
            "spec": {"capacity": {"storage": size}, "accessModes": ["ReadWriteOnce"],
                     "persistentVolumeReclaimPolicy": "Retain",
                     "hostPath": {"path": dir.display().to_string(), "type": "Directory"}}
        }))?;
        Api::<PersistentVolume>::all(client.clone())
            .create(&PostParams::default(), &pv)
            .await?;
        Ok(dir)
    }
}

impl Drop for RealNode {
    fn drop(&mut self) {
        if let Some(k) = self.kubelet.as_mut() {
            k.kill();
        }
        teardown(&self.root, &self.kube_proxy_bin);
        for proc in [
            &mut self.kube_proxy,
            &mut self.coredns,
            &mut self.containerd,
        ]
        .into_iter()
        .flatten()
        {
            proc.kill();
        }
        teardown(&self.root, &self.kube_proxy_bin);
    }
}

/// Kill every container of the node (the `kubepods` cgroups), its shims, any process of
/// an earlier run, then remove mounts under `root`, the CNI network namespaces, the
/// bridge, kube-proxy's and CNI's iptables rules, the cgroups and `root` itself.
/// Best effort: each step goes on after a failure.
fn teardown(root: &Path, kube_proxy: &Path) {
    let root_text = root.display().to_string();
    // Processes of this node: in a kubepods cgroup, or naming the node's root.
    let mut pids = Vec::new();
    for hierarchy in ["pids", "memory", "cpu", "systemd"] {
        let base = Path::new("/sys/fs/cgroup").join(hierarchy).join("kubepods");
        collect_cgroup_pids(&base, &mut pids);
    }
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for e in entries.flatten() {
            let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
                continue;
            };
            let cmdline = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
            if String::from_utf8_lossy(&cmdline).contains(&root_text)
                && pid != std::process::id() as i32
            {
                pids.push(pid);
            }
        }
    }
    for pid in pids {
        // SAFETY: kill has no memory-safety preconditions.
        unsafe { libc::kill(pid, libc::SIGKILL) };
    }
    std::thread::sleep(Duration::from_millis(300));
    // Mounts under root and the CNI network namespaces, deepest first.
    let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
    let mut mounts: Vec<String> = mountinfo
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_string))
        .filter(|m| m.starts_with(&root_text) || m.starts_with("/run/netns/cni-"))
        .collect();
    mounts.sort_by_key(|m| std::cmp::Reverse(m.len()));
    for m in &mounts {
        if let Ok(c) = std::ffi::CString::new(m.as_str()) {
            // SAFETY: `c` is a valid NUL-terminated path.
            unsafe { libc::umount2(c.as_ptr(), libc::MNT_DETACH) };
        }
    }
    if let Ok(entries) = std::fs::read_dir("/run/netns") {
        for e in entries.flatten() {
            if e.file_name().to_string_lossy().starts_with("cni-") {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = run("ip", &["link", "del", BRIDGE]);
    if kube_proxy.is_file() {
        let _ = run(&kube_proxy.display().to_string(), &["--cleanup"]);
    }
    // The kubelet's and CNI's chains (KUBE-*, CNI-<id>) and the jumps to them.
    for table in ["nat", "filter", "mangle"] {
        remove_chains(table);
    }
    if let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") {
        for e in entries.flatten() {
            remove_cgroup_tree(&e.path().join("kubepods"));
        }
    }
    let _ = std::fs::remove_dir_all(root);
}

/// Delete the rules of `table`'s built-in chains that jump to a `KUBE-` or `CNI-` chain
/// (by number, last first), then flush and delete those chains.
fn remove_chains(table: &str) {
    let Ok(rules) = run("iptables", &["-t", table, "-S"]) else {
        return;
    };
    let ours = |chain: &str| chain.starts_with("KUBE-") || chain.starts_with("CNI-");
    let chains: Vec<&str> = rules
        .lines()
        .filter_map(|l| l.strip_prefix("-N "))
        .filter(|c| ours(c))
        .collect();
    for builtin in ["PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"] {
        let Ok(listing) = run(
            "iptables",
            &["-t", table, "-L", builtin, "-n", "--line-numbers"],
        ) else {
            continue;
        };
        let numbers: Vec<String> = listing
            .lines()
            .filter_map(|l| {
                let mut words = l.split_whitespace();
                let number = words.next()?.parse::<u32>().ok()?;
                ours(words.next()?).then(|| number.to_string())
            })
            .collect();
        for number in numbers.iter().rev() {
            let _ = run("iptables", &["-t", table, "-D", builtin, number]);
        }
    }
    for chain in &chains {
        let _ = run("iptables", &["-t", table, "-F", chain]);
    }
    for chain in &chains {
        let _ = run("iptables", &["-t", table, "-X", chain]);
    }
}

fn collect_cgroup_pids(dir: &Path, pids: &mut Vec<i32>) {
    if let Ok(text) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        pids.extend(text.lines().filter_map(|l| l.trim().parse::<i32>().ok()));
    }
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                collect_cgroup_pids(&e.path(), pids);
            }
        }
    }
}

fn remove_cgroup_tree(dir: &Path) {
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            if e.file_type().is_ok_and(|t| t.is_dir()) {
                remove_cgroup_tree(&e.path());
            }
        }
    }
    let _ = std::fs::remove_dir(dir);
}
