#!/usr/bin/env bash
# The update-stream benchmark (issue 14; docs/updates.md, "Staleness"):
# the whole stack serving at 50% of its saturation while a producer appends
# to the stream at 1k, 10k and 50k entries/s; reports the apply rate and the
# lag p50/p99 per rate. Writes bench/results/updates/report.{json,md}.
#
#   scripts/bench-updates.sh
#   scripts/bench-updates.sh --rates 1000,10000 --seconds 10
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/update-lag" "$@"
