"""Reads one published response straight out of the sidecar's segment.

Everything here comes from docs/protocol.md alone: the header offsets, the
geometry, the slot state word and the response header. The Arrow tables are
decoded by pyarrow from a buffer over the mapping, without a copy; the script
reports whether every data buffer pyarrow returns lies inside the mapping.

Usage: read_segment.py <segment name> <slot index>
Prints one JSON object on stdout.
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

    assert mm[0:8] == MAGIC, "magic"
    assert u32(8) == 4, "layout version"
    assert u64(16) == size, "segment size"
    # Geometry at 720, feature schema at 784.
    slot_count, max_targets = u32(720), u32(724)
    control_off, data_off, stride, request_bytes = u64(744), u64(752), u64(760), u64(768)
    feature_dim, dtype = u32(784), u32(788)
    assert 0 <= slot_idx < slot_count
    assert dtype == 1, "f32"

    word = u64(control_off + 64 * slot_idx)
    state = word & 0xFF
    area = data_off + slot_idx * stride + request_bytes
    status, n_targets, n_nodes = u32(area), u32(area + 4), u32(area + 8)
    node_off, node_len = u64(area + 40), u64(area + 48)
    target_off, target_len = u64(area + 56), u64(area + 64)
    # The subgraph layout (hops 1 to 3) adds the edge table.
    edge_off, edge_len, hops = u64(area + 104), u64(area + 112), u32(area + 120)

    base = pa.py_buffer(mm)
    lo, hi = base.address, base.address + base.size

    def read_table(off, length):
        # Slicing a pyarrow Buffer is zero-copy; open_stream reads from it in place.
        reader = pa.ipc.open_stream(base.slice(area + off, length))
        batches = list(reader)
        assert len(batches) == 1
        return batches[0]

    nodes = read_table(node_off, node_len)
    targets = read_table(target_off, target_len)
    edges = read_table(edge_off, edge_len) if hops else None

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

    for column in nodes.columns + targets.columns + (edges.columns if edges else []):
        check(column)

    features = nodes.column("features").values.to_numpy(zero_copy_only=True)
    out = {
        "state_published": state == PUBLISHED,
        "status": status,
        "n_targets": n_targets,
        "n_nodes": n_nodes,
        "feature_dim": feature_dim,
        "max_targets": max_targets,
        "node_ids": nodes.column("node_id").to_pylist(),
        "features": [float(x) for x in features],
        "fallback": nodes.column("fallback").to_pylist(),
        "target_ids": targets.column("target_id").to_pylist(),
        "target_row": targets.column("target_row").to_pylist(),
        "hops": hops,
        "buffers_inside": inside,
        "buffers_outside": outside,
        "buffers_misaligned": misaligned,
        "features_inside": lo <= features.ctypes.data < hi,
        "layout_version": nodes.schema.metadata[b"gnn.layout_version"].decode(),
    }
    if hops:
        # PyG's edge_index: the list column's values, a 2 x E int64 matrix.
        edge_index = edges.column("edge_index").values.to_numpy(zero_copy_only=True)
        out["edge_index"] = edge_index.reshape(2, -1).tolist()
        out["edge_index_inside"] = lo <= edge_index.ctypes.data < hi or edge_index.size == 0
        counts = edges.column("hop_counts").to_pylist()
        out["num_sampled_nodes"], out["num_sampled_edges"] = counts[0], counts[1]
        del edge_index
    else:
        out["hop1_rows"] = targets.column("hop1_rows").values.to_pylist()
        out["hop2_rows"] = targets.column("hop2_rows").values.to_pylist()
    del nodes, targets, edges, features, base
    json.dump(out, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
