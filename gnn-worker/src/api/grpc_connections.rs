//! The gRPC port's connections (docs/serving.md, "Connections"): bounded
//! like the HTTP port's, in the accept loop, beneath tonic.
//!
//! - A new connection must send HTTP/2's 24-byte preface within
//!   `preface_timeout` (`http_read_timeout_s`), or it is closed: a
//!   half-sent connection holds nothing for long. With TLS
//!   (`crate::api::tls`), its handshake must end within that time instead.
//! - At most `max` at once. At the cap, a new connection closes, first,
//!   the oldest one that has not yet sent its preface (or ended its TLS
//!   handshake) and has sent no byte at all, whatever its age: a real client sends its preface right after connecting, so
//!   connections that never speak cannot hold the port however fast they
//!   are reopened, and cannot push out a client that spoke. Failing that, it closes the one idle longest, if idle at
//!   least `preface_timeout`, where idle means no call in flight and none
//!   begun or ended since: PINGs, SETTINGS, WINDOW_UPDATEs or empty frames
//!   do not make a connection busy (calls are seen by [`ActivityLayer`]).
//!   An idle HTTP/2 connection is a client's to keep while there is room,
//!   and gRPC clients reconnect by themselves. When none qualifies, the
//!   new one waits for room, first come first served (at most
//!   [`max_waiting`] wait, each until the preface timeout, counted from its
//!   accept), so a client that connects once is not outrun by connections
//!   reopened in a tight loop; past that bound it is closed at once.
//! - Every close is counted in `gnn_worker_connections_closed_total{port=
//!   "grpc", why}`: `timed_out` (no preface in time, waiting included),
//!   `evicted`, `refused` (the waiting bound), `handshake_failed` (TLS: no
//!   or a wrong client certificate, not TLS at all).

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::Poll;
use std::time::{Duration, Instant};

use futures_util::task::AtomicWaker;

use crate::metrics::WorkerMetrics;

/// One connection's state, shared with the accept loop.
#[derive(Debug)]
pub struct ConnState {
    /// When the connection was accepted, or a call on it last began or
    /// ended, in ms since [`Registry::base`].
    last_call_ms: AtomicU64,
    /// Calls begun and not yet ended (their response bodies still open).
    calls: AtomicUsize,
    /// The preface arrived (or the TLS handshake ended): the connection is
    /// served.
    established: AtomicBool,
    /// Its first bytes arrived (a real client's preface or TLS ClientHello
    /// follows its connect at once; looked at when it is accepted and as
    /// soon as it is readable): a pending connection that has spoken is
    /// never closed to make room.
    spoke: AtomicBool,
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

    /// Room for one more connection: at the cap, evicts the oldest one
    /// not yet established that has not spoken, or else the
    /// one idle longest if it has been idle at least `min_idle`; `false`
    /// when none qualifies.
    fn make_room(&self, max: usize, min_idle: Duration, metrics: &WorkerMetrics) -> bool {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        if conns.len() < max {
            return true;
        }
        let now = self.now_ms();
        // Ids grow with accept order: the smallest pending id is the oldest.
        let pending = conns
            .iter()
            .filter(|(_, c)| {
                !c.established.load(Ordering::Acquire) && !c.spoke.load(Ordering::Acquire)
            })
            .map(|(id, _)| *id)
            .min();
        let idlest = || {
            conns
                .iter()
                .filter(|(_, c)| c.calls.load(Ordering::Acquire) == 0)
                .map(|(id, c)| (c.last_call_ms.load(Ordering::Relaxed), *id))
                .min()
                .filter(|(last, _)| now.saturating_sub(*last) >= min_idle.as_millis() as u64)
                .map(|(_, id)| id)
        };
        let victim = pending.or_else(idlest);
        match victim.and_then(|id| conns.remove(&id)) {
            Some(conn) => {
                conn.evicted.store(true, Ordering::Release);
                conn.reader.wake();
                metrics.connections_closed("grpc", "evicted");
                true
            }
            None => false,
        }
    }
}

/// Connections that wait for room at most, for a cap of `max`: twice the
/// cap, and at least 256.
pub fn max_waiting(max: usize) -> usize {
    (2 * max).max(256)
}

/// How often connections waiting for room are looked at again.
const ADMIT_TICK: Duration = Duration::from_millis(10);

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
        // Connections accepted that found no room, first come first served
        // (at most [`max_waiting`]): a client that connects once is not outrun by
        // connections reopened in a tight loop.
        let mut waiting: std::collections::VecDeque<(tokio::net::TcpStream, Instant)> =
            std::collections::VecDeque::new();
        loop {
            let tick = async {
                if waiting.is_empty() {
                    std::future::pending::<()>().await
                } else {
                    tokio::time::sleep(ADMIT_TICK).await
                }
            };
            tokio::select! {
                accepted = listener.accept() => match accepted {
                    Ok((stream, _)) if waiting.len() < max_waiting(max) => {
                        waiting.push_back((stream, Instant::now()));
                    }
                    // Closed at once.
                    Ok(_) => metrics.connections_closed("grpc", "refused"),
                    Err(e) => {
                        tracing::warn!(error = %e, "accepting a gRPC connection failed");
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    }
                },
                () = tick => {}
                () = tx.closed() => return,
            };
            // In arrival order, while there is room; those that waited
            // past the preface timeout are closed.
            while let Some((_, since)) = waiting.front() {
                if since.elapsed() >= preface_timeout {
                    waiting.pop_front();
                    metrics.connections_closed("grpc", "timed_out");
                    continue;
                }
                if !registry.make_room(max, preface_timeout, &metrics) {
                    break;
                }
                let (stream, since) = waiting.pop_front().expect("not empty");
                let (stream, spoke) = match spoken(stream) {
                    Ok(spoken) => spoken,
                    Err(e) => {
                        tracing::debug!(error = %e, "a gRPC connection failed at accept");
                        continue;
                    }
                };
                // An HTTP/2 response is several small writes (headers, data,
                // trailers): Nagle's algorithm would hold the last one for the
                // client's delayed ACK (40 ms).
                if let Err(e) = stream.set_nodelay(true) {
                    tracing::debug!(error = %e, "TCP_NODELAY not set");
                }
                let state = Arc::new(ConnState {
                    last_call_ms: AtomicU64::new(registry.now_ms()),
                    calls: AtomicUsize::new(0),
                    established: AtomicBool::new(false),
                    spoke: AtomicBool::new(spoke),
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
                    // Its first byte marks it as spoken (protected from being
                    // closed for room) the moment it is readable.
                    // The preface timeout runs from the accept.
                    let left = || preface_timeout.saturating_sub(since.elapsed());
                    let first = tokio::time::timeout(left(), stream.peek(&mut [0u8; 1])).await;
                    if matches!(first, Ok(Ok(n)) if n > 0) {
                        state.spoke.store(true, Ordering::Release);
                    }
                    let preface_timeout = left();
                    let stream = match tls {
                        None => {
                            let sent =
                                tokio::time::timeout(preface_timeout, preface(&stream)).await;
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
                            state.established.store(true, Ordering::Release);
                            state
                                .last_call_ms
                                .store(registered.registry.now_ms(), Ordering::Relaxed);
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
        }
    });
    tokio_stream::wrappers::ReceiverStream::new(rx)
}

/// `stream`, and whether its peer had sent a byte by the time it was
/// accepted (looked at without waiting or consuming it).
fn spoken(stream: tokio::net::TcpStream) -> std::io::Result<(tokio::net::TcpStream, bool)> {
    let stream = stream.into_std()?;
    let mut byte = [0u8; 1];
    // The socket is non-blocking: no byte yet is WouldBlock.
    let spoke = matches!(stream.peek(&mut byte), Ok(n) if n > 0);
    Ok((tokio::net::TcpStream::from_std(stream)?, spoke))
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
        std::pin::Pin::new(&mut self.stream).poll_read(cx, buf)
    }
}

impl tokio::io::AsyncWrite for Counted {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.stream).poll_write(cx, buf)
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
        std::pin::Pin::new(&mut self.stream).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.stream.is_write_vectored()
    }
}

/// What a request on a gRPC connection knows of it: its TCP peer, and the
/// state [`ActivityLayer`] marks calls in.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The peer's and our addresses.
    pub tcp: tonic::transport::server::TcpConnectInfo,
    state: Arc<ConnState>,
    registry: Arc<Registry>,
}

impl tonic::transport::server::Connected for Counted {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        ConnInfo {
            tcp: match &self.stream {
                Conn::Plain(s) => s.connect_info(),
                Conn::Tls(s) => s.get_ref().0.connect_info(),
            },
            state: self.state.clone(),
            registry: self.registered.registry.clone(),
        }
    }
}

/// One call in flight on a connection: begun when made, ended when
/// dropped (with the call's response body).
struct CallGuard(ConnInfo);

impl CallGuard {
    fn begin(info: &ConnInfo) -> Self {
        info.state.calls.fetch_add(1, Ordering::AcqRel);
        info.state
            .last_call_ms
            .store(info.registry.now_ms(), Ordering::Relaxed);
        CallGuard(info.clone())
    }
}

impl Drop for CallGuard {
    fn drop(&mut self) {
        self.0
            .state
            .last_call_ms
            .store(self.0.registry.now_ms(), Ordering::Relaxed);
        self.0.state.calls.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The tower layer (on the gRPC server) that marks each call in its
/// connection's state from its first byte until its response body ends,
/// so that only connections without calls count as idle.
#[derive(Debug, Clone, Copy, Default)]
pub struct ActivityLayer;

/// When a call reached the server: stamped by [`ActivityLayer`], the
/// outermost of the worker's layers, in the same step in which tonic
/// starts its own timer of the call's `grpc-timeout` (which would end the
/// call CANCELLED). A call's time left is counted from here, not from when
/// its handler ran, so that the worker's DEADLINE_EXCEEDED comes first
/// also when reading and decoding the call was slow (a loaded machine).
#[derive(Debug, Clone, Copy)]
pub struct Arrived(pub Instant);

/// A call's time left of its `grpc-timeout` (`timeout`), counted from when
/// it reached the server ([`Arrived`]; from now when it was not stamped).
pub fn time_left(extensions: &tonic::Extensions, timeout: Option<Duration>) -> Option<Duration> {
    let timeout = timeout?;
    Some(match extensions.get::<Arrived>() {
        Some(Arrived(at)) => timeout.saturating_sub(at.elapsed()),
        None => timeout,
    })
}

impl<S> tower::Layer<S> for ActivityLayer {
    type Service = Activity<S>;

    fn layer(&self, inner: S) -> Self::Service {
        Activity(inner)
    }
}

/// [`ActivityLayer`]'s service.
#[derive(Debug, Clone)]
pub struct Activity<S>(S);

impl<S, B> tower::Service<::http::Request<B>> for Activity<S>
where
    S: tower::Service<::http::Request<B>, Response = ::http::Response<tonic::body::Body>>,
    S::Future: Send + 'static,
{
    type Response = ::http::Response<tonic::body::Body>;
    type Error = S::Error;
    type Future = std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Self::Response, Self::Error>> + Send>,
    >;

    fn poll_ready(&mut self, cx: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&mut self, mut request: ::http::Request<B>) -> Self::Future {
        request.extensions_mut().insert(Arrived(Instant::now()));
        let guard = request.extensions().get::<ConnInfo>().map(CallGuard::begin);
        let response = self.0.call(request);
        Box::pin(async move {
            let response = response.await?;
            Ok(match guard {
                None => response,
                Some(guard) => response.map(|body| tonic::body::Body::new(Guarded { body, guard })),
            })
        })
    }
}

/// A response body that holds its call's guard until it is dropped.
struct Guarded {
    body: tonic::body::Body,
    #[allow(dead_code)] // held for its Drop
    guard: CallGuard,
}

impl http_body::Body for Guarded {
    type Data = bytes::Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Self::Data>, Self::Error>>> {
        std::pin::Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.body.size_hint()
    }
}
