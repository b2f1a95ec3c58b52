//! Every type that lives in the shared-memory segment, and its fingerprint.
//!
//! The byte-level description (offsets, sizes, meaning of each field) is in
//! `docs/protocol.md`; this module is its source of truth and the tests at the
//! bottom pin the offsets the document states.
//!
//! Rules for a type in this module:
//! - `#[repr(C)]`, fields in the documented order, explicit padding;
//! - plain integers, byte arrays and atomics only: offsets and indices, never
//!   pointers, references, heap data or file descriptors;
//! - it implements [`ShmSafe`], and it is listed in [`shared_types`] so that its
//!   name, size and alignment are part of the segment fingerprint.
#![allow(unsafe_code)]

use std::mem::{align_of, size_of};

use crate::sync::{AtomicU32, AtomicU64};

/// Marker for types that may be placed in memory shared with another process.
///
/// # Safety
///
/// An implementor promises that the type:
/// - is `#[repr(C)]` (or a primitive) with a layout that does not depend on the
///   compiler version;
/// - contains only integers, byte arrays, and atomics of the same width as
///   their integer (no pointers, references, `Box`, `Vec`, file descriptors,
///   `bool` or enums, whose invalid bit patterns would be UB to read);
/// - is valid for **every** bit pattern, so that bytes written by a buggy or
///   hostile peer can be read without undefined behaviour (they are then
///   validated);
/// - does not implement `Drop`.
pub unsafe trait ShmSafe: Sized {}

/// First bytes of every segment: "GNNRING" and a NUL.
pub const MAGIC: [u8; 8] = *b"GNNRING\0";
/// Version of everything in this module and of the payload schema. Any change
/// to a shared type, an offset, a state code or a payload column bumps it.
pub const LAYOUT_VERSION: u32 = 4;
/// Hops of the dense layout (GraphSAGE 2-hop), and of the fanouts a
/// segment's geometry caps.
pub const MAX_HOPS: usize = 2;
/// Most hops a subgraph-layout request may ask for (docs/protocol.md,
/// "The subgraph layout"): a PyG model of up to three message-passing layers.
pub const MAX_SUBGRAPH_HOPS: usize = 3;
/// Largest fanout a segment may allow for one hop: 2^15, so that a
/// target's `f1 x f2` hop-2 entries (at most 2^30) index as i32. In
/// practice the response area bounds it first: the hop arrays of one target
/// take `4 x f1 x (2 + f2)` bytes (6.8 MB at 1,303 x 1,303), which the
/// sidecar checks against its response area at start.
pub const MAX_FANOUT: u32 = 1 << 15;
/// Most worker processes (or client handles) attached at once.
pub const MAX_CLIENTS: usize = 64;
/// Most slots a segment can have (the submission bitmap has one bit per slot).
pub const MAX_SLOTS: usize = 1024;
/// Words of the submission bitmap.
pub const SUBMIT_WORDS: usize = MAX_SLOTS / 64;
/// Most shared types the fingerprint table can list.
pub const MAX_TYPES: usize = 16;
/// Alignment of every slot data region (a page) and of every Arrow buffer (64).
pub const SLOT_ALIGN: usize = 4096;
/// Alignment of Arrow buffers and messages inside a slot.
pub const BUFFER_ALIGN: usize = 64;
/// Bytes of the response's human-readable message.
pub const MESSAGE_BYTES: usize = 256;

/// Server (sidecar) lifecycle, in [`Preamble::server_state`].
pub mod server_state {
    /// The sidecar created the segment and is still writing the header.
    pub const INITIALIZING: u32 = 0;
    /// Header complete; the sidecar accepts requests.
    pub const READY: u32 = 1;
    /// The sidecar finishes in-flight requests and takes no new ones.
    pub const DRAINING: u32 = 2;
    /// The sidecar stopped cleanly; the segment is (or is about to be) unlinked.
    pub const STOPPED: u32 = 3;
    /// A new sidecar found this segment stale and replaced it with a new one.
    pub const RETIRED: u32 = 4;
}

/// The part of the header whose offsets never change across layout versions,
/// so that any version can tell whether a segment is alive before it decides
/// whether it understands the rest.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Preamble {
    /// [`MAGIC`].
    pub magic: [u8; 8],
    /// [`LAYOUT_VERSION`] of the sidecar that created the segment.
    pub layout_version: u32,
    /// `size_of::<Header>()` as the creator built it.
    pub header_bytes: u32,
    /// Total size of the segment in bytes (the file size).
    pub segment_bytes: u64,
    /// Changes at every sidecar start; a worker that sees another epoch has a
    /// new sidecar to re-attach to.
    pub epoch: u64,
    /// One of [`server_state`].
    pub server_state: AtomicU32,
    /// Process id of the sidecar in *its* PID namespace. Informational only:
    /// never used for liveness.
    pub server_pid: AtomicU32,
    /// Incremented by the sidecar every `heartbeat_interval_us`.
    pub server_heartbeat: AtomicU64,
    /// How often the sidecar beats, in microseconds; a client beats its own
    /// entry at least this often.
    pub heartbeat_interval_us: u32,
    /// How long a client's heartbeat may stand still before the sidecar
    /// treats the client as dead (unless it holds its entry's lock), in
    /// milliseconds.
    pub client_timeout_ms: u32,
    pub _pad: [u8; 8],
}

/// Name, size and alignment of one shared type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TypeDesc {
    /// NUL-padded ASCII type name.
    pub name: [u8; 32],
    pub size: u32,
    pub align: u32,
}

impl TypeDesc {
    fn of<T>(name: &str) -> Self {
        let mut bytes = [0u8; 32];
        bytes[..name.len()].copy_from_slice(name.as_bytes());
        Self {
            name: bytes,
            size: size_of::<T>() as u32,
            align: align_of::<T>() as u32,
        }
    }

    /// The name as text (lossy: the bytes may come from another process).
    pub fn name(&self) -> String {
        let end = self.name.iter().position(|&b| b == 0).unwrap_or(32);
        String::from_utf8_lossy(&self.name[..end]).into_owned()
    }
}

/// How the segment is cut into slots.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    /// Number of slots, 1..=[`MAX_SLOTS`].
    pub slot_count: u32,
    /// Most target node ids in one request.
    pub max_targets: u32,
    /// Hard cap on the fanout of each hop; a request asking for more is refused.
    pub max_fanouts: [u32; MAX_HOPS],
    /// Most rows in the node table of one response.
    pub max_nodes: u32,
    pub _pad: u32,
    /// Offset of the array of `slot_count` [`SlotControl`]s.
    pub slot_control_offset: u64,
    /// Offset of slot 0's data region (a multiple of [`SLOT_ALIGN`]).
    pub slot_data_offset: u64,
    /// Bytes from one slot's data region to the next (a multiple of [`SLOT_ALIGN`]).
    pub slot_stride: u64,
    /// Bytes at the start of each data region for the request; the response
    /// area follows (a multiple of [`BUFFER_ALIGN`]).
    pub request_bytes: u64,
    /// Bytes of the response area (`slot_stride - request_bytes`).
    pub response_bytes: u64,
}

/// Element type of a feature row.
pub mod dtype {
    /// IEEE 754 binary32, little endian.
    pub const F32: u32 = 1;
}

/// What the features in this segment are.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FeatureSchema {
    /// Elements per feature row.
    pub feature_dim: u32,
    /// One of [`dtype`].
    pub dtype: u32,
    /// Version of the graph the sidecar serves; a model declares the version it
    /// was trained on.
    pub graph_version: u64,
    /// Fanouts used when a request leaves its own at 0.
    pub default_fanouts: [u32; MAX_HOPS],
}

/// Client (worker handle) registration states, low byte of [`ClientEntry::state`].
pub mod client_state {
    pub const FREE: u64 = 0;
    pub const ACTIVE: u64 = 1;
}

/// One attached client: `state` = generation << 8 | [`client_state`].
#[repr(C, align(64))]
#[derive(Debug)]
pub struct ClientEntry {
    pub state: AtomicU64,
    /// Incremented by the client every heartbeat interval.
    pub heartbeat: AtomicU64,
    /// Client's process id in its own PID namespace; informational only.
    pub pid: AtomicU32,
    /// Calls the client accepted while the segment was READY and has not
    /// finished (docs/protocol.md, "Draining"): a drain waits for them, and
    /// the client may still submit them while DRAINING. 0 at registration.
    pub accepted: AtomicU32,
    pub _pad: [u8; 40],
}

/// Per-slot synchronisation: the state word and the client's wake-up futex.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct SlotControl {
    /// generation (32 bits) << 32 | owner tag (24 bits: client generation
    /// low 16 bits << 8 | client index) << 8 | state (8 bits).
    pub state: AtomicU64,
    /// Futex word the owning client parks on; bumped after every transition
    /// the client waits for.
    pub wake: AtomicU32,
    /// Non-zero while the owning client is (about to be) parked on `wake`.
    pub waiters: AtomicU32,
    pub _pad: [u8; 48],
}

/// The segment header, at offset 0.
#[repr(C, align(64))]
#[derive(Debug)]
pub struct Header {
    pub preamble: Preamble,
    /// FNV-1a over the type table; a quick check before the per-type one.
    pub fingerprint: u64,
    /// Entries used in `types`.
    pub n_types: u32,
    pub _pad0: u32,
    pub types: [TypeDesc; MAX_TYPES],
    pub geometry: Geometry,
    pub schema: FeatureSchema,
    /// Futex word the sidecar parks on when no request is pending; bumped by
    /// every submission.
    pub doorbell: AtomicU32,
    /// Non-zero while the sidecar is (about to be) parked on `doorbell`.
    pub server_parked: AtomicU32,
    /// Futex word bumped whenever a slot becomes free.
    pub free_seq: AtomicU32,
    /// Number of clients parked on `free_seq`.
    pub free_waiters: AtomicU32,
    /// A typed graph's schema ([`crate::graph_schema`]): its offset in the
    /// segment (after the slot control array, before the first slot) and
    /// its length; both 0 for a one-type graph.
    pub graph_schema_offset: u64,
    pub graph_schema_bytes: u64,
    /// A one-type graph's edge data ([`crate::graph_schema::EdgeDataDesc`]
    /// encoded: `attr_dim`, then flags bit 0 weight, bit 1 time); zero in a
    /// typed graph's segment, whose edge types carry their own.
    pub one_type_edge_data: [u32; 2],
    pub _pad1: [u8; 48],
    /// One bit per slot: set by the client after it submits the slot, taken
    /// (swapped to 0) by the sidecar.
    pub submit_bits: [AtomicU64; SUBMIT_WORDS],
    pub clients: [ClientEntry; MAX_CLIENTS],
}

/// Request flags (docs/protocol.md, "Request area").
pub mod request_flags {
    /// Only the targets' own rows: no neighbour is sampled or fetched; the
    /// response's fanouts are [1, 1] with every count 0 (what a model that
    /// reads the target alone, such as an MLP student, needs).
    pub const OWN_ROWS_ONLY: u32 = 1;
    /// The request's one target is a node the graph does not have: its
    /// feature row and its edges follow the target id (and, in the graph
    /// layout, the fanouts), each edge a (src, dst) pair with the new node
    /// at an end (docs/protocol.md, "A new node in the request"). Sampled
    /// as if it had been added with those edges, without adding it.
    pub const NEW_NODE: u32 = 1 << 1;
    /// Answer targets whose sampled neighbourhood has not changed since a
    /// point of the sidecar's change clock with target status `FRESH`
    /// (docs/protocol.md, "Freshness"): the caller holds their answer
    /// already (precomputed outputs). In the dense layout such a target
    /// gets its own row alone, its answers computed at `fresh_fanouts`; in
    /// the graph layout no row (target_row -1), its answers computed at the
    /// request's own hops and fanouts, and the subgraph is sampled for the
    /// other targets.
    pub const FRESH_SINCE: u32 = 1 << 3;
    /// The caller holds the layer-1 embedding of every node as computed at
    /// `fresh_clock`/`fresh_tick`/`fresh_fanouts`: a sampled hop-1 node of
    /// degree at least `hub_min_degree` whose own hop-1 sample has not
    /// changed since then gets no hop-2 neighbours and `hop2_count` -1
    /// ([`crate::payload::schema::HOP2_CACHED`]); docs/protocol.md, "Hub
    /// layer-1 embeddings".
    pub const HUB_H1: u32 = 1 << 4;
    /// Graph layout: the response carries each sampled edge's attributes,
    /// per edge type that has them, in `edge_index`'s column order
    /// (docs/protocol.md, "Edge data").
    pub const EDGE_ATTR: u32 = 1 << 6;
    /// Graph layout: the same for each sampled edge's weight.
    pub const EDGE_WEIGHT: u32 = 1 << 7;
    /// Graph layout: the same for each sampled edge's time.
    pub const EDGE_TIME: u32 = 1 << 8;
    /// Graph layout: temporal sampling. A seed time per target (i64) follows
    /// the fanouts; each target is sampled as its own tree, and an edge
    /// whose time is later than its target's seed time is not sampled, at
    /// every hop (docs/protocol.md, "Temporal sampling").
    pub const SEED_TIME: u32 = 1 << 9;
    /// With `SEED_TIME`: each node takes its most recent valid neighbours
    /// (PyG's `temporal_strategy="last"`) instead of uniform draws.
    pub const TEMPORAL_LAST: u32 = 1 << 10;
    /// Every defined bit; a sidecar refuses others. Bits 2 and 5
    /// (`NEW_NODE_DIRECTED`, `TYPED`) were retired in layout version 4: a
    /// new node's edges name their direction, and `hops` alone chooses the
    /// layout.
    pub const KNOWN: u32 = OWN_ROWS_ONLY
        | NEW_NODE
        | FRESH_SINCE
        | HUB_H1
        | EDGE_ATTR
        | EDGE_WEIGHT
        | EDGE_TIME
        | SEED_TIME
        | TEMPORAL_LAST;
}

/// The fixed part of a request, at the start of a slot's data region; the
/// `n_targets` u64 target ids follow at offset 128.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, PartialEq, Eq, bytemuck::Pod, bytemuck::Zeroable)]
pub struct RequestHeader {
    /// Chosen by the client, echoed in the response; for tracing.
    pub request_id: u64,
    /// CLOCK_MONOTONIC nanoseconds after which the answer is useless; 0 = the
    /// sidecar's default deadline.
    pub deadline_mono_ns: u64,
    pub n_targets: u32,
    /// The dense layout's fanouts; 0 = the segment's default for that hop.
    /// Zero in the graph layout, whose fanouts follow the target ids.
    pub fanouts: [u32; MAX_HOPS],
    /// Bits of [`request_flags`].
    pub flags: u32,
    /// With `NEW_NODE`: the new node's edges after its feature row; 0
    /// otherwise.
    pub new_node_edges: u32,
    /// With `HUB_H1`: the smallest degree of a hop-1 node whose layer-1
    /// embedding the caller holds (at least 1); 0 otherwise.
    pub hub_min_degree: u32,
    /// With `FRESH_SINCE` or `HUB_H1`: the change clock
    /// ([`ResponseHeader::change_clock`]) and tick the caller's stored
    /// outputs were computed at and, in the dense layout, the fanouts they
    /// were computed with; 0 otherwise.
    pub fresh_clock: u64,
    pub fresh_tick: u64,
    pub fresh_fanouts: [u32; MAX_HOPS],
    /// The response layout: 0 the dense layout (two hops, `fanouts`); 1 to
    /// [`MAX_SUBGRAPH_HOPS`] the graph layout with that many hops, a fanout
    /// per edge type and hop after the target ids (docs/protocol.md, "Graph
    /// requests").
    pub hops: u32,
    /// Zero (a sidecar refuses other bytes; a third hop's fanout until
    /// layout version 3).
    pub _reserved_68: u32,
    /// With `FRESH_SINCE` in the graph layout: the hops the caller's
    /// answers were computed at, their fanouts (a fanout per edge type and
    /// hop) after the request's own; 0: at the request's own hops and
    /// fanouts. 0 otherwise.
    pub fresh_hops: u32,
    /// Zero (a sidecar refuses other bytes).
    pub _reserved_76: u32,
    /// The W3C trace context of the call this request serves
    /// (docs/protocol.md, "Trace context"): its trace id, the worker's span
    /// the sidecar's spans nest under, and the trace flags (bit 0:
    /// sampled). All zero: no trace.
    pub trace_id: [u8; 16],
    pub trace_parent: [u8; 8],
    pub trace_flags: u32,
    /// In the graph layout: the targets' node type (its index in the
    /// segment's graph schema; 0 on a one-type graph); 0 in the dense
    /// layout.
    pub target_type: u32,
    /// Zero (a sidecar refuses other bytes).
    pub _reserved: [u8; 16],
}

/// Response status codes, in [`ResponseHeader::status`].
pub mod status {
    /// The tables are valid.
    pub const OK: u32 = 0;
    /// The request was malformed (bad count, fanout above the cap, unknown flag).
    pub const INVALID_REQUEST: u32 = 1;
    /// The response would not fit in the slot; split the batch or enlarge slots.
    pub const TOO_LARGE: u32 = 2;
    /// The deadline passed before the sidecar could answer.
    pub const DEADLINE_EXCEEDED: u32 = 3;
    /// The sidecar is draining or stopping.
    pub const UNAVAILABLE: u32 = 4;
    /// Anything else; the message says what.
    pub const INTERNAL: u32 = 5;
}

/// The fixed part of a response, at the start of the response area. Offsets
/// are relative to the start of the response area.
#[repr(C, align(64))]
#[derive(Debug, Clone, Copy, bytemuck::Pod, bytemuck::Zeroable)]
pub struct ResponseHeader {
    /// One of [`status`].
    pub status: u32,
    pub n_targets: u32,
    pub n_nodes: u32,
    /// Fanouts the sidecar actually used.
    pub fanouts: [u32; MAX_HOPS],
    /// Bytes used in `message`.
    pub message_len: u32,
    /// Echo of [`RequestHeader::request_id`].
    pub request_id: u64,
    pub graph_version: u64,
    /// Arrow IPC stream of the node table.
    pub node_table_offset: u64,
    pub node_table_len: u64,
    /// Arrow IPC stream of the target table.
    pub target_table_offset: u64,
    pub target_table_len: u64,
    /// Nanoseconds the sidecar spent on the request (take to publish).
    pub server_ns: u64,
    /// The sidecar's change clock: a non-zero id drawn at each sidecar start
    /// (0 from a sidecar without one), and the changes (graph updates,
    /// feature invalidations) it had applied when it sampled this request.
    pub change_clock: u64,
    pub change_tick: u64,
    /// The graph's largest known node id + 1 when it sampled this request.
    pub id_bound: u64,
    /// Subgraph layout only: the Arrow IPC stream of the edge table; 0 in a
    /// dense-layout response.
    pub edge_table_offset: u64,
    pub edge_table_len: u64,
    /// The request's `hops`: 0 for the dense layout, 1 to
    /// [`MAX_SUBGRAPH_HOPS`] for the subgraph layout.
    pub hops: u32,
    /// The third hop's fanout as used (subgraph layout with 3 hops; 0
    /// otherwise).
    pub fanout3: u32,
    /// UTF-8 text explaining a non-OK status.
    pub message: [u8; MESSAGE_BYTES],
}

// SAFETY: each type below is #[repr(C)], made only of integers, byte arrays,
// arrays of other ShmSafe types and std atomics (same size and alignment as
// their integer, valid for every bit pattern), has no Drop, and every bit
// pattern is a valid value.
unsafe impl ShmSafe for Preamble {}
// SAFETY: as above.
unsafe impl ShmSafe for TypeDesc {}
// SAFETY: as above.
unsafe impl ShmSafe for Geometry {}
// SAFETY: as above.
unsafe impl ShmSafe for FeatureSchema {}
// SAFETY: as above.
unsafe impl ShmSafe for ClientEntry {}
// SAFETY: as above.
unsafe impl ShmSafe for SlotControl {}
// SAFETY: as above.
unsafe impl ShmSafe for Header {}
// SAFETY: as above.
unsafe impl ShmSafe for RequestHeader {}
// SAFETY: as above.
unsafe impl ShmSafe for ResponseHeader {}

/// The table of every shared type: its name, size and alignment in this build.
pub fn shared_types() -> Vec<TypeDesc> {
    vec![
        TypeDesc::of::<Preamble>("Preamble"),
        TypeDesc::of::<TypeDesc>("TypeDesc"),
        TypeDesc::of::<Geometry>("Geometry"),
        TypeDesc::of::<FeatureSchema>("FeatureSchema"),
        TypeDesc::of::<ClientEntry>("ClientEntry"),
        TypeDesc::of::<SlotControl>("SlotControl"),
        TypeDesc::of::<Header>("Header"),
        TypeDesc::of::<RequestHeader>("RequestHeader"),
        TypeDesc::of::<ResponseHeader>("ResponseHeader"),
    ]
}

/// FNV-1a 64 over the type table and the layout version.
pub fn fingerprint(types: &[TypeDesc]) -> u64 {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(0x0000_0100_0000_01b3);
        }
    };
    eat(&LAYOUT_VERSION.to_le_bytes());
    for t in types {
        eat(&t.name);
        eat(&t.size.to_le_bytes());
        eat(&t.align.to_le_bytes());
    }
    hash
}

/// Rounds `n` up to a multiple of `align` (a power of two); `None` on overflow.
pub fn align_up(n: u64, align: u64) -> Option<u64> {
    debug_assert!(align.is_power_of_two());
    Some(n.checked_add(align - 1)? & !(align - 1))
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::mem::offset_of;

    use super::*;

    /// The offsets docs/protocol.md states. If this test fails, either the
    /// change was a mistake or both the document and LAYOUT_VERSION change.
    #[test]
    fn offsets_match_the_documented_layout() {
        assert_eq!(size_of::<Preamble>(), 64);
        assert_eq!(offset_of!(Preamble, layout_version), 8);
        assert_eq!(offset_of!(Preamble, header_bytes), 12);
        assert_eq!(offset_of!(Preamble, segment_bytes), 16);
        assert_eq!(offset_of!(Preamble, epoch), 24);
        assert_eq!(offset_of!(Preamble, server_state), 32);
        assert_eq!(offset_of!(Preamble, server_pid), 36);
        assert_eq!(offset_of!(Preamble, server_heartbeat), 40);
        assert_eq!(offset_of!(Preamble, heartbeat_interval_us), 48);
        assert_eq!(offset_of!(Preamble, client_timeout_ms), 52);

        assert_eq!(size_of::<TypeDesc>(), 40);
        assert_eq!(size_of::<Geometry>(), 64);
        assert_eq!(offset_of!(Geometry, slot_control_offset), 24);
        assert_eq!(size_of::<FeatureSchema>(), 24);

        assert_eq!(offset_of!(Header, fingerprint), 64);
        assert_eq!(offset_of!(Header, n_types), 72);
        assert_eq!(offset_of!(Header, types), 80);
        assert_eq!(offset_of!(Header, geometry), 720);
        assert_eq!(offset_of!(Header, schema), 784);
        assert_eq!(offset_of!(Header, doorbell), 808);
        assert_eq!(offset_of!(Header, server_parked), 812);
        assert_eq!(offset_of!(Header, free_seq), 816);
        assert_eq!(offset_of!(Header, free_waiters), 820);
        assert_eq!(offset_of!(Header, graph_schema_offset), 824);
        assert_eq!(offset_of!(Header, graph_schema_bytes), 832);
        assert_eq!(offset_of!(Header, one_type_edge_data), 840);
        assert_eq!(offset_of!(Header, submit_bits), 896);
        assert_eq!(offset_of!(Header, clients), 1024);
        assert_eq!(size_of::<Header>(), 1024 + 64 * MAX_CLIENTS);

        assert_eq!(size_of::<ClientEntry>(), 64);
        assert_eq!(offset_of!(ClientEntry, heartbeat), 8);
        assert_eq!(offset_of!(ClientEntry, pid), 16);

        assert_eq!(size_of::<SlotControl>(), 64);
        assert_eq!(offset_of!(SlotControl, wake), 8);
        assert_eq!(offset_of!(SlotControl, waiters), 12);

        assert_eq!(size_of::<RequestHeader>(), 128);
        assert_eq!(offset_of!(RequestHeader, hops), 64);
        assert_eq!(offset_of!(RequestHeader, _reserved_68), 68);
        assert_eq!(offset_of!(RequestHeader, fresh_hops), 72);
        assert_eq!(offset_of!(RequestHeader, _reserved_76), 76);
        assert_eq!(offset_of!(RequestHeader, trace_id), 80);
        assert_eq!(offset_of!(RequestHeader, trace_parent), 96);
        assert_eq!(offset_of!(RequestHeader, trace_flags), 104);
        assert_eq!(offset_of!(RequestHeader, target_type), 108);
        assert_eq!(offset_of!(RequestHeader, _reserved), 112);
        assert_eq!(offset_of!(RequestHeader, deadline_mono_ns), 8);
        assert_eq!(offset_of!(RequestHeader, n_targets), 16);
        assert_eq!(offset_of!(RequestHeader, fanouts), 20);
        assert_eq!(offset_of!(RequestHeader, flags), 28);
        assert_eq!(offset_of!(RequestHeader, new_node_edges), 32);
        assert_eq!(offset_of!(RequestHeader, hub_min_degree), 36);
        assert_eq!(offset_of!(RequestHeader, fresh_clock), 40);
        assert_eq!(offset_of!(RequestHeader, fresh_tick), 48);
        assert_eq!(offset_of!(RequestHeader, fresh_fanouts), 56);
        assert_eq!(offset_of!(ResponseHeader, change_clock), 80);
        assert_eq!(offset_of!(ResponseHeader, change_tick), 88);
        assert_eq!(offset_of!(ResponseHeader, id_bound), 96);
        assert_eq!(offset_of!(ResponseHeader, edge_table_offset), 104);
        assert_eq!(offset_of!(ResponseHeader, edge_table_len), 112);
        assert_eq!(offset_of!(ResponseHeader, hops), 120);
        assert_eq!(offset_of!(ResponseHeader, fanout3), 124);

        assert_eq!(offset_of!(ResponseHeader, status), 0);
        assert_eq!(offset_of!(ResponseHeader, n_targets), 4);
        assert_eq!(offset_of!(ResponseHeader, n_nodes), 8);
        assert_eq!(offset_of!(ResponseHeader, fanouts), 12);
        assert_eq!(offset_of!(ResponseHeader, message_len), 20);
        assert_eq!(offset_of!(ResponseHeader, request_id), 24);
        assert_eq!(offset_of!(ResponseHeader, graph_version), 32);
        assert_eq!(offset_of!(ResponseHeader, node_table_offset), 40);
        assert_eq!(offset_of!(ResponseHeader, node_table_len), 48);
        assert_eq!(offset_of!(ResponseHeader, target_table_offset), 56);
        assert_eq!(offset_of!(ResponseHeader, target_table_len), 64);
        assert_eq!(offset_of!(ResponseHeader, server_ns), 72);
        assert_eq!(offset_of!(ResponseHeader, message), 128);
        assert_eq!(size_of::<ResponseHeader>(), 384);
    }

    #[test]
    fn the_type_table_fits_and_the_fingerprint_depends_on_it() {
        let types = shared_types();
        assert!(types.len() <= MAX_TYPES);
        let mut changed = types.clone();
        changed[5].size += 8;
        assert_ne!(fingerprint(&types), fingerprint(&changed));
    }
}
