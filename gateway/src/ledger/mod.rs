//! The receipt ledger: an append-only, hash-chained, signed table in SQLite.
//!
//! # Entry hash
//! `entry_hash = SHA-256(encoding)`, where `encoding` is the 18 ASCII bytes
//! `gateway.receipt.v1` followed by these fields, in this order:
//!
//! | field | encoding |
//! |---|---|
//! | seq | u64, little-endian |
//! | ts_ms (unix milliseconds) | i64, little-endian |
//! | request_id | u64, little-endian |
//! | principal, key_id, service, action | each: u32 LE byte length, then UTF-8 bytes |
//! | params_digest | u32 LE length (32), then the bytes |
//! | decision, | u32 LE length, UTF-8 |
//! | status | i64, little-endian |
//! | upstream_latency_us (-1: none) | i64, little-endian |
//! | error_code ('' when none) | u32 LE length, UTF-8 |
//! | prev_hash (32 zero bytes for seq 1) | u32 LE length (32), then the bytes |
//! | signer_key_id | u32 LE length, UTF-8 |
//!
//! `signature = Ed25519(signer, entry_hash)` (the 32 hash bytes are the signed message).

pub mod signer;
pub mod verify;
pub mod writer;

use sha2::{Digest, Sha256};

pub use writer::{Durable, Ledger, PendingReceipt, Unavailable, WriterOptions};

const DOMAIN: &[u8] = b"gateway.receipt.v1";

pub const GENESIS_HASH: [u8; 32] = [0; 32];

/// Every hashed field of a receipt, borrowed (from a pending receipt or a database row).
pub struct Fields<'a> {
    pub seq: u64,
    pub ts_ms: i64,
    pub request_id: u64,
    pub principal: &'a str,
    pub key_id: &'a str,
    pub service: &'a str,
    pub action: &'a str,
    pub params_digest: &'a [u8],
    pub decision: &'a str,
    pub status: i64,
    pub upstream_latency_us: i64,
    pub error_code: &'a str,
    pub prev_hash: &'a [u8],
    pub signer_key_id: &'a str,
}

impl Fields<'_> {
    pub fn entry_hash(&self) -> [u8; 32] {
        let mut h = Sha256::new();
        h.update(DOMAIN);
        h.update(self.seq.to_le_bytes());
        h.update(self.ts_ms.to_le_bytes());
        h.update(self.request_id.to_le_bytes());
        for text in [self.principal, self.key_id, self.service, self.action] {
            put_bytes(&mut h, text.as_bytes());
        }
        put_bytes(&mut h, self.params_digest);
        put_bytes(&mut h, self.decision.as_bytes());
        h.update(self.status.to_le_bytes());
        h.update(self.upstream_latency_us.to_le_bytes());
        put_bytes(&mut h, self.error_code.as_bytes());
        put_bytes(&mut h, self.prev_hash);
        put_bytes(&mut h, self.signer_key_id.as_bytes());
        h.finalize().into()
    }
}

fn put_bytes(h: &mut Sha256, bytes: &[u8]) {
    // Fields are far below 4 GiB (the request body is capped at 1 MiB).
    h.update((bytes.len() as u32).to_le_bytes());
    h.update(bytes);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Fields<'static> {
        Fields {
            seq: 1,
            ts_ms: 2,
            request_id: 3,
            principal: "u",
            key_id: "k",
            service: "s",
            action: "a",
            params_digest: &[7; 32],
            decision: "allow",
            status: 200,
            upstream_latency_us: 10,
            error_code: "",
            prev_hash: &GENESIS_HASH,
            signer_key_id: "sk",
        }
    }

    #[test]
    fn length_prefixes_keep_fields_apart() {
        // Moving a byte from one string field to the next must change the hash.
        let a = Fields {
            principal: "ab",
            key_id: "c",
            ..sample()
        };
        let b = Fields {
            principal: "a",
            key_id: "bc",
            ..sample()
        };
        assert_ne!(a.entry_hash(), b.entry_hash());
    }

    #[test]
    fn hash_matches_the_documented_encoding() {
        let f = sample();
        let mut enc = Vec::new();
        enc.extend_from_slice(b"gateway.receipt.v1");
        enc.extend_from_slice(&1u64.to_le_bytes());
        enc.extend_from_slice(&2i64.to_le_bytes());
        enc.extend_from_slice(&3u64.to_le_bytes());
        for s in ["u", "k", "s", "a"] {
            enc.extend_from_slice(&1u32.to_le_bytes());
            enc.extend_from_slice(s.as_bytes());
        }
        enc.extend_from_slice(&32u32.to_le_bytes());
        enc.extend_from_slice(&[7; 32]);
        enc.extend_from_slice(&5u32.to_le_bytes());
        enc.extend_from_slice(b"allow");
        enc.extend_from_slice(&200i64.to_le_bytes());
        enc.extend_from_slice(&10i64.to_le_bytes());
        enc.extend_from_slice(&0u32.to_le_bytes());
        enc.extend_from_slice(&32u32.to_le_bytes());
        enc.extend_from_slice(&[0; 32]);
        enc.extend_from_slice(&2u32.to_le_bytes());
        enc.extend_from_slice(b"sk");
        let expected: [u8; 32] = Sha256::digest(&enc).into();
        assert_eq!(f.entry_hash(), expected);
    }
}
