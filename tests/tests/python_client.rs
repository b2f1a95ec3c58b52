//! The Python client package (clients/python): installed from the
//! repository into a fresh directory, its checked-in stubs equal to what
//! grpcio-tools generates from the worker's .proto, and its checks
//! (clients/python/tests/check_worker.py) passing against a running worker.

use std::path::Path;
use std::process::Command;

use tests::stack::{python, repo_root, run_ok, Stack, StackOptions};

#[test]
fn the_python_client_installs_and_passes_its_checks_against_a_worker() {
    let root = repo_root();
    let dir = tempfile::tempdir().unwrap();
    let site = dir.path().join("site");
    // Installed as a user would, from the repository's package directory
    // (copied, so that the build's leftovers stay out of the tree), with
    // the project venv's grpcio and protobuf (no download).
    let package = dir.path().join("package");
    tests::stack::copy_dir(&root.join("clients/python"), &package);
    run_ok(
        Command::new(python())
            .args([
                "-m",
                "pip",
                "install",
                "--quiet",
                "--no-deps",
                "--no-build-isolation",
            ])
            .arg("--target")
            .arg(&site)
            .arg(&package),
        "pip install clients/python",
    );
    assert!(site.join("gnn_client/client.py").is_file());

    // The checked-in stubs are what the .proto generates today.
    let generated = dir.path().join("generated");
    std::fs::create_dir_all(&generated).unwrap();
    run_ok(
        Command::new(python())
            .current_dir(&root)
            .args(["-m", "grpc_tools.protoc", "-Ignn_client=gnn-worker/proto"])
            .arg(format!("--python_out={}", generated.display()))
            .arg(format!("--grpc_python_out={}", generated.display()))
            .arg("gnn-worker/proto/predictor.proto"),
        "grpc_tools.protoc",
    );
    for stub in ["predictor_pb2.py", "predictor_pb2_grpc.py"] {
        let read = |p: &Path| std::fs::read(p).unwrap();
        assert!(
            read(&generated.join("gnn_client").join(stub))
                == read(&root.join("clients/python/src/gnn_client").join(stub)),
            "clients/python/src/gnn_client/{stub} is out of date: regenerate it \
             (clients/python/README.md)"
        );
    }

    let max_request_targets = 32;
    let mut options = StackOptions::new("cora");
    options.worker_args = vec![
        "--max-request-targets".into(),
        max_request_targets.to_string(),
    ];
    let stack = Stack::start(&options).expect("stack");
    let ids: Vec<u64> = (0..10).collect();
    let (code, body) = tests::stack::http_request(
        &stack.http,
        "POST",
        "/v1/predict",
        Some(&serde_json::json!({ "node_ids": ids }).to_string()),
    )
    .unwrap();
    assert_eq!(code, 200, "{body}");
    let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
    let expected = dir.path().join("expected.json");
    std::fs::write(&expected, answer["predictions"].to_string()).unwrap();
    let grpc = stack.grpc.trim_start_matches("http://").to_string();
    let (said, _) = run_ok(
        Command::new(python())
            .env("PYTHONPATH", &site)
            .arg(root.join("clients/python/tests/check_worker.py"))
            .args(["--grpc", &grpc, "--http", &stack.http, "--expected"])
            .arg(&expected)
            .args(["--max-request-targets", &max_request_targets.to_string()])
            .args(["--feature-dim", "1433"]),
        "check_worker.py",
    );
    assert!(said.contains("gnn_client checks passed"), "{said}");
    assert!(stack.stop());
}
