//! Every `sidecarctl` command against a running `sidecar serve` (a real
//! process on cora, the embedded store), each checked by its effect: on the
//! ring (a real ring client), on `/metrics`, or on the sidecar's state. The
//! probes are checked in their failing states too: not ready while warming
//! up (Redis stopped), while about to drain and while draining; not live
//! when the process does not answer.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::time::{Duration, Instant};

use protocol::client::{CallError, CallRequest, ClientOptions, RingClient};
use tests::stack::{
    dataset, free_port, freeze_process, http_request, http_status_within as status_within,
    metric_value, sidecar_import, thaw_process, workspace_bin,
};
use tests::{eventually, segment_exists, unique_name};

/// A `sidecar serve` process with an admin socket and a metrics endpoint.
struct Sidecar {
    child: Child,
    shm_name: String,
    socket: PathBuf,
    metrics: String,
    dir: tempfile::TempDir,
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn import_cora(data: &Path) {
    sidecar_import(&dataset("cora"), data, &[]);
}

impl Sidecar {
    /// Starts on an imported cora with `extra` flags; does not wait.
    fn spawn(dir: tempfile::TempDir, extra: &[&str]) -> Self {
        let shm_name = unique_name("admin");
        let socket = dir.path().join("admin.sock");
        let metrics = format!("127.0.0.1:{}", free_port());
        let warm_up: &[&str] = if extra.contains(&"--warm-up") {
            &[]
        } else {
            &["--warm-up", "100"]
        };
        let child = Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(dir.path().join("data"))
            .args(["--shm-name", &shm_name, "--metrics-addr", &metrics])
            .arg("--admin-socket")
            .arg(&socket)
            .args(["--slots", "8"])
            .args(warm_up)
            .args(extra)
            .stderr(std::fs::File::create(dir.path().join("sidecar.log")).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            shm_name,
            socket,
            metrics,
            dir,
        }
    }

    fn start() -> Self {
        let dir = tempfile::tempdir().unwrap();
        import_cora(&dir.path().join("data"));
        // A generous feature deadline: the counts these tests check must not
        // depend on how loaded the machine is (no row served late).
        let sidecar = Self::spawn(dir, &["--deadline-ms", "10000"]);
        sidecar.wait_ready();
        sidecar
    }

    fn wait_ready(&self) {
        assert!(
            eventually(Duration::from_secs(60), || self
                .ctl(&["ready"])
                .status
                .success()),
            "the sidecar did not become ready"
        );
    }

    fn ctl(&self, args: &[&str]) -> Output {
        Command::new(workspace_bin("sidecarctl"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .unwrap()
    }

    /// stdout of a command that must succeed.
    fn ok(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert!(
            out.status.success(),
            "sidecarctl {args:?} failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8(out.stdout).unwrap()
    }

    /// stderr of a command that must fail.
    fn fails(&self, args: &[&str]) -> String {
        let out = self.ctl(args);
        assert_eq!(
            out.status.code(),
            Some(1),
            "sidecarctl {args:?} should fail: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8(out.stderr).unwrap()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        let mut all = args.to_vec();
        all.push("--json");
        serde_json::from_str(&self.ok(&all)).unwrap()
    }

    fn metric(&self, name: &str) -> f64 {
        metric_value(&self.metrics, name)
    }

    fn client(&self) -> RingClient {
        RingClient::attach(&self.shm_name, ClientOptions::default()).unwrap()
    }
}

/// One ring call with the sidecar's fanouts (0, 0); returns (fanouts used,
/// hop-1 neighbours of each target, node ids).
fn call(client: &RingClient, targets: &[u64]) -> ([u32; 2], Vec<Vec<u64>>, Vec<u64>) {
    let response = client.call(&CallRequest::new(targets)).unwrap();
    let tables = response.tables().unwrap();
    let fanouts = tables.fanouts();
    let f1 = fanouts[0] as usize;
    let ids = tables.node_ids().to_vec();
    let hop1 = (0..targets.len())
        .map(|i| {
            (0..tables.hop1_counts()[i] as usize)
                .map(|j| ids[tables.hop1_rows()[i * f1 + j] as usize])
                .collect()
        })
        .collect();
    (fanouts, hop1, ids)
}

#[test]
fn status_stats_and_the_probes_report_a_serving_sidecar() {
    let sidecar = Sidecar::start();
    assert_eq!(sidecar.ok(&["ready"]).trim(), "ok");
    assert_eq!(sidecar.ok(&["live"]).trim(), "ok");
    let status = sidecar.json(&["status"]);
    assert_eq!(status["phase"], "ready");
    assert_eq!(status["ready"], true);
    assert_eq!(status["n_nodes"], 2708);
    assert_eq!(status["feature_dim"], 1433);
    assert_eq!(status["store"], "rocksdb");
    assert_eq!(status["fanouts"], serde_json::json!([20, 10]));
    assert_eq!(status["slots"], 8);
    assert_eq!(status["pinned_rows"], 100);
    let table = sidecar.ok(&["status"]);
    assert!(table.contains("phase             ready"), "{table}");

    let client = sidecar.client();
    for k in 0..20u64 {
        call(&client, &[k, k + 100]);
    }
    let stats = sidecar.json(&["stats"]);
    assert_eq!(stats["requests"], 20);
    let stages = stats["stages"].as_array().unwrap();
    for stage in stages {
        assert!(stage["count"].as_u64().unwrap() > 0, "{stage}");
        assert!(stage["p50"].as_f64().unwrap() > 0.0, "{stage}");
        assert!(stage["p99"].as_f64().unwrap() >= stage["p50"].as_f64().unwrap());
    }
    assert_eq!(stats["neighbor_fetch_count"]["count"], 20);
    let rows: u64 = stats["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["rows"].as_u64().unwrap())
        .sum();
    // Every row asked (the warm-up's 100 too) was served by a tier, or
    // joined a fetch already in flight for it.
    assert_eq!(
        rows as f64 + sidecar.metric("sidecar_feature_coalesced_total"),
        sidecar.metric("sidecar_rows_fetched_total") + 100.0
    );
    assert_eq!(stats["ring"]["slots"], 8);
    assert_eq!(stats["ring"]["clients"], 1);
    assert_eq!(stats["deadline_misses"], 0);
    let table = sidecar.ok(&["stats"]);
    assert!(table.contains("rows per tier"), "{table}");
    assert!(table.contains("fetch"), "{table}");

    // A closed pipe ends sidecarctl quietly (exit 0, nothing on stderr).
    let piped = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} --socket {} stats | true; echo ${{PIPESTATUS[0]}}",
            workspace_bin("sidecarctl").display(),
            sidecar.socket.display()
        ))
        .output()
        .unwrap();
    assert!(
        piped.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&piped.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&piped.stdout).trim(), "0");
}

#[test]
fn runtime_knobs_take_effect_without_a_restart() {
    let sidecar = Sidecar::start();
    let client = sidecar.client();
    // The hub 1358 has 168 neighbours: the fanout caps what is sampled.
    assert_eq!(call(&client, &[1358]).0, [20, 10]);
    assert!(sidecar
        .ok(&["fanouts", "get"])
        .contains("fanouts 20,10 (max 50,50)"));
    sidecar.ok(&["fanouts", "set", "5,3"]);
    let (fanouts, hop1, _) = call(&client, &[1358]);
    assert_eq!(fanouts, [5, 3]);
    assert_eq!(hop1[0].len(), 5);
    assert_eq!(
        sidecar.json(&["status"])["fanouts"],
        serde_json::json!([5, 3])
    );
    let e = sidecar.fails(&["fanouts", "set", "60,1"]);
    assert!(e.contains("fanout 60 of hop 1 is outside 1..=50"), "{e}");
    // -1, every neighbour: the hop's max_fanouts.
    sidecar.ok(&["fanouts", "set", "-1,4"]);
    let (fanouts, hop1, _) = call(&client, &[1358]);
    assert_eq!(fanouts, [50, 4]);
    assert_eq!(hop1[0].len(), 50);
    // Another negative number is refused where it is parsed (a usage
    // error), naming what is taken.
    let out = sidecar.ctl(&["fanouts", "set", "-2,4"]);
    let e = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{e}");
    assert!(e.contains("-1: every neighbour"), "{e}");
    sidecar.ok(&["fanouts", "set", "5,3"]);

    assert!(sidecar
        .ok(&["deadline", "get"])
        .contains("deadline 10000 ms"));
    sidecar.ok(&["deadline", "set", "7.5"]);
    assert_eq!(sidecar.json(&["status"])["deadline_ms"], 7.5);
    assert_eq!(sidecar.metric("sidecar_deadline_seconds"), 0.0075);
    assert!(sidecar.fails(&["deadline", "set", "0"]).contains("outside"));
    assert!(sidecar
        .fails(&["deadline", "set", "inf"])
        .contains("outside"));
    // The configuration's range, not merely "above 0".
    let e = sidecar.fails(&["deadline", "set", "1e-300"]);
    assert!(e.contains("outside 0.01..=60000 ms"), "{e}");
    let e = sidecar.fails(&["deadline", "set", "-5"]);
    assert!(
        e.contains("outside"),
        "a negative number reaches the check: {e}"
    );
    assert_eq!(sidecar.json(&["status"])["deadline_ms"], 7.5);
    let out = sidecar.ctl(&["--timeout-s", "1e300", "status"]);
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    let e = String::from_utf8_lossy(&out.stderr);
    assert!(e.contains("--timeout-s 1e300"), "{e}");
    assert!(!e.contains("panicked"), "{e}");

    assert_eq!(sidecar.json(&["log-level", "get"])["log_level"], "info");
    sidecar.ok(&["log-level", "set", "sidecar=debug,warn"]);
    assert_eq!(sidecar.json(&["status"])["log_level"], "sidecar=debug,warn");
    let e = sidecar.fails(&["log-level", "set", "loud"]);
    assert!(e.contains("is not a log level"), "{e}");
    assert_eq!(
        sidecar.json(&["log-level", "get"])["log_level"],
        "sidecar=debug,warn"
    );
}

#[test]
fn warm_invalidate_and_cache_flush_change_the_l1_contents() {
    let sidecar = Sidecar::start();
    assert_eq!(sidecar.json(&["status"])["pinned_rows"], 100);
    let out = sidecar.ctl(&["warm", "--top", "2500"]);
    assert!(out.status.success());
    let progress = String::from_utf8_lossy(&out.stderr);
    assert!(progress.contains("1000/2500"), "progress: {progress}");
    assert!(
        progress.contains("2500/2500 (100%)"),
        "progress: {progress}"
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("pinned 2500 of 2500 rows"));
    assert_eq!(sidecar.json(&["status"])["pinned_rows"], 2500);
    let ids = sidecar.dir.path().join("ids.txt");
    std::fs::write(&ids, "5 6\n7, 2603 # a comment\n").unwrap();
    let warmed = sidecar.json(&["warm", "--ids-file", ids.to_str().unwrap()]);
    assert_eq!(warmed["pinned"], 4);
    let pinned = sidecar.json(&["status"])["pinned_rows"].as_u64().unwrap();
    assert!(pinned >= 2500, "{pinned}");
    std::fs::write(&ids, "99999\n").unwrap();
    let e = sidecar.fails(&["warm", "--ids-file", ids.to_str().unwrap()]);
    assert!(e.contains("node 99999 is not in the graph"), "{e}");

    // Everything pinned is now served from L1.
    let client = sidecar.client();
    let before = sidecar.metric("sidecar_feature_rows_total{tier=\"l1\"}");
    let (_, _, ids_served) = call(&client, &[5]);
    assert_eq!(
        sidecar.metric("sidecar_feature_rows_total{tier=\"l1\"}") - before,
        ids_served.len() as f64
    );
    assert!(sidecar
        .ok(&["invalidate", "5", "6", "7"])
        .contains("invalidated 3 id(s)"));
    assert_eq!(sidecar.json(&["status"])["pinned_rows"], pinned - 3);
    assert_eq!(sidecar.metric("sidecar_invalidated_ids_admin_total"), 3.0);

    let e = sidecar.fails(&["cache", "flush", "--l2"]);
    assert!(e.contains("store of record"), "{e}");
    let flushed = sidecar.json(&["cache", "flush"]);
    assert_eq!(flushed["pinned_rows"], pinned - 3);
    assert_eq!(flushed["l2"], false);
    assert_eq!(sidecar.json(&["status"])["pinned_rows"], 0);
    assert_eq!(sidecar.json(&["status"])["l1_rows"], 0);
    // Served again from the store, then cached.
    let before = sidecar.metric("sidecar_feature_rows_total{tier=\"l2\"}");
    call(&client, &[5]);
    assert!(sidecar.metric("sidecar_feature_rows_total{tier=\"l2\"}") > before);
}

#[test]
fn graph_updates_reach_the_ring_and_survive_compaction() {
    let sidecar = Sidecar::start();
    let client = sidecar.client();
    let dim = 1433;
    let row: Vec<String> = (0..dim).map(|i| format!("{}", (i % 3) as f32)).collect();
    let added = sidecar.json(&[
        "graph",
        "add-node",
        "2708",
        "--features",
        &row.join(","),
        "--edge",
        "1",
        "--edge",
        "2",
    ]);
    assert_eq!(added["nodes_added"], 1);
    assert_eq!(added["edges_added"], 4);
    let (_, hop1, _) = call(&client, &[2708]);
    let mut neighbours = hop1[0].clone();
    neighbours.sort();
    assert_eq!(neighbours, [1, 2]);

    let edges = sidecar.dir.path().join("edges.txt");
    std::fs::write(&edges, "# new links\n2708 3\n2708 4\n\n").unwrap();
    let added = sidecar.json(&["graph", "add-edges", "--file", edges.to_str().unwrap()]);
    assert_eq!(added["edges_added"], 4);
    let (_, hop1, _) = call(&client, &[2708]);
    assert_eq!(hop1[0].len(), 4);
    std::fs::write(&edges, "2708 x\n").unwrap();
    let e = sidecar.fails(&["graph", "add-edges", "--file", edges.to_str().unwrap()]);
    assert!(e.contains(":1:"), "the error names the line: {e}");

    let before = sidecar.json(&["status"]);
    let compacted = sidecar.json(&["graph", "compact"]);
    assert_eq!(compacted["n_nodes"], 2709);
    assert_eq!(compacted["n_edges"], before["n_edges"]);
    let (_, hop1, _) = call(&client, &[2708]);
    assert_eq!(hop1[0].len(), 4);
    assert_eq!(sidecar.json(&["status"])["n_edges"], before["n_edges"]);
}

#[test]
fn drain_answers_what_was_submitted_then_refuses_new_requests() {
    let sidecar = Sidecar::start();
    let client = sidecar.client();
    call(&client, &[1]);
    // A preStop-style drain: not ready at once, still serving meanwhile.
    let socket = sidecar.socket.clone();
    let drain = std::thread::spawn(move || {
        Command::new(workspace_bin("sidecarctl"))
            .arg("--socket")
            .arg(&socket)
            .args(["drain", "--after-s", "6", "--json"])
            .output()
            .unwrap()
    });
    // Within the 6 s delay (a slow machine still has seconds to spare).
    let mut said = String::new();
    assert!(eventually(Duration::from_secs(4), || {
        let out = sidecar.ctl(&["ready"]);
        said = String::from_utf8_lossy(&out.stdout).into_owned();
        out.status.code() == Some(1)
    }));
    assert!(said.contains("about to drain"), "{said}");
    let (code, _) = http_request(&sidecar.metrics, "GET", "/readyz", None).unwrap();
    assert_eq!(code, 503);
    call(&client, &[2]); // still served during the delay
    let drained = drain.join().unwrap();
    assert!(
        drained.status.success(),
        "{}",
        String::from_utf8_lossy(&drained.stderr)
    );
    let drained: serde_json::Value = serde_json::from_slice(&drained.stdout).unwrap();
    assert_eq!(drained["complete"], true);
    assert_eq!(drained["pending"], 0);
    // Draining: not ready, live, and new requests are refused by the client rule.
    let why = sidecar.ctl(&["ready"]);
    assert_eq!(why.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&why.stdout).contains("draining"));
    assert!(sidecar.ctl(&["live"]).status.success());
    assert_eq!(sidecar.metric("sidecar_draining"), 1.0);
    assert!(matches!(
        client.call(&CallRequest::new(&[3])),
        Err(CallError::Draining { .. })
    ));
    // Draining twice reports the same drain.
    assert_eq!(sidecar.json(&["drain"])["complete"], true);
}

#[test]
fn shutdown_stops_the_sidecar_and_removes_the_segment() {
    let mut sidecar = Sidecar::start();
    let shm = sidecar.shm_name.clone();
    assert!(segment_exists(&shm));
    assert!(sidecar.ok(&["shutdown"]).contains("draining and stopping"));
    let started = Instant::now();
    let status = loop {
        if let Some(status) = sidecar.child.try_wait().unwrap() {
            break status;
        }
        assert!(started.elapsed() < Duration::from_secs(30), "still running");
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success());
    assert!(!segment_exists(&shm));
    assert!(
        !sidecar.socket.exists(),
        "the admin socket outlived the sidecar"
    );
    let e = sidecar.fails(&["status"]);
    assert!(e.contains("is the sidecar running"), "{e}");
}

/// Graph updates acknowledged through the admin socket survive a clean
/// stop (`shutdown`, as SIGTERM): the stop compacts them into the index, so
/// the restarted sidecar serves them, the node's row included; the
/// acknowledgement says they are in memory until then.
#[test]
fn a_clean_stop_keeps_the_acknowledged_graph_updates() {
    let mut sidecar = Sidecar::start();
    let row: Vec<String> = (0..1433).map(|i| format!("{}", (i % 5) as f32)).collect();
    let said = sidecar.ok(&[
        "graph",
        "add-node",
        "2708",
        "--features",
        &row.join(","),
        "--edge",
        "1",
    ]);
    assert!(
        said.contains("in memory until the graph is compacted"),
        "{said}"
    );
    let edges = sidecar.dir.path().join("edges.txt");
    std::fs::write(&edges, "2708 3\n").unwrap();
    let added = sidecar.json(&["graph", "add-edges", "--file", edges.to_str().unwrap()]);
    assert_eq!(
        (&added["edges_added"], &added["durable"]),
        (&2.into(), &false.into())
    );
    let before = sidecar.json(&["graph", "checksum"]);
    assert_eq!(before["n_nodes"], 2709);
    sidecar.ok(&["shutdown"]);
    let status = sidecar.child.wait().unwrap();
    assert!(status.success(), "{status:?}");

    let dir = std::mem::replace(&mut sidecar.dir, tempfile::tempdir().unwrap());
    let again = Sidecar::spawn(dir, &["--deadline-ms", "10000"]);
    again.wait_ready();
    let after = again.json(&["graph", "checksum"]);
    assert_eq!(
        (&after["checksum"], &after["n_nodes"]),
        (&before["checksum"], &before["n_nodes"]),
        "the restarted sidecar serves the updated graph"
    );
    let client = again.client();
    let response = client.call(&CallRequest::new(&[2708])).unwrap();
    let tables = response.tables().unwrap();
    assert_eq!(tables.target_status()[0], 0, "node 2708 is known");
    let dim = 1433;
    let features = &tables.features()[..dim];
    assert_eq!(features[1], 1.0, "its row is the one added");
    assert!(!tables.fallback(0));
}

/// A dataset of `n` nodes in a ring (each linked to the next, both
/// directions) with `dim` features per node: large enough that importing
/// it takes seconds.
fn ring_dataset(dir: &Path, n: u32, dim: usize) {
    use std::io::Write;
    std::fs::create_dir_all(dir).unwrap();
    let mut pairs: Vec<(u32, u32)> = (0..n)
        .flat_map(|i| [(i, (i + 1) % n), ((i + 1) % n, i)])
        .collect();
    pairs.sort_unstable();
    let mut edges = std::io::BufWriter::new(std::fs::File::create(dir.join("edges.u32")).unwrap());
    for (a, b) in &pairs {
        edges.write_all(&a.to_le_bytes()).unwrap();
        edges.write_all(&b.to_le_bytes()).unwrap();
    }
    edges.flush().unwrap();
    let mut features =
        std::io::BufWriter::new(std::fs::File::create(dir.join("features.f32")).unwrap());
    for i in 0..n {
        for j in 0..dim {
            features
                .write_all(&(((i as usize + j) % 7) as f32).to_le_bytes())
                .unwrap();
        }
    }
    features.flush().unwrap();
    std::fs::write(
        dir.join("meta.json"),
        format!(
            "{{\"name\": \"ring\", \"num_nodes\": {n}, \"num_edges\": {}, \"feature_dim\": {dim}}}",
            pairs.len()
        ),
    )
    .unwrap();
}

#[test]
fn not_ready_until_loaded_and_warm_and_not_live_when_it_does_not_answer() {
    // The sidecar seeds its data directory from a 128 MB dataset at start:
    // seconds of `loading`, then `warming-up`, before the ring exists.
    let dir = tempfile::tempdir().unwrap();
    let seed = dir.path().join("ring-dataset");
    ring_dataset(&seed, 500_000, 64);
    let sidecar = Sidecar::spawn(
        dir,
        &[
            "--seed-dataset",
            seed.to_str().unwrap(),
            "--warm-up",
            "200000",
        ],
    );
    assert!(
        eventually(Duration::from_secs(30), || {
            let out = sidecar.ctl(&["ready"]);
            let said = String::from_utf8_lossy(&out.stdout);
            out.status.code() == Some(1)
                && (said.contains("not ready: loading") || said.contains("not ready: warming-up"))
        }),
        "no 'not ready' answer while loading"
    );
    let (code, body) = http_request(&sidecar.metrics, "GET", "/readyz", None).unwrap();
    assert!(code == 503 || code == 200, "{code} {body}");
    if code == 503 {
        assert!(body.starts_with("not ready"), "{body}");
        assert!(!segment_exists(&sidecar.shm_name), "a ring before ready");
    }
    assert!(
        sidecar.ctl(&["live"]).status.success(),
        "live while loading"
    );
    sidecar.wait_ready();
    assert!(segment_exists(&sidecar.shm_name));
    assert_eq!(sidecar.metric("sidecar_ready"), 1.0);
    assert_eq!(sidecar.json(&["status"])["n_nodes"], 500_000);

    // A stopped process answers nothing: the probes fail (and say why).
    freeze_process(sidecar.child.id());
    let out = sidecar.ctl(&["--timeout-s", "1", "live"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("sent nothing for 1 s"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        status_within(&sidecar.metrics, "/healthz", Duration::from_secs(1)),
        None,
        "/healthz answered from a stopped process"
    );
    thaw_process(sidecar.child.id());
    assert!(sidecar.ctl(&["live"]).status.success());
    assert_eq!(
        status_within(&sidecar.metrics, "/healthz", Duration::from_secs(5)),
        Some(200)
    );
}

#[test]
fn silent_connections_cannot_lock_operators_out_and_an_eviction_says_why() {
    let sidecar = Sidecar::start();
    use std::io::{Read, Write};
    // Twice as many connections as the cap, none of which says Hello: once
    // the first ones are past the grace, each one past the cap closes the
    // one that waited longest, with the reason.
    use sidecar::admin::server::{HELLO_GRACE, MAX_CONNECTIONS};
    let mut silent = Vec::new();
    for _ in 0..MAX_CONNECTIONS {
        silent.push(std::os::unix::net::UnixStream::connect(&sidecar.socket).unwrap());
    }
    std::thread::sleep(HELLO_GRACE + Duration::from_millis(50));
    for _ in 0..MAX_CONNECTIONS {
        silent.push(std::os::unix::net::UnixStream::connect(&sidecar.socket).unwrap());
    }
    let first = &mut silent[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut got = Vec::new();
    let _ = first.read_to_end(&mut got);
    let said = String::from_utf8_lossy(&got);
    assert!(said.contains("closed to make room"), "{said}");
    // While they hold every slot, operators and probes get in at once (the
    // 50 clients of an outside test that reconnect as soon as they are cut
    // off locked `sidecarctl live` out 20 times in 20).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let hammer: Vec<_> = (0..8)
        .map(|_| {
            let (socket, stop) = (sidecar.socket.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&socket) {
                        s.set_read_timeout(Some(Duration::from_millis(500)))
                            .unwrap();
                        let _ = s.read_to_end(&mut Vec::new());
                    }
                }
            })
        })
        .collect();
    for _ in 0..20 {
        let out = sidecar.ctl(&["live"]);
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    assert_eq!(sidecar.json(&["status"])["ready"], true);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for h in hammer {
        h.join().unwrap();
    }
    drop(silent);

    // A Hello that trickles in byte by byte is cut off as a whole.
    let mut slow = std::os::unix::net::UnixStream::connect(&sidecar.socket).unwrap();
    slow.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    slow.write_all(&64u32.to_le_bytes()).unwrap();
    let mut closed = false;
    for _ in 0..80 {
        if slow.write_all(&[0]).is_err() {
            closed = true;
            break;
        }
        let mut byte = [0u8; 1];
        match slow.read(&mut byte) {
            Ok(0) => {
                closed = true;
                break;
            }
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                ) => {}
            _ => {
                closed = true;
                break;
            }
        }
    }
    assert!(closed, "a Hello trickling in for 8 s kept its connection");
}

/// A client of the admin socket that says Hello and then idles, as the
/// outside probe's: `Ok` once it is in, `Err` when turned away.
fn hello(socket: &Path) -> std::io::Result<std::os::unix::net::UnixStream> {
    use sidecar::admin::wire::{
        read_frame, write_frame, AdminRequest, AdminResponse, ADMIN_VERSION,
    };
    let mut stream = std::os::unix::net::UnixStream::connect(socket)?;
    stream.set_read_timeout(Some(Duration::from_secs(5)))?;
    write_frame(
        &mut stream,
        &AdminRequest::Hello {
            version: ADMIN_VERSION,
        },
    )
    .map_err(std::io::Error::other)?;
    match read_frame::<AdminResponse>(&mut stream).map_err(std::io::Error::other)? {
        AdminResponse::Hello { .. } => Ok(stream),
        other => Err(std::io::Error::other(format!("{other:?}"))),
    }
}

/// The outside probe's attack: connections that said Hello and then idle,
/// twice the cap, reconnecting (and saying Hello again) as soon as they
/// are closed, locked `sidecarctl status` out 10 times in 10. Idle ones
/// now make room; while every connection is busy answering, a reserved
/// place answers probes and views; and a client that errs in a loop
/// writes a bounded number of warnings.
#[test]
fn idle_connections_past_their_hello_cannot_lock_operators_out() {
    use sidecar::admin::server::{MAX_CONNECTIONS, WARNINGS_PER_MINUTE};
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicBool, Ordering};
    let sidecar = Sidecar::start();
    let stop = std::sync::Arc::new(AtomicBool::new(false));
    let idlers: Vec<_> = (0..2 * MAX_CONNECTIONS)
        .map(|_| {
            let (socket, stop) = (sidecar.socket.clone(), stop.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut idle) = hello(&socket) else {
                        continue;
                    };
                    // Idle until closed.
                    idle.set_read_timeout(Some(Duration::from_millis(200)))
                        .unwrap();
                    let mut byte = [0u8; 64];
                    while !stop.load(Ordering::Relaxed) {
                        match idle.read(&mut byte) {
                            Ok(0) => break,
                            Ok(_) => {}
                            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
                            Err(_) => break,
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..10 {
        sidecar.ok(&["live"]);
        assert_eq!(sidecar.json(&["status"])["ready"], true);
    }
    stop.store(true, Ordering::Relaxed);
    for thread in idlers {
        thread.join().unwrap();
    }
    stop.store(false, Ordering::Relaxed);
    // Every connection busy: clients that send requests back to back on
    // connections of their own, never idle. A probe and a view get a
    // reserved place; other commands there are refused by name.
    let busy: Vec<_> = (0..MAX_CONNECTIONS)
        .map(|_| {
            let (socket, stop) = (sidecar.socket.clone(), stop.clone());
            std::thread::spawn(move || {
                use sidecar::admin::wire::{read_frame, write_frame, AdminRequest, AdminResponse};
                while !stop.load(Ordering::Relaxed) {
                    let Ok(mut conn) = hello(&socket) else {
                        continue;
                    };
                    while !stop.load(Ordering::Relaxed) {
                        if write_frame(&mut conn, &AdminRequest::Stats).is_err()
                            || read_frame::<AdminResponse>(&mut conn).is_err()
                        {
                            break;
                        }
                    }
                }
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(500));
    for _ in 0..10 {
        sidecar.ok(&["live"]);
        sidecar.ok(&["status"]);
    }
    let refused = sidecar.fails(&["warm", "--top", "10"]);
    assert!(
        refused.contains("a reserved connection answers only"),
        "{refused}"
    );
    stop.store(true, Ordering::Relaxed);
    for thread in busy {
        thread.join().unwrap();
    }
    // A client that errs in a loop: 300 connections sending a frame that
    // is not one. The log holds a bounded number of warnings about them.
    for _ in 0..300 {
        if let Ok(mut conn) = std::os::unix::net::UnixStream::connect(&sidecar.socket) {
            let _ = conn.write_all(&[5, 0, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff]);
            let _ = conn.read_to_end(&mut Vec::new());
        }
    }
    sidecar.ok(&["live"]);
    let log = std::fs::read_to_string(sidecar.dir.path().join("sidecar.log")).unwrap();
    let warned = log
        .lines()
        .filter(|line| line.contains("admin connection ended with an error"))
        .count();
    assert!(warned >= 1, "the errors were logged: {log}");
    assert!(
        warned <= WARNINGS_PER_MINUTE as usize * 2,
        "{warned} warnings about admin connections"
    );
}
