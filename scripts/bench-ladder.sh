#!/usr/bin/env bash
# The degrade ladder under twice the sustainable load (issue 15;
# docs/strategies.md, "The ladder under overload"): one sidecar, a worker
# with the GNN only and one with the student and reduced fanouts, each
# given open-loop HTTP load at twice the plain worker's saturation, calls
# carrying a 20 ms deadline; latency, errors, accuracy and rungs. Writes
# bench/results/ladder/report.{json,md}.
#
#   scripts/bench-ladder.sh
#   scripts/bench-ladder.sh --dataset citeseer --deadline-ms 10
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/ladder" "$@"
