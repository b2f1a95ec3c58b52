//! A frame on the admin socket, as the sidecar reads it (docs/admin.md).
#![no_main]

use libfuzzer_sys::fuzz_target;
use sidecar::admin::wire::{read_frame, AdminRequest, AdminResponse};

fuzz_target!(|bytes: &[u8]| {
    let _ = read_frame::<AdminRequest>(&mut &bytes[..]);
    // sidecarctl reads the answers.
    let _ = read_frame::<AdminResponse>(&mut &bytes[..]);
});
