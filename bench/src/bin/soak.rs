//! `soak`: the whole stack (Redis, the sidecar with its features in Redis
//! and an L2 cache, the worker) under open-loop HTTP load at a fraction of
//! its measured saturation rate for many minutes, with graph updates and
//! invalidations in the background. Reports per minute: calls, errors,
//! latency percentiles, and the RSS of both daemons by kind (anonymous,
//! file, shared memory); then the RSS slopes over the second half.
//! Run through `scripts/soak.sh` (README, "Soak").

use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{ensure, Context};
use bench::load;
use bench::redis_stack::RedisStack;
use clap::Parser;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tests::stack::{dataset, metric_value};

#[derive(Debug, Parser)]
#[command(about = "Soak the whole stack at a fraction of its saturation rate")]
struct Args {
    /// Minutes of load.
    #[arg(long, default_value_t = 10)]
    minutes: u32,
    /// Fraction of the measured saturation rate to offer.
    #[arg(long, default_value_t = 0.8)]
    fraction: f64,
    /// A dataset of ../shared/data.
    #[arg(long, default_value = "cora")]
    dataset: String,
    /// Graph updates and invalidations per second in the background.
    #[arg(long, default_value_t = 5.0)]
    updates_per_s: f64,
    /// Distinct random edges the graph updates add, in turn, over and over:
    /// once all are in, adding one again is a duplicate the graph ignores,
    /// so the workload stops growing (a graph that keeps getting denser
    /// samples ever larger neighbourhoods, and memory follows). 0: a new
    /// random edge every time.
    #[arg(long, default_value_t = 150)]
    edge_pool: usize,
    /// The sidecar's `--l2-mib` (its default unless given). The L2 write
    /// buffer is an eighth of it, at most 64 MiB: a smaller L2 flushes its
    /// memtables within minutes, so a soak sees several fill-and-flush
    /// cycles.
    #[arg(long)]
    l2_mib: Option<u64>,
    /// Where the report goes (report.json, report.md).
    #[arg(long, default_value = "bench/results/soak")]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Minute {
    minute: u32,
    offered_per_s: f64,
    answered_per_s: f64,
    calls: u64,
    errors: u64,
    p50_ms: f64,
    p99_ms: f64,
    p999_ms: f64,
    max_ms: f64,
    sidecar_rss_mib: Rss,
    worker_rss_mib: Rss,
    ring_used_slots: f64,
    /// Node-table rows per request this minute: the sampled neighbourhood
    /// grows as added edges make the graph denser.
    rows_per_request: f64,
    graph_edges: f64,
    /// What RocksDB's memtables held at the end of the minute.
    l2_memtables_mib: f64,
    l2_block_cache_mib: f64,
    l1_mib: f64,
    updates: u64,
    update_errors: u64,
    first_error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    dataset: String,
    cores: usize,
    saturation_per_s: f64,
    rate_per_s: f64,
    minutes: Vec<Minute>,
    errors: u64,
    /// Least-squares slopes over the second half of the run, MiB per
    /// minute.
    sidecar_rss_slope_mib_per_min: f64,
    sidecar_anon_slope_mib_per_min: f64,
    /// The sidecar's anonymous memory less what RocksDB's memtables hold:
    /// those fill with write-backs up to the write buffer size, then flush.
    sidecar_anon_less_memtables_slope_mib_per_min: f64,
    worker_rss_slope_mib_per_min: f64,
    worker_anon_slope_mib_per_min: f64,
}

/// A line of `/proc/<pid>/status` (`VmRSS`, `RssAnon`, `RssFile`,
/// `RssShmem`: kB), in MiB.
fn status_mib(pid: u32, field: &str) -> f64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
                .and_then(|v| v.split_whitespace().next()?.parse::<f64>().ok())
        })
        .map_or(f64::NAN, |kib| kib / 1024.0)
}

/// Resident memory of one daemon, MiB: the total and its three kinds.
/// Shared memory is the ring segment's pages touched so far (bounded by
/// the segment's size); file pages are mapped files (the graph index,
/// libraries); anonymous pages are the process's own heap and stacks.
#[derive(Debug, Clone, Copy, Serialize)]
struct Rss {
    total: f64,
    anon: f64,
    file: f64,
    shmem: f64,
}

impl Rss {
    fn of(pid: u32) -> Self {
        Self {
            total: status_mib(pid, "VmRSS"),
            anon: status_mib(pid, "RssAnon"),
            file: status_mib(pid, "RssFile"),
            shmem: status_mib(pid, "RssShmem"),
        }
    }
}

/// Least-squares slope of `f` over the minutes, per minute.
fn slope_of(minutes: &[Minute], f: impl Fn(&Minute) -> f64) -> f64 {
    slope(&minutes.iter().map(f).collect::<Vec<_>>())
}

/// Least-squares slope of `ys` over their indices (per minute).
fn slope(ys: &[f64]) -> f64 {
    let n = ys.len() as f64;
    if ys.len() < 2 {
        return 0.0;
    }
    let mean_x = (n - 1.0) / 2.0;
    let mean_y = ys.iter().sum::<f64>() / n;
    let (mut num, mut den) = (0.0, 0.0);
    for (i, y) in ys.iter().enumerate() {
        let dx = i as f64 - mean_x;
        num += dx * (y - mean_y);
        den += dx * dx;
    }
    num / den
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(args.minutes >= 1, "--minutes must be at least 1");
    ensure!(
        args.fraction > 0.0 && args.fraction <= 1.0,
        "--fraction must be in (0, 1]"
    );
    let runtime = tokio::runtime::Runtime::new()?;

    // Redis holds the features; the sidecar caches them in L1 and L2.
    let l2_mib = args.l2_mib.map(|m| m.to_string());
    let mut sidecar_args = vec!["--invalidation-channel", "feat-invalidate"];
    if let Some(l2_mib) = &l2_mib {
        sidecar_args.extend(["--l2-mib", l2_mib]);
    }
    let running = RedisStack::start(&args.dataset, &sidecar_args)?;
    let (stack, metrics, redis) = (&running.stack, &running.metrics, &running.redis);
    let edge_dir = tempfile::tempdir()?;
    let sidecar_pid = stack.sidecar.as_ref().expect("sidecar").child.id();
    let worker_pid = stack.worker.as_ref().expect("worker").child.id();
    let meta: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        dataset(&args.dataset).join("meta.json"),
    )?)?;
    let n_nodes = meta["num_nodes"]
        .as_u64()
        .context("meta.json has no num_nodes")?;
    let caller = running.one_node_caller(n_nodes);

    // Saturation: a closed-loop estimate, then the highest open-loop rate
    // (80% to 100% of it) answered without errors at 95% of the offer.
    let estimate = runtime.block_on(load::closed(caller.clone(), 16, Duration::from_secs(10)));
    let mut saturation = estimate.throughput;
    for step in [1.0, 0.9, 0.8, 0.7, 0.6] {
        let rate = estimate.throughput * step;
        let s = runtime.block_on(load::open(
            caller.clone(),
            rate,
            Duration::from_secs(10),
            Duration::from_secs(5),
        ));
        saturation = rate;
        if s.errors == 0 && s.throughput >= 0.95 * rate {
            break;
        }
    }
    let rate = saturation * args.fraction;
    eprintln!(
        "soak: saturation about {saturation:.0} calls/s (closed-loop estimate {:.0}); \
         offering {rate:.0} calls/s for {} minutes",
        estimate.throughput, args.minutes
    );

    // Background: graph updates (new edges between random nodes, through
    // the admin socket) and invalidations (Redis pub/sub).
    let stop = Arc::new(AtomicBool::new(false));
    let updates = Arc::new(AtomicU64::new(0));
    let update_errors = Arc::new(AtomicU64::new(0));
    let background = {
        let (stop, updates, update_errors) = (stop.clone(), updates.clone(), update_errors.clone());
        let admin = stack.admin_socket.clone();
        let edge_file = edge_dir.path().join("edge.txt");
        let port = redis.port;
        let edge_pool = args.edge_pool;
        let period = Duration::from_secs_f64(1.0 / args.updates_per_s.max(0.1));
        std::thread::spawn(move || {
            let mut rng = rand::rngs::SmallRng::seed_from_u64(7);
            let mut pick = move || (rng.random_range(0..n_nodes), rng.random_range(0..n_nodes));
            let pool: Vec<(u64, u64)> = (0..edge_pool).map(|_| pick()).collect();
            let mut k = 0u64;
            while !stop.load(Ordering::Acquire) {
                let (a, b) = if k.is_multiple_of(2) && !pool.is_empty() {
                    pool[(k / 2) as usize % pool.len()]
                } else {
                    pick()
                };
                let ok = if k.is_multiple_of(2) {
                    std::fs::write(&edge_file, format!("{a} {b}\n")).is_ok()
                        && std::process::Command::new(tests::stack::workspace_bin("sidecarctl"))
                            .arg("--socket")
                            .arg(&admin)
                            .args(["graph", "add-edges", "--file"])
                            .arg(&edge_file)
                            .output()
                            .is_ok_and(|o| o.status.success())
                } else {
                    tests::redis::raw_command(
                        port,
                        None,
                        &format!("PUBLISH feat-invalidate {a},{b}"),
                    )
                    .is_ok()
                };
                updates.fetch_add(1, Ordering::Relaxed);
                if !ok {
                    update_errors.fetch_add(1, Ordering::Relaxed);
                }
                k += 1;
                std::thread::sleep(period);
            }
        })
    };

    let mut minutes = Vec::new();
    let started = Instant::now();
    let fetch_rows = || {
        (
            metric_value(metrics, "sidecar_neighbor_fetch_count_sum"),
            metric_value(metrics, "sidecar_neighbor_fetch_count_count"),
        )
    };
    for minute in 1..=args.minutes {
        let (u0, e0) = (
            updates.load(Ordering::Relaxed),
            update_errors.load(Ordering::Relaxed),
        );
        let (rows0, requests0) = fetch_rows();
        let s = runtime.block_on(load::open(
            caller.clone(),
            rate,
            Duration::from_secs(60),
            Duration::from_secs(5),
        ));
        let used = ["claimed", "submitted", "serving", "published", "abandoned"]
            .iter()
            .map(|state| metric_value(metrics, &format!("sidecar_ring_slots{{state=\"{state}\"}}")))
            .sum();
        let (rows1, requests1) = fetch_rows();
        let mib = |bytes: f64| bytes / (1024.0 * 1024.0);
        let m = Minute {
            minute,
            offered_per_s: rate,
            answered_per_s: s.throughput,
            calls: s.calls,
            errors: s.errors,
            p50_ms: s.p50_us / 1e3,
            p99_ms: s.p99_us / 1e3,
            p999_ms: s.p999_us / 1e3,
            max_ms: s.max_us / 1e3,
            sidecar_rss_mib: Rss::of(sidecar_pid),
            worker_rss_mib: Rss::of(worker_pid),
            ring_used_slots: used,
            rows_per_request: (rows1 - rows0) / (requests1 - requests0).max(1.0),
            graph_edges: metric_value(metrics, "sidecar_graph_edges"),
            l2_memtables_mib: mib(metric_value(
                metrics,
                "sidecar_l2_memory_bytes{part=\"memtables\"}",
            )),
            l2_block_cache_mib: mib(metric_value(
                metrics,
                "sidecar_l2_memory_bytes{part=\"block_cache\"}",
            )),
            l1_mib: mib(metric_value(metrics, "sidecar_l1_bytes")),
            updates: updates.load(Ordering::Relaxed) - u0,
            update_errors: update_errors.load(Ordering::Relaxed) - e0,
            first_error: s.first_error.clone(),
        };
        eprintln!(
            "soak: minute {minute}: {} calls, {} errors, p50 {:.2} ms, p99 {:.2} ms, sidecar \
             {:.0} MiB, worker {:.0} MiB, {} updates",
            m.calls,
            m.errors,
            m.p50_ms,
            m.p99_ms,
            m.sidecar_rss_mib.total,
            m.worker_rss_mib.total,
            m.updates
        );
        minutes.push(m);
    }
    stop.store(true, Ordering::Release);
    let _ = background.join();
    let clean = running.stack.stop();
    eprintln!(
        "soak: {:.1} minutes; clean shutdown: {clean}",
        started.elapsed().as_secs_f64() / 60.0
    );

    // The first minutes warm the caches and touch the ring's pages for the
    // first time: the slopes are over the second half of the run.
    let steady = &minutes[minutes.len() / 2..];
    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        dataset: args.dataset.clone(),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        saturation_per_s: saturation,
        rate_per_s: rate,
        errors: minutes.iter().map(|m| m.errors).sum(),
        sidecar_rss_slope_mib_per_min: slope_of(steady, |m| m.sidecar_rss_mib.total),
        sidecar_anon_slope_mib_per_min: slope_of(steady, |m| m.sidecar_rss_mib.anon),
        sidecar_anon_less_memtables_slope_mib_per_min: slope_of(steady, |m| {
            m.sidecar_rss_mib.anon - m.l2_memtables_mib
        }),
        worker_rss_slope_mib_per_min: slope_of(steady, |m| m.worker_rss_mib.total),
        worker_anon_slope_mib_per_min: slope_of(steady, |m| m.worker_rss_mib.anon),
        minutes,
    };
    let mut md = format!(
        "# Soak: {} at {:.0} calls/s ({:.0}% of about {:.0}), {} minutes, {} cores\n\n\
         Command: `{}`\n\n\
         RSS columns are MiB: total (anonymous / file / shared memory).\n\n\
         | minute | calls | errors | answered/s | p50 ms | p99 ms | p99.9 ms | max ms | sidecar RSS | worker RSS | used slots | updates | graph edges | rows/request | L2 memtables MiB | L2 block cache MiB | L1 MiB |\n\
         |---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n",
        report.dataset,
        report.rate_per_s,
        args.fraction * 100.0,
        report.saturation_per_s,
        report.minutes.len(),
        report.cores,
        report.command
    );
    let rss = |r: &Rss| {
        format!(
            "{:.1} ({:.1} / {:.1} / {:.1})",
            r.total, r.anon, r.file, r.shmem
        )
    };
    for m in &report.minutes {
        md.push_str(&format!(
            "| {} | {} | {} | {:.0} | {:.2} | {:.2} | {:.2} | {:.1} | {} | {} | {} | {} | {:.0} | {:.1} | {:.1} | {:.1} | {:.1} |\n",
            m.minute,
            m.calls,
            m.errors,
            m.answered_per_s,
            m.p50_ms,
            m.p99_ms,
            m.p999_ms,
            m.max_ms,
            rss(&m.sidecar_rss_mib),
            rss(&m.worker_rss_mib),
            m.ring_used_slots,
            m.updates,
            m.graph_edges,
            m.rows_per_request,
            m.l2_memtables_mib,
            m.l2_block_cache_mib,
            m.l1_mib
        ));
    }
    md.push_str(&format!(
        "\nErrors: {} (goal 0). Slopes over the second half of the run (goal: about 0), MiB/min: \
         sidecar RSS {:+.2}, anonymous {:+.2}, anonymous less the L2 memtables {:+.2}; \
         worker RSS {:+.2}, anonymous {:+.2}.\n",
        report.errors,
        report.sidecar_rss_slope_mib_per_min,
        report.sidecar_anon_slope_mib_per_min,
        report.sidecar_anon_less_memtables_slope_mib_per_min,
        report.worker_rss_slope_mib_per_min,
        report.worker_anon_slope_mib_per_min
    ));
    bench::report::write_files(&args.out, &report, &md)?;
    print!("{md}");
    ensure!(
        report.errors == 0,
        "{} calls failed during the soak",
        report.errors
    );
    Ok(())
}
