//! The memory-mapped CSR index, verified before use.
//!
//! This is the sidecar's only `unsafe` code: mapping a file. The file is
//! opened read-only and owned by the sidecar's data directory; the builder
//! writes a new index under a temporary name and renames it into place, so a
//! mapped index is never modified underneath the mapping.
#![allow(unsafe_code)]

use std::fs::File;
use std::path::Path;

use memmap2::Mmap;
use xxhash_rust::xxh3::xxh3_64;

use crate::graph::format::{CsrHeader, EdgeDataShape, FormatError};

/// The data of one row's edges ([`CsrIndex::edge_row`]).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EdgeRow<'a> {
    /// `degree x attr_dim`, row-major.
    pub attrs: &'a [f32],
    pub weights: &'a [f32],
    pub times: &'a [i64],
}

/// A verified, memory-mapped CSR graph.
#[derive(Debug)]
pub struct CsrIndex {
    map: Mmap,
    header: CsrHeader,
    /// Known nodes: n_nodes, or the bitmap's population.
    known: u64,
}

impl CsrIndex {
    /// Maps `path` and verifies it: header, checksums, and structure
    /// (non-decreasing indptr ending at n_edges, every neighbour id in range,
    /// rows sorted and unique). A truncated or corrupt file is refused.
    pub fn open(path: &Path) -> Result<Self, FormatError> {
        let shown = path.display().to_string();
        let io = |source| FormatError::Io {
            path: shown.clone(),
            source,
        };
        let file = File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        // SAFETY: the file is opened read-only; index files are only ever
        // replaced by rename, never written in place, so the mapped bytes do
        // not change while mapped (see the module doc). Every access goes
        // through bounds-checked slices.
        let map = unsafe { Mmap::map(&file) }.map_err(io)?;
        let header = CsrHeader::decode(&map, len, &shown)?;
        let mut index = Self {
            map,
            header,
            known: header.n_nodes,
        };
        index.verify(&shown)?;
        if header.has_known_bitmap() {
            index.known = index
                .known_words()
                .iter()
                .map(|w| u64::from(w.count_ones()))
                .sum();
        }
        Ok(index)
    }

    /// A graph without nodes, in memory: the one-type graph of a sidecar
    /// that serves a typed graph (whose edge types have indexes of their
    /// own), so that every one-type request finds no node.
    pub fn empty(graph_version: u64) -> Self {
        let len = CsrHeader::file_bytes(0, 0, false, EdgeDataShape::default()) as usize;
        let mut bytes = vec![0u8; len];
        // indptr = [0]: the zeros already there.
        let header = CsrHeader {
            flags: 0,
            n_nodes: 0,
            n_edges: 0,
            graph_version,
            body_checksum: xxh3_64(&bytes[CsrHeader::indptr_offset()..]),
            position: crate::graph::format::StreamPosition::START,
            generation: 0,
            consumed: 0,
            n_src: 0,
            edge_data: EdgeDataShape::default(),
        };
        bytes[..CsrHeader::indptr_offset()].copy_from_slice(&header.encode());
        let mut map = memmap2::MmapMut::map_anon(len).expect("mapping a few anonymous bytes");
        map.copy_from_slice(&bytes);
        let map = map
            .make_read_only()
            .expect("protecting an anonymous mapping");
        let index = Self {
            map,
            header,
            known: 0,
        };
        index.verify("(empty)").expect("an empty index is valid");
        index
    }

    fn verify(&self, path: &str) -> Result<(), FormatError> {
        let corrupt = |what: String| FormatError::Corrupt {
            path: path.to_string(),
            what,
        };
        let body = &self.map[CsrHeader::indptr_offset()..];
        if xxh3_64(body) != self.header.body_checksum {
            return Err(corrupt("body checksum mismatch".into()));
        }
        let indptr = self.indptr();
        let n_edges = self.header.n_edges;
        if indptr.first() != Some(&0) || indptr.last() != Some(&n_edges) {
            return Err(corrupt("indptr does not span the edges".into()));
        }
        if indptr.windows(2).any(|w| w[0] > w[1]) {
            return Err(corrupt("indptr decreases".into()));
        }
        let n = self.header.n_nodes as u32;
        let bound = self.header.source_count();
        // Between two types an equal id is no loop (module doc of format).
        let loops_checked = !self.header.is_typed();
        let shape = self.header.edge_data;
        for node in 0..n {
            let row = self.neighbors(node);
            let data = self.edge_row(node);
            // A row's order (format's module doc): by (time, id) with time,
            // by id otherwise; repeated ids only where edges carry data.
            let ordered = |i: usize| match (shape.time, shape.is_empty()) {
                (true, _) => (data.times[i], row[i]) <= (data.times[i + 1], row[i + 1]),
                (false, false) => row[i] <= row[i + 1],
                (false, true) => row[i] < row[i + 1],
            };
            if row
                .iter()
                .any(|&v| u64::from(v) >= bound || loops_checked && v == node)
                || !(0..row.len().saturating_sub(1)).all(ordered)
            {
                return Err(corrupt(format!(
                    "row of node {node} has an id out of range, a self loop, or is not in the \
                     index's order ({})",
                    if shape.time {
                        "by time, then id"
                    } else if shape.is_empty() {
                        "sorted and unique"
                    } else {
                        "sorted"
                    }
                )));
            }
        }
        let ranges = self.header.edge_data_ranges();
        let attrs: &[f32] = bytemuck::cast_slice(&self.map[ranges.attrs]);
        let weights: &[f32] = bytemuck::cast_slice(&self.map[ranges.weights]);
        for (name, values, width) in [
            ("attribute", attrs, shape.attr_dim.max(1) as usize),
            ("weight", weights, 1),
        ] {
            if let Some(at) = values.iter().position(|v| !v.is_finite()) {
                return Err(corrupt(format!(
                    "edge {} has a non-finite {name} ({})",
                    at / width,
                    values[at]
                )));
            }
        }
        if self.header.has_known_bitmap() {
            let tail = n as usize % 64;
            if tail != 0 && self.known_words().last().is_some_and(|w| w >> tail != 0) {
                return Err(corrupt(
                    "the known-node bitmap has bits past the last node".into(),
                ));
            }
            for node in 0..n {
                let row = self.neighbors(node);
                if !self.is_known(node) && !row.is_empty() || row.iter().any(|&v| !self.is_known(v))
                {
                    return Err(corrupt(format!(
                        "node {node}: an unknown node has edges, or an edge leads to one"
                    )));
                }
            }
        }
        Ok(())
    }

    pub fn header(&self) -> &CsrHeader {
        &self.header
    }

    pub fn n_nodes(&self) -> u32 {
        self.header.n_nodes as u32
    }

    pub fn n_edges(&self) -> u64 {
        self.header.n_edges
    }

    pub fn graph_version(&self) -> u64 {
        self.header.graph_version
    }

    /// Known nodes: every id below n_nodes, unless the file has a bitmap.
    pub fn known_nodes(&self) -> u64 {
        self.known
    }

    fn known_words(&self) -> &[u64] {
        bytemuck::cast_slice(&self.map[self.header.known_range()])
    }

    /// Whether `node` is a known node of this index.
    pub fn is_known(&self, node: u32) -> bool {
        if node >= self.n_nodes() {
            return false;
        }
        if !self.header.has_known_bitmap() {
            return true;
        }
        self.known_words()[node as usize / 64] >> (node % 64) & 1 == 1
    }

    fn indptr(&self) -> &[u64] {
        bytemuck::cast_slice(&self.map[self.header.indptr_range()])
    }

    fn indices(&self) -> &[u32] {
        bytemuck::cast_slice(&self.map[self.header.indices_range()])
    }

    /// The sorted neighbour ids of `node` (empty for an id outside the graph).
    pub fn neighbors(&self, node: u32) -> &[u32] {
        let indptr = self.indptr();
        let node = node as usize;
        if node + 1 >= indptr.len() {
            return &[];
        }
        &self.indices()[indptr[node] as usize..indptr[node + 1] as usize]
    }

    /// What each edge carries besides its source.
    pub fn edge_data(&self) -> EdgeDataShape {
        self.header.edge_data
    }

    /// The data of `node`'s edges, aligned with [`Self::neighbors`]: entry
    /// `i` (row `i` of the attributes) belongs to `neighbors(node)[i]`.
    /// Empty slices for what the edges do not carry, and for an id outside
    /// the graph.
    pub fn edge_row(&self, node: u32) -> EdgeRow<'_> {
        let indptr = self.indptr();
        let node = node as usize;
        let shape = self.header.edge_data;
        if shape.is_empty() || node + 1 >= indptr.len() {
            return EdgeRow::default();
        }
        let (start, end) = (indptr[node] as usize, indptr[node + 1] as usize);
        let ranges = self.header.edge_data_ranges();
        let dim = shape.attr_dim as usize;
        let attrs: &[f32] = bytemuck::cast_slice(&self.map[ranges.attrs]);
        let weights: &[f32] = bytemuck::cast_slice(&self.map[ranges.weights]);
        let times: &[i64] = bytemuck::cast_slice(&self.map[ranges.times]);
        EdgeRow {
            attrs: &attrs[start * dim..end * dim],
            weights: weights.get(start..end).unwrap_or_default(),
            times: times.get(start..end).unwrap_or_default(),
        }
    }

    pub fn degree(&self, node: u32) -> u32 {
        self.neighbors(node).len() as u32
    }

    /// The `k` nodes of highest degree, highest first (ties by id): the
    /// default hot set pinned in L1 at warm-up. O(n) selection, then a sort
    /// of the `k` chosen.
    pub fn top_degree(&self, k: usize) -> Vec<u32> {
        let n = self.n_nodes() as usize;
        let k = k.min(n);
        if k == 0 {
            return Vec::new();
        }
        let order = |a: &u32, b: &u32| self.degree(*b).cmp(&self.degree(*a)).then(a.cmp(b));
        let mut nodes: Vec<u32> = (0..n as u32).collect();
        if k < n {
            nodes.select_nth_unstable_by(k - 1, order);
            nodes.truncate(k);
        }
        nodes.sort_unstable_by(order);
        nodes
    }
}
