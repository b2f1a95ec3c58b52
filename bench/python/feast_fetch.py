"""Feast's online store on the same Redis (system (d) of the benchmark):
the feature store teams use, asked for the same rows as the product's cold
fetch. Feature fetch only.

    python feast_fetch.py --redis 127.0.0.1:6379 --features features.f32 --dim 128 \
        --num-nodes N --rows rows.json --out feast.json

rows.json is a list of requests, each the list of node ids (the unique rows
of one sampled neighbourhood). The rows they name are written to Feast's
online store first (write_to_online_store: Feast keeps its own keys and
encoding in Redis, beside the product's), then each request is one
get_online_features call, one at a time; out gets the latencies in
microseconds.
"""
import argparse
import json
import os
import tempfile
import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pandas as pd
from feast import Entity, FeatureStore, FeatureView, Field, FileSource, ValueType
from feast.infra.online_stores.redis import RedisOnlineStoreConfig
from feast.repo_config import RepoConfig
from feast.types import Array, Float32


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--redis", required=True)
    p.add_argument("--features", required=True)
    p.add_argument("--dim", type=int, required=True)
    p.add_argument("--num-nodes", type=int, required=True)
    p.add_argument("--rows", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--warmup", type=int, default=5)
    args = p.parse_args()

    with open(args.rows) as f:
        requests = json.load(f)
    x = np.memmap(args.features, dtype="<f4", mode="r", shape=(args.num_nodes, args.dim))
    repo = tempfile.mkdtemp(prefix="feast-")
    config = RepoConfig(
        project="gnnbench",
        registry=os.path.join(repo, "registry.db"),
        provider="local",
        online_store=RedisOnlineStoreConfig(connection_string=args.redis),
        entity_key_serialization_version=3,
    )
    store = FeatureStore(config=config)
    node = Entity(name="node", join_keys=["node_id"], value_type=ValueType.INT64)
    placeholder = os.path.join(repo, "source.parquet")
    pd.DataFrame({"node_id": [0], "embedding": [[0.0] * args.dim],
                  "ts": [datetime.now(timezone.utc)]}).to_parquet(placeholder)
    view = FeatureView(name="node_features", entities=[node],
                       schema=[Field(name="embedding", dtype=Array(Float32))],
                       source=FileSource(path=placeholder, timestamp_field="ts"),
                       online=True, ttl=timedelta(days=7))
    store.apply([node, view])

    ids = np.array(sorted({int(v) for request in requests for v in request}), dtype=np.int64)
    started = time.time()
    now = datetime.now(timezone.utc)
    for chunk in range(0, len(ids), 20_000):
        part = ids[chunk:chunk + 20_000]
        df = pd.DataFrame({"node_id": part, "embedding": list(np.asarray(x[part])),
                           "ts": [now] * len(part)})
        store.write_to_online_store("node_features", df)
    written = time.time() - started

    def fetch(request):
        return store.get_online_features(
            features=["node_features:embedding"],
            entity_rows=[{"node_id": int(v)} for v in request]).to_dict()

    for request in requests[:args.warmup]:
        fetch(request)
    latencies = []
    for request in requests:
        t = time.perf_counter()
        got = fetch(request)
        latencies.append((time.perf_counter() - t) * 1e6)
        first = got["embedding"][0]
        if first is None or not np.allclose(first, x[int(request[0])], atol=1e-6):
            raise SystemExit(f"feast returned a wrong row for node {request[0]}")
    with open(args.out, "w") as f:
        json.dump({"latencies_us": latencies, "rows_written": len(ids),
                   "write_seconds": written}, f)


if __name__ == "__main__":
    main()
