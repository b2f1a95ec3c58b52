//! The admin Unix socket: `sidecarctl` talks to a running sidecar here.
//!
//! Commands (frames in [`protocol::admin`]): `status`, `add-nodes` (graph
//! updates with feature rows: inductive serving), `invalidate`, `shutdown`.
//! The socket file is created with mode 0600 and every connection's peer
//! credentials are checked: only root or the sidecar's own uid may talk to
//! it. Connections are served on their own threads, at most
//! [`MAX_CONNECTIONS`] at a time; a malformed frame closes that connection
//! only.

use std::io::BufReader;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

use anyhow::{ensure, Context};
use nix::sys::socket::{getsockopt, sockopt::PeerCredentials};
use protocol::admin::{
    read_frame, write_frame, AdminRequest, AdminResponse, FrameError, StatusReport, ADMIN_VERSION,
};

use crate::features::contract::encode_row;
use crate::features::rocks::Role;
use crate::serve::Daemon;

/// Most admin connections served at once.
pub const MAX_CONNECTIONS: usize = 8;

/// The running admin socket; dropping it stops accepting and removes the file.
#[derive(Debug)]
pub struct AdminServer {
    path: PathBuf,
    stop: Arc<std::sync::atomic::AtomicBool>,
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
                "{} exists and is not a socket: choose another --admin-socket",
                path.display()
            );
            ensure!(
                UnixStream::connect(path).is_err(),
                "another sidecar answers on {}: stop it or choose another --admin-socket",
                path.display()
            );
            std::fs::remove_file(path)?;
        }
        let listener = UnixListener::bind(path)
            .with_context(|| format!("binding the admin socket {}", path.display()))?;
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
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

fn accept_loop(
    listener: &UnixListener,
    stop: &std::sync::atomic::AtomicBool,
    daemon: Arc<Daemon>,
    runtime: tokio::runtime::Handle,
) {
    let active = Arc::new(AtomicUsize::new(0));
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
        if active.fetch_add(1, Ordering::AcqRel) >= MAX_CONNECTIONS {
            active.fetch_sub(1, Ordering::AcqRel);
            let mut stream = stream;
            let _ = write_frame(
                &mut stream,
                &AdminResponse::Error {
                    message: format!("too many admin connections (at most {MAX_CONNECTIONS})"),
                },
            );
            continue;
        }
        let (daemon, runtime, active) = (daemon.clone(), runtime.clone(), active.clone());
        let spawned = std::thread::Builder::new()
            .name("admin-conn".into())
            .spawn(move || {
                if let Err(e) = serve_connection(stream, &daemon, &runtime) {
                    tracing::warn!(error = %e, "admin connection ended with an error");
                }
                active.fetch_sub(1, Ordering::AcqRel);
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
) -> Result<(), FrameError> {
    let mut writer = stream.try_clone()?;
    let mut reader = BufReader::new(stream);
    match read_frame::<AdminRequest>(&mut reader)? {
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
        let response = handle(request, daemon, runtime).unwrap_or_else(|e| AdminResponse::Error {
            message: format!("{e:#}"),
        });
        write_frame(&mut writer, &response)?;
    }
}

fn handle(
    request: AdminRequest,
    daemon: &Daemon,
    runtime: &tokio::runtime::Handle,
) -> anyhow::Result<AdminResponse> {
    Ok(match request {
        AdminRequest::Hello { .. } => AdminResponse::Error {
            message: "handshake already done".into(),
        },
        AdminRequest::Status => AdminResponse::Status(status(daemon)),
        AdminRequest::AddNodes {
            nodes,
            edges,
            undirected,
        } => {
            let dim = daemon.feature_dim;
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
            match (&daemon.store, &daemon.redis) {
                (Some(store), None) if store.role() == Role::StoreOfRecord => {
                    store.put_many(rows.iter().map(|(id, row)| (*id, row.as_slice())))?
                }
                (_, Some(redis)) => runtime
                    .block_on(redis.set_many(&rows))
                    .context("writing the new rows to Redis")?,
                _ => anyhow::bail!("no feature store to write the new rows to"),
            }
            runtime.block_on(daemon.tiers.invalidate(&ids));
            let before = daemon.graph.snapshot().n_nodes();
            let stats = daemon.graph.add_edges_and_nodes(&edges, &ids, undirected)?;
            tracing::info!(
                nodes = ids.len(),
                edges = stats.edges_added,
                n_nodes = stats.n_nodes,
                "graph updated through the admin socket"
            );
            AdminResponse::Updated {
                nodes_added: stats.n_nodes.saturating_sub(before),
                edges_added: stats.edges_added,
                n_nodes: stats.n_nodes,
                generation: stats.generation,
            }
        }
        AdminRequest::Invalidate { ids } => {
            runtime.block_on(daemon.tiers.invalidate(&ids));
            AdminResponse::Invalidated {
                ids: ids.len() as u64,
            }
        }
        AdminRequest::Shutdown => {
            daemon.stop.store(true, Ordering::Release);
            AdminResponse::ShuttingDown
        }
    })
}

fn status(daemon: &Daemon) -> StatusReport {
    let graph = daemon.graph.snapshot();
    StatusReport {
        shm_name: daemon.shm_name.clone(),
        ready: daemon.tiers.is_ready(),
        uptime_s: daemon.started.elapsed().as_secs_f64(),
        feature_dim: daemon.feature_dim as u32,
        graph_version: graph.graph_version(),
        n_nodes: graph.n_nodes(),
        n_edges: graph.n_edges(),
        graph_generation: graph.generation(),
        counters: crate::serve::metrics::samples(daemon)
            .iter()
            .map(|sample| (sample.key.to_string(), sample.value))
            .collect(),
    }
}
