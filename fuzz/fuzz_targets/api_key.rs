//! API-key parsing (`Authorization: Bearer ak_<16 hex>_<64 hex>`): any header bytes → a key
//! or `None` (the gateway's 401), never a panic. A key it returns is exactly the one the
//! header carried, and it authenticates against its own MAC only.

#![no_main]

use gateway::{apikey, secrets::HmacSha256};
use hmac::Mac as _;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|header: &[u8]| {
    let Some(presented) = apikey::parse_authorization(header) else {
        return;
    };
    let hex = |s: &str, len| s.len() == len && s.bytes().all(|b| b.is_ascii_hexdigit());
    assert!(hex(presented.key_id, apikey::ID_HEX), "{presented:?}");
    assert!(hex(presented.secret, apikey::SECRET_HEX), "{presented:?}");
    let text = std::str::from_utf8(header).expect("a parsed header is UTF-8");
    let (scheme, token) = text.split_once(' ').expect("scheme and token");
    assert!(scheme.eq_ignore_ascii_case("bearer"), "{scheme:?}");
    let carried = format!("ak_{}_{}", presented.key_id, presented.secret);
    assert_eq!(token.trim(), carried);

    let mac_key = HmacSha256::new_from_slice(b"fuzz").expect("HMAC takes any key length");
    let stored = apikey::secret_mac(&mac_key, presented.secret);
    assert!(apikey::mac_matches(&mac_key, presented.secret, &stored));
    // Any other secret, even one that differs only in the case of a digit, is refused.
    let mut other = presented.secret.to_owned();
    let flipped = match other.as_bytes()[0] {
        b'0' => '1',
        b if b.is_ascii_lowercase() => b.to_ascii_uppercase() as char,
        _ => '0',
    };
    other.replace_range(..1, flipped.encode_utf8(&mut [0; 4]));
    assert!(!apikey::mac_matches(&mac_key, &other, &stored), "{other}");
});
