//! `sidecar serve` with its features in Redis, as real processes: rows come
//! from Redis first, are written back to the L2 RocksDB cache, a restarted
//! sidecar serves them warm from L2, a corrupt L2 cache is rebuilt at start
//! with an error log and a metric (never a crash), and `/metrics` reports
//! the tiers.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use protocol::client::{CallRequest, ClientOptions, RingClient};
use protocol::payload::schema::tier;
use tests::redis::RedisServer;
use tests::stack::{dataset, free_port, http_request, read_f32, workspace_bin, Daemon};
use tests::{eventually, segment_exists, unique_name};

const DIM: usize = 1433;

struct Sidecar {
    daemon: Daemon,
    shm_name: String,
    metrics: String,
}

impl Sidecar {
    fn start(data: &Path, redis_url: &str) -> Self {
        let shm_name = unique_name("l2");
        let metrics = format!("127.0.0.1:{}", free_port());
        let child = Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(["--shm-name", &shm_name, "--redis", redis_url])
            .args(["--metrics-addr", &metrics, "--warm-up", "0"])
            .spawn()
            .expect("starting sidecar serve");
        let mut daemon = Daemon {
            child,
            name: "sidecar",
        };
        assert!(
            eventually(Duration::from_secs(60), || {
                assert!(
                    matches!(daemon.child.try_wait(), Ok(None)),
                    "sidecar serve exited at start"
                );
                segment_exists(&shm_name)
                    && http_request(&metrics, "GET", "/readyz", None)
                        .is_ok_and(|(code, _)| code == 200)
            }),
            "sidecar became ready"
        );
        Self {
            daemon,
            shm_name,
            metrics,
        }
    }

    /// The value of one metric line (`name` with its labels).
    fn metric(&self, name: &str) -> u64 {
        tests::stack::metric_value(&self.metrics, name) as u64
    }
}

/// Asks for `targets` and checks every row against the dataset; returns
/// the tier of each row.
fn call_and_check(sidecar: &Sidecar, targets: &[u64], features: &[f32]) -> Vec<u8> {
    let client = RingClient::attach(&sidecar.shm_name, ClientOptions::default()).unwrap();
    let response = client.call(&CallRequest::new(targets)).unwrap();
    let tables = response.tables().unwrap();
    for (row, &id) in tables.node_ids().iter().enumerate() {
        assert_eq!(
            &tables.features()[row * DIM..(row + 1) * DIM],
            &features[id as usize * DIM..(id as usize + 1) * DIM],
            "row of node {id}"
        );
        assert!(!tables.fallback(row), "node {id} is no fallback");
    }
    tables.tiers().to_vec()
}

#[test]
fn the_l2_cache_fills_from_redis_serves_a_restart_warm_and_is_rebuilt_when_corrupt() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let imported = Command::new(workspace_bin("sidecar"))
        .arg("import")
        .arg(dataset("cora"))
        .arg("--data-dir")
        .arg(&data)
        .args(["--redis", &redis.url()])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(imported.success());
    let features = read_f32(&dataset("cora").join("features.f32"));
    let targets = [5u64, 600, 1200, 2400];

    // 1. Cold: every row from Redis, then written back to L2.
    let sidecar = Sidecar::start(&data, &redis.url());
    let tiers = call_and_check(&sidecar, &targets, &features);
    let rows = tiers.len() as u64;
    assert!(tiers.iter().all(|&t| t == tier::L3), "{tiers:?}");
    assert_eq!(
        sidecar.metric("sidecar_feature_rows_total{tier=\"l3\"}"),
        rows
    );
    assert_eq!(sidecar.metric("sidecar_redis_round_trips_total"), 1);
    assert!(
        eventually(Duration::from_secs(10), || sidecar
            .metric("sidecar_l2_writes_total")
            == rows),
        "the rows reached the L2 cache"
    );
    assert_eq!(sidecar.metric("sidecar_l2_rebuilds_total"), 0);
    assert!(sidecar.daemon.stop(), "clean exit");

    // 2. Restarted: the same rows come from L2; Redis is not asked.
    let sidecar = Sidecar::start(&data, &redis.url());
    let tiers = call_and_check(&sidecar, &targets, &features);
    assert!(tiers.iter().all(|&t| t == tier::L2), "{tiers:?}");
    assert_eq!(
        sidecar.metric("sidecar_feature_rows_total{tier=\"l2\"}"),
        rows
    );
    assert_eq!(sidecar.metric("sidecar_redis_round_trips_total"), 0);
    assert!(sidecar.daemon.stop(), "clean exit");

    // 3. A corrupt L2 cache: wiped and rebuilt at start, counted, and the
    //    rows come from Redis again.
    std::fs::write(data.join("l2-cache").join("CURRENT"), b"garbage\n").unwrap();
    let sidecar = Sidecar::start(&data, &redis.url());
    assert_eq!(sidecar.metric("sidecar_l2_rebuilds_total"), 1);
    let tiers = call_and_check(&sidecar, &targets, &features);
    assert!(tiers.iter().all(|&t| t == tier::L3), "{tiers:?}");
    assert_eq!(
        sidecar.metric("sidecar_feature_fallbacks_total{cause=\"missing\"}"),
        0
    );
    assert!(sidecar.daemon.stop(), "clean exit");
}
