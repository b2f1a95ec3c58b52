//! Generates the gRPC types from proto/predictor.proto. Needs `protoc` (the
//! Debian package protobuf-compiler; scripts/setup.sh installs it) or
//! PROTOC pointing at one.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/predictor.proto");
    tonic_prost_build::compile_protos("proto/predictor.proto")?;
    Ok(())
}
