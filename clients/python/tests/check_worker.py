"""Checks gnn_client against a running worker; run by
tests/tests/python_client.rs with the package installed from the
repository. Exits non-zero with the failed check.

    python check_worker.py --grpc HOST:PORT --http HOST:PORT --expected FILE \
        --max-request-targets N --feature-dim D
"""
import argparse
import json
import socket

import gnn_client
from gnn_client import Client, InvalidArgument, NewNode, Unavailable


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--grpc", required=True)
    parser.add_argument("--http", required=True)
    parser.add_argument("--expected", required=True,
                        help="JSON list of {node_id, label, logits} from the worker's HTTP API")
    parser.add_argument("--max-request-targets", type=int, required=True)
    parser.add_argument("--feature-dim", type=int, required=True)
    args = parser.parse_args()
    with open(args.expected) as f:
        expected = json.load(f)
    ids = [e["node_id"] for e in expected]

    client = Client(args.grpc, http=args.http, timeout=10)
    client.wait_ready(timeout=30)
    ok, reason = client.ready()
    assert ok, reason

    got = client.predict(ids, request_id=7)
    assert [p.node_id for p in got] == ids, got
    for p, e in zip(got, expected):
        assert isinstance(p, gnn_client.Prediction)
        assert p.label == e["label"], (p, e)
        assert max(abs(a - b) for a, b in zip(p.logits, e["logits"])) <= 1e-5, (p, e)
        assert p.known and p.answered_by == "gnn" and not p.degraded, p
    unknown = client.predict([10**12])[0]
    # An unknown node is answered from the default row: flagged degraded.
    assert unknown.known is False and unknown.degraded is True, unknown

    too_many = list(range(args.max_request_targets + 1))
    try:
        client.predict(too_many)
        raise AssertionError("too many node ids were accepted")
    except InvalidArgument as e:
        assert isinstance(e, ValueError)
        assert "max_request_targets" in e.message, e.message

    results = list(client.stream([ids[:2], too_many, ids[2:3]]))
    assert [r.request_id for r in results] == [1, 2, 3], results
    assert results[0].error is None and [p.node_id for p in results[0].predictions] == ids[:2]
    assert isinstance(results[1].error, InvalidArgument) and not results[1].predictions
    assert results[2].error is None and results[2].predictions[0].node_id == ids[2]

    # A burst: 10,000 one-node requests sent back to back on one stream, all
    # answered, in order.
    burst = [[i % 2708] for i in range(10_000)]
    answered = 0
    for k, result in enumerate(client.stream(burst), start=1):
        assert result.request_id == k and result.error is None, result
        assert result.predictions[0].node_id == burst[k - 1][0], result
        answered += 1
    assert answered == len(burst), answered

    row = [1.0] * args.feature_dim
    new = client.predict_new_node(NewNode(id=10**6, features=row, neighbors=ids[:3]))
    assert new.node_id == 10**6 and new.known, new
    try:
        client.predict_new_node(NewNode(id=10**6, features=row[:-1], neighbors=ids[:3]))
        raise AssertionError("a row of the wrong width was accepted")
    except InvalidArgument as e:
        assert str(args.feature_dim) in e.message, e.message
    client.close()

    # Nobody listening: UNAVAILABLE, raised as Unavailable.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with Client(f"127.0.0.1:{port}", http=f"127.0.0.1:{port}", timeout=2) as gone:
        try:
            gone.predict(ids)
            raise AssertionError("a call to a closed port succeeded")
        except Unavailable:
            pass
        assert gone.ready()[0] is False
    print(f"gnn_client checks passed against {args.grpc}")


if __name__ == "__main__":
    main()
