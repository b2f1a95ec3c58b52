#!/usr/bin/env python3
"""PyTorch Geometric model tooling for gnn-worker's subgraph layout, one
for a one-type graph and a typed (heterogeneous) graph: read the dataset
(`common.Graph`; a one-type dataset is the 1x1 typed graph), sample as
NeighborLoader samples (`common.sample`), train a PyG GNN, export any PyG
model with torch.onnx.export (opset pinned), check onnxruntime against PyG
on sampled and adversarial subgraphs before anything is written, and write
the manifest and the reference outputs the worker and the tests read.

    python gnn-worker/model/pyg_model.py train --dataset DIR --out models/m \
        [--arch sage|gcn|gat|gin (one-type) | to_hetero|heteroconv (typed)] \
        [--layers 2] [--hidden 64] [--fanouts 20,10] [--fanout SRC__REL__DST=A,B ...] \
        [--mode full|minibatch] [--output classes|embedding]
    python gnn-worker/model/pyg_model.py export --module mymodels:Net --init '{"hidden": 64}' \
        --state-dict net.pt --dataset DIR --out models/net [--fanouts 20,10] [--target-type T]

or, from the Python that trained the model:

    sys.path.insert(0, "gnn-worker/model")
    from pyg_model import export
    model.eval()
    export(model, dataset="DIR", fanouts=[20, 10], out="models/net")

The dataset's kind decides the call and the names. A one-type model is
called `model(x, edge_index)`; its ONNX inputs are `x` [n, D] f32 and
`edge_index` [2, e] int64. A heterogeneous model is called as PyG calls
one, `model(x_dict, edge_index_dict)`, and returns the target type's rows
(a tensor, or a dict holding them); a node type with features has its rows
in `x_dict` (float32 [n, D]), a type without features its global ids
(int64 [n], PyG's `n_id`); its inputs are named by the rule of
docs/model.md, "Bring your own heterogeneous model": `x__<type>`,
`n_id__<type>` and `edge_index__<src>__<relation>__<dst>`. Either way the
output `out` is [n, C], one row per node (of the target type), the targets
first. Where the dataset's edges carry data (docs/graph-index.md, "Edge
data"), a forward parameter named `edge_attr`, `edge_weight` or
`edge_time` (a typed model's: the same, or with `_dict`) is given it by
keyword, in edge_index's column order, as PyG's NeighborLoader batch has
it: inputs `edge_attr` [e, A] f32, `edge_weight` [e] f32, `edge_time` [e]
int64 (typed: `edge_attr__<src>__<relation>__<dst>` ..., for each edge
type that carries it).

writes into the model directory:
  model.onnx            TorchScript exporter, opset 18, dynamic sizes; a max
                        or min scatter the exporter got wrong is corrected
                        (`fix_scatter_extrema`)
  manifest.json         layout "subgraph"; one-type: the feature dim and one
                        fanout per hop; typed: the node types (features or
                        ids), the edge types, the target type and the
                        fanouts per edge type and hop; the inputs, the
                        output, what the check measured, offline accuracy
  reference/outputs.f32 PyG's full-graph outputs for every node (of the
                        target type), f32 LE
  reference/subgraph.json + reference/*.bin: one sampled subgraph (each
                        input as <input>.bin, each type's global ids as
                        global_ids__<type>.bin) and onnxruntime's outputs on
                        it (ort_outputs.bin)
  weights.safetensors   (train only) the trained state_dict, PyG's names

The subgraphs are laid out as the sidecar lays out a subgraph-layout
response and as NeighborLoader(num_neighbors=fanouts, replace=False) builds
a batch: per type the unique targets first, then each hop's newly reached
nodes; per edge type an edge (source, destination) per sampled neighbour
(docs/protocol.md, "The subgraph layout"). NeighborLoader itself needs
pyg-lib or torch-sparse, which do not install from PyPI here, so the
tooling samples the same way itself (`common.sample`).
"""
import argparse
import importlib
import json
import os
import sys
import time

import numpy as np

from common import (EDGE_DATA, ONE_EDGE_TYPE, ONE_TYPE, Edges, Graph, edge_key, fanout_list,
                    file_sha256, neighbour_lists, progress, sample, session_of)

OPSET = 18
OUTPUT = "out"
ONE_TYPE_ARCHS = ("sage", "gcn", "gat", "gin", "gine", "transformer")
TYPED_ARCHS = ("to_hetero", "heteroconv")
# Outputs are compared relative to the row's magnitude: a float32 sum of
# large terms differs by its own rounding whatever computes it.
TOLERANCE = 1e-5
# On features x1,000 an attention softmax over large logits amplifies
# float32 rounding alone to 3e-5 .. 1.1e-4 (a to_hetero GAT on
# OpenFlights, the same seed: the sums' order varies between runs on a
# busy machine); the exporter's hazards are 1e-3 and more off there.
LARGE_TOLERANCE = 3e-4
# A case past its tolerance is measured against PyG in float64: how far
# float32 rounding alone moves PyG's own answer there (its conditioning;
# onnxruntime's difference from PyG was at most 3.8 times it over 20
# trainings of a to_hetero GAT on OpenFlights, every case) bounds what
# rounding explains, and the case passes within this many times that.
ROUNDING_FACTOR = 8
# Past this many edges the check does not run the whole graph through
# onnxruntime (PyG's full-graph outputs are computed either way).
FULL_GRAPH_CHECK_EDGES = 2_000_000


def full_edge_index(n, edges):
    """PyG's edge_index of a one-type graph: message u -> v for every
    neighbour u of v (the sidecar's lists, so sampling with covering fanouts
    reaches exactly these edges)."""
    indptr, indices = neighbour_lists(n, edges)
    node = np.repeat(np.arange(n), np.diff(indptr))
    return np.stack([indices, node]).astype(np.int64)


def sample_subgraph(indptr, indices, targets, fanouts, rng=None):
    """`common.sample` on a one-type graph's neighbour lists: (n_id,
    edge_index [2, E] local, num_sampled_nodes, num_sampled_edges)."""
    n_id, edge_index, num_nodes, num_edges = sample(
        Graph.from_lists(indptr, indices), ONE_TYPE, targets,
        {ONE_EDGE_TYPE: [int(f) for f in fanouts]}, rng)
    return (n_id[ONE_TYPE], edge_index[ONE_EDGE_TYPE], num_nodes[ONE_TYPE],
            num_edges[ONE_EDGE_TYPE])


def torch_modules():
    import warnings
    warnings.filterwarnings("ignore", category=FutureWarning)
    import torch
    import torch_geometric.nn as pyg_nn
    return torch, torch.nn.functional, pyg_nn


# --- the model's inputs: names, the call, the export ----------------------

def x_input(ds, node_type):
    if ds.one_type:
        return "x"
    return f"x__{node_type}" if ds.featured(node_type) else f"n_id__{node_type}"


def edge_input(ds, edge_type):
    return "edge_index" if ds.one_type else "edge_index__" + edge_key(edge_type)


def data_input(ds, kind, edge_type):
    """The input name of an edge type's data of `kind` (EDGE_DATA):
    `edge_attr`, `edge_weight`, `edge_time`, typed `edge_attr__<key>`..."""
    return f"edge_{kind}" if ds.one_type else f"edge_{kind}__{edge_key(edge_type)}"


# The parameters of a model's forward that take each kind of edge data, by
# PyG's names: a one-type model's tensor, a heterogeneous model's dict per
# edge type (to_hetero keeps the base module's names and takes dicts).
EDGE_PARAMS = {kind: (f"edge_{kind}", f"edge_{kind}_dict") for kind in EDGE_DATA}


def edge_params(model, ds):
    """{kind: parameter name} of the edge data `model` takes: each forward
    parameter named `edge_attr`, `edge_weight` or `edge_time` (or with
    `_dict`) is given its edges' data by keyword where the dataset carries
    it (one with a default is left out where it does not; one without
    ends the export, naming it)."""
    import inspect
    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):  # no signature to read: no edge data
        return {}
    taken = {}
    for kind, names in EDGE_PARAMS.items():
        for name in names:
            if name not in params:
                continue
            if ds.carries(kind):
                taken[kind] = name
            elif params[name].default is inspect.Parameter.empty:
                sys.exit(f"the model's forward takes {name}, and no edge type of the dataset "
                         f"carries edge {kind}s: import data with them (docs/graph-index.md, "
                         "\"Edge data\"), or give the parameter a default (None)")
    return taken


def input_spec(ds, params=None):
    """(kind, key, input name) of every input a model over `ds` can take:
    each node type's rows or ids, then each edge type's edge_index, then
    each kind of edge data of `params` (edge_params; None: every kind the
    dataset carries) of each edge type that carries it."""
    spec = [("node", t, x_input(ds, t)) for t in ds.node_types]
    spec += [("edge", et, edge_input(ds, et)) for et in ds.edge_types]
    kinds = EDGE_DATA if params is None else [k for k in EDGE_DATA if k in params]
    spec += [(kind, et, data_input(ds, kind, et)) for kind in kinds for et in ds.carries(kind)]
    return spec


def flat_inputs(ds, x, edge_index):
    """The flat input dict of a (sub)graph (`edge_index` an `Edges`), every
    name of input_spec."""
    def value(kind, key):
        if kind == "node":
            return x[key]
        return edge_index[key] if kind == "edge" else edge_index.data[kind][key]
    return {name: np.ascontiguousarray(value(kind, key)) for kind, key, name in input_spec(ds)}


def call(model, ds, x, edge_index, target_type):
    """The model on torch dicts, called as PyG calls a model of this
    graph: `model(x, edge_index)` for one type, `model(x_dict,
    edge_index_dict)` for a typed graph, with the edge data it takes by
    keyword (edge_params: `edge_attr=`, or `edge_attr_dict=` per edge type
    that carries it); the target type's rows."""
    data = getattr(edge_index, "data", {})
    extra = {name: (data[kind][ONE_EDGE_TYPE] if ds.one_type else data[kind])
             for kind, name in edge_params(model, ds).items()}
    if ds.one_type:
        out = model(x[ONE_TYPE], edge_index[ONE_EDGE_TYPE], **extra)
    else:
        out = model(x, dict(edge_index), **extra)
    return out[target_type] if isinstance(out, dict) else out


def to_torch(arrays):
    """numpy to torch: a dict of arrays, or an `Edges` with its data."""
    torch = torch_modules()[0]
    tensor = lambda v: torch.from_numpy(np.ascontiguousarray(v))  # noqa: E731
    if isinstance(arrays, Edges):
        return arrays.map(lambda _, v: tensor(v), lambda _k, _e, v: tensor(v))
    return {k: tensor(v) for k, v in arrays.items()}


def pyg_outputs(model, ds, x, edge_index, target_type):
    torch = torch_modules()[0]
    with torch.no_grad():
        return call(model, ds, to_torch(x), to_torch(edge_index), target_type).numpy()


def float64_model(model):
    """A float64 copy of `model` (its floating parameters and buffers), or
    None where the module cannot be copied."""
    import copy
    try:
        return copy.deepcopy(model).double()
    except Exception:  # a module deepcopy cannot copy: no float64 reference
        return None


def pyg_outputs64(model64, ds, x, edge_index, target_type):
    """PyG's answer in float64 (features widened, ids as they are), or None
    where the model does not run so (a float32 constant inside it)."""
    if model64 is None:
        return None
    def widen(v):
        return v.astype(np.float64) if v.dtype == np.float32 else v
    wide = {t: widen(v) for t, v in x.items()}
    if isinstance(edge_index, Edges):
        edge_index = edge_index.map(lambda _, v: v, lambda _k, _e, v: widen(v))
    try:
        return pyg_outputs(model64, ds, wide, edge_index, target_type)
    except Exception:  # the model is float32-only: no float64 reference
        return None


def flat_wrapper(model, ds, target_type):
    """The module torch.onnx.export traces: flat tensors in, in the order
    of `input_spec(ds)`, the call the model takes built from them, the
    target type's rows out (dict outputs are exported by neither
    exporter)."""
    torch = torch_modules()[0]
    spec = input_spec(ds, edge_params(model, ds))

    class Flat(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = model

        def forward(self, *tensors):
            x_dict, edges = {}, Edges({})
            for (kind, key, _), tensor in zip(spec, tensors):
                if kind == "node":
                    x_dict[key] = tensor
                elif kind == "edge":
                    edges[key] = tensor
                else:
                    edges.data.setdefault(kind, {})[key] = tensor
            return call(self.model, ds, x_dict, edges, target_type)

    return Flat().eval()


def export_onnx(model, ds, target_type, path, x, edge_index):
    """torch.onnx.export with the TorchScript exporter (the dynamo one fails
    on GATConv), opset pinned, every node and edge count dynamic."""
    torch = torch_modules()[0]
    import warnings
    spec = input_spec(ds, edge_params(model, ds))
    feed = flat_inputs(ds, x, edge_index)
    names = [name for _, _, name in spec]
    # An edge type's data shares its edge_index's edge count.
    dynamic = {name: ({1: f"{name}_e"} if kind == "edge" else
                      {0: f"{x_input(ds, key)}_n"} if kind == "node" else
                      {0: f"{edge_input(ds, key)}_e"})
               for kind, key, name in spec}
    dynamic[OUTPUT] = {0: "n"}
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(flat_wrapper(model, ds, target_type),
                          tuple(torch.from_numpy(feed[n]) for n in names), path, dynamo=False,
                          opset_version=OPSET, input_names=names, output_names=[OUTPUT],
                          dynamic_axes=dynamic)


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


def row_diff(a, b):
    """Largest difference of two output matrices, each row's relative to
    its magnitude (at least 1)."""
    if a.size == 0:
        return 0.0
    scale = np.maximum(1.0, np.abs(a).max(axis=1, keepdims=True))
    return float((np.abs(a - b) / scale).max())


# --- fanouts ------------------------------------------------------------------

def parse_fanouts(ds, default, overrides=None):
    """Fanouts per edge type and hop: `default` ("10,5" or [10, 5]: every
    edge type; or a dict edge type -> fanouts) and overrides
    "src__rel__dst=a,b" (or "rel=a,b" where the relation names one edge
    type). Every edge type has the same number of hops, 1 to 3; a typed
    graph's fanout may be 0 (the type is not sampled at that hop), a
    one-type graph's is at least 1; -1 is every neighbour (PyG's
    num_neighbors -1; served up to the sidecar's max_fanouts)."""
    least = 1 if ds.one_type else 0

    def numbers(text, what):
        return fanout_list(text, least=least, what=what)

    if isinstance(default, dict):
        fanouts = {}
        for key, values in default.items():
            et = key if isinstance(key, tuple) else edge_type_named(ds, key)
            fanouts[et] = numbers(",".join(str(v) for v in values), f"fanout {edge_key(et)}")
        missing = [edge_key(et) for et in ds.edge_types if et not in fanouts]
        if missing:
            sys.exit(f"fanouts: no fanouts for {', '.join(missing)}: give every edge type's")
    else:
        if isinstance(default, (list, tuple)):
            default = ",".join(str(int(f)) for f in default)
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


# --- the check ----------------------------------------------------------------

def pad_inputs(ds, feed, kept):
    """A subgraph's inputs as the worker runs them (gnn-worker's padding
    of empty inputs): a node type the model reads with no rows, or at an
    end of an edge type it reads with no edges, gets one more row (zeros,
    or node id 0); each such edge type one edge between its ends' extra
    rows, with zero attributes, weight 1 and time 0. No edge reaches an
    extra row from a real one. Returns the padded feed and the inputs that
    were empty."""
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
        name = x_input(ds, t)
        rows = feed[name]
        extra = np.zeros((1,) + rows.shape[1:], dtype=rows.dtype)
        padded[name] = np.ascontiguousarray(np.concatenate([rows, extra]))
    for kind, et, name in input_spec(ds):
        if kind == "edge" and name in empty:
            src, dst = (len(feed[x_input(ds, t)]) for t in (et[0], et[2]))
            padded[name] = np.array([[src], [dst]], dtype=np.int64)
        elif kind in EDGE_DATA and edge_input(ds, et) in empty:
            fill = {"attr": 0, "weight": 1, "time": 0}[kind]
            values = feed[name]
            padded[name] = np.full((1,) + values.shape[1:], fill, dtype=values.dtype)
    return padded, empty


def emptied(ds, x, edge_index, node_type=None, edge_type=None):
    """The subgraph with node type `node_type`'s rows and edges (or edge
    type `edge_type`'s edges) taken out."""
    x = dict(x)
    if node_type is not None:
        x[node_type] = x[node_type][:0]

    def gone(et):
        return et == edge_type or node_type in (et[0], et[2])
    edge_index = edge_index.map(lambda et, v: v[:, :0] if gone(et) else v,
                                lambda _, et, v: v[:0] if gone(et) else v)
    return x, edge_index


def scaled(ds, x, edge_index, factor):
    """The subgraph with its features and edge attributes times
    `factor`."""
    x = {t: (v * np.float32(factor) if ds.featured(t) else v) for t, v in x.items()}
    return x, edge_index.map(lambda _, v: v, lambda kind, _, v: (
        v * np.float32(factor) if kind == "attr" else v))


def check_export(model, session, ds, target_type, fanouts, seed, subgraphs=8):
    """onnxruntime against PyG: sampled subgraphs at `fanouts` (1 and 16
    targets), the whole graph (up to FULL_GRAPH_CHECK_EDGES edges), a
    target some edge type reaches with no edge, the covering subgraph of
    the target with the most edges into it, the same with negated and with
    scaled (x1000) features, that target's sampled subgraph with each other
    node type emptied and with each edge type emptied, and the target
    alone (an unknown id; `no_edges` records whether onnxruntime runs it
    unpadded). A subgraph with an empty input is run padded, as the worker
    runs it (pad_inputs). Exits if a case differs by more than TOLERANCE
    (relative to the row; LARGE_TOLERANCE on features x1,000) and by more
    than ROUNDING_FACTOR times what float32 rounding alone moves PyG's own
    answer there (PyG in float64 against PyG in float32), or cannot run; a
    case onnxruntime cannot run unpadded while PyG can is recorded in
    `cannot_run` (some attention models fail so inside onnxruntime 1.31.1),
    served padded."""
    rng = np.random.default_rng(seed)
    n = ds.num_nodes[target_type]
    kept = [i.name for i in session.get_inputs()]
    results = {"max_rel_diff": 0.0, "cases": {}, "cannot_run": []}
    import onnxruntime as ort
    quiet = ort.RunOptions()
    quiet.log_severity_level = 4  # a failure is reported below, not logged twice
    model64 = []  # the float64 copy, made at the first case that needs it

    def compare(name, x, edge_index, tolerance=TOLERANCE):
        try:
            want = pyg_outputs(model, ds, x, edge_index, target_type)
        except Exception as e:  # PyG itself cannot: nothing to compare with
            results["cases"][name] = {"pyg_error": str(e).splitlines()[0][:300]}
            progress(f"note: PyG cannot run this model on the {name} subgraph; not compared")
            return None
        feed = flat_inputs(ds, x, edge_index)
        padded, empty = pad_inputs(ds, feed, kept)
        runs_unpadded = True
        if empty:
            try:
                session.run(None, {k: feed[k] for k in kept}, quiet)
            except Exception as e:  # onnxruntime's own failure, recorded
                error = str(e).splitlines()[0][:300]
                runs_unpadded = False
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
        sizes = {x_input(ds, t): int(len(v)) for t, v in x.items()}
        sizes.update({edge_input(ds, et): int(v.shape[1]) for et, v in edge_index.items()})
        results["cases"][name] = {"sizes": sizes, "max_rel_diff": diff, "padded": empty}
        case = results["cases"][name]
        if diff > tolerance:
            if not model64:
                model64.append(float64_model(model))
            exact = pyg_outputs64(model64[0], ds, x, edge_index, target_type)
            if exact is not None:
                rounding = row_diff(exact, want)
                case["float32_rounding"] = rounding
                tolerance = max(tolerance, ROUNDING_FACTOR * rounding)
        if tolerance != TOLERANCE:
            case["tolerance"] = tolerance
        results["max_rel_diff"] = max(results["max_rel_diff"], diff)
        if diff > tolerance:
            rounding = case.get("float32_rounding")
            within = (f"; float32 rounding alone moves PyG's answer there by {rounding:.3g}"
                      if rounding is not None else "")
            sys.exit(f"onnxruntime differs from PyG by {diff:.3g} (relative to the row) on the "
                     f"{name} subgraph{within}: the export is not faithful (docs/model.md lists "
                     "the exporter's hazards); fix the model or export it another way")
        return {"runs_unpadded": runs_unpadded, "max_rel_diff": diff}

    for i in range(subgraphs):
        targets = rng.choice(n, 1 if i % 2 == 0 else min(16, n), replace=False)
        n_id, edge_index, _, _ = sample(ds, target_type, targets, fanouts, rng)
        compare(f"sampled-{len(targets)}-{i}", ds.rows(n_id), edge_index)
    if ds.num_edges() <= FULL_GRAPH_CHECK_EDGES:
        compare("full-graph", *ds.full_graph())
    # A target with no edge of some type reaching it (an empty edge set).
    into = [et for et in ds.edge_types if et[2] == target_type]
    for et in into:
        indptr, _ = ds.lists[et]
        lonely = np.flatnonzero(np.diff(indptr) == 0)
        if len(lonely):
            n_id, edge_index, _, _ = sample(ds, target_type, [int(lonely[0])], fanouts, None)
            compare(f"no-{edge_key(et)}", ds.rows(n_id), edge_index)
            compare(f"no-{edge_key(et)}-negative-features",
                    *scaled(ds, ds.rows(n_id), edge_index, -3.0))
            break
    # The target with the most edges into it: its covering subgraph (every
    # neighbour, at every hop), with its features as they are, negated and
    # scaled; then every type and edge type empty in turn around it, and
    # the target alone (an unknown id's subgraph).
    degree = sum(np.diff(ds.lists[et][0]) for et in into) if into else np.zeros(n)
    busy = int(np.argmax(degree))
    n_id, edge_index, _, _ = sample(ds, target_type, [busy], fanouts, None)
    x = ds.rows(n_id)
    compare("busy-covering", x, edge_index)
    compare("busy-negative-features", *scaled(ds, x, edge_index, -3.0))
    compare("busy-large-features", *scaled(ds, x, edge_index, 1e3), LARGE_TOLERANCE)
    n_id, edge_index, _, _ = sample(ds, target_type, [busy], fanouts,
                                    np.random.default_rng(seed + 3))
    x = ds.rows(n_id)
    for t in ds.node_types:
        if t != target_type:
            compare(f"empty-{t}", *emptied(ds, x, edge_index, node_type=t))
    for et in ds.edge_types:
        compare(f"empty-{edge_key(et)}", *emptied(ds, x, edge_index, edge_type=et))
    alone = {t: (v[:1] if t == target_type else v[:0]) for t, v in x.items()}
    no_edges = edge_index.map(lambda _, v: v[:, :0], lambda _k, _e, v: v[:0])
    lone = compare("target-alone", alone, no_edges)
    if lone is not None:
        results["no_edges"] = lone
    return results


def write_reference(out, session, ds, target_type, fanouts, full_outputs, seed):
    """reference/outputs.f32 (PyG's full-graph outputs) and one sampled
    subgraph with onnxruntime's outputs on it."""
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


# --- export -------------------------------------------------------------------

def example_graph(ds, target_type, fanouts, seed):
    """What the export traces: the whole graph (no size is 0 or 1), or
    past FULL_GRAPH_CHECK_EDGES a sampled subgraph of a few targets with
    at least two edges of every edge type."""
    if ds.num_edges() > FULL_GRAPH_CHECK_EDGES:
        rng = np.random.default_rng(seed)
        n = ds.num_nodes[target_type]
        for _ in range(16):
            n_id, edge_index, _, _ = sample(ds, target_type, rng.choice(n, min(4, n), replace=False),
                                            fanouts, rng)
            if all(e.shape[1] >= 2 for e in edge_index.values()) and all(
                    len(v) >= 2 for v in n_id.values()):
                return ds.rows(n_id), edge_index
    return ds.full_graph()


def manifest_graph(ds, target_type, fanouts, kept):
    """The manifest's description of the graph the model reads: with the
    width of the edge attributes it takes (`edge_dim`, per edge type on a
    typed graph)."""
    def edge_dim(et):
        if data_input(ds, "attr", et) not in kept:
            return {}
        return {"edge_dim": int(ds.edge_data[et]["attr"].shape[1])}
    if ds.one_type:
        return {"feature_dim": ds.feature_dim[ONE_TYPE],
                "dtype": "f32",
                "fanouts": fanouts[ONE_EDGE_TYPE],
                "num_nodes": ds.num_nodes[ONE_TYPE],
                **edge_dim(ONE_EDGE_TYPE)}
    node_types = []
    for t in ds.node_types:
        entry = {"name": t, "num_nodes": ds.num_nodes[t], "input": x_input(ds, t)}
        if ds.featured(t):
            entry.update(feature_dim=ds.feature_dim[t], dtype="f32")
        node_types.append(entry)
    return {"node_types": node_types,
            "edge_types": [{"src": s, "relation": r, "dst": d, "input": edge_input(ds, (s, r, d)),
                            **edge_dim((s, r, d))}
                           for s, r, d in ds.edge_types],
            "target_type": target_type,
            "fanouts": {edge_key(et): v for et, v in fanouts.items()}}


def export(model, *, dataset, out, fanouts, overrides=None, target_type=None, output="classes",
           graph_version=1, architecture=None, seed=0, check_subgraphs=8, extra=None):
    """Exports a trained PyG model for gnn-worker's subgraph layout: a
    one-type model (`model(x, edge_index)`) or a heterogeneous one
    (`model(x_dict, edge_index_dict)`), as the dataset is. Runs
    torch.onnx.export (opset 18, the TorchScript exporter, behind a
    generated flat-input wrapper), checks onnxruntime against PyG on
    sampled and adversarial subgraphs of `dataset` (within 1e-5 of each
    row's magnitude: check_export), and writes model.onnx, manifest.json
    and reference/ into `out`. `fanouts`: one per hop the sidecar samples
    ("20,10" or [20, 10]: every edge type; or a dict edge type -> fanouts
    per hop; a GCN needs one hop more than its layers for exact degrees,
    docs/model.md); `overrides`: "src__rel__dst=a,b" strings. `output`:
    "classes" (logits) or "embedding". Returns the manifest."""
    torch = torch_modules()[0]
    import torch_geometric
    if output not in ("classes", "embedding"):
        sys.exit(f"output {output!r}: classes or embedding")
    ds = dataset if isinstance(dataset, Graph) else Graph(dataset, labels=False)
    target_type = target_type or ds.target_type
    if target_type not in ds.num_nodes:
        sys.exit(f"target type {target_type!r}: give one of {', '.join(ds.node_types)}")
    fanouts = parse_fanouts(ds, fanouts, overrides)
    model.eval()
    os.makedirs(out, exist_ok=True)
    path = os.path.join(out, "model.onnx")
    # PyG's full run comes first: it also gives lazy layers (in_channels
    # -1) their widths, as PyG asks before any other use of such a model.
    full = pyg_outputs(model, ds, *ds.full_graph(), target_type)
    export_onnx(model, ds, target_type, path, *example_graph(ds, target_type, fanouts, seed))
    extrema_fixed = fix_scatter_extrema(path)
    session = session_of(path)
    kept = [i.name for i in session.get_inputs()]
    spec = [name for _, _, name in input_spec(ds, edge_params(model, ds))]
    dropped = [name for name in spec if name not in kept]
    if dropped and ds.one_type:
        sys.exit(f"the export takes inputs {kept}; gnn-worker feeds exactly {spec}: the model "
                 "must read each of them (the exporter drops an input it never reads)")
    if dropped:
        progress(f"note: the export dropped {', '.join(dropped)} (they cannot reach the output); "
                 "the worker feeds exactly the inputs the model declares")
    started = time.time()
    check = check_export(model, session, ds, target_type, fanouts, seed, check_subgraphs)
    width = int(full.shape[1])
    write_reference(out, session, ds, target_type, fanouts, full, seed)
    manifest = {
        "format_version": 1,
        "layout": "subgraph",
        "architecture": architecture or type(model).__name__,
        "dataset": ds.name,
        **manifest_graph(ds, target_type, fanouts, kept),
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
            for name, code in (("test", 2), ("val", 1))}
    manifest.update(extra or {})
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(manifest, f, indent=2)
    return manifest


# --- training -----------------------------------------------------------------

def edge_reads(arch, ds):
    """What a one-type architecture reads of its edges' data: GINEConv
    and TransformerConv their attributes (the dataset must carry them),
    GATConv its attributes and GCNConv its weights where the dataset
    carries them; SAGEConv and GINConv nothing. None, `edge_attr` or
    `edge_weight`."""
    attrs, weights = bool(ds.carries("attr")), bool(ds.carries("weight"))
    if arch in ("gine", "transformer") and not attrs:
        if arch == "gine":
            sys.exit("arch gine reads edge attributes and the dataset's edges carry none "
                     "(docs/graph-index.md, \"Edge data\"): train gin, or import attributes")
        return None
    if arch in ("gine", "transformer", "gat") and attrs:
        return "edge_attr"
    if arch == "gcn" and weights:
        return "edge_weight"
    return None


def build_net(arch, ds, hidden, out_dim, layers, *, dropout=0.5, heads=8, row_normalise=True,
              embedding_dim=16, head=False):
    """A PyG GNN over `ds` of `layers` message-passing layers answering for
    its target type. One-type architectures (called model(x, edge_index)):
    SAGEConv (mean), GCNConv, GATConv (`heads` heads, concatenated, one on
    the last layer) or GINConv (a 2-layer MLP each), with `dropout`; with
    `row_normalise` each feature row is divided by its sum (at least 1)
    first, inside the model, so the stores keep the raw rows. Typed
    architectures (called model(x_dict, edge_index_dict)): `to_hetero` of a
    GraphSAGE (sum over edge types) or a stack of `HeteroConv` of SAGEConv;
    a type without features gets an embedding table of `embedding_dim` by
    global id. With `head`, the GNN gives a `hidden` embedding and a linear
    layer the `out_dim` classes (`encode` returns the embedding). Where
    the dataset's edges carry data, GATConv (`edge_dim`) and GINEConv and
    TransformerConv read their attributes, GCNConv their weights
    (`edge_reads`)."""
    if ds.one_type and arch not in ONE_TYPE_ARCHS:
        sys.exit(f"arch {arch!r}: a one-type graph trains one of {', '.join(ONE_TYPE_ARCHS)}")
    if not ds.one_type and arch not in TYPED_ARCHS:
        sys.exit(f"arch {arch!r}: a typed graph trains one of {', '.join(TYPED_ARCHS)}")
    torch, F, pyg_nn = torch_modules()
    last_out = hidden if head else out_dim
    dims = [hidden] * (layers - 1) + [last_out]

    if ds.one_type:
        reads = edge_reads(arch, ds)
        edge_dim = (int(ds.edge_data[ONE_EDGE_TYPE]["attr"].shape[1]) if reads == "edge_attr"
                    else None)

        def conv(d_in, d_out, last):
            h = 1 if last else heads
            if arch == "sage":
                return pyg_nn.SAGEConv(d_in, d_out)
            if arch == "gcn":
                return pyg_nn.GCNConv(d_in, d_out)
            if arch == "gat":
                return pyg_nn.GATConv(d_in, d_out // h if not last else d_out, heads=h,
                                      edge_dim=edge_dim)
            if arch == "transformer":
                return pyg_nn.TransformerConv(d_in, d_out // h if not last else d_out, heads=h,
                                              edge_dim=edge_dim)
            mlp = torch.nn.Sequential(torch.nn.Linear(d_in, hidden), torch.nn.ReLU(),
                                      torch.nn.Linear(hidden, d_out))
            if arch == "gine":
                return pyg_nn.GINEConv(mlp, edge_dim=edge_dim)
            return pyg_nn.GINConv(mlp)

        class Net(torch.nn.Module):
            def __init__(self):
                super().__init__()
                ins = [ds.feature_dim[ONE_TYPE]] + dims[:-1]
                self.convs = torch.nn.ModuleList(
                    conv(ins[i], dims[i], last=(i == layers - 1) and not head)
                    for i in range(layers))
                self.head = torch.nn.Linear(hidden, out_dim) if head else None
                self.row_normalise = row_normalise
                self.dropout = dropout

            def run(self, x, edge_index, edge_data):
                if self.row_normalise:
                    x = x / x.sum(dim=-1, keepdim=True).clamp(min=1.0)
                for i, c in enumerate(self.convs):
                    x = F.dropout(x, p=self.dropout, training=self.training)
                    x = c(x, edge_index) if edge_data is None else c(x, edge_index, edge_data)
                    if i < len(self.convs) - 1:
                        x = F.elu(x) if arch == "gat" else F.relu(x)
                return x

            def out(self, x):
                return self.head(F.relu(x)) if self.head is not None else x

        # The forward names exactly the edge data the layers read (the
        # export takes what it names: edge_params).
        class Plain(Net):
            def encode(self, x, edge_index):
                return self.run(x, edge_index, None)

            def forward(self, x, edge_index):
                return self.out(self.encode(x, edge_index))

        class Attr(Net):
            def encode(self, x, edge_index, edge_attr):
                return self.run(x, edge_index, edge_attr)

            def forward(self, x, edge_index, edge_attr):
                return self.out(self.encode(x, edge_index, edge_attr))

        class Weight(Net):
            def encode(self, x, edge_index, edge_weight):
                return self.run(x, edge_index, edge_weight)

            def forward(self, x, edge_index, edge_weight):
                return self.out(self.encode(x, edge_index, edge_weight))

        return {None: Plain, "edge_attr": Attr, "edge_weight": Weight}[reads]()

    metadata = (ds.node_types, ds.edge_types)
    target = ds.target_type

    class Sage(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.convs = torch.nn.ModuleList(pyg_nn.SAGEConv((-1, -1), d) for d in dims)

        def forward(self, x, edge_index):
            for i, conv in enumerate(self.convs):
                x = conv(x, edge_index)
                if i < len(self.convs) - 1:
                    x = x.relu()
            return x

    class HeteroNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.embeddings = torch.nn.ModuleDict({
                t: torch.nn.Embedding(ds.num_nodes[t], embedding_dim)
                for t in ds.node_types if not ds.featured(t)})
            if arch == "to_hetero":
                self.gnn = pyg_nn.to_hetero(Sage(), metadata, aggr="sum")
                self.convs = None
            else:
                self.convs = torch.nn.ModuleList(
                    pyg_nn.HeteroConv({et: pyg_nn.SAGEConv((-1, -1), d) for et in ds.edge_types},
                                      aggr="sum")
                    for d in dims)
                self.gnn = None
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

    net = HeteroNet()
    # Lazy layers take their widths from a first run.
    x, edge_index = ds.full_graph()
    with torch.no_grad():
        net(to_torch(x), to_torch(edge_index))
    return net


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

            def forward(self, *inputs, **edge_data):  # (x, edge_index), or dicts
                return self.net.encode(*inputs, **edge_data)

        # Its forward takes the edge data `encode` takes (edge_params).
        import inspect
        sig = inspect.signature(net.encode)
        self_param = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
        Wrapped.forward.__signature__ = sig.replace(
            parameters=[self_param, *sig.parameters.values()])
        return Wrapped().eval()


def train(net, ds, *, epochs, lr, weight_decay, mode, fanouts, batch, seed):
    """Trains `net` on the target type's training nodes (split 0), keeping
    the weights of the epoch with the best validation accuracy (split 1).
    `full`: the whole graph each epoch; `minibatch`: NeighborLoader-shaped
    batches of `batch` training nodes at `fanouts`. Returns (best val
    accuracy, best epoch)."""
    torch, F, _ = torch_modules()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    target = ds.target_type
    x, edge_index = ds.full_graph()
    xt, et = to_torch(x), to_torch(edge_index)
    y = torch.from_numpy(ds.y).long()
    train_idx = np.flatnonzero(ds.split == 0)
    val_idx = torch.from_numpy(np.flatnonzero(ds.split == 1))
    opt = torch.optim.Adam(net.parameters(), lr=lr, weight_decay=weight_decay)

    def train_epoch():
        if mode == "full":
            opt.zero_grad()
            loss = F.cross_entropy(call(net, ds, xt, et, target)[train_idx], y[train_idx])
            loss.backward()
            opt.step()
            return
        order = rng.permutation(train_idx)
        for start in range(0, len(order), batch):
            seeds = order[start:start + batch]
            n_id, sub, _, _ = sample(ds, target, seeds, fanouts, rng)
            opt.zero_grad()
            out = call(net, ds, to_torch(ds.rows(n_id)), to_torch(sub), target)
            loss = F.cross_entropy(out[:len(seeds)], y[torch.from_numpy(seeds)])
            loss.backward()
            opt.step()

    def val_accuracy():
        pred = call(net, ds, xt, et, target).argmax(1)
        return float((pred[val_idx] == y[val_idx]).float().mean())

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


def neighbor_loader_accuracy(model, ds, fanouts, runs, seed):
    """Test accuracy as PyG's NeighborLoader inference computes it at
    `fanouts`, one target per batch, over `runs` seeded runs: (mean, each
    run's)."""
    idx = np.flatnonzero(ds.split == 2)
    accs = []
    for run in range(runs):
        rng = np.random.default_rng(seed + 1000 + run)
        correct = 0
        for t in idx:
            n_id, edge_index, _, _ = sample(ds, ds.target_type, [t], fanouts, rng)
            out = pyg_outputs(model, ds, ds.rows(n_id), edge_index, ds.target_type)
            correct += int(out[0].argmax() == ds.y[t])
        accs.append(correct / len(idx))
    return float(np.mean(accs)), accs


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


def plain_fanouts(ds, fanouts):
    """The fanouts as the manifest and the output print them."""
    if ds.one_type:
        return fanouts[ONE_EDGE_TYPE]
    return {edge_key(et): v for et, v in fanouts.items()}


def cmd_export(args):
    model = load_module(args.module, json.loads(args.init) if args.init else {})
    if args.state_dict:
        missing, unexpected = model.load_state_dict(load_state(args.state_dict), strict=False)
        if missing or unexpected:
            sys.exit(f"--state-dict {args.state_dict} does not fit {args.module}: missing "
                     f"{list(missing)}, unexpected {list(unexpected)}")
    ds = Graph(args.dataset, labels=False)
    manifest = export(model, dataset=ds, out=args.out,
                      fanouts=args.fanouts or ("20,10" if ds.one_type else "10,5"),
                      overrides=args.fanout, target_type=args.target_type, output=args.output,
                      graph_version=args.graph_version, architecture=args.module, seed=args.seed)
    print(json.dumps({"out": args.out, "check": manifest["check"]["max_rel_diff"],
                      "inputs": manifest["inputs"], "offline": manifest.get("offline")}))


def cmd_train(args):
    torch = torch_modules()[0]
    started = time.time()
    ds = Graph(args.dataset)
    one = ds.one_type
    # Defaults by the graph's kind (the help says which).
    arch = args.arch or ("sage" if one else "to_hetero")
    fanouts = parse_fanouts(ds, args.fanouts or ("20,10" if one else "10,5"), args.fanout)
    epochs = args.epochs or (200 if one else 100)
    loader_runs = args.loader_runs if args.loader_runs is not None else (3 if one else 1)
    mode = args.mode
    if mode == "auto":
        mode = "full" if ds.num_edges() <= 2_000_000 else "minibatch"
    torch.manual_seed(args.seed)
    embedding = args.output == "embedding"
    net = build_net(arch, ds, args.hidden, ds.num_classes, args.layers, dropout=args.dropout,
                    heads=args.heads, row_normalise=args.row_normalise,
                    embedding_dim=args.embedding_dim, head=embedding)
    val, epoch = train(net, ds, epochs=epochs, lr=args.lr, weight_decay=args.weight_decay,
                       mode=mode, fanouts=fanouts, batch=args.batch, seed=args.seed)
    full = pyg_outputs(net, ds, *ds.full_graph(), ds.target_type)
    test = ds.split == 2
    test_acc = float((full[test].argmax(1) == ds.y[test]).mean())
    training = {"arch": arch, "layers": args.layers, "hidden": args.hidden, "mode": mode,
                "epochs": epochs, "best_epoch": epoch, "lr": args.lr,
                "weight_decay": args.weight_decay, "seed": args.seed,
                "val_accuracy": val, "test_accuracy": test_acc,
                "seconds": round(time.time() - started, 1)}
    if one:
        training.update(dropout=args.dropout, row_normalise=args.row_normalise)
    else:
        training.update(embedding_dim=args.embedding_dim)
    extra = {"training": training}
    if not embedding and loader_runs > 0:
        mean, runs = neighbor_loader_accuracy(net, ds, fanouts, loader_runs, args.seed)
        extra["neighbor_loader"] = {"fanouts": plain_fanouts(ds, fanouts), "batch_size": 1,
                                    "runs": runs, "mean_test_accuracy": mean}
    name = f"pyg-{arch}-{args.layers}layer" if one else f"pyg-{arch}-sage-{args.layers}layer"
    manifest = export(Encoder.of(net) if embedding else net, dataset=ds, out=args.out,
                      fanouts=fanouts, output=args.output, graph_version=args.graph_version,
                      architecture=name, seed=args.seed, extra=extra)
    # The trained weights as PyG names them (sage.py import-pyg reads a
    # one-type SAGEConv model's: the same weights in the dense layout).
    from safetensors.torch import save_file
    save_file({k: v.detach().contiguous() for k, v in net.state_dict().items()},
              os.path.join(args.out, "weights.safetensors"))
    print(json.dumps({"out": args.out, "arch": arch, "layers": args.layers,
                      "test_accuracy": test_acc, "val_accuracy": val, "best_epoch": epoch,
                      "check_max_rel_diff": manifest["check"]["max_rel_diff"],
                      "inputs": manifest["inputs"],
                      "neighbor_loader": extra.get("neighbor_loader"),
                      "seconds": round(time.time() - started, 1)}))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)

    def common(p):
        p.add_argument("--dataset", required=True,
                       help="a dataset directory: the ../shared/data layout (one type) or the "
                            "typed layout")
        p.add_argument("--out", required=True, help="model directory to write")
        p.add_argument("--fanouts",
                       help="fanouts per hop for every edge type, one per hop the sidecar "
                            "samples (default 20,10 for a one-type graph, 10,5 for a typed one)")
        p.add_argument("--fanout", action="append", metavar="SRC__REL__DST=A,B",
                       help="one edge type's fanouts per hop (repeatable; the relation alone "
                            "where it names one edge type)")
        p.add_argument("--output", choices=["classes", "embedding"], default="classes",
                       help="embedding: serve the last GNN layer's output (the classifier's head "
                            "is used for training only)")
        p.add_argument("--graph-version", type=int, default=1)
        p.add_argument("--seed", type=int, default=0)

    t = sub.add_parser("train", help="train a PyG GNN, export it, check it, write references")
    common(t)
    t.add_argument("--arch", choices=ONE_TYPE_ARCHS + TYPED_ARCHS,
                   help="one-type: sage (default), gcn, gat, gin, gine, transformer (gine, "
                        "transformer and gat read edge attributes, gcn edge weights, where the "
                        "dataset carries them); typed: to_hetero (default), "
                        "heteroconv")
    t.add_argument("--layers", type=int, default=2, choices=[1, 2, 3])
    t.add_argument("--hidden", type=int, default=64)
    t.add_argument("--heads", type=int, default=8, help="GAT: attention heads of the hidden layers")
    t.add_argument("--embedding-dim", type=int, default=16,
                   help="typed: width of the embedding of each node type without features")
    t.add_argument("--mode", choices=["auto", "full", "minibatch"], default="auto",
                   help="auto: the whole graph each epoch up to 2M edges, mini-batches past it")
    t.add_argument("--batch", type=int, default=128, help="training nodes per mini-batch")
    t.add_argument("--epochs", type=int,
                   help="default 200 for a one-type graph, 100 for a typed one")
    t.add_argument("--lr", type=float, default=0.01)
    t.add_argument("--weight-decay", type=float, default=5e-4)
    t.add_argument("--dropout", type=float, default=0.5, help="one-type architectures")
    t.add_argument("--no-row-normalise", dest="row_normalise", action="store_false",
                   help="one-type: train on the rows as stored (default: divide each by its sum "
                        "in the model)")
    t.add_argument("--loader-runs", type=int,
                   help="runs of NeighborLoader-style inference at the fanouts for the manifest "
                        "(default 3 for a one-type graph, 1 for a typed one)")
    e = sub.add_parser("export", help="export your own PyG module with a state dict")
    common(e)
    e.add_argument("--module", required=True, help="package.module:Class, importable from here")
    e.add_argument("--init", help="the class's keyword arguments, as JSON")
    e.add_argument("--state-dict", help="its trained weights (torch.save or .safetensors)")
    e.add_argument("--target-type", help="typed: the node type it answers for (default: the "
                                         "labelled one)")
    args = parser.parse_args()
    {"train": cmd_train, "export": cmd_export}[args.command](args)


if __name__ == "__main__":
    main()
