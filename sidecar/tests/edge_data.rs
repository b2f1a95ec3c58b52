//! Edges that carry data (docs/graph-index.md, "Edge data"): attributes, a
//! weight and a time per edge, imported from a dataset's `edge_data`
//! files into the index, aligned with each row, each row in the index's
//! order (by time, then source id, then input position with a time; by
//! source id, then input position without), duplicates kept, refused by
//! name when the files disagree with the edges, checked when the index is
//! opened, and carried through a compaction.

use protocol::request::EdgeColumns;
use std::path::Path;
use std::process::Command;

use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sidecar::graph::typed::TYPED_DIR;
use sidecar::graph::{
    CsrHeader, CsrIndex, EdgeValues, GraphSnapshot, GraphSource, GraphUpdate, LiveGraph, TypedGraph,
};
use tests::stack::workspace_bin;

/// One edge list with its data, as a converter writes it.
#[derive(Debug, Clone, Default)]
struct Edges {
    pairs: Vec<[u32; 2]>,
    attr_dim: usize,
    attrs: Vec<f32>,
    weights: Vec<f32>,
    times: Vec<i64>,
}

impl Edges {
    /// `n` random edges between `n_src` and `n_dst` nodes, with repeats
    /// (few nodes, many edges) and, where `attr_dim`/`weight`/`time` ask,
    /// random data; times from a small range so that ties occur.
    fn random(rng: &mut SmallRng, n: usize, n_src: u32, n_dst: u32, shape: Shape) -> Self {
        let (attr_dim, weight, time) = shape;
        let mut edges = Edges {
            attr_dim,
            ..Edges::default()
        };
        for _ in 0..n {
            edges
                .pairs
                .push([rng.random_range(0..n_src), rng.random_range(0..n_dst)]);
            for _ in 0..attr_dim {
                edges.attrs.push(rng.random_range(-1.0f32..1.0));
            }
            if weight {
                edges.weights.push(rng.random_range(0.0f32..5.0));
            }
            if time {
                edges
                    .times
                    .push(rng.random_range(1_356_998_400i64..1_356_998_420));
            }
        }
        edges
    }

    /// Writes the edge file and the data files named `<stem>.*` into
    /// `dir`; returns the `edge_data` object of meta.json.
    fn write(&self, dir: &Path, stem: &str) -> serde_json::Value {
        let bytes: Vec<u8> = self
            .pairs
            .iter()
            .flat_map(|p| p.iter().flat_map(|v| v.to_le_bytes()))
            .collect();
        std::fs::write(dir.join(format!("{stem}.u32")), bytes).unwrap();
        let mut data = serde_json::Map::new();
        if self.attr_dim > 0 {
            let file = format!("{stem}.attr.f32");
            let bytes: Vec<u8> = self.attrs.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(dir.join(&file), bytes).unwrap();
            data.insert("attrs".into(), file.into());
            data.insert("attr_dim".into(), self.attr_dim.into());
        }
        if !self.weights.is_empty() {
            let file = format!("{stem}.weight.f32");
            let bytes: Vec<u8> = self.weights.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(dir.join(&file), bytes).unwrap();
            data.insert("weight".into(), file.into());
        }
        if !self.times.is_empty() {
            let file = format!("{stem}.time.i64");
            let bytes: Vec<u8> = self.times.iter().flat_map(|v| v.to_le_bytes()).collect();
            std::fs::write(dir.join(&file), bytes).unwrap();
            data.insert("time".into(), file.into());
            data.insert("time_unit".into(), "s".into());
        }
        serde_json::Value::Object(data)
    }

    /// What the index's row of `row_node` must hold, in the documented
    /// order: the input edges whose row end is `row_node` (less self loops
    /// when `loops` says they are dropped), as (time, entry id, input
    /// position), sorted.
    fn expected_row(&self, row_node: u32, row_end: usize, drop_loops: bool) -> Vec<usize> {
        let entry_end = 1 - row_end;
        let mut row: Vec<(i64, u32, usize)> = self
            .pairs
            .iter()
            .enumerate()
            .filter(|(_, p)| p[row_end] == row_node && !(drop_loops && p[entry_end] == row_node))
            .map(|(k, p)| (self.times.get(k).copied().unwrap_or(0), p[entry_end], k))
            .collect();
        row.sort_unstable();
        row.into_iter().map(|(_, _, k)| k).collect()
    }

    /// Asserts that `index`'s rows hold exactly these edges and their data
    /// in the documented order; `row_end` is the pair's end the rows are
    /// keyed by (1: a typed index's destination, 0: a one-type index's
    /// first id).
    fn assert_index(&self, index: &CsrIndex, row_end: usize, drop_loops: bool, what: &str) {
        let dim = self.attr_dim;
        let mut total = 0;
        for node in 0..index.n_nodes() {
            let expected = self.expected_row(node, row_end, drop_loops);
            let row = index.neighbors(node);
            let data = index.edge_row(node);
            let ids: Vec<u32> = expected
                .iter()
                .map(|&k| self.pairs[k][1 - row_end])
                .collect();
            assert_eq!(row, &ids[..], "{what}: the ids of row {node}");
            let attrs: Vec<f32> = expected
                .iter()
                .flat_map(|&k| self.attrs[k * dim..(k + 1) * dim].iter().copied())
                .collect();
            assert_eq!(
                data.attrs,
                &attrs[..],
                "{what}: the attributes of row {node}"
            );
            let weights: Vec<f32> = expected
                .iter()
                .filter_map(|&k| self.weights.get(k).copied())
                .collect();
            assert_eq!(
                data.weights,
                &weights[..],
                "{what}: the weights of row {node}"
            );
            let times: Vec<i64> = expected
                .iter()
                .filter_map(|&k| self.times.get(k).copied())
                .collect();
            assert_eq!(data.times, &times[..], "{what}: the times of row {node}");
            total += row.len();
        }
        assert_eq!(index.n_edges(), total as u64, "{what}: the edge count");
    }
}

/// Attribute width, weight, time.
type Shape = (usize, bool, bool);

/// A typed dataset of accounts and merchants: `pays` (accounts to
/// merchants: 3 attributes, a weight and a time), `sends` (accounts to
/// accounts, with self loops: a time) and `rev_pays` (no data).
fn payments(dir: &Path) -> [Edges; 3] {
    let mut rng = SmallRng::seed_from_u64(7);
    let pays = Edges::random(&mut rng, 600, 40, 12, (3, true, true));
    let sends = Edges::random(&mut rng, 300, 40, 40, (0, false, true));
    let rev_pays = Edges {
        pairs: {
            let mut pairs: Vec<[u32; 2]> = pays.pairs.iter().map(|&[a, m]| [m, a]).collect();
            pairs.sort_unstable();
            pairs.dedup();
            pairs
        },
        ..Edges::default()
    };
    std::fs::create_dir_all(dir.join("edges")).unwrap();
    let mut edge_types = Vec::new();
    for (name, src, dst, edges) in [
        ("pays", "account", "merchant", &pays),
        ("sends", "account", "account", &sends),
        ("rev_pays", "merchant", "account", &rev_pays),
    ] {
        let stem = format!("edges/{src}__{name}__{dst}");
        let data = edges.write(dir, &stem);
        let mut entry = serde_json::json!({
            "src": src, "relation": name, "dst": dst,
            "num_edges": edges.pairs.len(), "edges": format!("{stem}.u32"),
        });
        if data.as_object().is_some_and(|d| !d.is_empty()) {
            entry["edge_data"] = data;
        }
        edge_types.push(entry);
    }
    let meta = serde_json::json!({
        "node_types": [
            {"name": "account", "num_nodes": 40},
            {"name": "merchant", "num_nodes": 12},
        ],
        "edge_types": edge_types,
    });
    std::fs::write(dir.join("meta.json"), meta.to_string()).unwrap();
    [pays, sends, rev_pays]
}

fn import(dataset: &Path, data_dir: &Path, extra: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("sidecar"))
        .arg("import")
        .arg(dataset)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .output()
        .expect("running sidecar import")
}

fn imported(dataset: &Path, data_dir: &Path) -> String {
    let out = import(dataset, data_dir, &[]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "import: {stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    stdout
}

fn refused(dataset: &Path, extra: &[&str]) -> String {
    let data = tempfile::tempdir().unwrap();
    let out = import(dataset, data.path(), extra);
    assert!(!out.status.success(), "the import of {dataset:?} succeeded");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn a_typed_dataset_s_edge_data_is_stored_in_each_row_s_order() {
    let source = tempfile::tempdir().unwrap();
    let edges = payments(source.path());
    let data = tempfile::tempdir().unwrap();
    let stdout = imported(source.path(), data.path());
    assert!(
        stdout.contains(
            "edge type account__pays__merchant: 600 edges carrying 3 attributes, a weight, a \
             time (duplicates kept, 0 self loops dropped)"
        ),
        "{stdout}"
    );
    let loops = edges[1].pairs.iter().filter(|p| p[0] == p[1]).count();
    assert!(loops > 0, "the generated sends have self loops");
    assert!(
        stdout.contains(&format!(
            "edge type account__sends__account: {} edges carrying a time (duplicates kept, \
             {loops} self loops dropped)",
            300 - loops
        )),
        "{stdout}"
    );
    let graph = TypedGraph::open(data.path()).unwrap();
    let schema = graph.schema();
    let shapes: Vec<(u32, bool, bool)> = schema
        .edge_types
        .iter()
        .map(|e| (e.attr_dim, e.weight, e.time))
        .collect();
    assert_eq!(
        shapes,
        [(3, true, true), (0, false, true), (0, false, false)]
    );
    // Repeated pairs are in the generated data and stay in the index.
    let mut distinct = edges[0].pairs.clone();
    distinct.sort_unstable();
    distinct.dedup();
    assert!(distinct.len() < 600, "the generated pays repeat pairs");
    // Self loops go where both ends are one type (sends), not elsewhere.
    for (e, (edges, drop_loops)) in edges.iter().zip([false, true, false]).enumerate() {
        edges.assert_index(graph.csr(e), 1, drop_loops, &schema.edge_types[e].key());
    }
    // The version: 2 with data, 1 without.
    for (e, version) in [(0, 2u32), (2, 1)] {
        let key = schema.edge_types[e].key();
        let bytes = std::fs::read(data.path().join(TYPED_DIR).join(format!("{key}.csr"))).unwrap();
        assert_eq!(
            u32::from_le_bytes(bytes[8..12].try_into().unwrap()),
            version
        );
    }
}

#[test]
fn a_one_type_dataset_s_edge_data_follows_its_edge_list() {
    let source = tempfile::tempdir().unwrap();
    let mut rng = SmallRng::seed_from_u64(11);
    let edges = Edges::random(&mut rng, 400, 30, 30, (2, true, false));
    let data_obj = edges.write(source.path(), "edges");
    let meta = serde_json::json!({
        "num_nodes": 30, "num_edges": 400, "edge_data": data_obj,
    });
    std::fs::write(source.path().join("meta.json"), meta.to_string()).unwrap();
    let data = tempfile::tempdir().unwrap();
    let stdout = imported(source.path(), data.path());
    let loops = edges.pairs.iter().filter(|p| p[0] == p[1]).count();
    assert!(
        stdout.contains(&format!(
            "{} edges carrying 2 attributes, a weight (duplicates kept, {loops} self loops \
             dropped)",
            400 - loops
        )),
        "{stdout}"
    );
    let graph = TypedGraph::open_one_type(&data.path().join("graph.csr"), 0).unwrap();
    let edge_type = &graph.schema().edge_types[0];
    assert_eq!(
        (edge_type.attr_dim, edge_type.weight, edge_type.time),
        (2, true, false)
    );
    // The one-type layout's pair (a, b) lists b in a's row.
    edges.assert_index(graph.csr(0), 0, true, "node__to__node");
    // Each edge listed once is imported as it is: --undirected would
    // need data for the reverses.
    let message = refused(source.path(), &["--undirected"]);
    assert!(message.contains("leave out --undirected"), "{message}");
}

/// Breaks one input file of a dataset.
type Breakage<'a> = Box<dyn Fn() + 'a>;

/// Edits an index file's bytes.
type Edit = Box<dyn Fn(&mut Vec<u8>)>;

/// Rewrites `meta.json` of `dir` through `edit`.
fn edit_meta(dir: &Path, edit: impl FnOnce(&mut serde_json::Value)) {
    let path = dir.join("meta.json");
    let mut meta: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(&mut meta);
    std::fs::write(&path, meta.to_string()).unwrap();
}

#[test]
fn edge_data_that_disagrees_with_its_edges_is_refused_by_name() {
    let source = tempfile::tempdir().unwrap();
    let dir = source.path();
    payments(dir);
    let pays = |meta: &mut serde_json::Value| meta["edge_types"][0]["edge_data"].clone();
    let original = {
        let mut meta = serde_json::Value::Null;
        edit_meta(dir, |m| meta = m.clone());
        meta
    };
    let attrs = dir.join("edges/account__pays__merchant.attr.f32");
    let weights = dir.join("edges/account__pays__merchant.weight.f32");
    let attr_bytes = std::fs::read(&attrs).unwrap();
    let weight_bytes = std::fs::read(&weights).unwrap();
    let restore = || {
        std::fs::write(dir.join("meta.json"), original.to_string()).unwrap();
        std::fs::write(&attrs, &attr_bytes).unwrap();
        std::fs::write(&weights, &weight_bytes).unwrap();
    };
    let cases: Vec<(&str, Breakage, &str)> = vec![
        (
            "an attribute file one row short",
            Box::new(|| std::fs::write(&attrs, &attr_bytes[..attr_bytes.len() - 12]).unwrap()),
            "edge attributes",
        ),
        (
            "a NaN weight",
            Box::new(|| {
                let mut bytes = weight_bytes.clone();
                bytes[4 * 17..4 * 18].copy_from_slice(&f32::NAN.to_le_bytes());
                std::fs::write(&weights, bytes).unwrap();
            }),
            "edge 17 has weight NaN",
        ),
        (
            "an infinite attribute",
            Box::new(|| {
                let mut bytes = attr_bytes.clone();
                bytes[4 * 31..4 * 32].copy_from_slice(&f32::INFINITY.to_le_bytes());
                std::fs::write(&attrs, bytes).unwrap();
            }),
            "edge 10 has attribute inf in column 1",
        ),
        (
            "a width without a file",
            Box::new(|| {
                edit_meta(dir, |m| {
                    let mut data = pays(m);
                    data.as_object_mut().unwrap().remove("attrs");
                    m["edge_types"][0]["edge_data"] = data;
                })
            }),
            "edge_data has attr_dim 3 and attrs None",
        ),
        (
            "a misspelt key",
            Box::new(|| {
                edit_meta(dir, |m| {
                    m["edge_types"][0]["edge_data"]["weights"] = 1.into()
                })
            }),
            "unknown field `weights`",
        ),
        (
            "two names for three attributes",
            Box::new(|| {
                edit_meta(dir, |m| {
                    m["edge_types"][0]["edge_data"]["attr_names"] = serde_json::json!(["a", "b"])
                })
            }),
            "lists 2 attr_names for attr_dim 3",
        ),
    ];
    for (what, break_it, expected) in cases {
        restore();
        break_it();
        let message = refused(dir, &[]);
        assert!(message.contains(expected), "{what}: {message}");
        assert!(
            message.contains("account__pays__merchant"),
            "{what} names the edge type or its file: {message}"
        );
    }
    restore();
    imported(dir, tempfile::tempdir().unwrap().path());
}

#[test]
fn an_index_whose_edge_data_is_out_of_order_or_not_finite_is_refused() {
    let source = tempfile::tempdir().unwrap();
    let edges = payments(source.path());
    let data = tempfile::tempdir().unwrap();
    imported(source.path(), data.path());
    let path = data
        .path()
        .join(TYPED_DIR)
        .join("account__pays__merchant.csr");
    let original = std::fs::read(&path).unwrap();
    let header = CsrHeader::decode(&original, original.len() as u64, "x").unwrap();
    let ranges = header.edge_data_ranges();
    // A destination with two edges at different times: its first two.
    let index = CsrIndex::open(&path).unwrap();
    let node = (0..index.n_nodes())
        .find(|&v| {
            let times = index.edge_row(v).times;
            times.len() >= 2 && times[0] < times[1]
        })
        .expect("a row with two times");
    assert_eq!(
        index.neighbors(node).len(),
        edges[0].expected_row(node, 1, false).len()
    );
    let start: usize = (0..node).map(|v| index.degree(v) as usize).sum();
    drop(index);
    let broken = data.path().join("broken.csr");
    let open_edited = |edit: &dyn Fn(&mut Vec<u8>)| {
        let mut bytes = original.clone();
        edit(&mut bytes);
        tests::stack::reseal_csr(&mut bytes);
        std::fs::write(&broken, &bytes).unwrap();
        CsrIndex::open(&broken)
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default()
    };
    let t = ranges.times.start + 8 * start;
    let w = ranges.weights.start + 4 * (start + 1);
    let a = ranges.attrs.start + 4 * 3 * start + 8;
    let d = ranges.descriptor.start;
    let cases: Vec<(&str, Edit, String)> = vec![
        (
            "two times swapped",
            Box::new(move |b: &mut Vec<u8>| {
                let (x, y) = (b[t..t + 8].to_vec(), b[t + 8..t + 16].to_vec());
                b[t..t + 8].copy_from_slice(&y);
                b[t + 8..t + 16].copy_from_slice(&x);
            }),
            "not in the index's order (by time, then id)".into(),
        ),
        (
            "a NaN weight",
            Box::new(move |b: &mut Vec<u8>| b[w..w + 4].copy_from_slice(&f32::NAN.to_le_bytes())),
            format!("edge {} has a non-finite weight", start + 1),
        ),
        (
            "an infinite attribute",
            Box::new(move |b: &mut Vec<u8>| {
                b[a..a + 4].copy_from_slice(&f32::NEG_INFINITY.to_le_bytes())
            }),
            format!("edge {start} has a non-finite attribute"),
        ),
        (
            "a wider descriptor",
            Box::new(move |b: &mut Vec<u8>| b[d + 8..d + 12].copy_from_slice(&4u32.to_le_bytes())),
            "header offsets disagree with the counts".into(),
        ),
        (
            "a reserved descriptor byte",
            Box::new(move |b: &mut Vec<u8>| b[d + 20] = 1),
            "zero reserved bytes".into(),
        ),
        (
            "version 1 with the section",
            Box::new(|b: &mut Vec<u8>| b[8..12].copy_from_slice(&1u32.to_le_bytes())),
            "header offsets disagree with the counts".into(),
        ),
        (
            "version 3",
            Box::new(|b: &mut Vec<u8>| b[8..12].copy_from_slice(&3u32.to_le_bytes())),
            "has version 3, this sidecar reads versions 1 and 2".into(),
        ),
    ];
    for (what, edit, expected) in cases {
        let message = open_edited(&*edit);
        assert!(message.contains(&expected), "{what}: {message}");
    }
    std::fs::write(&broken, &original).unwrap();
    assert!(CsrIndex::open(&broken).is_ok(), "the file as written opens");
}

/// Edge type `e`'s row of `node` as `snapshot` serves it: ids, attributes,
/// weights, times, in the row's order; each id also checked against
/// `neighbor(i)`, the sampler's access by position.
fn served_row(
    snapshot: &GraphSnapshot,
    e: usize,
    node: u32,
) -> (Vec<u32>, Vec<f32>, Vec<f32>, Vec<i64>) {
    let mut row = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    snapshot.for_each_edge(e, node, |v, at| {
        let datum = snapshot.edge_data_at(e, node, at);
        row.0.push(v);
        row.1.extend_from_slice(datum.attrs);
        row.2.extend(datum.weight);
        row.3.extend(datum.time);
    });
    let degree = GraphSource::degree(snapshot, e, u64::from(node)).unwrap_or(0);
    let by_position: Vec<u32> = (0..degree)
        .map(|i| GraphSource::neighbor(snapshot, e, u64::from(node), i) as u32)
        .collect();
    assert_eq!(
        by_position, row.0,
        "edge type {e}, node {node}: neighbor(i)"
    );
    row
}

/// What `edges` says the row of `node` holds (rows keyed by the pair's
/// second id), in the documented order.
fn reference_row(
    edges: &Edges,
    node: u32,
    drop_loops: bool,
) -> (Vec<u32>, Vec<f32>, Vec<f32>, Vec<i64>) {
    let order = edges.expected_row(node, 1, drop_loops);
    let dim = edges.attr_dim;
    (
        order.iter().map(|&k| edges.pairs[k][0]).collect(),
        order
            .iter()
            .flat_map(|&k| edges.attrs[k * dim..(k + 1) * dim].iter().copied())
            .collect(),
        order
            .iter()
            .filter_map(|&k| edges.weights.get(k).copied())
            .collect(),
        order
            .iter()
            .filter_map(|&k| edges.times.get(k).copied())
            .collect(),
    )
}

#[test]
fn updates_add_edges_with_their_data_in_the_row_s_order_and_a_compaction_keeps_them() {
    let source = tempfile::tempdir().unwrap();
    let mut edges = payments(source.path());
    let data = tempfile::tempdir().unwrap();
    imported(source.path(), data.path());
    let graph = LiveGraph::new(TypedGraph::open(data.path()).unwrap());
    let generation = graph.snapshot().generation();
    // Refused by name, and nothing applied: edges of a type with data
    // without it, a short list, a NaN, values for a type without data.
    let pays = |values: EdgeValues| GraphUpdate {
        nodes: vec![(0, 42)],
        edges: vec![(0, vec![(1, 2)])],
        values: vec![values],
    };
    let good = EdgeValues {
        attrs: vec![0.5, 0.25, -1.0],
        weights: vec![2.0],
        times: vec![1_356_998_410],
    };
    for (update, expected) in [
        (
            GraphUpdate {
                values: Vec::new(),
                ..pays(good.clone())
            },
            "edge type account__pays__merchant: its edges carry 3 attributes, a weight, a time: \
             1 edges need 3 attributes (3 per edge), 0 were given",
        ),
        (
            pays(EdgeValues {
                times: vec![],
                ..good.clone()
            }),
            "1 edges need 1 times, 0 were given",
        ),
        (
            pays(EdgeValues {
                weights: vec![f32::NAN],
                ..good.clone()
            }),
            "edge 0 has weight NaN",
        ),
        (
            GraphUpdate {
                nodes: vec![],
                edges: vec![(0, vec![(1, 2)]), (2, vec![(1, 3)])],
                values: vec![good.clone(), good.clone()],
            },
            "edge type merchant__rev_pays__account: its edges carry no edge data, and 3 \
             attributes were given",
        ),
    ] {
        let message = graph.update(update).unwrap_err().to_string();
        assert!(message.contains(expected), "{message}");
    }
    assert_eq!(graph.snapshot().generation(), generation);
    assert_eq!(graph.snapshot().id_bound(0), 40);
    // Taken: new accounts; pays edges that repeat a pair and tie with the
    // index's times (the generated times are 1356998400..1356998420);
    // sends edges with a self loop (dropped); a rev_pays edge (no data).
    let t = 1_356_998_405i64;
    let new_pays = [
        ([3u32, 1u32], t, [1.0f32, 2.0, 3.0], 0.5f32),
        ([40, 1], t - 5, [4.0, 5.0, 6.0], 1.5),
        ([3, 1], t, [7.0, 8.0, 9.0], 2.5),
    ];
    let update = GraphUpdate {
        nodes: vec![(0, 40), (0, 41)],
        edges: vec![
            (
                0,
                new_pays
                    .iter()
                    .map(|(p, ..)| (u64::from(p[0]), u64::from(p[1])))
                    .collect(),
            ),
            (1, vec![(41, 5), (5, 5), (7, 41)]),
            (2, vec![(3, 41)]),
        ],
        values: vec![
            EdgeValues {
                attrs: new_pays.iter().flat_map(|(_, _, a, _)| *a).collect(),
                weights: new_pays.iter().map(|(.., w)| *w).collect(),
                times: new_pays.iter().map(|(_, t, ..)| *t).collect(),
            },
            EdgeValues {
                times: vec![t, t, t + 1],
                ..EdgeValues::default()
            },
            EdgeValues::default(),
        ],
    };
    let stats = graph.update(update).unwrap();
    assert_eq!((stats.edges_added, stats.edges_ignored), (6, 1));
    // The reference: the new edges after the imported ones, in the
    // update's order.
    for (pair, time, attrs, weight) in new_pays {
        edges[0].pairs.push(pair);
        edges[0].times.push(time);
        edges[0].attrs.extend(attrs);
        edges[0].weights.push(weight);
    }
    for (pair, time) in [([41, 5], t), ([5, 5], t), ([7, 41], t + 1)] {
        edges[1].pairs.push(pair);
        edges[1].times.push(time);
    }
    edges[2].pairs.push([3, 41]);
    let check = |snapshot: &GraphSnapshot, what: &str| {
        for (e, drop_loops) in [(0, false), (1, true), (2, false)] {
            let dst_count = if e == 0 { 12 } else { 42 };
            for node in 0..dst_count {
                assert_eq!(
                    served_row(snapshot, e, node),
                    reference_row(&edges[e], node, drop_loops),
                    "{what}: edge type {e}, row {node}"
                );
            }
        }
    };
    let before = graph.snapshot();
    check(&before, "served before a compaction");
    // Merchant 1's row holds the repeated pair (3, 1) three times or more.
    assert!(before.sources(0, 1).iter().filter(|&&v| v == 3).count() >= 2);
    let checksum = before.checksum();
    let compacted = graph.compact().unwrap();
    assert_eq!(compacted.n_edges, before.n_edges());
    let after = graph.snapshot();
    check(&after, "served after a compaction");
    assert_eq!(after.checksum(), checksum, "a compaction keeps the digest");
    let reopened = TypedGraph::open(data.path()).unwrap();
    assert_eq!(reopened.schema().node_types[0].num_nodes, 42);
    edges[0].assert_index(reopened.csr(0), 1, false, "pays after a compaction");
    edges[1].assert_index(reopened.csr(1), 1, true, "sends after a compaction");
    edges[2].assert_index(reopened.csr(2), 1, false, "rev_pays after a compaction");
    // A new node of a request (NEW_NODE) carries no edge data: its edges
    // of a type with data are refused by name where the request asks for
    // that data, taken where it does not; its others taken.
    let snapshot = graph.snapshot();
    let times = EdgeColumns {
        time: true,
        ..Default::default()
    };
    let message = snapshot
        .with_new_node(1, 12, &[vec![(0, 12)], vec![], vec![]], times)
        .unwrap_err()
        .to_string();
    assert!(
        message.contains(
            "the new node's edges of edge type account__pays__merchant: the request asks for \
             their data (3 attributes, a weight, a time), and a new node's edges in a request \
             carry none"
        ),
        "{message}"
    );
    let unasked = snapshot
        .with_new_node(
            1,
            12,
            &[vec![(0, 12)], vec![], vec![]],
            EdgeColumns::default(),
        )
        .unwrap();
    assert!(unasked.sources(0, 12).contains(&0));
    let with_node = snapshot
        .with_new_node(1, 12, &[vec![], vec![], vec![(12, 0)]], times)
        .unwrap();
    assert_eq!(with_node.sources(2, 0).last(), Some(&12));
    // A digest covers the data: one edge's weight apart, two digests.
    let digest = |weight: f32| {
        let replica = LiveGraph::new(TypedGraph::open(data.path()).unwrap());
        replica
            .update(pays(EdgeValues {
                weights: vec![weight],
                ..good.clone()
            }))
            .unwrap();
        replica.snapshot().checksum()
    };
    assert_eq!(digest(2.0), digest(2.0));
    assert_ne!(digest(2.0), digest(2.5));
    // The temporary files went.
    let left: Vec<String> = std::fs::read_dir(data.path().join(TYPED_DIR))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.ends_with(".tmp"))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}
