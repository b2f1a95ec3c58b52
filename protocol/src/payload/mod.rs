//! The response payload: Arrow tables written in place into a slot (two in
//! the dense layout, three in the subgraph layout, a directory of them for
//! a typed graph).
//!
//! - [`schema`]: the columns and their codes (versioned with the layout);
//! - `ipc`: where each buffer goes, and the IPC messages that describe them;
//! - [`writer`]: the sidecar fills typed views of the final buffers;
//! - [`reader`]: the worker decodes without copying, validating everything;
//! - [`typed`]: both sides of a typed graph's response.

pub(crate) mod ipc;
pub mod reader;
pub mod schema;
pub(crate) mod table;
pub mod typed;
pub mod writer;

pub use reader::{decode, DecodeLimits, ResponseTables};
pub use table::{header_message, read_header, status_name, DecodeError};
pub use typed::{decode_typed, TypedColumns, TypedResponseWriter, TypedShape, TypedTables};
pub use writer::{
    write_error, NodeColumns, PayloadShape, ResponseMeta, ResponseWriter, SchemaCache,
    SubgraphShape, TargetColumns, WriteError,
};
