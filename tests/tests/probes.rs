//! The worker's readiness tells the truth, in every state it can be in:
//! before a sidecar exists, attached, while the sidecar drains, after it was
//! killed, attached again to its replacement, attached to a sidecar serving
//! another graph version, and with every executor retired after a panic
//! (the `gnn-worker-executor` failpoint). gRPC calls made while it is not
//! ready are UNAVAILABLE, and `grpc.health.v1` (Check and Watch) agrees
//! with `/readyz` in each state, with the same reason. Also: every metric both daemons export is
//! documented in docs/metrics.md, and every documented one is exported.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::stack::{
    dataset, free_port, freeze_process, http_request, http_status_within as status_within,
    metric_value, onnxruntime_lib, repo_root, sidecar_import, thaw_process, trained_model,
    workspace_bin, Stack, StackOptions,
};
use tests::{eventually, unique_name};
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::HealthCheckRequest;

/// A child killed (SIGKILL) on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn import(data: &Path, graph_version: u64) {
    let version = graph_version.to_string();
    sidecar_import(&dataset("cora"), data, &["--graph-version", &version]);
}

fn sidecar(data: &Path, shm: &str, socket: &Path) -> Proc {
    Proc(
        Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(["--shm-name", shm, "--slots", "8", "--warm-up", "100"])
            .arg("--admin-socket")
            .arg(socket)
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    )
}

struct Worker {
    _proc: Proc,
    http: String,
    grpc: String,
}

fn worker(shm: &str, extra_env: &[(&str, &str)]) -> Worker {
    let (grpc, http) = (free_port(), free_port());
    let mut cmd = Command::new(workspace_bin("gnn-worker"));
    cmd.arg("serve")
        .arg("--model")
        .arg(trained_model("cora"))
        .args(["--shm-name", shm, "--executors", "2"])
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .arg("--onnxruntime-lib")
        .arg(onnxruntime_lib())
        .stderr(Stdio::null());
    for (k, v) in extra_env {
        cmd.env(k, v);
    }
    let mut worker = Worker {
        _proc: Proc(cmd.spawn().unwrap()),
        http: format!("127.0.0.1:{http}"),
        grpc: format!("http://127.0.0.1:{grpc}"),
    };
    let up = eventually(Duration::from_secs(30), || {
        http_request(&worker.http, "GET", "/healthz", None).is_ok_and(|(c, _)| c == 200)
    });
    if !up {
        let exited = worker._proc.0.try_wait();
        panic!("the worker's HTTP endpoint did not come up (the process: {exited:?})");
    }
    worker
}

impl Worker {
    fn pid(&self) -> u32 {
        self._proc.0.id()
    }

    fn readyz(&self) -> (u16, String) {
        http_request(&self.http, "GET", "/readyz", None).unwrap()
    }

    fn wait_ready(&self, ready: bool, within: Duration) -> String {
        let want = if ready { 200 } else { 503 };
        let mut last = String::new();
        let reached = eventually(within, || {
            let (code, body) = self.readyz();
            last = body;
            code == want
        });
        assert!(reached, "readyz did not become {want}: {last}");
        last
    }

    fn predict(&self, ids: &[u64]) -> Result<Vec<pb::Prediction>, tonic::Status> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let mut client = PredictorClient::connect(self.grpc.clone())
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            client
                .predict(pb::PredictRequest {
                    node_ids: ids.to_vec(),
                    request_id: 1,
                    new_node: None,
                })
                .await
                .map(|r| r.into_inner().predictions)
        })
    }

    fn metric(&self, name: &str) -> f64 {
        metric_value(&self.http, name)
    }

    fn runtime() -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap()
    }

    /// `grpc.health.v1` Check of `service`: the status and the
    /// `x-not-ready-reason` metadata.
    fn health(&self, service: &str) -> Result<(ServingStatus, String), tonic::Status> {
        Self::runtime().block_on(async {
            let channel = channel(&self.grpc)
                .await
                .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
            let mut client = HealthClient::new(channel);
            let response = client
                .check(HealthCheckRequest {
                    service: service.into(),
                })
                .await?;
            let reason = response
                .metadata()
                .get("x-not-ready-reason")
                .map(|v| v.to_str().unwrap().to_string())
                .unwrap_or_default();
            let status = ServingStatus::try_from(response.into_inner().status).unwrap();
            Ok((status, reason))
        })
    }

    /// Both readiness names say `want`, as `/readyz` does at that moment.
    fn assert_health(&self, want: ServingStatus) -> String {
        let (code, body) = self.readyz();
        assert_eq!(code == 200, want == ServingStatus::Serving, "{body}");
        let (status, reason) = self.health("").unwrap();
        assert_eq!(status, want, "{reason}");
        for name in ["gnn.v1.Predictor", "inference.GRPCInferenceService"] {
            assert_eq!(self.health(name).unwrap().0, want, "the service's own name");
        }
        if want == ServingStatus::NotServing {
            assert_eq!(format!("not ready: {reason}\n"), body, "the same reason");
        }
        reason
    }

    /// The services gRPC server reflection lists.
    fn reflected_services(&self) -> Vec<String> {
        use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
        use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
        use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
        use tonic_reflection::pb::v1::ServerReflectionRequest;
        Self::runtime().block_on(async {
            let mut client = ServerReflectionClient::new(channel(&self.grpc).await.unwrap());
            let request = ServerReflectionRequest {
                host: String::new(),
                message_request: Some(MessageRequest::ListServices(String::new())),
            };
            let mut answers = client
                .server_reflection_info(tokio_stream::iter([request]))
                .await
                .unwrap()
                .into_inner();
            match answers.message().await.unwrap().unwrap().message_response {
                Some(MessageResponse::ListServicesResponse(list)) => {
                    list.service.into_iter().map(|s| s.name).collect()
                }
                other => panic!("not a list of services: {other:?}"),
            }
        })
    }
}

async fn channel(addr: &str) -> Result<tonic::transport::Channel, tonic::transport::Error> {
    tonic::transport::Endpoint::from_shared(addr.to_string())?
        .connect()
        .await
}

fn unavailable(result: Result<Vec<pb::Prediction>, tonic::Status>) -> String {
    match result {
        Err(status) => {
            assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
            status.message().to_string()
        }
        Ok(p) => panic!("the call succeeded while not ready: {p:?}"),
    }
}

fn sidecarctl(socket: &Path, args: &[&str]) -> String {
    let out = Command::new(workspace_bin("sidecarctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[test]
fn the_workers_readiness_follows_the_sidecar() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    import(&data, 1);
    let shm = unique_name("probes");
    let socket = dir.path().join("admin.sock");

    // No sidecar yet: up, not ready, calls UNAVAILABLE.
    let worker = worker(&shm, &[]);
    let why = worker.wait_ready(false, Duration::from_secs(30));
    assert!(why.contains("waiting for the sidecar"), "{why}");
    let said = unavailable(worker.predict(&[1]));
    assert!(said.contains("waiting for the sidecar"), "{said}");
    assert_eq!(worker.metric("gnn_worker_ready"), 0.0);
    // grpc.health.v1 tells the same: NOT_SERVING, with the same reason;
    // the liveness name is SERVING; an unknown name is NOT_FOUND.
    let reason = worker.assert_health(ServingStatus::NotServing);
    assert!(reason.contains("waiting for the sidecar"), "{reason}");
    assert_eq!(worker.health("liveness").unwrap().0, ServingStatus::Serving);
    let unknown = worker.health("gnn.v1.Nothing").unwrap_err();
    assert_eq!(unknown.code(), tonic::Code::NotFound, "{unknown}");
    // Reflection lists the API and the health service (for grpcurl).
    let services = worker.reflected_services();
    for name in [
        "gnn.v1.Predictor",
        "inference.GRPCInferenceService",
        "grpc.health.v1.Health",
    ] {
        assert!(services.iter().any(|s| s == name), "{services:?}");
    }

    // The sidecar comes: ready, serving, naming the model it serves (its
    // model.onnx's sha256 as sha256sum computes it).
    let mut sidecar_proc = sidecar(&data, &shm, &socket);
    let ready = worker.wait_ready(true, Duration::from_secs(60));
    let model = std::fs::canonicalize(trained_model("cora")).unwrap();
    let sum = Command::new("sha256sum")
        .arg(model.join("model.onnx"))
        .output()
        .unwrap();
    let sha256 = String::from_utf8(sum.stdout).unwrap()[..64].to_string();
    let name = model.file_name().unwrap().to_string_lossy().into_owned();
    assert_eq!(ready, format!("ready: model {name} sha256 {sha256}\n"));
    assert_eq!(
        worker.metric(&format!(
            "gnn_worker_model_info{{model=\"{name}\",sha256=\"{sha256}\"}}"
        )),
        1.0
    );
    assert_eq!(worker.predict(&[1, 2]).unwrap().len(), 2);
    assert_eq!(worker.metric("gnn_worker_ready"), 1.0);
    worker.assert_health(ServingStatus::Serving);

    // The sidecar drains: not ready, calls UNAVAILABLE naming the drain; a
    // health Watch opened while serving sees the change.
    let runtime = Worker::runtime();
    let mut watch = runtime.block_on(async {
        let mut client = HealthClient::new(channel(&worker.grpc).await.unwrap());
        let request = HealthCheckRequest {
            service: String::new(),
        };
        client.watch(request).await.unwrap().into_inner()
    });
    let mut next_status = || {
        let message = runtime.block_on(async {
            tokio::time::timeout(Duration::from_secs(10), watch.message()).await
        });
        ServingStatus::try_from(message.unwrap().unwrap().unwrap().status).unwrap()
    };
    assert_eq!(next_status(), ServingStatus::Serving);
    sidecarctl(&socket, &["drain"]);
    let why = worker.wait_ready(false, Duration::from_secs(5));
    assert!(why.contains("draining"), "{why}");
    assert!(unavailable(worker.predict(&[1])).contains("draining"));
    assert_eq!(next_status(), ServingStatus::NotServing);
    let reason = worker.assert_health(ServingStatus::NotServing);
    assert!(reason.contains("draining"), "{reason}");

    // Killed: the worker notices within its sidecar timeout.
    let _ = sidecar_proc.0.kill();
    let _ = sidecar_proc.0.wait();
    let _ = std::fs::remove_file(&socket);
    let why = worker.wait_ready(false, Duration::from_secs(3));
    assert!(why.contains("gone") || why.contains("draining"), "{why}");

    // Liveness: the worker answers /healthz however its sidecar is, and
    // stops answering (the probe fails) when the process hangs.
    freeze_process(worker.pid());
    let hung = status_within(&worker.http, "/healthz", Duration::from_secs(1));
    thaw_process(worker.pid());
    assert_eq!(hung, None, "/healthz answered from a stopped worker");
    assert_eq!(
        status_within(&worker.http, "/healthz", Duration::from_secs(5)),
        Some(200)
    );

    // Its replacement: ready again without a worker restart.
    sidecar_proc = sidecar(&data, &shm, &socket);
    worker.wait_ready(true, Duration::from_secs(60));
    assert_eq!(worker.predict(&[3]).unwrap().len(), 1);

    // A sidecar serving another graph version: attached, but not ready.
    drop(sidecar_proc);
    let _ = std::fs::remove_file(&socket);
    let other = dir.path().join("data-v2");
    import(&other, 2);
    let _v2 = sidecar(&other, &shm, &socket);
    let mut last = String::new();
    assert!(
        eventually(Duration::from_secs(60), || {
            last = worker.readyz().1;
            last.contains("another feature schema or graph version")
        }),
        "{last}"
    );
    assert!(unavailable(worker.predict(&[1])).contains("graph version"));
}

#[test]
fn a_worker_whose_executors_all_panicked_is_not_ready() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    import(&data, 1);
    let shm = unique_name("panics");
    let socket = dir.path().join("admin.sock");
    let _sidecar = sidecar(&data, &shm, &socket);
    let worker = worker(&shm, &[("FAILPOINTS", "gnn-worker-executor=panic")]);
    worker.wait_ready(true, Duration::from_secs(60));
    // Each call's batch panics its executor: the call gets INTERNAL, the
    // executor retires.
    for _ in 0..2 {
        let status = worker.predict(&[1]).unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal, "{status}");
    }
    let why = worker.wait_ready(false, Duration::from_secs(5));
    assert!(why.contains("no executor is alive"), "{why}");
    assert!(unavailable(worker.predict(&[1])).contains("no executor"));
    assert_eq!(worker.metric("gnn_worker_executor_panics_total"), 2.0);
    assert_eq!(worker.metric("gnn_worker_executors_alive"), 0.0);
    assert_eq!(
        worker.metric("gnn_worker_call_errors_total{kind=\"internal\"}"),
        2.0
    );
}

/// The metric names docs/metrics.md lists (the first column of its
/// tables; a cell may list several, comma-separated).
fn documented() -> BTreeSet<String> {
    let text = std::fs::read_to_string(repo_root().join("docs/metrics.md")).unwrap();
    let mut names = BTreeSet::new();
    for line in text.lines() {
        let Some(cell) = line.strip_prefix("| ").and_then(|l| l.split(" |").next()) else {
            continue;
        };
        for part in cell.split(", ") {
            let part = part.trim();
            if let Some(name) = part
                .strip_prefix('`')
                .and_then(|p| p.split(['`', '{']).next())
            {
                if name.starts_with("sidecar_") || name.starts_with("gnn_worker_") {
                    names.insert(name.to_string());
                }
            }
        }
    }
    names
}

fn exported(addr: &str) -> BTreeSet<String> {
    let (code, body) = http_request(addr, "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    tests::openmetrics::families(&body)
        .iter()
        .map(|f| f.sample_name())
        .collect()
}

#[test]
fn every_exported_metric_is_documented_and_every_documented_one_exported() {
    let metrics_addr = format!("127.0.0.1:{}", free_port());
    // Following an update stream: its metrics are exported only then.
    let redis = tests::redis::RedisServer::start();
    let mut options = StackOptions::new("cora");
    options.sidecar_args = vec![
        "--metrics-addr".into(),
        metrics_addr.clone(),
        "--updates-redis".into(),
        redis.url(),
        "--updates-stream".into(),
        "gnn:updates".into(),
    ];
    let stack = Stack::start(&options).expect("stack");
    let (code, _) = http_request(
        &stack.http,
        "POST",
        "/v1/predict",
        Some("{\"node_ids\": [1, 2, 3]}"),
    )
    .unwrap();
    assert_eq!(code, 200);
    let mut exported_names = exported(&metrics_addr);
    exported_names.extend(exported(&stack.http));
    let documented = documented();
    let undocumented: Vec<_> = exported_names.difference(&documented).collect();
    let missing: Vec<_> = documented.difference(&exported_names).collect();
    assert!(
        undocumented.is_empty(),
        "exported but not in docs/metrics.md: {undocumented:?}"
    );
    assert!(
        missing.is_empty(),
        "in docs/metrics.md but not exported: {missing:?}"
    );
    assert!(exported_names.contains("sidecar_neighbor_fetch_count"));
    assert!(exported_names.contains("gnn_worker_onnx_run_seconds"));
    assert!(stack.stop());
}
