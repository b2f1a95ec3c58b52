//! The model: its manifest, its check against the segment, and running it on
//! a response's Arrow buffers in place.
//!
//! A model reads one of the two response layouts (docs/protocol.md):
//!
//! - **subgraph** (a PyTorch Geometric model exported with
//!   `torch.onnx.export`, unchanged): inputs `x` (n_nodes x D, the node
//!   table's features) and `edge_index` (2 x n_edges int64, the edge
//!   table's list values), output one row per node, of which the targets'
//!   rows are the answers (classes or an embedding). Its aggregation is
//!   rewritten at load ([`crate::onnx_graph`]). A typed graph's model reads
//!   a typed response's tables by its inputs' names; a one-type model's
//!   response is read as the 1x1 typed graph's, so both run the one
//!   [`Model::run_subgraph`].
//! - **dense** (this project's GraphSAGE, `sage.py`): six inputs, below.
//!
//! The dense model's six inputs are the response tables' buffers as they are:
//! `features` (n_nodes x D), `target_row` (T), `hop1_count` (T), `hop1_rows`
//! (T x f1), `hop2_count` (T x f1), `hop2_rows` (T x f1 x f2, the same
//! buffer as the target table's T x (f1*f2) list with a 3-d shape). Each is
//! handed to ONNX Runtime as a tensor that borrows the shared-memory bytes
//! ([`bind_inputs`]); nothing is copied or reshaped in memory.

//!
//! The module's parts: [`manifest`] (what a model directory declares and
//! its identity), [`checks`] (the manifest against the sidecar's segment
//! and against the ONNX session), [`session`] (loading), [`run`] (binding
//! a response's buffers and running).

mod checks;
mod manifest;
mod run;
mod session;

pub use manifest::*;
pub use run::{bind_inputs, bind_subgraph_inputs, Input, InputSlices};

/// The node type and the edge type of a one-type graph read as the 1x1
/// typed graph (the sidecar's names for them too).
pub const ONE_TYPE: &str = "node";
pub const ONE_RELATION: &str = "to";

use ort::session::Session;
use serde::Deserialize;

/// Where the model runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Device {
    Cpu,
    Cuda,
}

/// A loaded model (one ONNX Runtime session): the GNN, or an MLP student.
#[derive(Debug)]
pub struct Model {
    session: Session,
    manifest: Manifest,
    answered_by: AnsweredBy,
    /// `hidden` zeros: the `[1, 1, hidden]` hub input of a run without
    /// cached slots.
    no_hubs: Vec<f32>,
    scatters_rewritten: usize,
    /// Max/min scatters corrected at load ([`crate::onnx_graph::fix_scatter_extrema`]).
    extrema_fixed: usize,
}

/// How a model is loaded.
#[derive(Debug, Clone, Copy)]
struct LoadOptions {
    device: Device,
    intra_threads: usize,
    fast_scatter: bool,
}
