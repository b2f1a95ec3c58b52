//! The stores' contract (`sidecar::features::store::conformance`), run
//! against every real implementation: the embedded store as store of
//! record and as the L2 cache (real RocksDB directories), and the Redis
//! tier on a Redis server and on a 3-node Redis Cluster. The fetch path's
//! fakes run the same suite in its unit tests.

use std::time::Duration;

use sidecar::features::contract::{redis_key, DEFAULT_PREFIX};
use sidecar::features::redis_tier::{RedisConfig, RedisTier};
use sidecar::features::rocks::{RocksStore, Role};
use sidecar::features::store::conformance;
use tests::redis::{RedisCluster, RedisServer};

#[test]
fn the_embedded_store_keeps_the_contract_in_both_roles() {
    let cache = Role::Cache {
        max_bytes: 64 << 20,
        ttl: Duration::from_secs(3_600),
    };
    for role in [Role::StoreOfRecord, cache] {
        let dir = tempfile::tempdir().unwrap();
        let (store, _) = RocksStore::open(&dir.path().join("store"), role).unwrap();
        conformance::local_store(&store);
    }
}

/// Writes [`conformance::remote_rows`] under the contract's keys: one
/// pipeline to a server, one SET at a time to a cluster (each key to its
/// own node).
async fn seed(config: &RedisConfig) {
    if config.cluster {
        let client = redis::cluster::ClusterClient::new(config.urls.clone()).unwrap();
        let mut connection = client.get_async_connection().await.unwrap();
        for (id, value) in conformance::remote_rows() {
            let _: () = redis::cmd("SET")
                .arg(redis_key(DEFAULT_PREFIX, id))
                .arg(value)
                .query_async(&mut connection)
                .await
                .unwrap();
        }
    } else {
        let mut pipe = redis::pipe();
        for (id, value) in conformance::remote_rows() {
            pipe.cmd("SET")
                .arg(redis_key(DEFAULT_PREFIX, id))
                .arg(value)
                .ignore();
        }
        let client = redis::Client::open(config.urls[0].as_str()).unwrap();
        let mut connection = client.get_multiplexed_async_connection().await.unwrap();
        let _: () = pipe.query_async(&mut connection).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_redis_tier_keeps_the_contract_on_a_server_and_a_cluster() {
    let server = RedisServer::start();
    let single = RedisConfig::single(server.url());
    seed(&single).await;
    conformance::remote_store(&RedisTier::connect(&single).await.unwrap()).await;

    let cluster = RedisCluster::start();
    let config = RedisConfig {
        urls: cluster.urls(),
        cluster: true,
        ..RedisConfig::single("")
    };
    seed(&config).await;
    conformance::remote_store(&RedisTier::connect(&config).await.unwrap()).await;
}
