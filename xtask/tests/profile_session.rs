//! Root only: a short tail session through the very command users run (`xtask profile`, the
//! built xtask binary), then every file the session README lists is checked: present, SVGs
//! well-formed with gateway frames in them, trace.json with complete events on at least three
//! tracks, and every folded file re-rendered by inferno.
//!
//! The session's probe effect is checked too: probe-effect.json with its windows, the README's
//! **Probe effect** line at the top, and breakdown.json naming the tracer's exact arguments.
//!
//! Kept short (about 45 s once the release binaries are built): a 0.5 s find-max step, a 1 s
//! warm-up, two probe-effect windows of 2 s per arm and a 6 s traced window at 25% of max.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;
use std::time::Instant;

/// Pictures with gateway stacks in them. tail-offcpu.svg has stacks only with
/// `--offcpu-stacks`, which the default session leaves off: it is checked as a file only.
const SVGS: [&str; 3] = ["tail-oncpu.svg", "all-oncpu.svg", "tail-diff.svg"];
const FOLDED: [&str; 5] = [
    "tail-oncpu.folded",
    "all-oncpu.folded",
    "tail-offcpu.folded",
    "tail-wait.folded",
    "median-oncpu.folded",
];
/// The wait-for picture: its frames are holders, with a gateway stack only where a sample of
/// the holder fell inside a wait, so it is checked for its root frame instead.
const WAIT_SVG: &str = "tail-wait.svg";
/// A frame of the gateway crate itself (its functions demangle to `gateway::...`).
const GATEWAY_FRAME: &str = "gateway::";

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// inferno's SVGs carry a DOCTYPE, which roxmltree refuses unless allowed.
fn parse_svg(text: &str) -> roxmltree::Document<'_> {
    let options = roxmltree::ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    roxmltree::Document::parse_with_options(text, options).expect("well-formed XML")
}

/// Text of every `<title>` (inferno puts each frame's name and count there).
fn frame_titles(doc: &roxmltree::Document<'_>) -> Vec<String> {
    doc.descendants()
        .filter(|n| n.has_tag_name("title"))
        .filter_map(|n| n.text().map(str::to_owned))
        .collect()
}

#[test]
fn a_short_profile_session_writes_every_file() {
    if !is_root() {
        eprintln!("SKIPPED a_short_profile_session_writes_every_file: needs root (eBPF)");
        return;
    }
    let started = Instant::now();
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("session");
    let status = Command::new(env!("CARGO_BIN_EXE_xtask"))
        .args([
            "profile",
            "--duration",
            "6",
            "--warmup",
            "1",
            "--find-max-step",
            "0.5",
            "--ab-windows",
            "2",
            "--ab-window",
            "2",
            // The tail holds 1% of 6 s of requests and little of their on-CPU time: at the
            // default 299 Hz its picture has ~5 samples, and once in a while none with a
            // gateway frame. Symbolization is what is checked here, not the rate.
            "--sample-hz",
            "999",
        ])
        .arg("--out")
        .arg(&out)
        .status()
        .expect("running xtask profile");
    assert!(status.success(), "xtask profile failed ({status})");
    eprintln!(
        "profile_session: session took {:.1}s",
        started.elapsed().as_secs_f64()
    );
    check_session(&out);
}

fn check_session(out: &Path) {
    for file in [
        "README.md",
        "breakdown.json",
        "loadgen.json",
        "trace.json",
        "pictures.json",
        "probe-effect.json",
        "profile.json",
        "tail-offcpu.svg",
    ]
    .iter()
    .chain(&SVGS)
    .chain(&FOLDED)
    .chain(&[WAIT_SVG])
    {
        assert!(
            out.join(file).is_file(),
            "{file} missing in {}",
            out.display()
        );
    }
    assert!(
        out.join("requests.csv.gz").is_file() || out.join("requests.csv").is_file(),
        "requests.csv(.gz) missing"
    );
    // The files read through the model: a key the tracer writes and the model does not know
    // fails here.
    let breakdown: session::breakdown::Breakdown =
        serde_json::from_slice(&std::fs::read(out.join("breakdown.json")).unwrap()).unwrap();
    assert!(breakdown.calibration.is_some(), "the session calibrates");
    let _: session::pictures::Pictures =
        serde_json::from_slice(&std::fs::read(out.join("pictures.json")).unwrap()).unwrap();
    let readme = std::fs::read_to_string(out.join("README.md")).unwrap();
    let first_section = readme.find("\n## ").expect("README.md has sections");
    assert!(
        readme[..first_section].contains("**Probe effect** (traced/untraced"),
        "README.md does not open with the probe effect:\n{}",
        &readme[..first_section]
    );
    let effect: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("probe-effect.json")).unwrap()).unwrap();
    let windows = effect["windows"]
        .as_array()
        .expect("probe-effect.json windows");
    let arms: Vec<&str> = windows.iter().map(|w| w["arm"].as_str().unwrap()).collect();
    assert_eq!(arms, ["untraced", "traced", "traced", "untraced"]);
    for w in windows {
        assert!(w["p99_us"].as_f64().is_some_and(|p| p > 0.0), "{w}");
        assert!(
            w["gateway_cpu_us_per_request"]
                .as_f64()
                .is_some_and(|c| c > 0.0),
            "{w}"
        );
    }
    assert_eq!(effect["comparison"]["pairs"], 2, "{effect}");
    for svg in SVGS.iter().chain(&[WAIT_SVG]) {
        assert!(readme.contains(svg), "README.md does not link {svg}");
    }
    assert!(
        readme.contains("## While the tail waited, the CPU ran"),
        "README.md has no wait-for table"
    );
    // The sampled per-phase split finds the gateway's phase frames in real stacks.
    assert!(
        readme.contains("## On-CPU time by phase (sampled)"),
        "README.md has no per-phase table"
    );
    let pictures: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("pictures.json")).unwrap()).unwrap();
    let all = &pictures["phase_samples"]["all"];
    let in_phases: u64 = all["phases"]
        .as_object()
        .expect("phase_samples.all.phases")
        .values()
        .map(|n| n.as_u64().unwrap())
        .sum();
    assert!(in_phases > 0, "no sample fell in a phase frame: {all}");
    let wait = std::fs::read_to_string(out.join(WAIT_SVG)).unwrap();
    let titles = frame_titles(&parse_svg(&wait));
    assert!(
        titles.iter().any(|t| t.starts_with("scheduling")),
        "{WAIT_SVG}: no scheduling root among {} frames",
        titles.len()
    );

    for svg in SVGS {
        let text = std::fs::read_to_string(out.join(svg)).unwrap();
        let doc = parse_svg(&text);
        assert_eq!(doc.root_element().tag_name().name(), "svg", "{svg}");
        let titles = frame_titles(&doc);
        assert!(
            titles.iter().any(|t| t.contains(GATEWAY_FRAME)),
            "{svg}: no gateway frame among {} frames",
            titles.len()
        );
    }

    let trace: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("trace.json")).unwrap())
            .expect("trace.json is JSON");
    let events = trace["traceEvents"].as_array().expect("traceEvents");
    let tracks: BTreeSet<(u64, u64)> = events
        .iter()
        .filter(|e| e["ph"] == "X")
        .map(|e| (e["pid"].as_u64().unwrap(), e["tid"].as_u64().unwrap()))
        .collect();
    assert!(
        tracks.len() >= 3,
        "complete events on {} tracks only",
        tracks.len()
    );

    for folded in FOLDED {
        let text = std::fs::read_to_string(out.join(folded)).unwrap();
        assert!(!text.trim().is_empty(), "{folded} is empty");
        let mut svg = Vec::new();
        let mut options = inferno::flamegraph::Options::default();
        inferno::flamegraph::from_lines(&mut options, text.lines(), &mut svg)
            .unwrap_or_else(|e| panic!("{folded}: inferno: {e}"));
        let svg = String::from_utf8(svg).unwrap();
        let doc = parse_svg(&svg);
        assert!(
            frame_titles(&doc).len() > 1,
            "{folded} re-rendered without frames"
        );
    }

    let breakdown: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("breakdown.json")).unwrap()).unwrap();
    assert!(breakdown["requests"].as_u64().unwrap() > 0, "{breakdown}");
    // The session's tracer ran with the flags the probe-effect windows ran with.
    let args: Vec<&str> = breakdown["record_args"]
        .as_array()
        .expect("breakdown.json record_args")
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert_eq!(args[1..3], ["record", "--pid"], "{args:?}");
    let flags: Vec<&str> = effect["tracer_flags"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    assert!(
        args.windows(flags.len()).any(|w| w == flags.as_slice()),
        "{args:?} lacks the windows' flags {flags:?}"
    );
}
