"""The client: typed predictions, gRPC statuses mapped to exceptions,
streaming, readiness."""
from __future__ import annotations

import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from typing import Iterable, Iterator, Optional, Sequence

import grpc

from gnn_client import predictor_pb2, predictor_pb2_grpc


class GnnError(Exception):
    """A call the worker did not answer with predictions. `code` is the
    gRPC status code (a `grpc.StatusCode`), `message` the worker's text,
    which names the problem and the fix."""

    def __init__(self, code: grpc.StatusCode, message: str):
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message


class InvalidArgument(GnnError, ValueError):
    """INVALID_ARGUMENT: the request was wrong (too many node ids, a bad new
    node, ...); retrying the same request fails the same way."""


class Overloaded(GnnError):
    """RESOURCE_EXHAUSTED: the worker's queue is full; retry after a moment
    or add replicas."""


class Unavailable(GnnError):
    """UNAVAILABLE: the worker is not ready (no sidecar yet, sidecar gone or
    draining) or shutting down; retry, ideally on another replica."""


class DeadlineExceeded(GnnError, TimeoutError):
    """DEADLINE_EXCEEDED: the call's timeout passed before an answer."""


class InternalError(GnnError):
    """INTERNAL or any other status: a fault in the worker; its message says
    what."""


class NotReady(Exception):
    """`wait_ready` ran out of time; the message is the worker's last reason."""


_ERRORS = {
    grpc.StatusCode.INVALID_ARGUMENT: InvalidArgument,
    grpc.StatusCode.RESOURCE_EXHAUSTED: Overloaded,
    grpc.StatusCode.UNAVAILABLE: Unavailable,
    grpc.StatusCode.DEADLINE_EXCEEDED: DeadlineExceeded,
}


def _error(code: grpc.StatusCode, message: str) -> GnnError:
    return _ERRORS.get(code, InternalError)(code, message)


def _code_of(number: int) -> grpc.StatusCode:
    for code in grpc.StatusCode:
        if code.value[0] == number:
            return code
    return grpc.StatusCode.UNKNOWN


@dataclass(frozen=True)
class Prediction:
    """One node's answer (the proto's `Prediction`)."""

    node_id: int
    # Arg max of the logits; -1 from an embedding model.
    label: int
    # Empty from an embedding model.
    logits: list[float]
    # False when the node is not in the sidecar's graph.
    known: bool
    # Rows of its sampled subgraph that were the default row.
    fallback_rows: int
    # The rung of the worker's ladder that answered: "gnn", "precomputed",
    # "gnn_reduced", "student" or "precomputed_unchecked".
    answered_by: str
    # The node's embedding, from a model whose manifest says `output:
    # embedding`; empty from a classifier.
    embedding: list[float] = field(default_factory=list)
    # Less than the model's answer on the node's full, current data: a row it
    # read was the default (fallback_rows > 0) or a rung below the GNN
    # answered. Check this one field where such an answer must not be used.
    degraded: bool = False

    @staticmethod
    def _of(p: predictor_pb2.Prediction) -> "Prediction":
        return Prediction(p.node_id, p.label, list(p.logits), p.known, p.fallback_rows,
                          p.answered_by, list(p.embedding), p.degraded)


@dataclass(frozen=True)
class NewNode:
    """A node the graph does not have, answered from its own row and its
    edges to known nodes without being added."""

    id: int
    features: Sequence[float]
    neighbors: Sequence[int] = field(default_factory=list)
    # The edges go from the new node only (by default both ways).
    directed: bool = False

    def _pb(self) -> predictor_pb2.NewNode:
        return predictor_pb2.NewNode(id=self.id, features=list(self.features),
                                     neighbors=list(self.neighbors), directed=self.directed)


@dataclass(frozen=True)
class StreamResult:
    """One answer on a stream: the predictions, or the error that request
    got (the stream goes on after it)."""

    request_id: int
    predictions: list[Prediction]
    error: Optional[GnnError]


class Client:
    """A connection to one worker. `address` is its gRPC `host:port`;
    `http`, its HTTP `host:port`, is needed only for readiness. `timeout`
    (seconds) is every call's default deadline, sent as grpc-timeout: the
    worker picks the richest rung of its ladder that fits it."""

    def __init__(self, address: str, http: Optional[str] = None,
                 timeout: Optional[float] = None):
        self.address = address
        self.http = http
        self.timeout = timeout
        self._channel = grpc.insecure_channel(address)
        self._stub = predictor_pb2_grpc.PredictorStub(self._channel)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def predict(self, node_ids: Iterable[int], timeout: Optional[float] = None,
                request_id: int = 0) -> list[Prediction]:
        """The predictions of `node_ids`, in order (at most the worker's
        `max_request_targets` per call)."""
        request = predictor_pb2.PredictRequest(node_ids=list(node_ids), request_id=request_id)
        return self._unary(request, timeout)

    def predict_new_node(self, node: NewNode, timeout: Optional[float] = None,
                         request_id: int = 0) -> Prediction:
        """The prediction of a node the graph does not have (nothing is
        added)."""
        request = predictor_pb2.PredictRequest(new_node=node._pb(), request_id=request_id)
        return self._unary(request, timeout)[0]

    def stream(self, requests: Iterable[Sequence[int]],
               timeout: Optional[float] = None) -> Iterator[StreamResult]:
        """Sends each list of node ids on one stream (request ids 1, 2, ...)
        and yields each answer in order; a request that fails yields a
        result with `error` set and the stream goes on. A failure of the
        stream itself raises."""
        def messages():
            for i, ids in enumerate(requests, start=1):
                yield predictor_pb2.PredictRequest(node_ids=list(ids), request_id=i)

        try:
            for response in self._stub.PredictStream(messages(), timeout=self._timeout(timeout)):
                error = None
                if response.HasField("error"):
                    error = _error(_code_of(response.error.code), response.error.message)
                yield StreamResult(response.request_id,
                                   [Prediction._of(p) for p in response.predictions], error)
        except grpc.RpcError as e:
            raise _error(e.code(), e.details() or "") from None

    def ready(self) -> tuple[bool, str]:
        """(whether the worker is ready to serve, its `GET /readyz` line: the
        model it serves when ready, `ready: model <name> sha256 <hex>`, the
        reason when not); needs `http`."""
        if self.http is None:
            raise ValueError("readiness is served over HTTP: give Client(..., http='host:port')")
        try:
            with urllib.request.urlopen(f"http://{self.http}/readyz", timeout=5) as response:
                return True, response.read().decode().strip()
        except urllib.error.HTTPError as e:
            return False, e.read().decode().strip()
        except OSError as e:
            return False, f"no answer from {self.http}: {e}"

    def wait_ready(self, timeout: float = 60.0, interval: float = 0.2) -> None:
        """Waits until the worker is ready; raises NotReady with its last
        reason after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while True:
            ok, reason = self.ready()
            if ok:
                return
            if time.monotonic() >= deadline:
                raise NotReady(f"worker at {self.http} not ready after {timeout} s: {reason}")
            time.sleep(interval)

    def _timeout(self, timeout: Optional[float]) -> Optional[float]:
        return timeout if timeout is not None else self.timeout

    def _unary(self, request, timeout: Optional[float]) -> list[Prediction]:
        try:
            response = self._stub.Predict(request, timeout=self._timeout(timeout))
        except grpc.RpcError as e:
            raise _error(e.code(), e.details() or "") from None
        return [Prediction._of(p) for p in response.predictions]
