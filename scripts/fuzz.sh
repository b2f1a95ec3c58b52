#!/usr/bin/env bash
# Fuzzes every decoder of bytes from outside the process (one cargo-fuzz
# target each, fuzz/fuzz_targets; the list is in docs/reliability.md) for a
# bounded time, starting from the seed corpus in fuzz/seeds.
#
#   scripts/fuzz.sh                  every target, FUZZ_SECONDS (6) each
#   scripts/fuzz.sh csr_file 600     one target for ten minutes
#
# A crash, a hang (10 s), or an allocation above 1 GiB fails the run; the
# input is kept under $FUZZ_WORK/artifacts/<target>/ and printed: reproduce
# it with `cargo fuzz run <target> <file>` and turn it into a regression
# test. New inputs the fuzzer finds go to $FUZZ_WORK/corpus/<target>/ (kept
# between runs, outside the clone), never into fuzz/seeds.
#
# Stable Rust, `--sanitizer none` (the code is safe Rust apart from the
# shared-memory layer; the fuzzer looks for panics, aborts, hangs and
# runaway allocations). With a nightly toolchain, AddressSanitizer:
#   FUZZ_TOOLCHAIN=nightly FUZZ_SANITIZER=address scripts/fuzz.sh
#
# The fuzz build links the RocksDB library the workspace build compiled
# (ROCKSDB_LIB_DIR) instead of compiling RocksDB's C++ again.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh

target=${CARGO_TARGET_DIR:-$PWD/target}
work=${FUZZ_WORK:-$target/fuzz-work}
seconds=${FUZZ_SECONDS:-6}
sanitizer=${FUZZ_SANITIZER:-none}
toolchain=()
if [[ -n "${FUZZ_TOOLCHAIN:-}" ]]; then
    toolchain=("+$FUZZ_TOOLCHAIN")
fi
targets=(request_area response_area segment_header admin_frame csr_file
    dataset_files edge_list config_file redis_value predict_request)
if [[ $# -ge 1 ]]; then
    targets=("$1")
    seconds=${2:-$seconds}
fi

find_rocksdb() {
    ls -t "$target"/release/build/librocksdb-sys-*/out/librocksdb.a 2>/dev/null | head -1
}
if [[ -z "$(find_rocksdb)" ]]; then
    echo "== building the workspace first (the fuzz build links its RocksDB)"
    CARGO_TARGET_DIR=$target cargo build --release --workspace --all-targets
fi
export ROCKSDB_LIB_DIR ROCKSDB_STATIC=1
ROCKSDB_LIB_DIR=$(dirname "$(find_rocksdb)")
export CARGO_TARGET_DIR=$target/fuzz

echo "== building the fuzz targets (sanitizer: $sanitizer)"
cargo "${toolchain[@]}" fuzz build --sanitizer "$sanitizer"

# The targets that decode files write them under the temp directory: one
# of this run's own, removed at the end.
scratch=$(mktemp -d -t gnn-fuzz-run.XXXXXX)
trap 'rm -rf "$scratch"' EXIT

failed=()
for t in "${targets[@]}"; do
    mkdir -p "$work/corpus/$t" "$work/artifacts/$t"
    echo "== fuzz $t for ${seconds} s"
    log="$work/$t.log"
    if TMPDIR=$scratch cargo "${toolchain[@]}" fuzz run --sanitizer "$sanitizer" "$t" \
        "$work/corpus/$t" "fuzz/seeds/$t" -- \
        -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
        -malloc_limit_mb=1024 -artifact_prefix="$work/artifacts/$t/" \
        -print_final_stats=1 >"$log" 2>&1; then
        grep -E '^stat::number_of_executed_units|^Done' "$log" | tr '\n' ' '
        echo
    else
        tail -40 "$log"
        failed+=("$t")
    fi
done
if [[ ${#failed[@]} -gt 0 ]]; then
    echo "fuzz: crashes in ${failed[*]}; inputs under $work/artifacts/" >&2
    exit 1
fi
echo "fuzz: ${#targets[@]} targets, no crash"
