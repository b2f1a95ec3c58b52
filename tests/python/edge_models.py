"""PyG models that read their edges' data (a user's own modules, for
`pyg_model.py export --module edge_models:<Class>`), one per way PyG's
layers take edge data: GINEConv, GATConv and TransformerConv with
`edge_dim` read `edge_attr`; GCNConv reads `edge_weight`; a to_hetero
GATConv on OpenFlights reads `edge_attr_dict`, the route edge type's
attributes.
Used by tests/tests/edge_models.rs.
"""
import torch
from torch_geometric.nn import GATConv, GCNConv, GINEConv, TransformerConv, to_hetero


class Gine(torch.nn.Module):
    def __init__(self, in_dim, edge_dim, hidden=32, classes=7):
        super().__init__()
        mlp = lambda i, o: torch.nn.Sequential(  # noqa: E731
            torch.nn.Linear(i, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, o))
        self.conv1 = GINEConv(mlp(in_dim, hidden), edge_dim=edge_dim)
        self.conv2 = GINEConv(mlp(hidden, classes), edge_dim=edge_dim)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr)


class Gat(torch.nn.Module):
    def __init__(self, in_dim, edge_dim, hidden=8, heads=4, classes=7):
        super().__init__()
        self.conv1 = GATConv(in_dim, hidden, heads=heads, edge_dim=edge_dim)
        self.conv2 = GATConv(hidden * heads, classes, heads=1, edge_dim=edge_dim)

    def forward(self, x, edge_index, edge_attr):
        x = torch.nn.functional.elu(self.conv1(x, edge_index, edge_attr))
        return self.conv2(x, edge_index, edge_attr)


class Transformer(torch.nn.Module):
    def __init__(self, in_dim, edge_dim, hidden=16, heads=2, classes=7):
        super().__init__()
        self.conv1 = TransformerConv(in_dim, hidden, heads=heads, edge_dim=edge_dim)
        self.conv2 = TransformerConv(hidden * heads, classes, heads=1, edge_dim=edge_dim)

    def forward(self, x, edge_index, edge_attr):
        x = self.conv1(x, edge_index, edge_attr).relu()
        return self.conv2(x, edge_index, edge_attr)


class Gcn(torch.nn.Module):
    def __init__(self, in_dim, hidden=32, classes=7):
        super().__init__()
        self.conv1 = GCNConv(in_dim, hidden)
        self.conv2 = GCNConv(hidden, classes)

    def forward(self, x, edge_index, edge_weight):
        x = self.conv1(x, edge_index, edge_weight).relu()
        return self.conv2(x, edge_index, edge_weight)


class FlightsGat(torch.nn.Module):
    """to_hetero of a GATConv with `edge_dim` on OpenFlights: the route
    edge type carries 4 attributes and reads them; the other edge types
    carry none (to_hetero hands their layers None); countries and planes
    have no features (an embedding by id)."""

    def __init__(self, edge_dim=4, classes=10):
        super().__init__()
        from flights_gat import EDGE_TYPES, NODE_TYPES

        class Base(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.conv1 = GATConv((-1, -1), 16, edge_dim=edge_dim, add_self_loops=False)
                self.conv2 = GATConv((-1, -1), classes, edge_dim=edge_dim, add_self_loops=False)

            def forward(self, x, edge_index, edge_attr):
                x = self.conv1(x, edge_index, edge_attr).relu()
                return self.conv2(x, edge_index, edge_attr)

        self.country = torch.nn.Embedding(261, 8)
        self.plane = torch.nn.Embedding(246, 8)
        self.gnn = to_hetero(Base(), (NODE_TYPES, EDGE_TYPES), aggr="sum")

    def forward(self, x_dict, edge_index_dict, edge_attr_dict):
        x_dict = dict(x_dict, country=self.country(x_dict["country"]),
                      plane=self.plane(x_dict["plane"]))
        return self.gnn(x_dict, edge_index_dict, edge_attr_dict)["airport"]
