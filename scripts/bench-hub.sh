#!/usr/bin/env bash
# Hub layer-1 embeddings against the plain inductive path (issue 15;
# docs/strategies.md, "Hub layer-1 embeddings"): per dataset (cora and the
# synthetic power-law graph of 1M nodes and 50M edges, generated into
# --work once), one sidecar, a worker sending hubs without their
# neighbourhood (stored layer-1 embeddings from `gnn-worker precompute`)
# and a plain one; rows fetched per request, lone-call latency, closed-loop
# throughput and the labels of both. Writes bench/results/hub/report.{json,md}.
#
#   scripts/bench-hub.sh
#   scripts/bench-hub.sh --datasets cora --seconds 5
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/hub" "$@"
