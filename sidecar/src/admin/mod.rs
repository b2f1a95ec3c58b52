//! The operator's admin socket: the wire format ([`wire`]) that `sidecarctl`
//! and the sidecar exchange, and the sidecar's side of it ([`server`]).
//! Only the sidecar and `sidecarctl` speak it, so it lives here and not in
//! `protocol` (the ring contract both processes link).

pub mod server;
pub mod wire;
