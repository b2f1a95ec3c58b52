#!/usr/bin/env python3
"""Model tooling for gnn-worker's dense layout: a 2-layer GraphSAGE (mean
aggregator) as a torch.nn.Module, trained with torch.optim, exported with
torch.onnx.export (opset pinned) beside a manifest and reference outputs.

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
accuracies; `distill` trains an MLP student (a torch.nn.Module too) on the
teacher's soft labels (the target's own features only) and exports it with
its own manifest (inputs `features`, `target_row`). Both measure accuracy
and onnxruntime's speed against the model they come from
(docs/strategies.md).

The offline model is full-graph GraphSAGE: h = relu(x W1s + mean_nbr(x) W1n
+ b1), logits = h W2s + mean_nbr(h) W2n + b2, on row-normalised features
(a row is divided by its sum inside the model, so the store keeps the raw
rows). `DenseSage` computes it two ways with the same parameters: on the
whole graph (`full`, the mean a sparse operator on the CSR) and on the
sidecar's response tables (`forward`, what is exported). With fanouts that
cover every neighbour the two are the same computation.
"""
import argparse
import copy
import json
import os
import sys
import time

import numpy as np

from common import (fanout_list, file_sha256, load_dataset, neighbour_lists, peak_rss_mib,
                    pick_neighbours, progress, session_of)

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
STUDENT_INPUTS = ["features", "target_row"]


def torch():
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    warnings.filterwarnings("ignore", message=".*legacy TorchScript-based ONNX export")
    import torch as t
    return t


def dense_modules():
    """The torch.nn.Module classes of this layout, defined on first use
    (torch takes seconds to import; `quantize` never needs it)."""
    global DenseSage, Student
    if "DenseSage" in globals():
        return DenseSage, Student
    t = torch()
    nn = t.nn

    def masked_mean(values, mask, counts):
        """The mean over axis -2 of `values` (..., width, H) of the
        positions `mask` (..., width) keeps, 0 where `counts` is 0 or
        below (the padding holds a valid row; it is multiplied away)."""
        total = (values * mask.unsqueeze(-1)).sum(-2)
        return total / counts.clamp(min=1).to(values.dtype).unsqueeze(-1)

    def below(counts, rows, axis):
        """1.0 where the list position (axis `axis` of `rows`) is below the
        count, else 0.0."""
        positions = t.arange(rows.shape[axis], dtype=counts.dtype)
        return (positions < counts.unsqueeze(-1)).to(t.float32)

    class _DenseSage(nn.Module):
        """2-layer GraphSAGE, mean aggregator, weights laid out [in, out]
        (a MatMul each, what onnxruntime's INT8 quantization rewrites);
        dropout on the inputs and the hidden layer while training."""

        def __init__(self, feature_dim, hidden, num_classes, dropout=0.0, row_normalise=True):
            super().__init__()
            p = nn.Parameter
            self.w1_self = p(t.empty(feature_dim, hidden))
            self.w1_neigh = p(t.empty(feature_dim, hidden))
            self.b1 = p(t.zeros(hidden))
            self.w2_self = p(t.empty(hidden, num_classes))
            self.w2_neigh = p(t.empty(hidden, num_classes))
            self.b2 = p(t.zeros(num_classes))
            for w in (self.w1_self, self.w1_neigh, self.w2_self, self.w2_neigh):
                nn.init.xavier_uniform_(w)
            self.drop = nn.Dropout(dropout)
            self.row_normalise = row_normalise

        def decayed(self):
            """The parameters weight decay applies to: the first layer's."""
            return [self.w1_self, self.w1_neigh]

        def inputs(self, features):
            if self.row_normalise:
                features = features / features.sum(1, keepdim=True).clamp(min=1.0)
            return self.drop(features)

        def forward(self, features, target_row, hop1_count, hop1_rows, hop2_count, hop2_rows,
                    hop1_h1):
            """The served computation on a response's tables (docs/model.md):
            (logits [T, C], h1 [T, hidden]). Features are projected once
            per node-table row, so the gathers move hidden-size rows (mean
            and projection commute)."""
            x = self.inputs(features)
            p_self, p_neigh = x @ self.w1_self, x @ self.w1_neigh
            m1 = below(hop1_count, hop1_rows, 1)
            m2 = below(hop2_count, hop2_rows, 2)
            h_t = t.relu(p_self[target_row] + masked_mean(p_neigh[hop1_rows], m1, hop1_count)
                         + self.b1)
            h_1 = t.relu(p_self[hop1_rows] + masked_mean(p_neigh[hop2_rows], m2, hop2_count)
                         + self.b1)
            # A hop-1 slot sent without hop-2 neighbours (hop2_count -1: a
            # hub whose stored layer-1 embedding stands) takes it from
            # hop1_h1 instead.
            h_1 = t.where((hop2_count < 0).unsqueeze(2), hop1_h1, h_1)
            agg = masked_mean(self.drop(h_1), m1, hop1_count)
            logits = self.drop(h_t) @ self.w2_self + agg @ self.w2_neigh + self.b2
            return logits, h_t

        def full(self, features, mean):
            """The same model on the whole graph: (logits [N, C], h1
            [N, hidden]); `mean` is the sparse mean-over-neighbours
            operator (`mean_operator`)."""
            x = self.inputs(features)
            h = t.relu(x @ self.w1_self + t.sparse.mm(mean, x @ self.w1_neigh) + self.b1)
            hd = self.drop(h)
            return hd @ self.w2_self + t.sparse.mm(mean, hd @ self.w2_neigh) + self.b2, h

    class _Student(nn.Module):
        """A 2-layer MLP on the targets' own row-normalised features
        (gathered from the node table by `target_row`)."""

        def __init__(self, feature_dim, hidden, num_classes, dropout=0.0):
            super().__init__()
            p = nn.Parameter
            self.w1 = p(t.empty(feature_dim, hidden))
            self.b1 = p(t.zeros(hidden))
            self.w2 = p(t.empty(hidden, num_classes))
            self.b2 = p(t.zeros(num_classes))
            nn.init.xavier_uniform_(self.w1)
            nn.init.xavier_uniform_(self.w2)
            self.drop = nn.Dropout(dropout)

        def decayed(self):
            return [self.w1]

        def forward(self, features, target_row):
            x = features[target_row]
            x = self.drop(x / x.sum(1, keepdim=True).clamp(min=1.0))
            return self.drop(t.relu(x @ self.w1 + self.b1)) @ self.w2 + self.b2

    DenseSage, Student = _DenseSage, _Student
    return DenseSage, Student


def mean_operator(n, indptr, indices):
    """The mean over each node's neighbours as a sparse [N, N] matrix (row v
    holds 1/deg(v) at v's neighbours; empty for a node without any): memory
    O(E), never N x N."""
    t = torch()
    degree = np.diff(indptr)
    rows = np.repeat(np.arange(n, dtype=np.int64), degree)
    values = (1.0 / np.maximum(degree, 1)).astype(np.float32)[rows]
    return t.sparse_coo_tensor(t.from_numpy(np.stack([rows, indices])), t.from_numpy(values),
                               (n, n), check_invariants=False).coalesce()


def tensors(feeds):
    t = torch()
    return {k: t.from_numpy(np.ascontiguousarray(v)) for k, v in feeds.items()}


def layout_args(feeds, hidden):
    """A response's tables in `forward`'s order, with `hop1_h1` ([1, 1,
    hidden] zeros: no slot cached) when `feeds` has none."""
    t = torch()
    ts = tensors(feeds)
    if HUB_INPUT not in ts:
        ts[HUB_INPUT] = t.zeros(1, 1, hidden)
    return tuple(ts[name] for name in GNN_INPUTS)


def layout_logits(model, feeds):
    """`model`'s logits on inputs laid out as a response (stored hub
    embeddings included): what the exported graph must compute on them."""
    t = torch()
    model.eval()
    with t.no_grad():
        return model(*layout_args(feeds, model.b1.shape[0]))[0].numpy()


def offline(model, x, mean):
    """(logits, h1) of every node on the whole graph, every neighbour."""
    t = torch()
    model.eval()
    with t.no_grad():
        logits, h1 = model.full(t.from_numpy(x), mean)
    return logits.numpy(), h1.numpy()


def export_dense(model, out, example):
    """torch.onnx.export of `model`'s served computation (TorchScript
    exporter, opset OPSET, every table's sizes dynamic) into out/model.onnx,
    checked by onnx."""
    import onnx
    t = torch()
    model.eval()
    path = os.path.join(out, "model.onnx")
    dynamic = {
        "features": {0: "n_nodes"}, "target_row": {0: "n_targets"},
        "hop1_count": {0: "n_targets"}, "hop1_rows": {0: "n_targets", 1: "f1"},
        "hop2_count": {0: "n_targets", 1: "f1"},
        "hop2_rows": {0: "n_targets", 1: "f1", 2: "f2"},
        # [n_targets, f1, hidden], or [1, 1, hidden] (broadcast) when no
        # slot is cached.
        HUB_INPUT: {0: "hub_targets", 1: "hub_f1"},
        OUTPUT: {0: "n_targets"}, H1_OUTPUT: {0: "n_targets"},
    }
    with t.no_grad():
        t.onnx.export(model, layout_args(example, model.b1.shape[0]), path, dynamo=False,
                      opset_version=OPSET, input_names=GNN_INPUTS,
                      output_names=[OUTPUT, H1_OUTPUT], dynamic_axes=dynamic)
    onnx.checker.check_model(onnx.load(path))
    return path


def export_student(model, out, x):
    import onnx
    t = torch()
    model.eval()
    path = os.path.join(out, "model.onnx")
    example = (t.from_numpy(np.ascontiguousarray(x[:3])), t.arange(3, dtype=t.int32))
    with t.no_grad():
        t.onnx.export(model, example, path, dynamo=False, opset_version=OPSET,
                      input_names=STUDENT_INPUTS, output_names=[OUTPUT],
                      dynamic_axes={"features": {0: "n_nodes"}, "target_row": {0: "n_targets"},
                                    OUTPUT: {0: "n_targets"}})
    onnx.checker.check_model(onnx.load(path))
    return path


def dense_fanouts(text):
    """The dense layout's two fanouts: its hop arrays are as wide as they
    are, so each is a number (-1, every neighbour, has no width here: give
    the sidecar's max_fanouts instead, or export a PyG model with
    pyg_model.py, whose subgraph layout takes -1)."""
    fanouts = fanout_list(text, what="--fanouts")
    if len(fanouts) != 2 or -1 in fanouts:
        sys.exit(f"--fanouts {text}: the dense layout takes two fanouts of 1 or more, such as "
                 "20,10 (its arrays are as wide as they are; -1 is for a subgraph-layout "
                 "model, pyg_model.py)")
    return fanouts


def export_example(x, indptr, indices, fanouts):
    """A small response to trace the export with (two targets with
    neighbours, sampled at `fanouts`)."""
    degree = np.diff(indptr)
    targets = np.flatnonzero(degree > 0)[:2]
    if len(targets) == 0:
        targets = np.arange(min(2, len(x)))
    rng = np.random.default_rng(0)
    return response_inputs(x, targets, sample_neighbours(indptr, indices, rng), fanouts)


def synthetic_example(feature_dim):
    """A response of two targets with two neighbours each, on random rows:
    for exports without a dataset (`init`, `import-pyg` alone)."""
    x = np.random.default_rng(0).random((4, feature_dim), dtype=np.float32)
    indptr = np.array([0, 2, 4, 5, 6])
    indices = np.array([1, 2, 0, 3, 0, 1])
    return response_inputs(x, [0, 1], sample_neighbours(indptr, indices, np.random.default_rng(0)),
                           (2, 1))


def sample_neighbours(indptr, indices, rng):
    """`sample(v, f)`: up to f of v's neighbours, uniformly without
    replacement (`common.pick_neighbours`; all of them with `rng` None)."""
    return lambda v, f: pick_neighbours(indptr, indices, v, f, rng)


def accuracy(logits, labels, idx):
    return float((logits[idx].argmax(axis=1) == labels[idx]).mean()) if len(idx) else 0.0


def optimiser(model, lr, weight_decay):
    """Adam (betas 0.9, 0.999) with L2 weight decay on the first layer
    only."""
    t = torch()
    decayed = {id(p) for p in model.decayed()}
    return t.optim.Adam([
        {"params": model.decayed(), "weight_decay": weight_decay},
        {"params": [p for p in model.parameters() if id(p) not in decayed], "weight_decay": 0.0},
    ], lr=lr)


def train_full(model, x, mean, labels, split, epochs, lr, weight_decay):
    """Full-graph training (every node, every neighbour, each epoch), the
    aggregation a sparse operator. Returns (best validation accuracy, its
    epoch); `model` holds that epoch's parameters."""
    t = torch()
    opt = optimiser(model, lr, weight_decay)
    train_idx = t.from_numpy(np.flatnonzero(split == 0))
    val_idx = np.flatnonzero(split == 1)
    xt, y = t.from_numpy(x), t.from_numpy(labels.astype(np.int64))
    best = (-1.0, None, 0)
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        logits, _ = model.full(xt, mean)
        t.nn.functional.cross_entropy(logits[train_idx], y[train_idx]).backward()
        opt.step()
        val = accuracy(offline(model, x, mean)[0], labels, val_idx)
        if val > best[0]:
            best = (val, copy.deepcopy(model.state_dict()), epoch)
        progress(f"full-graph training: epoch {epoch}/{epochs}, validation {val * 100:.1f}% "
                 f"(best {best[0] * 100:.1f}%)", last=epoch == epochs, every=0.5)
    model.load_state_dict(best[1])
    return best[0], best[2]


def train_minibatch(model, x, indptr, indices, mean, labels, split, epochs, lr, weight_decay,
                    seed, batch, fanouts, max_steps):
    """Neighbour-sampled mini-batch training (GraphSAGE's): each step
    samples a batch of training nodes' 2-hop neighbourhoods at `fanouts`,
    laid out as the sidecar lays out a response, and runs the served
    computation (`forward`, what is exported) on them; memory per step is
    the batch's, O(batch x f1 x f2 x hidden). Validation (full-graph,
    sparse) after each epoch and at the end. Returns (best validation
    accuracy, its epoch); `model` holds that epoch's parameters."""
    t = torch()
    rng = np.random.default_rng(seed)
    opt = optimiser(model, lr, weight_decay)
    train_idx, val_idx = np.flatnonzero(split == 0), np.flatnonzero(split == 1)
    sample = sample_neighbours(indptr, indices, rng)
    hidden = model.b1.shape[0]
    steps_per_epoch = max(1, -(-len(train_idx) // batch))
    total = epochs * steps_per_epoch if max_steps is None else min(max_steps, epochs * steps_per_epoch)
    best = (-1.0, None, 0)
    step, epoch = 0, 0
    started = time.time()

    def validate():
        val = accuracy(offline(model, x, mean)[0], labels, val_idx)
        return val if val <= best[0] else (val, copy.deepcopy(model.state_dict()), epoch)

    while step < total:
        epoch += 1
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch):
            if step >= total:
                break
            step += 1
            targets = order[start:start + batch]
            model.train()
            opt.zero_grad()
            logits, _ = model(*layout_args(response_inputs(x, targets, sample, fanouts), hidden))
            y = t.from_numpy(labels[targets].astype(np.int64))
            t.nn.functional.cross_entropy(logits, y).backward()
            opt.step()
            progress(f"mini-batch training: step {step}/{total} (epoch {epoch}), "
                     f"{step / max(time.time() - started, 1e-9):.1f} steps/s", last=step == total,
                     every=0.5)
        if step < total:
            better = validate()
            if isinstance(better, tuple):
                best = better
    better = validate()
    if isinstance(better, tuple):
        best = better
    model.load_state_dict(best[1])
    return best[0], best[2]


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


def write_reference(out, model, x, indptr, indices, targets, logits, h1, fanouts, seed,
                    tolerance=1e-4):
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
    # torch (the module that was exported).
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
        expected_plain, expected = layout_logits(model, plain_feeds), layout_logits(model, feeds)
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


def dense_manifest(**fields):
    """The dense layout's manifest: shared fields, then `fields`."""
    manifest = {
        "format_version": 1,
        "architecture": "graphsage-mean-2layer",
        "dtype": "f32",
        "opset": OPSET,
        "inputs": GNN_INPUTS,
        "outputs": [OUTPUT, H1_OUTPUT],
    }
    manifest.update(fields)
    return manifest


def write_manifest(out, manifest):
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)


def cmd_train(args):
    started = time.time()
    t = torch()
    t.manual_seed(args.seed)
    meta, x, edges, labels, split = load_dataset(args.dataset)
    n, d, c = meta["num_nodes"], meta["feature_dim"], meta["num_classes"]
    indptr, indices = neighbour_lists(n, edges)
    del edges
    mean = mean_operator(n, indptr, indices)
    fanouts = dense_fanouts(args.fanouts)
    mode = args.mode
    if mode == "auto":
        mode = "full" if len(indices) <= FULL_GRAPH_MAX_EDGES else "minibatch"
    DenseSage, _ = dense_modules()
    model = DenseSage(d, args.hidden, c, dropout=args.dropout)
    if mode == "full":
        val, epoch = train_full(model, x, mean, labels, split, args.epochs, args.lr,
                                args.weight_decay)
    else:
        val, epoch = train_minibatch(model, x, indptr, indices, mean, labels, split, args.epochs,
                                     args.lr, args.weight_decay, args.seed, args.batch, fanouts,
                                     args.max_steps)
    trained = time.time() - started
    logits, h1 = offline(model, x, mean)
    test_idx = np.flatnonzero(split == 2)
    test_acc = accuracy(logits, labels, test_idx)
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    export_dense(model, args.out, export_example(x, indptr, indices, fanouts))
    logits.tofile(os.path.join(args.out, "reference", "logits.f32"))

    targets = test_idx[: args.reference_targets]
    diff, hub_diff = write_reference(args.out, model, x, indptr, indices, targets, logits, h1,
                                     fanouts, args.seed)
    write_manifest(args.out, dense_manifest(
        dataset=meta["name"], feature_dim=d, num_classes=c, hidden=args.hidden, fanouts=fanouts,
        graph_version=args.graph_version, num_nodes=n,
        training={"mode": mode, "seed": args.seed, "epochs": args.epochs, "best_epoch": epoch,
                  "lr": args.lr, "weight_decay": args.weight_decay, "dropout": args.dropout,
                  "batch": args.batch if mode == "minibatch" else None,
                  "max_steps": args.max_steps if mode == "minibatch" else None,
                  "framework": f"torch {t.__version__}",
                  "seconds": round(trained, 1), "peak_rss_mib": round(peak_rss_mib(), 1)},
        offline={"val_accuracy": val, "test_accuracy": test_acc,
                 "onnxruntime_max_abs_diff": diff, "hub_h1_max_abs_diff": hub_diff}))
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
    names) loaded into DenseSage and exported as the dense layout's ONNX
    graph with its manifest."""
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
    t = torch()
    DenseSage, _ = dense_modules()
    model = DenseSage(d, hidden, c, row_normalise=args.row_normalise)
    model.load_state_dict({name: t.from_numpy(np.ascontiguousarray(value)) for name, value in {
        "w1_self": w["conv1.lin_r.weight"].T, "w1_neigh": w["conv1.lin_l.weight"].T,
        "b1": w["conv1.lin_l.bias"], "w2_self": w["conv2.lin_r.weight"].T,
        "w2_neigh": w["conv2.lin_l.weight"].T, "b2": w["conv2.lin_l.bias"]}.items()})
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    fanouts = dense_fanouts(args.fanouts)
    checked = None
    name = None
    if args.dataset:
        meta, x, edges, labels, split = load_dataset(args.dataset)
        name = meta["name"]
        if meta["feature_dim"] != d:
            sys.exit(f"{args.dataset} has {meta['feature_dim']} features; the weights take {d}")
        n = meta["num_nodes"]
        indptr, indices = neighbour_lists(n, edges)
        export_dense(model, args.out, export_example(x, indptr, indices, fanouts))
        xin = (x / np.maximum(x.sum(axis=1, keepdims=True), 1.0)).astype(np.float32) \
            if args.row_normalise else x
        logits, h1 = pyg_sage_reference(w, xin, indptr, indices)
        logits.tofile(os.path.join(args.out, "reference", "logits.f32"))
        test_idx = np.flatnonzero(split == 2)
        targets = (test_idx if len(test_idx) else np.arange(n))[:32]
        diff, hub_diff = write_reference(args.out, model, x, indptr, indices, targets, logits, h1,
                                         fanouts, 0, tolerance=1e-5)
        checked = {"test_accuracy": accuracy(logits, labels, test_idx),
                   "reference": "numpy, PyG's SAGEConv formula, every neighbour",
                   "onnxruntime_max_abs_diff": diff, "hub_h1_max_abs_diff": hub_diff}
    else:
        export_dense(model, args.out, synthetic_example(d))
    write_manifest(args.out, dense_manifest(
        dataset=name, feature_dim=d, num_classes=c, hidden=hidden, fanouts=fanouts,
        graph_version=args.graph_version, num_nodes=None, row_normalise=args.row_normalise,
        imported={"from": "pytorch_geometric", "layer": "SAGEConv", "aggr": "mean",
                  "weights_sha256": file_sha256(args.weights)},
        training=None, offline=checked))
    said = (f"onnxruntime within {checked['onnxruntime_max_abs_diff']:.1e} of PyG's formula on "
            f"{name}, test accuracy {checked['test_accuracy'] * 100:.1f}%" if checked else
            "not checked against a dataset (give --dataset)")
    print(f"imported SAGEConv x 2 ({d} -> {hidden} -> {c}); {said} -> {args.out}")


def cmd_init(args):
    """A model of the right shape with random (Glorot) weights and no
    training: for load tests on graphs without labels (the synthetic
    graphs of `sidecar generate`). Its predictions mean nothing."""
    torch().manual_seed(args.seed)
    d, c, hidden = args.feature_dim, args.classes, args.hidden
    DenseSage, _ = dense_modules()
    os.makedirs(args.out, exist_ok=True)
    export_dense(DenseSage(d, hidden, c), args.out, synthetic_example(d))
    write_manifest(args.out, dense_manifest(
        dataset=None, feature_dim=d, num_classes=c, hidden=hidden,
        fanouts=dense_fanouts(args.fanouts), graph_version=args.graph_version,
        num_nodes=None, training=None, offline=None))
    print(f"untrained model: {d} features, {c} classes, hidden {hidden} -> {args.out}")


def sampled_inputs(x, indptr, indices, targets, fanouts, rng):
    """Model inputs for `targets` at `fanouts`, as the sidecar serves them:
    up to f neighbours of each node sampled without replacement."""
    return response_inputs(x, targets, sample_neighbours(indptr, indices, rng), fanouts)


def own_row_inputs(x, targets):
    """A student's inputs: the targets' own rows, nothing else."""
    return {"features": x[np.asarray(targets)].astype(np.float32),
            "target_row": np.arange(len(targets), dtype=np.int32)}


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
    hop), as the sidecar samples them (pyg_model.sample_subgraph, the one sampler on a one-type graph), beside
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
    indptr, indices = neighbour_lists(n, edges)
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
        with open(os.path.join(ref_in, "subgraph.json")) as f:
            described = json.load(f)
        files = ["subgraph.json"] + [d["file"] for d in described["inputs"].values()]
        files += list(described["global_ids"].values())
        for name in files:
            shutil.copy(os.path.join(ref_in, name), os.path.join(ref_out, name))
        feeds = {name: np.fromfile(os.path.join(ref_in, d["file"]),
                                   dtype="<f4" if d["dtype"] == "f32" else "<i8").reshape(d["shape"])
                 for name, d in described["inputs"].items()}
        int8.run(None, feeds)[0].astype("<f4").tofile(os.path.join(ref_out, "ort_outputs.bin"))
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


def train_student(model, x, teacher_logits, labels, split, epochs, lr, weight_decay, temperature,
                  hard_weight):
    """`model` (a Student) trained on the teacher's soft labels for every
    node (KL at the temperature, scaled by T^2 as Hinton et al.) and,
    weighted `hard_weight`, the true labels of the training nodes; the
    epoch with the best validation accuracy kept. Returns (that accuracy,
    its epoch)."""
    t = torch()
    F = t.nn.functional
    n = len(x)
    xt, every = t.from_numpy(x), t.arange(n, dtype=t.int32)
    soft = F.softmax(t.from_numpy(teacher_logits) / temperature, dim=1)
    train_idx = t.from_numpy(np.flatnonzero(split == 0))
    val_idx = np.flatnonzero(split == 1)
    y = t.from_numpy(labels.astype(np.int64))
    opt = optimiser(model, lr, weight_decay)
    best = (-1.0, None, 0)
    for epoch in range(1, epochs + 1):
        model.train()
        opt.zero_grad()
        z = model(xt, every)
        loss = -(soft * F.log_softmax(z / temperature, dim=1)).sum(1).mean() * temperature ** 2
        if hard_weight:
            loss = loss + hard_weight * F.cross_entropy(z[train_idx], y[train_idx])
        loss.backward()
        opt.step()
        model.eval()
        with t.no_grad():
            val = accuracy(model(xt, every).numpy(), labels, val_idx)
        if val > best[0]:
            best = (val, copy.deepcopy(model.state_dict()), epoch)
    model.load_state_dict(best[1])
    return best[0], best[2]


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
    t = torch()
    t.manual_seed(args.seed)
    _, Student = dense_modules()
    model = Student(d, args.hidden, c, dropout=args.dropout)
    val, epoch = train_student(model, x, teacher_logits, labels, split, args.epochs, args.lr,
                               args.weight_decay, args.temperature, args.hard_weight)
    os.makedirs(os.path.join(args.out, "reference"), exist_ok=True)
    student_path = export_student(model, args.out, x)
    student = session_of(student_path)
    every = np.arange(n)
    logits = session_logits(student, lambda ids: own_row_inputs(x, ids), every)
    with t.no_grad():
        expected = model(t.from_numpy(x), t.arange(n, dtype=t.int32)).numpy()
    diff = float(np.abs(expected - logits).max())
    if diff > 1e-4:
        sys.exit(f"onnxruntime and the offline student disagree by {diff}")
    logits.astype(np.float32).tofile(os.path.join(args.out, "reference", "logits.f32"))
    test_idx = np.flatnonzero(split == 2)
    test_acc = accuracy(logits, labels, test_idx)
    teacher_acc = accuracy(teacher_logits, labels, test_idx)
    agreement = float((logits.argmax(1) == teacher_logits.argmax(1)).mean())
    indptr, indices = neighbour_lists(n, edges)
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
                     "temperature": args.temperature, "hard_weight": args.hard_weight,
                     "framework": f"torch {t.__version__}"},
        "offline": {"val_accuracy": val, "test_accuracy": test_acc,
                    "teacher_test_accuracy": teacher_acc, "agreement_with_teacher": agreement,
                    "onnxruntime_max_abs_diff": diff, "onnxruntime_us": timings},
    }
    write_manifest(args.out, manifest)
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
