#!/usr/bin/env python3
"""Converts the OpenFlights database into the typed dataset layout.

Usage: openflights.py <raw-dir> <out-dir>

<raw-dir> holds airports.dat, airlines.dat, routes.dat, countries.dat and
planes.dat of jpatokal/openflights at commit
5a0360255a5a2ff2b9f1e9cb199716da68a8a33f (directory data/). <out-dir> gets
the typed layout (docs/graph-index.md, "Typed datasets"): meta.json,
nodes/<type>.f32 for the types with features, edges/<src>__<rel>__<dst>.u32,
the route edges' attributes edges/airport__route__airport.attr.f32, labels.i32
and split.u8 of the airports. The conversion is deterministic:
running it again on the same files writes the same bytes (the tests check
the shipped copy that way).

Only the standard library and numpy.
"""

import csv
import hashlib
import json
import os
import sys

import numpy as np

COMMIT = "5a0360255a5a2ff2b9f1e9cb199716da68a8a33f"
RAW_FILES = ["airports.dat", "airlines.dat", "routes.dat", "countries.dat", "planes.dat"]
NULL = "\\N"
# OpenFlights' daylight-saving rules, in the order of the one-hot columns
# (E Europe, A US/Canada, S South America, O Australia, Z New Zealand,
# N none, U unknown; \N counts as U).
DST_RULES = ["E", "A", "S", "O", "Z", "N", "U"]
SPLIT_SEED = 0
# The route edge type's attributes (its edge_data, docs/graph-index.md,
# "Edge data"), over the known routes of each (source, destination) pair.
ROUTE_ATTRS = ["routes", "codeshare", "stops", "equipment"]


def read_rows(path, width):
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    for number, row in enumerate(rows, 1):
        if len(row) != width:
            sys.exit(f"{path}:{number}: {len(row)} fields, {width} expected")
    return rows


def number(text, default=0.0):
    return default if text in ("", NULL) else float(text)


def code(text, length):
    """A real IATA or ICAO code: `length` letters or digits."""
    return len(text) == length and text.isalnum()


def first_index(keys):
    index = {}
    for i, key in enumerate(keys):
        index.setdefault(key, i)
    return index


def pairs_array(pairs):
    """Unique (src, dst) pairs sorted, as an E x 2 u32 array."""
    array = np.array(sorted(set(pairs)), dtype="<u4").reshape(-1, 2)
    return np.ascontiguousarray(array)


def sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def convert(raw, out):
    airports = read_rows(os.path.join(raw, "airports.dat"), 14)
    airlines = read_rows(os.path.join(raw, "airlines.dat"), 8)
    routes = read_rows(os.path.join(raw, "routes.dat"), 9)
    countries = read_rows(os.path.join(raw, "countries.dat"), 3)
    planes = read_rows(os.path.join(raw, "planes.dat"), 3)

    # Node ids: row i of a type is line i of its file.
    airport_of = {row[0]: i for i, row in enumerate(airports)}
    airline_of = {row[0]: i for i, row in enumerate(airlines)}
    country_of = first_index(row[0] for row in countries)
    plane_of = {}
    for i, row in enumerate(planes):
        for plane_code in (row[1], row[2]):
            if plane_code not in ("", NULL):
                plane_of.setdefault(plane_code, i)

    airport_x = np.zeros((len(airports), 11), dtype="<f4")
    for i, row in enumerate(airports):
        airport_x[i, 0] = number(row[6]) / 90.0
        airport_x[i, 1] = number(row[7]) / 180.0
        airport_x[i, 2] = number(row[8]) / 10000.0
        airport_x[i, 3] = number(row[9]) / 12.0
        rule = row[10] if row[10] in DST_RULES else "U"
        airport_x[i, 4 + DST_RULES.index(rule)] = 1.0
    airline_x = np.zeros((len(airlines), 3), dtype="<f4")
    for i, row in enumerate(airlines):
        airline_x[i, 0] = 1.0 if row[7] in ("Y", "y") else 0.0
        airline_x[i, 1] = 1.0 if code(row[3], 2) else 0.0
        airline_x[i, 2] = 1.0 if code(row[4], 3) else 0.0

    # A route counts when its airline and both airports are known.
    known = [r for r in routes if r[1] in airline_of and r[3] in airport_of and r[5] in airport_of]
    route = pairs_array(
        (airport_of[r[3]], airport_of[r[5]]) for r in known if r[3] != r[5]
    )
    # Each route edge's attributes, over the known routes of its pair (one
    # per airline flying it): how many, the share of codeshares, the mean
    # stops and the mean count of equipment codes.
    on_pair = {}
    for r in known:
        if r[3] != r[5]:
            on_pair.setdefault((airport_of[r[3]], airport_of[r[5]]), []).append(r)
    route_attr = np.zeros((len(route), len(ROUTE_ATTRS)), dtype="<f4")
    for i, (a, b) in enumerate(route.tolist()):
        flown = on_pair[(a, b)]
        route_attr[i] = [len(flown),
                         np.mean([r[6] == "Y" for r in flown]),
                         np.mean([number(r[7]) for r in flown]),
                         np.mean([len(r[8].split()) for r in flown])]
    serves = pairs_array(
        (airline_of[r[1]], airport_of[a]) for r in known for a in (r[3], r[5])
    )
    located_in = pairs_array(
        (i, country_of[row[3]]) for i, row in enumerate(airports) if row[3] in country_of
    )
    based_in = pairs_array(
        (i, country_of[row[6]]) for i, row in enumerate(airlines) if row[6] in country_of
    )
    flies = pairs_array(
        (airline_of[r[1]], plane_of[c]) for r in known for c in r[8].split() if c in plane_of
    )

    regions = [row[11].split("/")[0] if row[11] not in ("", NULL) else None for row in airports]
    classes = sorted({r for r in regions if r is not None})
    labels = np.array([classes.index(r) if r is not None else -1 for r in regions], dtype="<i4")
    split = np.full(len(airports), 3, dtype="u1")
    labelled = np.flatnonzero(labels >= 0)
    order = np.random.default_rng(SPLIT_SEED).permutation(labelled)
    n_train, n_val = int(len(order) * 0.6), int(len(order) * 0.2)
    split[order[:n_train]] = 0
    split[order[n_train:n_train + n_val]] = 1
    split[order[n_train + n_val:]] = 2

    os.makedirs(os.path.join(out, "nodes"), exist_ok=True)
    os.makedirs(os.path.join(out, "edges"), exist_ok=True)
    files = {}

    def write(relative, array, desc):
        path = os.path.join(out, relative)
        array.tofile(path)
        files[relative] = {"bytes": os.path.getsize(path), "sha256": sha256(path), "desc": desc}

    node_types = []
    for name, rows, x, feature_names in [
        ("airport", airports, airport_x,
         ["latitude / 90", "longitude / 180", "altitude in feet / 10000", "UTC offset in hours / 12"]
         + [f"daylight-saving rule {r}" for r in DST_RULES]),
        ("airline", airlines, airline_x, ["active", "has an IATA code", "has an ICAO code"]),
        ("country", countries, None, []),
        ("plane", planes, None, []),
    ]:
        entry = {"name": name, "num_nodes": len(rows), "feature_dim": 0 if x is None else x.shape[1]}
        if x is not None:
            entry["dtype"] = "f32"
            entry["features"] = f"nodes/{name}.f32"
            entry["feature_names"] = feature_names
            write(entry["features"], x, f"float32 LE row-major {len(rows)} x {x.shape[1]}")
        node_types.append(entry)

    edge_types = []
    for src, rel, dst, pairs in [
        ("airport", "route", "airport", route),
        ("airline", "serves", "airport", serves),
        ("airport", "located_in", "country", located_in),
        ("airline", "based_in", "country", based_in),
        ("airline", "flies", "plane", flies),
    ]:
        for s, r, d, p in [(src, rel, dst, pairs), (dst, "rev_" + rel, src, pairs[:, ::-1])]:
            if r == "rev_route":
                continue  # routes are directed flights; a route back is its own route
            p = pairs_array(map(tuple, p.tolist()))
            relative = f"edges/{s}__{r}__{d}.u32"
            write(relative, p, f"uint32 LE pairs ({s} id, {d} id), unique, sorted")
            entry = {"src": s, "relation": r, "dst": d, "num_edges": len(p), "edges": relative}
            if r == "route":
                attrs = f"edges/{s}__{r}__{d}.attr.f32"
                write(attrs, route_attr, f"float32 LE row-major {len(p)} x {len(ROUTE_ATTRS)}, "
                      "one row per edge of the edge file, in its order")
                entry["edge_data"] = {"attrs": attrs, "attr_dim": len(ROUTE_ATTRS),
                                      "attr_names": ROUTE_ATTRS}
            edge_types.append(entry)

    write("labels.i32", labels, "int32 LE, one per airport: time-zone region class, -1 unknown")
    write("split.u8", split, "uint8, one per airport: 0 train, 1 val, 2 test, 3 none (no label)")

    meta = {
        "name": "openflights",
        "node_types": node_types,
        "edge_types": edge_types,
        "labels": {
            "node_type": "airport",
            "labels": "labels.i32",
            "split": "split.u8",
            "num_classes": len(classes),
            "classes": classes,
            "definition": "the region of the airport's IANA time zone (the part before the first '/'); -1 where OpenFlights has none",
            "split_definition": f"labelled airports permuted by numpy.random.default_rng({SPLIT_SEED}): first 60% train, next 20% val, rest test",
            "split_counts": {k: int((split == v).sum()) for k, v in [("train", 0), ("val", 1), ("test", 2), ("none", 3)]},
            "class_counts": [int((labels == c).sum()) for c in range(len(classes))],
        },
        "files": files,
        "source": {
            "repo": "jpatokal/openflights",
            "commit": COMMIT,
            "path": "data/{" + ",".join(f[:-4] for f in RAW_FILES) + "}.dat",
            "license": "Open Database License (ODbL) 1.0 (data/LICENSE, shipped as LICENCE); OpenFlights' data page licenses the contents under the Database Contents License (DbCL) 1.0; this converted database is a derived database, under the ODbL too",
            "raw_files": {f: sha256(os.path.join(raw, f)) for f in RAW_FILES},
        },
        "conversion": {
            "node_ids": "row i of a type is line i of its .dat file (airports and airlines by their OpenFlights id's line, countries and planes likewise)",
            "route": "one edge per distinct (source airport, destination airport) of the routes whose airline and both airports are known; self loops dropped",
            "route_attrs": "per route edge, over the known routes of its pair (one per airline): routes (their count), codeshare (the share marked Y), stops (their mean), equipment (the mean count of equipment codes)",
            "serves": "an airline serves each airport at either end of its known routes",
            "located_in": "airports.dat's country name matched to countries.dat's name (first match)",
            "based_in": "airlines.dat's country name matched to countries.dat's name (first match)",
            "flies": "the equipment codes of an airline's known routes matched to planes.dat's IATA or ICAO code",
            "reverse": "each relation between two types has its reverse type rev_<relation>, as torch_geometric's ToUndirected names them; routes stay directed",
            "routes_read": len(routes),
            "routes_known": len(known),
        },
    }
    with open(os.path.join(out, "meta.json"), "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=2)
        f.write("\n")
    return meta


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__.strip().splitlines()[2])
    meta = convert(sys.argv[1], sys.argv[2])
    for t in meta["node_types"]:
        print(f"{t['name']}: {t['num_nodes']} nodes, {t['feature_dim']} features")
    for e in meta["edge_types"]:
        print(f"({e['src']}, {e['relation']}, {e['dst']}): {e['num_edges']} edges")


if __name__ == "__main__":
    main()
