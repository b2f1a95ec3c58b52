#!/usr/bin/env bash
# The sidecar's work per target against the gather floor (issue 48, item
# 3; docs/serving.md, "The sidecar's work per request"): a real `sidecar
# serve` of the synthetic power-law graph (1M nodes, 50M edges, D = 128,
# generated and imported into --work once) with every row in L1 and no
# spinning, called over the ring from one thread at 1, 8 and 64 targets a
# request; its time and CPU per request and per target beside the
# in-memory gather of the same rows, side by side in one run. --perf <dir>
# also records the sidecar with `perf record -g`.
#
#   scripts/bench-sidecar-cost.sh
#   scripts/bench-sidecar-cost.sh --quick --calls 1000
#   scripts/bench-sidecar-cost.sh --perf /tmp/sidecar-perf
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/sidecar-cost" --work "$CARGO_TARGET_DIR/sidecar-cost" "$@"
