//! Several base directories on one node (`--base-dir` repeated, as local-path-provisioner's
//! `nodePathMap` paths): the class's `baseDir` parameter picks one for a new volume (default:
//! the first), and everything after provisioning goes to the one a PV's path lies in, so a
//! deletion needs nothing but the PV.

use std::collections::HashSet;
use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;
use k8s_openapi::api::core::v1::PersistentVolume;
use k8s_openapi::api::storage::v1::StorageClass;
use provisioner_api::{
    DeleteError, OrphanOutcome, PoolCapacity, ProvisionError, ProvisionOptions, Provisioner,
    VolumeError,
};

use crate::{delete, provision, HostPath};
use backend_kit::{blocking, blocking_with, capacity};

/// StorageClass parameter: which `--base-dir` new volumes of the class go to (exactly as given
/// to the flag; default: the first).
pub const PARAM_BASE_DIR: &str = "baseDir";

/// The hostpath backend over several base directories, one [`HostPath`] each.
#[derive(Debug, Clone)]
pub struct BaseDirs(pub Vec<HostPath>);

impl BaseDirs {
    /// The base directory `class` names (its own check refuses one that is not configured).
    fn for_class(&self, class: &StorageClass) -> &HostPath {
        let named = class
            .parameters
            .as_ref()
            .and_then(|p| p.get(PARAM_BASE_DIR));
        named
            .and_then(|dir| self.0.iter().find(|b| b.base_dir == Path::new(dir)))
            .unwrap_or(&self.0[0])
    }

    /// The base directory `pv`'s `hostPath` lies in (else the first, whose checks refuse it).
    fn for_volume(&self, pv: &PersistentVolume) -> &HostPath {
        let path = pv
            .spec
            .as_ref()
            .and_then(|s| s.host_path.as_ref())
            .map(|h| Path::new(&h.path));
        let parent = path.and_then(Path::parent);
        self.0
            .iter()
            .find(|b| Some(b.base_dir.as_path()) == parent)
            .unwrap_or(&self.0[0])
    }
}

#[async_trait]
impl Provisioner for BaseDirs {
    async fn provision(
        &self,
        options: &ProvisionOptions,
    ) -> Result<PersistentVolume, ProvisionError> {
        let dir = self.for_class(&options.storage_class);
        blocking_with("hostpath provision", dir, options, provision::provision).await
    }

    async fn delete(&self, volume: &PersistentVolume) -> Result<(), DeleteError> {
        let dir = self.for_volume(volume);
        blocking_with("hostpath delete", dir, volume, delete::delete).await
    }

    async fn delete_unprovisioned(&self, options: &ProvisionOptions) -> Result<(), DeleteError> {
        let dir = self.for_class(&options.storage_class);
        blocking_with(
            "hostpath delete",
            dir,
            options,
            delete::delete_unprovisioned,
        )
        .await
    }

    fn validate_volume(&self, pv: &PersistentVolume) -> Result<(), VolumeError> {
        Ok(provision::validate_volume(self.for_volume(pv), pv)?)
    }

    async fn list_volumes(&self) -> Option<Result<Vec<String>, VolumeError>> {
        let dirs = self.0.clone();
        let list = move || -> Result<Vec<String>, VolumeError> {
            let lists = dirs.iter().map(delete::list_volumes);
            Ok(lists.collect::<Result<Vec<_>, _>>()?.concat())
        };
        Some(blocking("hostpath listing", list).await)
    }

    async fn volumes_in_use(
        &self,
        pvs: &[PersistentVolume],
    ) -> Result<HashSet<String>, VolumeError> {
        let mut used = HashSet::new();
        for dir in &self.0 {
            used.extend(delete::volumes_in_use(dir, pvs).await?);
        }
        Ok(used)
    }

    async fn expand(&self, volume: &PersistentVolume, bytes: u64) -> Result<(), VolumeError> {
        provision::expand(self.for_volume(volume), volume, bytes).await
    }

    /// Each base directory's pool; `None` when a directory has no `--capacity`.
    async fn capacity(&self) -> Option<Result<Vec<PoolCapacity>, VolumeError>> {
        let mut pools = Vec::new();
        for dir in &self.0 {
            let name = dir.base_dir.display().to_string();
            match capacity::pool(dir.base_dir.clone(), name, dir.capacity?).await {
                Ok(pool) => pools.extend(pool),
                Err(e) => return Some(Err(e)),
            }
        }
        Some(Ok(pools))
    }

    async fn archive_orphan(
        &self,
        pv_name: &str,
        min_age: Duration,
    ) -> Option<Result<OrphanOutcome, DeleteError>> {
        let archive = move |dir: &HostPath, name: &str| delete::archive_orphan(dir, name, min_age);
        for dir in &self.0 {
            match blocking_with("hostpath orphan archive", dir, pv_name, archive).await {
                Ok(OrphanOutcome::Absent) => continue,
                other => return Some(other),
            }
        }
        Some(Ok(OrphanOutcome::Absent))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::provision::tests::{backend, options, reason};
    use std::collections::BTreeMap;

    /// Two base directories: the class picks the second, and the PV alone finds it again
    /// for the checks, the delete and the orphan sweep.
    #[tokio::test]
    async fn the_class_picks_a_base_dir_and_the_pv_alone_finds_it() {
        let tmp = tempfile::tempdir().unwrap();
        let (fast, slow) = (tmp.path().join("fast"), tmp.path().join("slow"));
        let dirs = BaseDirs(vec![backend(&fast, Some("n")), backend(&slow, Some("n"))]);
        let mut o = options(Some("1Gi"));
        let slow_param = slow.to_string_lossy().into_owned();
        let params = BTreeMap::from([(PARAM_BASE_DIR.to_string(), slow_param)]);
        o.storage_class.parameters = Some(params);
        let pv = dirs.provision(&o).await.unwrap();
        assert_eq!(
            pv.spec.as_ref().unwrap().host_path.as_ref().unwrap().path,
            slow.join("pvc-123").to_string_lossy()
        );
        assert!(slow.join("pvc-123").is_dir() && !fast.join("pvc-123").exists());
        dirs.validate_volume(&pv).unwrap();
        // The same PV name without `baseDir` goes to the default (first) directory.
        dirs.provision(&options(Some("1Gi"))).await.unwrap();
        assert_eq!(dirs.list_volumes().await.unwrap().unwrap().len(), 2);
        let used = dirs
            .volumes_in_use(std::slice::from_ref(&pv))
            .await
            .unwrap();
        assert!(used.contains("pvc-123"));
        dirs.delete(&pv).await.unwrap();
        assert!(!slow.join("pvc-123").exists(), "deleted where the PV says");
        assert!(
            fast.join("pvc-123").exists(),
            "the other base dir untouched"
        );
        assert_eq!(
            dirs.archive_orphan("pvc-123", Duration::ZERO).await,
            Some(Ok(OrphanOutcome::Archived(fast.join("archived-pvc-123"))))
        );
        assert_eq!(
            dirs.archive_orphan("pvc-gone", Duration::ZERO).await,
            Some(Ok(OrphanOutcome::Absent))
        );
    }

    #[tokio::test]
    async fn a_base_dir_that_is_not_configured_is_refused() {
        let tmp = tempfile::tempdir().unwrap();
        let dirs = BaseDirs(vec![
            backend(&tmp.path().join("a"), Some("n")),
            backend(&tmp.path().join("b"), Some("n")),
        ]);
        let mut o = options(Some("1Gi"));
        o.storage_class.parameters = Some(BTreeMap::from([(
            PARAM_BASE_DIR.to_string(),
            "/etc".to_string(),
        )]));
        let err = reason(dirs.provision(&o).await.unwrap_err());
        assert!(
            err.contains("baseDir=\"/etc\", which is not one of this provisioner's --base-dir"),
            "{err}"
        );
        assert_eq!(std::fs::read_dir(tmp.path()).unwrap().count(), 0);
    }
}
