//! k8s/kserve (docs/operations.md, "Deploying with KServe"): rendered with
//! `kubectl kustomize`, its ServingRuntime and InferenceService validated
//! against KServe's own CRD schemas (vendored in third_party/kserve/crds,
//! strict: a field the schema does not name is an error), its ConfigMap
//! with kubernetes-validate, and the configuration files it carries
//! accepted by the daemons themselves. The runtime runs the pod pair: the
//! worker as kserve-container under the InferenceService's name, the
//! sidecar beside it on the same /dev/shm.

use std::path::Path;
use std::process::Command;

use tests::stack::{python, rendered_objects, repo_root, run_ok, workspace_bin};

const KUBERNETES_VERSION: &str = "1.32.0";

fn kubectl_kustomize(dir: &Path) -> String {
    let found = Command::new("kubectl")
        .arg("version")
        .arg("--client")
        .output();
    assert!(
        found.is_ok_and(|o| o.status.success()),
        "kubectl is missing: install kubectl (with kustomize) or Debian's kubernetes-client \
         (scripts/setup.sh)"
    );
    run_ok(
        Command::new("kubectl").arg("kustomize").arg(dir),
        "kubectl kustomize k8s/kserve",
    )
    .0
}

#[test]
fn the_kserve_manifests_validate_against_kserves_crds() {
    let root = repo_root();
    let rendered = kubectl_kustomize(&root.join("k8s/kserve"));
    let work = tempfile::tempdir().unwrap();
    let file = work.path().join("kserve.yaml");
    std::fs::write(&file, &rendered).unwrap();
    let found = rendered_objects(&rendered);
    let kinds: Vec<&str> = found.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds,
        ["ConfigMap", "ServingRuntime", "InferenceService"],
        "{rendered}"
    );

    // The custom kinds against KServe's CRDs.
    let crds = root.join("third_party/kserve/crds");
    let (said, _) = run_ok(
        Command::new(python())
            .arg(root.join("tests/python/validate_crd.py"))
            .arg("--crd")
            .arg(crds.join("serving.kserve.io_servingruntimes.yaml"))
            .arg("--crd")
            .arg(crds.join("serving.kserve.io_inferenceservices.yaml"))
            .arg(&file),
        "validate_crd.py",
    );
    assert!(
        said.contains("ServingRuntime gnn-serving: valid against serving.kserve.io/v1alpha1")
            && said.contains("InferenceService cora-sage: valid against serving.kserve.io/v1beta1"),
        "{said}"
    );
    // The validator refuses what the API server would: an unknown field,
    // a value of the wrong type.
    let broken = rendered
        .replacen(
            "protocolVersion: v2",
            "protocolVersion: v2\n      replica: 2",
            1,
        )
        .replacen("containerPort: 8080", "containerPort: http", 1);
    let broken_file = work.path().join("broken.yaml");
    std::fs::write(&broken_file, broken).unwrap();
    let refused = Command::new(python())
        .arg(root.join("tests/python/validate_crd.py"))
        .arg("--crd")
        .arg(crds.join("serving.kserve.io_servingruntimes.yaml"))
        .arg("--crd")
        .arg(crds.join("serving.kserve.io_inferenceservices.yaml"))
        .arg(&broken_file)
        .output()
        .unwrap();
    let report = String::from_utf8_lossy(&refused.stdout);
    assert!(!refused.status.success(), "{report}");
    assert!(report.contains("'replica' was unexpected"), "{report}");
    assert!(
        report.contains("'http' is not of type 'integer'"),
        "{report}"
    );

    // The ConfigMap against Kubernetes' schemas.
    let report = run_ok(
        Command::new(root.join(".venv/bin/kubernetes-validate"))
            .args(["-k", KUBERNETES_VERSION, "--strict"])
            .arg(&file),
        "kubernetes-validate",
    )
    .0;
    assert!(
        report.contains("passed for resource configmap/gnn-serving-kserve-config-"),
        "{report}"
    );
    // The generated ConfigMap's name (a content hash) is what the
    // runtime mounts.
    let config_map = &found[0].1;
    assert!(
        rendered.contains(&format!("name: {config_map}\n"))
            && rendered.matches(config_map.as_str()).count() == 2,
        "the ServingRuntime does not mount the generated {config_map}:\n{rendered}"
    );

    // The runtime: the worker as kserve-container with the model KServe
    // mounts and the InferenceService's name; the sidecar beside it; one
    // memory-backed /dev/shm for both.
    for needle in [
        "name: kserve-container",
        "- /mnt/models",
        "- --model-name",
        "- '{{.Name}}'",
        "path: /v2/health/ready",
        "name: sidecar\n",
        "medium: Memory",
        "runtime: gnn-serving",
        // Both of the worker's ports, gRPC named so that KServe marks it
        // appProtocol grpc.
        "containerPort: 8080",
        "containerPort: 8081",
        "name: grpc\n",
    ] {
        assert!(rendered.contains(needle), "no {needle:?} in:\n{rendered}");
    }
    assert_eq!(rendered.matches("mountPath: /dev/shm").count(), 2);

    // The configuration files are the daemons' own: each accepts its file
    // (with the arguments the runtime adds).
    let kserve = root.join("k8s/kserve");
    let (worker, _) = run_ok(
        Command::new(workspace_bin("gnn-worker"))
            .args(["serve", "--config"])
            .arg(kserve.join("worker.toml"))
            .args([
                "--model",
                "/mnt/models",
                "--model-name",
                "cora-sage",
                "--print-config",
            ]),
        "gnn-worker serve --print-config",
    );
    assert!(worker.contains("model_name = \"cora-sage\""), "{worker}");
    assert!(worker.contains("http = \"0.0.0.0:8080\""), "{worker}");
    let (sidecar, _) = run_ok(
        Command::new(workspace_bin("sidecar"))
            .args(["serve", "--config"])
            .arg(kserve.join("sidecar.toml"))
            .arg("--print-config"),
        "sidecar serve --print-config",
    );
    assert!(sidecar.contains("shm_name = \"gnn-ring\""), "{sidecar}");
    assert!(worker.contains("shm_name = \"gnn-ring\""), "{worker}");
}
