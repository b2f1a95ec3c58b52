//! What no system can beat, and the feature-fetch comparisons, measured
//! in this process on the same requests:
//!
//! - (f) the floors: an in-memory gather of a request's rows (the feature
//!   matrix in RAM), and the ONNX model alone on the request's inputs
//!   already materialised (latency, and throughput with the worker's
//!   number of sessions);
//! - (e) a bare MGET and naive GETs of the request's rows;
//! - the product's own cold fetch (the feature tiers with no L1 or L2
//!   cache, straight to Redis), to compare with (d) Feast.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use gnn_worker::model::{Device, InputSlices, Model};
use sidecar::features::redis_tier::{RedisConfig, RedisTier};
use sidecar::features::{FeatureTiers, RowSource, TierConfig};
use sidecar::graph::{CsrIndex, Sampled, Sampler};

use crate::load::{histogram, Summary};

/// The feature matrix of a dataset, in RAM.
#[derive(Debug)]
pub struct Features {
    pub dim: usize,
    pub values: Vec<f32>,
}

impl Features {
    pub fn read(path: &Path, dim: usize) -> anyhow::Result<Self> {
        let bytes = std::fs::read(path)?;
        let values = bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect();
        Ok(Self { dim, values })
    }

    /// Copies the rows of `nodes` into `out` (the gather).
    pub fn gather(&self, nodes: &[u64], out: &mut Vec<f32>) {
        out.clear();
        for &node in nodes {
            let start = node as usize * self.dim;
            match self.values.get(start..start + self.dim) {
                Some(row) => out.extend_from_slice(row),
                None => out.extend(std::iter::repeat_n(0.0, self.dim)),
            }
        }
    }
}

/// Feature rows on a 64-byte boundary, as a response's Arrow buffers are
/// in the ring: ONNX Runtime's kernels run measurably faster on them than
/// on a heap vector's 16-byte alignment (scripts/bench-onnx.sh: 0.76x the
/// time on cora's one-target inputs), so the floor runs on them too.
#[derive(Debug, Default, Clone)]
pub struct Aligned {
    raw: Vec<f32>,
    start: usize,
    len: usize,
}

impl Aligned {
    /// Holds a copy of `values`.
    pub fn set(&mut self, values: &[f32]) {
        self.raw.clear();
        self.raw.resize(values.len() + 16, 0.0);
        self.start = self.raw.as_ptr().align_offset(64).min(16);
        self.len = values.len();
        self.raw[self.start..self.start + self.len].copy_from_slice(values);
    }

    pub fn as_slice(&self) -> &[f32] {
        &self.raw[self.start..self.start + self.len]
    }
}

/// The sample of request `k` (the same seed every system's caller-side
/// sampling uses).
pub fn sample(
    index: &CsrIndex,
    sampler: &mut Sampler,
    targets: &[u64],
    fanouts: [u32; 2],
    k: usize,
) -> Sampled {
    sampler.sample(index, targets, fanouts, k as u64 + 1)
}

fn inputs<'a>(sampled: &'a Sampled, features: &'a [f32], dim: usize) -> InputSlices<'a> {
    InputSlices {
        features,
        feature_dim: dim,
        target_row: &sampled.target_row,
        hop1_count: &sampled.hop1_count,
        hop1_rows: &sampled.hop1_rows,
        hop2_count: &sampled.hop2_count,
        hop2_rows: &sampled.hop2_rows,
        fanouts: sampled.fanouts.map(|f| f as usize),
        hop1_h1: &[],
    }
}

/// The two floors of each request: the gather of its rows and the model
/// run on its materialised inputs.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Floors {
    pub gather: Summary,
    pub onnx: Summary,
    /// Requests per second of the model alone, with `sessions` sessions
    /// running at once on pre-built inputs.
    pub onnx_throughput: f64,
    pub sessions: usize,
    /// Mean rows per request (the sampled neighbourhood).
    pub mean_rows: f64,
    /// The CPU one model run costs alone (one thread, `intra_threads` 1,
    /// inputs materialised), mean microseconds: the floor of the product's
    /// CPU per call.
    pub onnx_cpu_us: f64,
}

/// CPU time this thread has used, seconds.
fn thread_cpu_seconds() -> f64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID)
        .map_or(0.0, |t| t.tv_sec() as f64 + t.tv_nsec() as f64 / 1e9)
}

#[allow(clippy::too_many_arguments)]
pub fn floors(
    index: &CsrIndex,
    features: &Features,
    requests: &[Vec<u64>],
    fanouts: [u32; 2],
    env: &ort::environment::Environment,
    model_dir: &Path,
    calls: usize,
    sessions: usize,
    throughput_for: Duration,
) -> anyhow::Result<Floors> {
    let mut model = Model::load(env, model_dir, Device::Cpu, 1)?;
    let mut sampler = Sampler::default();
    let (mut gather_h, mut onnx_h) = (histogram(), histogram());
    let mut buffer = Vec::new();
    let mut aligned = Aligned::default();
    let mut rows = 0usize;
    let mut onnx_cpu = 0.0;
    for k in 0..calls {
        let sampled = sample(
            index,
            &mut sampler,
            &requests[k % requests.len()],
            fanouts,
            k,
        );
        rows += sampled.nodes.len();
        let t = Instant::now();
        features.gather(&sampled.nodes, &mut buffer);
        let _ = gather_h.record((t.elapsed().as_nanos() as u64).max(1));
        aligned.set(&buffer);
        let t = Instant::now();
        let cpu = thread_cpu_seconds();
        model.run_slices(&inputs(&sampled, aligned.as_slice(), features.dim))?;
        onnx_cpu += thread_cpu_seconds() - cpu;
        let _ = onnx_h.record((t.elapsed().as_micros() as u64).max(1));
    }
    // Throughput of the model alone: `sessions` threads over pre-built inputs.
    let built: Vec<(Sampled, Aligned)> = (0..32.min(requests.len()))
        .map(|k| {
            let sampled = sample(index, &mut sampler, &requests[k], fanouts, k);
            let mut buffer = Vec::new();
            features.gather(&sampled.nodes, &mut buffer);
            let mut aligned = Aligned::default();
            aligned.set(&buffer);
            (sampled, aligned)
        })
        .collect();
    let built = Arc::new(built);
    let runs = std::sync::atomic::AtomicU64::new(0);
    let started = Instant::now();
    std::thread::scope(|scope| -> anyhow::Result<()> {
        let mut handles = Vec::new();
        for s in 0..sessions {
            let mut model = Model::load(env, model_dir, Device::Cpu, 1)?;
            let (built, runs) = (built.clone(), &runs);
            handles.push(scope.spawn(move || {
                let mut k = s;
                while started.elapsed() < throughput_for {
                    let (sampled, buffer) = &built[k % built.len()];
                    if model
                        .run_slices(&inputs(sampled, buffer.as_slice(), features.dim))
                        .is_ok()
                    {
                        runs.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                    k += sessions;
                }
            }));
        }
        for handle in handles {
            let _ = handle.join();
        }
        Ok(())
    })?;
    let seconds = started.elapsed().as_secs_f64();
    Ok(Floors {
        gather: Summary::of(&gather_h, 0, 0.0, None).scaled(1000.0),
        onnx: Summary::of(&onnx_h, 0, 0.0, None),
        onnx_throughput: runs.load(std::sync::atomic::Ordering::Relaxed) as f64 / seconds,
        sessions,
        mean_rows: rows as f64 / calls.max(1) as f64,
        onnx_cpu_us: onnx_cpu * 1e6 / calls.max(1) as f64,
    })
}

/// Feature fetch of each request's rows from Redis, four ways (Feast is
/// measured by its own script on the same row lists).
#[derive(Debug, Clone, serde::Serialize)]
pub struct Fetches {
    /// The product's feature tiers with no cache: one MGET per request.
    pub ours_cold: Summary,
    pub bare_mget: Summary,
    pub naive_gets: Summary,
    pub feast: Option<Summary>,
    pub mean_rows: f64,
}

/// The unique rows of each request's sample.
pub fn row_lists(
    index: &CsrIndex,
    requests: &[Vec<u64>],
    fanouts: [u32; 2],
    n: usize,
) -> Vec<Vec<u64>> {
    let mut sampler = Sampler::default();
    (0..n)
        .map(|k| {
            sample(
                index,
                &mut sampler,
                &requests[k % requests.len()],
                fanouts,
                k,
            )
            .nodes
        })
        .collect()
}

pub async fn fetches(
    redis_url: &str,
    prefix: &str,
    dim: usize,
    rows: &[Vec<u64>],
    naive_calls: usize,
) -> anyhow::Result<Fetches> {
    let mut config = RedisConfig::single(redis_url);
    config.prefix = prefix.to_string();
    let tier = RedisTier::connect(&config).await?;
    let mut tier_config = TierConfig::new(dim);
    tier_config.l1_bytes = 0;
    let tiers = FeatureTiers::new(&tier_config, None, Some(tier));
    let client = redis::Client::open(redis_url)?;
    let mut conn = client.get_multiplexed_async_connection().await?;
    let (mut ours, mut mget, mut gets) = (histogram(), histogram(), histogram());
    let mut features = Vec::new();
    let mut sources = Vec::new();
    for ids in rows {
        features.resize(ids.len() * dim, 0.0);
        sources.resize(ids.len(), RowSource::default());
        let t = Instant::now();
        tiers
            .fetch_into(
                ids,
                Some(Instant::now() + Duration::from_secs(10)),
                &mut features,
                &mut sources,
            )
            .await;
        let _ = ours.record((t.elapsed().as_micros() as u64).max(1));
        anyhow::ensure!(
            sources.iter().all(|s| !s.fallback),
            "the product's fetch served default rows"
        );
        let keys: Vec<String> = ids.iter().map(|id| format!("{prefix}{id}")).collect();
        let t = Instant::now();
        let values: Vec<Option<Vec<u8>>> =
            redis::cmd("MGET").arg(&keys).query_async(&mut conn).await?;
        let _ = mget.record((t.elapsed().as_micros() as u64).max(1));
        anyhow::ensure!(values.iter().all(Option::is_some), "a key is missing");
    }
    for ids in rows.iter().take(naive_calls) {
        let t = Instant::now();
        for id in ids {
            let _: Option<Vec<u8>> = redis::cmd("GET")
                .arg(format!("{prefix}{id}"))
                .query_async(&mut conn)
                .await?;
        }
        let _ = gets.record((t.elapsed().as_micros() as u64).max(1));
    }
    Ok(Fetches {
        ours_cold: Summary::of(&ours, 0, 0.0, None),
        bare_mget: Summary::of(&mget, 0, 0.0, None),
        naive_gets: Summary::of(&gets, 0, 0.0, None),
        feast: None,
        mean_rows: rows.iter().map(Vec::len).sum::<usize>() as f64 / rows.len().max(1) as f64,
    })
}
