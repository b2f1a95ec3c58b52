//! A dataset directory's meta.json (with its `edge_data`) and a data
//! directory's features.json, as `sidecar import` and `sidecar serve` read
//! them.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use sidecar::features::import::FeatureManifest;
use sidecar::graph::build::EdgeDataSpec;
use sidecar::graph::dataset::DatasetMeta;

fuzz_target!(|bytes: &[u8]| {
    let dir = common::scratch();
    std::fs::write(dir.join("meta.json"), bytes).expect("write meta.json");
    if let Ok(meta) = DatasetMeta::read(dir) {
        if let Ok(spec) = EdgeDataSpec::from_json(meta.edge_data.as_ref()) {
            let _ = spec.files(dir);
        }
    }
    std::fs::write(dir.join(FeatureManifest::FILE), bytes).expect("write features.json");
    let _ = FeatureManifest::read(dir);
});
