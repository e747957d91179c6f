//! Graceful shutdown: SIGTERM or SIGINT cancel a token that the service's work
//! loops watch.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// Cancel `token` on the first SIGTERM or SIGINT. Spawns a task; returns at once.
pub fn cancel_on_signal(token: CancellationToken) {
    tokio::spawn(async move {
        let Ok(mut term) = signal(SignalKind::terminate())
            .inspect_err(|err| tracing::error!(error = %err, "cannot listen for SIGTERM"))
        else {
            return;
        };
        tokio::select! {
            _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
            _ = tokio::signal::ctrl_c() => tracing::info!("SIGINT received, shutting down"),
        }
        token.cancel();
    });
}
