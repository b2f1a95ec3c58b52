#!/usr/bin/env bash
# The benchmarks, each printing its ratios measured side by side in one run:
# 1. ring: two real processes exchange requests through the shared-memory
#    ring (spinning, parked); a 221 x 128 f32 neighbourhood in place against
#    the same bytes over a Unix socket;
# 2. graph: a seeded 50M-edge power-law graph generated, imported, sampled;
# 3. features: the feature tiers (warm L1, L2 only, cold from Redis) against
#    a bare MGET, naive GETs and an in-memory gather.
# Pass --quick for a short run. Installs what is missing first.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
# --workspace: the same feature set as scripts/test.sh, so RocksDB's C++ is
# not compiled a second time for a narrower selection of packages.
cargo bench --workspace --bench ring -- "$@"
cargo bench --workspace --bench graph -- "$@"
cargo bench --workspace --bench features -- "$@"
