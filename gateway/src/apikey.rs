//! API keys: `ak_<key_id>_<secret>`, with a 16-hex-digit id and a 64-hex-digit secret.
//!
//! The database keeps `HMAC-SHA256(api-key-mac key, secret)`, never the secret. A request's key
//! is found by id (one hash-map lookup) and its MAC compared in constant time.

use hmac::Mac;
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::secrets::HmacSha256;

pub const ID_HEX: usize = 16;
pub const SECRET_HEX: usize = 64;

/// A parsed `Authorization` credential, borrowing from the header.
#[derive(Debug, PartialEq, Eq)]
pub struct Presented<'a> {
    pub key_id: &'a str,
    pub secret: &'a str,
}

/// Parses `Bearer ak_<id>_<secret>`; `None` when it is not of that shape.
pub fn parse_authorization(header: &[u8]) -> Option<Presented<'_>> {
    let text = std::str::from_utf8(header).ok()?;
    let (scheme, token) = text.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("bearer") {
        return None;
    }
    let rest = token.trim().strip_prefix("ak_")?;
    let (key_id, secret) = rest.split_once('_')?;
    let hex = |s: &str, len| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    (hex(key_id, ID_HEX) && hex(secret, SECRET_HEX)).then_some(Presented { key_id, secret })
}

pub fn secret_mac(mac_key: &HmacSha256, secret: &str) -> [u8; 32] {
    let mut mac = mac_key.clone();
    mac.update(secret.as_bytes());
    mac.finalize().into_bytes().into()
}

pub fn mac_matches(mac_key: &HmacSha256, secret: &str, stored: &[u8; 32]) -> bool {
    secret_mac(mac_key, secret).ct_eq(stored).into()
}

/// A fresh key: (key_id, secret, full `ak_...` string).
pub fn generate() -> (String, String, String) {
    let mut id = [0u8; ID_HEX / 2];
    let mut secret = [0u8; SECRET_HEX / 2];
    rand::rngs::OsRng.fill_bytes(&mut id);
    rand::rngs::OsRng.fill_bytes(&mut secret);
    let (id, secret) = (hex::encode(id), hex::encode(secret));
    let full = format!("ak_{id}_{secret}");
    (id, secret, full)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_only_well_formed_keys() {
        let (id, secret, full) = generate();
        let header = format!("Bearer {full}");
        assert_eq!(
            parse_authorization(header.as_bytes()),
            Some(Presented {
                key_id: &id,
                secret: &secret
            })
        );
        for bad in [
            "Basic abc",
            "Bearer",
            "Bearer ak_",
            "Bearer ak_123_456",
            "Bearer xx_0123456789abcdef_00",
            &format!("Bearer ak_{id}{secret}"),
        ] {
            assert_eq!(parse_authorization(bad.as_bytes()), None, "{bad}");
        }
        assert_eq!(parse_authorization(&[0xff, 0xfe]), None);
    }

    #[test]
    fn mac_comparison() {
        let key = HmacSha256::new_from_slice(b"k").expect("key");
        let stored = secret_mac(&key, "s1");
        assert!(mac_matches(&key, "s1", &stored));
        assert!(!mac_matches(&key, "s2", &stored));
    }
}
