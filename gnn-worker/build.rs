//! Generates the gRPC types from proto/predictor.proto, and its descriptor
//! set for gRPC server reflection. Needs `protoc` (the
//! Debian package protobuf-compiler; scripts/setup.sh installs it) or
//! PROTOC pointing at one.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    println!("cargo:rerun-if-changed=proto/predictor.proto");
    // The descriptor set is what gRPC server reflection serves.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("gnn_descriptor.bin"))
        .compile_protos(&["proto/predictor.proto"], &["proto"])?;
    Ok(())
}
