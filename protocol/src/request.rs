//! The request a worker writes into a slot: a [`RequestHeader`] and the
//! target node ids after it.

use std::mem::size_of;

use crate::layout::{
    align_up, request_flags, FeatureSchema, Geometry, RequestHeader, MAX_HOPS, SLOT_ALIGN,
};

/// Offset of the target ids in the request area.
pub const TARGETS_OFFSET: usize = size_of::<RequestHeader>();

/// Bytes of request area a segment needs for `max_targets` targets, whole
/// pages (4096 bytes) so that the response area after it starts on a page
/// and each process can map the areas its peer writes read-only.
pub fn request_bytes_for(max_targets: u32) -> Option<u64> {
    let targets = u64::from(max_targets).checked_mul(8)?;
    align_up(
        (TARGETS_OFFSET as u64).checked_add(targets)?,
        SLOT_ALIGN as u64,
    )
}

/// The bytes of a request area holding `request` (its header and targets),
/// for the client to copy in.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn encoded(
    request_id: u64,
    deadline_mono_ns: u64,
    fanouts: [u32; MAX_HOPS],
    flags: u32,
    targets: &[u64],
) -> Vec<u8> {
    let mut area = vec![0u8; TARGETS_OFFSET + targets.len() * 8];
    encode(
        &mut area,
        request_id,
        deadline_mono_ns,
        fanouts,
        flags,
        targets,
    );
    area
}

/// A request as the sidecar sees it after validation: fanouts resolved
/// against the segment defaults and checked against the caps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub request_id: u64,
    /// CLOCK_MONOTONIC nanoseconds; 0 = the sidecar's default deadline.
    pub deadline_mono_ns: u64,
    pub fanouts: [u32; MAX_HOPS],
    /// The hops whose fanout the client left at 0 ("the sidecar's choice"):
    /// `fanouts` holds the segment default there, which a sidecar may
    /// replace with its current setting.
    pub defaulted: [bool; MAX_HOPS],
    /// `OWN_ROWS_ONLY`: the targets' rows, no neighbours.
    pub own_rows_only: bool,
    pub targets: Vec<u64>,
}

impl Request {
    /// Time left before the request's deadline, on CLOCK_MONOTONIC: `None`
    /// when the client set none (use the sidecar's default), `Some(ZERO)` once
    /// it has passed.
    pub fn remaining(&self) -> Option<std::time::Duration> {
        self.remaining_at(mono_now_ns())
    }

    fn remaining_at(&self, now_ns: u64) -> Option<std::time::Duration> {
        (self.deadline_mono_ns != 0)
            .then(|| std::time::Duration::from_nanos(self.deadline_mono_ns.saturating_sub(now_ns)))
    }
}

/// Why a request read from a slot is refused. Every variant is the client's
/// mistake (or a hostile client's), answered with `INVALID_REQUEST`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RequestError {
    #[error("request has {n_targets} targets; the segment allows at most {max_targets}")]
    TooManyTargets { n_targets: u32, max_targets: u32 },
    #[error(
        "request fanout {fanout} for hop {hop} exceeds the cap {cap}; ask for at most {cap} or \
         raise the sidecar's max fanout"
    )]
    FanoutAboveCap { hop: usize, fanout: u32, cap: u32 },
    #[error("request flags {flags:#x} contain bits this sidecar does not know")]
    UnknownFlags { flags: u32 },
    #[error(
        "request bytes 32..64 (reserved) are not zero: the client writes a newer layout than \
         this sidecar's"
    )]
    ReservedNotZero,
}

/// Writes `request` into a request area (the caller holds the slot CLAIMED).
/// The caller has already checked `targets.len() <= max_targets`, which the
/// area was sized for.
#[cfg_attr(loom, allow(dead_code))]
pub(crate) fn encode(
    area: &mut [u8],
    request_id: u64,
    deadline_mono_ns: u64,
    fanouts: [u32; MAX_HOPS],
    flags: u32,
    targets: &[u64],
) {
    let header = RequestHeader {
        request_id,
        deadline_mono_ns,
        n_targets: targets.len() as u32,
        fanouts,
        flags,
        _reserved: [0; 32],
    };
    area[..TARGETS_OFFSET].copy_from_slice(bytemuck::bytes_of(&header));
    let ids = &mut area[TARGETS_OFFSET..TARGETS_OFFSET + targets.len() * 8];
    for (chunk, id) in ids.chunks_exact_mut(8).zip(targets) {
        chunk.copy_from_slice(&id.to_le_bytes());
    }
}

/// Reads and validates a request from a request area. Never panics, whatever
/// the bytes.
pub fn decode(
    area: &[u8],
    geometry: &Geometry,
    schema: &FeatureSchema,
) -> Result<Request, RequestError> {
    // The area is request_bytes long, validated at attach/create to hold
    // the header and max_targets ids; check anyway rather than index blindly.
    let Some(head) = area.get(..TARGETS_OFFSET) else {
        return Err(RequestError::TooManyTargets {
            n_targets: 0,
            max_targets: geometry.max_targets,
        });
    };
    let header: RequestHeader = bytemuck::pod_read_unaligned(head);
    if header.flags & !request_flags::KNOWN != 0 {
        return Err(RequestError::UnknownFlags {
            flags: header.flags,
        });
    }
    if header._reserved != [0; 32] {
        return Err(RequestError::ReservedNotZero);
    }
    if header.n_targets > geometry.max_targets {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    }
    let mut fanouts = [0; MAX_HOPS];
    let mut defaulted = [false; MAX_HOPS];
    for (hop, fanout) in fanouts.iter_mut().enumerate() {
        let asked = header.fanouts[hop];
        defaulted[hop] = asked == 0;
        let cap = geometry.max_fanouts[hop];
        *fanout = if asked == 0 {
            schema.default_fanouts[hop]
        } else {
            asked
        };
        if *fanout > cap {
            return Err(RequestError::FanoutAboveCap {
                hop: hop + 1,
                fanout: *fanout,
                cap,
            });
        }
    }
    let end = TARGETS_OFFSET + header.n_targets as usize * 8;
    let Some(ids) = area.get(TARGETS_OFFSET..end) else {
        return Err(RequestError::TooManyTargets {
            n_targets: header.n_targets,
            max_targets: geometry.max_targets,
        });
    };
    let targets = ids
        .chunks_exact(8)
        .map(|c| u64::from_le_bytes(c.try_into().expect("chunks of 8")))
        .collect();
    Ok(Request {
        request_id: header.request_id,
        deadline_mono_ns: header.deadline_mono_ns,
        fanouts,
        defaulted,
        own_rows_only: header.flags & request_flags::OWN_ROWS_ONLY != 0,
        targets,
    })
}

/// CLOCK_MONOTONIC now, in nanoseconds: the clock of request deadlines. Both
/// containers of a pod share the kernel's monotonic clock (Kubernetes does not
/// create time namespaces).
pub fn mono_now_ns() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|ts| ts.tv_sec() as u64 * 1_000_000_000 + ts.tv_nsec() as u64)
        .unwrap_or(0)
}

#[cfg(all(test, not(loom)))]
mod tests {
    use std::time::Duration;

    use super::*;

    #[test]
    fn remaining_time_follows_the_deadline() {
        let mut request = Request {
            request_id: 1,
            deadline_mono_ns: 0,
            fanouts: [1, 1],
            defaulted: [false; 2],
            own_rows_only: false,
            targets: vec![],
        };
        assert_eq!(request.remaining_at(5_000), None, "no deadline");
        request.deadline_mono_ns = 8_000;
        assert_eq!(
            request.remaining_at(5_000),
            Some(Duration::from_nanos(3_000))
        );
        assert_eq!(request.remaining_at(9_000), Some(Duration::ZERO), "passed");
        assert!(mono_now_ns() > 0);
    }
}

/// Parses fanouts written as `f1,f2` (command lines of both processes).
pub fn parse_fanouts(text: &str) -> Result<[u32; MAX_HOPS], String> {
    let bad = || format!("{text:?}: expected two numbers such as 20,10");
    let (a, b) = text.split_once(',').ok_or_else(bad)?;
    match (a.trim().parse(), b.trim().parse()) {
        (Ok(a), Ok(b)) => Ok([a, b]),
        _ => Err(bad()),
    }
}
