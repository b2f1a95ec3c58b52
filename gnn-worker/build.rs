//! Generates the gRPC types from proto/predictor.proto (`gnn.v1`) and from
//! KServe's third_party/kserve/grpc_predict_v2.proto (`inference`, the Open
//! Inference Protocol), and their descriptor set for gRPC server
//! reflection. Needs `protoc` (the Debian package protobuf-compiler;
//! scripts/setup.sh installs it) or PROTOC pointing at one.
fn main() -> Result<(), Box<dyn std::error::Error>> {
    const V2: &str = "../third_party/kserve/grpc_predict_v2.proto";
    println!("cargo:rerun-if-changed=proto/predictor.proto");
    println!("cargo:rerun-if-changed={V2}");
    // The descriptor sets are what gRPC server reflection serves.
    let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?);
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("gnn_descriptor.bin"))
        .compile_protos(&["proto/predictor.proto"], &["proto"])?;
    tonic_prost_build::configure()
        .file_descriptor_set_path(out.join("inference_descriptor.bin"))
        .compile_protos(&[V2], &["../third_party/kserve"])?;
    Ok(())
}
