//! `sidecar import` for features: a dataset's `features.f32` (N x D f32,
//! row-major, little-endian) into the embedded RocksDB store of record
//! (`<data-dir>/features.db`, the default) or into Redis (pipelined, one key
//! per node). Either way the population mean row is computed on the way and
//! written to `<data-dir>/feature_mean.f32`, with `<data-dir>/features.json`
//! describing the store.

use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{ensure, Context};
use serde::{Deserialize, Serialize};

use crate::features::contract::{decode_row, encode_row};
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{RocksStore, Role};

/// Rows written per batch (RocksDB write batch or Redis pipeline chunks).
const BATCH_ROWS: usize = 4_096;

/// Largest feature dimension an import accepts (docs/features.md).
pub const MAX_FEATURE_DIM: usize = 1 << 20;

/// `<data-dir>/features.json`: what the sidecar needs to serve the rows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct FeatureManifest {
    pub feature_dim: u32,
    pub dtype: String,
    pub num_nodes: u64,
    /// "rocksdb" (embedded store of record) or "redis".
    pub store: String,
    /// Redis key prefix, when the store is Redis.
    pub redis_prefix: Option<String>,
    /// File with the population mean row (f32 LE).
    pub mean_file: String,
    /// What the import wrote, `<rows>x<dim>:<xxh3 of the rows' bytes>`,
    /// recorded in the store too (RocksDB's `\xffdataset` key, Redis's
    /// `<prefix>dataset`): a store holding another import's rows is refused
    /// at start ([`FeatureManifest::check_store`]). Absent in data
    /// directories imported before it existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fingerprint: Option<String>,
}

impl FeatureManifest {
    pub const FILE: &'static str = "features.json";
    pub const STORE_DIR: &'static str = "features.db";
    pub const MEAN_FILE: &'static str = "feature_mean.f32";

    pub fn read(data_dir: &Path) -> anyhow::Result<Self> {
        let path = data_dir.join(Self::FILE);
        let text = std::fs::read_to_string(&path).with_context(|| {
            format!(
                "reading {}: run `sidecar import` for this data directory",
                path.display()
            )
        })?;
        serde_json::from_str(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn new(
        feature_dim: u32,
        num_nodes: u64,
        redis_prefix: Option<String>,
        fingerprint: String,
    ) -> Self {
        Self {
            fingerprint: Some(fingerprint),
            feature_dim,
            dtype: "f32".into(),
            num_nodes,
            store: if redis_prefix.is_some() {
                "redis"
            } else {
                "rocksdb"
            }
            .into(),
            redis_prefix,
            mean_file: Self::MEAN_FILE.into(),
        }
    }

    /// The Redis key of the import's fingerprint under `prefix`: not a
    /// node id, so never a row's key.
    pub fn redis_dataset_key(prefix: &str) -> String {
        format!("{prefix}dataset")
    }

    /// Refuses a store of record at `path` that does not hold what this
    /// manifest's import wrote: another import's fingerprint, or rows of
    /// another width (a store from another dataset put in the data
    /// directory would otherwise be served as ready, every row a default).
    pub fn check_store(&self, store: &RocksStore, path: &Path) -> anyhow::Result<()> {
        let fix = "re-run `sidecar import` for this data directory, or put back the store it \
                   wrote";
        if let Some(want) = &self.fingerprint {
            let got = store.dataset();
            ensure!(
                got.as_deref() == Some(want.as_str()),
                "the feature store {} holds another import's rows (its fingerprint {}, \
                 features.json's {want}): {fix}",
                path.display(),
                got.as_deref().unwrap_or("none")
            );
        }
        self.check_width(store.first_row_len(), &path.display().to_string(), fix)
    }

    /// Refuses Redis rows (read from `sample`: the values of a few ids) or
    /// a recorded fingerprint that are not this manifest's import's.
    pub fn check_redis(
        &self,
        shown: &str,
        recorded: Option<&str>,
        sample: &[Option<Vec<u8>>],
    ) -> anyhow::Result<()> {
        let fix = "re-run `sidecar import --redis`, or point redis and the key prefix at the \
                   store this data directory was imported into";
        if let (Some(want), Some(got)) = (&self.fingerprint, recorded) {
            ensure!(
                got == want,
                "Redis {shown} holds another import's rows (its fingerprint {got}, \
                 features.json's {want}): {fix}"
            );
        }
        let len = sample.iter().flatten().map(Vec::len).next();
        self.check_width(len, &format!("Redis {shown}"), fix)
    }

    /// Refuses a sampled row length other than this manifest's width.
    fn check_width(&self, len: Option<usize>, store: &str, fix: &str) -> anyhow::Result<()> {
        let want = 4 * self.feature_dim as usize;
        if let Some(len) = len {
            ensure!(
                len == want,
                "{store} holds rows of {len} bytes ({} f32 values); features.json says \
                 {} values ({want} bytes): {fix}",
                len / 4,
                self.feature_dim
            );
        }
        Ok(())
    }

    /// The mean row written at import.
    pub fn read_mean(&self, data_dir: &Path) -> anyhow::Result<Vec<f32>> {
        let bytes = std::fs::read(data_dir.join(&self.mean_file))?;
        let mut mean = vec![0f32; self.feature_dim as usize];
        ensure!(
            decode_row(&bytes, &mut mean),
            "the mean row file has the wrong size"
        );
        Ok(mean)
    }
}

/// Checks at start that `tier` answers this client and holds what
/// `manifest`'s import wrote (its fingerprint, rows of its width, from a
/// sample of ids): a refused password or another import's rows are errors
/// naming the cause; a Redis that cannot be reached now is left to the
/// fetch path's fallbacks (logged).
pub async fn verify_redis(tier: &RedisTier, manifest: &FeatureManifest) -> anyhow::Result<()> {
    let shown = tier.shown();
    let unreachable = |e: redis::RedisError| -> anyhow::Result<()> {
        if let Some(problem) = crate::features::redis_tier::auth_problem(&e, shown) {
            anyhow::bail!(problem);
        }
        tracing::warn!(
            redis = %shown,
            error = %e,
            "could not check the feature store at start; serving on (rows it cannot give are \
             default rows, counted as fallbacks)"
        );
        Ok(())
    };
    let mut get = redis::cmd("GET");
    get.arg(FeatureManifest::redis_dataset_key(tier.prefix()));
    let recorded: Option<String> = match tier.query(&get).await {
        Ok(recorded) => recorded,
        Err(e) => return unreachable(e),
    };
    let ids: Vec<u64> = (0..manifest.num_nodes.min(8)).collect();
    let sample = match tier.get_many(&ids).await {
        Ok(sample) => sample,
        Err(e) => return unreachable(e),
    };
    manifest.check_redis(shown, recorded.as_deref(), &sample)
}

/// What a feature import did.
#[derive(Debug, Clone)]
pub struct FeatureImport {
    pub rows: u64,
    pub feature_dim: u32,
    pub seconds: f64,
    pub destination: String,
}

/// Streams `features.f32` in batches of rows to `sink`, returning the mean
/// and the import's fingerprint ([`FeatureManifest::fingerprint`]).
fn stream_rows(
    features: &Path,
    n: u64,
    dim: usize,
    mut sink: impl FnMut(u64, &[f32]) -> anyhow::Result<()>,
) -> anyhow::Result<(Vec<f32>, String)> {
    let file = File::open(features).with_context(|| format!("opening {}", features.display()))?;
    let len = file.metadata()?.len();
    ensure!(
        (1..=MAX_FEATURE_DIM).contains(&dim),
        "feature_dim {dim} is outside 1..={MAX_FEATURE_DIM}; fix meta.json"
    );
    let expected = n
        .checked_mul(dim as u64 * 4)
        .ok_or_else(|| anyhow::anyhow!("num_nodes {n} x feature_dim {dim} x 4 bytes overflows"))?;
    ensure!(
        len == expected,
        "{} is {len} bytes; meta.json's num_nodes x feature_dim x 4 = {expected}",
        features.display()
    );
    let mut reader = BufReader::with_capacity(1 << 20, file);
    let mut bytes = vec![0u8; BATCH_ROWS * dim * 4];
    let mut rows = vec![0f32; BATCH_ROWS * dim];
    let mut sum = vec![0f64; dim];
    let mut first = 0u64;
    let started = Instant::now();
    let mut hash = xxhash_rust::xxh3::Xxh3::new();
    while first < n {
        let count = (n - first).min(BATCH_ROWS as u64) as usize;
        let chunk = &mut bytes[..count * dim * 4];
        reader.read_exact(chunk)?;
        hash.update(chunk);
        let values = &mut rows[..count * dim];
        decode_row(chunk, values);
        for row in values.chunks_exact(dim) {
            for (s, v) in sum.iter_mut().zip(row) {
                *s += f64::from(*v);
            }
        }
        sink(first, values)?;
        first += count as u64;
        if first % (BATCH_ROWS as u64 * 64) < count as u64 || first == n {
            tracing::info!(
                rows = first,
                of = n,
                secs = started.elapsed().as_secs_f64(),
                "feature import"
            );
        }
    }
    let mean = sum.iter().map(|s| (*s / n.max(1) as f64) as f32).collect();
    Ok((mean, format!("{n}x{dim}:{:016x}", hash.digest())))
}

fn write_manifest(data_dir: &Path, manifest: &FeatureManifest, mean: &[f32]) -> anyhow::Result<()> {
    std::fs::write(data_dir.join(FeatureManifest::MEAN_FILE), encode_row(mean))?;
    std::fs::write(
        data_dir.join(FeatureManifest::FILE),
        serde_json::to_string_pretty(manifest)?,
    )?;
    Ok(())
}

/// Imports into the embedded store of record: `<data-dir>/features.db`.
pub fn import_to_rocksdb(
    features: &Path,
    n: u64,
    dim: u32,
    data_dir: &Path,
) -> anyhow::Result<FeatureImport> {
    let started = Instant::now();
    let store_path: PathBuf = data_dir.join(FeatureManifest::STORE_DIR);
    let (store, _) = RocksStore::open(&store_path, Role::StoreOfRecord)?;
    let mut row_bytes: Vec<Vec<u8>> = Vec::with_capacity(BATCH_ROWS);
    let (mean, fingerprint) = stream_rows(features, n, dim as usize, |first, values| {
        row_bytes.clear();
        row_bytes.extend(values.chunks_exact(dim as usize).map(encode_row));
        store.put_many(
            row_bytes
                .iter()
                .enumerate()
                .map(|(i, bytes)| (first + i as u64, bytes.as_slice())),
        )
    })?;
    store.set_dataset(&fingerprint)?;
    store.flush()?;
    let manifest = FeatureManifest::new(dim, n, None, fingerprint);
    write_manifest(data_dir, &manifest, &mean)?;
    Ok(FeatureImport {
        rows: n,
        feature_dim: dim,
        seconds: started.elapsed().as_secs_f64(),
        destination: format!("RocksDB store of record {}", store_path.display()),
    })
}

/// Imports into Redis (pipelined SETs, `<prefix><node id>` keys).
pub async fn import_to_redis(
    features: &Path,
    n: u64,
    dim: u32,
    data_dir: &Path,
    redis: &RedisConfig,
) -> anyhow::Result<FeatureImport> {
    let started = Instant::now();
    let tier = RedisTier::connect(redis).await?;
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<(u64, Vec<u8>)>>(4);
    let path = features.to_path_buf();
    // Reading and encoding on a blocking thread; writing on the runtime.
    let reader = tokio::task::spawn_blocking(move || {
        stream_rows(&path, n, dim as usize, |first, values| {
            let batch = values
                .chunks_exact(dim as usize)
                .enumerate()
                .map(|(i, row)| (first + i as u64, encode_row(row)))
                .collect();
            tx.blocking_send(batch)
                .map_err(|_| anyhow::anyhow!("the Redis writer stopped"))
        })
    });
    while let Some(batch) = rx.recv().await {
        tier.set_many(&batch)
            .await
            .with_context(|| format!("writing feature rows to Redis {}", tier.shown()))?;
    }
    let (mean, fingerprint) = reader.await.context("the feature reader panicked")??;
    let mut set = redis::cmd("SET");
    set.arg(FeatureManifest::redis_dataset_key(tier.prefix()))
        .arg(&fingerprint);
    tier.query::<()>(&set)
        .await
        .with_context(|| format!("writing the dataset fingerprint to Redis {}", tier.shown()))?;
    std::fs::create_dir_all(data_dir)?;
    let manifest = FeatureManifest::new(dim, n, Some(tier.prefix().to_string()), fingerprint);
    write_manifest(data_dir, &manifest, &mean)?;
    Ok(FeatureImport {
        rows: n,
        feature_dim: dim,
        seconds: started.elapsed().as_secs_f64(),
        destination: format!("Redis {}", tier.shown()),
    })
}
