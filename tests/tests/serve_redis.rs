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
        Self::start_with(data, redis_url, &[])
    }

    fn start_with(data: &Path, redis_url: &str, extra: &[&str]) -> Self {
        let shm_name = unique_name("l2");
        let metrics = format!("127.0.0.1:{}", free_port());
        let child = Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(data)
            .args(["--shm-name", &shm_name, "--redis", redis_url])
            .args(["--metrics-addr", &metrics, "--warm-up", "0"])
            .args(extra)
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

#[test]
fn many_workers_at_once_get_every_row_right_through_every_tier() {
    // Features in Redis, a small L1 and an L2 cache: rows come from all
    // three tiers while four serving threads answer six clients (separate
    // registrations in the segment, as separate workers are) of four
    // threads each.
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    tests::stack::sidecar_import(&dataset("cora"), &data, &["--redis", &redis.url()]);
    let sidecar = Sidecar::start_with(
        &data,
        &redis.url(),
        &[
            "--serve-threads",
            "4",
            "--l1-mib",
            "2",
            "--deadline-ms",
            "10000",
        ],
    );
    let features = read_f32(&dataset("cora").join("features.f32"));
    let edges = std::fs::read(dataset("cora").join("edges.u32")).unwrap();
    let mut neighbours: std::collections::HashMap<u64, Vec<u64>> = Default::default();
    for e in edges.chunks_exact(8) {
        let s = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as u64;
        let d = u32::from_le_bytes([e[4], e[5], e[6], e[7]]) as u64;
        neighbours.entry(s).or_default().push(d);
    }
    const CLIENTS: u64 = 6;
    const THREADS: u64 = 4;
    const CALLS: u64 = 40;
    let clients: Vec<RingClient> = (0..CLIENTS)
        .map(|_| RingClient::attach(&sidecar.shm_name, ClientOptions::default()).unwrap())
        .collect();
    std::thread::scope(|scope| {
        for (c, client) in clients.iter().enumerate() {
            for t in 0..THREADS {
                let (features, neighbours) = (&features, &neighbours);
                scope.spawn(move || {
                    let mut seed = (c as u64 * 31 + t) * 2_654_435_761 + 7;
                    for _ in 0..CALLS {
                        let mut targets = Vec::new();
                        let n = 1 + (seed % 8);
                        for _ in 0..n {
                            seed = seed.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                            targets.push((seed >> 33) % 2708);
                        }
                        let response = client.call(&CallRequest::new(&targets)).unwrap();
                        let tables = response.tables().unwrap();
                        assert_eq!(tables.target_ids(), &targets[..]);
                        let ids = tables.node_ids();
                        for (row, &id) in ids.iter().enumerate() {
                            assert!(!tables.fallback(row), "row {row} ({id}) is a fallback");
                            assert_eq!(
                                &tables.features()[row * DIM..(row + 1) * DIM],
                                &features[id as usize * DIM..(id as usize + 1) * DIM],
                                "the features of node {id}"
                            );
                        }
                        let f1 = tables.fanouts()[0] as usize;
                        for (i, &target) in targets.iter().enumerate() {
                            assert_eq!(ids[tables.target_rows()[i] as usize], target);
                            for j in 0..tables.hop1_counts()[i] as usize {
                                let n1 = ids[tables.hop1_rows()[i * f1 + j] as usize];
                                assert!(neighbours[&target].contains(&n1));
                            }
                        }
                    }
                });
            }
        }
    });
    let calls = CLIENTS * THREADS * CALLS;
    assert_eq!(sidecar.metric("sidecar_requests_total"), calls);
    assert!(sidecar.metric("sidecar_feature_rows_total{tier=\"l3\"}") > 0);
    assert!(
        eventually(Duration::from_secs(10), || {
            sidecar.metric("sidecar_rows_in_flight") == 0
        }),
        "fetches left in flight"
    );
    // Every row asked was served by a tier or joined a fetch in flight.
    let served: u64 = ["l1", "l2", "l3"]
        .iter()
        .map(|t| sidecar.metric(&format!("sidecar_feature_rows_total{{tier=\"{t}\"}}")))
        .sum::<u64>()
        + sidecar.metric("sidecar_feature_coalesced_total");
    assert_eq!(served, sidecar.metric("sidecar_rows_fetched_total"));
    assert_eq!(
        sidecar.metric("sidecar_feature_fallbacks_total{cause=\"deadline\"}"),
        0
    );
    drop(clients);
    assert!(sidecar.daemon.stop(), "clean exit");
}
