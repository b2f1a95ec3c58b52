//! A sidecar serving a typed graph over the ring (docs/protocol.md, "Typed
//! requests" and section 4.4): the shipped OpenFlights imported, a real
//! `sidecar serve`, the Rust client and pyarrow reading the typed response
//! in place, checked against the model tooling's sampler (`common.sample`) and the
//! dataset's own feature files; RocksDB and a real redis-server behind the
//! types' tiers; what a typed sidecar refuses.

use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use protocol::graph_schema::GraphSchema;
use protocol::payload::schema::{target_status, tier};
use protocol::payload::GraphTables;
use protocol::request::GraphAsk;
use protocol::{CallError, CallRequest, RingClient};
use tests::eventually;
use tests::redis::RedisServer;
use tests::stack::{dataset, python, read_f32, repo_root, run_ok, workspace_bin, Daemon};
use tests::typed::TypedSidecar;

/// What the model tooling's `common.sample` samples for `targets` (airports) at
/// `fanout` for every edge type and hop.
fn python_sample(targets: &[u64], hops: usize, fanout: u32) -> serde_json::Value {
    tests::stack::openflights_python_sample(targets, hops, fanout)
}

fn ask(schema: &GraphSchema, hops: u32, fanout: u32) -> GraphAsk {
    GraphAsk {
        target_type: schema.node_type("airport").unwrap() as u32,
        hops,
        fanouts: vec![fanout; schema.edge_types.len() * hops as usize],
        edge_data: Default::default(),
    }
}

fn call(client: &RingClient, targets: &[u64], ask: &GraphAsk) -> protocol::Response {
    let mut request = CallRequest::new(targets);
    request.graph = Some(ask);
    request.timeout = Some(Duration::from_secs(10));
    client.call(&request).expect("a typed call")
}

/// The dataset's feature rows of node type `name` (width `dim`), by id.
fn rows(name: &str, dim: usize) -> impl Fn(u64) -> Vec<f32> {
    let all = read_f32(&dataset("openflights").join(format!("nodes/{name}.f32")));
    move |id| all[id as usize * dim..(id as usize + 1) * dim].to_vec()
}

/// The response holds PyG tooling's subgraph exactly: every type's node
/// ids in order, every edge type's edge_index, every count; each row of a
/// type with features is the dataset's row of that node.
fn assert_is_python_sample(tables: &GraphTables, schema: &GraphSchema, want: &serde_json::Value) {
    for (t, node_type) in schema.node_types.iter().enumerate() {
        let ids: Vec<u64> = serde_json::from_value(want["n_id"][&node_type.name].clone()).unwrap();
        assert_eq!(tables.node_ids(t), ids, "{} ids", node_type.name);
        let counts: Vec<i64> =
            serde_json::from_value(want["nodes"][&node_type.name].clone()).unwrap();
        assert_eq!(tables.sampled_nodes(t), counts, "{} counts", node_type.name);
        let dim = node_type.feature_dim as usize;
        if dim == 0 {
            assert!(tables.features(t).is_empty() && tables.tiers(t).is_empty());
            continue;
        }
        let row_of = rows(&node_type.name, dim);
        for (row, &id) in ids.iter().enumerate() {
            assert_eq!(
                &tables.features(t)[row * dim..(row + 1) * dim],
                row_of(id),
                "{} row {row} (node {id})",
                node_type.name
            );
            assert!(!tables.fallback(t, row));
        }
    }
    for e in 0..schema.edge_types.len() {
        let key = schema.edge_key(e);
        let index: Vec<Vec<i64>> =
            serde_json::from_value(want["edge_index"][&key].clone()).unwrap();
        let flat: Vec<i64> = index.concat();
        assert_eq!(tables.edge_index(e), flat, "{key}");
        let counts: Vec<i64> = serde_json::from_value(want["edges"][&key].clone()).unwrap();
        assert_eq!(tables.sampled_edges(e), counts, "{key} counts");
    }
}

#[test]
fn a_typed_call_answers_pyg_tooling_s_subgraph_with_each_type_s_rows() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().expect("a typed segment");
    assert_eq!(
        schema.describe(),
        "airport (11 f32), airline (3 f32), country (ids), plane (ids); \
         airport__route__airport (4 attributes), airline__serves__airport, airport__rev_serves__airline, \
         airport__located_in__country, country__rev_located_in__airport, \
         airline__based_in__country, country__rev_based_in__airline, airline__flies__plane, \
         plane__rev_flies__airline"
    );
    assert_eq!(client.schema().unwrap().feature_dim, 0);
    // Covering fanouts (every source at every hop): a small airport, the
    // largest hub with one hop, a batch with a repeat.
    for (targets, hops) in [
        (vec![1u64], 2u32),
        (vec![3482], 1),
        (vec![5, 3482, 5, 900, 7000], 2),
    ] {
        let response = call(&client, &targets, &ask(&schema, hops, 2048));
        let tables = response.graph_tables(0).expect("a valid typed response");
        assert_eq!(tables.hops(), hops as usize);
        assert_eq!(tables.target_ids(), targets);
        assert!(tables
            .target_status()
            .iter()
            .all(|&s| s == target_status::OK));
        // A repeated target points at its one row; targets first.
        let rows: Vec<i32> = tables.target_rows().to_vec();
        assert_eq!(rows[0], 0);
        if targets.len() == 5 {
            assert_eq!(rows, [0, 1, 0, 2, 3]);
        }
        assert_is_python_sample(
            &tables,
            &schema,
            &python_sample(&targets, hops as usize, 100_000),
        );
    }
    // Small fanouts: the sidecar's own seeded draws, the same on every
    // call, each destination within its fanout (real edges:
    // sidecar/tests/typed_index.rs).
    let small = ask(&schema, 2, 3);
    let first = call(&client, &[3482, 17], &small);
    let second = call(&client, &[3482, 17], &small);
    let (a, b) = (
        first.graph_tables(0).unwrap(),
        second.graph_tables(0).unwrap(),
    );
    for e in 0..schema.edge_types.len() {
        assert_eq!(
            a.edge_index(e),
            b.edge_index(e),
            "the same call, the same draws"
        );
        let dst = &a.edge_index(e)[a.edge_index(e).len() / 2..];
        for row in dst {
            assert!(
                dst.iter().filter(|&&r| r == *row).count() <= 3,
                "fanout 3 holds"
            );
        }
    }
}

#[test]
fn an_unknown_target_gets_a_default_row_and_no_edges() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let response = call(&client, &[7698, 1], &ask(&schema, 1, 5));
    let tables = response.graph_tables(0).unwrap();
    assert_eq!(
        tables.target_status(),
        [target_status::UNKNOWN_NODE, target_status::OK]
    );
    assert_eq!(tables.node_ids(0)[0], 7698);
    assert!(
        tables.fallback(0, 0),
        "the unknown airport's row is a default"
    );
    assert_eq!(tables.tiers(0)[0], tier::DEFAULT);
    // The default row: the airports' mean row (default_row "mean").
    let all = read_f32(&dataset("openflights").join("nodes/airport.f32"));
    let n = all.len() / 11;
    for (j, &got) in tables.features(0)[..11].iter().enumerate() {
        let mean = (0..n).map(|i| f64::from(all[i * 11 + j])).sum::<f64>() / n as f64;
        assert!(
            (f64::from(got) - mean).abs() < 1e-5,
            "column {j}: {got} vs {mean}"
        );
    }
    for e in 0..schema.edge_types.len() {
        let index = tables.edge_index(e);
        let dst = &index[index.len() / 2..];
        if schema.edge_types[e].dst == 0 {
            assert!(
                !dst.contains(&0),
                "{}: no edge into the unknown target",
                schema.edge_key(e)
            );
        }
    }
    // `sidecarctl stats` and `status` read the counters `/metrics` counts
    // per node type (before: 0 fallback rows in `stats` beside 1,118 in
    // `/metrics` on a typed sidecar).
    let (_, text) = tests::stack::http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
    let counted = |name: &str, label: &str| -> u64 {
        text.lines()
            .filter(|line| line.starts_with(name) && line.contains(label))
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .sum::<f64>() as u64
    };
    let missing = counted("sidecar_feature_fallbacks_total", "cause=\"missing\"");
    assert!(missing >= 1, "{text}");
    let stats = sidecar.sidecarctl_json(&["stats"]);
    let in_stats = stats["fallbacks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f[0] == "missing")
        .map(|f| f[1].as_u64().unwrap());
    assert_eq!(in_stats, Some(missing), "{stats}");
    let rows = counted("sidecar_feature_rows_total", "tier=");
    let stats_rows: u64 = stats["tiers"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|t| t["tier"] != "default")
        .map(|t| t["rows"].as_u64().unwrap())
        .sum();
    assert_eq!(stats_rows, rows, "{stats}");
}

#[test]
fn a_typed_sidecar_refuses_one_type_calls_and_commands_by_name() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    // A one-type call, refused before a slot is claimed.
    let error = client.call(&CallRequest::new(&[1])).unwrap_err();
    assert!(
        matches!(&error, CallError::Graph(m) if m.contains("serves a typed graph (airport (11 f32)")
            && m.ends_with("): send a graph-layout request (`graph`)")),
        "{error}"
    );
    // Fanouts of the wrong count, a type the graph lacks, a fanout past the cap.
    let mut wrong = ask(&schema, 2, 3);
    wrong.fanouts.pop();
    let mut request = CallRequest::new(&[1]);
    request.graph = Some(&wrong);
    let error = client.call(&request).unwrap_err().to_string();
    assert!(
        error.contains("17 fanouts; this graph has 9 edge types, so 2 hops need 18"),
        "{error}"
    );
    let mut unknown_type = ask(&schema, 1, 3);
    unknown_type.target_type = 4;
    request.graph = Some(&unknown_type);
    let error = client.call(&request).unwrap_err().to_string();
    assert!(
        error.contains("target type 4 is not a node type of this graph"),
        "{error}"
    );
    let above = ask(&schema, 1, 5000);
    request.graph = Some(&above);
    let error = client.call(&request).unwrap_err().to_string();
    assert!(
        error.contains(
            "fanout 5000 of edge type airport__route__airport at hop 1 exceeds the cap 2048"
        ),
        "{error}"
    );
    // The operator's commands of a one-type graph: refused, with the
    // typed form where there is one.
    for (args, expected) in [
        (
            vec!["invalidate", "1"],
            "name the type (`sidecarctl invalidate --type",
        ),
        (
            vec!["graph", "add-node", "9000", "--features", "1,2"],
            "name the type (`sidecarctl graph add-node --type",
        ),
        (vec!["cache", "flush"], "is for one-type graphs"),
        (
            vec!["warm", "--ids-file", "/dev/null"],
            "name the type (`sidecarctl warm --type TYPE --ids-file F`",
        ),
    ] {
        let out = sidecar.sidecarctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} was accepted");
        assert!(
            stderr.contains("serves a typed graph") && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
    }
    let status = sidecar.sidecarctl(&["--json", "status"]);
    assert!(status.status.success());
    let status: serde_json::Value = serde_json::from_slice(&status.stdout).unwrap();
    assert_eq!(status["store"], "typed graph: 4 node types, 9 edge types");
    assert_eq!(status["n_nodes"], 7698 + 6162 + 261 + 246);
    assert_eq!(status["ready"], true);
}

/// A typed sidecar on OpenFlights whose features are in `redis`: no L2,
/// a deadline no loaded CI machine misses, and nothing pinned at start
/// (every row comes from Redis first), with `extra` serve arguments.
fn redis_sidecar(redis: &RedisServer, extra: &[&str]) -> TypedSidecar {
    let url = redis.url();
    let mut serve = vec![
        "--redis",
        &url,
        "--no-l2",
        "--deadline-ms",
        "5000",
        "--warm-up",
        "0",
    ];
    serve.extend_from_slice(extra);
    TypedSidecar::start(&["--redis", &url], &serve)
}

#[test]
fn a_typed_graph_s_rows_come_from_redis_per_type_then_l1() {
    let redis = RedisServer::start();
    let sidecar = redis_sidecar(&redis, &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let targets = [5u64, 900];
    let want = python_sample(&targets, 2, 100_000);
    let first = call(&client, &targets, &ask(&schema, 2, 2048));
    let tables = first.graph_tables(0).unwrap();
    assert_is_python_sample(&tables, &schema, &want);
    assert!(
        tables.tiers(0).iter().all(|&t| t == tier::L3),
        "airports from Redis"
    );
    assert!(
        tables.tiers(1).iter().all(|&t| t == tier::L3),
        "airlines from Redis"
    );
    drop(tables);
    drop(first);
    // The rows a fetch brought are put in L1 as it lands, off the request's
    // path: a later call finds them there.
    let mut again = call(&client, &targets, &ask(&schema, 2, 2048));
    let mut calls = 2.0;
    let in_l1 = |response: &protocol::Response| {
        let tables = response.graph_tables(0).unwrap();
        tables.tiers(0).iter().all(|&t| t == tier::L1)
    };
    let filled = eventually(Duration::from_secs(10), || {
        again = call(&client, &targets, &ask(&schema, 2, 2048));
        calls += 1.0;
        in_l1(&again)
    });
    assert!(filled, "then from L1");
    let tables = again.graph_tables(0).unwrap();
    assert_is_python_sample(&tables, &schema, &want);
    // Each type's tiers count their own rows, labelled by type.
    let (code, body) =
        tests::stack::http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    let labelled = |metric: &str, node_type: &str, label: &str| -> f64 {
        body.lines()
            .find(|l| {
                l.starts_with(&format!("{metric}{{"))
                    && l.contains(&format!("node_type=\"{node_type}\""))
                    && l.contains(label)
            })
            .and_then(|l| l.rsplit(' ').next()?.parse().ok())
            .unwrap_or_else(|| panic!("no {metric} of {node_type} ({label}) in:\n{body}"))
    };
    let rows = |node_type: &str, tier: &str| -> f64 {
        labelled(
            "sidecar_feature_rows_total",
            node_type,
            &format!("tier=\"{tier}\""),
        )
    };
    // At least one call's rows from each tier (a call made before the
    // first fetch had landed in L1 read Redis again).
    let airports = tables.n_rows(0) as f64;
    assert!(rows("airport", "l3") >= airports);
    assert!(rows("airport", "l1") >= airports);
    assert!(rows("airline", "l3") >= tables.n_rows(1) as f64);
    // Every call counts each airport row once: from a tier, or as joining
    // a fetch still in flight (a call made while the previous call's fetch
    // was putting its rows in L1).
    let coalesced = labelled("sidecar_feature_coalesced_total", "airport", "");
    assert_eq!(
        rows("airport", "l3") + rows("airport", "l1") + coalesced,
        airports * calls,
        "every call counts each airport row once ({calls} calls)"
    );
    // The graph's metrics are the one store's: nodes and edges over every
    // type, as `graph checksum` counts them.
    let gauge = |name: &str| -> u64 {
        body.lines()
            .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
    };
    let graph = sidecar.sidecarctl_json(&["graph", "checksum"]);
    assert_eq!(gauge("sidecar_graph_nodes"), 7698 + 6162 + 261 + 246);
    assert_eq!(
        Some(gauge("sidecar_graph_nodes")),
        graph["n_nodes"].as_u64()
    );
    assert_eq!(
        Some(gauge("sidecar_graph_edges")),
        graph["n_edges"].as_u64()
    );
}

/// What tests/python/read_typed_segment.py, written from docs/protocol.md
/// alone, reads of slot `slot` of segment `name` with pyarrow.
fn read_typed_segment(name: &str, slot: usize) -> serde_json::Value {
    let script = repo_root().join("tests/python/read_typed_segment.py");
    let (stdout, _) = run_ok(
        Command::new(python())
            .arg(&script)
            .arg(name)
            .arg(slot.to_string()),
        "read_typed_segment.py",
    );
    serde_json::from_str(&stdout).unwrap()
}

#[test]
fn pyarrow_reads_a_typed_response_in_place_as_the_client_does() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let targets = [5u64, 3482, 7698];
    let response = call(&client, &targets, &ask(&schema, 2, 7));
    let tables = response.graph_tables(0).unwrap();
    let out = read_typed_segment(&sidecar.shm_name, response.slot_index());
    assert_eq!(out["buffers_outside"], 0, "pyarrow copied a buffer: {out}");
    assert_eq!(out["buffers_misaligned"], 0);
    assert_eq!(
        out["node_types"],
        serde_json::json!(["airport", "airline", "country", "plane"])
    );
    assert_eq!(out["target_ids"], serde_json::json!(targets));
    for (t, node_type) in schema.node_types.iter().enumerate() {
        let name = &node_type.name;
        assert_eq!(
            out["n_id"][name],
            serde_json::json!(tables.node_ids(t)),
            "{name}"
        );
        assert_eq!(
            out["num_sampled_nodes"][name],
            serde_json::json!(tables.sampled_nodes(t))
        );
        if node_type.feature_dim > 0 {
            let x: Vec<f32> = serde_json::from_value(out["x"][name].clone()).unwrap();
            assert_eq!(x, tables.features(t), "{name}");
            let fallback: Vec<bool> = (0..tables.n_rows(t))
                .map(|r| tables.fallback(t, r))
                .collect();
            assert_eq!(out["fallback"][name], serde_json::json!(fallback));
        } else {
            assert!(out["x"][name].is_null(), "{name} has no features");
        }
    }
    for e in 0..schema.edge_types.len() {
        let key = schema.edge_key(e);
        let index = tables.edge_index(e);
        let (src, dst) = index.split_at(index.len() / 2);
        assert_eq!(
            out["edge_index"][&key],
            serde_json::json!([src, dst]),
            "{key}"
        );
        assert_eq!(
            out["num_sampled_edges"][&key],
            serde_json::json!(tables.sampled_edges(e))
        );
    }
}

#[test]
fn a_worker_of_a_one_type_model_refuses_a_typed_sidecar_by_name() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let stderr = refused_worker(&sidecar, &tests::stack::trained_model("cora"), &[]);
    assert!(
        stderr.contains("the sidecar serves a typed graph")
            && stderr.contains("serve it beside a sidecar of a one-type graph"),
        "{stderr}"
    );
}

/// A model trained and exported by `pyg_model.py train` on OpenFlights
/// with `args`.
fn train_hetero(tag: &str, args: &[&str]) -> PathBuf {
    tests::stack::hetero_model_for(&dataset("openflights"), args, tag)
}

/// A `to_hetero` GraphSAGE at its default fanouts ([10, 5] on every edge
/// type), with three runs of NeighborLoader-style inference in its
/// manifest.
fn trained_to_hetero() -> PathBuf {
    let args = [
        "--arch",
        "to_hetero",
        "--epochs",
        "60",
        "--loader-runs",
        "3",
    ];
    train_hetero("typed-serving-model", &args)
}

/// A worker serving `model` beside `sidecar`; its HTTP address.
fn start_worker(sidecar: &TypedSidecar, model: &std::path::Path) -> (Daemon, String) {
    let worker = tests::typed::Worker::start(&sidecar.shm_name, model, &[]);
    (worker.daemon, worker.http)
}

/// The largest difference of the answers' logits for `ids` from PyG's
/// full-graph outputs (`reference/outputs.f32` of `model`), relative to
/// each row's magnitude (at least 1).
fn worst_difference(answers: &[serde_json::Value], ids: &[u64], model: &std::path::Path) -> f32 {
    let full = read_f32(&model.join("reference/outputs.f32"));
    let width = full.len() / 7698;
    let mut worst = 0f32;
    for (answer, &id) in answers.iter().zip(ids) {
        let logits: Vec<f32> = serde_json::from_value(answer["logits"].clone()).unwrap();
        assert_eq!(logits.len(), width);
        let want = &full[id as usize * width..(id as usize + 1) * width];
        let scale = want.iter().fold(1f32, |m, v| m.max(v.abs()));
        for (got, want) in logits.iter().zip(want) {
            worst = worst.max((got - want).abs() / scale);
        }
    }
    worst
}

/// The worker's predictions for `ids`, 16 a call.
fn predict(http: &str, ids: &[u64]) -> Vec<serde_json::Value> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(16) {
        let body = serde_json::json!({ "node_ids": chunk }).to_string();
        let (code, text) =
            tests::stack::http_request(http, "POST", "/v1/predict", Some(&body)).unwrap();
        assert_eq!(code, 200, "{text}");
        let answer: serde_json::Value = serde_json::from_str(&text).unwrap();
        out.extend(answer["predictions"].as_array().unwrap().iter().cloned());
    }
    out
}

#[test]
fn a_pyg_to_hetero_model_is_served_with_pyg_s_answers() {
    let model = trained_to_hetero();
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let sidecar = TypedSidecar::start(&[], &[]);
    let labels = tests::stack::read_i32(&dataset("openflights").join("labels.i32"));
    let split: Vec<u8> = std::fs::read(dataset("openflights").join("split.u8")).unwrap();
    let test: Vec<u64> = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect();

    // Sampled at the model's fanouts ([10, 5]): served accuracy within 1.5
    // points of PyG's NeighborLoader-style inference at the same fanouts.
    let (worker, http) = start_worker(&sidecar, &model);
    let answers = predict(&http, &test);
    let correct = answers
        .iter()
        .zip(&test)
        .filter(|(a, &id)| a["label"].as_i64() == Some(i64::from(labels[id as usize])))
        .count();
    let served = correct as f64 / test.len() as f64;
    let loader = manifest["neighbor_loader"]["mean_test_accuracy"]
        .as_f64()
        .unwrap();
    assert!(
        (served - loader).abs() <= 0.015,
        "served accuracy {served:.4}, NeighborLoader's {loader:.4}"
    );
    assert!(answers
        .iter()
        .all(|a| a["known"] == true && a["answered_by"] == "gnn"));
    // An airport the graph does not have is answered, flagged unknown.
    let unknown = predict(&http, &[7698]);
    assert_eq!(unknown[0]["known"], false);
    assert!(unknown[0]["fallback_rows"].as_u64().unwrap() >= 1);
    // A new node with one-type `neighbors` to a typed model: refused by name.
    let body = serde_json::json!({ "new_node": { "id": 9000, "features": vec![0.0f32; 11] } });
    let (code, text) =
        tests::stack::http_request(&http, "POST", "/v1/predict", Some(&body.to_string())).unwrap();
    assert_eq!(code, 400, "{text}");
    assert!(text.contains("this model's graph is typed"), "{text}");
    assert!(worker.stop(), "the worker stops cleanly");

    // Covering fanouts (every source at every hop): the same model, served
    // with `--fanouts 2048,2048`, which a typed model's worker applies to
    // every edge type it samples (PyG's `num_neighbors` list on a
    // HeteroData), gives PyG's full-graph outputs.
    let covering =
        tests::typed::Worker::start(&sidecar.shm_name, &model, &["--fanouts", "2048,2048"]);
    let http = covering.http;
    // Every test airport of the first 400 ids, the largest hub (3482)
    // among them, in calls of 16.
    let mut ids: Vec<u64> = test.iter().copied().filter(|&i| i < 400).collect();
    ids.push(3482);
    let answers = predict(&http, &ids);
    let worst = worst_difference(&answers, &ids, &model);
    assert!(answers.iter().all(|a| a["fallback_rows"] == 0));
    assert!(
        worst <= 1e-5,
        "served outputs differ from PyG's full graph by {worst:e}"
    );
    eprintln!(
        "typed serving: sampled accuracy {served:.4} vs NeighborLoader {loader:.4} on {} test \
         airports; covering fanouts: {} airports within {worst:.2e} of PyG's full graph",
        test.len(),
        ids.len()
    );
    assert!(covering.daemon.stop());
}

/// A worker of `model` (with `args`) beside `sidecar` that exits at
/// start: its stderr.
fn refused_worker(sidecar: &TypedSidecar, model: &std::path::Path, args: &[&str]) -> String {
    tests::stack::worker_refusal(&sidecar.shm_name, model, args)
}

#[test]
fn a_typed_model_that_needs_what_the_graph_lacks_is_refused_by_name() {
    let model = trained_one_layer();
    // A graph of users and items: no airports.
    let generated = tests::stack::process_dir("typed-serving-users-items");
    run_ok(
        Command::new(workspace_bin("sidecar"))
            .arg("generate")
            .arg("--out")
            .arg(&generated)
            .args(["--nodes", "2000", "--items", "300", "--edges", "20000"])
            .args([
                "--feature-dim",
                "11",
                "--item-feature-dim",
                "3",
                "--seed",
                "1",
            ]),
        "sidecar generate --items",
    );
    let sidecar = TypedSidecar::start_on(&generated, &[], &[]);
    let stderr = refused_worker(&sidecar, &model, &[]);
    assert!(
        stderr.contains("the model needs node type \"airport\"; the sidecar's graph has user"),
        "{stderr}"
    );
    drop(sidecar);
    // OpenFlights, but the model asks for more features of airports.
    let sidecar = TypedSidecar::start(&[], &[]);
    let wider = tests::stack::process_dir("typed-serving-wider");
    tests::stack::copy_dir(&model, &wider);
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    manifest["node_types"][0]["feature_dim"] = serde_json::json!(12);
    std::fs::write(wider.join("manifest.json"), manifest.to_string()).unwrap();
    let stderr = refused_worker(&sidecar, &wider, &[]);
    assert!(
        stderr.contains("\"x__airport\"") && stderr.contains("12"),
        "{stderr}"
    );
    // Fanouts for every edge type it samples: one above the sidecar's cap
    // is refused naming the setting.
    for (args, said) in [
        (
            ["--fanouts", "100000,5"],
            "at hop 1 (fanouts (--fanouts)) exceeds the sidecar's max_fanouts",
        ),
        (
            ["--degrade-fanouts", "3,100000"],
            "at hop 2 (degrade_fanouts) exceeds the sidecar's max_fanouts",
        ),
    ] {
        let stderr = refused_worker(&sidecar, &model, &args);
        assert!(stderr.contains(said), "{args:?}: {stderr}");
    }
    // Hub embeddings are the dense layout's.
    let stderr = refused_worker(
        &sidecar,
        &model,
        &[
            "--hub-min-degree",
            "50",
            "--precomputed-redis",
            "redis://127.0.0.1:1",
        ],
    );
    assert!(
        stderr.contains("hub embeddings are a dense-layout feature"),
        "{stderr}"
    );
}

/// A one-layer `to_hetero` model: the TorchScript exporter drops every
/// edge type that does not lead into an airport.
fn trained_one_layer() -> PathBuf {
    static MODEL: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    MODEL.get_or_init(train_one_layer).clone()
}

fn train_one_layer() -> PathBuf {
    let args = [
        "--arch",
        "to_hetero",
        "--layers",
        "1",
        "--epochs",
        "20",
        "--loader-runs",
        "0",
        "--fanouts",
        "2048",
    ];
    train_hetero("typed-serving-one-layer", &args)
}

#[test]
fn a_model_whose_export_dropped_edge_types_is_fed_exactly_its_inputs() {
    let model = trained_one_layer();
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let dropped = manifest["exporter"]["dropped_inputs"].as_array().unwrap();
    assert!(
        dropped
            .iter()
            .any(|d| d == "edge_index__airline__flies__plane"),
        "{dropped:?}"
    );
    let sidecar = TypedSidecar::start(&[], &[]);
    let (worker, http) = start_worker(&sidecar, &model);
    let ids: Vec<u64> = vec![0, 1, 17, 3482, 5000, 7697];
    let worst = worst_difference(&predict(&http, &ids), &ids, &model);
    assert!(worst <= 1e-5, "{worst:e} from PyG's full graph");
    assert!(worker.stop());
}

#[test]
fn a_typed_sidecar_pins_its_busiest_rows_at_start_and_through_the_admin_socket() {
    // Before: a typed sidecar pinned nothing at start and refused `warm`.
    let sidecar = TypedSidecar::start(&[], &["--warm-up", "300"]);
    let status = sidecar.sidecarctl_json(&["status"]);
    assert_eq!(status["pinned_rows"], 300, "{status}");
    // Airport 3482, with the 19th most edges of any airport or airline, is
    // served from the pinned set.
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let response = call(&client, &[3482], &ask(&schema, 1, 5));
    let tables = response.graph_tables(0).unwrap();
    assert_eq!(tables.node_ids(0)[0], 3482);
    assert_eq!(tables.tiers(0)[0], tier::L1);
    // `warm --top` ranks the same way: 100 more.
    let warmed = sidecar.sidecarctl_json(&["warm", "--top", "400"]);
    assert_eq!(warmed["pinned_total"], 400, "{warmed}");
    // Ids of one type: two airlines without edges, pinned on demand only.
    let ids = sidecar.data.parent().unwrap().join("airlines.txt");
    std::fs::write(&ids, "6161\n6160\n").unwrap();
    let ids = ids.to_str().unwrap();
    let warmed = sidecar.sidecarctl_json(&["warm", "--type", "airline", "--ids-file", ids]);
    assert_eq!(warmed["requested"], 2, "{warmed}");
    assert_eq!(warmed["pinned_total"], 402, "{warmed}");
    // Refused by name: a type without rows, an id past the type's nodes,
    // ids without their type.
    for (args, expected) in [
        (
            vec!["warm", "--type", "country", "--ids-file", ids],
            "has no feature rows",
        ),
        (
            vec!["warm", "--type", "plane", "--ids-file", ids],
            "has no feature rows",
        ),
        (
            vec!["warm", "--type", "city", "--ids-file", ids],
            "node type \"city\" is not",
        ),
        (vec!["warm", "--ids-file", ids], "--type TYPE --ids-file"),
    ] {
        let out = sidecar.sidecarctl(&args);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(expected),
            "{args:?}: {stderr}"
        );
    }
    std::fs::write(ids, "6162\n").unwrap();
    let out = sidecar.sidecarctl(&["warm", "--type", "airline", "--ids-file", ids]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("airline 6162 is not in the graph (6162 airline nodes)"),
        "{stderr}"
    );
}

#[test]
fn an_empty_type_or_an_unknown_id_is_answered_alone_as_in_any_batch() {
    // A to_hetero GAT that onnxruntime cannot run where a node type has no
    // rows or an edge type no edges (its manifest's check.cannot_run says
    // so). Before: such a target alone (an airport no airline serves, any
    // unknown id) was answered HTTP 500, "retry", every time, and exactly
    // in a batch with another airport.
    let dir = tests::stack::process_dir("typed-serving-gat");
    std::fs::copy(
        repo_root().join("tests/python/flights_gat.py"),
        dir.join("flights_gat.py"),
    )
    .unwrap();
    let model = dir.join("model");
    run_ok(
        Command::new(python())
            .current_dir(&dir)
            .arg(repo_root().join("gnn-worker/model/pyg_model.py"))
            .args(["export", "--module", "flights_gat:Net"])
            // Covering: every answer is PyG's on the whole graph.
            .args(["--fanouts", "2048,2048"])
            .arg("--dataset")
            .arg(dataset("openflights"))
            .arg("--out")
            .arg(&model),
        "pyg_model.py export of a to_hetero GAT",
    );
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    // The export check ran every empty type and edge type, padded as the
    // worker runs them, and the target alone.
    let cases = manifest["check"]["cases"].as_object().unwrap();
    for case in [
        "empty-airline",
        "empty-country",
        "empty-plane",
        "empty-airport__route__airport",
        "empty-airline__serves__airport",
        "target-alone",
    ] {
        assert!(
            cases[case]["max_rel_diff"].as_f64().unwrap() <= 1e-5,
            "{case}: {}",
            cases[case]
        );
    }
    assert!(!manifest["check"]["cannot_run"]
        .as_array()
        .unwrap()
        .is_empty());
    // An airport that no airline serves: its subgraph has no airlines and
    // no planes.
    let served: std::collections::HashSet<u32> = tests::stack::read_u32_pairs(
        &dataset("openflights").join("edges/airline__serves__airport.u32"),
    )
    .into_iter()
    .map(|(_, airport)| airport)
    .collect();
    let lonely = (0..7698u64)
        .find(|id| !served.contains(&(*id as u32)))
        .expect("an airport without airlines");
    let sidecar = TypedSidecar::start(&[], &[]);
    let (worker, http) = start_worker(&sidecar, &model);
    // Alone and in a batch: PyG's answer on the whole graph.
    for ids in [vec![lonely], vec![1, lonely], vec![lonely, 2, 3]] {
        let answers = predict(&http, &ids);
        assert!(answers
            .iter()
            .all(|a| a["known"] == true && a["degraded"] == false));
        let worst = worst_difference(&answers, &ids, &model);
        assert!(worst <= 1e-5, "{ids:?}: {worst:e} from PyG's full graph");
    }
    // An unknown id: known false, degraded, the same alone and batched.
    let alone = predict(&http, &[7698]);
    assert_eq!(alone[0]["known"], false);
    assert_eq!(alone[0]["degraded"], true);
    let batched = predict(&http, &[lonely, 7698]);
    assert_eq!(batched[1]["known"], false);
    let logits = |a: &serde_json::Value| -> Vec<f32> {
        serde_json::from_value(a["logits"].clone()).unwrap()
    };
    for (a, b) in logits(&alone[0]).iter().zip(logits(&batched[1])) {
        assert!((a - b).abs() <= 1e-5, "{alone:?} vs {batched:?}");
    }
    assert!(worker.stop());
}

/// POSTs `body` to the worker's `/v1/predict`: the status and the body
/// (JSON when 200, the error's text otherwise).
fn post(http: &str, body: &serde_json::Value) -> (u16, String) {
    tests::stack::http_request(http, "POST", "/v1/predict", Some(&body.to_string())).unwrap()
}

#[test]
fn a_typed_new_node_in_one_call_gets_the_answer_it_gets_once_added() {
    let model = train_hetero(
        "typed-new-node-model",
        &["--epochs", "5", "--loader-runs", "0"],
    );
    let sidecar = TypedSidecar::start(&[], &[]);
    let (_worker, http) = start_worker(&sidecar, &model);
    let row: Vec<f32> = (0..11).map(|i| 0.25 * i as f32 - 1.0).collect();
    // A new airport with routes to and from hub 3482, served by airline 0.
    let edges = serde_json::json!({
        "route": [[3482, 7698], [7698, 3482]],
        "airline__serves__airport": [[0, 7698]],
        "airport__rev_serves__airline": [[7698, 0]],
    });
    let new_node = |edges: &serde_json::Value| serde_json::json!({"new_node": {"id": 7698, "features": row, "edges": edges}});
    let (code, in_one_call) = post(&http, &new_node(&edges));
    assert_eq!(code, 200, "{in_one_call}");
    let in_one_call: serde_json::Value = serde_json::from_str(&in_one_call).unwrap();
    let in_one_call = &in_one_call["predictions"][0];
    assert_eq!(in_one_call["known"], true);
    assert_eq!(
        in_one_call["fallback_rows"], 0,
        "its own row came with the call"
    );
    // Nothing was added.
    assert_eq!(predict(&http, &[7698])[0]["known"], false);
    // What the call cannot carry is refused by name.
    for (edges, expected) in [
        (
            serde_json::json!({"route": [[99999, 7698]]}),
            "airport 99999 is not in the graph",
        ),
        (
            serde_json::json!({"flies_to": [[1, 7698]]}),
            "edge type \"flies_to\"",
        ),
        (
            serde_json::json!({"route": [[1, 2]]}),
            "an edge of the new node has it (7698) at an end of node type airport",
        ),
    ] {
        let (code, answer) = post(&http, &new_node(&edges));
        assert_eq!(code, 400, "{answer}");
        assert!(answer.contains(expected), "{answer}");
    }
    let (code, answer) = post(
        &http,
        &serde_json::json!({"new_node": {"id": 7698, "features": [1.0, 2.0], "edges": {}}}),
    );
    assert_eq!(code, 400);
    assert!(
        answer
            .to_string()
            .contains("rows of node type airport have 11"),
        "{answer}"
    );
    // Added with the same row and edges, predicted by id: the same answer.
    let row_text: Vec<String> = row.iter().map(f32::to_string).collect();
    let added = sidecar.sidecarctl_json(&[
        "graph",
        "add-node",
        "7698",
        "--type",
        "airport",
        &format!("--features={}", row_text.join(",")),
        "--typed-edges",
        "route=3482,7698,7698,3482",
        // The route edges' 4 attributes each (which this model does not
        // read, and the call above did not carry).
        "--edge-data",
        "route=1,0,0,2,1,0,0,2",
        "--typed-edges",
        "airline__serves__airport=0,7698",
        "--typed-edges",
        "airport__rev_serves__airline=7698,0",
    ]);
    assert_eq!(added["edges_added"], 4, "{added}");
    let by_id = &predict(&http, &[7698])[0];
    assert_eq!(by_id["known"], true);
    let logits = |p: &serde_json::Value| -> Vec<f64> {
        p["logits"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect()
    };
    let (a, b) = (logits(in_one_call), logits(by_id));
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() <= 1e-5 * x.abs().max(1.0), "{a:?} vs {b:?}");
    }
    // The id is now the graph's: a new node needs another.
    let (code, answer) = post(&http, &new_node(&edges));
    assert_eq!(code, 400);
    assert!(answer.contains("already in the graph"), "{answer}");
}

/// A typed response's contents a call can compare: per node type its ids,
/// rows and fallback flags and its counts; per edge type its edge_index
/// and counts (not the tiers, which a second call changes).
fn contents(response: &protocol::Response, schema: &GraphSchema) -> Vec<Vec<String>> {
    let tables = response.graph_tables(0).unwrap();
    let nodes = (0..schema.node_types.len()).map(|t| {
        let fallback: Vec<bool> = (0..tables.node_ids(t).len())
            .map(|row| tables.fallback(t, row))
            .collect();
        vec![
            format!("{:?}", tables.node_ids(t)),
            format!("{:?}", tables.features(t)),
            format!("{fallback:?}"),
            format!("{:?}", tables.sampled_nodes(t)),
        ]
    });
    let edges = (0..schema.edge_types.len()).map(|e| {
        vec![
            format!("{:?}", tables.edge_index(e)),
            format!("{:?}", tables.sampled_edges(e)),
        ]
    });
    nodes.chain(edges).collect()
}

/// Typed requests that reach the sidecar in one ring batch share one fetch
/// per node type (cross-request batching), and each is answered what it
/// is answered alone: the same HeteroData, the same rows.
#[test]
fn typed_requests_batched_together_answer_what_each_answers_alone() {
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let ask = ask(&schema, 2, 10);
    // Overlapping neighbourhoods: hub airports among small ones.
    let targets: Vec<Vec<u64>> = (0..24u64)
        .map(|k| vec![(k * 37) % 3000, (k * 101 + 5) % 3000])
        .collect();
    let alone: Vec<Vec<Vec<String>>> = targets
        .iter()
        .map(|t| contents(&call(&client, t, &ask), &schema))
        .collect();
    let batched = || -> (f64, f64) {
        let (code, body) =
            tests::stack::http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
        assert_eq!(code, 200);
        let value = |name: &str| -> f64 {
            body.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(' ')?.parse().ok())
                .unwrap_or_else(|| panic!("no {name} in:\n{body}"))
        };
        (
            value("sidecar_batch_requests_sum"),
            value("sidecar_batch_requests_count"),
        )
    };
    // Eight callers at once until a ring batch held several typed requests.
    let until = std::time::Instant::now() + Duration::from_secs(120);
    let mut rounds = 0;
    loop {
        rounds += 1;
        std::thread::scope(|scope| {
            for first in 0..8 {
                let (client, targets, alone, ask) = (sidecar.client(), &targets, &alone, &ask);
                let schema = &schema;
                scope.spawn(move || {
                    for k in (first..targets.len()).step_by(8) {
                        let got = contents(&call(&client, &targets[k], ask), schema);
                        assert_eq!(got, alone[k], "targets {:?}", targets[k]);
                    }
                });
            }
        });
        let (requests, batches) = batched();
        if requests > batches {
            break;
        }
        assert!(
            std::time::Instant::now() < until,
            "{rounds} rounds of eight concurrent callers, and no ring batch held two requests"
        );
    }
}

/// A typed graph's invalidation channel evicts the rows its tokens name
/// (`<type>:<id>`) from their type's caches: the next call reads Redis
/// again. A token naming a type without rows is counted, not applied.
#[test]
fn a_typed_graph_s_invalidation_channel_evicts_rows_of_the_named_type() {
    let redis = RedisServer::start();
    let sidecar = redis_sidecar(&redis, &["--invalidation-channel", "feat-invalidate"]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let airport = schema.node_type("airport").unwrap();
    let ask = ask(&schema, 1, 4);
    // The target's own row: row 0 of the airport table.
    let own_row = || {
        let response = call(&client, &[5], &ask);
        let tables = response.graph_tables(0).unwrap();
        (tables.tiers(airport)[0], tables.fallback(airport, 0))
    };
    // The first call's fetch puts the row in L1 as it lands, off the
    // request's path: a later call finds it there.
    assert!(
        eventually(Duration::from_secs(10), || own_row() == (tier::L1, false)),
        "not cached after the first calls"
    );
    // Gone from Redis, the row is still served from L1 ...
    assert!(redis.command("DEL feat:airport:5").contains(":1"));
    assert_eq!(own_row(), (tier::L1, false));
    // ... until the channel names it: the next call finds no row.
    let subscribers = redis.command("PUBLISH feat-invalidate airport:5,country:1");
    assert!(subscribers.contains(":1"), "one subscriber: {subscribers}");
    assert!(
        eventually(Duration::from_secs(10), || own_row().1),
        "airport 5's row was not evicted"
    );
    let (code, body) =
        tests::stack::http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    for (name, want) in [
        ("sidecar_invalidation_ids_total", "1"),
        ("sidecar_invalidation_bad_tokens_total", "1"),
    ] {
        assert!(
            body.lines().any(|l| l == format!("{name} {want}")),
            "{name} {want} in:\n{body}"
        );
    }
}

/// The typed request a worker of `model` sends (its manifest's fanouts per
/// edge type, 0 for an edge type it does not name), as the worker builds it.
fn manifest_ask(schema: &GraphSchema, model: &std::path::Path) -> GraphAsk {
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let per_edge = manifest["fanouts"].as_object().unwrap();
    let hops = per_edge.values().next().unwrap().as_array().unwrap().len();
    let fanouts = (0..schema.edge_types.len())
        .flat_map(|e| match per_edge.get(&schema.edge_key(e)) {
            Some(f) => serde_json::from_value::<Vec<u32>>(f.clone()).unwrap(),
            None => vec![0; hops],
        })
        .collect();
    GraphAsk {
        target_type: schema.node_type("airport").unwrap() as u32,
        hops: hops as u32,
        fanouts,
        edge_data: Default::default(),
    }
}

/// Precomputed answers for a typed model (docs/serving.md, "Precomputed
/// answers"): `gnn-worker precompute` computes each airport on its own
/// typed subgraph at the manifest's fanouts; the worker answers from the
/// set while the sidecar vouches (a typed `FRESH_SINCE`) that nothing in
/// that subgraph changed, and through the GNN exactly for the airports
/// whose subgraph holds a changed row, in batches that mix both.
#[test]
fn precomputed_answers_serve_a_typed_model_until_its_subgraph_changes() {
    let model = trained_to_hetero();
    let redis = RedisServer::start();
    let sidecar = TypedSidecar::start(&[], &[]);
    let client = sidecar.client();
    let schema = client.graph_schema().unwrap();
    let airport = schema.node_type("airport").unwrap();
    let precompute = |extra: &[&str]| {
        let mut command = Command::new(workspace_bin("gnn-worker"));
        command
            .args(["precompute", "--model"])
            .arg(&model)
            .args(["--shm-name", &sidecar.shm_name, "--redis", &redis.url()])
            .arg("--onnxruntime-lib")
            .arg(tests::stack::onnxruntime_lib())
            .args(extra);
        command
    };
    // Fanouts for every edge type, as a worker's: one above the sidecar's
    // cap is refused by name.
    let refused = precompute(&["--fanouts", "5,100000"]).output().unwrap();
    assert!(!refused.status.success());
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(
        said.contains("at hop 2 (--fanouts) exceeds the sidecar's max_fanouts"),
        "{said}"
    );
    let n = 7698u64;
    let (said, _) = run_ok(&mut precompute(&[]), "gnn-worker precompute");
    assert!(said.contains(&format!("precomputed {n} nodes")), "{said}");

    // The answers each airport gets alone from the GNN.
    let ids: Vec<u64> = (0..200).chain([3482]).collect();
    let gnn = tests::typed::Worker::start(&sidecar.shm_name, &model, &[]);
    let alone: Vec<serde_json::Value> = ids.iter().map(|&id| predict_one(&gnn.http, id)).collect();
    assert!(gnn.daemon.stop());

    let worker = worker_with_set(&sidecar, &model, &redis, n);
    let logits = |p: &serde_json::Value| -> Vec<f32> {
        serde_json::from_value(p["logits"].clone()).unwrap()
    };
    let close = |a: &serde_json::Value, b: &serde_json::Value| {
        logits(a)
            .iter()
            .zip(logits(b))
            .all(|(x, y)| (x - y).abs() <= 1e-5 * x.abs().max(1.0))
    };
    // Every stored answer is the one the GNN gives the airport alone.
    let before = predict(&worker.http, &ids);
    for ((stored, gnn), id) in before.iter().zip(&alone).zip(&ids) {
        assert_eq!(stored["answered_by"], "precomputed", "airport {id}");
        assert!(close(stored, gnn), "airport {id}: {stored} vs {gnn}");
    }

    // A changed row of the largest hub: exactly the airports whose own
    // subgraph holds it are stale.
    let ask = manifest_ask(&schema, &model);
    let hub = 3482u64;
    let stale: std::collections::BTreeSet<u64> = ids
        .iter()
        .copied()
        .filter(|&id| {
            let response = call(&client, &[id], &ask);
            let tables = response.graph_tables(airport).unwrap();
            tables.node_ids(airport).contains(&hub)
        })
        .collect();
    assert!(stale.contains(&hub) && stale.len() < ids.len(), "{stale:?}");
    let said = sidecar.sidecarctl(&["invalidate", "--type", "airport", &hub.to_string()]);
    assert!(said.status.success(), "{said:?}");
    let mixed = predict(&worker.http, &ids);
    let by_gnn: std::collections::BTreeSet<u64> = mixed
        .iter()
        .filter(|p| p["answered_by"] == "gnn")
        .map(|p| p["node_id"].as_u64().unwrap())
        .collect();
    assert_eq!(
        by_gnn, stale,
        "the airports answered by the GNN are not exactly those whose subgraph holds the hub"
    );
    // The stored answers served in batches of 16 mixed with stale ones are
    // still the airports' own, and a stale airport asked alone gets its
    // answer from the GNN, the one it got before (the hub's row is the
    // same in the store: an invalidation evicts it from the caches only).
    for ((answer, gnn), id) in mixed.iter().zip(&alone).zip(&ids) {
        if stale.contains(id) {
            let again = predict_one(&worker.http, *id);
            assert_eq!(again["answered_by"], "gnn", "airport {id}");
            assert!(close(&again, gnn), "airport {id}: {again} vs {gnn}");
        } else {
            assert!(close(answer, gnn), "airport {id}: {answer} vs {gnn}");
        }
    }
    let (code, body) =
        tests::stack::http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    let fresh: f64 = body
        .lines()
        .find_map(|l| l.strip_prefix("sidecar_fresh_targets_total "))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    assert!(
        fresh >= (2 * ids.len() - stale.len()) as f64,
        "sidecar_fresh_targets_total {fresh}"
    );
    eprintln!(
        "typed precomputed answers: {} airports, {} stale after airport {hub}'s row changed, \
         sidecar_fresh_targets_total {fresh}",
        ids.len(),
        stale.len()
    );
    assert!(worker.daemon.stop());
}

/// The covering strategy for a typed model (docs/strategies.md): a set
/// computed at covering fanouts (`precompute --fanouts 2048,2048`, every
/// edge type) is vouched for beside a worker serving at the manifest's
/// smaller ones (its `FRESH_SINCE` names the set's hops and fanouts,
/// `fresh_hops`), so the worker answers PyG's full-graph outputs from it.
#[test]
fn a_typed_set_at_covering_fanouts_serves_pyg_s_full_graph_outputs() {
    let model = trained_to_hetero();
    let redis = RedisServer::start();
    let sidecar = TypedSidecar::start(&[], &[]);
    let mut precompute = Command::new(workspace_bin("gnn-worker"));
    precompute
        .args(["precompute", "--model"])
        .arg(&model)
        .args(["--shm-name", &sidecar.shm_name, "--redis", &redis.url()])
        .args(["--fanouts", "2048,2048"])
        .arg("--onnxruntime-lib")
        .arg(tests::stack::onnxruntime_lib());
    let (said, _) = run_ok(&mut precompute, "gnn-worker precompute --fanouts 2048,2048");
    let n = 7698u64;
    assert!(said.contains(&format!("precomputed {n} nodes")), "{said}");
    let worker = worker_with_set(&sidecar, &model, &redis, n);
    let ids: Vec<u64> = (0..200).chain([3482]).collect();
    let answers = predict(&worker.http, &ids);
    for (answer, id) in answers.iter().zip(&ids) {
        assert_eq!(
            answer["answered_by"], "precomputed",
            "airport {id}: {answer}"
        );
    }
    let worst = worst_difference(&answers, &ids, &model);
    assert!(
        worst <= 1e-5,
        "stored answers differ from PyG's full graph by {worst:e}"
    );
    assert!(worker.daemon.stop());
}

/// A worker of `model` beside `sidecar` answering from the precomputed set
/// in `redis`, once it has loaded the set's `n` nodes.
fn worker_with_set(
    sidecar: &TypedSidecar,
    model: &std::path::Path,
    redis: &RedisServer,
    n: u64,
) -> tests::typed::Worker {
    let worker = tests::typed::Worker::start(
        &sidecar.shm_name,
        model,
        &[
            "--precomputed-redis",
            &redis.url(),
            "--precomputed-check-s",
            "0.2",
        ],
    );
    assert!(
        eventually(Duration::from_secs(20), || {
            // The worker learns the sidecar's clock from a response.
            predict_one(&worker.http, 0);
            tests::stack::metric_value(&worker.http, "gnn_worker_precomputed_nodes") == n as f64
        }),
        "the set was not loaded"
    );
    worker
}

/// The worker's answer for airport `id`, alone in its call.
fn predict_one(http: &str, id: u64) -> serde_json::Value {
    predict(http, &[id]).remove(0)
}
