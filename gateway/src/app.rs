//! Server state shared by every connection, and the per-worker-thread configuration check.

use std::cell::RefCell;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use rusqlite::Connection;

use crate::acting::Acting;
use crate::config::Config;
use crate::error::ApiError;
use crate::ledger::{Ledger, WriterOptions};
use crate::ratelimit::Limiter;
use crate::secrets::{HmacSha256, MasterKey, Sealer};
use crate::upstream::Pools;

pub struct App {
    id: usize,
    db: PathBuf,
    pub mac_key: HmacSha256,
    vault: Sealer,
    pools: Pools,
    /// The newest configuration any worker has loaded; workers copy it instead of reloading.
    shared: Mutex<Arc<Config>>,
    pub limiter: Limiter,
    /// Per API key, the denied requests that may still get a receipt.
    pub denials: Limiter,
    pub limits: KeyLimits,
    pub ledger: Ledger,
    /// Requests past the point where a shutdown waits for their upstream call and receipt.
    pub acting: Acting,
    /// `GET /v1/receipts/pubkey`, serialized once.
    pub pubkey_body: Bytes,
}

/// What one API key's requests may cost the gateway: time holding a handler, receipts.
#[derive(Clone, Copy, Debug)]
pub struct KeyLimits {
    /// A request body must arrive whole within this time of its handler starting to read it
    /// (its head parsed and its key checked); past it, 408 `body_timeout`.
    pub body_timeout: Duration,
    /// Denied requests (scope, rate limit, registry, vault) receipted per key: a token bucket
    /// of this rate per second and burst. Past it, a denial is refused without a receipt.
    pub denials_per_s: f64,
    pub denials_burst: f64,
}

/// Each tokio worker thread keeps its own read connection and its current configuration, so
/// the per-request staleness check takes no lock shared with other workers.
struct WorkerDb {
    app: usize,
    conn: Connection,
    config: Arc<Config>,
}

thread_local! {
    static WORKER_DB: RefCell<Option<WorkerDb>> = const { RefCell::new(None) };
}

static NEXT_APP_ID: AtomicUsize = AtomicUsize::new(1);

impl App {
    pub fn start(
        db: &Path,
        master: &MasterKey,
        writer: WriterOptions,
        limits: KeyLimits,
    ) -> anyhow::Result<(Arc<App>, JoinHandle<()>)> {
        let conn = crate::db::open(db, false)?;
        let vault = master.vault();
        let pools = Pools::default();
        let config = Config::load(&conn, &vault, &pools, None)?;
        let signer = crate::ledger::signer::load(&conn, &master.signer())?;
        drop(conn);
        let (ledger, writer_thread) = Ledger::start(db, signer, writer)?;
        let pubkey_body = serde_json::to_vec(&serde_json::json!({
            "algorithm": "ed25519",
            "key_id": &*ledger.signer_key_id,
            "public_key": hex::encode(ledger.public_key),
        }))?;
        let app = App {
            id: NEXT_APP_ID.fetch_add(1, Ordering::Relaxed),
            db: db.to_owned(),
            mac_key: master.api_key_mac(),
            vault,
            pools,
            shared: Mutex::new(Arc::new(config)),
            limiter: Limiter::default(),
            denials: Limiter::default(),
            limits,
            ledger,
            acting: Acting::default(),
            pubkey_body: Bytes::from(pubkey_body),
        };
        Ok((Arc::new(app), writer_thread))
    }

    /// The current configuration: one primary-key read of `config_gen` on this thread's
    /// connection, and a reload only if it moved.
    pub fn config(&self) -> Result<Arc<Config>, ApiError> {
        WORKER_DB.with_borrow_mut(|slot| {
            if slot.as_ref().is_none_or(|w| w.app != self.id) {
                let conn = crate::db::open(&self.db, false)
                    .map_err(|e| ApiError::internal(format!("opening the database: {e:#}")))?;
                let config = self.shared_config();
                *slot = Some(WorkerDb {
                    app: self.id,
                    conn,
                    config,
                });
            }
            let Some(worker) = slot.as_mut() else {
                return Err(ApiError::internal("worker database missing"));
            };
            let generation: i64 = worker
                .conn
                .prepare_cached("SELECT gen FROM config_gen WHERE id = 1")
                .and_then(|mut stmt| stmt.query_row([], |r| r.get(0)))
                .map_err(|e| ApiError::internal(format!("reading config_gen: {e}")))?;
            if generation != worker.config.generation {
                worker.config = self.reload(&worker.conn, generation)?;
            }
            Ok(worker.config.clone())
        })
    }

    fn shared_config(&self) -> Arc<Config> {
        self.shared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    fn reload(&self, conn: &Connection, generation: i64) -> Result<Arc<Config>, ApiError> {
        let mut shared = self.shared.lock().unwrap_or_else(|p| p.into_inner());
        if shared.generation >= generation {
            return Ok(shared.clone());
        }
        let fresh = Config::load(conn, &self.vault, &self.pools, Some(&shared))
            .map_err(|e| ApiError::internal(format!("reloading configuration: {e:#}")))?;
        *shared = Arc::new(fresh);
        Ok(shared.clone())
    }
}
