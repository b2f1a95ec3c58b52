"""Models as a team would define them in its own code, for
tests/tests/pyg_models.rs:
- Net: a 2-layer GraphSAGE with max aggregation (the aggregation the ONNX
  exporter gets wrong without pyg_model.py's fix) and a skip connection,
  exported with `pyg_model.py export --module user_module:Net` from a
  state dict this script writes, or by hand (`--by-hand`: the TorchScript
  exporter as a user calls it, no fix).
- Transformer: a 2-layer TransformerConv, which onnxruntime cannot run on
  a subgraph without edges.
- With `--by-hand`, also a GATConv exported by hand (`by-hand-gat.onnx`),
  whose attention softmax the TorchScript exporter computes over max(0, .),
  with PyG's outputs on inputs where that underflows
  (`by-hand-gat.{x,edge_index,pyg}` little-endian f32, i64, f32).

Usage: user_module.py <feature dim> <out state dict> [--by-hand model.onnx]
"""
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn import GATConv, SAGEConv, TransformerConv


class Net(torch.nn.Module):
    def __init__(self, in_dim, hidden=32, classes=7):
        super().__init__()
        self.conv1 = SAGEConv(in_dim, hidden, aggr="max")
        self.conv2 = SAGEConv(hidden, classes, aggr="max")
        self.skip = torch.nn.Linear(in_dim, classes)

    def forward(self, x, edge_index):
        h = F.relu(self.conv1(x, edge_index))
        return self.conv2(h, edge_index) + self.skip(x)


class Transformer(torch.nn.Module):
    def __init__(self, in_dim, hidden=16, classes=7):
        super().__init__()
        self.conv1 = TransformerConv(in_dim, hidden, heads=2)
        self.conv2 = TransformerConv(2 * hidden, classes)
        # Small query and key weights: with the default ones, the export
        # check's features x 1,000 give attention logits near 1e6, where
        # float32 rounding alone moves a softmax by 3e-5 (beyond the check's
        # 1e-5), in PyG and onnxruntime alike.
        with torch.no_grad():
            for conv in (self.conv1, self.conv2):
                conv.lin_query.weight.mul_(0.01)
                conv.lin_key.weight.mul_(0.01)

    def forward(self, x, edge_index):
        return self.conv2(F.relu(self.conv1(x, edge_index)), edge_index)


class Gat(torch.nn.Module):
    def __init__(self, in_dim, classes=7):
        super().__init__()
        self.conv = GATConv(in_dim, classes)

    def forward(self, x, edge_index):
        return self.conv(x, edge_index)


def export_by_hand(net, x, edge_index, path):
    """As a user exports a model by hand: the TorchScript exporter, which
    computes max(0, .) for PyG's scatter(..., reduce="max")."""
    net.eval()
    with torch.no_grad():
        torch.onnx.export(net, (x, edge_index), path, dynamo=False, opset_version=18,
                          input_names=["x", "edge_index"], output_names=["out"],
                          dynamic_axes={"x": {0: "n"}, "edge_index": {1: "e"}, "out": {0: "n"}})


if __name__ == "__main__":
    torch.manual_seed(3)
    net = Net(int(sys.argv[1]))
    torch.save(net.state_dict(), sys.argv[2])
    if sys.argv[3:4] == ["--by-hand"]:
        dim = int(sys.argv[1])
        edge_index = torch.tensor([[1, 2, 3, 4, 5], [0, 0, 1, 2, 3]])
        export_by_hand(net, torch.randn(6, dim), edge_index, sys.argv[4])
        gat = Gat(dim).eval()
        export_by_hand(gat, torch.randn(6, dim), edge_index, "by-hand-gat.onnx")
        # Large features: every attention logit into some nodes is far
        # below zero, where exp(logit - max(0, .)) underflows to 0.
        x = torch.randn(6, dim) * 1e3
        with torch.no_grad():
            pyg = gat(x, edge_index)
        x.numpy().astype("<f4").tofile("by-hand-gat.x")
        edge_index.numpy().astype("<i8").tofile("by-hand-gat.edge_index")
        pyg.numpy().astype("<f4").tofile("by-hand-gat.pyg")
