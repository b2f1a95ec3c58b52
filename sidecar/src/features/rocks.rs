//! L2: feature rows in RocksDB on local disk (NVMe in production).
//!
//! Two roles:
//! - **store of record** (no Redis configured): written by `sidecar import`,
//!   rows never expire, no size bound; a corrupt store is refused with the
//!   fix (re-run the import), since nothing else holds the rows;
//! - **cache** in front of Redis: rows carry an expiry (the TTL bounds their
//!   staleness when an invalidation is lost), the size is bounded by FIFO
//!   compaction (the oldest files are dropped past the bound), and a store
//!   found corrupt at open is moved aside and rebuilt empty, with an error
//!   log and a counter: it is only a cache. It survives restarts, so a
//!   restarted sidecar serves warm.
//!
//! The directory is watched: if it is deleted or replaced while the store is
//! open (RocksDB would go on accepting writes into files nobody can find
//! again), [`RocksStore::directory_problem`] says so, the alarm is logged
//! once and raised as a metric, and every write is refused with an error
//! instead of being acknowledged and lost. Reads go on from the files still
//! open. Writes to the store of record are synced before they are
//! acknowledged.
//!
//! RocksDB calls block: callers run them on blocking threads.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rocksdb::{
    DBCompactionStyle, ErrorKind, FifoCompactOptions, Options, WriteBatch, WriteOptions, DB,
};

use crate::features::contract::{rocks_key, rocks_value, split_rocks_value};
use crate::graph::StreamPosition;

pub use crate::features::store::Role;

/// What opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// An existing store (or a new empty one) opened normally.
    Existing,
    /// The cache was corrupt: it was moved aside and recreated empty.
    Rebuilt,
}

/// A RocksDB-backed row store.
#[derive(Debug)]
pub struct RocksStore {
    db: DB,
    role: Role,
    path: PathBuf,
    /// Reads that failed (corruption, I/O) and were served as misses.
    pub read_errors: AtomicU64,
    /// Values of the wrong shape, served as misses.
    pub malformed: AtomicU64,
    /// (device, inode) of the directory when it was opened.
    identity: (u64, u64),
    /// Set once the directory was found deleted or replaced (logged once).
    alarmed: AtomicBool,
    /// Writes refused because of it.
    pub writes_refused: AtomicU64,
    /// Writes RocksDB failed (a full disk, an I/O error): never acknowledged.
    pub write_errors: AtomicU64,
    /// Whether the last write failed for want of space (the alarm gauge);
    /// its first failure of an episode is logged.
    no_space: AtomicBool,
}

/// Where the update-stream position is kept: not 8 bytes long, so never a
/// node's key.
const UPDATE_POSITION_KEY: &[u8] = b"\xffupdates-position";

/// Where the store of record keeps the fingerprint of the import that
/// filled it ([`crate::features::import::FeatureManifest::fingerprint`]).
const DATASET_KEY: &[u8] = b"\xffdataset";

fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl RocksStore {
    fn options(role: Role) -> Options {
        let mut options = Options::default();
        options.create_if_missing(true);
        options.set_paranoid_checks(true);
        options.increase_parallelism(2);
        if let Role::Cache { max_bytes, .. } = role {
            options.set_compaction_style(DBCompactionStyle::Fifo);
            let mut fifo = FifoCompactOptions::default();
            fifo.set_max_table_files_size(max_bytes);
            options.set_fifo_compaction_options(&fifo);
            // Keep memtables small relative to the bound.
            options.set_write_buffer_size((max_bytes / 8).clamp(1 << 20, 64 << 20) as usize);
        }
        options
    }

    /// Opens (or creates) the store at `path`.
    pub fn open(path: &Path, role: Role) -> anyhow::Result<(Self, Opened)> {
        let options = Self::options(role);
        let (db, opened) = match DB::open(&options, path) {
            Ok(db) => (db, Opened::Existing),
            Err(e) if is_lock_held(&e) => {
                return Err(anyhow::anyhow!(
                    "{} is in use by another process (its RocksDB LOCK is held): stop that \
                     process, or give this sidecar its own directory ({e})",
                    path.display()
                ))
            }
            Err(e) if role != Role::StoreOfRecord && is_damage(&e) => {
                // Moved aside, never deleted: whatever the directory holds
                // (an operator's mistaken --l2-dir included) survives.
                let aside = aside_path(path);
                tracing::error!(
                    path = %path.display(),
                    moved_to = %aside.display(),
                    error = %e,
                    "L2 feature cache is corrupt; moved it aside and rebuilding it empty \
                     (delete the moved directory once it is not needed)"
                );
                std::fs::rename(path, &aside).with_context(|| {
                    format!(
                        "moving the corrupt L2 cache {} aside to {}",
                        path.display(),
                        aside.display()
                    )
                })?;
                let db = DB::open(&options, path)
                    .with_context(|| format!("recreating the L2 cache at {}", path.display()))?;
                (db, Opened::Rebuilt)
            }
            Err(e) => {
                return Err(anyhow::anyhow!(
                    "feature store {} cannot be opened: {e}; if it is damaged, re-run \
                     `sidecar import` to rebuild it",
                    path.display()
                ))
            }
        };
        let meta = std::fs::metadata(path)
            .with_context(|| format!("reading {} after opening it", path.display()))?;
        Ok((
            Self {
                db,
                role,
                path: path.to_path_buf(),
                read_errors: AtomicU64::new(0),
                malformed: AtomicU64::new(0),
                identity: (meta.dev(), meta.ino()),
                alarmed: AtomicBool::new(false),
                writes_refused: AtomicU64::new(0),
                write_errors: AtomicU64::new(0),
                no_space: AtomicBool::new(false),
            },
            opened,
        ))
    }

    /// What is wrong with the store's directory, if anything: deleted, or
    /// replaced by another directory, since it was opened. Logs the first
    /// finding once.
    pub fn directory_problem(&self) -> Option<String> {
        let problem = match std::fs::metadata(&self.path) {
            Ok(meta) if (meta.dev(), meta.ino()) == self.identity => return None,
            Ok(_) => format!(
                "{} was replaced by another directory while the sidecar had it open",
                self.path.display()
            ),
            Err(e) => format!(
                "{} is gone while the sidecar had it open ({e})",
                self.path.display()
            ),
        };
        if !self.alarmed.swap(true, Ordering::AcqRel) {
            tracing::error!(
                path = %self.path.display(),
                problem = %problem,
                "feature store directory lost: reads go on from the files still open, \
                 writes are refused; restore the directory (`sidecar import`) and restart \
                 the sidecar"
            );
        }
        Some(problem)
    }

    /// Whether the directory was ever found lost (the alarm metric).
    pub fn alarmed(&self) -> bool {
        self.alarmed.load(Ordering::Acquire)
    }

    /// Refuses a write while the directory is lost.
    fn check_writable(&self) -> anyhow::Result<()> {
        match self.directory_problem() {
            None => Ok(()),
            Some(problem) => {
                self.writes_refused.fetch_add(1, Ordering::Relaxed);
                Err(anyhow::anyhow!(
                    "write refused: {problem}, so the write would be lost; restore the \
                     directory (`sidecar import`) and restart the sidecar"
                ))
            }
        }
    }

    /// A write, synced first for the store of record (acknowledged means on
    /// disk).
    ///
    /// A failure is counted; one for want of space raises the disk-full
    /// alarm (logged once per episode) until a write succeeds again.
    fn write(&self, batch: WriteBatch) -> Result<(), rocksdb::Error> {
        let mut options = WriteOptions::default();
        options.set_sync(self.role == Role::StoreOfRecord);
        let written = self.db.write_opt(batch, &options);
        match &written {
            Ok(()) => {
                if self.no_space.swap(false, Ordering::AcqRel) {
                    tracing::info!(path = %self.path.display(), "feature store writes succeed again");
                }
            }
            Err(e) => {
                self.write_errors.fetch_add(1, Ordering::Relaxed);
                if is_no_space(e) && !self.no_space.swap(true, Ordering::AcqRel) {
                    tracing::error!(
                        path = %self.path.display(),
                        error = %e,
                        "feature store: no space left on its device; writes fail and are \
                         never acknowledged, reads go on. Free space on the data path, then \
                         restart the sidecar: RocksDB refuses writes until it is reopened"
                    );
                }
            }
        }
        written
    }

    /// Whether the last write failed for want of space.
    pub fn disk_full(&self) -> bool {
        self.no_space.load(Ordering::Acquire)
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether the store holds at least one feature row (a key of 8
    /// bytes: the update-stream position is not one).
    pub fn holds_rows(&self) -> bool {
        self.db
            .iterator(rocksdb::IteratorMode::Start)
            .take(16)
            .any(|entry| entry.is_ok_and(|(key, _)| key.len() == 8))
    }

    /// The fingerprint of the import that filled this store, if recorded.
    pub fn dataset(&self) -> Option<String> {
        let value = self.db.get(DATASET_KEY).ok().flatten()?;
        String::from_utf8(value).ok()
    }

    /// Records the fingerprint of the import that filled this store.
    pub fn set_dataset(&self, fingerprint: &str) -> anyhow::Result<()> {
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        batch.put(DATASET_KEY, fingerprint.as_bytes());
        self.write(batch)
            .with_context(|| format!("writing the dataset fingerprint to {}", self.path.display()))
    }

    /// The byte length of the first stored row (a sample of the width the
    /// store was filled with); `None` when it holds none.
    pub fn first_row_len(&self) -> Option<usize> {
        self.db
            .iterator(rocksdb::IteratorMode::Start)
            .take(16)
            .filter_map(Result::ok)
            .find(|(key, _)| key.len() == 8)
            .and_then(|(_, value)| {
                crate::features::contract::split_rocks_value(&value).map(|(_, row)| row.len())
            })
    }

    /// Looks up `ids` in one batched multi-get. Each answer is the row's
    /// bytes, or `None` for a missing, expired, unreadable or malformed row
    /// (`row_bytes` is the expected length).
    pub fn get_many(&self, ids: &[u64], row_bytes: usize) -> Vec<Option<Vec<u8>>> {
        let now = now_secs();
        let keys: Vec<[u8; 8]> = ids.iter().map(|&id| rocks_key(id)).collect();
        self.db
            .multi_get(&keys)
            .into_iter()
            .map(|result| match result {
                Ok(Some(value)) => match split_rocks_value(&value) {
                    Some((expiry, row)) if row.len() == row_bytes => {
                        (expiry == 0 || expiry > now).then(|| row.to_vec())
                    }
                    _ => {
                        self.malformed.fetch_add(1, Ordering::Relaxed);
                        None
                    }
                },
                Ok(None) => None,
                Err(e) => {
                    let n = self.read_errors.fetch_add(1, Ordering::Relaxed) + 1;
                    // Logged at the 1st, 2nd, 4th, 8th... failure: a damaged
                    // file read under load must not flood the log.
                    if n.is_power_of_two() {
                        tracing::error!(
                            path = %self.path.display(),
                            error = %e,
                            read_errors = n,
                            "feature store read failed (damaged file?); serving a miss \
                             (sidecar_l2_read_errors_total counts them all); if it persists, \
                             stop the sidecar and re-run `sidecar import` (store of record) or \
                             delete the L2 cache directory"
                        );
                    }
                    None
                }
            })
            .collect()
    }

    /// When a row written now expires: never in the store of record, after
    /// the TTL in a cache.
    fn expires_at(&self) -> u64 {
        match self.role {
            Role::StoreOfRecord => 0,
            Role::Cache { ttl, .. } => now_secs() + ttl.as_secs().max(1),
        }
    }

    /// Writes rows (as raw little-endian bytes) in one batch. A cache stamps
    /// them with its TTL; the store of record never expires them.
    pub fn put_many<'a>(
        &self,
        rows: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> anyhow::Result<()> {
        let expires_at = self.expires_at();
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        for (id, row) in rows {
            batch.put(rocks_key(id), rocks_value(expires_at, row));
        }
        self.write(batch)
            .with_context(|| format!("writing feature rows to {}", self.path.display()))
    }

    /// The position in the update stream of the last entry whose rows and
    /// evictions this store holds, and the entries consumed up to it
    /// (docs/updates.md, "Positions"); `None` when none was recorded (or a
    /// cache flush dropped it).
    pub fn update_position(&self) -> Option<(StreamPosition, u64)> {
        let value = self.db.get(UPDATE_POSITION_KEY).ok().flatten()?;
        let value: [u8; 24] = value.as_slice().try_into().ok()?;
        let word = |i: usize| u64::from_le_bytes(value[8 * i..8 * i + 8].try_into().expect("8"));
        Some((
            StreamPosition {
                ms: word(0),
                seq: word(1),
            },
            word(2),
        ))
    }

    /// Writes `rows`, deletes `evicted` (a cache only: the store of record
    /// keeps its rows), and records `position`, in one atomic batch.
    pub fn apply_updates<'a>(
        &self,
        rows: impl IntoIterator<Item = (u64, &'a [u8])>,
        evicted: &[u64],
        position: StreamPosition,
        consumed: u64,
    ) -> anyhow::Result<()> {
        let expires_at = self.expires_at();
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        if matches!(self.role, Role::Cache { .. }) {
            for &id in evicted {
                batch.delete(rocks_key(id));
            }
        }
        for (id, row) in rows {
            batch.put(rocks_key(id), rocks_value(expires_at, row));
        }
        let mut value = [0u8; 24];
        value[..8].copy_from_slice(&position.ms.to_le_bytes());
        value[8..16].copy_from_slice(&position.seq.to_le_bytes());
        value[16..].copy_from_slice(&consumed.to_le_bytes());
        batch.put(UPDATE_POSITION_KEY, value);
        // One batch: after a crash the store holds all of it or none.
        self.write(batch)
            .with_context(|| format!("applying updates to {}", self.path.display()))
    }

    /// Removes rows (invalidation).
    pub fn delete_many(&self, ids: &[u64]) -> anyhow::Result<()> {
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        for &id in ids {
            batch.delete(rocks_key(id));
        }
        Ok(self.write(batch)?)
    }

    /// Deletes every row (a cache flush): one range tombstone over the
    /// whole key space, then a compaction that drops the files.
    pub fn clear(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.role != Role::StoreOfRecord,
            "{} is the store of record; it is never cleared",
            self.path.display()
        );
        self.check_writable()?;
        let mut batch = WriteBatch::default();
        batch.delete_range(rocks_key(0), rocks_key(u64::MAX));
        batch.delete(rocks_key(u64::MAX));
        self.write(batch)
            .with_context(|| format!("clearing {}", self.path.display()))?;
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    /// Flushes memtables to disk (import, shutdown).
    pub fn flush(&self) -> anyhow::Result<()> {
        Ok(self.db.flush()?)
    }

    /// Memory RocksDB holds, by part: memtables (written rows not yet
    /// flushed; bounded by the write buffer size times the number of
    /// buffers), the block cache, and the table readers' index and filter
    /// blocks.
    pub fn memory_bytes(&self) -> [(&'static str, u64); 3] {
        let property = |name: &str| self.db.property_int_value(name).ok().flatten().unwrap_or(0);
        [
            ("memtables", property("rocksdb.cur-size-all-mem-tables")),
            ("block_cache", property("rocksdb.block-cache-usage")),
            (
                "table_readers",
                property("rocksdb.estimate-table-readers-mem"),
            ),
        ]
    }

    /// Approximate bytes on disk (SST files).
    pub fn disk_bytes(&self) -> u64 {
        self.db
            .property_int_value("rocksdb.total-sst-files-size")
            .ok()
            .flatten()
            .unwrap_or(0)
    }
}

/// RocksDB's refusal to open a database whose LOCK another process (or
/// another handle of this one) holds: an IOError naming the lock file.
/// Whether a RocksDB error is a full device (ENOSPC; RocksDB keeps the
/// DB read-only after one until it is reopened).
fn is_no_space(e: &rocksdb::Error) -> bool {
    let text = e.to_string();
    text.contains("No space left on device") || text.contains("NoSpace")
}

fn is_lock_held(e: &rocksdb::Error) -> bool {
    e.kind() == ErrorKind::IOError && e.to_string().contains("lock file")
}

/// `<path>.damaged-<unix seconds>` beside `path` (a suffix added if taken).
fn aside_path(path: &Path) -> PathBuf {
    let seconds = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let name = path
        .file_name()
        .map_or_else(|| "l2".into(), |n| n.to_string_lossy().into_owned());
    let mut aside = path.with_file_name(format!("{name}.damaged-{seconds}"));
    let mut n = 1;
    while aside.exists() {
        aside = path.with_file_name(format!("{name}.damaged-{seconds}-{n}"));
        n += 1;
    }
    aside
}

fn is_damage(e: &rocksdb::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Corruption | ErrorKind::IOError | ErrorKind::InvalidArgument
    )
}

/// The embedded store at one moment.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct StoreSnapshot {
    /// Whether a store is open (none with Redis and no L2 cache).
    pub open: bool,
    pub directory_lost: bool,
    pub disk_full: bool,
    pub write_errors: u64,
    pub writes_refused: u64,
    pub read_errors: u64,
    pub disk_bytes: u64,
    /// Memory RocksDB holds, per part ([`RocksStore::memory_bytes`]).
    pub memory_bytes: [(&'static str, u64); 3],
    /// Corrupt L2 caches moved aside and rebuilt empty at start.
    pub rebuilds: u64,
}

/// The embedded store as the sidecar reports it: the store of record, the
/// L2 cache, or none; registered at the sidecar's top level
/// (`sidecar_store_*`, `sidecar_l2_*`).
#[derive(Debug)]
pub struct StoreTelemetry {
    pub store: Option<std::sync::Arc<RocksStore>>,
    pub rebuilds: u64,
}

impl StoreTelemetry {
    /// Reading it checks that the store's directory is still there.
    pub fn snapshot(&self) -> StoreSnapshot {
        let Some(store) = &self.store else {
            return StoreSnapshot {
                rebuilds: self.rebuilds,
                ..StoreSnapshot::default()
            };
        };
        let load = |a: &AtomicU64| a.load(Ordering::Relaxed);
        store.directory_problem();
        StoreSnapshot {
            open: true,
            directory_lost: store.alarmed(),
            disk_full: store.disk_full(),
            write_errors: load(&store.write_errors),
            writes_refused: load(&store.writes_refused),
            read_errors: load(&store.read_errors),
            disk_bytes: store.disk_bytes(),
            memory_bytes: store.memory_bytes(),
            rebuilds: self.rebuilds,
        }
    }
}

impl daemon_kit::metrics::Telemetry for StoreTelemetry {
    fn encode(&self, out: &mut daemon_kit::metrics::Out<'_>) -> std::fmt::Result {
        let s = self.snapshot();
        out.counter(
            "l2_rebuilds",
            "corrupt L2 caches moved aside and rebuilt empty at start",
            s.rebuilds,
        )?;
        out.gauge(
            "store_directory_lost",
            "1 once the embedded store's directory was found deleted or replaced while open \
             (writes are refused; restore it and restart)",
            u64::from(s.directory_lost),
        )?;
        out.gauge(
            "store_disk_full",
            "1 once a write of the embedded store failed for want of space on its device \
             (writes fail until space is freed and the sidecar restarted; reads go on)",
            u64::from(s.disk_full),
        )?;
        out.counter(
            "store_write_errors",
            "writes to the embedded store that failed (full disk, I/O error), never acknowledged",
            s.write_errors,
        )?;
        out.counter(
            "store_writes_refused",
            "writes to the embedded store refused because its directory was lost",
            s.writes_refused,
        )?;
        out.counter(
            "l2_read_errors",
            "L2 reads that failed and were served as misses",
            s.read_errors,
        )?;
        out.gauge(
            "l2_disk_bytes",
            "bytes of the L2 store's files on disk",
            s.disk_bytes,
        )?;
        if s.open {
            let parts = s.memory_bytes.map(|(part, bytes)| (part, bytes as i64));
            out.gauges(
                "l2_memory_bytes",
                "memory the L2 store (RocksDB) holds, per part",
                "part",
                &parts,
            )?;
        }
        Ok(())
    }
}

impl crate::features::store::LocalStore for RocksStore {
    fn malformed_rows(&self) -> u64 {
        self.malformed.load(Ordering::Relaxed)
    }

    fn role(&self) -> Role {
        RocksStore::role(self)
    }

    fn path(&self) -> &Path {
        RocksStore::path(self)
    }

    fn get_many(&self, ids: &[u64], row_bytes: usize) -> Vec<Option<Vec<u8>>> {
        RocksStore::get_many(self, ids, row_bytes)
    }

    fn put_rows(&self, rows: &[(u64, Vec<u8>)]) -> anyhow::Result<()> {
        self.put_many(rows.iter().map(|(id, bytes)| (*id, bytes.as_slice())))
    }

    fn delete_many(&self, ids: &[u64]) -> anyhow::Result<()> {
        RocksStore::delete_many(self, ids)
    }

    fn clear(&self) -> anyhow::Result<()> {
        RocksStore::clear(self)
    }

    fn disk_full(&self) -> bool {
        RocksStore::disk_full(self)
    }
}
