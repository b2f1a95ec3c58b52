//! The local graph index and the neighbour sampler.
//!
//! - [`format`]: the CSR file layout and its header;
//! - [`build`]: streaming, bounded-memory construction from an edge list;
//! - [`index`]: the memory-mapped, verified index;
//! - [`dataset`]: the `../shared/data` dataset layout and text edge lists;
//! - [`sampler`]: uniform sampling without replacement, O(fanout) per node;
//! - [`delta`]: the persistent map of added rows a snapshot shares;
//! - [`live`]: the served graph, base + added nodes and edges, switched
//!   atomically, and its compaction;
//! - [`generate`]: seeded R-MAT graphs with planted super nodes;
//! - [`changes`]: the change clock that tells stored answers fresh or stale;
//! - [`typed`]: typed graphs, one index per edge type, and their import;
//! - [`typed_live`]: the served typed graph, base + added nodes and edges.

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
pub mod typed_live;

pub use build::{BuildOptions, BuildStats};
pub use changes::Changes;
pub use format::{CsrHeader, FormatError, StreamPosition};
pub use index::CsrIndex;
pub use live::{GraphSnapshot, GraphUpdate, LiveGraph, UpdateStats};
pub use sampler::{
    NeighborSource, Sampled, Sampler, TypedFanouts, TypedNeighborSource, TypedSampled,
};
pub use typed::{TypedGraph, TypedSchema};
