//! `scripts/setup.sh`: the demo's setup (`--demo`) installs what the demo
//! needs and nothing of the test tooling; the full setup installs both;
//! a second run installs nothing. Run on a copy of the script and its
//! requirements files, with `apt-get`, `dpkg`, `cargo`, `rustup` and
//! Python replaced by programs that record what they are asked and report
//! every package missing (a fresh machine), so nothing is installed here.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A copy of the setup script and its requirements in `dir`, with a PATH
/// of recording stand-ins for the installers.
struct Sandbox {
    dir: tempfile::TempDir,
}

/// What a stand-in records, one line a call, in `calls.log`.
const RECORDER: &str = r#"#!/bin/sh
echo "$(basename "$0") $*" >> "$SETUP_LOG"
"#;

impl Sandbox {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let root = tests::stack::repo_root();
        std::fs::create_dir(dir.path().join("scripts")).unwrap();
        std::fs::copy(
            root.join("scripts/setup.sh"),
            dir.path().join("scripts/setup.sh"),
        )
        .unwrap();
        for file in [
            "requirements.txt",
            "requirements-demo.txt",
            "requirements-v2.txt",
        ] {
            std::fs::copy(root.join(file), dir.path().join(file)).unwrap();
        }
        let bin = dir.path().join("bin");
        std::fs::create_dir(&bin).unwrap();
        let script = |name: &str, body: &str| {
            let path = bin.join(name);
            std::fs::write(&path, body).unwrap();
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        };
        // A fresh machine: no package, no cargo subcommand, no component.
        script("dpkg", "#!/bin/sh\nexit 1\n");
        script("apt-get", RECORDER);
        script("rustup", RECORDER);
        script(
            "cargo",
            &format!("{RECORDER}case \"$1\" in install) exit 0 ;; *) exit 1 ;; esac\n"),
        );
        // The system Python: has venv; `-m venv DIR` makes DIR/bin/python,
        // which records its pip calls.
        script(
            "python3",
            &format!(
                "{RECORDER}if [ \"$1\" = -m ] && [ \"$2\" = venv ]; then\n\
                 mkdir -p \"$3/bin\"\n\
                 printf '%s' '{}' > \"$3/bin/python\"\n\
                 chmod +x \"$3/bin/python\"\nfi\nexit 0\n",
                RECORDER.replace("$(basename \"$0\")", "$0")
            ),
        );
        // One filesystem with the MiB free written in $HOME/free-mib
        // (plenty when it is absent), mounted at /.
        script(
            "df",
            "#!/bin/bash\nfree=100000\n[ -f \"$HOME/free-mib\" ] && free=$(< \"$HOME/free-mib\")\n\
             echo 'Filesystem 1048576-blocks Used Available Capacity Mounted on'\n\
             echo \"/dev/vda 200000 1000 $free 1% /\"\n",
        );
        // The few tools the script itself runs.
        for tool in [
            "sha256sum",
            "cut",
            "cat",
            "basename",
            "dirname",
            "mkdir",
            "chmod",
        ] {
            let found = ["/usr/bin", "/bin"]
                .iter()
                .map(|d| Path::new(d).join(tool))
                .find(|p| p.exists())
                .unwrap_or_else(|| panic!("{tool} is not in /usr/bin or /bin"));
            std::os::unix::fs::symlink(found, bin.join(tool)).unwrap();
        }
        Sandbox { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// Runs the copied setup with `args`; returns its output and the calls
    /// the stand-ins recorded (the log is emptied for the next run).
    fn run(&self, args: &[&str]) -> (Output, Vec<String>) {
        let log = self.path("calls.log");
        let bash = ["/usr/bin/bash", "/bin/bash"]
            .into_iter()
            .find(|p| Path::new(p).exists())
            .expect("bash");
        let output = Command::new(bash)
            .arg(self.path("scripts/setup.sh"))
            .args(args)
            .env_clear()
            .env("PATH", self.path("bin"))
            .env("SETUP_LOG", &log)
            .env("HOME", self.dir.path())
            .output()
            .unwrap();
        let calls = std::fs::read_to_string(&log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        let _ = std::fs::remove_file(&log);
        (output, calls)
    }
}

/// The Debian packages the calls asked `apt-get install` for.
fn packages(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter_map(|c| c.strip_prefix("apt-get install -y -qq "))
        .flat_map(|p| p.split(' ').map(str::to_string))
        .collect()
}

/// The requirements files pip was given, with the venv it ran in.
fn pip_installs(calls: &[String]) -> Vec<String> {
    calls
        .iter()
        .filter(|c| c.contains(" -m pip install") && c.contains(" -r "))
        .map(|c| {
            let venv = c.split("/bin/python").next().unwrap();
            let venv = Path::new(venv).file_name().unwrap().to_string_lossy();
            format!("{venv} {}", c.rsplit(' ').next().unwrap())
        })
        .collect()
}

fn succeeded(output: &Output) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "setup failed:\n{text}");
    text
}

#[test]
fn the_demo_setup_installs_what_the_demo_needs_and_no_test_tooling() {
    let sandbox = Sandbox::new();
    let (output, calls) = sandbox.run(&["--demo"]);
    let text = succeeded(&output);
    assert_eq!(
        packages(&calls),
        ["clang", "libclang-dev", "protobuf-compiler"],
        "{calls:#?}"
    );
    assert_eq!(
        pip_installs(&calls),
        [".venv requirements-demo.txt"],
        "{calls:#?}"
    );
    assert!(
        !calls
            .iter()
            .any(|c| c.starts_with("cargo install") || c.starts_with("rustup")),
        "the demo's setup builds no test tool: {calls:#?}"
    );
    assert!(!sandbox.path(".venv-v2").exists());
    // Each step says how long the setup has run.
    assert!(
        text.contains("setup [") && text.contains("ready for the demo"),
        "{text}"
    );
    // Again: everything is there, nothing is installed.
    let (output, calls) = sandbox.run(&["--demo"]);
    succeeded(&output);
    assert!(pip_installs(&calls).is_empty(), "{calls:#?}");
}

#[test]
fn the_full_setup_adds_the_test_tooling_and_a_bad_argument_is_named() {
    let sandbox = Sandbox::new();
    let (output, calls) = sandbox.run(&["--demo"]);
    succeeded(&output);
    let (output, calls_full) = sandbox.run(&[]);
    succeeded(&output);
    let asked = packages(&calls_full);
    for package in ["redis-server", "podman", "prometheus", "protobuf-compiler"] {
        assert!(asked.iter().any(|p| p == package), "{package}: {asked:?}");
    }
    for tool in ["cargo-deny", "cargo-fuzz"] {
        assert!(
            calls_full
                .iter()
                .any(|c| c.starts_with("cargo install") && c.contains(tool)),
            "{tool}: {calls_full:#?}"
        );
    }
    // The demo's venv gains the rest; the clients' venv is made.
    assert_eq!(
        pip_installs(&calls_full),
        [".venv requirements.txt", ".venv-v2 requirements-v2.txt"],
        "{calls:#?} then {calls_full:#?}"
    );
    let (output, calls) = sandbox.run(&["--tests"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&output.stderr).contains("unknown argument --tests"),
        "{output:?}"
    );
    assert!(calls.is_empty(), "{calls:#?}");
}

/// Where torch's CUDA build cannot fit, the setup says how much room it
/// needs and where before pip starts, instead of pip failing half-way;
/// with room, the same sandbox installs.
#[test]
fn a_disk_without_room_for_torch_is_refused_before_pip_starts() {
    let sandbox = Sandbox::new();
    std::fs::write(sandbox.path("free-mib"), "7000").unwrap();
    let (output, calls) = sandbox.run(&["--demo"]);
    assert_eq!(output.status.code(), Some(1), "{output:?}");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr
            .contains("installing requirements-demo.txt into .venv needs about 8900 MiB free on /")
            && stderr.contains("it has 7000")
            && stderr.contains("TMPDIR"),
        "{stderr}"
    );
    assert!(pip_installs(&calls).is_empty(), "{calls:#?}");
    std::fs::write(sandbox.path("free-mib"), "8900").unwrap();
    let (output, calls) = sandbox.run(&["--demo"]);
    succeeded(&output);
    assert_eq!(
        pip_installs(&calls),
        [".venv requirements-demo.txt"],
        "{calls:#?}"
    );
    assert!(
        calls
            .iter()
            .filter(|c| c.contains(" -m pip install"))
            .all(|c| c.contains("--no-cache-dir")),
        "pip keeps no cache of torch's wheels: {calls:#?}"
    );
}
