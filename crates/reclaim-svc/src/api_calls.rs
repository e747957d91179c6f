//! The Kubernetes API calls reclaim-svc makes, for the deploy manifests' RBAC
//! check; keep in step with `controller`, `finalizer`, `operation`, events and the Lease.

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every API call of reclaim-svc.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall::cluster(
        "",
        "persistentvolumes",
        &["get", "list", "watch", "patch", "delete"],
    ),
    ApiCall::cluster("storage.k8s.io", "storageclasses", &["get"]),
    EVENT_CALLS,
    LEASE_CALLS,
];
