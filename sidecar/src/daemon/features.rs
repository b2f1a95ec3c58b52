//! The served graph's features, per node type (a one-type graph has one
//! type): each type's tiers over its stores, as `sidecar serve` loaded
//! them (`serve::load`).

use std::sync::Arc;

use crate::features::redis_tier::RedisTier;
use crate::features::rocks::RocksStore;
use crate::features::FeatureTiers;
use crate::graph::GraphSnapshot;

/// A node type's features: its tiers, the embedded store (store of record,
/// or the L2 cache in front of Redis) and Redis, when the rows live there.
#[derive(Debug)]
pub struct TypeFeatures {
    pub tiers: FeatureTiers,
    pub store: Option<Arc<RocksStore>>,
    pub redis: Option<RedisTier>,
}

impl TypeFeatures {
    /// Values of a row.
    pub fn feature_dim(&self) -> usize {
        self.tiers.feature_dim()
    }
}

/// Every node type's features, in the graph's type order: `None` for a
/// type without features (its nodes' ids are the model's input).
#[derive(Debug)]
pub struct GraphFeatures {
    pub types: Vec<Option<TypeFeatures>>,
}

impl GraphFeatures {
    /// Node type `t`'s features, if it has any.
    pub fn of(&self, t: usize) -> Option<&TypeFeatures> {
        self.types.get(t).and_then(Option::as_ref)
    }

    /// The embedded stores, of every type that has one.
    pub fn stores(&self) -> impl Iterator<Item = &Arc<RocksStore>> {
        self.types.iter().flatten().filter_map(|f| f.store.as_ref())
    }

    /// The `k` nodes of `graph` with the most edges, of the node types with
    /// feature rows: what the start-up warm-up and `sidecarctl warm --top`
    /// pin.
    pub fn top_degree(&self, graph: &GraphSnapshot, k: usize) -> Vec<(usize, u64)> {
        graph.top_degree(k, |t| self.of(t).is_some())
    }

    /// Fetches `nodes` through their types' tiers and pins them in L1,
    /// `chunk` rows at a time, calling `progress(done, total)` over all of
    /// them; nodes of a type without features are skipped. Returns the rows
    /// this call pinned.
    pub async fn pin(
        &self,
        nodes: &[(usize, u64)],
        chunk: usize,
        mut progress: impl FnMut(u64, u64),
    ) -> usize {
        let total = nodes.len() as u64;
        let mut done = 0u64;
        let mut pinned = 0;
        for (t, features) in self.types.iter().enumerate() {
            let ids: Vec<u64> = nodes
                .iter()
                .filter(|&&(of, _)| of == t)
                .map(|&(_, id)| id)
                .collect();
            let Some(features) = features else {
                done += ids.len() as u64;
                continue;
            };
            if ids.is_empty() {
                continue;
            }
            pinned += features
                .tiers
                .pin(&ids, chunk, |d, _| progress(done + d, total))
                .await;
            done += ids.len() as u64;
        }
        progress(done, total);
        pinned
    }

    /// Rows in L1 over every node type: cached, pinned.
    pub fn l1_rows(&self) -> (usize, usize) {
        self.types.iter().flatten().fold((0, 0), |(c, p), f| {
            let (cached, pinned) = f.tiers.l1_rows();
            (c + cached, p + pinned)
        })
    }
}
