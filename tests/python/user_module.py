"""A model as a team would define it in its own code: a 2-layer GraphSAGE
with max aggregation (the aggregation the ONNX exporter gets wrong without
pyg_model.py's fix) and a skip connection. tests/tests/pyg_models.rs
exports it with `pyg_model.py export --module user_module:Net` from a
state dict this script writes.

Usage: user_module.py <feature dim> <out state dict>
"""
import sys

import torch
import torch.nn.functional as F
from torch_geometric.nn import SAGEConv


class Net(torch.nn.Module):
    def __init__(self, in_dim, hidden=32, classes=7):
        super().__init__()
        self.conv1 = SAGEConv(in_dim, hidden, aggr="max")
        self.conv2 = SAGEConv(hidden, classes, aggr="max")
        self.skip = torch.nn.Linear(in_dim, classes)

    def forward(self, x, edge_index):
        h = F.relu(self.conv1(x, edge_index))
        return self.conv2(h, edge_index) + self.skip(x)


if __name__ == "__main__":
    torch.manual_seed(3)
    net = Net(int(sys.argv[1]))
    torch.save(net.state_dict(), sys.argv[2])
