//! The Kubernetes API calls provision-svc makes, for the deploy manifests' RBAC
//! check. Keep exact: add a line here with every new call.

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every resource provision-svc touches and the verbs it uses.
///
/// * claims: list/watch (reflector; a list limited to one name confirms a
///   deleted claim is gone before its unwritten volume is deleted), patch
///   (reschedule removes the selected node);
/// * PVs: list/watch (reflector), get (the start-up walk's live check that a
///   deleted claim's PV really does not exist before its asset is deleted);
/// * StorageClasses: list/watch (reflector);
/// * nodes: get (selected node lookup on demand);
/// * events (on claims) and the Lease.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall {
        group: "",
        resource: "persistentvolumeclaims",
        verbs: &["list", "watch", "patch"],
        namespaced: false,
    },
    ApiCall {
        group: "",
        resource: "persistentvolumes",
        verbs: &["get", "list", "watch"],
        namespaced: false,
    },
    ApiCall {
        group: "storage.k8s.io",
        resource: "storageclasses",
        verbs: &["list", "watch"],
        namespaced: false,
    },
    ApiCall {
        group: "",
        resource: "nodes",
        verbs: &["get"],
        namespaced: false,
    },
    EVENT_CALLS,
    LEASE_CALLS,
];
