"""What every model tool shares (sage.py, pyg_model.py): the one reader of
the dataset layouts (`Graph`: a one-type dataset in the ../shared/data
layout is the 1x1 typed graph), the neighbour lists as the sidecar's index
keeps them, the one neighbour sampler (the sidecar's rule), onnxruntime
sessions, progress lines and file hashes."""
import hashlib
import json
import os
import re
import sys
import time

import numpy as np


def load_dataset(path, labels=True):
    """A dataset in the ../shared/data layout: (meta, x [N, D] f32,
    edges [E, 2] (src, dst), labels, split); labels and split are None
    when the dataset has none and `labels` is False, and their absence
    ends the tool with the fix when it is True (training needs them)."""
    with open(os.path.join(path, "meta.json")) as f:
        meta = json.load(f)
    n, d = meta["num_nodes"], meta["feature_dim"]
    x = np.fromfile(os.path.join(path, "features.f32"), dtype="<f4").reshape(n, d)
    edges = np.fromfile(os.path.join(path, "edges.u32"), dtype="<u4").reshape(-1, 2)
    y = split = None
    if all(os.path.exists(os.path.join(path, f)) for f in ("labels.i32", "split.u8")):
        y = np.fromfile(os.path.join(path, "labels.i32"), dtype="<i4")
        split = np.fromfile(os.path.join(path, "split.u8"), dtype="u1")
        if len(y) != n or len(split) != n:
            sys.exit(f"{path}: labels.i32 or split.u8 disagrees with meta.json's num_nodes {n}")
    elif labels:
        sys.exit(f"{path} has no labels.i32 and split.u8: training needs labels and a split "
                 "(`sidecar generate --classes K` writes them for a synthetic graph; `sage.py "
                 "init` exports an untrained model without them)")
    if len(edges) != meta["num_edges"]:
        sys.exit(f"{path}: edges.u32 holds {len(edges)} edges, meta.json says {meta['num_edges']}")
    return meta, x, edges, y, split


def neighbour_lists(n, edges):
    """Each node's neighbours as the sidecar's index keeps them: edge
    src -> dst makes dst a neighbour of src; sorted, deduplicated, no self
    loops. Returns (indptr, indices), both int64."""
    keep = edges[:, 0] != edges[:, 1]
    # One int64 key per edge (src * n + dst): a 1-d sort, not a row sort.
    keys = np.unique(edges[keep, 0].astype(np.int64) * n + edges[keep, 1])
    src, dst = np.divmod(keys, n)
    del keys
    indptr = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(np.bincount(src, minlength=n), out=indptr[1:])
    return indptr, dst


def pick_neighbours(indptr, indices, v, fanout, rng):
    """Up to `fanout` of node `v`'s listed neighbours (`indices[indptr[v]:
    indptr[v + 1]]`), uniformly without replacement (the sidecar's rule,
    O(fanout) for a node of any degree); all of them with `rng` None,
    with `fanout` -1 (every neighbour) or when there are at most
    `fanout`."""
    return indices[pick_positions(indptr, v, fanout, rng)]


def pick_positions(indptr, v, fanout, rng):
    """`pick_neighbours`, as positions in the neighbour list (PyG's
    `e_id` of each sampled edge, which indexes the edge data)."""
    lo, hi = indptr[v], indptr[v + 1]
    degree = hi - lo
    if rng is None or fanout < 0 or degree <= fanout:
        return np.arange(lo, hi)
    return lo + rng.choice(degree, fanout, replace=False)


# The edge data a dataset's edges may carry (docs/graph-index.md, "Edge
# data"), by the name PyG's models take them under: `edge_attr` [E, A]
# f32, `edge_weight` [E] f32, `edge_time` [E] int64.
EDGE_DATA = ("attr", "weight", "time")


class Edges(dict):
    """A (sub)graph's `edge_index` per edge type, and `data`: per kind of
    EDGE_DATA, per edge type that carries it, its values in `edge_index`'s
    column order (what PyG's NeighborLoader puts beside `edge_index`)."""

    def __init__(self, edge_index, data=None):
        super().__init__(edge_index)
        self.data = {kind: dict(v) for kind, v in (data or {}).items() if v}

    def map(self, edge_fn, data_fn):
        """A copy with every edge_index through `edge_fn(et, value)` and
        every data array through `data_fn(kind, et, value)`."""
        return Edges({et: edge_fn(et, v) for et, v in self.items()},
                     {kind: {et: data_fn(kind, et, v) for et, v in per.items()}
                      for kind, per in self.data.items()})


def read_edge_data(path, spec, num_edges, where):
    """An `edge_data` object's files (docs/graph-index.md, "Edge data"),
    checked as `sidecar import` checks them: {"attr": [E, A] f32,
    "weight": [E] f32, "time": [E] int64}, each only where given."""
    known = {"attrs", "attr_dim", "attr_names", "weight", "time", "time_unit"}
    unknown = sorted(set(spec) - known)
    if unknown:
        sys.exit(f"{where}: edge_data has unknown keys {unknown}; known: {sorted(known)}")
    data = {}
    columns = []
    if "attrs" in spec:
        dim = int(spec.get("attr_dim", 0))
        if not 1 <= dim <= 4096:
            sys.exit(f"{where}: edge_data attrs needs attr_dim 1 to 4096")
        columns.append(("attr", spec["attrs"], "<f4", (num_edges, dim)))
    for kind, dtype in (("weight", "<f4"), ("time", "<i8")):
        if kind in spec:
            columns.append((kind, spec[kind], dtype, (num_edges,)))
    for kind, file, dtype, shape in columns:
        values = np.fromfile(os.path.join(path, file), dtype=dtype)
        if values.size != int(np.prod(shape)):
            sys.exit(f"{os.path.join(path, file)}: {values.size} values, {shape} expected "
                     f"({where})")
        values = values.reshape(shape)
        if dtype == "<f4" and not np.isfinite(values).all():
            sys.exit(f"{os.path.join(path, file)}: a value that is not finite ({where}); edge "
                     "data must be finite numbers")
        data[kind] = values
    return data


def edge_rows(n_dst, src, dst, time=None, drop_self_loops=False):
    """The index's rows of an edge type whose edges carry data: each
    destination's sources, duplicates kept, sorted by (time, source,
    position) with times, else by (source, position); self loops dropped
    where asked. Returns (indptr, indices, order): `order[i]` is the edge
    file's position of the rows' `i`-th entry."""
    keep = np.flatnonzero(src != dst) if drop_self_loops else np.arange(len(src))
    keys = [keep, src[keep]] + ([time[keep]] if time is not None else []) + [dst[keep]]
    order = keep[np.lexsort(keys)]
    indptr = np.zeros(n_dst + 1, dtype=np.int64)
    np.cumsum(np.bincount(dst[order], minlength=n_dst), out=indptr[1:])
    return indptr, src[order].astype(np.int64), order


def fanout_list(text, least=1, what="fanouts"):
    """"20,10": one fanout per hop, 1 to 3 hops, each at least `least` or
    -1 (every neighbour, PyG's num_neighbors -1); exits naming `what`
    otherwise."""
    try:
        fanouts = [int(f) for f in str(text).split(",")]
    except ValueError:
        sys.exit(f"{what} {text!r}: give numbers such as 20,10 (-1: every neighbour)")
    if not 1 <= len(fanouts) <= 3 or any(f < least and f != -1 for f in fanouts):
        sys.exit(f"{what} {text!r}: one fanout of {least} or more (or -1, every neighbour) "
                 "per hop, 1 to 3 hops")
    return fanouts


def sample(ds, target_type, targets, fanouts, rng=None, e_id=None, seed_times=None,
           strategy="uniform"):
    """The one sampler of the model tooling: one batch as
    NeighborLoader(num_neighbors=fanouts, replace=False) builds it from a
    HeteroData for seeds of `target_type`, and as the sidecar writes it
    (`ds`: a `Graph`, whose `lists` give each edge type's (indptr,
    indices) of each destination node's sources; a one-type graph is its
    1x1 case): per type the unique nodes (targets first in theirs, then
    each hop's newly reached ones), per edge type an
    edge_index in local ids. Each hop, every edge type (src, rel, dst) in
    the dataset's order draws, for each node of type dst reached in the
    hop before (in local order), up to its fanout of sources, uniformly
    without replacement (all of them with `rng` None). A fanout of 0
    samples nothing. Returns (n_id, edge_index, num_sampled_nodes,
    num_sampled_edges), dicts as PyG names them, edge_index an `Edges`
    holding the sampled edges' data; with `e_id` a dict, it gets each edge
    type's sampled edges' positions in its rows (PyG's `e_id`).

    With `seed_times` (one per target), temporal sampling as PyG's
    NeighborLoader with `time_attr` on the edges samples (and as the
    sidecar does for the request flag SEED_TIME): every target is the root
    of its own tree (disjoint: a node reached in two trees has a row in
    each; rows are laid out hop by hop over all trees), and a node of
    target t's tree draws only among its sources through an edge whose time
    is at most seed_times[t] (the first ones of its row, which is sorted by
    time; every source for an edge type without times), at every hop:
    uniformly (`strategy` "uniform"), or the most recent `fanout` of them
    ("last"). Then `e_id`, if given, also gets "tree": per node type each
    row's target (PyG's `batch`)."""
    hops = len(next(iter(fanouts.values())))
    n_id = {t: [] for t in ds.node_types}
    row = {t: {} for t in ds.node_types}
    temporal = seed_times is not None
    if temporal and strategy not in ("uniform", "last"):
        sys.exit(f"temporal strategy {strategy!r}: uniform or last")
    tree = {t: [] for t in ds.node_types}

    def add(t, v, root=0):
        key = (root, v) if temporal else v
        local = row[t].get(key)
        if local is None:
            local = row[t][key] = len(n_id[t])
            n_id[t].append(v)
            tree[t].append(root)
        return local

    for i, v in enumerate(targets):
        add(target_type, int(v), i)
    src = {et: [] for et in ds.edge_types}
    dst = {et: [] for et in ds.edge_types}
    pos = {et: [] for et in ds.edge_types}
    num_nodes = {t: [len(n_id[t])] for t in ds.node_types}
    num_edges = {et: [] for et in ds.edge_types}
    frontier = {t: (0, len(n_id[t])) for t in ds.node_types}
    for hop in range(hops):
        before = {t: len(n_id[t]) for t in ds.node_types}
        for et in ds.edge_types:
            s, _, d = et
            fanout = fanouts[et][hop]
            count = len(src[et])
            indptr, indices = ds.lists[et]
            begin, end = frontier[d]
            times = ds.edge_data.get(et, {}).get("time") if temporal else None
            for local in range(begin, end) if fanout else ():
                v = n_id[d][local]
                if times is None:
                    picked = pick_positions(indptr, v, fanout, rng)
                else:
                    lo, hi = indptr[v], indptr[v + 1]
                    limit = seed_times[tree[d][local]]
                    valid = lo + int(np.searchsorted(times[lo:hi], limit, side="right"))
                    if strategy == "last" and fanout >= 0:
                        picked = np.arange(max(lo, valid - fanout), valid)
                    elif rng is None or fanout < 0 or valid - lo <= fanout:
                        picked = np.arange(lo, valid)
                    else:
                        picked = lo + rng.choice(valid - lo, fanout, replace=False)
                for p in picked:
                    src[et].append(add(s, int(indices[p]), tree[d][local]))
                    dst[et].append(local)
                    pos[et].append(int(p))
            num_edges[et].append(len(src[et]) - count)
        for t in ds.node_types:
            num_nodes[t].append(len(n_id[t]) - before[t])
        frontier = {t: (before[t], len(n_id[t])) for t in ds.node_types}
    n_id = {t: np.array(v, dtype=np.int64) for t, v in n_id.items()}
    edge_index = {et: np.array([src[et], dst[et]], dtype=np.int64).reshape(2, -1)
                  for et in ds.edge_types}
    pos = {et: np.array(p, dtype=np.int64) for et, p in pos.items()}
    if e_id is not None:
        e_id.update(pos)
        if temporal:
            e_id["tree"] = {t: np.array(v, dtype=np.int64) for t, v in tree.items()}
    return n_id, Edges(edge_index, ds.edge_rows(pos)), num_nodes, num_edges


# The names of a one-type graph as the 1x1 typed graph it is (the
# sidecar's names for it too).
ONE_TYPE = "node"
ONE_EDGE_TYPE = (ONE_TYPE, "to", ONE_TYPE)

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


class Graph:
    """A dataset as the model tooling reads it: N node types and E edge
    types, checked. A typed dataset (docs/graph-index.md, "Typed
    datasets": meta.json has node_types and edge_types) is read as it is;
    a one-type dataset (the ../shared/data layout) is the 1x1 case, node
    type `node` and edge type `node__to__node` whose lists are each node's
    neighbours as the sidecar keeps them (`one_type` is True). Per node
    type: `num_nodes`, `feature_dim` (0: no features), `x`; per edge type
    `edges` ((src, dst) pairs, message src -> dst) and `lists` (each
    destination node's sources, sorted: what the sampler draws from);
    `y`, `split`, `target_type` and `num_classes` where it has labels;
    `edge_data` per edge type that carries any ({"attr", "weight",
    "time"}: `read_edge_data`), aligned with its `edges`, which are then
    in its rows' order (`edge_rows`: duplicates kept)."""

    def __init__(self, path, labels=True):
        with open(os.path.join(path, "meta.json")) as f:
            self.meta = meta = json.load(f)
        self.name = meta.get("name")
        self.one_type = "node_types" not in meta and "edge_types" not in meta
        if self.one_type:
            self._read_one_type(path, labels)
        else:
            self._read_typed(path, labels)

    def _read_one_type(self, path, labels):
        meta, x, edges, y, split = load_dataset(path, labels)
        n, d = x.shape
        self.edge_data = {}
        if "edge_data" in meta:
            # The pair (a, b) lists b in a's row: PyG's edge b -> a.
            data = read_edge_data(path, meta["edge_data"], len(edges), "meta.json")
            row, source = edges[:, 0].astype(np.int64), edges[:, 1].astype(np.int64)
            indptr, indices, order = edge_rows(n, source, row, data.get("time"),
                                               drop_self_loops=True)
            self.edge_data[ONE_EDGE_TYPE] = {k: np.ascontiguousarray(v[order])
                                             for k, v in data.items()}
        else:
            indptr, indices = neighbour_lists(n, edges)
        self.num_nodes, self.feature_dim = {ONE_TYPE: n}, {ONE_TYPE: d}
        self.x = {ONE_TYPE: x} if d else {}
        self.node_types, self.edge_types = [ONE_TYPE], [ONE_EDGE_TYPE]
        # Messages u -> v for every neighbour u of v.
        node = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        self.edges = {ONE_EDGE_TYPE: np.stack([indices, node], axis=1)}
        self.lists = {ONE_EDGE_TYPE: (indptr, indices)}
        self.y, self.split = y, split
        self.target_type = ONE_TYPE
        self.num_classes = int(meta["num_classes"]) if y is not None else None

    def _read_typed(self, path, labels):
        meta = self.meta
        if "node_types" not in meta or "edge_types" not in meta:
            sys.exit(f"{path}/meta.json has one of node_types and edge_types: a typed dataset "
                     "has both (docs/graph-index.md, \"Typed datasets\")")
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
        self.edges, self.edge_data, self.lists = {}, {}, {}
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
            if "edge_data" in e:
                data = read_edge_data(path, e["edge_data"], len(pairs), f"edge type {et}")
                indptr, indices, order = edge_rows(
                    self.num_nodes[et[2]], pairs[:, 0], pairs[:, 1], data.get("time"),
                    drop_self_loops=et[0] == et[2])
                self.edge_data[et] = {k: np.ascontiguousarray(v[order]) for k, v in data.items()}
                self.edges[et] = np.ascontiguousarray(pairs[order])
                self.lists[et] = (indptr, indices)
                continue
            keys = pairs[:, 0] * self.num_nodes[et[2]] + pairs[:, 1]
            if len(keys) > 1 and not (np.diff(keys) > 0).all():
                sys.exit(f"{file}: pairs must be unique and sorted by (src, dst)")
            self.edges[et] = pairs
        self.edge_types = list(self.edges)
        self.y = self.split = None
        self.target_type = self.num_classes = None
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
        # Each destination node's sources (who sends it messages), sorted.
        for et, pairs in self.edges.items():
            if et in self.lists:
                continue
            n_dst = self.num_nodes[et[2]]
            order = np.lexsort((pairs[:, 0], pairs[:, 1]))
            indptr = np.zeros(n_dst + 1, dtype=np.int64)
            np.cumsum(np.bincount(pairs[:, 1], minlength=n_dst), out=indptr[1:])
            self.lists[et] = (indptr, pairs[order, 0])

    @classmethod
    def from_lists(cls, indptr, indices, x=None):
        """A one-type graph of neighbour lists (`neighbour_lists`), for the
        sampler (and `x`'s rows, if given)."""
        g = cls.__new__(cls)
        n = len(indptr) - 1
        d = 0 if x is None else x.shape[1]
        g.meta, g.name, g.one_type = {}, None, True
        g.num_nodes, g.feature_dim = {ONE_TYPE: n}, {ONE_TYPE: d}
        g.x = {ONE_TYPE: x} if d else {}
        g.node_types, g.edge_types = [ONE_TYPE], [ONE_EDGE_TYPE]
        g.lists = {ONE_EDGE_TYPE: (indptr, indices)}
        node = np.repeat(np.arange(n, dtype=np.int64), np.diff(indptr))
        g.edges = {ONE_EDGE_TYPE: np.stack([indices, node], axis=1)}
        g.y = g.split = g.target_type = g.num_classes = None
        g.edge_data = {}
        return g

    def featured(self, node_type):
        return self.feature_dim[node_type] > 0

    def num_edges(self):
        return sum(len(p) for p in self.edges.values())

    def full_graph(self):
        """x_dict (features, or every id) and edge_index_dict of the whole
        graph (`Edges`, with the edge data), as numpy."""
        x = {t: self.x[t] if self.featured(t) else np.arange(self.num_nodes[t], dtype=np.int64)
             for t in self.node_types}
        edge_index = {et: np.ascontiguousarray(p.T) for et, p in self.edges.items()}
        return x, Edges(edge_index, self.full_edge_data())

    def carries(self, kind):
        """The edge types whose edges carry `kind` (one of EDGE_DATA)."""
        return [et for et in self.edge_types if kind in self.edge_data.get(et, {})]

    def edge_rows(self, e_id, kinds=EDGE_DATA):
        """The edge data of sampled edges (`sample`'s `e_id`): per kind of
        `kinds`, per edge type that carries it, its values in the sampled
        edges' order."""
        return {kind: {et: np.ascontiguousarray(self.edge_data[et][kind][e_id[et]])
                       for et in self.carries(kind)} for kind in kinds}

    def full_edge_data(self, kinds=EDGE_DATA):
        """The edge data of `full_graph`'s edges, as `edge_rows` gives it."""
        return {kind: {et: self.edge_data[et][kind] for et in self.carries(kind)}
                for kind in kinds}

    def rows(self, n_id):
        """x_dict of a sampled subgraph: each type's rows, or its ids."""
        return {t: np.ascontiguousarray(self.x[t][ids]) if self.featured(t) else ids
                for t, ids in n_id.items()}


def session_of(path):
    """An onnxruntime CPU session of one thread (as one worker executor
    runs one batch: timings compare models, not thread pools)."""
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    return ort.InferenceSession(path, options, providers=["CPUExecutionProvider"])


_last_progress = [0.0]


def progress(text, last=False, every=0.0):
    """One line of progress on stderr; with `every` > 0 the line is
    rewritten in place at most once per `every` seconds (and with `last`,
    always, ending the line)."""
    if every <= 0:
        print(text, file=sys.stderr, flush=True)
        return
    now = time.time()
    if last or now - _last_progress[0] >= every:
        _last_progress[0] = now
        sys.stderr.write("\r" + text + ("\n" if last else ""))
        sys.stderr.flush()


def file_sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def peak_rss_mib():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0
