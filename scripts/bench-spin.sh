#!/usr/bin/env bash
# What spinning buys and costs (docs/serving.md, "Spinning"): the same
# sidecar and worker on cora (embedded store, warm), both ends'
# ring_spin_us at each of SPINS in turn (auto: learned, the default; a
# number: fixed microseconds), at each of CONNS HTTP connections (wrk; 1:
# lone calls), each for SECONDS_EACH. Prints wrk's p50, p99 and calls/s,
# the CPU per call of the sidecar and of the worker (user + system, /proc),
# and the worker's own means (ring round trip, ONNX run) per configuration.
#
#   scripts/bench-spin.sh
#   SPINS="0 auto 1000" CONNS="1 16" SECONDS_EACH=5 scripts/bench-spin.sh
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
. scripts/lib/cora-stack.sh
seconds=${SECONDS_EACH:-8}
ticks=$(getconf CLK_TCK)
cpu() { awk '{print $14 + $15}' "/proc/$1/stat"; }
mean() { # metric name, scrape before, scrape after: the mean in us
    python3 - "$1" "$2" "$3" <<'PY'
import sys
def values(path):
    out = {}
    for line in open(path):
        if not line.startswith("#") and " " in line:
            key, value = line.rsplit(" ", 1)
            out[key] = float(value)
    return out
name, a, b = sys.argv[1], values(sys.argv[2]), values(sys.argv[3])
count = b.get(name + "_count", 0) - a.get(name + "_count", 0)
total = b.get(name + "_sum", 0) - a.get(name + "_sum", 0)
print(f"{1e6 * total / count:.0f}" if count else "-")
PY
}
for spin in ${SPINS:-0 50 auto 1000}; do
    for c in ${CONNS:-1 4 16}; do
        shm="bench-spin-$$"
        "$bin/sidecar" serve --data-dir "$work/data" --shm-name "$shm" --ring-spin-us "$spin" \
            --admin-socket "$work/admin.sock" 2> "$work/sidecar.log" &
        sidecar=$!
        "$bin/gnn-worker" serve --model "$work/model" --shm-name "$shm" --grpc 127.0.0.1:0 \
            --http 127.0.0.1:58191 --onnxruntime-lib "$ort" --ring-spin-us "$spin" \
            2> "$work/worker.log" &
        worker=$!
        for _ in $(seq 300); do curl -sf localhost:58191/readyz > /dev/null && break; sleep 0.2; done
        wrk -t1 -c1 -d2s -s "$work/post.lua" http://127.0.0.1:58191/v1/predict > /dev/null
        curl -s localhost:58191/metrics > "$work/before"
        s0=$(cpu "$sidecar"); w0=$(cpu "$worker")
        wrk -t1 -c"$c" -d"${seconds}s" --latency -s "$work/post.lua" \
            http://127.0.0.1:58191/v1/predict > "$work/wrk.out"
        s1=$(cpu "$sidecar"); w1=$(cpu "$worker")
        curl -s localhost:58191/metrics > "$work/after"
        calls=$(awk '/requests in/ {print $1}' "$work/wrk.out")
        printf 'ring_spin_us %4s, %2d connections: ' "$spin" "$c"
        awk '/ 50%/ {p50=$2} / 99%/ {p99=$2} /Requests\/sec/ {rps=$2} END {printf "p50 %s p99 %s calls/s %s", p50, p99, rps}' "$work/wrk.out"
        awk -v s="$((s1 - s0))" -v w="$((w1 - w0))" -v n="$calls" -v t="$ticks" \
            'BEGIN {printf ", CPU a call: sidecar %.0f us, worker %.0f us", s / t / n * 1e6, w / t / n * 1e6}'
        echo ", ring round trip $(mean gnn_worker_ring_wait_seconds "$work/before" "$work/after") us, ONNX $(mean gnn_worker_onnx_run_seconds "$work/before" "$work/after") us"
        kill "$worker"; wait "$worker" || true
        kill "$sidecar"; wait "$sidecar" || true
    done
done
