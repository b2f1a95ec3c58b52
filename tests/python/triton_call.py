"""Calls a model through the Open Inference Protocol with tritonclient,
over HTTP and over gRPC, as a client of a KServe InferenceService would
(tests/tests/pod.rs), and prints what each answered as JSON: per protocol
the model's readiness, its `logits` as the f32 bytes in hex and its
`label`s. Run with .venv-v2's Python.
"""
import argparse
import json

import numpy as np


def call(module, client, model, ids):
    ids_input = module.InferInput("node_ids", [len(ids)], "INT64")
    ids_input.set_data_from_numpy(np.array(ids, dtype=np.int64))
    result = client.infer(model, [ids_input])
    logits = result.as_numpy("logits")
    return {"ready": bool(client.is_model_ready(model)),
            "logits_hex": logits.astype(np.float32).tobytes().hex(),
            "shape": list(logits.shape),
            "label": result.as_numpy("label").tolist()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--http", required=True, help="host:port")
    p.add_argument("--grpc", required=True, help="host:port")
    p.add_argument("--model", required=True)
    p.add_argument("ids", type=int, nargs="+")
    args = p.parse_args()
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp
    out = {"http": call(thttp, thttp.InferenceServerClient(args.http), args.model, args.ids),
           "grpc": call(tgrpc, tgrpc.InferenceServerClient(args.grpc), args.model, args.ids)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
