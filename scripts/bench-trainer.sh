#!/usr/bin/env bash
# The trainer's time and peak memory (docs/model.md, "Training at scale"):
# full-graph on cora, citeseer and cora_ml (default epochs), mini-batch on
# generated power-law graphs of 100k and 1M nodes (D = 128, 4 classes, a
# fixed number of steps). Each line is the tool's own summary (training
# seconds, seconds in all, peak RSS). Graphs are generated into $WORK once.
#
#   scripts/bench-trainer.sh [--max-steps 100]
#
# Not part of the test suite: it takes minutes and wants a quiet machine.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export CARGO_TARGET_DIR=${CARGO_TARGET_DIR:-$PWD/target}
cargo build --release --workspace --all-targets
WORK=${WORK:-/tmp/gnn-bench-trainer}
STEPS=100
if [[ "${1:-}" == "--max-steps" ]]; then STEPS=$2; fi
mkdir -p "$WORK"
for name in cora citeseer cora_ml; do
    .venv/bin/python gnn-worker/model/sage.py train --dataset "../shared/data/$name" \
        --out "$WORK/model-$name" 2>/dev/null
done
for spec in 100k:100000:5000000 1m:1000000:50000000; do
    IFS=: read -r name nodes edges <<< "$spec"
    if [[ ! -f "$WORK/rmat-$name/labels.i32" ]]; then
        "$CARGO_TARGET_DIR/release/sidecar" generate --out "$WORK/rmat-$name" --nodes "$nodes" \
            --edges "$edges" --seed 1 --super-nodes 1 --super-degree $((nodes - 1)) \
            --feature-dim 128 --classes 4
    fi
    .venv/bin/python gnn-worker/model/sage.py train --dataset "$WORK/rmat-$name" \
        --out "$WORK/model-rmat-$name" --mode minibatch --max-steps "$STEPS" 2>/dev/null
done
