//! `sidecar publish`: appends operations to the update stream, rows to the
//! feature store first (docs/updates.md, "Publishing").

use std::io::BufRead;
use std::path::Path;

use anyhow::{bail, Context};

use crate::features::import::FeatureManifest;
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::updates::entry::Op;

/// Operations appended per pipelined round trip.
const PIPELINE: usize = 512;

/// Where `sidecar publish` writes.
#[derive(Debug, Clone)]
pub struct PublishTarget {
    /// The stream's Redis.
    pub redis: RedisConfig,
    pub stream: String,
    /// The feature store's Redis, when the features live in Redis: rows are
    /// written there before their entry is appended.
    pub features: Option<RedisConfig>,
    /// Values per row, when known (a data directory was given).
    pub feature_dim: Option<usize>,
}

impl PublishTarget {
    /// The stream on `redis`; with a data directory, its feature store
    /// (rows go to Redis first when the features live there) and row size.
    pub fn new(redis: RedisConfig, stream: &str, data_dir: Option<&Path>) -> anyhow::Result<Self> {
        let (features, feature_dim) = match data_dir {
            Some(dir) => {
                let manifest = FeatureManifest::read(dir)?;
                let features = (manifest.store == "redis").then(|| RedisConfig {
                    prefix: manifest
                        .redis_prefix
                        .clone()
                        .unwrap_or_else(|| crate::features::contract::DEFAULT_PREFIX.into()),
                    ..redis.clone()
                });
                (features, Some(manifest.feature_dim as usize))
            }
            None => (None, None),
        };
        Ok(Self {
            redis,
            stream: stream.to_string(),
            features,
            feature_dim,
        })
    }
}

/// Parses the operations of a file: one per line in the text syntax
/// (`Op::from_words`), `#` comments and blank lines skipped. An error names
/// the line.
pub fn read_ops(path: &Path, dim: Option<usize>) -> anyhow::Result<Vec<Op>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut ops = Vec::new();
    for (n, line) in std::io::BufReader::new(file).lines().enumerate() {
        let line = line.with_context(|| format!("reading {}", path.display()))?;
        let content = line.split('#').next().unwrap_or("").trim();
        if content.is_empty() {
            continue;
        }
        let words: Vec<&str> = content.split_whitespace().collect();
        let op = Op::from_words(&words, dim)
            .map_err(|e| anyhow::anyhow!("{}:{}: {e}", path.display(), n + 1))?;
        ops.push(op);
    }
    Ok(ops)
}

/// Appends `ops` in order, pipelined; each op's row goes to the feature
/// store before its entry is appended. Returns the id of the last entry.
pub async fn publish(target: &PublishTarget, ops: &[Op]) -> anyhow::Result<Option<String>> {
    if let Some(dim) = target.feature_dim {
        for (i, op) in ops.iter().enumerate() {
            if let Some((id, row)) = op.row() {
                if row.len() != 4 * dim {
                    bail!(
                        "operation {} (node {id}): the row has {} values; this graph's rows have \
                         {dim}",
                        i + 1,
                        row.len() / 4
                    );
                }
            }
        }
    }
    let stream = RedisTier::connect(&target.redis)
        .await
        .context("connecting to the update stream's Redis")?;
    let features = match &target.features {
        Some(config) => Some(
            RedisTier::connect(config)
                .await
                .context("connecting to the feature store")?,
        ),
        None => None,
    };
    let mut last = None;
    for chunk in ops.chunks(PIPELINE) {
        if let Some(features) = &features {
            let rows: Vec<(u64, Vec<u8>)> = chunk
                .iter()
                .filter_map(|op| op.row().map(|(id, row)| (id, row.to_vec())))
                .collect();
            if !rows.is_empty() {
                features
                    .set_many(&rows)
                    .await
                    .context("writing rows to the feature store")?;
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
