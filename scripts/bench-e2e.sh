#!/usr/bin/env bash
# The end-to-end benchmark (issue 12; README "End-to-end benchmark"): the
# product through gRPC and HTTP against the key-by-key JSON design, a
# FastAPI service, Feast, bare Redis and the machine's floors, in one run on
# the same data, the same Redis and the same request sequences. Writes
# bench/results/<date>/report.json, report.md and the plots.
#
#   scripts/bench-e2e.sh            # the full run (16 scenarios, 1M-node graph)
#   scripts/bench-e2e.sh --quick    # 4 scenarios, 100k-node graph, short steps
#   scripts/bench-e2e.sh --only cora/   # the scenarios whose name contains cora/
#   scripts/bench-e2e.sh --only cora/embedded/warm/f20x10/t1,rmat-1m/redis/warm/f20x10/t8
#                                   # several, separated by commas
#   scripts/bench-e2e.sh --only cora/ --baseline /tmp/prev/target/release
#                                   # another build's product beside this one's
#
# Installs what is missing first (scripts/setup.sh, then .venv-bench with
# bench/requirements.txt: FastAPI, uvicorn, redis-py, onnxruntime, Feast,
# matplotlib), and is safe to run again. Not part of the test suite: the
# numbers are ratios measured side by side, on a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}

requirements=bench/requirements.txt
stamp=.venv-bench/.requirements.sha256
want=$(sha256sum "$requirements" | cut -d' ' -f1)
if [ ! -x .venv-bench/bin/python ]; then
    echo "bench-e2e: creating the benchmark's Python venv in .venv-bench"
    "${PYTHON:-python3}" -m venv .venv-bench
fi
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    echo "bench-e2e: installing $requirements into .venv-bench"
    .venv-bench/bin/python -m pip install -q --no-cache-dir --upgrade pip
    .venv-bench/bin/python -m pip install -q --no-cache-dir -r "$requirements"
    echo "$want" >"$stamp"
fi

# The whole workspace, all targets: the same features as scripts/test.sh,
# so RocksDB's C++ is compiled once for both.
cargo build --release --workspace --all-targets
"$CARGO_TARGET_DIR/release/bench-e2e" --python .venv-bench/bin/python \
    --work-dir "$CARGO_TARGET_DIR/bench-e2e" "$@"
