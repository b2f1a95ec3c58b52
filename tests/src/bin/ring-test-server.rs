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
use protocol::{RingServer, SegmentConfig, ServerOptions, Spin, WaitPolicy};

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
    /// Answer every non-empty request with one precomputed full
    /// neighbourhood of target 1 (for benchmarks: measures moving the
    /// payload, not generating it).
    #[arg(long)]
    precomputed: bool,
    /// Instead of a ring, serve the precomputed payload over this Unix
    /// socket: the copy-based reference of the benchmark.
    #[arg(long)]
    uds: Option<std::path::PathBuf>,
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "warn".into()),
        )
        .init();
    let args = Args::parse();
    let precomputed = Arc::new(tests::Precomputed::full(
        1,
        [args.fanout1, args.fanout2],
        args.dim,
    ));
    if let Some(path) = &args.uds {
        return serve_uds(path, &precomputed, args.response_bytes as usize);
    }
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
    options.segment.client_timeout = Duration::from_millis(args.client_timeout_ms);
    options.wait = WaitPolicy {
        spin: Spin::Fixed(Duration::from_micros(args.spin_us)),
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
            let (dim, full, pre) = (
                args.dim,
                args.full,
                args.precomputed.then(|| precomputed.clone()),
            );
            std::thread::spawn(move || loop {
                let ticket = match rx.lock().expect("not poisoned").recv() {
                    Ok(ticket) => ticket,
                    Err(_) => return,
                };
                answer(ticket, dim, full, pre.as_deref());
            })
        })
        .collect();

    let mut batch = Vec::new();
    while !stop.load(Ordering::Acquire) {
        server.next_batch(&mut batch, Duration::from_millis(100));
        for ticket in batch.drain(..) {
            if args.inline {
                let pre = args.precomputed.then_some(&*precomputed);
                answer(ticket, args.dim, args.full, pre);
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

fn answer(
    ticket: protocol::ServeTicket,
    dim: u32,
    full: bool,
    precomputed: Option<&tests::Precomputed>,
) {
    let Some(pre) = precomputed else {
        return tests::answer_synthetic(ticket, dim, full);
    };
    match ticket.request() {
        Ok(request) if !request.targets.is_empty() => {
            let _ = ticket.respond(request.request_id, 7, pre.shape, |nodes, targets| {
                pre.fill(nodes, targets)
            });
        }
        _ => tests::answer_synthetic(ticket, dim, full),
    }
}

/// The copy-based reference: per request, write the same Arrow response into
/// a local buffer (the same gather as the ring path) and send it over a Unix
/// socket; the client reads it into its own buffer.
fn serve_uds(
    path: &std::path::Path,
    precomputed: &tests::Precomputed,
    area_bytes: usize,
) -> anyhow::Result<()> {
    use std::io::Write;
    let _ = std::fs::remove_file(path);
    let listener = std::os::unix::net::UnixListener::bind(path)?;
    println!("READY 0x0");
    let (mut stream, _) = listener.accept()?;
    let schemas = protocol::payload::SchemaCache::default();
    // 64-byte aligned, like a slot's response area.
    let mut area = arrow_buffer::MutableBuffer::from_len_zeroed(area_bytes);
    let mut request = [0u8; 8];
    while stream.read_exact(&mut request).is_ok() {
        let mut writer = protocol::payload::ResponseWriter::new(
            area.as_slice_mut(),
            precomputed.shape,
            &schemas,
        )?;
        {
            let (mut nodes, mut targets) = writer.columns();
            precomputed.fill(&mut nodes, &mut targets);
        }
        let used = writer.finish(u64::from_le_bytes(request), 7, 0);
        stream.write_all(&(used as u64).to_le_bytes())?;
        stream.write_all(&area.as_slice()[..used])?;
    }
    let _ = std::fs::remove_file(path);
    Ok(())
}
