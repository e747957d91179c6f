//! The Kubernetes API calls provision-svc makes, for the deploy manifests' RBAC
//! check. Keep exact: add a line here with every new call.

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every resource provision-svc touches and the verbs it uses.
///
/// * claims: list/watch (reflector), patch (reschedule removes the selected node);
/// * PVs and StorageClasses: list/watch (reflectors);
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
        verbs: &["list", "watch"],
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
