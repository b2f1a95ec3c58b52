#!/usr/bin/env bash
# The demo, end to end on the embedded default (no Redis needed): uses the
# cora dataset the repository ships (demo/data/cora.tar.gz), imports it into
# the embedded RocksDB store, trains and exports the
# GraphSAGE model with the tooling (PyTorch -> ONNX), starts `sidecar serve`
# and `gnn-worker serve`, sends every test node through gRPC, prints the test
# accuracy and the p50/p99 latency, and shuts both down cleanly.
#
# Installs what the demo needs first (`scripts/setup.sh --demo`: no test
# tooling); safe to run again. Pass --dataset citeseer|cora_ml for another
# dataset. The benchmarks are scripts/bench.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --demo
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# The daemons log at info by default; the demo shows their warnings only
# (log_level for the daemons, RUST_LOG for `sidecar import`).
export RUST_LOG=${RUST_LOG:-warn}
export SIDECAR_LOG_LEVEL=${SIDECAR_LOG_LEVEL:-warn}
export GNN_WORKER_LOG_LEVEL=${GNN_WORKER_LOG_LEVEL:-warn}
# The demo starts the binaries of the whole workspace. All targets, so the
# dependencies are resolved with the same features as scripts/test.sh and
# RocksDB's C++ (the slowest step) is compiled once for both.
echo "demo [${SECONDS}s]: building the workspace into $CARGO_TARGET_DIR (from nothing about 35 minutes on 2 cores, most of it RocksDB's C++; later runs take seconds)"
cargo build --release --workspace --all-targets
echo "demo [${SECONDS}s]: built"
"$CARGO_TARGET_DIR/release/demo" "$@"
echo "demo [${SECONDS}s]: done"
