//! Every example of README.md, ARCHITECTURE.md, clients/python/README.md
//! and docs/*.md runs, as
//! docs/examples.md says: each document's `sh`, `console` and `python`
//! blocks run in order in a sandbox of their own (a private network
//! namespace with Redis on its documented port, private /dev/shm, /tmp,
//! /run and /var/lib, the repository as the working directory), `stack`
//! blocks with the sidecar and the worker started first, `synopsis` blocks
//! checked flag by flag against the command's `--help`, and a block whose
//! first line is `# not run in CI: <reason>` listed by name and skipped.
//! Nothing here names a document or an example: a new one is covered as
//! it is written.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use tests::docs::{documents, fences, help_names_flag, Fence};
use tests::stack::{copy_dir, onnxruntime_lib, python, repo_root, run_ok, workspace_bin};

/// The first line of a block that does not run here, before its reason.
const NOT_RUN: &str = "# not run in CI:";

/// How long one step (a block, or a console block's command) may take.
const STEP_TIMEOUT_S: u64 = 600;

/// What the harness checks of one step.
#[derive(Debug, Clone)]
enum Check {
    /// Exit status 0.
    Succeeds,
    /// This exit status (0 unless the shown output ends with a line
    /// `[exit N]`) and this output (stdout and stderr, as a terminal shows
    /// them), matched by [`output_matches`].
    Shows(Vec<String>),
    /// `<command> --help` exits 0 and names every one of these flags.
    Names(Vec<String>),
}

#[derive(Debug, Clone)]
struct Step {
    /// `docs/serving.md:3`, or `docs/serving.md:3 $ 2` for a console
    /// block's second command.
    name: String,
    /// `sh` or `python`.
    interpreter: &'static str,
    script: String,
    stack: bool,
    check: Check,
    /// The exit status the step must end with.
    exit: i32,
}

/// The example blocks of every document: the steps to run, per document,
/// and the examples not run here with their reasons.
struct Plan {
    steps: Vec<(PathBuf, Vec<Step>)>,
    not_run: Vec<(String, String)>,
    examples: usize,
}

fn plan() -> Plan {
    let mut plan = Plan {
        steps: Vec::new(),
        not_run: Vec::new(),
        examples: 0,
    };
    let mut problems = Vec::new();
    for doc in documents() {
        let mut steps = Vec::new();
        for fence in fences(&doc) {
            match steps_of(&fence) {
                Ok(None) => {}
                Ok(Some(Err(reason))) => {
                    plan.examples += 1;
                    plan.not_run.push((fence.name(), reason));
                }
                Ok(Some(Ok(more))) => {
                    plan.examples += 1;
                    steps.extend(more);
                }
                Err(problem) => problems.push(format!("{}: {problem}", fence.name())),
            }
        }
        if !steps.is_empty() {
            plan.steps.push((doc, steps));
        }
    }
    assert!(
        problems.is_empty(),
        "examples the harness cannot read (docs/examples.md says how to write one):\n{}",
        problems.join("\n")
    );
    plan
}

/// An example block read: its steps, or the reason it is not run here.
type Example = Result<Vec<Step>, String>;

/// `None`: not an example (a `text`, `toml` or `rust` block). `Some(Err)`:
/// not run here, with the reason. `Err`: written wrong.
fn steps_of(fence: &Fence) -> Result<Option<Example>, String> {
    let interpreter = match fence.lang.as_str() {
        "sh" | "console" => "sh",
        "python" => "python",
        "bash" | "shell" | "zsh" | "shell-session" | "py" | "python3" => {
            return Err(format!(
                "`{}` block: write `sh`, `console` or `python`, the languages whose \
                 blocks run",
                fence.lang
            ))
        }
        _ => return Ok(None),
    };
    let mut stack = false;
    let mut synopsis = false;
    for attribute in &fence.attributes {
        match attribute.as_str() {
            "stack" => stack = true,
            "synopsis" if fence.lang == "sh" => synopsis = true,
            other => {
                return Err(format!(
                    "unknown attribute `{other}` (known: `stack`; `synopsis` on `sh`)"
                ))
            }
        }
    }
    if let Some(first) = fence.body.lines().next() {
        if let Some(reason) = first.strip_prefix(NOT_RUN) {
            let reason = reason.trim();
            if reason.is_empty() {
                return Err(format!("`{NOT_RUN}` without a reason"));
            }
            return Ok(Some(Err(reason.to_string())));
        }
    }
    let name = fence.name();
    let steps = if synopsis {
        synopsis_steps(&name, &fence.body)?
    } else if fence.lang == "console" {
        console_steps(&name, &fence.body, stack)?
    } else {
        vec![Step {
            name,
            interpreter,
            script: fence.body.clone(),
            stack,
            check: Check::Succeeds,
            exit: 0,
        }]
    };
    Ok(Some(Ok(steps)))
}

/// Commands joined across `\` line ends; `#` comment lines dropped.
fn commands(body: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut current = String::new();
    for line in body.lines() {
        if current.is_empty() && (line.trim().is_empty() || line.trim_start().starts_with('#')) {
            continue;
        }
        match line.trim_end().strip_suffix('\\') {
            Some(head) => {
                current.push_str(head);
                current.push(' ');
            }
            None => {
                current.push_str(line);
                out.push(std::mem::take(&mut current));
            }
        }
    }
    if !current.is_empty() {
        out.push(current);
    }
    out
}

/// A synopsis: each command's `--help` must name each of its flags.
fn synopsis_steps(name: &str, body: &str) -> Result<Vec<Step>, String> {
    let mut steps = Vec::new();
    for (i, command) in commands(body).iter().enumerate() {
        let command = command.split(" #").next().unwrap_or_default();
        let words: Vec<&str> = command.split_whitespace().collect();
        let head: Vec<&str> = words
            .iter()
            .take_while(|w| !w.starts_with('-') && !w.starts_with('[') && !w.contains('|'))
            .copied()
            .collect();
        if head.is_empty() {
            return Err(format!("synopsis line `{command}` names no command"));
        }
        let flags: BTreeSet<String> = words
            .iter()
            .flat_map(|w| w.split(['[', ']', '|', '=']))
            .filter(|w| w.starts_with("--") && w.len() > 2)
            .map(|w| w.trim_end_matches([',', '.', ')']).to_string())
            .collect();
        steps.push(Step {
            name: format!("{name} synopsis {}", i + 1),
            interpreter: "sh",
            script: format!("{} --help", head.join(" ")),
            stack: false,
            check: Check::Names(flags.into_iter().collect()),
            exit: 0,
        });
    }
    Ok(steps)
}

/// A console block: `$ ` lines are commands (a `\` line end continues
/// one), the lines after each are its output.
fn console_steps(name: &str, body: &str, stack: bool) -> Result<Vec<Step>, String> {
    let mut steps: Vec<Step> = Vec::new();
    let mut continuing = false;
    for line in body.lines() {
        if continuing {
            let step = steps.last_mut().expect("a command continues");
            step.script.push('\n');
            step.script
                .push_str(line.strip_prefix("> ").unwrap_or(line));
            continuing = line.trim_end().ends_with('\\');
        } else if let Some(command) = line.strip_prefix("$ ") {
            steps.push(Step {
                name: format!("{name} $ {}", steps.len() + 1),
                interpreter: "sh",
                script: command.to_string(),
                stack,
                check: Check::Shows(Vec::new()),
                exit: 0,
            });
            continuing = command.trim_end().ends_with('\\');
        } else {
            match steps.last_mut() {
                Some(Step {
                    check: Check::Shows(expected),
                    ..
                }) => expected.push(line.to_string()),
                _ => return Err("a console block starts with a `$ ` command".into()),
            }
        }
    }
    if steps.is_empty() {
        return Err("a console block without a `$ ` command".into());
    }
    for step in &mut steps {
        let Check::Shows(expected) = &mut step.check else {
            continue;
        };
        while expected.last().is_some_and(|l| l.trim().is_empty()) {
            expected.pop();
        }
        let shown_exit = expected.last().and_then(|l| {
            l.trim()
                .strip_prefix("[exit ")
                .and_then(|rest| rest.strip_suffix(']'))
                .map(|n| n.parse::<i32>())
        });
        match shown_exit {
            Some(Ok(exit)) if exit != 0 => {
                step.exit = exit;
                expected.pop();
            }
            Some(_) => return Err(format!("{}: write `[exit N]` with N above 0", step.name)),
            None => {}
        }
    }
    Ok(steps)
}

/// Output matching as a reader takes a shown output: line by line,
/// trailing spaces ignored; a line `...` stands for any number of lines,
/// and `...` inside a line for any text.
fn output_matches(expected: &[String], actual: &str) -> bool {
    fn line_matches(pattern: &str, line: &str) -> bool {
        let pattern = pattern.trim_end();
        let line = line.trim_end();
        let parts: Vec<&str> = pattern.split("...").collect();
        if parts.len() == 1 {
            return pattern == line;
        }
        let mut rest = line;
        for (i, part) in parts.iter().enumerate() {
            if i == 0 {
                let Some(r) = rest.strip_prefix(part) else {
                    return false;
                };
                rest = r;
            } else if i == parts.len() - 1 {
                return rest.ends_with(part);
            } else {
                let Some(at) = rest.find(part) else {
                    return false;
                };
                rest = &rest[at + part.len()..];
            }
        }
        true
    }
    fn from(expected: &[String], actual: &[&str]) -> bool {
        match expected.split_first() {
            None => actual.is_empty(),
            Some((first, rest)) if first.trim() == "..." => {
                (0..=actual.len()).any(|skip| from(rest, &actual[skip..]))
            }
            Some((first, rest)) => actual
                .split_first()
                .is_some_and(|(line, more)| line_matches(first, line) && from(rest, more)),
        }
    }
    let mut expected: Vec<String> = expected.to_vec();
    while expected.last().is_some_and(|l| l.trim().is_empty()) {
        expected.pop();
    }
    let actual: Vec<&str> = actual.trim_end_matches('\n').lines().collect();
    from(&expected, &actual)
}

/// What every document's sandbox shares: the binaries, a `curl` that fails
/// on an HTTP error, the Python client, the shipped datasets, the stack's
/// model.
struct Prepared {
    bin: PathBuf,
    site: PathBuf,
    model: PathBuf,
}

fn prepare(base: &Path) -> Prepared {
    let root = repo_root();
    let bin = base.join("bin");
    std::fs::create_dir_all(&bin).unwrap();
    for name in ["sidecar", "sidecarctl", "gnn-worker"] {
        std::os::unix::fs::symlink(workspace_bin(name), bin.join(name)).unwrap();
    }
    // An HTTP error status fails the example, as it fails a reader.
    let real_curl = which("curl");
    std::fs::write(
        bin.join("curl"),
        format!(
            "#!/usr/bin/env bash\n\
             for a in \"$@\"; do case \"$a\" in --fail*|-[a-zA-Z]*f*) exec {c} \"$@\";; esac; done\n\
             exec {c} --fail-with-body \"$@\"\n",
            c = real_curl.display()
        ),
    )
    .unwrap();
    make_executable(&bin.join("curl"));

    let site = base.join("site");
    let package = base.join("client-package");
    copy_dir(&root.join("clients/python"), &package);
    run_ok(
        Command::new(python())
            .args(["-m", "pip", "install", "--quiet", "--no-deps"])
            .arg("--no-build-isolation")
            .arg("--target")
            .arg(&site)
            .arg(&package),
        "pip install clients/python",
    );

    let model = base.join("stack-model");
    copy_dir(
        &tests::stack::trained_model_for(&tests::stack::shipped_cora()),
        &model,
    );
    Prepared { bin, site, model }
}

fn which(name: &str) -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is not on PATH: run scripts/setup.sh"))
}

fn make_executable(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// The working directory of a document's examples: the repository's top
/// level linked in, `data/` with the shipped datasets, nothing else.
fn workdir(dir: &Path) -> PathBuf {
    let root = repo_root();
    let work = dir.join("work");
    std::fs::create_dir_all(work.join("data")).unwrap();
    for entry in std::fs::read_dir(&root).unwrap().flatten() {
        let name = entry.file_name();
        if name == "target" || name == ".git" || name == "data" || name == "models" {
            continue;
        }
        std::os::unix::fs::symlink(entry.path(), work.join(&name)).unwrap();
    }
    for archive in std::fs::read_dir(root.join("demo/data")).unwrap().flatten() {
        if archive.path().to_string_lossy().ends_with(".tar.gz") {
            let mut tar = Command::new("tar");
            tar.arg("-xzf")
                .arg(archive.path())
                .arg("-C")
                .arg(work.join("data"));
            run_ok(&mut tar, "tar -xzf demo/data/*.tar.gz");
        }
    }
    work
}

/// The directories the sandbox mounts an empty tmpfs over, so that nothing
/// of the host's (another test's Redis socket, shared memory, state) is
/// seen or left behind.
const MASKED: [&str; 4] = ["/dev/shm", "/tmp", "/run", "/var/lib"];

/// Of `paths` (resolved), those under a directory of [`MASKED`], each only
/// once and none inside another: the driver keeps them visible by binding
/// each back in place over its tmpfs (a checkout, or a target directory,
/// under /tmp is a common place for a first try). A file is kept by its
/// directory.
fn kept_under_masks(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut kept: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| p.canonicalize().ok())
        .map(|p| {
            if p.is_file() {
                p.parent().map(Path::to_path_buf).unwrap_or(p)
            } else {
                p
            }
        })
        .filter(|p| MASKED.iter().any(|m| p.starts_with(m) && p != Path::new(m)))
        .collect();
    kept.sort();
    kept.dedup();
    let outermost: Vec<PathBuf> = kept
        .iter()
        .filter(|p| !kept.iter().any(|q| q != *p && p.starts_with(q)))
        .cloned()
        .collect();
    outermost
}

/// `path` as one shell word, whatever it holds (spaces, quotes).
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

/// The driver that runs inside the sandbox: sets it up, then runs the
/// steps in order and stops at the first that fails (later ones build on
/// it). Step `i` leaves `out/<i>.out` and `out/<i>.rc`.
fn driver(steps: &[Step], dir: &Path, prepared: &Prepared) -> String {
    let mut s = String::new();
    let out = dir.join("out");
    let kept = kept_under_masks(&[
        dir.to_path_buf(),
        prepared.bin.clone(),
        prepared.site.clone(),
        prepared.model.clone(),
        repo_root(),
        repo_root().join(".venv"),
        onnxruntime_lib(),
        // What bin/'s links point at: the target directory's binaries.
        workspace_bin("sidecar"),
    ]);
    let _ = writeln!(
        s,
        r#"set -u
OUT={out}
PATH="$PATH:/usr/sbin:/sbin" ip link set lo up || exit 90
{keep_open}
for d in {masked}; do mount -t tmpfs tmpfs "$d" || exit 91; done
{keep_bind}
mount --bind {hosts} /etc/hosts || exit 92
mkdir -p /run/gnn
cd {work}
redis-server --bind 127.0.0.1 --port 6379 --save '' --appendonly no --daemonize yes \
    --dir /tmp --logfile "$OUT/redis.log" || exit 93
for i in $(seq 100); do redis-cli ping > /dev/null 2>&1 && break; sleep 0.1; done
stack_up=0
start_stack() {{
    # Up already when a block of the document started the same stack.
    {curl} -sf localhost:8080/readyz > /dev/null 2>&1 && return 0
    if [ ! -e /var/lib/sidecar/graph.csr ]; then
        sidecar import data/cora --data-dir /var/lib/sidecar >> "$OUT/stack.log" 2>&1 || return 1
    fi
    rm -rf models/cora && mkdir -p models && cp -r {model} models/cora
    sidecar serve --data-dir /var/lib/sidecar --shm-name gnn-sidecar \
        --admin-socket /run/gnn/admin.sock >> "$OUT/stack.log" 2>&1 &
    gnn-worker serve --model models/cora --shm-name gnn-sidecar \
        --grpc 0.0.0.0:50051 --http 0.0.0.0:8080 >> "$OUT/stack.log" 2>&1 &
    for i in $(seq 600); do
        {curl} -sf localhost:8080/readyz > /dev/null 2>&1 && return 0
        sleep 0.2
    done
    return 1
}}
step() {{
    if [ "$3" = 1 ] && [ "$stack_up" = 0 ]; then
        if ! start_stack; then
            echo "the stack did not become ready (its log: $OUT/stack.log)" > "$OUT/$1.out"
            echo 95 > "$OUT/$1.rc"
            exit 0
        fi
        stack_up=1
    fi
    timeout -k 5 {timeout} $2 "$OUT/$1.step" > "$OUT/$1.out" 2>&1 < /dev/null
    rc=$?
    echo $rc > "$OUT/$1.rc"
    [ $rc = "$4" ] || exit 0
}}"#,
        out = quoted(&out),
        keep_open = kept
            .iter()
            .enumerate()
            .map(|(i, p)| format!("exec {}<{} || exit 94", i + 3, quoted(p)))
            .collect::<Vec<_>>()
            .join("\n"),
        masked = MASKED.join(" "),
        keep_bind = kept
            .iter()
            .enumerate()
            .map(|(i, p)| format!(
                "mkdir -p {p} && mount --no-canonicalize --bind /proc/self/fd/{fd} {p} || exit 94",
                p = quoted(p),
                fd = i + 3
            ))
            .collect::<Vec<_>>()
            .join("\n"),
        hosts = quoted(&dir.join("hosts")),
        work = quoted(&dir.join("work")),
        model = quoted(&prepared.model),
        curl = quoted(&which("curl")),
        timeout = STEP_TIMEOUT_S,
    );
    for (i, step) in steps.iter().enumerate() {
        let interpreter = match step.interpreter {
            "python" => ".venv/bin/python".to_string(),
            _ => "bash -e -o pipefail".to_string(),
        };
        std::fs::write(out.join(format!("{i}.step")), &step.script).unwrap();
        let _ = writeln!(
            s,
            "step {i} '{interpreter}' {} {}",
            u8::from(step.stack),
            step.exit
        );
    }
    s
}

/// Runs one document's steps in its sandbox; the failures, by step name.
fn run_document(doc: &Path, steps: &[Step], base: &Path, prepared: &Prepared) -> Vec<String> {
    let dir = base.join(doc.to_string_lossy().replace('/', "_"));
    std::fs::create_dir_all(dir.join("out")).unwrap();
    workdir(&dir);
    std::fs::write(
        dir.join("hosts"),
        "127.0.0.1 localhost redis\n::1 localhost\n",
    )
    .unwrap();
    let script = driver(steps, &dir, prepared);
    std::fs::write(dir.join("driver.sh"), script).unwrap();
    let path = format!(
        "{}:{}",
        prepared.bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let status = Command::new("unshare")
        .args([
            "--user",
            "--map-root-user",
            "--net",
            "--mount",
            "--pid",
            "--fork",
        ])
        .args(["--kill-child", "--propagation", "private", "bash"])
        .arg(dir.join("driver.sh"))
        .env_clear()
        .env("PATH", path)
        .env("HOME", dir.join("work"))
        .env("LANG", "C.UTF-8")
        .env("ORT_DYLIB_PATH", onnxruntime_lib())
        .env("PYTHONPATH", &prepared.site)
        .stdin(Stdio::null())
        .status()
        .expect("running unshare (util-linux)");
    if !status.success() {
        let why = match status.code() {
            Some(90) => "the loopback interface of its network namespace did not come up",
            Some(91) => "a tmpfs could not be mounted over /dev/shm, /tmp, /run or /var/lib",
            Some(92) => "its hosts file could not be bound over /etc/hosts",
            Some(93) => "redis-server did not start in it (its log: out/redis.log)",
            Some(94) => {
                "the checkout or the sandbox's directory could not be bound back over the \
                 tmpfs that hides it"
            }
            _ => {
                "unshare failed: unprivileged user, network and mount namespaces are needed, \
                 as for podman"
            }
        };
        return vec![format!(
            "{}: the sandbox could not be set up in {} ({status}): {why}",
            doc.display(),
            dir.display()
        )];
    }
    let mut failures = Vec::new();
    for (i, step) in steps.iter().enumerate() {
        let out_path = dir.join("out").join(format!("{i}.out"));
        let rc = std::fs::read_to_string(dir.join("out").join(format!("{i}.rc")));
        let Ok(rc) = rc else {
            if failures.is_empty() {
                failures.push(format!("{}: never ran", step.name));
            }
            break;
        };
        let output = std::fs::read_to_string(&out_path).unwrap_or_default();
        let tail: String = {
            let lines: Vec<&str> = output.lines().collect();
            lines[lines.len().saturating_sub(30)..].join("\n")
        };
        let rc = rc.trim();
        if rc != step.exit.to_string() {
            failures.push(format!(
                "{}: exit {rc}{}, not {}\n{}\n--- its output (last 30 lines):\n{tail}",
                step.name,
                if rc == "124" { " (timed out)" } else { "" },
                step.exit,
                step.script
            ));
            break;
        }
        match &step.check {
            Check::Succeeds => {}
            Check::Shows(expected) => {
                if !output_matches(expected, &output) {
                    failures.push(format!(
                        "{}: the output is not what the doc shows\n--- the doc:\n{}\n--- the command printed:\n{output}",
                        step.name,
                        expected.join("\n")
                    ));
                }
            }
            Check::Names(flags) => {
                let missing: Vec<&String> = flags
                    .iter()
                    .filter(|f| !help_names_flag(&output, f))
                    .collect();
                if !missing.is_empty() {
                    failures.push(format!(
                        "{}: `{}` does not know {missing:?}",
                        step.name, step.script
                    ));
                }
            }
        }
    }
    failures
}

#[test]
fn the_output_matching_reads_shown_output_as_a_reader_does() {
    let lines = |t: &str| t.lines().map(str::to_string).collect::<Vec<_>>();
    assert!(output_matches(&lines("a\nb"), "a\nb\n"));
    assert!(!output_matches(&lines("a\nb"), "a\nc\n"));
    assert!(!output_matches(&lines("a"), "a\nb\n"));
    assert!(output_matches(&lines("a\n...\nd"), "a\nb\nc\nd\n"));
    assert!(output_matches(&lines("a\n...\nd"), "a\nd\n"));
    assert!(!output_matches(&lines("a\n...\nd"), "a\nb\n"));
    assert!(output_matches(&lines("p50 ... us"), "p50 120 us"));
    assert!(!output_matches(&lines("p50 ... us"), "p99 120 us"));
    assert!(output_matches(
        &lines("node 1 label ... by ..."),
        "node 1 label 3 by gnn"
    ));
    assert!(help_names_flag("  --batch <N>\n", "--batch"));
    assert!(!help_names_flag("  --batch-size <N>\n", "--batch"));
}

#[test]
fn every_example_is_written_as_the_harness_reads_it() {
    let plan = plan();
    assert!(plan.examples > 0, "no example found in the docs");
    for (name, reason) in &plan.not_run {
        assert!(reason.len() > 10, "{name}: say why it cannot run here");
    }
}

#[test]
fn every_example_of_the_docs_runs_and_shows_what_the_doc_shows() {
    let mut plan = plan();
    // DOC_EXAMPLES_ONLY=docs/admin.md,README.md: those documents alone.
    if let Ok(only) = std::env::var("DOC_EXAMPLES_ONLY") {
        let only: Vec<&str> = only.split(',').map(str::trim).collect();
        plan.steps
            .retain(|(doc, _)| only.contains(&doc.to_string_lossy().as_ref()));
        plan.not_run
            .retain(|(name, _)| only.iter().any(|doc| name.starts_with(&format!("{doc}:"))));
        assert!(
            !plan.steps.is_empty(),
            "DOC_EXAMPLES_ONLY={only:?} names no document with examples"
        );
    }
    let exe = std::env::current_exe().unwrap();
    let base = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .join("doc-examples");
    let _ = std::fs::remove_dir_all(&base);
    std::fs::create_dir_all(&base).unwrap();
    let prepared = prepare(&base);

    // Three documents at a time: most steps wait on a process or train a
    // small model.
    let queue = std::sync::Mutex::new(plan.steps.iter());
    let failures = std::sync::Mutex::new(Vec::new());
    std::thread::scope(|scope| {
        for _ in 0..3 {
            scope.spawn(|| loop {
                let next = queue.lock().unwrap().next();
                let Some((doc, steps)) = next else { break };
                let started = std::time::Instant::now();
                let found = run_document(doc, steps, &base, &prepared);
                eprintln!(
                    "{}: {} steps, {} failed, {:.0} s",
                    doc.display(),
                    steps.len(),
                    found.len(),
                    started.elapsed().as_secs_f64()
                );
                failures.lock().unwrap().extend(found);
            });
        }
    });
    // Written to stderr itself, past the test harness's capture: the
    // examples not run here are listed on every run, passing or not.
    let n_run: usize = plan.steps.iter().map(|(_, s)| s.len()).sum();
    let mut summary = format!(
        "doc examples: {} examples, {} run ({} steps), {} not run here:\n",
        plan.examples,
        plan.examples - plan.not_run.len(),
        n_run,
        plan.not_run.len()
    );
    for (name, reason) in &plan.not_run {
        summary.push_str(&format!("  {name}: {reason}\n"));
    }
    let _ = std::io::Write::write_all(&mut std::io::stderr().lock(), summary.as_bytes());
    let failures = failures.into_inner().unwrap();
    assert!(
        failures.is_empty(),
        "{} examples fail (each document's steps stop at its first failure; \
         sandboxes in {}):\n\n{}",
        failures.len(),
        base.display(),
        failures.join("\n\n")
    );
}

/// The sandbox with everything it reads under /tmp, which it hides behind
/// a tmpfs of its own (a clone, or a target directory, under /tmp is a
/// common place for a first try): the host's /tmp stays hidden and
/// untouched, while the binaries, the datasets, the hosts file and the
/// stack's model stay visible, and a stack block runs; the path holds a
/// space and a quote.
#[test]
fn a_sandbox_whose_files_live_under_tmp_runs_its_examples() {
    let tmp = tempfile::Builder::new()
        .prefix("doc-examples-under-tmp")
        .tempdir_in("/tmp")
        .unwrap();
    // A path with a space and a quote, as a user's may have.
    let base = tmp.path().join("a user's dir").join("base");
    std::fs::create_dir_all(&base).unwrap();
    let prepared = prepare(&base);
    let marker = tmp.path().join("marker.txt");
    std::fs::write(&marker, "still here\n").unwrap();
    let step = |name: &str, script: String, stack: bool, shown: &[&str]| Step {
        name: name.into(),
        interpreter: "sh",
        script,
        stack,
        check: Check::Shows(shown.iter().map(|l| l.to_string()).collect()),
        exit: 0,
    };
    let steps = vec![
        step(
            "under-tmp:1",
            // The host's /tmp is hidden (its own tmpfs), what the sandbox
            // reads from there is not.
            format!(
                "test ! -e {} && echo hidden; ls data/cora/meta.json; grep -c redis /etc/hosts",
                marker.display()
            ),
            false,
            &["hidden", "data/cora/meta.json", "1"],
        ),
        step(
            "under-tmp:2",
            "curl -s localhost:8080/readyz | head -c 5; echo".into(),
            true,
            &["ready"],
        ),
    ];
    let failures = run_document(Path::new("under-tmp.md"), &steps, &base, &prepared);
    assert!(failures.is_empty(), "{}", failures.join("\n\n"));
    // The host's /tmp is as it was: the sandbox's tmpfs was its own.
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "still here\n");
}
