//! The response payload: Arrow tables written in place into a slot (two in
//! the dense layout, three in the subgraph layout, a directory of them for
//! a typed graph).
//!
//! - [`schema`]: the columns and their codes (versioned with the layout);
//! - `ipc`: where each buffer goes, and the IPC messages that describe them;
//! - [`writer`]: the sidecar fills typed views of the final buffers (the
//!   dense layout's writer, and what every writer shares);
//! - [`reader`]: the worker decodes the dense layout without copying,
//!   validating everything;
//! - [`graph`]: both sides of the graph layouts (the subgraph layout, a
//!   one-type graph's, and the typed layout), one writer and one reader.

pub mod graph;
pub(crate) mod ipc;
pub mod reader;
pub mod schema;
pub(crate) mod table;
pub mod writer;

pub use graph::{
    decode_graph, decode_graph_with, GraphColumns, GraphForm, GraphShape, GraphTables, GraphWriter,
};
pub use reader::{decode, DecodeLimits, ResponseTables};
pub use table::{header_message, read_header, status_name, DecodeError};
pub use writer::{
    write_error, NodeColumns, PayloadShape, ResponseMeta, ResponseWriter, SchemaCache,
    TargetColumns, WriteError,
};
