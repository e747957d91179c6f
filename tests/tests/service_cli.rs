//! What an operator sees of the service binaries themselves, run as
//! processes (stdout/stderr to files, not a terminal):
//!
//! * a `--redis-url` that does not parse (or its `REDIS_URL` twin) ends the
//!   process at once with status 2 and the flag's name; a password in it is
//!   not echoed;
//! * `--help` starts with what the service does and groups the flags
//!   (Kubernetes, Redis, leader election, HTTP, logging, backend);
//! * `provisioner-ctl queue list` with Redis down prints its error once, the cause
//!   once;
//! * an unreachable API server is logged once per change (unreachable with
//!   its address and the cause, reachable again), not at every retry, and the
//!   text log carries no terminal colour codes: on the simulator (no server
//!   at first, then one on that port) and on a real kube-apiserver (stopped
//!   and started).

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use e2e::harness::{wait_until, Binaries, ControlPlane, ManagedProcess, Profile};
use e2e::on_both_planes;

fn bins() -> Binaries {
    Binaries::ensure_built(Profile::current()).expect("service binaries")
}

fn all(bins: &Binaries) -> [(&'static str, PathBuf); 3] {
    [
        ("provision-svc", bins.provision.clone()),
        ("pv-writer", bins.pv_writer.clone()),
        ("reclaim-svc", bins.reclaim.clone()),
    ]
}

/// Run `cmd` to its end, killing it after `limit` (then `None`).
fn run_with_limit(mut cmd: Command, limit: Duration) -> Option<Output> {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("wait").is_none() {
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Some(child.wait_with_output().expect("output"))
}

#[test]
fn a_redis_url_that_does_not_parse_exits_2_naming_the_flag() {
    let bins = bins();
    for (name, bin) in all(&bins) {
        for (url, via_env) in [
            ("http://nowhere", false),
            ("redis://127.0.0.1:notaport/0", false),
            ("redis://operator:hunter2@127.0.0.1:99999/0", true),
        ] {
            let mut cmd = Command::new(&bin);
            cmd.env_remove("REDIS_URL");
            if via_env {
                cmd.env("REDIS_URL", url);
            } else {
                cmd.args(["--redis-url", url]);
            }
            let out = run_with_limit(cmd, Duration::from_secs(10))
                .unwrap_or_else(|| panic!("{name} --redis-url {url}: still running after 10 s"));
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{name} {url}: {stderr}");
            assert!(stderr.contains("--redis-url"), "{name} {url}: {stderr}");
            assert!(stderr.contains("Redis URL"), "{name} {url}: {stderr}");
            assert!(
                !stderr.contains("hunter2"),
                "{name}: password echoed: {stderr}"
            );
        }
    }
}

#[test]
fn help_leads_with_what_the_service_does_and_groups_the_flags() {
    let bins = bins();
    let leads = [
        "Provisions volumes for PersistentVolumeClaims",
        "Drains the durable Redis PV-write queue",
        "Deletes released volumes",
    ];
    for ((name, bin), lead) in all(&bins).into_iter().zip(leads) {
        for flag in ["--help", "-h"] {
            let out = run_with_limit(
                {
                    let mut c = Command::new(&bin);
                    c.arg(flag);
                    c
                },
                Duration::from_secs(10),
            )
            .expect("help returns");
            assert!(out.status.success(), "{name} {flag}");
            let text = String::from_utf8_lossy(&out.stdout);
            assert!(text.starts_with(lead), "{name} {flag} starts:\n{text}");
            let headings: Vec<&str> = text
                .lines()
                .filter(|l| l.ends_with(':') && !l.starts_with(' '))
                .collect();
            for want in [
                "Kubernetes:",
                "Redis:",
                "Leader election:",
                "HTTP:",
                "Logging:",
                "Backend:",
            ] {
                assert!(headings.contains(&want), "{name} {flag}: {headings:?}");
            }
            // Each flag under its group; only --help and --version left in
            // the catch-all.
            let flags = |heading: &str| -> Vec<String> {
                section(&text, heading)
                    .iter()
                    .filter_map(|l| l.trim_start().split(' ').find(|w| w.starts_with("--")))
                    .map(|w| w.trim_end_matches(',').to_string())
                    .collect()
            };
            assert_eq!(flags("Options:"), ["--help", "--version"], "{name} {flag}");
            for (flag_name, heading) in [
                ("--redis-url", "Redis:"),
                ("--kube-api-qps", "Kubernetes:"),
                ("--leader-election-namespace", "Leader election:"),
                ("--log-level", "Logging:"),
                ("--http-endpoint", "HTTP:"),
                ("--backend", "Backend:"),
            ] {
                assert!(
                    flags(heading).iter().any(|f| f == flag_name),
                    "{name} {flag}: {flag_name} not under {heading}:\n{text}"
                );
            }
        }
    }
}

/// The lines under `heading` (a line of its own) up to the next heading.
fn section<'a>(text: &'a str, heading: &str) -> Vec<&'a str> {
    text.lines()
        .skip_while(|l| *l != heading)
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with(' '))
        .collect()
}

fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

#[test]
fn ctl_queue_list_with_redis_down_prints_the_cause_once() {
    let bins = bins();
    let url = format!("redis://127.0.0.1:{}/0", closed_port());
    let mut cmd = Command::new(&bins.ctl);
    cmd.args(["queue", "list", "--redis-url", &url]);
    let out = run_with_limit(cmd, Duration::from_secs(30)).expect("queue list returns");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one error line:\n{stderr}");
    assert!(lines[0].starts_with("provisioner-ctl: "), "{stderr}");
    assert!(lines[0].contains(&url), "{stderr}");
    assert_eq!(
        lines[0].matches("Connection refused").count(),
        1,
        "the cause once: {stderr}"
    );
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// provision-svc against the API server of `kubeconfig`, with a short Lease
/// retry period (500 ms) and an unreachable Redis (irrelevant here).
fn start_provision(bins: &Binaries, kubeconfig: &Path, dir: &Path) -> ManagedProcess {
    let args: Vec<String> = [
        "--kubeconfig",
        &kubeconfig.display().to_string(),
        "--redis-url",
        &format!("redis://127.0.0.1:{}/0", closed_port()),
        "--insecure-unsigned-queue",
        "--base-dir",
        &dir.display().to_string(),
        "--node-name",
        "node-1",
        "--http-endpoint",
        "127.0.0.1:0",
        "--leader-election-namespace",
        "default",
        "--leader-election-lease-duration",
        "3s",
        "--leader-election-renew-deadline",
        "2s",
        "--leader-election-retry-period",
        "500ms",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    ManagedProcess::spawn(
        "provision-svc",
        &bins.provision,
        &args,
        &[],
        &dir.join("provision-svc.log"),
    )
    .expect("provision-svc starts")
}

fn count(log: &str, what: &str) -> usize {
    log.lines().filter(|l| l.contains(what)).count()
}

async fn wait_log(p: &ManagedProcess, what: &str, timeout: Duration) {
    let r = wait_until(timeout, &format!("{what:?} in the log"), || async {
        p.log_text().contains(what)
    })
    .await;
    r.unwrap_or_else(|e| panic!("{e:#}\n{}", p.log_text()));
}

const UNREACHABLE: &str = "API server unreachable";
const REACHABLE: &str = "API server reachable again";

async fn an_unreachable_api_server_is_logged_once_per_change(plane: ControlPlane) {
    let bins = bins();
    let dir = tempfile::tempdir().unwrap();
    match plane {
        ControlPlane::Sim(config) => {
            // Nothing listens at first; then the simulator starts on that port.
            let port = closed_port();
            let kubeconfig = dir.path().join("kubeconfig");
            std::fs::write(
                &kubeconfig,
                format!(
                    "apiVersion: v1\nkind: Config\ncurrent-context: sim\n\
                     clusters: [{{name: sim, cluster: {{server: \"http://127.0.0.1:{port}\"}}}}]\n\
                     users: [{{name: sim, user: {{}}}}]\n\
                     contexts: [{{name: sim, context: {{cluster: sim, user: sim, namespace: default}}}}]\n"
                ),
            )
            .unwrap();
            let p = start_provision(&bins, &kubeconfig, dir.path());
            wait_log(&p, UNREACHABLE, Duration::from_secs(30)).await;
            // Many retry periods (500 ms) pass: still one line.
            tokio::time::sleep(Duration::from_secs(4)).await;
            let log = p.log_text();
            assert_eq!(count(&log, UNREACHABLE), 1, "{log}");
            let line = log.lines().find(|l| l.contains(UNREACHABLE)).unwrap();
            assert!(line.contains(&format!("127.0.0.1:{port}")), "{line}");
            assert!(line.contains("connection refused"), "{line}");

            let _sim = e2e::sim::Simulator::start(e2e::sim::SimConfig { port, ..config })
                .await
                .expect("simulator on the same port");
            wait_log(&p, REACHABLE, Duration::from_secs(30)).await;
            wait_log(&p, "became leader", Duration::from_secs(30)).await;
            let log = p.log_text();
            assert_eq!(count(&log, UNREACHABLE), 1, "{log}");
            assert_eq!(count(&log, REACHABLE), 1, "{log}");
            assert!(
                !log.contains('\u{1b}'),
                "colour codes in a non-TTY log:\n{log}"
            );
            assert_no_per_retry_lines(&log);
        }
        ControlPlane::Real(assets) => {
            let mut cluster = e2e::realkube::RealCluster::start(&assets, Default::default())
                .await
                .expect("real control plane");
            let address = cluster
                .server_url()
                .trim_start_matches("https://")
                .trim_end_matches('/')
                .to_string();
            let p = start_provision(&bins, cluster.admin_kubeconfig(), dir.path());
            wait_log(&p, "became leader", Duration::from_secs(60)).await;
            cluster.stop_apiserver().await.unwrap();
            wait_log(&p, UNREACHABLE, Duration::from_secs(30)).await;
            // The Lease is lost and campaigned for every 500 ms meanwhile.
            tokio::time::sleep(Duration::from_secs(5)).await;
            cluster.start_apiserver().await.unwrap();
            wait_log(&p, REACHABLE, Duration::from_secs(60)).await;
            let log = p.log_text();
            let lines: Vec<&str> = log.lines().filter(|l| l.contains(UNREACHABLE)).collect();
            // One line, or one more per change of cause (a request cut by
            // the stop, then refused), never one per retry.
            assert!(
                (1..=3).contains(&lines.len()),
                "{} lines:\n{log}",
                lines.len()
            );
            for l in &lines {
                assert!(l.contains(&address), "{l}");
            }
            assert!(
                lines.iter().any(|l| l.contains("connection refused")),
                "{log}"
            );
            for pair in lines.windows(2) {
                let cause = |l: &str| l.split("cause=").nth(1).map(|c| c.to_string());
                assert_ne!(cause(pair[0]), cause(pair[1]), "repeated: {pair:?}");
            }
            assert_eq!(count(&log, REACHABLE), 1, "{log}");
            assert!(
                !log.contains('\u{1b}'),
                "colour codes in a non-TTY log:\n{log}"
            );
            assert_no_per_retry_lines(&log);
        }
    }
}

/// No line but the state changes names the connection failure (kube's
/// client used to log `client error (Connect)` at every attempt).
fn assert_no_per_retry_lines(log: &str) {
    let per_retry: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("client error") && !l.contains(UNREACHABLE))
        .collect();
    assert!(per_retry.is_empty(), "{per_retry:#?}");
}

on_both_planes!(an_unreachable_api_server_is_logged_once_per_change);
