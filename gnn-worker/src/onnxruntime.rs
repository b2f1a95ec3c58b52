//! Loading the ONNX Runtime shared library (`load-dynamic`): the one the
//! `onnxruntime==1.31.1` Python wheel ships (or the GPU build of the same
//! version), so nothing is downloaded at build or run time.
//!
//! Where it comes from, in order: the `onnxruntime_lib` setting (flag,
//! `GNN_WORKER_ONNXRUNTIME_LIB`, config file), `$ORT_DYLIB_PATH`, then
//! [`LIBRARY`] by name: beside the executable, then the system's library
//! path (`LD_LIBRARY_PATH`, the `ld.so` cache, /lib and /usr/lib). The
//! worker never goes looking for a Python environment.

use std::path::{Path, PathBuf};

use anyhow::Context;

/// The library file the wheel ships in `onnxruntime/capi/`.
pub const LIBRARY: &str = "libonnxruntime.so.1.31.1";

/// The library to load: `explicit`, else `$ORT_DYLIB_PATH`, else
/// [`LIBRARY`] by name (resolved by the dynamic loader).
pub fn library_path(explicit: Option<&Path>) -> PathBuf {
    if let Some(path) = explicit {
        return path.to_path_buf();
    }
    if let Some(path) = std::env::var_os("ORT_DYLIB_PATH") {
        return PathBuf::from(path);
    }
    PathBuf::from(LIBRARY)
}

/// Loads the library and builds the process-wide environment.
pub fn init(explicit: Option<&Path>) -> anyhow::Result<ort::environment::Environment> {
    let path = library_path(explicit);
    let fix = || {
        if path.is_absolute() {
            format!(
                "loading ONNX Runtime from {}: check the path (onnxruntime_lib or \
                 ORT_DYLIB_PATH)",
                path.display()
            )
        } else {
            format!(
                "loading ONNX Runtime ({}) from the system library path: install \
                 onnxruntime==1.31.1's library there, or point onnxruntime_lib \
                 (--onnxruntime-lib, GNN_WORKER_ONNXRUNTIME_LIB) or ORT_DYLIB_PATH at it",
                path.display()
            )
        }
    };
    let builder = ort::init_from(&path).with_context(fix)?;
    builder
        .with_name("gnn-worker")
        .build()
        .with_context(|| format!("starting ONNX Runtime from {}", path.display()))
}
