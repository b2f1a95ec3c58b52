//! The contract between the `gnn-worker` and the `sidecar`: the shared-memory
//! segment, the slot lifecycle, and the Arrow response payload.
//!
//! Both processes link this crate; it is the only code that touches the
//! segment. `docs/protocol.md` describes the same contract byte by byte.
//!
//! - [`layout`]: every `#[repr(C)]` type in the segment, and its fingerprint;
//! - [`segment`]: create (exclusive, stale takeover), attach (validate first),
//!   unlink;
//! - [`slot`]: the slot state machine; [`submit`]: the submission bitmap and
//!   doorbell; `wait`/`futex`: spin, then park;
//! - [`liveness`]: heartbeats and the client registry;
//! - [`request`] and [`payload`]: what a slot carries each way;
//! - [`graph_schema`]: a typed graph's node and edge types, as the segment
//!   carries them;
//! - [`server`] and [`client`]: the sidecar's and the worker's handles.
//!
//! **Architecture invariant:** no tokio, RocksDB, Redis or ONNX Runtime here,
//! and no dependency on `sidecar` or `gnn-worker`. Blocking waits are futex
//! parks with deadlines, usable from any thread.
//!
//! **Unsafe code** is denied crate-wide and allowed only in `futex` (the
//! system call), `segment` (mapping and pointer arithmetic over validated
//! offsets, and the word-by-word copies of request areas), `layout` (the
//! `ShmSafe` marker impls), `server` (the response area of a slot it holds
//! `SERVING`), `client` (handing a leased slot to Arrow without a copy) and
//! `sigbus` (the handler that keeps a truncated segment from killing the
//! process). Each `unsafe` block states why it is
//! sound in a `SAFETY:` comment.
#![deny(unsafe_code)]

mod futex;
pub mod graph_schema;
pub mod layout;
pub mod payload;
pub mod request;
pub mod slot;
pub mod submit;
mod sync;
pub mod wait;

#[cfg(not(loom))]
pub mod client;
#[cfg(not(loom))]
pub mod liveness;
#[cfg(not(loom))]
pub mod segment;
#[cfg(not(loom))]
pub mod server;
#[cfg(not(loom))]
mod sigbus;

#[cfg(not(loom))]
pub use client::{
    Accepted, CallError, CallRequest, ClientOptions, ClientStatus, Response, RingClient,
};
pub use layout::{FeatureSchema, Geometry, LAYOUT_VERSION};
pub use payload::{PayloadShape, ResponseTables};
#[cfg(not(loom))]
pub use segment::{AttachError, CreateError, Segment, SegmentConfig};
#[cfg(not(loom))]
pub use server::{RingMonitor, RingServer, ServeTicket, ServerOptions, SlotOccupancy};
pub use wait::{Spin, WaitPolicy, WaitSite};

/// Hooks for the loom model tests: the atomics and wait helpers the ring is
/// made of, exposed only under `--cfg loom`.
#[cfg(loom)]
pub mod loom_hooks {
    pub use crate::wait::{notify, wait_for};
}
