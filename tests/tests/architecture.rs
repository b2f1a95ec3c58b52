//! The workspace's structure, checked on its sources: no module imports
//! form a loop inside a crate (ARCHITECTURE.md's invariant).
//!
//! A file's module imports another through `crate::a::b` or `super::x`
//! paths. Two modules are compared where their paths part: `serve::control`
//! importing `daemon::events` is an edge `serve -> daemon`, and
//! `serve::control` importing `serve::batch` an edge `control -> batch`
//! among `serve`'s children. A parent and its own child may use each other
//! (Rust's `super::`); siblings may not go round in a circle.
//!
//! And no new typed twin of one-type code: a `typed_*`/`*_typed` function
//! or `Typed*` type whose one-type name the same crate defines must be one
//! of the known twins ([`TYPED_TWINS`], each with its reason), which go as
//! the one-type graph becomes the 1x1 typed graph.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// `sidecar/src/serve/control.rs` -> ["serve", "control"];
/// `mod.rs`, `lib.rs` and `main.rs` name their folder.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap().with_extension("");
    let mut parts: Vec<String> = rel
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    if matches!(
        parts.last().map(String::as_str),
        Some("mod" | "lib" | "main")
    ) {
        parts.pop();
    }
    parts
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() && path.file_name().is_some_and(|n| n != "bin") {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The module paths a file's code names: `crate::x::y` and `super::z`
/// (with `super::super::` climbing further), cut to the modules that exist.
fn imports(text: &str, here: &[String], modules: &BTreeSet<Vec<String>>) -> Vec<Vec<String>> {
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut found = Vec::new();
    for (start, _) in text
        .match_indices("crate::")
        .chain(text.match_indices("super::"))
    {
        if start > 0 && text[..start].ends_with(|c: char| is_ident(c) || c == ':') {
            continue;
        }
        let mut base: Vec<String> = Vec::new();
        let mut rest = &text[start..];
        if let Some(r) = rest.strip_prefix("crate::") {
            rest = r;
        } else {
            base = here.to_vec();
            while let Some(r) = rest.strip_prefix("super::") {
                base.pop();
                rest = r;
            }
        }
        let mut path = base;
        for segment in rest.split("::") {
            let ident: String = segment.chars().take_while(|&c| is_ident(c)).collect();
            if ident.is_empty() {
                break;
            }
            path.push(ident.clone());
            if ident.len() != segment.len() {
                break;
            }
        }
        while !path.is_empty() && !modules.contains(&path) {
            path.pop();
        }
        found.push(path);
    }
    found
}

/// A cycle among the edges, if any.
fn cycle(edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    fn visit(
        node: &Vec<String>,
        edges: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        stack: &mut Vec<Vec<String>>,
        done: &mut BTreeSet<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        if let Some(i) = stack.iter().position(|n| n == node) {
            let mut loop_ = stack[i..].to_vec();
            loop_.push(node.clone());
            return Some(loop_);
        }
        if done.contains(node) {
            return None;
        }
        stack.push(node.clone());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(found) = visit(next, edges, stack, done) {
                return Some(found);
            }
        }
        stack.pop();
        done.insert(node.clone());
        None
    }
    let mut done = BTreeSet::new();
    edges
        .keys()
        .find_map(|node| visit(node, edges, &mut Vec::new(), &mut done))
}

/// Sibling edges of a crate: for each import, the two children of the
/// paths' common ancestor, unless one path is the ancestor itself.
fn sibling_edges(src: &Path) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let modules: BTreeSet<Vec<String>> = files.iter().map(|f| module_path(src, f)).collect();
    let mut edges: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for file in &files {
        let here = module_path(src, file);
        let text = std::fs::read_to_string(file).unwrap();
        // Unit tests may reach anywhere; comments (doc links) import nothing.
        let code: String = text
            .split("#[cfg(test)]")
            .next()
            .unwrap()
            .lines()
            .filter(|line| !line.trim_start().starts_with("//"))
            .collect::<Vec<_>>()
            .join("\n");
        for target in imports(&code, &here, &modules) {
            let common = here.iter().zip(&target).take_while(|(a, b)| a == b).count();
            if common == here.len() || common == target.len() {
                continue;
            }
            edges
                .entry(here[..=common].to_vec())
                .or_default()
                .insert(target[..=common].to_vec());
        }
    }
    edges
}

#[test]
fn no_module_imports_form_a_loop_inside_a_crate() {
    // This checkout's sources: a binary reused from a shared target
    // directory was compiled in another (repo_root says why).
    let root = tests::stack::repo_root();
    let mut checked = 0;
    for krate in [
        "protocol",
        "daemon-kit",
        "sidecar",
        "gnn-worker",
        "tests",
        "bench",
    ] {
        let src = root.join(krate).join("src");
        if !src.is_dir() {
            continue;
        }
        let edges = sibling_edges(&src);
        assert!(
            !edges.is_empty() || !["protocol", "sidecar", "gnn-worker"].contains(&krate),
            "no imports found in {krate}: the reader is broken"
        );
        if let Some(found) = cycle(&edges) {
            let shown: Vec<String> = found.iter().map(|m| m.join("::")).collect();
            panic!(
                "{krate}: modules import each other in a loop: {}",
                shown.join(" -> ")
            );
        }
        checked += 1;
    }
    assert!(
        checked >= 4,
        "only {checked} crates found under {}",
        root.display()
    );
}

#[test]
fn a_loop_is_found_when_there_is_one() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path();
    std::fs::create_dir_all(src.join("serve")).unwrap();
    std::fs::write(src.join("lib.rs"), "pub mod admin;\npub mod serve;\n").unwrap();
    std::fs::write(src.join("admin.rs"), "use crate::serve::run;\n").unwrap();
    std::fs::write(src.join("serve/mod.rs"), "pub mod batch;\nuse super::x;\n").unwrap();
    std::fs::write(
        src.join("serve/batch.rs"),
        "use crate::admin::Wire;\nuse super::run;\n",
    )
    .unwrap();
    let edges = sibling_edges(src);
    let found = cycle(&edges).expect("admin <-> serve is a loop");
    assert!(found.contains(&vec!["admin".to_string()]), "{found:?}");
    // Without admin's import there is none (serve::batch -> serve is a
    // child using its parent).
    std::fs::write(src.join("admin.rs"), "").unwrap();
    assert_eq!(cycle(&sibling_edges(src)), None);
}

/// The typed twins of one-type code that exist today, each with what it
/// is the twin of. The one-type graph is to be served as the 1x1 typed
/// graph, one path below every door; as each pair is merged its entry goes
/// (the test below fails on an entry that is no longer a twin), and a new
/// twin fails the test until it is built once for both graph kinds or
/// listed here with its reason.
const TYPED_TWINS: &[(&str, &str)] = &[];

/// Names a crate's product code defines: functions, and types (structs,
/// enums, traits, aliases), each as `(is_fn, name)`.
fn defined_names(src: &Path) -> BTreeSet<(bool, String)> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    let is_ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut names = BTreeSet::new();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap();
        let words: Vec<&str> = text
            .split(|c: char| !is_ident(c))
            .filter(|w| !w.is_empty())
            .collect();
        for pair in words.windows(2) {
            match pair[0] {
                "fn" => {
                    names.insert((true, pair[1].to_string()));
                }
                "struct" | "enum" | "trait" | "type" => {
                    names.insert((false, pair[1].to_string()));
                }
                _ => {}
            }
        }
    }
    names
}

/// Every `typed_*` or `*_typed` function and `Typed*` type whose one-type
/// name is defined in the same crate, and nothing else, is in
/// [`TYPED_TWINS`].
#[test]
fn no_typed_twin_of_one_type_code_beyond_the_known_ones() {
    let root = tests::stack::repo_root();
    let mut twins = BTreeSet::new();
    for krate in ["protocol", "sidecar", "gnn-worker", "daemon-kit"] {
        let names = defined_names(&root.join(krate).join("src"));
        for (is_fn, name) in &names {
            let one_type = if *is_fn {
                name.strip_prefix("typed_")
                    .or_else(|| name.strip_suffix("_typed"))
            } else {
                name.strip_prefix("Typed").filter(|rest| !rest.is_empty())
            };
            if let Some(one_type) = one_type {
                if names.contains(&(*is_fn, one_type.to_string())) {
                    twins.insert(name.clone());
                }
            }
        }
    }
    let allowed: BTreeSet<String> = TYPED_TWINS.iter().map(|(n, _)| n.to_string()).collect();
    let new: Vec<&String> = twins.difference(&allowed).collect();
    let merged: Vec<&String> = allowed.difference(&twins).collect();
    assert!(
        new.is_empty(),
        "typed twins of one-type code: {new:?}. Build the capability once for both graph \
         kinds (a one-type graph is the 1x1 typed graph), or list the name in TYPED_TWINS \
         with what it is the twin of"
    );
    assert!(
        merged.is_empty(),
        "TYPED_TWINS lists {merged:?}, no longer twins of one-type code: remove them"
    );
}
