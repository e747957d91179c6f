//! Plain data shared across the provisioner services.
//!
//! Nothing in this crate performs I/O. It holds the names the seed controller
//! (sig-storage-lib-external-provisioner v8) reads and writes on Kubernetes
//! objects, the API calls each service declares, and the versioned schema of
//! the records kept in Redis ([`queue::QueuedPvWrite`],
//! [`queue::ProvisionIntent`]). The backend contract (options, states, errors)
//! lives in the `provisioner-api` crate.

pub mod annotations;
pub mod api_calls;
pub mod queue;

pub use annotations::*;
