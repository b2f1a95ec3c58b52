#!/usr/bin/env python3
"""Heterogeneous PyTorch Geometric model tooling: read a typed dataset, sample
typed subgraphs as NeighborLoader samples a HeteroData, train a `to_hetero`
or `HeteroConv` model, export it (or your own heterogeneous module) with
torch.onnx.export behind a generated flat-input wrapper, and check
onnxruntime against PyG before anything is written.

    python gnn-worker/model/pyg_hetero.py train --dataset DIR --out models/hetero \
        [--arch to_hetero|heteroconv] [--layers 2] [--hidden 64] [--fanouts 10,5] \
        [--fanout airport__route__airport=20,10 ...]
    python gnn-worker/model/pyg_hetero.py export --module mymodels:Net --init '{...}' \
        --state-dict net.pt --dataset DIR --out models/net [--fanouts 10,5]

or, from the Python that trained the model:

    sys.path.insert(0, "gnn-worker/model")
    from pyg_hetero import export
    export(model, dataset="DIR", out="models/net", fanouts={...})

The user's module is called as PyG calls a heterogeneous model,
`model(x_dict, edge_index_dict)`, and returns the target type's rows (a
tensor) or a dict holding them. A node type with features has its rows in
`x_dict` (float32 [n, D]); a type without features has its global node
ids (int64 [n], PyG's `n_id`): the model embeds them. The ONNX model's
inputs are named by the rule of docs/model.md, "Bring your own
heterogeneous model": `x__<type>`, `n_id__<type>` and
`edge_index__<src>__<relation>__<dst>`; its output `out` is [n, C], one
row per node of the target type, the targets first.

writes into the model directory:
  model.onnx            TorchScript exporter, opset 18, dynamic sizes; the
                        inputs the export kept (it drops an input that
                        cannot reach the output)
  manifest.json         layout "subgraph", the node types (features or ids),
                        the edge types, the target type, the fanouts per
                        edge type and hop, the inputs, the output, what the
                        check measured, offline accuracy
  reference/outputs.f32 PyG's full-graph outputs for every node of the
                        target type, f32 LE
  reference/subgraph.json + reference/*.bin: one sampled typed subgraph and
                        onnxruntime's outputs on it
  weights.safetensors   (train only) the trained state_dict
"""
import argparse
import json
import os
import re
import sys
import time

import numpy as np

import pyg_model
from common import file_sha256, progress, sample, session_of
from pyg_model import OPSET, OUTPUT, TOLERANCE, row_diff

NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def check_name(kind, name):
    """A type or relation name usable in an input name: letters, digits
    and single underscores, starting with a letter (`__` separates the
    parts of an input name)."""
    if not NAME.match(name) or "__" in name:
        sys.exit(f"{kind} {name!r}: use letters, digits and single underscores, starting with a "
                 "letter ('__' separates the parts of an input name)")


def edge_key(edge_type):
    return "__".join(edge_type)


def x_input(node_type, featured):
    return f"x__{node_type}" if featured else f"n_id__{node_type}"


def edge_input(edge_type):
    return "edge_index__" + edge_key(edge_type)


class TypedDataset:
    """A dataset in the typed layout (docs/graph-index.md, "Typed datasets"),
    checked: every file's size, every edge's ids in range, pairs unique and
    sorted."""

    def __init__(self, path, labels=True):
        with open(os.path.join(path, "meta.json")) as f:
            self.meta = meta = json.load(f)
        if "node_types" not in meta or "edge_types" not in meta:
            sys.exit(f"{path}/meta.json has no node_types and edge_types: not a typed dataset "
                     "(pyg_model.py reads the one-type layout)")
        self.name = meta.get("name")
        self.num_nodes, self.feature_dim, self.x = {}, {}, {}
        for t in meta["node_types"]:
            name = t["name"]
            check_name("node type", name)
            n, d = int(t["num_nodes"]), int(t.get("feature_dim", 0))
            self.num_nodes[name], self.feature_dim[name] = n, d
            if d:
                if t.get("dtype", "f32") != "f32":
                    sys.exit(f"node type {name}: dtype {t['dtype']!r}, the tooling reads f32")
                file = os.path.join(path, t["features"])
                x = np.fromfile(file, dtype="<f4")
                if x.size != n * d:
                    sys.exit(f"{file}: {x.size} values, {n} x {d} expected")
                self.x[name] = x.reshape(n, d)
        self.node_types = list(self.num_nodes)
        self.edges = {}
        for e in meta["edge_types"]:
            et = (e["src"], e["relation"], e["dst"])
            check_name("relation", et[1])
            for t in (et[0], et[2]):
                if t not in self.num_nodes:
                    sys.exit(f"edge type {et}: node type {t!r} is not in node_types")
            file = os.path.join(path, e["edges"])
            pairs = np.fromfile(file, dtype="<u4").reshape(-1, 2).astype(np.int64)
            if len(pairs) != int(e["num_edges"]):
                sys.exit(f"{file}: {len(pairs)} edges, meta.json says {e['num_edges']}")
            if len(pairs) and (pairs[:, 0].max() >= self.num_nodes[et[0]]
                               or pairs[:, 1].max() >= self.num_nodes[et[2]]):
                sys.exit(f"{file}: a node id past its type's count")
            keys = pairs[:, 0] * self.num_nodes[et[2]] + pairs[:, 1]
            if len(keys) > 1 and not (np.diff(keys) > 0).all():
                sys.exit(f"{file}: pairs must be unique and sorted by (src, dst)")
            self.edges[et] = pairs
        self.edge_types = list(self.edges)
        self.y = self.split = None
        self.target_type = None
        label = meta.get("labels")
        if label:
            self.target_type = label["node_type"]
            self.num_classes = int(label["num_classes"])
            n = self.num_nodes[self.target_type]
            self.y = np.fromfile(os.path.join(path, label["labels"]), dtype="<i4")
            self.split = np.fromfile(os.path.join(path, label["split"]), dtype="u1")
            if len(self.y) != n or len(self.split) != n:
                sys.exit(f"{path}: labels and split need one entry per {self.target_type}")
        elif labels:
            sys.exit(f"{path} has no labels: training needs labels and a split")
        # Sampling lists: for each edge type, each destination node's
        # sources (who sends it messages), sorted.
        self.lists = {}
        for et, pairs in self.edges.items():
            n_dst = self.num_nodes[et[2]]
            order = np.lexsort((pairs[:, 0], pairs[:, 1]))
            indptr = np.zeros(n_dst + 1, dtype=np.int64)
            np.cumsum(np.bincount(pairs[:, 1], minlength=n_dst), out=indptr[1:])
            self.lists[et] = (indptr, pairs[order, 0])

    def featured(self, node_type):
        return self.feature_dim[node_type] > 0

    def full_graph(self):
        """x_dict (features, or every id) and edge_index_dict of the whole
        graph, as numpy."""
        x = {t: self.x[t] if self.featured(t) else np.arange(self.num_nodes[t], dtype=np.int64)
             for t in self.node_types}
        edge_index = {et: np.ascontiguousarray(p.T) for et, p in self.edges.items()}
        return x, edge_index

    def rows(self, n_id):
        """x_dict of a sampled subgraph: each type's rows, or its ids."""
        return {t: np.ascontiguousarray(self.x[t][ids]) if self.featured(t) else ids
                for t, ids in n_id.items()}


def torch_modules():
    torch = pyg_model.torch_modules()[0]
    import torch_geometric.nn as pyg_nn
    return torch, pyg_nn


def build_net(arch, ds, hidden, out_dim, layers, embedding_dim, head=False):
    """A heterogeneous GNN over `ds`'s types answering for its target type:
    `to_hetero` of a GraphSAGE (sum over edge types) or a stack of
    `HeteroConv` of SAGEConv. A type without features gets an embedding
    table of `embedding_dim` by global id. With `head`, the GNN gives a
    `hidden` embedding and a linear layer the classes (`encode` returns
    the embedding). Called as model(x_dict, edge_index_dict)."""
    torch, pyg_nn = torch_modules()
    F = torch.nn.functional
    metadata = (ds.node_types, ds.edge_types)
    target = ds.target_type
    last_out = hidden if head else out_dim

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            dims = [hidden] * (layers - 1) + [last_out]
            self.convs = torch.nn.ModuleList(pyg_nn.SAGEConv((-1, -1), d) for d in dims)

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = torch.nn.ModuleDict({
                t: torch.nn.Embedding(ds.num_nodes[t], embedding_dim)
                for t in ds.node_types if not ds.featured(t)})
            if arch == "to_hetero":
                self.gnn = pyg_nn.to_hetero(Sage(), metadata, aggr="sum")
                self.convs = None
            elif arch == "heteroconv":
                dims = [hidden] * (layers - 1) + [last_out]
                self.convs = torch.nn.ModuleList(
                    pyg_nn.HeteroConv({et: pyg_nn.SAGEConv((-1, -1), d) for et in ds.edge_types},
                                      aggr="sum")
                    for d in dims)
                self.gnn = None
            else:
                sys.exit(f"arch {arch!r}: to_hetero or heteroconv")
            self.head = torch.nn.Linear(hidden, out_dim) if head else None

        def encode(self, x_dict, edge_index_dict):
            x_dict = {t: self.embeddings[t](x) if t in self.embeddings else x
                      for t, x in x_dict.items()}
            if self.gnn is not None:
                return self.gnn(x_dict, edge_index_dict)[target]
            for i, conv in enumerate(self.convs):
                out = conv(x_dict, edge_index_dict)
                # A type no edge type reaches keeps its input (HeteroConv
                # returns only the types it wrote).
                x_dict = {t: (out[t].relu() if i < len(self.convs) - 1 else out[t])
                          if t in out else x_dict[t] for t in x_dict}
            return x_dict[target]

        def forward(self, x_dict, edge_index_dict):
            h = self.encode(x_dict, edge_index_dict)
            return self.head(F.relu(h)) if self.head is not None else h

    net = Net()
    # Lazy layers take their widths from a first run.
    x, edge_index = ds.full_graph()
    with torch.no_grad():
        net(to_torch(x), to_torch(edge_index))
    return net


def to_torch(arrays):
    torch = torch_modules()[0]
    return {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in arrays.items()}


def flat_wrapper(model, ds, target_type):
    """The module torch.onnx.export traces: flat tensors in, in the order
    of `input_spec(ds)`, the dicts PyG's heterogeneous models take built
    from them, the target type's rows out (dict outputs are exported by
    neither exporter)."""
    torch = torch_modules()[0]
    spec = input_spec(ds)

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            x_dict, edge_index_dict = {}, {}
            for (kind, key, _), tensor in zip(spec, tensors):
                if kind == "edge":
                    edge_index_dict[key] = tensor
                else:
                    x_dict[key] = tensor
            out = self.model(x_dict, edge_index_dict)
            return out[target_type] if isinstance(out, dict) else out

    return Flat().eval()


def input_spec(ds):
    """(kind, key, input name) of every input a model over `ds` can take:
    each node type's rows or ids, then each edge type's edge_index."""
    spec = [("node", t, x_input(t, ds.featured(t))) for t in ds.node_types]
    spec += [("edge", et, edge_input(et)) for et in ds.edge_types]
    return spec


def flat_inputs(ds, x, edge_index):
    """The flat input dict of a (sub)graph, every name of input_spec."""
    feed = {}
    for kind, key, name in input_spec(ds):
        feed[name] = np.ascontiguousarray(x[key] if kind == "node" else edge_index[key])
    return feed


def pyg_outputs(model, x, edge_index, target_type):
    torch = torch_modules()[0]
    with torch.no_grad():
        out = model(to_torch(x), to_torch(edge_index))
    return (out[target_type] if isinstance(out, dict) else out).numpy()


def export_onnx(model, ds, target_type, path, x, edge_index):
    torch = torch_modules()[0]
    import warnings
    spec = input_spec(ds)
    feed = flat_inputs(ds, x, edge_index)
    names = [name for _, _, name in spec]
    dynamic = {}
    for kind, _, name in spec:
        dynamic[name] = {1: f"{name}_e"} if kind == "edge" else {0: f"{name}_n"}
    dynamic[OUTPUT] = {0: "n"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(flat_wrapper(model, ds, target_type),
                          tuple(torch.from_numpy(feed[n]) for n in names), path, dynamo=False,
                          opset_version=OPSET, input_names=names, output_names=[OUTPUT],
                          dynamic_axes=dynamic)


def parse_fanouts(ds, default, overrides):
    """Fanouts per edge type and hop: `default` ("10,5": every edge type)
    and overrides "src__rel__dst=a,b" (or "rel=a,b" where the relation
    names one edge type). Every edge type has the same number of hops, 1
    to 3; a fanout is 0 (the type is not sampled at that hop) or more."""
    def numbers(text, what):
        return pyg_model.parse_fanouts(text, least=0, what=what)

    if isinstance(default, dict):
        fanouts = {}
        for key, values in default.items():
            et = key if isinstance(key, tuple) else edge_type_named(ds, key)
            fanouts[et] = [int(v) for v in values]
        missing = [edge_key(et) for et in ds.edge_types if et not in fanouts]
        if missing:
            sys.exit(f"fanouts: no fanouts for {', '.join(missing)}: give every edge type's")
    else:
        base = numbers(default, "fanouts")
        fanouts = {et: list(base) for et in ds.edge_types}
    for text in overrides or []:
        key, _, values = text.partition("=")
        fanouts[edge_type_named(ds, key)] = numbers(values, f"fanout {key}")
    hops = {len(v) for v in fanouts.values()}
    if len(hops) != 1 or not 1 <= hops.pop() <= 3:
        sys.exit("fanouts: every edge type needs the same number of hops, 1 to 3")
    return fanouts


def edge_type_named(ds, key):
    matches = [et for et in ds.edge_types if key in (edge_key(et), et[1])]
    if len(matches) != 1:
        known = ", ".join(edge_key(et) for et in ds.edge_types)
        sys.exit(f"edge type {key!r}: {'ambiguous' if matches else 'unknown'}; give one of {known}")
    return matches[0]


def pad_typed(ds, feed, kept):
    """A typed subgraph's inputs as the worker runs them (gnn-worker
    TypedPadding): a node type the model reads with no rows, or at an end
    of an edge type it reads with no edges, gets one more row (zeros, or
    node id 0); each such edge type one edge between its ends' extra rows.
    No edge reaches an extra row from a real one. Returns the padded feed
    and the inputs that were empty."""
    padded = dict(feed)
    dummy, empty = set(), []
    for kind, key, name in input_spec(ds):
        if name not in kept:
            continue
        if kind == "node" and len(feed[name]) == 0:
            dummy.add(key)
            empty.append(name)
        elif kind == "edge" and feed[name].shape[1] == 0:
            dummy.update([key[0], key[2]])
            empty.append(name)
    for t in dummy:
        name = x_input(t, ds.featured(t))
        rows = feed[name]
        extra = np.zeros((1,) + rows.shape[1:], dtype=rows.dtype)
        padded[name] = np.ascontiguousarray(np.concatenate([rows, extra]))
    for kind, et, name in input_spec(ds):
        if kind == "edge" and name in empty:
            src, dst = (len(feed[x_input(t, ds.featured(t))]) for t in (et[0], et[2]))
            padded[name] = np.array([[src], [dst]], dtype=np.int64)
    return padded, empty


def emptied(ds, x, edge_index, node_type=None, edge_type=None):
    """The subgraph with node type `node_type`'s rows and edges (or edge
    type `edge_type`'s edges) taken out."""
    x = dict(x)
    edge_index = dict(edge_index)
    if node_type is not None:
        x[node_type] = x[node_type][:0]
    for et in ds.edge_types:
        if et == edge_type or node_type in (et[0], et[2]):
            edge_index[et] = np.zeros((2, 0), dtype=np.int64)
    return x, edge_index


def check_export(model, session, ds, target_type, fanouts, seed, subgraphs=8):
    """onnxruntime against PyG: sampled subgraphs at `fanouts` (1 and 16
    targets), the whole graph, a target some edge type reaches with no
    edge, the same with negated, scaled features, and a busy target's
    subgraph with each other node type emptied, with each edge type
    emptied, and with nothing but the target (an unknown id). A subgraph
    with an empty input is run padded, as the worker runs it (pad_typed).
    Exits if a case differs by more than TOLERANCE (relative to the row)
    or cannot run; a case onnxruntime cannot run unpadded while PyG can is
    recorded in `cannot_run` (some attention models fail so inside
    onnxruntime 1.31.1), served padded."""
    rng = np.random.default_rng(seed)
    n = ds.num_nodes[target_type]
    kept = [i.name for i in session.get_inputs()]
    results = {"max_rel_diff": 0.0, "cases": {}, "cannot_run": []}
    import onnxruntime as ort
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failure is reported below, not logged twice

    def compare(name, x, edge_index):
        try:
            want = pyg_outputs(model, x, edge_index, target_type)
        except Exception as e:  # PyG itself cannot: nothing to compare with
            results["cases"][name] = {"pyg_error": str(e).splitlines()[0][:300]}
            progress(f"note: PyG cannot run this model on the {name} subgraph; not compared")
            return
        feed = flat_inputs(ds, x, edge_index)
        padded, empty = pad_typed(ds, feed, kept)
        if empty:
            try:
                session.run(None, {k: feed[k] for k in kept}, quiet)
            except Exception as e:  # onnxruntime's own failure, recorded
                error = str(e).splitlines()[0][:300]
                results["cannot_run"].append({"case": name, "empty_inputs": empty,
                                              "error": error})
                progress(f"note: onnxruntime cannot run this model on the {name} subgraph, whose "
                         f"{', '.join(empty)} are empty; the worker runs it padded")
        try:
            got = session.run(None, {k: padded[k] for k in kept}, quiet)[0][:len(want)]
        except Exception as e:  # onnxruntime's own failure
            error = str(e).splitlines()[0][:300]
            how = f" even padded ({', '.join(empty)} were empty)" if empty else ""
            sys.exit(f"onnxruntime cannot run the export on the {name} subgraph{how} ({error}); "
                     "PyG can: fix the model or export it another way")
        diff = row_diff(want, got)
        sizes = {x_input(t, ds.featured(t)): int(len(v)) for t, v in x.items()}
        sizes.update({edge_input(et): int(v.shape[1]) for et, v in edge_index.items()})
        results["cases"][name] = {"sizes": sizes, "max_rel_diff": diff, "padded": empty}
        results["max_rel_diff"] = max(results["max_rel_diff"], diff)
        if diff > TOLERANCE:
            sys.exit(f"onnxruntime differs from PyG by {diff:.3g} (relative to the row) on the "
                     f"{name} subgraph: the export is not faithful; fix the model or export it "
                     "another way")

    for i in range(subgraphs):
        targets = rng.choice(n, 1 if i % 2 == 0 else min(16, n), replace=False)
        n_id, edge_index, _, _ = sample(ds, target_type, targets, fanouts, rng)
        compare(f"sampled-{len(targets)}-{i}", ds.rows(n_id), edge_index)
    x, edge_index = ds.full_graph()
    compare("full-graph", x, edge_index)
    # A target with no edge of some type reaching it (an empty edge set).
    into = [et for et in ds.edge_types if et[2] == target_type]
    for et in into:
        indptr, _ = ds.lists[et]
        lonely = np.flatnonzero(np.diff(indptr) == 0)
        if len(lonely):
            n_id, edge_index, _, _ = sample(ds, target_type, [int(lonely[0])], fanouts, None)
            compare(f"no-{edge_key(et)}", ds.rows(n_id), edge_index)
            scaled = {t: (v * np.float32(-3.0) if ds.featured(t) else v)
                      for t, v in ds.rows(n_id).items()}
            compare(f"no-{edge_key(et)}-negative-features", scaled, edge_index)
            break
    # Every type and edge type empty in turn, around the target with the
    # most edges into it; then the target alone (an unknown id's subgraph).
    degree = sum(np.diff(ds.lists[et][0]) for et in into) if into else np.zeros(n)
    busy = int(np.argmax(degree))
    n_id, edge_index, _, _ = sample(ds, target_type, [busy], fanouts,
                                          np.random.default_rng(seed + 3))
    x = ds.rows(n_id)
    for t in ds.node_types:
        if t != target_type:
            compare(f"empty-{t}", *emptied(ds, x, edge_index, node_type=t))
    for et in ds.edge_types:
        compare(f"empty-{edge_key(et)}", *emptied(ds, x, edge_index, edge_type=et))
    alone = {t: (v[:1] if t == target_type else v[:0]) for t, v in x.items()}
    no_edges = {et: np.zeros((2, 0), dtype=np.int64) for et in ds.edge_types}
    compare("target-alone", alone, no_edges)
    return results


def write_reference(out, session, ds, target_type, fanouts, full_outputs, seed):
    ref = os.path.join(out, "reference")
    os.makedirs(ref, exist_ok=True)
    full_outputs.astype("<f4").tofile(os.path.join(ref, "outputs.f32"))
    rng = np.random.default_rng(seed + 7)
    targets = rng.choice(ds.num_nodes[target_type], min(8, ds.num_nodes[target_type]),
                         replace=False)
    n_id, edge_index, num_nodes, num_edges = sample(ds, target_type, targets, fanouts, rng)
    feed = flat_inputs(ds, ds.rows(n_id), edge_index)
    kept = [i.name for i in session.get_inputs()]
    got = session.run(None, {k: feed[k] for k in kept})[0]
    files = {}
    for name, array in feed.items():
        dtype = "<f4" if array.dtype == np.float32 else "<i8"
        array.astype(dtype).tofile(os.path.join(ref, f"{name}.bin"))
        files[name] = {"file": f"{name}.bin", "dtype": "f32" if dtype == "<f4" else "i64",
                       "shape": list(array.shape)}
    for t, ids in n_id.items():
        ids.astype("<i8").tofile(os.path.join(ref, f"global_ids__{t}.bin"))
    got.astype("<f4").tofile(os.path.join(ref, "ort_outputs.bin"))
    with open(os.path.join(ref, "subgraph.json"), "w") as f:
        json.dump({"target_type": target_type, "targets": [int(t) for t in targets],
                   "inputs": files, "global_ids": {t: f"global_ids__{t}.bin" for t in n_id},
                   "num_sampled_nodes": num_nodes,
                   "num_sampled_edges": {edge_key(et): v for et, v in num_edges.items()},
                   "outputs": {"file": "ort_outputs.bin", "shape": list(got.shape)}}, f, indent=2)


def export(model, *, dataset, out, fanouts, overrides=None, target_type=None, output="classes",
           graph_version=1, architecture=None, seed=0, check_subgraphs=8, extra=None):
    """Exports a heterogeneous PyG model (`model(x_dict, edge_index_dict)`)
    for the typed subgraph layout: generates the flat-input wrapper, runs
    torch.onnx.export, checks onnxruntime against PyG (check_export) and
    writes model.onnx, manifest.json and reference/ into `out`. `fanouts`:
    "10,5" for every edge type, or a dict edge type -> fanouts per hop;
    `overrides`: "src__rel__dst=a,b" strings. Returns the manifest."""
    torch = torch_modules()[0]
    import torch_geometric
    if output not in ("classes", "embedding"):
        sys.exit(f"output {output!r}: classes or embedding")
    ds = dataset if isinstance(dataset, TypedDataset) else TypedDataset(dataset, labels=False)
    target_type = target_type or ds.target_type
    if target_type not in ds.num_nodes:
        sys.exit(f"target type {target_type!r}: give one of {', '.join(ds.node_types)}")
    fanouts = parse_fanouts(ds, fanouts, overrides)
    model.eval()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.onnx")
    # The traced example: the whole graph (no size is 0 or 1). PyG's full
    # run comes first: it also gives lazy layers (in_channels -1) their
    # widths, as PyG asks before any other use of such a model.
    x, edge_index = ds.full_graph()
    full = pyg_outputs(model, x, edge_index, target_type)
    export_onnx(model, ds, target_type, path, x, edge_index)
    extrema_fixed = pyg_model.fix_scatter_extrema(path)
    session = session_of(path)
    kept = [i.name for i in session.get_inputs()]
    dropped = [name for _, _, name in input_spec(ds) if name not in kept]
    if dropped:
        progress(f"note: the export dropped {', '.join(dropped)} (they cannot reach the output); "
                 "the worker feeds exactly the inputs the model declares")
    started = time.time()
    check = check_export(model, session, ds, target_type, fanouts, seed, check_subgraphs)
    width = int(full.shape[1])
    write_reference(out, session, ds, target_type, fanouts, full, seed)
    node_types = []
    for t in ds.node_types:
        entry = {"name": t, "num_nodes": ds.num_nodes[t], "input": x_input(t, ds.featured(t))}
        if ds.featured(t):
            entry.update(feature_dim=ds.feature_dim[t], dtype="f32")
        node_types.append(entry)
    manifest = {
        "format_version": 1,
        "layout": "subgraph",
        "architecture": architecture or type(model).__name__,
        "dataset": ds.name,
        "node_types": node_types,
        "edge_types": [{"src": s, "relation": r, "dst": d, "input": edge_input((s, r, d))}
                       for s, r, d in ds.edge_types],
        "target_type": target_type,
        "fanouts": {edge_key(et): v for et, v in fanouts.items()},
        "output": output,
        "graph_version": graph_version,
        "opset": OPSET,
        "inputs": kept,
        "outputs": [OUTPUT],
        "exporter": {"torch": torch.__version__.split("+")[0],
                     "torch_geometric": torch_geometric.__version__, "onnx_exporter": "torchscript",
                     "scatter_extrema_fixed": extrema_fixed, "dropped_inputs": dropped,
                     "model_sha256": file_sha256(path)},
        "check": dict(check, seconds=round(time.time() - started, 1), tolerance=TOLERANCE),
    }
    manifest["num_classes" if output == "classes" else "embedding_dim"] = width
    if ds.y is not None and output == "classes" and target_type == ds.target_type:
        manifest["offline"] = {
            f"{name}_accuracy": float((full[ds.split == code].argmax(1)
                                       == ds.y[ds.split == code]).mean())
            for name, code in (("val", 1), ("test", 2))}
    manifest.update(extra or {})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


def train(net, ds, *, epochs, lr, weight_decay, seed):
    """Full-graph training on the target type's split 0, keeping the
    weights of the best validation epoch. Returns (val accuracy, epoch)."""
    torch = torch_modules()[0]
    F = torch.nn.functional
    torch.manual_seed(seed)
    x, edge_index = ds.full_graph()
    xt, et = to_torch(x), to_torch(edge_index)
    y = torch.from_numpy(ds.y).long()
    train_idx = torch.from_numpy(np.flatnonzero(ds.split == 0))
    val_idx = torch.from_numpy(np.flatnonzero(ds.split == 1))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)

    def train_epoch():
        opt.zero_grad()
        loss = F.cross_entropy(net(xt, et)[train_idx], y[train_idx])
        loss.backward()
        opt.step()

    def val_accuracy():
        pred = net(xt, et).argmax(1)
        return float((pred[val_idx] == y[val_idx]).float().mean())

    return pyg_model.keep_best(net, epochs, train_epoch, val_accuracy)


def neighbor_loader_accuracy(model, ds, fanouts, runs, seed):
    """Test accuracy of NeighborLoader-style inference at `fanouts`, one
    target a batch, over `runs` seeded runs: (mean, each run's)."""
    idx = np.flatnonzero(ds.split == 2)
    accs = []
    for run in range(runs):
        rng = np.random.default_rng(seed + 1000 + run)
        correct = 0
        for t in idx:
            n_id, edge_index, _, _ = sample(ds, ds.target_type, [t], fanouts, rng)
            out = pyg_outputs(model, ds.rows(n_id), edge_index, ds.target_type)
            correct += int(out[0].argmax() == ds.y[t])
        accs.append(correct / len(idx))
    return float(np.mean(accs)), accs


def cmd_train(args):
    torch = torch_modules()[0]
    started = time.time()
    ds = TypedDataset(args.dataset)
    fanouts = parse_fanouts(ds, args.fanouts, args.fanout)
    torch.manual_seed(args.seed)
    embedding = args.output == "embedding"
    net = build_net(args.arch, ds, args.hidden, ds.num_classes, args.layers, args.embedding_dim,
                    head=embedding)
    val, epoch = train(net, ds, epochs=args.epochs, lr=args.lr, weight_decay=args.weight_decay,
                       seed=args.seed)
    x, edge_index = ds.full_graph()
    full = pyg_outputs(net, x, edge_index, ds.target_type)
    test = ds.split == 2
    test_acc = float((full[test].argmax(1) == ds.y[test]).mean())
    training = {"arch": args.arch, "layers": args.layers, "hidden": args.hidden,
                "embedding_dim": args.embedding_dim, "epochs": args.epochs, "best_epoch": epoch,
                "lr": args.lr, "weight_decay": args.weight_decay, "seed": args.seed,
                "val_accuracy": val, "test_accuracy": test_acc,
                "seconds": round(time.time() - started, 1)}
    extra = {"training": training}
    if not embedding and args.loader_runs > 0:
        mean, runs = neighbor_loader_accuracy(net, ds, fanouts, args.loader_runs, args.seed)
        extra["neighbor_loader"] = {"fanouts": {edge_key(et): v for et, v in fanouts.items()},
                                    "batch_size": 1, "runs": runs, "mean_test_accuracy": mean}
    manifest = export(pyg_model.Encoder.of(net) if embedding else net, dataset=ds, out=args.out,
                      fanouts=fanouts, output=args.output, graph_version=args.graph_version,
                      architecture=f"pyg-{args.arch}-sage-{args.layers}layer", seed=args.seed,
                      extra=extra)
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()},
              os.path.join(args.out, "weights.safetensors"))
    print(json.dumps({"out": args.out, "arch": args.arch, "test_accuracy": test_acc,
                      "val_accuracy": val, "best_epoch": epoch,
                      "check_max_rel_diff": manifest["check"]["max_rel_diff"],
                      "inputs": manifest["inputs"],
                      "neighbor_loader": extra.get("neighbor_loader"),
                      "seconds": round(time.time() - started, 1)}))


def cmd_export(args):
    model = pyg_model.load_module(args.module, json.loads(args.init) if args.init else {})
    if args.state_dict:
        missing, unexpected = model.load_state_dict(pyg_model.load_state(args.state_dict),
                                                    strict=False)
        if missing or unexpected:
            sys.exit(f"--state-dict {args.state_dict} does not fit {args.module}: missing "
                     f"{list(missing)}, unexpected {list(unexpected)}")
    manifest = export(model, dataset=args.dataset, out=args.out, fanouts=args.fanouts,
                      overrides=args.fanout, target_type=args.target_type, output=args.output,
                      graph_version=args.graph_version, architecture=args.module, seed=args.seed)
    print(json.dumps({"out": args.out, "check": manifest["check"]["max_rel_diff"],
                      "inputs": manifest["inputs"], "offline": manifest.get("offline")}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--dataset", required=True, help="a dataset directory in the typed layout")
        p.add_argument("--out", required=True, help="model directory to write")
        p.add_argument("--fanouts", default="10,5",
                       help="fanouts per hop for every edge type (default 10,5)")
        p.add_argument("--fanout", action="append", metavar="SRC__REL__DST=A,B",
                       help="one edge type's fanouts per hop (repeatable; the relation alone "
                            "where it names one edge type)")
        p.add_argument("--output", choices=["classes", "embedding"], default="classes")
        p.add_argument("--graph-version", type=int, default=1)
        p.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train", help="train a to_hetero or HeteroConv model, export and check it")
    common(t)
    t.add_argument("--arch", choices=["to_hetero", "heteroconv"], default="to_hetero")
    t.add_argument("--layers", type=int, default=2, choices=[1, 2, 3])
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--embedding-dim", type=int, default=16,
                   help="width of the embedding of each node type without features")
    t.add_argument("--epochs", type=int, default=100)
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--loader-runs", type=int, default=1,
                   help="runs of NeighborLoader-style inference at the fanouts for the manifest")
    e = sub.add_parser("export", help="export your own heterogeneous PyG module")
    common(e)
    e.add_argument("--module", required=True, help="package.module:Class, importable from here")
    e.add_argument("--init", help="the class's keyword arguments, as JSON")
    e.add_argument("--state-dict", help="its trained weights (torch.save or .safetensors)")
    e.add_argument("--target-type", help="the node type it answers for (default: the labelled one)")
    args = parser.parse_args()
    {"train": cmd_train, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    main()
