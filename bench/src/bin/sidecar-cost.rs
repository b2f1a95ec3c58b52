//! The sidecar's work per target against the gather floor (issue 48, item
//! 3), measured side by side in one run.
//!
//! A seeded R-MAT graph (by default the end-to-end benchmark's rmat-1m: 1M
//! nodes, 50M edges, a super node, D = 128; kept in `--work` between runs)
//! is imported and served by a real `sidecar serve` with every row in L1
//! and `--ring-spin-us 0` (its CPU is then its work and its wake-ups, no
//! spinning). This process calls it over the ring from one thread, a
//! request of T uniformly drawn targets at a time, in the dense layout at
//! the sidecar's fanouts (20, 10), and for each T reports:
//! - the sidecar's time per request: the response header's `server_ns`,
//!   from taking the request to publishing the answer (sampling, dedup, the
//!   fetch's lookups and copies, writing the response), p50 and p99;
//! - the sidecar process's CPU per request, every thread
//!   (`/proc/<pid>/task/*/schedstat`);
//! - the gather floor: the same response's rows copied in this process
//!   from the dataset's feature matrix in RAM (`features.f32`), p50, right
//!   after each call;
//! - the ratios, per target.
//!
//! With `--perf <dir>`, `perf record -g` samples the sidecar during each
//! T's calls (`<dir>/perf-t<T>.data`) for `perf report`. With `--baseline
//! <dir>`, another build's `sidecar` is measured in the same run on the
//! same import, the two taking `--rounds` turns each.
//!
//! Run: `scripts/bench-sidecar-cost.sh` (`--quick`: 100k nodes, 5M
//! edges). Goal (printed, not asserted): the sidecar's CPU per target at 8
//! targets at most 1.5x the gather floor's.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use clap::Parser;
use hdrhistogram::Histogram;
use protocol::{CallRequest, ClientOptions, RingClient};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use sidecar::graph::dataset::INDEX_FILE;
use tests::stack::{free_port, workspace_bin};

#[derive(Debug, Parser)]
struct Args {
    /// Where the dataset and its import are kept between runs.
    #[arg(long, default_value = "target/sidecar-cost")]
    work: PathBuf,
    /// 100k nodes and 5M edges instead of 1M and 50M.
    #[arg(long)]
    quick: bool,
    /// Targets per request, one measurement each.
    #[arg(long, value_delimiter = ',', default_value = "1,8,64")]
    targets: Vec<usize>,
    /// Requests measured per setting (after a tenth as many unmeasured).
    #[arg(long, default_value_t = 4000)]
    calls: usize,
    /// Record the sidecar with `perf record -g` into this folder.
    #[arg(long)]
    perf: Option<PathBuf>,
    /// Another build's binaries (its `sidecar`), measured in the same run
    /// on the same import, the builds taking turns.
    #[arg(long)]
    baseline: Option<PathBuf>,
    /// Turns each build takes (with --baseline).
    #[arg(long, default_value_t = 2)]
    rounds: usize,
}

fn run(command: &mut Command, what: &str) -> anyhow::Result<()> {
    let status = command
        .status()
        .with_context(|| format!("starting {what}"))?;
    ensure!(status.success(), "{what} failed ({status})");
    Ok(())
}

/// The dataset and its import, made once per size.
fn prepare(args: &Args) -> anyhow::Result<(PathBuf, PathBuf, u64)> {
    let (nodes, edges): (u64, u64) = if args.quick {
        (100_000, 5_000_000)
    } else {
        (1_000_000, 50_000_000)
    };
    let dataset = args.work.join(format!("rmat-n{nodes}-e{edges}"));
    let data = args.work.join(format!("rmat-n{nodes}-e{edges}-data"));
    let sidecar = workspace_bin("sidecar");
    if !dataset.join("meta.json").exists() {
        let _ = std::fs::remove_dir_all(&dataset);
        run(
            Command::new(&sidecar)
                .arg("generate")
                .arg("--out")
                .arg(&dataset)
                .args(["--nodes", &nodes.to_string(), "--edges", &edges.to_string()])
                .args(["--super-nodes", "1", "--super-degree"])
                .arg((nodes - 1).to_string())
                .args(["--feature-dim", "128"]),
            "sidecar generate",
        )?;
    }
    if !(data.join(INDEX_FILE).exists() && data.join("features.json").exists()) {
        let _ = std::fs::remove_dir_all(&data);
        run(
            Command::new(&sidecar)
                .arg("import")
                .arg(&dataset)
                .arg("--data-dir")
                .arg(&data)
                .stdout(Stdio::null()),
            "sidecar import",
        )?;
    }
    Ok((dataset, data, nodes))
}

/// A running `sidecar serve`, killed on drop.
struct Sidecar(Child);

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// CPU the process `pid` has spent, every thread, in nanoseconds.
fn process_cpu_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("schedstat")).ok())
        .filter_map(|s| s.split_whitespace().next()?.parse::<u64>().ok())
        .sum()
}

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000_000, 3).expect("bounds")
}

/// One setting's figures, in microseconds.
struct Figures {
    targets: usize,
    rows: f64,
    server_p50: f64,
    server_p99: f64,
    cpu: f64,
    gather_p50: f64,
}

fn measure(
    client: &RingClient,
    features: &[f32],
    dim: usize,
    nodes: u64,
    targets: usize,
    args: &Args,
    pid: u32,
) -> anyhow::Result<Figures> {
    let mut rng = SmallRng::seed_from_u64(targets as u64);
    let mut ids = vec![0u64; targets];
    let mut gathered: Vec<f32> = Vec::new();
    let (mut server, mut gather) = (histogram(), histogram());
    let mut rows = 0u64;
    let mut call = |record: bool| -> anyhow::Result<()> {
        ids.iter_mut()
            .for_each(|id| *id = rng.random_range(0..nodes));
        let mut request = CallRequest::new(&ids);
        request.timeout = Some(Duration::from_secs(5));
        let response = client.call(&request)?;
        let tables = response.tables()?;
        let t = Instant::now();
        gathered.clear();
        for &node in tables.node_ids() {
            let start = node as usize * dim;
            gathered.extend_from_slice(&features[start..start + dim]);
        }
        let gather_ns = t.elapsed().as_nanos() as u64;
        std::hint::black_box(&gathered);
        if record {
            server.record(response.header().server_ns.max(1))?;
            gather.record(gather_ns.max(1))?;
            rows += tables.n_nodes() as u64;
        }
        Ok(())
    };
    for _ in 0..args.calls / 10 {
        call(false)?;
    }
    let perf = match &args.perf {
        None => None,
        Some(dir) => {
            std::fs::create_dir_all(dir)?;
            let out = dir.join(format!("perf-t{targets}.data"));
            let child = Command::new("perf")
                .args(["record", "-F", "999", "-g", "-p", &pid.to_string(), "-o"])
                .arg(&out)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .context("starting perf record")?;
            std::thread::sleep(Duration::from_millis(300));
            Some(child)
        }
    };
    let cpu_before = process_cpu_ns(pid);
    for _ in 0..args.calls {
        call(true)?;
    }
    let cpu = process_cpu_ns(pid) - cpu_before;
    if let Some(child) = perf {
        // perf record writes its file on SIGINT.
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(child.id() as i32),
            nix::sys::signal::Signal::SIGINT,
        )?;
        child.wait_with_output()?;
    }
    let n = args.calls as f64;
    Ok(Figures {
        targets,
        rows: rows as f64 / n,
        server_p50: server.value_at_quantile(0.5) as f64 / 1e3,
        server_p99: server.value_at_quantile(0.99) as f64 / 1e3,
        cpu: cpu as f64 / n / 1e3,
        gather_p50: gather.value_at_quantile(0.5) as f64 / 1e3,
    })
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    std::fs::create_dir_all(&args.work)?;
    let (dataset, data, nodes) = prepare(&args)?;
    let dim = 128;
    let bytes = std::fs::read(dataset.join("features.f32"))?;
    let features: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .collect();
    drop(bytes);
    let max_targets = args.targets.iter().copied().max().unwrap_or(64).max(1);
    let mut builds = vec![("this build", workspace_bin("sidecar"))];
    if let Some(dir) = &args.baseline {
        builds.push(("baseline", dir.join("sidecar")));
    }
    let rounds = if builds.len() > 1 {
        args.rounds.max(1)
    } else {
        1
    };
    println!(
        "sidecar-cost: {} ({nodes} nodes), every row in L1, dense layout at [20, 10], \
         {} requests a setting, one caller thread{}",
        dataset.display(),
        args.calls,
        if builds.len() > 1 {
            format!(
                "; this build and {} take {rounds} turns each",
                builds[1].1.display()
            )
        } else {
            String::new()
        }
    );
    println!();
    println!(
        "| build | targets | rows a request | sidecar time p50 | p99 | sidecar CPU a request | \
         gather floor p50 | CPU a target | floor a target | CPU / floor |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut goal = None;
    for round in 0..rounds {
        for k in 0..builds.len() {
            // The builds alternate which goes first from one round to the next.
            let (name, bin) = &builds[(k + round) % builds.len()];
            let (sidecar, client, _dir) = start(bin, &data, nodes, dim, max_targets)?;
            for &t in &args.targets {
                let f = measure(&client, &features, dim, nodes, t, &args, sidecar.0.id())?;
                let ratio = f.cpu / f.gather_p50;
                println!(
                    "| {name} | {} | {:.0} | {:.1} us | {:.1} us | {:.1} us | {:.1} us | {:.2} us | \
                     {:.2} us | {:.2}x |",
                    f.targets,
                    f.rows,
                    f.server_p50,
                    f.server_p99,
                    f.cpu,
                    f.gather_p50,
                    f.cpu / t as f64,
                    f.gather_p50 / t as f64,
                    ratio
                );
                if t == 8 && *name == "this build" {
                    goal = Some(ratio);
                }
            }
            drop(client);
            drop(sidecar);
        }
    }
    println!();
    if let Some(ratio) = goal {
        println!(
            "goal: sidecar CPU per target at 8 targets <= 1.5x the gather floor's: {ratio:.2}x \
             (this build, last turn), {}",
            if ratio <= 1.5 { "met" } else { "missed" }
        );
    }
    Ok(())
}

/// A `sidecar serve` of `data` by `bin`, every row pinned, and a client
/// attached to its ring.
fn start(
    bin: &std::path::Path,
    data: &std::path::Path,
    nodes: u64,
    dim: usize,
    max_targets: usize,
) -> anyhow::Result<(Sidecar, RingClient, tempfile::TempDir)> {
    let shm = tests::unique_name("cost");
    let dir = tempfile::tempdir()?;
    let l1_mib = ((nodes * dim as u64 * 4) >> 20) + 64;
    let child = Command::new(bin)
        .arg("serve")
        .arg("--data-dir")
        .arg(data)
        .args(["--shm-name", &shm, "--admin-socket"])
        .arg(dir.path().join("admin.sock"))
        .args(["--fanouts", "20,10", "--max-fanouts", "50,50"])
        .args(["--max-targets", &max_targets.to_string()])
        .args(["--response-mib", "32", "--slots", "8"])
        .args([
            "--warm-up",
            &nodes.to_string(),
            "--l1-mib",
            &l1_mib.to_string(),
        ])
        .args(["--ring-spin-us", "0", "--log-level", "warn"])
        .args(["--metrics-addr", &format!("127.0.0.1:{}", free_port())])
        .spawn()
        .with_context(|| format!("starting {} serve", bin.display()))?;
    let sidecar = Sidecar(child);
    let started = Instant::now();
    let client = loop {
        match RingClient::attach(&shm, ClientOptions::default()) {
            Ok(client) => break client,
            Err(_) if started.elapsed() < Duration::from_secs(300) => {
                std::thread::sleep(Duration::from_millis(200))
            }
            Err(e) => return Err(e).context("attaching to the sidecar's ring"),
        }
    };
    // The warm-up pins every row before the ring opens; give it a moment
    // to settle its threads.
    std::thread::sleep(Duration::from_millis(500));
    Ok((sidecar, client, dir))
}
