#!/usr/bin/env python3
"""PyTorch Geometric model tooling for gnn-worker's subgraph layout: train a
PyG GNN, export any PyG model with torch.onnx.export (opset pinned), check
onnxruntime against PyG on sampled subgraphs, write the manifest and the
reference outputs the worker and the tests read.

    python gnn-worker/model/pyg_model.py train --dataset DIR --arch sage --out models/pyg-sage \
        [--layers 2] [--hidden 64] [--fanouts 20,10] [--mode full|minibatch] [--output classes]
    python gnn-worker/model/pyg_model.py export --module mymodels:Net --init '{"hidden": 64}' \
        --state-dict net.pt --dataset DIR --fanouts 20,10 --out models/net

or, from the Python that trained the model:

    sys.path.insert(0, "gnn-worker/model")
    from pyg_model import export
    model.eval()
    export(model, dataset="DIR", fanouts=[20, 10], out="models/net")

writes into the model directory:
  model.onnx            the model as torch.onnx.export wrote it (TorchScript
                        exporter, opset 18, dynamic node and edge counts):
                        inputs x [n, D] f32 and edge_index [2, e] int64,
                        output `out` [n, C] (one row per node); a max or min
                        scatter the exporter got wrong is corrected
                        (`fix_scatter_extrema`)
  manifest.json         layout "subgraph", feature dim, fanouts (one per
                        hop), graph version, opset, output kind and width,
                        what the check measured, offline accuracy
  reference/outputs.f32 PyG's full-graph model(x, edge_index) for every
                        node, N x C, f32 LE
  reference/subgraph.json + reference/*.bin: one sampled subgraph (node ids,
                        x, edge_index) and the outputs onnxruntime computed
                        on it in Python
  weights.safetensors   (train only) the trained state_dict, PyG's names

The subgraphs are laid out as the sidecar lays out a subgraph-layout
response and as NeighborLoader(num_neighbors=fanouts, replace=False) builds
a batch: the unique targets first, then each hop's newly reached nodes; an
edge (neighbour, node) per sampled neighbour (docs/protocol.md, "The
subgraph layout"). NeighborLoader itself needs pyg-lib or torch-sparse,
which do not install from PyPI here, so this module samples the same way
itself (`sample_subgraph`).
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from common import (ONE_EDGE_TYPE, ONE_TYPE, OneTypeGraph, file_sha256,  # noqa: F401
                    load_dataset, neighbour_lists, progress, sample, session_of)

OPSET = 18
INPUTS = ["x", "edge_index"]
OUTPUT = "out"
ARCHS = ("sage", "gcn", "gat", "gin")
# Outputs are compared relative to the row's magnitude: a float32 sum of
# large terms differs by its own rounding whatever computes it.
TOLERANCE = 1e-5


def full_edge_index(n, edges):
    """PyG's edge_index of the whole graph: message u -> v for every
    neighbour u of v (the sidecar's lists, so sampling with covering fanouts
    reaches exactly these edges)."""
    indptr, indices = neighbour_lists(n, edges)
    node = np.repeat(np.arange(n), np.diff(indptr))
    return np.stack([indices, node]).astype(np.int64)


def sample_subgraph(indptr, indices, targets, fanouts, rng=None):
    """One batch as NeighborLoader(num_neighbors=fanouts, replace=False)
    builds it for `targets`, and as the sidecar writes a subgraph-layout
    response: returns (n_id, edge_index [2, E] local, num_sampled_nodes,
    num_sampled_edges). With `rng` None every neighbour is taken (fanouts
    that cover the degrees); otherwise up to the fanout, uniformly without
    replacement. The typed sampler (`common.sample`) on the graph's one
    type and one edge type."""
    n_id, edge_index, num_nodes, num_edges = sample(
        OneTypeGraph(indptr, indices), ONE_TYPE, targets,
        {ONE_EDGE_TYPE: [int(f) for f in fanouts]}, rng)
    return (n_id[ONE_TYPE], edge_index[ONE_EDGE_TYPE], num_nodes[ONE_TYPE],
            num_edges[ONE_EDGE_TYPE])


def torch_modules():
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import torch.nn.functional as F
    from torch_geometric.nn import GATConv, GCNConv, GINConv, SAGEConv
    return torch, F, SAGEConv, GCNConv, GATConv, GINConv


def build_net(arch, in_dim, hidden, out_dim, layers, dropout, heads=8, row_normalise=True,
              head=False):
    """A PyG GNN of `layers` message-passing layers: SAGEConv (mean),
    GCNConv, GATConv (`heads` heads, concatenated, one on the last layer)
    or GINConv (a 2-layer MLP each). With `row_normalise`, each feature
    row is divided by its sum (at least 1) first, inside the model, so the
    stores keep the raw rows. With `head`, the last layer gives `hidden`
    (an embedding) and a linear layer the `out_dim` classes (`encode`
    returns the embedding)."""
    torch, F, SAGEConv, GCNConv, GATConv, GINConv = torch_modules()

    def conv(d_in, d_out, last):
        if arch == "sage":
            return SAGEConv(d_in, d_out)
        if arch == "gcn":
            return GCNConv(d_in, d_out)
        if arch == "gat":
            h = 1 if last else heads
            return GATConv(d_in, d_out // h if not last else d_out, heads=h)
        if arch == "gin":
            mlp = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(),
                                      torch.nn.Linear(hidden, d_out))
            return GINConv(mlp)
        raise ValueError(f"arch {arch!r}: one of {', '.join(ARCHS)}")

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            last_out = hidden if head else out_dim
            dims = [in_dim] + [hidden] * (layers - 1) + [last_out]
            self.convs = torch.nn.ModuleList(
                conv(dims[i], dims[i + 1], last=(i == layers - 1) and not head)
                for i in range(layers))
            self.head = torch.nn.Linear(hidden, out_dim) if head else None
            self.row_normalise = row_normalise
            self.dropout = dropout

        def encode(self, x, edge_index):
            if self.row_normalise:
                x = x / x.sum(dim=-1, keepdim=True).clamp(min=1.0)
            for i, c in enumerate(self.convs):
                x = F.dropout(x, p=self.dropout, training=self.training)
                x = c(x, edge_index)
                if i < len(self.convs) - 1:
                    x = F.elu(x) if arch == "gat" else F.relu(x)
            return x

        def forward(self, x, edge_index):
            x = self.encode(x, edge_index)
            if self.head is not None:
                x = self.head(F.relu(x))
            return x

    return Net()


class Encoder:
    """Wraps a trained classifier with a head so that its forward is the
    embedding (what an embedding model's export serves)."""

    @staticmethod
    def of(net):
        torch = torch_modules()[0]

        class Wrapped(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.net = net

            def forward(self, *inputs):  # (x, edge_index), or a typed model's dicts
                return self.net.encode(*inputs)

        return Wrapped().eval()


def train(net, x, edge_index, y, split, *, epochs, lr, weight_decay, mode, fanouts, batch, seed,
          indptr=None, indices=None):
    """Trains `net` on the training nodes (split 0), keeping the weights of
    the epoch with the best validation accuracy (split 1). `full`: the
    whole graph each epoch; `minibatch`: NeighborLoader-shaped batches of
    `batch` training nodes at `fanouts`. Returns (best val accuracy,
    best epoch)."""
    torch = torch_modules()[0]
    F = torch_modules()[1]
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    xt, et, yt = torch.from_numpy(x), torch.from_numpy(edge_index), torch.from_numpy(y).long()
    train_idx = np.flatnonzero(split == 0)
    val_idx = torch.from_numpy(np.flatnonzero(split == 1))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)

    def train_epoch():
        if mode == "full":
            opt.zero_grad()
            loss = F.cross_entropy(net(xt, et)[train_idx], yt[train_idx])
            loss.backward()
            opt.step()
            return
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch):
            seeds = order[start:start + batch]
            n_id, sub, _, _ = sample_subgraph(indptr, indices, seeds, fanouts, rng)
            opt.zero_grad()
            out = net(xt[torch.from_numpy(n_id)], torch.from_numpy(sub))
            loss = F.cross_entropy(out[:len(seeds)], yt[torch.from_numpy(seeds)])
            loss.backward()
            opt.step()

    def val_accuracy():
        pred = net(xt, et).argmax(1)
        return float((pred[val_idx] == yt[val_idx]).float().mean())

    return keep_best(net, epochs, train_epoch, val_accuracy)


def keep_best(net, epochs, train_epoch, val_accuracy):
    """Runs `train_epoch()` (in training mode) `epochs` times, measures
    `val_accuracy()` (in eval mode, without gradients) after each, and
    leaves `net` in eval mode with the weights of the best epoch. Returns
    (best val accuracy, its epoch)."""
    torch = torch_modules()[0]
    best = (-1.0, 0, None)
    for epoch in range(1, epochs + 1):
        net.train()
        train_epoch()
        net.eval()
        with torch.no_grad():
            val = val_accuracy()
        if val > best[0]:
            best = (val, epoch, {k: v.detach().clone() for k, v in net.state_dict().items()})
        if epoch % 20 == 0 or epoch == epochs:
            progress(f"epoch {epoch}/{epochs}: val {val:.3f} (best {best[0]:.3f} at {best[1]})")
    net.load_state_dict(best[2])
    net.eval()
    return best[0], best[1]


def export_onnx(model, path, x_example, edge_example):
    """torch.onnx.export with the TorchScript exporter (the dynamo one fails
    on GATConv), opset pinned, dynamic node and edge counts."""
    torch = torch_modules()[0]
    import warnings
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model, (torch.from_numpy(x_example), torch.from_numpy(edge_example)),
                          path, dynamo=False, opset_version=OPSET, input_names=INPUTS,
                          output_names=[OUTPUT],
                          dynamic_axes={"x": {0: "n"}, "edge_index": {1: "e"}, OUTPUT: {0: "n"}})


def _zeros_source(name, producers):
    """Whether tensor `name` is all zeros by construction: a ConstantOfShape
    of 0, possibly passed on by Identity, Reshape or both branches of an If
    (how the TorchScript exporter hands scatter_reduce its `new_zeros`)."""
    from onnx import numpy_helper
    node = producers.get(name)
    if node is None:
        return False
    if node.op_type == "ConstantOfShape":
        value = [a for a in node.attribute if a.name == "value"]
        return not value or not numpy_helper.to_array(value[0].t).any()
    if node.op_type in ("Identity", "Reshape"):
        return _zeros_source(node.input[0], producers)
    if node.op_type == "If":
        k = list(node.output).index(name)
        for branch in node.attribute:
            graph = branch.g
            inner = {o: n for n in graph.node for o in n.output}
            out = inner.get(graph.output[k].name)
            if out is None or out.op_type not in ("Identity", "Reshape"):
                return False
            if not _zeros_source(out.input[0], producers):
                return False
        return True
    return False


def fix_scatter_extrema(path):
    """The TorchScript exporter turns PyG's `scatter(..., reduce="max")`
    (torch's scatter_reduce with include_self=False on a zeros tensor) into
    ScatterElements(zeros, ..., reduction="max"): the maximum of 0 and the
    messages, wrong when all of a node's messages are negative (attention
    softmax then underflows; max aggregation answers 0). Rewrites each such
    scatter to start from -inf (+inf for min) and to keep 0 where no message
    arrived, PyG's semantics, in place. Returns the scatters fixed."""
    import onnx
    from onnx import TensorProto, helper
    model = onnx.load(path)
    graph = model.graph
    producers = {o: n for n in graph.node for o in n.output}
    fixed, nodes = 0, []
    for node in graph.node:
        reduction = [a.s for a in node.attribute if a.name == "reduction"]
        if (node.op_type != "ScatterElements" or reduction not in ([b"max"], [b"min"])
                or not _zeros_source(node.input[0], producers)):
            nodes.append(node)
            continue
        fixed += 1
        out, data = node.output[0], node.input[0]
        at = f"{out}/include_self_false"
        sign = -1.0 if reduction == [b"max"] else 1.0
        nodes.append(helper.make_node(
            "Constant", [], [f"{at}/inf"],
            value=helper.make_tensor(f"{at}/inf", TensorProto.FLOAT, [], [sign * np.inf])))
        nodes.append(helper.make_node("Add", [data, f"{at}/inf"], [f"{at}/start"]))
        scatter = onnx.NodeProto()
        scatter.CopyFrom(node)
        scatter.input[0], scatter.output[0] = f"{at}/start", f"{at}/reduced"
        nodes.append(scatter)
        nodes.append(helper.make_node("IsInf", [f"{at}/reduced"], [f"{at}/empty"],
                                      detect_positive=int(sign > 0), detect_negative=int(sign < 0)))
        nodes.append(helper.make_node("Where", [f"{at}/empty", data, f"{at}/reduced"], [out]))
    if fixed:
        del graph.node[:]
        graph.node.extend(nodes)
        onnx.save(model, path)
    return fixed


def pyg_outputs(model, x, edge_index):
    torch = torch_modules()[0]
    with torch.no_grad():
        return model(torch.from_numpy(x), torch.from_numpy(edge_index)).numpy()


def row_diff(a, b):
    """Largest difference of two output matrices, each row's relative to
    its magnitude (at least 1)."""
    if a.size == 0:
        return 0.0
    scale = np.maximum(1.0, np.abs(a).max(axis=1, keepdims=True))
    return float((np.abs(a - b) / scale).max())


def check_export(model, session, x, indptr, indices, fanouts, seed, subgraphs=8):
    """onnxruntime against PyG on the same subgraphs: sampled ones at
    `fanouts` (1 and 16 targets), a covering one around the largest hub,
    the same with negated and scaled features, and a target without edges.
    Returns what was measured; exits if a case that ran differs by more
    than TOLERANCE."""
    rng = np.random.default_rng(seed)
    n = x.shape[0]
    degree = np.diff(indptr)
    cases = []
    for i in range(subgraphs):
        targets = rng.choice(n, 1 if i % 2 == 0 else 16, replace=False)
        cases.append((f"sampled-{len(targets)}", targets, rng, 1.0))
    hub = int(degree.argmax())
    cases.append(("hub-covering", [hub], None, 1.0))
    cases.append(("negative-features", [hub], None, -3.0))
    cases.append(("large-features", [hub], None, 1e3))
    isolated = np.flatnonzero(degree == 0)
    results = {"max_rel_diff": 0.0, "cases": {}}
    for name, targets, case_rng, scale in cases:
        n_id, sub, _, _ = sample_subgraph(indptr, indices, targets, fanouts, case_rng)
        xs = np.ascontiguousarray(x[n_id] * np.float32(scale))
        want = pyg_outputs(model, xs, sub)
        got = session.run(None, {"x": xs, "edge_index": sub})[0]
        diff = row_diff(want, got)
        results["cases"][name] = {"nodes": int(len(n_id)), "edges": int(sub.shape[1]),
                                  "max_rel_diff": diff}
        results["max_rel_diff"] = max(results["max_rel_diff"], diff)
        if diff > TOLERANCE:
            sys.exit(f"onnxruntime differs from PyG by {diff:.3g} (relative to the row) on the "
                     f"{name} subgraph ({len(n_id)} nodes, {sub.shape[1]} edges): the export is "
                     "not faithful (see ../shared/FACTS.md-style hazards in docs/model.md); fix "
                     "the model or export it another way")
    # A target with no edge (an unknown id, an isolated node): the worker
    # runs such a subgraph padded (pad_edgeless), as some exports cannot run
    # on an empty edge_index; the padded run must give PyG's answer.
    lone = [int(isolated[0])] if len(isolated) else [hub]
    xs = np.ascontiguousarray(x[lone])
    empty = np.zeros((2, 0), dtype=np.int64)
    want = pyg_outputs(model, xs, empty)
    import onnxruntime as ort
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failure here is expected of some exports
    try:
        session.run(None, {"x": xs, "edge_index": empty}, quiet)
        runs_unpadded = True
    except Exception:  # onnxruntime's own failure: the padding is what serves it
        runs_unpadded = False
    px, pedges = pad_edgeless(xs)
    try:
        got = session.run(None, {"x": px, "edge_index": pedges})[0][:len(xs)]
    except Exception as e:
        sys.exit(f"onnxruntime cannot run the export on a target without edges, even padded "
                 f"with an unconnected row ({str(e).splitlines()[0][:300]}); PyG can: fix the "
                 "model or export it another way")
    diff = row_diff(want, got)
    results["no_edges"] = {"runs_unpadded": runs_unpadded, "max_rel_diff": diff}
    if diff > TOLERANCE:
        sys.exit(f"onnxruntime differs from PyG by {diff:.3g} on a target without edges (run "
                 "padded as the worker runs it): the model reads nodes it has no edge to; fix "
                 "the model")
    return results


def pad_edgeless(x):
    """A subgraph without edges as the worker runs it (gnn-worker
    Model::run_subgraph_slices): one more row of zeros and one edge from it
    to itself, which reaches no other row."""
    n = len(x)
    padded = np.concatenate([x, np.zeros((1, x.shape[1]), dtype=x.dtype)])
    return np.ascontiguousarray(padded), np.array([[n], [n]], dtype=np.int64)


def neighbor_loader_accuracy(model, x, indptr, indices, y, idx, fanouts, runs, seed):
    """Test accuracy as PyG's NeighborLoader inference computes it at
    `fanouts`, one target per batch, over `runs` seeded runs: (mean, each
    run's)."""
    accs = []
    for run in range(runs):
        rng = np.random.default_rng(seed + 1000 + run)
        correct = 0
        for t in idx:
            n_id, sub, _, _ = sample_subgraph(indptr, indices, [t], fanouts, rng)
            out = pyg_outputs(model, np.ascontiguousarray(x[n_id]), sub)
            correct += int(out[0].argmax() == y[t])
        accs.append(correct / len(idx))
    return float(np.mean(accs)), accs


def write_reference(out, session, x, indptr, indices, fanouts, full_outputs, seed):
    """reference/outputs.f32 (PyG's full-graph outputs) and one sampled
    subgraph with onnxruntime's outputs on it."""
    ref = os.path.join(out, "reference")
    os.makedirs(ref, exist_ok=True)
    full_outputs.astype("<f4").tofile(os.path.join(ref, "outputs.f32"))
    rng = np.random.default_rng(seed + 7)
    targets = rng.choice(x.shape[0], min(8, x.shape[0]), replace=False)
    n_id, sub, num_nodes, num_edges = sample_subgraph(indptr, indices, targets, fanouts, rng)
    xs = np.ascontiguousarray(x[n_id])
    got = session.run(None, {"x": xs, "edge_index": sub})[0]
    n_id.astype("<i8").tofile(os.path.join(ref, "n_id.bin"))
    xs.astype("<f4").tofile(os.path.join(ref, "x.bin"))
    sub.astype("<i8").tofile(os.path.join(ref, "edge_index.bin"))
    got.astype("<f4").tofile(os.path.join(ref, "ort_outputs.bin"))
    with open(os.path.join(ref, "subgraph.json"), "w") as f:
        json.dump({"targets": [int(t) for t in targets], "nodes": int(len(n_id)),
                   "edges": int(sub.shape[1]), "feature_dim": int(x.shape[1]),
                   "width": int(got.shape[1]), "num_sampled_nodes": num_nodes,
                   "num_sampled_edges": num_edges,
                   "files": {"n_id": "n_id.bin (i64)", "x": "x.bin (f32, nodes x dim)",
                             "edge_index": "edge_index.bin (i64, 2 x edges)",
                             "outputs": "ort_outputs.bin (f32, nodes x width)"}}, f, indent=2)


def export(model, *, dataset, out, fanouts, output="classes", graph_version=1, architecture=None,
           seed=0, check_subgraphs=8, extra=None):
    """Exports a trained PyG model (`model(x, edge_index)`, one output row
    per node) for gnn-worker: runs torch.onnx.export (opset 18, the
    TorchScript exporter), checks onnxruntime against PyG on sampled and
    adversarial subgraphs of `dataset` (within 1e-5 of each row's
    magnitude), and writes model.onnx, manifest.json and reference/ into
    `out`. `fanouts`: one per hop the sidecar samples (1 to 3; a GCN needs
    one hop more than its layers for exact degrees, docs/model.md).
    `output`: "classes" (logits) or "embedding". Returns the manifest."""
    torch = torch_modules()[0]
    import torch_geometric
    fanouts = [int(f) for f in fanouts]
    if not 1 <= len(fanouts) <= 3 or min(fanouts) < 1:
        sys.exit(f"fanouts {fanouts}: give one fanout of at least 1 per hop, 1 to 3 hops")
    if output not in ("classes", "embedding"):
        sys.exit(f"output {output!r}: classes or embedding")
    model.eval()
    meta, x, edges, y, split = load_dataset(dataset, labels=False)
    n, d = x.shape
    indptr, indices = neighbour_lists(n, edges)
    edge_index = full_edge_index(n, edges)
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.onnx")
    rng = np.random.default_rng(seed)
    # The example batch: a sampled subgraph with edges, so no size is 0 or 1.
    example_targets = rng.choice(n, min(4, n), replace=False)
    n_id, sub, _, _ = sample_subgraph(indptr, indices, example_targets, fanouts, rng)
    if sub.shape[1] < 2:
        n_id, sub = np.arange(min(n, 8)), edge_index[:, :8] % min(n, 8)
    export_onnx(model, path, np.ascontiguousarray(x[n_id]), sub)
    extrema_fixed = fix_scatter_extrema(path)
    session = session_of(path)
    names = [i.name for i in session.get_inputs()]
    if names != INPUTS:
        sys.exit(f"the export takes inputs {names}; gnn-worker feeds exactly {INPUTS}: the model "
                 "must read both x and edge_index (the exporter drops an input it never reads)")
    started = time.time()
    check = check_export(model, session, x, indptr, indices, fanouts, seed, check_subgraphs)
    full = pyg_outputs(model, x, edge_index)
    width = int(full.shape[1])
    write_reference(out, session, x, indptr, indices, fanouts, full, seed)
    manifest = {
        "format_version": 1,
        "layout": "subgraph",
        "architecture": architecture or type(model).__name__,
        "dataset": meta.get("name"),
        "feature_dim": int(d),
        "dtype": "f32",
        "output": output,
        "fanouts": fanouts,
        "graph_version": graph_version,
        "num_nodes": int(n),
        "opset": OPSET,
        "inputs": INPUTS,
        "outputs": [OUTPUT],
        "exporter": {"torch": torch.__version__.split("+")[0],
                     "torch_geometric": torch_geometric.__version__, "onnx_exporter": "torchscript",
                     "scatter_extrema_fixed": extrema_fixed, "model_sha256": file_sha256(path)},
        "check": dict(check, seconds=round(time.time() - started, 1), tolerance=TOLERANCE),
    }
    if output == "classes":
        manifest["num_classes"] = width
    else:
        manifest["embedding_dim"] = width
    if y is not None and output == "classes":
        test_idx = np.flatnonzero(split == 2)
        manifest["offline"] = {
            "test_accuracy": float((full[test_idx].argmax(1) == y[test_idx]).mean()),
            "val_accuracy": float((full[split == 1].argmax(1) == y[split == 1]).mean()),
        }
    manifest.update(extra or {})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def load_module(spec, init_kwargs):
    """`package.module:Class` (importable from the working directory), built
    with `init_kwargs`."""
    if ":" not in spec:
        sys.exit(f"--module {spec!r}: give it as package.module:Class")
    module_name, class_name = spec.split(":", 1)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        sys.exit(f"--module {spec!r}: cannot import {module_name} ({e}); run from the directory "
                 "that holds it, or add it to PYTHONPATH")
    cls = getattr(module, class_name, None)
    if cls is None:
        sys.exit(f"--module {spec!r}: {module_name} has no {class_name}")
    return cls(**init_kwargs)


def load_state(path):
    """A state dict saved with torch.save or safetensors."""
    torch = torch_modules()[0]
    if path.endswith(".safetensors"):
        from safetensors.torch import load_file
        return load_file(path)
    state = torch.load(path, map_location="cpu", weights_only=True)
    return state.get("state_dict", state) if isinstance(state, dict) else state


def cmd_export(args):
    model = load_module(args.module, json.loads(args.init) if args.init else {})
    if args.state_dict:
        missing, unexpected = model.load_state_dict(load_state(args.state_dict), strict=False)
        if missing or unexpected:
            sys.exit(f"--state-dict {args.state_dict} does not fit {args.module}: missing "
                     f"{list(missing)}, unexpected {list(unexpected)}")
    manifest = export(model, dataset=args.dataset, out=args.out, fanouts=parse_fanouts(args.fanouts),
                      output=args.output, graph_version=args.graph_version,
                      architecture=args.module, seed=args.seed)
    print(json.dumps({"out": args.out, "check": manifest["check"]["max_rel_diff"],
                      "offline": manifest.get("offline")}))


def cmd_train(args):
    torch = torch_modules()[0]
    started = time.time()
    meta, x, edges, y, split = load_dataset(args.dataset)
    n, d = x.shape
    c = int(meta["num_classes"])
    fanouts = parse_fanouts(args.fanouts)
    torch.manual_seed(args.seed)
    embedding = args.output == "embedding"
    net = build_net(args.arch, d, args.hidden, c, args.layers, args.dropout, heads=args.heads,
                    row_normalise=args.row_normalise, head=embedding)
    indptr, indices = neighbour_lists(n, edges)
    edge_index = full_edge_index(n, edges)
    mode = args.mode
    if mode == "auto":
        mode = "full" if len(edges) <= 2_000_000 else "minibatch"
    val, epoch = train(net, x, edge_index, y, split, epochs=args.epochs, lr=args.lr,
                       weight_decay=args.weight_decay, mode=mode, fanouts=fanouts,
                       batch=args.batch, seed=args.seed, indptr=indptr, indices=indices)
    test_idx = np.flatnonzero(split == 2)
    full = pyg_outputs(net, x, edge_index)
    test_acc = float((full[test_idx].argmax(1) == y[test_idx]).mean())
    training = {"arch": args.arch, "layers": args.layers, "hidden": args.hidden,
                "mode": mode, "epochs": args.epochs, "best_epoch": epoch, "lr": args.lr,
                "weight_decay": args.weight_decay, "dropout": args.dropout, "seed": args.seed,
                "row_normalise": args.row_normalise, "val_accuracy": val,
                "test_accuracy": test_acc, "seconds": round(time.time() - started, 1)}
    served = Encoder.of(net) if embedding else net
    extra = {"training": training}
    if not embedding and args.loader_runs > 0:
        mean, runs = neighbor_loader_accuracy(net, x, indptr, indices, y, test_idx, fanouts,
                                              args.loader_runs, args.seed)
        extra["neighbor_loader"] = {"fanouts": fanouts, "batch_size": 1, "runs": runs,
                                    "mean_test_accuracy": mean}
    manifest = export(served, dataset=args.dataset, out=args.out, fanouts=fanouts,
                      output=args.output, graph_version=args.graph_version,
                      architecture=f"pyg-{args.arch}-{args.layers}layer", seed=args.seed,
                      extra=extra)
    # The trained weights as PyG names them (sage.py import-pyg reads a
    # SAGEConv model's: the same weights in the dense layout).
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()},
              os.path.join(args.out, "weights.safetensors"))
    print(json.dumps({"out": args.out, "arch": args.arch, "layers": args.layers,
                      "test_accuracy": test_acc, "val_accuracy": val, "best_epoch": epoch,
                      "check_max_rel_diff": manifest["check"]["max_rel_diff"],
                      "neighbor_loader": extra.get("neighbor_loader"),
                      "seconds": round(time.time() - started, 1)}))


def parse_fanouts(text, least=1, what="fanouts"):
    """"20,10": one fanout per hop, 1 to 3 hops, each at least `least`;
    exits naming `what` otherwise."""
    try:
        fanouts = [int(f) for f in str(text).split(",")]
    except ValueError:
        sys.exit(f"{what} {text!r}: give numbers such as 20,10")
    if not 1 <= len(fanouts) <= 3 or min(fanouts) < least:
        sys.exit(f"{what} {text!r}: one fanout of {least} or more per hop, 1 to 3 hops")
    return fanouts


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    t = sub.add_parser("train", help="train a PyG GNN, export it, check it, write references")
    t.add_argument("--dataset", required=True, help="a dataset directory in the ../shared/data layout")
    t.add_argument("--out", required=True, help="model directory to write")
    t.add_argument("--arch", choices=ARCHS, default="sage")
    t.add_argument("--layers", type=int, default=2, choices=[1, 2, 3])
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--heads", type=int, default=8, help="GAT: attention heads of the hidden layers")
    t.add_argument("--fanouts", default="20,10",
                   help="serving fanouts, one per hop the sidecar samples (recorded in the manifest)")
    t.add_argument("--output", choices=["classes", "embedding"], default="classes",
                   help="embedding: serve the last GNN layer's output (the classifier's head is "
                        "used for training only)")
    t.add_argument("--mode", choices=["auto", "full", "minibatch"], default="auto")
    t.add_argument("--batch", type=int, default=128, help="training nodes per mini-batch")
    t.add_argument("--epochs", type=int, default=200)
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--dropout", type=float, default=0.5)
    t.add_argument("--no-row-normalise", dest="row_normalise", action="store_false",
                   help="train on the rows as stored (default: divide each by its sum in the model)")
    t.add_argument("--loader-runs", type=int, default=3,
                   help="runs of NeighborLoader-style inference at --fanouts for the manifest")
    t.add_argument("--graph-version", type=int, default=1)
    t.add_argument("--seed", type=int, default=0)
    e = sub.add_parser("export", help="export your own PyG module with a state dict")
    e.add_argument("--module", required=True, help="package.module:Class, importable from here")
    e.add_argument("--init", help="the class's keyword arguments, as JSON")
    e.add_argument("--state-dict", help="its trained weights (torch.save or .safetensors)")
    e.add_argument("--dataset", required=True, help="the dataset it serves (the check's subgraphs)")
    e.add_argument("--out", required=True, help="model directory to write")
    e.add_argument("--fanouts", required=True, help="one per hop the sidecar samples, e.g. 20,10")
    e.add_argument("--output", choices=["classes", "embedding"], default="classes")
    e.add_argument("--graph-version", type=int, default=1)
    e.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    {"train": cmd_train, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    main()
