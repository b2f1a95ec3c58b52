//! The whole stack with its features in a Redis of its own, for the
//! long-running binaries (`soak`, `update-lag`), and their one-node callers.

use std::sync::Arc;

use anyhow::Context;
use rand::{Rng, SeedableRng};
use tests::redis::RedisServer;
use tests::stack::{dataset, free_port, sidecar_import, Stack, StackOptions};

use crate::http::HttpClient;
use crate::load::Caller;
use crate::systems::ProductHttp;

/// A Redis, `dataset`'s features imported into it, and the stack serving
/// them, its sidecar's metrics endpoint at `metrics`. Dropped in reverse
/// order: the stack first, then the directory and Redis.
#[derive(Debug)]
pub struct RedisStack {
    pub stack: Stack,
    /// `host:port` of the sidecar's /metrics.
    pub metrics: String,
    pub redis: RedisServer,
    _work: tempfile::TempDir,
}

impl RedisStack {
    /// Starts it all; `sidecar_args` come after `--redis <url>
    /// --metrics-addr <addr>`.
    pub fn start(dataset_name: &str, sidecar_args: &[&str]) -> anyhow::Result<Self> {
        let redis = RedisServer::start();
        let work = tempfile::tempdir()?;
        let data = work.path().join("data");
        sidecar_import(&dataset(dataset_name), &data, &["--redis", &redis.url()]);
        let metrics = format!("127.0.0.1:{}", free_port());
        let mut options = StackOptions::new(dataset_name);
        options.imported = Some(data);
        options.sidecar_args = ["--redis", &redis.url(), "--metrics-addr", &metrics]
            .iter()
            .chain(sidecar_args)
            .map(|s| s.to_string())
            .collect();
        let stack = Stack::start(&options).context("starting the stack")?;
        Ok(Self {
            stack,
            metrics,
            redis,
            _work: work,
        })
    }

    /// One-target HTTP calls over nodes `0..n_nodes`, in a fixed random
    /// order.
    pub fn one_node_caller(&self, n_nodes: u64) -> Arc<dyn Caller> {
        let mut rng = rand::rngs::SmallRng::seed_from_u64(13);
        let requests: Vec<Vec<u64>> = (0..100_000)
            .map(|_| vec![rng.random_range(0..n_nodes)])
            .collect();
        Arc::new(ProductHttp {
            http: HttpClient::new(&self.stack.http),
            requests: Arc::new(requests),
        })
    }
}
