//! Creating and attaching to real segments in /dev/shm.
#![cfg(not(loom))]

use std::mem::offset_of;
use std::os::unix::fs::PermissionsExt;
use std::sync::atomic::Ordering;
use std::time::Duration;

use protocol::layout::{dtype, server_state, FeatureSchema, Header, TypeDesc};
use protocol::{AttachError, CreateError, Segment, SegmentConfig};

fn name(tag: &str) -> String {
    format!("gnn-segtest-{tag}-{}", std::process::id())
}

fn config(name: &str) -> SegmentConfig {
    let schema = FeatureSchema {
        feature_dim: 8,
        dtype: dtype::F32,
        graph_version: 3,
        default_fanouts: [4, 2],
    };
    let mut cfg = SegmentConfig::new(name, schema);
    cfg.slot_count = 4;
    cfg.response_bytes = 64 * 1024;
    cfg.stale_after = Duration::from_millis(200);
    cfg
}

fn mode_of(name: &str) -> u32 {
    std::fs::metadata(format!("/dev/shm/{name}"))
        .unwrap()
        .permissions()
        .mode()
        & 0o777
}

#[test]
fn create_sets_the_mode_exactly_and_attach_sees_the_same_geometry() {
    let n = name("mode");
    let created = Segment::create(&config(&n)).unwrap();
    assert_eq!(
        mode_of(&n),
        0o600,
        "default mode is 0600 whatever the umask"
    );
    let attached = Segment::attach(&n).unwrap();
    assert_eq!(attached.geometry(), created.geometry());
    assert_eq!(attached.schema(), created.schema());
    assert_eq!(attached.epoch(), created.epoch());
    assert!(created.unlink().unwrap());

    let n = name("mode660");
    let mut cfg = config(&n);
    cfg.mode = 0o660;
    let created = Segment::create(&cfg).unwrap();
    assert_eq!(mode_of(&n), 0o660);
    created.unlink().unwrap();
}

#[test]
fn attach_to_a_missing_segment_says_how_to_fix_it() {
    let err = Segment::attach("gnn-segtest-nobody-here").unwrap_err();
    assert!(matches!(err, AttachError::NotFound { .. }));
    assert!(err.to_string().contains("--shm-name"), "{err}");
}

#[test]
fn bad_names_are_refused() {
    for bad in ["", "a/b", "../x", ".hidden", "sp ace"] {
        assert!(Segment::attach(bad).is_err(), "{bad:?}");
        assert!(
            matches!(
                Segment::create(&config(bad)),
                Err(CreateError::InvalidConfig(_))
            ),
            "{bad:?}"
        );
    }
}

/// Overwrites bytes of a live segment through the file.
fn patch(n: &str, offset: usize, bytes: &[u8]) {
    use std::io::{Seek, SeekFrom, Write};
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .open(format!("/dev/shm/{n}"))
        .unwrap();
    file.seek(SeekFrom::Start(offset as u64)).unwrap();
    file.write_all(bytes).unwrap();
}

/// Patches, then attaches, which must fail.
fn attach_after_patch(n: &str, offset: usize, bytes: &[u8]) -> AttachError {
    patch(n, offset, bytes);
    Segment::attach(n).unwrap_err()
}

#[test]
fn a_mismatch_names_the_field() {
    let n = name("mismatch");
    let created = Segment::create(&config(&n)).unwrap();

    // A different size for one shared type: the error names the type.
    let slot_control_desc = offset_of!(Header, types) + 5 * std::mem::size_of::<TypeDesc>();
    let err = attach_after_patch(&n, slot_control_desc + 32, &128u32.to_le_bytes());
    let text = err.to_string();
    assert!(text.contains("shared type SlotControl"), "{text}");
    assert!(
        text.contains("size 128") && text.contains("size 64"),
        "{text}"
    );
    assert!(text.contains("same release"), "says the fix: {text}");
    patch(&n, slot_control_desc + 32, &64u32.to_le_bytes());
    assert!(Segment::attach(&n).is_ok(), "restored");

    // Another layout version.
    let err = attach_after_patch(&n, 8, &99u32.to_le_bytes());
    assert!(
        err.to_string().contains(&format!(
            "layout version is 99, expected {}",
            protocol::LAYOUT_VERSION
        )),
        "{err}"
    );
    patch(&n, 8, &protocol::LAYOUT_VERSION.to_le_bytes());

    // A geometry that points past the end of the segment.
    let stride = offset_of!(Header, geometry) + 40;
    let err = attach_after_patch(&n, stride, &(1u64 << 30).to_le_bytes());
    assert!(
        matches!(
            err,
            AttachError::Invalid {
                field: "geometry",
                ..
            }
        ),
        "{err}"
    );

    // An unknown dtype in the feature schema.
    patch(&n, stride, &created.geometry().slot_stride.to_le_bytes());
    assert!(Segment::attach(&n).is_ok(), "restored");
    let err = attach_after_patch(&n, offset_of!(Header, schema) + 4, &9u32.to_le_bytes());
    assert!(err.to_string().contains("dtype code 9"), "{err}");
    patch(&n, offset_of!(Header, schema) + 4, &1u32.to_le_bytes());

    // A one-type graph's edge data: read from the header, refused past
    // its defined bits and widths.
    let data = offset_of!(Header, one_type_edge_data);
    patch(&n, data, &[3, 0, 0, 0, 2, 0, 0, 0]);
    let attached = Segment::attach(&n).unwrap();
    assert_eq!(
        attached.graph().edge_types[0].data,
        protocol::graph_schema::EdgeDataDesc {
            attr_dim: 3,
            weight: false,
            time: true
        }
    );
    drop(attached);
    let err = attach_after_patch(&n, data + 4, &4u32.to_le_bytes());
    assert!(err.to_string().contains("edge data flags 0x4"), "{err}");
    let err = attach_after_patch(&n, data, &[0, 0x20, 0, 0, 0, 0, 0, 0]);
    assert!(
        err.to_string().contains("attr_dim 8192, more than 4096"),
        "{err}"
    );

    created.unlink().unwrap();
}

#[test]
fn a_live_segment_is_not_taken_over_and_a_stale_one_is() {
    let n = name("takeover");
    let first = Segment::create(&config(&n)).unwrap();
    let heartbeat = &first.header().preamble.server_heartbeat;

    // Alive: the heartbeat moves while the second sidecar watches.
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|scope| {
        scope.spawn(|| {
            while !stop.load(Ordering::Relaxed) {
                heartbeat.fetch_add(1, Ordering::Release);
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        let err = Segment::create(&config(&n)).unwrap_err();
        stop.store(true, Ordering::Relaxed);
        assert!(matches!(err, CreateError::InUse { .. }), "{err}");
    });

    // Stale: the heartbeat stands still; the old segment is marked RETIRED
    // (so its workers give up at once) and replaced by a new epoch.
    let second = Segment::create(&config(&n)).unwrap();
    assert_ne!(second.epoch(), first.epoch());
    assert_eq!(
        first.header().preamble.server_state.load(Ordering::Acquire),
        server_state::RETIRED
    );
    // The replaced sidecar must not unlink its successor's segment.
    assert!(!first.unlink().unwrap());
    assert_eq!(Segment::attach(&n).unwrap().epoch(), second.epoch());
    assert!(second.unlink().unwrap());
}

#[test]
fn a_foreign_file_is_left_alone() {
    let n = name("foreign");
    let path = format!("/dev/shm/{n}");
    std::fs::write(&path, vec![0xAB; 8192]).unwrap();
    let err = Segment::create(&config(&n)).unwrap_err();
    assert!(matches!(err, CreateError::Foreign { .. }), "{err}");
    assert_eq!(std::fs::read(&path).unwrap()[0], 0xAB, "not modified");
    std::fs::remove_file(&path).unwrap();
}

/// A file without the magic that stays so for `stale_after`, empty or with
/// a zeroed header, is not taken over either: left alone, named.
#[test]
fn an_empty_or_zeroed_file_is_left_alone() {
    for (what, bytes) in [("empty", Vec::new()), ("zeroed", vec![0u8; 8192])] {
        let n = name(what);
        let path = format!("/dev/shm/{n}");
        std::fs::write(&path, &bytes).unwrap();
        let err = Segment::create(&config(&n)).unwrap_err();
        assert!(matches!(err, CreateError::Foreign { .. }), "{what}: {err}");
        assert!(err.to_string().contains(&n), "{err}");
        assert_eq!(std::fs::read(&path).unwrap(), bytes, "{what}: not modified");
        std::fs::remove_file(&path).unwrap();
    }
}

#[test]
fn invalid_configurations_are_refused_with_the_reason() {
    let n = name("badcfg");
    let mut cfg = config(&n);
    cfg.slot_count = 0;
    assert!(Segment::create(&cfg)
        .unwrap_err()
        .to_string()
        .contains("slot count 0"));
    let mut cfg = config(&n);
    cfg.schema.default_fanouts = [60, 2];
    assert!(Segment::create(&cfg)
        .unwrap_err()
        .to_string()
        .contains("default fanout of hop 1 is 60"));
    let mut cfg = config(&n);
    cfg.schema.dtype = 2;
    assert!(Segment::create(&cfg)
        .unwrap_err()
        .to_string()
        .contains("dtype code 2"));
    assert!(!std::path::Path::new(&format!("/dev/shm/{n}")).exists());
}

/// The protections of this process's mappings over `range` (from
/// /proc/self/maps), e.g. "rw-s" or "r--s".
fn protections_over(range: std::ops::Range<usize>) -> Vec<String> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    maps.lines()
        .filter_map(|line| {
            let (span, rest) = line.split_once(' ')?;
            let (a, b) = span.split_once('-')?;
            let (a, b) = (
                usize::from_str_radix(a, 16).ok()?,
                usize::from_str_radix(b, 16).ok()?,
            );
            (a < range.end && b > range.start).then(|| rest[..4].to_string())
        })
        .collect()
}

#[test]
fn each_side_maps_the_areas_its_peer_writes_read_only() {
    let n = name("protect");
    let created = Segment::create(&config(&n)).unwrap();
    let attached = Segment::attach(&n).unwrap();
    let g = *attached.geometry();
    assert_eq!(g.request_bytes % 4096, 0, "request areas are whole pages");
    assert!(created.protect_peer_areas(false).unwrap());
    assert!(attached.protect_peer_areas(true).unwrap());
    for slot in 0..g.slot_count as usize {
        let region = |segment: &Segment| {
            segment.address_range().start
                + (g.slot_data_offset + g.slot_stride * slot as u64) as usize
        };
        let (worker, sidecar) = (region(&attached), region(&created));
        let request = |base: usize| base..base + g.request_bytes as usize;
        let response = |base: usize| base + g.request_bytes as usize..base + g.slot_stride as usize;
        assert_eq!(protections_over(response(worker)), ["r--s"], "slot {slot}");
        assert_eq!(protections_over(request(worker)), ["rw-s"], "slot {slot}");
        assert_eq!(protections_over(request(sidecar)), ["r--s"], "slot {slot}");
        assert_eq!(protections_over(response(sidecar)), ["rw-s"], "slot {slot}");
    }
    assert!(created.unlink().unwrap());
}
