//! Faults and limits on the whole stack (real sidecar, real worker, real
//! ONNX Runtime): each test asserts what a client sees, and that nothing is
//! lost (docs/reliability.md lists the fault, the behaviour and the test).

use tests::h2::frame as h2_frame;
use tests::stack::{http_request, metric_value, Stack, StackOptions};

fn predict(stack: &Stack, ids: &[u64]) -> (u16, serde_json::Value) {
    let body = serde_json::json!({ "node_ids": ids }).to_string();
    let (code, text) =
        http_request(&stack.http, "POST", "/v1/predict", Some(&body)).expect("POST /v1/predict");
    let json = serde_json::from_str(&text).unwrap_or(serde_json::Value::String(text));
    (code, json)
}

fn predicted_ids(json: &serde_json::Value) -> Vec<u64> {
    json["predictions"]
        .as_array()
        .expect("predictions")
        .iter()
        .map(|p| p["node_id"].as_u64().expect("node_id"))
        .collect()
}

/// cora's node of highest degree (168): with fanouts [20, 10] its
/// neighbourhood alone has more than 20 rows.
const HUB: u64 = 1358;
/// A cora node of degree 1 whose neighbour has degree at most 3: at most 4
/// rows.
const LEAF: u64 = 3;

#[test]
fn a_batch_too_large_for_one_response_is_split_and_every_call_answered() {
    // Any single cora target fits 250 rows (at most 1 + 20 + 200 = 221); the
    // neighbourhoods of 64 targets together do not.
    let mut options = StackOptions::new("cora");
    options.sidecar_args = vec!["--max-nodes".into(), "250".into()];
    let stack = Stack::start(&options).expect("stack");
    let ids: Vec<u64> = (0..64).collect();
    let (code, json) = predict(&stack, &ids);
    assert_eq!(code, 200, "{json}");
    assert_eq!(predicted_ids(&json), ids, "every target answered, in order");
    assert!(
        metric_value(&stack.http, "gnn_worker_ring_splits_total") >= 1.0,
        "the merged request was split"
    );

    // Concurrent one-node calls merged by the batcher: all answered.
    std::thread::scope(|scope| {
        let calls: Vec<_> = (100..132u64)
            .map(|id| {
                let stack = &stack;
                scope.spawn(move || predict(stack, &[id]))
            })
            .collect();
        for (call, id) in calls.into_iter().zip(100..132u64) {
            let (code, json) = call.join().unwrap();
            assert_eq!(code, 200, "{json}");
            assert_eq!(predicted_ids(&json), vec![id]);
        }
    });
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn only_the_call_whose_target_cannot_fit_alone_fails_naming_the_limit() {
    let mut options = StackOptions::new("cora");
    options.sidecar_args = vec!["--max-nodes".into(), "20".into()];
    let stack = Stack::start(&options).expect("stack");

    let (code, json) = predict(&stack, &[HUB]);
    assert_eq!(code, 400, "{json}");
    let message = json.to_string();
    assert!(message.contains("1358"), "names the node: {message}");
    assert!(message.contains("max_nodes"), "names the limit: {message}");

    // The hub's call and a leaf's call at the same time, again and again:
    // the leaf is always answered, whatever the batcher merged.
    for _ in 0..10 {
        std::thread::scope(|scope| {
            let hub = scope.spawn(|| predict(&stack, &[HUB]));
            let leaf = scope.spawn(|| predict(&stack, &[LEAF]));
            let (code, json) = leaf.join().unwrap();
            assert_eq!(code, 200, "{json}");
            assert_eq!(predicted_ids(&json), vec![LEAF]);
            assert_eq!(hub.join().unwrap().0, 400);
        });
    }
    // And the worker is still ready.
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200);
    assert!(stack.stop(), "clean shutdown");
}

/// Sum of `fallback_rows` over the predictions of one answer.
fn fallback_rows(json: &serde_json::Value) -> u64 {
    json["predictions"]
        .as_array()
        .expect("predictions")
        .iter()
        .map(|p| p["fallback_rows"].as_u64().expect("fallback_rows"))
        .sum()
}

/// Runs `during` while two callers keep calling over HTTP (each its own
/// node and the hub), from 300 ms before it until it returns; returns how
/// many calls got each status.
fn under_load(stack: &Stack, during: impl FnOnce()) -> std::collections::BTreeMap<u16, u32> {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    let statuses = std::sync::Mutex::new(std::collections::BTreeMap::new());
    std::thread::scope(|scope| {
        for caller in 0..2u64 {
            let (stop, statuses) = (&stop, &statuses);
            scope.spawn(move || {
                while !stop.load(Ordering::Acquire) {
                    let (code, _) = predict(stack, &[caller + 1, HUB]);
                    *statuses.lock().unwrap().entry(code).or_default() += 1;
                }
            });
        }
        std::thread::sleep(std::time::Duration::from_millis(300));
        during();
        stop.store(true, Ordering::Release);
    });
    statuses.into_inner().unwrap()
}

/// Four callers call offsets of `ids` (each caller and each call its own)
/// every 20 ms for `period`; every call must be answered OK. Returns how many calls there
/// were and how many had fallback rows.
fn calls_during(stack: &Stack, ids: &[u64], period: std::time::Duration) -> (u32, u32) {
    let until = std::time::Instant::now() + period;
    std::thread::scope(|scope| {
        let callers: Vec<_> = (0..4u64)
            .map(|caller| {
                scope.spawn(move || {
                    let (mut calls, mut with_fallbacks) = (0, 0);
                    while std::time::Instant::now() < until {
                        // Other targets each call: a target's sample is the
                        // same every call, and a call repeating the last one
                        // would join its fetch still in flight, and get its
                        // rows in time.
                        let shift = caller * 10 + u64::from(calls) * 40;
                        let ids: Vec<u64> = ids.iter().map(|id| (id + shift) % 2700).collect();
                        let (code, json) = predict(stack, &ids);
                        assert_eq!(code, 200, "a call failed while Redis was away: {json}");
                        assert_eq!(predicted_ids(&json), ids);
                        calls += 1;
                        with_fallbacks += u32::from(fallback_rows(&json) > 0);
                        std::thread::sleep(std::time::Duration::from_millis(20));
                    }
                    (calls, with_fallbacks)
                })
            })
            .collect();
        callers
            .into_iter()
            .map(|caller| caller.join().expect("a caller panicked"))
            .fold((0, 0), |(a, b), (c, d)| (a + c, b + d))
    })
}

#[test]
fn redis_stopped_or_killed_costs_fallback_rows_never_a_failed_call_and_serving_recovers() {
    let mut redis = tests::redis::RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let redis_url = redis.url();
    let stack = tests::stack::redis_only_stack(&redis, data.path(), &redis_url, &[]);
    let ids = [1u64, 2, 3];
    let (code, json) = predict(&stack, &ids);
    assert_eq!(code, 200, "{json}");
    assert_eq!(fallback_rows(&json), 0, "Redis serves every row: {json}");

    // Redis frozen (SIGSTOP) for 5 s: every call still answered, with the
    // rows that could not arrive flagged as fallbacks.
    redis.freeze();
    let (calls, with_fallbacks) = calls_during(&stack, &ids, std::time::Duration::from_secs(5));
    redis.thaw();
    assert!(calls >= 12, "{calls} calls in 5 s");
    assert_eq!(
        with_fallbacks, calls,
        "every call during the stall had fallback rows"
    );
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || {
            fallback_rows(&predict(&stack, &ids).1) == 0
        }),
        "serving recovered by itself after Redis came back"
    );

    // Redis killed, then restarted with its data gone: calls keep being
    // answered (the rows are missing: fallbacks), never a failed call.
    redis.stop();
    let (calls, with_fallbacks) = calls_during(&stack, &ids, std::time::Duration::from_secs(1));
    assert!(calls >= 3 && with_fallbacks == calls);
    redis.restart();
    tests::stack::sidecar_import(
        &tests::stack::dataset("cora"),
        &data.path().join("reimport"),
        &["--redis", &redis.url()],
    );
    assert!(
        tests::eventually(std::time::Duration::from_secs(15), || {
            fallback_rows(&predict(&stack, &ids).1) == 0
        }),
        "serving recovered after Redis restarted"
    );
    assert!(stack.stop(), "clean shutdown");
}

/// The names under `dir`, recursively, sorted (what "touches nothing" means
/// for a directory another process owns).
fn tree(dir: &std::path::Path) -> Vec<String> {
    let mut names = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(at) = stack.pop() {
        for entry in std::fs::read_dir(&at).unwrap() {
            let path = entry.unwrap().path();
            names.push(path.strip_prefix(dir).unwrap().display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    names.sort();
    names
}

/// [`tree`] without RocksDB's info logs (which a live store rotates).
fn files_but_logs(dir: &std::path::Path) -> Vec<String> {
    tree(dir)
        .into_iter()
        .filter(|name| !name.starts_with("LOG"))
        .collect()
}

/// Runs `sidecar serve` on `data_dir` (plus `extra`), which must exit with an
/// error; returns its stderr.
fn second_sidecar_refused(data_dir: &std::path::Path, extra: &[&str]) -> String {
    let second = std::process::Command::new(tests::stack::workspace_bin("sidecar"))
        .arg("serve")
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .args([
            "--shm-name",
            &tests::unique_name("second"),
            "--warm-up",
            "0",
        ])
        .output()
        .expect("running a second sidecar");
    let stderr = String::from_utf8_lossy(&second.stderr).into_owned();
    assert!(
        !second.status.success(),
        "the second sidecar started: {stderr}"
    );
    stderr
}

#[test]
fn a_second_sidecar_on_a_data_directory_in_use_is_refused_and_touches_nothing() {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("data");
    tests::stack::sidecar_import(&tests::stack::dataset("cora"), &data_dir, &[]);
    let mut options = StackOptions::new("cora");
    options.imported = Some(data_dir.clone());
    let stack = Stack::start(&options).expect("stack");
    let store = data_dir.join("features.db");
    let before = files_but_logs(&store);

    let stderr = second_sidecar_refused(&data_dir, &[]);
    assert!(
        stderr.contains("sidecar.lock") && stderr.contains("in use by another sidecar"),
        "names the lock: {stderr}"
    );
    let import = std::process::Command::new(tests::stack::workspace_bin("sidecar"))
        .arg("import")
        .arg(tests::stack::dataset("cora"))
        .arg("--data-dir")
        .arg(&data_dir)
        .output()
        .expect("running an import");
    assert!(
        !import.status.success(),
        "an import into a served directory ran"
    );
    assert!(String::from_utf8_lossy(&import.stderr).contains("sidecar.lock"));

    let after = files_but_logs(&store);
    assert_eq!(before, after, "the first sidecar's store was touched");
    let (code, json) = predict(&stack, &[1, 2, 3]);
    assert_eq!(code, 200, "the first sidecar still serves: {json}");
    assert_eq!(fallback_rows(&json), 0);
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn an_l2_directory_in_use_is_refused_never_wiped() {
    let redis = tests::redis::RedisServer::start();
    let base = tempfile::tempdir().unwrap();
    let l2 = base.path().join("shared-l2");
    let mut sidecars = Vec::new();
    for name in ["a", "b"] {
        let data_dir = base.path().join(name);
        tests::stack::sidecar_import(
            &tests::stack::dataset("cora"),
            &data_dir,
            &["--redis", &redis.url()],
        );
        sidecars.push(data_dir);
    }
    let mut options = StackOptions::new("cora");
    options.imported = Some(sidecars[0].clone());
    options.sidecar_args = ["--redis", &redis.url(), "--l2-dir", l2.to_str().unwrap()]
        .map(String::from)
        .to_vec();
    let stack = Stack::start(&options).expect("stack");
    let (code, json) = predict(&stack, &[1, 2, 3]);
    assert_eq!(code, 200, "{json}");
    let before = files_but_logs(&l2);

    // Another sidecar (its own data directory) given the same L2 directory.
    let stderr = second_sidecar_refused(
        &sidecars[1],
        &["--redis", &redis.url(), "--l2-dir", l2.to_str().unwrap()],
    );
    assert!(stderr.contains("in use by another process"), "{stderr}");
    let after = files_but_logs(&l2);
    assert_eq!(before, after, "the L2 directory in use was touched");
    assert!(
        !std::fs::read_dir(base.path()).unwrap().any(|e| e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .contains("damaged")),
        "a directory in use was treated as damaged"
    );
    let (code, _) = predict(&stack, &[4, 5]);
    assert_eq!(code, 200);
    assert!(stack.stop(), "clean shutdown");
}

/// cora imported into an embedded store of its own, served with a metrics
/// endpoint and `extra` sidecar arguments: (the directory holding it, the
/// data directory, the metrics address, the stack).
fn embedded_stack(extra: &[&str]) -> (tempfile::TempDir, std::path::PathBuf, String, Stack) {
    let data = tempfile::tempdir().unwrap();
    let data_dir = data.path().join("data");
    tests::stack::sidecar_import(&tests::stack::dataset("cora"), &data_dir, &[]);
    let metrics = format!("127.0.0.1:{}", tests::stack::free_port());
    let mut options = StackOptions::new("cora");
    options.imported = Some(data_dir.clone());
    options.sidecar_args = ["--metrics-addr", &metrics]
        .iter()
        .chain(extra)
        .map(|s| s.to_string())
        .collect();
    let stack = Stack::start(&options).expect("stack");
    (data, data_dir, metrics, stack)
}

#[test]
fn the_store_directory_deleted_while_serving_refuses_writes_and_raises_the_alarm() {
    let (_data, data_dir, metrics, stack) = embedded_stack(&[]);
    assert_eq!(metric_value(&metrics, "sidecar_store_directory_lost"), 0.0);

    std::fs::remove_dir_all(data_dir.join("features.db")).unwrap();
    // Reads go on (from the caches and the files still open).
    let (code, json) = predict(&stack, &[1, 2, 3]);
    assert_eq!(code, 200, "{json}");
    // A write is refused, never acknowledged and lost.
    let row = vec!["0.5"; 1433].join(",");
    let added = stack.sidecarctl(&[
        "graph",
        "add-node",
        "2708",
        "--features",
        &row,
        "--edge",
        "1",
    ]);
    let err = added.expect_err("a write into a deleted store was acknowledged");
    assert!(err.to_string().contains("write refused"), "{err}");
    assert!(
        tests::eventually(std::time::Duration::from_secs(5), || {
            metric_value(&metrics, "sidecar_store_directory_lost") == 1.0
        }),
        "the alarm is raised"
    );
    assert!(metric_value(&metrics, "sidecar_store_writes_refused_total") >= 1.0);
    // The node was not added half-way: the graph does not know it.
    let (code, json) = predict(&stack, &[2708]);
    assert_eq!(code, 200, "{json}");
    assert_eq!(json["predictions"][0]["known"], false, "{json}");
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200, "still serving");
}

/// `POST /v1/predict` returning the status, the `Retry-After` header and
/// the body.
fn predict_raw(addr: &str, ids: &[u64]) -> (u16, Option<String>, String) {
    use std::io::{Read, Write};
    let body = serde_json::json!({ "node_ids": ids }).to_string();
    let mut stream = std::net::TcpStream::connect(addr).expect("connect");
    write!(
        stream,
        "POST /v1/predict HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut reply = String::new();
    stream.read_to_string(&mut reply).unwrap();
    let (head, body) = reply.split_once("\r\n\r\n").unwrap_or((&reply, ""));
    let code = head
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let retry_after = head.lines().find_map(|line| {
        let (name, value) = line.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().to_string())
    });
    (code, retry_after, body.to_string())
}

#[test]
fn a_full_ring_is_an_explicit_overload_error_with_retry_after() {
    let mut options = StackOptions::new("cora");
    options.slots = 1;
    options.sidecar_args = ["--serve-threads", "1"].map(String::from).to_vec();
    options.worker_args = ["--ring-timeout-ms", "300"].map(String::from).to_vec();
    let stack = Stack::start(&options).expect("stack");
    assert_eq!(predict(&stack, &[1]).0, 200);

    // The sidecar frozen: the one slot stays taken, and within the worker's
    // 1 s sidecar timeout a second call finds no free slot.
    let pid = stack.sidecar.as_ref().unwrap().child.id();
    tests::stack::freeze_process(pid);
    let (first, second) = std::thread::scope(|scope| {
        let first = scope.spawn(|| predict_raw(&stack.http, &[1]));
        std::thread::sleep(std::time::Duration::from_millis(50));
        let second = scope.spawn(|| predict_raw(&stack.http, &[2]));
        (first.join().unwrap(), second.join().unwrap())
    });
    tests::stack::thaw_process(pid);
    let overloaded = [&first, &second]
        .into_iter()
        .find(|(_, _, body)| body.contains("no ring slot came free"))
        .unwrap_or_else(|| panic!("no overload error: {first:?} {second:?}"));
    assert_eq!(overloaded.0, 503, "{overloaded:?}");
    assert_eq!(
        overloaded.1.as_deref(),
        Some("1"),
        "Retry-After: {overloaded:?}"
    );
    assert!(
        metric_value(
            &stack.http,
            "gnn_worker_call_errors_total{kind=\"overloaded\"}"
        ) >= 1.0
    );

    // Serving recovers by itself once the sidecar runs again.
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || predict(&stack, &[3])
            .0
            == 200),
        "serving recovered"
    );
    assert!(stack.stop(), "clean shutdown");
}

/// A gRPC codec of raw bytes: sends what a broken or hostile client would.
#[derive(Debug, Clone, Default)]
struct RawCodec;

impl tonic::codec::Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;
    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }
    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl tonic::codec::Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(
        &mut self,
        item: Vec<u8>,
        buf: &mut tonic::codec::EncodeBuf<'_>,
    ) -> Result<(), tonic::Status> {
        bytes::BufMut::put_slice(buf, &item);
        Ok(())
    }
}

impl tonic::codec::Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(
        &mut self,
        buf: &mut tonic::codec::DecodeBuf<'_>,
    ) -> Result<Option<Vec<u8>>, tonic::Status> {
        let n = bytes::Buf::remaining(buf);
        Ok(Some(bytes::Buf::copy_to_bytes(buf, n).to_vec()))
    }
}

fn encoded(ids: &[u64], request_id: u64) -> Vec<u8> {
    prost::Message::encode_to_vec(&gnn_worker::api::grpc::pb::PredictRequest {
        node_ids: ids.to_vec(),
        request_id,
        new_node: None,
    })
}

/// A real flood on the gRPC port, written frame by frame: a `PredictStream`
/// opened and then sent DATA frames without data, by the thousand. The
/// server's HTTP/2 flood protection still ends that connection (GOAWAY,
/// ENHANCE_YOUR_CALM) although well-behaved bursts are read ahead
/// (`a_burst_of_100000_stream_requests_is_answered_in_order`), and the
/// worker goes on serving other connections.
#[test]
fn a_flood_of_empty_frames_on_a_stream_meets_the_flood_protection() {
    use std::io::{Read, Write};
    let stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    let addr = stack.grpc.trim_start_matches("http://").to_string();
    let mut conn = std::net::TcpStream::connect(&addr).unwrap();
    conn.set_read_timeout(Some(std::time::Duration::from_secs(20)))
        .unwrap();
    let block = tests::h2::grpc_headers("/gnn.v1.Predictor/PredictStream");
    let mut flood = tests::h2::PREFACE.to_vec();
    flood.extend(h2_frame(4, 0, 0, &[])); // SETTINGS
    flood.extend(h2_frame(1, 0x4, 1, &block)); // HEADERS, END_HEADERS
    for _ in 0..5000 {
        flood.extend(h2_frame(0, 0, 1, &[])); // DATA, empty, not the end
    }
    // The server may close before it has read everything.
    let _ = conn.write_all(&flood);
    let mut got = Vec::new();
    let mut buf = [0u8; 65536];
    let goaway = loop {
        // Frames from the server: find its GOAWAY.
        let mut at = 0;
        let mut found = None;
        while got.len() >= at + 9 {
            let len = u32::from_be_bytes([0, got[at], got[at + 1], got[at + 2]]) as usize;
            if got.len() < at + 9 + len {
                break;
            }
            if got[at + 3] == 7 && len >= 8 {
                let code = &got[at + 9 + 4..at + 9 + 8];
                found = Some(u32::from_be_bytes(code.try_into().unwrap()));
            }
            at += 9 + len;
        }
        if found.is_some() {
            break found;
        }
        match conn.read(&mut buf) {
            Ok(0) | Err(_) => break None,
            Ok(n) => got.extend(&buf[..n]),
        }
    };
    const ENHANCE_YOUR_CALM: u32 = 0xb;
    assert_eq!(
        goaway,
        Some(ENHANCE_YOUR_CALM),
        "the flood's connection ends with GOAWAY ENHANCE_YOUR_CALM"
    );
    // Other clients are served as before.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let answer = runtime.block_on(async {
        let mut client = gnn_worker::api::grpc::PredictorClient::connect(stack.grpc.clone())
            .await
            .expect("connect");
        client
            .predict(gnn_worker::api::grpc::pb::PredictRequest {
                node_ids: vec![1],
                request_id: 1,
                new_node: None,
            })
            .await
    });
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(predict(&stack, &[1]).0, 200);
    drop(runtime);
    assert!(stack.stop());
}

#[test]
fn grpc_malformed_messages_are_invalid_argument_and_a_stream_goes_on() {
    use gnn_worker::api::grpc::pb;
    let stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let channel = tonic::transport::Channel::from_shared(stack.grpc.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        let mut grpc = tonic::client::Grpc::new(channel);
        // An incomplete varint: not a protobuf message.
        let garbage = vec![0xff, 0xff, 0xff];

        grpc.ready().await.unwrap();
        let status = grpc
            .unary(
                tonic::Request::new(garbage.clone()),
                tonic::codegen::http::uri::PathAndQuery::from_static("/gnn.v1.Predictor/Predict"),
                RawCodec,
            )
            .await
            .expect_err("garbage was answered");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");

        // On a stream: a good request, an invalid request (too many ids), a
        // good request, garbage. Three answers in order (the invalid one in
        // band, the stream going on), then the stream ends INVALID_ARGUMENT.
        let messages = vec![
            encoded(&[1], 1),
            encoded(&vec![1; 5000], 3),
            encoded(&[2], 4),
            garbage,
        ];
        grpc.ready().await.unwrap();
        let mut answers = grpc
            .streaming(
                tonic::Request::new(tokio_stream::iter(messages)),
                tonic::codegen::http::uri::PathAndQuery::from_static(
                    "/gnn.v1.Predictor/PredictStream",
                ),
                RawCodec,
            )
            .await
            .expect("the stream opens")
            .into_inner();
        let mut got = Vec::new();
        let ended = loop {
            match answers.message().await {
                Ok(Some(bytes)) => got.push(
                    <pb::PredictResponse as prost::Message>::decode(bytes.as_slice()).unwrap(),
                ),
                Ok(None) => panic!("the stream ended without a status: {got:?}"),
                Err(status) => break status,
            }
        };
        assert_eq!(got.len(), 3, "{got:?}");
        assert_eq!((got[0].request_id, got[0].error.is_none()), (1, true));
        assert_eq!(got[0].predictions[0].node_id, 1);
        assert_eq!(got[1].request_id, 3);
        let invalid = tonic::Code::InvalidArgument as i32;
        assert_eq!(
            got[1].error.as_ref().map(|e| e.code),
            Some(invalid),
            "{got:?}"
        );
        assert!(got[1].predictions.is_empty());
        assert_eq!((got[2].request_id, got[2].error.is_none()), (4, true));
        assert_eq!(got[2].predictions[0].node_id, 2);
        assert_eq!(ended.code(), tonic::Code::InvalidArgument, "{ended:?}");
    });
    // The client's connections close with its runtime.
    drop(runtime);
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn expired_and_invalid_requests_get_their_status_with_their_id() {
    use protocol::liveness;
    use protocol::slot::state;
    let stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    // A client by hand on the real sidecar's segment: registered, holding
    // its entry lock, writing a request whose deadline is long past.
    let segment = protocol::Segment::attach(&stack.shm_name).unwrap();
    let id = liveness::register_with(segment.header(), |index| {
        segment.lock_client_entry(index).unwrap()
    })
    .expect("a client entry");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm/{}", stack.shm_name))
        .unwrap();
    let raw = memmap2::MmapOptions::new().map_raw(&file).unwrap();
    let slot_idx = 0;
    let slot = segment.slot(slot_idx);
    let g = segment.geometry();
    let region = g.slot_data_offset as usize + slot_idx * g.slot_stride as usize;
    // Writes `request` into slot 0, submits it, waits for the answer and
    // returns its status and echoed request id.
    let hand_call = |request: &[u8]| -> (u32, u64) {
        // The worker is idle: slot 0 is free.
        let claimed = slot.try_claim(id.tag()).expect("slot 0 is free");
        // SAFETY: slot 0 is CLAIMED by this test, which owns its request
        // area; the region lies inside the mapping (validated geometry).
        unsafe {
            std::ptr::copy_nonoverlapping(
                request.as_ptr(),
                raw.as_mut_ptr().add(region),
                request.len(),
            );
        }
        slot.submit(claimed).unwrap();
        protocol::submit::SubmitQueue {
            bits: &segment.header().submit_bits,
            doorbell: &segment.header().doorbell,
            server_parked: &segment.header().server_parked,
        }
        .push(slot_idx);
        assert!(
            tests::eventually(std::time::Duration::from_secs(5), || {
                liveness::beat(&segment.header().clients[id.index as usize]);
                slot.load().state == state::PUBLISHED
            }),
            "the sidecar answered"
        );
        let response = region + g.request_bytes as usize;
        let mut header = [0u8; 32];
        // SAFETY: PUBLISHED and ours: the sidecar no longer writes the area.
        unsafe {
            std::ptr::copy_nonoverlapping(raw.as_ptr().add(response), header.as_mut_ptr(), 32);
        }
        assert!(slot.release(slot.load()));
        (
            u32::from_le_bytes(header[0..4].try_into().unwrap()),
            u64::from_le_bytes(header[24..32].try_into().unwrap()),
        )
    };
    let mut request = [0u8; 136];
    request[0..8].copy_from_slice(&0xdead_beef_u64.to_le_bytes());
    request[8..16].copy_from_slice(&1u64.to_le_bytes()); // 1 ns after boot
    request[16..20].copy_from_slice(&1u32.to_le_bytes());
    request[128..136].copy_from_slice(&7u64.to_le_bytes());
    assert_eq!(
        hand_call(&request),
        (protocol::layout::status::DEADLINE_EXCEEDED, 0xdead_beef),
        "DEADLINE_EXCEEDED, the request id echoed"
    );
    // No deadline, but a reserved byte set: refused, the id still echoed.
    request[0..8].copy_from_slice(&0xfeed_u64.to_le_bytes());
    request[8..16].copy_from_slice(&0u64.to_le_bytes());
    request[40] = 1;
    assert_eq!(
        hand_call(&request),
        (protocol::layout::status::INVALID_REQUEST, 0xfeed),
        "INVALID_REQUEST, the request id echoed"
    );
    liveness::unregister(segment.header(), id);
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn a_request_whose_hop_arrays_cannot_fit_is_refused_before_sampling() {
    let mut options = StackOptions::new("cora");
    options.max_targets = 256;
    options.response_mib = 1;
    let stack = Stack::start(&options).expect("stack");
    let client =
        protocol::RingClient::attach(&stack.shm_name, protocol::ClientOptions::default()).unwrap();
    // 256 targets at [50, 50]: 256 x 50 x 52 x 4 bytes of hop arrays alone,
    // more than the 1 MiB response area.
    let targets: Vec<u64> = (0..256).collect();
    let mut request = protocol::CallRequest::new(&targets);
    request.fanouts = [50, 50];
    request.request_id = 77;
    let err = client.call(&request).unwrap_err();
    match &err {
        protocol::CallError::Status {
            status, message, ..
        } => {
            assert_eq!(*status, protocol::layout::status::TOO_LARGE);
            assert!(message.contains("hop arrays"), "{message}");
        }
        other => panic!("expected TOO_LARGE, got {other}"),
    }
    // The sidecar goes on serving.
    let response = client.call(&protocol::CallRequest::new(&[1, 2])).unwrap();
    assert_eq!(response.tables().unwrap().target_ids(), [1, 2]);
    drop(response);
    drop(client);
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn redis_slowed_to_50_ms_a_reply_costs_fallback_rows_within_the_deadline_never_a_failed_call() {
    let redis = tests::redis::RedisServer::start();
    let proxy =
        tests::proxy::DelayProxy::start(format!("127.0.0.1:{}", redis.port).parse().unwrap())
            .unwrap();
    let through_proxy = format!("redis://{}", proxy.addr);
    let data = tempfile::tempdir().unwrap();
    // The sidecar waits 20 ms for Redis, through the proxy.
    let stack = tests::stack::redis_only_stack(
        &redis,
        data.path(),
        &through_proxy,
        &["--deadline-ms", "20"],
    );
    let ids = [1u64, 2, 3];
    assert_eq!(
        fallback_rows(&predict(&stack, &ids).1),
        0,
        "full rows at first"
    );

    // 50 ms a reply, 2.5 times the sidecar's deadline: every call is still
    // answered OK, with the rows that came late flagged.
    proxy.set_delay(std::time::Duration::from_millis(50));
    let (calls, with_fallbacks) = calls_during(&stack, &ids, std::time::Duration::from_secs(2));
    assert!(calls >= 5, "{calls} calls in 2 s");
    assert_eq!(
        with_fallbacks, calls,
        "every call during the slowness had fallback rows"
    );
    // Back to normal: full rows again, by itself.
    proxy.set_delay(std::time::Duration::ZERO);
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || {
            fallback_rows(&predict(&stack, &ids).1) == 0
        }),
        "serving recovered once Redis was fast again"
    );
    assert!(stack.stop(), "clean shutdown");
}

#[test]
fn a_killed_sidecar_makes_the_worker_unavailable_and_a_new_one_is_served_without_a_worker_restart()
{
    use gnn_worker::api::grpc::{pb, PredictorClient};
    let mut stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    let worker_pid = stack.worker.as_ref().unwrap().child.id();
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let grpc_addr = stack.grpc.clone();
    let sidecar_pid = stack.sidecar.as_ref().unwrap().child.id();
    let grpc_code = |ids: Vec<u64>| {
        let addr = grpc_addr.clone();
        runtime.block_on(async move {
            let mut client = PredictorClient::connect(addr).await.expect("connect");
            match client
                .predict(pb::PredictRequest {
                    node_ids: ids,
                    request_id: 1,
                    new_node: None,
                })
                .await
            {
                Ok(_) => tonic::Code::Ok,
                Err(status) => status.code(),
            }
        })
    };
    assert_eq!(grpc_code(vec![1]), tonic::Code::Ok);

    // Under load: two callers keep calling over HTTP.
    let statuses = under_load(&stack, || {
        let killed = std::time::Instant::now();
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(sidecar_pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap();
        assert!(
            tests::eventually(std::time::Duration::from_secs(10), || {
                stack.http_get("/readyz").is_ok_and(|(code, _)| code == 503)
            }),
            "readiness turned false"
        );
        let not_ready_after = killed.elapsed();
        assert!(
            tests::eventually(std::time::Duration::from_secs(10), || {
                grpc_code(vec![1]) == tonic::Code::Unavailable
            }),
            "gRPC answers UNAVAILABLE"
        );
        let unavailable_after = killed.elapsed();
        eprintln!(
            "sidecar SIGKILLed under load: readiness false after {not_ready_after:?}, gRPC \
             UNAVAILABLE after {unavailable_after:?} (the worker's sidecar_timeout is 1 s)"
        );
    });
    assert!(
        statuses.keys().all(|code| *code == 200 || *code == 503),
        "every call was answered, OK or unavailable: {statuses:?}"
    );
    assert!(statuses.get(&200).is_some_and(|n| *n > 0), "{statuses:?}");

    // A new sidecar: served again, by the same worker process.
    stack.restart_sidecar().expect("a new sidecar");
    assert_eq!(grpc_code(vec![2, 3]), tonic::Code::Ok);
    let (code, json) = predict(&stack, &[4]);
    assert_eq!(code, 200, "{json}");
    assert_eq!(stack.worker.as_ref().unwrap().child.id(), worker_pid);
    drop(runtime);
    assert!(stack.stop(), "clean shutdown");
}

/// Another process in the pod truncates the segment file under load: the
/// sidecar and the worker both survive (no SIGBUS death), the sidecar
/// retires the segment and creates a new one, and the worker attaches to it
/// by itself and serves again.
#[test]
fn a_truncated_segment_kills_neither_process_and_a_new_one_is_served() {
    let metrics = format!("127.0.0.1:{}", tests::stack::free_port());
    let mut options = StackOptions::new("cora");
    options.sidecar_args = vec!["--metrics-addr".into(), metrics.clone()];
    let mut stack = Stack::start(&options).expect("stack");
    let worker_pid = stack.worker.as_ref().unwrap().child.id();
    let sidecar_pid = stack.sidecar.as_ref().unwrap().child.id();
    let path = format!("/dev/shm/{}", stack.shm_name);
    let statuses = under_load(&stack, || {
        // Down to one page: the header survives, every slot is past the end.
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(&path)
            .expect("the segment file");
        file.set_len(4096).expect("truncate the segment");
        drop(file);
        assert!(
            tests::eventually(std::time::Duration::from_secs(10), || {
                metric_value(&metrics, "sidecar_ring_segments_replaced_total") == 1.0
            }),
            "the sidecar replaced the truncated segment"
        );
        // The worker attaches to the new segment by itself and serves.
        assert!(
            tests::eventually(std::time::Duration::from_secs(10), || {
                predict(&stack, &[5, 6]).0 == 200
            }),
            "served again"
        );
        std::thread::sleep(std::time::Duration::from_millis(300));
    });
    eprintln!("calls around the truncation, by status: {statuses:?}");
    assert!(
        statuses.keys().all(|code| *code == 200 || *code == 503),
        "every call answered, OK or unavailable: {statuses:?}"
    );
    // Both processes are the ones that started, still running.
    for daemon in [stack.sidecar.as_mut(), stack.worker.as_mut()] {
        let daemon = daemon.unwrap();
        assert_eq!(
            daemon.child.try_wait().unwrap(),
            None,
            "{} is still running",
            daemon.name
        );
    }
    assert_eq!(stack.worker.as_ref().unwrap().child.id(), worker_pid);
    assert_eq!(stack.sidecar.as_ref().unwrap().child.id(), sidecar_pid);
    let new_len = std::fs::metadata(&path).expect("a new segment").len();
    assert!(
        new_len > 4096,
        "the new segment has its full size: {new_len}"
    );
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200);
    // The ring's readiness latch, held while the segment was replaced, is
    // released by the new one.
    let (code, body) = tests::stack::http_request(&metrics, "GET", "/readyz", None).unwrap();
    assert_eq!((code, body.trim()), (200, "ready"), "the sidecar's /readyz");
    assert_eq!(metric_value(&metrics, "sidecar_ready"), 1.0);
    assert!(stack.stop(), "clean shutdown");
}

/// A tmpfs mounted for one test, unmounted (lazily) when dropped.
struct Tmpfs {
    path: std::path::PathBuf,
}

impl Tmpfs {
    fn mount(path: &std::path::Path, size: &str) -> Self {
        std::fs::create_dir_all(path).unwrap();
        let status = std::process::Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(path)
            .status()
            .expect("run mount");
        assert!(
            status.success(),
            "mounting a {size} tmpfs at {} (the full-disk test needs root or CAP_SYS_ADMIN)",
            path.display()
        );
        Self {
            path: path.to_path_buf(),
        }
    }

    /// Writes a file until the device is full; returns its path.
    fn fill(&self) -> std::path::PathBuf {
        use std::io::Write;
        let filler = self.path.join("filler");
        let mut file = std::fs::File::create(&filler).unwrap();
        for chunk in [1 << 20, 4096, 1] {
            let bytes = vec![0xa5u8; chunk];
            while file.write_all(&bytes).and_then(|()| file.flush()).is_ok() {}
        }
        filler
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount")
            .arg("-l")
            .arg(&self.path)
            .status();
    }
}

/// The data path's device fills up under load: reads go on, every write
/// (a new node's row, a compaction's new index) fails and is never
/// acknowledged, nothing is applied half-way, the sidecar stays up, and the
/// alarm metric says why. Once space is freed, a restarted sidecar writes
/// again.
#[test]
fn a_full_disk_on_the_data_path_fails_writes_keeps_serving_and_raises_the_alarm() {
    let dir = tempfile::tempdir().unwrap();
    let disk = Tmpfs::mount(&dir.path().join("disk"), "32m");
    let data_dir = disk.path.join("data");
    tests::stack::sidecar_import(&tests::stack::dataset("cora"), &data_dir, &[]);
    let metrics = format!("127.0.0.1:{}", tests::stack::free_port());
    let mut options = StackOptions::new("cora");
    options.imported = Some(data_dir.clone());
    options.sidecar_args = vec!["--metrics-addr".into(), metrics.clone()];
    let mut stack = Stack::start(&options).expect("stack");
    assert_eq!(metric_value(&metrics, "sidecar_store_disk_full"), 0.0);
    let index_before = std::fs::read(data_dir.join("graph.csr")).unwrap();

    let filler = disk.fill();
    let row = vec!["0.5"; 1433].join(",");
    let add_node = |stack: &Stack| {
        stack.sidecarctl(&[
            "graph",
            "add-node",
            "2708",
            "--features",
            &row,
            "--edge",
            "1",
        ])
    };
    let statuses = under_load(&stack, || {
        // A write fails with the reason, and is not acknowledged.
        let err = add_node(&stack).expect_err("a write on a full disk was acknowledged");
        assert!(err.to_string().contains("No space left on device"), "{err}");
        assert_eq!(metric_value(&metrics, "sidecar_store_disk_full"), 1.0);
        assert!(metric_value(&metrics, "sidecar_store_write_errors_total") >= 1.0);
        // Not applied half-way: the graph does not know the node.
        let (code, json) = predict(&stack, &[2708]);
        assert_eq!(code, 200, "{json}");
        assert_eq!(json["predictions"][0]["known"], false, "{json}");
        // A compaction cannot write its new index: refused, the old index
        // untouched, the sidecar alive (no SIGBUS from a sparse mapping).
        let err = stack
            .sidecarctl(&["graph", "compact"])
            .expect_err("a compaction on a full disk succeeded");
        assert!(err.to_string().contains("No space left on device"), "{err}");
    });
    eprintln!("calls while the disk was full, by status: {statuses:?}");
    assert_eq!(
        statuses.keys().copied().collect::<Vec<_>>(),
        [200],
        "every call answered OK: {statuses:?}"
    );
    assert_eq!(
        std::fs::read(data_dir.join("graph.csr")).unwrap(),
        index_before
    );
    assert_eq!(
        stack.sidecar.as_mut().unwrap().child.try_wait().unwrap(),
        None,
        "the sidecar is still running"
    );
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200);

    // Space freed: RocksDB keeps refusing writes after a failed one until
    // the store is opened again, so writes resume after a sidecar restart
    // (what the log line tells the operator); the worker is not restarted.
    std::fs::remove_file(filler).unwrap();
    let err = add_node(&stack).expect_err("RocksDB stays read-only until reopened");
    assert!(err.to_string().contains("No space left on device"), "{err}");
    stack
        .restart_sidecar()
        .expect("a new sidecar on the same data");
    let added = add_node(&stack).expect("a write after the restart");
    assert!(added.contains("added"), "{added}");
    assert_eq!(metric_value(&metrics, "sidecar_store_disk_full"), 0.0);
    let (code, json) = predict(&stack, &[2708]);
    assert_eq!(code, 200, "{json}");
    assert_eq!(json["predictions"][0]["known"], true, "{json}");
    assert!(stack.stop(), "clean shutdown");
}

/// How the rogue sidecar below answers.
const ANSWER_RIGHT: u32 = 0;
const ANSWER_OTHER_TARGETS: u32 = 1;
const ANSWER_FEWER_TARGETS: u32 = 2;

/// A sidecar of the test's own, on the real protocol: it answers each
/// request with its targets (each alone, default rows), with other targets
/// than asked, or with fewer, as `mode` says.
fn rogue_sidecar(
    server: &protocol::RingServer,
    mode: &std::sync::atomic::AtomicU32,
    stop: &std::sync::atomic::AtomicBool,
) {
    use std::sync::atomic::Ordering;
    let mut tickets = Vec::new();
    while !stop.load(Ordering::Acquire) {
        tickets.clear();
        server.next_batch(&mut tickets, std::time::Duration::from_millis(20));
        for ticket in tickets.drain(..) {
            let request = ticket.request().expect("the worker's request is valid");
            let mut targets = request.targets.clone();
            match mode.load(Ordering::Acquire) {
                ANSWER_OTHER_TARGETS => targets.iter_mut().for_each(|t| *t += 1),
                ANSWER_FEWER_TARGETS => {
                    targets.pop();
                }
                _ => {}
            }
            let n = targets.len() as u32;
            let shape = protocol::PayloadShape {
                n_targets: n,
                n_nodes: n,
                feature_dim: 1433,
                fanouts: request.fanouts,
            };
            let [f1, f2] = request.fanouts.map(|f| f as usize);
            ticket
                .respond(request.request_id, 1, shape, |nodes, out| {
                    for (row, &target) in targets.iter().enumerate() {
                        nodes.node_id[row] = target;
                        nodes.tier[row] = 3;
                        nodes.set_fallback(row, true);
                        out.target_id[row] = target;
                        out.target_row[row] = row as i32;
                        out.hop1_count[row] = 0;
                        out.hop1_rows[row * f1..(row + 1) * f1].fill(row as i32);
                        out.hop2_count[row * f1..(row + 1) * f1].fill(0);
                        out.hop2_rows[row * f1 * f2..(row + 1) * f1 * f2].fill(row as i32);
                    }
                })
                .expect("the answer fits");
        }
    }
}

/// A sidecar that answers with other targets than asked, or fewer: the
/// call gets an INTERNAL error naming the mismatch, the worker keeps
/// serving (no executor lost) and answers the next call normally.
#[test]
fn a_malformed_sidecar_answer_fails_that_call_and_the_worker_keeps_serving() {
    use protocol::layout::{dtype, FeatureSchema};
    use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
    let name = tests::unique_name("rogue");
    let schema = FeatureSchema {
        feature_dim: 1433,
        dtype: dtype::F32,
        graph_version: 1,
        default_fanouts: [20, 10],
    };
    let mut segment = protocol::SegmentConfig::new(name.clone(), schema);
    segment.max_targets = 64;
    let server = protocol::RingServer::create(protocol::ServerOptions::new(segment)).unwrap();
    let (mode, stop) = (AtomicU32::new(ANSWER_RIGHT), AtomicBool::new(false));
    std::thread::scope(|scope| {
        scope.spawn(|| rogue_sidecar(&server, &mode, &stop));
        let http = format!("127.0.0.1:{}", tests::stack::free_port());
        let grpc = format!("127.0.0.1:{}", tests::stack::free_port());
        let mut worker = tests::stack::Daemon {
            child: std::process::Command::new(tests::stack::workspace_bin("gnn-worker"))
                .arg("serve")
                .arg("--model")
                .arg(tests::stack::trained_model("cora"))
                .args(["--shm-name", &name, "--grpc", &grpc, "--http", &http])
                .args(["--fanouts", "20,10", "--executors", "2"])
                .arg("--onnxruntime-lib")
                .arg(tests::stack::onnxruntime_lib())
                .spawn()
                .unwrap(),
            name: "gnn-worker",
        };
        let ready = || {
            tests::stack::http_request(&http, "GET", "/readyz", None).is_ok_and(|(c, _)| c == 200)
        };
        assert!(tests::eventually(std::time::Duration::from_secs(60), ready));
        let call = |ids: &[u64]| {
            let body = serde_json::json!({ "node_ids": ids }).to_string();
            tests::stack::http_request(&http, "POST", "/v1/predict", Some(&body)).unwrap()
        };
        let (code, body) = call(&[1, 2]);
        assert_eq!(code, 200, "{body}");
        for (answer, what) in [
            (ANSWER_OTHER_TARGETS, "other targets than asked"),
            (ANSWER_FEWER_TARGETS, "fewer targets than asked"),
        ] {
            mode.store(answer, Ordering::Release);
            for _ in 0..4 {
                let (code, body) = call(&[1, 2]);
                assert_eq!(code, 500, "{what}: {body}");
                assert!(
                    body.contains("not the ones asked") || body.contains("does not match"),
                    "{what}: {body}"
                );
            }
            assert!(ready(), "still ready after {what}");
        }
        // Every executor is still there: calls are answered again.
        mode.store(ANSWER_RIGHT, Ordering::Release);
        for ids in [[3u64, 4], [5, 6], [7, 8], [9, 10]] {
            let (code, body) = call(&ids);
            assert_eq!(code, 200, "{body}");
        }
        assert_eq!(worker.child.try_wait().unwrap(), None, "the worker runs");
        assert!(worker.stop(), "clean worker shutdown");
        stop.store(true, Ordering::Release);
    });
    server.shutdown();
}

/// The embedded store's files damaged while serving (garbage written over
/// the SST files RocksDB has open): the rows that cannot be read are served
/// as flagged default rows, every call is answered, the read errors are
/// counted and logged, nothing crashes.
#[test]
fn the_store_corrupted_while_serving_costs_fallback_rows_never_a_failed_call() {
    // No L1 and no warm-up: every row is read from the store.
    let (_data, data_dir, metrics, mut stack) =
        embedded_stack(&["--l1-mib", "0", "--warm-up", "0"]);
    let (code, json) = predict(&stack, &[1, 2, 3]);
    assert_eq!((code, fallback_rows(&json)), (200, 0), "{json}");

    let mut damaged = 0;
    for entry in std::fs::read_dir(data_dir.join("features.db")).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_some_and(|e| e == "sst") {
            use std::io::{Seek, Write};
            let len = std::fs::metadata(&path).unwrap().len();
            let mut file = std::fs::OpenOptions::new().write(true).open(&path).unwrap();
            // Everything but the footer (and the index it points to, which
            // RocksDB holds since the open): the data blocks.
            file.seek(std::io::SeekFrom::Start(0)).unwrap();
            file.write_all(&vec![0x5a; (len / 2) as usize]).unwrap();
            file.sync_all().unwrap();
            damaged += 1;
        }
    }
    assert!(damaged > 0, "the store has SST files");
    // Rows never read before, so not in RocksDB's block cache.
    let mut with_fallbacks = 0;
    for first in (100..700u64).step_by(6) {
        let ids: Vec<u64> = (first..first + 6).collect();
        let (code, json) = predict(&stack, &ids);
        assert_eq!(code, 200, "{json}");
        assert_eq!(predicted_ids(&json), ids);
        with_fallbacks += u32::from(fallback_rows(&json) > 0);
    }
    assert!(with_fallbacks > 0, "damaged rows are served as fallbacks");
    assert!(metric_value(&metrics, "sidecar_l2_read_errors_total") > 0.0);
    assert_eq!(
        stack.sidecar.as_mut().unwrap().child.try_wait().unwrap(),
        None,
        "the sidecar is still running"
    );
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200);
    assert!(stack.stop(), "clean shutdown");
}

/// Overload is explicit: with the first model run held for 20 s (a
/// failpoint) and one call a batch, the worker accepts 4,096 waiting calls
/// (and the three its pipeline holds: one in the model run, one ready for
/// it, one on the ring thread) and refuses every further call at once,
/// RESOURCE_EXHAUSTED over gRPC and 503 with Retry-After over HTTP; the
/// accepted calls are all answered once the run ends.
#[test]
fn the_waiting_call_bound_refuses_the_next_call_at_once() {
    use gnn_worker::api::grpc::{pb, PredictorClient};
    use gnn_worker::batcher::MAX_QUEUED_CALLS;
    let mut options = StackOptions::new("cora");
    options.max_batch = 1;
    options.executors = 1;
    // The pipeline's bound: every call through its threads (a call run to
    // completion would hold one more).
    options.worker_args = ["--ring-concurrency", "1", "--run-to-completion", "false"]
        .map(String::from)
        .to_vec();
    options
        .worker_args
        .extend(["--call-timeout-ms".into(), "600000".into()]);
    options.worker_env = vec![(
        "FAILPOINTS".into(),
        "gnn-worker-executor=1*sleep(20000)".into(),
    )];
    let stack = Stack::start(&options).expect("stack");
    // Over 30 connections (HTTP/2 caps the streams of one).
    let (connections, per_connection) = (30, 150);
    let calls = connections * per_connection;
    let held = 3;
    let extra = calls - MAX_QUEUED_CALLS - held;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let http = stack.http.clone();
    let overloaded =
        move || metric_value(&http, "gnn_worker_call_errors_total{kind=\"overloaded\"}");
    let codes: Vec<tonic::Code> = runtime.block_on(async {
        let mut tasks = Vec::with_capacity(calls);
        for c in 0..connections {
            let client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
            for k in 0..per_connection {
                let mut client = client.clone();
                let id = ((c * per_connection + k) % 2708) as u64;
                tasks.push(tokio::spawn(async move {
                    client
                        .predict(pb::PredictRequest {
                            node_ids: vec![id],
                            request_id: id,
                            new_node: None,
                        })
                        .await
                        .map_or_else(|e| e.code(), |_| tonic::Code::Ok)
                }));
            }
        }
        // Every call beyond the bound is refused while the run is held.
        let waiting = overloaded.clone();
        let refused = tokio::task::spawn_blocking(move || {
            tests::eventually(std::time::Duration::from_secs(60), || {
                waiting() >= extra as f64
            })
        });
        let errors = tests::stack::http_request(&stack.http, "GET", "/metrics", None)
            .map(|(_, text)| {
                text.lines()
                    .filter(|l| l.starts_with("gnn_worker_call"))
                    .collect::<Vec<_>>()
                    .join("\n")
            })
            .unwrap_or_default();
        assert!(
            refused.await.unwrap(),
            "{} of {extra} refused; {errors}",
            overloaded()
        );
        // HTTP too, at once.
        let http = stack.http.clone();
        let (code, retry_after, body) =
            tokio::task::spawn_blocking(move || predict_raw(&http, &[5]))
                .await
                .unwrap();
        assert_eq!(code, 503, "{body}");
        assert_eq!(retry_after.as_deref(), Some("1"));
        assert!(body.contains("4096 calls already wait"), "{body}");
        let mut codes = Vec::with_capacity(calls);
        for task in tasks {
            codes.push(task.await.unwrap());
        }
        codes
    });
    let ok = codes.iter().filter(|&&c| c == tonic::Code::Ok).count();
    let exhausted = codes
        .iter()
        .filter(|&&c| c == tonic::Code::ResourceExhausted)
        .count();
    assert_eq!(
        (ok, exhausted),
        (MAX_QUEUED_CALLS + held, extra),
        "every accepted call answered, every other refused"
    );
    assert!(stack.stop());
}

/// No dead work: with every model run held for 3 s (a failpoint), calls
/// whose HTTP client closed its connection and gRPC calls ended at their
/// deadline are dropped when the ring thread takes them, and calls without
/// a deadline that waited past the worker's `call_timeout_ms` (1 s here)
/// are answered 504: none reaches the ring. Only the three calls the
/// pipeline held when the clients went (one in the model run, one ready for
/// it, one on the ring thread) and the next call become ring requests.
#[test]
fn calls_nobody_waits_for_are_dropped_before_the_ring() {
    use gnn_worker::api::grpc::{pb, PredictorClient};
    use std::io::Write;
    let mut options = StackOptions::new("cora");
    options.max_batch = 1;
    options.executors = 1;
    // The pipeline's rule: every call through its threads.
    options.worker_args = [
        "--ring-concurrency",
        "1",
        "--call-timeout-ms",
        "1000",
        "--run-to-completion",
        "false",
    ]
    .map(String::from)
    .to_vec();
    options.worker_env = vec![(
        "FAILPOINTS".into(),
        "gnn-worker-executor=sleep(3000)".into(),
    )];
    let stack = Stack::start(&options).expect("stack");
    // A call with a deadline of a minute: never dropped here.
    let patient = |ids: &[u64]| {
        let body = serde_json::json!({ "node_ids": ids, "timeout_ms": 60000 }).to_string();
        http_request(&stack.http, "POST", "/v1/predict", Some(&body)).unwrap()
    };
    assert_eq!(patient(&[1]).0, 200);
    let metric = |name: &str| metric_value(&stack.http, name);
    let ring_requests = metric("gnn_worker_ring_requests_total");
    let calls = || metric("gnn_worker_calls_total") as usize;
    let before = calls();
    // 20 HTTP calls whose clients then close their connections.
    let mut streams = Vec::new();
    for k in 0..20u64 {
        let body = serde_json::json!({ "node_ids": [k] }).to_string();
        let mut stream = std::net::TcpStream::connect(&stack.http).unwrap();
        write!(
            stream,
            "POST /v1/predict HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        )
        .unwrap();
        streams.push(stream);
    }
    assert!(
        tests::eventually(std::time::Duration::from_secs(20), || calls()
            == before + 20),
        "the HTTP calls arrived"
    );
    drop(streams);
    // 20 gRPC calls ended at their 1 s deadline.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let codes: Vec<tonic::Code> = runtime.block_on(async {
        let client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
        let tasks: Vec<_> = (0..20u64)
            .map(|k| {
                let mut client = client.clone();
                tokio::spawn(async move {
                    let mut request = tonic::Request::new(pb::PredictRequest {
                        node_ids: vec![100 + k],
                        request_id: k,
                        new_node: None,
                    });
                    request.set_timeout(std::time::Duration::from_secs(1));
                    client
                        .predict(request)
                        .await
                        .map_or_else(|e| e.code(), |_| tonic::Code::Ok)
                })
            })
            .collect();
        let mut codes = Vec::new();
        for task in tasks {
            codes.push(task.await.unwrap());
        }
        codes
    });
    // Ended at their deadline (the client's timer or the server's).
    assert!(
        codes
            .iter()
            .all(|&c| matches!(c, tonic::Code::DeadlineExceeded | tonic::Code::Cancelled)),
        "{codes:?}"
    );
    // 5 HTTP calls without a deadline that wait longer than call_timeout_ms.
    let late: Vec<_> = (0..5u64)
        .map(|k| {
            let http = stack.http.clone();
            std::thread::spawn(move || {
                let body = serde_json::json!({ "node_ids": [200 + k] });
                http_request(&http, "POST", "/v1/predict", Some(&body.to_string())).unwrap()
            })
        })
        .collect();
    for call in late {
        let (code, body) = call.join().unwrap();
        assert_eq!(code, 504, "{body}");
        assert!(body.contains("past its deadline"), "{body}");
    }
    assert_eq!(patient(&[7]).0, 200);
    assert_eq!(
        metric("gnn_worker_calls_dropped_total{why=\"gone\"}"),
        37.0,
        "the HTTP calls after the first three, and the gRPC calls"
    );
    assert_eq!(
        metric("gnn_worker_calls_dropped_total{why=\"deadline\"}"),
        5.0
    );
    assert_eq!(
        metric("gnn_worker_ring_requests_total") - ring_requests,
        4.0,
        "the three calls the pipeline held, and the next one"
    );
    assert!(stack.stop());
}

/// Transport-level decode failures of a unary call are the client's
/// mistake: an empty body, a frame cut short, and a compressed flag without
/// `grpc-encoding` are INVALID_ARGUMENT (tonic reports INTERNAL, which is
/// documented as retryable), and the worker serves on.
#[test]
fn grpc_transport_decode_failures_are_invalid_argument() {
    use tonic::codegen::Service;
    let stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let good = encoded(&[1], 1);
    let frame = |flag: u8, message: &[u8], declared: usize| {
        let mut body = vec![flag];
        body.extend_from_slice(&(declared as u32).to_be_bytes());
        body.extend_from_slice(message);
        body
    };
    let bodies = [
        ("an empty body", Vec::new()),
        ("a frame cut short", frame(0, &good, good.len() + 10)),
        (
            "a compressed flag without grpc-encoding",
            frame(1, &good, good.len()),
        ),
    ];
    runtime.block_on(async {
        let mut channel = tonic::transport::Channel::from_shared(stack.grpc.clone())
            .unwrap()
            .connect()
            .await
            .expect("connect");
        for (what, body) in bodies {
            let request = tonic::codegen::http::Request::builder()
                .method("POST")
                .uri(format!("{}/gnn.v1.Predictor/Predict", stack.grpc))
                .header("content-type", "application/grpc")
                .header("te", "trailers")
                .body(tonic::body::Body::new(http_body_util::Full::new(
                    bytes::Bytes::from(body),
                )))
                .unwrap();
            std::future::poll_fn(|cx| channel.poll_ready(cx))
                .await
                .unwrap();
            let response = channel.call(request).await.expect("an HTTP answer");
            let status = tonic::Status::from_header_map(response.headers())
                .unwrap_or_else(|| panic!("{what}: no grpc-status in the headers"));
            assert_eq!(
                status.code(),
                tonic::Code::InvalidArgument,
                "{what}: {status:?}"
            );
        }
    });
    // The channel's connection goes with its runtime.
    drop(runtime);
    assert_eq!(predict(&stack, &[1]).0, 200, "the worker serves on");
    assert!(stack.stop());
}

/// A burst on one stream: 100,000 one-node requests sent back to back (as
/// fast as HTTP/2 flow control lets them go) are all answered, in order:
/// the worker reads a burst off the connection instead of leaving its
/// small frames to HTTP/2's flood protection, and answers many at once.
#[test]
fn a_burst_of_100000_stream_requests_is_answered_in_order() {
    use gnn_worker::api::grpc::{pb, PredictorClient};
    let mut options = StackOptions::new("cora");
    // What is tested is order and completeness, not speed: on a machine
    // whose cores other processes hold, one ring round trip of the burst
    // took longer than the default 500 ms and its calls were answered
    // "deadline exceeded", as they should be in production.
    options.worker_args = ["--ring-timeout-ms", "60000"].map(String::from).to_vec();
    let stack = Stack::start(&options).expect("stack");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let n = 100_000u64;
    let answered = runtime.block_on(async {
        let mut client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
        let requests = (1..=n).map(|k| pb::PredictRequest {
            node_ids: vec![k % 2708],
            request_id: k,
            new_node: None,
        });
        let mut answers = client
            .predict_stream(tokio_stream::iter(requests))
            .await
            .expect("the stream opens")
            .into_inner();
        let mut next = 1u64;
        while let Some(answer) = answers.message().await.expect("the stream holds") {
            assert_eq!(answer.request_id, next);
            assert!(answer.error.is_none(), "{answer:?}");
            assert_eq!(answer.predictions[0].node_id, next % 2708);
            next += 1;
        }
        next - 1
    });
    assert_eq!(answered, n);
    assert!(stack.stop());
}

/// Calls that wait for the batcher when the sidecar is found gone fail then
/// (503), instead of each waiting up to `ring_timeout_ms` (here ten
/// minutes) for a new sidecar; once the sidecar is back, calls succeed.
#[test]
fn waiting_calls_fail_when_the_sidecar_is_found_gone() {
    let mut options = StackOptions::new("cora");
    options.max_batch = 1;
    options.worker_args = ["--ring-concurrency", "1", "--ring-timeout-ms", "600000"]
        .map(String::from)
        .to_vec();
    let stack = Stack::start(&options).expect("stack");
    assert_eq!(predict(&stack, &[1]).0, 200);
    let pid = stack.sidecar.as_ref().unwrap().child.id();
    // Frozen: its heartbeat stands still, and after a second the worker
    // takes it for gone.
    tests::stack::freeze_process(pid);
    let calls: Vec<_> = (0..8u64)
        .map(|k| {
            let http = stack.http.clone();
            std::thread::spawn(move || predict_raw(&http, &[k]))
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let answers: Vec<_> = calls.into_iter().map(|c| c.join().unwrap()).collect();
        let _ = tx.send(answers);
    });
    let answers = rx
        .recv_timeout(std::time::Duration::from_secs(60))
        .expect("the waiting calls were answered, not held for ring_timeout_ms");
    tests::stack::thaw_process(pid);
    for (code, _, body) in &answers {
        assert_eq!(*code, 503, "{body}");
    }
    assert!(
        tests::eventually(std::time::Duration::from_secs(30), || predict(&stack, &[2])
            .0
            == 200),
        "serving resumed"
    );
    assert!(stack.stop());
}

/// A bare SIGTERM to the sidecar fails none of the calls the worker had
/// accepted: its drain waits for the worker's accepted calls (counted in
/// its registry entry), and the worker still submits them while the
/// segment is DRAINING; calls made after the drain began are refused at
/// once.
#[test]
fn a_sidecar_drain_answers_every_call_the_worker_had_accepted() {
    let mut options = StackOptions::new("cora");
    options.max_batch = 1;
    options.executors = 1;
    options.worker_args = ["--ring-concurrency", "1"].map(String::from).to_vec();
    // Each model run takes 300 ms: the calls wait in the worker's queue.
    options.worker_env = vec![("FAILPOINTS".into(), "gnn-worker-executor=sleep(300)".into())];
    let mut stack = Stack::start(&options).expect("stack");
    let http = stack.http.clone();
    let calls_before = metric_value(&http, "gnn_worker_calls_total");
    let n = 8u64;
    let calls: Vec<_> = (0..n)
        .map(|k| {
            let http = http.clone();
            std::thread::spawn(move || predict_raw(&http, &[k]))
        })
        .collect();
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || metric_value(
            &http,
            "gnn_worker_calls_total"
        ) >= calls_before
            + n as f64),
        "the calls reached the worker"
    );
    std::thread::sleep(std::time::Duration::from_millis(100));
    let sidecar = stack.sidecar.take().expect("a sidecar");
    let stopping = std::thread::spawn(move || sidecar.stop());
    // Once the worker sees the segment DRAINING (its readiness says so), a
    // new call is refused at once. (Polling with calls instead raced on a
    // loaded machine: a call that got in before the drain was visible is
    // one of the accepted ones, answered 200 behind the others, and the
    // next one came after the drain had ended.)
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || {
            stack
                .http_get("/readyz")
                .is_ok_and(|(code, body)| code == 503 && body.contains("draining"))
        }),
        "the worker saw the drain"
    );
    let (code, _, body) = predict_raw(&http, &[100]);
    assert!(
        code == 503 && body.contains("draining"),
        "a call made during the drain is refused as unavailable: {code} {body}"
    );
    for call in calls {
        let (code, _, body) = call.join().unwrap();
        assert_eq!(
            code, 200,
            "an accepted call failed during the drain: {body}"
        );
    }
    assert!(stopping.join().unwrap(), "the sidecar stopped cleanly");
    assert!(stack.worker.take().expect("a worker").stop());
}

/// Idle and half-sent connections by the hundred cannot lock the worker's
/// ports: on the HTTP port a new connection at `max_connections` closes
/// the one waiting longest for a request, so probes and calls get in at
/// once; on the gRPC port connections past the cap are closed at once and
/// those that send no HTTP/2 preface within `http_read_timeout_s` are
/// closed then, so a new client gets in; every connection held without a
/// request is closed by the worker.
#[test]
fn idle_and_half_sent_connections_cannot_lock_the_ports() {
    use gnn_worker::api::grpc::{pb, PredictorClient};
    use std::io::{Read, Write};
    let mut options = StackOptions::new("cora");
    options.worker_args = ["--max-connections", "32", "--http-read-timeout-s", "1"]
        .map(String::from)
        .to_vec();
    let stack = Stack::start(&options).expect("stack");
    let grpc_addr = stack.grpc.trim_start_matches("http://").to_string();
    let mut held = Vec::new();
    for k in 0..100 {
        let mut http = std::net::TcpStream::connect(&stack.http).unwrap();
        let mut grpc = std::net::TcpStream::connect(&grpc_addr).unwrap();
        if k % 2 == 0 {
            // Half-sent: a request head, a preface, cut short.
            http.write_all(b"POST /v1/predict HTTP/1.1\r\nHost: x\r\n")
                .unwrap();
            grpc.write_all(b"PRI * HTTP/2.0\r\n").unwrap();
        }
        held.push(http);
        held.push(grpc);
    }
    // HTTP: a probe and a call, on new connections, at once.
    assert_eq!(stack.http_get("/readyz").unwrap().0, 200);
    assert_eq!(predict(&stack, &[1]).0, 200);
    let metric = |name: &str| metric_value(&stack.http, name);
    assert!(
        metric("gnn_worker_connections_closed_total{port=\"http\",why=\"evicted\"}") >= 68.0,
        "room was made by closing the connections waiting longest"
    );
    // gRPC: a new client gets in once the held ones are closed.
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let served = tests::eventually(std::time::Duration::from_secs(20), || {
        runtime.block_on(async {
            let Ok(mut client) = PredictorClient::connect(stack.grpc.clone()).await else {
                return false;
            };
            client
                .predict(pb::PredictRequest {
                    node_ids: vec![2],
                    request_id: 2,
                    new_node: None,
                })
                .await
                .is_ok()
        })
    });
    assert!(served, "a new gRPC client got in");
    // The first held connection to time out (or be evicted, silent for
    // http_read_timeout_s) lets the client in; the others time out within
    // moments of it.
    let grpc_closed = |why: &str| {
        metric(&format!(
            "gnn_worker_connections_closed_total{{port=\"grpc\",why=\"{why}\"}}"
        ))
    };
    assert!(
        tests::eventually(std::time::Duration::from_secs(10), || grpc_closed(
            "timed_out"
        ) + grpc_closed(
            "evicted"
        ) >= 68.0),
        "every held gRPC connection without a preface was closed"
    );
    // Established HTTP/2 connections, as many as the cap, all idle: a new
    // client gets in by closing the one silent longest.
    let evicted_before = grpc_closed("evicted");
    let idle = runtime.block_on(async {
        let mut idle = Vec::new();
        for k in 0..32u64 {
            let mut client = PredictorClient::connect(stack.grpc.clone())
                .await
                .expect("an idle client connects");
            client
                .predict(pb::PredictRequest {
                    node_ids: vec![k],
                    request_id: k,
                    new_node: None,
                })
                .await
                .expect("an idle client's first call");
            idle.push(client);
        }
        idle
    });
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let newcomer = runtime.block_on(async {
        let mut client = PredictorClient::connect(stack.grpc.clone()).await?;
        client
            .predict(pb::PredictRequest {
                node_ids: vec![3],
                request_id: 3,
                new_node: None,
            })
            .await
            .map_err(Box::<dyn std::error::Error>::from)
    });
    assert!(
        newcomer.is_ok(),
        "a new client got past idle connections: {newcomer:?}"
    );
    assert!(
        grpc_closed("evicted") > evicted_before,
        "an idle connection made room"
    );
    drop(idle);
    drop(runtime);
    // Every held connection is closed by the worker: reading ends.
    for mut stream in held {
        stream
            .set_read_timeout(Some(std::time::Duration::from_secs(10)))
            .unwrap();
        let mut sink = Vec::new();
        let read = stream.read_to_end(&mut sink);
        assert!(
            read.is_ok()
                || read
                    .as_ref()
                    .is_err_and(|e| e.kind() == std::io::ErrorKind::ConnectionReset),
            "a held connection stayed open: {read:?}"
        );
    }
    assert!(stack.stop());
}
