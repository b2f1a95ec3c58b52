//! A typed graph as the sidecar serves it (`sidecar serve` loads it):
//! the typed index, the types the segment carries, and each node type's
//! tiers.

use protocol::graph_schema::GraphSchema;

use crate::features::FeatureTiers;
use crate::graph::typed::TypedGraph;

/// A typed graph and its per-type tiers, as the ring serves them.
#[derive(Debug)]
pub struct TypedServing {
    pub graph: TypedGraph,
    /// The types as the segment carries them.
    pub ring: GraphSchema,
    /// Per node type: its tiers; `None` for a type without features.
    pub tiers: Vec<Option<FeatureTiers>>,
}

impl TypedServing {
    pub fn graph_version(&self) -> u64 {
        self.graph.schema().graph_version
    }

    /// Node type `t`'s id bound: its node count.
    pub fn id_bound(&self, t: usize) -> u64 {
        self.graph.schema().node_types[t].num_nodes
    }
}
