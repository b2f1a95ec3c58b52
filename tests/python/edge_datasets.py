"""Datasets whose edges carry data, for tests/tests/edge_models.rs:

    python tests/python/edge_datasets.py cora <cora dir> <out dir> [attr,weight,time]

cora with, per edge of its edge file, 3 attributes (standard normal), a
weight (uniform 0.1 .. 2) and a time (an integer 0 .. 99), seeded (the
columns named, default all): the one-type layout's `edge_data`
(docs/graph-index.md, "Edge data").
"""
import json
import os
import shutil
import sys

import numpy as np


def cora(source, out, columns=("attr", "weight", "time")):
    os.makedirs(out, exist_ok=True)
    for name in ("features.f32", "edges.u32", "labels.i32", "split.u8"):
        shutil.copy(os.path.join(source, name), os.path.join(out, name))
    with open(os.path.join(source, "meta.json")) as f:
        meta = json.load(f)
    edges = meta["num_edges"]
    rng = np.random.default_rng(1)
    rng.standard_normal((edges, 3)).astype("<f4").tofile(os.path.join(out, "attr.f32"))
    rng.uniform(0.1, 2.0, edges).astype("<f4").tofile(os.path.join(out, "weight.f32"))
    rng.integers(0, 100, edges).astype("<i8").tofile(os.path.join(out, "time.i64"))
    data = {"attr": {"attrs": "attr.f32", "attr_dim": 3}, "weight": {"weight": "weight.f32"},
            "time": {"time": "time.i64", "time_unit": "step"}}
    meta["edge_data"] = {k: v for c in columns for k, v in data[c].items()}
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump(meta, f)


if __name__ == "__main__":
    if len(sys.argv) not in (4, 5) or sys.argv[1] != "cora":
        sys.exit(__doc__)
    cora(sys.argv[2], sys.argv[3], *([sys.argv[4].split(",")] if len(sys.argv) == 5 else []))
