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
//! [`MAX_CONNECTIONS`] at a time. At the cap, a new connection closes the
//! one that has waited longest without saying Hello, if that is at least
//! [`HELLO_GRACE`] (it gets an error frame saying why), so silent
//! connections, however many and however fast they come back, cannot lock
//! an operator or a probe out (`sidecarctl` tries again when it is turned
//! away); otherwise the new one gets the error frame and closes. A connection must send its Hello within [`HELLO_TIMEOUT`], and
//! each later frame whole within [`IDLE_TIMEOUT`] of the previous answer,
//! or it is closed. A malformed frame closes that connection only.

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
use crate::daemon::Daemon;
use crate::features::contract::encode_row;
use crate::features::rocks::Role;
use crate::updates::typed_entry::TypedOp;

/// Most admin connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// A connection whose next frame has not fully arrived this long after the
/// previous answer is closed.
pub const IDLE_TIMEOUT: Duration = Duration::from_secs(30);

/// A connection whose Hello has not fully arrived this long after it was
/// accepted is closed.
pub const HELLO_TIMEOUT: Duration = Duration::from_secs(2);

/// At the connection cap, a connection silent this long (no Hello yet) may
/// be closed to make room for a new one.
pub const HELLO_GRACE: Duration = Duration::from_millis(100);

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

/// One served connection, as the accept loop sees it.
struct Slot {
    id: u64,
    accepted: Instant,
    /// Set once its Hello was read.
    hello: Arc<AtomicBool>,
    /// A handle on its socket, to close it to make room.
    stream: UnixStream,
}

/// Room for one more connection in `slots` (at most [`MAX_CONNECTIONS`]):
/// at the cap, closes the connection that has waited longest without a
/// Hello, telling it why; `false` when every connection has said Hello.
fn make_room(slots: &mut Vec<Slot>) -> bool {
    if slots.len() < MAX_CONNECTIONS {
        return true;
    }
    // A connection gets HELLO_GRACE to say Hello before it can be closed
    // for one: a client that says it at once is never pushed out by a
    // stream of silent ones.
    let silent = slots
        .iter()
        .enumerate()
        .filter(|(_, s)| !s.hello.load(Ordering::Acquire) && s.accepted.elapsed() >= HELLO_GRACE)
        .min_by_key(|(_, s)| s.accepted)
        .map(|(i, _)| i);
    let Some(i) = silent else {
        return false;
    };
    let mut evicted = slots.swap_remove(i).stream;
    let _ = evicted.set_write_timeout(Some(Duration::from_millis(100)));
    let _ = write_frame(
        &mut evicted,
        &AdminResponse::Error {
            message: format!(
                "closed to make room: {MAX_CONNECTIONS} admin connections were open and this \
                 one had said no Hello"
            ),
        },
    );
    let _ = evicted.shutdown(std::net::Shutdown::Both);
    true
}

fn accept_loop(
    listener: &UnixListener,
    stop: &AtomicBool,
    daemon: Arc<Daemon>,
    runtime: tokio::runtime::Handle,
) {
    let slots: Arc<std::sync::Mutex<Vec<Slot>>> = Arc::default();
    let mut next_id = 0u64;
    let own_uid = nix::unistd::getuid().as_raw();
    for stream in listener.incoming() {
        if stop.load(Ordering::Acquire) {
            break;
        }
        let Ok(stream) = stream else { continue };
        match getsockopt(&stream, PeerCredentials) {
            Ok(cred) if cred.uid() == own_uid || cred.uid() == 0 => {}
            Ok(cred) => {
                tracing::warn!(
                    peer_uid = cred.uid(),
                    "admin connection refused: not root nor the sidecar's user"
                );
                continue;
            }
            Err(e) => {
                tracing::warn!(error = %e, "admin connection refused: no peer credentials");
                continue;
            }
        }
        let hello = Arc::new(AtomicBool::new(false));
        let id = next_id;
        next_id += 1;
        {
            let mut slots = slots.lock().unwrap_or_else(|p| p.into_inner());
            let handle = stream.try_clone();
            if !make_room(&mut slots) || handle.is_err() {
                drop(slots);
                let mut stream = stream;
                let _ = write_frame(
                    &mut stream,
                    &AdminResponse::Error {
                        message: format!(
                            "too many admin connections (at most {MAX_CONNECTIONS}); retry \
                             shortly"
                        ),
                    },
                );
                continue;
            }
            slots.push(Slot {
                id,
                accepted: Instant::now(),
                hello: hello.clone(),
                stream: handle.expect("checked above"),
            });
        }
        let (daemon, runtime, slots) = (daemon.clone(), runtime.clone(), slots.clone());
        let spawned = std::thread::Builder::new()
            .name("admin-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(stream, &daemon, &runtime, &hello) {
                    tracing::warn!(error = %e, "admin connection ended with an error");
                }
                slots
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .retain(|s| s.id != id);
            });
        if spawned.is_err() {
            tracing::error!("could not spawn an admin connection thread");
        }
    }
}

fn serve_connection(
    stream: UnixStream,
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    hello: &AtomicBool,
) -> Result<(), FrameError> {
    let mut writer = stream.try_clone()?;
    writer.set_write_timeout(Some(IDLE_TIMEOUT))?;
    let mut reader = BufReader::new(DeadlineReader {
        stream,
        until: Instant::now() + HELLO_TIMEOUT,
    });
    let first = read_frame::<AdminRequest>(&mut reader)?;
    hello.store(true, Ordering::Release);
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
        reader.get_mut().until = Instant::now() + IDLE_TIMEOUT;
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
        let response = handle(request, daemon, runtime, &mut send_progress).unwrap_or_else(|e| {
            AdminResponse::Error {
                message: format!("{e:#}"),
            }
        });
        if let Some(e) = progress_error {
            return Err(e);
        }
        write_frame(&mut writer, &response)?;
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
        if let Some(typed) = daemon.core().and_then(|c| c.typed.as_ref()) {
            let typed_form = match command {
                "invalidate" => Some("sidecarctl invalidate --type TYPE ID..."),
                "graph add-node" => Some("sidecarctl graph add-node --type TYPE ID ..."),
                "graph add-edges" => Some("sidecarctl graph add-edges --edge-type EDGE_TYPE ..."),
                _ => None,
            };
            match typed_form {
                Some(form) => bail!(
                    "this sidecar serves a typed graph ({}): name the type (`{form}`, \
                     docs/updates.md, \"Typed graphs\")",
                    typed.ring.describe()
                ),
                None => bail!(
                    "this sidecar serves a typed graph ({}); `{command}` is for one-type graphs \
                     in this release (docs/graph-index.md, \"Serving a typed graph\")",
                    typed.ring.describe()
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
            let ids: Vec<u64> = core
                .graph
                .snapshot()
                .base()
                .top_degree(k)
                .into_iter()
                .map(u64::from)
                .collect();
            warm(daemon, runtime, &ids, progress)?
        }
        AdminRequest::WarmIds { ids } => {
            let core = daemon.loaded()?;
            let graph = core.graph.snapshot();
            if let Some(&unknown) = ids.iter().find(|&&id| !graph.is_known(id)) {
                bail!(
                    "node {unknown} is not in the graph ({} nodes): warm known nodes only",
                    graph.n_nodes()
                );
            }
            warm(daemon, runtime, &ids, progress)?
        }
        AdminRequest::Invalidate { ids } => {
            let core = daemon.loaded()?;
            runtime.block_on(core.tiers.invalidate(&ids));
            daemon
                .metrics
                .admin_invalidated_ids
                .inc_by(ids.len() as u64);
            AdminResponse::Invalidated {
                ids: ids.len() as u64,
            }
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
            let core = daemon.loaded()?;
            refuse_while_following(core)?;
            let dim = core.feature_dim;
            for node in &nodes {
                ensure!(
                    node.features.len() == dim,
                    "node {} has {} features; the sidecar serves rows of {dim}",
                    node.id,
                    node.features.len()
                );
            }
            // Rows first, then the graph: a node is never reachable before
            // its features are stored.
            let rows: Vec<(u64, Vec<u8>)> = nodes
                .iter()
                .map(|n| (n.id, encode_row(&n.features)))
                .collect();
            let ids: Vec<u64> = nodes.iter().map(|n| n.id).collect();
            match (&core.store, &core.redis) {
                (Some(store), None) if store.role() == Role::StoreOfRecord => {
                    store.put_many(rows.iter().map(|(id, row)| (*id, row.as_slice())))?
                }
                (_, Some(redis)) => runtime
                    .block_on(redis.set_many(&rows))
                    .context("writing the new rows to Redis")?,
                _ => bail!("no feature store to write the new rows to"),
            }
            runtime.block_on(core.tiers.invalidate(&ids));
            let stats = core.graph.add_edges_and_nodes(&edges, &ids, undirected)?;
            tracing::info!(
                nodes = ids.len(),
                edges = stats.edges_added,
                n_nodes = stats.n_nodes,
                "graph updated through the admin socket"
            );
            AdminResponse::Updated {
                nodes_added: stats.nodes_added,
                edges_added: stats.edges_added,
                n_nodes: stats.n_nodes,
                generation: stats.generation,
            }
        }
        AdminRequest::AddEdges { edges, undirected } => {
            let core = daemon.loaded()?;
            refuse_while_following(core)?;
            let stats = core.graph.add_edges(&edges, undirected)?;
            tracing::info!(
                edges = stats.edges_added,
                ignored = stats.edges_ignored,
                n_nodes = stats.n_nodes,
                "edges added through the admin socket"
            );
            AdminResponse::Updated {
                nodes_added: stats.nodes_added,
                edges_added: stats.edges_added,
                n_nodes: stats.n_nodes,
                generation: stats.generation,
            }
        }
        AdminRequest::TypedAddNode {
            node_type,
            id,
            features,
            edges,
        } => typed_update(
            daemon,
            runtime,
            TypedOp::AddNode {
                node_type,
                id,
                row: (!features.is_empty()).then(|| encode_row(&features)),
                edges,
            },
        )?,
        AdminRequest::TypedAddEdges { edge_type, edges } => typed_update(
            daemon,
            runtime,
            TypedOp::AddEdges {
                edges: vec![(edge_type, edges)],
            },
        )?,
        AdminRequest::TypedInvalidate { node_type, ids } => {
            let n = ids.len() as u64;
            typed_update(daemon, runtime, TypedOp::Invalidate { node_type, ids })?;
            daemon.metrics.admin_invalidated_ids.inc_by(n);
            AdminResponse::Invalidated { ids: n }
        }
        AdminRequest::GraphChecksum => {
            // The typed graph where the sidecar serves one, else the graph.
            let (checksum, n_nodes, n_edges, generation, position) = match typed_graph(daemon) {
                Some(typed) => {
                    let g = typed.graph.snapshot();
                    let at = g.position();
                    (g.checksum(), g.n_nodes(), g.n_edges(), g.generation(), at)
                }
                None => {
                    let g = daemon.loaded()?.graph.snapshot();
                    let at = g.position();
                    (g.checksum(), g.n_nodes(), g.n_edges(), g.generation(), at)
                }
            };
            AdminResponse::GraphChecksum {
                checksum: format!("{checksum:016x}"),
                n_nodes,
                n_edges,
                generation,
                position: position.to_string(),
            }
        }
        AdminRequest::Compact if typed_graph(daemon).is_some() => {
            let typed = typed_graph(daemon).expect("checked");
            let compacted = typed.graph.compact(&daemon.config.data_dir)?;
            AdminResponse::Compacted {
                n_nodes: compacted.n_nodes,
                n_edges: compacted.n_edges,
                generation: compacted.generation,
                seconds: compacted.seconds,
            }
        }
        AdminRequest::Compact => {
            let core = daemon.loaded()?;
            let started = Instant::now();
            core.graph.compact(&core.index_path)?;
            let graph = core.graph.snapshot();
            AdminResponse::Compacted {
                n_nodes: graph.n_nodes(),
                n_edges: graph.n_edges(),
                generation: graph.generation(),
                seconds: started.elapsed().as_secs_f64(),
            }
        }
        AdminRequest::FlushCache { l1, l2 } => {
            let core = daemon.loaded()?;
            let l2_is_cache = core
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
                runtime.block_on(core.tiers.flush_l2())?;
            }
            let (l1_rows, pinned_rows) = if l1 {
                core.tiers.flush_l1(true)
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

fn warm(
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    ids: &[u64],
    progress: &mut dyn FnMut(u64, u64),
) -> anyhow::Result<AdminResponse> {
    let core = daemon.loaded()?;
    let started = Instant::now();
    let pinned = runtime.block_on(core.tiers.pin(ids, WARM_CHUNK, progress));
    let (_, pinned_total) = core.tiers.l1_rows();
    tracing::info!(
        pinned,
        requested = ids.len(),
        pinned_total,
        "warmed through the admin socket"
    );
    Ok(AdminResponse::Warmed {
        pinned: pinned as u64,
        requested: ids.len() as u64,
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
        AdminRequest::WarmTop { .. } | AdminRequest::WarmIds { .. } => "warm",
        AdminRequest::Invalidate { .. } => "invalidate",
        AdminRequest::AddNodes { .. } => "graph add-node",
        AdminRequest::AddEdges { .. } => "graph add-edges",
        AdminRequest::FlushCache { .. } => "flush-cache",
        _ => return None,
    })
}

/// The typed graph this sidecar serves, if it serves one.
fn typed_graph(daemon: &Daemon) -> Option<&Arc<crate::daemon::TypedServing>> {
    daemon.core().and_then(|c| c.typed.as_ref())
}

/// Applies one typed operation made through the admin socket: checked
/// against the graph's types (names, widths) as an update-stream entry is,
/// rows written to their type's store first, then evicted from its caches,
/// then the graph change published.
fn typed_update(
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
    op: TypedOp,
) -> anyhow::Result<AdminResponse> {
    let core = daemon.loaded()?;
    let Some(typed) = core.typed.as_ref() else {
        bail!(
            "this sidecar serves a one-type graph: give node ids without a node type or edge \
             type (drop --type / --edge-type)"
        );
    };
    refuse_while_following(core)?;
    let graph = typed.graph.snapshot();
    let change = op.resolve(graph.schema()).map_err(anyhow::Error::msg)?;
    if let Some(update) = &change.update {
        // Refused before any row is written (and checked again when applied).
        graph.check(update)?;
    }
    let schema = graph.schema();
    for (t, id, row) in &change.rows {
        let stores = typed.stores[*t]
            .as_ref()
            .expect("a row only for a type with features");
        let rows = [(*id, row.clone())];
        match (&stores.store, &stores.redis) {
            (Some(store), None) if store.role() == Role::StoreOfRecord => {
                store.put_many(rows.iter().map(|(id, row)| (*id, row.as_slice())))?
            }
            (_, Some(redis)) => runtime.block_on(redis.set_many(&rows)).with_context(|| {
                format!("writing the {} row to Redis", schema.node_types[*t].name)
            })?,
            _ => bail!("no feature store to write the new row to"),
        }
    }
    for (t, tiers) in typed.tiers.iter().enumerate() {
        let ids: Vec<u64> = change
            .evicted
            .iter()
            .filter(|(ty, _)| *ty == t)
            .map(|(_, id)| *id)
            .collect();
        if let (Some(tiers), false) = (tiers, ids.is_empty()) {
            runtime.block_on(tiers.invalidate(&ids));
        }
    }
    let Some(update) = change.update else {
        return Ok(AdminResponse::Invalidated {
            ids: change.evicted.len() as u64,
        });
    };
    let stats = typed.graph.update(update)?;
    tracing::info!(
        nodes_added = stats.nodes_added,
        edges_added = stats.edges_added,
        n_nodes = stats.n_nodes,
        "typed graph updated through the admin socket"
    );
    Ok(AdminResponse::Updated {
        nodes_added: stats.nodes_added,
        edges_added: stats.edges_added,
        n_nodes: stats.n_nodes,
        generation: stats.generation,
    })
}

fn refuse_while_following(core: &crate::daemon::Core) -> anyhow::Result<()> {
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
    let typed = core.and_then(|c| c.typed.as_ref());
    let graph = core.map(|c| {
        let mut counts = c.graph.counts();
        if let Some(typed) = typed {
            // A typed graph's totals over its types.
            let graph = typed.graph.snapshot();
            counts.nodes = graph.n_nodes();
            counts.edges = graph.n_edges();
            counts.generation = graph.generation();
            counts.position = graph.position();
        }
        counts
    });
    let updates = core.and_then(|c| c.updates.as_ref()).map(|u| u.snapshot());
    let tiers = core.map(|c| c.tiers.snapshot()).unwrap_or_default();
    let ring = daemon.ring.snapshot().segment;
    StatusReport {
        server: format!("sidecar {}", env!("CARGO_PKG_VERSION")),
        shm_name: daemon.config.shm_name.clone(),
        phase: daemon.phase().name().into(),
        ready: daemon.is_ready(),
        uptime_s: daemon.started.elapsed().as_secs_f64(),
        feature_dim: core.map_or(0, |c| c.feature_dim as u32),
        graph_version: graph.map_or(0, |g| g.graph_version),
        n_nodes: graph.map_or(0, |g| g.nodes),
        n_edges: graph.map_or(0, |g| g.edges),
        graph_generation: graph.map_or(0, |g| g.generation),
        store: match core {
            None => "not open yet".into(),
            Some(c) if c.typed.is_some() => {
                let typed = c.typed.as_ref().expect("checked");
                format!(
                    "typed graph: {} node types, {} edge types",
                    typed.ring.node_types.len(),
                    typed.ring.edge_types.len()
                )
            }
            Some(c) => match (&c.store, &c.redis) {
                (_, Some(_)) if c.store.is_some() => "redis+l2".into(),
                (_, Some(_)) => "redis".into(),
                (Some(_), None) => "rocksdb".into(),
                (None, None) => "none".into(),
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

/// The stats report, from the serving path's histograms and the tiers' and
/// the ring's snapshots (what `/metrics` encodes of them).
fn stats(daemon: &Daemon) -> StatsReport {
    use crate::daemon::metrics::STAGES;
    let m = &daemon.metrics;
    let stages = STAGES
        .iter()
        .map(|&stage| distribution(stage, &m.stage(stage)))
        .collect();
    let t = daemon
        .core()
        .map(|c| c.tiers.snapshot())
        .unwrap_or_default();
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
