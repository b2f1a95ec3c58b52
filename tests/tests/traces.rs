//! Traces across the pod pair (docs/operations.md, "Traces"): with
//! `otlp_endpoint` set on both daemons, one call's spans reach a real OTLP
//! receiver (the OpenTelemetry collector's own `TraceService`, from
//! opentelemetry-proto, on a loopback port) from both processes, share the
//! trace id of the client's `traceparent`, and nest: the worker's front end,
//! queue, batch, ring call and ONNX run; under the ring call the sidecar's
//! request, its sampling, its fetch through L1, L2 and the Redis MGET, and
//! its response write. Without a sampled parent and at ratio 0 nothing is
//! exported.

use std::collections::HashMap;
use std::process::{Command, Stdio};
use std::time::Duration;

use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::eventually;
use tests::otlp::{Received, Receiver};
use tests::redis::RedisServer;
use tests::stack::{dataset, workspace_bin, Stack, StackOptions};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The spans of `trace` that the receiver holds.
fn trace_spans(receiver: &Receiver, trace: &[u8]) -> Vec<Received> {
    receiver
        .spans()
        .into_iter()
        .filter(|s| s.trace_id == trace)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_calls_spans_from_both_processes_share_its_trace_and_nest() {
    let (receiver, endpoint, server) = Receiver::serve("127.0.0.1:0").await.unwrap();

    // Features in Redis, none cached: the call's fetch goes through every
    // tier.
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let imported = Command::new(workspace_bin("sidecar"))
        .arg("import")
        .arg(dataset("cora"))
        .arg("--data-dir")
        .arg(data.path())
        .args(["--redis", &redis.url()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(imported.success());
    let mut options = StackOptions::new("cora");
    options.imported = Some(data.path().to_path_buf());
    options.sidecar_args = [
        "--redis",
        &redis.url(),
        "--warm-up",
        "0",
        "--otlp-endpoint",
        &endpoint,
    ]
    .map(String::from)
    .to_vec();
    options.worker_args = ["--otlp-endpoint", &endpoint, "--trace-sample-ratio", "0"]
        .map(String::from)
        .to_vec();
    // Export every 200 ms rather than every 5 s.
    let export_often = vec![("OTEL_BSP_SCHEDULE_DELAY".to_string(), "200".to_string())];
    options.worker_env = export_often.clone();
    options.sidecar_env = export_often;
    let stack = tokio::task::spawn_blocking(move || Stack::start(&options).unwrap())
        .await
        .unwrap();

    // An untraced call at ratio 0: nothing is exported for it.
    let mut client = PredictorClient::connect(stack.grpc.clone()).await.unwrap();
    client
        .predict(pb::PredictRequest {
            node_ids: vec![3],
            ..Default::default()
        })
        .await
        .unwrap();

    // A traced call: the client's traceparent, sampled.
    let trace_id: [u8; 16] = *b"gnn-serving-test";
    let client_span = [7u8; 8];
    let traceparent = format!("00-{}-{}-01", hex(&trace_id), hex(&client_span));
    let mut request = tonic::Request::new(pb::PredictRequest {
        node_ids: vec![1],
        ..Default::default()
    });
    request
        .metadata_mut()
        .insert("traceparent", traceparent.parse().unwrap());
    let answer = client.predict(request).await.unwrap().into_inner();
    assert_eq!(answer.predictions.len(), 1);

    let expected = [
        ("gnn-worker", "predict"),
        ("gnn-worker", "queue"),
        ("gnn-worker", "batch"),
        ("gnn-worker", "ring"),
        ("gnn-worker", "onnx"),
        ("gnn-sidecar", "sidecar.request"),
        ("gnn-sidecar", "sample"),
        ("gnn-sidecar", "write_response"),
        ("gnn-sidecar", "fetch"),
        ("gnn-sidecar", "l1"),
        ("gnn-sidecar", "l2"),
        ("gnn-sidecar", "redis.mget"),
    ];
    let all_there = tokio::task::block_in_place(|| {
        eventually(Duration::from_secs(30), || {
            let spans = trace_spans(&receiver, &trace_id);
            expected.iter().all(|(service, name)| {
                spans
                    .iter()
                    .any(|s| s.service == *service && s.name == *name)
            })
        })
    });
    let spans = trace_spans(&receiver, &trace_id);
    let names: Vec<(String, String)> = spans
        .iter()
        .map(|s| (s.service.clone(), s.name.clone()))
        .collect();
    assert!(all_there, "spans of the traced call: {names:?}");

    // Nesting: each span's parent, by name.
    let by_id: HashMap<&[u8], &Received> =
        spans.iter().map(|s| (s.span_id.as_slice(), s)).collect();
    let one = |service: &str, name: &str| -> &Received {
        let found: Vec<&Received> = spans
            .iter()
            .filter(|s| s.service == service && s.name == name)
            .collect();
        assert_eq!(found.len(), 1, "{service} {name}: {found:?}");
        found[0]
    };
    let parent_of = |span: &Received| -> String {
        if span.parent == client_span {
            return "client".into();
        }
        by_id.get(span.parent.as_slice()).map_or_else(
            || format!("unknown {}", hex(&span.parent)),
            |p| p.name.clone(),
        )
    };
    for (service, name, parent) in [
        ("gnn-worker", "predict", "client"),
        ("gnn-worker", "queue", "predict"),
        ("gnn-worker", "batch", "predict"),
        ("gnn-worker", "ring", "batch"),
        ("gnn-worker", "onnx", "batch"),
        ("gnn-sidecar", "sidecar.request", "ring"),
        ("gnn-sidecar", "sample", "sidecar.request"),
        ("gnn-sidecar", "write_response", "sidecar.request"),
        ("gnn-sidecar", "fetch", "write_response"),
        ("gnn-sidecar", "l1", "fetch"),
        ("gnn-sidecar", "l2", "fetch"),
        ("gnn-sidecar", "redis.mget", "fetch"),
    ] {
        let span = one(service, name);
        assert_eq!(parent_of(span), parent, "the parent of {service} {name}");
        if span.parent != client_span {
            // A child starts within its parent's time (one machine, one
            // clock). Its end may trail the parent's by microseconds: the
            // sidecar closes its spans just after it publishes the response
            // that ends the worker's `ring` span.
            let p = by_id[span.parent.as_slice()];
            assert!(
                p.start <= span.start && span.start <= p.end,
                "{name} [{}, {}] starts outside {} [{}, {}]",
                span.start,
                span.end,
                p.name,
                p.start,
                p.end
            );
        }
    }
    // Over HTTP: the traceparent header, the same spans.
    let http_trace: [u8; 16] = *b"gnn-serving-http";
    let body = r#"{"node_ids": [2]}"#;
    let raw = format!(
        "POST /v1/predict HTTP/1.1\r\nHost: worker\r\nContent-Type: application/json\r\n\
         traceparent: 00-{}-{}-01\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        hex(&http_trace),
        hex(&client_span),
        body.len()
    );
    let reply = tokio::task::block_in_place(|| {
        use std::io::{Read, Write};
        let mut socket = std::net::TcpStream::connect(&stack.http).unwrap();
        socket.write_all(raw.as_bytes()).unwrap();
        let mut reply = String::new();
        socket.read_to_string(&mut reply).unwrap();
        reply
    });
    assert!(reply.starts_with("HTTP/1.1 200"), "{reply}");
    let over_http = tokio::task::block_in_place(|| {
        eventually(Duration::from_secs(30), || {
            let spans = trace_spans(&receiver, &http_trace);
            ["predict", "ring", "onnx", "sidecar.request", "redis.mget"]
                .iter()
                .all(|name| spans.iter().any(|s| s.name == *name))
        })
    });
    assert!(
        over_http,
        "spans of the HTTP call: {:?}",
        trace_spans(&receiver, &http_trace)
            .iter()
            .map(|s| &s.name)
            .collect::<Vec<_>>()
    );
    let predict = trace_spans(&receiver, &http_trace)
        .into_iter()
        .find(|s| s.name == "predict")
        .unwrap();
    assert_eq!(predict.parent, client_span);

    // The untraced call: no other trace was exported.
    let others: Vec<String> = receiver
        .spans()
        .iter()
        .filter(|s| s.trace_id != trace_id && s.trace_id != http_trace)
        .map(|s| format!("{} {} {}", s.service, s.name, hex(&s.trace_id)))
        .collect();
    assert!(others.is_empty(), "spans of an untraced call: {others:?}");

    tokio::task::block_in_place(|| assert!(stack.stop(), "the stack did not stop cleanly"));
    server.abort();
}
