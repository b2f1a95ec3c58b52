//! A typed graph as the sidecar serves it (`sidecar serve` loads it):
//! the typed graph with its updates, the types the segment carries, and
//! each node type's stores and tiers.

use std::sync::Arc;

use protocol::graph_schema::GraphSchema;

use crate::features::redis_tier::RedisTier;
use crate::features::rocks::RocksStore;
use crate::features::FeatureTiers;
use crate::graph::typed_live::TypedLiveGraph;

/// A typed graph and its per-type tiers, as the ring serves them.
#[derive(Debug)]
pub struct TypedServing {
    pub graph: TypedLiveGraph,
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
    pub fn graph_version(&self) -> u64 {
        self.graph.snapshot().graph_version()
    }
}
