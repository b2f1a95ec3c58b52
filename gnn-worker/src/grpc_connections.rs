//! The gRPC port's connections (docs/serving.md, "Connections"): bounded
//! like the HTTP port's, in the accept loop, beneath tonic.
//!
//! - A new connection must send HTTP/2's 24-byte preface within
//!   `preface_timeout` (`http_read_timeout_s`), or it is closed: a
//!   half-sent connection holds nothing for long. With TLS
//!   (`crate::tls`), its handshake must end within that time instead.
//! - At most `max` at once. At the cap, a new connection closes the one
//!   silent longest (no byte either way), if it has been silent at least
//!   `preface_timeout`: an idle HTTP/2 connection is a client's to keep
//!   while there is room, and gRPC clients reconnect by themselves. When
//!   none has been silent that long, the new one is closed at once.
//! - Every close is counted in `gnn_worker_connections_closed_total{port=
//!   "grpc", why}`: `timed_out`, `evicted`, `refused`, `handshake_failed`
//!   (TLS: no or a wrong client certificate, not TLS at all).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

use crate::metrics::WorkerMetrics;

/// One connection's state, shared with the accept loop.
#[derive(Debug)]
struct ConnState {
    /// When a byte last went either way, in ms since [`Registry::base`].
    last_io_ms: AtomicU64,
    /// Set by the accept loop to close the connection: its next read is
    /// the end of the stream.
    evicted: AtomicBool,
    /// The connection's reader, woken on eviction.
    reader: AtomicWaker,
}

/// The connections the port holds now, by id.
#[derive(Debug)]
struct Registry {
    base: Instant,
    conns: Mutex<HashMap<u64, Arc<ConnState>>>,
}

impl Registry {
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    /// Room for one more connection: at the cap, evicts the one silent
    /// longest if it has been silent at least `min_silence`; `false` when
    /// none has.
    fn make_room(&self, max: usize, min_silence: Duration, metrics: &WorkerMetrics) -> bool {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns.len() < max {
            return true;
        }
        let now = self.now_ms();
        let quietest = conns
            .iter()
            .map(|(id, c)| (c.last_io_ms.load(Ordering::Relaxed), *id))
            .min()
            .filter(|(last, _)| now.saturating_sub(*last) >= min_silence.as_millis() as u64);
        match quietest.and_then(|(_, id)| conns.remove(&id)) {
            Some(conn) => {
                conn.evicted.store(true, Ordering::Release);
                conn.reader.wake();
                metrics.connections_closed("grpc", "evicted");
                true
            }
            None => {
                metrics.connections_closed("grpc", "refused");
                false
            }
        }
    }
}

/// Accepts gRPC connections on `listener` within the limits above, until
/// the server drops the stream.
/// With `tls`, a connection must end its TLS handshake within
/// `preface_timeout` instead of sending the plaintext preface.
pub fn guarded_incoming(
    listener: tokio::net::TcpListener,
    max: usize,
    preface_timeout: Duration,
    tls: Option<tokio_rustls::TlsAcceptor>,
    metrics: Arc<WorkerMetrics>,
) -> tokio_stream::wrappers::ReceiverStream<std::io::Result<Counted>> {
    let (tx, rx) = tokio::sync::mpsc::channel(64);
    tokio::spawn(async move {
        let registry = Arc::new(Registry {
            base: Instant::now(),
            conns: Mutex::default(),
        });
        let mut next_id = 0u64;
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
            if !registry.make_room(max, preface_timeout, &metrics) {
                // Dropped: closed at once.
                continue;
            }
            // An HTTP/2 response is several small writes (headers, data,
            // trailers): Nagle's algorithm would hold the last one for the
            // client's delayed ACK (40 ms).
            if let Err(e) = stream.set_nodelay(true) {
                tracing::debug!(error = %e, "TCP_NODELAY not set");
            }
            let state = Arc::new(ConnState {
                last_io_ms: AtomicU64::new(registry.now_ms()),
                evicted: AtomicBool::new(false),
                reader: AtomicWaker::new(),
            });
            let id = next_id;
            next_id += 1;
            registry
                .conns
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .insert(id, state.clone());
            let registered = Registered {
                id,
                registry: registry.clone(),
            };
            let (tx, metrics, tls) = (tx.clone(), metrics.clone(), tls.clone());
            tokio::spawn(async move {
                // The connection, or why it is closed before it serves.
                let stream = match tls {
                    None => {
                        let sent = tokio::time::timeout(preface_timeout, preface(&stream)).await;
                        match sent {
                            Ok(true) => Ok(Conn::Plain(stream)),
                            _ => Err("timed_out"),
                        }
                    }
                    Some(tls) => {
                        match tokio::time::timeout(preface_timeout, tls.accept(stream)).await {
                            Ok(Ok(stream)) => Ok(Conn::Tls(Box::new(stream))),
                            Ok(Err(e)) => {
                                tracing::debug!(error = %e, "gRPC TLS handshake failed");
                                Err("handshake_failed")
                            }
                            Err(_) => Err("timed_out"),
                        }
                    }
                };
                match stream {
                    Ok(stream) => {
                        let counted = Counted {
                            stream,
                            state,
                            registered,
                        };
                        let _ = tx.send(Ok(counted)).await;
                    }
                    Err(why) if !state.evicted.load(Ordering::Acquire) => {
                        metrics.connections_closed("grpc", why);
                    }
                    Err(_) => {}
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

/// A gRPC connection: records when bytes last went either way, ends (its
/// next read is the end of the stream) when evicted, and leaves the
/// registry when it closes.
#[derive(Debug)]
pub struct Counted {
    stream: Conn,
    state: Arc<ConnState>,
    registered: Registered,
}

/// A connection's bytes: plaintext, or TLS over it.
#[derive(Debug)]
enum Conn {
    Plain(tokio::net::TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>),
}

/// A connection's place in the registry, left when it is dropped (after
/// its handshake failed, or when it closes).
#[derive(Debug)]
struct Registered {
    id: u64,
    registry: Arc<Registry>,
}

impl Drop for Registered {
    fn drop(&mut self) {
        self.registry
            .conns
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&self.id);
    }
}

impl Counted {
    fn touched(&self) {
        self.state
            .last_io_ms
            .store(self.registered.registry.now_ms(), Ordering::Relaxed);
    }
}

impl tokio::io::AsyncRead for Conn {
    fn poll_read(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl tokio::io::AsyncWrite for Conn {
    fn poll_write(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }

    fn poll_write_vectored(
        self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => std::pin::Pin::new(s).poll_write_vectored(cx, bufs),
            Conn::Tls(s) => std::pin::Pin::new(s.as_mut()).poll_write_vectored(cx, bufs),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Conn::Plain(s) => s.is_write_vectored(),
            Conn::Tls(s) => s.is_write_vectored(),
        }
    }
}

impl tokio::io::AsyncRead for Counted {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        self.state.reader.register(cx.waker());
        if self.state.evicted.load(Ordering::Acquire) {
            // The end of the stream: the server closes the connection.
            return Poll::Ready(Ok(()));
        }
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.stream).poll_read(cx, buf);
        if matches!(polled, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.touched();
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write(cx, buf);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touched();
        }
        polled
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.stream).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        let polled = std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs);
        if matches!(polled, Poll::Ready(Ok(n)) if n > 0) {
            self.touched();
        }
        polled
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = tonic::transport::server::TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        match &self.stream {
            Conn::Plain(s) => s.connect_info(),
            Conn::Tls(s) => s.get_ref().0.connect_info(),
        }
    }
}
