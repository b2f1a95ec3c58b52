//! Loading a typed graph to serve (docs/graph-index.md, "Serving a typed
//! graph"): the typed index, and for each node type with features its own
//! feature store and tiers, in `typed-features/<type>/` (RocksDB, or Redis
//! under `<prefix><type>:`, with an L2 cache per type in
//! `<l2_dir>/<type>`).
//!
//! Updates reach a typed graph through the admin socket or the update
//! stream (docs/updates.md, "Typed graphs"); the invalidation channel, the
//! warm-up and a seed dataset are for one-type graphs in this release, and
//! a configuration that asks for them is refused at start, by name.

use std::sync::Arc;

use anyhow::{bail, ensure, Context};

use crate::config::{DefaultRowKind, ServeConfig};
use crate::daemon::{Daemon, TypeStores, TypedServing};
use crate::features::import::FeatureManifest;
use crate::features::redis_tier::{RedisConfig, RedisTier};
use crate::features::rocks::{RocksStore, Role, StoreTelemetry};
use crate::features::{DefaultRow, FeatureTiers, TierConfig};
use crate::graph::typed::{self, TypedGraph};

/// Whether `config.data_dir` holds a typed graph and no one-type index.
pub fn is_typed_data_dir(config: &ServeConfig) -> bool {
    !config
        .data_dir
        .join(crate::graph::dataset::INDEX_FILE)
        .exists()
        && config.data_dir.join(typed::TYPED_DIR).is_dir()
}

/// Opens the typed index and each type's store and tiers; refuses what a
/// typed graph does not serve yet.
pub fn load(
    daemon: &Daemon,
    runtime: &tokio::runtime::Runtime,
) -> anyhow::Result<(TypedGraph, Arc<TypedServing>)> {
    let config = &daemon.config;
    let refused = [
        (
            config.invalidation_channel.is_some(),
            "invalidation_channel (--invalidation-channel)",
        ),
        (config.seed_dataset.is_some(), "seed_dataset"),
    ];
    if let Some((_, what)) = refused.iter().find(|(set, _)| *set) {
        bail!(
            "{} holds a typed graph; {what} is for one-type graphs in this release: leave it \
             unset (docs/graph-index.md, \"Serving a typed graph\")",
            config.data_dir.display()
        );
    }
    let graph = TypedGraph::open(&config.data_dir)?;
    let mut tiers = Vec::with_capacity(graph.schema().node_types.len());
    let mut stores = Vec::with_capacity(tiers.capacity());
    for t in &graph.schema().node_types {
        if t.feature_dim == 0 {
            tiers.push(None);
            stores.push(None);
            continue;
        }
        let dir = typed::feature_dir(&config.data_dir, &t.name);
        let manifest = FeatureManifest::read(&dir).with_context(|| {
            format!(
                "node type {} has {} features: import its rows (sidecar import)",
                t.name, t.feature_dim
            )
        })?;
        ensure!(
            manifest.feature_dim == t.feature_dim && manifest.dtype == "f32",
            "{}: {} {} values per row; the typed index says {} f32 for node type {}: re-run \
             sidecar import",
            dir.join(FeatureManifest::FILE).display(),
            manifest.feature_dim,
            manifest.dtype,
            t.feature_dim,
            t.name
        );
        let (store, redis) = match manifest.store.as_str() {
            "rocksdb" => {
                ensure!(
                    config.redis.0.is_empty(),
                    "the features of node type {} are in the embedded store; drop redis, or \
                     re-import them with --redis",
                    t.name
                );
                let path = dir.join(FeatureManifest::STORE_DIR);
                ensure!(
                    path.join("CURRENT").is_file(),
                    "the feature store {} of node type {} is missing: re-run sidecar import",
                    path.display(),
                    t.name
                );
                let (store, _) = RocksStore::open(&path, Role::StoreOfRecord)?;
                manifest
                    .check_store(&store, &path)
                    .with_context(|| format!("node type {}", t.name))?;
                (Some(Arc::new(store)), None)
            }
            "redis" => {
                ensure!(
                    !config.redis.0.is_empty(),
                    "the features of node type {} were imported into Redis: set redis (--redis \
                     <url>)",
                    t.name
                );
                let redis_config = RedisConfig::of_feature_store(
                    config,
                    manifest
                        .redis_prefix
                        .clone()
                        .unwrap_or_else(|| typed::redis_prefix("feat:", &t.name)),
                );
                let tier = runtime.block_on(RedisTier::connect(&redis_config))?;
                runtime
                    .block_on(crate::features::import::verify_redis(&tier, &manifest))
                    .with_context(|| format!("node type {}", t.name))?;
                let l2 = match config.l2_cache() {
                    None => None,
                    Some(l2) => {
                        let path = l2.path.join(&t.name);
                        let role = Role::Cache {
                            max_bytes: l2.max_bytes,
                            ttl: l2.ttl,
                        };
                        let (store, _) = RocksStore::open(&path, role).with_context(|| {
                            format!("opening node type {}'s L2 cache {}", t.name, path.display())
                        })?;
                        Some(Arc::new(store))
                    }
                };
                (l2, Some(tier))
            }
            other => bail!(
                "{}: unknown store {other:?}",
                dir.join(FeatureManifest::FILE).display()
            ),
        };
        let mut tier_config = TierConfig::new(t.feature_dim as usize);
        tier_config.l1_bytes = config.l1_bytes();
        tier_config.default_deadline = config.deadline();
        tier_config.default_row = match config.default_row {
            DefaultRowKind::Zeros => DefaultRow::Zeros,
            DefaultRowKind::Mean => DefaultRow::Mean(manifest.read_mean(&dir)?.into()),
        };
        daemon.metrics.register_labelled(
            "node_type",
            &t.name,
            Arc::new(StoreTelemetry {
                store: store.clone(),
                rebuilds: 0,
            }),
        );
        stores.push(Some(TypeStores {
            store: store.clone(),
            redis: redis.clone(),
            row_bytes: 4 * t.feature_dim as usize,
        }));
        let node_tiers = FeatureTiers::new(&tier_config, store, redis);
        daemon
            .metrics
            .register_labelled("node_type", &t.name, node_tiers.clone());
        tiers.push(Some(node_tiers));
    }
    daemon.latches.store.release();
    daemon.latches.invalidation.release();
    let ring = graph.schema().to_ring();
    tracing::info!(
        data_dir = %config.data_dir.display(),
        types = %ring.describe(),
        "typed graph loaded"
    );
    Ok((
        graph,
        Arc::new(TypedServing {
            ring,
            tiers,
            stores,
        }),
    ))
}
