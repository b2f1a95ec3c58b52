"""Calls a running gnn-worker through the Open Inference Protocol with the
protocol's own clients, tritonclient (gRPC and HTTP) and the kserve SDK
(REST and gRPC), as a team that already calls Triton or runs KServe would,
and checks every answer against the native API's (tests/tests/
open_inference.rs computes those over gnn.v1 and passes them in
--expected): the logits or the embedding byte for byte, the labels, the
flags. Then the health and metadata calls, and the protocol's errors for
malformed calls.

Run with .venv-v2's Python (requirements-v2.txt), once with --clients
triton and once with --clients kserve: both packages register the
protocol's messages (`inference.*`) in protobuf's default pool, so one
process cannot import both. Prints "v2 checks passed" and exits 0, or
lists every failed check and exits 1.
"""

import argparse
import asyncio
import json
import sys

import numpy as np

failures = []
checked = 0


def expect(condition, what):
    global checked
    checked += 1
    if not condition:
        failures.append(what)


class Expected:
    def __init__(self, path):
        with open(path) as f:
            e = json.load(f)
        self.model = e["model"]
        self.version = e["version"]
        self.output = e["output"]
        self.width = e["width"]
        self.feature_dim = e["feature_dim"]
        self.max_request_targets = e["max_request_targets"]
        self.cases = e["cases"]
        self.new_node = e.get("new_node")

    @property
    def main(self):
        return "logits" if self.output == "classes" else "embedding"

    def outputs(self):
        main = ["label", "logits"] if self.output == "classes" else ["embedding"]
        return main + ["known", "fallback_rows", "answered_by", "degraded"]

    def inputs(self):
        return [
            {"name": "node_ids", "datatype": "INT64", "shape": [-1]},
            {"name": "new_node_id", "datatype": "INT64", "shape": [1]},
            {"name": "new_node_features", "datatype": "FP32", "shape": [self.feature_dim]},
            {"name": "new_node_neighbors", "datatype": "INT64", "shape": [-1]},
            {"name": "new_node_directed", "datatype": "BOOL", "shape": [1]},
        ]

    def output_meta(self):
        types = {"label": "INT32", "logits": "FP32", "embedding": "FP32", "known": "BOOL",
                 "fallback_rows": "UINT32", "answered_by": "BYTES", "degraded": "BOOL"}
        return [
            {"name": n, "datatype": types[n],
             "shape": [-1, self.width] if n in ("logits", "embedding") else [-1]}
            for n in self.outputs()
        ]


def compare(get, case, who, expected, only=None):
    """`get(name)`: the output as numpy (None when absent)."""
    n = len(case["ids"])
    names = only or expected.outputs()
    for name in expected.outputs():
        array = get(name)
        if name not in names:
            expect(array is None, f"{who}: {name} answered though not asked for")
            continue
        if array is None:
            failures.append(f"{who}: no {name} output")
            continue
        if name == expected.main:
            expect(array.dtype == np.float32 and array.shape == (n, expected.width),
                   f"{who}: {name} is {array.dtype} {array.shape}, expected float32 {(n, expected.width)}")
            expect(array.astype(np.float32).tobytes().hex() == case["main_hex"],
                   f"{who}: {name} differs from the native answer's bytes")
        elif name == "label":
            expect(array.dtype == np.int32 and array.tolist() == case["label"],
                   f"{who}: label {array.tolist()} ({array.dtype}), native {case['label']}")
        elif name == "known":
            expect(array.dtype == np.bool_ and array.tolist() == case["known"],
                   f"{who}: known {array.tolist()}, native {case['known']}")
        elif name == "fallback_rows":
            expect(array.dtype == np.uint32 and array.tolist() == case["fallback_rows"],
                   f"{who}: fallback_rows {array.tolist()} ({array.dtype}), native {case['fallback_rows']}")
        elif name == "degraded":
            expect(array.dtype == np.bool_ and array.tolist() == case["degraded"],
                   f"{who}: degraded {array.tolist()}, native {case['degraded']}")
        elif name == "answered_by":
            got = [b.decode() if isinstance(b, bytes) else str(b) for b in array.tolist()]
            expect(got == case["answered_by"], f"{who}: answered_by {got}, native {case['answered_by']}")


def ints(values):
    return [int(v) for v in values]


def check_metadata(model_meta, server_meta, expected, who):
    expect(server_meta["name"] == "gnn-worker", f"{who}: server name {server_meta['name']}")
    expect("binary_tensor_data" in server_meta["extensions"],
           f"{who}: extensions {server_meta['extensions']}")
    expect(model_meta["name"] == expected.model, f"{who}: model name {model_meta['name']}")
    expect(list(model_meta["versions"]) == [expected.version],
           f"{who}: versions {model_meta['versions']}, expected [{expected.version}]")
    expect(model_meta["platform"] == "onnxruntime_onnx", f"{who}: platform {model_meta['platform']}")
    inputs = [{"name": t["name"], "datatype": t["datatype"], "shape": ints(t["shape"])}
              for t in model_meta["inputs"]]
    outputs = [{"name": t["name"], "datatype": t["datatype"], "shape": ints(t["shape"])}
               for t in model_meta["outputs"]]
    expect(inputs == expected.inputs(), f"{who}: inputs {inputs}")
    expect(outputs == expected.output_meta(), f"{who}: outputs {outputs}")


def expect_error(call, status, words, who):
    from tritonclient.utils import InferenceServerException

    try:
        call()
    except InferenceServerException as e:
        expect(e.status() == status, f"{who}: status {e.status()}, expected {status} ({e.message()})")
        for w in words:
            expect(w in (e.message() or ""), f"{who}: message {e.message()!r} lacks {w!r}")
        return
    failures.append(f"{who}: no error")


def new_node_inputs(module, node):
    id_ = module.InferInput("new_node_id", [1], "INT64")
    id_.set_data_from_numpy(np.array([node["id"]], dtype=np.int64))
    features = module.InferInput("new_node_features", [len(node["features"])], "FP32")
    features.set_data_from_numpy(np.array(node["features"], dtype=np.float32))
    neighbors = module.InferInput("new_node_neighbors", [len(node["neighbors"])], "INT64")
    neighbors.set_data_from_numpy(np.array(node["neighbors"], dtype=np.int64))
    return [id_, features, neighbors]


def ids_input(module, ids, datatype="INT64", shape=None, **kw):
    dtype = {"INT64": np.int64, "INT32": np.int32, "FP32": np.float32}[datatype]
    array = np.array(ids, dtype=dtype)
    tensor = module.InferInput("node_ids", shape or [len(ids)], datatype)
    if shape is not None:
        array = array.reshape(shape)
    tensor.set_data_from_numpy(array, **kw)
    return tensor


def check_errors(client, module, expected, who, statuses):
    model = expected.model
    expect_error(lambda: client.infer(model, [ids_input(module, [1, 2], "INT32")]),
                 statuses["invalid"], ["node_ids", "INT32", "expected INT64"], f"{who} wrong dtype")
    expect_error(lambda: client.infer(model, [ids_input(module, [1, 2], shape=[1, 2])]),
                 statuses["invalid"], ["node_ids", "shape [1, 2]", "[T]"], f"{who} wrong shape")
    expect_error(lambda: client.infer("no-such-model", [ids_input(module, [1])]),
                 statuses["not_found"], ["no-such-model", expected.model], f"{who} unknown model")
    expect_error(lambda: client.infer(model, [ids_input(module, [1])], model_version="999"),
                 statuses["not_found"], ["999", expected.version], f"{who} unknown version")
    expect_error(lambda: client.infer(model, [ids_input(module, [1])],
                                      outputs=[module.InferRequestedOutput("probabilities")]),
                 statuses["invalid"], ["unknown output", "probabilities"], f"{who} unknown output")
    expect_error(lambda: client.infer(model, [ids_input(module, [1])],
                                      outputs=[module.InferRequestedOutput(expected.main, class_count=2)]),
                 statuses["invalid"], ["classification"], f"{who} classification")
    too_many = list(range(expected.max_request_targets + 1))
    expect_error(lambda: client.infer(model, [ids_input(module, too_many)]),
                 statuses["invalid"], ["max_request_targets"], f"{who} too many targets")
    # Over the 4 MiB a message or body may have.
    huge = list(range(600_000))
    expect_error(lambda: client.infer(model, [ids_input(module, huge)]),
                 statuses["too_large"], [], f"{who} oversized")


def check_extensions(c, expected, who, status):
    """tritonclient's calls of Triton's extensions, which the worker does
    not implement: each refused with a message naming its extension."""
    model = expected.model
    for call, extension in [
        (lambda: c.get_model_config(model), "model configuration"),
        (lambda: c.get_inference_statistics(model), "statistics"),
        (lambda: c.get_model_repository_index(), "model repository"),
        (lambda: c.load_model(model), "model repository"),
        (lambda: c.get_system_shared_memory_status(), "system shared memory"),
    ]:
        expect_error(call, status, [f"the {extension} extension", "does not implement",
                                    "docs/serving.md"], f"{who} {extension}")


def check_health(c, expected, who, **json):
    """Liveness, readiness and metadata through a tritonclient client
    (the gRPC one's metadata as JSON with `as_json=True`)."""
    expect(c.is_server_live(), f"{who}: not live")
    expect(c.is_server_ready(), f"{who}: not ready")
    expect(c.is_model_ready(expected.model), f"{who}: model not ready")
    expect(c.is_model_ready(expected.model, expected.version), f"{who}: version not ready")
    check_metadata(c.get_model_metadata(expected.model, **json),
                   c.get_server_metadata(**json), expected, who)


def triton_grpc(url, expected):
    import tritonclient.grpc as tgrpc

    who = "tritonclient.grpc"
    with tgrpc.InferenceServerClient(url) as c:
        check_health(c, expected, who, as_json=True)
        for case in expected.cases:
            r = c.infer(expected.model, [ids_input(tgrpc, case["ids"])], request_id="case")
            expect(r.get_response().id == "case", f"{who}: id {r.get_response().id!r}")
            expect(r.get_response().model_version == expected.version,
                   f"{who}: model_version {r.get_response().model_version}")
            compare(r.as_numpy, case, f"{who} {len(case['ids'])} ids", expected)
            # The response's parameter: some prediction is degraded.
            flag = r.get_response().parameters["degraded"].bool_param
            expect(flag == any(case["degraded"]), f"{who}: parameter degraded {flag}")
        case = expected.cases[-1]
        only = [expected.main, "known"]
        r = c.infer(expected.model, [ids_input(tgrpc, case["ids"])],
                    outputs=[tgrpc.InferRequestedOutput(n) for n in only])
        compare(r.as_numpy, case, f"{who} two outputs", expected, only)
        if expected.new_node:
            r = c.infer(expected.model, new_node_inputs(tgrpc, expected.new_node))
            compare(r.as_numpy, expected.new_node, f"{who} new node", expected)
        statuses = {"invalid": "StatusCode.INVALID_ARGUMENT", "not_found": "StatusCode.NOT_FOUND",
                    "too_large": "StatusCode.RESOURCE_EXHAUSTED"}
        check_errors(c, tgrpc, expected, who, statuses)
        check_extensions(c, expected, who, "StatusCode.UNIMPLEMENTED")


def triton_http(url, expected):
    import tritonclient.http as thttp

    who = "tritonclient.http"
    with thttp.InferenceServerClient(url) as c:
        check_health(c, expected, who)
        for binary in (True, False):
            for case in expected.cases:
                outputs = [thttp.InferRequestedOutput(n, binary_data=binary) for n in expected.outputs()]
                r = c.infer(expected.model, [ids_input(thttp, case["ids"], binary_data=binary)],
                            outputs=outputs)
                compare(r.as_numpy, case, f"{who} {len(case['ids'])} ids binary={binary}", expected)
                flag = r.get_response()["parameters"]["degraded"]
                expect(flag is any(case["degraded"]), f"{who}: parameter degraded {flag!r}")
        # No outputs named: every output (binary, tritonclient's default).
        case = expected.cases[0]
        r = c.infer(expected.model, [ids_input(thttp, case["ids"])])
        compare(r.as_numpy, case, f"{who} default outputs", expected)
        if expected.new_node:
            r = c.infer(expected.model, new_node_inputs(thttp, expected.new_node))
            compare(r.as_numpy, expected.new_node, f"{who} new node", expected)
        statuses = {"invalid": "400", "not_found": "404", "too_large": "413"}
        check_errors(c, thttp, expected, who, statuses)
        check_extensions(c, expected, who, "501")


async def kserve_clients(http, grpc, expected):
    from kserve import InferenceGRPCClient, InferenceRESTClient, InferInput, InferRequest, RESTConfig
    from kserve.protocol.infer_type import RequestedOutput

    rest = InferenceRESTClient(RESTConfig(protocol="v2"))
    base = f"http://{http}"
    expect(await rest.is_server_live(base), "kserve REST: not live")
    expect(await rest.is_server_ready(base), "kserve REST: not ready")
    expect(await rest.is_model_ready(base, expected.model), "kserve REST: model not ready")
    g = InferenceGRPCClient(grpc)
    expect(await g.is_server_ready(), "kserve gRPC: not ready")
    expect(await g.is_model_ready(expected.model), "kserve gRPC: model not ready")
    for case in expected.cases:
        ids = np.array(case["ids"], dtype=np.int64)
        for binary in (True, False):
            tensor = InferInput("node_ids", [len(ids)], "INT64")
            tensor.set_data_from_numpy(ids, binary_data=binary)
            outputs = [RequestedOutput(n, {"binary_data": binary}) for n in expected.outputs()]
            request = InferRequest(expected.model, [tensor], request_outputs=outputs)
            response = await rest.infer(base, request, model_name=expected.model)
            by_name = {o.name: o for o in response.outputs}
            compare(lambda n: by_name[n].as_numpy() if n in by_name else None, case,
                    f"kserve REST binary={binary}", expected)
        tensor = InferInput("node_ids", [len(ids)], "INT64")
        tensor.set_data_from_numpy(ids)
        response = await g.infer(InferRequest(expected.model, [tensor]))
        by_name = {o.name: o for o in response.outputs}
        compare(lambda n: by_name[n].as_numpy() if n in by_name else None, case,
                "kserve gRPC", expected)
    await rest.close()
    await g.close()


def main():
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--grpc", required=True, help="host:port")
    parser.add_argument("--http", required=True, help="host:port")
    parser.add_argument("--expected", required=True)
    parser.add_argument("--clients", choices=["triton", "kserve"], required=True)
    args = parser.parse_args()
    expected = Expected(args.expected)
    if args.clients == "triton":
        triton_grpc(args.grpc, expected)
        triton_http(args.http, expected)
    else:
        # Importing kserve parses sys.argv as its model server's flags.
        sys.argv = sys.argv[:1]
        asyncio.run(kserve_clients(args.http, args.grpc, expected))
    if failures:
        print(f"{len(failures)} checks of the {args.clients} clients failed:")
        for f in failures:
            print(" -", f)
        sys.exit(1)
    print(f"v2 checks passed ({checked} checks of the {args.clients} clients)")


if __name__ == "__main__":
    main()
