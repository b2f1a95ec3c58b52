//! The HTTP port's connections (docs/serving.md, "Connections"): HTTP/1.1
//! served by hyper with the limits a port facing many clients needs.
//!
//! - A connection must deliver a whole request head within `read_timeout`
//!   of connecting or of its previous answer, or it is closed: a half-sent
//!   request and an idle keep-alive connection alike (hyper measures both
//!   from when the connection starts waiting for a request).
//! - At most `max_connections` at once. At the cap, a new connection
//!   closes the one that has waited longest for its next request (idle or
//!   half-sent); only when every connection is busy answering is the new
//!   one closed at once. So idle connections, however many, cannot lock a
//!   probe or a client out, and the worker never runs out of descriptors
//!   for them.
//! - On stop, every connection finishes its request in flight and closes.
//! - With TLS (`crate::api::tls`), the handshake too must end within
//!   `read_timeout` of connecting.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use hyper_util::rt::{TokioIo, TokioTimer};
use tower::ServiceExt;

use crate::metrics::WorkerMetrics;

/// The limits of the HTTP port.
#[derive(Debug, Clone, Copy)]
pub struct HttpLimits {
    pub read_timeout: Duration,
    pub max_connections: usize,
}

/// One connection's state, shared with the accept loop.
#[derive(Debug)]
struct Conn {
    /// Since when it has waited for its next request; `None` while it
    /// answers one.
    waiting_since: Mutex<Option<Instant>>,
    abort: tokio::task::AbortHandle,
}

impl Conn {
    fn waiting_since(&self) -> Option<Instant> {
        *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_waiting(&self, since: Option<Instant>) {
        *self.waiting_since.lock().unwrap_or_else(|p| p.into_inner()) = since;
    }
}

type Conns = Arc<Mutex<HashMap<u64, Arc<Conn>>>>;

/// Serves `router` on `listener` until `stop` turns true, then lets every
/// connection finish its request in flight.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: axum::Router,
    limits: HttpLimits,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: Arc<WorkerMetrics>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) -> std::io::Result<()> {
    let conns: Conns = Arc::default();
    let next_id = AtomicU64::new(0);
    let mut tasks = tokio::task::JoinSet::new();
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
                Err(e) => {
                    // Out of descriptors, say: wait a moment, do not spin.
                    tracing::warn!(error = %e, "accepting an HTTP connection failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stopped(&mut stop) => break,
        };
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!(error = %e, "TCP_NODELAY not set");
        }
        if !make_room(&conns, limits.max_connections, &metrics) {
            // Dropped: closed at once.
            continue;
        }
        let id = next_id.fetch_add(1, Ordering::Relaxed);
        let (router, conns2, stop, tls) =
            (router.clone(), conns.clone(), stop.clone(), tls.clone());
        let metrics2 = metrics.clone();
        let (registered_tx, registered_rx) = tokio::sync::oneshot::channel::<Arc<Conn>>();
        let abort = tasks.spawn(async move {
            let Ok(conn) = registered_rx.await else {
                return;
            };
            match tls {
                None => serve_connection(stream, router, limits, conn, stop).await,
                Some(tls) => {
                    match tokio::time::timeout(limits.read_timeout, tls.accept(stream)).await {
                        Ok(Ok(stream)) => {
                            serve_connection(stream, router, limits, conn, stop).await;
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(error = %e, "TLS handshake failed");
                            metrics2.connections_closed("http", "handshake_failed");
                        }
                        Err(_) => metrics2.connections_closed("http", "timed_out"),
                    }
                }
            }
            conns2.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
        });
        let conn = Arc::new(Conn {
            waiting_since: Mutex::new(Some(Instant::now())),
            abort,
        });
        conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(id, conn.clone());
        let _ = registered_tx.send(conn);
        // Reap finished tasks as we go.
        while tasks.try_join_next().is_some() {}
    }
    drop(listener);
    while tasks.join_next().await.is_some() {}
    Ok(())
}

/// Room for one more connection: at the cap, closes the one that has
/// waited longest for a request; `false` when every one is busy.
fn make_room(conns: &Conns, max: usize, metrics: &WorkerMetrics) -> bool {
    let mut conns = conns.lock().unwrap_or_else(|p| p.into_inner());
    if conns.len() < max {
        return true;
    }
    let oldest = conns
        .iter()
        .filter_map(|(id, c)| c.waiting_since().map(|since| (since, *id)))
        .min();
    match oldest {
        Some((_, id)) => {
            if let Some(conn) = conns.remove(&id) {
                conn.abort.abort();
            }
            metrics.connections_closed("http", "evicted");
            true
        }
        None => {
            metrics.connections_closed("http", "refused");
            false
        }
    }
}

/// Resolves once `stop` is true (or its sender is gone).
async fn stopped(stop: &mut tokio::sync::watch::Receiver<bool>) {
    let _ = stop.wait_for(|s| *s).await;
}

async fn serve_connection(
    stream: impl tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
    router: axum::Router,
    limits: HttpLimits,
    conn: Arc<Conn>,
    mut stop: tokio::sync::watch::Receiver<bool>,
) {
    let state = conn.clone();
    let service =
        hyper::service::service_fn(move |request: hyper::Request<hyper::body::Incoming>| {
            let (router, state) = (router.clone(), state.clone());
            async move {
                state.set_waiting(None);
                let answer = router.oneshot(request.map(axum::body::Body::new)).await;
                state.set_waiting(Some(Instant::now()));
                answer
            }
        });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.read_timeout)
        .keep_alive(true);
    let connection = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(connection);
    tokio::select! {
        done = connection.as_mut() => {
            if let Err(e) = done {
                tracing::debug!(error = %e, "HTTP connection ended");
            }
        }
        () = stopped(&mut stop) => {
            connection.as_mut().graceful_shutdown();
            let _ = connection.await;
        }
    }
}
