//! Group commit: one `ledger-writer` thread turns queued receipts into durable, signed rows.
//!
//! Per batch, on the writer thread, in this order (probe sites in brackets):
//! 1. block for the first receipt, then take more until `batch_max` or `batch_wait` passes
//!    (with `batch_wait = 0`, only what is already queued);
//! 2. seal the batch [`sign_begin(batch, count)` … `sign_end(batch, count)`]: for each record,
//!    assign `seq = head + 1`, chain `prev_hash`, hash, and sign;
//! 3. insert the whole batch in one transaction and commit (WAL, `synchronous=FULL`, so the
//!    commit syncs the WAL; the tracer sees that as the fsync syscall);
//! 4. only then complete each waiter [`receipt_durable(req_id, seq)` per record].
//!
//! The head (last seq and hash) lives in memory; it is read from the table once at start.
//! If the insert or commit fails, every waiter of the batch gets an error. When the disk is
//! full, the batch is rolled back (the head too: its seqs are given again) and the ledger is
//! [`Unavailable::Full`] until the filesystem has [`ROOM_TO_RESUME`] bytes free again, which
//! the writer checks every [`ROOM_CHECK`]: the server refuses acts meanwhile, before any
//! upstream call. Any other failure is logged and the writer stops for good: [`Ledger::failure`]
//! then says why, `/healthz` fails and the server shuts down, rather than answer 500 after
//! every upstream call. Autocheckpoint is off on this connection; the writer runs a passive
//! checkpoint itself every few batches, after completing the waiters, to keep the WAL file
//! bounded without delaying a batch's responses.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, OnceLock};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use ed25519_dalek::Signer as _;
use rusqlite::{Connection, OptionalExtension};
use tokio::sync::{Notify, oneshot};

use super::signer::Signer;
use super::{Fields, GENESIS_HASH};
use crate::probe;

/// A receipt before it has a place in the chain.
pub struct PendingReceipt {
    pub ts_ms: i64,
    pub request_id: u64,
    pub principal: Box<str>,
    pub key_id: Arc<str>,
    pub service: Box<str>,
    pub action: Box<str>,
    pub params_digest: [u8; 32],
    pub decision: &'static str,
    pub status: u16,
    pub upstream_latency_us: i64,
    pub error_code: &'static str,
}

/// What a request learns once its receipt is committed.
#[derive(Clone, Copy, Debug)]
pub struct Durable {
    pub seq: u64,
    pub entry_hash: [u8; 32],
    pub signature: [u8; 64],
}

#[derive(Debug)]
pub struct ReceiptFailed;

struct Job {
    /// The probe id, for `receipt_durable` (the receipt keeps the client's id).
    req_id: u64,
    receipt: PendingReceipt,
    done: oneshot::Sender<Result<Durable, ReceiptFailed>>,
}

#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    pub batch_max: usize,
    pub batch_wait: Duration,
    /// Run a passive WAL checkpoint after this many committed records.
    pub checkpoint_records: u64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions {
            batch_max: 256,
            batch_wait: Duration::ZERO,
            checkpoint_records: 2048,
        }
    }
}

/// The request side of the ledger: a channel to the writer thread.
pub struct Ledger {
    jobs: Sender<Job>,
    pub signer_key_id: Arc<str>,
    pub public_key: [u8; 32],
    health: Arc<Health>,
}

/// Free bytes the ledger's filesystem needs, after a full disk, before acts are taken again:
/// room for many full batches and the checkpoints that follow them, so the gateway does not
/// flap between full and not at every receipt.
pub const ROOM_TO_RESUME: u64 = 4 << 20;
/// How often a full ledger looks for room.
pub const ROOM_CHECK: Duration = Duration::from_secs(1);

/// Why no receipt can be made now.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unavailable<'a> {
    /// The disk is full; acts resume once there is room.
    Full,
    /// The writer stopped for good, for this reason.
    Failed(&'a str),
}

const WRITING: u8 = 0;
const FULL: u8 = 1;
const FAILED: u8 = 2;

/// Set by the writer thread: full while the disk is, failed once it stops for good.
#[derive(Default)]
struct Health {
    /// [`WRITING`], [`FULL`] or [`FAILED`]: what a request reads, one load.
    state: AtomicU8,
    failure: OnceLock<String>,
    failed: Notify,
}

impl Health {
    fn fail(&self, reason: String) {
        eprintln!("ledger writer stopped: {reason}");
        let _ = self.failure.set(reason);
        self.state.store(FAILED, Ordering::Release);
        self.failed.notify_waiters();
    }

    fn full(&self) -> bool {
        self.state.load(Ordering::Relaxed) == FULL
    }

    fn set_full(&self, full: bool) {
        let (from, to) = if full {
            (WRITING, FULL)
        } else {
            (FULL, WRITING)
        };
        let _ = self
            .state
            .compare_exchange(from, to, Ordering::AcqRel, Ordering::Relaxed);
    }
}

impl Ledger {
    /// Opens the writer's own connection, reads the head and starts the `ledger-writer` thread.
    pub fn start(
        db: &Path,
        signer: Signer,
        options: WriterOptions,
    ) -> anyhow::Result<(Ledger, JoinHandle<()>)> {
        let conn = crate::db::open(db, false)?;
        conn.execute_batch("PRAGMA wal_autocheckpoint = 0;")?;
        let head = conn
            .query_row(
                "SELECT seq, entry_hash FROM receipts ORDER BY seq DESC LIMIT 1",
                [],
                |r| Ok((r.get::<_, i64>(0)?, r.get::<_, Vec<u8>>(1)?)),
            )
            .optional()?;
        let head = match head {
            Some((seq, hash)) => Head {
                seq: seq as u64,
                hash: hash
                    .try_into()
                    .map_err(|_| anyhow::anyhow!("head hash is not 32 bytes"))?,
            },
            None => Head {
                seq: 0,
                hash: GENESIS_HASH,
            },
        };
        let (jobs, rx) = mpsc::channel();
        let health = Arc::new(Health::default());
        let ledger = Ledger {
            jobs,
            signer_key_id: signer.key_id.as_str().into(),
            public_key: signer.key.verifying_key().to_bytes(),
            health: health.clone(),
        };
        let writer = Writer {
            conn,
            db: db.to_owned(),
            health: health.clone(),
            signer,
            options,
            head,
            batch_id: 0,
            since_checkpoint: 0,
        };
        let handle = std::thread::Builder::new()
            .name("ledger-writer".into())
            .spawn(move || {
                let run = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| writer.run(rx)));
                match run {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => health.fail(format!("writing receipts: {e}")),
                    // The panic hook has already printed the message.
                    Err(_) => health.fail("the writer thread panicked".to_owned()),
                }
            })
            .context("spawning the ledger writer")?;
        Ok((ledger, handle))
    }

    /// Why no receipt can be made now, if none can: the check before every act.
    pub fn unavailable(&self) -> Option<Unavailable<'_>> {
        match self.health.state.load(Ordering::Acquire) {
            WRITING => None,
            FULL => Some(Unavailable::Full),
            _ => Some(Unavailable::Failed(self.failure().unwrap_or_default())),
        }
    }

    /// Why the writer stopped, once it has: no receipt can be made after that.
    pub fn failure(&self) -> Option<&str> {
        self.health.failure.get().map(String::as_str)
    }

    /// Completes when the writer stops for good, with the reason.
    pub async fn failed(&self) -> String {
        loop {
            let mut notified = std::pin::pin!(self.health.failed.notified());
            notified.as_mut().enable();
            if let Some(reason) = self.failure() {
                return reason.to_owned();
            }
            notified.await;
        }
    }

    /// Queues `receipt` and waits until it is durable.
    pub async fn append(
        &self,
        req_id: u64,
        receipt: PendingReceipt,
    ) -> Result<Durable, ReceiptFailed> {
        let (done, wait) = oneshot::channel();
        probe::gw_probe_ledger_enqueue(req_id, 0, 0);
        self.jobs
            .send(Job {
                req_id,
                receipt,
                done,
            })
            .map_err(|_| ReceiptFailed)?;
        wait.await.unwrap_or(Err(ReceiptFailed))
    }
}

#[derive(Clone, Copy)]
struct Head {
    seq: u64,
    hash: [u8; 32],
}

struct Writer {
    conn: Connection,
    /// The database file, whose filesystem a full ledger watches for room.
    db: PathBuf,
    health: Arc<Health>,
    signer: Signer,
    options: WriterOptions,
    head: Head,
    batch_id: u64,
    since_checkpoint: u64,
}

struct Sealed {
    seq: u64,
    prev_hash: [u8; 32],
    entry_hash: [u8; 32],
    signature: [u8; 64],
}

impl Writer {
    /// Returns when every sender (the server) is gone, or with the first insert or commit
    /// error other than a full disk: the waiters of that batch get an error, and so does every
    /// later one, as the receiver is dropped.
    fn run(mut self, rx: Receiver<Job>) -> rusqlite::Result<()> {
        let mut batch: Vec<Job> = Vec::with_capacity(self.options.batch_max);
        let mut sealed: Vec<Sealed> = Vec::with_capacity(self.options.batch_max);
        loop {
            let first = if self.health.full() {
                match rx.recv_timeout(ROOM_CHECK) {
                    Ok(job) => job,
                    Err(RecvTimeoutError::Timeout) => {
                        self.look_for_room();
                        continue;
                    }
                    Err(RecvTimeoutError::Disconnected) => break,
                }
            } else {
                match rx.recv() {
                    Ok(job) => job,
                    Err(_) => break,
                }
            };
            batch.push(first);
            self.gather(&rx, &mut batch);
            self.batch_id += 1;
            let batch_id = self.batch_id;
            let head_before = self.head;
            probe::gw_probe_sign_begin(batch_id, batch.len() as u64, 0);
            for job in &batch {
                let seq = self.head.seq + 1;
                let prev_hash = self.head.hash;
                let entry_hash =
                    fields(&job.receipt, seq, &prev_hash, &self.signer.key_id).entry_hash();
                let signature = self.signer.key.sign(&entry_hash).to_bytes();
                sealed.push(Sealed {
                    seq,
                    prev_hash,
                    entry_hash,
                    signature,
                });
                self.head = Head {
                    seq,
                    hash: entry_hash,
                };
            }
            probe::gw_probe_sign_end(batch_id, batch.len() as u64, 0);

            match self.insert(&batch, &sealed) {
                Ok(()) => {
                    for (job, s) in batch.drain(..).zip(&sealed) {
                        probe::gw_probe_receipt_durable(job.req_id, s.seq, 0);
                        let _ = job.done.send(Ok(Durable {
                            seq: s.seq,
                            entry_hash: s.entry_hash,
                            signature: s.signature,
                        }));
                    }
                    self.since_checkpoint += sealed.len() as u64;
                    if self.health.full() {
                        // Receipts that raced the refusal found room after all.
                        self.look_for_room();
                    }
                }
                Err(e) => {
                    let full = is_disk_full(&e);
                    if full {
                        // Rolled back: the chain ends where it did; these seqs are given again.
                        self.head = head_before;
                        // Before the waiters hear: a client that retries is refused at once.
                        if !self.health.full() {
                            eprintln!(
                                "ledger: the disk is full ({e}); acts are refused \
                                 (503 ledger_full) until {} MiB are free",
                                ROOM_TO_RESUME >> 20
                            );
                            self.health.set_full(true);
                        }
                    }
                    for job in batch.drain(..) {
                        let _ = job.done.send(Err(ReceiptFailed));
                    }
                    if !full {
                        return Err(e);
                    }
                }
            }
            sealed.clear();
            if self.since_checkpoint >= self.options.checkpoint_records {
                // PASSIVE never waits for readers; a partial checkpoint is finished next time.
                let _ = self
                    .conn
                    .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                self.since_checkpoint = 0;
            }
        }
        Ok(())
    }

    /// Ends a full disk's refusal once the filesystem has [`ROOM_TO_RESUME`] bytes free.
    fn look_for_room(&self) {
        let free = match rustix::fs::statvfs(&self.db) {
            Ok(stat) => stat.f_bavail.saturating_mul(stat.f_frsize),
            Err(e) => {
                eprintln!("ledger: statvfs {}: {e}", self.db.display());
                return;
            }
        };
        if free >= ROOM_TO_RESUME {
            eprintln!(
                "ledger: {} MiB free again; acts are taken again",
                free >> 20
            );
            self.health.set_full(false);
        }
    }

    fn gather(&self, rx: &Receiver<Job>, batch: &mut Vec<Job>) {
        let max = self.options.batch_max.max(1);
        if self.options.batch_wait.is_zero() {
            while batch.len() < max {
                match rx.try_recv() {
                    Ok(job) => batch.push(job),
                    Err(_) => return,
                }
            }
            return;
        }
        let deadline = Instant::now() + self.options.batch_wait;
        while batch.len() < max {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(job) => batch.push(job),
                Err(RecvTimeoutError::Timeout | RecvTimeoutError::Disconnected) => return,
            }
        }
    }

    fn insert(&mut self, batch: &[Job], sealed: &[Sealed]) -> rusqlite::Result<()> {
        let tx = self.conn.transaction()?;
        {
            let mut stmt = tx.prepare_cached(
                "INSERT INTO receipts (seq, ts_ms, request_id, principal, key_id, service, action,
                   params_digest, decision, status, upstream_latency_us, error_code, prev_hash,
                   entry_hash, signature, signer_key_id)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16)",
            )?;
            for (job, s) in batch.iter().zip(sealed) {
                let r = &job.receipt;
                stmt.execute(rusqlite::params![
                    s.seq as i64,
                    r.ts_ms,
                    r.request_id as i64,
                    &*r.principal,
                    &*r.key_id,
                    &*r.service,
                    &*r.action,
                    r.params_digest.as_slice(),
                    r.decision,
                    i64::from(r.status),
                    r.upstream_latency_us,
                    r.error_code,
                    s.prev_hash.as_slice(),
                    s.entry_hash.as_slice(),
                    s.signature.as_slice(),
                    self.signer.key_id.as_str(),
                ])?;
            }
        }
        tx.commit()
    }
}

/// SQLITE_FULL: a write found no room (ENOSPC), or the database hit its page limit.
fn is_disk_full(e: &rusqlite::Error) -> bool {
    e.sqlite_error_code() == Some(rusqlite::ErrorCode::DiskFull)
}

fn fields<'a>(
    r: &'a PendingReceipt,
    seq: u64,
    prev_hash: &'a [u8; 32],
    signer: &'a str,
) -> Fields<'a> {
    Fields {
        seq,
        ts_ms: r.ts_ms,
        request_id: r.request_id,
        principal: &r.principal,
        key_id: &r.key_id,
        service: &r.service,
        action: &r.action,
        params_digest: &r.params_digest,
        decision: r.decision,
        status: i64::from(r.status),
        upstream_latency_us: r.upstream_latency_us,
        error_code: r.error_code,
        prev_hash,
        signer_key_id: signer,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn receipt(request_id: u64) -> PendingReceipt {
        PendingReceipt {
            ts_ms: 0,
            request_id,
            principal: "u".into(),
            key_id: "k".into(),
            service: "s".into(),
            action: "a".into(),
            params_digest: [0; 32],
            decision: "allow",
            status: 200,
            upstream_latency_us: -1,
            error_code: "",
        }
    }

    #[test]
    fn item_15_a_failed_commit_stops_the_writer_and_says_why() {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("g.db");
        let (conn, master) = crate::admin::init(&db, &dir.path().join("g.key")).expect("init");
        let signer = super::super::signer::load(&conn, &master.signer()).expect("signer");
        let (ledger, writer) = Ledger::start(&db, signer, WriterOptions::default()).expect("start");
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        assert!(runtime.block_on(ledger.append(1, receipt(1))).is_ok());
        assert_eq!(ledger.failure(), None);

        conn.execute_batch(
            "CREATE TRIGGER forced_failure BEFORE INSERT ON receipts
             BEGIN SELECT RAISE(ABORT, 'forced writer failure'); END;",
        )
        .expect("trigger");
        assert!(runtime.block_on(ledger.append(2, receipt(2))).is_err());
        let reason = runtime.block_on(ledger.failed());
        assert!(reason.contains("forced writer failure"), "{reason}");
        assert_eq!(ledger.failure(), Some(reason.as_str()));
        // Stopped for good: later receipts fail at once instead of waiting.
        assert!(runtime.block_on(ledger.append(3, receipt(3))).is_err());
        writer.join().expect("the writer thread returns");
    }
}
