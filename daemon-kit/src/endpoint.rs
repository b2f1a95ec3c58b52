//! The operator's HTTP endpoints, the same on both daemons: `GET /metrics`
//! (OpenMetrics text), `GET /healthz` (liveness) and `GET /readyz`
//! (readiness). A probe answers 200 (`ok`, `ready`) or 503 with the reason
//! on one line.

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::http::{header, StatusCode};
use axum::routing::get;
use axum::Router;

/// What the endpoints ask of a daemon.
pub trait Probes: Send + Sync + 'static {
    /// Every metric, as OpenMetrics text.
    fn metrics(&self) -> String;
    /// `Err` with the line `/readyz` answers ("not ready: ...").
    fn readiness(&self) -> Result<(), String>;
    /// The line `/readyz` answers when ready.
    fn ready_line(&self) -> String {
        "ready".into()
    }
    /// `Err` with the line `/healthz` answers ("not live: ...").
    fn liveness(&self) -> Result<(), String>;
}

fn answer(result: Result<(), String>, ok: &str) -> (StatusCode, String) {
    match result {
        Ok(()) => (StatusCode::OK, format!("{ok}\n")),
        Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
    }
}

/// The three routes, to serve alone ([`serve`]) or beside a daemon's own.
pub fn routes<S: Clone + Send + Sync + 'static>(probes: Arc<dyn Probes>) -> Router<S> {
    let (for_ready, for_live) = (probes.clone(), probes.clone());
    Router::new()
        .route(
            "/metrics",
            get(move || async move {
                (
                    [(header::CONTENT_TYPE, crate::metrics::CONTENT_TYPE)],
                    probes.metrics(),
                )
            }),
        )
        .route(
            "/healthz",
            get(move || async move { answer(for_live.liveness(), "ok") }),
        )
        .route(
            "/readyz",
            get(move || async move { answer(for_ready.readiness(), &for_ready.ready_line()) }),
        )
}

/// Serves the three routes on `addr` from the runtime of `handle`. The
/// address is bound before this returns, so a taken port is a start-up
/// error naming `key` (the setting to change), not a log line.
pub fn serve(
    addr: SocketAddr,
    key: &str,
    probes: Arc<dyn Probes>,
    handle: &tokio::runtime::Handle,
) -> anyhow::Result<tokio::task::JoinHandle<()>> {
    let listener = std::net::TcpListener::bind(addr)
        .with_context(|| format!("binding the metrics address {addr}: choose another {key}"))?;
    listener.set_nonblocking(true)?;
    let _guard = handle.enter();
    let listener = tokio::net::TcpListener::from_std(listener)?;
    let app: Router = routes(probes);
    tracing::info!(%addr, "metrics endpoint listening");
    Ok(handle.spawn(async move {
        if let Err(e) = axum::serve(listener, app).await {
            tracing::error!(error = %e, "metrics endpoint stopped");
        }
    }))
}
