//! The admin Unix socket: `sidecarctl` talks to a running sidecar here.
//!
//! Commands ([`AdminRequest`], docs/admin.md): `status`, `stats`, `ready`,
//! `live`, `warm`, `invalidate`, `fanouts get|set`, `deadline get|set`,
//! `log-level get|set`, `graph add-node|add-edges|compact|checksum`, `cache flush`,
//! `drain`, `shutdown`. The socket is bound before the graph is loaded, so
//! the probes answer (not ready) during start-up; commands that need the
//! graph or the tiers say the sidecar is not ready yet.
//!
//! The socket file is created with mode 0600 and every connection's peer
//! credentials are checked: only root or the sidecar's own uid may talk to
//! it. Connections are served on their own threads, at most
//! [`MAX_CONNECTIONS`] at a time. At the cap, a new connection closes
//! (with an error frame saying why), in this order: the one that has waited
//! longest without saying Hello, if that is at least [`HELLO_GRACE`]; else
//! the one idle longest (said Hello, no request being answered), if idle
//! that long. Failing both (every connection is answering a request), it is
//! served in one of [`RESERVED_CONNECTIONS`] reserved places, which answer
//! one `live`, `ready`, `status` or `stats` request, sent with its Hello
//! within [`RESERVED_TIMEOUT`], and close. So idle
//! connections, silent or past their Hello, however many and however fast
//! they come back, cannot lock an operator or a probe out (`sidecarctl`
//! tries again when it is turned away). A connection that finds no place
//! waits for one, first come first served (at most [`MAX_WAITING`], each at
//! most [`WAIT_LIMIT`]), so a client that tries again with a backoff is not
//! outrun by clients that reconnect in a tight loop; past that it is turned
//! away with the error frame. A connection must send
//! its Hello within [`HELLO_TIMEOUT`], and each later frame whole within
//! [`IDLE_TIMEOUT`] of the previous answer, or it is closed. A malformed
//! frame closes that connection only. Connections ending with an error are
//! logged at most [`WARNINGS_PER_MINUTE`] times a minute (the rest counted
//! in the next warning), so a client that misbehaves in a loop cannot flood
//! the log.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{bail, ensure, Context};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};

use crate::admin::wire::{
    read_frame, write_frame, AdminRequest, AdminResponse, Distribution, FrameError, RingOccupancy,
    StatsReport, StatusReport, TierRows, ADMIN_VERSION,
};
use crate::daemon::{Core, Daemon};
use crate::features::contract::encode_row;
use crate::features::rocks::Role;
use crate::graph::GraphSource;
use crate::updates::entry::Op;
use crate::updates::typed_entry::{GraphChange, GraphOp, NamedEdges};

/// Most admin connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// A connection whose next frame has not fully arrived this long after the
/// previous answer is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection whose Hello has not fully arrived this long after it was
/// accepted is closed.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// At the connection cap, a connection silent this long (no Hello yet),
/// or idle this long after its Hello or its last answer, may be closed to
/// make room for a new one.
pub const HELLO_GRACE: Duration = Duration::from_millis(100);

/// Connections served beyond [`MAX_CONNECTIONS`] when every one is
/// answering a request: each answers one probe or view and closes.
pub const RESERVED_CONNECTIONS: usize = 2;

/// A connection in a reserved place must send its Hello and its one
/// request within this of being accepted.
pub const RESERVED_TIMEOUT: Duration = Duration::from_millis(500);

/// Warnings about admin connections logged per minute, at most.
pub const WARNINGS_PER_MINUTE: u32 = 10;

/// Warnings about connections, at most [`WARNINGS_PER_MINUTE`]: the
/// minute's count and the ones left out.
#[derive(Debug)]
struct WarnBudget {
    minute_start: Instant,
    logged: u32,
    left_out: u64,
}

static WARNINGS: std::sync::Mutex<Option<WarnBudget>> = std::sync::Mutex::new(None);

/// Logs `what` about an admin connection unless this minute's budget is
/// spent; the next logged warning says how many were left out.
fn warn_connection(what: &str, error: &dyn std::fmt::Display) {
    let mut budget = WARNINGS.lock().unwrap_or_else(|p| p.into_inner());
    let budget = budget.get_or_insert_with(|| WarnBudget {
        minute_start: Instant::now(),
        logged: 0,
        left_out: 0,
    });
    if budget.minute_start.elapsed() >= Duration::from_secs(60) {
        budget.minute_start = Instant::now();
        budget.logged = 0;
    }
    if budget.logged >= WARNINGS_PER_MINUTE {
        budget.left_out += 1;
        return;
    }
    budget.logged += 1;
    let left_out = std::mem::take(&mut budget.left_out);
    tracing::warn!(error = %error, left_out, "{what}");
}

/// Reads from the connection, failing with `TimedOut` once `until` passes,
/// however slowly the bytes trickle in.
struct DeadlineReader {
    stream: UnixStream,
    until: Instant,
}

impl std::io::Read for DeadlineReader {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        let left = self.until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "the admin frame did not arrive in time",
            ));
        }
        self.stream.set_read_timeout(Some(left))?;
        self.stream.read(buf)
    }
}

/// Ids fetched per step of a warm-up (one progress frame each).
const WARM_CHUNK: usize = 1_000;

/// The running admin socket; dropping it stops accepting and removes the file.
#[derive(Debug)]
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl AdminServer {
    /// Binds `path` (replacing a stale socket file, never another file).
    pub fn start(
        path: &Path,
        daemon: Arc<Daemon>,
        runtime: tokio::runtime::Handle,
    ) -> anyhow::Result<Self> {
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            use std::os::unix::fs::FileTypeExt;
            ensure!(
                meta.file_type().is_socket(),
                "{} exists and is not a socket: choose another admin_socket",
                path.display()
            );
            ensure!(
                UnixStream::connect(path).is_err(),
                "another sidecar answers on {}: stop it or choose another admin_socket",
                path.display()
            );
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)
            .with_context(|| format!("binding the admin socket {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(AtomicBool::new(false));
        let s = stop.clone();
        let thread = std::thread::Builder::new()
            .name("admin-accept".into())
            .spawn(move || accept_loop(&listener, &s, daemon, runtime))?;
        tracing::info!(socket = %path.display(), "admin socket listening");
        Ok(Self {
            path: path.to_path_buf(),
            stop,
            thread: Some(thread),
        })
    }
}

impl Drop for AdminServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // Wake the accept loop with a connection of our own.
        let _ = UnixStream::connect(&self.path);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
        let _ = std::fs::remove_file(&self.path);
    }
}

/// What the accept loop and a connection's thread share of it.
#[derive(Debug)]
struct ConnState {
    /// Set once its Hello was read.
    hello: AtomicBool,
    /// Set while a request is being answered.
    busy: AtomicBool,
    /// When it was accepted, said Hello or was last answered, in ms since
    /// the accept loop's start.
    last_ms: std::sync::atomic::AtomicU64,
}

/// One served connection, as the accept loop sees it.
struct Slot {
    id: u64,
    accepted: Instant,
    state: Arc<ConnState>,
    /// Served in a reserved place (one probe or view, then closed).
    reserved: bool,
    /// A handle on its socket, to close it to make room.
    stream: UnixStream,
}

/// Where a new connection is served: a place of its own, or a reserved
/// place; `None` when it is turned away.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Regular,
    Reserved,
}

/// A place for one more connection in `slots` (at most [`MAX_CONNECTIONS`]
/// regular and [`RESERVED_CONNECTIONS`] reserved ones): at the cap, closes
/// the connection that has waited longest without a Hello, else the one
/// idle longest, telling it why; else a reserved place if one is free.
fn make_room(slots: &mut Vec<Slot>, now_ms: u64) -> Option<Place> {
    let regular = slots.iter().filter(|s| !s.reserved).count();
    if regular < MAX_CONNECTIONS {
        return Some(Place::Regular);
    }
    // A connection gets HELLO_GRACE to say Hello, and to send a request
    // after it, before it can be closed for room: a client that says them
    // at once is never pushed out by a stream of idle ones.
    let grace = HELLO_GRACE.as_millis() as u64;
    let silent = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| {
            !s.state.hello.load(Ordering::Acquire) && s.accepted.elapsed() >= HELLO_GRACE
        })
        .min_by_key(|(_, s)| s.accepted)
        .map(|(i, _)| (i, "had said no Hello"));
    let idle = || {
        slots
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.state.hello.load(Ordering::Acquire) && !s.state.busy.load(Ordering::Acquire)
            })
            .map(|(i, s)| (s.state.last_ms.load(Ordering::Acquire), i))
            .filter(|(last, _)| now_ms.saturating_sub(*last) >= grace)
            .min()
            .map(|(_, i)| (i, "was idle"))
    };
    let Some((i, why)) = silent.or_else(idle) else {
        let reserved = slots.iter().filter(|s| s.reserved).count();
        return (reserved < RESERVED_CONNECTIONS).then_some(Place::Reserved);
    };
    let evicted = slots.swap_remove(i);
    let place = if evicted.reserved {
        Place::Reserved
    } else {
        Place::Regular
    };
    let mut stream = evicted.stream;
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = write_frame(
        &mut stream,
        &AdminResponse::Error {
            message: format!(
                "closed to make room: {MAX_CONNECTIONS} admin connections were open and this \
                 one {why}"
            ),
        },
    );
    let _ = stream.shutdown(std::net::Shutdown::Both);
    Some(place)
}

/// Connections accepted and not yet given a place that wait, at most; the
/// next one is turned away.
pub const MAX_WAITING: usize = 64;

/// The longest a connection waits for a place before it is turned away
/// (`sidecarctl` then tries again).
pub const WAIT_LIMIT: Duration = Duration::from_secs(2);

/// The connections served and those waiting for a place, first come first
/// served: a client that tries again with a backoff is not outrun by
/// clients that reconnect in a tight loop.
#[derive(Default)]
struct Queues {
    slots: Vec<Slot>,
    waiting: std::collections::VecDeque<(UnixStream, Instant)>,
    next_id: u64,
    stopped: bool,
}

/// [`Queues`], and the condition the admitting thread waits on: a
/// connection arrived or ended (or a place may have come free with time).
struct Admission {
    queues: std::sync::Mutex<Queues>,
    changed: std::sync::Condvar,
    base: Instant,
    daemon: Arc<Daemon>,
    runtime: tokio::runtime::Handle,
}

impl Admission {
    fn now_ms(&self) -> u64 {
        self.base.elapsed().as_millis() as u64
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Queues> {
        self.queues.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Gives places to the waiting connections, in arrival order, while
    /// there are places; turns away those that waited past [`WAIT_LIMIT`].
    fn admit(self: &Arc<Self>, queues: &mut Queues) {
        while !queues.waiting.is_empty() {
            let Some(place) = make_room(&mut queues.slots, self.now_ms()) else {
                break;
            };
            let (stream, _) = queues.waiting.pop_front().expect("not empty");
            let Ok(handle) = stream.try_clone() else {
                continue;
            };
            let state = Arc::new(ConnState {
                hello: AtomicBool::new(false),
                busy: AtomicBool::new(false),
                last_ms: std::sync::atomic::AtomicU64::new(self.now_ms()),
            });
            let id = queues.next_id;
            queues.next_id += 1;
            queues.slots.push(Slot {
                id,
                accepted: Instant::now(),
                state: state.clone(),
                reserved: place == Place::Reserved,
                stream: handle,
            });
            let admission = self.clone();
            let spawned = std::thread::Builder::new()
                .name("admin-conn".into())
                .spawn(move || {
                    let now_ms = || admission.now_ms();
                    let served = Served {
                        state: &state,
                        now_ms: &now_ms,
                        reserved: place == Place::Reserved,
                    };
                    let result =
                        serve_connection(stream, &admission.daemon, &admission.runtime, served);
                    if let Err(e) = result {
                        warn_connection("admin connection ended with an error", &e);
                    }
                    admission.lock().slots.retain(|s| s.id != id);
                    admission.changed.notify_all();
                });
            if spawned.is_err() {
                tracing::error!("could not spawn an admin connection thread");
                queues.slots.retain(|s| s.id != id);
            }
        }
        while queues
            .waiting
            .front()
            .is_some_and(|(_, since)| since.elapsed() >= WAIT_LIMIT)
        {
            let (stream, _) = queues.waiting.pop_front().expect("not empty");
            turn_away(stream);
        }
    }
}

/// Tells a connection there is no place for it, and closes it.
fn turn_away(mut stream: UnixStream) {
    let _ = stream.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = write_frame(
        &mut stream,
        &AdminResponse::Error {
            message: format!(
                "too many admin connections (at most {MAX_CONNECTIONS}); retry shortly"
            ),
        },
    );
}

fn accept_loop(
    listener: &UnixListener,
    stop: &AtomicBool,
    daemon: Arc<Daemon>,
    runtime: tokio::runtime::Handle,
) {
    let admission = Arc::new(Admission {
        queues: std::sync::Mutex::default(),
        changed: std::sync::Condvar::new(),
        base: Instant::now(),
        daemon,
        runtime,
    });
    // Places come free when a connection ends, and with time (a
    // connection idle past the grace): this thread gives them out.
    let admitter = {
        let admission = admission.clone();
        std::thread::Builder::new()
            .name("admin-admit".into())
            .spawn(move || {
                let mut queues = admission.lock();
                while !queues.stopped {
                    admission.admit(&mut queues);
                    let wait = if queues.waiting.is_empty() {
                        Duration::from_secs(1)
                    } else {
                        Duration::from_millis(10)
                    };
                    queues = admission
                        .changed
                        .wait_timeout(queues, wait)
                        .unwrap_or_else(|p| p.into_inner())
                        .0;
                }
                for (stream, _) in queues.waiting.drain(..) {
                    turn_away(stream);
                }
            })
    };
    let own_uid = nix::unistd::getuid().as_raw();
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else { continue };
        match getsockopt(&stream, PeerCredentials) {
            Ok(cred) if cred.uid() == own_uid || cred.uid() == 0 => {}
            Ok(cred) => {
                warn_connection(
                    "admin connection refused: not root nor the sidecar's user",
                    &format!("peer uid {}", cred.uid()),
                );
                continue;
            }
            Err(e) => {
                warn_connection("admin connection refused: no peer credentials", &e);
                continue;
            }
        }
        let mut queues = admission.lock();
        if queues.waiting.len() >= MAX_WAITING {
            drop(queues);
            turn_away(stream);
            continue;
        }
        queues.waiting.push_back((stream, Instant::now()));
        admission.admit(&mut queues);
        drop(queues);
        admission.changed.notify_all();
    }
    admission.lock().stopped = true;
    admission.changed.notify_all();
    if let Ok(admitter) = admitter {
        let _ = admitter.join();
    }
}

/// What a connection's thread marks in its state, and whether it was
/// given a reserved place.
struct Served<'a> {
    state: &'a ConnState,
    now_ms: &'a dyn Fn() -> u64,
    reserved: bool,
}

impl Served<'_> {
    /// The connection is answering a request (`true`) or idle again.
    fn mark(&self, busy: bool) {
        self.state.last_ms.store((self.now_ms)(), Ordering::Release);
        self.state.busy.store(busy, Ordering::Release);
    }
}

fn serve_connection(
    stream: UnixStream,
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    served: Served<'_>,
) -> Result<(), FrameError> {
    let mut writer = stream.try_clone()?;
    writer.set_write_timeout(Some(IDLE_TIMEOUT))?;
    // A reserved place is for one quick probe or view: its Hello and
    // request both within RESERVED_TIMEOUT, so an idle client cannot hold it.
    let reserved_until = Instant::now() + RESERVED_TIMEOUT;
    let mut reader = BufReader::new(DeadlineReader {
        stream,
        until: if served.reserved {
            reserved_until
        } else {
            Instant::now() + HELLO_TIMEOUT
        },
    });
    let first = read_frame::<AdminRequest>(&mut reader)?;
    served.mark(false);
    served.state.hello.store(true, Ordering::Release);
    match first {
        AdminRequest::Hello { version } if version == ADMIN_VERSION => write_frame(
            &mut writer,
            &AdminResponse::Hello {
                version: ADMIN_VERSION,
                server: format!("sidecar {}", env!("CARGO_PKG_VERSION")),
            },
        )?,
        AdminRequest::Hello { version } => {
            return write_frame(
                &mut writer,
                &AdminResponse::Error {
                    message: format!(
                        "sidecarctl speaks admin version {version}, this sidecar {ADMIN_VERSION}: \
                         use the sidecarctl of the same release"
                    ),
                },
            )
        }
        _ => {
            return write_frame(
                &mut writer,
                &AdminResponse::Error {
                    message: "the first admin frame must be Hello".into(),
                },
            )
        }
    }
    loop {
        reader.get_mut().until = if served.reserved {
            reserved_until
        } else {
            Instant::now() + IDLE_TIMEOUT
        };
        let request = match read_frame::<AdminRequest>(&mut reader) {
            Ok(request) => request,
            Err(FrameError::Closed) => return Ok(()),
            Err(e) => {
                let _ = write_frame(
                    &mut writer,
                    &AdminResponse::Error {
                        message: e.to_string(),
                    },
                );
                return Err(e);
            }
        };
        let mut progress_error = None;
        let mut send_progress = |done: u64, total: u64| {
            if progress_error.is_none() {
                if let Err(e) = write_frame(&mut writer, &AdminResponse::Progress { done, total }) {
                    progress_error = Some(e);
                }
            }
        };
        served.mark(true);
        let probe_or_view = matches!(
            request,
            AdminRequest::Live | AdminRequest::Ready | AdminRequest::Status | AdminRequest::Stats
        );
        let response = if served.reserved && !probe_or_view {
            AdminResponse::Error {
                message: format!(
                    "{MAX_CONNECTIONS} admin connections are busy answering; a reserved \
                     connection answers only live, ready, status and stats: retry shortly"
                ),
            }
        } else {
            handle(request, daemon, runtime, &mut send_progress).unwrap_or_else(|e| {
                AdminResponse::Error {
                    message: format!("{e:#}"),
                }
            })
        };
        if let Some(e) = progress_error {
            return Err(e);
        }
        write_frame(&mut writer, &response)?;
        served.mark(false);
        if served.reserved {
            return Ok(());
        }
    }
}

fn probe(result: Result<(), String>) -> AdminResponse {
    match result {
        Ok(()) => AdminResponse::Probe {
            ok: true,
            reason: String::new(),
        },
        Err(reason) => AdminResponse::Probe { ok: false, reason },
    }
}

fn handle(
    request: AdminRequest,
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<AdminResponse> {
    if let Some(command) = one_type_command(&request) {
        if let Some(schema) = daemon.core().and_then(|c| c.ring_schema.as_ref()) {
            let typed_form = match command {
                "invalidate" => Some("sidecarctl invalidate --type TYPE ID..."),
                "warm --ids-file" => Some("sidecarctl warm --type TYPE --ids-file F"),
                "graph add-node" => Some("sidecarctl graph add-node --type TYPE ID ..."),
                "graph add-edges" => Some("sidecarctl graph add-edges --edge-type EDGE_TYPE ..."),
                _ => None,
            };
            match typed_form {
                Some(form) => bail!(
                    "this sidecar serves a typed graph ({}): name the type (`{form}`, \
                     docs/updates.md, \"Typed graphs\")",
                    schema.describe()
                ),
                None => bail!(
                    "this sidecar serves a typed graph ({}); `{command}` is for one-type graphs \
                     in this release (docs/graph-index.md, \"Serving a typed graph\")",
                    schema.describe()
                ),
            }
        }
    }
    Ok(match request {
        AdminRequest::Hello { .. } => bail!("handshake already done"),
        AdminRequest::Status => AdminResponse::Status(status(daemon)),
        AdminRequest::Stats => AdminResponse::Stats(stats(daemon)),
        AdminRequest::Ready => probe(daemon.readiness()),
        AdminRequest::Live => probe(daemon.liveness()),
        AdminRequest::WarmTop { k } => {
            let core = daemon.loaded()?;
            let k = usize::try_from(k).unwrap_or(usize::MAX);
            let nodes = core.features.top_degree(&core.graph.snapshot(), k);
            warm(daemon, runtime, &nodes, progress)?
        }
        AdminRequest::TypedWarmIds { node_type, ids } => {
            let core = daemon.loaded()?;
            let Some(schema) = core.ring_schema.as_ref() else {
                bail!(
                    "this sidecar serves a one-type graph: warm it without --type \
                     (`sidecarctl warm --ids-file F`)"
                );
            };
            let graph = core.graph.snapshot();
            let Some(t) = graph.schema().node_type(&node_type) else {
                bail!(
                    "node type {node_type:?} is not in the graph ({})",
                    schema.describe()
                );
            };
            if core.features.of(t).is_none() {
                bail!(
                    "node type {node_type:?} has no feature rows to pin: warm a type with \
                     features ({})",
                    schema.describe()
                );
            }
            if let Some(&unknown) = ids.iter().find(|&&id| !graph.is_node(t, id)) {
                bail!(
                    "{node_type} {unknown} is not in the graph ({} {node_type} nodes): warm \
                     known nodes only",
                    graph.n_nodes_of(t)
                );
            }
            let nodes: Vec<(usize, u64)> = ids.iter().map(|&id| (t, id)).collect();
            warm(daemon, runtime, &nodes, progress)?
        }
        AdminRequest::WarmIds { ids } => {
            let core = daemon.loaded()?;
            let graph = core.graph.snapshot();
            if let Some(&unknown) = ids.iter().find(|&&id| !graph.is_node(0, id)) {
                bail!(
                    "node {unknown} is not in the graph ({} nodes): warm known nodes only",
                    graph.n_nodes()
                );
            }
            warm(daemon, runtime, &one_type(&ids), progress)?
        }
        AdminRequest::Invalidate { ids } => {
            let n = ids.len() as u64;
            change(daemon, runtime, vec![GraphOp::from(Op::Invalidate { ids })])?;
            daemon.metrics.admin_invalidated_ids.inc_by(n);
            AdminResponse::Invalidated { ids: n }
        }
        AdminRequest::GetFanouts => fanouts(daemon),
        AdminRequest::SetFanouts { fanouts: wanted } => {
            daemon.knobs.set_fanouts(wanted)?;
            tracing::info!(fanouts = ?wanted, "fanouts set through the admin socket");
            fanouts(daemon)
        }
        AdminRequest::GetDeadline => deadline(daemon),
        AdminRequest::SetDeadline { ms } => {
            daemon.knobs.set_deadline_ms(ms)?;
            tracing::info!(ms, "feature deadline set through the admin socket");
            deadline(daemon)
        }
        AdminRequest::GetLogLevel => AdminResponse::LogLevel {
            level: log_handle(daemon)?.level(),
        },
        AdminRequest::SetLogLevel { level } => {
            let log = log_handle(daemon)?;
            log.set_level(&level).map_err(anyhow::Error::msg)?;
            tracing::info!(%level, "log level set through the admin socket");
            AdminResponse::LogLevel { level: log.level() }
        }
        AdminRequest::AddNodes {
            nodes,
            edges,
            undirected,
        } => {
            // The nodes with their rows, then the edges: one update.
            let mut ops: Vec<GraphOp> = nodes
                .iter()
                .map(|n| {
                    GraphOp::from(Op::AddNode {
                        id: n.id,
                        row: Some(encode_row(&n.features)),
                        neighbors: Vec::new(),
                        directed: true,
                    })
                })
                .collect();
            ops.push(GraphOp::from(Op::AddEdges {
                edges,
                directed: !undirected,
            }));
            change(daemon, runtime, ops)?
        }
        AdminRequest::AddEdges { edges, undirected } => change(
            daemon,
            runtime,
            vec![GraphOp::from(Op::AddEdges {
                edges,
                directed: !undirected,
            })],
        )?,
        AdminRequest::TypedAddNode {
            node_type,
            id,
            features,
            edges,
        } => {
            let data = vec![None; edges.len()];
            let op = typed_add_node(node_type, id, &features, edges, data);
            change_naming_types(daemon, runtime, op)?
        }
        AdminRequest::TypedAddNodeWithData {
            node_type,
            id,
            features,
            edges,
            data,
        } => {
            anyhow::ensure!(
                data.len() == edges.len(),
                "TypedAddNodeWithData: {} edge lists and {} data entries; give one per list",
                edges.len(),
                data.len()
            );
            let op = typed_add_node(node_type, id, &features, edges, data);
            change_naming_types(daemon, runtime, op)?
        }
        AdminRequest::TypedAddEdges { edge_type, edges } => change_naming_types(
            daemon,
            runtime,
            GraphOp::AddEdges {
                edges: vec![NamedEdges::new(edge_type, edges)],
            },
        )?,
        // Edges with data name their edge type on every graph: a one-type
        // graph's is the 1x1 graph's `node__to__node`.
        AdminRequest::AddEdgesWithData {
            edge_type,
            edges,
            data,
        } => change(
            daemon,
            runtime,
            vec![GraphOp::AddEdges {
                edges: vec![NamedEdges {
                    data: Some(data),
                    ..NamedEdges::new(edge_type, edges)
                }],
            }],
        )?,
        AdminRequest::TypedInvalidate { node_type, ids } => {
            let n = ids.len() as u64;
            change_naming_types(daemon, runtime, GraphOp::Invalidate { node_type, ids })?;
            daemon.metrics.admin_invalidated_ids.inc_by(n);
            AdminResponse::Invalidated { ids: n }
        }
        AdminRequest::GraphChecksum => {
            let g = daemon.loaded()?.graph.snapshot();
            AdminResponse::GraphChecksum {
                checksum: format!("{:016x}", g.checksum()),
                n_nodes: g.n_nodes(),
                n_edges: g.n_edges(),
                generation: g.generation(),
                position: g.position().to_string(),
            }
        }
        AdminRequest::Compact => {
            let compacted = daemon.loaded()?.graph.compact()?;
            AdminResponse::Compacted {
                n_nodes: compacted.n_nodes,
                n_edges: compacted.n_edges,
                generation: compacted.generation,
                seconds: compacted.seconds,
            }
        }
        AdminRequest::FlushCache { l1, l2 } => {
            let core = daemon.loaded()?;
            let features = core.one_type()?;
            let l2_is_cache = features
                .store
                .as_ref()
                .is_some_and(|s| matches!(s.role(), Role::Cache { .. }));
            // Neither flag: every cache there is.
            let (l1, l2) = if !l1 && !l2 {
                (true, l2_is_cache)
            } else {
                (l1, l2)
            };
            if l2 {
                runtime.block_on(features.tiers.flush_l2())?;
            }
            let (l1_rows, pinned_rows) = if l1 {
                features.tiers.flush_l1(true)
            } else {
                (0, 0)
            };
            tracing::info!(
                l1,
                l2,
                l1_rows,
                pinned_rows,
                "caches flushed through the admin socket"
            );
            AdminResponse::Flushed {
                l1_rows: l1_rows as u64,
                pinned_rows: pinned_rows as u64,
                l2,
            }
        }
        AdminRequest::Drain { after_s } => {
            ensure!(
                after_s.is_finite() && (0.0..=3600.0).contains(&after_s),
                "drain --after-s {after_s} is outside 0..=3600 seconds"
            );
            let wait = daemon.config.drain_timeout() + Duration::from_secs(5);
            let outcome = daemon.drain_and_wait(Duration::from_secs_f64(after_s), wait)?;
            AdminResponse::Drained {
                answered: outcome.answered,
                pending: outcome.pending,
                seconds: outcome.seconds,
                complete: outcome.complete,
            }
        }
        AdminRequest::Shutdown => {
            daemon.request_stop();
            AdminResponse::ShuttingDown
        }
    })
}

fn log_handle(daemon: &Daemon) -> anyhow::Result<&daemon_kit::logging::LogHandle> {
    daemon.log.as_deref().ok_or_else(|| {
        anyhow::anyhow!("this sidecar was started without a managed logger (library use)")
    })
}

fn fanouts(daemon: &Daemon) -> AdminResponse {
    AdminResponse::Fanouts {
        fanouts: daemon.knobs.fanouts(),
        max_fanouts: daemon.knobs.max_fanouts(),
    }
}

fn deadline(daemon: &Daemon) -> AdminResponse {
    AdminResponse::Deadline {
        ms: daemon.knobs.deadline().as_secs_f64() * 1e3,
    }
}

/// One-type ids as the nodes of type 0.
fn one_type(ids: &[u64]) -> Vec<(usize, u64)> {
    ids.iter().map(|&id| (0, id)).collect()
}

/// Pins `nodes` (`(node type, id)`; type 0 of a one-type graph) in L1,
/// each through its type's tiers.
fn warm(
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    nodes: &[(usize, u64)],
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<AdminResponse> {
    let core = daemon.loaded()?;
    let started = Instant::now();
    let pinned = runtime.block_on(core.features.pin(nodes, WARM_CHUNK, progress));
    let (_, pinned_total) = core.features.l1_rows();
    tracing::info!(
        pinned,
        requested = nodes.len(),
        pinned_total,
        "warmed through the admin socket"
    );
    Ok(AdminResponse::Warmed {
        pinned: pinned as u64,
        requested: nodes.len() as u64,
        pinned_total: pinned_total as u64,
        seconds: started.elapsed().as_secs_f64(),
    })
}

/// A sidecar that follows an update stream takes graph changes from it
/// only: one made through its admin socket would reach this replica alone.
/// The `sidecarctl` command of a request that reads or changes the one-type
/// graph or its tiers (refused by a sidecar serving a typed graph).
fn one_type_command(request: &AdminRequest) -> Option<&'static str> {
    Some(match request {
        AdminRequest::WarmIds { .. } => "warm --ids-file",
        AdminRequest::Invalidate { .. } => "invalidate",
        AdminRequest::AddNodes { .. } => "graph add-node",
        AdminRequest::AddEdges { .. } => "graph add-edges",
        AdminRequest::FlushCache { .. } => "flush-cache",
        _ => return None,
    })
}

/// Writes `rows` (`(id, encoded row)`) to a node type's store: the store
/// of record, or Redis (whose L2 cache the caller evicts them from).
fn store_rows(
    runtime: &tokio::runtime::Handle,
    features: &crate::daemon::TypeFeatures,
    rows: &[(u64, Vec<u8>)],
) -> anyhow::Result<()> {
    match (&features.store, &features.redis) {
        (Some(store), None) if store.role() == Role::StoreOfRecord => {
            store.put_many(rows.iter().map(|(id, row)| (*id, row.as_slice())))
        }
        (_, Some(redis)) => runtime
            .block_on(redis.set_many(rows))
            .context("writing the new rows to Redis"),
        _ => bail!("no feature store to write the new rows to"),
    }
}

/// The operation adding a typed graph's node: its row (none for a type
/// without features) and its edges per edge type, each list with its data
/// (`None`: none given).
fn typed_add_node(
    node_type: String,
    id: u64,
    features: &[f32],
    edges: Vec<(String, Vec<(u64, u64)>)>,
    data: Vec<Option<String>>,
) -> GraphOp {
    GraphOp::AddNode {
        node_type,
        id,
        row: (!features.is_empty()).then(|| encode_row(features)),
        edges: edges
            .into_iter()
            .zip(data)
            .map(|((name, pairs), data)| NamedEdges {
                data,
                ..NamedEdges::new(name, pairs)
            })
            .collect(),
    }
}

/// Applies one operation a typed command names (`--type`,
/// `--edge-type`); refused on a one-type graph, whose commands name no
/// type.
fn change_naming_types(
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    op: GraphOp,
) -> anyhow::Result<AdminResponse> {
    if !daemon.loaded()?.is_typed() {
        bail!(
            "this sidecar serves a one-type graph: give node ids without a node type or edge \
             type (drop --type / --edge-type)"
        );
    }
    change(daemon, runtime, vec![op])
}

/// Applies operations made through the admin socket as one change, for
/// every graph (a one-type graph's are the 1x1 typed graph's): each
/// checked against the graph's types (names, widths) as an update-stream
/// entry is, then the rows written to their type's store, evicted from its
/// caches, then the graph change published in one snapshot. A change that
/// writes rows or the graph is refused on a replica that follows an update
/// stream; an invalidation is not.
fn change(
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    ops: Vec<GraphOp>,
) -> anyhow::Result<AdminResponse> {
    let core = daemon.loaded()?;
    if ops
        .iter()
        .any(|op| !matches!(op, GraphOp::Invalidate { .. }))
    {
        refuse_while_following(core)?;
    }
    let graph = core.graph.snapshot();
    let schema = graph.schema();
    let mut change = GraphChange::default();
    for op in &ops {
        let one = op.resolve(schema).map_err(anyhow::Error::msg)?;
        change.rows.extend(one.rows);
        change.evicted.extend(one.evicted);
        if let Some(update) = one.update {
            change
                .update
                .get_or_insert_with(Default::default)
                .extend(update);
        }
    }
    if let Some(update) = &change.update {
        // Refused before any row is written (and checked again when applied).
        graph.check(update)?;
    }
    // Rows first, then the graph: a node is never reachable before its
    // features are stored.
    for (t, id, row) in &change.rows {
        let features = core
            .features
            .of(*t)
            .expect("a row only for a type with features");
        store_rows(runtime, features, &[(*id, row.clone())])
            .with_context(|| format!("the {} row", schema.node_types[*t].name))?;
    }
    for (t, features) in core.features.types.iter().enumerate() {
        let ids: Vec<u64> = change
            .evicted
            .iter()
            .filter(|(ty, _)| *ty == t)
            .map(|(_, id)| *id)
            .collect();
        if let (Some(features), false) = (features, ids.is_empty()) {
            runtime.block_on(features.tiers.invalidate(&ids));
        }
    }
    let Some(update) = change.update else {
        return Ok(AdminResponse::Invalidated {
            ids: change.evicted.len() as u64,
        });
    };
    let stats = core.graph.update(update)?;
    tracing::info!(
        nodes_added = stats.nodes_added,
        edges_added = stats.edges_added,
        n_nodes = stats.n_nodes,
        "graph updated through the admin socket"
    );
    Ok(AdminResponse::Updated {
        nodes_added: stats.nodes_added,
        edges_added: stats.edges_added,
        n_nodes: stats.n_nodes,
        generation: stats.generation,
    })
}

fn refuse_while_following(core: &Core) -> anyhow::Result<()> {
    if let Some(updates) = &core.updates {
        bail!(
            "this sidecar follows the update stream {}: publish the change there (`sidecar \
             publish`, docs/updates.md) so that every replica applies it",
            updates.stream
        );
    }
    Ok(())
}

fn status(daemon: &Daemon) -> StatusReport {
    let core = daemon.core();
    let graph = core.map(|c| c.graph.counts());
    let updates = core.and_then(|c| c.updates.as_ref()).map(|u| u.snapshot());
    let tiers = core.map(tier_snapshot).unwrap_or_default();
    let ring = daemon.ring.snapshot().segment;
    StatusReport {
        server: format!("sidecar {}", env!("CARGO_PKG_VERSION")),
        shm_name: daemon.config.shm_name.clone(),
        phase: daemon.phase().name().into(),
        ready: daemon.is_ready(),
        uptime_s: daemon.started.elapsed().as_secs_f64(),
        feature_dim: core
            .and_then(|c| c.one_type().ok())
            .map_or(0, |f| f.feature_dim() as u32),
        graph_version: graph.map_or(0, |g| g.graph_version),
        n_nodes: graph.map_or(0, |g| g.nodes),
        n_edges: graph.map_or(0, |g| g.edges),
        graph_generation: graph.map_or(0, |g| g.generation),
        store: match core {
            None => "not open yet".into(),
            Some(Core {
                ring_schema: Some(schema),
                ..
            }) => format!(
                "typed graph: {} node types, {} edge types",
                schema.node_types.len(),
                schema.edge_types.len()
            ),
            Some(c) => match c.one_type().ok().map(|f| (&f.store, &f.redis)) {
                Some((Some(_), Some(_))) => "redis+l2".into(),
                Some((None, Some(_))) => "redis".into(),
                Some((Some(_), None)) => "rocksdb".into(),
                Some((None, None)) | None => "none".into(),
            },
        },
        fanouts: daemon.knobs.fanouts(),
        max_fanouts: daemon.knobs.max_fanouts(),
        deadline_ms: daemon.knobs.deadline().as_secs_f64() * 1e3,
        log_level: daemon.log.as_ref().map_or_else(String::new, |l| l.level()),
        slots: ring.as_ref().map_or(0, |r| r.slots),
        slots_used: ring.as_ref().map_or(0, |r| r.occupancy.used()),
        clients: ring.as_ref().map_or(0, |r| r.clients),
        l1_rows: tiers.l1_rows,
        l1_bytes: tiers.l1_bytes,
        pinned_rows: tiers.pinned_rows,
        update_position: match (&updates, graph) {
            (Some(u), _) => u.position.to_string(),
            (None, Some(g)) => g.position.to_string(),
            (None, None) => String::new(),
        },
        update_lag_s: updates.as_ref().map_or(0.0, |u| u.lag_seconds),
        updates_stream: updates.map_or_else(String::new, |u| u.stream),
    }
}

fn distribution(name: &str, histogram: &daemon_kit::metrics::Histogram) -> Distribution {
    let h = histogram.snapshot();
    Distribution {
        name: name.to_string(),
        count: h.count,
        mean: h.mean(),
        p50: h.quantile(0.5),
        p90: h.quantile(0.9),
        p99: h.quantile(0.99),
    }
}

/// The tiers' counters of the whole sidecar: its node types' summed (a
/// one-type graph's one type's).
fn tier_snapshot(core: &Core) -> crate::features::tiers::TierSnapshot {
    let snapshots: Vec<_> = core
        .features
        .types
        .iter()
        .flatten()
        .map(|f| f.tiers.snapshot())
        .collect();
    crate::features::tiers::TierSnapshot::sum(&snapshots)
}

/// The stats report, from the serving path's histograms and the tiers' and
/// the ring's snapshots (what `/metrics` encodes of them).
fn stats(daemon: &Daemon) -> StatsReport {
    use crate::daemon::metrics::STAGES;
    let m = &daemon.metrics;
    let stages = STAGES
        .iter()
        .map(|&stage| distribution(stage, &m.stage(stage)))
        .collect();
    let t = daemon.core().map(tier_snapshot).unwrap_or_default();
    let fallbacks: Vec<(String, u64)> = t
        .fallback_rows()
        .iter()
        .map(|&(cause, n)| (cause.to_string(), n))
        .collect();
    let mut tier_rows: Vec<(String, u64)> = t
        .tier_rows()
        .iter()
        .map(|&(tier, n)| (tier.to_string(), n))
        .collect();
    tier_rows.push(("default".into(), fallbacks.iter().map(|(_, n)| n).sum()));
    let served: u64 = tier_rows.iter().map(|(_, n)| n).sum();
    let tiers = tier_rows
        .into_iter()
        .map(|(tier, rows)| TierRows {
            ratio: if served == 0 {
                0.0
            } else {
                rows as f64 / served as f64
            },
            tier,
            rows,
        })
        .collect();
    let ring = match daemon.ring.snapshot().segment {
        Some(r) => {
            let o = r.occupancy;
            RingOccupancy {
                slots: r.slots,
                free: o.free,
                claimed: o.claimed,
                submitted: o.submitted,
                serving: o.serving,
                published: o.published,
                abandoned: o.abandoned,
                clients: r.clients,
            }
        }
        None => RingOccupancy {
            slots: 0,
            free: 0,
            claimed: 0,
            submitted: 0,
            serving: 0,
            published: 0,
            abandoned: 0,
            clients: 0,
        },
    };
    StatsReport {
        batches: m.batches.get(),
        requests: m.requests.get(),
        stages,
        neighbor_fetch_count: distribution("neighbor_fetch_count", &m.neighbor_fetch_count),
        tiers,
        fallbacks,
        deadline_misses: m.deadline_misses.get(),
        ring,
    }
}
