"""Writes subgraph-layout model directories that gnn-worker must refuse,
each for one reason (tests/tests/pyg_models.rs checks the refusal names it).

Usage: pyg_variants.py <dataset dir> <out dir>

  renamed   model.onnx takes "features" and "edges"
  int32     edge_index is int32 (a Cast to int64 inside)
  fixed     exported without dynamic axes: fixed node and edge counts
  no-edges  a model that ignores edge_index (the exporter drops the input)
  width     a model for 10 features on a dataset of another width
  opset     a manifest that says opset 15
  inputs    a manifest that names other inputs
"""
import json
import os
import shutil
import sys
import warnings

import numpy as np
import onnx
import torch
from torch_geometric.nn import SAGEConv


class Sage(torch.nn.Module):
    def __init__(self, dim, classes=7):
        super().__init__()
        self.conv = SAGEConv(dim, classes)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


class Mlp(torch.nn.Module):
    def __init__(self, dim, classes=7):
        super().__init__()
        self.lin = torch.nn.Linear(dim, classes)

    def forward(self, x, edge_index):
        return self.lin(x)


def export(model, path, dim, names=("x", "edge_index"), dynamic=True):
    x = torch.rand(6, dim)
    edge_index = torch.tensor([[1, 2, 3, 4], [0, 0, 1, 1]])
    axes = {names[0]: {0: "n"}, names[1]: {1: "e"}, "out": {0: "n"}} if dynamic else None
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(model.eval(), (x, edge_index), path, dynamo=False, opset_version=18,
                          input_names=list(names), output_names=["out"], dynamic_axes=axes)


def manifest(out, dim, **changes):
    body = {"format_version": 1, "layout": "subgraph", "architecture": "variant",
            "feature_dim": dim, "dtype": "f32", "output": "classes", "num_classes": 7,
            "fanouts": [10, 5], "graph_version": 1, "opset": 18, "inputs": ["x", "edge_index"],
            "outputs": ["out"]}
    body.update(changes)
    with open(os.path.join(out, "manifest.json"), "w") as f:
        json.dump(body, f, indent=2)


def variant(root, name):
    out = os.path.join(root, name)
    os.makedirs(out, exist_ok=True)
    return out


def main():
    dataset, root = sys.argv[1], sys.argv[2]
    dim = json.load(open(os.path.join(dataset, "meta.json")))["feature_dim"]
    torch.manual_seed(0)

    out = variant(root, "renamed")
    export(Sage(dim), os.path.join(out, "model.onnx"), dim, names=("features", "edges"))
    manifest(out, dim)

    out = variant(root, "int32")
    path = os.path.join(out, "model.onnx")
    export(Sage(dim), path, dim)
    model = onnx.load(path)
    graph = model.graph
    for node in graph.node:
        node.input[:] = ["edge_index_i64" if i == "edge_index" else i for i in node.input]
    graph.node.insert(0, onnx.helper.make_node("Cast", ["edge_index"], ["edge_index_i64"],
                                               to=onnx.TensorProto.INT64))
    for value in graph.input:
        if value.name == "edge_index":
            value.type.tensor_type.elem_type = onnx.TensorProto.INT32
    onnx.save(model, path)
    manifest(out, dim)

    out = variant(root, "fixed")
    export(Sage(dim), os.path.join(out, "model.onnx"), dim, dynamic=False)
    manifest(out, dim)

    out = variant(root, "no-edges")
    export(Mlp(dim), os.path.join(out, "model.onnx"), dim)
    manifest(out, dim)

    out = variant(root, "width")
    export(Sage(10), os.path.join(out, "model.onnx"), 10)
    manifest(out, 10)

    for name, changes in [("opset", {"opset": 15}), ("inputs", {"inputs": ["x", "edges"]})]:
        out = variant(root, name)
        shutil.copy(os.path.join(root, "fixed", "model.onnx"), os.path.join(out, "model.onnx"))
        manifest(out, dim, **changes)
    np.zeros(1).tofile(os.path.join(root, "done"))


if __name__ == "__main__":
    main()
