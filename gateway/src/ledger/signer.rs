//! The Ed25519 receipt signer, stored in `signer_keys` with its secret sealed (AES-256-GCM) by
//! the master key.

use anyhow::{Context, bail};
use ed25519_dalek::{SigningKey, VerifyingKey};
use rusqlite::{Connection, OptionalExtension};
use sha2::{Digest, Sha256};

use crate::secrets::Sealer;

pub struct Signer {
    pub key_id: String,
    pub key: SigningKey,
}

fn aad(key_id: &str) -> Vec<u8> {
    [b"signer\0".as_slice(), key_id.as_bytes()].concat()
}

/// The key id: `ed25519:` and the first 8 bytes of SHA-256(public key), in hex.
pub fn key_id(public: &VerifyingKey) -> String {
    let digest = Sha256::digest(public.as_bytes());
    format!("ed25519:{}", hex::encode(&digest[..8]))
}

/// Creates the active signer unless one exists; returns its key id.
pub fn ensure(conn: &Connection, sealer: &Sealer, now_s: i64) -> anyhow::Result<String> {
    let existing: Option<String> = conn
        .query_row("SELECT key_id FROM signer_keys WHERE active = 1", [], |r| {
            r.get(0)
        })
        .optional()?;
    if let Some(id) = existing {
        return Ok(id);
    }
    let key = SigningKey::generate(&mut rand::rngs::OsRng);
    let id = key_id(&key.verifying_key());
    let sealed = sealer.seal(&aad(&id), key.as_bytes());
    conn.execute(
        "INSERT INTO signer_keys (key_id, public_key, sealed_secret, active, created_at)
         VALUES (?1, ?2, ?3, 1, ?4)",
        rusqlite::params![id, key.verifying_key().as_bytes().as_slice(), sealed, now_s],
    )?;
    Ok(id)
}

/// Loads and unseals the active signer.
pub fn load(conn: &Connection, sealer: &Sealer) -> anyhow::Result<Signer> {
    let (key_id, public, sealed): (String, Vec<u8>, Vec<u8>) = conn
        .query_row(
            "SELECT key_id, public_key, sealed_secret FROM signer_keys WHERE active = 1",
            [],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()?
        .context("no active signer key (run `gateway init`)")?;
    let secret = sealer
        .open(&aad(&key_id), &sealed)
        .context("unsealing the signer key")?;
    let secret: [u8; 32] = secret
        .try_into()
        .map_err(|_| anyhow::anyhow!("signer secret is not 32 bytes"))?;
    let key = SigningKey::from_bytes(&secret);
    if key.verifying_key().as_bytes().as_slice() != public.as_slice() {
        bail!("signer {key_id}: sealed secret does not match the stored public key");
    }
    Ok(Signer { key_id, key })
}
