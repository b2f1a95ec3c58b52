#!/usr/bin/env bash
# Typed (heterogeneous) graphs served end to end, each beside a one-type
# graph of the same node and edge counts (issue 31; docs/model.md,
# "Serving a heterogeneous model"): the shipped OpenFlights and a generated
# users/items graph, a 2-layer PyG SAGE at [10, 5] on each (to_hetero on the
# typed ones); lone-call latency, closed-loop throughput, and CPU per
# prediction beside the ONNX Runtime run. Writes
# bench/results/typed/report.{json,md}.
#
#   scripts/bench-typed.sh
#   scripts/bench-typed.sh --rounds 1 --seconds 5 --users 50000 --items 10000
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/typed" "$@"
