//! Folded stacks → SVG through inferno, with options that make the output a pure function of
//! the input (colors by name hash, fixed width) and keep files small (narrow frames pruned).

use std::io::{self, BufReader, Write};

use inferno::differential;
use inferno::flamegraph::color::{MultiPalette, Palette};
use inferno::flamegraph::{self, Options};

use super::fold::Folded;

/// What a picture is; becomes its title and labels.
#[derive(Clone, Debug)]
pub struct Picture {
    pub title: String,
    pub subtitle: String,
    /// What one unit of a stack's count is: `samples` or `ns`.
    pub count_name: &'static str,
}

/// Frames narrower than this share of the width (in %) are left out. At the fixed 1200 px
/// width that is ~1 px: invisible anyway, and it bounds the SVG's size.
pub const MIN_WIDTH_PCT: f64 = 0.1;

/// Deterministic inferno options: the same folded input always gives the same bytes.
pub fn options(picture: &Picture) -> Options<'static> {
    let mut opt = Options::default();
    opt.title = picture.title.clone();
    opt.subtitle = Some(picture.subtitle.clone());
    opt.count_name = picture.count_name.to_owned();
    // Kernel frames (`_[k]`) orange, Rust paths yellow, the rest red.
    opt.colors = Palette::Multi(MultiPalette::Perl);
    opt.deterministic = true;
    opt.hash = true;
    opt.image_width = Some(1200);
    opt.min_width = MIN_WIDTH_PCT;
    opt
}

/// Renders `folded`; an empty profile becomes a small SVG that says so instead of an error.
pub fn svg(picture: &Picture, folded: &Folded, out: impl Write) -> io::Result<()> {
    if folded.is_empty() {
        return empty_svg(picture, out);
    }
    let lines = folded.lines();
    flamegraph::from_lines(&mut options(picture), lines.iter().map(String::as_str), out)
}

/// A differential graph: `after` drawn with its own widths, colored by the change from
/// `before` (red = larger share in `after`), `before` scaled to `after`'s total first.
pub fn differential_svg(
    picture: &Picture,
    before: &Folded,
    after: &Folded,
    out: impl Write,
) -> io::Result<()> {
    if before.is_empty() || after.is_empty() {
        return empty_svg(picture, out);
    }
    let mut both = Vec::new();
    let opts = differential::Options {
        normalize: true,
        strip_hex: false,
    };
    differential::from_readers(
        opts,
        BufReader::new(before.to_text().as_bytes()),
        BufReader::new(after.to_text().as_bytes()),
        &mut both,
    )?;
    let text = String::from_utf8(both).map_err(io::Error::other)?;
    flamegraph::from_lines(&mut options(picture), text.lines(), out)
}

fn empty_svg(picture: &Picture, mut out: impl Write) -> io::Result<()> {
    write!(
        out,
        concat!(
            r#"<?xml version="1.0" standalone="no"?>"#,
            "\n",
            r#"<svg version="1.1" width="1200" height="90" xmlns="http://www.w3.org/2000/svg">"#,
            r#"<text x="600" y="30" text-anchor="middle" font-size="17" font-family="Verdana">{}</text>"#,
            r#"<text x="600" y="60" text-anchor="middle" font-size="12" font-family="Verdana">{}</text>"#,
            "</svg>\n"
        ),
        xml_text(&picture.title),
        xml_text(&format!("No stacks to draw. {}", picture.subtitle)),
    )
}

fn xml_text(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
