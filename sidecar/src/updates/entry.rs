//! One entry of the update stream (docs/updates.md, "The contract"): its
//! fields parsed and checked whole, before anything is applied, and the
//! text syntax `sidecar publish` reads.

use crate::graph::live::MAX_NODE_ID;

/// Most ids one entry may name.
pub const MAX_IDS_PER_ENTRY: usize = 1_000_000;

/// One operation of the update stream.
#[derive(Debug, Clone, PartialEq)]
pub enum Op {
    AddNode {
        id: u64,
        /// The row's raw bytes (feature-store encoding), if given.
        row: Option<Vec<u8>>,
        neighbors: Vec<u64>,
        directed: bool,
    },
    AddEdges {
        edges: Vec<(u64, u64)>,
        directed: bool,
    },
    SetFeatures {
        id: u64,
        row: Option<Vec<u8>>,
    },
    Invalidate {
        ids: Vec<u64>,
    },
}

impl Op {
    /// The `op` field's value.
    pub fn name(&self) -> &'static str {
        match self {
            Op::AddNode { .. } => "add_node",
            Op::AddEdges { .. } => "add_edges",
            Op::SetFeatures { .. } => "set_features",
            Op::Invalidate { .. } => "invalidate",
        }
    }

    /// The entry's fields, as `XADD` takes them.
    pub fn to_fields(&self) -> Vec<(&'static str, Vec<u8>)> {
        let list = |ids: &mut dyn Iterator<Item = u64>| -> Vec<u8> {
            ids.map(|id| id.to_string())
                .collect::<Vec<_>>()
                .join(" ")
                .into_bytes()
        };
        let mut fields = vec![("op", self.name().as_bytes().to_vec())];
        match self {
            Op::AddNode {
                id,
                row,
                neighbors,
                directed,
            } => {
                fields.push(("id", id.to_string().into_bytes()));
                if let Some(row) = row {
                    fields.push(("row", row.clone()));
                }
                if !neighbors.is_empty() {
                    fields.push(("neighbors", list(&mut neighbors.iter().copied())));
                }
                if *directed {
                    fields.push(("directed", b"1".to_vec()));
                }
            }
            Op::AddEdges { edges, directed } => {
                fields.push(("edges", list(&mut edges.iter().flat_map(|&(s, d)| [s, d]))));
                if *directed {
                    fields.push(("directed", b"1".to_vec()));
                }
            }
            Op::SetFeatures { id, row } => {
                fields.push(("id", id.to_string().into_bytes()));
                if let Some(row) = row {
                    fields.push(("row", row.clone()));
                }
            }
            Op::Invalidate { ids } => fields.push(("ids", list(&mut ids.iter().copied()))),
        }
        fields
    }

    /// Parses and checks an entry's fields; `row_bytes` is `4 x
    /// feature_dim`. The error names the rule broken.
    pub fn from_fields(fields: &[(Vec<u8>, Vec<u8>)], row_bytes: usize) -> Result<Op, String> {
        let mut seen: Vec<&str> = Vec::new();
        let mut get = |name: &'static str| -> Option<&[u8]> {
            let found = fields
                .iter()
                .find(|(k, _)| k.as_slice() == name.as_bytes())
                .map(|(_, v)| v.as_slice());
            if found.is_some() {
                seen.push(name);
            }
            found
        };
        let text = |name: &str, value: &[u8]| -> Result<String, String> {
            String::from_utf8(value.to_vec()).map_err(|_| format!("field `{name}` is not text"))
        };
        let op = get("op").ok_or("no `op` field")?;
        let op = text("op", op)?;
        let id = |value: Option<&[u8]>, name: &str| -> Result<u64, String> {
            let value = value.ok_or(format!("no `{name}` field"))?;
            parse_id(&text(name, value)?)
        };
        let ids = |value: &[u8], name: &str| parse_ids(&text(name, value)?, name);
        let row = |value: Option<&[u8]>| -> Result<Option<Vec<u8>>, String> {
            match value {
                Some(row) if row.len() != row_bytes => Err(format!(
                    "`row` has {} bytes; rows of this graph have {row_bytes} ({} f32 values)",
                    row.len(),
                    row_bytes / 4
                )),
                other => Ok(other.map(<[u8]>::to_vec)),
            }
        };
        let directed = |value: Option<&[u8]>| -> Result<bool, String> {
            match value {
                None | Some(b"0") => Ok(false),
                Some(b"1") => Ok(true),
                Some(_) => Err("`directed` is neither 0 nor 1".into()),
            }
        };
        let parsed = match op.as_str() {
            "add_node" => Op::AddNode {
                id: id(get("id"), "id")?,
                row: row(get("row"))?,
                neighbors: match get("neighbors") {
                    Some(v) => ids(v, "neighbors")?,
                    None => Vec::new(),
                },
                directed: directed(get("directed"))?,
            },
            "add_edges" => {
                let flat = ids(get("edges").ok_or("no `edges` field")?, "edges")?;
                if flat.len() % 2 != 0 {
                    return Err(format!(
                        "`edges` has {} ids, not a whole number of `src dst` pairs",
                        flat.len()
                    ));
                }
                Op::AddEdges {
                    edges: flat.chunks(2).map(|p| (p[0], p[1])).collect(),
                    directed: directed(get("directed"))?,
                }
            }
            "set_features" => Op::SetFeatures {
                id: id(get("id"), "id")?,
                row: row(get("row"))?,
            },
            "invalidate" => Op::Invalidate {
                ids: ids(get("ids").ok_or("no `ids` field")?, "ids")?,
            },
            other => {
                return Err(format!(
                    "unknown op {other:?} (add_node, add_edges, set_features, invalidate)"
                ))
            }
        };
        for (key, _) in fields {
            let key = String::from_utf8_lossy(key);
            if !seen.iter().any(|s| *s == key) {
                return Err(format!("unknown or repeated field `{key}` for op {op}"));
            }
        }
        Ok(parsed)
    }

    /// Parses one operation in the text syntax of `sidecar publish`:
    ///
    /// - `add-node ID [NEIGHBOR...] [row=V,V,...] [directed]`
    /// - `add-edges SRC DST [SRC DST...] [directed]`
    /// - `set-features ID row=V,V,...`
    /// - `invalidate ID [ID...]`
    ///
    /// `row=` may also be `row-file=PATH` (raw little-endian f32). `dim`,
    /// when known, checks the row's length.
    pub fn from_words(words: &[&str], dim: Option<usize>) -> Result<Op, String> {
        let (&verb, rest) = words.split_first().ok_or("an empty operation")?;
        let mut ids = Vec::new();
        let mut row = None;
        let mut directed = false;
        for word in rest {
            if let Some(values) = word.strip_prefix("row=") {
                row = Some(parse_row(values)?);
            } else if let Some(path) = word.strip_prefix("row-file=") {
                row = Some(std::fs::read(path).map_err(|e| format!("reading {path}: {e}"))?);
            } else if *word == "directed" {
                directed = true;
            } else {
                ids.push(parse_id(word)?);
            }
        }
        if let (Some(row), Some(dim)) = (&row, dim) {
            if row.len() != 4 * dim {
                return Err(format!(
                    "the row has {} values; this graph's rows have {dim}",
                    row.len() as f64 / 4.0
                ));
            }
        }
        let has_row = row.is_some();
        let one_id = |ids: &[u64]| -> Result<u64, String> {
            ids.first()
                .copied()
                .ok_or_else(|| format!("{verb} needs a node id"))
        };
        let op = match verb {
            "add-node" => Op::AddNode {
                id: one_id(&ids)?,
                row,
                neighbors: ids[1..].to_vec(),
                directed,
            },
            "add-edges" => {
                if ids.is_empty() || ids.len() % 2 != 0 {
                    return Err("add-edges needs `src dst` pairs".into());
                }
                Op::AddEdges {
                    edges: ids.chunks(2).map(|p| (p[0], p[1])).collect(),
                    directed,
                }
            }
            "set-features" => {
                if ids.len() != 1 || row.is_none() {
                    return Err("set-features needs one node id and its row (row=...)".into());
                }
                Op::SetFeatures { id: ids[0], row }
            }
            "invalidate" => {
                if ids.is_empty() || has_row || directed {
                    return Err("invalidate takes node ids only".into());
                }
                Op::Invalidate { ids }
            }
            other => {
                return Err(format!(
                    "unknown operation {other:?} (add-node, add-edges, set-features, invalidate)"
                ))
            }
        };
        if matches!(op, Op::AddEdges { .. } | Op::Invalidate { .. }) && has_row {
            return Err(format!("{verb} takes no row"));
        }
        Ok(op)
    }
}

/// Field `name`'s space-separated decimal ids, at most
/// [`MAX_IDS_PER_ENTRY`].
pub(crate) fn parse_ids(text: &str, name: &str) -> Result<Vec<u64>, String> {
    let ids: Vec<u64> = text
        .split(' ')
        .filter(|t| !t.is_empty())
        .map(parse_id)
        .collect::<Result<_, _>>()?;
    if ids.len() > MAX_IDS_PER_ENTRY {
        return Err(format!(
            "`{name}` names {} ids, more than {MAX_IDS_PER_ENTRY}",
            ids.len()
        ));
    }
    Ok(ids)
}

/// A row given inline, `V,V,...`, as its raw little-endian f32 bytes.
pub(crate) fn parse_row(values: &str) -> Result<Vec<u8>, String> {
    let values: Vec<f32> = values
        .split(',')
        .map(|v| {
            v.trim()
                .parse::<f32>()
                .map_err(|_| format!("row value {v:?} is not a number"))
        })
        .collect::<Result<_, _>>()?;
    Ok(values.iter().flat_map(|v| v.to_le_bytes()).collect())
}

/// A node id: decimal, at most `MAX_NODE_ID`.
pub(crate) fn parse_id(text: &str) -> Result<u64, String> {
    let id: u64 = text
        .parse()
        .map_err(|_| format!("node id {text:?} is not a decimal integer"))?;
    if id > MAX_NODE_ID {
        return Err(format!(
            "node id {id} is above the largest node id {MAX_NODE_ID}"
        ));
    }
    Ok(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fields(pairs: &[(&str, &[u8])]) -> Vec<(Vec<u8>, Vec<u8>)> {
        pairs
            .iter()
            .map(|(k, v)| (k.as_bytes().to_vec(), v.to_vec()))
            .collect()
    }

    #[test]
    fn every_op_round_trips_through_its_fields() {
        let row = vec![0u8, 0, 128, 63, 0, 0, 0, 64];
        for op in [
            Op::AddNode {
                id: 7,
                row: Some(row.clone()),
                neighbors: vec![1, 2],
                directed: false,
            },
            Op::AddNode {
                id: 8,
                row: None,
                neighbors: vec![],
                directed: true,
            },
            Op::AddEdges {
                edges: vec![(1, 2), (3, 4)],
                directed: true,
            },
            Op::SetFeatures {
                id: 9,
                row: Some(row.clone()),
            },
            Op::Invalidate { ids: vec![5, 6] },
        ] {
            let wire: Vec<(Vec<u8>, Vec<u8>)> = op
                .to_fields()
                .into_iter()
                .map(|(k, v)| (k.as_bytes().to_vec(), v))
                .collect();
            assert_eq!(Op::from_fields(&wire, 8), Ok(op));
        }
    }

    #[test]
    fn a_malformed_entry_names_the_rule_it_broke() {
        type Case<'a> = (&'a [(&'a str, &'a [u8])], &'a str);
        let cases: &[Case] = &[
            (&[], "no `op`"),
            (&[("op", b"drop_node"), ("id", b"1")], "unknown op"),
            (&[("op", b"add_node")], "no `id`"),
            (&[("op", b"add_node"), ("id", b"x")], "not a decimal"),
            (
                &[("op", b"add_node"), ("id", b"4294967295")],
                "above the largest",
            ),
            (&[("op", b"add_edges"), ("edges", b"1 2 3")], "pairs"),
            (
                &[("op", b"set_features"), ("id", b"1"), ("row", b"abc")],
                "3 bytes",
            ),
            (
                &[("op", b"invalidate"), ("ids", b"1"), ("colour", b"red")],
                "unknown or repeated",
            ),
            (
                &[
                    ("op", b"add_edges"),
                    ("edges", b"1 2"),
                    ("directed", b"yes"),
                ],
                "neither 0 nor 1",
            ),
        ];
        for (f, expected) in cases {
            let err = Op::from_fields(&fields(f), 8).unwrap_err();
            assert!(err.contains(expected), "{f:?}: {err}");
        }
    }

    #[test]
    fn the_text_syntax_reads_each_op() {
        assert_eq!(
            Op::from_words(&["add-edges", "1", "2", "3", "4", "directed"], None),
            Ok(Op::AddEdges {
                edges: vec![(1, 2), (3, 4)],
                directed: true
            })
        );
        assert_eq!(
            Op::from_words(&["set-features", "4", "row=1,2"], Some(2)),
            Ok(Op::SetFeatures {
                id: 4,
                row: Some(vec![0, 0, 128, 63, 0, 0, 0, 64])
            })
        );
        assert!(Op::from_words(&["set-features", "4", "row=1"], Some(2))
            .unwrap_err()
            .contains("1 values"));
        assert!(Op::from_words(&["add-edges", "1"], None).is_err());
        assert!(Op::from_words(&["remove-node", "1"], None).is_err());
    }
}
