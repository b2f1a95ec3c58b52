#!/usr/bin/env bash
# The whole test suite: formatting, lints, the dependency policy
# (cargo deny), every test of the workspace
# (unit, property, multi-process, pyarrow), the loom model tests, and about
# a minute of fuzzing of every decoder (scripts/fuzz.sh).
# Installs what is missing first (scripts/setup.sh); safe to run again.
#
# Everything builds in the release profile, the one the demo and the
# benchmarks use, so each dependency is compiled once. Set CARGO_TARGET_DIR
# to keep builds outside the clone (.ci/run does).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

target=${CARGO_TARGET_DIR:-$PWD/target}
export CARGO_TARGET_DIR=$target

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --release --workspace --all-targets -- -D warnings
echo "== cargo deny (licences, bans, sources; deny.toml)"
cargo deny --log-level error check licenses bans sources
echo "== cargo build (every binary the tests start)"
# `cargo test` builds a package's binaries only for that package's own
# integration tests: the daemons the tests crate starts (gnn-worker,
# sidecar) must be built here, or a warm target directory would run stale
# ones.
cargo build --release --workspace --all-targets
echo "== cargo test"
cargo test --release --workspace
echo "== loom model tests"
# --cfg loom changes every crate's flags: a target directory of its own keeps
# the main build incremental.
RUSTFLAGS="--cfg loom" CARGO_TARGET_DIR="$target/loom" \
    cargo test --release -p protocol --test loom
echo "== fuzz (scripts/fuzz.sh: every decoder of outside bytes, about a minute)"
scripts/fuzz.sh
