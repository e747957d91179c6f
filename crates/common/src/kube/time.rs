//! Wall-clock helpers shared by the services.

use std::time::{SystemTime, UNIX_EPOCH};

/// Milliseconds since the Unix epoch, now (wall clock; 0 if the clock is set
/// before 1970). Used for every persisted timestamp (queue scores, intents,
/// dead letters), so all services agree on the unit.
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn now_ms_is_milliseconds_since_the_epoch() {
        let before = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let now = now_ms();
        let after = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert!(
            before <= now && now <= after,
            "{before} <= {now} <= {after}"
        );
    }
}
