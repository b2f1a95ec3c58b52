//! The model worker: serves predictions to clients, batches their requests,
//! submits target ids to the sidecar's ring and runs the ONNX model directly
//! on the Arrow buffers the sidecar wrote into shared memory.
//!
//! What exists so far is the ring client it uses (`protocol::client`); the
//! model runtime, the batcher and the gRPC/HTTP front arrive with the issue
//! that builds them.
//!
//! **Architecture invariant:** depends on `protocol`, never on `sidecar`; no
//! RocksDB or Redis here.
#![forbid(unsafe_code)]
