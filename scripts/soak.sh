#!/usr/bin/env bash
# The soak (issue 13; README "Soak"): the whole stack (Redis with the
# features, the sidecar with L1 and L2 in front of it, the worker) under
# open-loop HTTP load at 80% of its measured saturation rate for 10 minutes,
# with graph updates and invalidations in the background. Reports per
# minute: calls, errors (goal 0), latency percentiles, the RSS of both
# daemons (anonymous / file / shared memory) and the used ring slots; then
# the RSS slopes over the second half of the run (goal: about 0).
# Writes bench/results/soak/report.json and report.md; exits 1 on any error.
#
#   scripts/soak.sh                       # 10 minutes at 80%
#   scripts/soak.sh --minutes 2 --fraction 0.5
#   scripts/soak.sh --minutes 12 --l2-mib 64   # memtables flush within the run
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# The whole workspace, all targets: the same features as scripts/test.sh,
# so RocksDB's C++ is compiled once for both.
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/soak" "$@"
