//! The folded → SVG path is a pure function of its input: rendered with the session's
//! options, a fixed folded profile must give exactly the committed SVG.
//! Re-bless after an intended change with `BLESS=1 cargo test -p tracer --test flame_golden`.

use std::fs;
use std::path::PathBuf;

use tracer::flame::fold::Folded;
use tracer::flame::render::{self, Picture};

const FOLDED: &str = "\
cpu.auth;tokio::runtime::task::raw::poll;gateway::auth::verify;sha2::sha256::compress256 30
cpu.auth;tokio::runtime::task::raw::poll;gateway::auth::verify;subtle::ConstantTimeEq::ct_eq 4
cpu.parse;tokio::runtime::task::raw::poll;serde_json::de::from_slice 12
cpu.respond;tokio::runtime::task::raw::poll;tokio::net::TcpStream::poll_write;__x64_sys_write_[k];tcp_sendmsg_[k] 9
";

const MEDIAN: &str = "\
cpu.auth;tokio::runtime::task::raw::poll;gateway::auth::verify;sha2::sha256::compress256 60
cpu.parse;tokio::runtime::task::raw::poll;serde_json::de::from_slice 40
";

fn golden(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name)
}

fn check(name: &str, rendered: Vec<u8>) {
    let path = golden(name);
    if std::env::var_os("BLESS").is_some() {
        fs::write(&path, &rendered).unwrap();
        return;
    }
    let want =
        fs::read(&path).unwrap_or_else(|err| panic!("{}: {err}; run with BLESS=1", path.display()));
    assert!(
        want == rendered,
        "{} differs from the rendering ({} vs {} bytes); if intended, re-run with BLESS=1",
        path.display(),
        want.len(),
        rendered.len()
    );
}

fn parse(text: &str) -> Folded {
    text.parse().expect("valid folded text")
}

fn picture(title: &str) -> Picture {
    Picture {
        title: title.to_owned(),
        subtitle: "golden test".to_owned(),
        count_name: "samples",
    }
}

#[test]
fn folded_renders_to_the_golden_svg() {
    let mut svg = Vec::new();
    render::svg(&picture("golden on-CPU"), &parse(FOLDED), &mut svg).unwrap();
    // Rendering twice gives the same bytes: nothing random or time-dependent leaks in.
    let mut again = Vec::new();
    render::svg(&picture("golden on-CPU"), &parse(FOLDED), &mut again).unwrap();
    assert!(svg == again);
    check("flame-oncpu.svg", svg);
}

#[test]
fn differential_renders_to_the_golden_svg() {
    let mut svg = Vec::new();
    render::differential_svg(
        &picture("golden diff"),
        &parse(MEDIAN),
        &parse(FOLDED),
        &mut svg,
    )
    .unwrap();
    check("flame-diff.svg", svg);
}

#[test]
fn an_empty_profile_is_a_valid_svg_that_says_so() {
    let mut svg = Vec::new();
    render::svg(&picture("nothing"), &Folded::default(), &mut svg).unwrap();
    let text = String::from_utf8(svg).unwrap();
    parse_xml(&text).unwrap();
    assert!(text.contains("No stacks to draw"));
}

/// inferno's SVGs carry a DOCTYPE, which roxmltree rejects unless asked.
fn parse_xml(text: &str) -> Result<roxmltree::Document<'_>, roxmltree::Error> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, options)
}
