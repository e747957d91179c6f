//! Sizes enforced for real: `tools/quota-vm/run.sh` boots Debian's kernel in qemu with an XFS
//! image (`prjquota`) and an ext4 image (`-O quota,project`) and runs `quota-probe`, which
//! limits a volume directory through `backend_kit::quota` (as the backends do for
//! `quota=required`) and writes past the limit. The host kernel here has no quota support,
//! so this is where enforcement is checked. Without qemu the test is skipped with one line,
//! except under CI, where it fails.

use std::process::Command;

#[test]
fn a_write_past_the_claims_size_fails_on_xfs_and_ext4() {
    let script = e2e::harness::binaries::workspace_root().join("tools/quota-vm/run.sh");
    let have_qemu = Command::new("sh")
        .args([
            "-c",
            "command -v qemu-system-x86_64 && command -v mkfs.xfs && command -v busybox",
        ])
        .output()
        .is_ok_and(|o| o.status.success());
    if !have_qemu {
        assert!(
            !e2e::realkube::assets::in_ci(),
            "CI must provide qemu-system-x86, xfsprogs, busybox-static (.ci/run)"
        );
        eprintln!("skipped quota VM test: no qemu-system-x86_64, mkfs.xfs or busybox");
        return;
    }
    let out = Command::new("bash")
        .arg(&script)
        .arg(env!("CARGO_BIN_EXE_quota-probe"))
        .output()
        .expect("tools/quota-vm/run.sh runs");
    let log = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "the VM run failed:\n{log}\n{stderr}");
    for fs in ["xfs", "ext4"] {
        assert!(
            log.contains(&format!("QUOTA-PROBE {fs} PASS")),
            "{fs}:\n{log}"
        );
        // XFS reports a full project as ENOSPC (28), ext4 as EDQUOT (122).
        let errno = if fs == "xfs" {
            "errno Some(28)"
        } else {
            "errno Some(122)"
        };
        let line = log
            .lines()
            .find(|l| l.starts_with(&format!("QUOTA-PROBE {fs} write past 10 MiB")))
            .unwrap_or_else(|| panic!("no write line for {fs}:\n{log}"));
        assert!(line.ends_with(errno), "{line}");
    }
}
