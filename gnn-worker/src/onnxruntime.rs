//! Finding and loading the ONNX Runtime shared library (`load-dynamic`): the
//! one the `onnxruntime==1.31.1` Python wheel ships, so nothing is
//! downloaded at build or run time.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};

/// The library file the wheel ships in `onnxruntime/capi/`.
pub const LIBRARY: &str = "libonnxruntime.so.1.31.1";

/// `explicit`, else `$ORT_DYLIB_PATH`, else `.venv/lib/python3*/site-packages/
/// onnxruntime/capi/` under the current directory or any ancestor of it or
/// of the executable.
pub fn find_library(explicit: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(path) = explicit {
        return Ok(path.to_path_buf());
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        return Ok(PathBuf::from(path));
    }
    let mut bases: Vec<PathBuf> = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        bases.extend(cwd.ancestors().map(Path::to_path_buf));
    }
    if let Ok(exe) = std::env::current_exe() {
        bases.extend(exe.ancestors().skip(1).map(Path::to_path_buf));
    }
    for base in bases {
        let lib = base.join(".venv/lib");
        let Ok(entries) = std::fs::read_dir(&lib) else {
            continue;
        };
        for entry in entries.flatten() {
            let candidate = entry
                .path()
                .join("site-packages/onnxruntime/capi")
                .join(LIBRARY);
            if candidate.is_file() {
                return Ok(candidate);
            }
        }
    }
    bail!(
        "{LIBRARY} not found: install onnxruntime==1.31.1 into the project's .venv \
         (scripts/setup.sh does), set ORT_DYLIB_PATH, or pass --onnxruntime-lib"
    )
}

/// Loads the library and builds the process-wide environment.
pub fn init(explicit: Option<&Path>) -> anyhow::Result<ort::environment::Environment> {
    let path = find_library(explicit)?;
    let builder = ort::init_from(&path)
        .with_context(|| format!("loading ONNX Runtime from {}", path.display()))?;
    builder
        .with_name("gnn-worker")
        .build()
        .with_context(|| format!("starting ONNX Runtime from {}", path.display()))
}
