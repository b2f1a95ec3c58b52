//! `sidecar publish`: appends operations to the update stream, rows to the
//! feature store first (docs/updates.md, "Publishing").

use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context};

use crate::features::import::FeatureManifest;
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::graph::typed::{self, TypedSchema};
use crate::updates::entry::Op;
use crate::updates::typed_entry::{GraphOp, EDGES_FIELD};

/// Operations appended per pipelined round trip.
const PIPELINE: usize = 512;

/// Where `sidecar publish` writes.
#[derive(Debug, Clone)]
pub struct PublishTarget {
    /// The stream's Redis.
    pub redis: RedisConfig,
    pub stream: String,
    /// The data directory's graph, when one was given.
    pub graph: Option<PublishGraph>,
}

/// The graph of a data directory `sidecar publish` was given: its types
/// (a one-type graph's are the 1x1 graph's, [`TypedSchema::one_type`]),
/// which syntax its entries take, and per node type the feature store's
/// Redis where its rows live in Redis (rows are written there before
/// their entry is appended).
#[derive(Debug, Clone)]
pub struct PublishGraph {
    pub schema: TypedSchema,
    pub one_type: bool,
    pub features: Vec<Option<RedisConfig>>,
}

impl PublishTarget {
    /// The stream on `redis`; with a data directory, its graph's types and
    /// feature stores.
    pub fn new(redis: RedisConfig, stream: &str, data_dir: Option<&Path>) -> anyhow::Result<Self> {
        let in_redis = |manifest: &FeatureManifest, default_prefix: String| {
            (manifest.store == "redis").then(|| RedisConfig {
                prefix: manifest.redis_prefix.clone().unwrap_or(default_prefix),
                ..redis.clone()
            })
        };
        let graph = match data_dir {
            None => None,
            Some(dir)
                if !dir.join(crate::graph::dataset::INDEX_FILE).exists()
                    && dir.join(typed::TYPED_DIR).is_dir() =>
            {
                let schema = TypedSchema::read(dir)?;
                let mut features = Vec::with_capacity(schema.node_types.len());
                for t in &schema.node_types {
                    features.push(if t.feature_dim == 0 {
                        None
                    } else {
                        let manifest = FeatureManifest::read(&typed::feature_dir(dir, &t.name))?;
                        in_redis(&manifest, typed::redis_prefix("feat:", &t.name))
                    });
                }
                Some(PublishGraph {
                    schema,
                    one_type: false,
                    features,
                })
            }
            Some(dir) => {
                let manifest = FeatureManifest::read(dir)?;
                Some(PublishGraph {
                    schema: TypedSchema::one_type(manifest.num_nodes, manifest.feature_dim, 0),
                    one_type: true,
                    features: vec![in_redis(
                        &manifest,
                        crate::features::contract::DEFAULT_PREFIX.into(),
                    )],
                })
            }
        };
        Ok(Self {
            redis,
            stream: stream.to_string(),
            graph,
        })
    }

    /// Values per row of a one-type graph, when its data directory was
    /// given (the one-type text syntax reads rows with it).
    pub fn feature_dim(&self) -> Option<usize> {
        let graph = self.graph.as_ref().filter(|g| g.one_type)?;
        Some(graph.schema.node_types[0].feature_dim as usize)
    }

    /// Refuses an entry the data directory's graph would skip as
    /// malformed: a typed entry for a one-type graph and the reverse, an
    /// unknown type or relation, a row of the wrong width. One check for
    /// both graph kinds: the replicas' ([`GraphOp::resolve`]).
    fn check(&self, entry: &Entry) -> Result<(), String> {
        let Some(graph) = &self.graph else {
            return Ok(());
        };
        match (entry, graph.one_type) {
            (Entry::OneType(_), false) => Err(
                "the data directory holds a typed graph: name the node type (`add-node TYPE ID \
                 ...`) or the edge type (`edges:EDGE_TYPE=SRC,DST`)"
                    .into(),
            ),
            (Entry::Typed(_), true) => Err(
                "the data directory holds a one-type graph: give ids without a node type".into(),
            ),
            _ => entry.op().resolve(&graph.schema).map(|_| ()),
        }
    }
}

/// An entry as `sidecar publish` writes it: an operation on a one-type
/// graph, or on a typed one (it names a node type or an edge type).
#[derive(Debug, Clone, PartialEq)]
pub enum Entry {
    OneType(Op),
    Typed(GraphOp),
}

impl Entry {
    /// The entry's fields, as `XADD` takes them.
    pub fn to_fields(&self) -> Vec<(String, Vec<u8>)> {
        match self {
            Entry::OneType(op) => op
                .to_fields()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
            Entry::Typed(op) => op.to_fields(),
        }
    }

    /// The operation on the graph: a one-type entry's is the 1x1 graph's.
    pub fn op(&self) -> GraphOp {
        match self {
            Entry::OneType(op) => GraphOp::from(op.clone()),
            Entry::Typed(op) => op.clone(),
        }
    }

    /// Parses one operation in the text syntax of `sidecar publish`: the
    /// typed syntax ([`GraphOp::from_words`]) when it names a node type
    /// (a word where the one-type syntax has an id) or `edges:`, the
    /// one-type one ([`Op::from_words`]) otherwise.
    pub fn from_words(words: &[&str], dim: Option<usize>) -> Result<Entry, String> {
        let typed = words.iter().skip(1).any(|w| w.starts_with(EDGES_FIELD))
            || words
                .get(1)
                .is_some_and(|w| !w.contains('=') && *w != "directed" && w.parse::<u64>().is_err());
        if typed {
            GraphOp::from_words(words).map(Entry::Typed)
        } else {
            Op::from_words(words, dim).map(Entry::OneType)
        }
    }
}

/// Parses the operations of a file: one per line in the text syntax
/// ([`Entry::from_words`]), `#` comments and blank lines skipped, each
/// checked against `target`'s data directory. An error names the line.
pub fn read_ops(path: &Path, target: &PublishTarget) -> anyhow::Result<Vec<Entry>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut ops = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let words: Vec<&str> = content.split_whitespace().collect();
        let op = Entry::from_words(&words, target.feature_dim())
            .and_then(|op| target.check(&op).map(|()| op))
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        ops.push(op);
    }
    Ok(ops)
}

/// Appends `ops` in order, pipelined; each op's row goes to the feature
/// store before its entry is appended. Every op is checked against the
/// data directory's graph first (when one was given): then nothing is
/// appended. Returns the id of the last entry.
pub async fn publish(target: &PublishTarget, ops: &[Entry]) -> anyhow::Result<Option<String>> {
    for (i, op) in ops.iter().enumerate() {
        if let Err(why) = target.check(op) {
            bail!("operation {}: {why}; nothing was appended", i + 1);
        }
    }
    let stream = RedisTier::connect(&target.redis)
        .await
        .context("connecting to the update stream's Redis")?;
    let connect = |config: &RedisConfig| {
        let config = config.clone();
        async move {
            RedisTier::connect(&config)
                .await
                .context("connecting to the feature store")
        }
    };
    // One connection per node type whose rows live in Redis.
    let mut features: Vec<Option<RedisTier>> = Vec::new();
    if let Some(graph) = &target.graph {
        for config in &graph.features {
            features.push(match config {
                Some(config) => Some(connect(config).await?),
                None => None,
            });
        }
    }
    let mut last = None;
    for chunk in ops.chunks(PIPELINE) {
        if let Some(graph) = &target.graph {
            let mut rows: Vec<Vec<(u64, Vec<u8>)>> = vec![Vec::new(); features.len()];
            for op in chunk {
                let op = op.op();
                if let Some((node_type, id, row)) = op.row() {
                    let t = graph.schema.node_type(node_type).expect("checked above");
                    rows[t].push((id, row.to_vec()));
                }
            }
            for (t, rows) in rows.iter().enumerate() {
                if let (Some(tier), false) = (&features[t], rows.is_empty()) {
                    tier.set_many(rows)
                        .await
                        .with_context(|| match graph.one_type {
                            true => "writing rows to the feature store".to_string(),
                            false => format!(
                                "writing node type {}'s rows to the feature store",
                                graph.schema.node_types[t].name
                            ),
                        })?;
                }
            }
        }
        let mut pipe = redis::pipe();
        for op in chunk {
            let cmd = pipe.cmd("XADD").arg(&target.stream).arg("*");
            for (name, value) in op.to_fields() {
                cmd.arg(name).arg(value);
            }
        }
        let ids: Vec<String> = stream
            .query_pipeline(&pipe)
            .await
            .with_context(|| format!("appending to the update stream {}", target.stream))?;
        last = ids.last().cloned().or(last);
    }
    Ok(last)
}
