//! Real Redis servers for tests: a single node, or a 3-node Redis Cluster,
//! on free loopback ports, each in its own temporary directory, stopped on
//! drop. A missing `redis-server` is a failure that says how to install it.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port that is free now, and whose cluster bus port (+10000) is too.
fn free_port() -> u16 {
    loop {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port");
        let port = listener.local_addr().unwrap().port();
        if port < 55_000 && TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

fn redis_server() -> &'static str {
    let ok = Command::new("redis-server")
        .arg("--version")
        .stdout(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "redis-server is not installed: run scripts/setup.sh (Debian package redis-server)"
    );
    "redis-server"
}

/// Sends one inline command and returns the raw reply.
pub fn raw_command(port: u16, password: Option<&str>, command: &str) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    if let Some(password) = password {
        stream.write_all(format!("AUTH {password}\r\n").as_bytes())?;
        let mut buf = [0u8; 64];
        let _ = stream.read(&mut buf)?;
    }
    stream.write_all(format!("{command}\r\n").as_bytes())?;
    let mut buf = vec![0u8; 16 * 1024];
    let n = stream.read(&mut buf)?;
    Ok(String::from_utf8_lossy(&buf[..n]).into_owned())
}

/// One `redis-server` process.
#[derive(Debug)]
pub struct RedisServer {
    child: Option<Child>,
    pub port: u16,
    password: Option<String>,
    dir: tempfile::TempDir,
    extra: Vec<String>,
    /// Set when the server listens with TLS only (see `start_tls`).
    tls: bool,
}

/// Runs openssl with `args` in `dir`, failing the test with its output.
/// Runs `openssl` in `dir`, failing the test with its stderr.
pub fn openssl(dir: &Path, args: &[&str]) {
    let output = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (Debian package openssl) runs");
    assert!(
        output.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(None, &[])
    }

    /// Starts with `requirepass` set.
    pub fn start_with_password(password: &str) -> Self {
        Self::start_with(Some(password), &[])
    }

    pub fn start_with(password: Option<&str>, extra: &[&str]) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut server = Self {
            child: None,
            port: free_port(),
            password: password.map(str::to_string),
            dir,
            extra: extra.iter().map(|s| s.to_string()).collect(),
            tls: false,
        };
        server.spawn();
        server
    }

    /// Starts a server that speaks TLS only, with a certificate for
    /// 127.0.0.1 signed by a fresh test CA (`ca_file()`).
    pub fn start_tls(password: Option<&str>) -> Self {
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        openssl(
            d,
            &[
                "req",
                "-x509",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "ca.key",
                "-out",
                "ca.crt",
                "-days",
                "2",
                "-subj",
                "/CN=gnn-test-ca",
            ],
        );
        openssl(
            d,
            &[
                "req",
                "-newkey",
                "rsa:2048",
                "-nodes",
                "-keyout",
                "server.key",
                "-out",
                "server.csr",
                "-subj",
                "/CN=localhost",
            ],
        );
        std::fs::write(
            d.join("san.ext"),
            "subjectAltName=IP:127.0.0.1,DNS:localhost\n",
        )
        .unwrap();
        openssl(
            d,
            &[
                "x509",
                "-req",
                "-in",
                "server.csr",
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                "server.crt",
                "-days",
                "2",
                "-extfile",
                "san.ext",
            ],
        );
        let port = free_port();
        let file = |name: &str| d.join(name).display().to_string();
        let extra = vec![
            "--tls-port".to_string(),
            port.to_string(),
            "--tls-cert-file".into(),
            file("server.crt"),
            "--tls-key-file".into(),
            file("server.key"),
            "--tls-ca-cert-file".into(),
            file("ca.crt"),
            "--tls-auth-clients".into(),
            "no".into(),
        ];
        let mut server = Self {
            child: None,
            port,
            password: password.map(str::to_string),
            dir,
            extra,
            tls: true,
        };
        server.spawn();
        server
    }

    /// The test CA's certificate (PEM) of a TLS server.
    pub fn ca_file(&self) -> std::path::PathBuf {
        self.dir.path().join("ca.crt")
    }

    fn answers_ping(&self) -> bool {
        if !self.tls {
            return raw_command(self.port, self.password.as_deref(), "PING")
                .is_ok_and(|r| r.contains("PONG"));
        }
        let mut cmd = Command::new("redis-cli");
        cmd.args(["--tls", "--cacert"]).arg(self.ca_file()).args([
            "-h",
            "127.0.0.1",
            "-p",
            &self.port.to_string(),
        ]);
        if let Some(password) = &self.password {
            cmd.args(["-a", password, "--no-auth-warning"]);
        }
        cmd.arg("PING")
            .output()
            .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("PONG"))
    }

    fn spawn(&mut self) {
        let mut cmd = Command::new(redis_server());
        let plain_port = if self.tls { 0 } else { self.port };
        cmd.arg("--port")
            .arg(plain_port.to_string())
            .arg("--bind")
            .arg("127.0.0.1")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(self.dir.path())
            .args(&self.extra)
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        if let Some(password) = &self.password {
            cmd.arg("--requirepass").arg(password);
        }
        self.child = Some(cmd.spawn().expect("spawn redis-server"));
        let started = Instant::now();
        loop {
            if self.answers_ping() {
                return;
            }
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "redis-server on port {} did not answer PING",
                self.port
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// `redis[s]://[:password@]127.0.0.1:<port>`.
    pub fn url(&self) -> String {
        let scheme = if self.tls { "rediss" } else { "redis" };
        match &self.password {
            Some(p) => format!("{scheme}://:{p}@127.0.0.1:{}", self.port),
            None => format!("{scheme}://127.0.0.1:{}", self.port),
        }
    }

    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Runs an inline command (e.g. `SET k v`, `PUBLISH ch msg`).
    pub fn command(&self, command: &str) -> String {
        raw_command(self.port, self.password.as_deref(), command).expect("redis command")
    }

    /// Stops the server (SIGKILL) without removing its directory.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Starts it again on the same port.
    pub fn restart(&mut self) {
        self.stop();
        self.spawn();
    }

    /// Freezes it (SIGSTOP), so requests hang instead of failing.
    pub fn freeze(&self) {
        if let Some(child) = &self.child {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGSTOP,
            );
        }
    }

    pub fn thaw(&self) {
        if let Some(child) = &self.child {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(child.id() as i32),
                nix::sys::signal::Signal::SIGCONT,
            );
        }
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.thaw();
        self.stop();
    }
}

/// A local 3-master Redis Cluster (no replicas).
#[derive(Debug)]
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(
                    None,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                    ],
                )
            })
            .collect();
        let mut create = Command::new("redis-cli");
        create.arg("--cluster").arg("create");
        for node in &nodes {
            create.arg(format!("127.0.0.1:{}", node.port));
        }
        let output = create
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .expect("redis-cli (Debian package redis-tools) runs");
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&output.stdout)
        );
        let started = Instant::now();
        while !nodes
            .iter()
            .all(|n| n.command("CLUSTER INFO").contains("cluster_state:ok"))
        {
            assert!(
                started.elapsed() < Duration::from_secs(20),
                "cluster never became ok"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Self { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}
