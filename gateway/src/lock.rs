//! One server per ledger: `gateway serve` holds an exclusive `flock` on `<db>.lock`, which
//! names the holder's pid. A second server on the same database would answer 500 after its
//! upstream call (the writer cannot get the write lock), so it refuses to start instead.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{Read, Seek, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use rustix::fs::{FlockOperation, OFlags, flock};
use rustix::io::Errno;

/// Held for as long as the server runs (the lock goes with the open file); the kernel drops
/// the lock when the process ends, however it ends, so a stale lock file never blocks a
/// restart.
pub struct LedgerLock {
    _lock: File,
}

pub fn lock_path(db: &Path) -> PathBuf {
    let mut name = OsString::from(db.as_os_str());
    name.push(".lock");
    PathBuf::from(name)
}

impl LedgerLock {
    pub fn acquire(db: &Path) -> anyhow::Result<LedgerLock> {
        let path = lock_path(db);
        let mut lock = OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(false)
            .mode(0o600)
            .custom_flags((OFlags::NOFOLLOW | OFlags::CLOEXEC).bits() as i32)
            .open(&path)
            .with_context(|| format!("opening the ledger lock {}", path.display()))?;
        match flock(&lock, FlockOperation::NonBlockingLockExclusive) {
            Ok(()) => {}
            Err(Errno::WOULDBLOCK) => {
                let mut holder = String::new();
                let _ = lock.read_to_string(&mut holder);
                let holder = match holder.trim() {
                    "" => "unknown pid".to_owned(),
                    pid => format!("pid {pid}"),
                };
                bail!(
                    "database {} is already served by another gateway ({holder}, holding {})",
                    db.display(),
                    path.display()
                );
            }
            Err(e) => bail!("locking {}: {e}", path.display()),
        }
        lock.set_len(0)?;
        lock.rewind()?;
        writeln!(lock, "{}", std::process::id())?;
        Ok(LedgerLock { _lock: lock })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_lock_names_the_holder() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("g.db");
        let held = LedgerLock::acquire(&db).expect("first lock");
        let err = LedgerLock::acquire(&db)
            .err()
            .expect("second lock must fail");
        let message = err.to_string();
        assert!(
            message.contains(&format!("pid {}", std::process::id())),
            "{message}"
        );
        drop(held);
        LedgerLock::acquire(&db).expect("free again once the holder is gone");
    }
}
