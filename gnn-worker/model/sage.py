#!/usr/bin/env python3
"""Model tooling for gnn-worker: train a 2-layer GraphSAGE (mean aggregator)
with numpy, export it to ONNX with a pinned opset and a manifest, and write
reference outputs.

    python gnn-worker/model/sage.py train --dataset ../shared/data/cora --out models/cora
    python gnn-worker/model/sage.py init --feature-dim 128 --classes 16 --out models/bench
    python gnn-worker/model/sage.py quantize --model models/cora --dataset ../shared/data/cora \
        --out models/cora-int8
    python gnn-worker/model/sage.py distill --teacher models/cora --dataset ../shared/data/cora \
        --out models/cora/student
    python gnn-worker/model/sage.py import-pyg --weights model.safetensors \
        --dataset ../shared/data/cora --out models/pyg

writes into --out:
  model.onnx          the model; its inputs are the sidecar's response tables
                      as they are (see docs/model.md)
  manifest.json       feature dim, fanouts, graph version, opset, input and
                      output names, classes, offline accuracy
  reference/logits.f32        offline (full-neighbourhood) logits, N x C, f32 LE
  reference/inputs.json       + reference/*.bin: a batch of model inputs
                      built in Python for the first test nodes, with every
                      neighbour, and reference/ort_logits.f32: what the
                      onnxruntime Python package computes on them

`quantize` writes a dynamically quantized (INT8 weights) copy of a trained
model with the same inputs and a manifest that records it and both
accuracies; `distill` trains an MLP student on the teacher's soft labels
(the target's own features only) and exports it with its own manifest
(inputs `features`, `target_row`). Both measure accuracy and onnxruntime's
speed against the model they come from (docs/strategies.md).

The offline model is full-graph GraphSAGE: h = relu(x W1s + mean_nbr(x) W1n
+ b1), logits = h W2s + mean_nbr(h) W2n + b2, on row-normalised features
(a row is divided by its sum inside the model, so the store keeps the raw
rows). With fanouts that cover every neighbour, the served computation is
exactly this one.
"""
import argparse
import json
import os
import sys
import time

import numpy as np

OPSET = 17
INPUTS = ["features", "target_row", "hop1_count", "hop1_rows", "hop2_count", "hop2_rows"]
OUTPUT = "logits"
# The GNN's second output: the targets' layer-1 embedding (what `gnn-worker
# precompute` stores beside the logits).
H1_OUTPUT = "h1"
# The GNN's seventh input: the stored layer-1 embedding of each hop-1 slot
# the sidecar sent without hop-2 neighbours (hop2_count -1, request flag
# HUB_H1); [1, 1, hidden] when there is none.
HUB_INPUT = "hop1_h1"
GNN_INPUTS = INPUTS + [HUB_INPUT]


def load_dataset(path):
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    n, d = meta["num_nodes"], meta["feature_dim"]
    for name in ("labels.i32", "split.u8"):
        if not os.path.exists(os.path.join(path, name)):
            sys.exit(f"{path} has no {name}: training needs labels and a split (`sidecar generate "
                     "--classes K` writes them for a synthetic graph; `sage.py init` exports an "
                     "untrained model without them)")
    x = np.fromfile(os.path.join(path, "features.f32"), dtype="<f4").reshape(n, d)
    edges = np.fromfile(os.path.join(path, "edges.u32"), dtype="<u4").reshape(-1, 2)
    labels = np.fromfile(os.path.join(path, "labels.i32"), dtype="<i4")
    split = np.fromfile(os.path.join(path, "split.u8"), dtype="u1")
    if len(labels) != n or len(split) != n or len(edges) != meta["num_edges"]:
        sys.exit(f"{path}: file sizes disagree with meta.json")
    return meta, x, edges, labels, split


def csr(n, edges):
    """Neighbour lists in the order the sidecar's CSR keeps them (sorted,
    deduplicated, no self loops)."""
    keep = edges[:, 0] != edges[:, 1]
    # One int64 key per edge (src * n + dst): a 1-d sort, not a row sort.
    keys = np.unique(edges[keep, 0].astype(np.int64) * n + edges[keep, 1])
    src, dst = np.divmod(keys, n)
    del keys
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst


class MeanAggregator:
    """The mean over each node's neighbours as an operator on the CSR:
    `agg(x)` is A @ x and `agg.t(g)` is A.T @ g, with A the adjacency whose
    row v holds 1/deg(v) at v's neighbours (0 for a node without any).
    Rows are gathered a block of nodes at a time (at most BLOCK_EDGES
    edges), so memory is O(E + N x width): never N x N."""

    BLOCK_EDGES = 1 << 18

    def __init__(self, n, indptr, indices):
        self.n = n
        self.indptr, self.indices = indptr, indices
        degree = np.diff(indptr)
        self.inv = (1.0 / np.maximum(degree, 1)).astype(np.float32)
        # The transpose: for each node u, the edges v -> u, weighted 1/deg(v).
        order = np.argsort(indices, kind="stable")
        src = np.repeat(np.arange(n, dtype=np.int64), degree)[order]
        self.t_indices = src
        self.t_weight = self.inv[src]
        self.t_indptr = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(np.bincount(indices, minlength=n), out=self.t_indptr[1:])

    def __call__(self, x):
        return self._sums(x, self.indptr, self.indices, None) * self.inv[:, None]

    def t(self, g):
        return self._sums(g, self.t_indptr, self.t_indices, self.t_weight)

    def _sums(self, x, indptr, indices, weight):
        out = np.zeros((self.n, x.shape[1]), np.float32)
        lo = 0
        while lo < self.n:
            hi = int(np.searchsorted(indptr, indptr[lo] + self.BLOCK_EDGES, side="right")) - 1
            hi = min(max(hi, lo + 1), self.n)
            a, b = indptr[lo], indptr[hi]
            if b > a:
                vals = x[indices[a:b]]
                if weight is not None:
                    vals *= weight[a:b, None]
                nonempty = np.diff(indptr[lo:hi + 1]) > 0
                out[lo:hi][nonempty] = np.add.reduceat(vals, indptr[lo:hi][nonempty] - a, axis=0)
            lo = hi
        return out


def normalise(x):
    return x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)


def layer1(params, xn, agg):
    """h(v) for every node: the layer-1 embedding (`agg`: a
    MeanAggregator)."""
    w1s, w1n, b1 = params[:3]
    return np.maximum(xn @ w1s + agg(xn @ w1n) + b1, 0.0)


def layer2(params, h, agg):
    """The logits of every node from every node's layer-1 embedding."""
    w2s, w2n, b2 = params[3:]
    return h @ w2s + agg(h @ w2n) + b2


def forward(params, xn, agg):
    return layer2(params, layer1(params, xn, agg), agg)


def glorot(rng, fan_in, fan_out):
    """Glorot-uniform weights, f32."""
    s = np.sqrt(6.0 / (fan_in + fan_out))
    return rng.uniform(-s, s, size=(fan_in, fan_out)).astype(np.float32)


def adam_step(params, grads, decay, m, v, lr, epoch):
    """One Adam update (betas 0.9, 0.999) in place, with L2 weight decay
    `decay[i]` on parameter i."""
    for i, (param, grad) in enumerate(zip(params, grads)):
        grad = grad + decay[i] * param
        m[i] = 0.9 * m[i] + 0.1 * grad
        v[i] = 0.999 * v[i] + 0.001 * grad * grad
        mhat = m[i] / (1 - 0.9 ** epoch)
        vhat = v[i] / (1 - 0.999 ** epoch)
        params[i] = (param - lr * mhat / (np.sqrt(vhat) + 1e-8)).astype(np.float32)


def init_params(rng, d, hidden, num_classes):
    return [glorot(rng, d, hidden), glorot(rng, d, hidden), np.zeros(hidden, np.float32),
            glorot(rng, hidden, num_classes), glorot(rng, hidden, num_classes),
            np.zeros(num_classes, np.float32)]


def start_training(rng, d, hidden, num_classes, weight_decay, split):
    """Glorot parameters, their weight decay (first layer only), Adam's
    moments, and the training and validation nodes."""
    params = init_params(rng, d, hidden, num_classes)
    decay = [weight_decay, weight_decay, 0.0, 0.0, 0.0, 0.0]
    moments = ([np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params])
    return params, decay, moments, np.flatnonzero(split == 0), np.flatnonzero(split == 1)


_last_progress = [0.0]


def progress(text, last=False):
    """One line of progress on stderr, rewritten in place at most twice a
    second (and with `last`, always, ending the line)."""
    now = time.time()
    if last or now - _last_progress[0] >= 0.5:
        _last_progress[0] = now
        sys.stderr.write("\r" + text + ("\n" if last else ""))
        sys.stderr.flush()


def train_full(x, agg, labels, split, num_classes, hidden, epochs, lr, weight_decay, dropout,
               seed):
    """Full-graph training (every node, every neighbour, each epoch), the
    aggregation a sparse operator on the CSR. Returns (best validation
    accuracy, its parameters, its epoch)."""
    rng = np.random.default_rng(seed)
    n, d = x.shape
    xn = normalise(x).astype(np.float32)
    params, decay, (m, v), train_idx, val_idx = start_training(rng, d, hidden, num_classes,
                                                               weight_decay, split)
    onehot = np.eye(num_classes, dtype=np.float32)[labels[train_idx]]
    keep = 1.0 - dropout
    best = (-1.0, None, 0)
    for epoch in range(1, epochs + 1):
        w1s, w1n, b1, w2s, w2n, b2 = params
        mask0 = (rng.random(xn.shape) < keep).astype(np.float32) / keep
        xd = xn * mask0
        z1 = xd @ w1s + agg(xd @ w1n) + b1
        h = np.maximum(z1, 0.0)
        mask1 = (rng.random(h.shape) < keep).astype(np.float32) / keep
        hd = h * mask1
        z2 = hd @ w2s + agg(hd @ w2n) + b2
        logits = z2[train_idx]
        p = np.exp(logits - logits.max(axis=1, keepdims=True))
        p /= p.sum(axis=1, keepdims=True)
        dz2 = np.zeros_like(z2)
        dz2[train_idx] = (p - onehot) / len(train_idx)
        at_dz2 = agg.t(dz2)
        g_w2s = hd.T @ dz2
        g_w2n = hd.T @ at_dz2
        g_b2 = dz2.sum(axis=0)
        dh = (dz2 @ w2s.T + at_dz2 @ w2n.T) * mask1 * (z1 > 0)
        g_w1s = xd.T @ dh
        g_w1n = xd.T @ agg.t(dh)
        g_b1 = dh.sum(axis=0)
        grads = [g_w1s, g_w1n, g_b1, g_w2s, g_w2n, g_b2]
        adam_step(params, grads, decay, m, v, lr, epoch)
        val = accuracy(forward(params, xn, agg), labels, val_idx)
        if val > best[0]:
            best = (val, [p.copy() for p in params], epoch)
        progress(f"full-graph training: epoch {epoch}/{epochs}, validation {val * 100:.1f}% "
                 f"(best {best[0] * 100:.1f}%)", last=epoch == epochs)
    return best


def sample_neighbours(indptr, indices, rng):
    """`sample(v, f)`: up to f of v's neighbours, uniformly without
    replacement (the sidecar's rule; O(f) for a node of any degree)."""
    def sample(v, f):
        lo, hi = indptr[v], indptr[v + 1]
        if hi - lo <= f:
            return indices[lo:hi]
        return indices[lo + rng.choice(hi - lo, size=f, replace=False)]
    return sample


def masked_mean(values, counts, width):
    """Mean over axis -2 of `values` (..., width, H) of the first `counts`
    entries (0 where a count is 0), and the weights used: (mean, w) with w
    (..., width) = 1/count at kept positions."""
    keep = (np.arange(width) < counts[..., None]).astype(np.float32)
    w = keep / np.maximum(counts, 1)[..., None].astype(np.float32)
    return (values * w[..., None]).sum(axis=-2), w


def train_minibatch(x, indptr, indices, labels, split, num_classes, hidden, epochs, lr,
                    weight_decay, dropout, seed, batch, fanouts, max_steps, agg):
    """Neighbour-sampled mini-batch training (GraphSAGE's): each step
    samples a batch of training nodes' 2-hop neighbourhoods at `fanouts`,
    laid out as the sidecar lays out a response, and runs the served
    computation and its gradient on them; memory per step is the batch's,
    O(batch x f1 x f2 x hidden). Validation (full-graph, sparse) after
    each epoch and at the end. Returns (best validation accuracy, its
    parameters, its epoch)."""
    rng = np.random.default_rng(seed)
    n, d = x.shape
    params, decay, (m, v), train_idx, val_idx = start_training(rng, d, hidden, num_classes,
                                                               weight_decay, split)
    f1, f2 = fanouts
    sample = sample_neighbours(indptr, indices, rng)
    keep = 1.0 - dropout
    steps_per_epoch = max(1, -(-len(train_idx) // batch))
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    best = (-1.0, None, 0)
    step, epoch = 0, 0
    started = time.time()

    def validate():
        xn = normalise(x).astype(np.float32)
        return accuracy(forward(params, xn, agg), labels, val_idx)

    while step < total:
        epoch += 1
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch):
            if step >= total:
                break
            step += 1
            targets = order[start:start + batch]
            feeds = response_inputs(x, targets, sample, (f1, f2))
            grads = minibatch_gradients(params, feeds, labels[targets], num_classes, keep, rng)
            adam_step(params, grads, decay, m, v, lr, step)
            progress(f"mini-batch training: step {step}/{total} (epoch {epoch}), "
                     f"{step / max(time.time() - started, 1e-9):.1f} steps/s", last=step == total)
        if step < total:
            val = validate()
            if val > best[0]:
                best = (val, [p.copy() for p in params], epoch)
    val = validate()
    if val > best[0]:
        best = (val, [p.copy() for p in params], epoch)
    return best


def minibatch_gradients(params, feeds, labels, num_classes, keep, rng):
    """The gradients of the mean cross-entropy of a batch laid out as a
    response (`feeds`), through the served computation (docs/model.md)
    with dropout on the inputs and the hidden layer."""
    w1s, w1n, b1, w2s, w2n, b2 = params
    x = normalise(feeds["features"]).astype(np.float32)
    xd = x * ((rng.random(x.shape) < keep).astype(np.float32) / keep)
    tr, c1, r1 = feeds["target_row"], feeds["hop1_count"], feeds["hop1_rows"]
    c2, r2 = feeds["hop2_count"], feeds["hop2_rows"]
    f1, f2 = r2.shape[1], r2.shape[2]
    ps, pn = xd @ w1s, xd @ w1n
    agg_t, w1 = masked_mean(pn[r1], c1, f1)
    agg_1, w2 = masked_mean(pn[r2], c2, f2)
    z_t = ps[tr] + agg_t + b1
    z_1 = ps[r1] + agg_1 + b1
    mask_t = (rng.random(z_t.shape) < keep).astype(np.float32) / keep
    mask_1 = (rng.random(z_1.shape) < keep).astype(np.float32) / keep
    h_t = np.maximum(z_t, 0.0) * mask_t
    h_1 = np.maximum(z_1, 0.0) * mask_1
    agg_h, _ = masked_mean(h_1, c1, f1)
    z2 = h_t @ w2s + agg_h @ w2n + b2
    p = np.exp(z2 - z2.max(axis=1, keepdims=True))
    p /= p.sum(axis=1, keepdims=True)
    dz2 = (p - np.eye(num_classes, dtype=np.float32)[labels]) / len(labels)
    g_w2s, g_w2n, g_b2 = h_t.T @ dz2, agg_h.T @ dz2, dz2.sum(axis=0)
    dz_t = (dz2 @ w2s.T) * mask_t * (z_t > 0)
    dz_1 = (dz2 @ w2n.T)[:, None, :] * w1[..., None] * mask_1 * (z_1 > 0)
    hidden = w1s.shape[1]
    dps = np.zeros((len(x), hidden), np.float32)
    dpn = np.zeros((len(x), hidden), np.float32)
    scatter_add(dps, tr, dz_t)
    scatter_add(dps, r1.reshape(-1), dz_1.reshape(-1, hidden))
    scatter_add(dpn, r1.reshape(-1), (dz_t[:, None, :] * w1[..., None]).reshape(-1, hidden))
    scatter_add(dpn, r2.reshape(-1), (dz_1[:, :, None, :] * w2[..., None]).reshape(-1, hidden))
    g_b1 = dz_t.sum(axis=0) + dz_1.sum(axis=(0, 1))
    return [xd.T @ dps, xd.T @ dpn, g_b1, g_w2s, g_w2n, g_b2]


def scatter_add(out, rows, values):
    """out[rows[i]] += values[i] for every i (rows may repeat): sorted and
    summed per row, far faster than np.add.at."""
    order = np.argsort(rows, kind="stable")
    sorted_rows = rows[order]
    starts = np.flatnonzero(np.r_[True, sorted_rows[1:] != sorted_rows[:-1]])
    out[sorted_rows[starts]] += np.add.reduceat(values[order], starts, axis=0)


def layout_logits(params, feeds, row_normalise=True):
    """The served computation (docs/model.md) in numpy on inputs laid out
    as a response, stored hub embeddings included: what the ONNX graph
    must compute on them."""
    w1s, w1n, b1, w2s, w2n, b2 = params
    x = feeds["features"].astype(np.float32)
    if row_normalise:
        x = normalise(x).astype(np.float32)
    tr, c1, r1 = feeds["target_row"], feeds["hop1_count"], feeds["hop1_rows"]
    c2, r2 = feeds["hop2_count"], feeds["hop2_rows"]
    f1, f2 = r2.shape[1], r2.shape[2]
    ps, pn = x @ w1s, x @ w1n
    h_t = np.maximum(ps[tr] + masked_mean(pn[r1], c1, f1)[0] + b1, 0.0)
    h_1 = np.maximum(ps[r1] + masked_mean(pn[r2], c2, f2)[0] + b1, 0.0)
    if HUB_INPUT in feeds:
        h_1 = np.where((c2 < 0)[..., None], feeds[HUB_INPUT], h_1)
    return h_t @ w2s + masked_mean(h_1, c1, f1)[0] @ w2n + b2


def peak_rss_mib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def accuracy(logits, labels, idx):
    return float((logits[idx].argmax(axis=1) == labels[idx]).mean()) if len(idx) else 0.0


def build_onnx(params, feature_dim, num_classes, row_normalise=True):
    from onnx import TensorProto, helper, numpy_helper

    w1s, w1n, b1, w2s, w2n, b2 = params
    inits = [numpy_helper.from_array(arr, name) for arr, name in [
        (w1s, "w1_self"), (w1n, "w1_neigh"), (b1, "b1"),
        (w2s, "w2_self"), (w2n, "w2_neigh"), (b2, "b2"),
        (np.array([1], np.int64), "axis1"), (np.array([2], np.int64), "axis2"), (np.array([3], np.int64), "axis3"),
        (np.array(1.0, np.float32), "one_f"), (np.array(0, np.int32), "zero_i"),
        (np.array(1, np.int32), "one_i"),
    ]]
    nodes = []

    def op(kind, inputs, output, **attrs):
        nodes.append(helper.make_node(kind, inputs, [output], **attrs))
        return output

    # Row-normalised features, projected once per node-table row: gathering
    # hidden-size rows instead of feature rows keeps the work per neighbour
    # small (mean and projection commute).
    if row_normalise:
        rowsum = op("ReduceSum", ["features", "axis1"], "rowsum", keepdims=1)
        xn = op("Div", ["features", op("Max", [rowsum, "one_f"], "rowsum1")], "xn")
    else:
        xn = "features"
    p_self = op("MatMul", [xn, "w1_self"], "p_self")
    p_neigh = op("MatMul", [xn, "w1_neigh"], "p_neigh")

    def mask(counts, rows, axis, name):
        # 1.0 where the list position is below the count, else 0.0 (the
        # padding holds a valid row index; it is multiplied away here).
        shape = op("Shape", [rows], f"{name}_shape")
        width = op("Cast", [op("Gather", [shape, "axis" + str(axis)], f"{name}_width64", axis=0)],
                   f"{name}_width", to=TensorProto.INT32)
        width = op("Squeeze", [width], f"{name}_width_s")
        positions = op("Range", ["zero_i", width, "one_i"], f"{name}_positions")
        below = op("Less", [positions, op("Unsqueeze", [counts, "axis" + str(axis)], f"{name}_cu")],
                   f"{name}_below")
        return op("Cast", [below], f"{name}_mask", to=TensorProto.FLOAT)

    def masked_mean(values, mask_, counts, axis, name):
        weighted = op("Mul", [values, op("Unsqueeze", [mask_, "axis" + str(axis + 1)], f"{name}_mu")],
                      f"{name}_weighted")
        total = op("ReduceSum", [weighted, "axis" + str(axis)], f"{name}_sum", keepdims=0)
        denom = op("Max", [op("Cast", [counts], f"{name}_cf", to=TensorProto.FLOAT), "one_f"],
                   f"{name}_denom")
        return op("Div", [total, op("Unsqueeze", [denom, "axis" + str(axis)], f"{name}_du")],
                  f"{name}_mean")

    m1 = mask("hop1_count", "hop1_rows", 1, "m1")
    m2 = mask("hop2_count", "hop2_rows", 2, "m2")
    # Layer 1 at the targets and at their hop-1 neighbours.
    agg_t = masked_mean(op("Gather", [p_neigh, "hop1_rows"], "g_h1n", axis=0), m1, "hop1_count", 1, "agg_t")
    agg_1 = masked_mean(op("Gather", [p_neigh, "hop2_rows"], "g_h2n", axis=0), m2, "hop2_count", 2, "agg_1")
    h_t = op("Relu", [op("Add", [op("Add", [op("Gather", [p_self, "target_row"], "g_ts", axis=0), agg_t],
                                    "z_t0"), "b1"], "z_t")], "h_t")
    h_1 = op("Relu", [op("Add", [op("Add", [op("Gather", [p_self, "hop1_rows"], "g_1s", axis=0), agg_1],
                                    "z_10"), "b1"], "z_1")], "h_1")
    # A hop-1 slot sent without hop-2 neighbours (hop2_count -1: a hub whose
    # stored layer-1 embedding stands) takes it from hop1_h1 instead.
    cached = op("Unsqueeze", [op("Less", ["hop2_count", "zero_i"], "hub_less"), "axis2"], "hub_cached")
    h_1 = op("Where", [cached, HUB_INPUT, h_1], "h_1_hub")
    # Layer 2 at the targets.
    agg_h = masked_mean(h_1, m1, "hop1_count", 1, "agg_h")
    out = op("Add", [op("MatMul", [h_t, "w2_self"], "o_self"), op("MatMul", [agg_h, "w2_neigh"], "o_neigh")],
             "o_sum")
    op("Add", [out, "b2"], OUTPUT)
    op("Identity", [h_t], H1_OUTPUT)

    i32, f32 = TensorProto.INT32, TensorProto.FLOAT
    inputs = [
        helper.make_tensor_value_info("features", f32, ["n_nodes", feature_dim]),
        helper.make_tensor_value_info("target_row", i32, ["n_targets"]),
        helper.make_tensor_value_info("hop1_count", i32, ["n_targets"]),
        helper.make_tensor_value_info("hop1_rows", i32, ["n_targets", "f1"]),
        helper.make_tensor_value_info("hop2_count", i32, ["n_targets", "f1"]),
        helper.make_tensor_value_info("hop2_rows", i32, ["n_targets", "f1", "f2"]),
        # [n_targets, f1, hidden], or [1, 1, hidden] (broadcast) when no slot
        # is cached.
        helper.make_tensor_value_info(HUB_INPUT, f32, ["hub_targets", "hub_f1", w1s.shape[1]]),
    ]
    hidden = w1s.shape[1]
    return onnx_model(nodes, "graphsage_mean_2layer", inputs, num_classes, inits,
                      "gnn-worker/model/sage.py", hidden=hidden)


def onnx_model(nodes, name, inputs, num_classes, inits, producer, hidden=None):
    """The checked model of `nodes` (opset OPSET, IR 8) with the output
    `logits`, f32 [n_targets, num_classes], and with `hidden`, the second
    output `h1`, f32 [n_targets, hidden]."""
    import onnx
    from onnx import TensorProto, helper

    outputs = [helper.make_tensor_value_info(OUTPUT, TensorProto.FLOAT, ["n_targets", num_classes])]
    if hidden is not None:
        outputs.append(helper.make_tensor_value_info(H1_OUTPUT, TensorProto.FLOAT,
                                                     ["n_targets", hidden]))
    graph = helper.make_graph(nodes, name, inputs, outputs, inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name=producer)
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def response_inputs(x, targets, neighbours, fanouts, hubs=None):
    """Model inputs for `targets` laid out exactly as the sidecar lays out
    a response at `fanouts` (targets first, rows deduplicated, padding =
    the target's own row, hop2_count padded with 0); `neighbours(v, f)`
    gives the neighbours of v kept for a hop of fanout f. With `hubs` =
    (is_hub, h1), a hop-1 node u with is_hub(u) goes without hop-2
    neighbours (hop2_count -1) and `hop1_h1` holds h1[u] in its slot, as a
    HUB_H1 response is served."""
    f1, f2 = fanouts
    hop1_h1 = None if hubs is None else np.zeros((len(targets), f1, hubs[1].shape[1]), np.float32)
    rows, nodes = {}, []

    def row_of(v):
        if v not in rows:
            rows[v] = len(nodes)
            nodes.append(v)
        return rows[v]

    target_row = [row_of(int(t)) for t in targets]
    t_n = len(targets)
    hop1_count = np.zeros(t_n, np.int32)
    hop1_rows = np.zeros((t_n, f1), np.int32)
    hop2_count = np.zeros((t_n, f1), np.int32)
    hop2_rows = np.zeros((t_n, f1, f2), np.int32)
    for i, t in enumerate(targets):
        hop1_rows[i, :] = target_row[i]
        hop2_rows[i, :, :] = target_row[i]
        hop1 = neighbours(int(t), f1)
        hop1_count[i] = len(hop1)
        for j, u in enumerate(hop1):
            hop1_rows[i, j] = row_of(int(u))
            if hubs is not None and hubs[0](int(u)):
                hop2_count[i, j] = -1
                hop1_h1[i, j] = hubs[1][int(u)]
                continue
            hop2 = neighbours(int(u), f2)
            hop2_count[i, j] = len(hop2)
            for k, w in enumerate(hop2):
                hop2_rows[i, j, k] = row_of(int(w))
    feeds = {
        "features": x[np.array(nodes)].astype(np.float32),
        "target_row": np.array(target_row, np.int32),
        "hop1_count": hop1_count, "hop1_rows": hop1_rows,
        "hop2_count": hop2_count, "hop2_rows": hop2_rows,
    }
    if hop1_h1 is not None:
        feeds[HUB_INPUT] = hop1_h1
    return feeds


def session_feeds(session, feeds):
    """The entries of `feeds` that `session` takes, with `hop1_h1` (no
    cached slot: [1, 1, hidden] zeros) when it takes one and `feeds` has
    none."""
    wanted = {i.name: i for i in session.get_inputs()}
    out = {k: v for k, v in feeds.items() if k in wanted}
    if HUB_INPUT in wanted and HUB_INPUT not in out:
        out[HUB_INPUT] = np.zeros((1, 1, wanted[HUB_INPUT].shape[2]), np.float32)
    return out


def full_inputs(x, indptr, indices, targets, hubs=None):
    """Model inputs for `targets` with every neighbour: fanouts just wide
    enough for the widest neighbour list among them (`hubs`: as
    response_inputs)."""
    degree = indptr[1:] - indptr[:-1]
    f1 = max(1, max(int(degree[t]) for t in targets))
    f2 = max([1] + [int(degree[u]) for t in targets for u in indices[indptr[t]:indptr[t + 1]]])
    return response_inputs(x, targets, lambda v, f: indices[indptr[v]:indptr[v + 1]], (f1, f2), hubs)


def write_reference(out, params, x, indptr, indices, targets, logits, h1, fanouts, seed,
                    row_normalise=True, tolerance=1e-4):
    """Writes reference/ (inputs.json, <input>.bin, ort_logits.f32) for the
    exported model in `out` and checks onnxruntime against the offline
    `logits` (and `h1`, every node's layer-1 embedding) within
    `tolerance`: exits naming the difference otherwise. Returns the
    largest differences without and with stored hub embeddings."""
    # A batch of inputs and what onnxruntime (Python) makes of them: the
    # Rust worker must compute the same on the same bytes. The batch is
    # served as a HUB_H1 response is: hop-1 nodes of degree at least the
    # batch's median hop-1 degree come with their offline h1 and no hop-2
    # neighbours, which with every neighbour sampled changes nothing. On a
    # graph too large for every neighbour of the batch, it is sampled at
    # the manifest's fanouts and checked against the same computation in
    # numpy.
    import onnxruntime as ort
    session = ort.InferenceSession(os.path.join(out, "model.onnx"), providers=["CPUExecutionProvider"])
    degree = np.diff(indptr)
    hop1 = [u for t in targets for u in indices[indptr[t]:indptr[t + 1]]]
    covering = len(targets) * max([1] + [int(degree[t]) for t in targets]) * \
        max([1] + [int(degree[u]) for u in hop1]) <= REFERENCE_MAX_ENTRIES
    hub_degree = max(2, int(np.median([degree[u] for u in hop1]))) if hop1 else 2
    hubs = (lambda u: degree[u] >= hub_degree, h1)
    if covering:
        plain_feeds = full_inputs(x, indptr, indices, targets)
        feeds = full_inputs(x, indptr, indices, targets, hubs=hubs)
        expected_plain = expected = logits[targets]
    else:
        rng = np.random.default_rng(seed)
        plain_feeds = sampled_inputs(x, indptr, indices, targets, fanouts, rng)
        feeds = response_inputs(x, targets, sample_neighbours(indptr, indices, rng), fanouts, hubs)
        expected_plain, expected = (layout_logits(params, plain_feeds, row_normalise),
                                   layout_logits(params, feeds, row_normalise))
    plain = session.run([OUTPUT], session_feeds(session, plain_feeds))[0]
    diff = float(np.abs(plain - expected_plain).max())
    if diff > tolerance:
        sys.exit(f"onnxruntime and the offline model disagree by {diff} on the reference batch")
    ort_logits = session.run([OUTPUT], feeds)[0]
    hub_diff = float(np.abs(ort_logits - expected).max())
    if hub_diff > tolerance:
        sys.exit(f"with stored hub embeddings, onnxruntime and the offline model disagree by {hub_diff}")
    described = {}
    for name in GNN_INPUTS:
        arr = np.ascontiguousarray(feeds[name])
        arr.tofile(os.path.join(out, "reference", name + ".bin"))
        described[name] = {"dtype": str(arr.dtype), "shape": list(arr.shape)}
    ort_logits.astype(np.float32).tofile(os.path.join(out, "reference", "ort_logits.f32"))
    with open(os.path.join(out, "reference", "inputs.json"), "w") as f:
        json.dump({"targets": [int(t) for t in targets], "inputs": described,
                   "covering": covering,
                   "ort_logits": {"dtype": "float32", "shape": list(ort_logits.shape)}}, f, indent=2)

    return diff, hub_diff


# Above this many edges, `train --mode auto` trains on mini-batches.
FULL_GRAPH_MAX_EDGES = 2_000_000
# Above this many hop-2 entries, the reference batch is sampled at the
# manifest's fanouts instead of covering every neighbour.
REFERENCE_MAX_ENTRIES = 1 << 20


def cmd_train(args):
    started = time.time()
    meta, x, edges, labels, split = load_dataset(args.dataset)
    n, d, c = meta["num_nodes"], meta["feature_dim"], meta["num_classes"]
    indptr, indices = csr(n, edges)
    del edges
    agg = MeanAggregator(n, indptr, indices)
    fanouts = [int(v) for v in args.fanouts.split(",")]
    mode = args.mode
    if mode == "auto":
        mode = "full" if len(indices) <= FULL_GRAPH_MAX_EDGES else "minibatch"
    if mode == "full":
        val, params, epoch = train_full(x, agg, labels, split, c, args.hidden, args.epochs, args.lr,
                                        args.weight_decay, args.dropout, args.seed)
    else:
        val, params, epoch = train_minibatch(x, indptr, indices, labels, split, c, args.hidden,
                                             args.epochs, args.lr, args.weight_decay, args.dropout,
                                             args.seed, args.batch, fanouts, args.max_steps, agg)
    trained = time.time() - started
    xn = normalise(x).astype(np.float32)
    h1 = layer1(params, xn, agg).astype(np.float32)
    del xn
    logits = layer2(params, h1, agg).astype(np.float32)
    test_idx = np.flatnonzero(split == 2)
    test_acc = accuracy(logits, labels, test_idx)
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    model = build_onnx(params, d, c)
    import onnx
    onnx.save(model, os.path.join(args.out, "model.onnx"))
    logits.tofile(os.path.join(args.out, "reference", "logits.f32"))

    targets = test_idx[: args.reference_targets]
    diff, hub_diff = write_reference(args.out, params, x, indptr, indices, targets, logits, h1,
                                     fanouts, args.seed)

    manifest = {
        "format_version": 1,
        "architecture": "graphsage-mean-2layer",
        "dataset": meta["name"],
        "feature_dim": d,
        "dtype": "f32",
        "num_classes": c,
        "hidden": args.hidden,
        "fanouts": fanouts,
        "graph_version": args.graph_version,
        "num_nodes": n,
        "opset": OPSET,
        "inputs": GNN_INPUTS,
        "outputs": [OUTPUT, H1_OUTPUT],
        "training": {"mode": mode, "seed": args.seed, "epochs": args.epochs, "best_epoch": epoch,
                     "lr": args.lr, "weight_decay": args.weight_decay, "dropout": args.dropout,
                     "batch": args.batch if mode == "minibatch" else None,
                     "max_steps": args.max_steps if mode == "minibatch" else None,
                     "seconds": round(trained, 1), "peak_rss_mib": round(peak_rss_mib(), 1)},
        "offline": {"val_accuracy": val, "test_accuracy": test_acc,
                    "onnxruntime_max_abs_diff": diff, "hub_h1_max_abs_diff": hub_diff},
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"{meta['name']}: offline test accuracy {test_acc * 100:.1f}% (val {val * 100:.1f}%, "
          f"epoch {epoch}); onnxruntime diff {diff:.2e}; {mode} training {trained:.1f} s, "
          f"{time.time() - started:.1f} s in all, peak RSS {peak_rss_mib():.0f} MiB -> {args.out}")


# PyG's parameter names of a 2-layer SAGEConv model (mean aggregation, root
# weight): lin_l acts on the neighbours' mean and carries the bias, lin_r on
# the node itself.
PYG_SAGE_KEYS = ["conv1.lin_l.weight", "conv1.lin_l.bias", "conv1.lin_r.weight",
                 "conv2.lin_l.weight", "conv2.lin_l.bias", "conv2.lin_r.weight"]


def pyg_sage_reference(weights, x, indptr, indices):
    """PyG's SAGEConv, written from its documentation: x'_i = W_1 x_i +
    W_2 mean_{j in N(i)} x_j (+ bias, on lin_l), W_1 = lin_r, W_2 = lin_l;
    relu between the layers. Node by node, independent of the export:
    (logits, h1) of every node."""
    def layer(h, k):
        w_l, b_l, w_r = (weights[f"conv{k}.lin_l.weight"], weights[f"conv{k}.lin_l.bias"],
                         weights[f"conv{k}.lin_r.weight"])
        out = np.empty((len(h), w_l.shape[0]), np.float64)
        for i in range(len(h)):
            nbrs = indices[indptr[i]:indptr[i + 1]]
            mean = h[nbrs].astype(np.float64).mean(axis=0) if len(nbrs) else np.zeros(h.shape[1])
            out[i] = w_l @ mean + b_l + w_r @ h[i]
        return out.astype(np.float32)
    h1 = np.maximum(layer(x, 1), 0.0)
    return layer(h1, 2), h1


def cmd_import_pyg(args):
    """A 2-layer PyTorch Geometric model's weights (safetensors, PyG's
    names) exported as this contract's ONNX graph with its manifest."""
    from safetensors.numpy import load_file
    if args.arch == "gcn":
        sys.exit("GCNConv is not imported into the dense layout: its symmetric normalisation "
                 "needs the degree of every node of the sampled subgraph, which the dense layout "
                 "does not carry. Export the PyG model as it is and serve it in the subgraph "
                 "layout (gnn-worker/model/pyg_model.py; docs/model.md, \"PyTorch Geometric "
                 "models\")")
    weights = {k[len(args.prefix):]: v for k, v in load_file(args.weights).items()
               if k.startswith(args.prefix)}
    missing = [k for k in PYG_SAGE_KEYS if k not in weights]
    if missing:
        sys.exit(f"{args.weights}: no {', '.join(args.prefix + k for k in missing)} (it has "
                 f"{sorted(weights) or 'nothing under the prefix'}): save a 2-layer SAGEConv "
                 "model's state_dict (docs/model.md, \"Bring your own model\"), or give --prefix")
    extra = [k for k in weights if k not in PYG_SAGE_KEYS]
    if extra:
        sys.exit(f"{args.weights}: parameters this import does not know: {extra} (a bias on "
                 "lin_r, a third layer, another aggregation?): only SAGEConv(mean, "
                 "root_weight=True) x 2 is supported")
    w = {k: np.asarray(v, np.float32) for k, v in weights.items()}
    hidden, d = w["conv1.lin_l.weight"].shape
    c = w["conv2.lin_l.weight"].shape[0]
    shapes = {"conv1.lin_l.bias": (hidden,), "conv1.lin_r.weight": (hidden, d),
              "conv2.lin_l.weight": (c, hidden), "conv2.lin_l.bias": (c,),
              "conv2.lin_r.weight": (c, hidden)}
    for key, shape in shapes.items():
        if w[key].shape != shape:
            sys.exit(f"{args.weights}: {key} has shape {list(w[key].shape)}, expected "
                     f"{list(shape)} (from conv1.lin_l.weight {[hidden, d]} and "
                     f"conv2.lin_l.weight {[c, hidden]})")
    params = [w["conv1.lin_r.weight"].T.copy(), w["conv1.lin_l.weight"].T.copy(),
              w["conv1.lin_l.bias"], w["conv2.lin_r.weight"].T.copy(),
              w["conv2.lin_l.weight"].T.copy(), w["conv2.lin_l.bias"]]
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    import onnx
    onnx.save(build_onnx(params, d, c, row_normalise=args.row_normalise),
              os.path.join(args.out, "model.onnx"))
    fanouts = [int(v) for v in args.fanouts.split(",")]
    offline = None
    name = None
    if args.dataset:
        meta, x, edges, labels, split = load_dataset(args.dataset)
        name = meta["name"]
        if meta["feature_dim"] != d:
            sys.exit(f"{args.dataset} has {meta['feature_dim']} features; the weights take {d}")
        n = meta["num_nodes"]
        indptr, indices = csr(n, edges)
        xin = normalise(x).astype(np.float32) if args.row_normalise else x
        logits, h1 = pyg_sage_reference(w, xin, indptr, indices)
        logits.tofile(os.path.join(args.out, "reference", "logits.f32"))
        test_idx = np.flatnonzero(split == 2)
        targets = (test_idx if len(test_idx) else np.arange(n))[:32]
        diff, hub_diff = write_reference(args.out, params, x, indptr, indices, targets, logits, h1,
                                         fanouts, 0, row_normalise=args.row_normalise,
                                         tolerance=1e-5)
        offline = {"test_accuracy": accuracy(logits, labels, test_idx),
                   "reference": "numpy, PyG's SAGEConv formula, every neighbour",
                   "onnxruntime_max_abs_diff": diff, "hub_h1_max_abs_diff": hub_diff}
    manifest = {
        "format_version": 1,
        "architecture": "graphsage-mean-2layer",
        "dataset": name,
        "feature_dim": d,
        "dtype": "f32",
        "num_classes": c,
        "hidden": hidden,
        "fanouts": fanouts,
        "graph_version": args.graph_version,
        "num_nodes": None,
        "opset": OPSET,
        "inputs": GNN_INPUTS,
        "outputs": [OUTPUT, H1_OUTPUT],
        "row_normalise": args.row_normalise,
        "imported": {"from": "pytorch_geometric", "layer": "SAGEConv", "aggr": "mean",
                     "weights_sha256": file_sha256(args.weights)},
        "training": None,
        "offline": offline,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    checked = (f"onnxruntime within {offline['onnxruntime_max_abs_diff']:.1e} of PyG's formula on "
               f"{name}, test accuracy {offline['test_accuracy'] * 100:.1f}%" if offline else
               "not checked against a dataset (give --dataset)")
    print(f"imported SAGEConv x 2 ({d} -> {hidden} -> {c}); {checked} -> {args.out}")


def cmd_init(args):
    """A model of the right shape with random (Glorot) weights and no
    training: for load tests on graphs without labels (the synthetic
    graphs of `sidecar generate`). Its predictions mean nothing."""
    rng = np.random.default_rng(args.seed)
    d, c, hidden = args.feature_dim, args.classes, args.hidden

    params = [glorot(rng, d, hidden), glorot(rng, d, hidden), np.zeros(hidden, np.float32),
              glorot(rng, hidden, c), glorot(rng, hidden, c), np.zeros(c, np.float32)]
    os.makedirs(args.out, exist_ok=True)
    import onnx
    onnx.save(build_onnx(params, d, c), os.path.join(args.out, "model.onnx"))
    manifest = {
        "format_version": 1,
        "architecture": "graphsage-mean-2layer",
        "dataset": None,
        "feature_dim": d,
        "dtype": "f32",
        "num_classes": c,
        "hidden": hidden,
        "fanouts": [int(v) for v in args.fanouts.split(",")],
        "graph_version": args.graph_version,
        "num_nodes": None,
        "opset": OPSET,
        "inputs": GNN_INPUTS,
        "outputs": [OUTPUT, H1_OUTPUT],
        "training": None,
        "offline": None,
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(f"untrained model: {d} features, {c} classes, hidden {hidden} -> {args.out}")


def sampled_inputs(x, indptr, indices, targets, fanouts, rng):
    """Model inputs for `targets` at `fanouts`, as the sidecar serves them:
    up to f neighbours of each node sampled without replacement."""
    def sample(v, f):
        nbrs = indices[indptr[v]:indptr[v + 1]]
        return nbrs if len(nbrs) <= f else rng.choice(nbrs, size=f, replace=False)

    return response_inputs(x, targets, sample, fanouts)


def own_row_inputs(x, targets):
    """A student's inputs: the targets' own rows, nothing else."""
    return {"features": x[np.asarray(targets)].astype(np.float32),
            "target_row": np.arange(len(targets), dtype=np.int32)}


def session_of(path):
    import onnxruntime as ort
    options = ort.SessionOptions()
    # One thread, as one worker executor runs one batch: the timings compare
    # the models, not the thread pool.
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


def session_logits(session, feeds_of, idx, batch=16):
    """Logits of `session` for the nodes `idx`, `batch` targets a run."""
    out = []
    for start in range(0, len(idx), batch):
        feeds = feeds_of(idx[start:start + batch])
        out.append(session.run([OUTPUT], session_feeds(session, feeds))[0])
    return np.concatenate(out)


def time_sessions(named, feeds_pool, runs):
    """Latency (us) of one run of each session on the same inputs, the
    sessions taking turns run by run so that each sees the same machine:
    {name: (p50, p99)}."""
    samples = {name: [] for name, _ in named}
    for r in range(runs):
        feeds = feeds_pool[r % len(feeds_pool)]
        for name, session in (named if r % 2 == 0 else named[::-1]):
            f = session_feeds(session, feeds)
            first = [session.get_outputs()[0].name]
            started = time.perf_counter()
            session.run(first, f)
            samples[name].append((time.perf_counter() - started) * 1e6)
    return {name: (float(np.percentile(v, 50)), float(np.percentile(v, 99)))
            for name, v in samples.items()}


def subgraph_inputs(x, indptr, indices, targets, fanouts, rng):
    """A subgraph-layout model's inputs for `targets` at `fanouts` (one per
    hop), as the sidecar samples them (pyg_model.sample_subgraph), beside
    the targets' own rows (what a student reads)."""
    from pyg_model import sample_subgraph
    n_id, edge_index, _, _ = sample_subgraph(indptr, indices, targets, fanouts, rng)
    return dict(own_row_inputs(x, targets), x=np.ascontiguousarray(x[n_id]),
                edge_index=edge_index)


def serving_timings(named, x, indptr, indices, fanouts, n, runs, seed, subgraph=False):
    """Per-run latency of each session on serving-shaped inputs (targets
    drawn at random, neighbourhoods sampled at `fanouts`, in the dense
    layout or, with `subgraph`, the subgraph layout), for batches of 1 and
    32 targets: {"1": {name: [p50, p99]}, "32": ...}."""
    rng = np.random.default_rng(seed)
    inputs = subgraph_inputs if subgraph else sampled_inputs
    out = {}
    for batch in (1, 32):
        pool = [inputs(x, indptr, indices, rng.integers(0, n, size=batch), fanouts, rng)
                for _ in range(50)]
        out[str(batch)] = {name: [round(p50, 1), round(p99, 1)]
                           for name, (p50, p99) in time_sessions(named, pool, runs).items()}
    return out


def read_manifest(model_dir):
    with open(os.path.join(model_dir, "manifest.json")) as f:
        return json.load(f)


def file_sha256(path):
    import hashlib
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def check_dataset_matches(manifest, meta, model_dir):
    if manifest.get("feature_dim") != meta["feature_dim"]:
        sys.exit(f"{model_dir}: feature_dim {manifest.get('feature_dim')} in the manifest, "
                 f"{meta['feature_dim']} in the dataset: pass the dataset the model was trained on")
    if manifest.get("num_classes") != meta["num_classes"]:
        sys.exit(f"{model_dir}: num_classes {manifest.get('num_classes')} in the manifest, "
                 f"{meta['num_classes']} in the dataset: pass the dataset the model was trained on")


def cmd_quantize(args):
    """INT8: onnxruntime's dynamic quantization of the MatMul weights
    (activations quantized per run); same inputs and outputs."""
    from onnxruntime.quantization import QuantType, quantize_dynamic
    started = time.time()
    manifest = read_manifest(args.model)
    if manifest.get("quantization"):
        sys.exit(f"{args.model} is already quantized: quantize the FP32 model")
    subgraph = manifest.get("layout") == "subgraph"
    if subgraph and manifest.get("output", "classes") != "classes":
        sys.exit(f"{args.model}: an embedding model; quantize a classifier (the accuracy is "
                 "measured on the labels)")
    if not subgraph and manifest.get("architecture") != "graphsage-mean-2layer":
        sys.exit(f"{args.model}: architecture {manifest.get('architecture')!r}; quantize a GNN "
                 "exported by `sage.py train` or `init`, or a PyG model exported by "
                 "`pyg_model.py`")
    meta, x, edges, labels, split = load_dataset(args.dataset)
    check_dataset_matches(manifest, meta, args.model)
    n = meta["num_nodes"]
    indptr, indices = csr(n, edges)
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    fp32_path = os.path.join(args.model, "model.onnx")
    int8_path = os.path.join(args.out, "model.onnx")
    # onnxruntime's pre-processing (shape inference, graph optimisation)
    # first, as its quantization tools advise.
    from onnxruntime.quantization.shape_inference import quant_pre_process
    prepared = os.path.join(args.out, "model.prepared.onnx")
    quant_pre_process(fp32_path, prepared, skip_symbolic_shape=True)
    quantize_dynamic(prepared, int8_path, weight_type=QuantType.QInt8)
    os.remove(prepared)
    fp32, int8 = session_of(fp32_path), session_of(int8_path)

    # Accuracy with covering fanouts (every neighbour): the model's own
    # error, not sampling's.
    test_idx = np.flatnonzero(split == 2)
    every = np.arange(n)
    if subgraph:
        # A PyG model runs on the whole graph at once.
        from pyg_model import full_edge_index
        whole = {"x": x, "edge_index": full_edge_index(n, edges)}
        l32, l8 = fp32.run(None, whole)[0], int8.run(None, whole)[0]
    else:
        full = lambda t: full_inputs(x, indptr, indices, t)  # noqa: E731
        l32 = session_logits(fp32, full, every)
        l8 = session_logits(int8, full, every)
    acc32, acc8 = accuracy(l32, labels, test_idx), accuracy(l8, labels, test_idx)
    agreement = float((l32.argmax(1) == l8.argmax(1)).mean())
    timings = serving_timings([("fp32", fp32), ("int8", int8)], x, indptr, indices,
                              manifest["fanouts"], n, args.runs, args.seed, subgraph=subgraph)

    # The reference batch of the FP32 model, answered by the INT8 one: the
    # Rust worker must compute the same on the same bytes.
    ref_in = os.path.join(args.model, "reference")
    ref_out = os.path.join(args.out, "reference")
    if os.path.exists(os.path.join(ref_in, "inputs.json")):
        with open(os.path.join(ref_in, "inputs.json")) as f:
            described = json.load(f)
        feeds = {name: np.fromfile(os.path.join(ref_in, name + ".bin"),
                                   dtype=d["dtype"]).reshape(d["shape"])
                 for name, d in described["inputs"].items()}
        for name, arr in feeds.items():
            arr.tofile(os.path.join(ref_out, name + ".bin"))
        ort_logits = int8.run([OUTPUT], feeds)[0].astype(np.float32)
        ort_logits.tofile(os.path.join(ref_out, "ort_logits.f32"))
        with open(os.path.join(ref_out, "inputs.json"), "w") as f:
            json.dump(dict(described, ort_logits={"dtype": "float32", "shape": list(ort_logits.shape)}),
                      f, indent=2)
    if subgraph:
        # The FP32 model's reference subgraph, answered by the INT8 one.
        import shutil
        for name in ("subgraph.json", "n_id.bin", "x.bin", "edge_index.bin"):
            shutil.copy(os.path.join(ref_in, name), os.path.join(ref_out, name))
        with open(os.path.join(ref_in, "subgraph.json")) as f:
            described = json.load(f)
        xs = np.fromfile(os.path.join(ref_in, "x.bin"), dtype="<f4").reshape(
            described["nodes"], described["feature_dim"])
        sub = np.fromfile(os.path.join(ref_in, "edge_index.bin"), dtype="<i8").reshape(2, -1)
        int8.run(None, {"x": xs, "edge_index": sub})[0].astype("<f4").tofile(
            os.path.join(ref_out, "ort_outputs.bin"))
        l8.astype(np.float32).tofile(os.path.join(ref_out, "outputs.f32"))
    else:
        l8.astype(np.float32).tofile(os.path.join(ref_out, "logits.f32"))

    quantized = dict(manifest)
    quantized["quantization"] = {
        "method": "onnxruntime.quantization.quantize_dynamic",
        "weights": "int8",
        "activations": "uint8, quantized at run time",
        "from_model_sha256": file_sha256(fp32_path),
    }
    quantized["offline"] = dict(manifest.get("offline") or {}, **{
        "test_accuracy": acc8,
        "fp32_test_accuracy": acc32,
        "agreement_with_fp32": agreement,
        "max_abs_diff_from_fp32": float(np.abs(l32 - l8).max()),
        "onnxruntime_us": timings,
    })
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(quantized, f, indent=2)
    print(json.dumps({"dataset": meta["name"], "fp32_test_accuracy": acc32, "int8_test_accuracy": acc8,
                      "agreement": agreement, "onnxruntime_us": timings,
                      "model_bytes": {"fp32": os.path.getsize(fp32_path), "int8": os.path.getsize(int8_path)},
                      "seconds": round(time.time() - started, 1)}))


def train_student(xn, teacher_logits, labels, split, hidden, epochs, lr, weight_decay, dropout,
                  temperature, hard_weight, seed):
    """A 2-layer MLP on the row-normalised features, trained on the
    teacher's soft labels for every node (and, weighted `hard_weight`, the
    true labels of the training nodes); the epoch with the best validation
    accuracy kept."""
    rng = np.random.default_rng(seed)
    n, d = xn.shape
    c = teacher_logits.shape[1]

    def softmax(z):
        e = np.exp(z - z.max(axis=1, keepdims=True))
        return e / e.sum(axis=1, keepdims=True)

    soft = softmax(teacher_logits / temperature).astype(np.float32)
    train_idx, val_idx = np.flatnonzero(split == 0), np.flatnonzero(split == 1)
    hard = np.zeros((n, c), np.float32)
    hard[train_idx] = np.eye(c, dtype=np.float32)[labels[train_idx]]
    params = [glorot(rng, d, hidden), np.zeros(hidden, np.float32), glorot(rng, hidden, c), np.zeros(c, np.float32)]
    decay = [weight_decay, 0.0, 0.0, 0.0]
    m = [np.zeros_like(p) for p in params]
    v = [np.zeros_like(p) for p in params]
    keep = 1.0 - dropout
    best = (-1.0, None, 0)
    for epoch in range(1, epochs + 1):
        w1, b1, w2, b2 = params
        xd = xn * ((rng.random(xn.shape) < keep).astype(np.float32) / keep)
        z1 = xd @ w1 + b1
        h = np.maximum(z1, 0.0)
        mask1 = (rng.random(h.shape) < keep).astype(np.float32) / keep
        hd = h * mask1
        z2 = hd @ w2 + b2
        # Soft part: KL(teacher || student) at the temperature, scaled by T^2
        # (Hinton et al.); hard part: cross-entropy on the training nodes.
        dz2 = (softmax(z2 / temperature) - soft) * temperature / n
        dz2[train_idx] += hard_weight * (softmax(z2[train_idx]) - hard[train_idx]) / len(train_idx)
        g_w2, g_b2 = hd.T @ dz2, dz2.sum(axis=0)
        dh = (dz2 @ w2.T) * mask1 * (z1 > 0)
        grads = [xd.T @ dh, dh.sum(axis=0), g_w2, g_b2]
        adam_step(params, grads, decay, m, v, lr, epoch)
        w1, b1, w2, b2 = params
        val = accuracy(np.maximum(xn[val_idx] @ w1 + b1, 0.0) @ w2 + b2, labels[val_idx],
                       np.arange(len(val_idx)))
        if val > best[0]:
            best = (val, [p.copy() for p in params], epoch)
    return best


STUDENT_INPUTS = ["features", "target_row"]


def build_student_onnx(params, feature_dim, num_classes):
    """logits = relu(x W1 + b1) W2 + b2 on the targets' own rows (gathered
    from the node table by `target_row`, row-normalised inside)."""
    from onnx import TensorProto, helper, numpy_helper

    w1, b1, w2, b2 = params
    inits = [numpy_helper.from_array(arr, name) for arr, name in [
        (w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"),
        (np.array([1], np.int64), "axis1"), (np.array(1.0, np.float32), "one_f"),
    ]]
    nodes = [
        helper.make_node("Gather", ["features", "target_row"], ["x_t"], axis=0),
        helper.make_node("ReduceSum", ["x_t", "axis1"], ["rowsum"], keepdims=1),
        helper.make_node("Max", ["rowsum", "one_f"], ["rowsum1"]),
        helper.make_node("Div", ["x_t", "rowsum1"], ["xn"]),
        helper.make_node("MatMul", ["xn", "w1"], ["z1_0"]),
        helper.make_node("Add", ["z1_0", "b1"], ["z1"]),
        helper.make_node("Relu", ["z1"], ["h"]),
        helper.make_node("MatMul", ["h", "w2"], ["z2_0"]),
        helper.make_node("Add", ["z2_0", "b2"], [OUTPUT]),
    ]
    inputs = [
        helper.make_tensor_value_info("features", TensorProto.FLOAT, ["n_nodes", feature_dim]),
        helper.make_tensor_value_info("target_row", TensorProto.INT32, ["n_targets"]),
    ]
    return onnx_model(nodes, "mlp_student_2layer", inputs, num_classes, inits,
                      "gnn-worker/model/sage.py distill")


def cmd_distill(args):
    started = time.time()
    teacher = read_manifest(args.teacher)
    subgraph = teacher.get("layout") == "subgraph"
    dense_teacher = teacher.get("architecture") == "graphsage-mean-2layer" and teacher.get("offline")
    pyg_teacher = subgraph and teacher.get("output", "classes") == "classes"
    if not (dense_teacher or pyg_teacher):
        sys.exit(f"{args.teacher}: distill from a GNN trained by `sage.py train` (its manifest has "
                 "`offline` results and reference/logits.f32) or a PyG classifier exported by "
                 "`pyg_model.py` (reference/outputs.f32)")
    meta, x, edges, labels, split = load_dataset(args.dataset)
    check_dataset_matches(teacher, meta, args.teacher)
    n, d, c = meta["num_nodes"], meta["feature_dim"], meta["num_classes"]
    reference = "outputs.f32" if subgraph else "logits.f32"
    teacher_logits = np.fromfile(os.path.join(args.teacher, "reference", reference),
                                 dtype="<f4").reshape(n, c)
    xn = normalise(x).astype(np.float32)
    val, params, epoch = train_student(xn, teacher_logits, labels, split, args.hidden, args.epochs,
                                       args.lr, args.weight_decay, args.dropout, args.temperature,
                                       args.hard_weight, args.seed)
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    import onnx
    student_path = os.path.join(args.out, "model.onnx")
    onnx.save(build_student_onnx(params, d, c), student_path)
    student = session_of(student_path)
    every = np.arange(n)
    logits = session_logits(student, lambda t: own_row_inputs(x, t), every)
    w1, b1, w2, b2 = params
    offline = np.maximum(xn @ w1 + b1, 0.0) @ w2 + b2
    diff = float(np.abs(offline - logits).max())
    if diff > 1e-4:
        sys.exit(f"onnxruntime and the offline student disagree by {diff}")
    logits.astype(np.float32).tofile(os.path.join(args.out, "reference", "logits.f32"))
    test_idx = np.flatnonzero(split == 2)
    test_acc = accuracy(logits, labels, test_idx)
    teacher_acc = accuracy(teacher_logits, labels, test_idx)
    agreement = float((logits.argmax(1) == teacher_logits.argmax(1)).mean())
    indptr, indices = csr(n, edges)
    timings = serving_timings([("teacher", session_of(os.path.join(args.teacher, "model.onnx"))),
                               ("student", student)], x, indptr, indices, teacher["fanouts"], n,
                              args.runs, args.seed, subgraph=subgraph)
    manifest = {
        "format_version": 1,
        "architecture": "mlp-2layer",
        "role": "student",
        "dataset": meta["name"],
        "feature_dim": d,
        "dtype": "f32",
        "num_classes": c,
        "hidden": args.hidden,
        # The student reads the targets' own rows: it needs no neighbours.
        "fanouts": [0, 0],
        "graph_version": teacher["graph_version"],
        "num_nodes": n,
        "opset": OPSET,
        "inputs": STUDENT_INPUTS,
        "outputs": [OUTPUT],
        "teacher": {"model_sha256": file_sha256(os.path.join(args.teacher, "model.onnx")),
                    "test_accuracy": teacher_acc},
        "training": {"seed": args.seed, "epochs": args.epochs, "best_epoch": epoch, "lr": args.lr,
                     "weight_decay": args.weight_decay, "dropout": args.dropout,
                     "temperature": args.temperature, "hard_weight": args.hard_weight},
        "offline": {"val_accuracy": val, "test_accuracy": test_acc,
                    "teacher_test_accuracy": teacher_acc, "agreement_with_teacher": agreement,
                    "onnxruntime_max_abs_diff": diff, "onnxruntime_us": timings},
    }
    with open(os.path.join(args.out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    print(json.dumps({"dataset": meta["name"], "student_test_accuracy": test_acc,
                      "teacher_test_accuracy": teacher_acc, "agreement": agreement,
                      "within_2_points": teacher_acc - test_acc <= 0.02, "onnxruntime_us": timings,
                      "best_epoch": epoch, "seconds": round(time.time() - started, 1)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train, export ONNX + manifest, write reference outputs")
    t.add_argument("--dataset", required=True, help="a dataset directory in the ../shared/data layout")
    t.add_argument("--out", required=True, help="model directory to write")
    t.add_argument("--fanouts", default="20,10", help="serving fanouts recorded in the manifest")
    t.add_argument("--graph-version", type=int, default=1,
                   help="graph version the model is for (sidecar import --graph-version)")
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--epochs", type=int, default=200)
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--dropout", type=float, default=0.5)
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--reference-targets", type=int, default=32)
    t.add_argument("--mode", choices=["auto", "full", "minibatch"], default="auto",
                   help="full-graph epochs, or neighbour-sampled mini-batches at --fanouts; auto: "
                   f"full-graph up to {FULL_GRAPH_MAX_EDGES:,} edges")
    t.add_argument("--batch", type=int, default=512, help="training nodes per mini-batch")
    t.add_argument("--max-steps", type=int, default=None,
                   help="stop mini-batch training after this many steps (timing runs)")
    i = sub.add_parser("init", help="export an untrained model of the right shape (load tests)")
    i.add_argument("--feature-dim", type=int, required=True)
    i.add_argument("--classes", type=int, default=16)
    i.add_argument("--out", required=True, help="model directory to write")
    i.add_argument("--fanouts", default="20,10", help="serving fanouts recorded in the manifest")
    i.add_argument("--graph-version", type=int, default=1)
    i.add_argument("--hidden", type=int, default=64)
    i.add_argument("--seed", type=int, default=0)
    g = sub.add_parser("import-pyg", help="export a 2-layer PyTorch Geometric SAGEConv model's "
                       "weights (safetensors) as the serving contract's ONNX graph")
    g.add_argument("--weights", required=True, help="model.safetensors: the model's state_dict")
    g.add_argument("--out", required=True, help="model directory to write")
    g.add_argument("--arch", choices=["sage", "gcn"], default="sage")
    g.add_argument("--prefix", default="", help="prefix of the parameter names (e.g. model.)")
    g.add_argument("--no-row-normalise", dest="row_normalise", action="store_false",
                   help="the model was trained on raw features (no NormalizeFeatures)")
    g.add_argument("--dataset", help="check the export against PyG's formula on this dataset "
                   "and write reference outputs (covering fanouts, within 1e-5)")
    g.add_argument("--fanouts", default="20,10", help="serving fanouts recorded in the manifest")
    g.add_argument("--graph-version", type=int, default=1)
    q = sub.add_parser("quantize", help="export a dynamically quantized (INT8) copy of a model, "
                       "with its accuracy and speed against FP32")
    q.add_argument("--model", required=True, help="the FP32 model directory (sage.py train or init)")
    q.add_argument("--dataset", required=True, help="the dataset it was trained on (accuracy, timing)")
    q.add_argument("--out", required=True, help="model directory to write")
    q.add_argument("--runs", type=int, default=400, help="timed runs per batch size")
    q.add_argument("--seed", type=int, default=0)
    s = sub.add_parser("distill", help="train an MLP student on a GNN's soft labels and export it")
    s.add_argument("--teacher", required=True, help="the GNN's model directory (sage.py train)")
    s.add_argument("--dataset", required=True, help="the dataset the teacher was trained on")
    s.add_argument("--out", required=True, help="model directory to write (e.g. TEACHER/student)")
    s.add_argument("--hidden", type=int, default=512)
    s.add_argument("--epochs", type=int, default=300)
    s.add_argument("--lr", type=float, default=0.01)
    s.add_argument("--weight-decay", type=float, default=5e-4)
    s.add_argument("--dropout", type=float, default=0.5)
    s.add_argument("--temperature", type=float, default=1.0)
    s.add_argument("--hard-weight", type=float, default=0.0,
                   help="weight of the true labels of the training nodes beside the soft labels")
    s.add_argument("--runs", type=int, default=400, help="timed runs per batch size")
    s.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    {"train": cmd_train, "init": cmd_init, "quantize": cmd_quantize,
     "distill": cmd_distill, "import-pyg": cmd_import_pyg}[args.command](args)


if __name__ == "__main__":
    main()
