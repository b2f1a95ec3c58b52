//! The admin wire format: what `sidecarctl` and the sidecar's admin Unix
//! socket exchange.
//!
//! A frame is a u32 little-endian length followed by that many bytes of a
//! `bincode` 2 (standard configuration, serde) encoding of an
//! [`AdminRequest`] or [`AdminResponse`]. The first frame each way is the
//! handshake: the client sends [`AdminRequest::Hello`] with its
//! [`ADMIN_VERSION`]; the sidecar answers [`AdminResponse::Hello`] or, for
//! another version, an [`AdminResponse::Error`] naming both versions, and
//! closes. Then any number of request/response pairs, in order.
//!
//! A request may be answered by several frames: a long command (`warm`)
//! sends [`AdminResponse::Progress`] frames before its final answer.
//!
//! bincode is pinned (`=2.0.1`) and used only in this module.
//! docs/admin.md specifies the bytes, for clients in other languages.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Version of the admin frames; bumped on any incompatible change.
pub const ADMIN_VERSION: u32 = 2;

/// Largest frame either side accepts (a graph update with features).
pub const MAX_FRAME_BYTES: u32 = 64 << 20;

/// The frame codec: bincode's standard encoding, with no length inside a
/// frame allowed to claim more bytes than a frame holds, so that a hostile
/// string or list length is refused before any memory is set aside for it
/// (found by the `admin_frame` fuzz target).
fn codec() -> impl bincode::config::Config {
    bincode::config::standard().with_limit::<{ MAX_FRAME_BYTES as usize }>()
}

/// A request to the sidecar. The variant order is the wire format (bincode
/// writes the variant index): append, never reorder. docs/admin.md lists
/// every variant with its index.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminRequest {
    /// The handshake (first frame).
    Hello {
        version: u32,
    },
    /// Readiness, phase, graph, knobs, ring.
    Status,
    /// Latency percentiles, tiers, fallbacks, ring occupancy.
    Stats,
    /// Readiness probe: `Probe { ok }`.
    Ready,
    /// Liveness probe: `Probe { ok }`.
    Live,
    /// Pins the `k` highest-degree nodes in L1 (of a typed graph: the `k`
    /// nodes with the most edges over its node types with features); answers
    /// `Progress` frames, then `Warmed`.
    WarmTop {
        k: u64,
    },
    /// Pins these nodes in L1 (answers `Progress` frames, then `Warmed`).
    WarmIds {
        ids: Vec<u64>,
    },
    /// Evicts rows from L1 (pinned set included) and from an L2 cache.
    Invalidate {
        ids: Vec<u64>,
    },
    GetFanouts,
    /// Sets the fanouts of requests that leave them to the sidecar.
    SetFanouts {
        fanouts: [u32; 2],
    },
    GetDeadline,
    /// Sets the feature-fetch deadline, milliseconds.
    SetDeadline {
        ms: f64,
    },
    GetLogLevel,
    SetLogLevel {
        level: String,
    },
    /// Adds nodes (with their feature rows) and edges while serving. Rows
    /// are written to the feature store first, then the graph snapshot that
    /// makes them reachable is published.
    AddNodes {
        nodes: Vec<NewNode>,
        edges: Vec<(u64, u64)>,
        /// Add the reverse of every edge too.
        undirected: bool,
    },
    /// Adds edges between nodes (unknown endpoints become nodes).
    AddEdges {
        edges: Vec<(u64, u64)>,
        undirected: bool,
    },
    /// Rewrites the graph index with every update folded in.
    Compact,
    /// Empties L1 (cache and pinned set) and/or the L2 cache.
    FlushCache {
        l1: bool,
        l2: bool,
    },
    /// Stops taking new requests, answers what is submitted and what the
    /// workers had accepted, reports when both are done (`Drained`). With `after_s` > 0 the sidecar first
    /// reports not ready and keeps serving that long (so the pod's worker
    /// and the Service stop sending first).
    Drain {
        after_s: f64,
    },
    /// Drains and stops the sidecar.
    Shutdown,
    /// A digest of the served graph (index and delta), with its counts.
    GraphChecksum,
    /// Adds a node of a typed graph's node type, with its row (empty for a
    /// type without features) and edges per edge type, in one snapshot.
    TypedAddNode {
        node_type: String,
        id: u64,
        features: Vec<f32>,
        /// `(edge type, [(src, dst)])`.
        edges: Vec<(String, Vec<(u64, u64)>)>,
    },
    /// Adds edges of one edge type of a typed graph.
    TypedAddEdges {
        edge_type: String,
        edges: Vec<(u64, u64)>,
    },
    /// Pins these nodes of one node type of a typed graph in its L1
    /// (answers `Progress` frames, then `Warmed`).
    TypedWarmIds {
        node_type: String,
        ids: Vec<u64>,
    },
    /// Evicts rows of one node type of a typed graph from its caches.
    TypedInvalidate {
        node_type: String,
        ids: Vec<u64>,
    },
    /// Adds edges of one edge type whose edges carry data, with their data
    /// as text: per edge, its attributes, then its weight, then its time,
    /// separated by white space (docs/graph-index.md, "Edge data"; checked
    /// against the edge type). Answered `Updated`.
    AddEdgesWithData {
        edge_type: String,
        edges: Vec<(u64, u64)>,
        data: String,
    },
    /// [`AdminRequest::TypedAddNode`] whose edges of an edge type with
    /// data carry it: `data` holds, per entry of `edges`, its edges' data
    /// as [`AdminRequest::AddEdgesWithData`] takes it (`None` for an edge
    /// type without data).
    TypedAddNodeWithData {
        node_type: String,
        id: u64,
        features: Vec<f32>,
        edges: Vec<(String, Vec<(u64, u64)>)>,
        data: Vec<Option<String>>,
    },
}

/// A node added while serving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewNode {
    pub id: u64,
    /// Its feature row (the segment's feature dim).
    pub features: Vec<f32>,
}

/// The sidecar's answer. The variant order is the wire format.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminResponse {
    Hello {
        version: u32,
        server: String,
    },
    /// The request failed; the message names the problem and the fix.
    Error {
        message: String,
    },
    Status(StatusReport),
    Stats(StatsReport),
    /// A probe's answer: `ok`, and why not.
    Probe {
        ok: bool,
        reason: String,
    },
    /// Progress of a long command; more frames follow.
    Progress {
        done: u64,
        total: u64,
    },
    Warmed {
        /// Rows pinned by this command.
        pinned: u64,
        requested: u64,
        /// Rows in the pinned set now.
        pinned_total: u64,
        seconds: f64,
    },
    Invalidated {
        ids: u64,
    },
    Fanouts {
        fanouts: [u32; 2],
        max_fanouts: [u32; 2],
    },
    Deadline {
        ms: f64,
    },
    LogLevel {
        level: String,
    },
    Updated {
        nodes_added: u64,
        edges_added: u64,
        n_nodes: u64,
        generation: u64,
    },
    Compacted {
        n_nodes: u64,
        n_edges: u64,
        generation: u64,
        seconds: f64,
    },
    Flushed {
        /// L1 rows dropped (cache).
        l1_rows: u64,
        /// Pinned rows dropped.
        pinned_rows: u64,
        /// Whether the L2 cache was emptied.
        l2: bool,
    },
    Drained {
        /// Requests answered since the drain began.
        answered: u64,
        /// Requests still submitted plus calls the workers had accepted and
        /// not finished when the drain ended (0 unless it timed out; a call
        /// in the ring may count twice).
        pending: u64,
        seconds: f64,
        /// False when the drain timed out with requests still pending.
        complete: bool,
    },
    ShuttingDown,
    /// Equal on replicas that applied the same updates, compacted or not.
    GraphChecksum {
        /// 16 hex digits.
        checksum: String,
        n_nodes: u64,
        n_edges: u64,
        generation: u64,
        /// The last update-stream entry applied (`ms-seq`; `0-0`: none).
        position: String,
    },
}

/// What `sidecarctl status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// `sidecar <version>`.
    pub server: String,
    pub shm_name: String,
    /// starting, loading, warming-up, ready, draining, stopping.
    pub phase: String,
    pub ready: bool,
    pub uptime_s: f64,
    pub feature_dim: u32,
    pub graph_version: u64,
    pub n_nodes: u64,
    pub n_edges: u64,
    pub graph_generation: u64,
    /// `rocksdb` (embedded store of record) or `redis` (with `+l2` when an
    /// L2 cache is in front).
    pub store: String,
    /// The runtime knobs.
    pub fanouts: [u32; 2],
    pub max_fanouts: [u32; 2],
    pub deadline_ms: f64,
    pub log_level: String,
    /// Ring geometry and use.
    pub slots: u32,
    pub slots_used: u32,
    pub clients: u32,
    /// L1 occupancy.
    pub l1_rows: u64,
    pub l1_bytes: u64,
    pub pinned_rows: u64,
    /// The update stream followed (empty: none).
    pub updates_stream: String,
    /// The last entry applied (`ms-seq`).
    pub update_position: String,
    /// Now minus the time of the last applied entry while entries are
    /// pending; 0 when caught up.
    pub update_lag_s: f64,
}

/// One latency distribution, seconds (percentiles estimated from the
/// Prometheus histogram's buckets; `None` without observations).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Distribution {
    pub name: String,
    pub count: u64,
    pub mean: Option<f64>,
    pub p50: Option<f64>,
    pub p90: Option<f64>,
    pub p99: Option<f64>,
}

/// Rows served by one tier.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TierRows {
    /// l1, l2, l3 or default (fallback rows).
    pub tier: String,
    pub rows: u64,
    /// Share of all rows served.
    pub ratio: f64,
}

/// Slots per state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RingOccupancy {
    pub slots: u32,
    pub free: u32,
    pub claimed: u32,
    pub submitted: u32,
    pub serving: u32,
    pub published: u32,
    pub abandoned: u32,
    pub clients: u32,
}

/// What `sidecarctl stats` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatsReport {
    pub batches: u64,
    pub requests: u64,
    /// Time per batch in each stage (sample, fetch, batch).
    pub stages: Vec<Distribution>,
    /// Node-table rows per request: the sampled neighbourhood fetched.
    pub neighbor_fetch_count: Distribution,
    pub tiers: Vec<TierRows>,
    /// Default rows served, per cause.
    pub fallbacks: Vec<(String, u64)>,
    /// Requests whose batch served at least one row late (the deadline
    /// passed before it arrived).
    pub deadline_misses: u64,
    pub ring: RingOccupancy,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES} byte limit")]
    TooLarge(u32),
    #[error("malformed admin frame: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, message: &impl Serialize) -> Result<(), FrameError> {
    let body = bincode::serde::encode_to_vec(message, codec())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME_BYTES)
        .ok_or(FrameError::TooLarge(u32::MAX))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame; [`FrameError::Closed`] on a clean end of stream before
/// the length.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    // Grown as the bytes arrive, not set aside from the length alone.
    let mut body = Vec::new();
    r.take(u64::from(len)).read_to_end(&mut body)?;
    if body.len() != len as usize {
        return Err(FrameError::Io(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!("frame ended after {} of {len} bytes", body.len()),
        )));
    }
    let (message, used) = bincode::serde::decode_from_slice(&body, codec())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            body.len() - used
        )));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame_bytes(message: &impl Serialize) -> Vec<u8> {
        let mut buf = Vec::new();
        write_frame(&mut buf, message).unwrap();
        buf
    }

    /// The byte examples of docs/admin.md.
    #[test]
    fn frames_are_the_documented_bytes() {
        assert_eq!(
            frame_bytes(&AdminRequest::Hello { version: 2 }),
            [2, 0, 0, 0, 0x00, 0x02]
        );
        assert_eq!(frame_bytes(&AdminRequest::Status), [1, 0, 0, 0, 0x01]);
        assert_eq!(
            frame_bytes(&AdminRequest::SetFanouts { fanouts: [10, 5] }),
            [3, 0, 0, 0, 0x09, 0x0a, 0x05]
        );
        assert_eq!(
            frame_bytes(&AdminRequest::Invalidate { ids: vec![7, 300] }),
            [6, 0, 0, 0, 0x07, 0x02, 0x07, 0xfb, 0x2c, 0x01]
        );
        let mut deadline = vec![9, 0, 0, 0, 0x0b];
        deadline.extend_from_slice(&12.5f64.to_le_bytes());
        assert_eq!(
            frame_bytes(&AdminRequest::SetDeadline { ms: 12.5 }),
            deadline
        );
        assert_eq!(
            frame_bytes(&AdminResponse::Probe {
                ok: false,
                reason: "draining".into()
            }),
            [11, 0, 0, 0, 0x04, 0x00, 0x08, b'd', b'r', b'a', b'i', b'n', b'i', b'n', b'g']
        );
        assert_eq!(frame_bytes(&AdminRequest::Shutdown), [1, 0, 0, 0, 19]);
        assert_eq!(frame_bytes(&AdminResponse::ShuttingDown), [1, 0, 0, 0, 15]);
    }

    /// One request of every variant, with its name: the match is
    /// exhaustive, so a new variant does not compile here until it is
    /// listed (and then the test below wants its row in docs/admin.md).
    fn every_request() -> Vec<(AdminRequest, &'static str)> {
        use AdminRequest as R;
        let all = vec![
            R::Hello { version: 2 },
            R::Status,
            R::Stats,
            R::Ready,
            R::Live,
            R::WarmTop { k: 1 },
            R::WarmIds { ids: vec![] },
            R::Invalidate { ids: vec![] },
            R::GetFanouts,
            R::SetFanouts { fanouts: [1, 1] },
            R::GetDeadline,
            R::SetDeadline { ms: 1.0 },
            R::GetLogLevel,
            R::SetLogLevel {
                level: String::new(),
            },
            R::AddNodes {
                nodes: vec![],
                edges: vec![],
                undirected: false,
            },
            R::AddEdges {
                edges: vec![],
                undirected: false,
            },
            R::Compact,
            R::FlushCache {
                l1: false,
                l2: false,
            },
            R::Drain { after_s: 0.0 },
            R::Shutdown,
            R::GraphChecksum,
            R::TypedAddNode {
                node_type: String::new(),
                id: 0,
                features: vec![],
                edges: vec![],
            },
            R::TypedAddEdges {
                edge_type: String::new(),
                edges: vec![],
            },
            R::TypedWarmIds {
                node_type: String::new(),
                ids: vec![],
            },
            R::TypedInvalidate {
                node_type: String::new(),
                ids: vec![],
            },
            R::AddEdgesWithData {
                edge_type: String::new(),
                edges: vec![],
                data: String::new(),
            },
            R::TypedAddNodeWithData {
                node_type: String::new(),
                id: 0,
                features: vec![],
                edges: vec![],
                data: vec![],
            },
        ];
        all.into_iter()
            .map(|r| {
                let name = match r {
                    R::Hello { .. } => "Hello",
                    R::Status => "Status",
                    R::Stats => "Stats",
                    R::Ready => "Ready",
                    R::Live => "Live",
                    R::WarmTop { .. } => "WarmTop",
                    R::WarmIds { .. } => "WarmIds",
                    R::Invalidate { .. } => "Invalidate",
                    R::GetFanouts => "GetFanouts",
                    R::SetFanouts { .. } => "SetFanouts",
                    R::GetDeadline => "GetDeadline",
                    R::SetDeadline { .. } => "SetDeadline",
                    R::GetLogLevel => "GetLogLevel",
                    R::SetLogLevel { .. } => "SetLogLevel",
                    R::AddNodes { .. } => "AddNodes",
                    R::AddEdges { .. } => "AddEdges",
                    R::Compact => "Compact",
                    R::FlushCache { .. } => "FlushCache",
                    R::Drain { .. } => "Drain",
                    R::Shutdown => "Shutdown",
                    R::GraphChecksum => "GraphChecksum",
                    R::TypedAddNode { .. } => "TypedAddNode",
                    R::TypedAddEdges { .. } => "TypedAddEdges",
                    R::TypedWarmIds { .. } => "TypedWarmIds",
                    R::TypedInvalidate { .. } => "TypedInvalidate",
                    R::AddEdgesWithData { .. } => "AddEdgesWithData",
                    R::TypedAddNodeWithData { .. } => "TypedAddNodeWithData",
                };
                (r, name)
            })
            .collect()
    }

    /// docs/admin.md's table of requests is every variant at the index
    /// the encoding writes, and nothing else.
    #[test]
    fn the_documented_request_table_is_every_variant() {
        let doc = std::fs::read_to_string(
            // Cargo's run-time value first: a binary reused from a shared
            // target directory may have been compiled in another checkout.
            std::env::var_os("CARGO_MANIFEST_DIR")
                .map_or_else(
                    || env!("CARGO_MANIFEST_DIR").into(),
                    std::path::PathBuf::from,
                )
                .join("../docs/admin.md"),
        )
        .expect("docs/admin.md");
        let table = doc
            .split("**Requests**")
            .nth(1)
            .and_then(|rest| rest.split("**Responses**").next())
            .expect("docs/admin.md has the Requests table");
        let documented: Vec<(u8, String)> = table
            .lines()
            .filter_map(|line| {
                let cells: Vec<&str> = line.split('|').map(str::trim).collect();
                let index = cells.get(1)?.parse().ok()?;
                Some((index, cells.get(2)?.trim_matches('`').to_string()))
            })
            .collect();
        let encoded: Vec<(u8, String)> = every_request()
            .iter()
            .map(|(r, name)| (frame_bytes(r)[4], name.to_string()))
            .collect();
        assert_eq!(documented, encoded);
    }

    #[test]
    fn frames_round_trip_and_bad_bytes_are_errors() {
        let request = AdminRequest::AddNodes {
            nodes: vec![NewNode {
                id: 7,
                features: vec![1.0, 2.5],
            }],
            edges: vec![(7, 1)],
            undirected: true,
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &request).unwrap();
        assert_eq!(read_frame::<AdminRequest>(&mut &buf[..]).unwrap(), request);
        // Truncated, oversized, garbage, empty.
        assert!(read_frame::<AdminRequest>(&mut &buf[..buf.len() - 1]).is_err());
        let huge = (MAX_FRAME_BYTES + 1).to_le_bytes();
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &huge[..]),
            Err(FrameError::TooLarge(_))
        ));
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &garbage[..]),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &[][..]),
            Err(FrameError::Closed)
        ));
    }

    /// Inputs the `admin_frame` fuzz target found (scripts/fuzz.sh): a
    /// length inside the frame that claims far more than the frame holds
    /// made the decoder set aside that much memory and abort.
    #[test]
    fn fuzzer_found_frames_are_refused() {
        let found: &[&[u8]] = &[include_bytes!(
            "../../tests/regressions/admin_frame_huge_length.bin"
        )];
        for bytes in found {
            assert!(read_frame::<AdminRequest>(&mut &bytes[..]).is_err());
            assert!(read_frame::<AdminResponse>(&mut &bytes[..]).is_err());
        }
    }
}
