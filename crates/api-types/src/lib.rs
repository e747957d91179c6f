//! Plain data shared across the provisioner services, no I/O: the names the seed
//! controller reads and writes on Kubernetes objects, each service's API calls,
//! and the versioned schema of the records kept in Redis.

pub mod annotations;
pub mod api_calls;
pub mod queue;

pub use annotations::*;
