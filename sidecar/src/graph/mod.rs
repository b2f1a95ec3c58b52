//! The local graph index and the neighbour sampler.
//!
//! - [`format`]: the CSR file layout and its header;
//! - [`build`]: streaming, bounded-memory construction from an edge list;
//! - [`index`]: the memory-mapped, verified index;
//! - [`dataset`]: the `../shared/data` dataset layout and text edge lists;
//! - [`sampler`]: uniform sampling without replacement, O(fanout) per node;
//! - [`delta`]: the persistent map of added rows a snapshot shares;
//! - [`live`]: the served graph (typed, or one-type as the 1x1 typed
//!   graph), base + added nodes and edges, switched atomically, and its
//!   compaction;
//! - [`generate`]: seeded R-MAT graphs with planted super nodes;
//! - [`changes`]: the change clock that tells stored answers fresh or stale;
//! - [`typed`]: the index of a graph, one CSR per edge type (a one-type
//!   index its 1x1 case), and the import of typed datasets.

pub mod build;
pub mod changes;
pub mod dataset;
pub mod delta;
pub mod format;
pub mod generate;
pub mod index;
pub mod live;
pub mod sampler;
pub mod typed;

pub use build::{BuildOptions, BuildStats};
pub use changes::Changes;
pub use format::{CsrHeader, FormatError, StreamPosition};
pub use index::CsrIndex;
pub use live::{
    Compacted, EdgeAt, EdgeDatum, EdgeValues, GraphSnapshot, GraphUpdate, LiveGraph, UpdateStats,
};
pub use sampler::{GraphFanouts, GraphSampled, GraphSource, NeighborSource, Sampled, Sampler};
pub use typed::{TypedGraph, TypedSchema};
