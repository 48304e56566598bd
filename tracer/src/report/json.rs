//! A small ordered JSON writer: keys come out in the order written, so `breakdown.json` is
//! byte-for-byte deterministic whatever features serde_json is built with.

use std::fmt::Write;

pub(crate) enum Value {
    Int(u64),
    /// Printed with 3 decimals.
    Num(f64),
    Str(String),
    Null,
    Bool(bool),
    Arr(Vec<Value>),
    Obj(Vec<(String, Value)>),
}

impl Value {
    pub(crate) fn obj() -> Self {
        Value::Obj(Vec::new())
    }

    pub(crate) fn with(mut self, key: &str, value: Value) -> Self {
        if let Value::Obj(fields) = &mut self {
            fields.push((key.to_owned(), value));
        }
        self
    }

    /// Converts a serde_json value; objects keep serde_json's (sorted) key order.
    pub(crate) fn from_serde(v: &serde_json::Value) -> Value {
        use serde_json::Value as J;
        match v {
            J::Null => Value::Null,
            J::Bool(b) => Value::Bool(*b),
            J::Number(n) => n
                .as_u64()
                .map_or_else(|| n.as_f64().map_or(Value::Null, Value::Num), Value::Int),
            J::String(s) => Value::Str(s.clone()),
            J::Array(items) => Value::Arr(items.iter().map(Value::from_serde).collect()),
            J::Object(map) => Value::Obj(
                map.iter()
                    .map(|(k, x)| (k.clone(), Value::from_serde(x)))
                    .collect(),
            ),
        }
    }

    pub(crate) fn render(&self) -> String {
        let mut out = String::new();
        self.write(&mut out, 0);
        out.push('\n');
        out
    }

    fn write(&self, out: &mut String, indent: usize) {
        match self {
            Value::Int(n) => write!(out, "{n}").expect("writing to a String"),
            Value::Num(x) if x.is_finite() => write!(out, "{x:.3}").expect("writing to a String"),
            Value::Num(_) | Value::Null => out.push_str("null"),
            Value::Str(s) => quote(out, s),
            Value::Bool(b) => write!(out, "{b}").expect("writing to a String"),
            Value::Arr(items) => {
                out.push('[');
                for (i, v) in items.iter().enumerate() {
                    if i > 0 {
                        out.push_str(", ");
                    }
                    v.write(out, indent);
                }
                out.push(']');
            }
            Value::Obj(fields) if fields.is_empty() => out.push_str("{}"),
            Value::Obj(fields) => {
                out.push_str("{\n");
                for (i, (k, v)) in fields.iter().enumerate() {
                    out.push_str(&"  ".repeat(indent + 1));
                    quote(out, k);
                    out.push_str(": ");
                    v.write(out, indent + 1);
                    out.push_str(if i + 1 < fields.len() { ",\n" } else { "\n" });
                }
                out.push_str(&"  ".repeat(indent));
                out.push('}');
            }
        }
    }
}

fn quote(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if u32::from(c) < 0x20 => {
                write!(out, "\\u{:04x}", u32::from(c)).expect("writing to a String")
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_valid_ordered_json() {
        let v = Value::obj()
            .with("b", Value::Int(1))
            .with(
                "a",
                Value::Obj(vec![
                    ("x\"y".into(), Value::Num(0.5)),
                    ("n".into(), Value::Null),
                ]),
            )
            .with("e", Value::obj())
            .with("s", Value::Str("tab\there".into()))
            .with(
                "extra",
                Value::from_serde(&serde_json::json!({"z": [1, 2.5, true, null], "a": "x"})),
            );
        let text = v.render();
        assert!(text.find("\"b\"").unwrap() < text.find("\"a\"").unwrap());
        let parsed: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(parsed["a"]["x\"y"], 0.5);
        assert_eq!(parsed["s"], "tab\there");
        assert_eq!(
            parsed["extra"]["z"],
            serde_json::json!([1, 2.5, true, null])
        );
        assert_eq!(parsed["extra"]["a"], "x");
    }
}
