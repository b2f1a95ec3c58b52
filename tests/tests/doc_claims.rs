//! Claims of the docs tied to the code that makes them true: the paths
//! and scripts the docs name exist, the benchmarks said to be part of a
//! script are in it, `sidecarctl`'s commands are the ones docs/admin.md
//! lists and `status --json` answers the fields it lists, the commands
//! each daemon's `main.rs` holds and the modules allowed `unsafe` are the
//! ones ARCHITECTURE.md names. (configuration.md's keys and defaults are
//! checked by `configuration.rs`, metrics.md's names by `probes.rs` and
//! `observability.rs`; the examples run in `doc_examples.rs`.)

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use tests::docs::documents;
use tests::stack::{repo_root, workspace_bin, Stack, StackOptions};

fn read(path: &str) -> String {
    std::fs::read_to_string(repo_root().join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
}

/// The backticked spans of `text`, outside code fences.
fn spans(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        let mut parts = line.split('`');
        parts.next();
        while let (Some(inside), Some(_)) = (parts.next(), parts.next()) {
            out.push(inside.to_string());
        }
    }
    out
}

/// A span that names a file or directory of the repository: starts with
/// one of its top-level directories and holds no placeholder.
fn repository_path(span: &str) -> Option<&str> {
    const TOP: [&str; 14] = [
        "scripts/",
        "docs/",
        "sidecar/",
        "gnn-worker/",
        "protocol/",
        "tests/",
        "bench/",
        "fuzz/",
        "k8s/",
        "containers/",
        "clients/",
        "demo/",
        "daemon-kit/",
        ".ci/",
    ];
    let path = span.split_whitespace().next()?;
    let path = path.trim_end_matches([',', '.', ':', ';', ')']);
    let placeholder = path.contains(['<', '*', '{', '$', '[', '|']) || path.contains("...");
    (TOP.iter().any(|top| path.starts_with(top)) && !placeholder).then_some(path)
}

#[test]
fn every_path_and_script_a_doc_names_exists() {
    let root = repo_root();
    let mut missing = Vec::new();
    let mut named = 0;
    for doc in documents() {
        let text = read(&doc.to_string_lossy());
        for span in spans(&text) {
            // Outputs a benchmark or a test run writes are not in the tree.
            let Some(path) = repository_path(&span) else {
                continue;
            };
            if path.starts_with("bench/results/") && !path.ends_with(".md") {
                if !root.join(path).exists() {
                    // A results directory a benchmark writes: its parent is.
                    let parent = Path::new(path).parent().unwrap();
                    if !root.join(parent).is_dir() {
                        missing.push(format!("{}: {path}", doc.display()));
                    }
                }
                continue;
            }
            named += 1;
            if !root.join(path).exists() {
                missing.push(format!("{}: {path}", doc.display()));
            }
        }
    }
    assert!(
        named > 100,
        "only {named} paths found: is the span reader broken?"
    );
    assert!(
        missing.is_empty(),
        "paths the docs name that do not exist:\n{}",
        missing.join("\n")
    );
}

#[test]
fn a_benchmark_said_to_be_part_of_a_script_is_in_it() {
    // "`cargo bench -p sidecar --bench graph` (part of `scripts/bench.sh`)"
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc.to_string_lossy()).replace('\n', " ");
        for (at, _) in text.match_indices("(part of `scripts/") {
            let script = text[at + "(part of `".len()..]
                .split('`')
                .next()
                .unwrap()
                .to_string();
            let before = &text[..at];
            let bench = before
                .rsplit("--bench ")
                .next()
                .and_then(|rest| rest.split([' ', '`']).next())
                .unwrap_or_default();
            assert!(
                !bench.is_empty() && before.len() - before.rfind("--bench ").unwrap() < 80,
                "{}: \"(part of `{script}`)\" follows no `--bench NAME`",
                doc.display()
            );
            let body = read(&script);
            assert!(
                body.contains(&format!("--bench {bench}")),
                "{}: the {bench} benchmark is said to be part of {script}, which does not run it",
                doc.display()
            );
            checked += 1;
        }
    }
    assert!(checked >= 3, "only {checked} such claims found");
}

/// The subcommands `<bin> --help` lists (without `help`).
fn subcommands(bin: &str, args: &[&str]) -> BTreeSet<String> {
    let out = Command::new(workspace_bin(bin))
        .args(args)
        .arg("--help")
        .output()
        .unwrap();
    let help = String::from_utf8(out.stdout).unwrap();
    help.split("Commands:")
        .nth(1)
        .unwrap_or_else(|| panic!("{bin} {args:?} --help lists no commands"))
        .split("Options:")
        .next()
        .unwrap()
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .filter(|c| *c != "help")
        .map(str::to_string)
        .collect()
}

#[test]
fn admin_md_lists_every_sidecarctl_command_and_no_other() {
    let text = read("docs/admin.md");
    let table = text
        .split("## Commands")
        .nth(1)
        .expect("docs/admin.md has a Commands section")
        .split("\n## ")
        .next()
        .unwrap();
    // First column: `status`, `fanouts get` / `fanouts set F1,F2`, ...
    let mut documented = BTreeSet::new();
    for row in table.lines().filter(|l| l.starts_with("| `")) {
        let first = row.split(" | ").next().unwrap();
        for span in spans(first) {
            let words: Vec<&str> = span.split_whitespace().collect();
            documented.insert(words[0].to_string());
            if ["graph", "cache", "fanouts", "deadline", "log-level"].contains(&words[0]) {
                if let Some(sub) = words.get(1) {
                    documented.insert(format!("{} {sub}", words[0]));
                }
            }
        }
    }
    let mut actual = subcommands("sidecarctl", &[]);
    for group in ["graph", "cache", "fanouts", "deadline", "log-level"] {
        for sub in subcommands("sidecarctl", &[group]) {
            actual.insert(format!("{group} {sub}"));
        }
    }
    assert_eq!(
        documented, actual,
        "docs/admin.md's command table and `sidecarctl --help` differ"
    );
}

#[test]
fn architecture_md_names_each_daemons_commands_and_every_unsafe_module() {
    let text = read("ARCHITECTURE.md").replace('\n', " ");
    let listed = |after: &str| -> BTreeSet<String> {
        let at = text
            .find(after)
            .unwrap_or_else(|| panic!("ARCHITECTURE.md says no `{after}`"));
        let list = text[at + after.len()..].split(')').next().unwrap();
        spans(list).into_iter().collect()
    };
    assert_eq!(
        listed("`gnn-worker/src/main.rs` ("),
        subcommands("gnn-worker", &[]),
        "ARCHITECTURE.md's commands of gnn-worker/src/main.rs"
    );
    assert_eq!(
        listed("`src/main.rs` is the command line ("),
        subcommands("sidecar", &[]),
        "ARCHITECTURE.md's commands of sidecar/src/main.rs"
    );

    // protocol: "allowed in six modules only: `futex` (...), ..."
    let mut allowed = BTreeSet::new();
    for entry in std::fs::read_dir(repo_root().join("protocol/src"))
        .unwrap()
        .flatten()
    {
        let source = std::fs::read_to_string(entry.path()).unwrap_or_default();
        if source.contains("#![allow(unsafe_code)]") {
            let name = entry
                .path()
                .file_stem()
                .unwrap()
                .to_string_lossy()
                .into_owned();
            allowed.insert(name);
        }
    }
    let at = text
        .find("`unsafe` is denied crate-wide and allowed in")
        .unwrap();
    let sentence = &text[at..at + text[at..].find(". ").unwrap()];
    let named: BTreeSet<String> = spans(sentence)
        .into_iter()
        .filter(|s| s != "unsafe" && !s.contains(' ') && !s.contains("Safe"))
        .collect();
    assert_eq!(named, allowed, "ARCHITECTURE.md: protocol's unsafe modules");
    let words = [
        "one", "two", "three", "four", "five", "six", "seven", "eight",
    ];
    assert!(
        sentence.contains(&format!("allowed in {} modules", words[allowed.len() - 1])),
        "ARCHITECTURE.md counts protocol's unsafe modules wrong: {sentence}"
    );
}

#[test]
fn status_json_answers_exactly_the_fields_admin_md_lists() {
    let text = read("docs/admin.md");
    let row = text
        .lines()
        .find(|l| l.starts_with("| `status` |"))
        .expect("docs/admin.md lists `status`");
    let fields = row.rsplit(" | ").next().expect("a fields column");
    let documented: BTreeSet<String> = spans(fields)[0].split(", ").map(str::to_string).collect();

    let stack = Stack::start(&StackOptions::new("cora")).expect("stack");
    let answer: serde_json::Value =
        serde_json::from_str(&stack.sidecarctl(&["status", "--json"]).unwrap()).unwrap();
    let actual: BTreeSet<String> = answer
        .as_object()
        .expect("an object")
        .keys()
        .cloned()
        .collect();
    assert!(stack.stop());
    assert_eq!(documented, actual, "docs/admin.md's status fields");
}

/// A heading's text as a reference names it: `#`s, a leading section
/// number (`3.3`) and backticks dropped.
fn heading_name(line: &str) -> String {
    let text = line.trim_start_matches('#').trim().replace('`', "");
    let unnumbered = text
        .split_once(' ')
        .filter(|(number, _)| number.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .map_or(text.as_str(), |(_, rest)| rest);
    unnumbered.trim().to_string()
}

#[test]
fn every_section_a_doc_points_to_exists() {
    // `docs/serving.md, "The ladder"` and `[serving.md](serving.md),
    // "The ladder"`, across line breaks.
    let root = repo_root();
    let mut dangling = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc.to_string_lossy()).replace('\n', " ");
        let text = text.replace("  ", " ");
        for (at, _) in text.match_indices(".md") {
            let before = &text[..at];
            let name_start = before
                .rfind(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                .map_or(0, |i| i + 1);
            let file = format!("{}.md", &before[name_start..]);
            let after = &text[at + 3..];
            let after = after.strip_prefix(')').unwrap_or(after);
            let Some(quoted) = after.strip_prefix(", \"") else {
                continue;
            };
            let Some(section) = quoted.split('"').next() else {
                continue;
            };
            let path = if file == "README.md" || file == "ARCHITECTURE.md" {
                root.join(&file)
            } else {
                root.join("docs").join(&file)
            };
            let Ok(target) = std::fs::read_to_string(&path) else {
                dangling.push(format!("{}: {file} does not exist", doc.display()));
                continue;
            };
            checked += 1;
            let wanted = section.replace('`', "");
            // A heading of that name (`### Speed: the scatter rewrite`,
            // `## PyTorch Geometric models (the subgraph layout)` count),
            // or a paragraph's bold lead (`**Trimmed past a position.**`).
            let found = target.lines().any(|l| {
                if l.starts_with('#') {
                    let name = heading_name(l);
                    name == wanted
                        || name.starts_with(&format!("{wanted}:"))
                        || name.starts_with(&format!("{wanted} ("))
                } else {
                    l.starts_with(&format!("**{section}**"))
                        || l.starts_with(&format!("**{section}.**"))
                }
            });
            if !found {
                dangling.push(format!(
                    "{}: {file}, \"{section}\": no such section",
                    doc.display()
                ));
            }
        }
    }
    assert!(checked > 30, "only {checked} section references found");
    assert!(
        dangling.is_empty(),
        "references to sections that do not exist:\n{}",
        dangling.join("\n")
    );
}

#[test]
fn protocol_md_says_which_statuses_the_sidecar_sends() {
    // Its table of response statuses and their causes: a status the
    // sidecar's code sends is not "not sent".
    let text = read("docs/protocol.md");
    let mut sources = String::new();
    let mut files = Vec::new();
    fn walk(dir: &Path, out: &mut Vec<std::path::PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    walk(&repo_root().join("sidecar/src"), &mut files);
    for file in files {
        sources.push_str(&std::fs::read_to_string(file).unwrap());
    }
    let mut checked = 0;
    for status in [
        "INVALID_REQUEST",
        "TOO_LARGE",
        "DEADLINE_EXCEEDED",
        "UNAVAILABLE",
        "INTERNAL",
    ] {
        let row = text
            .lines()
            .find(|l| l.starts_with(&format!("| {status} |")))
            .unwrap_or_else(|| panic!("docs/protocol.md has no causes row for {status}"));
        let sent = sources.contains(&format!("status::{status}"));
        if sent {
            checked += 1;
            assert!(
                !row.contains("not sent"),
                "docs/protocol.md says {status} is not sent; the sidecar sends it: {row}"
            );
        }
    }
    assert!(checked >= 3, "only {checked} statuses found sent");
}

#[test]
fn updates_md_gives_the_follower_s_xread_as_it_is() {
    let source = read("sidecar/src/updates/follower.rs");
    let block_ms = source
        .lines()
        .find_map(|l| l.strip_prefix("const BLOCK_MS: u64 = "))
        .and_then(|v| v.strip_suffix(';'))
        .expect("follower.rs's BLOCK_MS");
    let doc = read("docs/updates.md");
    let shown: Vec<&str> = doc
        .match_indices("XREAD BLOCK ")
        .map(|(at, _)| doc[at + "XREAD BLOCK ".len()..].split(' ').next().unwrap())
        .collect();
    assert!(!shown.is_empty(), "docs/updates.md shows no XREAD");
    for value in shown {
        assert_eq!(value, block_ms, "docs/updates.md's XREAD BLOCK");
    }
}

/// `<bin> <subcommands...> --help` texts along the path the words take,
/// cached.
fn help_along(
    bin: &str,
    words: &[&str],
    cache: &mut std::collections::HashMap<Vec<String>, String>,
) -> String {
    let mut path: Vec<String> = Vec::new();
    let mut all = String::new();
    let mut words = words.iter();
    loop {
        let key: Vec<String> = std::iter::once(bin.to_string())
            .chain(path.iter().cloned())
            .collect();
        let help = cache
            .entry(key)
            .or_insert_with(|| {
                let out = Command::new(workspace_bin(bin))
                    .args(&path)
                    .arg("--help")
                    .output()
                    .unwrap();
                String::from_utf8_lossy(&out.stdout).into_owned()
            })
            .clone();
        all.push_str(&help);
        let commands: BTreeSet<String> = help
            .split("Commands:")
            .nth(1)
            .map(|c| {
                c.split("Options:")
                    .next()
                    .unwrap()
                    .lines()
                    .filter_map(|l| l.split_whitespace().next())
                    .map(str::to_string)
                    .collect()
            })
            .unwrap_or_default();
        match words.find(|w| commands.contains(**w)) {
            Some(next) => path.push(next.to_string()),
            None => return all,
        }
    }
}

#[test]
fn every_command_a_doc_writes_uses_flags_the_command_has() {
    // In prose (`sidecarctl graph add-node ID --features-file F`) and in
    // blocks alike: a flag a command does not have is a copy that fails.
    let mut cache = std::collections::HashMap::new();
    let mut wrong = Vec::new();
    let mut checked = 0;
    for doc in documents() {
        let text = read(&doc.to_string_lossy());
        let mut commands: Vec<String> = spans(&text);
        for fence in tests::docs::fences(&doc) {
            if fence.lang == "sh" || fence.lang == "console" {
                let joined = fence.body.replace("\\\n", " ");
                commands.extend(joined.lines().map(|l| {
                    l.trim_start_matches("$ ")
                        .trim_start_matches("> ")
                        .to_string()
                }));
            }
        }
        for command in commands {
            let command = command.split(" #").next().unwrap_or_default();
            // Each command of a line (`a && b`, `a | b`).
            for part in command.split(['|', ';', '&', '(', ')']) {
                let words: Vec<&str> = part.split_whitespace().collect();
                let Some(bin) = words.first() else { continue };
                if !["sidecar", "sidecarctl", "gnn-worker"].contains(bin) {
                    continue;
                }
                let help = help_along(bin, &words[1..], &mut cache);
                for flag in words[1..]
                    .iter()
                    .flat_map(|w| w.split(['[', ']', '=']))
                    .filter(|w| w.starts_with("--") && w.len() > 2)
                    .map(|w| w.trim_end_matches([',', '.', ')', '`', '"']))
                {
                    checked += 1;
                    if !tests::docs::help_names_flag(&help, flag) {
                        wrong.push(format!("{}: `{}`: {flag}", doc.display(), part.trim()));
                    }
                }
            }
        }
    }
    assert!(checked > 50, "only {checked} flags found");
    assert!(
        wrong.is_empty(),
        "flags the docs give commands that do not have them:\n{}",
        wrong.join("\n")
    );
}

#[test]
fn the_ladder_s_rule_is_stated_as_the_worker_applies_it() {
    // gnn-worker/src/ladder.rs: a rung's estimate must fit half the time
    // left (its unit tests check the choice); both docs that state the rule
    // say so.
    let code = read("gnn-worker/src/ladder.rs");
    assert!(code.contains("An estimate must fit half the time left."));
    for doc in ["docs/serving.md", "docs/strategies.md"] {
        let text = read(doc).replace('\n', " ");
        assert!(
            text.contains("estimate fits half"),
            "{doc} does not say that a rung's estimate must fit half the time left"
        );
        assert!(
            !text.contains("estimate fits the time left"),
            "{doc} says a rung's estimate must fit the time left; it must fit half of it"
        );
    }
}
