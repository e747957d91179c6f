//! `tracing` setup: text or JSON lines on stderr, filtered by `--log-level`.
//! Text is coloured only when stderr is a terminal (`kubectl logs` and log
//! files get plain text).

use std::io::IsTerminal as _;

use tracing_subscriber::EnvFilter;

use crate::runtime::config::LogFormat;

/// kube's client logs every failed request at error level ("failed with error client error
/// (Connect)", once per retry, without the address); [`crate::runtime::api_reachability`] logs an
/// unreachable API server once per change instead, and the callers log their other failures.
pub const QUIET_BY_DEFAULT: &str = "kube_client::client::builder=off";

/// `filter` plus [`QUIET_BY_DEFAULT`], unless `filter` names kube's client.
pub fn effective_filter(filter: &str) -> String {
    if filter.contains("kube_client") {
        filter.to_string()
    } else {
        format!("{filter},{QUIET_BY_DEFAULT}")
    }
}

/// Install the global subscriber. `filter` uses EnvFilter syntax (`info`, `debug,kube=warn`; see
/// [`effective_filter`]); an invalid filter falls back to `info` with a warning. Calling it twice
/// is harmless (the second call is ignored).
pub fn init(format: LogFormat, filter: &str) {
    let parsed = EnvFilter::try_new(effective_filter(filter));
    let bad = parsed.as_ref().err().map(ToString::to_string);
    let builder = tracing_subscriber::fmt()
        .with_env_filter(parsed.unwrap_or_else(|_| EnvFilter::new(effective_filter("info"))))
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if let (Ok(()), Some(err)) = (result, bad) {
        tracing::warn!(filter, error = %err, "invalid --log-level, using info");
    }
}

/// `err` and its `source()` chain as one line, `a: b: c`, leaving out a
/// source whose text its parent already shows (errors that print their
/// cause and also return it as `source()`).
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut last = text.clone();
    for e in std::iter::successors(err.source(), |&e| e.source()) {
        let msg = e.to_string();
        if !msg.is_empty() && !last.contains(&msg) {
            text = format!("{text}: {msg}");
        }
        last = msg;
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("cannot connect to Redis at redis://h:1: {0}")]
    struct Connect(#[source] std::io::Error);

    #[test]
    fn kube_clients_per_request_error_is_off_unless_asked_for() {
        assert_eq!(
            effective_filter("info"),
            "info,kube_client::client::builder=off"
        );
        assert_eq!(
            effective_filter("debug,kube_client=trace"),
            "debug,kube_client=trace"
        );
        assert!(EnvFilter::try_new(effective_filter("debug,kube=warn")).is_ok());
    }

    #[test]
    fn error_chain_shows_each_cause_once() {
        let io = std::io::Error::new(std::io::ErrorKind::ConnectionRefused, "Connection refused");
        let err = anyhow::Error::new(Connect(io)).context("connecting to the queue");
        assert_eq!(format!("{err:#}").matches("Connection refused").count(), 2);
        assert_eq!(
            error_chain(err.as_ref()),
            "connecting to the queue: cannot connect to Redis at redis://h:1: Connection refused"
        );
        let plain = std::io::Error::other("boom");
        assert_eq!(error_chain(&plain), "boom");
    }
}
