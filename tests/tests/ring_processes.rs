//! Two real processes through a real /dev/shm segment: a `ring-test-server`
//! child answering with Arrow payloads, and clients in this process (several
//! threads) or in another child process.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use protocol::layout::{server_state, status};
use protocol::slot::state;
use protocol::{CallError, CallRequest, ClientOptions, RingClient, Segment, Spin, WaitPolicy};
use tests::{
    eventually, segment_exists, unique_name, verify_response, ServerProcess, UNKNOWN_FROM,
};

const SERVER: &str = env!("CARGO_BIN_EXE_ring-test-server");
const HOLDER: &str = env!("CARGO_BIN_EXE_ring-test-client");
const DIM: usize = 16;

fn start_server(name: &str, extra: &[&str]) -> ServerProcess {
    let mut args = vec!["--name".to_string(), name.to_string()];
    args.extend(extra.iter().map(|s| s.to_string()));
    ServerProcess::start(Path::new(SERVER), &args).expect("server starts")
}

fn fast_client_options() -> ClientOptions {
    ClientOptions {
        wait: WaitPolicy {
            spin: Spin::Fixed(Duration::from_micros(20)),
            max_park: Duration::from_millis(20),
        },
        sidecar_timeout: Duration::from_millis(300),
        heartbeat_interval: Duration::from_millis(20),
        default_timeout: Duration::from_secs(5),
    }
}

#[test]
fn concurrent_submitters_get_their_own_verified_answers_in_place() {
    let name = unique_name("concurrent");
    let server = start_server(&name, &["--slots", "8", "--threads", "2"]);
    let client = Arc::new(RingClient::attach(&name, fast_client_options()).unwrap());
    let threads: Vec<_> = (0..4u64)
        .map(|thread| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..150u64 {
                    // Distinct, overlapping and unknown targets, 1..=5 per call.
                    let n = 1 + (i % 5) as usize;
                    let mut targets: Vec<u64> =
                        (0..n as u64).map(|k| thread * 100 + (i + k) % 37).collect();
                    targets.dedup();
                    if i % 11 == 0 {
                        targets.push(UNKNOWN_FROM + i);
                    }
                    let mut request = CallRequest::new(&targets);
                    request.request_id = thread << 32 | i;
                    if i % 2 == 0 {
                        request.fanouts = [5, 3];
                    }
                    let response = client.call(&request).expect("call succeeds");
                    assert_eq!(response.header().request_id, request.request_id);
                    let tables = response.tables().expect("decodes");
                    if i % 2 == 0 {
                        assert_eq!(tables.fanouts(), [5, 3]);
                    } else {
                        assert_eq!(tables.fanouts(), [20, 10], "segment defaults");
                    }
                    verify_response(&tables, &targets, DIM, false).unwrap();
                    // Zero copy: the feature matrix lies inside the mapping.
                    let range = response.mapping_range();
                    let features = tables.features().as_ptr_range();
                    assert!(range.contains(&(features.start as usize)));
                    assert!(features.end as usize <= range.end);
                    assert_eq!(features.start as usize % 64, 0);
                }
            })
        })
        .collect();
    for t in threads {
        t.join().expect("submitter thread");
    }
    drop(client);
    let status = server.stop().unwrap();
    assert!(status.success(), "server exits cleanly: {status}");
    assert!(!segment_exists(&name), "clean shutdown unlinks the segment");
}

#[test]
fn more_submitters_than_slots_all_complete() {
    let name = unique_name("full");
    let server = start_server(&name, &["--slots", "2", "--threads", "1"]);
    let client = Arc::new(RingClient::attach(&name, fast_client_options()).unwrap());
    let threads: Vec<_> = (0..6u64)
        .map(|thread| {
            let client = client.clone();
            std::thread::spawn(move || {
                for i in 0..40 {
                    let targets = [thread * 1000 + i];
                    let response = client.call(&CallRequest::new(&targets)).unwrap();
                    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    drop(client);
    server.stop().unwrap();
}

#[test]
fn invalid_requests_are_answered_with_a_reason() {
    let name = unique_name("invalid");
    let server = start_server(&name, &["--max-targets", "4"]);
    let client = RingClient::attach(&name, fast_client_options()).unwrap();
    // Above the sidecar's fanout cap (50): the sidecar refuses and says why.
    let targets = [1u64];
    let mut request = CallRequest::new(&targets);
    request.fanouts = [51, 1];
    match client.call(&request) {
        Err(CallError::Status {
            status: code,
            message,
            ..
        }) => {
            assert_eq!(code, status::INVALID_REQUEST);
            assert!(message.contains("exceeds the cap 50"), "{message}");
        }
        other => panic!("expected INVALID_REQUEST, got {other:?}"),
    }
    // More targets than the segment allows: refused before submission.
    let many = [1u64, 2, 3, 4, 5];
    assert!(matches!(
        client.call(&CallRequest::new(&many)),
        Err(CallError::TooManyTargets {
            n_targets: 5,
            max_targets: 4
        })
    ));
    // The ring still works afterwards.
    let response = client.call(&CallRequest::new(&targets)).unwrap();
    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
    drop(response);
    drop(client);
    server.stop().unwrap();
}

#[test]
fn a_worker_survives_a_sidecar_crash_and_reattaches_to_the_new_one() {
    let name = unique_name("restart");
    let first = start_server(&name, &["--stale-after-ms", "300"]);
    let first_epoch = first.epoch;
    let client = RingClient::attach(&name, fast_client_options()).unwrap();
    let targets = [42u64];
    let response = client.call(&CallRequest::new(&targets)).unwrap();
    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
    drop(response);

    // Crash: no cleanup, the stale segment stays in /dev/shm.
    first.kill().unwrap();
    assert!(segment_exists(&name));
    let mut request = CallRequest::new(&targets);
    request.timeout = Some(Duration::from_millis(1500));
    match client.call(&request) {
        Err(CallError::SidecarGone { reason, .. }) => {
            // The kernel released the dead sidecar's segment lock: noticed
            // within one heartbeat interval, before its heartbeat timeout.
            assert!(
                reason.contains("sidecar process is gone"),
                "names the cause: {reason}"
            )
        }
        other => panic!("expected SidecarGone, got {other:?}"),
    }

    // A new sidecar takes the stale segment over; the same client object
    // re-attaches to the new epoch without a restart.
    let second = start_server(&name, &["--stale-after-ms", "300"]);
    assert_ne!(second.epoch, first_epoch, "a new start has a new epoch");
    request.timeout = Some(Duration::from_secs(5));
    let response = client.call(&request).expect("served by the new sidecar");
    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
    assert_eq!(client.epoch(), Some(second.epoch));
    drop(response);

    // A clean restart (STOPPED, unlinked) is noticed at once, and followed too.
    second.stop().unwrap();
    let third = start_server(&name, &[]);
    let response = client.call(&request).expect("served by the third sidecar");
    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
    assert_eq!(client.epoch(), Some(third.epoch));
    drop(response);
    drop(client);
    third.stop().unwrap();
}

#[test]
fn a_second_sidecar_on_a_live_segment_is_refused() {
    let name = unique_name("exclusive");
    let first = start_server(&name, &[]);
    let output = std::process::Command::new(SERVER)
        .args(["--name", &name])
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("in use by a live sidecar") && stderr.contains("--shm-name"),
        "says what is wrong and what to do: {stderr}"
    );
    // The first sidecar was not disturbed.
    let client = RingClient::attach(&name, fast_client_options()).unwrap();
    assert_eq!(client.epoch(), Some(first.epoch));
    let targets = [3u64];
    client.call(&CallRequest::new(&targets)).unwrap();
    drop(client);
    first.stop().unwrap();
}

/// A `ring-test-client` holding `n` published slots (it said so).
fn spawn_holder(name: &str, n: usize) -> std::process::Child {
    let mut holder = std::process::Command::new(HOLDER)
        .args(["--name", name, "--hold", &n.to_string()])
        .stdout(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    std::io::BufRead::read_line(
        &mut std::io::BufReader::new(holder.stdout.take().unwrap()),
        &mut line,
    )
    .unwrap();
    assert_eq!(line.trim(), format!("HOLDING {n}"));
    holder
}

#[test]
fn the_sidecar_reclaims_the_slots_of_a_dead_worker() {
    let name = unique_name("reap");
    let server = start_server(&name, &["--slots", "4", "--client-timeout-ms", "300"]);
    let mut holder = spawn_holder(&name, 3);

    let observer = Segment::attach(&name).unwrap();
    let published = || {
        observer
            .slots()
            .filter(|s| s.load().state == state::PUBLISHED)
            .count()
    };
    let active_clients = || protocol::liveness::registered_count(observer.header()) as usize;
    assert_eq!(published(), 3, "the live worker holds three slots");
    assert_eq!(active_clients(), 1);

    holder.kill().unwrap();
    holder.wait().unwrap();
    assert!(
        eventually(Duration::from_secs(10), || published() == 0
            && active_clients() == 0),
        "slots and registration of the dead worker are reclaimed"
    );
    assert!(observer.slots().all(|s| s.load().state == state::FREE));
    assert_eq!(
        observer
            .header()
            .preamble
            .server_state
            .load(std::sync::atomic::Ordering::Acquire),
        server_state::READY
    );

    // The whole ring (4 slots) is usable again by a new worker.
    let client = RingClient::attach(&name, fast_client_options()).unwrap();
    let held: Vec<_> = (0..4u64)
        .map(|i| {
            let targets = [i];
            client.call(&CallRequest::new(&targets)).unwrap()
        })
        .collect();
    assert_eq!(held.len(), 4);
    drop(held);
    drop(client);
    drop(observer);
    server.stop().unwrap();
}

#[test]
fn a_worker_recovers_when_a_stalled_sidecar_resumes() {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let name = unique_name("stall");
    let server = start_server(&name, &[]);
    let pid = Pid::from_raw(server.child.id() as i32);
    let client = RingClient::attach(&name, fast_client_options()).unwrap();
    let targets = [9u64];
    client.call(&CallRequest::new(&targets)).unwrap();

    // Freeze the sidecar well past the client's 300 ms timeout.
    kill(pid, Signal::SIGSTOP).unwrap();
    let mut request = CallRequest::new(&targets);
    request.timeout = Some(Duration::from_millis(800));
    let stalled = client.call(&request);
    assert!(
        matches!(
            stalled,
            Err(CallError::SidecarGone { .. }) | Err(CallError::DeadlineExceeded { .. })
        ),
        "a frozen sidecar is reported, not waited on forever: {stalled:?}"
    );

    // Once it resumes, the same client serves again from the same epoch.
    kill(pid, Signal::SIGCONT).unwrap();
    request.timeout = Some(Duration::from_secs(5));
    let response = client.call(&request).expect("served again after the stall");
    verify_response(&response.tables().unwrap(), &targets, DIM, false).unwrap();
    assert_eq!(client.epoch(), Some(server.epoch));
    drop(response);
    drop(client);
    server.stop().unwrap();
}

/// Resident set size of `pid`, KiB.
fn rss_kib(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS")
}

#[test]
fn a_thousand_killed_workers_leave_no_slot_no_entry_and_no_memory_behind() {
    let name = unique_name("kill1000");
    let server = start_server(&name, &["--slots", "64", "--client-timeout-ms", "200"]);
    let observer = Segment::attach(&name).unwrap();
    let used = || {
        observer
            .slots()
            .filter(|s| s.load().state != state::FREE)
            .count()
    };
    let active_clients = || protocol::liveness::registered_count(observer.header()) as usize;
    // A worker that keeps serving beside the killings.
    let stop = std::sync::atomic::AtomicBool::new(false);
    let kills = 1000;
    let (served, failed) = std::thread::scope(|scope| {
        let serving = scope.spawn(|| {
            let client = RingClient::attach(&name, fast_client_options()).unwrap();
            let (mut served, mut failed) = (0u64, Vec::new());
            while !stop.load(std::sync::atomic::Ordering::Acquire) {
                let targets = [served % 100];
                match client.call(&CallRequest::new(&targets)) {
                    Ok(response) => {
                        assert_eq!(response.tables().unwrap().target_ids(), targets);
                        served += 1;
                    }
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (served, failed)
        });
        // Warm-up: RSS after the allocator has seen the pattern once.
        let mut rss_after_warmup = 0;
        for kill in 0..kills {
            let mut holder = spawn_holder(&name, 1);
            holder.kill().unwrap();
            holder.wait().unwrap();
            if kill == 100 {
                rss_after_warmup = rss_kib(server.child.id());
            }
            // Keep the dead-but-unreaped clients well under the 64 entries.
            while active_clients() > 40 {
                std::thread::sleep(Duration::from_millis(5));
            }
        }
        assert!(
            eventually(Duration::from_secs(10), || active_clients() == 1
                && used() <= 1),
            "every dead worker's slot and entry came back ({} clients, {} slots used)",
            active_clients(),
            used()
        );
        let rss_end = rss_kib(server.child.id());
        // Flat, within 8 MiB, over 900 kills after the warm-up.
        assert!(
            rss_end <= rss_after_warmup + 8 * 1024,
            "the sidecar's RSS grew from {rss_after_warmup} KiB to {rss_end} KiB"
        );
        stop.store(true, std::sync::atomic::Ordering::Release);
        serving.join().unwrap()
    });
    assert!(failed.is_empty(), "the serving worker failed: {failed:?}");
    assert!(served > 0);
    assert!(
        eventually(Duration::from_secs(5), || used() == 0),
        "all slots free at the end"
    );
}
