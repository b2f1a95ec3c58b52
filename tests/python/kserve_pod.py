"""The pod KServe's controller runs for an InferenceService of the
gnn-serving runtime, written for `podman kube play` (tests/tests/pod.rs):
reads `kubectl kustomize k8s/kserve`'s output, takes the ServingRuntime's
containers and volumes as they are, fills in what the controller fills in
(`{{.Name}}`: the InferenceService's name; the model directory at
/mnt/models, where KServe's storage initializer copies the storageUri),
and adds what the test needs (this run's images, host ports). Prints the
runtime's ConfigMap and the Pod as one YAML stream.
"""
import argparse
import copy

import yaml


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rendered", required=True, help="kubectl kustomize k8s/kserve's output")
    p.add_argument("--pod", required=True, help="the pod's name")
    p.add_argument("--model-dir", required=True, help="the model directory (host path)")
    p.add_argument("--worker-image", required=True)
    p.add_argument("--sidecar-image", required=True)
    p.add_argument("--http-port", type=int, required=True)
    p.add_argument("--grpc-port", type=int, required=True)
    p.add_argument("--metrics-port", type=int, required=True)
    args = p.parse_args()
    with open(args.rendered) as f:
        docs = [d for d in yaml.safe_load_all(f) if d]
    kinds = {d["kind"]: d for d in docs}
    runtime, service = kinds["ServingRuntime"], kinds["InferenceService"]
    model = service["spec"]["predictor"]["model"]
    if model["runtime"] != runtime["metadata"]["name"]:
        raise SystemExit(f"the InferenceService names runtime {model['runtime']!r}, the "
                         f"ServingRuntime is {runtime['metadata']['name']!r}")
    name = service["metadata"]["name"]
    spec = copy.deepcopy(runtime["spec"])
    host_ports = {8080: args.http_port, 8081: args.grpc_port, 9100: args.metrics_port}
    for c in spec["containers"]:
        c["args"] = [a.replace("{{.Name}}", name) for a in c.get("args", [])]
        c["image"] = {"gnn-worker": args.worker_image,
                      "gnn-sidecar": args.sidecar_image}[c["image"]]
        for port in c.get("ports", []):
            port["hostPort"] = host_ports[port["containerPort"]]
        if c["name"] == "kserve-container":
            c.setdefault("volumeMounts", []).append(
                {"name": "kserve-provision-location", "mountPath": "/mnt/models",
                 "readOnly": True})
    volumes = spec.get("volumes", []) + [
        {"name": "kserve-provision-location",
         "hostPath": {"path": args.model_dir, "type": "Directory"}}]
    pod = {"apiVersion": "v1", "kind": "Pod",
           "metadata": {"name": args.pod,
                        "labels": {"serving.kserve.io/inferenceservice": name}},
           "spec": {"containers": spec["containers"], "volumes": volumes}}
    print(yaml.safe_dump_all([kinds["ConfigMap"], pod], sort_keys=False))


if __name__ == "__main__":
    main()
