"""Reads one published typed response straight out of the sidecar's segment.

Written from docs/protocol.md alone: the header offsets, the graph schema
(section 2.7), the slot state word, the response header and the typed
response's table directory (section 4.4), with the data tables of a
response to a request that asked for edge data (section 4.5). The Arrow tables are decoded by
pyarrow from a buffer over the mapping, without a copy; the script reports
whether every data buffer pyarrow returns lies inside the mapping.

Usage: read_typed_segment.py <segment name> <slot index>
Prints one JSON object on stdout: per node type its ids (`n_id`), its
features (`x`, flat, null without features), fallback flags and
`num_sampled_nodes`; per edge type (`src__relation__dst`) its `edge_index`
and `num_sampled_edges`, and where the response carries them its
`edge_attr` (flat), `edge_weight` and `edge_time`; the targets.
"""

import json
import mmap
import os
import struct
import sys

import pyarrow as pa

MAGIC = b"GNNRING\x00"
PUBLISHED = 4


def main() -> int:
    name, slot_idx = sys.argv[1], int(sys.argv[2])
    fd = os.open(f"/dev/shm/{name}", os.O_RDONLY)
    size = os.fstat(fd).st_size
    mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ)
    os.close(fd)

    def u32(off):
        return struct.unpack_from("<I", mm, off)[0]

    def u64(off):
        return struct.unpack_from("<Q", mm, off)[0]

    def name_at(off):
        return mm[off:off + 32].rstrip(b"\x00").decode("ascii")

    assert mm[0:8] == MAGIC, "magic"
    assert u32(8) == 4, "layout version"
    slot_count = u32(720)
    control_off, data_off, stride, request_bytes = u64(744), u64(752), u64(760), u64(768)
    assert u32(784) == 0, "a typed graph's segment has feature_dim 0"
    schema_off, schema_bytes = u64(824), u64(832)
    assert schema_bytes > 0, "a typed graph's segment has a graph schema"
    n_node_types, n_edge_types = u32(schema_off), u32(schema_off + 4)
    node_types = []
    for i in range(n_node_types):
        at = schema_off + 16 + 48 * i
        node_types.append((name_at(at), u32(at + 32)))
    edge_types = []
    for i in range(n_edge_types):
        at = schema_off + 16 + 48 * (n_node_types + i)
        src, dst = u32(at), u32(at + 4)
        edge_types.append(f"{node_types[src][0]}__{name_at(at + 8)}__{node_types[dst][0]}")
        attr_dim, data_flags = u32(at + 40), u32(at + 44)
        assert attr_dim <= 4096 and data_flags & ~0b11 == 0, "edge data of an edge type"
    assert 0 <= slot_idx < slot_count

    state = u64(control_off + 64 * slot_idx) & 0xFF
    area = data_off + slot_idx * stride + request_bytes
    status, n_targets = u32(area), u32(area + 4)
    directory_off, directory_len = u64(area + 40), u64(area + 48)
    target_off, target_len = u64(area + 56), u64(area + 64)
    counts_off, counts_len = u64(area + 104), u64(area + 112)
    hops = u32(area + 120)
    # With edge data asked for, one more entry per edge type (section 4.5).
    with_data = directory_len == 16 * (n_node_types + 2 * n_edge_types)
    assert with_data or directory_len == 16 * (n_node_types + n_edge_types)

    base = pa.py_buffer(mm)
    lo, hi = base.address, base.address + base.size

    def read_table(off, length):
        reader = pa.ipc.open_stream(base.slice(area + off, length))
        batches = list(reader)
        assert len(batches) == 1
        return batches[0]

    def entry(i):
        at = area + directory_off + 16 * i
        return u64(at), u64(at + 8)

    targets = read_table(target_off, target_len)
    counts = read_table(counts_off, counts_len).column("counts").to_pylist()
    nodes = [read_table(*entry(i)) for i in range(n_node_types)]
    edges = [read_table(*entry(n_node_types + i)) for i in range(n_edge_types)]
    data = [None] * n_edge_types
    if with_data:
        for i in range(n_edge_types):
            off, length = entry(n_node_types + n_edge_types + i)
            if length:
                data[i] = read_table(off, length)

    inside, outside, misaligned = 0, 0, 0

    def check(array):
        nonlocal inside, outside, misaligned
        for buf in array.buffers():
            if buf is None or buf.size == 0:
                continue
            if lo <= buf.address and buf.address + buf.size <= hi:
                inside += 1
            else:
                outside += 1
            if buf.address % 64:
                misaligned += 1

    for table in [targets] + nodes + edges + [d for d in data if d is not None]:
        for column in table.columns:
            check(column)

    out = {
        "state_published": state == PUBLISHED,
        "status": status,
        "hops": hops,
        "node_types": [t for t, _ in node_types],
        "target_ids": targets.column("target_id").to_pylist(),
        "target_row": targets.column("target_row").to_pylist(),
        "n_id": {}, "x": {}, "fallback": {}, "num_sampled_nodes": {},
        "edge_index": {}, "num_sampled_edges": {},
        "edge_attr": {}, "edge_weight": {}, "edge_time": {},
    }
    for i, ((type_name, dim), table) in enumerate(zip(node_types, nodes)):
        out["n_id"][type_name] = table.column("node_id").to_pylist()
        out["num_sampled_nodes"][type_name] = counts[i]
        if dim:
            x = table.column("features").values.to_numpy(zero_copy_only=True)
            out["x"][type_name] = [float(v) for v in x]
            out["fallback"][type_name] = table.column("fallback").to_pylist()
            del x
        else:
            out["x"][type_name] = None
    for i, (key, table) in enumerate(zip(edge_types, edges)):
        # PyG's edge_index: the list column's values, a 2 x E int64 matrix.
        index = table.column("edge_index").values.to_numpy(zero_copy_only=True)
        out["edge_index"][key] = index.reshape(2, -1).tolist()
        out["num_sampled_edges"][key] = counts[n_node_types + i]
        del index
        if data[i] is None:
            continue
        names = data[i].schema.names
        if "edge_attr" in names:
            # PyG's edge_attr: the values of the fixed-size list, E x attr_dim.
            attr = data[i].column("edge_attr").values.to_numpy(zero_copy_only=True)
            out["edge_attr"][key] = [float(v) for v in attr]
            del attr
        if "edge_weight" in names:
            weight = data[i].column("edge_weight").to_numpy(zero_copy_only=True)
            out["edge_weight"][key] = [float(v) for v in weight]
            del weight
        if "edge_time" in names:
            time = data[i].column("edge_time").to_numpy(zero_copy_only=True)
            out["edge_time"][key] = [int(v) for v in time]
            del time
    out.update(buffers_inside=inside, buffers_outside=outside, buffers_misaligned=misaligned)
    del targets, nodes, edges, data, base
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
