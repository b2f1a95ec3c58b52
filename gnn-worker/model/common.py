"""What every model tool shares (sage.py, pyg_model.py, pyg_hetero.py): the
one reader of the ../shared/data dataset layout, the neighbour lists as the
sidecar's index keeps them, the one neighbour sampler (the sidecar's rule),
onnxruntime sessions, progress lines and file hashes."""
import hashlib
import json
import os
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
    O(fanout) for a node of any degree); all of them with `rng` None or
    when there are at most `fanout`."""
    lo, hi = indptr[v], indptr[v + 1]
    degree = hi - lo
    if rng is None or degree <= fanout:
        return indices[lo:hi]
    return indices[lo + rng.choice(degree, fanout, replace=False)]


def sample(ds, target_type, targets, fanouts, rng=None):
    """The one sampler of the model tooling: one batch as
    NeighborLoader(num_neighbors=fanouts, replace=False) builds it from a
    HeteroData for seeds of `target_type`, and as the sidecar writes it
    (`ds`: anything with `node_types`, `edge_types` and `lists`, each edge
    type's (indptr, indices) of each destination node's sources; a
    one-type graph is `one_type_graph`, its one type and one edge type): per type the unique nodes (targets first in
    theirs, then each hop's newly reached ones), per edge type an
    edge_index in local ids. Each hop, every edge type (src, rel, dst) in
    the dataset's order draws, for each node of type dst reached in the
    hop before (in local order), up to its fanout of sources, uniformly
    without replacement (all of them with `rng` None). A fanout of 0
    samples nothing. Returns (n_id, edge_index, num_sampled_nodes,
    num_sampled_edges), dicts as PyG names them."""
    hops = len(next(iter(fanouts.values())))
    n_id = {t: [] for t in ds.node_types}
    row = {t: {} for t in ds.node_types}

    def add(t, v):
        local = row[t].get(v)
        if local is None:
            local = row[t][v] = len(n_id[t])
            n_id[t].append(v)
        return local

    for v in targets:
        add(target_type, int(v))
    src = {et: [] for et in ds.edge_types}
    dst = {et: [] for et in ds.edge_types}
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
            for local in range(begin, end) if fanout else ():
                for u in pick_neighbours(indptr, indices, n_id[d][local], fanout, rng):
                    src[et].append(add(s, int(u)))
                    dst[et].append(local)
            num_edges[et].append(len(src[et]) - count)
        for t in ds.node_types:
            num_nodes[t].append(len(n_id[t]) - before[t])
        frontier = {t: (before[t], len(n_id[t])) for t in ds.node_types}
    n_id = {t: np.array(v, dtype=np.int64) for t, v in n_id.items()}
    edge_index = {et: np.array([src[et], dst[et]], dtype=np.int64).reshape(2, -1)
                  for et in ds.edge_types}
    return n_id, edge_index, num_nodes, num_edges


# The names of a one-type graph as the 1x1 typed graph it is.
ONE_TYPE = "node"
ONE_EDGE_TYPE = (ONE_TYPE, "to", ONE_TYPE)


class OneTypeGraph:
    """A one-type graph's neighbour lists (`neighbour_lists`) as the typed
    sampler reads a graph: one node type, one edge type whose lists are
    each node's neighbours (who send it messages)."""

    node_types = [ONE_TYPE]
    edge_types = [ONE_EDGE_TYPE]

    def __init__(self, indptr, indices):
        self.lists = {ONE_EDGE_TYPE: (indptr, indices)}


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
