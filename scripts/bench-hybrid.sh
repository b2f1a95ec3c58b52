#!/usr/bin/env bash
# Precomputed answers against the inductive path (issue 15; docs/strategies.md,
# "Precomputed answers"): per dataset (cora, citeseer, cora_ml), one sidecar,
# a worker answering from `gnn-worker precompute`'s store and one that does
# not; share answered from the store and accuracy before and after a round
# of changes, lone-call latency of each path, closed-loop throughput of
# both. Writes bench/results/hybrid/report.{json,md}.
#
#   scripts/bench-hybrid.sh
#   scripts/bench-hybrid.sh --datasets cora --seconds 5
#   scripts/bench-hybrid.sh --datasets cora --model /tmp/gnn-bench-pyg/pyg-sage \
#       --out bench/results/hybrid-pyg     # a PyG model (scripts/bench-pyg.sh's)
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/hybrid" "$@"
