//! The controls of docs/security.md, tested on real processes: no secret in
//! any output, owner-only segment and socket, strangers refused by the
//! admin socket's peer-credential check.

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use protocol::client::{CallRequest, ClientOptions, RingClient};
use tests::redis::RedisServer;
use tests::stack::{dataset, free_port, http_request, sidecar_import, workspace_bin, Daemon};
use tests::{eventually, segment_exists, unique_name};

const PASSWORD: &str = "s3cret-Hunter2-do-not-log";

struct Sidecar {
    daemon: Daemon,
    shm_name: String,
    socket: std::path::PathBuf,
    metrics: String,
    log: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// A sidecar with its features in a password-protected Redis, logging at
/// debug level into a file.
fn start(redis: &RedisServer) -> Sidecar {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    sidecar_import(&dataset("cora"), &data, &["--redis", &redis.url()]);
    let shm_name = unique_name("sec");
    let socket = dir.path().join("admin.sock");
    let metrics = format!("127.0.0.1:{}", free_port());
    let log = dir.path().join("sidecar.log");
    let child = Command::new(workspace_bin("sidecar"))
        .arg("serve")
        .arg("--data-dir")
        .arg(&data)
        .args(["--shm-name", &shm_name, "--redis", &redis.url()])
        .args(["--metrics-addr", &metrics, "--log-level", "debug"])
        .args([
            "--invalidation-channel",
            "feat-invalidate",
            "--warm-up",
            "10",
        ])
        .arg("--admin-socket")
        .arg(&socket)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("starting sidecar serve");
    let sidecar = Sidecar {
        daemon: Daemon {
            child,
            name: "sidecar",
        },
        shm_name,
        socket,
        metrics,
        log,
        _dir: dir,
    };
    assert!(
        eventually(Duration::from_secs(60), || {
            segment_exists(&sidecar.shm_name)
                && http_request(&sidecar.metrics, "GET", "/readyz", None)
                    .is_ok_and(|(code, _)| code == 200)
        }),
        "the sidecar became ready"
    );
    sidecar
}

fn sidecarctl(socket: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(workspace_bin("sidecarctl"))
        .arg("--socket")
        .arg(socket)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn no_secret_reaches_a_log_line_a_metric_or_an_admin_answer() {
    let redis = RedisServer::start_with_password(PASSWORD);
    let sidecar = start(&redis);
    // Rows fetched from Redis, an invalidation, every admin view.
    let client = RingClient::attach(&sidecar.shm_name, ClientOptions::default()).unwrap();
    let response = client.call(&CallRequest::new(&[1, 2, 3])).unwrap();
    drop(response);
    redis.command("PUBLISH feat-invalidate 1,2");
    let mut seen = String::new();
    for args in [
        &["status", "--json"][..],
        &["stats", "--json"],
        &["status"],
        &["stats"],
    ] {
        let out = sidecarctl(&sidecar.socket, args);
        assert!(out.status.success(), "sidecarctl {args:?}");
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
    }
    let (code, metrics) = http_request(&sidecar.metrics, "GET", "/metrics", None).unwrap();
    assert_eq!(code, 200);
    seen.push_str(&metrics);
    let printed = Command::new(workspace_bin("sidecar"))
        .args([
            "serve",
            "--print-config",
            "--data-dir",
            "/tmp",
            "--redis",
            &redis.url(),
        ])
        .output()
        .unwrap();
    seen.push_str(&String::from_utf8_lossy(&printed.stdout));
    seen.push_str(&String::from_utf8_lossy(&printed.stderr));
    // The worker's precomputed answers' Redis, as the worker prints it.
    let printed = Command::new(workspace_bin("gnn-worker"))
        .args(["serve", "--print-config", "--model", "/tmp"])
        .args(["--precomputed-redis", &redis.url()])
        .output()
        .unwrap();
    assert!(printed.status.success(), "{printed:?}");
    let worker_config = String::from_utf8_lossy(&printed.stdout);
    assert!(
        worker_config.contains("precomputed_redis = \"redis://:***@127.0.0.1"),
        "{worker_config}"
    );
    seen.push_str(&worker_config);
    seen.push_str(&String::from_utf8_lossy(&printed.stderr));
    drop(client);
    assert!(sidecar.daemon.child.id() > 0);
    let Sidecar { daemon, log, .. } = sidecar;
    assert!(daemon.stop(), "clean shutdown");
    seen.push_str(&std::fs::read_to_string(&log).unwrap());
    assert!(seen.len() > 1000, "the outputs were captured");
    assert!(
        seen.contains("redis://:***@127.0.0.1"),
        "the URL is shown redacted somewhere"
    );
    assert!(
        !seen.contains(PASSWORD),
        "the Redis password leaked: {}",
        seen.lines()
            .find(|line| line.contains(PASSWORD))
            .unwrap_or_default()
    );
}

#[test]
fn the_segment_and_the_socket_are_owner_only_and_strangers_are_refused() {
    let redis = RedisServer::start();
    let sidecar = start(&redis);
    let mode =
        |path: &std::path::Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    assert_eq!(
        mode(std::path::Path::new(&format!(
            "/dev/shm/{}",
            sidecar.shm_name
        ))),
        0o600
    );
    assert_eq!(mode(&sidecar.socket), 0o600);
    assert!(sidecarctl(&sidecar.socket, &["status"]).status.success());

    // Another user, even with the socket file opened up to everyone, is
    // refused by the peer-credential check. (The suite runs as root, as
    // scripts/setup.sh needs; root may act as any user.)
    assert!(
        nix::unistd::geteuid().is_root(),
        "this test runs as root to act as another user"
    );
    let open_up = |path: &std::path::Path, mode: u32| {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).unwrap()
    };
    open_up(sidecar.socket.parent().unwrap(), 0o755);
    open_up(&sidecar.socket, 0o666);
    // A copy of sidecarctl the stranger may run (the build directory may
    // not be readable by other users).
    let bin = tempfile::tempdir().unwrap();
    open_up(bin.path(), 0o755);
    let ctl = bin.path().join("sidecarctl");
    std::fs::copy(workspace_bin("sidecarctl"), &ctl).unwrap();
    open_up(&ctl, 0o755);
    let stranger = Command::new(&ctl)
        .arg("--socket")
        .arg(&sidecar.socket)
        .args(["--timeout-s", "3", "status"])
        .uid(65534)
        .gid(65534)
        .output()
        .unwrap();
    assert!(
        !stranger.status.success(),
        "a stranger was answered: {}",
        String::from_utf8_lossy(&stranger.stdout)
    );
    let stderr = String::from_utf8_lossy(&stranger.stderr);
    assert!(
        !stderr.contains("Permission denied") && !stderr.contains("connecting to"),
        "the stranger could not even connect, so the peer check was not exercised: {stderr}"
    );
    assert!(
        stranger.stdout.is_empty(),
        "a stranger got an answer: {}",
        String::from_utf8_lossy(&stranger.stdout)
    );
    // The sidecar is unaffected.
    assert!(sidecarctl(&sidecar.socket, &["status"]).status.success());
    assert!(sidecar.daemon.stop(), "clean shutdown");
}

/// A worker with its precomputed answers' Redis behind `url`, logging at
/// debug level into `log`; returns it and its HTTP address.
fn worker(sidecar: &Sidecar, url: &str, log: &std::path::Path) -> (Daemon, String) {
    let http = format!("127.0.0.1:{}", free_port());
    let grpc = format!("127.0.0.1:{}", free_port());
    let child = Command::new(workspace_bin("gnn-worker"))
        .arg("serve")
        .arg("--model")
        .arg(tests::stack::trained_model("cora"))
        .args([
            "--shm-name",
            &sidecar.shm_name,
            "--http",
            &http,
            "--grpc",
            &grpc,
        ])
        .args(["--precomputed-redis", url, "--precomputed-check-s", "0.1"])
        .args(["--log-level", "debug"])
        .arg("--onnxruntime-lib")
        .arg(tests::stack::onnxruntime_lib())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .expect("starting gnn-worker serve");
    (
        Daemon {
            child,
            name: "gnn-worker",
        },
        http,
    )
}

/// The worker's logs and both daemons' errors keep Redis passwords out
/// too: a worker reading precomputed answers from a password-protected
/// Redis, one given a wrong password, and start-up and configuration
/// errors of both daemons with a password in the URL.
#[test]
fn no_secret_reaches_the_workers_logs_or_either_daemons_errors() {
    const WRONG: &str = "wrong-Hunter3-do-not-log";
    let redis = RedisServer::start_with_password(PASSWORD);
    let sidecar = start(&redis);
    let dir = tempfile::tempdir().unwrap();
    let mut seen = String::new();
    // A worker with the right password: ready, answers, stops.
    let log = dir.path().join("worker.log");
    let (daemon, http) = worker(&sidecar, &redis.url(), &log);
    assert!(
        eventually(Duration::from_secs(60), || {
            http_request(&http, "GET", "/readyz", None).is_ok_and(|(code, _)| code == 200)
        }),
        "the worker became ready: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    let body = r#"{"node_ids": [1, 2, 3]}"#;
    let (code, _) = http_request(&http, "POST", "/v1/predict", Some(body)).unwrap();
    assert_eq!(code, 200);
    assert!(daemon.stop(), "the worker stopped cleanly");
    seen.push_str(&std::fs::read_to_string(&log).unwrap());
    // A worker with a wrong password: its Redis errors are logged.
    let wrong_url = format!("redis://:{WRONG}@127.0.0.1:{}", redis.port);
    let log = dir.path().join("worker-wrong.log");
    let (daemon, http) = worker(&sidecar, &wrong_url, &log);
    // A call: the worker learns the sidecar's change clock, then looks for
    // the set stored for it.
    assert!(
        eventually(Duration::from_secs(60), || {
            http_request(&http, "POST", "/v1/predict", Some(body))
                .is_ok_and(|(code, _)| code == 200)
        }),
        "the worker answers without its precomputed answers"
    );
    assert!(
        eventually(Duration::from_secs(60), || {
            std::fs::read_to_string(&log).is_ok_and(|text| text.contains("redis://:***@"))
        }),
        "the worker named the Redis it cannot use: {}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    drop(daemon);
    seen.push_str(&std::fs::read_to_string(&log).unwrap());
    // Start-up errors: the sidecar with a wrong password; an import into
    // a Redis that refuses it.
    for args in [
        vec!["serve", "--data-dir", "/nonexistent", "--redis", &wrong_url],
        vec![
            "import",
            "/nonexistent",
            "--data-dir",
            "/tmp/x",
            "--redis",
            &wrong_url,
        ],
    ] {
        let out = Command::new(workspace_bin("sidecar"))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "sidecar {args:?} succeeded");
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
    }
    // Configuration errors naming a URL with a password.
    let not_redis = format!("http://:{WRONG}@127.0.0.1:1");
    for (bin, args) in [
        (
            "sidecar",
            vec!["serve", "--data-dir", "/d", "--redis", &not_redis],
        ),
        (
            "gnn-worker",
            vec!["serve", "--model", "/m", "--precomputed-redis", &not_redis],
        ),
    ] {
        let out = Command::new(workspace_bin(bin))
            .args(&args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bin} {args:?} succeeded");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(":***@"), "{bin} names the URL redacted: {err}");
        seen.push_str(&err);
    }
    let Sidecar { daemon, log, .. } = sidecar;
    assert!(daemon.stop(), "clean shutdown");
    seen.push_str(&std::fs::read_to_string(&log).unwrap());
    assert!(seen.len() > 1000, "the outputs were captured");
    for secret in [PASSWORD, WRONG] {
        assert!(
            !seen.contains(secret),
            "a Redis password leaked: {}",
            seen.lines()
                .find(|line| line.contains(secret))
                .unwrap_or_default()
        );
    }
}

/// Every form a Redis URL's secret can take (a list's second URL, a
/// malformed URL, a query parameter, a `redis+unix://` socket's `pass`, a
/// password holding `@` or `,`), given by flag, environment and file to
/// both daemons' printed configurations and their refusals: the secret is
/// never shown.
#[test]
fn every_form_of_a_redis_url_keeps_its_secret_out_of_every_output() {
    const SECRET: &str = "Zq9-redact-me";
    let forms = [
        format!("redis://127.0.0.1:1,redis://:{SECRET}@127.0.0.1:2"),
        format!("redis://127.0.0.1:1, redis://user:{SECRET}@127.0.0.1:2"),
        format!("redis//:{SECRET}@127.0.0.1:6379"),
        format!("redis:/:{SECRET}@127.0.0.1:6379"),
        format!("redis://127.0.0.1:6379/0?password={SECRET}"),
        format!("redis+unix:///run/redis.sock?db=0&pass={SECRET}"),
        format!("redis://:p@ss{SECRET}@127.0.0.1:6379"),
        format!("redis://:{SECRET},x@127.0.0.1:6379"),
        format!("http://:{SECRET}@127.0.0.1:1"),
    ];
    let dir = tempfile::tempdir().unwrap();
    let mut seen = String::new();
    let mut run = |bin: &str, args: &[&str], env: Option<(&str, &str)>| {
        let mut command = Command::new(workspace_bin(bin));
        command.args(args).env_remove("RUST_LOG");
        if let Some((key, value)) = env {
            command.env(key, value);
        }
        let out = command.output().unwrap();
        seen.push_str(&String::from_utf8_lossy(&out.stdout));
        seen.push_str(&String::from_utf8_lossy(&out.stderr));
        out.status.success()
    };
    for (k, form) in forms.iter().enumerate() {
        let file = dir.path().join(format!("sidecar-{k}.toml"));
        std::fs::write(&file, format!("redis = {form:?}\n")).unwrap();
        let worker_file = dir.path().join(format!("worker-{k}.toml"));
        std::fs::write(&worker_file, format!("precomputed_redis = {form:?}\n")).unwrap();
        let file = file.to_str().unwrap();
        let worker_file = worker_file.to_str().unwrap();
        for print in [true, false] {
            let p: &[&str] = if print { &["--print-config"] } else { &[] };
            fn with<'a>(args: &[&'a str], p: &[&'a str]) -> Vec<&'a str> {
                [args, p].concat()
            }
            run(
                "sidecar",
                &with(&["serve", "--data-dir", "/nonexistent", "--redis", form], p),
                None,
            );
            run(
                "sidecar",
                &with(&["serve", "--data-dir", "/nonexistent"], p),
                Some(("SIDECAR_REDIS", form)),
            );
            run(
                "sidecar",
                &with(
                    &["serve", "--data-dir", "/nonexistent", "--config", file],
                    p,
                ),
                None,
            );
            run(
                "gnn-worker",
                &with(
                    &[
                        "serve",
                        "--model",
                        "/nonexistent",
                        "--precomputed-redis",
                        form,
                    ],
                    p,
                ),
                None,
            );
            run(
                "gnn-worker",
                &with(
                    &["serve", "--model", "/nonexistent", "--config", worker_file],
                    p,
                ),
                None,
            );
        }
        run(
            "sidecar",
            &[
                "import",
                "/nonexistent",
                "--data-dir",
                "/nonexistent/d",
                "--redis",
                form,
            ],
            None,
        );
    }
    assert!(
        seen.matches("***").count() >= forms.len() * 4,
        "the URLs were shown, redacted: {seen}"
    );
    assert!(
        !seen.contains(SECRET),
        "a secret leaked: {}",
        seen.lines()
            .find(|line| line.contains(SECRET))
            .unwrap_or_default()
    );
}
