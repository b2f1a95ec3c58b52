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
        let (router, conns2, stop) = (router.clone(), conns.clone(), stop.clone());
        let (registered_tx, registered_rx) = tokio::sync::oneshot::channel::<Arc<Conn>>();
        let abort = tasks.spawn(async move {
            let Ok(conn) = registered_rx.await else {
                return;
            };
            serve_connection(stream, router, limits, conn, stop).await;
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
    stream: tokio::net::TcpStream,
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

/// The gRPC port's connections (docs/serving.md, "Connections"): at most
/// `max` at once (one more is closed at once: HTTP/2 clients keep their
/// connections open, so none is taken for idle), and each must send the
/// HTTP/2 preface within `preface_timeout` or it is closed (a half-sent
/// connection holds nothing for long). Accepts until the server drops the
/// stream.
pub fn guarded_grpc_incoming(
    listener: tokio::net::TcpListener,
    max: usize,
    preface_timeout: Duration,
    metrics: Arc<WorkerMetrics>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Counted>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let live = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        loop {
            let stream = tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tx.closed() => return,
            };
            if live.fetch_add(1, Ordering::AcqRel) >= max {
                live.fetch_sub(1, Ordering::AcqRel);
                metrics.connections_closed("grpc", "refused");
                continue;
            }
            // An HTTP/2 response is several small writes (headers, data,
            // trailers): Nagle's algorithm would hold the last one for the
            // client's delayed ACK (40 ms).
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let counted = Counted {
                stream,
                live: live.clone(),
            };
            let (tx, metrics) = (tx.clone(), metrics.clone());
            tokio::spawn(async move {
                if tokio::time::timeout(preface_timeout, preface(&counted.stream))
                    .await
                    .is_ok_and(|sent| sent)
                {
                    let _ = tx.send(Ok(counted)).await;
                } else {
                    metrics.connections_closed("grpc", "timed_out");
                }
            });
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// Whether the peer sent the 24 bytes of HTTP/2's connection preface
/// (left unread for the server).
async fn preface(stream: &tokio::net::TcpStream) -> bool {
    let mut buf = [0u8; 24];
    loop {
        match stream.peek(&mut buf).await {
            Ok(n) if n >= buf.len() => return true,
            Ok(0) | Err(_) => return false,
            // Part of it: peek again once more has come.
            Ok(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

/// A gRPC connection that counts itself out when it closes.
#[derive(Debug)]
pub struct Counted {
    stream: tokio::net::TcpStream,
    live: Arc<std::sync::atomic::AtomicUsize>,
}

impl Drop for Counted {
    fn drop(&mut self) {
        self.live.fetch_sub(1, Ordering::AcqRel);
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.stream.connect_info()
    }
}
