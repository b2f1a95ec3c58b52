//! The Open Inference Protocol (KServe's V2 protocol, which Triton, KServe,
//! Seldon MLServer and TorchServe speak) beside the worker's own API, on
//! the same ports and through the same [`crate::service::Service`]
//! (docs/serving.md, "The Open Inference Protocol"):
//!
//! - [`call`]: the protocol's tensors in the worker's terms (the model a
//!   call names, its inputs as the native call, the outputs built from the
//!   native answer, the errors);
//! - [`grpc`]: `inference.GRPCInferenceService` on the gRPC port;
//! - [`http`]: `/v2/...` on the HTTP port, with the binary tensor data
//!   extension.

pub mod call;
pub mod grpc;
pub mod http;
