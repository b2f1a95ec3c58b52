//! The feature tiers against real components: RocksDB directories, a real
//! redis-server (single, with a password, frozen, stopped), a real local
//! 3-node Redis Cluster, and the cora dataset's features.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use protocol::payload::schema::tier;
use sidecar::features::contract::{encode_row, DEFAULT_PREFIX};
use sidecar::features::import::{import_to_redis, import_to_rocksdb, FeatureManifest};
use sidecar::features::invalidation::{self, InvalidationStats};
use sidecar::features::redis_tier::{RedisConfig, RedisTier};
use sidecar::features::rocks::{Opened, RocksStore, Role};
use sidecar::features::{DefaultRow, FeatureTiers, RowSource, TierConfig};
use tests::redis::{RedisCluster, RedisServer};

const DIM: usize = 1433;

fn cora_dir() -> PathBuf {
    tests::stack::dataset("cora")
}

/// Row `node` of cora's features.f32.
fn cora_row(node: u64) -> Vec<f32> {
    use std::io::{Read, Seek, SeekFrom};
    let mut file = std::fs::File::open(cora_dir().join("features.f32")).unwrap();
    file.seek(SeekFrom::Start(node * DIM as u64 * 4)).unwrap();
    let mut bytes = vec![0u8; DIM * 4];
    file.read_exact(&mut bytes).unwrap();
    bytes
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

async fn fetch(
    tiers: &FeatureTiers,
    ids: &[u64],
    deadline: Duration,
) -> (Vec<f32>, Vec<RowSource>) {
    let mut features = vec![f32::NAN; ids.len() * tiers.feature_dim()];
    let mut sources = vec![
        RowSource {
            tier: 99,
            fallback: false,
            late: false
        };
        ids.len()
    ];
    tiers
        .fetch_into(
            ids,
            Some(Instant::now() + deadline),
            &mut features,
            &mut sources,
        )
        .await;
    (features, sources)
}

/// Waits until every flight has closed, i.e. the rows fetched so far are
/// in L1 (filled just after a flight lands, off the request's path).
async fn settled(tiers: &FeatureTiers) {
    let started = Instant::now();
    while tiers.rows_in_flight() > 0 {
        assert!(started.elapsed() < Duration::from_secs(5), "flights closed");
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

fn redis_config(server: &RedisServer) -> RedisConfig {
    RedisConfig::single(server.url())
}

async fn cora_in_redis(server: &RedisServer, data_dir: &Path) -> RedisTier {
    let config = redis_config(server);
    import_to_redis(
        &cora_dir().join("features.f32"),
        2708,
        DIM as u32,
        data_dir,
        &config,
    )
    .await
    .unwrap();
    RedisTier::connect(&config).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_embedded_store_serves_cora_with_tiers_and_fallbacks() {
    let data = tempfile::tempdir().unwrap();
    let done = import_to_rocksdb(
        &cora_dir().join("features.f32"),
        2708,
        DIM as u32,
        data.path(),
    )
    .unwrap();
    assert_eq!(done.rows, 2708);
    let manifest = FeatureManifest::read(data.path()).unwrap();
    assert_eq!(manifest.store, "rocksdb");
    let mean = manifest.read_mean(data.path()).unwrap();
    let (store, opened) = RocksStore::open(
        &data.path().join(FeatureManifest::STORE_DIR),
        Role::StoreOfRecord,
    )
    .unwrap();
    assert_eq!(opened, Opened::Existing);
    let mut config = TierConfig::new(DIM);
    config.default_row = DefaultRow::Mean(mean.clone().into());
    let tiers = FeatureTiers::new(&config, Some(Arc::new(store)), None);

    let ids = [0u64, 1358, 2707, 50_000];
    let (features, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    for (pos, &id) in ids[..3].iter().enumerate() {
        assert_eq!(
            &features[pos * DIM..(pos + 1) * DIM],
            &cora_row(id)[..],
            "node {id}"
        );
        assert_eq!(
            sources[pos],
            RowSource {
                tier: tier::L2,
                fallback: false,
                late: false
            }
        );
    }
    assert_eq!(
        &features[3 * DIM..],
        &mean[..],
        "unknown node gets the mean row"
    );
    assert_eq!(
        sources[3],
        RowSource {
            tier: tier::DEFAULT,
            fallback: true,
            late: false
        }
    );
    assert_eq!(
        tiers
            .stats()
            .fallback_missing
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );

    // The second time, from L1.
    settled(&tiers).await;
    let (again, sources) = fetch(&tiers, &ids[..3], Duration::from_secs(2)).await;
    assert_eq!(again, features[..3 * DIM]);
    assert!(sources.iter().all(|s| s.tier == tier::L1));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cold_rows_come_from_redis_in_one_round_trip_then_warm() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let (l2, _) = RocksStore::open(
        &data.path().join("l2"),
        Role::Cache {
            max_bytes: 64 << 20,
            ttl: Duration::from_secs(600),
        },
    )
    .unwrap();
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), Some(Arc::new(l2)), Some(l3));
    let ids: Vec<u64> = (0..221).map(|i| i * 12).collect();
    let (features, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    assert!(sources.iter().all(|s| *s
        == RowSource {
            tier: tier::L3,
            fallback: false,
            late: false
        }));
    assert_eq!(
        tiers
            .stats()
            .l3_round_trips
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    for (pos, &id) in ids.iter().enumerate().step_by(20) {
        assert_eq!(&features[pos * DIM..(pos + 1) * DIM], &cora_row(id)[..]);
    }
    // Asked again at once: served by the landed flight or by L1, never by
    // a second round trip.
    let (again, _) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    assert_eq!(again, features);
    assert_eq!(
        tiers
            .stats()
            .l3_round_trips
            .load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    settled(&tiers).await;
    let (_, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    assert!(sources.iter().all(|s| s.tier == tier::L1), "warm: L1");
}

/// A fetch whose ids repeat (a temporal sample has a row per tree): each
/// missed row is fetched once, in one round trip, and every position gets
/// it (a repeated miss used to find its own flight not yet open and
/// panic the serving thread).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repeated_ids_in_one_fetch_are_fetched_once_and_copied() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), None, Some(l3));
    let ids = [7u64, 9, 7, 11, 9, 7];
    let (features, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    for (pos, &id) in ids.iter().enumerate() {
        assert_eq!(
            &features[pos * DIM..(pos + 1) * DIM],
            &cora_row(id)[..],
            "{pos}"
        );
        assert_eq!(sources[pos].tier, tier::L3, "{pos}");
        assert!(!sources[pos].fallback);
    }
    let round_trips = &tiers.stats().l3_round_trips;
    assert_eq!(round_trips.load(std::sync::atomic::Ordering::Relaxed), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_sidecar_serves_warm_from_l2_without_redis() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l2_path = data.path().join("l2");
    let cache = Role::Cache {
        max_bytes: 64 << 20,
        ttl: Duration::from_secs(600),
    };
    let ids: Vec<u64> = (100..150).collect();
    {
        let l3 = cora_in_redis(&redis, data.path()).await;
        let (l2, _) = RocksStore::open(&l2_path, cache).unwrap();
        let l2 = Arc::new(l2);
        let tiers = FeatureTiers::new(&TierConfig::new(DIM), Some(l2.clone()), Some(l3));
        fetch(&tiers, &ids, Duration::from_secs(2)).await;
        // The write-back to L2 is asynchronous: wait for it.
        let started = Instant::now();
        while l2.get_many(&ids, DIM * 4).iter().any(Option::is_none) {
            assert!(
                started.elapsed() < Duration::from_secs(5),
                "rows reached L2"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        drop(tiers);
        l2.flush().unwrap();
    }
    drop(redis); // Redis is gone; the restarted sidecar has only its L2.
    let (l2, opened) = RocksStore::open(&l2_path, cache).unwrap();
    assert_eq!(opened, Opened::Existing);
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), Some(Arc::new(l2)), None);
    let (features, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    assert!(sources.iter().all(|s| s.tier == tier::L2));
    assert_eq!(&features[..DIM], &cora_row(100)[..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_or_dead_redis_yields_flagged_default_rows_never_an_error() {
    let mut redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), None, Some(l3));
    let stats = tiers.stats();

    redis.freeze();
    let (features, sources) = fetch(&tiers, &[1, 2, 3], Duration::from_millis(20)).await;
    assert!(sources.iter().all(|s| *s
        == RowSource {
            tier: tier::DEFAULT,
            fallback: true,
            late: true
        }));
    assert!(features.iter().all(|&v| v == 0.0), "zeros by default");
    assert_eq!(
        stats
            .fallback_deadline
            .load(std::sync::atomic::Ordering::Relaxed),
        3
    );
    redis.thaw();

    // Once thawed, the detached fetch lands and warms L1 for the next request.
    let started = Instant::now();
    loop {
        let (_, sources) = fetch(&tiers, &[1, 2, 3], Duration::from_millis(200)).await;
        if sources.iter().all(|s| !s.fallback) {
            break;
        }
        assert!(started.elapsed() < Duration::from_secs(5));
    }

    redis.stop();
    let (_, sources) = fetch(&tiers, &[10, 11], Duration::from_millis(500)).await;
    assert!(sources.iter().all(|s| s.fallback));
    let failed = stats
        .fallback_unavailable
        .load(std::sync::atomic::Ordering::Relaxed)
        + stats
            .fallback_deadline
            .load(std::sync::atomic::Ordering::Relaxed);
    assert!(failed >= 5, "counted by cause");

    // Redis comes back on the same port (empty): the connection manager
    // reconnects; rows written again are served.
    redis.restart();
    let config = redis_config(&redis);
    let l3 = RedisTier::connect(&config).await.unwrap();
    l3.set_many(&[(10, encode_row(&cora_row(10)))])
        .await
        .unwrap();
    let started = Instant::now();
    loop {
        let (features, sources) = fetch(&tiers, &[10], Duration::from_millis(500)).await;
        if !sources[0].fallback {
            assert_eq!(features, cora_row(10));
            break;
        }
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "reconnected with backoff"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn missing_and_malformed_keys_fall_back_and_are_counted() {
    let redis = RedisServer::start();
    redis.command(&format!("SET {DEFAULT_PREFIX}5 short"));
    let l3 = RedisTier::connect(&redis_config(&redis)).await.unwrap();
    let mut config = TierConfig::new(4);
    config.default_row = DefaultRow::Mean(vec![0.5; 4].into());
    let tiers = FeatureTiers::new(&config, None, Some(l3.clone()));
    l3.set_many(&[(6, encode_row(&[1.0, 2.0, 3.0, 4.0]))])
        .await
        .unwrap();
    let (features, sources) = fetch(&tiers, &[5, 6, 7], Duration::from_secs(2)).await;
    assert_eq!(&features[..4], &[0.5; 4], "malformed -> default");
    assert_eq!(&features[4..8], &[1.0, 2.0, 3.0, 4.0]);
    assert_eq!(&features[8..], &[0.5; 4], "missing -> default");
    assert_eq!(sources.iter().filter(|s| s.fallback).count(), 2);
    let stats = tiers.stats();
    assert_eq!(
        stats.malformed.load(std::sync::atomic::Ordering::Relaxed),
        1
    );
    assert_eq!(
        stats
            .fallback_missing
            .load(std::sync::atomic::Ordering::Relaxed),
        2
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_misses_of_the_same_rows_share_one_fetch() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), None, Some(l3));
    let ids: Vec<u64> = (0..50).collect();
    // Freeze Redis so the first fetch is still in flight when the second asks.
    redis.freeze();
    let first = {
        let (tiers, ids) = (tiers.clone(), ids.clone());
        tokio::spawn(async move { fetch(&tiers, &ids, Duration::from_secs(10)).await })
    };
    let stats = tiers.stats();
    while stats
        .l3_round_trips
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let second = {
        let (tiers, ids) = (tiers.clone(), ids.clone());
        tokio::spawn(async move { fetch(&tiers, &ids, Duration::from_secs(10)).await })
    };
    while stats.coalesced.load(std::sync::atomic::Ordering::Relaxed) < 50 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    redis.thaw();
    let (a, sa) = first.await.unwrap();
    let (b, sb) = second.await.unwrap();
    assert_eq!(a, b);
    assert!(sa.iter().chain(&sb).all(|s| s.tier == tier::L3));
    assert_eq!(
        stats
            .l3_round_trips
            .load(std::sync::atomic::Ordering::Relaxed),
        1,
        "one fetch"
    );
    assert_eq!(
        stats.coalesced.load(std::sync::atomic::Ordering::Relaxed),
        50
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_cluster_serves_keys_grouped_by_slot() {
    let cluster = RedisCluster::start();
    let data = tempfile::tempdir().unwrap();
    let config = RedisConfig {
        urls: cluster.urls(),
        cluster: true,
        ..RedisConfig::single("")
    };
    import_to_redis(
        &cora_dir().join("features.f32"),
        2708,
        DIM as u32,
        data.path(),
        &config,
    )
    .await
    .unwrap();
    // The keys really are spread over the three nodes.
    for node in &cluster.nodes {
        let size = node.command("DBSIZE");
        let n: u64 = size.trim().trim_start_matches(':').parse().unwrap();
        assert!(n > 500, "every master holds a share: {n}");
    }
    let l3 = RedisTier::connect(&config).await.unwrap();
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), None, Some(l3));
    let ids: Vec<u64> = (0..221).map(|i| i * 11 + 3).collect();
    let (features, sources) = fetch(&tiers, &ids, Duration::from_secs(2)).await;
    assert!(sources.iter().all(|s| s.tier == tier::L3 && !s.fallback));
    for (pos, &id) in ids.iter().enumerate().step_by(17) {
        assert_eq!(&features[pos * DIM..(pos + 1) * DIM], &cora_row(id)[..]);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_urls_work_and_errors_never_show_the_password() {
    let redis = RedisServer::start_with_password("s3cret-pw");
    let l3 = RedisTier::connect(&redis_config(&redis)).await.unwrap();
    assert!(!format!("{l3:?}").contains("s3cret-pw"));
    l3.set_many(&[(1, encode_row(&[1.0]))]).await.unwrap();
    assert_eq!(
        l3.get_many(&[1]).await.unwrap()[0].as_deref(),
        Some(&encode_row(&[1.0])[..])
    );
    let wrong = RedisConfig::single(format!("redis://:wrong-pw@127.0.0.1:{}", redis.port));
    let err = RedisTier::connect(&wrong).await.unwrap_err();
    let text = format!("{err:#}");
    assert!(!text.contains("wrong-pw"), "{text}");
    assert!(text.contains(":***@"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_invalidation_message_makes_the_new_row_visible() {
    let redis = RedisServer::start();
    invalidation_reaches_the_tiers(&redis, redis_config(&redis)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_invalidation_listener_uses_the_tls_settings_of_the_fetch_path() {
    let redis = RedisServer::start_tls(Some("tls-pw"));
    let mut config = redis_config(&redis);
    config.ca_file = Some(redis.ca_file());
    invalidation_reaches_the_tiers(&redis, config).await;
}

/// A 16 MiB L2 cache in `dir` whose rows live 10 minutes.
fn small_l2_cache(dir: &Path) -> Arc<RocksStore> {
    let (l2, _) = RocksStore::open(
        &dir.join("l2"),
        Role::Cache {
            max_bytes: 1 << 24,
            ttl: Duration::from_secs(600),
        },
    )
    .unwrap();
    Arc::new(l2)
}

async fn invalidation_reaches_the_tiers(_redis: &RedisServer, config: RedisConfig) {
    let l3 = RedisTier::connect(&config).await.unwrap();
    l3.set_many(&[(42, encode_row(&[1.0, 1.0]))]).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let tiers = FeatureTiers::new(
        &TierConfig::new(2),
        Some(small_l2_cache(data.path())),
        Some(l3.clone()),
    );
    let stats = Arc::new(InvalidationStats::default());
    let listener = invalidation::spawn_listener(
        invalidation::NodeTypes(vec![("node".into(), Some(tiers.clone()))]),
        &config,
        invalidation::DEFAULT_CHANNEL.into(),
        stats.clone(),
    )
    .await
    .unwrap();
    let (old, _) = fetch(&tiers, &[42], Duration::from_secs(1)).await;
    assert_eq!(old, [1.0, 1.0]);
    // Cached now in L1 (and on its way to L2): change the row, publish its id.
    l3.set_many(&[(42, encode_row(&[2.0, 2.0]))]).await.unwrap();
    // Published over a connection of the same configuration (plain or TLS).
    let mut publisher = config
        .client(&config.urls[0])
        .unwrap()
        .get_multiplexed_async_connection()
        .await
        .unwrap();
    let receivers: i64 = redis::cmd("PUBLISH")
        .arg(invalidation::DEFAULT_CHANNEL)
        .arg("42")
        .query_async(&mut publisher)
        .await
        .unwrap();
    assert_eq!(receivers, 1, "the listener was subscribed when it returned");
    let published = Instant::now();
    loop {
        let (now, _) = fetch(&tiers, &[42], Duration::from_secs(1)).await;
        if now == [2.0, 2.0] {
            break;
        }
        // Milliseconds in practice; generous for a loaded machine.
        assert!(
            published.elapsed() < Duration::from_secs(5),
            "the new value within 5 s of the message (stats: {} messages, {} ids; served {now:?})",
            stats.messages.load(std::sync::atomic::Ordering::Relaxed),
            stats.ids.load(std::sync::atomic::Ordering::Relaxed),
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(stats.ids.load(std::sync::atomic::Ordering::Relaxed) >= 1);
    listener.abort();
}

/// Requests racing an invalidation: a flight that starts while the
/// invalidation is under way (its row already gone from L1, not yet from the
/// L2 cache) may read the old row from L2, but must not put it in L1, where
/// it would stay until evicted. After every invalidation has returned and
/// every flight has closed, the row served is the new one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_old_row_outlives_an_invalidation_raced_by_requests() {
    let redis = RedisServer::start();
    let l3 = RedisTier::connect(&redis_config(&redis)).await.unwrap();
    let data = tempfile::tempdir().unwrap();
    let tiers = FeatureTiers::new(
        &TierConfig::new(2),
        Some(small_l2_cache(data.path())),
        Some(l3.clone()),
    );
    for round in 0..300u32 {
        let value = round as f32;
        l3.set_many(&[(42, encode_row(&[value, value]))])
            .await
            .unwrap();
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let requests = {
            let (tiers, stop) = (tiers.clone(), stop.clone());
            tokio::spawn(async move {
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    fetch(&tiers, &[42], Duration::from_secs(1)).await;
                    tokio::task::yield_now().await;
                }
            })
        };
        tiers.invalidate(&[42]).await;
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        requests.await.unwrap();
        settled(&tiers).await;
        let (now, sources) = fetch(&tiers, &[42], Duration::from_secs(1)).await;
        assert_eq!(
            now,
            [value, value],
            "round {round}: the row served after the invalidation (from tier {})",
            sources[0].tier
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn l1_is_bounded_in_bytes_and_the_pinned_hot_set_survives_pressure() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let mut config = TierConfig::new(DIM);
    config.l1_bytes = 50 * (DIM as u64 * 4 + 32); // about 50 rows
    let tiers = FeatureTiers::new(&config, None, Some(l3));
    assert_eq!(tiers.pin(&[1358, 306], 1_000, |_, _| {}).await, 2);
    for chunk in (0..2708u64).collect::<Vec<_>>().chunks(100) {
        fetch(&tiers, chunk, Duration::from_secs(2)).await;
    }
    assert!(
        tiers.l1_bytes() <= config.l1_bytes,
        "{} > {}",
        tiers.l1_bytes(),
        config.l1_bytes
    );
    let (features, sources) = fetch(&tiers, &[1358, 306], Duration::from_secs(2)).await;
    assert!(
        sources.iter().all(|s| s.tier == tier::L1),
        "pinned rows never leave L1"
    );
    assert_eq!(&features[..DIM], &cora_row(1358)[..]);
}

#[test]
fn a_corrupt_l2_cache_is_wiped_and_rebuilt_but_a_corrupt_store_of_record_is_refused() {
    let data = tempfile::tempdir().unwrap();
    let cache_path = data.path().join("l2");
    let cache = Role::Cache {
        max_bytes: 1 << 24,
        ttl: Duration::from_secs(60),
    };
    {
        let (store, _) = RocksStore::open(&cache_path, cache).unwrap();
        store.put_many([(1u64, &[0u8; 8][..])]).unwrap();
        store.flush().unwrap();
    }
    std::fs::write(cache_path.join("CURRENT"), b"garbage-manifest-name\n").unwrap();
    let (store, opened) = RocksStore::open(&cache_path, cache).unwrap();
    assert_eq!(opened, Opened::Rebuilt);
    assert_eq!(store.get_many(&[1], 8), vec![None], "rebuilt empty");
    drop(store);

    let record_path = data.path().join("features.db");
    {
        let (store, _) = RocksStore::open(&record_path, Role::StoreOfRecord).unwrap();
        store.put_many([(1u64, &[0u8; 8][..])]).unwrap();
        store.flush().unwrap();
    }
    std::fs::write(record_path.join("CURRENT"), b"garbage-manifest-name\n").unwrap();
    let err = RocksStore::open(&record_path, Role::StoreOfRecord).unwrap_err();
    assert!(err.to_string().contains("re-run `sidecar import`"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_in_flight_during_an_invalidation_does_not_cache_the_old_row() {
    let redis = RedisServer::start();
    let l3 = RedisTier::connect(&redis_config(&redis)).await.unwrap();
    l3.set_many(&[(7, encode_row(&[1.0]))]).await.unwrap();
    let tiers = FeatureTiers::new(&TierConfig::new(1), None, Some(l3.clone()));
    // The fetch starts while Redis still holds the old row (frozen, so it is
    // in flight for sure), the invalidation runs, then Redis answers.
    redis.freeze();
    let in_flight = {
        let tiers = tiers.clone();
        tokio::spawn(async move { fetch(&tiers, &[7], Duration::from_secs(10)).await })
    };
    while tiers
        .stats()
        .l3_round_trips
        .load(std::sync::atomic::Ordering::Relaxed)
        == 0
    {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    tiers.invalidate(&[7]).await;
    redis.thaw();
    let (old, _) = in_flight.await.unwrap();
    assert_eq!(old, [1.0], "the request in flight gets what Redis had");
    l3.set_many(&[(7, encode_row(&[2.0]))]).await.unwrap();
    let (now, sources) = fetch(&tiers, &[7], Duration::from_secs(5)).await;
    assert_eq!(now, [2.0], "the old row was not cached: {sources:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_urls_use_tls_checked_against_the_given_ca() {
    let redis = RedisServer::start_tls(Some("tls-pw"));
    assert!(redis.url().starts_with("rediss://"));
    let mut config = redis_config(&redis);
    config.ca_file = Some(redis.ca_file());
    let l3 = RedisTier::connect(&config).await.unwrap();
    l3.set_many(&[(3, encode_row(&[3.0, 4.0]))]).await.unwrap();
    let tiers = FeatureTiers::new(&TierConfig::new(2), None, Some(l3));
    let (features, sources) = fetch(&tiers, &[3], Duration::from_secs(2)).await;
    assert_eq!(features, [3.0, 4.0]);
    assert_eq!(sources[0].tier, tier::L3);

    // Without the private CA, the server's certificate is not trusted.
    let untrusted = RedisTier::connect(&redis_config(&redis)).await.unwrap_err();
    let text = format!("{untrusted:#}");
    assert!(!text.contains("tls-pw"), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fetch_dropped_midway_leaves_no_flight_behind() {
    let redis = RedisServer::start();
    let data = tempfile::tempdir().unwrap();
    let l3 = cora_in_redis(&redis, data.path()).await;
    let tiers = FeatureTiers::new(&TierConfig::new(DIM), None, Some(l3));
    redis.freeze();
    // The caller gives up (drops the fetch) before the fetch's own deadline.
    let dropped = tokio::time::timeout(
        Duration::from_millis(50),
        fetch(&tiers, &[7, 8, 9], Duration::from_secs(10)),
    )
    .await;
    assert!(dropped.is_err(), "Redis is frozen: the fetch cannot finish");
    assert_eq!(tiers.rows_in_flight(), 0, "the dropped flight was closed");
    redis.thaw();
    // Nobody joins a flight that will never land: the rows come from Redis.
    let (features, sources) = fetch(&tiers, &[7, 8, 9], Duration::from_secs(2)).await;
    assert!(sources.iter().all(|s| s.tier == tier::L3 && !s.fallback));
    assert_eq!(&features[..DIM], &cora_row(7)[..]);
}
