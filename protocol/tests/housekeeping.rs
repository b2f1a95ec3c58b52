//! The sidecar keeps every slot usable whatever a client does: each test
//! plays a misbehaving client by hand against a real `RingServer` on a real
//! segment, and asserts what the sidecar does about it (docs/protocol.md,
//! sections 3 and 6).
#![cfg(not(loom))]

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use memmap2::{MmapOptions, MmapRaw};
use protocol::client::{CallRequest, ClientOptions, RingClient};
use protocol::layout::{dtype, status, FeatureSchema};
use protocol::liveness::{self, ClientId};
use protocol::server::{RingServer, ServeTicket, ServerOptions};
use protocol::slot::{state, OwnerTag, SlotWord};
use protocol::submit::SubmitQueue;
use protocol::{Segment, SegmentConfig};

const INTERVAL: Duration = Duration::from_millis(10);
const CLIENT_TIMEOUT: Duration = Duration::from_millis(200);

fn name(tag: &str) -> String {
    format!("gnn-housekeep-{tag}-{}", std::process::id())
}

fn server(name: &str) -> RingServer {
    let schema = FeatureSchema {
        feature_dim: 4,
        dtype: dtype::F32,
        graph_version: 1,
        default_fanouts: [2, 2],
    };
    let mut cfg = SegmentConfig::new(name, schema);
    cfg.slot_count = 4;
    cfg.response_bytes = 64 * 1024;
    cfg.heartbeat_interval = INTERVAL;
    cfg.client_timeout = CLIENT_TIMEOUT;
    RingServer::create(ServerOptions::new(cfg)).expect("create the segment")
}

/// A client played by hand: its own mapping, a raw view of the file for
/// writing requests, and the registry entry it took.
struct HandClient {
    segment: Segment,
    raw: MmapRaw,
    id: ClientId,
}

impl HandClient {
    fn attach(name: &str, lock: bool) -> Self {
        let segment = Segment::attach(name).expect("attach");
        let id = liveness::register_with(segment.header(), |index| {
            !lock || segment.lock_client_entry(index).expect("fcntl")
        })
        .expect("a free client entry");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(format!("/dev/shm/{name}"))
            .expect("open the segment file");
        let raw = MmapOptions::new().map_raw(&file).expect("map");
        Self { segment, raw, id }
    }

    fn beat(&self) {
        liveness::beat(&self.segment.header().clients[self.id.index as usize]);
    }

    /// Claims slot `i` with `owner` and writes a one-target request into it.
    fn claim_and_write(&self, slot_idx: usize, owner: OwnerTag, request_id: u64) -> SlotWord {
        let claimed = self
            .segment
            .slot(slot_idx)
            .try_claim(owner)
            .expect("a free slot");
        let g = self.segment.geometry();
        let at = g.slot_data_offset as usize + slot_idx * g.slot_stride as usize;
        let mut request = [0u8; 136];
        request[0..8].copy_from_slice(&request_id.to_le_bytes());
        request[16..20].copy_from_slice(&1u32.to_le_bytes());
        request[128..136].copy_from_slice(&7u64.to_le_bytes());
        // SAFETY: the slot is CLAIMED by this test, which gives it the request
        // area; `at + 136` lies inside the mapping (validated geometry).
        unsafe {
            std::ptr::copy_nonoverlapping(
                request.as_ptr(),
                self.raw.as_mut_ptr().add(at),
                request.len(),
            );
        }
        claimed
    }

    /// Sets the flags field of slot `i`'s request (no flag is defined).
    fn set_flags(&self, slot_idx: usize, flags: u32) {
        let g = self.segment.geometry();
        let at = g.slot_data_offset as usize + slot_idx * g.slot_stride as usize + 28;
        // SAFETY: as in `claim_and_write`.
        unsafe {
            std::ptr::copy_nonoverlapping(
                flags.to_le_bytes().as_ptr(),
                self.raw.as_mut_ptr().add(at),
                4,
            );
        }
    }

    fn queue(&self) -> SubmitQueue<'_> {
        let header = self.segment.header();
        SubmitQueue {
            bits: &header.submit_bits,
            doorbell: &header.doorbell,
            server_parked: &header.server_parked,
        }
    }
}

fn wait_until(what: &str, mut condition: impl FnMut() -> bool) {
    let until = Instant::now() + Duration::from_secs(10);
    while !condition() {
        assert!(Instant::now() < until, "timed out waiting until {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn answer_all(server: &RingServer, timeout: Duration) -> Vec<ServeTicket> {
    let mut tickets = Vec::new();
    server.next_batch(&mut tickets, timeout);
    tickets
}

#[test]
fn a_client_that_unregisters_while_owning_slots_loses_them_to_the_sidecar() {
    let n = name("unregister");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    let tag = client.id.tag();
    // One slot CLAIMED, one SUBMITTED (no bit), one PUBLISHED.
    client.claim_and_write(0, tag, 1);
    let submitted = client.claim_and_write(1, tag, 2);
    client.segment.slot(1).submit(submitted).unwrap();
    let to_publish = client.claim_and_write(2, tag, 3);
    client.segment.slot(2).submit(to_publish).unwrap();
    client.queue().push(2);
    let ticket = answer_all(&server, Duration::from_secs(1))
        .pop()
        .expect("slot 2");
    ticket.respond_error(status::INTERNAL, 3, "test");
    assert_eq!(client.segment.slot(2).load().state, state::PUBLISHED);

    assert!(liveness::unregister(client.segment.header(), client.id));
    wait_until("every slot is free again", || {
        client
            .segment
            .slots()
            .all(|slot| slot.load().state == state::FREE)
    });
    assert!(server.counters().slots_reclaimed.load(Ordering::Relaxed) >= 3);

    // A fresh client now finds free slots and is served.
    let fresh = RingClient::attach(&n, ClientOptions::default()).unwrap();
    std::thread::scope(|scope| {
        scope.spawn(|| {
            let ticket = answer_all(&server, Duration::from_secs(5)).pop().unwrap();
            let id = ticket.request_id();
            ticket.respond_error(status::UNAVAILABLE, id, "answered");
        });
        let err = fresh.call(&CallRequest::new(&[1])).unwrap_err();
        assert!(err.to_string().contains("answered"), "{err}");
    });
}

#[test]
fn a_later_client_at_the_same_index_does_not_inherit_its_predecessors_slots() {
    let n = name("inherit");
    let server = server(&n);
    // The first client takes no lock and stops beating: it is reaped.
    let first = HandClient::attach(&n, false);
    first.claim_and_write(0, first.id.tag(), 1);
    wait_until("the silent client is reaped", || {
        !liveness::is_registered(first.segment.header(), first.id)
    });
    // Whatever the timing, its slot is never its successor's.
    let second = HandClient::attach(&n, true);
    assert_eq!(second.id.index, first.id.index, "the same entry is reused");
    assert_ne!(second.id.tag(), first.id.tag());
    wait_until("the predecessor's slot is reclaimed", || {
        second.segment.slot(0).load().state == state::FREE
    });
    assert_eq!(server.counters().clients_reaped.load(Ordering::Relaxed), 1);
}

#[test]
fn a_slot_abandoned_before_its_submission_bit_is_freed() {
    let n = name("abandon");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    let claimed = client.claim_and_write(0, client.id.tag(), 1);
    let submitted = client.segment.slot(0).submit(claimed).unwrap();
    client.segment.slot(0).abandon(submitted);
    assert_eq!(client.segment.slot(0).load().state, state::ABANDONED);
    wait_until("the abandoned slot is free", || {
        client.beat();
        client.segment.slot(0).load().state == state::FREE
    });
    assert_eq!(server.counters().abandoned_freed.load(Ordering::Relaxed), 1);
}

#[test]
fn a_submission_whose_bit_was_lost_is_served() {
    let n = name("lostbit");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    let claimed = client.claim_and_write(0, client.id.tag(), 41);
    // Submitted, but the client "died" before setting the bit (it still
    // holds its lock and beats: a live owner).
    client.segment.slot(0).submit(claimed).unwrap();
    let ticket = answer_all(&server, Duration::from_secs(5))
        .pop()
        .expect("housekeeping sets the bit again and the sidecar takes the request");
    assert_eq!(ticket.request().unwrap().request_id, 41);
    assert!(
        server
            .counters()
            .submissions_repaired
            .load(Ordering::Relaxed)
            >= 1
    );
    drop(ticket);
}

#[test]
fn requests_of_owners_that_are_not_live_registered_clients_are_refused() {
    let n = name("refuse");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    // Slot 0: an index no client can have; slot 1: a registered index with
    // the wrong generation; slot 2: an unregistered index.
    for (slot_idx, owner) in [
        (0, OwnerTag::new(200, 1)),
        (1, OwnerTag::new(client.id.index, client.id.generation + 1)),
        (2, OwnerTag::new(client.id.index + 1, 1)),
    ] {
        let claimed = client.claim_and_write(slot_idx, owner, 9);
        client.segment.slot(slot_idx).submit(claimed).unwrap();
        client.queue().push(slot_idx);
    }
    let tickets = answer_all(&server, Duration::from_millis(200));
    assert!(tickets.is_empty(), "served a request of a non-client");
    wait_until("the three slots are free", || {
        (0..3).all(|i| client.segment.slot(i).load().state == state::FREE)
    });
    let refused = server.counters().requests_refused.load(Ordering::Relaxed);
    let reclaimed = server.counters().slots_reclaimed.load(Ordering::Relaxed);
    assert_eq!(refused + reclaimed, 3, "each refused or reclaimed once");
}

#[test]
fn a_stalled_client_holding_its_lock_keeps_the_response_it_reads() {
    let n = name("stalled");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    let claimed = client.claim_and_write(0, client.id.tag(), 5);
    client.segment.slot(0).submit(claimed).unwrap();
    client.queue().push(0);
    let ticket = answer_all(&server, Duration::from_secs(1)).pop().unwrap();
    ticket.respond_error(status::UNAVAILABLE, 5, "read me");
    let published = client.segment.slot(0).load();
    assert_eq!(published.state, state::PUBLISHED);

    // No heartbeat for 3 client timeouts, lock held: a live, stalled process.
    std::thread::sleep(CLIENT_TIMEOUT * 3);
    assert_eq!(
        client.segment.slot(0).load(),
        published,
        "a live lease was reclaimed"
    );
    assert!(liveness::is_registered(client.segment.header(), client.id));
    assert!(server.counters().clients_stalled.load(Ordering::Relaxed) >= 1);

    // The process "dies": its lock goes with it, and the slot comes back.
    client.segment.unlock_client_entry(client.id.index);
    wait_until("the dead client's slot is reclaimed", || {
        client.segment.slot(0).load().state == state::FREE
    });
    assert!(!liveness::is_registered(client.segment.header(), client.id));
}

#[test]
fn refusals_echo_the_request_id() {
    let n = name("echo");
    let server = server(&n);
    let client = HandClient::attach(&n, true);
    let claimed = client.claim_and_write(0, client.id.tag(), 0xfeed);
    client.set_flags(0, 1 << 7);
    client.segment.slot(0).submit(claimed).unwrap();
    client.queue().push(0);
    let ticket = answer_all(&server, Duration::from_secs(1)).pop().unwrap();
    assert!(ticket.request().is_err(), "an undefined flag is refused");
    assert_eq!(ticket.request_id(), 0xfeed);
}

#[test]
fn the_header_carries_the_liveness_parameters() {
    let n = name("params");
    let _server = server(&n);
    let attached = Segment::attach(&n).unwrap();
    assert_eq!(attached.heartbeat_interval(), INTERVAL);
    assert_eq!(attached.client_timeout(), CLIENT_TIMEOUT);
}

/// A process that truncates the segment file: the sidecar's and a worker's
/// next accesses past the new end read zeros instead of killing them with
/// SIGBUS; both see the segment damaged, the server stops serving it, and a
/// client loses its attachment and cannot attach to the damaged file.
#[test]
fn a_truncated_segment_faults_no_process_and_is_seen_damaged_by_both_sides() {
    let name = name("truncated");
    let server = server(&name);
    let client = RingClient::attach(&name, ClientOptions::default()).expect("attach");
    let worker_view = Segment::attach(&name).expect("attach");
    assert!(server.segment().truncation_protected());
    assert!(worker_view.truncation_protected());
    assert!(!server.segment().damaged() && !worker_view.damaged());
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{name}"))
        .unwrap();
    file.set_len(0).unwrap();
    // Past the end now: each of these would be a SIGBUS.
    let last = server.segment().geometry().slot_count as usize - 1;
    assert_eq!(server.segment().slot(last).load().state, state::FREE);
    assert_eq!(worker_view.slot(0).load().state, state::FREE);
    assert_eq!(
        worker_view
            .header()
            .preamble
            .server_heartbeat
            .load(Ordering::Acquire),
        0,
        "a faulted page reads zeros"
    );
    assert!(server.segment().damaged() && worker_view.damaged());
    wait_until("the server's housekeeping noticed", || server.damaged());
    let mut tickets = Vec::new();
    assert_eq!(server.next_batch(&mut tickets, INTERVAL), 0);
    wait_until("the client let the damaged segment go", || {
        matches!(client.status(), protocol::ClientStatus::Lost(_))
    });
    assert!(
        Segment::attach(&name).is_err(),
        "a truncated file is refused"
    );
    drop(client);
    server.shutdown();
}

/// A response held while the file shrinks: its bytes now read as the zero
/// page, and the response says so, so that the worker discards what it
/// decoded or computed from it instead of answering with it.
#[test]
fn a_response_held_across_a_truncation_reports_its_segment_damaged() {
    let n = name("held-truncated");
    let server = server(&n);
    let client = RingClient::attach(&n, ClientOptions::default()).expect("attach");
    let response = std::thread::scope(|scope| {
        let call = scope.spawn(|| client.call(&CallRequest::new(&[7])));
        let ticket = loop {
            if let Some(ticket) = answer_all(&server, INTERVAL).pop() {
                break ticket;
            }
        };
        let request = ticket.request().expect("a valid request");
        let shape = protocol::PayloadShape {
            n_targets: 1,
            n_nodes: 1,
            feature_dim: 4,
            fanouts: request.fanouts,
        };
        let [f1, f2] = request.fanouts.map(|f| f as usize);
        ticket
            .respond(request.request_id, 1, shape, |nodes, out| {
                nodes.node_id[0] = 7;
                nodes.features.fill(1.5);
                out.target_id[0] = 7;
                out.hop2_count[..f1].fill(0);
                out.hop2_rows[..f1 * f2].fill(0);
            })
            .expect("the answer fits");
        call.join().unwrap().expect("an OK response")
    });
    let before = response.tables().expect("decodes");
    assert_eq!(before.target_ids(), &[7]);
    assert!(!response.segment_damaged());
    drop(before);

    std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{n}"))
        .unwrap()
        .set_len(4096)
        .unwrap();
    assert!(response.segment_damaged(), "the response knows");
    // Zeros are no valid payload; if they ever decoded, not as the answer.
    if let Ok(tables) = response.tables() {
        assert_ne!(tables.target_ids(), &[7], "read as zeros");
    }
    assert!(response.segment_damaged());
    drop(response);
    drop(client);
    server.shutdown();
}
