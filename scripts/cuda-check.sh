#!/usr/bin/env bash
# The CUDA path end to end on a GPU machine (docs/serving.md, "The CUDA
# rule"): cora imported, one sidecar, and two workers on the same model
# and ring, one `--device cuda`, one `--device cpu`, both loading the GPU
# build of ONNX Runtime; the same nodes through both; labels and the
# largest logit difference compared; lone-call latency and the mean ONNX
# run of each; the Open Inference Protocol answered on the GPU.
#
#   scripts/cuda-check.sh --onnxruntime-lib /path/to/onnxruntime/capi/libonnxruntime.so.1.31.1
#
# The library is onnxruntime-gpu 1.31.1's (its wheel's onnxruntime/capi/
# holds it with libonnxruntime_providers_cuda.so and
# libonnxruntime_providers_shared.so); the CUDA 13 and cuDNN 9 libraries
# it loads must be on LD_LIBRARY_PATH (PyTorch's nvidia/*/lib directories
# have them). Exits 1 when a label differs or a logit differs by more than
# 1e-5. Uses the binaries of target/release (or CARGO_TARGET_DIR) and the
# dense model in MODEL (a directory), else one sage.py trains on cora for
# the run (PyTorch: a Python with torch and onnx, PYTHON or .venv). Not part
# of the test suite: CI has no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
lib=
while [ $# -gt 0 ]; do
    case $1 in
        --onnxruntime-lib) lib=$2; shift 2 ;;
        *) echo "cuda-check: unknown argument $1 (give --onnxruntime-lib PATH)" >&2; exit 2 ;;
    esac
done
[ -n "$lib" ] && [ -f "$lib" ] || {
    echo "cuda-check: give --onnxruntime-lib, the GPU build's libonnxruntime.so.1.31.1" >&2
    exit 2
}
bin=${CARGO_TARGET_DIR:-$PWD/target}/release
for b in sidecar gnn-worker; do
    [ -x "$bin/$b" ] || { echo "cuda-check: $bin/$b is missing: cargo build --release --workspace" >&2; exit 2; }
done
python=${PYTHON:-.venv/bin/python}
[ -x "$python" ] || python=python3
work=$(mktemp -d)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; rm -rf "$work"; }
trap cleanup EXIT
tar -xzf demo/data/cora.tar.gz -C "$work"
model=${MODEL:-$work/model}
if [ ! -f "$model/manifest.json" ]; then
    "$python" -c 'import torch, onnx' 2>/dev/null || {
        echo "cuda-check: $python has no torch and onnx to train the model (sage.py is PyTorch):" \
            "give MODEL, a directory sage.py train wrote on another machine, or PYTHON, one with them" >&2
        exit 2
    }
    echo "cuda-check: training cora's GraphSAGE into $model (sage.py train)"
    "$python" gnn-worker/model/sage.py train --dataset "$work/cora" --out "$model" \
        > "$work/train.log" 2>&1 || { tail -20 "$work/train.log" >&2; exit 1; }
fi
"$bin/sidecar" import "$work/cora" --data-dir "$work/data" > "$work/import.log" 2>&1 \
    || { tail -20 "$work/import.log" >&2; exit 1; }
"$bin/sidecar" serve --data-dir "$work/data" --shm-name cuda-check \
    --admin-socket "$work/admin.sock" > "$work/sidecar.log" 2>&1 &
pids+=($!)
serve() { # device http-port grpc-port
    "$bin/gnn-worker" serve --model "$model" --model-name cora-sage --shm-name cuda-check \
        --grpc "127.0.0.1:$3" --http "127.0.0.1:$2" --device "$1" --onnxruntime-lib "$lib" \
        > "$work/worker-$1.log" 2>&1 &
    pids+=($!)
    for _ in $(seq 240); do
        curl -sf "127.0.0.1:$2/readyz" > /dev/null && return 0
        sleep 0.5
    done
    echo "cuda-check: the $1 worker did not become ready:" >&2
    tail -20 "$work/worker-$1.log" >&2
    return 1
}
serve cuda 18080 15051
serve cpu 18081 15052
"$python" - <<'PY'
import json, sys, time, urllib.request

def call(port, path, body):
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                     headers={"content-type": "application/json"})
    return json.load(urllib.request.urlopen(request))

ids = list(range(0, 2708, 7))
worst, same = 0.0, 0
for chunk in [ids[i:i + 64] for i in range(0, len(ids), 64)]:
    gpu = call(18080, "/v1/predict", {"node_ids": chunk})["predictions"]
    cpu = call(18081, "/v1/predict", {"node_ids": chunk})["predictions"]
    for a, b in zip(gpu, cpu):
        same += a["label"] == b["label"]
        worst = max(worst, max(abs(x - y) for x, y in zip(a["logits"], b["logits"])))
print(f"cuda vs cpu: {len(ids)} nodes, labels equal {same}/{len(ids)}, "
      f"largest logit difference {worst:.3e}")
v2 = call(18080, "/v2/models/cora-sage/infer",
          {"inputs": [{"name": "node_ids", "datatype": "INT64", "shape": [3], "data": [0, 1, 2]}]})
print("the Open Inference Protocol on cuda: labels", v2["outputs"][0]["data"])
for port, name in [(18080, "cuda"), (18081, "cpu")]:
    for i in range(50):
        call(port, "/v1/predict", {"node_ids": [i]})
    lat = []
    for i in range(400):
        t = time.perf_counter()
        call(port, "/v1/predict", {"node_ids": [i % 2708]})
        lat.append(time.perf_counter() - t)
    lat.sort()
    metrics = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics").read().decode()
    value = lambda n: float(next(l.split()[-1] for l in metrics.splitlines() if l.startswith(n + " ")))
    run = value("gnn_worker_onnx_run_seconds_sum") / value("gnn_worker_onnx_run_seconds_count")
    print(f"{name}: lone HTTP call p50 {lat[200] * 1e6:.0f} us, p99 {lat[396] * 1e6:.0f} us; "
          f"ONNX run mean {run * 1e6:.0f} us")
sys.exit(0 if same == len(ids) and worst <= 1e-5 else 1)
PY
