//! One sync or cleanup at a time per claim: [`ClaimLocks`], so a gone
//! claim's cleanup never overlaps a provision attempt of the same claim.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use tokio::sync::{Mutex as AsyncMutex, OwnedMutexGuard};

/// Per-claim-uid async locks; an entry lives while someone holds or awaits it.
#[derive(Default)]
pub struct ClaimLocks(Mutex<HashMap<String, Arc<AsyncMutex<()>>>>);

/// The lock of one claim uid, released (and its entry dropped if unused) on drop.
pub struct ClaimGuard<'a> {
    locks: &'a ClaimLocks,
    uid: String,
    guard: Option<OwnedMutexGuard<()>>,
}

impl ClaimLocks {
    fn map(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<AsyncMutex<()>>>> {
        self.0.lock().expect("claim locks poisoned")
    }

    /// Wait for, then hold, the lock of the claim `uid`.
    pub async fn lock(&self, uid: &str) -> ClaimGuard<'_> {
        let lock = self.map().entry(uid.to_string()).or_default().clone();
        ClaimGuard {
            locks: self,
            uid: uid.to_string(),
            guard: Some(lock.lock_owned().await),
        }
    }
}

impl Drop for ClaimGuard<'_> {
    fn drop(&mut self) {
        drop(self.guard.take());
        let mut map = self.locks.map();
        // Only the map holds it now: nobody waits (a waiter clones under this lock).
        if map
            .get(&self.uid)
            .is_some_and(|l| Arc::strong_count(l) == 1)
        {
            map.remove(&self.uid);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn one_holder_per_uid_and_no_entry_left_behind() {
        let locks = Arc::new(ClaimLocks::default());
        let held = locks.lock("a").await;
        let _other = locks.lock("b").await;
        let waiter = {
            let locks = locks.clone();
            tokio::spawn(async move {
                let _g = locks.lock("a").await;
            })
        };
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(!waiter.is_finished(), "the second holder of \"a\" waits");
        drop(held);
        waiter.await.unwrap();
        assert_eq!(locks.map().len(), 1, "only \"b\" is still held");
        drop(_other);
        assert!(locks.map().is_empty());
    }
}
