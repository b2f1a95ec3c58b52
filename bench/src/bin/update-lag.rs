//! `update-lag`: how fast a sidecar applies the update stream while it
//! serves, and how stale it gets (docs/updates.md, "Staleness").
//!
//! The whole stack (cora's features in Redis, the sidecar following
//! `gnn:updates`, the worker) under open-loop HTTP load at a fraction of its
//! measured saturation; meanwhile a producer appends one-edge `add_edges`
//! entries between new nodes (the served neighbourhoods stay as they were)
//! at each rate in turn (pipelined `XADD`, in 10 ms ticks). Per
//! rate: the entries applied per second, the apply lag p50/p99 (the
//! sidecar's `sidecar_update_apply_lag_seconds`: from an entry's id time to
//! its change being visible), and the serving latency and errors. Then the
//! apply rate: a burst appended as fast as the producer can, timed until the
//! sidecar has applied it. Run through `scripts/bench-updates.sh`.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::ensure;
use bench::load;
use bench::redis_stack::RedisStack;
use clap::Parser;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use tests::stack::{http_request, metric_value};

#[derive(Debug, Parser)]
#[command(about = "Update-stream apply rate and lag while serving")]
struct Args {
    /// Update rates to run, entries per second.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000,50000")]
    rates: Vec<f64>,
    /// Seconds per rate.
    #[arg(long, default_value_t = 20)]
    seconds: u64,
    /// Fraction of the measured saturation rate served meanwhile.
    #[arg(long, default_value_t = 0.5)]
    fraction: f64,
    /// Entries of the burst that measures the apply rate.
    #[arg(long, default_value_t = 200_000)]
    burst: u64,
    /// Where the report goes (report.json, report.md).
    #[arg(long, default_value = "bench/results/updates")]
    out: PathBuf,
}

#[derive(Debug, Serialize)]
struct Phase {
    offered_per_s: f64,
    appended: u64,
    applied_per_s: f64,
    lag_p50_s: f64,
    lag_p99_s: f64,
    /// `sidecar_update_lag_seconds` at the end of the phase.
    lag_at_end_s: f64,
    serving_per_s: f64,
    serving_p50_ms: f64,
    serving_p99_ms: f64,
    serving_errors: u64,
}

#[derive(Debug, Serialize)]
struct Report {
    command: String,
    cores: usize,
    saturation_per_s: f64,
    serving_rate_per_s: f64,
    phases: Vec<Phase>,
    burst_entries: u64,
    burst_applied_per_s: f64,
}

/// Appends entries over one TCP connection: inline `XADD`s written in
/// bulk, the replies drained by a second thread.
struct Producer {
    stream: TcpStream,
    replies: std::thread::JoinHandle<u64>,
    rng: rand::rngs::SmallRng,
    sent: u64,
}

impl Producer {
    fn connect(port: u16) -> anyhow::Result<Self> {
        let stream = TcpStream::connect(("127.0.0.1", port))?;
        stream.set_nodelay(true)?;
        let mut reader = stream.try_clone()?;
        let replies = std::thread::spawn(move || {
            let mut buf = vec![0u8; 1 << 16];
            let mut newlines = 0u64;
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 {
                    break;
                }
                newlines += buf[..n].iter().filter(|&&b| b == b'\n').count() as u64;
            }
            newlines
        });
        Ok(Self {
            stream,
            replies,
            rng: rand::rngs::SmallRng::seed_from_u64(5),
            sent: 0,
        })
    }

    /// Appends `n` one-edge entries between new nodes (ids from 2708 on,
    /// 100 000 of them): every entry changes the graph, but no call's
    /// neighbourhood, so the serving load stays what it was measured as (a
    /// graph getting denser under the served nodes would make every call
    /// dearer and confound the two).
    fn append(&mut self, n: u64) -> anyhow::Result<()> {
        let mut out = String::with_capacity(n as usize * 48);
        for _ in 0..n {
            let (a, b) = (
                2708 + self.rng.random_range(0..100_000u32),
                2708 + self.rng.random_range(0..100_000u32),
            );
            out.push_str(&format!(
                "XADD gnn:updates * op add_edges edges \"{a} {b}\"\r\n"
            ));
        }
        self.stream.write_all(out.as_bytes())?;
        self.sent += n;
        Ok(())
    }

    /// Appends at `rate` entries/s for `duration`, in 10 ms ticks.
    fn at_rate(&mut self, rate: f64, duration: Duration) -> anyhow::Result<u64> {
        let started = Instant::now();
        let mut done = 0u64;
        while started.elapsed() < duration {
            let due = (started.elapsed().as_secs_f64() * rate) as u64;
            if due > done {
                self.append(due - done)?;
                done = due;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        Ok(done)
    }

    fn close(self) -> u64 {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
        self.replies.join().unwrap_or(0)
    }
}

/// The apply-lag histogram's cumulative bucket counts: (le, count).
fn lag_buckets(metrics: &str) -> Vec<(f64, f64)> {
    let (_, body) = http_request(metrics, "GET", "/metrics", None).expect("GET /metrics");
    body.lines()
        .filter_map(|line| {
            let rest = line.strip_prefix("sidecar_update_apply_lag_seconds_bucket{le=\"")?;
            let (le, rest) = rest.split_once("\"}")?;
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().ok()?
            };
            Some((le, rest.trim().parse().ok()?))
        })
        .collect()
}

/// The `q` quantile of the observations between two bucket snapshots: the
/// upper bound of the bucket it falls in.
fn quantile(before: &[(f64, f64)], after: &[(f64, f64)], q: f64) -> f64 {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .zip(before)
        .map(|((le, a), (_, b))| (*le, a - b))
        .collect();
    let total = counts.last().map_or(0.0, |(_, c)| *c);
    if total == 0.0 {
        return 0.0;
    }
    counts
        .iter()
        .find(|(_, c)| *c >= q * total)
        .map_or(f64::INFINITY, |(le, _)| *le)
}

fn applied(metrics: &str) -> f64 {
    metric_value(metrics, "sidecar_updates_applied_total{op=\"add_edges\"}")
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    ensure!(
        args.fraction > 0.0 && args.fraction <= 1.0,
        "--fraction must be in (0, 1]"
    );
    let runtime = tokio::runtime::Runtime::new()?;
    let running = RedisStack::start("cora", &["--updates-stream", "gnn:updates"])?;
    let (metrics, redis) = (&running.metrics, &running.redis);
    let caller = running.one_node_caller(2708);
    let saturation = runtime
        .block_on(load::closed(caller.clone(), 16, Duration::from_secs(10)))
        .throughput;
    let serving_rate = saturation * args.fraction;
    eprintln!("update-lag: saturation about {saturation:.0} calls/s; serving {serving_rate:.0} calls/s meanwhile");

    let mut producer = Producer::connect(redis.port)?;
    let mut phases = Vec::new();
    for &rate in &args.rates {
        let before = lag_buckets(metrics);
        let applied_before = applied(metrics);
        let duration = Duration::from_secs(args.seconds);
        let serving = {
            let caller = caller.clone();
            runtime.spawn(load::open(
                caller,
                serving_rate,
                duration,
                Duration::from_secs(5),
            ))
        };
        let started = Instant::now();
        let appended = producer.at_rate(rate, duration)?;
        let lag_at_end = metric_value(metrics, "sidecar_update_lag_seconds");
        let applied_now = applied(metrics);
        let elapsed = started.elapsed().as_secs_f64();
        let served = runtime.block_on(serving)?;
        // Let the follower finish this phase's entries before the next.
        let until = Instant::now() + Duration::from_secs(120);
        while applied(metrics) < producer.sent as f64 && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(50));
        }
        let after = lag_buckets(metrics);
        let phase = Phase {
            offered_per_s: rate,
            appended,
            applied_per_s: (applied_now - applied_before) / elapsed,
            lag_p50_s: quantile(&before, &after, 0.5),
            lag_p99_s: quantile(&before, &after, 0.99),
            lag_at_end_s: lag_at_end,
            serving_per_s: served.throughput,
            serving_p50_ms: served.p50_us / 1e3,
            serving_p99_ms: served.p99_us / 1e3,
            serving_errors: served.errors,
        };
        eprintln!("update-lag: {phase:?}");
        phases.push(phase);
    }

    // The apply rate: a burst appended at once, timed until applied.
    let applied_before = applied(metrics);
    let started = Instant::now();
    let mut left = args.burst;
    while left > 0 {
        let n = left.min(10_000);
        producer.append(n)?;
        left -= n;
    }
    let target = applied_before + args.burst as f64;
    let until = Instant::now() + Duration::from_secs(300);
    while applied(metrics) < target {
        ensure!(
            Instant::now() < until,
            "the burst was not applied within 5 minutes"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let burst_rate = args.burst as f64 / started.elapsed().as_secs_f64();
    let replies = producer.close();
    eprintln!(
        "update-lag: burst of {} applied at {burst_rate:.0} entries/s ({replies} replies)",
        args.burst
    );
    let clean = running.stack.stop();
    ensure!(clean, "the stack did not stop cleanly");

    let report = Report {
        command: std::env::args().collect::<Vec<_>>().join(" "),
        cores: std::thread::available_parallelism().map_or(0, |n| n.get()),
        saturation_per_s: saturation,
        serving_rate_per_s: serving_rate,
        phases,
        burst_entries: args.burst,
        burst_applied_per_s: burst_rate,
    };
    let mut md = format!(
        "# Update stream: apply rate and lag while serving, cora, {} cores\n\n\
         Command: `{}`\n\n\
         Serving meanwhile: {:.0} calls/s ({:.0}% of about {:.0}), one node per call.\n\n\
         | updates offered/s | appended | applied/s | apply lag p50 | apply lag p99 | lag at end | served/s | serving p50 ms | serving p99 ms | serving errors |\n\
         |---|---|---|---|---|---|---|---|---|---|\n",
        report.cores,
        report.command,
        report.serving_rate_per_s,
        args.fraction * 100.0,
        report.saturation_per_s
    );
    for p in &report.phases {
        md.push_str(&format!(
            "| {:.0} | {} | {:.0} | ≤ {} s | ≤ {} s | {:.3} s | {:.0} | {:.2} | {:.2} | {} |\n",
            p.offered_per_s,
            p.appended,
            p.applied_per_s,
            p.lag_p50_s,
            p.lag_p99_s,
            p.lag_at_end_s,
            p.serving_per_s,
            p.serving_p50_ms,
            p.serving_p99_ms,
            p.serving_errors
        ));
    }
    md.push_str(&format!(
        "\nApply rate: a burst of {} entries applied at {:.0} entries/s while serving.\n\
         Lag percentiles are bucket upper bounds of `sidecar_update_apply_lag_seconds`.\n",
        report.burst_entries, report.burst_applied_per_s
    ));
    bench::report::write_files(&args.out, &report, &md)?;
    print!("{md}");
    Ok(())
}
