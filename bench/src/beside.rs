//! A second worker on a stack's ring, for the binaries that set two
//! workers side by side on one sidecar (`hybrid`, `ladder`, `hub`), and
//! what they ask both: a dataset's test split, every node's prediction.

use std::process::{Child, Command};
use std::time::{Duration, Instant};

use anyhow::ensure;
use tests::stack::{free_port, http_request, onnxruntime_lib, workspace_bin, Stack};

/// A worker serving `stack`'s model from its ring at fanouts [20, 10] with
/// two executors and `extra` arguments, once it is ready.
#[derive(Debug)]
pub struct Beside {
    pub child: Child,
    /// `host:port` of its HTTP listener.
    pub http: String,
    /// `http://host:port` of its gRPC listener.
    pub grpc: String,
}

impl Beside {
    pub fn start(stack: &Stack, extra: &[String]) -> anyhow::Result<Self> {
        Self::start_model(stack, &stack.model, extra)
    }

    /// As [`Beside::start`], serving `model` instead of the stack's.
    pub fn start_model(
        stack: &Stack,
        model: &std::path::Path,
        extra: &[String],
    ) -> anyhow::Result<Self> {
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let child = Command::new(workspace_bin("gnn-worker"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--shm-name", &stack.shm_name, "--grpc", &grpc])
            .args(["--http", &http, "--fanouts", "20,10", "--executors", "2"])
            .arg("--onnxruntime-lib")
            .arg(onnxruntime_lib())
            .args(extra)
            .spawn()?;
        let mut worker = Self {
            child,
            http,
            grpc: format!("http://{grpc}"),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        while http_request(&worker.http, "GET", "/readyz", None).map_or(true, |r| r.0 != 200) {
            if Instant::now() >= deadline {
                worker.stop();
                ensure!(false, "the worker beside the stack did not become ready");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        Ok(worker)
    }

    pub fn stop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Beside {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Node ids of the test split of the dataset in `dir`, and every node's
/// label.
pub fn test_split(dir: &std::path::Path) -> anyhow::Result<(Vec<u64>, Vec<i32>)> {
    let split = std::fs::read(dir.join("split.u8"))?;
    let labels = std::fs::read(dir.join("labels.i32"))?
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes(c.try_into().expect("4 bytes")))
        .collect();
    let test = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect();
    Ok((test, labels))
}

/// The predictions of `ids` from a worker, 16 nodes a gRPC call.
pub async fn predict_all(
    client: &gnn_worker::api::grpc::PredictorClient<tonic::transport::Channel>,
    ids: &[u64],
) -> anyhow::Result<Vec<gnn_worker::api::grpc::pb::Prediction>> {
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(16) {
        let mut client = client.clone();
        let response = client
            .predict(gnn_worker::api::grpc::pb::PredictRequest {
                node_ids: chunk.to_vec(),
                request_id: 0,
                new_node: None,
            })
            .await
            .map_err(|s| anyhow::anyhow!("{}: {}", s.code(), s.message()))?;
        out.extend(response.into_inner().predictions);
    }
    Ok(out)
}
