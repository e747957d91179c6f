//! End-to-end test support: the API-server simulator, the process harness and
//! a real Kubernetes control plane (`realkube`, envtest-style).

pub mod bench;
pub mod harness;
pub mod realkube;
pub mod sim;
