//! Reading the ledger back: `gateway verify` and `gateway receipts`.

use std::collections::HashMap;

use ed25519_dalek::{Signature, VerifyingKey};
use rusqlite::Connection;
use serde::Serialize;

use super::{Fields, GENESIS_HASH};

/// One stored receipt, as `gateway receipts` prints it (blobs in hex).
#[derive(Serialize)]
pub struct Row {
    pub seq: u64,
    pub ts_ms: i64,
    pub request_id: u64,
    pub principal: String,
    pub key_id: String,
    pub service: String,
    pub action: String,
    #[serde(with = "hex::serde")]
    pub params_digest: Vec<u8>,
    pub decision: String,
    pub status: i64,
    pub upstream_latency_us: i64,
    pub error_code: String,
    #[serde(with = "hex::serde")]
    pub prev_hash: Vec<u8>,
    #[serde(with = "hex::serde")]
    pub entry_hash: Vec<u8>,
    #[serde(with = "hex::serde")]
    pub signature: Vec<u8>,
    pub signer_key_id: String,
}

impl Row {
    pub fn fields(&self) -> Fields<'_> {
        Fields {
            seq: self.seq,
            ts_ms: self.ts_ms,
            request_id: self.request_id,
            principal: &self.principal,
            key_id: &self.key_id,
            service: &self.service,
            action: &self.action,
            params_digest: &self.params_digest,
            decision: &self.decision,
            status: self.status,
            upstream_latency_us: self.upstream_latency_us,
            error_code: &self.error_code,
            prev_hash: &self.prev_hash,
            signer_key_id: &self.signer_key_id,
        }
    }
}

/// Calls `f` for every receipt with `seq >= from`, in seq order, streaming (not collecting).
pub fn for_each(
    conn: &Connection,
    from: u64,
    mut f: impl FnMut(Row) -> anyhow::Result<()>,
) -> anyhow::Result<()> {
    let mut stmt = conn.prepare(
        "SELECT seq, ts_ms, request_id, principal, key_id, service, action, params_digest,
                decision, status, upstream_latency_us, error_code, prev_hash, entry_hash,
                signature, signer_key_id
         FROM receipts WHERE seq >= ?1 ORDER BY seq",
    )?;
    let mut rows = stmt.query([from as i64])?;
    while let Some(r) = rows.next()? {
        f(Row {
            seq: r.get::<_, i64>(0)? as u64,
            ts_ms: r.get(1)?,
            request_id: r.get::<_, i64>(2)? as u64,
            principal: r.get(3)?,
            key_id: r.get(4)?,
            service: r.get(5)?,
            action: r.get(6)?,
            params_digest: r.get(7)?,
            decision: r.get(8)?,
            status: r.get(9)?,
            upstream_latency_us: r.get(10)?,
            error_code: r.get(11)?,
            prev_hash: r.get(12)?,
            entry_hash: r.get(13)?,
            signature: r.get(14)?,
            signer_key_id: r.get(15)?,
        })?;
    }
    Ok(())
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok { receipts: u64 },
    Bad { seq: u64, reason: String },
}

/// Checks seq continuity from 1, the hash chain, every entry hash and every signature.
pub fn verify(conn: &Connection) -> anyhow::Result<Verdict> {
    let mut keys: HashMap<String, VerifyingKey> = HashMap::new();
    let mut stmt = conn.prepare("SELECT key_id, public_key FROM signer_keys")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let public: Vec<u8> = r.get(1)?;
        let public: [u8; 32] = public
            .try_into()
            .map_err(|_| anyhow::anyhow!("signer {id}: public key is not 32 bytes"))?;
        keys.insert(id, VerifyingKey::from_bytes(&public)?);
    }
    drop(rows);
    drop(stmt);

    let mut expected_seq = 1u64;
    let mut prev = GENESIS_HASH.to_vec();
    let mut bad: Option<(u64, String)> = None;
    for_each(conn, 0, |row| {
        if bad.is_some() {
            return Ok(());
        }
        let problem = check(&row, expected_seq, &prev, &keys);
        if let Some(reason) = problem {
            bad = Some((row.seq, reason));
        }
        expected_seq = row.seq + 1;
        prev = row.entry_hash;
        Ok(())
    })?;
    Ok(match bad {
        Some((seq, reason)) => Verdict::Bad { seq, reason },
        None => Verdict::Ok {
            receipts: expected_seq - 1,
        },
    })
}

fn check(
    row: &Row,
    expected_seq: u64,
    prev: &[u8],
    keys: &HashMap<String, VerifyingKey>,
) -> Option<String> {
    if row.seq != expected_seq {
        return Some(format!("expected seq {expected_seq}, found {}", row.seq));
    }
    if row.prev_hash != prev {
        return Some("prev_hash does not match the previous entry_hash".into());
    }
    if row.fields().entry_hash().as_slice() != row.entry_hash.as_slice() {
        return Some("entry_hash does not match the record's contents".into());
    }
    let Some(key) = keys.get(&row.signer_key_id) else {
        return Some(format!("unknown signer key {}", row.signer_key_id));
    };
    let Ok(signature) = Signature::from_slice(&row.signature) else {
        return Some("signature is not 64 bytes".into());
    };
    if key.verify_strict(&row.entry_hash, &signature).is_err() {
        return Some("signature does not verify".into());
    }
    None
}
