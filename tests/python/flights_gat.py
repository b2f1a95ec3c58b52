"""A to_hetero GAT on OpenFlights (a user's own module, for
`pyg_model.py export --module flights_gat:Net`): onnxruntime 1.31.1 cannot
run it on a subgraph where a node type has no rows, while PyG can. Used by
tests/tests/typed_graphs.rs and tests/tests/typed_serving.rs.
"""
import torch
from torch_geometric.nn import GATConv, to_hetero

NODE_TYPES = ["airport", "airline", "country", "plane"]
EDGE_TYPES = [("airport", "route", "airport"), ("airline", "serves", "airport"),
              ("airport", "rev_serves", "airline"), ("airport", "located_in", "country"),
              ("country", "rev_located_in", "airport"), ("airline", "based_in", "country"),
              ("country", "rev_based_in", "airline"), ("airline", "flies", "plane"),
              ("plane", "rev_flies", "airline")]


class GNN(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = GATConv((-1, -1), 16, add_self_loops=False)
        self.conv2 = GATConv((-1, -1), 10, add_self_loops=False)

    def forward(self, x, edge_index):
        return self.conv2(self.conv1(x, edge_index).relu(), edge_index)


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.country = torch.nn.Embedding(261, 8)
        self.plane = torch.nn.Embedding(246, 8)
        self.gnn = to_hetero(GNN(), (NODE_TYPES, EDGE_TYPES), aggr="sum")

    def forward(self, x_dict, edge_index_dict):
        x_dict = dict(x_dict, country=self.country(x_dict["country"]),
                      plane=self.plane(x_dict["plane"]))
        return self.gnn(x_dict, edge_index_dict)["airport"]
