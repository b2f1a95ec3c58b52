//! L2: feature rows in RocksDB on local disk (NVMe in production).
//!
//! Two roles:
//! - **store of record** (no Redis configured): written by `sidecar import`,
//!   rows never expire, no size bound; a corrupt store is refused with the
//!   fix (re-run the import), since nothing else holds the rows;
//! - **cache** in front of Redis: rows carry an expiry (the TTL bounds their
//!   staleness when an invalidation is lost), the size is bounded by FIFO
//!   compaction (the oldest files are dropped past the bound), and a store
//!   found corrupt at open is wiped and rebuilt empty, with an error log and
//!   a counter: it is only a cache. It survives restarts, so a restarted
//!   sidecar serves warm.
//!
//! RocksDB calls block: callers run them on blocking threads.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use rocksdb::{DBCompactionStyle, ErrorKind, FifoCompactOptions, Options, WriteBatch, DB};

use crate::features::contract::{rocks_key, rocks_value, split_rocks_value};

/// What an L2 store is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    StoreOfRecord,
    Cache { max_bytes: u64, ttl: Duration },
}

/// What opening found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Opened {
    /// An existing store (or a new empty one) opened normally.
    Existing,
    /// The cache was corrupt: it was wiped and recreated empty.
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
}

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
            Err(e) if role != Role::StoreOfRecord && is_damage(&e) => {
                tracing::error!(
                    path = %path.display(),
                    error = %e,
                    "L2 feature cache is corrupt; wiping and rebuilding it empty"
                );
                let _ = DB::destroy(&options, path);
                if path.exists() {
                    std::fs::remove_dir_all(path).with_context(|| {
                        format!("wiping the corrupt L2 cache at {}", path.display())
                    })?;
                }
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
        Ok((
            Self {
                db,
                role,
                path: path.to_path_buf(),
                read_errors: AtomicU64::new(0),
                malformed: AtomicU64::new(0),
            },
            opened,
        ))
    }

    pub fn role(&self) -> Role {
        self.role
    }

    pub fn path(&self) -> &Path {
        &self.path
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
                    self.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::error!(path = %self.path.display(), error = %e, "L2 read failed; serving a miss");
                    None
                }
            })
            .collect()
    }

    /// Writes rows (as raw little-endian bytes) in one batch. A cache stamps
    /// them with its TTL; the store of record never expires them.
    pub fn put_many<'a>(
        &self,
        rows: impl IntoIterator<Item = (u64, &'a [u8])>,
    ) -> anyhow::Result<()> {
        let expires_at = match self.role {
            Role::StoreOfRecord => 0,
            Role::Cache { ttl, .. } => now_secs() + ttl.as_secs().max(1),
        };
        let mut batch = WriteBatch::default();
        for (id, row) in rows {
            batch.put(rocks_key(id), rocks_value(expires_at, row));
        }
        self.db
            .write(batch)
            .with_context(|| format!("writing feature rows to {}", self.path.display()))
    }

    /// Removes rows (invalidation).
    pub fn delete_many(&self, ids: &[u64]) -> anyhow::Result<()> {
        let mut batch = WriteBatch::default();
        for &id in ids {
            batch.delete(rocks_key(id));
        }
        Ok(self.db.write(batch)?)
    }

    /// Deletes every row (a cache flush): one range tombstone over the
    /// whole key space, then a compaction that drops the files.
    pub fn clear(&self) -> anyhow::Result<()> {
        anyhow::ensure!(
            self.role != Role::StoreOfRecord,
            "{} is the store of record; it is never cleared",
            self.path.display()
        );
        let mut batch = WriteBatch::default();
        batch.delete_range(rocks_key(0), rocks_key(u64::MAX));
        batch.delete(rocks_key(u64::MAX));
        self.db
            .write(batch)
            .with_context(|| format!("clearing {}", self.path.display()))?;
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    /// Flushes memtables to disk (import, shutdown).
    pub fn flush(&self) -> anyhow::Result<()> {
        Ok(self.db.flush()?)
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

fn is_damage(e: &rocksdb::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::Corruption | ErrorKind::IOError | ErrorKind::InvalidArgument
    )
}
