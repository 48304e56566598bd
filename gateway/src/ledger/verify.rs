//! Reading the ledger back: `gateway verify` and `gateway receipts`.

use std::collections::HashMap;

use ed25519_dalek::{Signature, VerifyingKey};
use rusqlite::Connection;
use serde::Serialize;

use super::{Fields, GENESIS_HASH};
use crate::db;

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

/// What a verifier knows from outside the database it checks. The database alone proves only
/// that it is self-consistent: whoever can write it can also rewrite `signer_keys`, re-sign
/// every receipt, or cut the tail off.
#[derive(Default)]
pub struct Published {
    /// Every receipt must be signed by one of these keys (empty: trust `signer_keys`).
    pub keys: Vec<VerifyingKey>,
    /// A head published earlier: the chain must still hold this seq with this entry hash.
    pub head: Option<Head>,
}

/// `SEQ:ENTRY_HASH_HEX`, as `gateway head` prints it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    pub seq: u64,
    pub entry_hash: [u8; 32],
}

impl std::str::FromStr for Head {
    type Err = String;

    fn from_str(text: &str) -> Result<Head, String> {
        let (seq, hash) = text
            .split_once(':')
            .ok_or_else(|| format!("expected SEQ:HASH, got {text:?}"))?;
        let seq = seq
            .parse::<u64>()
            .map_err(|e| format!("head seq {seq:?}: {e}"))?;
        let mut entry_hash = [0; 32];
        hex::decode_to_slice(hash, &mut entry_hash)
            .map_err(|e| format!("head hash (64 hex digits): {e}"))?;
        Ok(Head { seq, entry_hash })
    }
}

impl std::fmt::Display for Head {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.seq, hex::encode(self.entry_hash))
    }
}

/// An Ed25519 public key given as 64 hex digits.
pub fn parse_public_key(text: &str) -> Result<VerifyingKey, String> {
    let mut bytes = [0; 32];
    hex::decode_to_slice(text, &mut bytes)
        .map_err(|e| format!("public key (64 hex digits): {e}"))?;
    VerifyingKey::from_bytes(&bytes).map_err(|e| format!("public key: {e}"))
}

/// The newest receipt, if any.
pub fn last(conn: &Connection) -> anyhow::Result<Option<Row>> {
    let seq: Option<i64> = conn.query_row("SELECT max(seq) FROM receipts", [], |r| r.get(0))?;
    let mut found = None;
    if let Some(seq) = seq {
        for_each(conn, seq as u64, |row| {
            found = Some(row);
            Ok(())
        })?;
    }
    Ok(found)
}

#[derive(Debug, PartialEq, Eq)]
pub enum Verdict {
    Ok { receipts: u64 },
    Bad { seq: u64, reason: String },
}

/// Checks seq continuity from 1, the hash chain, every entry hash and every signature, and
/// what `published` adds: the signing keys and a head the chain must still contain.
pub fn verify(conn: &Connection, published: &Published) -> anyhow::Result<Verdict> {
    let keys = if published.keys.is_empty() {
        Keys::Stored(stored_keys(conn)?)
    } else {
        Keys::Published(&published.keys)
    };
    let mut expected_seq = 1u64;
    let mut prev = GENESIS_HASH.to_vec();
    let mut bad: Option<(u64, String)> = None;
    let mut head_found = false;
    for_each(conn, 0, |row| {
        if bad.is_some() {
            return Ok(());
        }
        let mut problem = check(&row, expected_seq, &prev, &keys);
        if let Some(head) = published.head.filter(|h| h.seq == row.seq) {
            head_found = true;
            if problem.is_none() && row.entry_hash != head.entry_hash {
                problem = Some(format!("entry_hash differs from the published head {head}"));
            }
        }
        if let Some(reason) = problem {
            bad = Some((row.seq, reason));
        }
        expected_seq = row.seq + 1;
        prev = row.entry_hash;
        Ok(())
    })?;
    if let (None, Some(head), false) = (&bad, published.head, head_found) {
        bad = Some((
            head.seq,
            format!(
                "the published head {head} is missing: the chain ends at seq {}",
                expected_seq - 1
            ),
        ));
    }
    Ok(match bad {
        Some((seq, reason)) => Verdict::Bad { seq, reason },
        None => Verdict::Ok {
            receipts: expected_seq - 1,
        },
    })
}

enum Keys<'a> {
    /// From the database's own `signer_keys`, by key id.
    Stored(HashMap<String, VerifyingKey>),
    /// Given by the verifier: the key id is not trusted to pick one.
    Published(&'a [VerifyingKey]),
}

fn stored_keys(conn: &Connection) -> anyhow::Result<HashMap<String, VerifyingKey>> {
    let mut keys: HashMap<String, VerifyingKey> = HashMap::new();
    let mut stmt = conn.prepare("SELECT key_id, public_key FROM signer_keys")?;
    let mut rows = stmt.query([])?;
    while let Some(r) = rows.next()? {
        let id: String = r.get(0)?;
        let public = db::blob32(r, 1, || format!("signer {id}: public key"))?;
        keys.insert(id, VerifyingKey::from_bytes(&public)?);
    }
    Ok(keys)
}

fn check(row: &Row, expected_seq: u64, prev: &[u8], keys: &Keys<'_>) -> Option<String> {
    if row.seq != expected_seq {
        return Some(format!("expected seq {expected_seq}, found {}", row.seq));
    }
    if row.prev_hash != prev {
        return Some("prev_hash does not match the previous entry_hash".into());
    }
    if row.fields().entry_hash().as_slice() != row.entry_hash.as_slice() {
        return Some("entry_hash does not match the record's contents".into());
    }
    let Ok(signature) = Signature::from_slice(&row.signature) else {
        return Some("signature is not 64 bytes".into());
    };
    let verifies = |key: &VerifyingKey| key.verify_strict(&row.entry_hash, &signature).is_ok();
    match keys {
        Keys::Stored(keys) => match keys.get(&row.signer_key_id) {
            None => Some(format!("unknown signer key {}", row.signer_key_id)),
            Some(key) if !verifies(key) => Some("signature does not verify".into()),
            Some(_) => None,
        },
        Keys::Published(keys) if !keys.iter().any(verifies) => {
            Some("signature does not verify with any published key".into())
        }
        Keys::Published(_) => None,
    }
}
