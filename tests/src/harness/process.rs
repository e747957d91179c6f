//! Child processes the harness owns: each runs in its own process group, dies
//! with the harness (`PR_SET_PDEATHSIG`), writes stdout and stderr to one log
//! file, and is killed (SIGKILL to the whole group) when its handle drops, so no
//! process outlives a test, the demo or the benchmark.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;

/// A running (or exited) child process with its log file.
///
/// Dropping it sends SIGKILL to its process group and reaps it.
#[derive(Debug)]
pub struct ManagedProcess {
    name: String,
    child: Child,
    log: PathBuf,
    exit: Option<ExitStatus>,
}

impl ManagedProcess {
    /// Spawn `program` with `args`; stdout and stderr are appended to `log`.
    ///
    /// The child gets its own process group (so a signal reaches anything it
    /// forks) and `PR_SET_PDEATHSIG = SIGKILL` (so it dies if the harness
    /// process dies without running destructors).
    ///
    /// Errors: the log file cannot be opened or the program cannot be executed.
    pub fn spawn(
        name: &str,
        program: &Path,
        args: &[String],
        envs: &[(String, String)],
        log: &Path,
    ) -> anyhow::Result<Self> {
        let out = File::options()
            .create(true)
            .append(true)
            .open(log)
            .with_context(|| format!("opening log file {}", log.display()))?;
        let err = out.try_clone()?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            .process_group(0);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        set_parent_death_signal(&mut cmd);
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {name} ({})", program.display()))?;
        Ok(Self {
            name: name.to_string(),
            child,
            log: log.to_path_buf(),
            exit: None,
        })
    }

    /// Human name given at spawn (e.g. `provision-svc-0`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Process id (also the process-group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Path of the combined stdout/stderr log.
    pub fn log_path(&self) -> &Path {
        &self.log
    }

    /// The log's current contents (empty if unreadable).
    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Whether the process is still running (reaps it if it exited).
    pub fn is_running(&mut self) -> bool {
        if self.exit.is_some() {
            return false;
        }
        match self.child.try_wait() {
            Ok(Some(status)) => {
                self.exit = Some(status);
                false
            }
            Ok(None) => true,
            Err(_) => false,
        }
    }

    /// Whether an exit was already observed (without polling).
    pub fn has_exited(&self) -> bool {
        self.exit.is_some()
    }

    /// Exit status once the process has exited and been reaped.
    pub fn exit_status(&mut self) -> Option<ExitStatus> {
        self.is_running();
        self.exit
    }

    /// Send `signal` (e.g. `libc::SIGTERM`) to the process group.
    pub fn signal(&self, signal: i32) {
        if self.exit.is_none() {
            // SAFETY: plain syscall on a process group this handle created.
            unsafe {
                libc::kill(-(self.child.id() as i32), signal);
            }
        }
    }

    /// SIGSTOP the process group and wait (up to 5 s) until every thread of
    /// the process is stopped (`/proc/<pid>/task/*/stat` state `T`): `kill`
    /// returns before the threads stop, and a request one of them is sending
    /// can still go out in between.
    ///
    /// Errors: some thread still runs after 5 s.
    pub async fn pause(&self) -> anyhow::Result<()> {
        self.signal(libc::SIGSTOP);
        let tasks = PathBuf::from(format!("/proc/{}/task", self.pid()));
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let all_stopped = std::fs::read_dir(&tasks)?.flatten().all(|t| {
                std::fs::read_to_string(t.path().join("stat"))
                    .ok()
                    .and_then(|stat| {
                        // `pid (comm) S ...`: the state follows the last ')'.
                        let rest = &stat[stat.rfind(')')? + 1..];
                        rest.split_whitespace().next().map(|st| st == "T")
                    })
                    .unwrap_or(true)
            });
            if all_stopped {
                return Ok(());
            }
            if Instant::now() >= deadline {
                anyhow::bail!("{} not stopped 5 s after SIGSTOP", self.name);
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    /// SIGKILL the process group and reap the process: a crash, as a node
    /// failure or OOM kill looks to the rest of the system.
    pub fn kill(&mut self) {
        if self.exit.is_some() {
            return;
        }
        self.signal(libc::SIGKILL);
        if let Ok(status) = self.child.wait() {
            self.exit = Some(status);
        }
    }

    /// SIGTERM (graceful shutdown), then wait up to `grace` for the exit; SIGKILL
    /// after that. Returns the exit status.
    pub fn terminate(&mut self, grace: Duration) -> Option<ExitStatus> {
        if self.exit.is_some() {
            return self.exit;
        }
        self.signal(libc::SIGTERM);
        let deadline = Instant::now() + grace;
        while Instant::now() < deadline {
            if !self.is_running() {
                return self.exit;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        self.exit
    }

    /// Peak resident set size in KiB (`VmHWM` of `/proc/<pid>/status`), while the
    /// process runs; `None` once it has exited.
    pub fn peak_rss_kib(&mut self) -> Option<u64> {
        if !self.is_running() {
            return None;
        }
        proc_status_kib(self.pid(), "VmHWM:")
    }

    /// Current resident set size in KiB (`VmRSS`), while the process runs.
    pub fn rss_kib(&mut self) -> Option<u64> {
        if !self.is_running() {
            return None;
        }
        proc_status_kib(self.pid(), "VmRSS:")
    }
}

impl Drop for ManagedProcess {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Read a `kB` field such as `VmHWM:` from `/proc/<pid>/status`.
pub fn proc_status_kib(pid: u32, field: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l[field.len()..].split_whitespace().next())
        .and_then(|v| v.parse().ok())
}

#[cfg(target_os = "linux")]
fn set_parent_death_signal(cmd: &mut Command) {
    // SAFETY: prctl is async-signal-safe and touches only the child being set up.
    unsafe {
        cmd.pre_exec(|| {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
            Ok(())
        });
    }
}

#[cfg(not(target_os = "linux"))]
fn set_parent_death_signal(_cmd: &mut Command) {}

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read, close).
///
/// Errors: no socket can be bound.
pub fn free_port() -> anyhow::Result<u16> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding a probe socket")?;
    Ok(l.local_addr()?.port())
}

/// The last `n` lines of `text` that `keep` accepts, joined by newlines.
pub fn last_lines(text: &str, n: usize, keep: impl Fn(&str) -> bool) -> String {
    let kept: Vec<&str> = text.lines().filter(|l| keep(l)).collect();
    kept[kept.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kill_on_drop_and_peak_rss() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("sleep.log");
        let mut p = ManagedProcess::spawn(
            "sleep",
            Path::new("/bin/sleep"),
            &["30".to_string()],
            &[],
            &log,
        )
        .unwrap();
        assert!(p.is_running());
        assert!(p.peak_rss_kib().unwrap() > 0);
        let pid = p.pid();
        drop(p);
        // Killed and reaped: not even a zombie entry is left.
        assert!(!Path::new(&format!("/proc/{pid}")).exists());
    }

    #[test]
    fn terminate_returns_signal_exit() {
        use std::os::unix::process::ExitStatusExt;
        let dir = tempfile::tempdir().unwrap();
        let mut p = ManagedProcess::spawn(
            "sleep",
            Path::new("/bin/sleep"),
            &["30".to_string()],
            &[],
            &dir.path().join("l"),
        )
        .unwrap();
        let status = p.terminate(Duration::from_secs(5)).unwrap();
        assert_eq!(status.signal(), Some(libc::SIGTERM));
        assert!(!p.is_running());
    }
}
