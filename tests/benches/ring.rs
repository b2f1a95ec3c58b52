//! Ring benchmark: round trips through the shared-memory ring between two
//! real processes, against the same payload over a Unix-domain socket.
//!
//! Printed in one run, side by side (medians and p99 of each mode):
//! 1. empty request, both sides spinning;
//! 2. empty request, both sides parking on the futex at once;
//! 3. a 221 x 128 f32 neighbourhood written in place by the server and
//!    decoded by the client with arrow-rs (zero copy), both spinning;
//! 4. the same Arrow bytes, gathered the same way by the server, sent over a
//!    Unix-domain socket and decoded from the client's receive buffer.
//!
//! Goals (printed, not asserted): (1) p50 <= 5 us, (2) p50 <= 30 us,
//! (3) >= 10x faster than (4).
//!
//! References printed beside them: a futex ping-pong between two threads
//! with no ring (the floor of any parked round trip on this machine), and
//! (3) and (4) without the Arrow decode (the transport alone).
//!
//! Run: `cargo bench -p tests --bench ring` (add `-- --quick` for a short run).

use std::io::{Read, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use arrow_buffer::{Buffer, MutableBuffer};
use protocol::payload::{self, DecodeLimits, SchemaCache};
use protocol::{CallRequest, ClientOptions, RingClient, Spin, WaitPolicy};
use tests::{Latency, ServerProcess};

const SERVER: &str = env!("CARGO_BIN_EXE_ring-test-server");
const DIM: u32 = 128;
const FANOUTS: [u32; 2] = [20, 10];

/// A ring test server (or its Unix-socket twin) for one mode.
fn server(args: &[&str]) -> ServerProcess {
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    ServerProcess::start(Path::new(SERVER), &args).expect("start ring-test-server")
}

fn print(stats: &Latency) {
    println!(
        "{:<46} {:>8} {:>10.2} {:>10.2} {:>10.2}",
        stats.name,
        stats.hist.len(),
        stats.p50_us(),
        stats.p99_us(),
        stats.mean_us()
    );
}

fn client(name: &str, spin_for: Duration) -> RingClient {
    RingClient::attach(
        name,
        ClientOptions {
            wait: WaitPolicy {
                spin: Spin::Fixed(spin_for),
                max_park: Duration::from_millis(50),
            },
            ..ClientOptions::default()
        },
    )
    .expect("attach")
}

fn ring_empty(stats: &mut Latency, iterations: usize, spin: bool) {
    let name = format!("gnn-bench-empty-{}-{}", spin, std::process::id());
    let spin_us = if spin { "1000000" } else { "0" };
    let _server = server(&[
        "--name",
        &name,
        "--inline",
        "--spin-us",
        spin_us,
        "--dim",
        "8",
        "--slots",
        "4",
    ]);
    let client = client(
        &name,
        if spin {
            Duration::from_secs(1)
        } else {
            Duration::ZERO
        },
    );
    let request = CallRequest::new(&[]);
    for i in 0..iterations + iterations / 10 {
        let start = Instant::now();
        let response = client.call(&request).expect("empty call");
        let elapsed = start.elapsed();
        drop(response);
        if i >= iterations / 10 {
            stats.record(elapsed);
        }
    }
}

fn ring_payload(stats: &mut Latency, iterations: usize, decode: bool) -> f32 {
    let name = format!("gnn-bench-payload-{}", std::process::id());
    let _server = server(&[
        "--name",
        &name,
        "--inline",
        "--precomputed",
        "--spin-us",
        "1000000",
        "--dim",
        "128",
        "--slots",
        "4",
    ]);
    let client = client(&name, Duration::from_secs(1));
    let targets = [1u64];
    let mut request = CallRequest::new(&targets);
    request.fanouts = FANOUTS;
    let mut checksum = 0.0f32;
    for i in 0..iterations + iterations / 10 {
        let start = Instant::now();
        let response = client.call(&request).expect("payload call");
        if !decode {
            let elapsed = start.elapsed();
            assert_eq!(response.header().n_nodes, 221);
            drop(response);
            if i >= iterations / 10 {
                stats.record(elapsed);
            }
            continue;
        }
        let tables = response.tables().expect("decode");
        let features = tables.features();
        checksum += features[features.len() - 1];
        let elapsed = start.elapsed();
        assert_eq!(tables.n_nodes(), 221);
        drop(tables);
        drop(response);
        if i >= iterations / 10 {
            stats.record(elapsed);
        }
    }
    checksum
}

fn uds_payload(stats: &mut Latency, iterations: usize, _decode: bool) -> f32 {
    let path = std::env::temp_dir().join(format!("gnn-bench-{}.sock", std::process::id()));
    let _server = server(&[
        "--name",
        "unused",
        "--uds",
        path.to_str().unwrap(),
        "--dim",
        "128",
    ]);
    let mut stream = std::os::unix::net::UnixStream::connect(Path::new(&path)).unwrap();
    let limits = DecodeLimits {
        feature_dim: DIM,
        max_nodes: 16_384,
        max_targets: 64,
        max_fanouts: [50, 50],
    };
    let schemas = SchemaCache::default();
    let mut receive = MutableBuffer::from_len_zeroed(4 << 20);
    let mut checksum = 0.0f32;
    for i in 0..iterations + iterations / 10 {
        let start = Instant::now();
        stream.write_all(&(i as u64).to_le_bytes()).unwrap();
        let mut len = [0u8; 8];
        stream.read_exact(&mut len).unwrap();
        let len = u64::from_le_bytes(len) as usize;
        stream
            .read_exact(&mut receive.as_slice_mut()[..len])
            .unwrap();
        let buffer: Buffer = receive.into();
        let tables = payload::decode(&buffer, &limits, &schemas).expect("decode");
        let features = tables.features();
        checksum += features[features.len() - 1];
        let elapsed = start.elapsed();
        assert_eq!(tables.n_nodes(), 221);
        drop(tables);
        receive = buffer
            .into_mutable()
            .expect("the receive buffer is ours again");
        if i >= iterations / 10 {
            stats.record(elapsed);
        }
    }
    drop(stream);
    checksum
}

/// The floor of any parked round trip on this machine: two threads
/// ping-ponging through the same futex primitives, no ring.
fn futex_ping_pong(stats: &mut Latency, iterations: usize) {
    use protocol::wait::{notify, wait_for};
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::sync::Arc;
    #[derive(Default)]
    struct Side {
        word: AtomicU32,
        waiters: AtomicU32,
    }
    let park = WaitPolicy {
        spin: Spin::Fixed(Duration::ZERO),
        max_park: Duration::from_millis(50),
    };
    let turn = Arc::new(AtomicU32::new(0));
    let sides = Arc::new([Side::default(), Side::default()]);
    let total = iterations + iterations / 10;
    let peer = {
        let (turn, sides) = (turn.clone(), sides.clone());
        std::thread::spawn(move || {
            for _ in 0..total {
                wait_for(
                    &sides[1].word,
                    &sides[1].waiters,
                    park,
                    protocol::WaitSite::Request,
                    false,
                    None,
                    || (turn.load(Ordering::Acquire) == 1).then_some(()),
                );
                turn.store(0, Ordering::Release);
                notify(&sides[0].word, &sides[0].waiters);
            }
        })
    };
    for i in 0..total {
        let start = Instant::now();
        turn.store(1, Ordering::Release);
        notify(&sides[1].word, &sides[1].waiters);
        wait_for(
            &sides[0].word,
            &sides[0].waiters,
            park,
            protocol::WaitSite::Response,
            false,
            None,
            || (turn.load(Ordering::Acquire) == 0).then_some(()),
        );
        if i >= iterations / 10 {
            stats.record(start.elapsed());
        }
    }
    peer.join().unwrap();
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 2_000 } else { 20_000 };
    println!(
        "ring benchmark: {} iterations per mode (+10% warm-up), {} cores",
        n,
        std::thread::available_parallelism()
            .map(|p| p.get())
            .unwrap_or(0)
    );
    let mut spin = Latency::new("empty request, spinning");
    ring_empty(&mut spin, n, true);
    let mut parked = Latency::new("empty request, parked (futex)");
    ring_empty(&mut parked, n / 2, false);
    let mut floor = Latency::new("reference: futex ping-pong, 2 threads");
    futex_ping_pong(&mut floor, n / 2);
    let mut ring = Latency::new("221x128 f32 in place + arrow-rs decode");
    let a = ring_payload(&mut ring, n, true);
    let mut uds = Latency::new("221x128 f32 over Unix socket + decode");
    let b = uds_payload(&mut uds, n, true);
    assert_eq!(a, b, "both paths carried the same features");
    let mut ring_raw = Latency::new("221x128 f32 in place, no decode");
    ring_payload(&mut ring_raw, n, false);
    let mut uds_raw = Latency::new("221x128 f32 over Unix socket, no decode");
    uds_payload(&mut uds_raw, n, false);

    println!();
    println!(
        "{:<46} {:>8} {:>10} {:>10} {:>10}",
        "mode", "count", "p50 us", "p99 us", "mean us"
    );
    for stats in [&spin, &parked, &floor, &ring, &uds, &ring_raw, &uds_raw] {
        print(stats);
    }
    println!();
    let verdict = |ok: bool| if ok { "met" } else { "NOT met" };
    println!(
        "goal: empty spinning p50 <= 5 us: {:.2} us ({})",
        spin.p50_us(),
        verdict(spin.p50_us() <= 5.0)
    );
    println!(
        "goal: empty parked p50 <= 30 us: {:.2} us ({})",
        parked.p50_us(),
        verdict(parked.p50_us() <= 30.0)
    );
    let ratio50 = uds.p50_us() / ring.p50_us();
    let ratio99 = uds.p99_us() / ring.p99_us();
    println!(
        "goal: in place >= 10x faster than the socket copy: p50 {:.1}x, p99 {:.1}x ({})",
        ratio50,
        ratio99,
        verdict(ratio50 >= 10.0)
    );
    println!(
        "      transport alone (no decode on either side): p50 {:.1}x, p99 {:.1}x",
        uds_raw.p50_us() / ring_raw.p50_us(),
        uds_raw.p99_us() / ring_raw.p99_us()
    );
}
