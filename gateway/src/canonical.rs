//! Canonical JSON for the params digest.
//!
//! `params_digest = SHA-256(canonical(params))`, where `canonical` is:
//! - objects: `{`, members sorted by key (byte-wise on UTF-8), `"key":value` joined by `,`, `}`;
//! - arrays: `[`, elements in order joined by `,`, `]`;
//! - strings (keys included): serde_json's escaping: `\"`, `\\`, `\n`, `\r`, `\t`, `\b`, `\f`,
//!   other control characters as `\u00XX`, everything else as raw UTF-8;
//! - numbers: as serde_json prints them (integers in decimal, floats in shortest round-trip
//!   form); `true`, `false`, `null`;
//! - no whitespace anywhere.
//!
//! The same bytes are the body sent upstream, so the digest covers exactly what the tool got.

use serde_json::Value;
use sha2::{Digest, Sha256};

/// Deepest nesting accepted in `params`, counting the params object itself as depth 1.
pub const MAX_DEPTH: usize = 32;

#[derive(Debug, PartialEq, Eq)]
pub struct TooDeep;

/// Writes the canonical encoding of `value` into `out`; fails past [`MAX_DEPTH`].
pub fn encode(value: &Value, out: &mut Vec<u8>) -> Result<(), TooDeep> {
    write_value(value, out, 1)
}

pub fn digest(canonical: &[u8]) -> [u8; 32] {
    Sha256::digest(canonical).into()
}

fn write_value(value: &Value, out: &mut Vec<u8>, depth: usize) -> Result<(), TooDeep> {
    match value {
        Value::Object(map) => {
            if depth > MAX_DEPTH {
                return Err(TooDeep);
            }
            out.push(b'{');
            // serde_json's map is usually already sorted (BTreeMap); sort only when a feature
            // elsewhere in the build (preserve_order) made it keep insertion order.
            let sorted = map.keys().is_sorted();
            if sorted {
                for (i, (k, v)) in map.iter().enumerate() {
                    write_member(i, k, v, out, depth)?;
                }
            } else {
                let mut members: Vec<_> = map.iter().collect();
                members.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
                for (i, (k, v)) in members.into_iter().enumerate() {
                    write_member(i, k, v, out, depth)?;
                }
            }
            out.push(b'}');
        }
        Value::Array(items) => {
            if depth > MAX_DEPTH {
                return Err(TooDeep);
            }
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out, depth + 1)?;
            }
            out.push(b']');
        }
        scalar => write_scalar(scalar, out),
    }
    Ok(())
}

fn write_member(
    i: usize,
    key: &str,
    value: &Value,
    out: &mut Vec<u8>,
    depth: usize,
) -> Result<(), TooDeep> {
    if i > 0 {
        out.push(b',');
    }
    write_string(key, out);
    out.push(b':');
    write_value(value, out, depth + 1)
}

fn write_string(s: &str, out: &mut Vec<u8>) {
    // Serializing a str into a Vec cannot fail.
    let _ = serde_json::to_writer(&mut *out, s);
}

fn write_scalar(value: &Value, out: &mut Vec<u8>) {
    let _ = serde_json::to_writer(&mut *out, value);
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        let mut out = Vec::new();
        encode(v, &mut out).expect("shallow");
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn sorts_keys_and_drops_whitespace() {
        let v: Value =
            serde_json::from_str(r#"{ "b": [1, {"z":1,"a":"x\n"}], "a": null }"#).expect("json");
        assert_eq!(canon(&v), r#"{"a":null,"b":[1,{"a":"x\n","z":1}]}"#);
    }

    #[test]
    fn equal_values_have_equal_digests() {
        let a: Value = serde_json::from_str(r#"{"x":1,"y":2}"#).expect("json");
        let b: Value = serde_json::from_str(r#"{"y":2,  "x":1}"#).expect("json");
        assert_eq!(digest(canon(&a).as_bytes()), digest(canon(&b).as_bytes()));
    }

    #[test]
    fn depth_limit_counts_params_as_one() {
        let mut v = json!({});
        for _ in 1..MAX_DEPTH {
            v = json!({ "n": v });
        }
        assert!(encode(&v, &mut Vec::new()).is_ok());
        let deeper = json!({ "n": v });
        assert_eq!(encode(&deeper, &mut Vec::new()), Err(TooDeep));
    }
}
