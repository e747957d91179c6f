//! Process harness for end-to-end runs: the service binaries (built with
//! cargo when missing or stale), a private `redis-server` with AOF, the
//! in-process API-server simulator, service processes with log files and
//! kill/restart, bounded waits, `/metrics` scraping, and cleanup on drop so no
//! process outlives a test, the demo or the benchmark.
//!
//! ```no_run
//! # async fn demo() -> anyhow::Result<()> {
//! use e2e::harness::{System, SystemOptions};
//! use std::time::Duration;
//! let sys = System::start(SystemOptions::default()).await?;
//! sys.create_storage_class("hostpath", "Immediate", &[]).await?;
//! let claims = sys.create_claims("data", 20, "hostpath").await?;
//! sys.wait_provisioned(20, Duration::from_secs(30)).await?;
//! sys.delete_claims(&claims).await?;
//! sys.wait_reclaimed(Duration::from_secs(30)).await?;
//! # Ok(()) }
//! ```

pub mod api_plane;
pub mod binaries;
pub mod metrics;
pub mod peers;
pub mod plane;
pub mod process;
pub mod pv_writer;
pub mod rbac;
pub mod redis;
pub mod sentinel;
pub mod services;
pub mod system;
pub mod wait;

pub use api_plane::ApiPlane;
pub use binaries::{Binaries, Profile};
pub use metrics::MetricsPage;
pub use plane::{ControlPlane, Outage, Plane, RealPlane};
pub use process::ManagedProcess;
pub use redis::{RedisSecurity, RedisServer};
pub use sentinel::RedisSentinels;
pub use services::{Service, ServiceProcess, ServiceSettings, NFS_TEST_EXPORT, NFS_TEST_SERVER};
pub use system::{count_dirs, System, SystemOptions};
pub use wait::{wait_eq, wait_for, wait_until};
