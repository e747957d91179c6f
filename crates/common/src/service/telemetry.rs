//! `tracing` setup: text or JSON lines on stderr, filtered by `--log-level`.

use tracing_subscriber::EnvFilter;

use crate::service::config::LogFormat;

/// Install the global subscriber. `filter` uses EnvFilter syntax (`info`,
/// `debug,kube=warn`); an invalid filter falls back to `info` with a warning.
/// Calling it twice is harmless (the second call is ignored).
pub fn init(format: LogFormat, filter: &str) {
    let (env_filter, bad) = match EnvFilter::try_new(filter) {
        Ok(f) => (f, None),
        Err(e) => (EnvFilter::new("info"), Some(e.to_string())),
    };
    let builder = tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr);
    let result = match format {
        LogFormat::Text => builder.try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
    if result.is_ok() {
        if let Some(err) = bad {
            tracing::warn!(filter, error = %err, "invalid --log-level, using info");
        }
    }
}
