//! The Kubernetes API calls pv-writer makes, for the RBAC check of the deploy
//! manifests (see [`api_types::api_calls`]).

use api_types::api_calls::{ApiCall, EVENT_CALLS, LEASE_CALLS};

/// Every call pv-writer makes: PVs create and get (an existing PV's claim uid
/// on `AlreadyExists`), claims get (the entry's claim still there), events,
/// its Lease.
pub const API_CALLS: &[ApiCall] = &[
    ApiCall::cluster("", "persistentvolumes", &["get", "create"]),
    ApiCall::cluster("", "persistentvolumeclaims", &["get"]),
    EVENT_CALLS,
    LEASE_CALLS,
];
