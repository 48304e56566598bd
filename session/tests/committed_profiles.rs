//! Every recorded profile session's files parse with the model (a key the model does not
//! know, or one it needs and the file lacks, fails here), and breakdown.json and loadgen.json
//! written back from the model are the very bytes recorded.

use std::fs;
use std::path::{Path, PathBuf};

use session::breakdown::Breakdown;
use session::effect::ProbeEffect;
use session::loadgen::{FindMax, Summary};
use session::pictures::Pictures;
use session::requests::{IncompleteRow, RequestRow, rows};

/// profiles/2026-12-*: the tracer (profile) sessions.
fn sessions() -> Vec<PathBuf> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles");
    let dirs = session::runs_holding(&root, session::breakdown::FILE).unwrap();
    assert!(
        dirs.len() >= 12,
        "profile sessions under {}",
        root.display()
    );
    dirs
}

fn read(dir: &Path, name: &str) -> String {
    fs::read_to_string(dir.join(name)).unwrap_or_else(|e| panic!("{}/{name}: {e}", dir.display()))
}

fn parse<T: serde::de::DeserializeOwned>(dir: &Path, name: &str) -> T {
    serde_json::from_str(&read(dir, name))
        .unwrap_or_else(|e| panic!("{}/{name}: {e}", dir.display()))
}

/// Fails unless `back`, the file parsed and written back as its writer writes it, is `name`'s
/// text to the byte.
fn assert_written_back(dir: &Path, name: &str, back: &str, text: &str) {
    assert!(
        back == text,
        "{}: {name} written back differs",
        dir.display()
    );
}

/// JSON as loadgen and the tracer's pictures write it: pretty, with a final newline.
fn pretty<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_string_pretty(value).unwrap() + "\n"
}

#[test]
fn breakdown_json_round_trips_byte_for_byte() {
    for dir in sessions() {
        let text = read(&dir, session::breakdown::FILE);
        let breakdown =
            Breakdown::from_json(&text).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_written_back(&dir, session::breakdown::FILE, &breakdown.to_json(), &text);
    }
}

#[test]
fn loadgen_json_round_trips_and_find_max_parses() {
    for dir in sessions() {
        let text = read(&dir, session::loadgen::LOADGEN_JSON);
        let summary: Summary = parse(&dir, session::loadgen::LOADGEN_JSON);
        assert_written_back(
            &dir,
            session::loadgen::LOADGEN_JSON,
            &pretty(&summary),
            &text,
        );
        // A session given its max with --max-rate searched none (profile.json says so).
        if dir.join(session::loadgen::FIND_MAX_JSON).exists() {
            let find_max: FindMax = parse(&dir, session::loadgen::FIND_MAX_JSON);
            assert!(find_max.max_rate > 0.0, "{}", dir.display());
        } else {
            assert!(
                read(&dir, "profile.json").contains("\"given with --max-rate\""),
                "{}: no find-max.json, and its max was not given",
                dir.display()
            );
        }
    }
}

#[test]
fn pictures_and_probe_effect_parse() {
    let mut effects = 0;
    for dir in sessions() {
        let pictures: Pictures = parse(&dir, session::pictures::FILE);
        assert!(pictures.requests > 0, "{}", dir.display());
        // The tracer writes every key since 2026-12-02 (hardened): those files come back whole.
        let text = read(&dir, session::pictures::FILE);
        if text.contains("\"wait_all_of\"") {
            assert_written_back(&dir, session::pictures::FILE, &pretty(&pictures), &text);
        }
        if dir.join(session::effect::FILE).is_file() {
            let effect: ProbeEffect = parse(&dir, session::effect::FILE);
            assert_eq!(effect.windows.len() as u64, 2 * effect.windows_per_arm);
            effects += 1;
        }
    }
    assert!(effects >= 8, "sessions with probe-effect.json: {effects}");
}

#[test]
fn request_rows_parse_and_agree_with_breakdown() {
    for dir in sessions() {
        let breakdown = Breakdown::from_json(&read(&dir, session::breakdown::FILE)).unwrap();
        let gz = fs::File::open(dir.join("requests.csv.gz")).unwrap();
        let mut n = 0u64;
        for row in rows::<RequestRow, _>(flate2::read::GzDecoder::new(gz)) {
            let row = row.unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
            assert_eq!(row.total_ns, row.t_done_ns - row.t_arrive_ns);
            n += 1;
        }
        assert_eq!(n, breakdown.requests, "{}", dir.display());
        let incomplete: Vec<IncompleteRow> =
            rows(fs::File::open(dir.join(session::requests::INCOMPLETE_CSV)).unwrap())
                .collect::<Result<_, _>>()
                .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        assert_eq!(
            incomplete.len() as u64,
            breakdown.incomplete,
            "{}",
            dir.display()
        );
    }
}

#[test]
fn a_renamed_breakdown_key_fails_naming_it() {
    let dir = sessions().pop().unwrap();
    let text = read(&dir, session::breakdown::FILE);
    for (from, to) in [
        ("\"lost_events\"", "\"events_lost\""),
        ("\"p99_us\"", "\"p99\""),
    ] {
        let renamed = text.replacen(from, to, 1);
        let err = Breakdown::from_json(&renamed).unwrap_err().to_string();
        assert!(err.contains(to.trim_matches('"')), "{from} → {to}: {err}");
    }
    let missing = text.replacen("\"lost_events\": 0,\n", "", 1);
    assert_ne!(missing, text);
    let err = Breakdown::from_json(&missing).unwrap_err().to_string();
    assert!(err.contains("missing field `lost_events`"), "{err}");
}

#[test]
fn a_calibration_spread_written_as_null_still_reads() {
    // The tracer writes a non-finite float as null; the session's file must still read.
    let dir =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../profiles/2026-12-02-25pct-0ms-hardened");
    let text = read(&dir, session::breakdown::FILE);
    let nulled = text
        .replacen(
            "\"sched\": [-46.900, 168.300]",
            "\"sched\": [null, null]",
            1,
        )
        .replacen("\"sched\": 1183.600", "\"sched\": null", 1);
    assert_ne!(nulled, text);
    let breakdown = Breakdown::from_json(&nulled).unwrap();
    let calibration = breakdown.calibration.as_ref().unwrap();
    assert_eq!(calibration.ns_per_hit_min_max["sched"], [None, None]);
    assert_eq!(calibration.untraced_ns_per_loop["sched"], None);
    assert_eq!(breakdown.to_json(), nulled);
}
