//! Integration harness: helpers shared by the test binaries, the tests and
//! the ring benchmark.
//!
//! The ring test server (`ring-test-server`) answers requests with a
//! *synthetic* 2-hop neighbourhood: every node's neighbours and feature
//! values are pure functions of its id, so a client in another process can
//! check every byte of a response ([`verify_response`]). The sampler and the
//! feature tiers are not involved: this exercises the protocol alone, through
//! real processes and a real segment.

pub mod docs;
pub mod h2;
pub mod openmetrics;
pub mod otlp;
pub mod proxy;
pub mod redis;
pub mod stack;
pub mod typed;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{bail, ensure, Context};
use protocol::layout::status;
use protocol::payload::schema::{target_status, tier};
use protocol::payload::{NodeColumns, PayloadShape, TargetColumns};
use protocol::{ResponseTables, ServeTicket};

/// The `i`-th (0-based) hop neighbour of `node`.
pub fn neighbour(node: u64, i: u32) -> u64 {
    node.wrapping_mul(1_000).wrapping_add(u64::from(i) + 1)
}

/// How many neighbours `node` has for a fanout: all of them when `full`,
/// otherwise between fanout-2 and fanout (to exercise padding).
pub fn neighbour_count(node: u64, fanout: u32, full: bool) -> u32 {
    if full {
        fanout
    } else {
        fanout.saturating_sub((node % 3) as u32)
    }
}

/// Element `j` of `node`'s feature row.
pub fn feature(node: u64, j: usize) -> f32 {
    (node.wrapping_mul(31).wrapping_add(j as u64) % 10_007) as f32 * 0.25
}

/// Target ids at or above this are "unknown nodes".
pub const UNKNOWN_FROM: u64 = 1 << 60;

/// Answers one ticket with the synthetic neighbourhood of its targets.
pub fn answer_synthetic(ticket: ServeTicket, feature_dim: u32, full: bool) {
    let request = match ticket.request() {
        Ok(request) => request,
        Err(e) => {
            let request_id = ticket.request_id();
            ticket.respond_error(status::INVALID_REQUEST, request_id, &e.to_string());
            return;
        }
    };
    if request.remaining() == Some(Duration::ZERO) {
        ticket.respond_error(
            status::DEADLINE_EXCEEDED,
            request.request_id,
            "the deadline passed before the request was served",
        );
        return;
    }
    if let Some(fanouts) = request.graph.as_ref().and_then(|g| g.one_type_fanouts()) {
        answer_synthetic_subgraph(ticket, &request, fanouts, feature_dim, full);
        return;
    }
    let [f1, f2] = request.fanouts;
    // Assign node-table rows: targets first, then neighbours, deduplicated.
    let mut rows: HashMap<u64, i32> = HashMap::new();
    let mut order: Vec<u64> = Vec::new();
    let mut row_of = |node: u64| -> i32 {
        *rows.entry(node).or_insert_with(|| {
            order.push(node);
            (order.len() - 1) as i32
        })
    };
    struct Plan {
        row: i32,
        hop1: Vec<(i32, Vec<i32>)>,
    }
    let plans: Vec<Plan> = request
        .targets
        .iter()
        .map(|&target| {
            let row = row_of(target);
            let hop1 = if target >= UNKNOWN_FROM {
                Vec::new()
            } else {
                (0..neighbour_count(target, f1, full))
                    .map(|i| {
                        let n1 = neighbour(target, i);
                        let r1 = row_of(n1);
                        let hop2 = (0..neighbour_count(n1, f2, full))
                            .map(|j| row_of(neighbour(n1, j)))
                            .collect();
                        (r1, hop2)
                    })
                    .collect()
            };
            Plan { row, hop1 }
        })
        .collect();
    let shape = PayloadShape {
        n_targets: request.targets.len() as u32,
        n_nodes: order.len() as u32,
        feature_dim,
        fanouts: request.fanouts,
    };
    let dim = feature_dim as usize;
    let (f1, f2) = (f1 as usize, f2 as usize);
    let result = ticket.respond(request.request_id, 7, shape, |nodes, targets| {
        fill_synthetic_nodes(nodes, &order, dim);
        for (t, plan) in plans.iter().enumerate() {
            let target = request.targets[t];
            targets.target_id[t] = target;
            targets.status[t] = if target >= UNKNOWN_FROM {
                target_status::UNKNOWN_NODE
            } else {
                target_status::OK
            };
            targets.target_row[t] = plan.row;
            targets.hop1_count[t] = plan.hop1.len() as i32;
            for i in 0..f1 {
                let (r1, hop2) = plan
                    .hop1
                    .get(i)
                    .map(|(r, h)| (*r, h.as_slice()))
                    .unwrap_or((plan.row, &[]));
                targets.hop1_rows[t * f1 + i] = r1;
                targets.hop2_count[t * f1 + i] = hop2.len() as i32;
                for j in 0..f2 {
                    targets.hop2_rows[(t * f1 + i) * f2 + j] =
                        hop2.get(j).copied().unwrap_or(plan.row);
                }
            }
        }
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "response did not fit");
    }
}

/// The synthetic graph's subgraph-layout sample (docs/protocol.md, "The
/// subgraph layout"): node ids in row order, the edges (rows), and the
/// nodes and edges of each hop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SyntheticSubgraph {
    pub nodes: Vec<u64>,
    pub target_rows: Vec<i32>,
    pub src: Vec<i64>,
    pub dst: Vec<i64>,
    pub sampled_nodes: Vec<i64>,
    pub sampled_edges: Vec<i64>,
}

/// Samples the synthetic graph as the sidecar samples a subgraph: unique
/// targets first, then each hop's new nodes, an edge per neighbour, each
/// node expanded once at the hop that reached it.
pub fn synthetic_subgraph(targets: &[u64], fanouts: &[u32], full: bool) -> SyntheticSubgraph {
    let mut rows: HashMap<u64, i64> = HashMap::new();
    let mut out = SyntheticSubgraph {
        nodes: Vec::new(),
        target_rows: Vec::new(),
        src: Vec::new(),
        dst: Vec::new(),
        sampled_nodes: Vec::new(),
        sampled_edges: Vec::new(),
    };
    let row_of = |rows: &mut HashMap<u64, i64>, nodes: &mut Vec<u64>, node: u64| -> i64 {
        *rows.entry(node).or_insert_with(|| {
            nodes.push(node);
            nodes.len() as i64 - 1
        })
    };
    for &t in targets {
        let row = row_of(&mut rows, &mut out.nodes, t);
        out.target_rows.push(row as i32);
    }
    out.sampled_nodes.push(out.nodes.len() as i64);
    let mut begin = 0;
    for &fanout in fanouts {
        let (end, edges) = (out.nodes.len(), out.src.len());
        for local in begin..end {
            let node = out.nodes[local];
            if node >= UNKNOWN_FROM {
                continue;
            }
            for i in 0..neighbour_count(node, fanout, full) {
                let row = row_of(&mut rows, &mut out.nodes, neighbour(node, i));
                out.src.push(row);
                out.dst.push(local as i64);
            }
        }
        out.sampled_nodes.push((out.nodes.len() - end) as i64);
        out.sampled_edges.push((out.src.len() - edges) as i64);
        begin = end;
    }
    out
}

/// Answers a subgraph-layout request with the synthetic graph's sample.
fn answer_synthetic_subgraph(
    ticket: ServeTicket,
    request: &protocol::request::Request,
    fanouts: protocol::request::SubgraphFanouts,
    feature_dim: u32,
    full: bool,
) {
    let sample = synthetic_subgraph(&request.targets, fanouts.as_slice(), full);
    let shape = protocol::payload::GraphShape::subgraph(
        fanouts,
        request.targets.len() as u32,
        sample.nodes.len() as u32,
        sample.src.len() as u32,
    );
    let dim = feature_dim as usize;
    let result = ticket.respond_graph(request.request_id, 7, shape, |cols| {
        fill_synthetic_nodes(&mut cols.nodes[0], &sample.nodes, dim);
        for (t, &target) in request.targets.iter().enumerate() {
            cols.target_id[t] = target;
            cols.status[t] = if target >= UNKNOWN_FROM {
                target_status::UNKNOWN_NODE
            } else {
                target_status::OK
            };
            cols.target_row[t] = sample.target_rows[t];
        }
        let (src, dst) = cols.edge_index[0].split_at_mut(sample.src.len());
        src.copy_from_slice(&sample.src);
        dst.copy_from_slice(&sample.dst);
        cols.sampled_nodes[0].copy_from_slice(&sample.sampled_nodes);
        cols.sampled_edges[0].copy_from_slice(&sample.sampled_edges);
    });
    if let Err(e) = result {
        tracing::warn!(error = %e, "response did not fit");
    }
}

/// The node table of a synthetic response: ids, features, tiers, fallbacks.
fn fill_synthetic_nodes(nodes: &mut NodeColumns<'_>, order: &[u64], dim: usize) {
    for (row, &node) in order.iter().enumerate() {
        nodes.node_id[row] = node;
        let unknown = node >= UNKNOWN_FROM;
        for (j, value) in nodes.features[row * dim..(row + 1) * dim]
            .iter_mut()
            .enumerate()
        {
            *value = if unknown { 0.0 } else { feature(node, j) };
        }
        nodes.tier[row] = if unknown {
            tier::DEFAULT
        } else {
            (node % 3) as u8
        };
        nodes.set_fallback(row, unknown);
    }
}

/// Checks every value of a synthetic subgraph-layout response.
pub fn verify_subgraph_response(
    tables: &protocol::payload::GraphTables,
    targets: &[u64],
    feature_dim: usize,
    fanouts: &[u32],
    full: bool,
) -> anyhow::Result<()> {
    let want = synthetic_subgraph(targets, fanouts, full);
    ensure!(tables.hops() == fanouts.len(), "hops");
    ensure!(tables.target_ids() == targets, "target ids differ");
    ensure!(tables.node_ids(0) == want.nodes, "node ids or their order");
    ensure!(tables.target_rows() == want.target_rows, "target rows");
    let (src, dst) = tables
        .edge_index(0)
        .split_at(tables.edge_index(0).len() / 2);
    ensure!(src == want.src && dst == want.dst, "edge_index");
    ensure!(tables.sampled_nodes(0) == want.sampled_nodes, "node counts");
    ensure!(tables.sampled_edges(0) == want.sampled_edges, "edge counts");
    for (row, &node) in want.nodes.iter().enumerate() {
        let unknown = node >= UNKNOWN_FROM;
        ensure!(tables.fallback(0, row) == unknown, "fallback of row {row}");
        for j in 0..feature_dim {
            let expected = if unknown { 0.0 } else { feature(node, j) };
            ensure!(
                tables.features(0)[row * feature_dim + j] == expected,
                "feature {j} of node {node}"
            );
        }
    }
    Ok(())
}

/// Checks every value of a synthetic response against the pure functions
/// that generated it.
pub fn verify_response(
    tables: &ResponseTables,
    targets: &[u64],
    feature_dim: usize,
    full: bool,
) -> anyhow::Result<()> {
    let [f1, f2] = tables.fanouts().map(|f| f as usize);
    ensure!(tables.n_targets() == targets.len(), "target count");
    ensure!(tables.target_ids() == targets, "target ids differ");
    let ids = tables.node_ids();
    let features = tables.features();
    ensure!(
        features.len() == ids.len() * feature_dim,
        "feature matrix shape"
    );
    let mut unique = ids.to_vec();
    unique.sort_unstable();
    unique.dedup();
    ensure!(unique.len() == ids.len(), "node table has duplicate ids");
    for (row, &node) in ids.iter().enumerate() {
        let unknown = node >= UNKNOWN_FROM;
        ensure!(
            tables.fallback(row) == unknown,
            "fallback flag of row {row}"
        );
        for j in 0..feature_dim {
            let expected = if unknown { 0.0 } else { feature(node, j) };
            ensure!(
                features[row * feature_dim + j] == expected,
                "feature {j} of node {node}"
            );
        }
    }
    for (t, &target) in targets.iter().enumerate() {
        let row = tables.target_rows()[t];
        ensure!(ids[row as usize] == target, "target row of {target}");
        let c1 = tables.hop1_counts()[t] as usize;
        let expected_c1 = if target >= UNKNOWN_FROM {
            0
        } else {
            neighbour_count(target, f1 as u32, full) as usize
        };
        ensure!(
            c1 == expected_c1,
            "hop-1 count of {target}: {c1} != {expected_c1}"
        );
        for i in 0..f1 {
            let r1 = tables.hop1_rows()[t * f1 + i];
            if i >= c1 {
                ensure!(
                    r1 == row,
                    "hop-1 padding of {target} must be the target row"
                );
                continue;
            }
            let n1 = neighbour(target, i as u32);
            ensure!(ids[r1 as usize] == n1, "hop-1 neighbour {i} of {target}");
            let c2 = tables.hop2_counts()[t * f1 + i] as usize;
            ensure!(
                c2 == neighbour_count(n1, f2 as u32, full) as usize,
                "hop-2 count"
            );
            for j in 0..f2 {
                let r2 = tables.hop2_rows()[(t * f1 + i) * f2 + j];
                if j >= c2 {
                    ensure!(r2 == row, "hop-2 padding must be the target row");
                } else {
                    ensure!(
                        ids[r2 as usize] == neighbour(n1, j as u32),
                        "hop-2 neighbour"
                    );
                }
            }
        }
    }
    Ok(())
}

/// A segment name no other test or run uses.
///
/// A test that kills a sidecar (or is killed itself) leaves its segment in
/// `/dev/shm`, as a crashed sidecar in a pod does for its successor to take
/// over; nothing takes these over, and they would hold memory from one test
/// run to the next. So the first call in a test process removes the
/// segments named by earlier test processes that have exited.
pub fn unique_name(tag: &str) -> String {
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(remove_segments_of_exited_tests);
    format!(
        "gnn-test-{tag}-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Removes `/dev/shm/gnn-test-<tag>-<pid>-<n>` where no process `<pid>`
/// runs any more. Unlinking only removes the name: a daemon that outlived
/// its test keeps its mapping.
fn remove_segments_of_exited_tests() {
    let Ok(entries) = std::fs::read_dir("/dev/shm") else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(rest) = name.strip_prefix("gnn-test-") else {
            continue;
        };
        // <tag>-<pid>-<n>: the pid is the second field from the end.
        let mut fields = rest.rsplit('-');
        let (Some(_n), Some(pid)) = (fields.next(), fields.next()) else {
            continue;
        };
        let Ok(pid) = pid.parse::<u32>() else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = nix::sys::mman::shm_unlink(format!("/{name}").as_str());
        }
    }
}

/// A `ring-test-server` child process. Closing its stdin stops it cleanly;
/// dropping the handle does that too, and kills it if it has not exited
/// within two seconds.
#[derive(Debug)]
pub struct ServerProcess {
    pub child: Child,
    stdin: Option<ChildStdin>,
    pub epoch: u64,
    /// The segment name it was started with, removed on drop if the test
    /// is failing.
    segment: Option<String>,
}

impl ServerProcess {
    /// Starts the server and waits for its `READY <epoch>` line.
    pub fn start(bin: &Path, args: &[String]) -> anyhow::Result<Self> {
        let mut child = Command::new(bin)
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let stdout = child.stdout.take().expect("piped stdout");
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line)?;
        let Some(epoch) = line.trim().strip_prefix("READY ") else {
            let status = child.wait()?;
            bail!("ring-test-server did not start ({status}); said {line:?}");
        };
        let epoch = u64::from_str_radix(epoch.trim_start_matches("0x"), 16)?;
        let stdin = child.stdin.take();
        let segment = args
            .iter()
            .position(|a| a == "--name")
            .and_then(|i| args.get(i + 1))
            .cloned();
        Ok(Self {
            child,
            stdin,
            epoch,
            segment,
        })
    }

    /// Clean stop: close stdin, wait for exit.
    pub fn stop(mut self) -> anyhow::Result<std::process::ExitStatus> {
        drop(self.stdin.take());
        Ok(self.child.wait()?)
    }

    /// Crash: SIGKILL, no cleanup.
    pub fn kill(mut self) -> anyhow::Result<()> {
        self.child.kill()?;
        self.child.wait()?;
        Ok(())
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        drop(self.stdin.take());
        let exited = eventually(Duration::from_secs(2), || {
            matches!(self.child.try_wait(), Ok(Some(_)))
        });
        if !exited {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
        // A test that fails never reaches its clean stop, and a killed
        // server leaves its segment behind; tmpfs pages are memory, so remove
        // it. (Passing tests end with a clean stop, and the crash tests need
        // the stale segment to outlive `kill`.)
        if let (Some(name), true) = (&self.segment, std::thread::panicking()) {
            let _ = std::fs::remove_file(Path::new("/dev/shm").join(name));
        }
    }
}

/// Whether `/dev/shm/<name>` exists.
pub fn segment_exists(name: &str) -> bool {
    std::path::Path::new("/dev/shm").join(name).exists()
}

/// Polls `cond` every 10 ms for up to `limit` (for outcomes another process
/// produces on its own schedule). Returns whether it became true.
pub fn eventually(limit: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let start = std::time::Instant::now();
    loop {
        if cond() {
            return true;
        }
        if start.elapsed() >= limit {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// One target's full synthetic neighbourhood, computed once, so that a
/// benchmark measures moving it rather than generating it.
#[derive(Debug, Clone)]
pub struct Precomputed {
    pub shape: PayloadShape,
    pub target: u64,
    pub node_ids: Vec<u64>,
    pub features: Vec<f32>,
    pub hop1_rows: Vec<i32>,
    pub hop2_rows: Vec<i32>,
}

impl Precomputed {
    /// Target `target` with exactly `f1` hop-1 and `f1 * f2` hop-2
    /// neighbours, all distinct: `1 + f1 + f1 * f2` rows (221 for [20, 10]).
    pub fn full(target: u64, [f1, f2]: [u32; 2], feature_dim: u32) -> Self {
        let mut node_ids = vec![target];
        let mut hop1_rows = Vec::new();
        let mut hop2_rows = Vec::new();
        for i in 0..f1 {
            let n1 = neighbour(target, i);
            hop1_rows.push(node_ids.len() as i32);
            node_ids.push(n1);
        }
        for i in 0..f1 {
            let n1 = neighbour(target, i);
            for j in 0..f2 {
                hop2_rows.push(node_ids.len() as i32);
                node_ids.push(neighbour(n1, j));
            }
        }
        let dim = feature_dim as usize;
        let features = node_ids
            .iter()
            .flat_map(|&n| (0..dim).map(move |j| feature(n, j)))
            .collect();
        Self {
            shape: PayloadShape {
                n_targets: 1,
                n_nodes: node_ids.len() as u32,
                feature_dim,
                fanouts: [f1, f2],
            },
            target,
            node_ids,
            features,
            hop1_rows,
            hop2_rows,
        }
    }

    /// Copies the neighbourhood into a response's columns (a gather, as the
    /// sidecar does from its feature cache).
    pub fn fill(&self, nodes: &mut NodeColumns<'_>, targets: &mut TargetColumns<'_>) {
        let f2 = self.shape.fanouts[1] as i32;
        nodes.node_id.copy_from_slice(&self.node_ids);
        nodes.features.copy_from_slice(&self.features);
        nodes.tier.fill(tier::L1);
        targets.target_id[0] = self.target;
        targets.status[0] = target_status::OK;
        targets.target_row[0] = 0;
        targets.hop1_count[0] = self.hop1_rows.len() as i32;
        targets.hop1_rows.copy_from_slice(&self.hop1_rows);
        targets.hop2_count.fill(f2);
        targets.hop2_rows.copy_from_slice(&self.hop2_rows);
    }
}

/// A named latency histogram for the benchmarks (nanoseconds recorded,
/// microseconds reported).
#[derive(Debug)]
pub struct Latency {
    pub name: &'static str,
    pub hist: hdrhistogram::Histogram<u64>,
}

impl Latency {
    pub fn new(name: &'static str) -> Self {
        Self {
            name,
            hist: hdrhistogram::Histogram::new_with_bounds(1, 60_000_000_000, 3)
                .expect("valid bounds"),
        }
    }

    pub fn record(&mut self, elapsed: Duration) {
        self.hist
            .saturating_record(elapsed.as_nanos().max(1) as u64);
    }

    /// Records the time since `started` divided by `runs`.
    pub fn record_mean(&mut self, started: std::time::Instant, runs: u32) {
        self.record(started.elapsed() / runs.max(1));
    }

    pub fn p50_us(&self) -> f64 {
        self.hist.value_at_quantile(0.50) as f64 / 1000.0
    }

    pub fn p99_us(&self) -> f64 {
        self.hist.value_at_quantile(0.99) as f64 / 1000.0
    }

    pub fn mean_us(&self) -> f64 {
        self.hist.mean() / 1000.0
    }
}
