//! The pod pair, run for real: the dev overlay (k8s/overlays/dev) rendered
//! with `kubectl kustomize`, every object validated offline with
//! kubernetes-validate against a pinned Kubernetes version, and its
//! Deployment started with `podman kube play` from two images assembled on
//! this machine (no registry can be reached): the release binaries, the
//! shared libraries `ldd` lists, the shipped cora dataset (sidecar) and a
//! model trained on it plus ONNX Runtime (worker), imported with
//! `podman import`.
//!
//! Then: both containers run as uid 10001 and share the segment; the worker
//! answers gRPC for every cora test node at the model's accuracy; the probe
//! commands work inside the sidecar container; `podman kill` of the sidecar
//! makes the worker unready and UNAVAILABLE, and it serves again once the
//! container is back (`podman start`), without a worker restart; stopping
//! the pod (SIGTERM, as Kubernetes does) drains the sidecar, which exits 0
//! and leaves no segment behind; `podman kube down` removes the rest.
//!
//! The KServe runtime (k8s/kserve) is played the same way, as KServe's
//! controller runs it for its InferenceService, and called with
//! tritonclient over HTTP and gRPC.
//!
//! podman runs with a project-local containers.conf (`CONTAINERS_CONF`):
//! runc, cgroupfs, and ulimits the sandbox allows.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::eventually;
use tests::stack::{
    free_port, http_request, read_i32, repo_root, shipped_cora, trained_model_for, workspace_bin,
};

/// The PATH of the images (as Debian's): the probes run `sidecarctl` by name.
const PATH_ENV: &str = "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// The Kubernetes version the rendered objects are validated against.
const KUBERNETES_VERSION: &str = "1.32.0";

/// A command's stdout, failing the test with its stderr otherwise.
fn run(cmd: &mut Command) -> String {
    let out = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn require(tool: &str, fix: &str) {
    let found = Command::new("sh")
        .arg("-c")
        .arg(format!("command -v {tool}"))
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(found, "{tool} is not installed: {fix}");
}

/// One pod played at a time: the tests of this file run on threads of
/// one process, and two pods at once would share the host's free ports
/// (a port `free_port` hands one test can be handed to the other) and its
/// two cores.
static ONE_POD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// What playing a pod needs: podman, runc and kubectl (with kustomize).
fn require_pod_tools() {
    require(
        "podman",
        "run scripts/setup.sh (Debian packages podman, runc)",
    );
    require("runc", "run scripts/setup.sh (Debian package runc)");
    require(
        "kubectl",
        "install kubectl (with kustomize) or Debian's kubernetes-client",
    );
}

/// podman with the project's containers.conf.
struct Podman {
    conf: PathBuf,
}

impl Podman {
    fn new(dir: &Path) -> Self {
        let conf = dir.join("containers.conf");
        std::fs::write(
            &conf,
            "[engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\n\
             [containers]\ndefault_ulimits = [\"nofile=20000:20000\", \"nproc=1000:1000\"]\n",
        )
        .unwrap();
        Self { conf }
    }

    fn cmd(&self) -> Command {
        let mut cmd = Command::new("podman");
        cmd.env("CONTAINERS_CONF", &self.conf);
        cmd
    }

    fn run(&self, args: &[&str]) -> String {
        run(self.cmd().args(args))
    }
}

/// Copies `binary` (without its debug info, as a release image carries it)
/// and every library `ldd` lists for it into `root`, at the same paths.
fn copy_with_libraries(binary: &Path, dest: &Path, root: &Path) {
    let inside = root.join(dest.strip_prefix("/").unwrap());
    std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
    run(Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&inside)
        .arg(binary));
    let listing = run(Command::new("ldd").arg(binary));
    for line in listing.lines() {
        let path = match line.split_once("=>") {
            Some((_, right)) => right.split_whitespace().next(),
            None => line.split_whitespace().next(),
        };
        let Some(path) = path.filter(|p| p.starts_with('/')) else {
            continue;
        };
        let inside = root.join(path.trim_start_matches('/'));
        if inside.exists() {
            continue;
        }
        std::fs::create_dir_all(inside.parent().unwrap()).unwrap();
        std::fs::copy(path, &inside).unwrap_or_else(|e| panic!("copying {path}: {e}"));
    }
}

/// The files every image has: the users. The directories the pod mounts
/// volumes on are left to podman, which creates them owned by the pod's
/// user (over an existing root-owned directory, a volume takes its owner).
fn base_rootfs(root: &Path) {
    for dir in ["etc/gnn-serving", "usr/bin"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(
        root.join("etc/passwd"),
        "root:x:0:0:root:/root:/usr/sbin/nologin\ngnn:x:10001:10001:gnn:/nonexistent:/usr/sbin/nologin\n",
    )
    .unwrap();
    std::fs::write(root.join("etc/group"), "root:x:0:\ngnn:x:10001:\n").unwrap();
}

/// Tars `root` and imports it as `tag`; returns the image's size in bytes.
fn import_image(podman: &Podman, root: &Path, tag: &str, changes: &[&str]) -> u64 {
    let tar = root.with_extension("tar");
    run(Command::new("tar")
        .arg("--owner=0")
        .arg("--group=0")
        .arg("-C")
        .arg(root)
        .arg("-cf")
        .arg(&tar)
        .arg("."));
    let mut cmd = podman.cmd();
    cmd.arg("import");
    for change in changes {
        cmd.args(["--change", change]);
    }
    cmd.arg(&tar).arg(tag);
    run(&mut cmd);
    let size = podman.run(&["image", "inspect", "--format", "{{.Size}}", tag]);
    size.trim().parse().unwrap()
}

/// The two images, assembled from this machine's files and imported as
/// `localhost/gnn-sidecar:<id>` and `localhost/gnn-worker:<id>`: the
/// sidecar with the shipped cora dataset at the path the configurations'
/// `seed_dataset` names, the worker with ONNX Runtime where
/// `onnxruntime_lib` says and `model` (model.onnx, manifest.json) as its
/// image's model.
fn assemble_images(podman: &Podman, work: &Path, id: &str, model: &Path) -> (String, String) {
    let ort = tests::stack::onnxruntime_lib();
    let sidecar_root = work.join("sidecar-root");
    base_rootfs(&sidecar_root);
    copy_with_libraries(
        &workspace_bin("sidecar"),
        Path::new("/usr/bin/sidecar"),
        &sidecar_root,
    );
    copy_with_libraries(
        &workspace_bin("sidecarctl"),
        Path::new("/usr/bin/sidecarctl"),
        &sidecar_root,
    );
    tests::stack::copy_dir(
        &shipped_cora(),
        &sidecar_root.join("usr/share/gnn-serving/datasets/cora"),
    );
    let worker_root = work.join("worker-root");
    base_rootfs(&worker_root);
    copy_with_libraries(
        &workspace_bin("gnn-worker"),
        Path::new("/usr/bin/gnn-worker"),
        &worker_root,
    );
    copy_with_libraries(
        &ort,
        Path::new("/usr/lib/gnn-serving/libonnxruntime.so.1.31.1"),
        &worker_root,
    );
    for file in ["model.onnx", "manifest.json"] {
        let dir = worker_root.join("usr/share/gnn-serving/models/cora");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::copy(model.join(file), dir.join(file)).unwrap();
    }
    let sidecar_image = format!("localhost/gnn-sidecar:{id}");
    let worker_image = format!("localhost/gnn-worker:{id}");
    let sidecar_size = import_image(
        podman,
        &sidecar_root,
        &sidecar_image,
        &[
            "USER 10001:10001",
            PATH_ENV,
            "ENTRYPOINT [\"/usr/bin/sidecar\"]",
            "CMD [\"serve\", \"--config\", \"/etc/gnn-serving/sidecar.toml\"]",
        ],
    );
    let worker_size = import_image(
        podman,
        &worker_root,
        &worker_image,
        &[
            "USER 10001:10001",
            PATH_ENV,
            "ENTRYPOINT [\"/usr/bin/gnn-worker\"]",
            "CMD [\"serve\", \"--config\", \"/etc/gnn-serving/worker.toml\"]",
        ],
    );
    println!(
        "images: sidecar {:.1} MB, worker {:.1} MB",
        sidecar_size as f64 / 1e6,
        worker_size as f64 / 1e6
    );
    (sidecar_image, worker_image)
}

/// Everything the test started, torn down even when it fails.
struct Cleanup<'a> {
    podman: &'a Podman,
    played: Option<PathBuf>,
    images: Vec<String>,
}

impl Drop for Cleanup<'_> {
    fn drop(&mut self) {
        if let Some(file) = self.played.take() {
            let _ = self
                .podman
                .cmd()
                .arg("kube")
                .arg("down")
                .arg(&file)
                .output();
        }
        for image in &self.images {
            let _ = self.podman.cmd().args(["rmi", "-f", image]).output();
        }
    }
}

async fn predict(grpc: &str, ids: &[u64]) -> Result<Vec<pb::Prediction>, tonic::Status> {
    let mut client = PredictorClient::connect(grpc.to_string())
        .await
        .map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let mut out = Vec::with_capacity(ids.len());
    for chunk in ids.chunks(16) {
        let response = client
            .predict(pb::PredictRequest {
                node_ids: chunk.to_vec(),
                request_id: 0,
                new_node: None,
            })
            .await?;
        out.extend(response.into_inner().predictions);
    }
    Ok(out)
}

#[test]
fn the_dev_pod_pair_runs_under_podman_and_survives_a_sidecar_kill() {
    let started = Instant::now();
    let _one_pod = ONE_POD.lock().unwrap_or_else(|p| p.into_inner());
    require_pod_tools();
    let validate = repo_root().join(".venv/bin/kubernetes-validate");
    assert!(
        validate.is_file(),
        "{} is missing: run scripts/setup.sh",
        validate.display()
    );
    let work = tempfile::tempdir().unwrap();
    let podman = Podman::new(work.path());
    // Names of this run (Kubernetes names: lowercase, digits, '-').
    let id = format!("p{}", std::process::id());

    // 1. Render the base and the overlays; validate every object.
    for kustomization in [
        "k8s/base",
        "k8s/overlays/prod",
        "k8s/overlays/dev",
        "k8s/overlays/canary",
    ] {
        let objects = render_and_validate(&validate, kustomization, work.path());
        println!("{kustomization}: {}", objects.join(", "));
        for kind in [
            "ConfigMap/",
            "Service/",
            "Deployment/",
            "PodDisruptionBudget/",
            "HorizontalPodAutoscaler/",
        ] {
            assert!(
                objects.iter().any(|o| o.starts_with(kind)),
                "{kustomization} renders no {kind}"
            );
        }
    }

    // 2. Assemble the two images from this machine's files.
    let cora = shipped_cora();
    let model = trained_model_for(&cora);
    let (sidecar_image, worker_image) = assemble_images(&podman, work.path(), &id, &model);
    let mut cleanup = Cleanup {
        podman: &podman,
        played: None,
        images: vec![sidecar_image.clone(), worker_image.clone()],
    };

    // 3. The dev overlay with this run's images, names and host ports.
    let (grpc_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let overlay = work.path().join("overlay");
    std::fs::create_dir_all(&overlay).unwrap();
    let dev = pathdiff(&repo_root().join("k8s/overlays/dev"), &overlay);
    let (sidecar_tag, worker_tag) = (id.clone(), id.clone());
    std::fs::write(
        overlay.join("kustomization.yaml"),
        format!(
            "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n\
             resources:\n  - {dev}\nnameSuffix: -{id}\n\
             images:\n  - name: localhost/gnn-sidecar\n    newTag: {sidecar_tag}\n\
             \x20 - name: localhost/gnn-worker\n    newTag: {worker_tag}\n\
             patches:\n  - target:\n      kind: Deployment\n      name: gnn-serving\n    patch: |-\n\
             \x20     - op: add\n        path: /spec/template/spec/containers/0/ports/0/hostPort\n        value: {metrics_port}\n\
             \x20     - op: add\n        path: /spec/template/spec/containers/1/ports/0/hostPort\n        value: {grpc_port}\n\
             \x20     - op: add\n        path: /spec/template/spec/containers/1/ports/1/hostPort\n        value: {http_port}\n"
        ),
    )
    .unwrap();
    let for_podman = run(Command::new("kubectl").arg("kustomize").arg(&overlay));
    // podman runs the pod pair: its Deployment and the ConfigMap it mounts
    // (Services, the disruption budget, the autoscaler and the dev Redis,
    // whose image cannot be pulled here, are left out).
    let deployment_name = format!("name: gnn-serving-{id}\n");
    let kind_is = |doc: &str, kind: &str| doc.lines().any(|l| l == format!("kind: {kind}"));
    let kept: Vec<&str> = for_podman
        .split("\n---\n")
        .filter(|doc| {
            kind_is(doc, "ConfigMap")
                || (kind_is(doc, "Deployment") && doc.contains(&deployment_name))
        })
        .collect();
    assert_eq!(kept.len(), 2, "expected the ConfigMap and the Deployment");
    let play_file = work.path().join("play.yaml");
    std::fs::write(&play_file, kept.join("\n---\n")).unwrap();

    // 4. Play it.
    let played_at = Instant::now();
    podman.run(&["kube", "play", play_file.to_str().unwrap()]);
    cleanup.played = Some(play_file.clone());
    let pod = format!("gnn-serving-{id}-pod-0");
    let sidecar_ctr = format!("{pod}-sidecar");
    let worker_ctr = format!("{pod}-worker");
    let http = format!("127.0.0.1:{http_port}");
    let grpc = format!("http://127.0.0.1:{grpc_port}");
    let metrics = format!("127.0.0.1:{metrics_port}");
    let ready = eventually(Duration::from_secs(300), || {
        http_request(&http, "GET", "/readyz", None).is_ok_and(|(code, _)| code == 200)
    });
    if !ready {
        let sidecar_logs = podman.cmd().args(["logs", &sidecar_ctr]).output().unwrap();
        let worker_logs = podman.cmd().args(["logs", &worker_ctr]).output().unwrap();
        panic!(
            "the pod did not become ready.\nsidecar:\n{}\nworker:\n{}",
            String::from_utf8_lossy(&sidecar_logs.stderr),
            String::from_utf8_lossy(&worker_logs.stderr)
        );
    }
    println!(
        "pod ready {:.1} s after kube play",
        played_at.elapsed().as_secs_f64()
    );
    let (code, body) = http_request(&metrics, "GET", "/readyz", None).unwrap();
    assert_eq!((code, body.trim()), (200, "ready"), "the sidecar's /readyz");

    // Non-root, both.
    for ctr in [&sidecar_ctr, &worker_ctr] {
        // `huser`: the uid as the host sees it (no user namespace here).
        let users = podman.run(&["top", ctr, "huser"]);
        let users: Vec<&str> = users.lines().skip(1).map(str::trim).collect();
        assert!(!users.is_empty(), "no process in {ctr}");
        assert!(
            users.iter().all(|u| *u == "10001"),
            "{ctr} runs as {users:?}, not 10001"
        );
    }
    // One segment, in the shared emptyDir, mode 600, owned by uid 10001.
    let mounts = podman.run(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Destination}}={{.Source}}\n{{end}}",
        &sidecar_ctr,
    ]);
    let shm_dir = mounts
        .lines()
        .find_map(|l| l.strip_prefix("/dev/shm="))
        .map(PathBuf::from)
        .expect("the sidecar mounts /dev/shm");
    let worker_mounts = podman.run(&[
        "inspect",
        "--format",
        "{{range .Mounts}}{{.Destination}}={{.Source}}\n{{end}}",
        &worker_ctr,
    ]);
    assert!(
        worker_mounts.contains(&format!("/dev/shm={}", shm_dir.display())),
        "the worker does not mount the sidecar's /dev/shm: {worker_mounts}"
    );
    let segment = shm_dir.join("gnn-ring");
    let meta = std::fs::metadata(&segment).expect("the segment exists in the shared volume");
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(meta.uid(), 10001);
    }
    // The probe commands, inside the sidecar container.
    let probe = |what: &str| {
        podman
            .cmd()
            .args(["exec", &sidecar_ctr, "sidecarctl", what])
            .output()
            .unwrap()
    };
    for what in ["ready", "live"] {
        let out = probe(what);
        assert!(
            out.status.success(),
            "sidecarctl {what} in the pod: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    // 5. Every cora test node, through gRPC.
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let split = std::fs::read(cora.join("split.u8")).unwrap();
    let labels = read_i32(&cora.join("labels.i32"));
    let test: Vec<u64> = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .collect();
    let predictions = runtime.block_on(predict(&grpc, &test)).unwrap();
    assert_eq!(predictions.len(), test.len());
    let right = predictions
        .iter()
        .filter(|p| p.label == labels[p.node_id as usize])
        .count();
    let accuracy = right as f64 / test.len() as f64;
    let manifest: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(model.join("manifest.json")).unwrap())
            .unwrap();
    let offline = manifest["offline"]["test_accuracy"]
        .as_f64()
        .expect("the manifest records the offline test accuracy");
    println!("served accuracy {accuracy:.3} (offline {offline:.3})");
    assert!(
        (accuracy - offline).abs() <= 0.015,
        "served accuracy {accuracy:.3} is not the model's {offline:.3}"
    );

    // 6. The sidecar killed: the worker says so, then serves again once
    //    the container is back, without a restart of its own.
    let worker_started = podman.run(&["inspect", "--format", "{{.State.StartedAt}}", &worker_ctr]);
    podman.run(&["kill", &sidecar_ctr]);
    let killed = Instant::now();
    assert!(
        eventually(Duration::from_secs(5), || {
            http_request(&http, "GET", "/readyz", None).is_ok_and(|(code, _)| code == 503)
        }),
        "the worker still reports ready with its sidecar killed"
    );
    println!(
        "worker unready {:.2} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let refused = runtime.block_on(predict(&grpc, &test[..1]));
    match &refused {
        Err(status) => assert_eq!(status.code(), tonic::Code::Unavailable, "{status}"),
        Ok(p) => panic!("answered with the sidecar killed: {p:?}"),
    }
    // podman does not restart a container it killed itself (a crash it
    // would): bring it back as an operator would.
    podman.run(&["start", &sidecar_ctr]);
    assert!(
        eventually(Duration::from_secs(120), || {
            http_request(&http, "GET", "/readyz", None).is_ok_and(|(code, _)| code == 200)
        }),
        "the worker did not serve again after the sidecar came back"
    );
    println!(
        "serving again {:.1} s after the kill",
        killed.elapsed().as_secs_f64()
    );
    let again = runtime.block_on(predict(&grpc, &test[..50])).unwrap();
    assert_eq!(again.len(), 50);
    assert!(again.iter().all(|p| p.known));
    let worker_after = podman.run(&["inspect", "--format", "{{.State.StartedAt}}", &worker_ctr]);
    assert_eq!(worker_started, worker_after, "the worker was restarted");

    // 7. Stop and remove the pod. podman 4.3's `kube down` removes a
    //    running pod with SIGKILL, no grace period; Kubernetes sends
    //    SIGTERM and waits terminationGracePeriodSeconds. So the pod is
    //    stopped first as Kubernetes would (SIGTERM, a 60 s grace), then
    //    `kube down` removes what is left.
    let stopping = Instant::now();
    podman.run(&["pod", "stop", "--time", "60", &pod]);
    println!(
        "pod stopped {:.1} s after SIGTERM",
        stopping.elapsed().as_secs_f64()
    );
    for ctr in [&sidecar_ctr, &worker_ctr] {
        let code = podman.run(&["inspect", "--format", "{{.State.ExitCode}}", ctr]);
        assert_eq!(code.trim(), "0", "{ctr} did not exit cleanly");
    }
    assert!(
        !segment.exists(),
        "the segment {} outlived the sidecar",
        segment.display()
    );
    let log = {
        let out = podman.cmd().args(["logs", &sidecar_ctr]).output().unwrap();
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    };
    let lines: Vec<&str> = log.lines().collect();
    let last_start = lines
        .iter()
        .rposition(|l| l.contains("sidecar ready"))
        .unwrap_or_else(|| panic!("the sidecar's log does not say it was ready:\n{log}"));
    let tail = lines[last_start..].join("\n");
    for expected in [
        "stopping",
        "draining",
        "drained",
        "shared-memory ring removed",
        "sidecar stopped",
    ] {
        assert!(
            tail.contains(expected),
            "the sidecar's last life did not log {expected:?}:\n{tail}"
        );
    }
    podman.run(&["kube", "down", play_file.to_str().unwrap()]);
    cleanup.played = None;
    let exists = podman.cmd().args(["pod", "exists", &pod]).status().unwrap();
    assert!(!exists.success(), "the pod is still there after kube down");
    println!("pod test took {:.1} s", started.elapsed().as_secs_f64());
}

/// The KServe runtime (k8s/kserve) as KServe's controller runs it for the
/// InferenceService: the ServingRuntime's containers and volumes as
/// rendered, `{{.Name}}` the InferenceService's name, the model at
/// /mnt/models (tests/python/kserve_pod.py), played with `podman kube
/// play`. The sidecar seeds its empty data volume from the dataset its
/// image ships; the worker becomes ready over the Open Inference
/// Protocol; tritonclient calls the model by the InferenceService's name
/// over HTTP (8080) and gRPC (8081) and gets the native API's answers.
#[test]
fn the_kserve_runtime_pod_runs_under_podman_and_answers_tritonclient() {
    let started = Instant::now();
    let _one_pod = ONE_POD.lock().unwrap_or_else(|p| p.into_inner());
    require_pod_tools();
    let work = tempfile::tempdir().unwrap();
    let podman = Podman::new(work.path());
    let id = format!("k{}", std::process::id());
    let cora = shipped_cora();
    let model = trained_model_for(&cora);
    let (sidecar_image, worker_image) = assemble_images(&podman, work.path(), &id, &model);
    let mut cleanup = Cleanup {
        podman: &podman,
        played: None,
        images: vec![sidecar_image.clone(), worker_image.clone()],
    };
    // What the storage initializer leaves at /mnt/models: the model
    // directory, readable by the pod's user.
    let model_dir = work.path().join("mnt-models");
    std::fs::create_dir_all(&model_dir).unwrap();
    for file in ["model.onnx", "manifest.json"] {
        std::fs::copy(model.join(file), model_dir.join(file)).unwrap();
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&model_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let rendered = work.path().join("kserve.yaml");
    std::fs::write(
        &rendered,
        run(Command::new("kubectl")
            .arg("kustomize")
            .arg(repo_root().join("k8s/kserve"))),
    )
    .unwrap();
    let (grpc_port, http_port, metrics_port) = (free_port(), free_port(), free_port());
    let pod = format!("cora-sage-predictor-{id}");
    let play = run(Command::new(tests::stack::python())
        .arg(repo_root().join("tests/python/kserve_pod.py"))
        .arg("--rendered")
        .arg(&rendered)
        .args(["--pod", &pod, "--model-dir"])
        .arg(&model_dir)
        .args([
            "--worker-image",
            &worker_image,
            "--sidecar-image",
            &sidecar_image,
        ])
        .args(["--http-port", &http_port.to_string()])
        .args(["--grpc-port", &grpc_port.to_string()])
        .args(["--metrics-port", &metrics_port.to_string()]));
    let play_file = work.path().join("play.yaml");
    std::fs::write(&play_file, &play).unwrap();

    let played_at = Instant::now();
    podman.run(&["kube", "play", play_file.to_str().unwrap()]);
    cleanup.played = Some(play_file.clone());
    let http = format!("127.0.0.1:{http_port}");
    let grpc = format!("127.0.0.1:{grpc_port}");
    let ready = eventually(Duration::from_secs(300), || {
        http_request(&http, "GET", "/v2/health/ready", None).is_ok_and(|(code, _)| code == 200)
    });
    if !ready {
        let logs = |ctr: &str| {
            let out = podman.cmd().args(["logs", ctr]).output().unwrap();
            String::from_utf8_lossy(&out.stderr).into_owned()
        };
        panic!(
            "the KServe pod did not become ready.\nsidecar:\n{}\nworker:\n{}",
            logs(&format!("{pod}-sidecar")),
            logs(&format!("{pod}-kserve-container"))
        );
    }
    println!(
        "KServe pod ready {:.1} s after kube play",
        played_at.elapsed().as_secs_f64()
    );
    // The sidecar seeded its empty data volume from the image's dataset.
    let sidecar_log = podman
        .cmd()
        .args(["logs", &format!("{pod}-sidecar")])
        .output()
        .unwrap();
    let sidecar_log = String::from_utf8_lossy(&sidecar_log.stderr).into_owned()
        + &String::from_utf8_lossy(&sidecar_log.stdout);
    assert!(
        sidecar_log.contains("seed"),
        "the sidecar's log does not say it seeded its data directory:\n{sidecar_log}"
    );

    // The native answers (gnn.v1 on the same gRPC port), then
    // tritonclient's over both of the runtime's ports.
    let split = std::fs::read(cora.join("split.u8")).unwrap();
    let ids: Vec<u64> = (0..split.len() as u64)
        .filter(|&i| split[i as usize] == 2)
        .take(8)
        .collect();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let native = runtime
        .block_on(predict(&format!("http://{grpc}"), &ids))
        .unwrap();
    let hex: String = native
        .iter()
        .flat_map(|p| p.logits.iter().flat_map(|v| v.to_le_bytes()))
        .map(|b| format!("{b:02x}"))
        .collect();
    let labels: Vec<i32> = native.iter().map(|p| p.label).collect();
    let said = run(Command::new(tests::stack::python_v2())
        .arg(repo_root().join("tests/python/triton_call.py"))
        .args(["--http", &http, "--grpc", &grpc, "--model", "cora-sage"])
        .args(ids.iter().map(u64::to_string)));
    let answers: serde_json::Value = serde_json::from_str(said.trim()).unwrap();
    for protocol in ["http", "grpc"] {
        let answer = &answers[protocol];
        assert_eq!(answer["ready"], true, "{protocol}: {answer}");
        assert_eq!(
            answer["logits_hex"].as_str(),
            Some(hex.as_str()),
            "{protocol}: tritonclient's logits differ from the native answer's"
        );
        assert_eq!(answer["label"], serde_json::json!(labels), "{protocol}");
    }

    // Stopped as Kubernetes stops it (SIGTERM, a grace period): both exit 0.
    podman.run(&["pod", "stop", "--time", "60", &pod]);
    for ctr in [format!("{pod}-sidecar"), format!("{pod}-kserve-container")] {
        let code = podman.run(&["inspect", "--format", "{{.State.ExitCode}}", &ctr]);
        assert_eq!(code.trim(), "0", "{ctr} did not exit cleanly");
    }
    podman.run(&["kube", "down", play_file.to_str().unwrap()]);
    cleanup.played = None;
    println!(
        "KServe pod test took {:.1} s",
        started.elapsed().as_secs_f64()
    );
}

/// Renders `kustomization` (relative to the repository) with `kubectl
/// kustomize`, validates every object with kubernetes-validate against
/// [`KUBERNETES_VERSION`] (strict: unknown fields are errors), and returns
/// the objects as `Kind/name`.
fn render_and_validate(validate: &Path, kustomization: &str, work: &Path) -> Vec<String> {
    let rendered = run(Command::new("kubectl")
        .arg("kustomize")
        .arg(repo_root().join(kustomization)));
    let file = work.join(format!("{}.yaml", kustomization.replace('/', "-")));
    std::fs::write(&file, &rendered).unwrap();
    let report = run(Command::new(validate)
        .args(["-k", KUBERNETES_VERSION, "--strict"])
        .arg(&file));
    let objects: Vec<String> = tests::stack::rendered_objects(&rendered)
        .into_iter()
        .map(|(kind, name)| format!("{kind}/{name}"))
        .collect();
    assert_eq!(
        report.matches(" passed for resource ").count(),
        objects.len(),
        "kubernetes-validate did not pass every object of {kustomization}:\n{report}"
    );
    objects
}

/// `target` relative to `base` (kustomize resolves resources relative to
/// the kustomization).
fn pathdiff(target: &Path, base: &Path) -> String {
    let target = target.canonicalize().unwrap();
    let base = base.canonicalize().unwrap();
    let common = target
        .components()
        .zip(base.components())
        .take_while(|(a, b)| a == b)
        .count();
    let ups = base.components().count() - common;
    let mut out = PathBuf::new();
    for _ in 0..ups {
        out.push("..");
    }
    for part in target.components().skip(common) {
        out.push(part);
    }
    out.to_string_lossy().into_owned()
}
