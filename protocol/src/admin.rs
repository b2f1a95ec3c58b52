//! The admin wire format: what `sidecarctl` and the sidecar's admin Unix
//! socket exchange.
//!
//! A frame is a u32 little-endian length followed by that many bytes of a
//! `bincode` 2 (standard configuration, serde) encoding of an
//! [`AdminRequest`] or [`AdminResponse`]. The first frame each way is the
//! handshake: the client sends [`AdminRequest::Hello`] with its
//! [`ADMIN_VERSION`]; the sidecar answers [`AdminResponse::Hello`] or, for
//! another version, an [`AdminResponse::Error`] naming both versions, and
//! closes. Then any number of request/response pairs, in order.
//!
//! bincode is pinned (`=2.0.1`) and used only in this module.

use std::io::{self, Read, Write};

use serde::{Deserialize, Serialize};

/// Version of the admin frames; bumped on any incompatible change.
pub const ADMIN_VERSION: u32 = 1;

/// Largest frame either side accepts (a graph update with features).
pub const MAX_FRAME_BYTES: u32 = 64 << 20;

/// A request to the sidecar.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminRequest {
    Hello {
        version: u32,
    },
    /// Counters and configuration.
    Status,
    /// Adds nodes (with their feature rows) and edges while serving. Rows
    /// are written to the feature store first, then the graph snapshot that
    /// makes them reachable is published.
    AddNodes {
        nodes: Vec<NewNode>,
        edges: Vec<(u64, u64)>,
        /// Add the reverse of every edge too.
        undirected: bool,
    },
    /// Evicts rows from L1 (and from an L2 cache).
    Invalidate {
        ids: Vec<u64>,
    },
    /// Drains and stops the sidecar.
    Shutdown,
}

/// A node added while serving.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NewNode {
    pub id: u64,
    /// Its feature row (the segment's feature dim).
    pub features: Vec<f32>,
}

/// The sidecar's answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum AdminResponse {
    Hello {
        version: u32,
        server: String,
    },
    Status(StatusReport),
    Updated {
        nodes_added: u64,
        edges_added: u64,
        n_nodes: u64,
        generation: u64,
    },
    Invalidated {
        ids: u64,
    },
    ShuttingDown,
    Error {
        message: String,
    },
}

/// What `sidecarctl status` shows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    pub shm_name: String,
    pub ready: bool,
    pub uptime_s: f64,
    pub feature_dim: u32,
    pub graph_version: u64,
    pub n_nodes: u64,
    pub n_edges: u64,
    pub graph_generation: u64,
    /// (name, value) counters: batches, requests, tier hits, fallbacks.
    pub counters: Vec<(String, u64)>,
}

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum FrameError {
    #[error("connection closed")]
    Closed,
    #[error("frame of {0} bytes exceeds the {MAX_FRAME_BYTES} byte limit")]
    TooLarge(u32),
    #[error("malformed admin frame: {0}")]
    Malformed(String),
    #[error(transparent)]
    Io(#[from] io::Error),
}

/// Writes one frame.
pub fn write_frame(w: &mut impl Write, message: &impl Serialize) -> Result<(), FrameError> {
    let body = bincode::serde::encode_to_vec(message, bincode::config::standard())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    let len = u32::try_from(body.len())
        .ok()
        .filter(|&n| n <= MAX_FRAME_BYTES)
        .ok_or(FrameError::TooLarge(u32::MAX))?;
    w.write_all(&len.to_le_bytes())?;
    w.write_all(&body)?;
    w.flush()?;
    Ok(())
}

/// Reads one frame; [`FrameError::Closed`] on a clean end of stream before
/// the length.
pub fn read_frame<T: for<'de> Deserialize<'de>>(r: &mut impl Read) -> Result<T, FrameError> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len) {
        Ok(()) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Err(FrameError::Closed),
        Err(e) => return Err(e.into()),
    }
    let len = u32::from_le_bytes(len);
    if len > MAX_FRAME_BYTES {
        return Err(FrameError::TooLarge(len));
    }
    let mut body = vec![0u8; len as usize];
    r.read_exact(&mut body)?;
    let (message, used) = bincode::serde::decode_from_slice(&body, bincode::config::standard())
        .map_err(|e| FrameError::Malformed(e.to_string()))?;
    if used != body.len() {
        return Err(FrameError::Malformed(format!(
            "{} trailing bytes after the message",
            body.len() - used
        )));
    }
    Ok(message)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_bad_bytes_are_errors() {
        let request = AdminRequest::AddNodes {
            nodes: vec![NewNode {
                id: 7,
                features: vec![1.0, 2.5],
            }],
            edges: vec![(7, 1)],
            undirected: true,
        };
        let mut buf = Vec::new();
        write_frame(&mut buf, &request).unwrap();
        assert_eq!(read_frame::<AdminRequest>(&mut &buf[..]).unwrap(), request);
        // Truncated, oversized, garbage, empty.
        assert!(read_frame::<AdminRequest>(&mut &buf[..buf.len() - 1]).is_err());
        let huge = (MAX_FRAME_BYTES + 1).to_le_bytes();
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &huge[..]),
            Err(FrameError::TooLarge(_))
        ));
        let garbage = [3u8, 0, 0, 0, 0xff, 0xff, 0xff];
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &garbage[..]),
            Err(FrameError::Malformed(_))
        ));
        assert!(matches!(
            read_frame::<AdminRequest>(&mut &[][..]),
            Err(FrameError::Closed)
        ));
    }
}
