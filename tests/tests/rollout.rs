//! A model rolled out without a restart (docs/operations.md, "Rolling out
//! a model"): a `current` symlink swapped from model A (GraphSAGE) to
//! model B (the same trained from another seed) under gRPC load is
//! switched to without a failed call, every call answered by one model
//! whole (each prediction's logits are its named model's, nearer them
//! than the other model's), and
//! /readyz, `gnn_worker_model_info` and the rollout counter say so; a
//! directory whose manifest does not match the sidecar's graph, and one
//! whose model.onnx is not a model, are refused and the model serving
//! keeps serving; with the directory not watched, SIGHUP rolls out; a
//! model directory's own `student/` is rolled out with its model, and
//! precomputed answers are served only by the model that computed them.

use std::collections::HashMap;
use std::os::unix::fs::symlink;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use gnn_worker::api::grpc::{pb, PredictorClient};
use std::process::Command;
use tests::eventually;
use tests::redis::RedisServer;
use tests::stack::{
    copy_dir, metric_value, python, repo_root, run_ok, shipped_cora, Stack, StackOptions,
};

/// The nodes the test calls for.
const NODES: u64 = 40;

/// Points `link` at `target` atomically (a new link renamed over it), as
/// an operator's `ln -sfn` + `mv -T` does.
fn swap_link(link: &Path, target: &str) {
    let tmp = link.with_extension("tmp");
    let _ = std::fs::remove_file(&tmp);
    symlink(target, &tmp).unwrap();
    std::fs::rename(&tmp, link).unwrap();
}

/// `models/{a, b}` (the tooling's cora model, and one trained from another
/// seed) and `models/current` pointing at `a`.
fn model_dirs(root: &Path) -> std::path::PathBuf {
    let cora = shipped_cora();
    let models = root.join("models");
    copy_dir(&tests::stack::trained_model_for(&cora), &models.join("a"));
    run_ok(
        Command::new(python())
            .arg(repo_root().join("gnn-worker/model/sage.py"))
            .args(["train", "--seed", "7", "--epochs", "60", "--dataset"])
            .arg(&cora)
            .arg("--out")
            .arg(models.join("b")),
        "training model b",
    );
    let current = models.join("current");
    symlink("a", &current).unwrap();
    current
}

/// The sha256 /readyz names, once ready.
fn ready_sha(stack: &Stack) -> Option<String> {
    let (code, body) = stack.http_get("/readyz").ok()?;
    (code == 200).then(|| body.split_whitespace().last().unwrap_or("").to_string())
}

/// Every node's logits from model `name`, one call per node.
async fn reference(grpc: &str, name: &str) -> HashMap<u64, Vec<f32>> {
    let mut client = PredictorClient::connect(grpc.to_string()).await.unwrap();
    let mut out = HashMap::new();
    for id in 0..NODES {
        let response = client
            .predict(pb::PredictRequest {
                node_ids: vec![id],
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(response.model, name, "node {id} answered by another model");
        out.insert(id, response.predictions[0].logits.clone());
    }
    out
}

fn close(a: &[f32], b: &[f32], tolerance: f32) -> bool {
    a.len() == b.len() && distance(a, b) <= tolerance
}

/// The largest difference between two rows of logits.
fn distance(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// How far an answer may be from its model's answer to the node alone
/// (a batch's kernels may sum in another order).
const TOLERANCE: f32 = 1e-3;

/// Two models are told apart on a node where they differ by this much.
const APART: f32 = 0.1;

fn rollouts(stack: &Stack, outcome: &str) -> f64 {
    metric_value(
        &stack.http,
        &format!("gnn_worker_model_rollouts_total{{outcome=\"{outcome}\"}}"),
    )
}

/// A stack serving the model `current` points at, with `worker_args`.
async fn stack_on(current: &Path, worker_args: &[&str]) -> Stack {
    let mut options = StackOptions::new("cora");
    options.model = Some(current.to_path_buf());
    options.worker_args = worker_args.iter().map(|a| a.to_string()).collect();
    tokio::task::spawn_blocking(move || Stack::start(&options).unwrap())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_new_model_is_rolled_out_under_load_without_a_failed_or_mixed_call() {
    let root = tempfile::tempdir().unwrap();
    let current = model_dirs(root.path());
    let models = current.parent().unwrap().to_path_buf();
    let stack = stack_on(&current, &["--model-watch-s", "0.2"]).await;
    let sha =
        |dir: &str| gnn_worker::model::sha256_hex(&models.join(dir).join("model.onnx")).unwrap();
    let (sha_a, sha_b) = (sha("a"), sha("b"));
    assert_ne!(sha_a, sha_b);
    assert_eq!(ready_sha(&stack).as_deref(), Some(sha_a.as_str()));
    let info_a = format!("gnn_worker_model_info{{model=\"a\",sha256=\"{sha_a}\"}}");
    assert_eq!(metric_value(&stack.http, &info_a), 1.0);
    assert_eq!(rollouts(&stack, "switched"), 0.0);
    assert_eq!(rollouts(&stack, "refused"), 0.0);
    let ref_a = reference(&stack.grpc, "a").await;

    // Load: four clients calling for 1 to 3 nodes at a time, every answer
    // recorded with the model that says it answered.
    let stop = Arc::new(AtomicBool::new(false));
    let mut clients = Vec::new();
    for c in 0..4u64 {
        let (grpc, stop) = (stack.grpc.clone(), stop.clone());
        clients.push(tokio::spawn(async move {
            let mut client = PredictorClient::connect(grpc).await.unwrap();
            let (mut answers, mut errors) = (Vec::new(), Vec::new());
            let mut i = c;
            while !stop.load(Ordering::Acquire) {
                i += 7;
                let ids: Vec<u64> = (0..1 + i % 3).map(|k| (i + k * 11) % NODES).collect();
                match client
                    .predict(pb::PredictRequest {
                        node_ids: ids.clone(),
                        ..Default::default()
                    })
                    .await
                {
                    Ok(r) => answers.push((ids, r.into_inner())),
                    Err(status) => errors.push(status.to_string()),
                }
            }
            (answers, errors)
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    swap_link(&current, "b");
    let switched = {
        let stack = &stack;
        let sha_b = sha_b.clone();
        tokio::task::block_in_place(|| {
            eventually(Duration::from_secs(60), || {
                ready_sha(stack).as_deref() == Some(sha_b.as_str())
            })
        })
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Release);
    let (mut answers, mut errors) = (Vec::new(), Vec::new());
    for client in clients {
        let (a, e) = client.await.unwrap();
        answers.extend(a);
        errors.extend(e);
    }
    assert!(switched, "/readyz never named model b");
    assert!(
        errors.is_empty(),
        "calls failed during the rollout: {errors:?}"
    );
    let ref_b = reference(&stack.grpc, "b").await;
    let apart: Vec<f32> = (0..NODES)
        .map(|id| distance(&ref_a[&id], &ref_b[&id]))
        .collect();
    println!("a and b differ by {apart:?}");
    let differ = apart.iter().filter(|d| **d >= APART).count();
    assert!(
        differ as u64 > NODES / 4,
        "models a and b answer alike ({differ} of {NODES} nodes differ): the test cannot tell \
         them apart"
    );
    let mut by_model: HashMap<String, usize> = HashMap::new();
    for (ids, response) in &answers {
        let (reference, other, sha) = match response.model.as_str() {
            "a" => (&ref_a, &ref_b, &sha_a),
            "b" => (&ref_b, &ref_a, &sha_b),
            other => panic!("answered by {other:?}"),
        };
        assert_eq!(&response.model_sha256, sha);
        assert_eq!(response.predictions.len(), ids.len());
        for (id, p) in ids.iter().zip(&response.predictions) {
            let (mine, theirs) = (
                distance(&p.logits, &reference[id]),
                distance(&p.logits, &other[id]),
            );
            assert!(
                mine <= TOLERANCE
                    && (distance(&reference[id], &other[id]) < APART || mine < theirs),
                "node {id} in a call answered by model {}: logits {:?}, that model's {:?}, the \
                 other's {:?}",
                response.model,
                p.logits,
                reference[id],
                other[id]
            );
        }
        *by_model.entry(response.model.clone()).or_default() += 1;
    }
    println!("calls answered during the test, by model: {by_model:?}");
    assert!(
        by_model.get("a").is_some_and(|n| *n > 0) && by_model.get("b").is_some_and(|n| *n > 0),
        "the load did not span the switch: {by_model:?}"
    );
    assert_eq!(rollouts(&stack, "switched"), 1.0);
    let info_b = format!("gnn_worker_model_info{{model=\"b\",sha256=\"{sha_b}\"}}");
    assert_eq!(metric_value(&stack.http, &info_b), 1.0);
    let (_, metrics) = tests::stack::http_request(&stack.http, "GET", "/metrics", None).unwrap();
    assert!(
        !metrics.contains(&info_a),
        "the old model is still in gnn_worker_model_info"
    );

    // Refused: a manifest for another feature width, then a model.onnx
    // that is not a model. Model b keeps serving.
    let wrong = models.join("wrong-dim");
    copy_dir(&models.join("a"), &wrong);
    let manifest_path = wrong.join("manifest.json");
    let mut manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&manifest_path).unwrap()).unwrap();
    manifest["feature_dim"] = serde_json::json!(99);
    std::fs::write(&manifest_path, manifest.to_string()).unwrap();
    let broken = models.join("broken");
    copy_dir(&models.join("a"), &broken);
    std::fs::write(broken.join("model.onnx"), b"not an ONNX model").unwrap();
    for (n, dir) in [(1.0, "wrong-dim"), (2.0, "broken")] {
        swap_link(&current, dir);
        let refused = tokio::task::block_in_place(|| {
            eventually(Duration::from_secs(60), || rollouts(&stack, "refused") >= n)
        });
        assert!(refused, "the rollout of {dir} was not refused");
        assert_eq!(ready_sha(&stack).as_deref(), Some(sha_b.as_str()));
        let still = reference(&stack.grpc, "b").await;
        assert!((0..NODES).all(|id| close(&still[&id], &ref_b[&id], TOLERANCE)));
    }
    assert_eq!(rollouts(&stack, "switched"), 1.0);

    // Back to a: a rollback is a rollout.
    swap_link(&current, "a");
    let back = tokio::task::block_in_place(|| {
        eventually(Duration::from_secs(60), || {
            ready_sha(&stack).as_deref() == Some(sha_a.as_str())
        })
    });
    assert!(back, "the rollback to a did not happen");
    let again = reference(&stack.grpc, "a").await;
    assert!((0..NODES).all(|id| close(&again[&id], &ref_a[&id], 1e-4)));
    tokio::task::block_in_place(|| assert!(stack.stop(), "the stack did not stop cleanly"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_the_directory_unwatched_sighup_rolls_out() {
    let root = tempfile::tempdir().unwrap();
    let current = model_dirs(root.path());
    let models = current.parent().unwrap().to_path_buf();
    let stack = stack_on(&current, &["--model-watch-s", "0"]).await;
    let sha_b = gnn_worker::model::sha256_hex(&models.join("b/model.onnx")).unwrap();
    swap_link(&current, "b");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(
        ready_sha(&stack).as_deref(),
        Some(sha_b.as_str()),
        "model_watch_s 0 rolled out without a signal"
    );
    reference(&stack.grpc, "a").await;
    let pid = stack.worker.as_ref().unwrap().child.id();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let switched = tokio::task::block_in_place(|| {
        eventually(Duration::from_secs(60), || {
            ready_sha(&stack).as_deref() == Some(sha_b.as_str())
        })
    });
    assert!(switched, "SIGHUP did not roll out model b");
    reference(&stack.grpc, "b").await;
    tokio::task::block_in_place(|| assert!(stack.stop(), "the stack did not stop cleanly"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_models_own_student_is_rolled_out_with_it() {
    // a: the GNN alone; b: the same GNN with its student in b/student.
    let root = tempfile::tempdir().unwrap();
    let cora = shipped_cora();
    let models = root.path().join("models");
    copy_dir(&tests::stack::trained_model_for(&cora), &models.join("a"));
    copy_dir(&tests::stack::trained_model_for(&cora), &models.join("b"));
    copy_dir(
        &tests::stack::derived_model_for(&cora, "distill"),
        &models.join("b/student"),
    );
    let current = models.join("current");
    symlink("a", &current).unwrap();
    // Every call goes to the student when there is one.
    let stack = stack_on(
        &current,
        &["--model-watch-s", "0.2", "--degrade-queue-calls", "0"],
    )
    .await;
    let before = ask(&stack.grpc).await;
    assert_eq!(before.model, "a");
    assert!(before.predictions.iter().all(|p| p.answered_by == "gnn"));
    swap_link(&current, "b");
    let after = answered_by_model(&stack.grpc, "b").await;
    assert!(
        after.predictions.iter().all(|p| p.answered_by == "student"),
        "b's student does not answer: {after:?}"
    );
    // Back to a: its GNN answers again (a has no student).
    swap_link(&current, "a");
    let back = answered_by_model(&stack.grpc, "a").await;
    assert!(back.predictions.iter().all(|p| p.answered_by == "gnn"));
    tokio::task::block_in_place(|| assert!(stack.stop(), "the stack did not stop cleanly"));
}

/// One call for nodes 5 and 6.
async fn ask(grpc: &str) -> pb::PredictResponse {
    let mut client = PredictorClient::connect(grpc.to_string()).await.unwrap();
    client
        .predict(pb::PredictRequest {
            node_ids: vec![5, 6],
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
}

/// The first answer by model `name`, within a minute.
async fn answered_by_model(grpc: &str, name: &str) -> pb::PredictResponse {
    answered_by(grpc, name, None).await
}

/// Runs `gnn-worker precompute` of `model` against the stack's sidecar.
fn precompute(stack: &Stack, model: &Path, redis: &RedisServer) {
    let (said, _) = run_ok(
        Command::new(tests::stack::workspace_bin("gnn-worker"))
            .args(["precompute", "--model"])
            .arg(model)
            .args(["--shm-name", &stack.shm_name, "--redis", &redis.url()])
            .arg("--onnxruntime-lib")
            .arg(tests::stack::onnxruntime_lib()),
        "gnn-worker precompute",
    );
    assert!(said.contains("precomputed 2708 nodes"), "{said}");
}

/// The first answer by model `name` whose every prediction came from `by`
/// (any source when `None`), within a minute.
async fn answered_by(grpc: &str, name: &str, by: Option<&str>) -> pb::PredictResponse {
    let started = std::time::Instant::now();
    loop {
        let answer = ask(grpc).await;
        if answer.model == name
            && by.is_none_or(|by| answer.predictions.iter().all(|p| p.answered_by == by))
        {
            return answer;
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "no answer by model {name} from {by:?}: {answer:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn precomputed_answers_follow_the_model_that_computed_them() {
    let root = tempfile::tempdir().unwrap();
    let current = model_dirs(root.path());
    let models = current.parent().unwrap().to_path_buf();
    let redis = RedisServer::start();
    let stack = stack_on(
        &current,
        &[
            "--model-watch-s",
            "0.2",
            "--precomputed-redis",
            &redis.url(),
            "--precomputed-check-s",
            "0.2",
        ],
    )
    .await;
    tokio::task::block_in_place(|| precompute(&stack, &models.join("a"), &redis));
    let a = answered_by(&stack.grpc, "a", Some("precomputed")).await;

    // Model b has no stored answers yet: its GNN answers, never a's set.
    swap_link(&current, "b");
    let b_gnn = answered_by_model(&stack.grpc, "b").await;
    assert!(
        b_gnn.predictions.iter().all(|p| p.answered_by == "gnn"),
        "model b served answers it did not compute: {b_gnn:?}"
    );
    for (pa, pb) in a.predictions.iter().zip(&b_gnn.predictions) {
        assert!(distance(&pa.logits, &pb.logits) >= APART, "{pa:?} {pb:?}");
    }
    // Once b's set is stored, b serves it: its own answers.
    tokio::task::block_in_place(|| precompute(&stack, &models.join("b"), &redis));
    let b_stored = answered_by(&stack.grpc, "b", Some("precomputed")).await;
    for (stored, computed) in b_stored.predictions.iter().zip(&b_gnn.predictions) {
        assert!(
            close(&stored.logits, &computed.logits, TOLERANCE),
            "node {}: stored {:?}, computed {:?}",
            stored.node_id,
            stored.logits,
            computed.logits
        );
    }
    tokio::task::block_in_place(|| assert!(stack.stop(), "the stack did not stop cleanly"));
}
