//! A dataset directory's meta.json and a data directory's features.json,
//! as `sidecar import` and `sidecar serve` read them.
#![no_main]

mod common;

use libfuzzer_sys::fuzz_target;
use sidecar::features::import::FeatureManifest;
use sidecar::graph::dataset::DatasetMeta;

fuzz_target!(|bytes: &[u8]| {
    let dir = common::scratch();
    std::fs::write(dir.join("meta.json"), bytes).expect("write meta.json");
    let _ = DatasetMeta::read(dir);
    std::fs::write(dir.join(FeatureManifest::FILE), bytes).expect("write features.json");
    let _ = FeatureManifest::read(dir);
});
