//! Building a CSR index from an edge list, streaming, in bounded memory.
//!
//! Two passes over the edges (a text list is first converted to a binary
//! temporary file, so it is parsed once):
//! 1. count out-degrees (8 bytes per node);
//! 2. scatter each edge into its row, in the output file itself (mapped,
//!    so rows live in the page cache, not in the heap), with a cursor per
//!    node (8 more bytes per node).
//!
//! Then each row is sorted, deduplicated and stripped of self loops, rows are
//! compacted in place, the body checksum computed and the header written. The
//! file is built under a temporary name and renamed into place. Heap use is
//! 16 bytes per node plus one read buffer, whatever the edge count: a
//! 10M-node, 200M-edge graph needs about 160 MB of heap.
//!
//! Edges that carry data ([`EdgeDataFiles`]: attributes, a weight, a time,
//! one row per input edge) are built the same way, except that the scatter
//! also places each edge's input position (in a temporary file of 8 bytes
//! per edge beside the output, mapped), each row is sorted by (time, id,
//! input position) (24 bytes of heap per edge of the largest row),
//! duplicates are kept (two payments between two accounts are two edges),
//! and the data is copied into the index's edge-data section in the rows'
//! order. The data files are mapped, not read into the heap.
#![allow(unsafe_code)]

use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{bail, ensure, Context};
use memmap2::MmapMut;
use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use crate::graph::format::{
    CsrHeader, EdgeDataShape, StreamPosition, FLAG_KNOWN_BITMAP, FLAG_TYPED, FLAG_UNDIRECTED,
    HEADER_BYTES, MAX_EDGE_ATTRS,
};

/// Edges read per chunk (8 MB of u32 pairs).
const CHUNK_EDGES: usize = 1 << 20;
/// Edges between two progress lines.
const PROGRESS_EVERY: u64 = 50_000_000;

/// Where edges come from: a binary file of little-endian u32 pairs.
#[derive(Debug, Clone)]
pub struct EdgeFile {
    pub path: PathBuf,
    /// Node count if known (a dataset's meta.json); otherwise max id + 1.
    pub n_nodes: Option<u64>,
}

impl EdgeFile {
    /// Calls `each` with chunks of (src, dst) pairs, logging progress every
    /// 50M edges under the name `pass`.
    fn for_each_chunk(&self, pass: &str, mut each: impl FnMut(&[[u32; 2]])) -> anyhow::Result<()> {
        let file = File::open(&self.path)
            .with_context(|| format!("opening edge file {}", self.path.display()))?;
        let len = file.metadata()?.len();
        ensure!(
            len % 8 == 0,
            "edge file {} is {len} bytes, not a whole number of u32 (src, dst) pairs",
            self.path.display()
        );
        let mut reader = BufReader::with_capacity(1 << 20, file);
        let mut buf = vec![[0u32; 2]; CHUNK_EDGES];
        let total = len / 8;
        let mut done = 0u64;
        let mut next_report = PROGRESS_EVERY;
        loop {
            let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut buf[..]);
            let mut filled = 0;
            while filled < bytes.len() {
                let n = reader.read(&mut bytes[filled..])?;
                if n == 0 {
                    break;
                }
                filled += n;
            }
            ensure!(filled % 8 == 0, "edge file ended inside a pair");
            let pairs = &mut buf[..filled / 8];
            if cfg!(target_endian = "big") {
                for pair in pairs.iter_mut() {
                    *pair = pair.map(u32::from_le);
                }
            }
            if pairs.is_empty() {
                return Ok(());
            }
            each(pairs);
            done += pairs.len() as u64;
            if done >= next_report {
                next_report += PROGRESS_EVERY;
                tracing::info!(
                    pass,
                    edges = done,
                    of = total,
                    percent = (done * 100 / total.max(1)),
                    "graph import"
                );
            }
        }
    }
}

/// Options of a build.
#[derive(Debug, Clone, Default)]
pub struct BuildOptions {
    /// Add the reverse of every edge.
    pub undirected: bool,
    pub graph_version: u64,
    /// Known nodes, one bit each (bit i of word i / 64), when some ids below
    /// the node count are not nodes (a compaction of sparse additions);
    /// `None`: every id is.
    pub known: Option<Vec<u64>>,
    /// The update-stream position, entries consumed and generation the
    /// file records.
    pub position: StreamPosition,
    pub consumed: u64,
    pub generation: u64,
    /// One edge type of a typed graph: rows are the destinations (the edge
    /// file's `n_nodes`, which must be given, is the destination type's
    /// count), indices the sources (format's `FLAG_TYPED`).
    pub typed: Option<TypedEdges>,
    /// What each input edge carries (none: a version-1 index).
    pub edge_data: EdgeDataFiles,
}

/// Files of what each input edge carries, aligned with the edge file: row
/// `k` of each belongs to edge `k` (docs/graph-index.md, "Edge data").
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EdgeDataFiles {
    /// `E x width` little-endian f32, row-major, and the width.
    pub attrs: Option<(PathBuf, u32)>,
    /// `E` little-endian f32.
    pub weight: Option<PathBuf>,
    /// `E` little-endian i64.
    pub time: Option<PathBuf>,
}

impl EdgeDataFiles {
    /// What the edges carry.
    pub fn shape(&self) -> EdgeDataShape {
        EdgeDataShape {
            attr_dim: self.attrs.as_ref().map_or(0, |(_, dim)| *dim),
            weight: self.weight.is_some(),
            time: self.time.is_some(),
        }
    }
}

/// A dataset's `edge_data` (docs/graph-index.md, "Edge data"): the files
/// of what each edge carries, one row per edge in the edge file's order,
/// relative to the dataset directory. The same object in the one-type
/// layout's meta.json and in each edge type of a typed one.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EdgeDataSpec {
    /// `num_edges x attr_dim` little-endian f32, row-major.
    pub attrs: Option<PathBuf>,
    #[serde(default)]
    pub attr_dim: u32,
    /// The attributes' names, `attr_dim` of them (informational).
    pub attr_names: Option<Vec<String>>,
    /// `num_edges` little-endian f32.
    pub weight: Option<PathBuf>,
    /// `num_edges` little-endian i64 (the dataset's own unit; its meta.json
    /// says which).
    pub time: Option<PathBuf>,
    /// The unit of `time` (informational).
    pub time_unit: Option<String>,
}

impl EdgeDataSpec {
    /// Reads an `edge_data` object (absent: the edges carry nothing).
    pub fn from_json(value: Option<&serde_json::Value>) -> anyhow::Result<Self> {
        match value {
            None => Ok(Self::default()),
            Some(value) => Self::deserialize(value).context(
                "edge_data: an object of attrs, attr_dim, attr_names, weight, time and time_unit \
                 (docs/graph-index.md, \"Edge data\")",
            ),
        }
    }

    /// The files under `dir`, after the width agrees with the file's
    /// presence and the names with the width.
    pub fn files(&self, dir: &Path) -> anyhow::Result<EdgeDataFiles> {
        let attrs = match (&self.attrs, self.attr_dim) {
            (None, 0) => None,
            (Some(file), 1..=MAX_EDGE_ATTRS) => Some((dir.join(file), self.attr_dim)),
            (file, dim) => bail!(
                "edge_data has attr_dim {dim} and attrs {file:?}: attributes name their file \
                 and a width of 1 to {MAX_EDGE_ATTRS}; edges without attributes have neither"
            ),
        };
        if let Some(names) = &self.attr_names {
            ensure!(
                names.len() == self.attr_dim as usize,
                "edge_data lists {} attr_names for attr_dim {}: one name per attribute",
                names.len(),
                self.attr_dim
            );
        }
        ensure!(
            self.time.is_some() || self.time_unit.is_none(),
            "edge_data has a time_unit but no time file"
        );
        Ok(EdgeDataFiles {
            attrs,
            weight: self.weight.as_ref().map(|file| dir.join(file)),
            time: self.time.as_ref().map(|file| dir.join(file)),
        })
    }
}

/// A read-only mapping of a whole file (empty files map to nothing).
struct Mapped(Option<memmap2::Mmap>);

impl Mapped {
    fn open(path: &Path, what: &str, expected: u64) -> anyhow::Result<Self> {
        let file =
            File::open(path).with_context(|| format!("opening {what} {}", path.display()))?;
        let len = file.metadata()?.len();
        ensure!(
            len == expected,
            "{what} {} is {len} bytes; the edges need {expected} (one row per edge, in the edge \
             file's order): fix the file or meta.json",
            path.display()
        );
        if len == 0 {
            return Ok(Self(None));
        }
        // SAFETY: an input of the import, opened read-only; the import
        // requires that nothing writes its inputs while it runs (the edge
        // file's second pass checks it), and every access is bounds-checked.
        Ok(Self(Some(
            unsafe { memmap2::Mmap::map(&file) }
                .with_context(|| format!("mapping {what} {}", path.display()))?,
        )))
    }

    fn bytes(&self) -> &[u8] {
        self.0.as_deref().unwrap_or_default()
    }
}

/// The mapped inputs of an edge-data build.
struct EdgeDataInputs {
    shape: EdgeDataShape,
    attrs: Mapped,
    weights: Mapped,
    times: Mapped,
}

impl EdgeDataInputs {
    /// Maps the data files of `input_edges` edges, and refuses a file of
    /// the wrong size or a non-finite value, by name.
    fn open(files: &EdgeDataFiles, input_edges: u64) -> anyhow::Result<Self> {
        let shape = files.shape();
        ensure!(
            shape.attr_dim <= MAX_EDGE_ATTRS,
            "{} attributes per edge: at most {MAX_EDGE_ATTRS}",
            shape.attr_dim
        );
        let none = || Ok(Mapped(None));
        let inputs = Self {
            shape,
            attrs: files.attrs.as_ref().map_or_else(none, |(path, dim)| {
                Mapped::open(path, "edge attributes", 4 * u64::from(*dim) * input_edges)
            })?,
            weights: files.weight.as_ref().map_or_else(none, |path| {
                Mapped::open(path, "edge weights", 4 * input_edges)
            })?,
            times: files.time.as_ref().map_or_else(none, |path| {
                Mapped::open(path, "edge times", 8 * input_edges)
            })?,
        };
        let width = shape.attr_dim.max(1) as usize;
        for (what, file, bytes, width) in [
            (
                "attribute",
                &files.attrs.as_ref().map(|(p, _)| p),
                &inputs.attrs,
                width,
            ),
            ("weight", &files.weight.as_ref(), &inputs.weights, 1),
        ] {
            let bad = bytes
                .bytes()
                .chunks_exact(4)
                .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
                .enumerate()
                .find(|(_, v)| !v.is_finite());
            if let (Some((at, value)), Some(path)) = (bad, file) {
                bail!(
                    "{}: edge {} has {what} {value}{}; edge data must be finite numbers (fix \
                     the converter that wrote the file)",
                    path.display(),
                    at / width,
                    if width > 1 {
                        format!(" in column {}", at % width)
                    } else {
                        String::new()
                    }
                );
            }
        }
        Ok(inputs)
    }

    fn time(&self, k: u64) -> i64 {
        if !self.shape.time {
            return 0;
        }
        let at = 8 * k as usize;
        i64::from_le_bytes(self.times.bytes()[at..at + 8].try_into().expect("8 bytes"))
    }
}

/// The source side of a typed edge type's build.
#[derive(Debug, Clone, Copy)]
pub struct TypedEdges {
    /// The source type's node count: every source id is below it.
    pub n_src: u64,
    /// Source and destination are one type: self loops are dropped, as the
    /// one-type index drops them.
    pub same_type: bool,
}

/// What a build produced.
#[derive(Debug, Clone, Copy)]
pub struct BuildStats {
    pub n_nodes: u64,
    /// Edges read (before reversing and deduplication).
    pub input_edges: u64,
    /// Edges in the index.
    pub n_edges: u64,
    pub self_loops_dropped: u64,
    pub duplicates_dropped: u64,
    pub seconds: f64,
    /// What each edge carries (duplicates are kept when it carries
    /// anything).
    pub edge_data: EdgeDataShape,
}

impl BuildStats {
    /// `N edges (D duplicates and L self loops dropped)`, or with edge
    /// data `N edges carrying ... (duplicates kept, L self loops dropped)`.
    pub fn edges_summary(&self) -> String {
        if self.edge_data.is_empty() {
            format!(
                "{} edges ({} duplicates and {} self loops dropped)",
                self.n_edges, self.duplicates_dropped, self.self_loops_dropped
            )
        } else {
            format!(
                "{} edges carrying {} (duplicates kept, {} self loops dropped)",
                self.n_edges, self.edge_data, self.self_loops_dropped
            )
        }
    }
}

/// Converts a text edge list (`src dst` per line, `#` comments, blank lines)
/// to a binary edge file. Errors name the line.
pub fn text_to_binary(text: &Path, out: &Path) -> anyhow::Result<u64> {
    let input = File::open(text).with_context(|| format!("opening {}", text.display()))?;
    let mut reader = BufReader::with_capacity(1 << 20, input);
    let mut writer = BufWriter::with_capacity(1 << 20, File::create(out)?);
    let mut line = String::new();
    let mut line_no = 0u64;
    let mut edges = 0u64;
    loop {
        line.clear();
        if reader.read_line(&mut line)? == 0 {
            break;
        }
        line_no += 1;
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let mut fields = content.split_whitespace();
        let (Some(src), Some(dst), None) = (fields.next(), fields.next(), fields.next()) else {
            bail!(
                "{}:{line_no}: expected `src dst`, found {content:?}",
                text.display()
            );
        };
        let parse = |field: &str| -> anyhow::Result<u32> {
            field.parse::<u32>().with_context(|| {
                format!(
                    "{}:{line_no}: node id {field:?} is not an integer in 0..=4294967295",
                    text.display()
                )
            })
        };
        let (src, dst) = (parse(src)?, parse(dst)?);
        writer.write_all(&src.to_le_bytes())?;
        writer.write_all(&dst.to_le_bytes())?;
        edges += 1;
        if edges.is_multiple_of(PROGRESS_EVERY) {
            tracing::info!(edges, "parsing the edge list");
        }
    }
    writer.flush()?;
    Ok(edges)
}

/// Builds the CSR index at `out` from `edges`.
pub fn build(edges: &EdgeFile, out: &Path, options: &BuildOptions) -> anyhow::Result<BuildStats> {
    let started = Instant::now();
    ensure!(
        options.typed.is_none() || edges.n_nodes.is_some() && !options.undirected,
        "an edge type of a typed graph is built with its destination type's count, and not \
         undirected (its reverse is an edge type of its own)"
    );
    let data_shape = options.edge_data.shape();
    let with_data = !data_shape.is_empty();
    ensure!(
        !(with_data && options.undirected),
        "edges with data are imported as they are listed: leave out --undirected and list each \
         direction with its own data"
    );
    // Pass 1: degrees.
    let declared = edges.n_nodes.unwrap_or(0);
    ensure!(
        declared <= u64::from(u32::MAX),
        "num_nodes {declared}: node ids must be below 2^32; fix meta.json"
    );
    let mut degrees: Vec<u64> = Vec::new();
    degrees
        .try_reserve_exact(declared as usize)
        .map_err(|_| anyhow::anyhow!("num_nodes {declared}: not enough memory for the index"))?;
    degrees.resize(declared as usize, 0);
    let mut input_edges = 0u64;
    let mut too_large: Option<u32> = None;
    let mut unallocatable: Option<u32> = None;
    let mut source_too_large: Option<u32> = None;
    edges.for_each_chunk("counting degrees", |pairs| {
        input_edges += pairs.len() as u64;
        if let Some(typed) = options.typed {
            // Rows are destinations, below the declared count; sources are
            // ids of their own type.
            for &[src, dst] in pairs {
                if u64::from(src) >= typed.n_src {
                    source_too_large.get_or_insert(src);
                } else if let Some(degree) = degrees.get_mut(dst as usize) {
                    *degree += 1;
                } else {
                    too_large.get_or_insert(dst);
                }
            }
            return;
        }
        for &[src, dst] in pairs {
            let high = src.max(dst) as usize;
            if high >= degrees.len() {
                if edges.n_nodes.is_some() || high >= u32::MAX as usize {
                    // Ids are below 2^32 - 1 (a count of nodes must fit a u32):
                    // refused before any memory is set aside for them.
                    too_large.get_or_insert(high as u32);
                    continue;
                }
                if unallocatable.is_some()
                    || degrees.try_reserve_exact(high + 1 - degrees.len()).is_err()
                {
                    unallocatable.get_or_insert(high as u32);
                    continue;
                }
                degrees.resize(high + 1, 0);
            }
            degrees[src as usize] += 1;
            if options.undirected {
                degrees[dst as usize] += 1;
            }
        }
    })?;
    if let (Some(id), Some(typed)) = (source_too_large, options.typed) {
        bail!(
            "edge source {id} is not below the source type's num_nodes {}; fix meta.json or the \
             edges",
            typed.n_src
        );
    }
    if let (Some(id), Some(_)) = (too_large, options.typed) {
        bail!(
            "edge destination {id} is not below the destination type's num_nodes {declared}; fix \
             meta.json or the edges"
        );
    }
    if let Some(id) = too_large {
        match edges.n_nodes {
            Some(n) => bail!(
                "edge endpoint {id} is not below the dataset's num_nodes {n}; fix meta.json or \
                 the edges"
            ),
            None => bail!(
                "edge endpoint {id}: node ids must be below {} (4294967295 is reserved); \
                 renumber the nodes",
                u32::MAX
            ),
        }
    }
    if let Some(id) = unallocatable {
        bail!(
            "edge endpoint {id} needs an index of {} nodes, more memory than this machine can \
             set aside for its degrees ({} GiB): renumber the nodes densely from 0",
            u64::from(id) + 1,
            ((u64::from(id) + 1) * 8) >> 30
        );
    }
    let n_nodes = degrees.len() as u64;
    ensure!(
        n_nodes <= u64::from(u32::MAX),
        "{n_nodes} nodes: node ids must be below 2^32"
    );
    let raw_edges: u64 = degrees.iter().sum();
    let inputs = if with_data {
        Some(EdgeDataInputs::open(&options.edge_data, input_edges)?)
    } else {
        None
    };
    tracing::info!(
        nodes = n_nodes,
        edges = input_edges,
        secs = started.elapsed().as_secs_f64(),
        "graph import: degrees counted"
    );

    // Prefix sums into the output file's indptr; scatter with cursors.
    let tmp = out.with_extension("csr.tmp");
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&tmp)
        .with_context(|| format!("creating {}", tmp.display()))?;
    if let Some(known) = &options.known {
        ensure!(
            known.len() as u64 == n_nodes.div_ceil(64),
            "the known-node bitmap has {} words for {n_nodes} nodes",
            known.len()
        );
    }
    let with_bitmap = options.known.is_some();
    let raw_len = CsrHeader::file_bytes(n_nodes, raw_edges, with_bitmap, data_shape);
    // The blocks are reserved up front: a sparse file's pages written through
    // the mapping on a full device would raise SIGBUS and kill the process
    // (the sidecar, during a compaction); this fails cleanly instead.
    if let Err(e) = nix::fcntl::posix_fallocate(&file, 0, raw_len as i64) {
        drop(file);
        let _ = std::fs::remove_file(&tmp);
        anyhow::bail!(
            "cannot reserve {raw_len} bytes for {}: {e}; free space on that device and retry",
            tmp.display()
        );
    }
    // SAFETY: `tmp` was just created by this process and nobody else maps or
    // writes it until it is renamed into place below.
    let mut map = unsafe { MmapMut::map_mut(&file) }?;
    let indices_start = CsrHeader::indices_offset(n_nodes) as usize;
    let (head, rest) = map.split_at_mut(indices_start);
    let indptr: &mut [u64] =
        bytemuck::cast_slice_mut(&mut head[HEADER_BYTES..][..8 * (n_nodes as usize + 1)]);
    let indices: &mut [u32] = bytemuck::cast_slice_mut(&mut rest[..4 * raw_edges as usize]);
    // With edge data: each placed edge's input position, beside the output.
    let mut origin_file = match with_data {
        true => Some(Scratch::create(
            out.with_extension("csr.origin.tmp"),
            8 * raw_edges,
        )?),
        false => None,
    };
    let origin: &mut [u64] = match &mut origin_file {
        Some(scratch) => scratch.words(),
        None => &mut [],
    };
    indptr[0] = 0;
    for node in 0..n_nodes as usize {
        indptr[node + 1] = indptr[node] + degrees[node];
    }
    // Reuse the degree vector as the scatter cursor.
    let mut cursor = degrees;
    cursor.copy_from_slice(&indptr[..n_nodes as usize]);
    // The edge file is read twice; if it changed in between, an edge may
    // fall outside the rows counted by the first pass: refused, never
    // written out of bounds.
    let mut changed = false;
    let mut placed_edges = 0u64;
    edges.for_each_chunk("placing edges", |pairs| {
        let first = placed_edges;
        placed_edges += pairs.len() as u64;
        for (k, &[src, dst]) in (first..).zip(pairs) {
            let mut place = |from: u32, to: u32| {
                let from = from as usize;
                match cursor.get_mut(from) {
                    Some(c) if *c < indptr[from + 1] => {
                        indices[*c as usize] = to;
                        if let Some(at) = origin.get_mut(*c as usize) {
                            *at = k;
                        }
                        *c += 1;
                    }
                    _ => changed = true,
                }
            };
            if options.typed.is_some() {
                place(dst, src);
                continue;
            }
            place(src, dst);
            if options.undirected {
                place(dst, src);
            }
        }
    })?;
    ensure!(
        !changed && placed_edges == input_edges,
        "the edge file changed while it was read ({input_edges} edges at the first pass, \
         {placed_edges} at the second): import from a file nothing else writes"
    );
    drop(cursor);
    tracing::info!(
        secs = started.elapsed().as_secs_f64(),
        "graph import: edges scattered"
    );

    // Sort, dedup, drop self loops, compact rows towards the front.
    let drop_loops = options.typed.is_none_or(|typed| typed.same_type);
    let mut write = 0usize;
    let mut self_loops = 0u64;
    let mut read_start = 0usize;
    // With edge data: one row's (time, id, input position), sorted.
    let mut row: Vec<(i64, u32, u64)> = Vec::new();
    for node in 0..n_nodes as usize {
        let read_end = indptr[node + 1] as usize;
        if let Some(inputs) = &inputs {
            // By (time, id, input position); duplicates kept. Each key is
            // read once (a time is a random read of the time file).
            row.clear();
            row.extend(
                (read_start..read_end).map(|i| (inputs.time(origin[i]), indices[i], origin[i])),
            );
            row.sort_unstable();
            let mut kept = 0usize;
            for &(_, v, k) in &row {
                if drop_loops && v as usize == node {
                    self_loops += 1;
                    continue;
                }
                indices[write + kept] = v;
                origin[write + kept] = k;
                kept += 1;
            }
            indptr[node] = write as u64;
            write += kept;
            read_start = read_end;
            continue;
        }
        let row = &mut indices[read_start..read_end];
        row.sort_unstable();
        let mut kept = 0usize;
        let mut previous: Option<u32> = None;
        for i in 0..row.len() {
            // Reads index i, writes index kept <= i: in place.
            let v = row[i];
            if drop_loops && v as usize == node {
                self_loops += 1;
                continue;
            }
            if previous == Some(v) {
                continue;
            }
            previous = Some(v);
            row[kept] = v;
            kept += 1;
        }
        indices.copy_within(read_start..read_start + kept, write);
        indptr[node] = write as u64;
        write += kept;
        read_start = read_end;
    }
    indptr[n_nodes as usize] = write as u64;
    let n_edges = write as u64;
    map.flush()?;
    drop(map);
    let final_len = CsrHeader::file_bytes(n_nodes, n_edges, with_bitmap, data_shape);
    file.set_len(final_len)?;
    // SAFETY: as above; the file was shrunk before it is mapped again.
    let mut map = unsafe { MmapMut::map_mut(&file) }?;
    let mut flags = if options.undirected {
        FLAG_UNDIRECTED
    } else {
        0
    };
    if options.typed.is_some() {
        flags |= FLAG_TYPED;
    }
    if let Some(known) = &options.known {
        flags |= FLAG_KNOWN_BITMAP;
        let start = CsrHeader::known_offset(n_nodes, n_edges) as usize;
        // Zero padding between the indices and the bitmap, then the bitmap.
        map[CsrHeader::indices_offset(n_nodes) as usize + 4 * n_edges as usize..start].fill(0);
        for (i, word) in known.iter().enumerate() {
            map[start + 8 * i..start + 8 * i + 8].copy_from_slice(&word.to_le_bytes());
        }
    }
    let mut header = CsrHeader {
        flags,
        n_nodes,
        n_edges,
        graph_version: options.graph_version,
        body_checksum: 0,
        position: options.position,
        generation: options.generation,
        consumed: options.consumed,
        n_src: options.typed.map_or(0, |typed| typed.n_src),
        edge_data: data_shape,
    };
    if let Some(inputs) = &inputs {
        write_edge_data(&mut map, &header, inputs, &origin[..n_edges as usize]);
    }
    drop(origin_file);
    header.body_checksum = xxh3_64(&map[HEADER_BYTES..]);
    map[..HEADER_BYTES].copy_from_slice(&header.encode());
    map.flush()?;
    drop(map);
    file.sync_all()?;
    std::fs::rename(&tmp, out)
        .with_context(|| format!("renaming {} to {}", tmp.display(), out.display()))?;
    let stats = BuildStats {
        n_nodes,
        input_edges,
        n_edges,
        self_loops_dropped: self_loops,
        duplicates_dropped: raw_edges - n_edges - self_loops,
        seconds: started.elapsed().as_secs_f64(),
        edge_data: data_shape,
    };
    tracing::info!(
        nodes = stats.n_nodes,
        edges = stats.n_edges,
        duplicates_dropped = stats.duplicates_dropped,
        self_loops_dropped = stats.self_loops_dropped,
        secs = stats.seconds,
        edges_per_sec = (stats.input_edges as f64 / stats.seconds) as u64,
        "graph import: index written"
    );
    Ok(stats)
}

/// A temporary file of `bytes` bytes, mapped for writing, removed when
/// dropped.
struct Scratch {
    path: PathBuf,
    /// `None` for 0 bytes (nothing to map).
    map: Option<MmapMut>,
}

impl Scratch {
    fn create(path: PathBuf, bytes: u64) -> anyhow::Result<Self> {
        let file = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&path)
            .with_context(|| format!("creating {}", path.display()))?;
        let scratch = |e: String| {
            let _ = std::fs::remove_file(&path);
            anyhow::anyhow!(
                "cannot reserve {bytes} bytes for {}: {e}; free space on that device and retry",
                path.display()
            )
        };
        if bytes == 0 {
            return Ok(Self { path, map: None });
        }
        nix::fcntl::posix_fallocate(&file, 0, bytes as i64).map_err(|e| scratch(e.to_string()))?;
        // SAFETY: created above by this process, removed when dropped;
        // nothing else maps or writes it.
        let map = unsafe { MmapMut::map_mut(&file) }.map_err(|e| scratch(e.to_string()))?;
        Ok(Self {
            path,
            map: Some(map),
        })
    }

    fn words(&mut self) -> &mut [u64] {
        match &mut self.map {
            Some(map) => bytemuck::cast_slice_mut(&mut map[..]),
            None => &mut [],
        }
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Writes the edge-data section of `header`'s index into `map`: the
/// descriptor, then each array in the rows' order (`origin[i]`: the input
/// position of the index's edge `i`), with zero padding between sections.
fn write_edge_data(map: &mut [u8], header: &CsrHeader, inputs: &EdgeDataInputs, origin: &[u64]) {
    let ranges = header.edge_data_ranges();
    let graph_end = CsrHeader::file_bytes(
        header.n_nodes,
        header.n_edges,
        header.has_known_bitmap(),
        EdgeDataShape::default(),
    ) as usize;
    map[graph_end..ranges.descriptor.start].fill(0);
    map[ranges.descriptor.clone()]
        .copy_from_slice(&CsrHeader::edge_data_descriptor(header.edge_data));
    map[ranges.attrs.end..ranges.weights.start].fill(0);
    map[ranges.weights.end..ranges.times.start].fill(0);
    let row_bytes = 4 * header.edge_data.attr_dim as usize;
    for (i, &k) in origin.iter().enumerate() {
        let k = k as usize;
        if row_bytes > 0 {
            map[ranges.attrs.start + i * row_bytes..][..row_bytes]
                .copy_from_slice(&inputs.attrs.bytes()[k * row_bytes..][..row_bytes]);
        }
        if header.edge_data.weight {
            map[ranges.weights.start + 4 * i..][..4]
                .copy_from_slice(&inputs.weights.bytes()[4 * k..][..4]);
        }
        if header.edge_data.time {
            map[ranges.times.start + 8 * i..][..8]
                .copy_from_slice(&inputs.times.bytes()[8 * k..][..8]);
        }
    }
}
