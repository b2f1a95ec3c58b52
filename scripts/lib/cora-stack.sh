# Sourced by the scripts that measure one sidecar and worker on cora under
# wrk (bench-traces.sh, bench-spin.sh), from the repository root, after
# scripts/setup.sh and the workspace build. Sets `bin`, `work` (a temp
# directory removed on exit, with every background job), `ort` (ONNX
# Runtime's library), and leaves in `$work`: cora's dataset (`cora/`), its
# import (`data/`), a model trained on it (`model/`) and wrk's one-node
# POST body (`post.lua`).
bin=$CARGO_TARGET_DIR/release
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
ort=$(.venv/bin/python -c 'import onnxruntime, os; print(os.path.join(os.path.dirname(onnxruntime.__file__), "capi", "libonnxruntime.so.1.31.1"))')
mkdir -p "$work/cora" && tar -xzf demo/data/cora.tar.gz -C "$work/cora" --strip-components=1
"$bin/sidecar" import "$work/cora" --data-dir "$work/data" > /dev/null 2>&1
.venv/bin/python gnn-worker/model/sage.py train --dataset "$work/cora" --out "$work/model" > /dev/null 2>&1
cat > "$work/post.lua" <<'LUA'
wrk.method = "POST"
wrk.body   = '{"node_ids": [1]}'
wrk.headers["Content-Type"] = "application/json"
LUA
