//! Whether the API server answers, logged once per change (first failure with its
//! cause, a change of cause, the return) from every outcome the client's request
//! layer sees, so retry loops need not log each attempt that fails the same way.

use std::error::Error as StdError;
use std::sync::{Arc, Mutex};

/// Why the API server could not be reached.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Cause {
    /// Nothing listens at the address (`ECONNREFUSED`).
    #[error("connection refused")]
    Refused,
    /// Connecting or answering took too long.
    #[error("timed out")]
    TimedOut,
    /// The host name does not resolve.
    #[error("DNS lookup failed")]
    Dns,
    /// The TLS handshake failed (certificate not trusted, not a TLS port, ...).
    #[error("TLS handshake failed")]
    Tls,
    /// The connection was reset or closed before an answer.
    #[error("connection closed")]
    Closed,
    /// Another connection-level failure.
    #[error("cannot connect")]
    Other,
}

/// The cause when `err` (walked through its `source()` chain) is a failure to
/// reach the API server; `None` when the server answered (an API status such
/// as 403 or 409) or the error is of another kind.
pub fn unreachable_cause(err: &(dyn StdError + 'static)) -> Option<Cause> {
    let chain: Vec<_> = std::iter::successors(Some(err), |&e| e.source()).collect();
    if chain
        .iter()
        .any(|e| matches!(e.downcast_ref(), Some(kube::Error::Api(_))))
    {
        return None;
    }
    let texts: Vec<String> = chain.iter().map(|e| e.to_string().to_lowercase()).collect();
    let any = |words: &[&str]| texts.iter().any(|t| words.iter().any(|w| t.contains(w)));
    if any(&[
        "dns error",
        "failed to lookup address",
        "name or service not known",
    ]) {
        return Some(Cause::Dns);
    }
    if any(&["certificate", "tls", "handshake"]) {
        return Some(Cause::Tls);
    }
    // The innermost I/O error's kind; an io::Error wrapping another (as
    // hyper-rustls does) hides it from `source()`, so look inside too.
    let io_kind = chain.iter().rev().find_map(|e| {
        let mut io = e.downcast_ref::<std::io::Error>()?;
        while let Some(inner) = io
            .get_ref()
            .and_then(|i| i.downcast_ref::<std::io::Error>())
        {
            io = inner;
        }
        Some(io.kind())
    });
    if let Some(kind) = io_kind {
        use std::io::ErrorKind as K;
        return Some(match kind {
            K::ConnectionRefused => Cause::Refused,
            K::TimedOut => Cause::TimedOut,
            // rustls' alerts and garbled records reach us as InvalidData.
            K::InvalidData => Cause::Tls,
            K::ConnectionReset
            | K::ConnectionAborted
            | K::BrokenPipe
            | K::UnexpectedEof
            | K::NotConnected => Cause::Closed,
            _ => Cause::Other,
        });
    }
    if any(&["connection closed", "connection reset"]) {
        return Some(Cause::Closed);
    }
    any(&["client error (connect)", "tcp connect error"]).then_some(Cause::Other)
}

/// Log the failed call `what` (e.g. "lease renewal failed") about `object`: at debug level
/// when the API server is unreachable (the client's request layer logs that once), else as
/// a warning.
pub fn log_failure(object: &str, what: &str, error: &(dyn StdError + 'static)) {
    if unreachable_cause(error).is_some() {
        tracing::debug!(object, error = %error, "{what}");
    } else {
        tracing::warn!(object, error = %error, "{what}");
    }
}

/// The API server's reachability as the client last saw it (`Some`: unreachable, with
/// its cause); cheap to clone (clones share it).
#[derive(Clone, Debug)]
pub struct ApiReachability {
    server: Arc<str>,
    down: Arc<Mutex<Option<Cause>>>,
}

impl ApiReachability {
    /// Track the API server at `server` (its URL, for the log lines).
    pub fn new(server: impl Into<String>) -> Self {
        Self {
            server: server.into().into(),
            down: Arc::default(),
        }
    }

    fn down(&self) -> std::sync::MutexGuard<'_, Option<Cause>> {
        self.down.lock().expect("reachability poisoned")
    }

    /// The server answered a request (any HTTP status). Logs its return when it was
    /// unreachable; `true` then.
    pub fn answered(&self) -> bool {
        let returned = self.down().take().is_some();
        if returned {
            tracing::info!(api_server = %self.server, "API server reachable again");
        }
        returned
    }

    /// A request failed with `err`. When that is a failure to reach the
    /// server ([`unreachable_cause`]), logs the first one and each change of
    /// cause (with the address and the error), and returns the cause it logged.
    pub fn failed(&self, err: &(dyn StdError + 'static)) -> Option<Cause> {
        let cause = unreachable_cause(err)?;
        if self.down().replace(cause) == Some(cause) {
            return None;
        }
        tracing::warn!(
            api_server = %self.server,
            cause = %cause,
            error = %crate::runtime::telemetry::error_chain(err),
            "API server unreachable; retrying (logged again when the cause changes or it answers)"
        );
        Some(cause)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    /// A client of `url` without retries, as the services build it.
    fn client(url: &str) -> kube::Client {
        let mut config = kube::Config::new(url.parse().unwrap());
        config.connect_timeout = Some(Duration::from_secs(5));
        crate::runtime::kube_client::build_client(config, 0.0, 0, None).unwrap()
    }

    async fn cause_of(url: &str) -> Option<Cause> {
        let err = client(url).apiserver_version().await.unwrap_err();
        unreachable_cause(&err)
    }

    #[tokio::test]
    async fn causes_of_real_connection_failures() {
        let port = {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            l.local_addr().unwrap().port()
        };
        assert_eq!(
            cause_of(&format!("https://127.0.0.1:{port}")).await,
            Some(Cause::Refused)
        );
        assert_eq!(
            cause_of("https://no-such-host.invalid:6443").await,
            Some(Cause::Dns)
        );
        // A plain-TCP peer where TLS is expected.
        let plain = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = plain.local_addr().unwrap();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
            while let Ok((mut s, _)) = plain.accept().await {
                let mut buf = [0u8; 512];
                let _ = s.read(&mut buf).await;
                let _ = s.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
            }
        });
        assert_eq!(cause_of(&format!("https://{addr}")).await, Some(Cause::Tls));
    }

    #[test]
    fn an_api_status_is_an_answer_not_an_outage() {
        let status = kube::core::Status::failure("forbidden", "Forbidden").with_code(403);
        let err = kube::Error::Api(Box::new(status));
        assert_eq!(unreachable_cause(&err), None);
        let own_timeout = kube::Error::Service("lease read timed out".into());
        assert_eq!(unreachable_cause(&own_timeout), None);
    }

    #[test]
    fn logs_once_per_change_not_per_retry() {
        let reach = ApiReachability::new("https://10.0.0.1:6443");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        let timeout = std::io::Error::from(std::io::ErrorKind::TimedOut);
        assert!(!reach.answered(), "first answer: nothing to report");
        assert_eq!(reach.failed(&refused), Some(Cause::Refused));
        assert_eq!(reach.failed(&refused), None, "same cause: quiet");
        assert_eq!(reach.failed(&timeout), Some(Cause::TimedOut));
        assert_eq!(reach.failed(&timeout), None);
        assert!(reach.answered());
        assert!(!reach.answered());
        let other = std::io::Error::other("not a connection problem");
        let not_io = kube::Error::Service("boom".into());
        assert_eq!(reach.failed(&not_io), None, "not an outage");
        assert_eq!(reach.failed(&other), Some(Cause::Other));
    }
}
