//! A `sidecar serve` configuration file (docs/configuration.md): loaded and
//! validated, or refused with an error.
#![no_main]

mod common;

use daemon_kit::config::Layered;
use libfuzzer_sys::fuzz_target;
use sidecar::config::{ServeConfig, SPEC};

#[derive(serde::Serialize)]
struct NoFlags {}

fuzz_target!(|bytes: &[u8]| {
    let path = common::scratch().join("sidecar.toml");
    std::fs::write(&path, bytes).expect("write the configuration file");
    let _ = Layered::<ServeConfig>::load_from(SPEC, Some(&path), &[], &NoFlags {});
});
