//! A ring server for tests and the benchmark: creates a segment and answers
//! every request with the synthetic neighbourhood of `tests::answer_synthetic`,
//! on several threads. Prints `READY <epoch>` once the segment exists; stops
//! cleanly (unlinking the segment) when its stdin closes.
#![forbid(unsafe_code)]

use std::io::Read;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{mpsc, Arc, Mutex};
use std::time::Duration;

use clap::Parser;
use protocol::layout::{dtype, FeatureSchema};
use protocol::{RingServer, SegmentConfig, ServerOptions, WaitPolicy};

#[derive(Debug, Parser)]
struct Args {
    #[arg(long)]
    name: String,
    #[arg(long, default_value_t = 16)]
    dim: u32,
    #[arg(long, default_value_t = 16)]
    slots: u32,
    #[arg(long, default_value_t = 64)]
    max_targets: u32,
    #[arg(long, default_value_t = 4 << 20)]
    response_bytes: u64,
    /// Threads answering requests (the dispatcher hands tickets to them).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Microseconds to spin before parking while idle (0 = park at once).
    #[arg(long, default_value_t = 50)]
    spin_us: u64,
    /// Answer on the dispatcher thread itself (lowest latency, one at a time).
    #[arg(long)]
    inline: bool,
    /// Every node has exactly `fanout` neighbours (no padding).
    #[arg(long)]
    full: bool,
    #[arg(long, default_value_t = 500)]
    client_timeout_ms: u64,
    #[arg(long, default_value_t = 500)]
    stale_after_ms: u64,
    #[arg(long, default_value_t = 20)]
    fanout1: u32,
    #[arg(long, default_value_t = 10)]
    fanout2: u32,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let schema = FeatureSchema {
        feature_dim: args.dim,
        dtype: dtype::F32,
        graph_version: 7,
        default_fanouts: [args.fanout1, args.fanout2],
    };
    let mut segment = SegmentConfig::new(&args.name, schema);
    segment.slot_count = args.slots;
    segment.max_targets = args.max_targets;
    segment.response_bytes = args.response_bytes;
    segment.stale_after = Duration::from_millis(args.stale_after_ms);
    let mut options = ServerOptions::new(segment);
    options.client_timeout = Duration::from_millis(args.client_timeout_ms);
    options.wait = WaitPolicy {
        spin_for: Duration::from_micros(args.spin_us),
        max_park: Duration::from_millis(100),
    };
    let server = Arc::new(RingServer::create(options)?);
    println!("READY {:#x}", server.segment().epoch());

    let stop = Arc::new(AtomicBool::new(false));
    {
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
            stop.store(true, Ordering::Release);
        });
    }

    let (tx, rx) = mpsc::channel();
    let rx = Arc::new(Mutex::new(rx));
    let workers: Vec<_> = (0..args.threads)
        .map(|_| {
            let rx = rx.clone();
            let (dim, full) = (args.dim, args.full);
            std::thread::spawn(move || loop {
                let ticket = match rx.lock().expect("not poisoned").recv() {
                    Ok(ticket) => ticket,
                    Err(_) => return,
                };
                tests::answer_synthetic(ticket, dim, full);
            })
        })
        .collect();

    let mut batch = Vec::new();
    while !stop.load(Ordering::Acquire) {
        server.next_batch(&mut batch, Duration::from_millis(100));
        for ticket in batch.drain(..) {
            if args.inline {
                tests::answer_synthetic(ticket, args.dim, args.full);
            } else {
                tx.send(ticket)?;
            }
        }
    }
    drop(tx);
    for worker in workers {
        let _ = worker.join();
    }
    match Arc::try_unwrap(server) {
        Ok(server) => server.shutdown(),
        Err(_) => anyhow::bail!("server still shared at shutdown"),
    }
    Ok(())
}
