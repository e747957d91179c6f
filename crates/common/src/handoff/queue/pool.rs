//! The queue's own connections to the primary ([`Dedicated`]): commands that block their
//! connection until they answer never stall the shared one. They go to the shared
//! connection's primary, so they follow it after a failover.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redis::aio::MultiplexedConnection;

use crate::handoff::redis_conn::ANSWER_TIMEOUT;

/// Connections of the queue's own to the primary: the one blocking on the wake-up list (with
/// its answer timeout), and the idle ones of enqueues (`WAITAOF` and `WAIT` hold their
/// connection until they answer, so each enqueue uses one nothing else uses meanwhile).
#[derive(Clone, Default)]
pub(super) struct Dedicated {
    pub(super) waker: Arc<tokio::sync::Mutex<Option<(Pooled, Duration)>>>,
    /// Idle enqueue connections, each with the shared connection's number when it was made.
    /// Dropped all at once by bumping the generation: older ones are not given back.
    idle: Arc<Mutex<(u64, Vec<Pooled>)>>,
}

/// A dedicated connection and the number of the shared connection it followed
/// ([`RedisConn::primary`](crate::handoff::redis_conn::RedisConn::primary)).
pub(super) type Pooled = (u64, MultiplexedConnection);

/// Most idle enqueue connections kept (one per concurrent enqueue is made).
const IDLE_ENQUEUE_CONNECTIONS: usize = 32;

impl Dedicated {
    /// An idle enqueue connection (true) or a new one (false) to `primary` (the shared
    /// connection's), and the pool's generation; idle ones that followed an older shared
    /// connection are dropped.
    pub(super) async fn take(
        &self,
        primary: (u64, redis::Client),
    ) -> redis::RedisResult<(Pooled, bool, u64)> {
        let (generation, idle) = {
            let mut idle = self.idle.lock().expect("not poisoned");
            idle.1.retain(|(number, _)| *number == primary.0);
            (idle.0, idle.1.pop())
        };
        match idle {
            Some(conn) => Ok((conn, true, generation)),
            None => Ok((open(primary, ANSWER_TIMEOUT).await?, false, generation)),
        }
    }

    /// Keep `conn`, taken in `generation`, for the next enqueue (up to
    /// [`IDLE_ENQUEUE_CONNECTIONS`]) unless the pool was dropped since.
    pub(super) fn give_back(&self, conn: Pooled, generation: u64) {
        let mut idle = self.idle.lock().expect("not poisoned");
        if idle.0 == generation && idle.1.len() < IDLE_ENQUEUE_CONNECTIONS {
            idle.1.push(conn);
        }
    }

    /// Drop every idle connection, and those in use when they come back.
    pub(super) fn drop_all(&self) {
        let mut idle = self.idle.lock().expect("not poisoned");
        idle.0 += 1;
        idle.1.clear();
    }
}

/// A new connection to `primary` (the shared connection's number, a client) whose
/// commands answer within `answer`.
pub(super) async fn open(
    (number, client): (u64, redis::Client),
    answer: Duration,
) -> redis::RedisResult<Pooled> {
    let config = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(Duration::from_secs(2)))
        .set_response_timeout(Some(answer));
    let conn = client.get_multiplexed_async_connection_with_config(&config);
    Ok((number, conn.await?))
}
