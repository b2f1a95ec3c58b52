//! The update log (docs/updates.md) with real processes: sidecars with
//! their own data directories and segments follow one Redis Stream (one
//! Redis, then a 3-node Redis Cluster); `sidecar publish` appends at a
//! steady rate; a replica SIGKILLed mid-stream and restarted catches up; at
//! the end every replica serves the same graph and the same predictions.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use tests::redis::{RedisCluster, RedisServer};
use tests::stack::{
    dataset, free_port, http_request, metric_value, sidecar_import, workspace_bin, Stack,
    StackOptions,
};

const STREAM: &str = "gnn:updates";
const CORA_NODES: u64 = 2708;
const DIM: usize = 1433;

fn predict(stack: &Stack, ids: &[u64]) -> serde_json::Value {
    let body = serde_json::json!({ "node_ids": ids }).to_string();
    let (code, text) =
        http_request(&stack.http, "POST", "/v1/predict", Some(&body)).expect("POST /v1/predict");
    assert_eq!(code, 200, "{text}");
    serde_json::from_str(&text).expect("JSON")
}

fn ctl_json(stack: &Stack, args: &[&str]) -> serde_json::Value {
    let mut all = vec!["--json"];
    all.extend_from_slice(args);
    serde_json::from_str(&stack.sidecarctl(&all).expect("sidecarctl")).expect("JSON")
}

/// `sidecar publish <args>`; its stdout.
fn publish(args: &[&str]) -> String {
    let out = Command::new(workspace_bin("sidecar"))
        .arg("publish")
        .args(args)
        .output()
        .expect("sidecar publish runs");
    assert!(
        out.status.success(),
        "sidecar publish {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A seeded xorshift generator: the operations are the same every run.
struct Rng(u64);

impl Rng {
    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}

fn row_text(rng: &mut Rng) -> String {
    (0..DIM)
        .map(|_| if rng.below(50) == 0 { "1" } else { "0" })
        .collect::<Vec<_>>()
        .join(",")
}

/// Files of operations, appended one after another: `new_nodes` nodes with
/// rows and two neighbours each, `edges` random edges (10 per entry),
/// `changes` feature changes of existing nodes, interleaved.
fn operation_files(
    dir: &Path,
    files: usize,
    new_nodes: u64,
    edges: u64,
    changes: u64,
) -> Vec<PathBuf> {
    let mut rng = Rng(0x2545_f491_4f6c_dd1d);
    let mut lines: Vec<String> = Vec::new();
    for k in 0..new_nodes {
        let id = CORA_NODES + k;
        lines.push(format!(
            "add-node {id} {} {} row={}",
            rng.below(CORA_NODES),
            rng.below(CORA_NODES),
            row_text(&mut rng)
        ));
    }
    let mut edge_lines = Vec::new();
    for _ in 0..edges / 10 {
        let pairs: Vec<String> = (0..10)
            .map(|_| {
                // Endpoints among the nodes added so far at this point of
                // the stream (nodes are appended first, in order).
                let bound = CORA_NODES + new_nodes;
                format!("{} {}", rng.below(bound), rng.below(bound))
            })
            .collect();
        edge_lines.push(format!("add-edges {}", pairs.join(" ")));
    }
    let mut change_lines = Vec::new();
    for _ in 0..changes {
        change_lines.push(format!(
            "set-features {} row={}",
            rng.below(CORA_NODES),
            row_text(&mut rng)
        ));
    }
    // Interleave edges and changes after the nodes.
    let mut rest: Vec<String> = Vec::new();
    let step = (edge_lines.len() / change_lines.len().max(1)).max(1);
    let mut changes_iter = change_lines.into_iter();
    for (i, line) in edge_lines.into_iter().enumerate() {
        rest.push(line);
        if i % step == 0 {
            rest.extend(changes_iter.next());
        }
    }
    rest.extend(changes_iter);
    lines.extend(rest);
    let per_file = lines.len().div_ceil(files);
    lines
        .chunks(per_file)
        .enumerate()
        .map(|(i, chunk)| {
            let path = dir.join(format!("ops-{i}.txt"));
            std::fs::write(&path, chunk.join("\n") + "\n").unwrap();
            path
        })
        .collect()
}

/// Waits until every stack's follower has applied up to `last`.
fn wait_for_position(stacks: &[&Stack], last: &str) {
    let until = Instant::now() + Duration::from_secs(120);
    for stack in stacks {
        loop {
            let status = ctl_json(stack, &["status"]);
            if status["update_position"] == last {
                break;
            }
            assert!(
                Instant::now() < until,
                "a replica stayed at {} instead of {last}",
                status["update_position"]
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// Every replica: the same digest, counts and generation; the same
/// prediction for each of `nodes`.
fn assert_replicas_agree(stacks: &[&Stack], nodes: &[u64]) {
    let sums: Vec<serde_json::Value> = stacks
        .iter()
        .map(|s| ctl_json(s, &["graph", "checksum"]))
        .collect();
    for sum in &sums[1..] {
        for key in ["checksum", "n_nodes", "n_edges", "generation", "position"] {
            assert_eq!(sum[key], sums[0][key], "{key}: {sums:?}");
        }
    }
    for chunk in nodes.chunks(50) {
        let want = predict(stacks[0], chunk);
        for stack in &stacks[1..] {
            assert_eq!(predict(stack, chunk), want, "predictions of {chunk:?}");
        }
    }
}

fn start_replica(data: &Path, args: &[String]) -> Stack {
    let mut options = StackOptions::new("cora");
    options.imported = Some(data.to_path_buf());
    // A generous feature deadline: a row served late as a default row would
    // make one replica's prediction differ for a reason beside the point.
    options.sidecar_args = ["--deadline-ms".to_string(), "2000".into()]
        .into_iter()
        .chain(args.iter().cloned())
        .collect();
    options.worker_args = vec!["--max-delay-ms".into(), "0".into()];
    Stack::start(&options).expect("a replica")
}

/// The scenario of both tests: three replicas (data directories imported
/// with `import_args`, sidecars given `stream_args`) follow the stream while
/// `sidecar publish` (with `publish_args`) appends 1,000 new nodes with
/// rows, 100,000 edges (10 per entry) and 1,000 feature changes, in ten
/// files a little apart; replica 1 is SIGKILLed after the fourth and
/// restarted after the seventh. At the end all three have applied every
/// entry, report the same digest, counts and generation, and predict the
/// same for every new node and for changed ones.
fn converge(import_args: &[String], stream_args: &[String], publish_args: &[String]) {
    let work = tempfile::tempdir().unwrap();
    let metrics: Vec<String> = (0..3)
        .map(|_| format!("127.0.0.1:{}", free_port()))
        .collect();
    let import: Vec<&str> = import_args.iter().map(String::as_str).collect();
    let mut stacks: Vec<Stack> = (0..3)
        .map(|i| {
            let data = work.path().join(format!("data-{i}"));
            sidecar_import(&dataset("cora"), &data, &import);
            let mut args = stream_args.to_vec();
            args.extend(["--metrics-addr".to_string(), metrics[i].clone()]);
            start_replica(&data, &args)
        })
        .collect();
    let new_nodes = 1_000;
    let files = operation_files(work.path(), 10, new_nodes, 100_000, 1_000);
    let data0 = work.path().join("data-0").display().to_string();
    let mut last = String::new();
    let started = Instant::now();
    for (i, file) in files.iter().enumerate() {
        let mut args: Vec<&str> = publish_args.iter().map(String::as_str).collect();
        args.extend(["--data-dir", &data0, "--file", file.to_str().unwrap()]);
        last = publish(&args)
            .trim()
            .rsplit(' ')
            .next()
            .unwrap()
            .to_string();
        if i == 3 {
            // Mid-stream: replica 1 dies without a word.
            let sidecar = stacks[1].sidecar.as_mut().unwrap();
            sidecar.child.kill().unwrap();
            sidecar.child.wait().unwrap();
        }
        if i == 6 {
            stacks[1].restart_sidecar().expect("replica 1 restarts");
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!(
        "published {} files in {:.1} s; last entry {last}",
        files.len(),
        started.elapsed().as_secs_f64()
    );
    let refs: Vec<&Stack> = stacks.iter().collect();
    wait_for_position(&refs, &last);
    for addr in &metrics {
        assert_eq!(metric_value(addr, "sidecar_updates_malformed_total"), 0.0);
        assert_eq!(metric_value(addr, "sidecar_update_lag_seconds"), 0.0);
    }
    // Replica 1's counters restarted with it; the others saw every entry.
    for addr in [&metrics[0], &metrics[2]] {
        assert_eq!(
            metric_value(addr, "sidecar_updates_applied_total{op=\"add_node\"}"),
            new_nodes as f64
        );
    }
    let sum = ctl_json(&stacks[0], &["graph", "checksum"]);
    assert_eq!(sum["n_nodes"], CORA_NODES + new_nodes);
    assert_eq!(sum["generation"], 1_000 + 10_000, "one per graph entry");
    let new: Vec<u64> = (CORA_NODES..CORA_NODES + new_nodes).collect();
    assert_replicas_agree(&refs, &new);
    // Existing nodes whose rows changed: every replica serves the new rows.
    assert_replicas_agree(&refs, &(0..200).collect::<Vec<u64>>());
    // New nodes are served their own rows, not default ones.
    let answer = predict(&stacks[1], &new[..50]);
    for p in answer["predictions"].as_array().unwrap() {
        assert_eq!(p["known"], true, "{p}");
        assert_eq!(p["fallback_rows"], 0, "{p}");
    }
    // Graph changes through one replica's admin socket would diverge it.
    let err = stacks[0]
        .sidecarctl(&["graph", "add-node", "5000", "--features-file", "/dev/null"])
        .unwrap_err()
        .to_string();
    assert!(err.contains("follows the update stream"), "{err}");
    for stack in stacks {
        assert!(stack.stop(), "clean shutdown");
    }
}

/// Features in Redis (an L2 cache per replica), the stream on the same
/// Redis.
#[test]
fn three_replicas_follow_one_stream_through_a_kill_and_agree() {
    let redis = RedisServer::start();
    converge(
        &["--redis".into(), redis.url()],
        &[
            "--redis".into(),
            redis.url(),
            "--updates-stream".into(),
            STREAM.into(),
        ],
        &["--redis".into(), redis.url()],
    );
}

/// The stream on a 3-node Redis Cluster; the replicas' features in their
/// embedded stores, so every row travels in its entry.
#[test]
fn replicas_with_embedded_stores_follow_a_stream_on_a_redis_cluster() {
    let cluster = RedisCluster::start();
    let mut stream_args = vec![
        "--redis-cluster".to_string(),
        "--updates-stream".into(),
        STREAM.into(),
    ];
    let mut publish_args = vec!["--redis-cluster".to_string()];
    for url in cluster.urls() {
        stream_args.extend(["--updates-redis".into(), url.clone()]);
        publish_args.extend(["--redis".into(), url]);
    }
    converge(&[], &stream_args, &publish_args);
}

/// Entries that break the contract are skipped whole, counted and logged
/// with their stream id; the entries after them are applied.
#[test]
fn malformed_entries_are_skipped_whole_and_counted() {
    let redis = RedisServer::start();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data");
    sidecar_import(&dataset("cora"), &data, &["--redis", &redis.url()]);
    let metrics = format!("127.0.0.1:{}", free_port());
    let stack = start_replica(
        &data,
        &[
            "--redis".into(),
            redis.url(),
            "--updates-stream".into(),
            STREAM.into(),
            "--metrics-addr".into(),
            metrics.clone(),
        ],
    );
    // `sidecar publish --data-dir` refuses what the replicas would skip,
    // checked as they check it, and appends nothing.
    let short_row = work.path().join("short.f32");
    std::fs::write(&short_row, [0u8; 8]).unwrap();
    let (url, data_arg) = (redis.url(), data.display().to_string());
    let row_file = format!("row-file={}", short_row.display());
    for (op, expected) in [
        (
            vec!["set-features", "5", row_file.as_str()],
            "the row has 2 values; this graph's rows have 1433",
        ),
        (
            vec!["add-node", "airport", "1"],
            "the data directory holds a one-type graph",
        ),
    ] {
        let mut args = vec!["publish", "--redis", &url, "--data-dir", &data_arg];
        args.extend(&op);
        let out = Command::new(workspace_bin("sidecar"))
            .args(&args)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{op:?} was published");
        assert!(stderr.contains(expected), "{op:?}: {stderr}");
    }
    assert!(
        redis.command("XLEN gnn:updates").contains(":0"),
        "nothing appended"
    );
    let before = ctl_json(&stack, &["graph", "checksum"]);
    for bad in [
        "XADD gnn:updates * op drop_node id 5",
        "XADD gnn:updates * op add_edges edges 1",
        "XADD gnn:updates * op add_node id 4294967295",
        "XADD gnn:updates * op add_node id 3000000",
        "XADD gnn:updates * op set_features id 5 row abc",
        "XADD gnn:updates * op add_edges edges 1_2",
        "XADD gnn:updates * op invalidate ids 1 colour red",
        "XADD gnn:updates * id 5",
    ] {
        assert!(redis.command(bad).starts_with('$'), "{bad}");
    }
    let good = publish(&[
        "--redis",
        &redis.url(),
        "add-edges",
        "0",
        "2707",
        "directed",
    ]);
    let last = good.trim().rsplit(' ').next().unwrap().to_string();
    wait_for_position(&[&stack], &last);
    assert_eq!(
        metric_value(&metrics, "sidecar_updates_malformed_total"),
        8.0
    );
    let after = ctl_json(&stack, &["graph", "checksum"]);
    assert_eq!(
        after["n_edges"].as_u64().unwrap(),
        before["n_edges"].as_u64().unwrap() + 1,
        "only the good entry changed the graph"
    );
    assert_eq!(
        after["n_nodes"], before["n_nodes"],
        "no malformed node half-added"
    );
    assert_eq!(after["generation"].as_u64().unwrap(), 1);
    assert!(stack.stop());
}

/// A replica started from another's data directory (compacted, stopped)
/// replays the stream from the position that snapshot records; a snapshot
/// whose position was trimmed away is refused with how to re-seed it.
#[test]
fn a_replica_from_a_snapshot_replays_from_its_position_and_a_trimmed_one_is_refused() {
    let redis = RedisServer::start();
    let work = tempfile::tempdir().unwrap();
    let data = work.path().join("data-a");
    sidecar_import(&dataset("cora"), &data, &["--redis", &redis.url()]);
    let args = vec![
        "--redis".to_string(),
        redis.url(),
        "--updates-stream".into(),
        STREAM.into(),
    ];
    // A snapshot at position 0-0, as `sidecar import` writes one.
    let old_snapshot = work.path().join("snapshot-old");
    sidecar_import(&dataset("cora"), &old_snapshot, &["--redis", &redis.url()]);
    let a = start_replica(&data, &args);
    publish(&["--redis", &redis.url(), "add-edges", "1", "2", "3", "4"]);
    let out = publish(&["--redis", &redis.url(), "add-edges", "5", "6"]);
    let mid = out.trim().rsplit(' ').next().unwrap().to_string();
    wait_for_position(&[&a], &mid);
    a.sidecarctl(&["graph", "compact"]).unwrap();
    let compacted = ctl_json(&a, &["graph", "checksum"]);
    assert_eq!(compacted["position"], mid.as_str());
    assert!(a.stop());
    // The stopped replica's directory is the snapshot.
    let snapshot = work.path().join("data-b");
    copy_dir(&data, &snapshot);
    let out = publish(&["--redis", &redis.url(), "add-node", "2708", "7"]);
    let last = out.trim().rsplit(' ').next().unwrap().to_string();
    let b = start_replica(&snapshot, &args);
    wait_for_position(&[&b], &last);
    let sum = ctl_json(&b, &["graph", "checksum"]);
    assert_eq!(sum["n_nodes"], CORA_NODES + 1);
    assert_eq!(
        sum["generation"], 3,
        "two in the compacted index, one replayed"
    );
    assert!(b.stop());

    // Entries up to `mid` trimmed: the old snapshot (position 0-0) cannot
    // catch up, and says so.
    assert!(redis
        .command(&format!("XTRIM {STREAM} MINID {last}"))
        .starts_with(':'));
    let out = Command::new(workspace_bin("sidecar"))
        .args(["serve", "--data-dir"])
        .arg(&old_snapshot)
        .args(["--shm-name", &format!("gnn-trimmed-{}", std::process::id())])
        .args(&args)
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("trimmed past") && err.contains("Re-seed"),
        "{err}"
    );
}

fn copy_dir(from: &Path, to: &Path) {
    let status = Command::new("cp")
        .arg("-a")
        .arg(from)
        .arg(to)
        .status()
        .unwrap();
    assert!(status.success());
    // The copy must not carry the source's lock holder: it is a file lock,
    // released with the process, so the copied file is harmless.
}
