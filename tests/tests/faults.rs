//! Faults and limits on the whole stack (real sidecar, real worker, real
//! ONNX Runtime): each test asserts what a client sees, and that nothing is
//! lost (docs/reliability.md lists the fault, the behaviour and the test).

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

/// Four callers call `ids` (each its own offset of them) every 20 ms for
/// `period`; every call must be answered OK. Returns how many calls there
/// were and how many had fallback rows.
fn calls_during(stack: &Stack, ids: &[u64], period: std::time::Duration) -> (u32, u32) {
    let until = std::time::Instant::now() + period;
    std::thread::scope(|scope| {
        let callers: Vec<_> = (0..4u64)
            .map(|caller| {
                scope.spawn(move || {
                    let ids: Vec<u64> = ids.iter().map(|id| id + caller * 10).collect();
                    let (mut calls, mut with_fallbacks) = (0, 0);
                    while std::time::Instant::now() < until {
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
    tests::stack::sidecar_import(
        &tests::stack::dataset("cora"),
        &data.path().join("data"),
        &["--redis", &redis.url()],
    );
    let mut options = StackOptions::new("cora");
    options.imported = Some(data.path().join("data"));
    // Every row from Redis: no L1, no L2.
    options.sidecar_args = [
        "--redis",
        &redis.url(),
        "--l1-mib",
        "0",
        "--no-l2",
        "--warm-up",
        "0",
    ]
    .map(String::from)
    .to_vec();
    let stack = Stack::start(&options).expect("stack");
    let ids = [1u64, 2, 3];
    let (code, json) = predict(&stack, &ids);
    assert_eq!(code, 200, "{json}");
    assert_eq!(fallback_rows(&json), 0, "Redis serves every row: {json}");

    // Redis frozen (SIGSTOP) for 2 s: every call still answered, with the
    // rows that could not arrive flagged as fallbacks.
    redis.freeze();
    let (calls, with_fallbacks) = calls_during(&stack, &ids, std::time::Duration::from_secs(2));
    redis.thaw();
    assert!(calls >= 5, "{calls} calls in 2 s");
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
