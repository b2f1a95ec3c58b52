//! Creating, attaching to, validating and removing the shared-memory segment.
//!
//! Invariants this module upholds (and the rest of the crate relies on):
//! - A mapping is never dereferenced as a shared type before its size and the
//!   header fields that describe it (magic, version, fingerprints, geometry)
//!   were read with raw, unaligned copies and validated. After that, every
//!   reference formed into it is within bounds and aligned, because offsets
//!   come from the validated local copy of the geometry, not from the mapping.
//! - The geometry and schema are read once at attach and kept locally; later
//!   changes to those bytes by a buggy peer are ignored.
//! - Only the creator writes the header's plain (non-atomic) fields, and only
//!   before it publishes `server_state = READY` with Release.
//! - A segment is unlinked only by the sidecar that created it, and only if
//!   the name still refers to the same file (inode), so a sidecar that was
//!   presumed dead and replaced cannot remove its successor's segment.
//!
//! This module and `futex` are the crate's only `unsafe` code.
#![allow(unsafe_code)]

use std::fs::File;
use std::mem::{offset_of, size_of};
use std::os::fd::{AsFd, FromRawFd, IntoRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::ptr::NonNull;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::mman::{shm_open, shm_unlink};
use nix::sys::stat::{fchmod, Mode};

use crate::graph_schema::{EdgeDataDesc, GraphSchema, MAX_EDGE_TYPES, MAX_NODE_TYPES};
use crate::layout::{
    self, align_up, dtype, server_state, FeatureSchema, Geometry, Header, Preamble, SlotControl,
    TypeDesc, BUFFER_ALIGN, LAYOUT_VERSION, MAGIC, MAX_FANOUT, MAX_HOPS, MAX_SLOTS, MAX_TYPES,
    SLOT_ALIGN,
};
use crate::request::{self, request_bytes_for, request_bytes_with_new_node};
use crate::sync::Ordering;

/// Bytes of the preamble the sidecar keeps locked for its life.
const PREAMBLE_LOCK_LEN: usize = 64;

/// What the sidecar asks for when it creates a segment.
#[derive(Debug, Clone)]
pub struct SegmentConfig {
    /// Name under `/dev/shm` (no slashes).
    pub name: String,
    /// File mode; 0o600 by default, 0o660 when the pod's containers share a group.
    pub mode: u32,
    pub slot_count: u32,
    pub max_targets: u32,
    pub max_fanouts: [u32; MAX_HOPS],
    pub max_nodes: u32,
    /// Bytes of each slot's response area (Arrow tables and their header).
    pub response_bytes: u64,
    /// Edges of a new node (`NEW_NODE` requests) the request area holds
    /// besides its feature row.
    pub max_new_node_edges: u32,
    pub schema: FeatureSchema,
    /// A typed graph's node and edge types (then `schema.feature_dim` is
    /// 0); `None` for a one-type graph.
    pub graph: Option<GraphSchema>,
    /// What a one-type graph's edges carry (header offset 840); empty for
    /// a typed graph, whose schema says it per edge type.
    pub one_type_edge_data: EdgeDataDesc,
    pub heartbeat_interval: Duration,
    /// A client whose heartbeat stands still this long (and that holds no
    /// lock on its entry) is dead: its slots are reclaimed. Written into the
    /// header so that every client can read it.
    pub client_timeout: Duration,
    /// How long an existing segment's heartbeat must stand still before it is
    /// considered abandoned by a dead sidecar and taken over.
    pub stale_after: Duration,
}

/// The defaults of the ring's geometry: the one place they are written
/// (`sidecar serve` takes its defaults from here).
pub mod defaults {
    use std::time::Duration;

    use crate::layout::MAX_HOPS;

    pub const MODE: u32 = 0o600;
    pub const SLOT_COUNT: u32 = 64;
    pub const MAX_TARGETS: u32 = 64;
    pub const MAX_FANOUTS: [u32; MAX_HOPS] = [50, 50];
    pub const MAX_NODES: u32 = 65_536;
    pub const RESPONSE_BYTES: u64 = 8 << 20;
    pub const MAX_NEW_NODE_EDGES: u32 = 1024;
    pub const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(100);
    pub const STALE_AFTER: Duration = Duration::from_secs(1);
    /// How long a worker may stay silent before its slots are reclaimed.
    pub const CLIENT_TIMEOUT: Duration = Duration::from_secs(5);
}

impl SegmentConfig {
    /// A one-type graph's segment's graph: the 1x1 graph of its feature
    /// width whose edge type carries `one_type_edge_data`.
    fn one_type_graph(&self) -> GraphSchema {
        GraphSchema::one_type(self.schema.feature_dim).with_edge_data(0, self.one_type_edge_data)
    }

    /// [`defaults`] for everything but the name and the feature schema.
    pub fn new(name: impl Into<String>, schema: FeatureSchema) -> Self {
        Self {
            name: name.into(),
            mode: defaults::MODE,
            slot_count: defaults::SLOT_COUNT,
            max_targets: defaults::MAX_TARGETS,
            max_fanouts: defaults::MAX_FANOUTS,
            max_nodes: defaults::MAX_NODES,
            response_bytes: defaults::RESPONSE_BYTES,
            max_new_node_edges: defaults::MAX_NEW_NODE_EDGES,
            schema,
            graph: None,
            one_type_edge_data: EdgeDataDesc::default(),
            heartbeat_interval: defaults::HEARTBEAT_INTERVAL,
            client_timeout: defaults::CLIENT_TIMEOUT,
            stale_after: defaults::STALE_AFTER,
        }
    }
}

/// Why a segment could not be created.
#[derive(Debug, thiserror::Error)]
pub enum CreateError {
    #[error("invalid segment configuration: {0}")]
    InvalidConfig(String),
    #[error(
        "shared-memory segment /dev/shm/{name} is in use by a live sidecar (epoch {epoch:#x}, \
         heartbeat advancing): stop that sidecar first or choose another --shm-name"
    )]
    InUse { name: String, epoch: u64 },
    #[error(
        "/dev/shm/{name} exists and is not a sidecar segment (no magic: foreign, empty or \
         zeroed): it was not created by this product, or its creator died before writing its \
         header, so it is left alone; remove it by hand or choose another --shm-name"
    )]
    Foreign { name: String },
    #[error("shared-memory segment /dev/shm/{name}: {op} failed: {source}")]
    Os {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "shared-memory segment /dev/shm/{name}: another process keeps re-creating it; \
         is a second sidecar starting with the same --shm-name?"
    )]
    Contended { name: String },
}

/// Why a worker could not attach.
#[derive(Debug, thiserror::Error)]
pub enum AttachError {
    #[error(
        "no shared-memory segment /dev/shm/{name}: is the sidecar running with --shm-name {name}?"
    )]
    NotFound { name: String },
    #[error("shared-memory segment /dev/shm/{name}: {op} failed: {source}")]
    Os {
        name: String,
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("segment /dev/shm/{name}: {field} is {found}, expected {expected}: {fix}")]
    Mismatch {
        name: String,
        field: String,
        found: String,
        expected: String,
        fix: &'static str,
    },
    #[error("segment /dev/shm/{name}: invalid {field}: {reason}")]
    Invalid {
        name: String,
        field: &'static str,
        reason: String,
    },
    #[error("segment /dev/shm/{name} is not ready (sidecar state {state}); retry shortly")]
    NotReady { name: String, state: &'static str },
}

const FIX_REBUILD: &str = "the sidecar and the worker were built from different protocol \
                           versions; deploy images built from the same release";
const FIX_CORRUPT: &str =
    "the segment is corrupt or was written by something else; restart the sidecar";

/// Human name of a server state.
pub fn server_state_name(state: u32) -> &'static str {
    match state {
        server_state::INITIALIZING => "INITIALIZING",
        server_state::READY => "READY",
        server_state::DRAINING => "DRAINING",
        server_state::STOPPED => "STOPPED",
        server_state::RETIRED => "RETIRED",
        _ => "INVALID",
    }
}

/// Checks a segment name and returns the `shm_open` path for it.
pub fn shm_path(name: &str) -> Result<String, String> {
    if name.is_empty() || name.len() > 200 {
        return Err(format!("segment name {name:?} must be 1 to 200 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || b == b'.')
        || name.starts_with('.')
    {
        return Err(format!(
            "segment name {name:?} may only contain letters, digits, '-', '_' and '.', \
             and may not start with '.'"
        ));
    }
    Ok(format!("/{name}"))
}

/// The system's page size.
fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .map_or(4096, |p| p as u64)
}

/// Computes the geometry for a configuration; checks every size for overflow.
pub fn plan_geometry(cfg: &SegmentConfig) -> Result<(Geometry, u64), String> {
    plan_layout(cfg).map(|(geometry, total, _)| (geometry, total))
}

/// [`plan_geometry`], and where a typed graph's schema goes: after the
/// slot control array, before the first slot (offset, bytes; 0 and 0
/// without one).
fn plan_layout(cfg: &SegmentConfig) -> Result<(Geometry, u64, (u64, u64)), String> {
    if cfg.slot_count == 0 || cfg.slot_count as usize > MAX_SLOTS {
        return Err(format!(
            "slot count {} must be between 1 and {MAX_SLOTS}",
            cfg.slot_count
        ));
    }
    if cfg.max_targets == 0 {
        return Err("max targets must be at least 1".into());
    }
    for (hop, &fanout) in cfg.max_fanouts.iter().enumerate() {
        if fanout == 0 || fanout > MAX_FANOUT {
            return Err(format!(
                "max fanout of hop {} is {fanout}; it must be between 1 and {MAX_FANOUT}",
                hop + 1
            ));
        }
    }
    for (hop, &fanout) in cfg.schema.default_fanouts.iter().enumerate() {
        if fanout == 0 || fanout > cfg.max_fanouts[hop] {
            return Err(format!(
                "default fanout of hop {} is {fanout}; it must be between 1 and the cap {}",
                hop + 1,
                cfg.max_fanouts[hop]
            ));
        }
    }
    if cfg.max_nodes == 0 {
        return Err("max nodes must be at least 1".into());
    }
    if cfg.schema.dtype != dtype::F32 {
        return Err(format!(
            "feature dtype code {} is not supported (only {} = f32)",
            cfg.schema.dtype,
            dtype::F32
        ));
    }
    match (&cfg.graph, cfg.schema.feature_dim) {
        (None, 0) => return Err("feature dim must be at least 1".into()),
        (Some(graph), 0) => graph.validate()?,
        (Some(_), _) => {
            return Err(
                "a typed graph's segment has feature dim 0 (each node type has its own)".into(),
            )
        }
        (None, _) => {}
    }
    if cfg.graph.is_some() && !cfg.one_type_edge_data.is_empty() {
        return Err("a typed graph's edge data is in its schema, per edge type".into());
    }
    EdgeDataDesc::decode(cfg.one_type_edge_data.attr_dim, 0)?;
    let min_response = size_of::<layout::ResponseHeader>() as u64 + 4096;
    if cfg.response_bytes < min_response {
        return Err(format!(
            "response bytes {} is below the minimum {min_response}",
            cfg.response_bytes
        ));
    }
    let header_bytes = size_of::<Header>() as u64;
    let control_offset = align_up(header_bytes, 64).ok_or("overflow")?;
    let control_end = control_offset
        .checked_add(u64::from(cfg.slot_count) * size_of::<SlotControl>() as u64)
        .ok_or("overflow")?;
    let graph_schema = match &cfg.graph {
        None => (0, 0),
        Some(graph) => (
            align_up(control_end, 64).ok_or("overflow")?,
            graph.encoded_len() as u64,
        ),
    };
    let data_offset =
        align_up(control_end + graph_schema.1, SLOT_ALIGN as u64).ok_or("overflow")?;
    let one_type;
    let graph = match &cfg.graph {
        Some(graph) => graph,
        None => {
            one_type = cfg.one_type_graph();
            &one_type
        }
    };
    let request_bytes = request_bytes_with_new_node(cfg.max_targets, graph, cfg.max_new_node_edges)
        .ok_or("max targets or new-node edges too large")?;
    let response_bytes = align_up(cfg.response_bytes, BUFFER_ALIGN as u64).ok_or("overflow")?;
    let stride = align_up(
        request_bytes
            .checked_add(response_bytes)
            .ok_or("overflow")?,
        SLOT_ALIGN as u64,
    )
    .ok_or("overflow")?;
    let total = stride
        .checked_mul(u64::from(cfg.slot_count))
        .and_then(|s| s.checked_add(data_offset))
        .ok_or("segment size overflows")?;
    if total > 1 << 40 {
        return Err(format!("segment of {total} bytes is too large"));
    }
    let geometry = Geometry {
        slot_count: cfg.slot_count,
        max_targets: cfg.max_targets,
        max_fanouts: cfg.max_fanouts,
        max_nodes: cfg.max_nodes,
        _pad: 0,
        slot_control_offset: control_offset,
        slot_data_offset: data_offset,
        slot_stride: stride,
        request_bytes,
        response_bytes: stride - request_bytes,
    };
    Ok((geometry, total, graph_schema))
}

/// A mapped segment: validated, with a local copy of its geometry and schema.
#[derive(Debug)]
pub struct Segment {
    name: String,
    /// The mapping's SIGBUS protection; declared before `map` so that it is
    /// unregistered before the unmap.
    bus: crate::sigbus::BusGuard,
    map: MmapRaw,
    geometry: Geometry,
    schema: FeatureSchema,
    /// A typed graph's types, validated (a local copy).
    /// Its graph: a typed graph's types, or the 1x1 graph of a one-type
    /// graph (`typed` false).
    graph: GraphSchema,
    typed: bool,
    epoch: u64,
    /// (device, inode) of the file, for a safe unlink.
    identity: (u64, u64),
    created: bool,
    /// The open file: its description carries this process's entry lock
    /// (a client) or tests the clients' locks (the sidecar).
    file: File,
    /// The header's liveness parameters, copied at create or attach.
    heartbeat_interval: Duration,
    client_timeout: Duration,
}

// SAFETY (Send/Sync are automatic): MmapRaw is Send + Sync; all access to the
// mapping goes through atomics or through slot regions whose exclusive use is
// arbitrated by the slot state machine.

impl Segment {
    /// Creates the segment exclusively. An existing segment whose heartbeat
    /// advances is refused; one whose heartbeat stands still for
    /// `stale_after` (a crashed sidecar's) is retired and replaced.
    pub fn create(cfg: &SegmentConfig) -> Result<Segment, CreateError> {
        let path = shm_path(&cfg.name).map_err(CreateError::InvalidConfig)?;
        let (geometry, total, graph_schema) =
            plan_layout(cfg).map_err(CreateError::InvalidConfig)?;
        let os = |op: &'static str| {
            let name = cfg.name.clone();
            move |e: Errno| CreateError::Os {
                name,
                op,
                source: std::io::Error::from(e),
            }
        };
        for _attempt in 0..5 {
            let fd = match shm_open(
                path.as_str(),
                OFlag::O_CREAT | OFlag::O_EXCL | OFlag::O_RDWR,
                Mode::from_bits_truncate(cfg.mode),
            ) {
                Ok(fd) => fd,
                Err(Errno::EEXIST) => match probe_existing(&cfg.name, &path, cfg.stale_after)? {
                    Existing::Alive { epoch } => {
                        return Err(CreateError::InUse {
                            name: cfg.name.clone(),
                            epoch,
                        })
                    }
                    Existing::Stale { previous_epoch } => {
                        tracing::warn!(
                            segment = %cfg.name,
                            previous_epoch = format_args!("{previous_epoch:#x}"),
                            "taking over a stale shared-memory segment left by a dead sidecar"
                        );
                        match shm_unlink(path.as_str()) {
                            Ok(()) | Err(Errno::ENOENT) => continue,
                            Err(e) => return Err(os("shm_unlink of the stale segment")(e)),
                        }
                    }
                },
                Err(e) => return Err(os("shm_open")(e)),
            };
            // The umask filtered the mode given to shm_open; set it exactly.
            fchmod(fd.as_fd(), Mode::from_bits_truncate(cfg.mode)).map_err(os("fchmod"))?;
            let file = File::from(fd);
            file.set_len(total).map_err(|e| CreateError::Os {
                name: cfg.name.clone(),
                op: "ftruncate",
                source: e,
            })?;
            let meta = file.metadata().map_err(|e| CreateError::Os {
                name: cfg.name.clone(),
                op: "fstat",
                source: e,
            })?;
            let map = MmapOptions::new()
                .len(total as usize)
                .map_raw(&file)
                .map_err(|e| CreateError::Os {
                    name: cfg.name.clone(),
                    op: "mmap",
                    source: e,
                })?;
            let epoch = new_epoch();
            let segment = Segment {
                name: cfg.name.clone(),
                bus: crate::sigbus::protect(map.as_ptr(), map.len()),
                map,
                geometry,
                schema: cfg.schema,
                graph: cfg.graph.clone().unwrap_or_else(|| cfg.one_type_graph()),
                typed: cfg.graph.is_some(),
                epoch,
                identity: (meta.dev(), meta.ino()),
                created: true,
                file,
                heartbeat_interval: cfg.heartbeat_interval,
                client_timeout: cfg.client_timeout,
            };
            // Held for the sidecar's life, taken before READY is published:
            // a client that finds it released knows the sidecar is dead.
            if let Err(e) =
                segment.range_lock(0, PREAMBLE_LOCK_LEN, nix::libc::F_WRLCK as i16, false)
            {
                tracing::warn!(
                    segment = %cfg.name,
                    error = %e,
                    "cannot lock the segment's preamble; workers will detect a dead sidecar by \
                     its heartbeat alone"
                );
            }
            segment.initialize(total, graph_schema);
            return Ok(segment);
        }
        Err(CreateError::Contended {
            name: cfg.name.clone(),
        })
    }

    /// Writes the header of a freshly created, zero-filled segment and
    /// publishes it with `server_state = READY`.
    fn initialize(&self, total: u64, (schema_offset, schema_bytes): (u64, u64)) {
        let base = self.map.as_mut_ptr();
        let types = layout::shared_types();
        let mut table = [TypeDesc {
            name: [0; 32],
            size: 0,
            align: 0,
        }; MAX_TYPES];
        table[..types.len()].copy_from_slice(&types);
        // SAFETY: the mapping is `total >= size_of::<Header>()` bytes, page
        // aligned, freshly created by us with O_EXCL and zero-filled; no other
        // process reads the plain fields before `server_state` is READY
        // (Release below), which is the last write. Each write targets a field
        // of the header at its offset, with its own type.
        unsafe {
            let h = base.cast::<Header>();
            let p = &raw mut (*h).preamble;
            (&raw mut (*p).magic).write(MAGIC);
            (&raw mut (*p).layout_version).write(LAYOUT_VERSION);
            (&raw mut (*p).header_bytes).write(size_of::<Header>() as u32);
            (&raw mut (*p).segment_bytes).write(total);
            (&raw mut (*p).epoch).write(self.epoch);
            (&raw mut (*p).heartbeat_interval_us).write(
                self.heartbeat_interval
                    .as_micros()
                    .clamp(1, u32::MAX as u128) as u32,
            );
            (&raw mut (*p).client_timeout_ms)
                .write(self.client_timeout.as_millis().clamp(1, u32::MAX as u128) as u32);
            (&raw mut (*h).fingerprint).write(layout::fingerprint(&types));
            (&raw mut (*h).n_types).write(types.len() as u32);
            (&raw mut (*h).types).write(table);
            (&raw mut (*h).geometry).write(self.geometry);
            (&raw mut (*h).schema).write(self.schema);
            (&raw mut (*h).graph_schema_offset).write(schema_offset);
            (&raw mut (*h).graph_schema_bytes).write(schema_bytes);
            let one_type_edge_data = match self.typed {
                true => EdgeDataDesc::default(),
                false => self.graph.edge_types[0].data,
            };
            let data = one_type_edge_data.encode();
            (&raw mut (*h).one_type_edge_data).write(bytemuck::pod_read_unaligned(&data));
        }
        if let Some(graph) = self.graph_schema() {
            let bytes = graph.encode();
            debug_assert_eq!(bytes.len() as u64, schema_bytes);
            // SAFETY: plan_layout placed `schema_bytes` bytes at
            // `schema_offset`, after the slot control array and before the
            // first slot, inside the `total` bytes mapped; nobody reads them
            // before READY is published below.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    bytes.as_ptr(),
                    base.add(schema_offset as usize),
                    bytes.len(),
                );
            }
        }
        let header = self.header();
        header
            .preamble
            .server_pid
            .store(std::process::id(), Ordering::Relaxed);
        // SYNC POINT: Release publishes every plain write above to a worker's
        // Acquire load of server_state in `attach`.
        header
            .preamble
            .server_state
            .store(server_state::READY, Ordering::Release);
    }

    /// Attaches to an existing segment, validating everything before using it.
    pub fn attach(name: &str) -> Result<Segment, AttachError> {
        let path = shm_path(name).map_err(|reason| AttachError::Invalid {
            name: name.to_string(),
            field: "name",
            reason,
        })?;
        let fd = match shm_open(path.as_str(), OFlag::O_RDWR, Mode::empty()) {
            Ok(fd) => fd,
            Err(Errno::ENOENT) => {
                return Err(AttachError::NotFound {
                    name: name.to_string(),
                })
            }
            Err(e) => {
                return Err(AttachError::Os {
                    name: name.to_string(),
                    op: "shm_open",
                    source: e.into(),
                })
            }
        };
        let file = File::from(fd);
        let meta = file.metadata().map_err(|e| AttachError::Os {
            name: name.to_string(),
            op: "fstat",
            source: e,
        })?;
        let len = meta.len();
        let invalid = |field: &'static str, reason: String| AttachError::Invalid {
            name: name.to_string(),
            field,
            reason,
        };
        if len < size_of::<Header>() as u64 {
            return Err(invalid(
                "size",
                format!(
                    "{len} bytes is smaller than the {} byte header: {FIX_CORRUPT}",
                    size_of::<Header>()
                ),
            ));
        }
        let len_usize = usize::try_from(len).map_err(|_| invalid("size", len.to_string()))?;
        let map = MmapOptions::new()
            .len(len_usize)
            .map_raw(&file)
            .map_err(|e| AttachError::Os {
                name: name.to_string(),
                op: "mmap",
                source: e,
            })?;
        // Protected before the first read: the file may shrink meanwhile.
        let bus = crate::sigbus::protect(map.as_ptr(), map.len());
        let snapshot = HeaderSnapshot::read(&map);
        snapshot.validate(name, len)?;
        let graph = snapshot.graph_schema(&map, name)?;
        Ok(Segment {
            name: name.to_string(),
            bus,
            map,
            geometry: snapshot.geometry,
            schema: snapshot.schema,
            typed: graph.is_some(),
            graph: graph.unwrap_or_else(|| {
                // Checked by `validate`.
                let data = snapshot.one_type_edge_data().unwrap_or_default();
                GraphSchema::one_type(snapshot.schema.feature_dim).with_edge_data(0, data)
            }),
            epoch: snapshot.epoch,
            identity: (meta.dev(), meta.ino()),
            created: false,
            file,
            heartbeat_interval: Duration::from_micros(snapshot.heartbeat_interval_us.into()),
            client_timeout: Duration::from_millis(snapshot.client_timeout_ms.into()),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn epoch(&self) -> u64 {
        self.epoch
    }

    /// A typed graph's node and edge types; `None` for a one-type graph.
    pub fn graph_schema(&self) -> Option<&GraphSchema> {
        self.typed.then_some(&self.graph)
    }

    /// Its graph's node and edge types: a typed graph's, or a one-type
    /// graph's as the 1x1 graph (node type 0 of the segment's feature
    /// width, edge type 0).
    pub fn graph(&self) -> &GraphSchema {
        &self.graph
    }

    /// How requests to this segment are read.
    pub fn decoding(&self) -> request::Decoding<'_> {
        request::Decoding {
            geometry: &self.geometry,
            schema: &self.schema,
            graph: &self.graph,
            typed: self.typed,
        }
    }

    /// The validated geometry (a local copy).
    pub fn geometry(&self) -> &Geometry {
        &self.geometry
    }

    /// The validated feature schema (a local copy).
    pub fn schema(&self) -> &FeatureSchema {
        &self.schema
    }

    /// Whether this process created the segment (the sidecar).
    pub fn is_creator(&self) -> bool {
        self.created
    }

    /// Size of the mapping.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    /// Always false: a segment is never empty.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Address range of the mapping in this process (for zero-copy checks).
    pub fn address_range(&self) -> std::ops::Range<usize> {
        let start = self.map.as_ptr() as usize;
        start..start + self.map.len()
    }

    /// The header. Only its atomics are used after attach.
    pub fn header(&self) -> &Header {
        // SAFETY: the mapping is page aligned and at least size_of::<Header>()
        // bytes (checked at create and attach); Header is ShmSafe (valid for
        // every bit pattern, atomics for everything another process writes
        // after initialisation), and the mapping lives as long as `self`.
        unsafe { &*self.map.as_ptr().cast::<Header>() }
    }

    /// The control word of slot `slot_idx` (< slot_count).
    pub fn slot(&self, slot_idx: usize) -> &SlotControl {
        assert!(slot_idx < self.geometry.slot_count as usize);
        let offset =
            self.geometry.slot_control_offset as usize + slot_idx * size_of::<SlotControl>();
        // SAFETY: the validated geometry puts `slot_count` 64-aligned
        // SlotControls at slot_control_offset inside the mapping; SlotControl
        // is ShmSafe; the index is checked above.
        unsafe { &*self.map.as_ptr().add(offset).cast::<SlotControl>() }
    }

    /// Every slot's control word.
    pub fn slots(&self) -> impl Iterator<Item = &SlotControl> {
        (0..self.geometry.slot_count as usize).map(|i| self.slot(i))
    }

    /// Start of slot `slot_idx`'s data region (request area, then response area).
    pub(crate) fn slot_data(&self, slot_idx: usize) -> NonNull<u8> {
        assert!(slot_idx < self.geometry.slot_count as usize);
        let offset =
            self.geometry.slot_data_offset as usize + slot_idx * self.geometry.slot_stride as usize;
        // SAFETY: the validated geometry puts every data region inside the
        // mapping, so the offset is in bounds and the pointer non-null.
        unsafe { NonNull::new_unchecked(self.map.as_mut_ptr().add(offset)) }
    }

    /// Copies bytes `offset .. offset + out.len()` of a slot's request area
    /// into `out`, eight at a time with relaxed atomic loads: the sidecar
    /// never forms a reference to bytes a client may write meanwhile (a
    /// misbehaving one could). `offset` and `out.len()` are multiples of 8,
    /// inside the area. The slot state's acquire load orders these reads
    /// after the client's writes.
    pub(crate) fn read_request(&self, slot_idx: usize, offset: usize, out: &mut [u8]) {
        assert!(offset.is_multiple_of(8) && out.len().is_multiple_of(8));
        assert!(offset + out.len() <= self.geometry.request_bytes as usize);
        let base = self.slot_data(slot_idx).as_ptr();
        for (i, chunk) in out.chunks_exact_mut(8).enumerate() {
            // SAFETY: in bounds (asserted above, geometry validated); the
            // data region is 4096-aligned, so every word is 8-aligned; the
            // word is only ever accessed atomically or by the peer process.
            let word = unsafe {
                std::sync::atomic::AtomicU64::from_ptr(base.add(offset + i * 8).cast::<u64>())
            };
            chunk.copy_from_slice(
                &word
                    .load(std::sync::atomic::Ordering::Relaxed)
                    .to_ne_bytes(),
            );
        }
    }

    /// Writes `bytes` at the start of a slot's request area, eight at a time
    /// with relaxed atomic stores (the client's side of `read_request`; the
    /// submission's release store publishes them). `bytes.len()` is a
    /// multiple of 8 and at most `request_bytes`.
    pub(crate) fn write_request(&self, slot_idx: usize, bytes: &[u8]) {
        assert!(
            bytes.len().is_multiple_of(8) && bytes.len() <= self.geometry.request_bytes as usize
        );
        let base = self.slot_data(slot_idx).as_ptr();
        for (i, chunk) in bytes.chunks_exact(8).enumerate() {
            // SAFETY: as in `read_request`.
            let word =
                unsafe { std::sync::atomic::AtomicU64::from_ptr(base.add(i * 8).cast::<u64>()) };
            word.store(
                u64::from_ne_bytes(chunk.try_into().expect("8 bytes")),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
    }

    /// Maps the areas the peer writes read-only in this process (`mprotect`):
    /// a worker's view of every response area, the sidecar's view of every
    /// request area. This process then cannot write them even by mistake,
    /// and the peer's references into them alias no writer here. Returns
    /// false (nothing changed) when the areas are not whole pages (a segment
    /// made by another implementation may align them to 64 bytes only).
    pub fn protect_peer_areas(&self, responses: bool) -> std::io::Result<bool> {
        let page = page_size();
        let g = &self.geometry;
        if !g.request_bytes.is_multiple_of(page)
            || !g.slot_stride.is_multiple_of(page)
            || !g.slot_data_offset.is_multiple_of(page)
        {
            return Ok(false);
        }
        for slot_idx in 0..g.slot_count as usize {
            let (start, len) = if responses {
                (self.response_ptr(slot_idx), g.response_bytes)
            } else {
                (self.slot_data(slot_idx), g.request_bytes)
            };
            // SAFETY: a page-aligned range (checked above) inside this
            // mapping; making it read-only changes no memory, and this
            // process only ever reads it.
            let rc = unsafe {
                nix::libc::mprotect(start.as_ptr().cast(), len as usize, nix::libc::PROT_READ)
            };
            if rc != 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(true)
    }

    /// The response area of a slot (64-byte aligned; page aligned in the
    /// segments this crate creates), for the sidecar to write.
    ///
    /// # Safety
    ///
    /// The caller (the sidecar) holds the slot in `SERVING`, which gives it
    /// exclusive access to the area for the life of the slice: the owner
    /// maps it read-only (`protect_peer_areas`) and reads it only once the
    /// slot is `PUBLISHED`.
    #[allow(clippy::mut_from_ref)]
    pub(crate) unsafe fn response_area(&self, slot_idx: usize) -> &mut [u8] {
        let ptr = self.response_ptr(slot_idx);
        // SAFETY: in bounds per the validated geometry; exclusivity is the
        // caller's contract.
        unsafe {
            std::slice::from_raw_parts_mut(ptr.as_ptr(), self.geometry.response_bytes as usize)
        }
    }

    /// Pointer to the response area of a slot.
    pub(crate) fn response_ptr(&self, slot_idx: usize) -> NonNull<u8> {
        let data = self.slot_data(slot_idx);
        // SAFETY: request_bytes < slot_stride per the validated geometry, so
        // the response area starts inside the slot's data region.
        unsafe { NonNull::new_unchecked(data.as_ptr().add(self.geometry.request_bytes as usize)) }
    }

    /// How often the sidecar beats (from the header); clients beat at least
    /// this often.
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
    }

    /// How long a client's heartbeat may stand still (from the header).
    pub fn client_timeout(&self) -> Duration {
        self.client_timeout
    }

    /// Takes this open file's exclusive lock on client entry `index`'s 64
    /// bytes (an open-file-description lock, `F_OFD_SETLK`), held until it is
    /// unlocked or every descriptor of this open file is closed (the process
    /// exits or dies). `Ok(false)`: another open file holds it.
    pub fn lock_client_entry(&self, index: u16) -> std::io::Result<bool> {
        match self.entry_lock(index, nix::libc::F_WRLCK as i16, false) {
            Ok(_) => Ok(true),
            Err(Errno::EAGAIN | Errno::EACCES) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }

    /// Releases [`Segment::lock_client_entry`].
    pub fn unlock_client_entry(&self, index: u16) {
        let _ = self.entry_lock(index, nix::libc::F_UNLCK as i16, false);
    }

    /// Whether some other open file of the segment holds entry `index`'s
    /// lock: its holder is a live process, however long its heartbeat has
    /// stood still.
    pub fn client_entry_locked(&self, index: u16) -> std::io::Result<bool> {
        self.entry_lock(index, nix::libc::F_WRLCK as i16, true)
            .map(|found| found != nix::libc::F_UNLCK as i16)
            .map_err(Into::into)
    }

    /// Whether some other open file of the segment holds the sidecar's lock
    /// on the preamble: `Ok(false)` once the sidecar that created it is dead
    /// (the kernel dropped its lock), however its heartbeat looks.
    pub fn server_lock_held(&self) -> std::io::Result<bool> {
        self.range_lock(0, PREAMBLE_LOCK_LEN, nix::libc::F_WRLCK as i16, true)
            .map(|found| found != nix::libc::F_UNLCK as i16)
            .map_err(Into::into)
    }

    /// One `F_OFD_SETLK` (or `F_OFD_GETLK` when `probe`) of `kind` on entry
    /// `index`'s bytes; returns the lock type found (`F_UNLCK` when free).
    fn entry_lock(&self, index: u16, kind: i16, probe: bool) -> Result<i16, Errno> {
        let start =
            offset_of!(Header, clients) + index as usize * size_of::<crate::layout::ClientEntry>();
        self.range_lock(start, size_of::<crate::layout::ClientEntry>(), kind, probe)
    }

    /// One `F_OFD_SETLK` (or `F_OFD_GETLK` when `probe`) of `kind` on the
    /// segment file's bytes `start..start + len`; returns the lock type found
    /// (`F_UNLCK` when free).
    fn range_lock(&self, start: usize, len: usize, kind: i16, probe: bool) -> Result<i16, Errno> {
        // SAFETY: `flock` is plain data; all-zero is a valid value that the
        // fields below complete.
        let mut lock: nix::libc::flock = unsafe { std::mem::zeroed() };
        lock.l_type = kind;
        lock.l_whence = nix::libc::SEEK_SET as i16;
        lock.l_start = start as nix::libc::off_t;
        lock.l_len = len as nix::libc::off_t;
        lock.l_pid = 0;
        if probe {
            nix::fcntl::fcntl(&self.file, nix::fcntl::FcntlArg::F_OFD_GETLK(&mut lock))?;
            Ok(lock.l_type)
        } else {
            nix::fcntl::fcntl(&self.file, nix::fcntl::FcntlArg::F_OFD_SETLK(&lock))?;
            Ok(kind)
        }
    }

    /// Whether the segment file was truncated under this process: an access
    /// faulted past its end (and read zeros, see `sigbus`), or the file is
    /// now shorter than the mapping. A damaged segment is retired: a worker
    /// attaches again, the sidecar creates a new one.
    pub fn damaged(&self) -> bool {
        self.bus.faulted()
            || self
                .file
                .metadata()
                .is_ok_and(|meta| meta.len() < self.map.len() as u64)
    }

    /// Whether this mapping is protected from SIGBUS (see `damaged`).
    pub fn truncation_protected(&self) -> bool {
        self.bus.is_protected()
    }

    /// Whether `/dev/shm/<name>` still names this very file.
    pub fn name_refers_to_us(&self) -> bool {
        let Ok(path) = shm_path(&self.name) else {
            return false;
        };
        match shm_open(path.as_str(), OFlag::O_RDONLY, Mode::empty()) {
            Ok(fd) => File::from(fd)
                .metadata()
                .map(|m| (m.dev(), m.ino()) == self.identity)
                .unwrap_or(false),
            Err(_) => false,
        }
    }

    /// Removes the name, if it still refers to this segment. The mapping stays
    /// valid for every process that has it mapped.
    pub fn unlink(&self) -> std::io::Result<bool> {
        if !self.name_refers_to_us() {
            return Ok(false);
        }
        let path = shm_path(&self.name).map_err(std::io::Error::other)?;
        match shm_unlink(path.as_str()) {
            Ok(()) => Ok(true),
            Err(Errno::ENOENT) => Ok(false),
            Err(e) => Err(e.into()),
        }
    }
}

/// A copy of the header's plain fields, read without forming references.
#[derive(Debug, Clone)]
struct HeaderSnapshot {
    magic: [u8; 8],
    layout_version: u32,
    header_bytes: u32,
    segment_bytes: u64,
    epoch: u64,
    server_state: u32,
    heartbeat_interval_us: u32,
    client_timeout_ms: u32,
    fingerprint: u64,
    n_types: u32,
    types: [TypeDesc; MAX_TYPES],
    geometry: Geometry,
    schema: FeatureSchema,
    graph_schema_offset: u64,
    graph_schema_bytes: u64,
    /// `attr_dim` and flags, as written.
    one_type_edge_data: [u32; 2],
}

/// Copies a `T` from `base + offset` without forming a reference.
///
/// # Safety
///
/// `base + offset .. + size_of::<T>()` must lie inside one live mapping, and
/// `T` must be valid for every bit pattern.
unsafe fn read_raw<T: Copy>(base: *const u8, offset: usize) -> T {
    // SAFETY: in bounds per the caller; read_unaligned needs no alignment and
    // read_volatile-like semantics are not needed for a one-off copy that is
    // validated afterwards.
    unsafe { base.add(offset).cast::<T>().read_unaligned() }
}

impl HeaderSnapshot {
    fn read(map: &MmapRaw) -> Self {
        debug_assert!(map.len() >= size_of::<Header>());
        let base = map.as_ptr();
        let pre = offset_of!(Header, preamble);
        // SAFETY: the caller checked the mapping holds a whole Header; every
        // type read is plain integers (valid for every bit pattern), and the
        // offsets are those of the fields in Header.
        unsafe {
            // SYNC POINT: Acquire pairs with the creator's Release store of
            // READY in `initialize`; it must precede the plain reads below.
            let server_state = (*base
                .add(pre + offset_of!(Preamble, server_state))
                .cast::<std::sync::atomic::AtomicU32>())
            .load(Ordering::Acquire);
            HeaderSnapshot {
                magic: read_raw(base, pre + offset_of!(Preamble, magic)),
                layout_version: read_raw(base, pre + offset_of!(Preamble, layout_version)),
                header_bytes: read_raw(base, pre + offset_of!(Preamble, header_bytes)),
                segment_bytes: read_raw(base, pre + offset_of!(Preamble, segment_bytes)),
                epoch: read_raw(base, pre + offset_of!(Preamble, epoch)),
                server_state,
                heartbeat_interval_us: read_raw(
                    base,
                    pre + offset_of!(Preamble, heartbeat_interval_us),
                ),
                client_timeout_ms: read_raw(base, pre + offset_of!(Preamble, client_timeout_ms)),
                fingerprint: read_raw(base, offset_of!(Header, fingerprint)),
                n_types: read_raw(base, offset_of!(Header, n_types)),
                types: read_raw(base, offset_of!(Header, types)),
                geometry: read_raw(base, offset_of!(Header, geometry)),
                schema: read_raw(base, offset_of!(Header, schema)),
                graph_schema_offset: read_raw(base, offset_of!(Header, graph_schema_offset)),
                graph_schema_bytes: read_raw(base, offset_of!(Header, graph_schema_bytes)),
                one_type_edge_data: read_raw(base, offset_of!(Header, one_type_edge_data)),
            }
        }
    }

    /// The one-type edge data words decoded: zero in a typed graph's
    /// segment, no undefined bit.
    fn one_type_edge_data(&self) -> Result<EdgeDataDesc, String> {
        let [attr_dim, flags] = self.one_type_edge_data;
        if self.graph_schema_bytes != 0 && (attr_dim, flags) != (0, 0) {
            return Err(format!(
                "{attr_dim} attributes and flags {flags:#x} in a typed graph's segment, whose \
                 edge types carry their own (section 2.7): zero"
            ));
        }
        EdgeDataDesc::decode(attr_dim, flags)
    }

    fn validate(&self, name: &str, file_len: u64) -> Result<(), AttachError> {
        let mismatch = |field: &str, found: String, expected: String, fix: &'static str| {
            AttachError::Mismatch {
                name: name.to_string(),
                field: field.to_string(),
                found,
                expected,
                fix,
            }
        };
        let invalid = |field: &'static str, reason: String| AttachError::Invalid {
            name: name.to_string(),
            field,
            reason,
        };
        if self.magic != MAGIC {
            return Err(mismatch(
                "magic",
                format!("{:02x?}", self.magic),
                format!("{MAGIC:02x?}"),
                "this is not a sidecar segment; check --shm-name",
            ));
        }
        match self.server_state {
            server_state::READY | server_state::DRAINING => {}
            other => {
                return Err(AttachError::NotReady {
                    name: name.to_string(),
                    state: server_state_name(other),
                })
            }
        }
        if self.layout_version != LAYOUT_VERSION {
            return Err(mismatch(
                "layout version",
                self.layout_version.to_string(),
                LAYOUT_VERSION.to_string(),
                FIX_REBUILD,
            ));
        }
        if self.header_bytes as usize != size_of::<Header>() {
            return Err(mismatch(
                "header size",
                self.header_bytes.to_string(),
                size_of::<Header>().to_string(),
                FIX_REBUILD,
            ));
        }
        if self.segment_bytes != file_len {
            return Err(mismatch(
                "segment size",
                format!("{} (header)", self.segment_bytes),
                format!("{file_len} (file)"),
                FIX_CORRUPT,
            ));
        }
        let ours = layout::shared_types();
        if self.n_types as usize != ours.len() {
            return Err(mismatch(
                "number of shared types",
                self.n_types.to_string(),
                ours.len().to_string(),
                FIX_REBUILD,
            ));
        }
        for (theirs, ours) in self.types.iter().zip(&ours) {
            if theirs != ours {
                return Err(mismatch(
                    &format!("shared type {}", ours.name()),
                    format!(
                        "{} (size {}, align {})",
                        theirs.name(),
                        theirs.size,
                        theirs.align
                    ),
                    format!("{} (size {}, align {})", ours.name(), ours.size, ours.align),
                    FIX_REBUILD,
                ));
            }
        }
        if self.fingerprint != layout::fingerprint(&ours) {
            return Err(mismatch(
                "type fingerprint",
                format!("{:#x}", self.fingerprint),
                format!("{:#x}", layout::fingerprint(&ours)),
                FIX_REBUILD,
            ));
        }
        if self.heartbeat_interval_us == 0 {
            return Err(invalid("heartbeat_interval_us", "is 0".into()));
        }
        if self.client_timeout_ms == 0 {
            return Err(invalid("client_timeout_ms", "is 0".into()));
        }
        validate_geometry(&self.geometry, file_len).map_err(|r| invalid("geometry", r))?;
        validate_schema(&self.schema, &self.geometry, self.graph_schema_bytes != 0)
            .map_err(|r| invalid("feature schema", r))?;
        self.one_type_edge_data()
            .map_err(|r| invalid("one_type_edge_data", r))?;
        Ok(())
    }

    /// A typed graph's schema: where the header says, between the slot
    /// control array and the first slot, copied out and decoded. Call on a
    /// validated snapshot.
    fn graph_schema(&self, map: &MmapRaw, name: &str) -> Result<Option<GraphSchema>, AttachError> {
        let invalid = |reason: String| AttachError::Invalid {
            name: name.to_string(),
            field: "graph schema",
            reason,
        };
        let (offset, bytes) = (self.graph_schema_offset, self.graph_schema_bytes);
        if bytes == 0 {
            return if offset == 0 {
                Ok(None)
            } else {
                Err(invalid(format!("offset {offset} with 0 bytes")))
            };
        }
        let g = &self.geometry;
        let control_end =
            g.slot_control_offset + u64::from(g.slot_count) * size_of::<SlotControl>() as u64;
        let max_bytes = (16 + 48 * (MAX_NODE_TYPES + MAX_EDGE_TYPES)) as u64;
        if offset < control_end
            || bytes > max_bytes
            || offset
                .checked_add(bytes)
                .is_none_or(|end| end > g.slot_data_offset)
        {
            return Err(invalid(format!(
                "{bytes} bytes at {offset} are not between the slot control array (ends at \
                 {control_end}) and the first slot ({}), or more than {max_bytes}",
                g.slot_data_offset
            )));
        }
        let mut copy = vec![0u8; bytes as usize];
        // SAFETY: `offset + bytes <= slot_data_offset <= segment_bytes ==
        // map.len()` (validated geometry), so the range is inside the
        // mapping; the sidecar wrote it before publishing READY (read with
        // Acquire in the snapshot) and never writes it again; a byte copy
        // forms no reference into the peer's memory.
        unsafe {
            std::ptr::copy_nonoverlapping(
                map.as_ptr().add(offset as usize),
                copy.as_mut_ptr(),
                copy.len(),
            );
        }
        GraphSchema::decode(&copy).map(Some).map_err(invalid)
    }
}

/// Checks that a geometry read from a segment describes slots that fit in it.
fn validate_geometry(g: &Geometry, file_len: u64) -> Result<(), String> {
    if g.slot_count == 0 || g.slot_count as usize > MAX_SLOTS {
        return Err(format!(
            "slot count {} not in 1..={MAX_SLOTS}",
            g.slot_count
        ));
    }
    if g.max_targets == 0 {
        return Err("max targets is 0".into());
    }
    if g.max_nodes == 0 {
        return Err("max nodes is 0".into());
    }
    if g.max_fanouts.iter().any(|&f| f == 0 || f > MAX_FANOUT) {
        return Err(format!(
            "max fanouts {:?} not in 1..={MAX_FANOUT}",
            g.max_fanouts
        ));
    }
    if g.slot_control_offset < size_of::<Header>() as u64
        || !g.slot_control_offset.is_multiple_of(64)
    {
        return Err(format!(
            "slot control offset {} overlaps the header or is not 64-aligned",
            g.slot_control_offset
        ));
    }
    let control_end = g
        .slot_control_offset
        .checked_add(u64::from(g.slot_count) * size_of::<SlotControl>() as u64)
        .ok_or("slot control array overflows")?;
    if g.slot_data_offset < control_end || !g.slot_data_offset.is_multiple_of(SLOT_ALIGN as u64) {
        return Err(format!(
            "slot data offset {} overlaps the control array or is not {SLOT_ALIGN}-aligned",
            g.slot_data_offset
        ));
    }
    if g.slot_stride == 0 || !g.slot_stride.is_multiple_of(SLOT_ALIGN as u64) {
        return Err(format!(
            "slot stride {} is not a positive multiple of {SLOT_ALIGN}",
            g.slot_stride
        ));
    }
    let need_request = request_bytes_for(g.max_targets, 1).ok_or("max targets too large")?;
    if g.request_bytes < need_request || !g.request_bytes.is_multiple_of(BUFFER_ALIGN as u64) {
        return Err(format!(
            "request area {} bytes is too small for {} targets or not {BUFFER_ALIGN}-aligned",
            g.request_bytes, g.max_targets
        ));
    }
    if g.request_bytes.checked_add(g.response_bytes) != Some(g.slot_stride) {
        return Err(format!(
            "request {} + response {} bytes != slot stride {}",
            g.request_bytes, g.response_bytes, g.slot_stride
        ));
    }
    if g.response_bytes < size_of::<layout::ResponseHeader>() as u64 {
        return Err(format!(
            "response area {} bytes is too small",
            g.response_bytes
        ));
    }
    let end = g
        .slot_stride
        .checked_mul(u64::from(g.slot_count))
        .and_then(|s| s.checked_add(g.slot_data_offset))
        .ok_or("slot regions overflow")?;
    if end > file_len {
        return Err(format!(
            "slots end at byte {end}, past the end of the {file_len} byte segment"
        ));
    }
    if usize::try_from(end).is_err() {
        return Err("segment too large for this platform".into());
    }
    Ok(())
}

fn validate_schema(s: &FeatureSchema, g: &Geometry, typed: bool) -> Result<(), String> {
    if s.dtype != dtype::F32 {
        return Err(format!(
            "feature dtype code {} is unknown (f32 = {})",
            s.dtype,
            dtype::F32
        ));
    }
    if (s.feature_dim == 0) != typed {
        return Err(format!(
            "feature dim is {} with {} graph schema (a typed graph's segment has 0 and a \
             schema, a one-type graph's neither)",
            s.feature_dim,
            if typed { "a" } else { "no" }
        ));
    }
    for hop in 0..MAX_HOPS {
        if s.default_fanouts[hop] == 0 || s.default_fanouts[hop] > g.max_fanouts[hop] {
            return Err(format!(
                "default fanout {} of hop {} is not in 1..={}",
                s.default_fanouts[hop],
                hop + 1,
                g.max_fanouts[hop]
            ));
        }
    }
    Ok(())
}

enum Existing {
    Alive { epoch: u64 },
    Stale { previous_epoch: u64 },
}

/// Decides whether an existing segment belongs to a live sidecar by watching
/// its heartbeat for `stale_after`. A stale segment of ours is marked RETIRED
/// (so workers still mapped to it give up at once) before it is replaced.
fn probe_existing(name: &str, path: &str, stale_after: Duration) -> Result<Existing, CreateError> {
    let os = |op: &'static str, source: std::io::Error| CreateError::Os {
        name: name.to_string(),
        op,
        source,
    };
    let fd: OwnedFd = match shm_open(path, OFlag::O_RDWR, Mode::empty()) {
        Ok(fd) => fd,
        // Removed between our create and open: let the caller retry.
        Err(Errno::ENOENT) => return Ok(Existing::Stale { previous_epoch: 0 }),
        Err(e) => return Err(os("shm_open of the existing segment", e.into())),
    };
    // SAFETY: `into_raw_fd` hands over the one owner of a valid descriptor.
    let file = unsafe { File::from_raw_fd(fd.into_raw_fd()) };
    let preamble_len = size_of::<Preamble>();
    let started = Instant::now();
    let mut first: Option<(u64, u64)> = None; // (heartbeat, size)
    loop {
        let size = file.metadata().map_err(|e| os("fstat", e))?.len();
        if size < preamble_len as u64 {
            // Too small to hold a preamble: a sidecar that died between
            // shm_open and ftruncate, or one that is starting right now.
            match first {
                Some((_, s0)) if s0 == size => {}
                _ => first = Some((0, size)),
            }
            if started.elapsed() >= stale_after {
                // No header came: not a segment (or one whose creator died
                // before writing it); left alone, as any foreign file.
                return Err(CreateError::Foreign {
                    name: name.to_string(),
                });
            }
            continue_wait();
            continue;
        }
        let map = MmapOptions::new()
            .len(preamble_len)
            .map_raw(&file)
            .map_err(|e| os("mmap of the existing segment", e))?;
        let base = map.as_ptr();
        // SAFETY: the mapping holds a whole Preamble (size checked, page
        // aligned); Preamble is ShmSafe, and only its atomics are used through
        // the reference; the plain fields are copied without one.
        let (magic, epoch, preamble) = unsafe {
            (
                read_raw::<[u8; 8]>(base, offset_of!(Preamble, magic)),
                read_raw::<u64>(base, offset_of!(Preamble, epoch)),
                &*base.cast::<Preamble>(),
            )
        };
        let state = preamble.server_state.load(Ordering::Acquire);
        let heartbeat = preamble.server_heartbeat.load(Ordering::Acquire);
        if magic != MAGIC && magic != [0; 8] {
            return Err(CreateError::Foreign {
                name: name.to_string(),
            });
        }
        if magic == MAGIC && matches!(state, server_state::STOPPED | server_state::RETIRED) {
            return Ok(Existing::Stale {
                previous_epoch: epoch,
            });
        }
        match first {
            Some((h0, s0)) if h0 != heartbeat || s0 != size => {
                return Ok(Existing::Alive { epoch });
            }
            Some(_) => {}
            None => first = Some((heartbeat, size)),
        }
        if started.elapsed() >= stale_after {
            if magic != MAGIC {
                // Still no magic: left alone, as any foreign file.
                return Err(CreateError::Foreign {
                    name: name.to_string(),
                });
            }
            preamble
                .server_state
                .store(server_state::RETIRED, Ordering::Release);
            return Ok(Existing::Stale {
                previous_epoch: epoch,
            });
        }
        continue_wait();
    }
}

fn continue_wait() {
    std::thread::sleep(Duration::from_millis(10));
}

/// A value that differs at every sidecar start: wall-clock nanoseconds mixed
/// with the process id (splitmix64 finaliser), never 0.
pub fn new_epoch() -> u64 {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0);
    let mut z = nanos ^ (u64::from(std::process::id()) << 32);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^= z >> 31;
    z.max(1)
}
