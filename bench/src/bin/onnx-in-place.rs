//! `onnx-in-place`: the same ONNX Runtime run on the same inputs, the way
//! the worker runs it and alone (issue "A call at its floor", item 2; run
//! through `scripts/bench-onnx.sh`).
//!
//! One model, one set of inputs of a response's shape (cora: 1433-wide
//! rows, [20, 10] fanouts), and these ways of running it, interleaved call
//! by call so that the machine's noise falls on each alike:
//!
//! - `alone`: one session, inputs on the heap, runs back to back on one
//!   thread: the floor bench-e2e reports;
//! - `shared-memory`: the same session on the same bytes in a shared file
//!   mapping (the ring's segment is one), 64-byte aligned as the Arrow
//!   buffers are;
//! - `written-by-peer`: the inputs rewritten by another thread (another
//!   core, as the sidecar writes a response) just before each run;
//! - `caches-evicted`: 8 MiB of other memory touched before each run (what
//!   the front end, the sidecar and the client do between two lone calls);
//! - `woken-thread`: the run on a thread woken for it over a channel (as a
//!   model executor is), its run time only;
//! - `two-sessions`: two sessions of the model taking runs in turn (two
//!   executors woken in turn, each with its own weights), the run time
//!   only.
//!
//! Prints per way the p50, p99 and mean of the run's wall time and its
//! ratio to `alone`, and writes them as JSON with `--out`.

use std::io::Write;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::Instant;

use anyhow::Context;
use bench::load::{histogram, Summary};
use clap::Parser;
use gnn_worker::model::{Device, InputSlices, Model};
use rand::{Rng, SeedableRng};
use serde::Serialize;

#[derive(Debug, Parser)]
#[command(about = "The same ONNX run on the same inputs, in place and alone")]
struct Args {
    /// The model directory (default: a GraphSAGE trained on cora by the
    /// tooling).
    #[arg(long)]
    model: Option<PathBuf>,
    /// Targets per run.
    #[arg(long, default_value_t = 1)]
    targets: usize,
    /// Runs per way.
    #[arg(long, default_value_t = 2000)]
    runs: usize,
    /// Write the results as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// One run's inputs in the dense layout, owned.
#[derive(Debug, Clone)]
struct Inputs {
    features: Vec<f32>,
    target_row: Vec<i32>,
    hop1_count: Vec<i32>,
    hop1_rows: Vec<i32>,
    hop2_count: Vec<i32>,
    hop2_rows: Vec<i32>,
}

const FANOUTS: [usize; 2] = [20, 10];

impl Inputs {
    /// A neighbourhood of cora's shape: each target with 4 sampled
    /// neighbours, each of those with 3 (18 rows for one target, as the
    /// cora requests of bench-e2e have on average).
    fn new(targets: usize, dim: usize, seed: u64) -> Self {
        let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
        let [f1, f2] = FANOUTS;
        let (n1, n2) = (4usize, 3usize);
        let rows_per_target = 1 + n1 + n1 * n2 + 1;
        let n = targets * rows_per_target;
        let mut s = Self {
            features: (0..n * dim)
                .map(|_| f32::from(rng.random::<bool>()))
                .collect(),
            target_row: Vec::new(),
            hop1_count: vec![0; targets],
            hop1_rows: vec![-1; targets * f1],
            hop2_count: vec![0; targets * f1],
            hop2_rows: vec![-1; targets * f1 * f2],
        };
        for t in 0..targets {
            let base = (t * rows_per_target) as i32;
            s.target_row.push(base);
            s.hop1_count[t] = n1 as i32;
            for j in 0..n1 {
                s.hop1_rows[t * f1 + j] = base + 1 + j as i32;
                s.hop2_count[t * f1 + j] = n2 as i32;
                for k in 0..n2 {
                    s.hop2_rows[(t * f1 + j) * f2 + k] = base + 1 + (n1 + j * n2 + k) as i32;
                }
            }
        }
        s
    }

    fn byte_len(&self) -> usize {
        4 * (self.features.len()
            + self.target_row.len()
            + self.hop1_count.len()
            + self.hop1_rows.len()
            + self.hop2_count.len()
            + self.hop2_rows.len())
    }
}

/// The six buffers of [`Inputs`] laid out in one mapping, each 64-byte
/// aligned (as a response's Arrow buffers are).
struct Mapped {
    map: memmap2::MmapMut,
    offsets: [usize; 6],
    lens: [usize; 6],
}

impl Mapped {
    fn new(inputs: &Inputs) -> anyhow::Result<Self> {
        let lens = [
            inputs.features.len(),
            inputs.target_row.len(),
            inputs.hop1_count.len(),
            inputs.hop1_rows.len(),
            inputs.hop2_count.len(),
            inputs.hop2_rows.len(),
        ];
        let mut offsets = [0; 6];
        let mut at = 0;
        for (i, len) in lens.iter().enumerate() {
            offsets[i] = at;
            at = (at + len * 4).div_ceil(64) * 64;
        }
        let file = tempfile::tempfile_in("/dev/shm").context("a file in /dev/shm")?;
        file.set_len(at.max(inputs.byte_len()) as u64)?;
        // SAFETY: the file is this process's own, unlinked temp file: no
        // other process can truncate or write it while it is mapped.
        let map = unsafe { memmap2::MmapMut::map_mut(&file) }?;
        let mut mapped = Self { map, offsets, lens };
        let bytes = Mapped::with_layout(&mapped, inputs);
        mapped.map.copy_from_slice(&bytes);
        Ok(mapped)
    }

    fn f32s(&self, i: usize) -> &[f32] {
        let bytes = &self.map[self.offsets[i]..self.offsets[i] + self.lens[i] * 4];
        // Offsets are 64-byte aligned in a page-aligned mapping.
        bytemuck_cast(bytes)
    }

    fn i32s(&self, i: usize) -> &[i32] {
        let bytes = &self.map[self.offsets[i]..self.offsets[i] + self.lens[i] * 4];
        bytemuck_cast(bytes)
    }

    fn slices(&self, dim: usize) -> InputSlices<'_> {
        InputSlices {
            features: self.f32s(0),
            feature_dim: dim,
            target_row: self.i32s(1),
            hop1_count: self.i32s(2),
            hop1_rows: self.i32s(3),
            hop2_count: self.i32s(4),
            hop2_rows: self.i32s(5),
            fanouts: FANOUTS,
            hop1_h1: &[],
        }
    }
}

/// `bytes` as 4-byte values; `bytes` is 4-byte aligned and a multiple of 4
/// long (checked).
fn bytemuck_cast<T: Copy>(bytes: &[u8]) -> &[T] {
    assert_eq!(std::mem::size_of::<T>(), 4);
    assert_eq!(bytes.as_ptr().align_offset(4), 0);
    assert_eq!(bytes.len() % 4, 0);
    // SAFETY: T is a 4-byte plain value type (f32 or i32, every bit
    // pattern valid), the pointer is 4-byte aligned and the length a
    // multiple of 4 (asserted); the result borrows `bytes`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / 4) }
}

fn heap_slices(inputs: &Inputs, dim: usize) -> InputSlices<'_> {
    InputSlices {
        features: &inputs.features,
        feature_dim: dim,
        target_row: &inputs.target_row,
        hop1_count: &inputs.hop1_count,
        hop1_rows: &inputs.hop1_rows,
        hop2_count: &inputs.hop2_count,
        hop2_rows: &inputs.hop2_rows,
        fanouts: FANOUTS,
        hop1_h1: &[],
    }
}

const WAYS: [&str; 6] = [
    "alone",
    "shared-memory",
    "written-by-peer",
    "caches-evicted",
    "woken-thread",
    "two-sessions",
];

#[derive(Debug, Serialize)]
struct Way {
    way: &'static str,
    run: Summary,
    /// Mean run time over `alone`'s.
    ratio_to_alone: f64,
}

#[derive(Debug, Serialize)]
struct Results {
    model: String,
    targets: usize,
    rows: usize,
    runs: usize,
    ways: Vec<Way>,
}

/// Times `run`, in nanoseconds.
fn timed(run: impl FnOnce() -> anyhow::Result<()>) -> anyhow::Result<u64> {
    let t = Instant::now();
    run()?;
    Ok((t.elapsed().as_nanos() as u64).max(1))
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    let env = gnn_worker::onnxruntime::init(Some(&tests::stack::onnxruntime_lib()))?;
    let model_dir = args
        .model
        .clone()
        .unwrap_or_else(|| tests::stack::trained_model("cora"));
    let load = || Model::load(&env, &model_dir, Device::Cpu, 1).context("loading the model");
    let mut model = load()?;
    let dim = model.manifest().feature_dim as usize;
    let inputs = Inputs::new(args.targets, dim, 1);
    let other = Inputs::new(args.targets, dim, 2);
    let rows = inputs.target_row.len() * 18;
    let mut mapped = Mapped::new(&inputs)?;
    let mut evict = vec![0u8; 8 << 20];

    // The executor threads woken for a run (woken-thread, two-sessions).
    type Job = mpsc::SyncSender<anyhow::Result<u64>>;
    let mut executors = Vec::new();
    for _ in 0..2 {
        let (tx, rx) = mpsc::sync_channel::<Job>(0);
        let mut session = load()?;
        let inputs = inputs.clone();
        std::thread::spawn(move || {
            while let Ok(reply) = rx.recv() {
                let ran = timed(|| {
                    session.run_slices(&heap_slices(&inputs, dim))?;
                    Ok(())
                });
                let _ = reply.send(ran);
            }
        });
        executors.push(tx);
    }
    let mut histograms: Vec<_> = WAYS.iter().map(|_| histogram()).collect();
    // Warm every way up, then measure them in turn.
    for k in 0..args.runs + 50 {
        for (w, way) in WAYS.iter().enumerate() {
            let ns = match *way {
                "alone" => timed(|| {
                    model.run_slices(&heap_slices(&inputs, dim))?;
                    Ok(())
                })?,
                "shared-memory" => timed(|| {
                    model.run_slices(&mapped.slices(dim))?;
                    Ok(())
                })?,
                "written-by-peer" => {
                    // Another thread writes this run's inputs (alternately
                    // the two sets, so each write changes every byte).
                    let source = if k % 2 == 0 { &other } else { &inputs };
                    let written = Mapped::with_layout(&mapped, source);
                    let map = &mut mapped.map[..];
                    std::thread::scope(|scope| {
                        scope.spawn(|| map.copy_from_slice(&written));
                    });
                    timed(|| {
                        model.run_slices(&mapped.slices(dim))?;
                        Ok(())
                    })?
                }
                "caches-evicted" => {
                    for byte in evict.iter_mut().step_by(64) {
                        *byte = byte.wrapping_add(1);
                    }
                    std::hint::black_box(&evict);
                    timed(|| {
                        model.run_slices(&heap_slices(&inputs, dim))?;
                        Ok(())
                    })?
                }
                "woken-thread" | "two-sessions" => {
                    let executor = if *way == "two-sessions" { k % 2 } else { 0 };
                    let (reply, answer) = mpsc::sync_channel(1);
                    executors[executor].send(reply)?;
                    answer.recv()??
                }
                _ => unreachable!(),
            };
            if k >= 50 {
                let _ = histograms[w].record(ns);
            }
        }
    }
    let summaries: Vec<Summary> = histograms
        .iter()
        .map(|h| Summary::of(h, 0, 0.0, None).scaled(1000.0))
        .collect();
    let alone = summaries[0].mean_us.max(f64::MIN_POSITIVE);
    let ways: Vec<Way> = WAYS
        .iter()
        .zip(summaries)
        .map(|(way, run)| Way {
            way,
            ratio_to_alone: run.mean_us / alone,
            run,
        })
        .collect();
    println!(
        "model {} , {} targets, {} rows of {dim}, {} runs per way (microseconds)",
        model_dir.display(),
        args.targets,
        rows,
        args.runs
    );
    println!(
        "{:<16} {:>8} {:>8} {:>8} {:>14}",
        "way", "p50", "p99", "mean", "mean / alone"
    );
    for way in &ways {
        println!(
            "{:<16} {:>8.1} {:>8.1} {:>8.1} {:>13.2}x",
            way.way, way.run.p50_us, way.run.p99_us, way.run.mean_us, way.ratio_to_alone
        );
    }
    if let Some(out) = &args.out {
        let results = Results {
            model: model_dir.display().to_string(),
            targets: args.targets,
            rows,
            runs: args.runs,
            ways,
        };
        let mut file = std::fs::File::create(out)?;
        serde_json::to_writer_pretty(&mut file, &results)?;
        file.write_all(b"\n")?;
    }
    Ok(())
}

impl Mapped {
    /// The bytes of a mapping laid out like `like`'s holding `inputs`.
    fn with_layout(like: &Mapped, inputs: &Inputs) -> Vec<u8> {
        let mut bytes = vec![0u8; like.map.len()];
        let f32s: Vec<u8> = inputs
            .features
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        bytes[like.offsets[0]..like.offsets[0] + f32s.len()].copy_from_slice(&f32s);
        let i32s = [
            &inputs.target_row,
            &inputs.hop1_count,
            &inputs.hop1_rows,
            &inputs.hop2_count,
            &inputs.hop2_rows,
        ];
        for (i, values) in i32s.iter().enumerate() {
            let b: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
            bytes[like.offsets[i + 1]..like.offsets[i + 1] + b.len()].copy_from_slice(&b);
        }
        bytes
    }
}
