//! Runs inside the VM of `tools/quota-vm/run.sh` (as PID 1's child): for each
//! `<mountpoint>:<name>` argument, makes a volume directory as the backends do (a cap-std
//! handle, `backend_kit::quota` with `quota=required`, 10 MiB), writes 20 MiB into it without
//! `CAP_SYS_RESOURCE` and checks the write stops at the limit with ENOSPC/EDQUOT, reads the
//! usage back, raises the limit to 20 MiB (`quota::raise`, as an expansion does) and checks
//! the rest fits; checks project ids (distinct per directory, kept by a retry, not taken from
//! a parent, freed on removal). Prints `QUOTA-PROBE <name> PASS|FAIL` lines and
//! `QUOTA-PROBE PASS` when every filesystem passed; also the cost of one `apply`.

use std::io::Write;
use std::time::Instant;

use backend_kit::quota::{self, Applied, QuotaMode};
use backend_kit::safe_fs;

const MIB: u64 = 1 << 20;

fn main() {
    let mut all = true;
    for arg in std::env::args().skip(1) {
        let (mount, name) = arg.split_once(':').expect("argument <mountpoint>:<name>");
        let ok = probe(mount, name).unwrap_or_else(|e| {
            println!("QUOTA-PROBE {name} error: {e}");
            false
        });
        println!("QUOTA-PROBE {name} {}", if ok { "PASS" } else { "FAIL" });
        all &= ok;
    }
    println!("QUOTA-PROBE {}", if all { "PASS" } else { "FAIL" });
}

fn probe(mount: &str, name: &str) -> std::io::Result<bool> {
    let dir_path = format!("{mount}/pvc-probe-{name}");
    let root = safe_fs::open_root(std::path::Path::new(mount))?;
    let (handle, _) = safe_fs::create_path(&root, &[format!("pvc-probe-{name}")], 0o777)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    let dir = safe_fs::as_file(&handle)?;
    let applied = quota::apply(QuotaMode::Required, &dir, &dir_path, 10 * MIB);
    println!("QUOTA-PROBE {name} apply: {applied:?}");
    if !matches!(applied, Ok(Applied::Limited { .. })) {
        return Ok(false);
    }
    drop_sys_resource()?;
    let (written, errno) = fill(&format!("{dir_path}/data"), 20 * MIB);
    let stopped = matches!(errno, Some(libc::ENOSPC | libc::EDQUOT));
    let near_limit = (10 * MIB - 64 * 1024..=10 * MIB).contains(&written);
    println!("QUOTA-PROBE {name} write past 10 MiB: {written} bytes, errno {errno:?}");
    let (used, limit) = quota::usage(&dir)?;
    println!("QUOTA-PROBE {name} usage: {used} of {limit} bytes");
    let raised = quota::raise(&dir, &dir_path, 20 * MIB)?;
    println!("QUOTA-PROBE {name} raised: {raised}");
    let (more, errno_more) = fill(&format!("{dir_path}/more"), 9 * MIB);
    println!("QUOTA-PROBE {name} after raising to 20 MiB: {more} more bytes, errno {errno_more:?}");
    let ids_ok = ids_are_unique_and_freed(mount, name)?;
    let started = Instant::now();
    let volumes = 100;
    for i in 0..volumes {
        let path = format!("{mount}/pvc-cost-{name}-{i}");
        std::fs::create_dir(&path)?;
        let d = std::fs::File::open(&path)?;
        quota::apply(QuotaMode::Required, &d, &path, MIB).map_err(std::io::Error::other)?;
    }
    let per = started.elapsed() / volumes;
    println!("QUOTA-PROBE {name} cost: {per:?} per volume (mkdir + project id + limit, {volumes} volumes)");
    let counted = (written..=written + 64 * 1024).contains(&used);
    Ok(
        stopped
            && near_limit
            && limit == 10 * MIB
            && counted
            && raised
            && more == 9 * MIB
            && ids_ok,
    )
}

/// Two directories for one PV name (as two volumes whose names hash alike) get different
/// project ids, a retry keeps its id, a nested directory does not take its parent's; once
/// the first is removed (limit lifted), its id is free again (XFS: within 2 s).
fn ids_are_unique_and_freed(mount: &str, name: &str) -> std::io::Result<bool> {
    let root = safe_fs::open_root(std::path::Path::new(mount))?;
    let walk_error = |e: safe_fs::WalkError| std::io::Error::other(e.to_string());
    // The project `quota=required` gives the directory at `path` (created if missing).
    let limited = |path: &[&str]| -> std::io::Result<Option<u32>> {
        let path: Vec<String> = path.iter().map(|c| c.to_string()).collect();
        let (handle, _) = safe_fs::create_path(&root, &path, 0o777).map_err(walk_error)?;
        let dir = safe_fs::as_file(&handle)?;
        Ok(
            match quota::apply(QuotaMode::Required, &dir, "pvc-same", MIB) {
                Ok(Applied::Limited { project }) => Some(project),
                _ => None,
            },
        )
    };
    let make = |entry: &str| -> std::io::Result<Option<u32>> {
        std::fs::create_dir(format!("{mount}/{entry}"))?;
        std::fs::write(format!("{mount}/{entry}/file"), b"x")?;
        limited(&[entry])
    };
    let first = make("same-a")?;
    let retried = limited(&["same-a"])?; // a retry of the same volume keeps its id
    let second = make("same-b")?;
    quota::lift_before_removal(&root, "same-a", "pvc-same");
    root.remove_dir_all("same-a")?;
    let handle = std::fs::File::open(mount)?;
    let freed = first.is_some_and(|id| {
        (0..100).any(|_| {
            std::thread::sleep(std::time::Duration::from_millis(20));
            !quota::taken(&handle, id)
        })
    });
    let again = make("same-c")?;
    let expected: Vec<u32> = quota::candidates("pvc-same").take(2).collect();
    // A directory that inherited its parent's id (one of its own candidates) takes another,
    // and the parent's limit stays.
    let (parent, _) =
        safe_fs::create_path(&root, &["nest".to_string()], 0o777).map_err(walk_error)?;
    let parent = safe_fs::as_file(&parent)?;
    quota::limit(&parent, expected[0], 3 * MIB)?;
    let child = limited(&["nest", "child"])?;
    let parent_limit = quota::usage(&parent)?.1;
    println!("QUOTA-PROBE {name} nested: child {child:?}, parent's limit {parent_limit}");
    let nested_ok = child.is_some() && child != Some(expected[0]) && parent_limit == 3 * MIB;
    println!("QUOTA-PROBE {name} ids: first {first:?}, retried {retried:?}, second {second:?}, freed {freed}, after removal {again:?}, candidates {expected:?}");
    let retry_kept = retried == first;
    Ok(first == Some(expected[0])
        && retry_kept
        && second == Some(expected[1])
        && freed
        && again == first
        && nested_ok)
}

/// Write up to `max` bytes in 1 MiB chunks; the bytes written and the errno that stopped it.
fn fill(path: &str, max: u64) -> (u64, Option<i32>) {
    let mut file = match std::fs::File::create(path) {
        Ok(f) => f,
        Err(e) => return (0, e.raw_os_error()),
    };
    let chunk = vec![0xab_u8; MIB as usize];
    let mut written = 0;
    while written < max {
        match file.write(&chunk) {
            Ok(n) => written += n as u64,
            Err(e) => return (written, e.raw_os_error()),
        }
    }
    match file.sync_all() {
        Ok(()) => (written, None),
        Err(e) => (written, e.raw_os_error()),
    }
}

/// Drop `CAP_SYS_RESOURCE` from the effective set: with it, ext4 lets root past a hard limit.
fn drop_sys_resource() -> std::io::Result<()> {
    #[repr(C)]
    struct Header {
        version: u32,
        pid: i32,
    }
    #[repr(C)]
    #[derive(Default, Clone, Copy)]
    struct Data {
        effective: u32,
        permitted: u32,
        inheritable: u32,
    }
    const CAP_SYS_RESOURCE: u32 = 24;
    let mut header = Header {
        version: 0x2008_0522,
        pid: 0,
    };
    let mut data = [Data::default(); 2];
    // SAFETY: capget/capset with a v3 header and two data structs, as the ABI defines.
    unsafe {
        if libc::syscall(libc::SYS_capget, &mut header, data.as_mut_ptr()) < 0 {
            return Err(std::io::Error::last_os_error());
        }
        data[0].effective &= !(1 << CAP_SYS_RESOURCE);
        if libc::syscall(libc::SYS_capset, &mut header, data.as_ptr()) < 0 {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}
