//! The types of a typed (heterogeneous) graph as a segment carries them
//! (docs/protocol.md, section 2.7): node types, each with its feature
//! width (0: no features, its rows are node ids), and edge types
//! `(src, relation, dst)` by the indices of their node types.
//!
//! The sidecar writes the encoded schema once, when it creates the
//! segment, between the slot control array and the first slot; a reader
//! copies it out and decodes it like every other byte of the segment: as
//! hostile input. A segment with a schema has `feature_dim` 0 in its
//! feature schema, so that a reader without typed graphs refuses it.

use std::fmt::Write as _;

/// Most node types a typed graph has.
pub const MAX_NODE_TYPES: usize = 64;
/// Most edge types a typed graph has.
pub const MAX_EDGE_TYPES: usize = 256;
/// Bytes of a type's or relation's name in the encoded schema (NUL-padded).
pub const NAME_BYTES: usize = 32;
/// Bytes before the entries: the two counts and 8 zero bytes.
const HEAD_BYTES: usize = 16;
/// Bytes of one node type entry and of one edge type entry.
const ENTRY_BYTES: usize = 48;

/// A node type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeTypeDesc {
    pub name: String,
    /// f32 values per row; 0: the type has no features (a response carries
    /// its nodes' ids).
    pub feature_dim: u32,
}

/// An edge type: its source and destination node types (indices), its
/// relation's name and what its edges carry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EdgeTypeDesc {
    pub src: u32,
    pub relation: String,
    pub dst: u32,
    pub data: EdgeDataDesc,
}

/// Most f32 attributes an edge carries.
pub const MAX_EDGE_ATTR_DIM: u32 = 4096;

/// What each edge of an edge type carries besides its ends
/// (docs/protocol.md, section 2.7): `attr_dim` f32 attributes (0: none), a
/// weight (f32) and a time (i64). Encoded in 8 bytes: `attr_dim` (u32),
/// then flags (u32: bit 0 a weight, bit 1 a time).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct EdgeDataDesc {
    pub attr_dim: u32,
    pub weight: bool,
    pub time: bool,
}

impl EdgeDataDesc {
    /// Its edges carry nothing but their ends.
    pub fn is_empty(&self) -> bool {
        *self == Self::default()
    }

    /// The 8 encoded bytes.
    pub fn encode(&self) -> [u8; 8] {
        let flags = u32::from(self.weight) | u32::from(self.time) << 1;
        let mut out = [0; 8];
        out[..4].copy_from_slice(&self.attr_dim.to_le_bytes());
        out[4..].copy_from_slice(&flags.to_le_bytes());
        out
    }

    /// Decodes `attr_dim` and the flags; the error says what is wrong.
    pub fn decode(attr_dim: u32, flags: u32) -> Result<Self, String> {
        if attr_dim > MAX_EDGE_ATTR_DIM {
            return Err(format!(
                "attr_dim {attr_dim}, more than {MAX_EDGE_ATTR_DIM}"
            ));
        }
        if flags & !0b11 != 0 {
            return Err(format!(
                "edge data flags {flags:#x}: only bits 0 (weight) and 1 (time) are defined"
            ));
        }
        Ok(Self {
            attr_dim,
            weight: flags & 1 != 0,
            time: flags & 2 != 0,
        })
    }
}

impl std::fmt::Display for EdgeDataDesc {
    /// `3 attributes, a weight, a time`, or `no edge data`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts = Vec::new();
        if self.attr_dim > 0 {
            parts.push(format!("{} attributes", self.attr_dim));
        }
        if self.weight {
            parts.push("a weight".into());
        }
        if self.time {
            parts.push("a time".into());
        }
        if parts.is_empty() {
            return f.write_str("no edge data");
        }
        f.write_str(&parts.join(", "))
    }
}

/// A typed graph's node and edge types, in the graph's order (the order
/// of a response's tables and of a request's fanouts).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GraphSchema {
    pub node_types: Vec<NodeTypeDesc>,
    pub edge_types: Vec<EdgeTypeDesc>,
}

/// Whether `name` can name a node type or a relation: ASCII letters,
/// digits and single underscores, starting with a letter, at most
/// [`NAME_BYTES`] bytes (`__` separates the parts of a model's input names
/// and of an edge type's key).
pub fn valid_name(name: &str) -> bool {
    name.len() <= NAME_BYTES
        && name.chars().next().is_some_and(|c| c.is_ascii_alphabetic())
        && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !name.contains("__")
}

impl GraphSchema {
    /// Checks counts, names, uniqueness and that every edge type's ends are
    /// node types. The error names the type.
    pub fn validate(&self) -> Result<(), String> {
        let (n_node, n_edge) = (self.node_types.len(), self.edge_types.len());
        if !(1..=MAX_NODE_TYPES).contains(&n_node) || !(1..=MAX_EDGE_TYPES).contains(&n_edge) {
            return Err(format!(
                "{n_node} node types and {n_edge} edge types; a typed graph has 1 to \
                 {MAX_NODE_TYPES} node types and 1 to {MAX_EDGE_TYPES} edge types"
            ));
        }
        for (i, t) in self.node_types.iter().enumerate() {
            if !valid_name(&t.name) {
                return Err(format!(
                    "node type {:?}: a name is 1 to {NAME_BYTES} ASCII letters, digits and \
                     single underscores, starting with a letter",
                    t.name
                ));
            }
            if self.node_types[..i].iter().any(|o| o.name == t.name) {
                return Err(format!("node type {:?} is listed twice", t.name));
            }
        }
        for (i, e) in self.edge_types.iter().enumerate() {
            if e.src as usize >= n_node || e.dst as usize >= n_node {
                return Err(format!(
                    "edge type {i} ({:?}) names node type {} -> {}; there are {n_node}",
                    e.relation, e.src, e.dst
                ));
            }
            if !valid_name(&e.relation) {
                return Err(format!(
                    "relation {:?}: a name is 1 to {NAME_BYTES} ASCII letters, digits and \
                     single underscores, starting with a letter",
                    e.relation
                ));
            }
            if self.edge_types[..i]
                .iter()
                .any(|o| (o.src, &o.relation, o.dst) == (e.src, &e.relation, e.dst))
            {
                return Err(format!("edge type {} is listed twice", self.edge_key(i)));
            }
        }
        Ok(())
    }

    /// A schema from `(name, feature_dim)` per node type and `(src,
    /// relation, dst)` per edge type (indices of node types). Not
    /// validated.
    pub fn of(node_types: &[(&str, u32)], edge_types: &[(u32, &str, u32)]) -> Self {
        GraphSchema {
            node_types: node_types
                .iter()
                .map(|&(name, feature_dim)| NodeTypeDesc {
                    name: name.into(),
                    feature_dim,
                })
                .collect(),
            edge_types: edge_types
                .iter()
                .map(|&(src, relation, dst)| EdgeTypeDesc {
                    src,
                    relation: relation.into(),
                    dst,
                    data: EdgeDataDesc::default(),
                })
                .collect(),
        }
    }

    /// The schema with edge type `edge_type` carrying `data`.
    pub fn with_edge_data(mut self, edge_type: usize, data: EdgeDataDesc) -> Self {
        self.edge_types[edge_type].data = data;
        self
    }

    /// A one-type graph as the 1x1 typed graph: node type `node` with
    /// `feature_dim` features, edge type `node__to__node`.
    pub fn one_type(feature_dim: u32) -> Self {
        Self::of(&[("node", feature_dim)], &[(0, "to", 0)])
    }

    /// Edge type `edge_type`'s key, `src__relation__dst` (a model's input
    /// `edge_index__<key>`).
    pub fn edge_key(&self, edge_type: usize) -> String {
        let e = &self.edge_types[edge_type];
        format!(
            "{}__{}__{}",
            self.type_name(e.src),
            e.relation,
            self.type_name(e.dst)
        )
    }

    /// Node type `t`'s name in an edge type's key (`?` past the types,
    /// which a checked schema never has).
    fn type_name(&self, t: u32) -> &str {
        self.node_types
            .get(t as usize)
            .map_or("?", |t| t.name.as_str())
    }

    /// The index of the node type named `name`.
    pub fn node_type(&self, name: &str) -> Option<usize> {
        self.node_types.iter().position(|t| t.name == name)
    }

    /// The index of the edge type whose key is `key`.
    /// Compared in place, without building each key: a model's run looks
    /// its inputs up by key.
    pub fn edge_type(&self, key: &str) -> Option<usize> {
        self.edge_types.iter().position(|e| {
            key.strip_prefix(self.type_name(e.src))
                .and_then(|rest| rest.strip_prefix("__"))
                .and_then(|rest| rest.strip_prefix(e.relation.as_str()))
                .and_then(|rest| rest.strip_prefix("__"))
                == Some(self.type_name(e.dst))
        })
    }

    /// Bytes of the encoded schema.
    pub fn encoded_len(&self) -> usize {
        HEAD_BYTES + ENTRY_BYTES * (self.node_types.len() + self.edge_types.len())
    }

    /// The encoded schema (docs/protocol.md, section 2.7). Call on a
    /// validated schema.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.encoded_len());
        out.extend_from_slice(&(self.node_types.len() as u32).to_le_bytes());
        out.extend_from_slice(&(self.edge_types.len() as u32).to_le_bytes());
        out.extend_from_slice(&[0; 8]);
        for t in &self.node_types {
            out.extend_from_slice(&name_bytes(&t.name));
            out.extend_from_slice(&t.feature_dim.to_le_bytes());
            let dtype = if t.feature_dim == 0 {
                0
            } else {
                crate::layout::dtype::F32
            };
            out.extend_from_slice(&dtype.to_le_bytes());
            out.extend_from_slice(&[0; 8]);
        }
        for e in &self.edge_types {
            out.extend_from_slice(&e.src.to_le_bytes());
            out.extend_from_slice(&e.dst.to_le_bytes());
            out.extend_from_slice(&name_bytes(&e.relation));
            out.extend_from_slice(&e.data.encode());
        }
        out
    }

    /// Decodes and validates an encoded schema. Never panics, whatever the
    /// bytes; the error says what is wrong.
    pub fn decode(bytes: &[u8]) -> Result<Self, String> {
        let u32_at = |at: usize| -> Result<u32, String> {
            bytes
                .get(at..at + 4)
                .map(|b| u32::from_le_bytes(b.try_into().expect("4 bytes")))
                .ok_or_else(|| format!("{} bytes end before offset {}", bytes.len(), at + 4))
        };
        let (n_node, n_edge) = (u32_at(0)? as usize, u32_at(4)? as usize);
        if n_node > MAX_NODE_TYPES || n_edge > MAX_EDGE_TYPES {
            return Err(format!(
                "{n_node} node types and {n_edge} edge types, more than {MAX_NODE_TYPES} and \
                 {MAX_EDGE_TYPES}"
            ));
        }
        let expected = HEAD_BYTES + ENTRY_BYTES * (n_node + n_edge);
        if bytes.len() != expected {
            return Err(format!(
                "{} bytes for {n_node} node types and {n_edge} edge types; expected {expected}",
                bytes.len()
            ));
        }
        if bytes[8..HEAD_BYTES].iter().any(|&b| b != 0) {
            return Err("reserved bytes 8..16 are not zero".into());
        }
        let mut schema = GraphSchema {
            node_types: Vec::with_capacity(n_node),
            edge_types: Vec::with_capacity(n_edge),
        };
        for i in 0..n_node {
            let at = HEAD_BYTES + ENTRY_BYTES * i;
            let name = name_of(&bytes[at..at + NAME_BYTES])
                .ok_or_else(|| format!("node type {i}: its name is not NUL-padded ASCII"))?;
            let (feature_dim, dtype) = (u32_at(at + 32)?, u32_at(at + 36)?);
            let expected_dtype = if feature_dim == 0 {
                0
            } else {
                crate::layout::dtype::F32
            };
            if dtype != expected_dtype || bytes[at + 40..at + ENTRY_BYTES].iter().any(|&b| b != 0) {
                return Err(format!(
                    "node type {name}: dtype {dtype} with feature_dim {feature_dim} (f32 = 1 \
                     with features, 0 without) or non-zero reserved bytes"
                ));
            }
            schema.node_types.push(NodeTypeDesc { name, feature_dim });
        }
        for i in 0..n_edge {
            let at = HEAD_BYTES + ENTRY_BYTES * (n_node + i);
            let relation = name_of(&bytes[at + 8..at + 8 + NAME_BYTES])
                .ok_or_else(|| format!("edge type {i}: its relation is not NUL-padded ASCII"))?;
            let data = EdgeDataDesc::decode(u32_at(at + 40)?, u32_at(at + 44)?)
                .map_err(|e| format!("edge type {i} ({relation}): {e}"))?;
            schema.edge_types.push(EdgeTypeDesc {
                src: u32_at(at)?,
                relation,
                dst: u32_at(at + 4)?,
                data,
            });
        }
        schema.validate()?;
        Ok(schema)
    }

    /// One line per type, for logs and errors: `airport (11 f32), ...;
    /// airport__route__airport, ...`.
    pub fn describe(&self) -> String {
        let mut out = String::new();
        for (i, t) in self.node_types.iter().enumerate() {
            let sep = if i == 0 { "" } else { ", " };
            match t.feature_dim {
                0 => write!(out, "{sep}{} (ids)", t.name),
                dim => write!(out, "{sep}{} ({dim} f32)", t.name),
            }
            .expect("writing to a String");
        }
        out.push_str("; ");
        let keys: Vec<String> = (0..self.edge_types.len())
            .map(|e| match self.edge_types[e].data {
                data if data.is_empty() => self.edge_key(e),
                data => format!("{} ({data})", self.edge_key(e)),
            })
            .collect();
        out.push_str(&keys.join(", "));
        out
    }
}

fn name_bytes(name: &str) -> [u8; NAME_BYTES] {
    let mut out = [0; NAME_BYTES];
    let len = name.len().min(NAME_BYTES);
    out[..len].copy_from_slice(&name.as_bytes()[..len]);
    out
}

/// The name in a NUL-padded field: ASCII up to the first NUL, NULs after.
fn name_of(field: &[u8]) -> Option<String> {
    let len = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    if field[len..].iter().any(|&b| b != 0) || !field[..len].is_ascii() {
        return None;
    }
    String::from_utf8(field[..len].to_vec()).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flights() -> GraphSchema {
        GraphSchema::of(
            &[("airport", 11), ("plane", 0)],
            &[(0, "route", 0), (1, "used_at", 0)],
        )
    }

    #[test]
    fn a_schema_round_trips_and_names_its_edge_types() {
        let schema = flights();
        schema.validate().unwrap();
        let bytes = schema.encode();
        assert_eq!(bytes.len(), schema.encoded_len());
        assert_eq!(bytes.len(), 16 + 48 * 4);
        assert_eq!(GraphSchema::decode(&bytes).unwrap(), schema);
        assert_eq!(schema.edge_key(1), "plane__used_at__airport");
        assert_eq!(schema.edge_type("plane__used_at__airport"), Some(1));
        for e in 0..schema.edge_types.len() {
            assert_eq!(schema.edge_type(&schema.edge_key(e)), Some(e));
        }
        for near in [
            "plane__used_at__airpor",
            "plane__used_at__airports",
            "plane_used_at__airport",
            "plane__used_at_airport",
            "plane__used__airport",
            "",
        ] {
            assert_eq!(schema.edge_type(near), None, "{near:?}");
        }
        assert_eq!(schema.node_type("plane"), Some(1));
        assert_eq!(
            schema.describe(),
            "airport (11 f32), plane (ids); airport__route__airport, plane__used_at__airport"
        );
    }

    #[test]
    fn what_an_edge_type_carries_round_trips_in_its_entry() {
        let data = EdgeDataDesc {
            attr_dim: 3,
            weight: false,
            time: true,
        };
        let schema = flights().with_edge_data(0, data);
        let bytes = schema.encode();
        assert_eq!(
            &bytes[16 + 96 + 40..16 + 96 + 48],
            &[3, 0, 0, 0, 2, 0, 0, 0]
        );
        assert_eq!(GraphSchema::decode(&bytes).unwrap(), schema);
        assert!(schema
            .describe()
            .ends_with("airport__route__airport (3 attributes, a time), plane__used_at__airport"));
        // The same triple with other data is still the same edge type.
        let mut twice = schema.clone();
        twice.edge_types[1] = schema.edge_types[0].clone();
        twice.edge_types[1].data = EdgeDataDesc::default();
        assert!(twice.validate().unwrap_err().contains("listed twice"));
    }

    #[test]
    fn hostile_bytes_are_refused_by_name() {
        let good = flights().encode();
        type Damage = Box<dyn Fn(&mut Vec<u8>)>;
        let cases: Vec<(Damage, &str)> = vec![
            (Box::new(|b| b.truncate(40)), "expected 208"),
            (Box::new(|b| b[0] = 200), "more than 64"),
            (Box::new(|b| b[9] = 1), "reserved bytes 8..16"),
            (Box::new(|b| b[16 + 36] = 0), "dtype 0 with feature_dim 11"),
            (
                Box::new(|b| b[16 + 48 + 36] = 1),
                "dtype 1 with feature_dim 0",
            ),
            (Box::new(|b| b[16 + 96] = 7), "names node type 7 -> 0"),
            (Box::new(|b| b[16 + 96 + 8] = 0xff), "not NUL-padded ASCII"),
            (
                Box::new(|b| b[16 + 96 + 44] = 4),
                "edge type 0 (route): edge data flags 0x4",
            ),
            (
                Box::new(|b| b[16 + 96 + 41] = 0x20),
                "edge type 0 (route): attr_dim 8192, more than 4096",
            ),
            (Box::new(|b| b[16 + 96 + 14] = b'x'), "not NUL-padded ASCII"),
            (Box::new(|b| b[16] = b'_'), "node type \"_irport\""),
            (
                Box::new(|b| {
                    let (first, second) = (16 + 96, 16 + 144);
                    let copy = b[first..first + 48].to_vec();
                    b[second..second + 48].copy_from_slice(&copy);
                }),
                "listed twice",
            ),
        ];
        for (damage, expected) in cases {
            let mut bytes = good.clone();
            damage(&mut bytes);
            let error = GraphSchema::decode(&bytes).unwrap_err();
            assert!(error.contains(expected), "{error:?} lacks {expected:?}");
        }
        for len in 0..good.len() {
            assert!(GraphSchema::decode(&good[..len]).is_err());
        }
    }

    #[test]
    fn names_follow_the_input_naming_rule() {
        assert!(valid_name("airport") && valid_name("rev_serves") && valid_name("a1"));
        for bad in ["", "1a", "_a", "a__b", "a-b", "été", &"a".repeat(33)] {
            assert!(!valid_name(bad), "{bad:?}");
        }
        assert!(valid_name(&"a".repeat(32)));
    }
}
