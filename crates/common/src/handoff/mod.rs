//! The durable store: everything the services keep in Redis, and the only
//! code that talks to Redis (one operation per state transition).
//!
//! * [`queue`] — the durable PV-write queue shared by provision-svc and pv-writer;
//! * [`intents`] — durable provisioning intents;
//! * [`data_marker`] — detects a Redis that lost its data;
//! * [`queue_auth`] — HMAC authenticity of queue entries and the queue-key flags;
//! * [`orphan_report`] — the last orphan sweep's report (for `provisioner-ctl status`);
//! * [`redis_store`] — the Redis flags, the connection and the per-provisioner key prefix;
//! * [`redis_conn`] — the shared connection, following a Sentinel failover;
//! * [`reachability`] — the `redis_reachable` gauge.

pub mod data_marker;
pub mod intents;
pub mod orphan_report;
pub mod queue;
pub mod queue_auth;
pub mod reachability;
pub mod redis_conn;
pub mod redis_store;
#[cfg(any(test, feature = "testing"))]
pub mod test_redis;
