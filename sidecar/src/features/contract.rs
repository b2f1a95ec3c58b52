//! The feature-store contract: how a row is named and encoded.
//!
//! - Redis: one key per node, `<prefix><node id in decimal>` (default prefix
//!   `feat:`); the value is the row's raw little-endian bytes: `dim` f32, so
//!   exactly `4 * dim` bytes. This is what an offline pipeline writes.
//! - RocksDB: key = the node id as 8 big-endian bytes (ordered by id);
//!   value = 8 bytes little-endian expiry (Unix seconds, 0 = never) followed
//!   by the row's raw little-endian bytes.
//!
//! A value of the wrong length is not a row: it is treated as missing (and
//! counted), never as a truncated or padded row.

/// Default Redis key prefix.
pub const DEFAULT_PREFIX: &str = "feat:";

/// The Redis key of `node`.
pub fn redis_key(prefix: &str, node: u64) -> String {
    format!("{prefix}{node}")
}

/// Decodes a row of `dim` f32 from little-endian bytes into `out`.
/// Returns false (and leaves `out` alone) if the length is wrong.
pub fn decode_row(bytes: &[u8], out: &mut [f32]) -> bool {
    if bytes.len() != out.len() * 4 {
        return false;
    }
    for (value, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = f32::from_le_bytes(chunk.try_into().expect("chunks of 4"));
    }
    true
}

/// The little-endian bytes of a row.
pub fn encode_row(row: &[f32]) -> Vec<u8> {
    let mut bytes = Vec::with_capacity(row.len() * 4);
    for value in row {
        bytes.extend_from_slice(&value.to_le_bytes());
    }
    bytes
}

/// The RocksDB key of `node`.
pub fn rocks_key(node: u64) -> [u8; 8] {
    node.to_be_bytes()
}

/// A RocksDB value: expiry then row bytes.
pub fn rocks_value(expires_at: u64, row_bytes: &[u8]) -> Vec<u8> {
    let mut value = Vec::with_capacity(8 + row_bytes.len());
    value.extend_from_slice(&expires_at.to_le_bytes());
    value.extend_from_slice(row_bytes);
    value
}

/// Splits a RocksDB value into (expiry, row bytes); `None` if too short.
pub fn split_rocks_value(value: &[u8]) -> Option<(u64, &[u8])> {
    let (expiry, row) = value.split_at_checked(8)?;
    Some((u64::from_le_bytes(expiry.try_into().ok()?), row))
}

/// The Redis Cluster hash slot of a key: CRC16 (XMODEM) of the key, or of
/// its `{hash tag}` if it has a non-empty one, modulo 16384.
pub fn cluster_slot(key: &[u8]) -> u16 {
    let hashed = match key.iter().position(|&b| b == b'{') {
        Some(open) => match key[open + 1..].iter().position(|&b| b == b'}') {
            Some(len) if len > 0 => &key[open + 1..open + 1 + len],
            _ => key,
        },
        None => key,
    };
    crc16_xmodem(hashed) % 16384
}

fn crc16_xmodem(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_cluster_slot_follows_the_redis_specification() {
        // The test vector of the Redis Cluster specification.
        assert_eq!(crc16_xmodem(b"123456789"), 0x31C3);
        assert_eq!(cluster_slot(b"foo"), 12182);
        assert_eq!(
            cluster_slot(b"{user1000}.following"),
            cluster_slot(b"user1000")
        );
        assert_eq!(cluster_slot(b"foo{}{bar}"), cluster_slot(b"foo{}{bar}"));
        assert_ne!(
            cluster_slot(b"foo{}{bar}"),
            cluster_slot(b"bar"),
            "empty tag: whole key"
        );
    }

    #[test]
    fn rows_round_trip_and_wrong_lengths_are_refused() {
        let row = [1.5f32, -2.0, 0.0];
        let bytes = encode_row(&row);
        let mut out = [9.0f32; 3];
        assert!(decode_row(&bytes, &mut out));
        assert_eq!(out, row);
        let mut short = [9.0f32; 4];
        assert!(!decode_row(&bytes, &mut short));
        assert_eq!(short, [9.0; 4], "left alone");
        let value = rocks_value(77, &bytes);
        assert_eq!(split_rocks_value(&value), Some((77, &bytes[..])));
        assert_eq!(split_rocks_value(&[1, 2]), None);
    }
}
