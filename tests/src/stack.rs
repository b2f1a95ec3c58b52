//! The whole product as real processes: `sidecar import`, `sidecar serve`,
//! `gnn-worker serve`, and the model tooling (`gnn-worker/model/sage.py`)
//! run by the project venv's Python.

use std::collections::HashMap;
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Mutex;
use std::time::Duration;

use anyhow::{bail, ensure, Context};

use crate::{eventually, unique_name};

/// The repository root.
pub fn repo_root() -> PathBuf {
    // Cargo's run-time value first: a test binary reused from a shared
    // target directory may have been compiled in another checkout, and the
    // compile-time path would point there.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")));
    manifest_dir
        .parent()
        .expect("a crate directory is inside the repository")
        .to_path_buf()
}

/// A dataset the repository ships (`demo/data/<name>.tar.gz`: cora,
/// citeseer, cora_ml, openflights), extracted once per test process into a temporary
/// directory: the tests need nothing beside the checkout.
pub fn dataset(name: &str) -> PathBuf {
    static DIRS: Mutex<Option<HashMap<String, PathBuf>>> = Mutex::new(None);
    let mut dirs = DIRS.lock().unwrap_or_else(|p| p.into_inner());
    let dirs = dirs.get_or_insert_with(HashMap::new);
    if let Some(dir) = dirs.get(name) {
        return dir.clone();
    }
    let archive = repo_root().join(format!("demo/data/{name}.tar.gz"));
    assert!(
        archive.is_file(),
        "{} is missing: the repository ships cora, citeseer, cora_ml and openflights in demo/data",
        archive.display()
    );
    let out = process_dir(&format!("shipped-{name}"));
    let status = Command::new("tar")
        .arg("-xzf")
        .arg(&archive)
        .arg("-C")
        .arg(&out)
        .status()
        .expect("running tar");
    assert!(status.success(), "extracting {} failed", archive.display());
    let dir = out.join(name);
    assert!(
        dir.join("meta.json").is_file(),
        "{} holds no {name}/meta.json",
        archive.display()
    );
    dirs.insert(name.to_string(), dir.clone());
    dir
}

/// The project venv's Python (scripts/setup.sh creates it with numpy,
/// onnx and onnxruntime).
pub fn python() -> PathBuf {
    let venv = repo_root().join(".venv/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/setup.sh",
        venv.display()
    );
    venv
}

/// The objects of a rendered multi-document YAML (`kubectl kustomize`'s
/// output) as (kind, name), in order.
pub fn rendered_objects(rendered: &str) -> Vec<(String, String)> {
    rendered
        .split("\n---\n")
        .filter_map(|doc| {
            let kind = doc.lines().find_map(|l| l.strip_prefix("kind: "))?;
            let name = doc
                .lines()
                .skip_while(|l| *l != "metadata:")
                .find_map(|l| l.strip_prefix("  name: "))?;
            Some((kind.to_string(), name.to_string()))
        })
        .collect()
}

/// The Python of .venv-v2 (scripts/setup.sh creates it from
/// requirements-v2.txt): tritonclient and the kserve SDK, the Open
/// Inference Protocol's clients.
pub fn python_v2() -> PathBuf {
    let venv = repo_root().join(".venv-v2/bin/python");
    assert!(
        venv.exists(),
        "{} is missing: run scripts/setup.sh",
        venv.display()
    );
    venv
}

/// The ONNX Runtime library of the project venv (the `onnxruntime==1.31.1`
/// wheel that scripts/setup.sh installs), passed to the worker explicitly:
/// the worker itself never looks for a venv.
pub fn onnxruntime_lib() -> PathBuf {
    let lib = repo_root().join(".venv/lib");
    let found = std::fs::read_dir(&lib).ok().and_then(|entries| {
        entries.flatten().find_map(|entry| {
            let candidate = entry
                .path()
                .join("site-packages/onnxruntime/capi/libonnxruntime.so.1.31.1");
            candidate.is_file().then_some(candidate)
        })
    });
    found.unwrap_or_else(|| {
        panic!(
            "libonnxruntime.so.1.31.1 is not in {}: run scripts/setup.sh",
            lib.display()
        )
    })
}

/// A binary of the workspace, built beside the running test or binary
/// (`cargo test --workspace` builds them all).
pub fn workspace_bin(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("executable path");
    // A test runs from target/<profile>/deps, a binary from target/<profile>.
    let dir = exe.parent().expect("target/<profile>/...");
    let bin = [dir.join(name), dir.join("..").join(name)]
        .into_iter()
        .find(|p| p.is_file())
        .unwrap_or_else(|| dir.join(name));
    assert!(
        bin.is_file(),
        "{} is missing: build the workspace (cargo test --release --workspace builds every binary)",
        bin.display()
    );
    bin
}

/// A model trained by the tooling for `dataset` (of [`dataset`]), once
/// per test process.
pub fn trained_model(dataset_name: &str) -> PathBuf {
    trained_model_for(&dataset(dataset_name))
}

/// A directory that outlives the test that made it (models and extracted
/// data that a test process's tests share), in the temp directory. Its
/// name carries this process's id, so that the first call in a later test
/// process removes those of test processes that have exited.
pub fn process_dir(prefix: &str) -> PathBuf {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(remove_dirs_of_exited_tests);
    tempfile::Builder::new()
        .prefix(&format!("gnn-test-{}-{prefix}-", std::process::id()))
        .tempdir()
        .expect("temp dir")
        .keep()
}

/// Removes `<temp>/gnn-test-<pid>-...` where no process `<pid>` runs.
fn remove_dirs_of_exited_tests() {
    let Ok(entries) = std::fs::read_dir(std::env::temp_dir()) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(pid) = name
            .to_str()
            .and_then(|n| n.strip_prefix("gnn-test-"))
            .and_then(|rest| rest.split('-').next())
            .and_then(|pid| pid.parse::<u32>().ok())
        else {
            continue;
        };
        if pid != std::process::id() && !Path::new(&format!("/proc/{pid}")).exists() {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// What the model tooling `script` (a file of gnn-worker/model) writes
/// when run with `args` and `--out <dir>`, computed once for every test
/// process of a suite run and of later runs: the first process to need it
/// runs the tool into `<target>/<profile>/test-models/<key>` while the
/// others wait on its lock; each gets its own copy, in a directory of its
/// own ([`process_dir`], prefix `tag`). The key hashes the tooling's Python
/// files, the arguments, and the names and bytes of every file under each
/// argument that is a path (a dataset, a model), so a change to any of
/// them runs the tool again.
pub fn shared_tool_output(script: &str, args: &[&std::ffi::OsStr], tag: &str) -> PathBuf {
    use std::hash::{Hash, Hasher};
    let mut hasher = std::hash::DefaultHasher::new();
    script.hash(&mut hasher);
    hash_tree(&repo_root().join("gnn-worker/model"), &mut hasher);
    for arg in args {
        let path = Path::new(arg);
        if path.exists() {
            hash_tree(path, &mut hasher);
        } else {
            arg.hash(&mut hasher);
        }
    }
    let key = format!("{tag}-{:016x}", hasher.finish());
    let exe = std::env::current_exe().expect("executable path");
    let dir = exe.parent().expect("target/<profile>/...");
    let cache = if dir.ends_with("deps") {
        dir.parent().unwrap_or(dir)
    } else {
        dir
    }
    .join("test-models");
    std::fs::create_dir_all(&cache).expect("the test model cache");
    let lock = std::fs::File::create(cache.join(format!("{key}.lock"))).expect("a lock file");
    // Held until the model is published; the kernel releases it if this
    // process dies, and the next one finds no `.complete` and starts over.
    let lock = nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| e)
        .expect("locking the test model cache");
    let done = cache.join(&key);
    let complete = cache.join(format!("{key}.complete"));
    if !complete.is_file() {
        let partial = cache.join(format!("{key}.partial"));
        let _ = std::fs::remove_dir_all(&partial);
        let _ = std::fs::remove_dir_all(&done);
        let status = Command::new(python())
            .arg(repo_root().join("gnn-worker/model").join(script))
            .args(args)
            .arg("--out")
            .arg(&partial)
            .status()
            .expect("running the model tooling");
        assert!(status.success(), "{script} {args:?} failed");
        std::fs::rename(&partial, &done).expect("publishing a test model");
        std::fs::write(&complete, b"").expect("marking a test model complete");
    }
    drop(lock);
    let out = process_dir(tag);
    copy_dir(&done, &out);
    out
}

/// Hashes the names (relative to `path`) and bytes of the files under
/// `path`, in name order; Python's caches are left out.
fn hash_tree(path: &Path, hasher: &mut impl std::hash::Hasher) {
    use std::hash::Hash;
    if path.is_file() {
        std::fs::read(path)
            .expect("reading a file to hash")
            .hash(hasher);
        return;
    }
    let mut entries: Vec<_> = std::fs::read_dir(path)
        .expect("reading a directory to hash")
        .flatten()
        .filter(|e| e.file_name() != "__pycache__")
        .collect();
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        entry.file_name().hash(hasher);
        hash_tree(&entry.path(), hasher);
    }
}

/// A model trained by the tooling for the dataset directory `dir`, once per
/// suite run ([`shared_tool_output`]), copied once per test process.
pub fn trained_model_for(dir: &Path) -> PathBuf {
    static MODELS: Mutex<Option<HashMap<PathBuf, PathBuf>>> = Mutex::new(None);
    let mut models = MODELS.lock().unwrap_or_else(|p| p.into_inner());
    let models = models.get_or_insert_with(HashMap::new);
    if let Some(path) = models.get(dir) {
        return path.clone();
    }
    let name = dir
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let out = shared_tool_output(
        "sage.py",
        &["train".as_ref(), "--dataset".as_ref(), dir.as_os_str()],
        &format!("model-{name}"),
    );
    models.insert(dir.to_path_buf(), out.clone());
    out
}

/// A model derived by the tooling from the one [`trained_model_for`] `dir`
/// trains: `sage.py quantize` (`"quantize"`, INT8) or `sage.py distill`
/// (`"distill"`, the MLP student), once per suite run
/// ([`shared_tool_output`]).
pub fn derived_model_for(dir: &Path, command: &str) -> PathBuf {
    static MODELS: Mutex<Option<HashMap<(PathBuf, String), PathBuf>>> = Mutex::new(None);
    let source = trained_model_for(dir);
    let mut models = MODELS.lock().unwrap_or_else(|p| p.into_inner());
    let models = models.get_or_insert_with(HashMap::new);
    let key = (dir.to_path_buf(), command.to_string());
    if let Some(path) = models.get(&key) {
        return path.clone();
    }
    let from = if command == "distill" {
        "--teacher"
    } else {
        "--model"
    };
    let out = shared_tool_output(
        "sage.py",
        &[
            command.as_ref(),
            from.as_ref(),
            source.as_os_str(),
            "--dataset".as_ref(),
            dir.as_os_str(),
            "--runs".as_ref(),
            "20".as_ref(),
        ],
        &format!("model-{command}"),
    );
    models.insert(key, out.clone());
    out
}

/// A PyTorch Geometric model trained and exported by
/// `gnn-worker/model/pyg_model.py train --dataset <dir> <args>`, once per
/// suite run and argument list ([`shared_tool_output`]; the subgraph
/// layout, docs/model.md).
pub fn pyg_model_for(dir: &Path, args: &[&str]) -> PathBuf {
    /// (dataset, arguments) -> model directory.
    type Trained = HashMap<(PathBuf, Vec<String>), PathBuf>;
    static MODELS: Mutex<Option<Trained>> = Mutex::new(None);
    let key = (
        dir.to_path_buf(),
        args.iter().map(|a| a.to_string()).collect::<Vec<_>>(),
    );
    if let Some(path) = MODELS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .get(&key)
    {
        return path.clone();
    }
    // Trained outside the lock: models of other arguments train at once.
    let mut tool_args: Vec<&std::ffi::OsStr> =
        vec!["train".as_ref(), "--dataset".as_ref(), dir.as_os_str()];
    tool_args.extend(args.iter().map(std::ffi::OsStr::new));
    let out = shared_tool_output("pyg_model.py", &tool_args, "pyg-model");
    MODELS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(key, out.clone());
    out
}

/// A heterogeneous model trained and exported by
/// `gnn-worker/model/pyg_model.py train --dataset <dir> <args>`, once per
/// suite run and argument list ([`shared_tool_output`]), in a directory of
/// this process prefixed `tag`.
pub fn hetero_model_for(dir: &Path, args: &[&str], tag: &str) -> PathBuf {
    let mut tool_args: Vec<&std::ffi::OsStr> =
        vec!["train".as_ref(), "--dataset".as_ref(), dir.as_os_str()];
    tool_args.extend(args.iter().map(std::ffi::OsStr::new));
    shared_tool_output("pyg_model.py", &tool_args, tag)
}

/// The demo dataset the repository ships (`demo/data/cora.tar.gz`).
pub fn shipped_cora() -> PathBuf {
    dataset("cora")
}

/// A free TCP port on 127.0.0.1 (bound, then released for the child).
pub fn free_port() -> u16 {
    // The kernel may hand a just-released port out again at once: two calls
    // in a row (a gRPC and an HTTP port) could return the same one. Every
    // port is given to one caller of this process only.
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    let mut given = GIVEN.lock().unwrap_or_else(|p| p.into_inner());
    loop {
        let port = TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .expect("a free port");
        if !given.contains(&port) {
            given.push(port);
            return port;
        }
    }
}

/// How the stack is started.
#[derive(Debug, Clone)]
pub struct StackOptions {
    /// A dataset the repository ships ([`dataset`]), unless `dataset_dir`
    /// is set.
    pub dataset: String,
    /// A dataset directory of the shared layout (overrides `dataset`).
    pub dataset_dir: Option<PathBuf>,
    /// Fanouts the sidecar defaults to and the worker sends.
    pub fanouts: [u32; 2],
    /// The sidecar's caps (unset: each fanout, at least 50).
    pub max_fanouts: Option<[u32; 2]>,
    pub max_targets: u32,
    /// Slots of the ring (16).
    pub slots: u32,
    pub response_mib: u64,
    pub max_batch: usize,
    pub executors: usize,
    /// Extra `gnn-worker serve` arguments.
    pub worker_args: Vec<String>,
    /// Environment variables of `gnn-worker serve` (`FAILPOINTS`, say).
    pub worker_env: Vec<(String, String)>,
    /// Extra `sidecar serve` arguments.
    pub sidecar_args: Vec<String>,
    /// Environment variables of `sidecar serve`.
    pub sidecar_env: Vec<(String, String)>,
    /// A directory `sidecar import` already wrote: served as it is, with
    /// no import at start (several stacks over one large import).
    pub imported: Option<PathBuf>,
    /// The model to serve instead of one trained for the dataset.
    pub model: Option<PathBuf>,
    /// The worker's `--fanouts` when not `fanouts` (a subgraph-layout
    /// model's, one per hop, such as "168,168,168").
    pub worker_fanouts: Option<String>,
    /// The worker is given no fanouts: a subgraph-layout model is served
    /// at its manifest's (`worker_fanouts` is then unused).
    pub manifest_fanouts: bool,
    /// A directory holding another build's `sidecar`, `sidecarctl` and
    /// `gnn-worker`, run instead of this workspace's (a benchmark beside
    /// an earlier release).
    pub bin_dir: Option<PathBuf>,
}

impl StackOptions {
    pub fn new(dataset: &str) -> Self {
        Self {
            dataset: dataset.into(),
            dataset_dir: None,
            fanouts: [20, 10],
            max_fanouts: None,
            max_targets: 64,
            slots: 16,
            response_mib: 8,
            max_batch: 64,
            executors: 2,
            worker_args: Vec::new(),
            worker_env: Vec::new(),
            sidecar_args: Vec::new(),
            sidecar_env: Vec::new(),
            imported: None,
            model: None,
            worker_fanouts: None,
            manifest_fanouts: false,
            bin_dir: None,
        }
    }

    /// The daemon binary `name`: from `bin_dir` when set, else this
    /// workspace's.
    pub fn bin(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => workspace_bin(name),
        }
    }

    /// The dataset directory to import.
    pub fn dataset_path(&self) -> PathBuf {
        self.dataset_dir
            .clone()
            .unwrap_or_else(|| dataset(&self.dataset))
    }
}

/// A child process stopped with SIGTERM (then SIGKILL after 10 s) on drop.
#[derive(Debug)]
pub struct Daemon {
    pub child: Child,
    pub name: &'static str,
}

impl Daemon {
    /// SIGTERM and wait; returns whether it exited successfully.
    pub fn stop(mut self) -> bool {
        terminate(&mut self.child)
    }
}

fn terminate(child: &mut Child) -> bool {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    let _ = kill(Pid::from_raw(child.id() as i32), Signal::SIGTERM);
    let exited = eventually(Duration::from_secs(10), || {
        matches!(child.try_wait(), Ok(Some(_)))
    });
    if !exited {
        let _ = child.kill();
    }
    child.wait().map(|s| s.success()).unwrap_or(false) && exited
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            terminate(&mut self.child);
        }
    }
}

/// Sidecar + worker on a freshly imported dataset.
#[derive(Debug)]
pub struct Stack {
    pub worker: Option<Daemon>,
    pub sidecar: Option<Daemon>,
    pub shm_name: String,
    pub grpc: String,
    pub http: String,
    pub admin_socket: PathBuf,
    pub model: PathBuf,
    pub dir: tempfile::TempDir,
    /// `sidecar`'s arguments, to start it again.
    sidecar_command: Vec<std::ffi::OsString>,
    /// Where its binaries come from ([`StackOptions::bin_dir`]).
    bin_dir: Option<PathBuf>,
    sidecar_env: Vec<(String, String)>,
}

impl Stack {
    pub fn start(options: &StackOptions) -> anyhow::Result<Self> {
        let dir = tempfile::tempdir()?;
        let model = match &options.model {
            Some(model) => model.clone(),
            None => trained_model_for(&options.dataset_path()),
        };
        let data = match &options.imported {
            Some(data) => data.clone(),
            None => {
                let data = dir.path().join("data");
                let imported = Command::new(options.bin("sidecar"))
                    .arg("import")
                    .arg(options.dataset_path())
                    .arg("--data-dir")
                    .arg(&data)
                    .stdout(Stdio::null())
                    .status()?;
                ensure!(imported.success(), "sidecar import failed");
                data
            }
        };
        let shm_name = unique_name("e2e");
        let admin_socket = dir.path().join("admin.sock");
        let [f1, f2] = options.fanouts;
        let [m1, m2] = options.max_fanouts.unwrap_or([f1.max(50), f2.max(50)]);
        let mut sidecar_command: Vec<std::ffi::OsString> =
            vec!["serve".into(), "--data-dir".into(), data.clone().into()];
        for arg in [
            "--shm-name".to_string(),
            shm_name.clone(),
            "--admin-socket".into(),
            admin_socket.display().to_string(),
            "--fanouts".into(),
            format!("{f1},{f2}"),
            "--max-fanouts".into(),
            format!("{m1},{m2}"),
            "--max-targets".into(),
            options.max_targets.to_string(),
            "--response-mib".into(),
            options.response_mib.to_string(),
            "--slots".into(),
            options.slots.to_string(),
        ]
        .into_iter()
        .chain(options.sidecar_args.iter().cloned())
        {
            sidecar_command.push(arg.into());
        }
        let sidecar = Daemon {
            child: Command::new(options.bin("sidecar"))
                .args(&sidecar_command)
                .envs(options.sidecar_env.iter().map(|(k, v)| (k, v)))
                .spawn()
                .context("starting sidecar serve")?,
            name: "sidecar",
        };
        let spawn_worker = |grpc: &str, http: &str| {
            Command::new(options.bin("gnn-worker"))
                .arg("serve")
                .arg("--model")
                .arg(&model)
                .args(["--shm-name", &shm_name, "--grpc", grpc, "--http", http])
                .args(
                    (!options.manifest_fanouts)
                        .then(|| {
                            let fanouts = options
                                .worker_fanouts
                                .clone()
                                .unwrap_or_else(|| format!("{f1},{f2}"));
                            ["--fanouts".to_string(), fanouts]
                        })
                        .into_iter()
                        .flatten(),
                )
                .args(["--max-batch", &options.max_batch.to_string()])
                .args(["--executors", &options.executors.to_string()])
                .arg("--onnxruntime-lib")
                .arg(onnxruntime_lib())
                .args(&options.worker_args)
                .envs(options.worker_env.iter().map(|(k, v)| (k, v)))
                .spawn()
                .context("starting gnn-worker serve")
        };
        let grpc = format!("127.0.0.1:{}", free_port());
        let http = format!("127.0.0.1:{}", free_port());
        let worker = spawn_worker(&grpc, &http)?;
        let mut stack = Self {
            worker: Some(Daemon {
                child: worker,
                name: "gnn-worker",
            }),
            sidecar: Some(sidecar),
            shm_name: shm_name.clone(),
            grpc: format!("http://{grpc}"),
            http,
            admin_socket,
            model: model.clone(),
            dir,
            sidecar_command,
            sidecar_env: options.sidecar_env.clone(),
            bin_dir: options.bin_dir.clone(),
        };
        // Ready = the worker's /readyz answers 200. A free port handed out
        // may be taken by another process before the worker binds it (the
        // worker then exits naming the address): such a start is tried
        // again on other ports, twice at most.
        for attempt in 0.. {
            let ready = eventually(Duration::from_secs(120), || {
                stack.http_get("/readyz").is_ok_and(|(code, _)| code == 200)
                    || stack.worker_exited()
            });
            if ready && !stack.worker_exited() {
                break;
            }
            let grpc_addr = stack.grpc.trim_start_matches("http://").to_string();
            let port_taken = [&grpc_addr, &stack.http]
                .iter()
                .any(|addr| TcpListener::bind(addr.as_str()).is_err());
            if !(stack.worker_exited() && port_taken && attempt < 2) {
                bail!("the stack did not become ready");
            }
            let grpc = format!("127.0.0.1:{}", free_port());
            let http = format!("127.0.0.1:{}", free_port());
            stack.worker = Some(Daemon {
                child: spawn_worker(&grpc, &http)?,
                name: "gnn-worker",
            });
            stack.grpc = format!("http://{grpc}");
            stack.http = http;
        }
        Ok(stack)
    }

    /// Starts the sidecar again with the same arguments (after the test
    /// killed or stopped the previous one) and waits until the worker is
    /// ready again.
    pub fn restart_sidecar(&mut self) -> anyhow::Result<()> {
        if let Some(mut old) = self.sidecar.take() {
            let _ = old.child.kill();
            let _ = old.child.wait();
        }
        self.sidecar = Some(Daemon {
            child: Command::new(self.bin("sidecar"))
                .args(&self.sidecar_command)
                .envs(self.sidecar_env.iter().map(|(k, v)| (k, v)))
                .spawn()
                .context("starting sidecar serve again")?,
            name: "sidecar",
        });
        // The new sidecar first (the worker may not yet have noticed that
        // the old one is gone), then the worker on it.
        let ready = eventually(Duration::from_secs(120), || {
            self.sidecarctl(&["ready"]).is_ok()
        });
        ensure!(ready, "the new sidecar did not become ready");
        let ready = eventually(Duration::from_secs(120), || {
            self.http_get("/readyz").is_ok_and(|(code, _)| code == 200)
        });
        ensure!(ready, "the worker did not become ready on the new sidecar");
        Ok(())
    }

    fn worker_exited(&mut self) -> bool {
        self.worker
            .as_mut()
            .is_some_and(|w| !matches!(w.child.try_wait(), Ok(None)))
    }

    /// A plain HTTP/1.1 GET: (status code, body).
    pub fn http_get(&self, path: &str) -> anyhow::Result<(u16, String)> {
        http_request(&self.http, "GET", path, None)
    }

    /// The daemon binary `name` this stack runs ([`StackOptions::bin`]).
    pub fn bin(&self, name: &str) -> PathBuf {
        match &self.bin_dir {
            Some(dir) => dir.join(name),
            None => workspace_bin(name),
        }
    }

    /// `sidecarctl --socket <admin> <args...>`: stdout on success.
    pub fn sidecarctl(&self, args: &[&str]) -> anyhow::Result<String> {
        let out = Command::new(self.bin("sidecarctl"))
            .arg("--socket")
            .arg(&self.admin_socket)
            .args(args)
            .output()?;
        ensure!(
            out.status.success(),
            "sidecarctl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Ok(String::from_utf8(out.stdout)?)
    }

    /// Stops the worker then the sidecar; returns whether both exited 0.
    pub fn stop(mut self) -> bool {
        let worker = self.worker.take().map(Daemon::stop).unwrap_or(false);
        let sidecar = self.sidecar.take().map(Daemon::stop).unwrap_or(false);
        worker && sidecar
    }
}

/// A stack whose features are only in `redis` (imported under `base`),
/// which the sidecar reaches at `sidecar_redis_url`, with no L1 and no L2:
/// every row is fetched from Redis.
pub fn redis_only_stack(
    redis: &crate::redis::RedisServer,
    base: &std::path::Path,
    sidecar_redis_url: &str,
    extra: &[&str],
) -> Stack {
    let data = base.join("data");
    sidecar_import(&dataset("cora"), &data, &["--redis", &redis.url()]);
    let mut options = StackOptions::new("cora");
    options.imported = Some(data);
    options.sidecar_args = [
        "--redis",
        sidecar_redis_url,
        "--l1-mib",
        "0",
        "--no-l2",
        "--warm-up",
        "0",
    ]
    .iter()
    .chain(extra)
    .map(|s| s.to_string())
    .collect();
    Stack::start(&options).expect("stack")
}

/// `sidecar import <dataset> --data-dir <data_dir> <extra...>`, which must
/// succeed.
pub fn sidecar_import(dataset_dir: &Path, data_dir: &Path, extra: &[&str]) {
    let out = Command::new(workspace_bin("sidecar"))
        .arg("import")
        .arg(dataset_dir)
        .arg("--data-dir")
        .arg(data_dir)
        .args(extra)
        .output()
        .expect("running sidecar import");
    assert!(
        out.status.success(),
        "sidecar import {}: {}",
        dataset_dir.display(),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The value of one sample of `GET /metrics` on `addr`: `name` with its
/// labels as the exposition writes them, e.g. `x_total{tier="l1"}`.
pub fn metric_value(addr: &str, name: &str) -> f64 {
    let (code, body) = http_request(addr, "GET", "/metrics", None).expect("GET /metrics");
    assert_eq!(code, 200, "GET /metrics on {addr}");
    body.lines()
        .find_map(|line| line.strip_prefix(name)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no metric {name} in:\n{body}"))
        .parse()
        .unwrap_or_else(|e| panic!("{name}: {e}"))
}

/// Rewrites both checksums of a graph index file's bytes
/// (docs/graph-index.md, "The file") after an edit, so that only the
/// structure check can catch the edit.
pub fn reseal_csr(bytes: &mut [u8]) {
    use xxhash_rust::xxh3::xxh3_64;
    let body = xxh3_64(&bytes[128..]);
    bytes[64..72].copy_from_slice(&body.to_le_bytes());
    let header = xxh3_64(&bytes[..120]);
    bytes[120..128].copy_from_slice(&header.to_le_bytes());
}

/// Stops process `pid` (SIGSTOP) and returns once every one of its threads
/// is stopped: a signal is delivered asynchronously, and a probe sent
/// before the stop lands would still be answered.
pub fn freeze_process(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGSTOP).expect("SIGSTOP");
    let all_stopped = || -> bool {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return false;
        };
        tasks.flatten().all(|task| {
            std::fs::read_to_string(task.path().join("stat"))
                .ok()
                .and_then(|stat| {
                    // The state follows the command name in parentheses.
                    let state = stat.rsplit_once(')')?.1.trim_start().chars().next()?;
                    Some(state == 'T' || state == 't')
                })
                .unwrap_or(false)
        })
    };
    assert!(
        eventually(Duration::from_secs(5), all_stopped),
        "process {pid} did not stop"
    );
}

/// Resumes a process stopped by [`freeze_process`].
pub fn thaw_process(pid: u32) {
    use nix::sys::signal::{kill, Signal};
    kill(nix::unistd::Pid::from_raw(pid as i32), Signal::SIGCONT).expect("SIGCONT");
}

/// The status code of `GET path`, or `None` when no answer comes within
/// `limit`: what a probe with that timeout sees.
pub fn http_status_within(addr: &str, path: &str, limit: Duration) -> Option<u16> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr).ok()?;
    stream.set_read_timeout(Some(limit)).ok()?;
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    stream.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// One HTTP/1.1 request with `Connection: close`.
pub fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    json: Option<&str>,
) -> anyhow::Result<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    let body = json.unwrap_or("");
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .context("no HTTP status line")?;
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((code, body))
}

/// Reads a file of little-endian 4-byte values.
fn read_le4<T>(path: &Path, from: fn([u8; 4]) -> T) -> Vec<T> {
    let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    bytes
        .chunks_exact(4)
        .map(|b| from([b[0], b[1], b[2], b[3]]))
        .collect()
}

/// Reads a little-endian f32 file.
/// Through `stack`'s admin socket, adds the edge `a`-`b` (both ways) and
/// invalidates `c`'s row in the graph of `dataset_dir` (`n` nodes); returns
/// the nodes whose 2-hop answer this changes at covering fanouts: a node's
/// answer reads the rows within two hops of it and the neighbour lists of
/// itself and its neighbours.
pub fn add_an_edge_and_invalidate_a_row(
    stack: &Stack,
    dataset_dir: &Path,
    n: usize,
    (a, b, c): (u64, u64, u64),
) -> std::collections::BTreeSet<u64> {
    let mut adjacency = adjacency(dataset_dir, n);
    adjacency[a as usize].push(b);
    adjacency[b as usize].push(a);
    let mut stale = std::collections::BTreeSet::from([a, b, c]);
    stale.extend(adjacency[a as usize].iter().copied());
    stale.extend(adjacency[b as usize].iter().copied());
    for &u in &adjacency[c as usize] {
        stale.insert(u);
        stale.extend(adjacency[u as usize].iter().copied());
    }
    let pair = stack.dir.path().join("edge.txt");
    std::fs::write(&pair, format!("{a} {b}\n")).expect("the edge file");
    let said = stack
        .sidecarctl(&["graph", "add-edges", "--file", &pair.to_string_lossy()])
        .expect("graph add-edges");
    assert!(said.contains("added"), "{said}");
    stack
        .sidecarctl(&["invalidate", &c.to_string()])
        .expect("invalidate");
    stale
}

/// The edges of the dataset in `dataset_dir` (`edges.u32`, both
/// directions listed) as adjacency lists of its `n` nodes.
pub fn adjacency(dataset_dir: &Path, n: usize) -> Vec<Vec<u64>> {
    let edges = std::fs::read(dataset_dir.join("edges.u32")).expect("edges.u32");
    let mut adjacency: Vec<Vec<u64>> = vec![Vec::new(); n];
    for e in edges.chunks_exact(8) {
        let s = u32::from_le_bytes([e[0], e[1], e[2], e[3]]) as usize;
        let d = u32::from_le_bytes([e[4], e[5], e[6], e[7]]) as u64;
        adjacency[s].push(d);
    }
    adjacency
}

pub fn read_f32(path: &Path) -> Vec<f32> {
    read_le4(path, f32::from_le_bytes)
}

/// Reads a little-endian i32 file.
pub fn read_i32(path: &Path) -> Vec<i32> {
    read_le4(path, i32::from_le_bytes)
}

/// What the model tooling's one sampler (`common.sample`) samples on the shipped
/// OpenFlights for `targets` (airports), at `fanout` for every edge type
/// and each of `hops` hops: per node type its ids (`n_id`) and counts
/// (`nodes`), per edge type key its `edge_index` and counts (`edges`).
pub fn openflights_python_sample(targets: &[u64], hops: usize, fanout: u32) -> serde_json::Value {
    let script = format!(
        r#"
import json, sys
sys.path.insert(0, {model_dir:?})
from common import sample
from common import Graph
ds = Graph({dataset:?}, labels=False)
n_id, edge_index, nodes, edges = sample(
    ds, "airport", {targets:?}, {{et: [{fanout}] * {hops} for et in ds.edge_types}}, None)
print(json.dumps({{
    "n_id": {{t: v.tolist() for t, v in n_id.items()}},
    "edge_index": {{"__".join(et): v.tolist() for et, v in edge_index.items()}},
    "nodes": nodes,
    "edges": {{"__".join(et): v for et, v in edges.items()}},
}}))
"#,
        model_dir = repo_root().join("gnn-worker/model").display().to_string(),
        dataset = dataset("openflights").display().to_string(),
    );
    let (stdout, _) = run_ok(
        Command::new(python()).arg("-c").arg(script),
        "common.sample",
    );
    serde_json::from_str(&stdout).expect("common.sample prints JSON")
}

/// Starts `gnn-worker serve` with `model` (and `extra` arguments) beside
/// the sidecar of ring `shm_name`; it must exit non-zero (a model refused
/// at start). Returns its stderr.
pub fn worker_refusal(shm_name: &str, model: &Path, extra: &[&str]) -> String {
    let port = || format!("127.0.0.1:{}", free_port());
    let output = Command::new(workspace_bin("gnn-worker"))
        .arg("serve")
        .arg("--model")
        .arg(model)
        .args(["--shm-name", shm_name, "--grpc", &port(), "--http", &port()])
        .args(["--attach-timeout-s", "10"])
        .arg("--onnxruntime-lib")
        .arg(onnxruntime_lib())
        .args(extra)
        .output()
        .expect("running gnn-worker serve");
    assert!(!output.status.success(), "{} was served", model.display());
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Reads an edge file: little-endian u32 `(src, dst)` pairs.
pub fn read_u32_pairs(path: &Path) -> Vec<(u32, u32)> {
    let ids = read_le4(path, u32::from_le_bytes);
    ids.chunks_exact(2).map(|p| (p[0], p[1])).collect()
}

/// Runs `command` to its end and returns its stdout and stderr; panics
/// naming `what`, with both, when it fails.
pub fn run_ok(command: &mut Command, what: &str) -> (String, String) {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what}: cannot run: {e}"));
    let (stdout, stderr) = (
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    );
    assert!(out.status.success(), "{what} failed:\n{stdout}\n{stderr}");
    (stdout, stderr)
}

/// Copies the files under `from` to `to`, directories made as needed.
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
