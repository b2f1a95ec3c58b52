//! The repository's documents as test input: which files are docs, and
//! their fenced code blocks (docs/examples.md says how an example is
//! written and run).

use std::path::{Path, PathBuf};

use crate::stack::repo_root;

/// The documents whose examples run in CI: README.md, ARCHITECTURE.md,
/// the Python client's README and every `docs/*.md`, relative to the
/// repository root, sorted.
pub fn documents() -> Vec<PathBuf> {
    let root = repo_root();
    let mut docs = vec![
        PathBuf::from("README.md"),
        PathBuf::from("ARCHITECTURE.md"),
        PathBuf::from("clients/python/README.md"),
    ];
    let mut more: Vec<PathBuf> = std::fs::read_dir(root.join("docs"))
        .expect("docs/")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "md"))
        .map(|p| {
            p.strip_prefix(&root)
                .expect("inside the repository")
                .to_path_buf()
        })
        .collect();
    more.sort();
    docs.extend(more);
    docs
}

/// One fenced code block of a document.
#[derive(Debug, Clone)]
pub struct Fence {
    /// The document, relative to the repository root.
    pub doc: PathBuf,
    /// The 1-based line of the opening fence.
    pub line: usize,
    /// The info string's first word (`sh`, `console`, `python`, ...).
    pub lang: String,
    /// The info string's further words (`stack`, `synopsis`).
    pub attributes: Vec<String>,
    /// The lines between the fences, the fence's indentation removed.
    pub body: String,
}

impl Fence {
    /// `docs/serving.md:3`: how a report names the example.
    pub fn name(&self) -> String {
        format!("{}:{}", self.doc.display(), self.line)
    }
}

/// The fenced blocks of `doc` (relative to the repository root), in order.
/// Panics on a fence left open: the rest of the document would be read as
/// code.
pub fn fences(doc: &Path) -> Vec<Fence> {
    let text = std::fs::read_to_string(repo_root().join(doc))
        .unwrap_or_else(|e| panic!("reading {}: {e}", doc.display()));
    let mut found = Vec::new();
    // The block being read: its fence so far, the fence's indentation, its
    // lines.
    let mut open: Option<(Fence, usize, Vec<String>)> = None;
    for (i, line) in text.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        let is_fence = trimmed.starts_with("```");
        match open.take() {
            None if is_fence => {
                let mut words = trimmed[3..].split_whitespace().map(str::to_string);
                let fence = Fence {
                    doc: doc.to_path_buf(),
                    line: i + 1,
                    lang: words.next().unwrap_or_default(),
                    attributes: words.collect(),
                    body: String::new(),
                };
                open = Some((fence, indent, Vec::new()));
            }
            None => {}
            Some((mut fence, _, body)) if is_fence && trimmed.trim() == "```" => {
                fence.body = body.join("\n");
                found.push(fence);
            }
            Some((fence, fence_indent, mut body)) => {
                let cut = fence_indent.min(indent);
                body.push(line[cut..].to_string());
                open = Some((fence, fence_indent, body));
            }
        }
    }
    if let Some((fence, ..)) = open {
        panic!("{}: a code fence is never closed", fence.name());
    }
    found
}

/// Whether a `--help` text names `flag` as a word (`--batch` is not
/// `--batch-size`).
pub fn help_names_flag(help: &str, flag: &str) -> bool {
    help.match_indices(flag).any(|(at, _)| {
        let next = help[at + flag.len()..].chars().next();
        !next.is_some_and(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
    })
}
