//! Pure decisions about one PV, following the seed's `shouldDelete`,
//! `handleProtectionFinalizer`, `addFinalizer` and `removeFinalizer`. No I/O:
//! callers feed the PV as read from the reflector (or the API server) and act on
//! the answer.

use api_types::{ANN_DYNAMICALLY_PROVISIONED, ANN_MIGRATED_TO, FINALIZER_PV};
use k8s_openapi::api::core::v1::PersistentVolume;
use kube::ResourceExt;

/// Reclaim policy value `Delete`.
pub const POLICY_DELETE: &str = "Delete";
/// Reclaim policy value `Retain`.
pub const POLICY_RETAIN: &str = "Retain";
/// Reclaim policy value `Recycle` (deprecated in Kubernetes, still honoured as in the seed).
pub const POLICY_RECYCLE: &str = "Recycle";
/// PV phase value `Released`: the bound claim was deleted.
pub const PHASE_RELEASED: &str = "Released";

/// Whether `volume` is ours: `pv.kubernetes.io/provisioned-by` is set and it or
/// `pv.kubernetes.io/migrated-to` names the provisioner (seed `shouldDelete`).
pub fn is_ours(volume: &PersistentVolume, provisioner_name: &str) -> bool {
    let annotations = volume.annotations();
    let names_us = |key: &str| annotations.get(key).is_some_and(|p| p == provisioner_name);
    annotations.contains_key(ANN_DYNAMICALLY_PROVISIONED)
        && (names_us(ANN_DYNAMICALLY_PROVISIONED) || names_us(ANN_MIGRATED_TO))
}

/// Why [`should_delete`] declined a PV; the first failing check, in the seed's order.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Skip {
    /// The backend's deletion guard (`Provisioner::should_delete`) vetoed it.
    GuardVetoed,
    /// `--add-finalizer` is on, the PV is being deleted and our finalizer is
    /// already gone: the asset was deleted before.
    FinalizerGone,
    /// `--add-finalizer` is off and the PV is being deleted: left alone.
    BeingDeleted,
    /// `status.phase` is not `Released`.
    NotReleased,
    /// `spec.persistentVolumeReclaimPolicy` is not `Delete`.
    PolicyNotDelete,
    /// Neither `provisioned-by` nor `migrated-to` names this provisioner (or
    /// `provisioned-by` is missing).
    NotOurs,
}

/// Seed `shouldDelete`: `Ok` to delete `volume`'s asset now, else the first
/// [`Skip`] in the seed's order (the backend's `guard` first, called once).
pub fn should_delete(
    volume: &PersistentVolume,
    provisioner_name: &str,
    add_finalizer: bool,
    guard: impl FnOnce(&PersistentVolume) -> bool,
) -> Result<(), Skip> {
    if !guard(volume) {
        return Err(Skip::GuardVetoed);
    }
    let being_deleted = volume.metadata.deletion_timestamp.is_some();
    if add_finalizer {
        if being_deleted && !has_finalizer(volume, FINALIZER_PV) {
            return Err(Skip::FinalizerGone);
        }
    } else if being_deleted {
        return Err(Skip::BeingDeleted);
    }
    let phase = volume.status.as_ref().and_then(|s| s.phase.as_deref());
    if phase != Some(PHASE_RELEASED) {
        return Err(Skip::NotReleased);
    }
    if reclaim_policy(volume) != Some(POLICY_DELETE) {
        return Err(Skip::PolicyNotDelete);
    }
    if !is_ours(volume, provisioner_name) {
        return Err(Skip::NotOurs);
    }
    Ok(())
}

/// Why a PV decided for deletion is no longer to be deleted when read again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stale {
    /// Gone, or replaced by another object (uid) of the same name.
    Replaced,
    /// Bound to another claim since the decision.
    Rebound,
    /// [`should_delete`] declines it now.
    Declined(Skip),
}

/// Whether `decided`, read again as `fresh`, is still to be deleted: the same
/// object, bound to the same claim, and `should_delete` holds. Returns `fresh`.
pub fn still_to_delete(
    decided: &PersistentVolume,
    fresh: Option<PersistentVolume>,
    should_delete: impl FnOnce(&PersistentVolume) -> Result<(), Skip>,
) -> Result<PersistentVolume, Stale> {
    let fresh = fresh
        .filter(|pv| pv.metadata.uid == decided.metadata.uid)
        .ok_or(Stale::Replaced)?;
    let claim_uid = |pv: &PersistentVolume| pv.spec.as_ref()?.claim_ref.as_ref()?.uid.clone();
    if claim_uid(&fresh) != claim_uid(decided) {
        return Err(Stale::Rebound);
    }
    should_delete(&fresh).map_err(Stale::Declined)?;
    Ok(fresh)
}

/// Seed `handleProtectionFinalizer`: the complete new finalizer list of one of
/// our PVs (ours added for policy `Delete` with `add_finalizer`, else removed;
/// others kept in order), or `None` when nothing changes.
pub fn finalizer_update(
    volume: &PersistentVolume,
    provisioner_name: &str,
    add_finalizer: bool,
) -> Option<Vec<String>> {
    if !is_ours(volume, provisioner_name) {
        return None;
    }
    let (current, policy) = (finalizers(volume), reclaim_policy(volume));
    let has = has_finalizer(volume, FINALIZER_PV);
    if has && (!add_finalizer || matches!(policy, Some(POLICY_RETAIN | POLICY_RECYCLE))) {
        return Some(without(current, FINALIZER_PV));
    }
    let add = add_finalizer && policy == Some(POLICY_DELETE);
    (!has && add && volume.metadata.deletion_timestamp.is_none())
        .then(|| [current, &[FINALIZER_PV.to_string()]].concat())
}

/// `finalizers` without any `finalizer` entry (seed `removeFinalizer`).
pub fn without(finalizers: &[String], finalizer: &str) -> Vec<String> {
    let kept = finalizers.iter().filter(|f| f.as_str() != finalizer);
    kept.cloned().collect()
}

/// Whether `volume` carries `finalizer` (seed `checkFinalizer`).
pub fn has_finalizer(volume: &PersistentVolume, finalizer: &str) -> bool {
    finalizers(volume).iter().any(|f| f == finalizer)
}

/// The PV's `spec.persistentVolumeReclaimPolicy`, if set.
pub fn reclaim_policy(volume: &PersistentVolume) -> Option<&str> {
    volume
        .spec
        .as_ref()?
        .persistent_volume_reclaim_policy
        .as_deref()
}

/// The PV's StorageClass name (`spec.storageClassName`), `""` when unset: the
/// `class` label of the delete metrics, as in the seed.
pub fn storage_class(volume: &PersistentVolume) -> &str {
    volume
        .spec
        .as_ref()
        .and_then(|s| s.storage_class_name.as_deref())
        .unwrap_or("")
}

/// The PV's class as Kubernetes reads it (`GetPersistentVolumeClass`): the beta
/// annotation, else `spec.storageClassName`; `""` for none.
pub fn class_name(volume: &PersistentVolume) -> &str {
    let beta = volume
        .annotations()
        .get("volume.beta.kubernetes.io/storage-class");
    beta.map_or_else(|| storage_class(volume), String::as_str)
}

/// The PV's `metadata.finalizers` (empty when unset).
pub fn finalizers(volume: &PersistentVolume) -> &[String] {
    volume.metadata.finalizers.as_deref().unwrap_or(&[])
}

#[cfg(test)]
mod tests {
    use super::*;
    use k8s_openapi::api::core::v1::{
        ObjectReference, PersistentVolumeSpec, PersistentVolumeStatus,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};

    const ME: &str = "example.com/hostpath";
    const OTHER: &str = "other.example.com/nfs";
    const PROTECTION: &str = "kubernetes.io/pv-protection";

    fn pv(
        provisioned_by: Option<&str>,
        phase: &str,
        policy: &str,
        finalizers: &[&str],
        deleting: bool,
    ) -> PersistentVolume {
        let mut annotations = std::collections::BTreeMap::new();
        if let Some(p) = provisioned_by {
            annotations.insert(ANN_DYNAMICALLY_PROVISIONED.to_string(), p.to_string());
        }
        PersistentVolume {
            metadata: ObjectMeta {
                name: Some("pvc-1".into()),
                annotations: Some(annotations),
                finalizers: if finalizers.is_empty() {
                    None
                } else {
                    Some(finalizers.iter().map(|s| s.to_string()).collect())
                },
                deletion_timestamp: deleting.then(|| Time(Default::default())),
                ..Default::default()
            },
            spec: Some(PersistentVolumeSpec {
                persistent_volume_reclaim_policy: Some(policy.into()),
                storage_class_name: Some("fast".into()),
                ..Default::default()
            }),
            status: Some(PersistentVolumeStatus {
                phase: Some(phase.into()),
                ..Default::default()
            }),
        }
    }

    fn released() -> PersistentVolume {
        pv(Some(ME), PHASE_RELEASED, POLICY_DELETE, &[], false)
    }

    /// [`should_delete`] for our provisioner with every class allowed.
    fn verdict(pv: &PersistentVolume, add_finalizer: bool) -> Result<(), Skip> {
        should_delete(pv, ME, add_finalizer, allow)
    }

    fn allow(_: &PersistentVolume) -> bool {
        true
    }

    #[test]
    fn a_delete_goes_ahead_only_on_the_same_object_and_claim_still_to_delete() {
        let claimed = |uid: &str, claim: &str| {
            let mut v = released();
            v.metadata.uid = Some(uid.into());
            v.spec.as_mut().unwrap().claim_ref = Some(ObjectReference {
                uid: Some(claim.into()),
                ..Default::default()
            });
            v
        };
        let decided = claimed("pv-1", "claim-1");
        let check = |v: &PersistentVolume| should_delete(v, ME, false, allow);
        let fresh = still_to_delete(&decided, Some(decided.clone()), check).unwrap();
        assert_eq!(fresh, decided);
        assert_eq!(still_to_delete(&decided, None, check), Err(Stale::Replaced));
        let replaced = Some(claimed("pv-2", "claim-1"));
        assert_eq!(
            still_to_delete(&decided, replaced, check),
            Err(Stale::Replaced)
        );
        let rebound = Some(claimed("pv-1", "claim-2"));
        assert_eq!(
            still_to_delete(&decided, rebound, check),
            Err(Stale::Rebound)
        );
        let mut retained = decided.clone();
        retained
            .spec
            .as_mut()
            .unwrap()
            .persistent_volume_reclaim_policy = Some(POLICY_RETAIN.into());
        assert_eq!(
            still_to_delete(&decided, Some(retained), check),
            Err(Stale::Declined(Skip::PolicyNotDelete))
        );
    }

    #[test]
    fn ownership_needs_provisioned_by_and_our_name_in_it_or_migrated_to() {
        assert!(is_ours(&released(), ME));
        assert!(!is_ours(
            &pv(Some(OTHER), "Released", "Delete", &[], false),
            ME
        ));
        assert!(!is_ours(&pv(None, "Released", "Delete", &[], false), ME));

        let mut migrated = pv(Some(OTHER), "Released", "Delete", &[], false);
        migrated
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_MIGRATED_TO.into(), ME.into());
        assert!(is_ours(&migrated, ME));

        // migrated-to alone (no provisioned-by) is not enough, as in the seed.
        let mut only_migrated = pv(None, "Released", "Delete", &[], false);
        only_migrated
            .metadata
            .annotations
            .as_mut()
            .unwrap()
            .insert(ANN_MIGRATED_TO.into(), ME.into());
        assert!(!is_ours(&only_migrated, ME));
        assert!(!is_ours(&PersistentVolume::default(), ME));
    }

    #[test]
    fn should_delete_a_released_delete_policy_pv_of_ours() {
        assert_eq!(verdict(&released(), false), Ok(()));
        assert_eq!(verdict(&released(), true), Ok(()));
    }

    #[test]
    fn guard_is_checked_first() {
        // Even a PV failing every other check reports the guard veto.
        let bad = pv(None, "Bound", "Retain", &[], true);
        assert_eq!(
            should_delete(&bad, ME, false, |_| false),
            Err(Skip::GuardVetoed)
        );
        let mut called = 0;
        let _ = should_delete(&released(), ME, false, |_| {
            called += 1;
            true
        });
        assert_eq!(called, 1);
    }

    #[test]
    fn with_finalizer_option_a_deleted_pv_without_our_finalizer_is_done() {
        let gone = pv(Some(ME), "Released", "Delete", &[PROTECTION], true);
        assert_eq!(verdict(&gone, true), Err(Skip::FinalizerGone));
        // Being deleted but still holding our finalizer: the asset is deleted.
        let pending = pv(Some(ME), "Released", "Delete", &[FINALIZER_PV], true);
        assert_eq!(verdict(&pending, true), Ok(()));
    }

    #[test]
    fn without_finalizer_option_a_pv_being_deleted_is_left_alone() {
        let deleting = pv(Some(ME), "Released", "Delete", &[FINALIZER_PV], true);
        assert_eq!(verdict(&deleting, false), Err(Skip::BeingDeleted));
    }

    #[test]
    fn phase_policy_and_ownership_are_required() {
        for phase in ["Bound", "Available", "Pending", "Failed"] {
            let v = pv(Some(ME), phase, "Delete", &[], false);
            assert_eq!(verdict(&v, false), Err(Skip::NotReleased));
        }
        let mut no_status = released();
        no_status.status = None;
        assert_eq!(verdict(&no_status, false), Err(Skip::NotReleased));
        for policy in ["Retain", "Recycle", ""] {
            let v = pv(Some(ME), "Released", policy, &[], false);
            assert_eq!(verdict(&v, false), Err(Skip::PolicyNotDelete));
        }
        let theirs = pv(Some(OTHER), "Released", "Delete", &[], false);
        assert_eq!(verdict(&theirs, false), Err(Skip::NotOurs));
        let unannotated = pv(None, "Released", "Delete", &[], false);
        assert_eq!(verdict(&unannotated, false), Err(Skip::NotOurs));
    }

    fn strings(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn finalizer_is_added_after_others_when_enabled_for_delete_policy() {
        let v = pv(Some(ME), "Bound", "Delete", &[PROTECTION], false);
        assert_eq!(
            finalizer_update(&v, ME, true),
            Some(strings(&[PROTECTION, FINALIZER_PV]))
        );
        let none = pv(Some(ME), "Bound", "Delete", &[], false);
        assert_eq!(
            finalizer_update(&none, ME, true),
            Some(strings(&[FINALIZER_PV]))
        );
        // Already there: no change.
        let has = pv(
            Some(ME),
            "Bound",
            "Delete",
            &[FINALIZER_PV, PROTECTION],
            false,
        );
        assert_eq!(finalizer_update(&has, ME, true), None);
    }

    #[test]
    fn finalizer_is_not_added_to_a_pv_being_deleted() {
        let v = pv(Some(ME), "Released", "Delete", &[PROTECTION], true);
        assert_eq!(finalizer_update(&v, ME, true), None);
    }

    #[test]
    fn finalizer_is_removed_when_option_is_off_keeping_others() {
        let v = pv(
            Some(ME),
            "Bound",
            "Delete",
            &["a.example.com/x", FINALIZER_PV, PROTECTION],
            false,
        );
        assert_eq!(
            finalizer_update(&v, ME, false),
            Some(strings(&["a.example.com/x", PROTECTION]))
        );
        let only = pv(Some(ME), "Bound", "Delete", &[FINALIZER_PV], false);
        assert_eq!(finalizer_update(&only, ME, false), Some(vec![]));
        let without = pv(Some(ME), "Bound", "Delete", &[PROTECTION], false);
        assert_eq!(finalizer_update(&without, ME, false), None);
    }

    #[test]
    fn finalizer_is_removed_for_retain_and_recycle_even_when_enabled() {
        for policy in ["Retain", "Recycle"] {
            let v = pv(
                Some(ME),
                "Bound",
                policy,
                &[FINALIZER_PV, PROTECTION],
                false,
            );
            assert_eq!(finalizer_update(&v, ME, true), Some(strings(&[PROTECTION])));
        }
    }

    #[test]
    fn finalizer_is_left_alone_for_unset_policy_with_option_on() {
        let mut v = pv(Some(ME), "Bound", "Delete", &[FINALIZER_PV], false);
        v.spec.as_mut().unwrap().persistent_volume_reclaim_policy = None;
        assert_eq!(finalizer_update(&v, ME, true), None);
    }

    #[test]
    fn finalizers_of_pvs_that_are_not_ours_are_never_touched() {
        let theirs = pv(Some(OTHER), "Bound", "Delete", &[FINALIZER_PV], false);
        assert_eq!(finalizer_update(&theirs, ME, false), None);
        let theirs = pv(Some(OTHER), "Bound", "Delete", &[], false);
        assert_eq!(finalizer_update(&theirs, ME, true), None);
    }

    #[test]
    fn without_removes_every_copy_of_the_finalizer() {
        assert_eq!(without(&strings(&["a", "b", "a"]), "a"), strings(&["b"]));
        assert_eq!(without(&strings(&["b"]), "a"), strings(&["b"]));
    }
}
