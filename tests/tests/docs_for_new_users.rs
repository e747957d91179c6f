//! What a new user reads first stays true and readable: the README starts with the
//! two commands, names the services `--backend` goes to as the deploy sets it, installs
//! `kubectl` in a way that works on a fresh Debian 12, gives each `kubectl` command the
//! namespace of the service it names, and no document a user reads
//! (README.md, BENCHMARKS.md, deploy/README.md, docs/) cites issue or session numbers or
//! benchmark run labels.

use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The user-facing documents: README.md, BENCHMARKS.md, deploy/README.md, docs/**/*.md.
fn user_documents() -> Vec<PathBuf> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for e in std::fs::read_dir(dir).unwrap() {
            let p = e.unwrap().path();
            if p.is_dir() {
                walk(&p, out);
            } else if p.extension().is_some_and(|x| x == "md") {
                out.push(p);
            }
        }
    }
    let root = repo_root();
    let mut docs = vec![
        root.join("README.md"),
        root.join("BENCHMARKS.md"),
        root.join("deploy/README.md"),
    ];
    walk(&root.join("docs"), &mut docs);
    docs
}

/// References to the project's history in `text`, one line each: "issue 8",
/// "session 20", "#12", run labels "R7" and "run A".
fn history_references(text: &str) -> Vec<String> {
    let mut found = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let words: Vec<&str> = line
            .split(|c: char| !(c.is_alphanumeric() || c == '#'))
            .filter(|w| !w.is_empty())
            .collect();
        for (i, w) in words.iter().enumerate() {
            let next = words.get(i + 1).copied().unwrap_or("");
            let numbered = next.starts_with(|c: char| c.is_ascii_digit());
            let lower = w.to_lowercase();
            let hit = (matches!(lower.as_str(), "issue" | "issues" | "session" | "sessions")
                && numbered)
                || (w.starts_with('#')
                    && w.len() > 1
                    && w[1..].chars().all(|c| c.is_ascii_digit()))
                || (w.len() >= 2
                    && w.len() <= 3
                    && w.starts_with('R')
                    && w[1..].chars().all(|c| c.is_ascii_digit()))
                || (matches!(lower.as_str(), "run" | "runs")
                    && next.len() == 1
                    && next.chars().all(|c| c.is_ascii_uppercase()));
            if hit {
                found.push(format!("line {}: {}", n + 1, line.trim()));
                break;
            }
        }
    }
    found
}

#[test]
fn the_history_checker_finds_what_it_looks_for() {
    for bad in [
        "Targets (issue 8)",
        "as in session 20's runs",
        "see #12",
        "(R7, R9)",
        "shipped (run A, 157 PVs/s)",
    ] {
        assert_eq!(history_references(bad).len(), 1, "{bad}");
    }
    for fine in [
        "a known issue with the server",
        "Redis 7.2",
        "RBAC and R-values",
        "the run at 1,000 claims",
        "real stop and start of kube-apiserver",
    ] {
        assert!(history_references(fine).is_empty(), "{fine}");
    }
}

#[test]
fn user_documents_cite_no_issues_sessions_or_run_labels() {
    let mut problems = Vec::new();
    for doc in user_documents() {
        let text = std::fs::read_to_string(&doc).unwrap();
        for r in history_references(&text) {
            problems.push(format!("{}: {r}", doc.display()));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn readme_starts_with_the_demo_and_the_test_command() {
    let readme = read("README.md");
    let block = readme
        .split_once("```sh\n")
        .expect("a sh block")
        .1
        .split_once("```")
        .unwrap()
        .0;
    let commands: Vec<&str> = block
        .lines()
        .map(|l| l.split('#').next().unwrap().trim())
        .collect();
    assert_eq!(
        commands,
        [
            "cargo run --release -p e2e --bin demo",
            "cargo test --workspace"
        ]
    );
    let before = readme.split_once("```sh\n").unwrap().0;
    assert_eq!(
        before.lines().filter(|l| !l.trim().is_empty()).count(),
        1,
        "only the title comes before the two commands"
    );
}

/// The deploy sets `BACKEND` on all three services (pv-writer checks queued PVs against
/// the backend; tests/tests/deploy_manifests.rs checks the manifests): the README says so.
#[test]
fn readme_names_every_service_that_takes_the_backend_flag() {
    let readme = read("README.md");
    let at = readme
        .find("`--backend nfs-subdir` (env `BACKEND`")
        .expect("the README documents --backend nfs-subdir");
    let sentence = &readme[at..at + readme[at..].find(") is a").expect("end of the aside")];
    for svc in ["provision-svc", "pv-writer", "reclaim-svc"] {
        assert!(sentence.contains(svc), "{svc} missing from: {sentence}");
    }
}

/// A fresh Debian 12 has no pip and refuses system-wide installs (PEP 668): the kubectl
/// hint uses a virtual environment and puts its bin directory on PATH.
#[test]
fn readme_installs_kubectl_into_a_virtual_environment() {
    let readme = read("README.md");
    let pip_lines: Vec<&str> = readme
        .lines()
        .filter(|l| l.contains("pip install"))
        .collect();
    assert!(!pip_lines.is_empty(), "the README says how to get kubectl");
    for l in &pip_lines {
        assert!(
            l.trim_start()
                .starts_with("~/.local/kubectl-venv/bin/pip install"),
            "pip outside the virtual environment: {l}"
        );
    }
    for line in [
        "apt-get install python3-venv",
        "python3 -m venv ~/.local/kubectl-venv",
        "export PATH=\"$HOME/.local/kubectl-venv/bin:$PATH\"",
    ] {
        assert!(readme.contains(line), "missing: {line}");
    }
}

/// The `kubectl` commands of README.md and deploy/README.md (inline code and fenced
/// lines), whitespace collapsed.
fn kubectl_commands(text: &str) -> Vec<String> {
    let mut commands = Vec::new();
    for (i, part) in text.split("```").enumerate() {
        let pieces: Vec<String> = if i % 2 == 1 {
            part.lines().map(str::to_string).collect()
        } else {
            part.split('`')
                .skip(1)
                .step_by(2)
                .map(|s| s.split_whitespace().collect::<Vec<_>>().join(" "))
                .collect()
        };
        commands.extend(pieces.into_iter().filter(|c| c.contains("kubectl")));
    }
    commands
}

/// provision-svc and reclaim-svc run in `split-provisioner-volumes`: no documented
/// command looks for them (or for "<user>"/"<job>", which may be either) in
/// `split-provisioner`.
#[test]
fn documented_commands_use_the_namespace_of_their_service() {
    let mut problems = Vec::new();
    let mut seen = 0;
    for doc in ["README.md", "deploy/README.md"] {
        let commands = kubectl_commands(&read(doc));
        seen += commands.len();
        for c in commands {
            let wrong = c.contains("-n split-provisioner ")
                && ["provision-svc", "reclaim-svc", "<user>", "<job>"]
                    .iter()
                    .any(|s| c.contains(s));
            if wrong {
                problems.push(format!("{doc}: {c}"));
            }
        }
    }
    assert!(seen > 20, "only {seen} kubectl commands found");
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
