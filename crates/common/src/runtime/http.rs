//! The per-service HTTP server: Prometheus `/metrics` (path configurable),
//! `/healthz` (the work loop makes progress and a leader can renew its Lease:
//! [`crate::runtime::health`]) and `/readyz` (ready to serve its role).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use std::future::ready;

use axum::http::{header::CONTENT_TYPE, StatusCode};
use axum::routing::get;
use axum::Router;
use prometheus::Registry;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use crate::runtime::health::Liveness;

/// Readiness as `/readyz` reports it: ready while standing by, and as leader
/// once the work loop says so; never while recovering from a lost Lease
/// ([`set_lost`](Self::set_lost)). Clones share one state.
#[derive(Clone, Debug, Default)]
pub struct Readiness {
    leading: Arc<AtomicBool>,
    work_ready: Arc<AtomicBool>,
    lost: Arc<AtomicBool>,
}

impl Readiness {
    /// Record whether this replica currently leads (and so must have work ready).
    pub fn set_leading(&self, leading: bool) {
        self.leading.store(leading, Ordering::SeqCst);
        if !leading {
            self.work_ready.store(false, Ordering::SeqCst);
        }
    }

    /// Called by the work loop: caches synced and dependencies reachable (true),
    /// or a dependency lost (false).
    pub fn set_ready(&self, ready: bool) {
        self.work_ready.store(ready, Ordering::SeqCst);
    }

    /// Set by the runtime when a leader term ended with the Lease lost, and
    /// cleared once the Lease can be read again or this replica leads again:
    /// not ready in between, whatever the other flags say.
    pub fn set_lost(&self, lost: bool) {
        self.lost.store(lost, Ordering::SeqCst);
    }

    /// What `/readyz` answers: not recovering from a lost Lease, and standing
    /// by or leading with work ready.
    pub fn is_ready(&self) -> bool {
        !self.lost.load(Ordering::SeqCst)
            && (!self.leading.load(Ordering::SeqCst) || self.work_ready.load(Ordering::SeqCst))
    }
}

/// The router: `metrics_path` → text exposition, `/healthz` → 200 `ok` or 503
/// with the reason ([`Liveness::check`]), `/readyz` → 200 `ok` or 503 `not ready`.
pub fn router(
    registry: Registry,
    readiness: Readiness,
    liveness: Liveness,
    metrics_path: &str,
) -> Router {
    let text = [(CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")];
    let metrics = move || ready((text, crate::runtime::metrics::render(&registry)));
    let answer = |check: Result<(), String>| {
        ready(
            check
                .map(|()| "ok")
                .map_err(|why| (StatusCode::SERVICE_UNAVAILABLE, why)),
        )
    };
    let healthz = move || answer(liveness.check().map_err(|why| why.to_string()));
    let readyz = move || answer(readiness.is_ready().then_some(()).ok_or("not ready".into()));
    Router::new()
        .route(metrics_path, get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
}

/// Bind `addr` and serve `router` until `shutdown` is cancelled. Returns the bound address (useful
/// with port 0) and the server task. Errors: the address cannot be bound.
pub async fn serve(
    addr: SocketAddr,
    router: Router,
    shutdown: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let local = listener.local_addr()?;
    let task = tokio::spawn(async move {
        let result = axum::serve(listener, router)
            .with_graceful_shutdown(async move { shutdown.cancelled().await })
            .await;
        if let Err(err) = result {
            tracing::error!(error = %err, "HTTP server failed");
        }
    });
    Ok((local, task))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HTTP status of GET `path`.
    async fn status(addr: SocketAddr, path: &str) -> u16 {
        get_text(addr, path).await.0
    }

    /// `app` served on a free local port: its address, the stop and the server task.
    async fn serving(app: Router) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
        let stop = CancellationToken::new();
        let local = "127.0.0.1:0".parse().unwrap();
        let (addr, task) = serve(local, app, stop.clone()).await.unwrap();
        (addr, stop, task)
    }

    async fn get_text(addr: SocketAddr, path: &str) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split("\r\n\r\n").nth(1).unwrap_or_default().to_string();
        (status, body)
    }

    #[tokio::test]
    async fn serves_metrics_health_and_readiness() {
        let registry = Registry::new();
        let g = crate::runtime::metrics::gauge(&registry, "queue_depth", "test gauge");
        g.set(7);
        let readiness = Readiness::default();
        let (addr, stop, task) = serving(router(
            registry,
            readiness.clone(),
            Liveness::default(),
            "/custom-metrics",
        ))
        .await;

        let (code, body) = get_text(addr, "/custom-metrics").await;
        assert_eq!(code, 200);
        assert!(body.contains("# TYPE queue_depth gauge"), "{body}");
        assert!(body.contains("queue_depth 7"), "{body}");
        assert_eq!(status(addr, "/healthz").await, 200);

        // Standing by: ready. Leading without synced work: not ready. Then ready.
        assert_eq!(status(addr, "/readyz").await, 200);
        readiness.set_leading(true);
        assert_eq!(
            get_text(addr, "/readyz").await,
            (503, "not ready".to_string())
        );
        readiness.set_ready(true);
        assert_eq!(status(addr, "/readyz").await, 200);
        readiness.set_leading(false);
        readiness.set_leading(true);
        assert_eq!(
            status(addr, "/readyz").await,
            503,
            "losing the lead resets work readiness"
        );

        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test]
    async fn healthz_turns_503_when_the_work_loop_stops_beating() {
        use std::time::Duration;
        let liveness = Liveness::new(
            Duration::from_millis(200),
            Duration::from_secs(60),
            Duration::ZERO,
        );
        let (addr, stop, task) = serving(router(
            Registry::new(),
            Readiness::default(),
            liveness.clone(),
            "/metrics",
        ))
        .await;
        liveness.set_working(true);
        // A loop that beats (busy or idle) stays healthy past the stall timeout.
        for _ in 0..4 {
            liveness.heartbeat().beat();
            tokio::time::sleep(Duration::from_millis(100)).await;
            assert_eq!(status(addr, "/healthz").await, 200);
        }
        // The loop pauses: no beat for longer than the stall timeout.
        tokio::time::sleep(Duration::from_millis(300)).await;
        let (code, body) = get_text(addr, "/healthz").await;
        assert_eq!(code, 503);
        assert!(body.contains("work loop stalled"), "{body}");
        liveness.heartbeat().beat();
        assert_eq!(status(addr, "/healthz").await, 200, "beats again: healthy");
        stop.cancel();
        task.await.unwrap();
    }
}
