//! The configuration of both daemons, through their real binaries: one
//! precedence (flags > environment > file > defaults), `--print-config`
//! with each key's source and no secret, and a bad value in each of the
//! three sources refused with one line naming the key, the source and the
//! fix. Also: JSON logs.

use std::path::Path;
use std::process::{Command, Output};

use tests::stack::workspace_bin;

/// `<bin> serve <args>` with only the variables given (the test process's
/// own SIDECAR_* / GNN_WORKER_* variables never leak in).
fn serve(bin: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(workspace_bin(bin));
    cmd.arg("serve").args(args).env_clear();
    if let Some(path) = std::env::var_os("PATH") {
        cmd.env("PATH", path);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// The one-line refusal of a configuration.
fn refusal(out: &Output) -> String {
    assert!(!out.status.success(), "the configuration was accepted");
    let err = String::from_utf8_lossy(&out.stderr).trim().to_string();
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    err
}

fn file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).unwrap();
    path.to_string_lossy().into_owned()
}

#[test]
fn the_sidecar_refuses_a_bad_value_from_each_source_naming_key_source_and_fix() {
    let dir = tempfile::tempdir().unwrap();
    // The file: unknown key (with a suggestion), wrong type, out of range.
    let f = file(
        dir.path(),
        "unknown.toml",
        "data_dir = \"/d\"\n\nslotz = 8\n",
    );
    let e = refusal(&serve("sidecar", &["--config", &f], &[]));
    assert!(
        e.contains(&format!("`slotz` from {f}:3: unknown key")),
        "{e}"
    );
    assert!(e.contains("did you mean `slots`"), "{e}");
    let f = file(
        dir.path(),
        "type.toml",
        "data_dir = \"/d\"\nslots = \"many\"\n",
    );
    let e = refusal(&serve("sidecar", &["--config", &f], &[]));
    assert!(e.contains(&format!("`slots` from {f}:2")), "{e}");
    assert!(e.contains("docs/configuration.md"), "{e}");
    let f = file(
        dir.path(),
        "range.toml",
        "data_dir = \"/d\"\nfanouts = [20, 10]\nmax_fanouts = [10, 10]\n",
    );
    let e = refusal(&serve("sidecar", &["--config", &f], &[]));
    assert!(e.contains(&format!("`fanouts` from {f}:2")), "{e}");
    assert!(e.contains("lower fanouts or raise max_fanouts"), "{e}");
    // A fanout cap past 1,024 is fine while one target's hop arrays fit the
    // response area; past it, the refusal names the flag that makes room.
    let e = refusal(&serve(
        "sidecar",
        &[
            "--data-dir",
            "/d",
            "--max-fanouts",
            "2000,2000",
            "--response-mib",
            "8",
        ],
        &[],
    ));
    assert!(e.contains("`max_fanouts` from flag --max-fanouts"), "{e}");
    assert!(e.contains("--response-mib"), "{e}");
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d", "--max-fanouts", "40000,1"],
        &[],
    ));
    assert!(e.contains("outside 1..=32768"), "{e}");
    let f = file(dir.path(), "syntax.toml", "data_dir = \"/d\"\nslots = \n");
    let e = refusal(&serve("sidecar", &["--config", &f], &[]));
    assert!(e.contains(&format!("{f}:2: not valid TOML")), "{e}");
    let e = refusal(&serve("sidecar", &["--config", "/nonexistent.toml"], &[]));
    assert!(e.contains("/nonexistent.toml: cannot be read"), "{e}");

    // The environment.
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d"],
        &[("SIDECAR_SLOTS", "abc")],
    ));
    assert!(
        e.contains("`slots` from environment variable SIDECAR_SLOTS"),
        "{e}"
    );
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d"],
        &[("SIDECAR_L1_MB", "64")],
    ));
    assert!(
        e.contains("`l1_mb` from environment variable SIDECAR_L1_MB: unknown key"),
        "{e}"
    );
    assert!(e.contains("did you mean SIDECAR_L1_MIB"), "{e}");
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d"],
        &[("SIDECAR_CLIENT_TIMEOUT_S", "1e300")],
    ));
    assert!(
        e.contains("`client_timeout_s` from environment variable SIDECAR_CLIENT_TIMEOUT_S"),
        "{e}"
    );
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d"],
        &[("SIDECAR_CLIENT_TIMEOUT_S", "0.1")],
    ));
    assert!(
        e.contains(
            "`client_timeout_s` from environment variable SIDECAR_CLIENT_TIMEOUT_S: 0.1 is \
             outside 0.5..=3600 s"
        ),
        "{e}"
    );
    assert!(
        e.contains("set client_timeout_s between 0.5 and 3600"),
        "{e}"
    );

    // The flags.
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d", "--deadline-ms", "0"],
        &[],
    ));
    assert!(e.contains("`deadline_ms` from flag --deadline-ms"), "{e}");
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d", "--shm-mode", "666"],
        &[],
    ));
    assert!(e.contains("`shm_mode` from flag --shm-mode"), "{e}");
    let out = serve("sidecar", &["--data-dir", "/d", "--slots", "many"], &[]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("--slots"));
    // Nothing at all: the required key, and where to set it.
    let e = refusal(&serve("sidecar", &[], &[]));
    assert!(e.contains("`data_dir` from the default: is not set"), "{e}");
    assert!(e.contains("SIDECAR_DATA_DIR"), "{e}");
}

#[test]
fn the_sidecar_prints_its_effective_configuration_with_sources_and_no_password() {
    let dir = tempfile::tempdir().unwrap();
    let f = file(
        dir.path(),
        "sidecar.toml",
        "data_dir = \"/var/lib/sidecar\"\nslots = 8\nl1_mib = 64\nwarm_up = 5\n",
    );
    let out = serve(
        "sidecar",
        &["--print-config", "--slots", "32"],
        &[
            ("SIDECAR_CONFIG", &f),
            ("SIDECAR_SLOTS", "16"),
            ("SIDECAR_L1_MIB", "128"),
            ("SIDECAR_REDIS", "redis://:hunter2@cache.internal:6379"),
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(printed.contains("slots = 32  # flag --slots"), "{printed}");
    assert!(
        printed.contains("l1_mib = 128  # environment variable SIDECAR_L1_MIB"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("warm_up = 5  # {f}:4")),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("data_dir = \"/var/lib/sidecar\"  # {f}:1")),
        "{printed}"
    );
    assert!(
        printed.contains("deadline_ms = 20.0  # the default"),
        "{printed}"
    );
    assert!(
        !printed.contains("hunter2"),
        "the password was printed: {printed}"
    );
    assert!(printed.contains(":***@cache.internal:6379"), "{printed}");
    // What it prints is a configuration file that loads.
    let again = file(dir.path(), "printed.toml", &printed);
    let out = serve("sidecar", &["--print-config", "--config", &again], &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn the_worker_refuses_a_bad_value_from_each_source_and_prints_its_configuration() {
    let dir = tempfile::tempdir().unwrap();
    let f = file(dir.path(), "worker.toml", "model = \"/m\"\nexecutors = 0\n");
    let e = refusal(&serve("gnn-worker", &["--config", &f], &[]));
    assert!(e.contains(&format!("`executors` from {f}:2")), "{e}");
    let f = file(
        dir.path(),
        "unknown.toml",
        "model = \"/m\"\nmax_batches = 3\n",
    );
    let e = refusal(&serve("gnn-worker", &["--config", &f], &[]));
    assert!(e.contains("did you mean `max_batch`"), "{e}");
    let e = refusal(&serve(
        "gnn-worker",
        &["--model", "/m"],
        &[("GNN_WORKER_MAX_DELAY_MS", "nan")],
    ));
    assert!(
        e.contains("`max_delay_ms` from environment variable GNN_WORKER_MAX_DELAY_MS"),
        "{e}"
    );
    let e = refusal(&serve(
        "gnn-worker",
        &["--model", "/m", "--max-delay-ms", "1e300"],
        &[],
    ));
    assert!(e.contains("`max_delay_ms` from flag --max-delay-ms"), "{e}");
    let e = refusal(&serve(
        "gnn-worker",
        &[
            "--model",
            "/m",
            "--grpc",
            "127.0.0.1:9",
            "--http",
            "127.0.0.1:9",
        ],
        &[],
    ));
    assert!(e.contains("`http` from flag --http"), "{e}");

    let f = file(
        dir.path(),
        "ok.toml",
        "model = \"/models/cora\"\nmax_batch = 8\n",
    );
    let out = serve(
        "gnn-worker",
        &["--print-config", "--config", &f, "--executors", "3"],
        &[("GNN_WORKER_FANOUTS", "10,5")],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let printed = String::from_utf8(out.stdout).unwrap();
    assert!(
        printed.contains("executors = 3  # flag --executors"),
        "{printed}"
    );
    assert!(
        printed.contains(&format!("max_batch = 8  # {f}:2")),
        "{printed}"
    );
    assert!(
        printed.contains("fanouts = [10, 5]  # environment variable GNN_WORKER_FANOUTS"),
        "{printed}"
    );
}

/// The reader's findings (issue 30, item 5): a value the docs refuse is
/// refused, by name, and a rule both daemons state is checked alike.
#[test]
fn what_configuration_md_refuses_is_refused_by_both_daemons_alike() {
    // A reduced rung of zero fanouts would be the sidecar's full fanouts.
    let e = refusal(&serve(
        "gnn-worker",
        &["--model", "/m", "--degrade-fanouts", "0,0"],
        &[],
    ));
    assert!(
        e.contains("`degrade_fanouts` from flag --degrade-fanouts") && e.contains("zero fanout"),
        "{e}"
    );
    // updates_redis takes what redis takes: a Redis URL, one unless a
    // cluster.
    let e = refusal(&serve(
        "sidecar",
        &[
            "--data-dir",
            "/d",
            "--updates-stream",
            "gnn:updates",
            "--updates-redis",
            "http://cache:6379",
        ],
        &[],
    ));
    assert!(
        e.contains("`updates_redis` from flag --updates-redis") && e.contains("redis://"),
        "{e}"
    );
    let e = refusal(&serve(
        "sidecar",
        &["--data-dir", "/d", "--updates-stream", "s"],
        &[("SIDECAR_UPDATES_REDIS", "redis://a:1,redis://b:1")],
    ));
    assert!(e.contains("`updates_redis`") && e.contains("2 URLs"), "{e}");
    // One segment-name rule: every name the sidecar refuses, the worker
    // refuses with the same reason.
    let long = "a".repeat(250);
    for name in [".hidden", long.as_str(), "a/b", "", "gnn ring"] {
        let sidecar = refusal(&serve(
            "sidecar",
            &["--data-dir", "/d", "--shm-name", name],
            &[],
        ));
        let worker = refusal(&serve(
            "gnn-worker",
            &["--model", "/m", "--shm-name", name],
            &[],
        ));
        let reason = |e: &str| e.split(": ").nth(1).unwrap_or_default().to_string();
        assert!(sidecar.contains("`shm_name`"), "{sidecar}");
        assert!(worker.contains("`shm_name`"), "{worker}");
        assert_eq!(
            reason(&sidecar),
            reason(&worker),
            "{name:?}: {sidecar} / {worker}"
        );
    }
}

#[test]
fn logs_are_json_lines_when_asked() {
    let out = serve(
        "sidecar",
        &["--data-dir", "/nonexistent/data", "--log-format", "json"],
        &[],
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let first = stderr.lines().next().unwrap();
    let line: serde_json::Value = serde_json::from_str(first)
        .unwrap_or_else(|e| panic!("not a JSON log line ({e}): {first}"));
    assert_eq!(line["level"], "INFO", "{first}");
    assert!(line["timestamp"].is_string(), "{first}");
    // The refusal itself is the last line, plain, naming the fix.
    assert!(stderr
        .trim_end()
        .lines()
        .last()
        .unwrap()
        .contains("sidecar import"));
}

#[test]
fn sighup_rereads_the_log_level_from_the_file() {
    use std::io::Read;
    let dir = tempfile::tempdir().unwrap();
    // A worker waiting for a sidecar that never comes, logging at warn.
    let model = tests::stack::trained_model("cora");
    let f = file(
        dir.path(),
        "worker.toml",
        &format!("model = \"{}\"\nlog_level = \"warn\"\n", model.display()),
    );
    let log = dir.path().join("worker.log");
    let http = format!("127.0.0.1:{}", tests::stack::free_port());
    let mut child = Command::new(workspace_bin("gnn-worker"))
        .args(["serve", "--config", &f])
        .args(["--shm-name", "gnn-test-no-such-sidecar"])
        .args(["--grpc", "127.0.0.1:0", "--http", &http])
        .arg("--onnxruntime-lib")
        .arg(tests::stack::onnxruntime_lib())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let read = || {
        let mut text = String::new();
        std::fs::File::open(&log)
            .unwrap()
            .read_to_string(&mut text)
            .unwrap();
        text
    };
    // Waiting for the sidecar: the model is loaded and the ports are
    // listening, each of which logs at info.
    let waiting = tests::eventually(std::time::Duration::from_secs(30), || {
        tests::stack::http_request(&http, "GET", "/readyz", None)
            .is_ok_and(|(code, body)| code == 503 && !body.contains("loading the model"))
    });
    assert!(
        waiting,
        "the worker did not come up waiting for its sidecar"
    );
    assert!(
        !read().contains("INFO"),
        "info lines at level warn:\n{}",
        read()
    );
    std::fs::write(
        &f,
        format!("model = \"{}\"\nlog_level = \"info\"\n", model.display()),
    )
    .unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(child.id() as i32),
        nix::sys::signal::Signal::SIGHUP,
    )
    .unwrap();
    let reloaded = tests::eventually(std::time::Duration::from_secs(10), || {
        read().contains("log level reloaded (SIGHUP)")
    });
    let _ = child.kill();
    let _ = child.wait();
    assert!(reloaded, "no reload logged:\n{}", read());
}

/// A negative number given to a numeric flag reaches that flag's own check,
/// which names it, on every command line of the product.
#[test]
fn bad_numbers_on_command_lines_name_their_flag() {
    let cases: [(&str, &[&str], &str); 3] = [
        (
            "sidecar",
            &["serve", "--data-dir", "/nonexistent", "--slots", "-3"],
            "--slots",
        ),
        (
            "gnn-worker",
            &["serve", "--model", "/nonexistent", "--executors", "-1"],
            "--executors",
        ),
        (
            "sidecarctl",
            &["--socket", "/nonexistent", "--timeout-s", "-1", "status"],
            "--timeout-s",
        ),
    ];
    for (bin, args, flag) in cases {
        let out = Command::new(workspace_bin(bin))
            .args(args)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{bin} {args:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(flag), "{bin} {args:?}: {stderr}");
        assert!(
            !stderr.contains("unexpected argument"),
            "{bin} {args:?}: {stderr}"
        );
        assert!(!stderr.contains("panicked"), "{bin} {args:?}: {stderr}");
    }
}

/// A value as the docs and the help write it: no quotes or backticks,
/// lists as `a,b`, whole floats without `.0`.
fn normalised(value: &str) -> String {
    let v = value.trim().trim_matches('`').trim_matches('"');
    if let Some(list) = v.strip_prefix('[').and_then(|v| v.strip_suffix(']')) {
        return list
            .split(',')
            .map(normalised)
            .collect::<Vec<_>>()
            .join(",");
    }
    match v.strip_suffix(".0") {
        Some(whole) if whole.parse::<i64>().is_ok() => whole.to_string(),
        _ => v.to_string(),
    }
}

/// `--print-config`'s keys that come from the defaults, with their values.
fn printed_defaults(bin: &str, required: &[&str]) -> Vec<(String, String)> {
    let out = serve(bin, &[required, &["--print-config"]].concat(), &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|line| {
            let (setting, source) = line.split_once("  # ")?;
            let (key, value) = setting.split_once(" = ")?;
            (source == "the default").then(|| (key.to_string(), normalised(value)))
        })
        .collect()
}

/// The rows of one table of docs/configuration.md: key and default cell.
fn documented(section: &str) -> Vec<(String, String)> {
    let doc = std::fs::read_to_string(tests::stack::repo_root().join("docs/configuration.md"))
        .expect("docs/configuration.md");
    let start = doc.find(section).expect("the section");
    doc[start + section.len()..]
        .lines()
        .skip_while(|line| !line.starts_with('|'))
        .take_while(|line| line.starts_with('|'))
        .filter_map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            let key = cells.get(1)?.strip_prefix('`')?.strip_suffix('`')?;
            Some((key.to_string(), cells.get(3)?.to_string()))
        })
        .collect()
}

/// `serve --help`: each flag's `[default: ...]`, by key (`-` as `_`).
fn help_defaults(bin: &str) -> Vec<(String, String)> {
    let out = Command::new(workspace_bin(bin))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut found = Vec::new();
    let mut flag: Option<String> = None;
    for line in help.lines() {
        let trimmed = line.trim_start();
        if let Some(rest) = trimmed.strip_prefix("--") {
            flag = rest.split([' ', '<']).next().map(|f| f.replace('-', "_"));
        }
        if let (Some(key), Some(at)) = (&flag, line.find("[default: ")) {
            let value = &line[at + "[default: ".len()..];
            let value = value.split(']').next().unwrap_or_default();
            found.push((key.clone(), value.to_string()));
        }
    }
    found
}

/// Defaults are written in the code once: docs/configuration.md's tables
/// and every flag's `[default: ...]` in `serve --help` say what
/// `--print-config` reports as the default, for every key of both daemons,
/// and every key has its row and its flag.
#[test]
fn the_documented_defaults_are_the_declared_ones() {
    for (bin, section, required) in [
        ("sidecar", "## `sidecar serve`", ["--data-dir", "/d"]),
        ("gnn-worker", "## `gnn-worker serve`", ["--model", "/m"]),
    ] {
        let printed = printed_defaults(bin, &required);
        assert!(printed.len() > 20, "{bin}: {printed:?}");
        let rows = documented(section);
        let row = |key: &str| rows.iter().find(|(k, _)| k == key).map(|(_, d)| d.clone());
        let help = help_defaults(bin);
        assert!(help.len() >= 15, "{bin}: the help's defaults: {help:?}");
        let help_text = String::from_utf8_lossy(
            &Command::new(workspace_bin(bin))
                .args(["serve", "--help"])
                .output()
                .unwrap()
                .stdout,
        )
        .into_owned();
        for (key, value) in &printed {
            let doc = row(key).unwrap_or_else(|| panic!("{bin}: `{key}` has no row in {section}"));
            if value.is_empty() {
                // An empty list: no value, or another key's (`redis`).
                let other = doc.trim_matches('`');
                assert!(
                    doc == "unset" || rows.iter().any(|(k, _)| k == other),
                    "{bin}: `{key}` defaults to no value; the docs say {doc}"
                );
            } else {
                assert_eq!(
                    normalised(&doc),
                    *value,
                    "{bin}: `{key}`'s default in docs/configuration.md"
                );
            }
            let flag = format!("--{}", key.replace('_', "-"));
            assert!(
                help_text.lines().any(|line| {
                    let line = line.trim_start();
                    line == flag || line.starts_with(&format!("{flag} "))
                }),
                "{bin}: `{key}` has no flag {flag}"
            );
            if let Some((_, said)) = help.iter().find(|(k, _)| k == key) {
                // Up to a `;` (what follows is a remark); a default that is
                // not a value ("the --redis URLs") has no literal to check.
                let said = said.split(';').next().unwrap_or_default();
                if !said.contains(' ') && !value.is_empty() {
                    assert_eq!(
                        normalised(said),
                        *value,
                        "{bin}: --help's default of `{key}`"
                    );
                }
            }
        }
        // Every documented key is a key: defaulted, unset or required.
        for (key, default) in &rows {
            let known = printed.iter().any(|(k, _)| k == key);
            assert!(
                known || default == "unset" || default == "(required)" || default.contains('<'),
                "{bin}: `{key}` is documented with default {default} but has none"
            );
        }
    }
}
