//! The server's master key and what is derived from it.
//!
//! One 32-byte master key lives in a file beside the database (`<db>.key`, mode 0600, hex),
//! never in the database itself. Purpose keys are `HMAC-SHA256(master, label)`:
//! - `"gateway/api-key-mac/v1"`: API key secrets are stored as `HMAC-SHA256(this, secret)`;
//! - `"gateway/vault/v1"`: AES-256-GCM key for upstream tokens;
//! - `"gateway/signer/v1"`: AES-256-GCM key wrapping the Ed25519 receipt signer.
//!
//! Sealed values are `nonce (12 random bytes) || ciphertext+tag`, with associated data naming
//! the row they belong to, so a ciphertext moved to another row fails to open.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use aes_gcm::aead::{Aead, KeyInit, Payload};
use aes_gcm::{Aes256Gcm, Nonce};
use anyhow::{Context, bail};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::Sha256;

pub type HmacSha256 = Hmac<Sha256>;

const NONCE_LEN: usize = 12;

/// Default master key location for a database path: the same path with `.key` appended.
pub fn default_key_path(db: &Path) -> PathBuf {
    let mut os = db.as_os_str().to_owned();
    os.push(".key");
    PathBuf::from(os)
}

pub struct MasterKey([u8; 32]);

impl MasterKey {
    /// Loads the key file, or creates it (0600) when `create` is set and it does not exist.
    pub fn load(path: &Path, create: bool) -> anyhow::Result<MasterKey> {
        match std::fs::read_to_string(path) {
            Ok(text) => {
                let bytes = hex::decode(text.trim())
                    .with_context(|| format!("master key file {} is not hex", path.display()))?;
                let key: [u8; 32] = bytes.try_into().map_err(|_| {
                    anyhow::anyhow!("master key file {} must hold 32 bytes", path.display())
                })?;
                Ok(MasterKey(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && create => {
                let mut key = [0u8; 32];
                rand::rngs::OsRng.fill_bytes(&mut key);
                let mut file = std::fs::OpenOptions::new()
                    .write(true)
                    .create_new(true)
                    .mode(0o600)
                    .open(path)
                    .with_context(|| format!("creating master key file {}", path.display()))?;
                writeln!(file, "{}", hex::encode(key))?;
                file.sync_all()?;
                Ok(MasterKey(key))
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => bail!(
                "master key file {} not found (run `gateway init` first, or pass --key-file)",
                path.display()
            ),
            Err(e) => Err(e).with_context(|| format!("reading {}", path.display())),
        }
    }

    pub fn derive(&self, label: &str) -> [u8; 32] {
        let mut mac =
            <HmacSha256 as Mac>::new_from_slice(&self.0).expect("HMAC takes any key length");
        mac.update(label.as_bytes());
        mac.finalize().into_bytes().into()
    }

    pub fn api_key_mac(&self) -> HmacSha256 {
        <HmacSha256 as Mac>::new_from_slice(&self.derive("gateway/api-key-mac/v1"))
            .expect("HMAC takes any key length")
    }

    pub fn vault(&self) -> Sealer {
        Sealer::new(&self.derive("gateway/vault/v1"))
    }

    pub fn signer(&self) -> Sealer {
        Sealer::new(&self.derive("gateway/signer/v1"))
    }
}

/// AES-256-GCM with a random nonce per seal.
pub struct Sealer(Aes256Gcm);

impl Sealer {
    fn new(key: &[u8; 32]) -> Sealer {
        Sealer(Aes256Gcm::new(key.into()))
    }

    pub fn seal(&self, aad: &[u8], plaintext: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_LEN];
        rand::rngs::OsRng.fill_bytes(&mut nonce);
        let ct = self
            .0
            .encrypt(
                Nonce::from_slice(&nonce),
                Payload {
                    msg: plaintext,
                    aad,
                },
            )
            .expect("AES-GCM encryption of an in-memory buffer does not fail");
        let mut out = Vec::with_capacity(NONCE_LEN + ct.len());
        out.extend_from_slice(&nonce);
        out.extend_from_slice(&ct);
        out
    }

    pub fn open(&self, aad: &[u8], sealed: &[u8]) -> anyhow::Result<Vec<u8>> {
        if sealed.len() < NONCE_LEN {
            bail!("sealed value is too short");
        }
        let (nonce, ct) = sealed.split_at(NONCE_LEN);
        self.0
            .decrypt(Nonce::from_slice(nonce), Payload { msg: ct, aad })
            .map_err(|_| anyhow::anyhow!("sealed value does not open with this master key"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seal_binds_associated_data() {
        let dir = tempfile::tempdir().expect("tempdir");
        let key = MasterKey::load(&dir.path().join("k"), true).expect("create");
        let sealer = key.vault();
        let sealed = sealer.seal(b"row-a", b"secret");
        assert_eq!(sealer.open(b"row-a", &sealed).expect("opens"), b"secret");
        assert!(sealer.open(b"row-b", &sealed).is_err());
        let again = MasterKey::load(&dir.path().join("k"), false).expect("reload");
        assert_eq!(
            again.vault().open(b"row-a", &sealed).expect("opens"),
            b"secret"
        );
    }
}
