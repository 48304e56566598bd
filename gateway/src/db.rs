//! SQLite: connection settings and the versioned schema.
//!
//! The schema version is `PRAGMA user_version`; each migration runs once, in its own
//! transaction, and bumps it. Opening an up-to-date database applies nothing, so every command
//! may call [`open`] freely.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, bail};
use rusqlite::{Connection, OpenFlags};

/// Migration `i` brings the schema from version `i` to `i + 1`.
const MIGRATIONS: &[&str] = &[
    // 1: configuration, vault, signer keys and the receipt ledger.
    r#"
    -- Bumped by triggers on every change to configuration rows, so a server can tell with one
    -- primary-key read whether its in-memory copy is stale.
    CREATE TABLE config_gen (
        id  INTEGER PRIMARY KEY CHECK (id = 1),
        gen INTEGER NOT NULL
    );
    INSERT INTO config_gen (id, gen) VALUES (1, 0);

    CREATE TABLE api_keys (
        key_id     TEXT PRIMARY KEY,
        secret_mac BLOB NOT NULL,      -- HMAC-SHA256(api-key-mac key, secret)
        services   TEXT NOT NULL,      -- comma-separated names, or *
        users      TEXT NOT NULL,      -- comma-separated principals, or *
        revoked    INTEGER NOT NULL DEFAULT 0,
        created_at INTEGER NOT NULL
    );

    CREATE TABLE services (
        name              TEXT PRIMARY KEY,
        upstream          TEXT NOT NULL,   -- http://host:port[/base]
        method            TEXT NOT NULL,
        path_template     TEXT NOT NULL,   -- /items/{id}: {param} is taken from params
        credential_kind   TEXT NOT NULL CHECK (credential_kind IN ('bearer', 'header')),
        credential_header TEXT,            -- header name when credential_kind = 'header'
        rate_per_s        REAL,            -- NULL: unlimited
        burst             REAL,
        timeout_ms        INTEGER NOT NULL
    );

    CREATE TABLE vault_tokens (
        principal  TEXT NOT NULL,
        service    TEXT NOT NULL,
        sealed     BLOB NOT NULL,          -- AES-256-GCM, aad = "vault\0" principal "\0" service
        expires_at INTEGER,                -- unix seconds; NULL: never
        version    INTEGER NOT NULL,       -- bumped on every change: the decrypted-cache key
        PRIMARY KEY (principal, service)
    );

    CREATE TABLE signer_keys (
        key_id        TEXT PRIMARY KEY,
        public_key    BLOB NOT NULL,
        sealed_secret BLOB NOT NULL,       -- AES-256-GCM, aad = "signer\0" key_id
        active        INTEGER NOT NULL,
        created_at    INTEGER NOT NULL
    );

    CREATE TABLE receipts (
        seq                 INTEGER PRIMARY KEY,
        ts_ms               INTEGER NOT NULL,
        request_id          INTEGER NOT NULL,  -- the u64 request id, stored as its i64 bits
        principal           TEXT NOT NULL,
        key_id              TEXT NOT NULL,
        service             TEXT NOT NULL,
        action              TEXT NOT NULL,
        params_digest       BLOB NOT NULL,
        decision            TEXT NOT NULL,
        status              INTEGER NOT NULL,
        upstream_latency_us INTEGER NOT NULL,  -- -1: no upstream call
        error_code          TEXT NOT NULL,     -- '' when none
        prev_hash           BLOB NOT NULL,
        entry_hash          BLOB NOT NULL,
        signature           BLOB NOT NULL,
        signer_key_id       TEXT NOT NULL
    );

    CREATE TRIGGER receipts_no_update BEFORE UPDATE ON receipts
    BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;
    CREATE TRIGGER receipts_no_delete BEFORE DELETE ON receipts
    BEGIN SELECT RAISE(ABORT, 'receipts are append-only'); END;

    CREATE TRIGGER api_keys_ins AFTER INSERT ON api_keys
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER api_keys_upd AFTER UPDATE ON api_keys
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER api_keys_del AFTER DELETE ON api_keys
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER services_ins AFTER INSERT ON services
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER services_upd AFTER UPDATE ON services
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER services_del AFTER DELETE ON services
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER vault_tokens_ins AFTER INSERT ON vault_tokens
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER vault_tokens_upd AFTER UPDATE ON vault_tokens
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    CREATE TRIGGER vault_tokens_del AFTER DELETE ON vault_tokens
    BEGIN UPDATE config_gen SET gen = gen + 1 WHERE id = 1; END;
    "#,
];

pub const SCHEMA_VERSION: i64 = MIGRATIONS.len() as i64;

/// Opens (creating if asked) and migrates the database, in WAL mode with `synchronous=FULL`.
pub fn open(path: &Path, create: bool) -> anyhow::Result<Connection> {
    if !create && !path.exists() {
        bail!(
            "database {} does not exist (run `gateway init --db {}` first)",
            path.display(),
            path.display()
        );
    }
    let mut conn =
        Connection::open(path).with_context(|| format!("opening database {}", path.display()))?;
    configure(&conn)?;
    migrate(&mut conn)?;
    Ok(conn)
}

/// Opens an existing database read-only, for commands that only read (`verify`, `receipts`,
/// `head`): nothing is created or migrated, so checking a ledger cannot change it.
pub fn open_read_only(path: &Path) -> anyhow::Result<Connection> {
    if !path.exists() {
        bail!("database {} does not exist", path.display());
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .with_context(|| format!("opening database {} read-only", path.display()))?;
    conn.busy_timeout(Duration::from_secs(5))?;
    let version: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if version != SCHEMA_VERSION {
        bail!(
            "database {} has schema version {version}, this gateway reads version {SCHEMA_VERSION}",
            path.display()
        );
    }
    Ok(conn)
}

fn configure(conn: &Connection) -> anyhow::Result<()> {
    // Writers (the ledger thread, CLI commands) and readers share the file; wait for locks
    // instead of failing at once.
    conn.busy_timeout(Duration::from_secs(5))?;
    let mode: String = conn.query_row("PRAGMA journal_mode = WAL", [], |r| r.get(0))?;
    if !mode.eq_ignore_ascii_case("wal") {
        bail!("could not switch the database to WAL mode (got {mode})");
    }
    // FULL: every commit fdatasyncs the WAL, so a committed receipt survives power loss.
    // journal_size_limit: after a checkpoint resets the WAL, truncate the file to ≤ 16 MiB.
    conn.execute_batch(
        "PRAGMA synchronous = FULL;
         PRAGMA foreign_keys = ON;
         PRAGMA journal_size_limit = 16777216;",
    )?;
    Ok(())
}

fn migrate(conn: &mut Connection) -> anyhow::Result<()> {
    let current: i64 = conn.query_row("PRAGMA user_version", [], |r| r.get(0))?;
    if current > SCHEMA_VERSION {
        bail!("database schema version {current} is newer than this gateway ({SCHEMA_VERSION})");
    }
    for (version, sql) in MIGRATIONS.iter().enumerate().skip(current as usize) {
        let tx = conn.transaction()?;
        tx.execute_batch(sql)
            .with_context(|| format!("applying migration {}", version + 1))?;
        tx.pragma_update(None, "user_version", version as i64 + 1)?;
        tx.commit()?;
    }
    Ok(())
}

/// Column `idx` of `row`, a blob of 32 bytes (a MAC, a public key); `what` names it in the
/// error when it is another length.
pub fn blob32(
    row: &rusqlite::Row<'_>,
    idx: usize,
    what: impl FnOnce() -> String,
) -> anyhow::Result<[u8; 32]> {
    let blob: Vec<u8> = row.get(idx)?;
    blob.try_into()
        .map_err(|_| anyhow::anyhow!("{} is not 32 bytes", what()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrations_are_idempotent_and_receipts_append_only() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("g.db");
        drop(open(&path, true).expect("first open"));
        let conn = open(&path, false).expect("second open");
        let version: i64 = conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .expect("version");
        assert_eq!(version, SCHEMA_VERSION);
        conn.execute(
            "INSERT INTO receipts VALUES (1, 0, 0, 'u', 'k', 's', 'a', x'', 'allow', 200, 0, '',
             x'', x'', x'', 'sk')",
            [],
        )
        .expect("insert");
        let update = conn.execute("UPDATE receipts SET status = 500", []);
        assert!(update.unwrap_err().to_string().contains("append-only"));
        let delete = conn.execute("DELETE FROM receipts", []);
        assert!(delete.unwrap_err().to_string().contains("append-only"));
    }

    #[test]
    fn config_changes_bump_the_generation() {
        let dir = tempfile::tempdir().expect("tempdir");
        let conn = open(&dir.path().join("g.db"), true).expect("open");
        let generation = || -> i64 {
            conn.query_row("SELECT gen FROM config_gen", [], |r| r.get(0))
                .expect("gen")
        };
        let before = generation();
        conn.execute(
            "INSERT INTO api_keys VALUES ('id', x'00', '*', '*', 0, 0)",
            [],
        )
        .expect("insert");
        assert_eq!(generation(), before + 1);
    }

    #[test]
    fn missing_database_is_a_clear_error() {
        let err = open(Path::new("/nonexistent/dir/g.db"), false).unwrap_err();
        assert!(err.to_string().contains("gateway init"));
    }
}
