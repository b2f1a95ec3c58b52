"""A Python client for gnn-worker's gRPC API (gnn-worker/proto/predictor.proto).

    from gnn_client import Client

    with Client("127.0.0.1:50051", http="127.0.0.1:8080") as client:
        client.wait_ready(timeout=30)
        for p in client.predict([1, 2, 3]):
            print(p.node_id, p.label, p.answered_by)

Errors are raised as the exceptions below (a `GnnError` each), named after
the gRPC status the worker answered with.
"""
from gnn_client.client import (
    Client,
    DeadlineExceeded,
    GnnError,
    InternalError,
    InvalidArgument,
    NewNode,
    NotReady,
    Overloaded,
    Prediction,
    StreamResult,
    Unavailable,
)

__all__ = [
    "Client",
    "DeadlineExceeded",
    "GnnError",
    "InternalError",
    "InvalidArgument",
    "NewNode",
    "NotReady",
    "Overloaded",
    "Prediction",
    "StreamResult",
    "Unavailable",
]
