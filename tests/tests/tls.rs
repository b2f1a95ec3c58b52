//! TLS on the worker's front ends, with real certificates (openssl), a real
//! sidecar and worker, tonic's TLS client and curl: with `tls_client_ca`,
//! a call with a certificate that CA signed is answered over gRPC and HTTP,
//! and a call without one, with a stranger's, or in plaintext is refused;
//! a worker without `tls_client_ca` answers a call that brings no
//! certificate. The plaintext `health_addr` answers the probes meanwhile.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use gnn_worker::api::grpc::{pb, PredictorClient};
use tests::redis::openssl;
use tests::stack::{
    dataset, free_port, http_request, onnxruntime_lib, sidecar_import, trained_model, workspace_bin,
};
use tests::{eventually, unique_name};
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};

/// A child killed on drop.
struct Proc(Child);

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A certificate `name` signed by the CA `ca`, with the extensions `ext`.
fn signed(dir: &Path, ca: &str, name: &str, ext: &str) {
    let key = format!("{name}.key");
    let csr = format!("{name}.csr");
    let crt = format!("{name}.crt");
    let subject = format!("/CN={name}");
    openssl(
        dir,
        &[
            "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
            &subject,
        ],
    );
    let ext_file = format!("{name}.ext");
    std::fs::write(dir.join(&ext_file), ext).unwrap();
    let (ca_crt, ca_key) = (format!("{ca}.crt"), format!("{ca}.key"));
    openssl(
        dir,
        &[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca_crt,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &crt,
            "-days",
            "2",
            "-extfile",
            &ext_file,
        ],
    );
}

fn ca(dir: &Path, name: &str) {
    let (key, crt, subject) = (
        format!("{name}.key"),
        format!("{name}.crt"),
        format!("/CN={name}"),
    );
    openssl(
        dir,
        &[
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &crt,
            "-days", "2", "-subj", &subject,
        ],
    );
}

/// ca (its server and client certificates) and another CA's client.
fn certificates(dir: &Path) {
    ca(dir, "ca");
    signed(
        dir,
        "ca",
        "server",
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
    );
    signed(dir, "ca", "client", "extendedKeyUsage=clientAuth\n");
    ca(dir, "other-ca");
    signed(dir, "other-ca", "stranger", "extendedKeyUsage=clientAuth\n");
}

struct Worker {
    _proc: Proc,
    grpc: u16,
    http: u16,
    health: u16,
}

fn worker(shm: &str, certs: &Path, client_ca: bool) -> Worker {
    let (grpc, http, health) = (free_port(), free_port(), free_port());
    let mut cmd = Command::new(workspace_bin("gnn-worker"));
    cmd.arg("serve")
        .arg("--model")
        .arg(trained_model("cora"))
        .args(["--shm-name", shm, "--executors", "1"])
        .args(["--grpc", &format!("127.0.0.1:{grpc}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--health-addr", &format!("127.0.0.1:{health}")])
        .arg("--tls-cert")
        .arg(certs.join("server.crt"))
        .arg("--tls-key")
        .arg(certs.join("server.key"))
        .arg("--onnxruntime-lib")
        .arg(onnxruntime_lib())
        .stderr(Stdio::null());
    if client_ca {
        cmd.arg("--tls-client-ca").arg(certs.join("ca.crt"));
    }
    let worker = Worker {
        _proc: Proc(cmd.spawn().unwrap()),
        grpc,
        http,
        health,
    };
    let health = format!("127.0.0.1:{health}");
    let ready = eventually(Duration::from_secs(120), || {
        http_request(&health, "GET", "/readyz", None).is_ok_and(|(code, _)| code == 200)
    });
    assert!(ready, "the worker's plaintext /readyz did not answer 200");
    worker
}

/// A gRPC Predict of nodes 1 and 2 over TLS, with `identity` (a client
/// certificate's name) or none.
fn grpc_call(worker: &Worker, certs: &Path, identity: Option<&str>) -> Result<usize, String> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let read = |name: &str| std::fs::read(certs.join(name)).unwrap();
        let mut tls = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read("ca.crt")))
            .domain_name("localhost");
        if let Some(name) = identity {
            tls = tls.identity(Identity::from_pem(
                read(&format!("{name}.crt")),
                read(&format!("{name}.key")),
            ));
        }
        let channel = Endpoint::from_shared(format!("https://127.0.0.1:{}", worker.grpc))
            .unwrap()
            .tls_config(tls)
            .map_err(|e| e.to_string())?
            .connect()
            .await
            .map_err(|e| format!("connect: {e}"))?;
        let answer = PredictorClient::new(channel)
            .predict(pb::PredictRequest {
                node_ids: vec![1, 2],
                request_id: 7,
                new_node: None,
            })
            .await
            .map_err(|e| format!("predict: {e}"))?;
        Ok(answer.into_inner().predictions.len())
    })
}

/// `curl` POST /v1/predict over TLS with `identity` or none: (exit code
/// success, stdout).
fn curl(worker: &Worker, certs: &Path, identity: Option<&str>, scheme: &str) -> (bool, String) {
    let mut cmd = Command::new("curl");
    cmd.args(["-sS", "--max-time", "10", "--cacert"])
        .arg(certs.join("ca.crt"))
        .args(["-H", "Content-Type: application/json"])
        .args(["-d", "{\"node_ids\": [1, 2]}"]);
    if let Some(name) = identity {
        cmd.arg("--cert")
            .arg(certs.join(format!("{name}.crt")))
            .arg("--key")
            .arg(certs.join(format!("{name}.key")));
    }
    cmd.arg(format!("{scheme}://localhost:{}/v1/predict", worker.http));
    let out = cmd.output().expect("curl runs");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
    )
}

#[test]
fn the_front_ends_speak_tls_and_ask_for_client_certificates_when_told() {
    let dir = tempfile::tempdir().unwrap();
    let certs = dir.path().join("certs");
    std::fs::create_dir_all(&certs).unwrap();
    certificates(&certs);
    let data = dir.path().join("data");
    sidecar_import(&dataset("cora"), &data, &[]);
    let shm = unique_name("tls");
    let _sidecar = Proc(
        Command::new(workspace_bin("sidecar"))
            .arg("serve")
            .arg("--data-dir")
            .arg(&data)
            .args(["--shm-name", &shm, "--slots", "8", "--warm-up", "100"])
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

    // Mutual TLS.
    let mtls = worker(&shm, &certs, true);
    assert_eq!(grpc_call(&mtls, &certs, Some("client")), Ok(2));
    for identity in [None, Some("stranger")] {
        let refused = grpc_call(&mtls, &certs, identity);
        assert!(
            refused.is_err(),
            "a gRPC call with {identity:?} was answered"
        );
    }
    let (ok, body) = curl(&mtls, &certs, Some("client"), "https");
    assert!(ok && body.contains("\"node_id\":2"), "{body}");
    for identity in [None, Some("stranger")] {
        let (ok, body) = curl(&mtls, &certs, identity, "https");
        assert!(!ok && !body.contains("node_id"), "{identity:?}: {body}");
    }
    // Plaintext on a TLS port: nothing answered.
    let (ok, body) = curl(&mtls, &certs, Some("client"), "http");
    assert!(!ok && !body.contains("node_id"), "plaintext HTTP: {body}");
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let plain = runtime.block_on(async {
        let mut client = PredictorClient::connect(format!("http://127.0.0.1:{}", mtls.grpc))
            .await
            .map_err(|e| e.to_string())?;
        client
            .predict(pb::PredictRequest {
                node_ids: vec![1],
                request_id: 1,
                new_node: None,
            })
            .await
            .map_err(|e| e.to_string())
    });
    assert!(plain.is_err(), "a plaintext gRPC call was answered");
    // The plaintext health listener: probes and scrapes; each refused
    // handshake counted on its port.
    let health = format!("127.0.0.1:{}", mtls.health);
    assert_eq!(
        http_request(&health, "GET", "/healthz", None).unwrap().0,
        200
    );
    let (code, metrics) = http_request(&health, "GET", "/metrics", None).unwrap();
    assert!(
        code == 200 && metrics.contains("gnn_worker_calls_total"),
        "{metrics}"
    );
    for port in ["grpc", "http"] {
        let name = format!(
            "gnn_worker_connections_closed_total{{port=\"{port}\",why=\"handshake_failed\"}}"
        );
        let refused = eventually(Duration::from_secs(5), || {
            let (_, body) = http_request(&health, "GET", "/metrics", None).unwrap();
            body.lines()
                .find_map(|line| line.strip_prefix(name.as_str())?.strip_prefix(' '))
                .and_then(|v| v.parse::<f64>().ok())
                .is_some_and(|v| v >= 2.0)
        });
        assert!(refused, "{name} did not count the refused handshakes");
    }

    // TLS without client certificates: a call without one is answered.
    let tls_only = worker(&shm, &certs, false);
    assert_eq!(grpc_call(&tls_only, &certs, None), Ok(2));
    let (ok, body) = curl(&tls_only, &certs, None, "https");
    assert!(ok && body.contains("\"node_id\":1"), "{body}");
}

#[test]
fn half_a_tls_configuration_is_refused_by_name() {
    for (args, key) in [
        (&["--tls-cert", "/nonexistent/server.crt"][..], "tls_key"),
        (&["--tls-key", "/nonexistent/server.key"][..], "tls_cert"),
        (
            &["--tls-client-ca", "/nonexistent/ca.crt"][..],
            "tls_client_ca",
        ),
    ] {
        let out = Command::new(workspace_bin("gnn-worker"))
            .args(["serve", "--model", "/nonexistent/model"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{args:?} accepted");
        assert!(err.contains(key), "{args:?}: {err}");
    }
}

#[test]
fn the_prod_overlays_worker_configuration_is_accepted() {
    let config = tests::stack::repo_root().join("k8s/overlays/prod/worker.toml");
    let out = Command::new(workspace_bin("gnn-worker"))
        .args(["serve", "--print-config", "--config"])
        .arg(&config)
        .output()
        .unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    for key in ["tls_cert", "tls_key", "health_addr"] {
        assert!(
            printed.lines().any(|l| l.starts_with(&format!("{key} = "))),
            "{key} not set by {}: {printed}",
            config.display()
        );
    }
}
