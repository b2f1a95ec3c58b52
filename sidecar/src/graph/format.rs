//! The on-disk graph index: a CSR file.
//!
//! ```text
//! offset  size        field
//! 0       8           magic "GNNCSR\0\0"
//! 8       4           version (1; 2: the file ends with an edge-data section)
//! 12      4           flags (bit 0: built with --undirected, informational; bit 1: known-node bitmap;
//!                     bit 2: one edge type of a typed graph)
//! 16      8           n_nodes
//! 24      8           n_edges
//! 32      8           graph_version
//! 40      8           indptr_offset (128)
//! 48      8           indices_offset (indptr end, rounded up to 64)
//! 56      8           file_bytes
//! 64      8           body_checksum: xxh3-64 of bytes [128, file_bytes)
//! 72      8           known_offset: 0, or (flag bit 1) where the known-node bitmap starts
//! 80      8           update position, milliseconds part (0-0: none applied)
//! 88      8           update position, sequence part
//! 96      8           generation: updates applied to the graph since its import
//! 104     8           stream entries consumed up to the update position
//! 112     8           n_src: with flag bit 2, the source type's node count; otherwise zero
//! 120     8           header_checksum: xxh3-64 of bytes [0, 120)
//! 128     8 (n+1)     indptr: u64, indptr[0] = 0, non-decreasing, indptr[n] = n_edges
//! ...     4 n_edges   indices: u32 neighbour ids < n_nodes (< n_src with flag bit 2), each row
//!                     sorted, unique, no self loop (with flag bit 2: none checked)
//! ...     8 ceil(n/64) with flag bit 1 only, at known_offset (indices end rounded up
//!                     to 8): bit i of word i/64 set when node i is known
//! ```
//!
//! Version 2 adds what the edges carry (docs/graph-index.md, "Edge data"),
//! after the sections above, each section starting on a 64-byte boundary:
//!
//! ```text
//! size         field
//! 8            magic "EDGEDATA"
//! 4            attr_dim: attributes per edge (0: none)
//! 4            what: bit 0 a weight per edge, bit 1 a time per edge
//! 48           zero
//! 4 E attr_dim attributes, f32, row-major, row i the attributes of indices[i]
//! 4 E          with bit 0: weights, f32
//! 8 E          with bit 1: times, i64
//! ```
//!
//! The data is aligned with the indices: entry `i` of each array belongs to
//! the edge `indices[i]` of its row. A row is sorted by (time, id) when
//! the edges have a time, by id otherwise; with edge data a row may list
//! an id more than once (two payments between the same two accounts are
//! two edges), without it never. Attributes and weights are finite.
//!
//! All integers little-endian. A reader verifies both checksums and the
//! structure (monotone indptr, ids in range) before it samples from the file.
//!
//! Without flag bit 1 every id below n_nodes is a known node (what an import
//! writes). Earlier releases' compactions wrote the bitmap where ids added
//! past the end left gaps; a compaction keeps it while gaps remain
//! (`graph::live`). The update position is the
//! last entry of the update stream (docs/updates.md) whose changes the file
//! holds; the generation counts updates applied since the import.
//!
//! With flag bit 2 the file is one edge type `(src, relation, dst)` of a
//! typed graph (docs/graph-index.md, "Typed datasets"): row `v` lists the
//! sources of destination node `v` (PyG's direction: a message goes from a
//! source to `v`, and sampling for `v` draws among them), `n_nodes` is the
//! destination type's count and `n_src` the source type's. A same-type
//! relation's self loops are dropped by the builder as the one-type index
//! drops them; between two types an equal id is no loop, so the reader
//! does not check for one. Such a file has no known-node bitmap.

use std::ops::Range;

use xxhash_rust::xxh3::xxh3_64;

pub const MAGIC: [u8; 8] = *b"GNNCSR\0\0";
/// The version of a file without edge data.
pub const VERSION: u32 = 1;
/// The version of a file with an edge-data section.
pub const VERSION_EDGE_DATA: u32 = 2;
/// The edge-data section's magic.
pub const EDGE_DATA_MAGIC: [u8; 8] = *b"EDGEDATA";
/// Bytes of the edge-data section's descriptor.
pub const EDGE_DATA_HEADER_BYTES: u64 = 64;
/// The most attributes an edge may carry.
pub const MAX_EDGE_ATTRS: u32 = 4096;
pub const HEADER_BYTES: usize = 128;
pub const FLAG_UNDIRECTED: u32 = 1;
/// The file carries a bitmap of known nodes (some ids below n_nodes are not).
pub const FLAG_KNOWN_BITMAP: u32 = 2;
/// The file is one edge type of a typed graph: rows are destination nodes,
/// indices source ids below `n_src`.
pub const FLAG_TYPED: u32 = 4;

/// A position in the update stream: a Redis Stream entry id `ms-seq`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct StreamPosition {
    pub ms: u64,
    pub seq: u64,
}

impl StreamPosition {
    /// Before every entry (`0-0`).
    pub const START: StreamPosition = StreamPosition { ms: 0, seq: 0 };

    /// Parses `ms-seq` (or `ms`, sequence 0).
    pub fn parse(text: &str) -> Option<Self> {
        let (ms, seq) = text.split_once('-').unwrap_or((text, "0"));
        Some(Self {
            ms: ms.parse().ok()?,
            seq: seq.parse().ok()?,
        })
    }
}

impl std::fmt::Display for StreamPosition {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.ms, self.seq)
    }
}

/// What each edge of an index carries besides its source: attributes (a
/// width), a weight, a time (all absent: a version-1 file); the shape the
/// ring's graph schema carries for its edge type.
pub use protocol::graph_schema::EdgeDataDesc as EdgeDataShape;

/// Byte ranges of an index's edge-data arrays (empty where absent).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeDataRanges {
    /// The section's descriptor.
    pub descriptor: Range<usize>,
    pub attrs: Range<usize>,
    pub weights: Range<usize>,
    pub times: Range<usize>,
}

/// The header of a CSR file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CsrHeader {
    pub flags: u32,
    pub n_nodes: u64,
    pub n_edges: u64,
    pub graph_version: u64,
    pub body_checksum: u64,
    /// The last update-stream entry whose changes the file holds.
    pub position: StreamPosition,
    /// Updates applied to the graph since its import.
    pub generation: u64,
    /// Update-stream entries consumed up to `position` (applied or skipped):
    /// with Redis's count of entries ever added, tells whether any entry
    /// after `position` was deleted.
    pub consumed: u64,
    /// With [`FLAG_TYPED`]: the source type's node count (indices are below
    /// it); 0 otherwise.
    pub n_src: u64,
    /// What the edges carry (version 2's section; empty in version 1).
    pub edge_data: EdgeDataShape,
}

/// Why a CSR file was refused.
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error(
        "graph index {path} is truncated: {found} bytes, {expected} expected; re-run sidecar import"
    )]
    Truncated {
        path: String,
        found: u64,
        expected: u64,
    },
    #[error("graph index {path} is corrupt: {what}; re-run sidecar import")]
    Corrupt { path: String, what: String },
    #[error(
        "graph index {path} has version {found}, this sidecar reads versions {VERSION} and \
         {VERSION_EDGE_DATA}; re-run sidecar import with this release"
    )]
    Version { path: String, found: u32 },
    #[error("graph index {path} is not a graph index (bad magic); check --data-dir")]
    NotAnIndex { path: String },
    #[error("graph index {path}: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
}

impl CsrHeader {
    pub fn indptr_offset() -> usize {
        HEADER_BYTES
    }

    pub fn indices_offset(n_nodes: u64) -> u64 {
        let end = HEADER_BYTES as u64 + 8 * (n_nodes + 1);
        end.next_multiple_of(64)
    }

    /// Where the known-node bitmap starts (when there is one).
    pub fn known_offset(n_nodes: u64, n_edges: u64) -> u64 {
        (Self::indices_offset(n_nodes) + 4 * n_edges).next_multiple_of(8)
    }

    /// Bytes of the file without edge data: without a bitmap, the end of
    /// the indices.
    fn graph_bytes(n_nodes: u64, n_edges: u64, known_bitmap: bool) -> u64 {
        if known_bitmap {
            Self::known_offset(n_nodes, n_edges) + 8 * n_nodes.div_ceil(64)
        } else {
            Self::indices_offset(n_nodes) + 4 * n_edges
        }
    }

    /// Offsets of the edge-data section's descriptor and arrays (attrs,
    /// weights, times) and the file's end.
    fn edge_data_offsets(
        n_nodes: u64,
        n_edges: u64,
        known_bitmap: bool,
        shape: EdgeDataShape,
    ) -> [u64; 5] {
        let descriptor = Self::graph_bytes(n_nodes, n_edges, known_bitmap).next_multiple_of(64);
        let attrs = descriptor + EDGE_DATA_HEADER_BYTES;
        let attrs_end = attrs + 4 * n_edges * u64::from(shape.attr_dim);
        let weights = attrs_end.next_multiple_of(64);
        let weights_end = weights + if shape.weight { 4 * n_edges } else { 0 };
        let times = weights_end.next_multiple_of(64);
        let end = times + if shape.time { 8 * n_edges } else { 0 };
        [descriptor, attrs, weights, times, end]
    }

    /// Bytes of the file: the end of its last section.
    pub fn file_bytes(n_nodes: u64, n_edges: u64, known_bitmap: bool, shape: EdgeDataShape) -> u64 {
        if shape.is_empty() {
            Self::graph_bytes(n_nodes, n_edges, known_bitmap)
        } else {
            Self::edge_data_offsets(n_nodes, n_edges, known_bitmap, shape)[4]
        }
    }

    /// The edge-data section's 64-byte descriptor.
    pub fn edge_data_descriptor(shape: EdgeDataShape) -> [u8; EDGE_DATA_HEADER_BYTES as usize] {
        let mut out = [0u8; EDGE_DATA_HEADER_BYTES as usize];
        out[..8].copy_from_slice(&EDGE_DATA_MAGIC);
        out[8..12].copy_from_slice(&shape.attr_dim.to_le_bytes());
        let what = u32::from(shape.weight) | u32::from(shape.time) << 1;
        out[12..16].copy_from_slice(&what.to_le_bytes());
        out
    }

    /// Byte ranges of the edge-data arrays (all empty without edge data).
    pub fn edge_data_ranges(&self) -> EdgeDataRanges {
        if self.edge_data.is_empty() {
            return EdgeDataRanges {
                descriptor: 0..0,
                attrs: 0..0,
                weights: 0..0,
                times: 0..0,
            };
        }
        let [descriptor, attrs, weights, times, _] = Self::edge_data_offsets(
            self.n_nodes,
            self.n_edges,
            self.has_known_bitmap(),
            self.edge_data,
        )
        .map(|o| o as usize);
        let e = self.n_edges as usize;
        let shape = self.edge_data;
        EdgeDataRanges {
            descriptor: descriptor..attrs,
            attrs: attrs..attrs + 4 * e * shape.attr_dim as usize,
            weights: weights..weights + if shape.weight { 4 * e } else { 0 },
            times: times..times + if shape.time { 8 * e } else { 0 },
        }
    }

    pub fn has_known_bitmap(&self) -> bool {
        self.flags & FLAG_KNOWN_BITMAP != 0
    }

    /// One edge type of a typed graph ([`FLAG_TYPED`]).
    pub fn is_typed(&self) -> bool {
        self.flags & FLAG_TYPED != 0
    }

    /// The bound of the indices: `n_src` for an edge type of a typed
    /// graph, `n_nodes` otherwise.
    pub fn source_count(&self) -> u64 {
        if self.is_typed() {
            self.n_src
        } else {
            self.n_nodes
        }
    }

    fn own_file_bytes(&self) -> u64 {
        Self::file_bytes(
            self.n_nodes,
            self.n_edges,
            self.has_known_bitmap(),
            self.edge_data,
        )
    }

    /// The 128 header bytes.
    pub fn encode(&self) -> [u8; HEADER_BYTES] {
        let mut out = [0u8; HEADER_BYTES];
        out[0..8].copy_from_slice(&MAGIC);
        let version = if self.edge_data.is_empty() {
            VERSION
        } else {
            VERSION_EDGE_DATA
        };
        out[8..12].copy_from_slice(&version.to_le_bytes());
        out[12..16].copy_from_slice(&self.flags.to_le_bytes());
        out[16..24].copy_from_slice(&self.n_nodes.to_le_bytes());
        out[24..32].copy_from_slice(&self.n_edges.to_le_bytes());
        out[32..40].copy_from_slice(&self.graph_version.to_le_bytes());
        out[40..48].copy_from_slice(&(HEADER_BYTES as u64).to_le_bytes());
        out[48..56].copy_from_slice(&Self::indices_offset(self.n_nodes).to_le_bytes());
        out[56..64].copy_from_slice(&self.own_file_bytes().to_le_bytes());
        out[64..72].copy_from_slice(&self.body_checksum.to_le_bytes());
        let known_offset = if self.has_known_bitmap() {
            Self::known_offset(self.n_nodes, self.n_edges)
        } else {
            0
        };
        out[72..80].copy_from_slice(&known_offset.to_le_bytes());
        out[80..88].copy_from_slice(&self.position.ms.to_le_bytes());
        out[88..96].copy_from_slice(&self.position.seq.to_le_bytes());
        out[96..104].copy_from_slice(&self.generation.to_le_bytes());
        out[104..112].copy_from_slice(&self.consumed.to_le_bytes());
        out[112..120].copy_from_slice(&self.n_src.to_le_bytes());
        let header_checksum = xxh3_64(&out[..120]);
        out[120..128].copy_from_slice(&header_checksum.to_le_bytes());
        out
    }

    /// Parses and checks the header against the file length. Never panics.
    pub fn decode(bytes: &[u8], file_len: u64, path: &str) -> Result<Self, FormatError> {
        let corrupt = |what: String| FormatError::Corrupt {
            path: path.to_string(),
            what,
        };
        if bytes.len() < HEADER_BYTES {
            if bytes.len() >= 8 && bytes[..8] != MAGIC {
                return Err(FormatError::NotAnIndex {
                    path: path.to_string(),
                });
            }
            return Err(FormatError::Truncated {
                path: path.to_string(),
                found: file_len,
                expected: HEADER_BYTES as u64,
            });
        }
        if bytes[..8] != MAGIC {
            return Err(FormatError::NotAnIndex {
                path: path.to_string(),
            });
        }
        let u32_at = |o: usize| u32::from_le_bytes(bytes[o..o + 4].try_into().expect("4 bytes"));
        let u64_at = |o: usize| u64::from_le_bytes(bytes[o..o + 8].try_into().expect("8 bytes"));
        if u64_at(120) != xxh3_64(&bytes[..120]) {
            return Err(corrupt("header checksum mismatch".into()));
        }
        let version = u32_at(8);
        if version != VERSION && version != VERSION_EDGE_DATA {
            return Err(FormatError::Version {
                path: path.to_string(),
                found: version,
            });
        }
        let header = CsrHeader {
            flags: u32_at(12),
            n_nodes: u64_at(16),
            n_edges: u64_at(24),
            graph_version: u64_at(32),
            body_checksum: u64_at(64),
            position: StreamPosition {
                ms: u64_at(80),
                seq: u64_at(88),
            },
            generation: u64_at(96),
            consumed: u64_at(104),
            n_src: u64_at(112),
            edge_data: EdgeDataShape::default(),
        };
        if header.flags & !(FLAG_UNDIRECTED | FLAG_KNOWN_BITMAP | FLAG_TYPED) != 0 {
            return Err(corrupt(format!("unknown flags {:#x}", header.flags)));
        }
        if header.is_typed() && header.has_known_bitmap()
            || !header.is_typed() && header.n_src != 0
            || header.n_src > u64::from(u32::MAX)
        {
            return Err(corrupt(format!(
                "flags {:#x} with n_src {}: an edge type of a typed graph has a source count \
                 below 2^32 and no known-node bitmap; another file has no source count",
                header.flags, header.n_src
            )));
        }
        if header.n_nodes > u64::from(u32::MAX) || header.n_edges > u64::MAX / 8 {
            return Err(corrupt(format!(
                "{} nodes / {} edges is out of range",
                header.n_nodes, header.n_edges
            )));
        }
        let mut header = header;
        if version == VERSION_EDGE_DATA {
            header.edge_data = Self::decode_edge_data(&header, bytes, file_len, path)?;
        }
        let expected = header.own_file_bytes();
        let known_offset = if header.has_known_bitmap() {
            Self::known_offset(header.n_nodes, header.n_edges)
        } else {
            0
        };
        if u64_at(40) != HEADER_BYTES as u64
            || u64_at(48) != Self::indices_offset(header.n_nodes)
            || u64_at(56) != expected
            || u64_at(72) != known_offset
        {
            return Err(corrupt("header offsets disagree with the counts".into()));
        }
        if file_len < expected {
            return Err(FormatError::Truncated {
                path: path.to_string(),
                found: file_len,
                expected,
            });
        }
        if file_len > expected {
            return Err(corrupt(format!(
                "{} bytes past the end of the index",
                file_len - expected
            )));
        }
        Ok(header)
    }

    /// Reads a version-2 file's edge-data descriptor (after the sections
    /// `header`'s counts place).
    fn decode_edge_data(
        header: &CsrHeader,
        bytes: &[u8],
        file_len: u64,
        path: &str,
    ) -> Result<EdgeDataShape, FormatError> {
        let corrupt = |what: String| FormatError::Corrupt {
            path: path.to_string(),
            what,
        };
        let start = Self::graph_bytes(header.n_nodes, header.n_edges, header.has_known_bitmap())
            .next_multiple_of(64);
        let end = start + EDGE_DATA_HEADER_BYTES;
        if file_len < end || (bytes.len() as u64) < end {
            return Err(FormatError::Truncated {
                path: path.to_string(),
                found: file_len,
                expected: end,
            });
        }
        let descriptor = &bytes[start as usize..end as usize];
        if descriptor[..8] != EDGE_DATA_MAGIC {
            return Err(corrupt(format!(
                "version {VERSION_EDGE_DATA} without its edge-data section at byte {start}"
            )));
        }
        let u32_at = |o: usize| u32::from_le_bytes(descriptor[o..o + 4].try_into().expect("4"));
        let (attr_dim, what) = (u32_at(8), u32_at(12));
        let shape = EdgeDataShape {
            attr_dim,
            weight: what & 1 != 0,
            time: what & 2 != 0,
        };
        if what & !3 != 0
            || shape.is_empty()
            || attr_dim > MAX_EDGE_ATTRS
            || descriptor[16..].iter().any(|&b| b != 0)
        {
            return Err(corrupt(format!(
                "edge-data descriptor with {attr_dim} attributes and flags {what:#x}: a version \
                 {VERSION_EDGE_DATA} file carries attributes (at most {MAX_EDGE_ATTRS}), a \
                 weight or a time, and zero reserved bytes"
            )));
        }
        // Before any offset is computed from them: the arrays fit the file.
        let per_edge =
            4 * u64::from(attr_dim) + 4 * u64::from(shape.weight) + 8 * u64::from(shape.time);
        if header
            .n_edges
            .checked_mul(per_edge)
            .is_none_or(|bytes| bytes > file_len)
        {
            return Err(FormatError::Truncated {
                path: path.to_string(),
                found: file_len,
                expected: header.n_edges.saturating_mul(per_edge),
            });
        }
        Ok(shape)
    }

    /// Byte range of the indptr array.
    pub fn indptr_range(&self) -> Range<usize> {
        HEADER_BYTES..HEADER_BYTES + 8 * (self.n_nodes as usize + 1)
    }

    /// Byte range of the indices array.
    pub fn indices_range(&self) -> Range<usize> {
        let start = Self::indices_offset(self.n_nodes) as usize;
        start..start + 4 * self.n_edges as usize
    }

    /// Byte range of the known-node bitmap (empty without one).
    pub fn known_range(&self) -> Range<usize> {
        if !self.has_known_bitmap() {
            return 0..0;
        }
        let start = Self::known_offset(self.n_nodes, self.n_edges) as usize;
        start..start + 8 * self.n_nodes.div_ceil(64) as usize
    }
}
