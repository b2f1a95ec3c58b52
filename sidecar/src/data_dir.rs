//! One sidecar per data directory: `sidecar serve` and `sidecar import`
//! hold an exclusive lock on `<data_dir>/sidecar.lock` (an advisory
//! `flock`, released by the kernel when the process exits, however it
//! exits) for as long as they use the directory. A second process on the
//! same directory is refused before it opens anything in it, so it can never
//! touch the first one's graph index, store or cache.

use std::fs::{File, OpenOptions};

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use std::path::{Path, PathBuf};

/// The lock file's name inside a data directory.
pub const LOCK_FILE: &str = "sidecar.lock";

/// Why the lock could not be taken.
#[derive(Debug, thiserror::Error)]
pub enum DataDirLockError {
    #[error(
        "data directory {dir} is in use by another sidecar process (it holds the lock \
         {lock}): stop that process first, or give this one its own --data-dir"
    )]
    InUse { dir: PathBuf, lock: PathBuf },
    #[error(
        "data directory {dir} does not exist: run `sidecar import <dataset> --data-dir {dir}` \
         first, or check --data-dir"
    )]
    Missing { dir: PathBuf },
    #[error("cannot lock the data directory {dir} ({lock}): {source}")]
    Io {
        dir: PathBuf,
        lock: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// The held lock; dropping it releases the directory.
#[derive(Debug)]
pub struct DataDirLock {
    _file: Flock<File>,
    path: PathBuf,
}

impl DataDirLock {
    /// Takes the lock of the existing directory `dir` without waiting.
    pub fn acquire(dir: &Path) -> Result<Self, DataDirLockError> {
        if !dir.is_dir() {
            return Err(DataDirLockError::Missing {
                dir: dir.to_path_buf(),
            });
        }
        let lock = dir.join(LOCK_FILE);
        let io = |source| DataDirLockError::Io {
            dir: dir.to_path_buf(),
            lock: lock.clone(),
            source,
        };
        let file = OpenOptions::new()
            .create(true)
            .truncate(false)
            .read(true)
            .write(true)
            .open(&lock)
            .map_err(io)?;
        match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
            Ok(file) => Ok(Self {
                _file: file,
                path: lock,
            }),
            Err((_, Errno::EWOULDBLOCK)) => Err(DataDirLockError::InUse {
                dir: dir.to_path_buf(),
                lock,
            }),
            Err((_, errno)) => Err(io(errno.into())),
        }
    }

    /// The lock file.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_holder_is_refused_until_the_first_lets_go() {
        let dir = tempfile::tempdir().unwrap();
        let first = DataDirLock::acquire(dir.path()).unwrap();
        let err = DataDirLock::acquire(dir.path()).unwrap_err();
        assert!(matches!(err, DataDirLockError::InUse { .. }), "{err}");
        assert!(err.to_string().contains("sidecar.lock"), "{err}");
        drop(first);
        DataDirLock::acquire(dir.path()).expect("free again");
        let missing = DataDirLock::acquire(&dir.path().join("nope")).unwrap_err();
        assert!(missing.to_string().contains("sidecar import"), "{missing}");
    }
}
