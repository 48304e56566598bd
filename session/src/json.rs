//! The layout breakdown.json has always had: two-space indented objects, arrays on one line
//! (`[a, b]`, an object inside one opening on the same line), floats with three decimals,
//! a non-finite float as `null`, control characters as `\u00XX`. A serde_json [`Formatter`],
//! so the file is written by serializing the typed model, byte for byte as before.

use std::io::{self, Write};

use serde::{Deserialize, Deserializer, Serialize};
use serde_json::ser::{CharEscape, Formatter};

/// A key that is present, null or not: `Some(None)` for null, `None` only when absent (with
/// `#[serde(default, deserialize_with = "present")]` on an `Option<Option<T>>`; serde alone
/// reads a null as absent, and the file would not be written back as it was).
pub fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(
    d: D,
) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// `value` in breakdown.json's layout, with a final newline.
pub fn to_string_3dp<T: Serialize + ?Sized>(value: &T) -> serde_json::Result<String> {
    let mut out = Vec::new();
    let mut ser = serde_json::Serializer::with_formatter(&mut out, ThreeDecimals::default());
    value.serialize(&mut ser)?;
    out.push(b'\n');
    Ok(String::from_utf8(out).expect("serde_json writes UTF-8"))
}

#[derive(Default)]
struct ThreeDecimals {
    /// Objects open around the value being written (arrays do not indent).
    depth: usize,
    /// Whether each open object has had a key yet.
    has_key: Vec<bool>,
}

impl ThreeDecimals {
    fn indent<W: ?Sized + Write>(&self, w: &mut W) -> io::Result<()> {
        for _ in 0..self.depth {
            w.write_all(b"  ")?;
        }
        Ok(())
    }
}

impl Formatter for ThreeDecimals {
    fn write_f64<W: ?Sized + Write>(&mut self, w: &mut W, value: f64) -> io::Result<()> {
        write!(w, "{value:.3}")
    }

    fn write_f32<W: ?Sized + Write>(&mut self, w: &mut W, value: f32) -> io::Result<()> {
        write!(w, "{value:.3}")
    }

    fn write_char_escape<W: ?Sized + Write>(
        &mut self,
        w: &mut W,
        escape: CharEscape,
    ) -> io::Result<()> {
        let byte = match escape {
            CharEscape::Quote => return w.write_all(b"\\\""),
            CharEscape::ReverseSolidus => return w.write_all(b"\\\\"),
            CharEscape::Solidus => b'/',
            CharEscape::Backspace => 0x08,
            CharEscape::FormFeed => 0x0c,
            CharEscape::LineFeed => b'\n',
            CharEscape::CarriageReturn => b'\r',
            CharEscape::Tab => b'\t',
            CharEscape::AsciiControl(byte) => byte,
        };
        write!(w, "\\u{byte:04x}")
    }

    fn begin_array_value<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if first { Ok(()) } else { w.write_all(b", ") }
    }

    fn begin_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth += 1;
        self.has_key.push(false);
        w.write_all(b"{")
    }

    fn end_object<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        self.depth -= 1;
        if self.has_key.pop() == Some(true) {
            w.write_all(b"\n")?;
            self.indent(w)?;
        }
        w.write_all(b"}")
    }

    fn begin_object_key<W: ?Sized + Write>(&mut self, w: &mut W, first: bool) -> io::Result<()> {
        if let Some(has_key) = self.has_key.last_mut() {
            *has_key = true;
        }
        w.write_all(if first { b"\n" } else { b",\n" })?;
        self.indent(w)
    }

    fn begin_object_value<W: ?Sized + Write>(&mut self, w: &mut W) -> io::Result<()> {
        w.write_all(b": ")
    }
}

/// Test support: `text` with its first `"from"` renamed `"to"` does not read as a `T`, and
/// the error names `to`.
#[cfg(test)]
pub(crate) fn assert_rename_is_named<T: serde::de::DeserializeOwned + std::fmt::Debug>(
    text: &str,
    from: &str,
    to: &str,
) {
    let renamed = text.replacen(&format!("\"{from}\""), &format!("\"{to}\""), 1);
    let err = serde_json::from_str::<T>(&renamed).unwrap_err().to_string();
    assert!(err.contains(to), "{err}");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn objects_indent_arrays_stay_on_a_line_and_floats_have_three_decimals() {
        let value = serde_json::json!({
            "b": 1,
            "a": {"x\"y": 0.5, "n": null, "nan": f64::NAN},
            "e": {},
            "l": [],
            "s": "tab\there",
            "rows": [{"id": 1, "f": 2.0}, {"id": 2, "f": -3.25}],
        });
        let text = to_string_3dp(&value).unwrap();
        let expected = r#"{
  "a": {
    "n": null,
    "nan": null,
    "x\"y": 0.500
  },
  "b": 1,
  "e": {},
  "l": [],
  "rows": [{
    "f": 2.000,
    "id": 1
  }, {
    "f": -3.250,
    "id": 2
  }],
  "s": "tab\u0009here"
}
"#;
        assert_eq!(text, expected);
        let back: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(back["s"], "tab\there");
    }
}
