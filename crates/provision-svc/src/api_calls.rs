//! The Kubernetes API calls provision-svc makes, for the deploy manifests' RBAC
//! check. Keep exact: add a line here with every new call.

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every call provision-svc makes: claims list/watch/patch (a one-name list
/// confirms a claim gone) and their status (expansion), PVs list/watch/get (live checks)
/// and patch (expansion), StorageClasses list/watch, nodes get, events, its Lease.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall::cluster("", "persistentvolumeclaims", &["list", "watch", "patch"]),
    ApiCall::cluster("", "persistentvolumeclaims/status", &["patch"]),
    ApiCall::cluster("", "persistentvolumes", &["get", "list", "watch", "patch"]),
    ApiCall::cluster("storage.k8s.io", "storageclasses", &["list", "watch"]),
    ApiCall::cluster("", "nodes", &["get"]),
    EVENT_CALLS,
    LEASE_CALLS,
];
