//! A sidecar serving a typed graph (OpenFlights, or another typed dataset)
//! for the typed tests: `sidecar import`, then a real `sidecar serve`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use protocol::{ClientOptions, RingClient};

use crate::stack::{dataset, run_ok, workspace_bin, Daemon};
use crate::{eventually, unique_name};

/// A typed sidecar; stopped (and checked to stop cleanly) on drop.
pub struct TypedSidecar {
    sidecar: Option<Daemon>,
    pub shm_name: String,
    pub admin_socket: PathBuf,
    pub metrics: String,
    /// The data directory it serves.
    pub data: PathBuf,
    _dir: tempfile::TempDir,
}

/// `sidecar import` of `typed_dataset` into `data`.
pub fn import(typed_dataset: &Path, data: &Path, import_args: &[&str]) {
    run_ok(
        Command::new(workspace_bin("sidecar"))
            .arg("import")
            .arg(typed_dataset)
            .arg("--data-dir")
            .arg(data)
            .args(import_args),
        "sidecar import of a typed dataset",
    );
}

impl TypedSidecar {
    /// On a fresh import of OpenFlights.
    pub fn start(import_args: &[&str], serve_args: &[&str]) -> Self {
        Self::start_on(&dataset("openflights"), import_args, serve_args)
    }

    /// On a fresh import of `typed_dataset`.
    pub fn start_on(typed_dataset: &Path, import_args: &[&str], serve_args: &[&str]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        import(typed_dataset, &data, import_args);
        Self::serve_in(dir, data, serve_args)
    }

    /// On the data directory `data`, imported already (a restart, a
    /// replica).
    pub fn serve(data: &Path, serve_args: &[&str]) -> Self {
        Self::serve_in(tempfile::tempdir().unwrap(), data.to_path_buf(), serve_args)
    }

    fn serve_in(dir: tempfile::TempDir, data: PathBuf, serve_args: &[&str]) -> Self {
        let shm_name = unique_name("typed");
        let admin_socket = dir.path().join("admin.sock");
        let metrics = format!("127.0.0.1:{}", crate::stack::free_port());
        let child = Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .args(["--shm-name", &shm_name, "--admin-socket"])
            .arg(&admin_socket)
            .args(["--metrics-addr", &metrics])
            // Covering fanouts: the most sources of one node is 1,512 (the
            // airports located in the United States).
            .args(["--max-fanouts", "2048,2048", "--response-mib", "32"])
            .args([
                "--max-nodes",
                "100000",
                "--max-targets",
                "16",
                "--slots",
                "8",
            ])
            .args(serve_args)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting sidecar serve");
        let mut sidecar = Daemon {
            child,
            name: "sidecar",
        };
        // Ready once a client attaches: the segment's file appears before
        // its header is written.
        let ready = eventually(Duration::from_secs(60), || {
            RingClient::attach(&shm_name, ClientOptions::default()).is_ok()
                || matches!(sidecar.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            ready && matches!(sidecar.child.try_wait(), Ok(None)),
            "the typed sidecar made no segment (see its log above)"
        );
        Self {
            sidecar: Some(sidecar),
            shm_name,
            admin_socket,
            metrics,
            data,
            _dir: dir,
        }
    }

    pub fn client(&self) -> RingClient {
        RingClient::attach(&self.shm_name, ClientOptions::default()).expect("attaching")
    }

    pub fn sidecarctl(&self, args: &[&str]) -> std::process::Output {
        Command::new(workspace_bin("sidecarctl"))
            .arg("--socket")
            .arg(&self.admin_socket)
            .args(args)
            .output()
            .expect("running sidecarctl")
    }

    /// `sidecarctl --json ARGS`, which must succeed, as JSON.
    pub fn sidecarctl_json(&self, args: &[&str]) -> serde_json::Value {
        let out = self.sidecarctl(&[&["--json"], args].concat());
        assert!(
            out.status.success(),
            "sidecarctl {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("sidecarctl --json answers JSON")
    }

    /// The value of the sample `name` on its metrics endpoint.
    pub fn metric(&self, name: &str) -> f64 {
        crate::stack::metric_value(&self.metrics, name)
    }

    /// The sidecar's process id.
    pub fn pid(&self) -> u32 {
        self.sidecar.as_ref().map_or(0, |s| s.child.id())
    }

    /// Stops it; true when it stopped cleanly.
    pub fn stop(mut self) -> bool {
        self.sidecar.take().map(Daemon::stop).unwrap_or(false)
    }
}

/// `sidecar publish --redis URL --data-dir DATA ARGS...` (the stream is
/// the default one or ARGS name it).
pub fn publish(url: &str, data: &Path, args: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("sidecar"))
        .args(["publish", "--redis", url, "--data-dir"])
        .arg(data)
        .args(args)
        .output()
        .expect("running sidecar publish")
}

impl std::fmt::Debug for TypedSidecar {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TypedSidecar")
            .field("shm_name", &self.shm_name)
            .field("data", &self.data)
            .finish()
    }
}

impl Drop for TypedSidecar {
    fn drop(&mut self) {
        if let Some(sidecar) = self.sidecar.take() {
            let stopped = sidecar.stop();
            if !std::thread::panicking() {
                assert!(stopped, "the typed sidecar did not stop cleanly");
            }
        }
    }
}

/// A `gnn-worker serve` of `model` on the ring `shm_name`, ready.
#[derive(Debug)]
pub struct Worker {
    pub daemon: Daemon,
    pub http: String,
    pub grpc: String,
}

impl Worker {
    /// Starts it with `extra` arguments and waits until `/readyz` answers 200.
    pub fn start(shm_name: &str, model: &Path, extra: &[&str]) -> Self {
        let http = format!("127.0.0.1:{}", crate::stack::free_port());
        let grpc = format!("127.0.0.1:{}", crate::stack::free_port());
        let child = Command::new(workspace_bin("gnn-worker"))
            .arg("serve")
            .arg("--model")
            .arg(model)
            .args(["--shm-name", shm_name, "--grpc", &grpc, "--http", &http])
            .arg("--onnxruntime-lib")
            .arg(crate::stack::onnxruntime_lib())
            .args(extra)
            .stdout(Stdio::null())
            .spawn()
            .expect("starting gnn-worker serve");
        let mut daemon = Daemon {
            child,
            name: "gnn-worker",
        };
        let ready = eventually(Duration::from_secs(60), || {
            crate::stack::http_request(&http, "GET", "/readyz", None).is_ok_and(|(c, _)| c == 200)
                || matches!(daemon.child.try_wait(), Ok(Some(_)))
        });
        assert!(
            ready && matches!(daemon.child.try_wait(), Ok(None)),
            "the worker did not become ready (see its log above)"
        );
        Self { daemon, http, grpc }
    }
}
