//! End-to-end test support: the API-server simulator and process harness.

pub mod harness;
pub mod realkube;
pub mod sim;
