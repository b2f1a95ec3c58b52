#!/usr/bin/env bash
# The model run in place against the same run alone (issue "A call at its
# floor", item 2): bench/src/bin/onnx-in-place.rs runs one ONNX Runtime
# session of a GraphSAGE trained on cora on the same inputs six ways,
# interleaved run by run (alone on the heap; in a shared mapping, 64-byte
# aligned, as the ring's responses are; rewritten by another thread before
# each run, as the sidecar writes them; after 8 MiB of other memory was
# touched; on a thread woken for the run, as an executor is; two sessions in
# turn) and prints each way's p50, p99 and mean with its ratio to the run
# alone. A ratio well above 1 for a way the worker takes is a regression.
# Writes bench/results/<date>-onnx/t<targets>.json.
#
#   scripts/bench-onnx.sh                  # 1 and 8 targets, 2000 runs a way
#   RUNS=500 scripts/bench-onnx.sh
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
out=bench/results/$(date -u +%F)-onnx
mkdir -p "$out"
for targets in 1 8; do
    "$CARGO_TARGET_DIR/release/onnx-in-place" --targets "$targets" --runs "${RUNS:-2000}" \
        --out "$out/t$targets.json"
done
