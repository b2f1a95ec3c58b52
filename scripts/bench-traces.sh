#!/usr/bin/env bash
# What traces cost (docs/operations.md, "Traces"): the same sidecar and
# worker on cora (embedded store, warm), with traces off, on at
# trace_sample_ratio 0.01 and on at 1, every span exported to a real OTLP
# receiver (target/release/otlp-receiver); lone HTTP calls (one
# connection) and 16 connections, each for --seconds, by wrk, in
# alternating rounds. Prints wrk's p50, p99 and calls/s per configuration.
#
#   scripts/bench-traces.sh              # 2 rounds of 10 s
#   ROUNDS=3 SECONDS_EACH=5 scripts/bench-traces.sh
#
# Installs what is missing first (scripts/setup.sh); safe to run again.
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
. scripts/lib/cora-stack.sh
rounds=${ROUNDS:-2}
seconds=${SECONDS_EACH:-10}
"$bin/otlp-receiver" 127.0.0.1:0 > "$work/receiver.log" &
for _ in $(seq 50); do grep -q listening "$work/receiver.log" && break; sleep 0.1; done
endpoint=$(awk '/listening/ {print $2}' "$work/receiver.log")

one() { # label, arguments of both daemons, the worker's own
    local shm="bench-traces-$$"
    "$bin/sidecar" serve --data-dir "$work/data" --shm-name "$shm" \
        --admin-socket "$work/admin.sock" $2 2> "$work/sidecar.log" &
    local sidecar=$!
    "$bin/gnn-worker" serve --model "$work/model" --shm-name "$shm" --grpc 127.0.0.1:0 \
        --http 127.0.0.1:58181 --onnxruntime-lib "$ort" $2 $3 2> "$work/worker.log" &
    local worker=$!
    for _ in $(seq 300); do curl -sf localhost:58181/readyz > /dev/null && break; sleep 0.2; done
    wrk -t1 -c1 -d3s -s "$work/post.lua" http://127.0.0.1:58181/v1/predict > /dev/null
    for c in 1 16; do
        printf '%-14s %2d connections: ' "$1" "$c"
        wrk -t$((c > 1 ? 2 : 1)) -c"$c" -d"${seconds}s" --latency -s "$work/post.lua" \
            http://127.0.0.1:58181/v1/predict |
            awk '/ 50%/ {p50=$2} / 99%/ {p99=$2} /Requests\/sec/ {rps=$2} END {print "p50", p50, "p99", p99, "calls/s", rps}'
    done
    kill "$worker"; wait "$worker" || true
    kill "$sidecar"; wait "$sidecar" || true
}
for round in $(seq "$rounds"); do
    echo "round $round"
    one off "" ""
    one "ratio 0.01" "--otlp-endpoint $endpoint" "--trace-sample-ratio 0.01"
    one "ratio 1" "--otlp-endpoint $endpoint" "--trace-sample-ratio 1"
done
echo "spans received: $(tail -1 "$work/receiver.log" | awk '{print $2}')"
