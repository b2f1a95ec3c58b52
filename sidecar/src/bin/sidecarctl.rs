//! `sidecarctl`: the operator's command line for a running sidecar, over its
//! admin Unix socket (frames: `sidecar::admin::wire`, docs/admin.md).
//!
//! ```text
//! sidecarctl [--socket <path>] [--json] <command>
//!   status | stats | ready | live
//!   warm --top K | --ids-file F
//!   invalidate <id>...
//!   fanouts get | fanouts set F1,F2
//!   deadline get | deadline set MS
//!   log-level get | log-level set LEVEL
//!   graph add-node <id> (--features a,b,.. | --features-file row.f32) [--edge N]... [--directed]
//!   graph add-edges --file edges.txt [--directed]
//!   graph compact
//!   cache flush [--l1] [--l2]
//!   drain | shutdown
//! ```
//!
//! Exit status: 0 on success (for `ready` and `live`: the probe passed), 1
//! when the command failed or the probe did not pass, 2 on bad usage.
#![forbid(unsafe_code)]

use std::io::{BufReader, Write};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use anyhow::{bail, Context};
use clap::{Parser, Subcommand};

/// The longest `--timeout-s` (a day).
const MAX_TIMEOUT: Duration = Duration::from_secs(86_400);
use sidecar::admin::wire::{
    read_frame, write_frame, AdminRequest, AdminResponse, Distribution, FrameError, NewNode,
    StatsReport, StatusReport, ADMIN_VERSION,
};

/// Operate a running sidecar over its admin socket.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Cli {
    /// The sidecar's admin socket (its admin_socket setting).
    #[arg(long, env = "SIDECAR_ADMIN_SOCKET")]
    socket: PathBuf,
    /// Print JSON (one object) instead of a table.
    #[arg(long, global = true)]
    json: bool,
    /// Give up when the sidecar sends nothing for this long, seconds (a
    /// long command's progress frames count).
    #[arg(long, global = true, default_value_t = 60.0)]
    timeout_s: f64,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Phase, readiness, graph, store, runtime knobs, ring.
    Status,
    /// Stage latency percentiles, rows per tier, neighbourhood sizes,
    /// fallbacks, deadline misses, ring occupancy.
    Stats,
    /// Readiness probe: exit 0 when ready, 1 when not (with the reason).
    Ready,
    /// Liveness probe: exit 0 when live, 1 when not.
    Live,
    /// Pin nodes' feature rows in L1 (progress on stderr).
    Warm {
        /// The K highest-degree nodes (of a typed graph: the K nodes with
        /// the most edges over its node types with features).
        #[arg(
            long,
            conflicts_with_all = ["ids_file", "node_type"],
            required_unless_present = "ids_file"
        )]
        top: Option<u64>,
        /// Node ids, one per line (or separated by spaces or commas).
        #[arg(long)]
        ids_file: Option<PathBuf>,
        /// The ids' node type (a typed graph).
        #[arg(long = "type", requires = "ids_file")]
        node_type: Option<String>,
    },
    /// Evict rows from the sidecar's caches (L1, pinned set, L2 cache).
    Invalidate {
        #[arg(required = true)]
        ids: Vec<u64>,
        /// The ids' node type (a typed graph).
        #[arg(long = "type")]
        node_type: Option<String>,
    },
    /// Fanouts of requests that leave them to the sidecar.
    Fanouts {
        #[command(subcommand)]
        action: FanoutsAction,
    },
    /// The feature-fetch deadline, milliseconds.
    Deadline {
        #[command(subcommand)]
        action: DeadlineAction,
    },
    /// The log level (tracing directives).
    LogLevel {
        #[command(subcommand)]
        action: LogLevelAction,
    },
    /// Graph updates while serving.
    Graph {
        #[command(subcommand)]
        action: GraphAction,
    },
    /// The feature caches.
    Cache {
        #[command(subcommand)]
        action: CacheAction,
    },
    /// Stop taking new requests, answer what is submitted, report when the
    /// ring is empty. The sidecar stays up, not ready, until stopped.
    Drain {
        /// First report not ready and keep serving this long (a preStop
        /// hook: the Service and the worker stop sending first).
        #[arg(long, default_value_t = 0.0)]
        after_s: f64,
    },
    /// Drain and stop the sidecar.
    Shutdown,
}

#[derive(Debug, Subcommand)]
enum FanoutsAction {
    Get,
    /// e.g. `fanouts set 10,5`; -1 is every neighbour (the hop's
    /// max_fanouts).
    Set {
        #[arg(allow_hyphen_values = true)]
        fanouts: daemon_kit::config::Fanouts,
    },
}

#[derive(Debug, Subcommand)]
enum DeadlineAction {
    Get,
    /// e.g. `deadline set 15`.
    Set {
        ms: f64,
    },
}

#[derive(Debug, Subcommand)]
enum LogLevelAction {
    Get,
    /// e.g. `log-level set debug` or `log-level set sidecar=debug,warn`.
    Set {
        level: String,
    },
}

#[derive(Debug, Subcommand)]
enum GraphAction {
    /// Add a node with its feature row and edges.
    AddNode {
        id: u64,
        /// The feature row, comma separated.
        #[arg(long, conflicts_with = "features_file")]
        features: Option<String>,
        /// The feature row as raw little-endian f32.
        #[arg(long)]
        features_file: Option<PathBuf>,
        /// A neighbour (repeat for several).
        #[arg(long = "edge", conflicts_with = "node_type")]
        edges: Vec<u64>,
        /// Add only id -> neighbour, not the reverse edges.
        #[arg(long, conflicts_with = "node_type")]
        directed: bool,
        /// The node's type (a typed graph); its row is optional for a type
        /// without features.
        #[arg(long = "type")]
        node_type: Option<String>,
        /// Edges of an edge type added with the node, as
        /// `EDGE_TYPE=SRC,DST,...` (a typed graph; repeat for several).
        #[arg(long = "typed-edges", requires = "node_type")]
        typed_edges: Vec<String>,
        /// The data of the edges `--typed-edges EDGE_TYPE=...` names, for
        /// an edge type whose edges carry data, as `EDGE_TYPE=V,V,...`:
        /// per edge, its attributes, then its weight, then its time
        /// (repeat for several edge types).
        #[arg(long = "edge-data", requires = "node_type")]
        edge_data: Vec<String>,
    },
    /// Add edges from a text file: `src dst` per line, `#` comments; with
    /// --edge-type, an edge type whose edges carry data takes its values
    /// after `src dst` (attributes, then weight, then time).
    AddEdges {
        #[arg(long)]
        file: PathBuf,
        /// Add only src -> dst, not the reverse edges.
        #[arg(long, conflicts_with = "edge_type")]
        directed: bool,
        /// The edges' edge type (a typed graph): `src__relation__dst`, or a
        /// relation only one edge type has.
        #[arg(long)]
        edge_type: Option<String>,
    },
    /// Rewrite the graph index with every update folded in.
    Compact,
    /// Print a digest of the served graph (index and updates): equal on
    /// replicas that applied the same updates, compacted or not.
    Checksum,
}

#[derive(Debug, Subcommand)]
enum CacheAction {
    /// Empty caches: both flags absent means every cache there is (L1 and
    /// pinned set; the L2 cache in front of Redis).
    Flush {
        #[arg(long)]
        l1: bool,
        #[arg(long)]
        l2: bool,
    },
}

/// Writes to stdout; a closed pipe (`sidecarctl status | head`) ends the
/// process quietly.
fn out(text: &str) {
    let mut stdout = std::io::stdout().lock();
    if let Err(e) = writeln!(stdout, "{text}").and_then(|()| stdout.flush()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe {
            std::process::exit(0);
        }
        eprintln!("sidecarctl: writing the answer: {e}");
        std::process::exit(1);
    }
}

fn main() -> ExitCode {
    let cli: Cli = daemon_kit::cli::parse();
    match run(cli) {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::from(1),
        Err(e) => {
            eprintln!("sidecarctl: {e:#}");
            ExitCode::from(1)
        }
    }
}

fn parse_ids(text: &str, source: &str) -> anyhow::Result<Vec<u64>> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or(""))
        .flat_map(|line| line.split(|c: char| c.is_whitespace() || c == ','))
        .filter(|t| !t.is_empty())
        .map(|t| {
            t.parse::<u64>()
                .with_context(|| format!("{t:?} in {source} is not a node id"))
        })
        .collect()
}

/// A file's edges, and the values after `src dst` (edge data) as one text
/// when its lines have any.
type FileEdges = (Vec<(u64, u64)>, Option<String>);

/// The edges of a file of `src dst [values...]` lines, and the values
/// after `src dst` (edge data), as one text, when the lines have any: every
/// line then has as many (the sidecar checks them against the edge type).
fn parse_edges(path: &PathBuf) -> anyhow::Result<FileEdges> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut edges = Vec::new();
    let mut data = String::new();
    let mut width: Option<(usize, usize)> = None;
    for (i, line) in text.lines().enumerate() {
        let line = line.split('#').next().unwrap_or("").trim();
        if line.is_empty() {
            continue;
        }
        let parts: Vec<&str> = line.split_whitespace().collect();
        let [a, b, values @ ..] = parts.as_slice() else {
            bail!("{}:{}: expected `src dst`", path.display(), i + 1);
        };
        match width {
            None => width = Some((values.len(), i + 1)),
            Some((n, first)) if n != values.len() => bail!(
                "{}:{}: {} values after `src dst`, and line {first} has {n}: every edge of an \
                 edge type carries the same data (its attributes, then its weight, then its \
                 time)",
                path.display(),
                i + 1,
                values.len()
            ),
            Some(_) => {}
        }
        let parse = |t: &str| {
            t.parse::<u64>()
                .with_context(|| format!("{}:{}: {t:?} is not a node id", path.display(), i + 1))
        };
        edges.push((parse(a)?, parse(b)?));
        for value in values {
            data.push_str(value);
            data.push(' ');
        }
    }
    let with_data = width.is_some_and(|(n, _)| n > 0);
    Ok((edges, with_data.then_some(data)))
}

/// Each `--edge-data EDGE_TYPE=V,V,...` placed beside the `--typed-edges`
/// entry of the same EDGE_TYPE (`None` where none is given); one naming
/// an edge type no `--typed-edges` names, or named twice, is refused.
fn edge_data_beside_lists(
    edges: &[(String, Vec<(u64, u64)>)],
    specs: &[String],
) -> anyhow::Result<Vec<Option<String>>> {
    let mut data = vec![None; edges.len()];
    for spec in specs {
        let (name, values) = spec
            .split_once('=')
            .with_context(|| format!("--edge-data {spec:?}: write EDGE_TYPE=V,V,..."))?;
        let Some(at) = edges.iter().position(|(n, _)| n == name) else {
            bail!(
                "--edge-data {name}: no --typed-edges {name}=... gives its edges; name the edge \
                 type as --typed-edges does"
            );
        };
        if data[at].is_some() {
            bail!("--edge-data {name} is given twice: give each edge type's data once");
        }
        data[at] = Some(values.to_string());
    }
    Ok(data)
}

/// `EDGE_TYPE=SRC,DST,...`: the edges of one edge type.
fn parse_typed_edges(spec: &str) -> anyhow::Result<(String, Vec<(u64, u64)>)> {
    let (name, list) = spec
        .split_once('=')
        .with_context(|| format!("--typed-edges {spec:?}: write EDGE_TYPE=SRC,DST,..."))?;
    let ids = parse_ids(list, &format!("--typed-edges {name}"))?;
    if ids.is_empty() || !ids.len().is_multiple_of(2) {
        bail!("--typed-edges {name}: give SRC,DST pairs");
    }
    Ok((
        name.to_string(),
        ids.chunks(2).map(|p| (p[0], p[1])).collect(),
    ))
}

fn request_of(command: Command) -> anyhow::Result<AdminRequest> {
    Ok(match command {
        Command::Status => AdminRequest::Status,
        Command::Stats => AdminRequest::Stats,
        Command::Ready => AdminRequest::Ready,
        Command::Live => AdminRequest::Live,
        Command::Warm {
            top,
            ids_file,
            node_type,
        } => match (top, ids_file) {
            (Some(k), None) => AdminRequest::WarmTop { k },
            (None, Some(path)) => {
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("reading {}", path.display()))?;
                let ids = parse_ids(&text, &path.display().to_string())?;
                match node_type {
                    None => AdminRequest::WarmIds { ids },
                    Some(node_type) => AdminRequest::TypedWarmIds { node_type, ids },
                }
            }
            _ => bail!("give --top K or --ids-file F"),
        },
        Command::Invalidate {
            ids,
            node_type: None,
        } => AdminRequest::Invalidate { ids },
        Command::Invalidate {
            ids,
            node_type: Some(node_type),
        } => AdminRequest::TypedInvalidate { node_type, ids },
        Command::Fanouts { action } => match action {
            FanoutsAction::Get => AdminRequest::GetFanouts,
            FanoutsAction::Set { fanouts } => AdminRequest::SetFanouts { fanouts: fanouts.0 },
        },
        Command::Deadline { action } => match action {
            DeadlineAction::Get => AdminRequest::GetDeadline,
            DeadlineAction::Set { ms } => AdminRequest::SetDeadline { ms },
        },
        Command::LogLevel { action } => match action {
            LogLevelAction::Get => AdminRequest::GetLogLevel,
            LogLevelAction::Set { level } => AdminRequest::SetLogLevel { level },
        },
        Command::Graph { action } => match action {
            GraphAction::AddNode {
                id,
                features,
                features_file,
                node_type: Some(node_type),
                typed_edges,
                edge_data,
                ..
            } => {
                let features = match (&features, &features_file) {
                    (None, None) => Vec::new(),
                    _ => {
                        daemon_kit::row::feature_row(features.as_deref(), features_file.as_deref())
                            .map_err(anyhow::Error::msg)?
                    }
                };
                let edges: Vec<(String, Vec<(u64, u64)>)> = typed_edges
                    .iter()
                    .map(|spec| parse_typed_edges(spec))
                    .collect::<anyhow::Result<_>>()?;
                if edge_data.is_empty() {
                    AdminRequest::TypedAddNode {
                        node_type,
                        id,
                        features,
                        edges,
                    }
                } else {
                    let data = edge_data_beside_lists(&edges, &edge_data)?;
                    AdminRequest::TypedAddNodeWithData {
                        node_type,
                        id,
                        features,
                        edges,
                        data,
                    }
                }
            }
            GraphAction::AddNode {
                id,
                features,
                features_file,
                edges,
                directed,
                node_type: None,
                ..
            } => {
                let features =
                    daemon_kit::row::feature_row(features.as_deref(), features_file.as_deref())
                        .map_err(anyhow::Error::msg)?;
                AdminRequest::AddNodes {
                    nodes: vec![NewNode { id, features }],
                    edges: edges.into_iter().map(|n| (id, n)).collect(),
                    undirected: !directed,
                }
            }
            GraphAction::AddEdges {
                file,
                directed,
                edge_type: None,
            } => {
                let (edges, data) = parse_edges(&file)?;
                if data.is_some() {
                    bail!(
                        "{}: values after `src dst` are edge data, which goes to an edge type: \
                         name it with --edge-type",
                        file.display()
                    );
                }
                AdminRequest::AddEdges {
                    edges,
                    undirected: !directed,
                }
            }
            GraphAction::AddEdges {
                file,
                edge_type: Some(edge_type),
                ..
            } => match parse_edges(&file)? {
                (edges, None) => AdminRequest::TypedAddEdges { edge_type, edges },
                (edges, Some(data)) => AdminRequest::AddEdgesWithData {
                    edge_type,
                    edges,
                    data,
                },
            },
            GraphAction::Compact => AdminRequest::Compact,
            GraphAction::Checksum => AdminRequest::GraphChecksum,
        },
        Command::Cache {
            action: CacheAction::Flush { l1, l2 },
        } => AdminRequest::FlushCache { l1, l2 },
        Command::Drain { after_s } => AdminRequest::Drain { after_s },
        Command::Shutdown => AdminRequest::Shutdown,
    })
}

/// Runs the command; `Ok(false)` when a probe did not pass.
/// Connects and says Hello. A sidecar whose connections are all taken
/// answers with an error frame ("too many admin connections", or "closed to
/// make room" for a connection it dropped before reading its Hello): then
/// the connection is tried again, with a short backoff, until `timeout`.
fn connect(
    socket: &std::path::Path,
    timeout: Duration,
) -> anyhow::Result<(UnixStream, BufReader<UnixStream>)> {
    let until = std::time::Instant::now() + timeout;
    let mut backoff = Duration::from_millis(5);
    loop {
        let stream = UnixStream::connect(socket).with_context(|| {
            format!(
                "connecting to {}: is the sidecar running with admin_socket {}?",
                socket.display(),
                socket.display()
            )
        })?;
        stream.set_read_timeout(Some(timeout))?;
        stream.set_write_timeout(Some(timeout))?;
        let mut writer = stream.try_clone()?;
        let mut reader = BufReader::new(stream);
        let hello = write_frame(
            &mut writer,
            &AdminRequest::Hello {
                version: ADMIN_VERSION,
            },
        );
        // A refusal is written before the sidecar closes: read it even when
        // the Hello met a broken pipe.
        let answer = read_frame::<AdminResponse>(&mut reader);
        let message = match (answer, hello) {
            (Ok(AdminResponse::Hello { .. }), Ok(())) => return Ok((writer, reader)),
            (Ok(AdminResponse::Error { message }), _) => message,
            (Ok(other), _) => bail!("unexpected handshake answer {other:?}"),
            (Err(FrameError::Io(io)), _)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                bail!(
                    "the sidecar sent nothing for {} s (is it stopped or overloaded?)",
                    timeout.as_secs_f64()
                )
            }
            (Err(_), Err(e)) => return Err(e.into()),
            (Err(FrameError::Closed), Ok(())) => {
                bail!("the sidecar closed the connection")
            }
            (Err(e), Ok(())) => return Err(e.into()),
        };
        let busy = message.contains("too many admin connections")
            || message.contains("closed to make room");
        if !busy || std::time::Instant::now() + backoff >= until {
            bail!("{message}");
        }
        std::thread::sleep(backoff);
        backoff = (backoff * 2).min(Duration::from_millis(100));
    }
}

fn run(cli: Cli) -> anyhow::Result<bool> {
    let request = request_of(cli.command)?;
    let timeout = Duration::try_from_secs_f64(cli.timeout_s)
        .ok()
        .filter(|t| !t.is_zero() && *t <= MAX_TIMEOUT)
        .with_context(|| {
            format!(
                "--timeout-s {:?} must be a number of seconds above 0 and at most {}",
                cli.timeout_s,
                MAX_TIMEOUT.as_secs()
            )
        })?;
    let (mut writer, mut reader) = connect(&cli.socket, timeout)?;
    let timeout_s = cli.timeout_s;
    let read = |reader: &mut BufReader<UnixStream>| -> anyhow::Result<AdminResponse> {
        read_frame(reader).map_err(|e| match e {
            FrameError::Io(io)
                if matches!(
                    io.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) =>
            {
                anyhow::anyhow!(
                    "the sidecar sent nothing for {timeout_s} s (is it stopped or overloaded?)"
                )
            }
            FrameError::Closed => anyhow::anyhow!("the sidecar closed the connection"),
            other => other.into(),
        })
    };
    write_frame(&mut writer, &request)?;
    loop {
        let response = read(&mut reader)?;
        match response {
            AdminResponse::Progress { done, total } => {
                let percent = if total == 0 {
                    100.0
                } else {
                    done as f64 * 100.0 / total as f64
                };
                eprintln!("sidecarctl: {done}/{total} ({percent:.0}%)");
            }
            final_answer => return print(&final_answer, cli.json),
        }
    }
}

fn json(value: &impl serde::Serialize) {
    out(&serde_json::to_string(value).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}")));
}

fn ms(seconds: Option<f64>) -> String {
    seconds.map_or_else(|| "-".into(), |s| format!("{:.3}", s * 1e3))
}

fn print(response: &AdminResponse, as_json: bool) -> anyhow::Result<bool> {
    use serde_json::json as j;
    match response {
        AdminResponse::Error { message } => bail!("{message}"),
        AdminResponse::Hello { .. } | AdminResponse::Progress { .. } => {
            bail!("unexpected answer {response:?}")
        }
        AdminResponse::Status(s) if as_json => json(s),
        AdminResponse::Status(s) => print_status(s),
        AdminResponse::Stats(s) if as_json => json(s),
        AdminResponse::Stats(s) => print_stats(s),
        AdminResponse::Probe { ok, reason } => {
            if as_json {
                json(&j!({"ok": ok, "reason": reason}));
            } else if *ok {
                out("ok");
            } else {
                out(reason);
            }
            return Ok(*ok);
        }
        AdminResponse::Warmed {
            pinned,
            requested,
            pinned_total,
            seconds,
        } => {
            if as_json {
                json(&j!({"pinned": pinned, "requested": requested,
                    "pinned_total": pinned_total, "seconds": seconds}));
            } else {
                out(&format!(
                    "pinned {pinned} of {requested} rows in {seconds:.2} s; {pinned_total} rows \
                     pinned in all"
                ));
            }
        }
        AdminResponse::Invalidated { ids } => {
            if as_json {
                json(&j!({"invalidated": ids}));
            } else {
                out(&format!("invalidated {ids} id(s)"));
            }
        }
        AdminResponse::Fanouts {
            fanouts,
            max_fanouts,
        } => {
            if as_json {
                json(&j!({"fanouts": fanouts, "max_fanouts": max_fanouts}));
            } else {
                out(&format!(
                    "fanouts {},{} (max {},{})",
                    fanouts[0], fanouts[1], max_fanouts[0], max_fanouts[1]
                ));
            }
        }
        AdminResponse::Deadline { ms } => {
            if as_json {
                json(&j!({"deadline_ms": ms}));
            } else {
                out(&format!("deadline {ms} ms"));
            }
        }
        AdminResponse::LogLevel { level } => {
            if as_json {
                json(&j!({"log_level": level}));
            } else {
                out(&format!("log level {level}"));
            }
        }
        AdminResponse::Updated {
            nodes_added,
            edges_added,
            n_nodes,
            generation,
        } => {
            if as_json {
                json(&j!({"nodes_added": nodes_added, "edges_added": edges_added,
                    "n_nodes": n_nodes, "generation": generation, "durable": false}));
            } else {
                out(&format!(
                    "added {nodes_added} node(s), {edges_added} edge(s); {n_nodes} nodes, \
                     generation {generation}; in memory until the graph is compacted (a clean \
                     stop, `sidecarctl graph compact`, or compact_after): a crash before that \
                     loses it"
                ));
            }
        }
        AdminResponse::Compacted {
            n_nodes,
            n_edges,
            generation,
            seconds,
        } => {
            if as_json {
                json(&j!({"n_nodes": n_nodes, "n_edges": n_edges,
                    "generation": generation, "seconds": seconds}));
            } else {
                out(&format!(
                    "compacted: {n_nodes} nodes, {n_edges} edges in {seconds:.2} s; generation \
                     {generation}"
                ));
            }
        }
        AdminResponse::GraphChecksum {
            checksum,
            n_nodes,
            n_edges,
            generation,
            position,
        } => {
            if as_json {
                json(
                    &j!({"checksum": checksum, "n_nodes": n_nodes, "n_edges": n_edges,
                    "generation": generation, "position": position}),
                );
            } else {
                out(&format!(
                    "{checksum}  {n_nodes} nodes, {n_edges} edges, generation {generation}, \
                     position {position}"
                ));
            }
        }
        AdminResponse::Flushed {
            l1_rows,
            pinned_rows,
            l2,
        } => {
            if as_json {
                json(&j!({"l1_rows": l1_rows, "pinned_rows": pinned_rows, "l2": l2}));
            } else {
                out(&format!(
                    "flushed L1 ({l1_rows} cached, {pinned_rows} pinned rows){}",
                    if *l2 { " and the L2 cache" } else { "" }
                ));
            }
        }
        AdminResponse::Drained {
            answered,
            pending,
            seconds,
            complete,
        } => {
            if as_json {
                json(&j!({"answered": answered, "pending": pending,
                    "seconds": seconds, "complete": complete}));
            } else if *complete {
                out(&format!(
                    "drained: {answered} request(s) answered in {seconds:.2} s; the ring is empty"
                ));
            } else {
                out(&format!(
                    "drain timed out after {seconds:.2} s: {answered} answered, {pending} still \
                     pending"
                ));
            }
            return Ok(*complete);
        }
        AdminResponse::ShuttingDown => {
            if as_json {
                json(&j!({"shutting_down": true}));
            } else {
                out("sidecar is draining and stopping");
            }
        }
    }
    Ok(true)
}

fn print_status(s: &StatusReport) {
    let rows: Vec<(&str, String)> = vec![
        ("server", s.server.clone()),
        ("segment", s.shm_name.clone()),
        ("phase", s.phase.clone()),
        ("ready", s.ready.to_string()),
        ("uptime", format!("{:.1} s", s.uptime_s)),
        ("store", s.store.clone()),
        ("feature dim", s.feature_dim.to_string()),
        ("graph version", s.graph_version.to_string()),
        ("nodes / edges", format!("{} / {}", s.n_nodes, s.n_edges)),
        ("graph generation", s.graph_generation.to_string()),
        (
            "fanouts",
            format!(
                "{},{} (max {},{})",
                s.fanouts[0], s.fanouts[1], s.max_fanouts[0], s.max_fanouts[1]
            ),
        ),
        ("deadline", format!("{} ms", s.deadline_ms)),
        ("log level", s.log_level.clone()),
        (
            "ring",
            format!(
                "{} of {} slots used, {} worker(s)",
                s.slots_used, s.slots, s.clients
            ),
        ),
        (
            "L1",
            format!(
                "{} rows, {} bytes; {} pinned rows",
                s.l1_rows, s.l1_bytes, s.pinned_rows
            ),
        ),
        (
            "updates",
            if s.updates_stream.is_empty() {
                format!("no stream followed; graph position {}", s.update_position)
            } else {
                format!(
                    "stream {}, position {}, lag {:.3} s",
                    s.updates_stream, s.update_position, s.update_lag_s
                )
            },
        ),
    ];
    for (key, value) in rows {
        out(&format!("{key:<18}{value}"));
    }
}

fn print_distribution(d: &Distribution, unit_ms: bool) {
    let show = |v: Option<f64>| {
        if unit_ms {
            ms(v)
        } else {
            v.map_or_else(|| "-".into(), |v| format!("{v:.0}"))
        }
    };
    out(&format!(
        "  {:<22}{:>10}{:>12}{:>12}{:>12}{:>12}",
        d.name,
        d.count,
        show(d.mean),
        show(d.p50),
        show(d.p90),
        show(d.p99)
    ));
}

fn print_stats(s: &StatsReport) {
    out(&format!("batches {}  requests {}", s.batches, s.requests));
    out("latency per batch (ms)      count        mean         p50         p90         p99");
    for stage in &s.stages {
        print_distribution(stage, true);
    }
    out("rows per request            count        mean         p50         p90         p99");
    print_distribution(&s.neighbor_fetch_count, false);
    out("rows per tier");
    for t in &s.tiers {
        out(&format!(
            "  {:<10}{:>14}{:>9.1}%",
            t.tier,
            t.rows,
            t.ratio * 100.0
        ));
    }
    out("fallback rows by cause");
    for (cause, n) in &s.fallbacks {
        out(&format!("  {cause:<12}{n:>12}"));
    }
    out(&format!("deadline misses (requests) {}", s.deadline_misses));
    let r = &s.ring;
    out(&format!(
        "ring: {} slots: {} free, {} claimed, {} submitted, {} serving, {} published, {} \
         abandoned; {} worker(s)",
        r.slots, r.free, r.claimed, r.submitted, r.serving, r.published, r.abandoned, r.clients
    ));
}
