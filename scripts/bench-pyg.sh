#!/usr/bin/env bash
# PyTorch Geometric models served in the subgraph layout against the same
# weights in the dense layout (issue 24; docs/model.md, "Speed"): on cora
# at fanouts [20, 10], one sidecar and one worker per model: a PyG SAGEConv
# export (its scatter-adds rewritten at load), the same weights imported
# into the dense layout (sage.py import-pyg), the PyG model without the
# rewrite, and PyG GCN, GAT and GIN exports; lone-call latency, closed-loop
# throughput and accuracy of each. Writes bench/results/pyg/report.{json,md}.
#
#   scripts/bench-pyg.sh
#   scripts/bench-pyg.sh --rounds 1 --seconds 5 --archs gcn
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/pyg" "$@"
