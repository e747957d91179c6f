//! A base directory's capacity: the requests of its volumes may add up to at most the
//! configured capacity, so claims beyond it fail instead of filling the disk. Each volume's
//! request is recorded in the base directory's bookkeeping (`.split-provisioner/sizes/<pv>`),
//! out of reach of the pods, which only mount their own volume directories.

use std::io;
use std::sync::Mutex;

use crate::safe_fs::{self, Dir};
use crate::{single_component, Refusal};

/// The bookkeeping directory of a base directory (shared with nfs-subdir's registry).
pub const BOOKKEEPING_DIR: &str = ".split-provisioner";
/// Its sub-directory of size records, one file per PV holding the request in bytes.
pub const SIZES_DIR: &str = "sizes";

/// The directory `<root>/.split-provisioner/<sub>`, made (mode `0700`) when `create`, else
/// `None` when absent. Errors: the walk there failed.
pub fn bookkeeping(root: &Dir, sub: &str, create: bool) -> Result<Option<Dir>, safe_fs::WalkError> {
    let comps = [BOOKKEEPING_DIR.to_string(), sub.to_string()];
    let walked = if create {
        safe_fs::create_path(root, &comps, 0o700).map(|(d, _)| d)
    } else {
        safe_fs::open_path(root, &comps)
    };
    match walked {
        Err(safe_fs::WalkError::Missing(_)) if !create => Ok(None),
        walked => walked.map(Some),
    }
}

/// Held while a reservation checks and records, so two claims never both take the last space.
static RESERVING: Mutex<()> = Mutex::new(());

/// Record `bytes` for `pv_name` below `root` unless the total would exceed `capacity` (bytes);
/// `true` when this call wrote it (an existing record is kept: `false`). Errors: the capacity
/// would be exceeded (with the figures), or the records are unusable.
pub fn reserve(root: &Dir, pv_name: &str, bytes: u64, capacity: u64) -> Result<bool, Refusal> {
    let _guard = RESERVING.lock().unwrap_or_else(|e| e.into_inner());
    let sizes = records(root, pv_name)?;
    if safe_fs::entry(&sizes, pv_name).map_err(unusable)? != safe_fs::Entry::Absent {
        return Ok(false);
    }
    let allocated = allocated_in(&sizes).map_err(unusable)?;
    if allocated.saturating_add(bytes) > capacity {
        return Err(Refusal(format!(
            "the claim's {bytes} bytes do not fit: {allocated} of the base directory's capacity of {capacity} bytes are taken, {} free",
            capacity.saturating_sub(allocated)
        )));
    }
    safe_fs::replace(&sizes, pv_name, bytes.to_string().as_bytes()).map_err(unusable)?;
    Ok(true)
}

/// Change `pv_name`'s record to `bytes` unless the recorded total would then exceed
/// `capacity`; a PV without a record gets one. Errors: as [`reserve`].
pub fn grow(root: &Dir, pv_name: &str, bytes: u64, capacity: u64) -> Result<(), Refusal> {
    let _guard = RESERVING.lock().unwrap_or_else(|e| e.into_inner());
    let sizes = records(root, pv_name)?;
    let own: u64 = sizes
        .read_to_string(pv_name)
        .ok()
        .and_then(|t| t.trim().parse().ok())
        .unwrap_or(0);
    let others = allocated_in(&sizes).map_err(unusable)?.saturating_sub(own);
    if others.saturating_add(bytes) > capacity {
        return Err(Refusal(format!(
            "the volume cannot grow to {bytes} bytes: its neighbours take {others} of the base directory's capacity of {capacity} bytes"
        )));
    }
    safe_fs::replace(&sizes, pv_name, bytes.to_string().as_bytes()).map_err(unusable)
}

/// Forget `pv_name`'s record (its volume is deleted or archived); absent is fine.
/// Errors: the record exists and cannot be removed.
pub fn release(root: &Dir, pv_name: &str) -> io::Result<()> {
    let Ok(Some(sizes)) = bookkeeping(root, SIZES_DIR, false) else {
        return Ok(());
    };
    safe_fs::absent_ok(sizes.remove_file(pv_name))
}

/// [`release`] after a deletion or archive: a failure is only logged (it over-counts the
/// capacity used, never under-counts).
pub fn release_logged(root: &Dir, pv_name: &str) {
    if let Err(e) = release(root, pv_name) {
        tracing::warn!(pv = pv_name, error = %e, "cannot forget the volume's size record");
    }
}

/// The recorded total below `root` (bytes; 0 without records). Errors: unreadable records.
pub fn allocated(root: &Dir) -> io::Result<u64> {
    match bookkeeping(root, SIZES_DIR, false) {
        Ok(sizes) => sizes.map_or(Ok(0), |sizes| allocated_in(&sizes)),
        Err(e) => Err(io::Error::other(e.to_string())),
    }
}

/// One pool's capacity for `Provisioner::capacity`: `capacity` bytes at `root` (its records
/// read on the blocking pool), named `pool`. Errors: the records are unreadable.
pub async fn pool(
    root: std::path::PathBuf,
    pool: String,
    capacity: u64,
) -> Result<Vec<provisioner_api::PoolCapacity>, provisioner_api::VolumeError> {
    let shown = pool.clone();
    let allocated = crate::blocking("capacity", move || {
        let unreadable = |e: io::Error| {
            provisioner_api::VolumeError::Unreadable(format!("size records of {shown}: {e}"))
        };
        let root = safe_fs::open_root(&root).map_err(unreadable)?;
        allocated(&root).map_err(unreadable)
    });
    let allocated = allocated.await?;
    Ok(vec![provisioner_api::PoolCapacity {
        pool,
        capacity,
        allocated,
    }])
}

/// A capacity flag's value: a positive quantity (`500Gi`) in bytes. Errors: anything else.
pub fn parse_quantity(s: &str) -> Result<u64, String> {
    let q = k8s_openapi::apimachinery::pkg::api::resource::Quantity(s.to_string());
    provisioner_api::quantity::bytes(&q)
        .ok_or_else(|| format!("{s:?} is not a positive quantity such as 500Gi"))
}

/// A size-records failure as a refusal.
fn unusable(e: io::Error) -> Refusal {
    Refusal(format!(
        "cannot use the size records of the base directory: {e}"
    ))
}

/// The size-records directory below `root` (made if missing), for a record of `pv_name`.
/// Errors: `pv_name` is not one path component, or the directory is unusable.
fn records(root: &Dir, pv_name: &str) -> Result<Dir, Refusal> {
    single_component(pv_name)?;
    let made = bookkeeping(root, SIZES_DIR, true)
        .map_err(|e| unusable(io::Error::other(e.to_string())))?;
    Ok(made.expect("created"))
}

/// The sum of the records in `sizes`; a record that is not a number counts as 0.
fn allocated_in(sizes: &Dir) -> io::Result<u64> {
    let mut total = 0_u64;
    for entry in sizes.entries()? {
        let name = entry?.file_name();
        if name.to_string_lossy().starts_with('.') {
            continue;
        }
        let text = sizes.read_to_string(&name).unwrap_or_default();
        total = total.saturating_add(text.trim().parse().unwrap_or(0));
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_stop_at_the_capacity_and_are_idempotent() {
        let tmp = tempfile::tempdir().unwrap();
        let root = safe_fs::open_root(tmp.path()).unwrap();
        assert_eq!(allocated(&root).unwrap(), 0);
        assert!(reserve(&root, "pvc-a", 600, 1000).unwrap());
        assert!(
            !reserve(&root, "pvc-a", 600, 1000).unwrap(),
            "recorded already"
        );
        assert_eq!(allocated(&root).unwrap(), 600);
        let err = reserve(&root, "pvc-b", 500, 1000).unwrap_err();
        assert_eq!(
            err.0,
            "the claim's 500 bytes do not fit: 600 of the base directory's capacity of 1000 bytes are taken, 400 free"
        );
        assert!(reserve(&root, "pvc-b", 400, 1000).unwrap());
        release(&root, "pvc-a").unwrap();
        release(&root, "pvc-a").unwrap();
        assert_eq!(allocated(&root).unwrap(), 400);
        assert!(reserve(&root, "../x", 1, 1000).is_err());
        grow(&root, "pvc-b", 900, 1000).unwrap();
        assert_eq!(allocated(&root).unwrap(), 900);
        let err = grow(&root, "pvc-c", 200, 1000).unwrap_err();
        assert!(err.0.contains("its neighbours take 900"), "{err}");
    }
}
