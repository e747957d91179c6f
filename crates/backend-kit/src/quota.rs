//! Sizes enforced with project quotas (XFS; ext4 with the `project` feature): a volume
//! directory gets a project id, inherited by all it contains, and a hard block limit of the
//! claim's request, set through `quotactl_fd(2)` (Linux ≥ 5.14) on the directory's handle.
//! Why project quotas, and which kernels and filesystems enforce: docs/decisions/0014-sizes-enforced-with-project-quotas.md.

use std::collections::BTreeMap;
use std::io;
use std::os::fd::{AsFd, AsRawFd, FromRawFd};

use crate::attrs::DirAttrs;
use crate::safe_fs::{self, Dir};
use crate::Refusal;

/// StorageClass parameter choosing the [`QuotaMode`].
pub const QUOTA_PARAMETER: &str = "quota";

/// What a class asks for a claim's size (`quota` parameter; default `off`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum QuotaMode {
    /// No limit (the directory may grow until the filesystem is full).
    Off,
    /// A limit where the filesystem has project quotas; elsewhere the volume is made without.
    BestEffort,
    /// A limit, or no volume: provisioning fails where project quotas are not available.
    Required,
}

impl QuotaMode {
    /// The mode `parameters` ask for. Errors: a `quota` value other than
    /// `off`, `best-effort`, `required`.
    pub fn from_parameters(parameters: Option<&BTreeMap<String, String>>) -> Result<Self, Refusal> {
        let value = parameters.and_then(|p| p.get(QUOTA_PARAMETER));
        let value = value.map_or("off", String::as_str);
        <Self as clap::ValueEnum>::from_str(value, false).map_err(|_| {
            Refusal(format!(
                "StorageClass parameter {QUOTA_PARAMETER}={value:?} is not one of off, best-effort, required"
            ))
        })
    }
}

/// What [`apply`] did for a new volume directory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Applied {
    /// The class asked for no limit.
    Off,
    /// The directory's project `project` is limited to the request.
    Limited {
        /// The directory's project id.
        project: u32,
    },
    /// `best-effort` on a filesystem without project quotas: no limit, for this reason.
    Unenforced(String),
}

/// Apply `mode` to the new volume directory `dir` of `pv_name`: its own project id (one of
/// [`candidates`] no other directory uses) limited to `bytes`. Errors: `required` and no limit
/// (the cause named: no project quotas, kernel < 5.14, not permitted, every id taken).
pub fn apply(
    mode: QuotaMode,
    dir: &impl AsFd,
    pv_name: &str,
    bytes: u64,
) -> Result<Applied, Refusal> {
    if mode == QuotaMode::Off {
        return Ok(Applied::Off);
    }
    match free_project(dir, pv_name).and_then(|p| limit(dir, p, bytes).map(|()| p)) {
        Ok(project) => Ok(Applied::Limited { project }),
        Err(e) => {
            let reason = format!(
                "cannot limit the volume of {pv_name} to {bytes} bytes with a project quota: {}",
                explain(&e)
            );
            match mode {
                QuotaMode::Required => Err(Refusal(format!(
                    "{reason} (StorageClass {QUOTA_PARAMETER}=required)"
                ))),
                _ => Ok(Applied::Unenforced(reason)),
            }
        }
    }
}

/// Finish the new volume directory `dir` of `pv_name`: [`apply`] `mode`, then `attrs` (the
/// limit first: setting the project id needs the owner the service still is), logging the
/// limit. Errors: either step failed (`shown` names the directory).
pub fn limit_and_own(
    dir: &Dir,
    pv_name: &str,
    mode: QuotaMode,
    bytes: u64,
    attrs: &DirAttrs,
    shown: &str,
) -> Result<(), Refusal> {
    let file = safe_fs::as_file(dir).map_err(|e| Refusal(format!("cannot open {shown}: {e}")))?;
    let applied = apply(mode, &file, pv_name, bytes)?;
    if let Err(e) = attrs.apply(dir) {
        // The directory goes again: its id must not stay taken.
        let _ = raise(&file, pv_name, 0);
        return Err(Refusal(format!("cannot set mode/owner of {shown}: {e}")));
    }
    match applied {
        Applied::Limited { project } => {
            tracing::info!(pv = pv_name, project, bytes, "volume size limited")
        }
        Applied::Unenforced(reason) => {
            tracing::warn!(pv = pv_name, %reason, "volume size not enforced")
        }
        Applied::Off => {}
    }
    Ok(())
}

/// The project id of `pv_name`'s directory: a stable hash into `[2^20, 2^31)`, clear of the
/// small ids operators assign by hand in `/etc/projid`.
pub fn project_id(pv_name: &str) -> u32 {
    // FNV-1a: stable across releases and platforms, unlike std's hasher.
    let hash = pv_name.bytes().fold(0x811c_9dc5_u32, |h, b| {
        (h ^ u32::from(b)).wrapping_mul(0x0100_0193)
    });
    (1 << 20) + hash % ((1 << 31) - (1 << 20))
}

/// How many project ids, from [`project_id`] on, a volume may take when some are in use.
pub const PROBES: u32 = 16;

/// The project ids `pv_name`'s directory may own: [`project_id`] and the next
/// [`PROBES`]` - 1`, wrapping within `[2^20, 2^31)`.
pub fn candidates(pv_name: &str) -> impl Iterator<Item = u32> {
    probes_from(project_id(pv_name))
}

/// [`PROBES`] ids from `first` on, wrapping within `[2^20, 2^31)`.
fn probes_from(first: u32) -> impl Iterator<Item = u32> {
    let (low, span) = (1_u32 << 20, (1_u32 << 31) - (1 << 20));
    (0..PROBES).map(move |k| low + (first - low + k) % span)
}

/// The project id `dir` owns already (a retry of the same volume), else the first of
/// [`candidates`] with no usage and no limit on the filesystem. Errors: every candidate in use.
fn free_project(dir: &impl AsFd, pv_name: &str) -> io::Result<u32> {
    if let Some(own) = own_project(dir, pv_name) {
        return Ok(own);
    }
    candidates(pv_name)
        .find(|&id| !taken(dir, id))
        .ok_or_else(|| {
            io::Error::other(format!(
                "the {PROBES} project ids from {} on are all used by other directories",
                project_id(pv_name)
            ))
        })
}

/// Whether `project` has usage or a limit on `dir`'s filesystem (XFS frees a removed
/// directory's inodes in the background: its usage drops a moment after the removal).
pub fn taken(dir: &impl AsFd, project: u32) -> bool {
    // SAFETY: an all-zero `dqblk` is valid for the kernel to fill.
    let mut dq: libc::dqblk = unsafe { std::mem::zeroed() };
    quotactl(dir.as_fd().as_raw_fd(), libc::Q_GETQUOTA, project, &mut dq).is_ok()
        && (dq.dqb_curspace > 0 || dq.dqb_curinodes > 0 || dq.dqb_bhardlimit > 0)
}

/// `dir`'s project id when it is one of `pv_name`'s [`candidates`] (set by [`apply`]), not
/// one inherited from its parent (the same id as the parent's) or given by hand.
fn own_project(dir: &impl AsFd, pv_name: &str) -> Option<u32> {
    let fd = dir.as_fd().as_raw_fd();
    let id = project_of(fd)?;
    // SAFETY: openat of ".." relative to an open directory; the result is owned below.
    let parent = unsafe {
        libc::openat(
            fd,
            c"..".as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC,
        )
    };
    let parent = (parent >= 0).then(|| {
        // SAFETY: `parent` is a descriptor openat just returned and nothing else owns.
        unsafe { std::os::fd::OwnedFd::from_raw_fd(parent) }
    });
    let inherited = parent.is_some_and(|p| project_of(p.as_raw_fd()) == Some(id));
    (!inherited && candidates(pv_name).any(|c| c == id)).then_some(id)
}

/// The project id of the directory open at `fd`.
fn project_of(fd: libc::c_int) -> Option<u32> {
    fsxattr(fd).ok().map(|attr| attr.projid)
}

/// The `struct fsxattr` of the directory open at `fd`. Errors: the ioctl failed.
fn fsxattr(fd: libc::c_int) -> io::Result<FsXattr> {
    let mut attr = FsXattr::default();
    // SAFETY: `attr` is a valid `struct fsxattr` for the ioctl to fill.
    check(unsafe { libc::ioctl(fd, FS_IOC_FSGETXATTR, &mut attr) })?;
    Ok(attr)
}

/// Before `parent`'s entry `name` (the directory of `pv_name`) is removed: drop the limit of
/// its own project, so the id is free again. Nothing for a directory without its own limited
/// project (or that cannot be opened); a failed lift is logged (a later volume probes past it).
pub fn lift_before_removal(parent: &Dir, name: &str, pv_name: &str) {
    let dir = safe_fs::open_path(parent, &[name.to_string()]).ok();
    let Some(readable) = dir.and_then(|dir| safe_fs::as_file(&dir).ok()) else {
        return;
    };
    if let Err(e) = raise(&readable, pv_name, 0) {
        tracing::warn!(pv = pv_name, error = %e, "cannot lift the volume's size limit");
    }
}

/// Give `dir` the project id `project`, inherited by what is created in it, and a hard block
/// limit of `bytes` (rounded up to KiB; 0 removes the limit). Errors: the ioctl or
/// `quotactl_fd` failed (`ENOSYS`: kernel < 5.14; `ESRCH`/`ENOTSUP`: no project quotas).
pub fn limit(dir: &impl AsFd, project: u32, bytes: u64) -> io::Result<()> {
    let fd = dir.as_fd().as_raw_fd();
    let mut attr = fsxattr(fd)?;
    attr.projid = project;
    attr.xflags |= FS_XFLAG_PROJINHERIT;
    // SAFETY: `attr` is a valid `struct fsxattr` for the ioctl to read.
    check(unsafe { libc::ioctl(fd, FS_IOC_FSSETXATTR, &attr) })?;
    limit_project(fd, project, bytes)
}

/// Set the hard block limit of `project` on `fd`'s filesystem to `bytes` (rounded up to KiB).
fn limit_project(fd: libc::c_int, project: u32, bytes: u64) -> io::Result<()> {
    // SAFETY: an all-zero `dqblk` is valid; only the block limits are marked set.
    let mut dq: libc::dqblk = unsafe { std::mem::zeroed() };
    dq.dqb_bhardlimit = bytes.div_ceil(1024);
    dq.dqb_valid = libc::QIF_BLIMITS;
    quotactl(fd, libc::Q_SETQUOTA, project, &mut dq)
}

/// Set the limit of `pv_name`'s directory `dir` to `bytes` (0 lifts it) when it has its own
/// limited project (one of [`candidates`], not its parent's); `Ok(false)` when not (an
/// inherited, shared id is never changed for one volume). Errors: as [`limit`].
pub fn raise(dir: &impl AsFd, pv_name: &str, bytes: u64) -> io::Result<bool> {
    let Some(project) = own_project(dir, pv_name) else {
        return Ok(false);
    };
    match usage(dir) {
        Ok((_, limit)) if limit > 0 => {
            limit_project(dir.as_fd().as_raw_fd(), project, bytes).map(|()| true)
        }
        _ => Ok(false),
    }
}

/// An expansion of the volume directory `components` under `root` (a backend's base
/// directory or mount) to `bytes`: its room in `capacity` grown, then its own limit raised
/// ([`raise`]). Errors: [`VolumeError::Refused`] naming `shown` and the failed step.
pub async fn expand(
    root: std::path::PathBuf,
    components: Vec<String>,
    pv_name: String,
    bytes: u64,
    capacity: Option<u64>,
    shown: String,
) -> Result<(), provisioner_api::VolumeError> {
    crate::blocking("expand", move || {
        let refused = |e: String| provisioner_api::VolumeError::Refused(format!("{shown}: {e}"));
        let root = crate::safe_fs::open_root(&root).map_err(|e| refused(e.to_string()))?;
        let dir =
            crate::safe_fs::open_path(&root, &components).map_err(|e| refused(e.to_string()))?;
        if let Some(room) = capacity {
            crate::capacity::grow(&root, &pv_name, bytes, room).map_err(|r| refused(r.0))?;
        }
        let readable = crate::safe_fs::as_file(&dir).map_err(|e| refused(e.to_string()))?;
        raise(&readable, &pv_name, bytes)
            .map_err(|e| refused(format!("cannot raise its size limit: {e}")))?;
        Ok(())
    })
    .await
}

/// Space used and hard limit (bytes, 0: none) of `dir`'s project. Errors: as [`limit`].
pub fn usage(dir: &impl AsFd) -> io::Result<(u64, u64)> {
    let fd = dir.as_fd().as_raw_fd();
    let project = fsxattr(fd)?.projid;
    // SAFETY: an all-zero `dqblk` is valid for the kernel to fill.
    let mut dq: libc::dqblk = unsafe { std::mem::zeroed() };
    quotactl(fd, libc::Q_GETQUOTA, project, &mut dq)?;
    Ok((dq.dqb_curspace, dq.dqb_bhardlimit.saturating_mul(1024)))
}

/// A quota error in an operator's words.
fn explain(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOSYS) => format!("{e} (quotactl_fd needs Linux 5.14 or later)"),
        Some(libc::ESRCH | libc::ENOTSUP | libc::ENOTTY | libc::EINVAL) => format!(
            "{e} (the filesystem has no project quotas: XFS mounted with prjquota, or ext4 made with -O quota,project and mounted with prjquota)"
        ),
        Some(libc::EPERM) => format!("{e} (setting a project quota needs CAP_SYS_ADMIN)"),
        _ => e.to_string(),
    }
}

/// `struct fsxattr` of `<linux/fs.h>` (not in the libc crate).
#[repr(C)]
#[derive(Default)]
struct FsXattr {
    xflags: u32,
    extsize: u32,
    nextents: u32,
    projid: u32,
    cowextsize: u32,
    pad: [u8; 8],
}

const FS_IOC_FSGETXATTR: libc::Ioctl = 0x801c_581f_u32 as libc::Ioctl;
const FS_IOC_FSSETXATTR: libc::Ioctl = 0x401c_5820_u32 as libc::Ioctl;
const FS_XFLAG_PROJINHERIT: u32 = 0x200;
const PRJQUOTA: libc::c_int = 2;

fn quotactl(fd: libc::c_int, cmd: libc::c_int, id: u32, dq: &mut libc::dqblk) -> io::Result<()> {
    let op = libc::QCMD(cmd, PRJQUOTA);
    // SAFETY: quotactl_fd(fd, op, id, addr) with `addr` a valid `struct if_dqblk`.
    let r = unsafe { libc::syscall(libc::SYS_quotactl_fd, fd, op, id, dq as *mut libc::dqblk) };
    check(r as libc::c_int)
}

fn check(r: libc::c_int) -> io::Result<()> {
    if r < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_comes_from_the_quota_parameter() {
        let params = |v: &str| BTreeMap::from([(QUOTA_PARAMETER.to_string(), v.to_string())]);
        assert_eq!(QuotaMode::from_parameters(None), Ok(QuotaMode::Off));
        assert_eq!(
            QuotaMode::from_parameters(Some(&params("off"))),
            Ok(QuotaMode::Off)
        );
        assert_eq!(
            QuotaMode::from_parameters(Some(&params("best-effort"))),
            Ok(QuotaMode::BestEffort)
        );
        assert_eq!(
            QuotaMode::from_parameters(Some(&params("required"))),
            Ok(QuotaMode::Required)
        );
        let err = QuotaMode::from_parameters(Some(&params("yes"))).unwrap_err();
        assert!(
            err.0
                .contains("quota=\"yes\" is not one of off, best-effort, required"),
            "{err}"
        );
    }

    #[test]
    fn project_ids_are_stable_and_above_the_hand_assigned_range() {
        let id = project_id("pvc-6a1e0a51-0000-4000-8000-000000000002");
        assert_eq!(id, project_id("pvc-6a1e0a51-0000-4000-8000-000000000002"));
        assert_ne!(id, project_id("pvc-6a1e0a51-0000-4000-8000-000000000003"));
        for name in ["", "a", "pvc-x", &"z".repeat(300)] {
            let id = project_id(name);
            assert!((1 << 20..1 << 31).contains(&id), "{name}: {id}");
            let all: Vec<u32> = candidates(name).collect();
            assert_eq!(all.len(), PROBES as usize);
            assert_eq!(all[0], id);
            assert!(
                all.iter().all(|c| (1 << 20..1 << 31).contains(c)),
                "{all:?}"
            );
        }
        // Near the top of the range the ids wrap to its bottom, all distinct.
        let top: Vec<u32> = probes_from((1 << 31) - 2).collect();
        assert_eq!(top[..3], [(1 << 31) - 2, (1 << 31) - 1, 1 << 20]);
        let distinct: std::collections::BTreeSet<u32> = top.iter().copied().collect();
        assert_eq!(distinct.len(), PROBES as usize);
    }

    /// The backends' directory handles are `O_PATH`, on which the ioctls fail with `EBADF`:
    /// the quota functions take the readable descriptor `safe_fs::as_file` gives.
    #[test]
    fn quota_calls_need_a_readable_descriptor_not_an_o_path_handle() {
        let tmp = tempfile::tempdir().unwrap();
        let root = crate::safe_fs::open_root(tmp.path()).unwrap();
        let (dir, _) = crate::safe_fs::create_path(&root, &["pvc-1".to_string()], 0o777).unwrap();
        let o_path = limit(&dir, 1 << 20, 1 << 20).unwrap_err();
        assert_eq!(o_path.raw_os_error(), Some(libc::EBADF), "{o_path}");
        let readable = crate::safe_fs::as_file(&dir).unwrap();
        match limit(&readable, project_id("pvc-1"), 1 << 20) {
            Err(e) => assert_ne!(e.raw_os_error(), Some(libc::EBADF), "{e}"),
            Ok(()) => return, // this filesystem has project quotas
        }
        assert!(
            !raise(&readable, "pvc-1", 1 << 20).unwrap_or(true),
            "no limit to raise here"
        );
        // Another volume's name never raises this project (an inherited or foreign id).
        assert!(!raise(&readable, "pvc-2", 1 << 20).unwrap_or(true));
    }

    /// On a filesystem without project quotas (this test's temporary directory, on a host
    /// whose kernel may lack quota support altogether) `required` refuses with the cause and
    /// `best-effort` goes on without a limit. Real limits are checked in a VM
    /// (tools/quota-vm, `tests/tests/quota_vm.rs`).
    #[test]
    fn without_project_quotas_required_refuses_and_best_effort_goes_on() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = std::fs::File::open(tmp.path()).unwrap();
        if limit(&dir, project_id("pvc-probe"), 1 << 20).is_ok() {
            eprintln!("this filesystem has project quotas: the refusal is not testable here");
            return;
        }
        let err = apply(QuotaMode::Required, &dir, "pvc-1", 1 << 20).unwrap_err();
        assert!(
            err.0.starts_with(
                "cannot limit the volume of pvc-1 to 1048576 bytes with a project quota: "
            ),
            "{err}"
        );
        assert!(err.0.ends_with("(StorageClass quota=required)"), "{err}");
        match apply(QuotaMode::BestEffort, &dir, "pvc-1", 1 << 20).unwrap() {
            Applied::Unenforced(reason) => assert!(reason.contains("project quota"), "{reason}"),
            other => panic!("{other:?}"),
        }
        assert_eq!(
            apply(QuotaMode::Off, &dir, "pvc-1", 1 << 20),
            Ok(Applied::Off)
        );
    }
}
