//! A typed graph's features as the sidecar serves them (`sidecar serve`
//! loads them): the types the segment carries, and each node type's stores
//! and tiers. The graph itself is the core's (`Core::graph`).

use std::sync::Arc;

use protocol::graph_schema::GraphSchema;

use crate::features::redis_tier::RedisTier;
use crate::features::rocks::RocksStore;
use crate::features::FeatureTiers;
use crate::graph::GraphSnapshot;

/// A typed graph's per-type tiers, as the ring serves them.
#[derive(Debug)]
pub struct TypedServing {
    /// The types as the segment carries them.
    pub ring: GraphSchema,
    /// Per node type: its tiers; `None` for a type without features.
    pub tiers: Vec<Option<FeatureTiers>>,
    /// Per node type: where its rows are stored; `None` for a type without
    /// features.
    pub stores: Vec<Option<TypeStores>>,
}

/// A node type's stores: the embedded store (store of record, or the L2
/// cache in front of Redis) and Redis, when the rows live there.
#[derive(Debug, Clone)]
pub struct TypeStores {
    pub store: Option<Arc<RocksStore>>,
    pub redis: Option<RedisTier>,
    /// Bytes of a row: 4 x the type's feature width.
    pub row_bytes: usize,
}

impl TypedServing {
    /// The `k` nodes of `graph` with the most edges, of the node types
    /// with feature rows: what the start-up warm-up and `sidecarctl warm
    /// --top` pin.
    pub fn top_degree(&self, graph: &GraphSnapshot, k: usize) -> Vec<(usize, u64)> {
        graph.top_degree(k, |t| self.tiers.get(t).is_some_and(Option::is_some))
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
        for (t, tiers) in self.tiers.iter().enumerate() {
            let ids: Vec<u64> = nodes
                .iter()
                .filter(|&&(of, _)| of == t)
                .map(|&(_, id)| id)
                .collect();
            let Some(tiers) = tiers else {
                done += ids.len() as u64;
                continue;
            };
            if ids.is_empty() {
                continue;
            }
            pinned += tiers
                .pin(&ids, chunk, |d, _| progress(done + d, total))
                .await;
            done += ids.len() as u64;
        }
        progress(done, total);
        pinned
    }

    /// Rows in L1 over every node type: cached, pinned.
    pub fn l1_rows(&self) -> (usize, usize) {
        self.tiers.iter().flatten().fold((0, 0), |(c, p), tiers| {
            let (cached, pinned) = tiers.l1_rows();
            (c + cached, p + pinned)
        })
    }
}
