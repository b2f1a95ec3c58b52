//! One entry of the update stream for a typed graph (docs/updates.md,
//! "Typed graphs"): the operation names its node type (`type`) and its
//! edges per edge type (`edges:<edge type>`), parsed whole, then resolved
//! against the replica's types (names, widths), before anything is
//! applied; and the text syntax `sidecar publish` reads for it.

use crate::graph::live::EdgeValues;
use crate::graph::typed::TypedSchema;
use crate::graph::typed::{ONE_EDGE_TYPE, ONE_TYPE};
use crate::graph::GraphUpdate;
use crate::updates::entry::{parse_id, parse_ids as ids, Op, MAX_IDS_PER_ENTRY};

/// The prefix of an edge field: `edges:<edge type>`.
pub const EDGES_FIELD: &str = "edges:";
/// The prefix of an edge-data field: `data:<edge type>`, the data of the
/// edges of `edges:<edge type>` as text (docs/updates.md, "Typed graphs").
pub const DATA_FIELD: &str = "data:";

/// Edges of one edge type, by its index in the graph's types.
type IndexedEdges = (usize, Vec<(u64, u64)>);

/// Edges of one edge type, by the name the entry gives it (`src__relation__dst`,
/// or a relation only one edge type has), and their data as text, if
/// given (checked against the edge type by [`GraphOp::resolve`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NamedEdges {
    pub name: String,
    pub pairs: Vec<(u64, u64)>,
    pub data: Option<String>,
}

impl NamedEdges {
    /// Edges without data.
    pub fn new(name: impl Into<String>, pairs: Vec<(u64, u64)>) -> Self {
        Self {
            name: name.into(),
            pairs,
            data: None,
        }
    }
}

/// One operation on a typed graph.
#[derive(Debug, Clone, PartialEq)]
pub enum GraphOp {
    AddNode {
        node_type: String,
        id: u64,
        row: Option<Vec<u8>>,
        /// Edges added with the node, in the same snapshot.
        edges: Vec<NamedEdges>,
    },
    AddEdges {
        edges: Vec<NamedEdges>,
    },
    SetFeatures {
        node_type: String,
        id: u64,
        row: Option<Vec<u8>>,
    },
    Invalidate {
        node_type: String,
        ids: Vec<u64>,
    },
}

/// A typed operation resolved against a graph's types: indices, rows
/// checked against their type's width.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct GraphChange {
    /// `(node type, id, row)` to store.
    pub rows: Vec<(usize, u64, Vec<u8>)>,
    /// `(node type, id)` to evict from the caches.
    pub evicted: Vec<(usize, u64)>,
    /// The graph change, if the operation makes one.
    pub update: Option<GraphUpdate>,
}

impl From<Op> for GraphOp {
    /// The operation on the 1x1 typed graph a one-type graph is: node type
    /// `node`, edge type `node__to__node` (`(src, dst)` there is a message
    /// from `src` to `dst`, so a one-type edge `(a, b)`, which makes `b` a
    /// neighbour of `a`, is `(b, a)`, and its reverse `(a, b)` unless
    /// `directed`). Checked against the graph's types by
    /// [`GraphOp::resolve`], as a typed graph's operations are.
    fn from(op: Op) -> Self {
        let one_type = |edges: &[(u64, u64)], directed: bool| -> Vec<NamedEdges> {
            let update = GraphUpdate::one_type(&[], edges, !directed);
            update
                .edges
                .into_iter()
                .map(|(_, pairs)| NamedEdges::new(ONE_EDGE_TYPE, pairs))
                .collect()
        };
        match op {
            Op::AddNode {
                id,
                row,
                neighbors,
                directed,
            } => {
                let edges: Vec<(u64, u64)> = neighbors.iter().map(|&n| (id, n)).collect();
                GraphOp::AddNode {
                    node_type: ONE_TYPE.into(),
                    id,
                    row,
                    edges: one_type(&edges, directed),
                }
            }
            Op::AddEdges { edges, directed } => GraphOp::AddEdges {
                edges: one_type(&edges, directed),
            },
            Op::SetFeatures { id, row } => GraphOp::SetFeatures {
                node_type: ONE_TYPE.into(),
                id,
                row,
            },
            Op::Invalidate { ids } => GraphOp::Invalidate {
                node_type: ONE_TYPE.into(),
                ids,
            },
        }
    }
}

/// Whether an entry's fields are a typed operation's: it names a node type
/// or edges of an edge type.
pub fn is_typed(fields: &[(Vec<u8>, Vec<u8>)]) -> bool {
    fields.iter().any(|(k, _)| {
        k.as_slice() == b"type"
            || k.starts_with(EDGES_FIELD.as_bytes())
            || k.starts_with(DATA_FIELD.as_bytes())
    })
}

impl GraphOp {
    /// The `op` field's value.
    pub fn name(&self) -> &'static str {
        match self {
            GraphOp::AddNode { .. } => "add_node",
            GraphOp::AddEdges { .. } => "add_edges",
            GraphOp::SetFeatures { .. } => "set_features",
            GraphOp::Invalidate { .. } => "invalidate",
        }
    }

    /// The node type whose row the operation stores, the id and the row.
    pub fn row(&self) -> Option<(&str, u64, &[u8])> {
        match self {
            GraphOp::AddNode {
                node_type, id, row, ..
            }
            | GraphOp::SetFeatures { node_type, id, row } => {
                row.as_deref().map(|r| (node_type.as_str(), *id, r))
            }
            _ => None,
        }
    }

    /// The entry's fields, as `XADD` takes them.
    pub fn to_fields(&self) -> Vec<(String, Vec<u8>)> {
        let list = |ids: &mut dyn Iterator<Item = u64>| -> Vec<u8> {
            ids.map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(" ")
                .into_bytes()
        };
        let mut fields = vec![("op".to_string(), self.name().as_bytes().to_vec())];
        let edges = |fields: &mut Vec<(String, Vec<u8>)>, edges: &[NamedEdges]| {
            for edges in edges {
                fields.push((
                    format!("{EDGES_FIELD}{}", edges.name),
                    list(&mut edges.pairs.iter().flat_map(|&(s, d)| [s, d])),
                ));
                if let Some(data) = &edges.data {
                    fields.push((
                        format!("{DATA_FIELD}{}", edges.name),
                        data.as_bytes().to_vec(),
                    ));
                }
            }
        };
        match self {
            GraphOp::AddNode {
                node_type,
                id,
                row,
                edges: named,
            } => {
                fields.push(("type".into(), node_type.as_bytes().to_vec()));
                fields.push(("id".into(), id.to_string().into_bytes()));
                if let Some(row) = row {
                    fields.push(("row".into(), row.clone()));
                }
                edges(&mut fields, named);
            }
            GraphOp::AddEdges { edges: named } => edges(&mut fields, named),
            GraphOp::SetFeatures { node_type, id, row } => {
                fields.push(("type".into(), node_type.as_bytes().to_vec()));
                fields.push(("id".into(), id.to_string().into_bytes()));
                if let Some(row) = row {
                    fields.push(("row".into(), row.clone()));
                }
            }
            GraphOp::Invalidate { node_type, ids } => {
                fields.push(("type".into(), node_type.as_bytes().to_vec()));
                fields.push(("ids".into(), list(&mut ids.iter().copied())));
            }
        }
        fields
    }

    /// Parses a typed entry's fields (the syntax; [`GraphOp::resolve`]
    /// checks them against the graph's types). The error names the rule
    /// broken.
    pub fn from_fields(fields: &[(Vec<u8>, Vec<u8>)]) -> Result<GraphOp, String> {
        let text = |name: &str, value: &[u8]| -> Result<String, String> {
            String::from_utf8(value.to_vec()).map_err(|_| format!("field `{name}` is not text"))
        };
        let mut scalars: Vec<(&str, &[u8])> = Vec::new();
        let mut edges: Vec<NamedEdges> = Vec::new();
        let mut data: Vec<(String, String)> = Vec::new();
        let mut n_ids = 0usize;
        for (key, value) in fields {
            let key = text("name", key)?;
            if let Some(name) = key.strip_prefix(DATA_FIELD) {
                if data.iter().any(|(n, _)| n == name) {
                    return Err(format!("field `{key}` is repeated"));
                }
                data.push((name.to_string(), text(&key, value)?));
                continue;
            }
            if let Some(name) = key.strip_prefix(EDGES_FIELD) {
                if edges.iter().any(|e| e.name == name) {
                    return Err(format!("field `{key}` is repeated"));
                }
                let flat = ids(&text(&key, value)?, &key)?;
                if !flat.len().is_multiple_of(2) {
                    return Err(format!(
                        "`{key}` has {} ids, not a whole number of `src dst` pairs",
                        flat.len()
                    ));
                }
                n_ids += flat.len();
                edges.push(NamedEdges::new(
                    name,
                    flat.chunks(2).map(|p| (p[0], p[1])).collect(),
                ));
                continue;
            }
            let known = ["op", "type", "id", "ids", "row"];
            let Some(&name) = known.iter().find(|k| **k == key) else {
                return Err(format!(
                    "unknown field `{key}` for a typed entry (op, type, id, ids, row, \
                     {EDGES_FIELD}<edge type>, {DATA_FIELD}<edge type>)"
                ));
            };
            if scalars.iter().any(|(n, _)| *n == name) {
                return Err(format!("field `{key}` is repeated"));
            }
            scalars.push((name, value.as_slice()));
        }
        attach_data(&mut edges, data, DATA_FIELD)?;
        let get = |name: &str| scalars.iter().find(|(n, _)| *n == name).map(|(_, v)| *v);
        let op = text("op", get("op").ok_or("no `op` field")?)?;
        let node_type = || -> Result<String, String> {
            text(
                "type",
                get("type").ok_or(format!("op {op} on a typed graph needs `type`"))?,
            )
        };
        let id =
            || -> Result<u64, String> { parse_id(&text("id", get("id").ok_or("no `id` field")?)?) };
        let row = || get("row").map(<[u8]>::to_vec);
        let allowed = |names: &[&str], edges_allowed: bool| -> Result<(), String> {
            if let Some((name, _)) = scalars.iter().find(|(n, _)| !names.contains(n)) {
                return Err(format!("op {op} takes no `{name}` field"));
            }
            if !edges_allowed && !edges.is_empty() {
                return Err(format!("op {op} takes no `{EDGES_FIELD}` field"));
            }
            Ok(())
        };
        let parsed = match op.as_str() {
            "add_node" => {
                allowed(&["op", "type", "id", "row"], true)?;
                GraphOp::AddNode {
                    node_type: node_type()?,
                    id: id()?,
                    row: row(),
                    edges,
                }
            }
            "add_edges" => {
                allowed(&["op"], true)?;
                if edges.is_empty() {
                    return Err(format!(
                        "op add_edges on a typed graph needs `{EDGES_FIELD}<edge type>` fields"
                    ));
                }
                GraphOp::AddEdges { edges }
            }
            "set_features" => {
                allowed(&["op", "type", "id", "row"], false)?;
                GraphOp::SetFeatures {
                    node_type: node_type()?,
                    id: id()?,
                    row: row(),
                }
            }
            "invalidate" => {
                allowed(&["op", "type", "ids"], false)?;
                let list = ids(&text("ids", get("ids").ok_or("no `ids` field")?)?, "ids")?;
                n_ids += list.len();
                GraphOp::Invalidate {
                    node_type: node_type()?,
                    ids: list,
                }
            }
            other => {
                return Err(format!(
                    "unknown op {other:?} (add_node, add_edges, set_features, invalidate)"
                ))
            }
        };
        if n_ids > MAX_IDS_PER_ENTRY {
            return Err(format!(
                "the entry names {n_ids} ids, more than {MAX_IDS_PER_ENTRY}"
            ));
        }
        Ok(parsed)
    }

    /// Checks the operation against `schema`: its node type and edge types
    /// exist, a row has its type's width (and a type without features
    /// takes none). The error names the type and the fix.
    pub fn resolve(&self, schema: &TypedSchema) -> Result<GraphChange, String> {
        let node_type = |name: &str| -> Result<usize, String> {
            schema.node_type(name).ok_or_else(|| {
                let names: Vec<&str> = schema.node_types.iter().map(|t| t.name.as_str()).collect();
                format!(
                    "unknown node type {name:?}: this graph's node types are {}",
                    names.join(", ")
                )
            })
        };
        let row_of =
            |t: usize, id: u64, row: &Option<Vec<u8>>| -> Result<Option<Vec<u8>>, String> {
                let Some(row) = row else { return Ok(None) };
                let ty = &schema.node_types[t];
                if ty.feature_dim == 0 {
                    return Err(format!(
                        "{} {id}: node type {} has no features; give no `row`",
                        ty.name, ty.name
                    ));
                }
                let want = 4 * ty.feature_dim as usize;
                if row.len() != want {
                    return Err(format!(
                    "{} {id}: `row` has {} bytes; rows of node type {} have {want} ({} f32 values)",
                    ty.name,
                    row.len(),
                    ty.name,
                    ty.feature_dim
                ));
                }
                Ok(Some(row.clone()))
            };
        // The edge lists by index, and their data (empty when no list
        // has any: the update's `values` rule).
        let edges_of =
            |named: &[NamedEdges]| -> Result<(Vec<IndexedEdges>, Vec<EdgeValues>), String> {
                let mut lists = Vec::with_capacity(named.len());
                let mut values = Vec::with_capacity(named.len());
                for edges in named {
                    let name = &edges.name;
                    let e = schema.edge_type(name).ok_or_else(|| {
                        let keys: Vec<String> = schema.edge_types.iter().map(|e| e.key()).collect();
                        format!(
                            "unknown edge type {name:?}: name one of {} (or a relation only \
                             one of them has)",
                            keys.join(", ")
                        )
                    })?;
                    let edge_type = &schema.edge_types[e];
                    let parsed = match &edges.data {
                        Some(text) => EdgeValues::parse(edge_type, edges.pairs.len(), text)?,
                        None => EdgeValues::default(),
                    };
                    parsed
                        .check(edge_type, edges.pairs.len())
                        .map_err(|e| e.to_string())?;
                    lists.push((e, edges.pairs.clone()));
                    values.push(parsed);
                }
                if values.iter().all(|v| *v == EdgeValues::default()) {
                    values.clear();
                }
                Ok((lists, values))
            };
        let mut change = GraphChange::default();
        match self {
            GraphOp::AddNode {
                node_type: name,
                id,
                row,
                edges,
            } => {
                let t = node_type(name)?;
                if let Some(row) = row_of(t, *id, row)? {
                    change.rows.push((t, *id, row));
                }
                if schema.node_types[t].feature_dim > 0 {
                    change.evicted.push((t, *id));
                }
                let (edges, values) = edges_of(edges)?;
                change.update = Some(GraphUpdate {
                    nodes: vec![(t, *id)],
                    edges,
                    values,
                });
            }
            GraphOp::AddEdges { edges } => {
                let (edges, values) = edges_of(edges)?;
                change.update = Some(GraphUpdate {
                    nodes: Vec::new(),
                    edges,
                    values,
                });
            }
            GraphOp::SetFeatures {
                node_type: name,
                id,
                row,
            } => {
                let t = node_type(name)?;
                if schema.node_types[t].feature_dim == 0 {
                    return Err(format!(
                        "node type {name} has no features: set_features names a type with \
                         features"
                    ));
                }
                if let Some(row) = row_of(t, *id, row)? {
                    change.rows.push((t, *id, row));
                }
                change.evicted.push((t, *id));
            }
            GraphOp::Invalidate {
                node_type: name,
                ids,
            } => {
                let t = node_type(name)?;
                if schema.node_types[t].feature_dim == 0 {
                    return Err(format!(
                        "node type {name} has no features: there is no row to invalidate"
                    ));
                }
                change.evicted.extend(ids.iter().map(|&id| (t, id)));
            }
        }
        Ok(change)
    }

    /// Parses one typed operation in the text syntax of `sidecar publish`:
    ///
    /// - `add-node TYPE ID [row=V,V,...] [edges:EDGE_TYPE=SRC,DST,...
    ///   [data:EDGE_TYPE=V,V,...]]...`
    /// - `add-edges edges:EDGE_TYPE=SRC,DST,... [data:EDGE_TYPE=V,V,...]
    ///   [edges:EDGE_TYPE=...]...`
    /// - `set-features TYPE ID row=V,V,...`
    /// - `invalidate TYPE ID [ID...]`
    ///
    /// `row=` may also be `row-file=PATH` (raw little-endian f32).
    pub fn from_words(words: &[&str]) -> Result<GraphOp, String> {
        let (&verb, rest) = words.split_first().ok_or("an empty operation")?;
        let mut plain = Vec::new();
        let mut row = None;
        let mut edges: Vec<NamedEdges> = Vec::new();
        let mut data: Vec<(String, String)> = Vec::new();
        for word in rest {
            if let Some(spec) = word.strip_prefix(DATA_FIELD) {
                let (name, list) = spec.split_once('=').ok_or_else(|| {
                    format!("{word:?}: write edge data as {DATA_FIELD}EDGE_TYPE=V,V,...")
                })?;
                if data.iter().any(|(n, _)| n == name) {
                    return Err(format!("{DATA_FIELD}{name} is given twice"));
                }
                data.push((name.to_string(), list.to_string()));
            } else if let Some(values) = word.strip_prefix("row=") {
                row = Some(crate::updates::entry::parse_row(values)?);
            } else if let Some(path) = word.strip_prefix("row-file=") {
                row = Some(std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?);
            } else if let Some(spec) = word.strip_prefix(EDGES_FIELD) {
                let (name, list) = spec.split_once('=').ok_or_else(|| {
                    format!("{word:?}: write edges as {EDGES_FIELD}EDGE_TYPE=SRC,DST,...")
                })?;
                let flat: Vec<u64> = list
                    .split(',')
                    .filter(|t| !t.is_empty())
                    .map(parse_id)
                    .collect::<Result<_, _>>()?;
                if flat.is_empty() || !flat.len().is_multiple_of(2) {
                    return Err(format!("{EDGES_FIELD}{name} needs SRC,DST pairs"));
                }
                edges.push(NamedEdges::new(
                    name,
                    flat.chunks(2).map(|p| (p[0], p[1])).collect(),
                ));
            } else {
                plain.push(*word);
            }
        }
        attach_data(&mut edges, data, DATA_FIELD)?;
        let typed_id = |plain: &[&str]| -> Result<(String, u64), String> {
            match plain {
                [node_type, id] => Ok((node_type.to_string(), parse_id(id)?)),
                _ => Err(format!("{verb} on a typed graph needs TYPE ID")),
            }
        };
        Ok(match verb {
            "add-node" => {
                let (node_type, id) = typed_id(&plain)?;
                GraphOp::AddNode {
                    node_type,
                    id,
                    row,
                    edges,
                }
            }
            "add-edges" => {
                if !plain.is_empty() || row.is_some() || edges.is_empty() {
                    return Err(format!(
                        "add-edges on a typed graph takes {EDGES_FIELD}EDGE_TYPE=SRC,DST,... only"
                    ));
                }
                GraphOp::AddEdges { edges }
            }
            "set-features" => {
                let (node_type, id) = typed_id(&plain)?;
                if row.is_none() || !edges.is_empty() {
                    return Err("set-features needs TYPE ID and its row (row=...)".into());
                }
                GraphOp::SetFeatures { node_type, id, row }
            }
            "invalidate" => {
                let Some((node_type, ids)) = plain.split_first() else {
                    return Err("invalidate on a typed graph needs TYPE ID...".into());
                };
                if ids.is_empty() || row.is_some() || !edges.is_empty() {
                    return Err("invalidate on a typed graph takes TYPE ID... only".into());
                }
                GraphOp::Invalidate {
                    node_type: node_type.to_string(),
                    ids: ids
                        .iter()
                        .map(|id| parse_id(id))
                        .collect::<Result<_, _>>()?,
                }
            }
            other => {
                return Err(format!(
                    "unknown operation {other:?} (add-node, add-edges, set-features, invalidate)"
                ))
            }
        })
    }
}

/// Gives each `(edge type, data)` to the edge list of that name; data for
/// a list the entry does not have is refused by name.
fn attach_data(
    edges: &mut [NamedEdges],
    data: Vec<(String, String)>,
    prefix: &str,
) -> Result<(), String> {
    for (name, text) in data {
        let Some(list) = edges.iter_mut().find(|e| e.name == name) else {
            return Err(format!(
                "{prefix}{name} without {EDGES_FIELD}{name}: edge data goes with its edges"
            ));
        };
        list.data = Some(text);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::graph::typed::{EdgeType, NodeType};

    fn schema() -> TypedSchema {
        TypedSchema {
            node_types: vec![
                NodeType {
                    name: "user".into(),
                    num_nodes: 3,
                    feature_dim: 2,
                    dtype: Some("f32".into()),
                },
                NodeType {
                    name: "item".into(),
                    num_nodes: 2,
                    feature_dim: 0,
                    dtype: None,
                },
            ],
            edge_types: vec![
                EdgeType::new("user", "buys", "item"),
                EdgeType::new("item", "rev_buys", "user"),
            ],
            graph_version: 1,
        }
    }

    fn wire(op: &GraphOp) -> Vec<(Vec<u8>, Vec<u8>)> {
        op.to_fields()
            .into_iter()
            .map(|(k, v)| (k.into_bytes(), v))
            .collect()
    }

    #[test]
    fn every_typed_op_round_trips_and_resolves() {
        let row = vec![0u8, 0, 128, 63, 0, 0, 0, 64];
        let add = GraphOp::AddNode {
            node_type: "user".into(),
            id: 3,
            row: Some(row.clone()),
            edges: vec![
                NamedEdges::new("buys", vec![(3, 0)]),
                NamedEdges::new("item__rev_buys__user", vec![(0, 3)]),
            ],
        };
        for op in [
            add.clone(),
            GraphOp::AddEdges {
                edges: vec![NamedEdges::new("user__buys__item", vec![(1, 1), (2, 0)])],
            },
            GraphOp::SetFeatures {
                node_type: "user".into(),
                id: 1,
                row: Some(row.clone()),
            },
            GraphOp::Invalidate {
                node_type: "user".into(),
                ids: vec![0, 2],
            },
        ] {
            let fields = wire(&op);
            assert!(is_typed(&fields));
            assert_eq!(GraphOp::from_fields(&fields), Ok(op.clone()));
            op.resolve(&schema()).unwrap();
        }
        let change = add.resolve(&schema()).unwrap();
        assert_eq!(change.rows, vec![(0, 3, row)]);
        assert_eq!(change.evicted, vec![(0, 3)]);
        assert_eq!(
            change.update,
            Some(GraphUpdate {
                nodes: vec![(0, 3)],
                edges: vec![(0, vec![(3, 0)]), (1, vec![(0, 3)])],
                values: Vec::new(),
            })
        );
    }

    #[test]
    fn edge_data_rides_with_its_edges_and_is_checked_against_the_edge_type() {
        let mut schema = schema();
        // user__buys__item carries 2 attributes and a time.
        (schema.edge_types[0].attr_dim, schema.edge_types[0].time) = (2, true);
        let with_data = |data: &str| GraphOp::AddEdges {
            edges: vec![NamedEdges {
                data: Some(data.into()),
                ..NamedEdges::new("buys", vec![(1, 1), (2, 0)])
            }],
        };
        let op = with_data("0.5 -1 1700000000 2.25 0 1700000060");
        let fields = wire(&op);
        assert!(fields
            .iter()
            .any(|(k, v)| k == b"data:buys" && v == b"0.5 -1 1700000000 2.25 0 1700000060"));
        assert_eq!(GraphOp::from_fields(&fields), Ok(op.clone()));
        let update = op.resolve(&schema).unwrap().update.unwrap();
        assert_eq!(update.edges, vec![(0, vec![(1, 1), (2, 0)])]);
        assert_eq!(
            update.values,
            vec![EdgeValues {
                attrs: vec![0.5, -1.0, 2.25, 0.0],
                weights: vec![],
                times: vec![1_700_000_000, 1_700_000_060],
            }]
        );
        // The text syntax of `sidecar publish` gives the same operation.
        let words = [
            "add-edges",
            "edges:buys=1,1,2,0",
            "data:buys=0.5,-1,1700000000,2.25,0,1700000060",
        ];
        let published = GraphOp::from_words(&words).unwrap();
        assert_eq!(
            published.resolve(&schema).unwrap().update,
            op.resolve(&schema).unwrap().update
        );
        for (data, expected) in [
            (
                "0.5 -1 1700000000.5 2.25 0 1700000060",
                "edge 0's time \"1700000000.5\" is not an integer",
            ),
            ("0.5 -1 1700000000 2.25 0", "2 edges need 6, 5 were given"),
            (
                "0.5 x 1700000000 2.25 0 1700000060",
                "edge 0's attribute \"x\" is not a number",
            ),
            (
                "0.5 NaN 1700000000 2.25 0 1700000060",
                "edge 0 has attribute NaN in column 1",
            ),
        ] {
            let err = with_data(data).resolve(&schema).unwrap_err();
            assert!(err.contains("edge type user__buys__item"), "{data}: {err}");
            assert!(err.contains(expected), "{data}: {err}");
        }
        // Edges of a type with data need it; a type without takes none.
        let err = GraphOp::AddEdges {
            edges: vec![NamedEdges::new("buys", vec![(1, 1)])],
        }
        .resolve(&schema)
        .unwrap_err();
        assert!(
            err.contains("1 edges need 2 attributes (2 per edge), 0 were given"),
            "{err}"
        );
        let err = GraphOp::AddEdges {
            edges: vec![NamedEdges {
                data: Some("1".into()),
                ..NamedEdges::new("rev_buys", vec![(1, 1)])
            }],
        }
        .resolve(&schema)
        .unwrap_err();
        assert!(err.contains("its edges carry no data"), "{err}");
        // Data without its edges.
        let err =
            GraphOp::from_words(&["add-edges", "edges:buys=1,1", "data:rev_buys=1"]).unwrap_err();
        assert!(
            err.contains("data:rev_buys without edges:rev_buys"),
            "{err}"
        );
    }

    #[test]
    fn an_entry_naming_what_the_graph_lacks_is_refused_by_name() {
        let op = |node_type: &str, row: Option<Vec<u8>>, edges: Vec<NamedEdges>| GraphOp::AddNode {
            node_type: node_type.into(),
            id: 5,
            row,
            edges,
        };
        let cases = [
            (op("board", None, vec![]), "unknown node type \"board\""),
            (
                op("user", Some(vec![0; 12]), vec![]),
                "rows of node type user have 8",
            ),
            (
                op("item", Some(vec![0; 8]), vec![]),
                "node type item has no features",
            ),
            (
                op("user", None, vec![NamedEdges::new("likes", vec![(5, 0)])]),
                "unknown edge type \"likes\"",
            ),
        ];
        for (op, expected) in cases {
            let err = op.resolve(&schema()).unwrap_err();
            assert!(err.contains(expected), "{op:?}: {err}");
        }
        let fields = |pairs: &[(&str, &[u8])]| -> Vec<(Vec<u8>, Vec<u8>)> {
            pairs
                .iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec()))
                .collect()
        };
        for (f, expected) in [
            (fields(&[("op", b"add_node"), ("type", b"user")]), "no `id`"),
            (
                fields(&[("op", b"add_edges"), ("edges:buys", b"1 2 3")]),
                "pairs",
            ),
            (
                fields(&[
                    ("op", b"invalidate"),
                    ("type", b"user"),
                    ("ids", b"1"),
                    ("row", b""),
                ]),
                "takes no `row`",
            ),
            (
                fields(&[
                    ("op", b"add_node"),
                    ("type", b"user"),
                    ("id", b"1"),
                    ("neighbors", b"2"),
                ]),
                "unknown field `neighbors`",
            ),
        ] {
            let err = GraphOp::from_fields(&f).unwrap_err();
            assert!(err.contains(expected), "{err}");
        }
    }

    #[test]
    fn the_text_syntax_reads_typed_ops() {
        assert_eq!(
            GraphOp::from_words(&["add-node", "user", "7", "row=1,2", "edges:buys=7,0,7,1"]),
            Ok(GraphOp::AddNode {
                node_type: "user".into(),
                id: 7,
                row: Some(vec![0, 0, 128, 63, 0, 0, 0, 64]),
                edges: vec![NamedEdges::new("buys", vec![(7, 0), (7, 1)])],
            })
        );
        assert_eq!(
            GraphOp::from_words(&["invalidate", "user", "1", "2"]),
            Ok(GraphOp::Invalidate {
                node_type: "user".into(),
                ids: vec![1, 2]
            })
        );
        assert!(GraphOp::from_words(&["add-edges", "edges:buys=1"]).is_err());
        assert!(GraphOp::from_words(&["add-node", "user"]).is_err());
    }
}
