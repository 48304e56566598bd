//! The session's README.md, written only from the session's own files (breakdown.json,
//! requests.csv, loadgen.json, pictures.json, probe-effect.json), read through the model
//! (`session`): every figure in it can be recomputed from them, and a renamed key is an error.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, ensure};
use session::breakdown::{BandParts, Breakdown};
use session::effect::ProbeEffect;
use session::loadgen::Summary as Loadgen;
use session::pictures::{Pictures, Wait};
use session::requests::RequestRow;
use session::stats::nearest_rank;
use session::targets::{GATE_P99_ADDED_US, PROBE_EFFECT_RATIO};

use super::SessionFacts;
use super::compare::TailFacts;
use super::phases;
use super::target::Target;
use crate::workspace::read_json;

/// The session's own A/B windows and their ratios (see `effect`).
pub const PROBE_EFFECT_JSON: &str = session::effect::FILE;

/// Per-request overheads from the tracer's requests.csv, in ns.
#[derive(Debug, Default, PartialEq)]
pub struct Overheads {
    pub overhead: Vec<u64>,
    /// Overhead minus ledger_fsync: what the gateway adds besides the disk's fdatasync.
    pub non_fsync: Vec<u64>,
}

/// Reads requests.csv's rows (session::requests::RequestRow), sorted.
pub fn overheads(csv: impl std::io::Read) -> anyhow::Result<Overheads> {
    let mut out = Overheads::default();
    for row in session::requests::rows::<RequestRow, _>(csv) {
        let row = row.context("reading requests.csv")?;
        out.overhead.push(row.overhead_ns);
        out.non_fsync.push(row.non_fsync_ns());
    }
    out.overhead.sort_unstable();
    out.non_fsync.sort_unstable();
    Ok(out)
}

/// Nearest-rank percentile (p in per mille) of sorted values, in µs.
fn pct_us(sorted: &[u64], permille: usize) -> f64 {
    nearest_rank(sorted, permille).map_or(f64::NAN, |ns| ns as f64 / 1e3)
}

/// A session's files, read through the model.
pub struct Files {
    pub breakdown: Breakdown,
    pub loadgen: Loadgen,
    pub pictures: Pictures,
    /// None for a session recorded before a session measured its own probe effect
    /// (2026-12-01).
    pub effect: Option<ProbeEffect>,
    pub overheads: Overheads,
}

impl Files {
    /// Reads requests.csv, or the requests.csv.gz a finished session keeps.
    pub fn read(dir: &Path) -> anyhow::Result<Files> {
        let csv = dir.join(session::requests::REQUESTS_CSV);
        let overheads = match fs::File::open(&csv) {
            Ok(file) => overheads(std::io::BufReader::new(file))?,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let gz = fs::File::open(csv.with_extension("csv.gz"))
                    .context("reading requests.csv or requests.csv.gz")?;
                overheads(flate2::read::GzDecoder::new(std::io::BufReader::new(gz)))?
            }
            Err(e) => return Err(e).context("reading requests.csv"),
        };
        ensure!(
            !overheads.overhead.is_empty(),
            "requests.csv has no complete request"
        );
        Ok(Files {
            breakdown: read_json(&dir.join(session::breakdown::FILE))?,
            loadgen: read_json(&dir.join(session::loadgen::LOADGEN_JSON))?,
            pictures: read_json(&dir.join(session::pictures::FILE))?,
            effect: read_if_there(&dir.join(PROBE_EFFECT_JSON))?,
            overheads,
        })
    }
}

/// `path` read as its type, or None when there is no such file.
fn read_if_there<T: serde::de::DeserializeOwned>(path: &Path) -> anyhow::Result<Option<T>> {
    if path.exists() {
        read_json(path).map(Some)
    } else {
        Ok(None)
    }
}

/// What `cargo xtask profile` knew of the run (`SessionFacts`), beside the session's files.
pub const FACTS_JSON: &str = "profile.json";

/// Writes `dir/profile.json` and `dir/README.md`, and returns the README's path.
pub fn write(dir: &Path, facts: &SessionFacts) -> anyhow::Result<PathBuf> {
    let mut json = serde_json::to_string_pretty(facts)?;
    json.push('\n');
    fs::write(dir.join(FACTS_JSON), json)?;
    let text = render(facts, &Files::read(dir)?, &compared(dir, facts)?);
    let path = dir.join("README.md");
    fs::write(&path, text)?;
    Ok(path)
}

/// `--compare`: the earlier session's tail, read from the directory its README link names.
fn compared(dir: &Path, facts: &SessionFacts) -> anyhow::Result<Option<TailFacts>> {
    let Some(link) = &facts.compare else {
        return Ok(None);
    };
    let earlier = dir.join(link);
    let earlier = earlier.parent().unwrap_or(&earlier);
    TailFacts::read(earlier)
        .map(Some)
        .with_context(|| format!("the compared session {}", earlier.display()))
}

/// `412` or `41.2`; a missing figure is "–".
fn num(value: Option<f64>) -> String {
    match value {
        Some(x) if x.abs() >= 100.0 => format!("{x:.0}"),
        Some(x) => format!("{x:.1}"),
        None => "–".to_owned(),
    }
}

/// Compact JSON of a small map or list, as the README quotes it (`{"unsent":4}`).
fn quoted(value: &impl serde::Serialize) -> String {
    serde_json::to_string(value).expect("a map of strings serializes")
}

/// A band's parts with a share (upstream has none), largest share first, then by name.
fn view_parts(parts: &BandParts) -> Vec<(String, f64, f64)> {
    Breakdown::by_share(parts)
        .into_iter()
        .map(|(name, p)| (name.to_owned(), p.mean_us, p.share.unwrap_or(0.0)))
        .collect()
}

/// Sends more than this late (p99 of sent − scheduled) mean the open loop fell behind.
const SEND_LAG_LIMIT_US: f64 = 1000.0;

/// A warning when the gateway did not keep up with the open loop: requests never sent, a
/// send lag over [`SEND_LAG_LIMIT_US`] at p99, or under 95% of the target rate achieved. The
/// figures then describe a saturated gateway, not the load fraction asked for.
#[derive(askama::Template)]
#[template(path = "profile/overload.md", escape = "none")]
struct Overload {
    /// The target, as "the traced nginx" names it.
    name: &'static str,
    unsent: u64,
    lag_p99: f64,
    achieved: f64,
    target_rate: f64,
}

fn overload_warning(loadgen: &Loadgen, target_rate: f64, target: Target) -> Option<String> {
    use askama::Template as _;
    let o = Overload {
        name: target.name(),
        unsent: loadgen.unsent(),
        lag_p99: loadgen.send_lag_us.as_ref().map_or(0.0, |lag| lag.p99),
        achieved: loadgen.achieved_rate,
        target_rate,
    };
    let behind = o.unsent > 0 || o.lag_p99 > SEND_LAG_LIMIT_US || o.achieved < 0.95 * o.target_rate;
    behind.then(|| o.render().expect("the overload warning renders"))
}

/// Figures as the README writes them, for the templates.
trait Figures {
    /// [`num`] of a figure the template has (by value or through references).
    fn num(&self, value: impl Figure) -> String {
        num(Some(value.get()))
    }

    /// [`num`], "–" for a missing figure.
    fn opt(&self, value: &Option<f64>) -> String {
        num(*value)
    }
}

/// An `f64` however many references the template's bindings put around it.
trait Figure {
    fn get(&self) -> f64;
}

impl Figure for f64 {
    fn get(&self) -> f64 {
        *self
    }
}

impl<T: Figure + ?Sized> Figure for &T {
    fn get(&self) -> f64 {
        (**self).get()
    }
}

/// Each kind's figure, `None` where calibration could not measure it: null, or (in a session
/// recorded before that) a figure at or below zero.
fn measured_kinds(costs: &BTreeMap<String, Option<f64>>) -> Vec<(&str, Option<f64>)> {
    (costs.iter())
        .map(|(kind, ns)| (kind.as_str(), ns.filter(|ns| *ns > 0.0)))
        .collect()
}

/// "Tracer cost and loss": what the tracer lost and what it cost, all from breakdown.json
/// (`lost_events`, `incomplete`, `calibration`, `hits_per_request`, `cost`). Loss comes first
/// and is flagged when non-zero.
#[derive(askama::Template)]
#[template(path = "profile/cost_and_loss.md", escape = "none")]
struct CostAndLoss<'a> {
    b: &'a Breakdown,
    /// Where its probe effect is measured: `validate` for the gateway, the session itself for a
    /// proxy.
    target: Target,
    reasons: String,
    per_hit: Vec<(&'a str, Option<f64>)>,
    by_kind: Vec<(&'a str, Option<f64>)>,
    noisy: String,
    left_out: &'a [String],
    bpf: Option<BpfRunTime>,
    bpf_stats: &'a str,
    cpu_session_s: Option<f64>,
    cpu_user_s: Option<f64>,
    cpu_system_s: Option<f64>,
    /// NaN when unknown, as the README has always said it.
    peak_rss_mib: f64,
    /// Seconds the reader ran at normal priority, having fallen behind; 0 when it kept up.
    reader_behind_s: f64,
}

impl Figures for CostAndLoss<'_> {}

struct BpfRunTime {
    per_request_ns: f64,
    run_ms: f64,
    runs: u64,
    /// NaN when unknown.
    cpu_share: f64,
}

fn cost_and_loss(b: &Breakdown, target: Target) -> String {
    use askama::Template as _;
    let calibration = b.calibration.as_ref();
    let cost = b.cost.as_ref();
    let tracer = cost.map(|c| &c.tracer);
    let own = b.tracer.as_ref();
    CostAndLoss {
        b,
        target,
        reasons: quoted(&b.incomplete_reasons),
        per_hit: calibration.map_or_else(Vec::new, |c| measured_kinds(&c.ns_per_hit)),
        by_kind: calibration.map_or_else(Vec::new, |c| {
            measured_kinds(&c.probe_ns_per_request_by_kind)
        }),
        noisy: calibration.map_or_else(String::new, |c| quoted(&c.noisy)),
        left_out: calibration
            .and_then(|c| c.unmeasured.as_deref())
            .unwrap_or_default(),
        bpf: cost
            .and_then(|c| c.bpf.as_ref())
            .filter(|_| b.requests > 0)
            .map(|bpf| BpfRunTime {
                per_request_ns: bpf.total_run_time_ns as f64 / b.requests as f64,
                run_ms: bpf.total_run_time_ns as f64 / 1e6,
                runs: bpf.total_run_count,
                cpu_share: bpf.cpu_share.unwrap_or(f64::NAN),
            }),
        bpf_stats: cost.map_or("no `cost` section", |c| c.bpf_stats.as_str()),
        cpu_session_s: tracer.map(|t| t.cpu_session_s),
        cpu_user_s: tracer.map(|t| t.cpu_user_s).or(own.map(|t| t.cpu_user_s)),
        cpu_system_s: tracer
            .map(|t| t.cpu_system_s)
            .or(own.map(|t| t.cpu_system_s)),
        peak_rss_mib: tracer
            .and_then(|t| t.peak_rss_kib)
            .map_or(f64::NAN, |kib| kib as f64)
            / 1024.0,
        reader_behind_s: own.and_then(|t| t.reader_behind_s).unwrap_or(0.0),
    }
    .render()
    .expect("the cost and loss template renders")
}

/// The README: `templates/profile/README.md` over the session's files and the figures and
/// verdicts computed from them here; the template only lays them out. (askama drops a
/// template file's last newline: the template ends with a blank line so the README ends with
/// a newline.)
#[derive(askama::Template)]
#[template(path = "profile/README.md", escape = "none")]
struct Readme<'a> {
    f: &'a SessionFacts,
    /// The command that printed a proxy's `f.target_version` (`nginx -v`); None for the
    /// gateway.
    version_command: Option<String>,
    b: &'a Breakdown,
    loadgen: &'a Loadgen,
    pictures: &'a Pictures,
    effect: Option<&'a ProbeEffect>,
    o: &'a Overheads,
    effect_line: String,
    effect_warning: Option<String>,
    effect_table: Option<String>,
    overloaded: Option<String>,
    /// breakdown.json's parts by name, as the README has always listed them; a kernel-only
    /// target's without the gateway's parts, zero throughout (`always_zero`).
    parts: Vec<(&'a String, &'a session::breakdown::PartStats)>,
    always_zero: Vec<&'a String>,
    cost_and_loss: String,
    has_median: bool,
    /// Tail rows with a share, largest first; `tail_rows` leaves out the parts zero in both
    /// bands (`cpu.<phase>` without --phases).
    tail_rows_all: Vec<TailRow>,
    tail_rows: Vec<TailRow>,
    phases_section: String,
    wait_tables: String,
    errors: String,
    offcpu_stacks: bool,
    wait_scheduling_ns: u64,
    /// The probe-effect budget the Reading weighs the tail against.
    budget: f64,
    /// Overhead p50, p99, p99.9 µs.
    overhead: (f64, f64, f64),
    /// Overhead without ledger_fsync, p50 and p99 µs.
    non_fsync: (f64, f64),
    phases_reading: Option<String>,
    compare_reading: Option<String>,
    gate: session::targets::Verdict,
    gate_ms: f64,
}

impl Figures for Readme<'_> {}

impl Readme<'_> {
    /// "412 µs", or "–".
    fn us(&self, x: &Option<f64>) -> String {
        x.map_or("–".to_owned(), |x| self.us_of(x))
    }

    /// "412 µs".
    fn us_of(&self, x: impl Figure) -> String {
        format!("{:.0} µs", x.get())
    }
}

/// The probe-effect line of a session recorded before sessions measured their own.
const UNMEASURED_EFFECT: &str = "**Probe effect**: not measured. This session was recorded before \
     `cargo xtask profile` measured its own tracer's effect (2026-12-02), so its figures include \
     the tracer's cost by an amount it does not state; the validation runs of the same day \
     (profiles/validation-*) measured the tracer's effect apart.";

#[derive(Clone)]
struct TailRow {
    name: String,
    mean: f64,
    share: f64,
    /// The median band's mean and share of the same part.
    median: Option<(f64, f64)>,
}

fn render(facts: &SessionFacts, files: &Files, compared: &Option<TailFacts>) -> String {
    use askama::Template as _;
    let Files {
        breakdown: b,
        loadgen,
        pictures,
        effect,
        overheads: o,
    } = files;
    let median = view_parts(&b.median.parts);
    let tail_rows_all: Vec<TailRow> = view_parts(&b.tail.parts)
        .into_iter()
        .map(|(name, mean, share)| TailRow {
            median: (median.iter())
                .find(|(n, _, _)| *n == name)
                .map(|(_, mean, share)| (*mean, *share)),
            name,
            mean,
            share,
        })
        .collect();
    let tail_rows = (tail_rows_all.iter())
        .filter(|row| row.mean != 0.0 || row.median.is_some_and(|(mean, _)| mean != 0.0))
        .cloned()
        .collect();
    let mut parts: Vec<_> = b.parts.iter().collect();
    parts.sort_by(|x, y| x.0.cmp(y.0));
    // Kernel-only mode keeps the gateway's parts in breakdown.json, at zero; its README lists
    // those zero throughout in one line, as the tracer's report does.
    let (always_zero, parts): (Vec<_>, Vec<_>) = parts
        .into_iter()
        .partition(|(_, p)| facts.target.kernel_only() && p.max_us == 0.0 && p.mean_us == 0.0);
    let always_zero = always_zero.into_iter().map(|(name, _)| name).collect();
    // Phase frames are the gateway's.
    let phase_samples = (pictures.phase_samples.as_ref()).filter(|_| !facts.target.kernel_only());
    let effect = effect.as_ref();
    let effect_warning = effect.and_then(super::effect::warning);
    let nf99 = pct_us(&o.non_fsync, 990);
    Readme {
        f: facts,
        version_command: super::target::version_command(facts.target),
        b,
        loadgen,
        pictures,
        effect,
        o,
        effect_line: effect.map_or_else(|| UNMEASURED_EFFECT.to_owned(), super::effect::line),
        effect_table: effect.map(super::effect::table),
        budget: PROBE_EFFECT_RATIO.limit(),
        effect_warning,
        overloaded: overload_warning(loadgen, facts.target_rate, facts.target),
        parts,
        always_zero,
        cost_and_loss: cost_and_loss(b, facts.target),
        has_median: !median.is_empty(),
        tail_rows_all,
        tail_rows,
        phases_section: phase_samples
            .map(|sampled| phases_section(b, pictures, sampled))
            .unwrap_or_default(),
        wait_tables: wait_tables(
            pictures.wait.as_ref(),
            pictures.wait_all.as_ref(),
            b.tail.requests,
        ),
        errors: quoted(&loadgen.errors),
        // Sessions from before breakdown.json named the mode (2026-12-01 morning) all took
        // switch-out stacks: profile had no lean mode yet.
        offcpu_stacks: b.mode().is_none_or(|mode| mode.contains("offcpu-stacks")),
        wait_scheduling_ns: pictures.wait.as_ref().map_or(0, |wait| wait.scheduling_ns),
        overhead: (
            pct_us(&o.overhead, 500),
            pct_us(&o.overhead, 990),
            pct_us(&o.overhead, 999),
        ),
        non_fsync: (pct_us(&o.non_fsync, 500), nf99),
        phases_reading: phase_samples
            .map(|sampled| phases::reading(sampled, pictures.tail.requests)),
        compare_reading: compared
            .as_ref()
            .zip(facts.compare.as_ref())
            .map(|(then, link)| super::compare::reading(&TailFacts::new(b, pictures), then, link)),
        gate: GATE_P99_ADDED_US.verdict(Some(nf99)),
        gate_ms: GATE_P99_ADDED_US.limit() / 1e3,
    }
    .render()
    .expect("the README template renders")
}

/// "On-CPU time by phase": the sampled split beside the exact means of each band.
fn phases_section(
    b: &Breakdown,
    pictures: &Pictures,
    sampled: &session::pictures::BandPhases,
) -> String {
    let means = |parts: &BandParts| -> phases::Means {
        parts
            .iter()
            .map(|(name, p)| (name.clone(), p.mean_us))
            .collect()
    };
    let bands = [
        phases::Band {
            name: "tail",
            samples: &sampled.tail,
            requests: pictures.tail.requests,
            exact: Some(means(&b.tail.parts)),
        },
        phases::Band {
            name: "median",
            samples: &sampled.median,
            requests: pictures.median_band.requests,
            exact: Some(means(&b.median.parts)),
        },
        phases::Band {
            name: "all",
            samples: &sampled.all,
            requests: pictures.requests,
            exact: Some(
                (b.parts.iter())
                    .map(|(name, p)| (name.clone(), p.mean_us))
                    .collect(),
            ),
        },
    ];
    let mode = b.mode().unwrap_or("");
    phases::section(sampled, &bands, mode.contains("phases"))
}

/// Holder rows shown before the rest is summed into one.
const TOP_HOLDERS: usize = 12;
/// The wait-for total may differ from the tail's scheduling by this much before the README
/// names the remainder.
const COVER_TOLERANCE: f64 = 0.05;

/// "While the tail waited": pictures.json's `wait` section as two tables, what held the CPU
/// during the tail's `scheduling` and what the writer did during its receipt wait.
#[derive(askama::Template)]
#[template(path = "profile/wait.md", escape = "none")]
struct WaitTables<'a> {
    wait: Option<&'a Wait>,
    wait_all: Option<&'a Wait>,
    tail_requests: u64,
    /// The top holders, then the rest summed, then the total charged; ns.
    holders: Vec<HolderRow>,
    scheduling: f64,
    per_request: f64,
    uncovered: f64,
    not_charged: f64,
    /// Whether more than [`COVER_TOLERANCE`] of the tail's scheduling has no known holder.
    uncovered_flagged: bool,
    tolerance: f64,
    uncharged: Option<u64>,
    /// `wait_all.requests`; sessions before 2026-12-02 lack it and the README said null.
    all_requests: Option<u64>,
    all_total: f64,
    /// Some holder is `idle`.
    idle: bool,
    /// The receipt wait's top rows.
    receipt: &'a [session::pictures::ReceiptHolder],
}

struct HolderRow {
    name: String,
    ns: f64,
}

impl WaitTables<'_> {
    /// `x` as a share of `of`, "–" when `of` is zero.
    fn share(&self, x: &f64, of: &f64) -> String {
        if *of > 0.0 {
            format!("{:.1}%", x / of * 100.0)
        } else {
            "–".to_owned()
        }
    }
}

fn wait_tables(wait: Option<&Wait>, wait_all: Option<&Wait>, tail_requests: u64) -> String {
    use askama::Template as _;
    let scheduling = wait.map_or(0.0, |w| w.scheduling_ns as f64);
    let charged = wait.map_or(0.0, |w| w.charged_ns as f64);
    let unknown = wait.map_or(0.0, |w| w.unknown_ns as f64);
    let holders = wait.map_or(&[][..], |w| &w.holders);
    let mut rows: Vec<HolderRow> = (holders.iter().take(TOP_HOLDERS))
        .map(|h| HolderRow {
            name: h.holder.clone(),
            ns: h.ns as f64,
        })
        .collect();
    if holders.len() > TOP_HOLDERS {
        rows.push(HolderRow {
            name: format!("{} other holders", holders.len() - TOP_HOLDERS),
            ns: holders[TOP_HOLDERS..].iter().map(|h| h.ns as f64).sum(),
        });
    }
    rows.push(HolderRow {
        name: "**total charged**".to_owned(),
        ns: charged,
    });
    let uncovered = (scheduling - charged).abs() + unknown;
    let wait_all = wait_all.filter(|all| !all.holders.is_empty());
    let all_holders = wait_all.into_iter().flat_map(|all| &all.holders);
    WaitTables {
        wait,
        tail_requests,
        holders: rows,
        scheduling,
        per_request: if tail_requests > 0 {
            tail_requests as f64
        } else {
            1.0
        },
        uncovered,
        not_charged: (scheduling - charged).abs(),
        uncovered_flagged: scheduling > 0.0 && uncovered / scheduling > COVER_TOLERANCE,
        tolerance: COVER_TOLERANCE,
        uncharged: wait.and_then(|w| w.uncharged_requests).filter(|n| *n > 0),
        // Sessions before the uniform sample (2026-12-01) charged every request's waits.
        all_requests: wait_all.and_then(|all| all.requests),
        all_total: wait_all.map_or(1.0, |all| (all.scheduling_ns as f64).max(1.0)),
        idle: (holders.iter().chain(all_holders)).any(|h| h.holder.starts_with("idle")),
        wait_all,
        receipt: wait.map_or(&[][..], |w| &w.receipt[..w.receipt.len().min(TOP_HOLDERS)]),
    }
    .render()
    .expect("the wait template renders")
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use session::breakdown::Calibration;
    use session::pictures::{Holder, ReceiptHolder};

    /// A recorded session's files, read through the model, for tests to change.
    pub(crate) fn recorded(name: &str) -> (Breakdown, Pictures, Loadgen, ProbeEffect) {
        let dir = crate::workspace::root().join("profiles").join(name);
        (
            read_json(&dir.join(session::breakdown::FILE)).unwrap(),
            read_json(&dir.join(session::pictures::FILE)).unwrap(),
            read_json(&dir.join(session::loadgen::LOADGEN_JSON)).unwrap(),
            read_json(&dir.join(PROBE_EFFECT_JSON)).unwrap(),
        )
    }

    const SESSION: &str = "2026-12-02-25pct-0ms-hardened";

    /// The README of a recorded session, from its files alone (profile.json included).
    fn rerender(dir: &Path) -> anyhow::Result<String> {
        let facts: SessionFacts = read_json(&dir.join(FACTS_JSON))?;
        Ok(render(&facts, &Files::read(dir)?, &compared(dir, &facts)?))
    }

    /// Golden: every recorded profile session's README is what its files render to, byte for
    /// byte. A changed renderer shows here; `BLESS=1` writes the new renders, for review as a
    /// diff of the recorded READMEs.
    #[test]
    fn every_recorded_session_readme_renders_from_the_files_beside_it() {
        let root = crate::workspace::root().join("profiles");
        let (mut rendered, mut differs) = (0, Vec::new());
        let dirs = session::runs_holding(&root, session::breakdown::FILE).unwrap();
        for dir in dirs {
            let name = dir.file_name().unwrap().to_string_lossy().into_owned();
            let text = rerender(&dir).unwrap_or_else(|e| panic!("{name}: {e:#}"));
            let recorded = fs::read_to_string(dir.join("README.md")).unwrap();
            if text != recorded && std::env::var_os("BLESS").is_some() {
                fs::write(dir.join("README.md"), &text).unwrap();
            } else if text != recorded {
                let line = (text.lines().zip(recorded.lines()))
                    .position(|(a, b)| a != b)
                    .unwrap_or(text.lines().count().min(recorded.lines().count()));
                differs.push(format!(
                    "{name}/README.md differs from its render at line {}:\nrecorded: {:?}\nrendered: {:?}",
                    line + 1,
                    recorded.lines().nth(line),
                    text.lines().nth(line)
                ));
            }
            rendered += 1;
        }
        assert!(differs.is_empty(), "{}", differs.join("\n"));
        assert!(rendered >= 13, "sessions rendered: {rendered}");
    }

    #[test]
    fn a_written_session_renders_again_from_its_directory() {
        let recorded = crate::workspace::root().join("profiles").join(SESSION);
        let root = tempfile::tempdir().unwrap();
        let (dir, then) = (root.path().join("now"), root.path().join("then"));
        fs::create_dir(&dir).unwrap();
        fs::create_dir(&then).unwrap();
        for file in [
            "breakdown.json",
            "loadgen.json",
            "pictures.json",
            "probe-effect.json",
            "requests.csv.gz",
        ] {
            fs::copy(recorded.join(file), dir.join(file)).unwrap();
        }
        for file in ["breakdown.json", "pictures.json"] {
            fs::copy(recorded.join(file), then.join(file)).unwrap();
        }
        let facts = SessionFacts {
            target: Target::Gateway,
            target_version: None,
            command: "cargo xtask profile --load 0.25".to_owned(),
            load: 0.25,
            delay_ms: 0,
            duration_s: 30.0,
            warmup_s: 3.0,
            workers: 1,
            connections: 128,
            no_request_id: false,
            max_rate: 16158.1,
            max_rate_source: "--max-rate".to_owned(),
            target_rate: 0.25 * 16158.1,
            pinning: vec![("gateway".to_owned(), "0".to_owned(), "0".to_owned())],
            machine: crate::machine::collect(),
            compare: Some("../then/README.md".to_owned()),
        };
        let readme = write(&dir, &facts).unwrap();
        let text = fs::read_to_string(readme).unwrap();
        assert!(text.contains("Against the earlier session"), "{text}");
        assert!(dir.join(FACTS_JSON).is_file());
        assert_eq!(rerender(&dir).unwrap(), text);
    }

    /// A proxy's session is worded for it: its name and version, no gateway workers, no
    /// ledger, its own CPU in the probe effect.
    #[test]
    fn a_proxy_session_names_its_target_and_leaves_the_gateway_out() {
        let dir = crate::workspace::root().join("profiles").join(SESSION);
        let mut facts: SessionFacts = read_json(&dir.join(FACTS_JSON)).unwrap();
        let mut files = Files::read(&dir).unwrap();
        facts.target = Target::Nginx;
        facts.target_version = Some("nginx version: nginx/1.22.1".to_owned());
        // The ledger's parts, zero as a kernel-only session has them.
        for part in ["ledger_fsync", "signing", "ledger_other"] {
            files.breakdown.parts.insert(
                part.to_owned(),
                session::breakdown::PartStats {
                    p50_us: 0.0,
                    p90_us: 0.0,
                    p99_us: 0.0,
                    p999_us: 0.0,
                    max_us: 0.0,
                    mean_us: 0.0,
                },
            );
        }
        let effect = files.effect.as_mut().unwrap();
        effect.target = Target::Nginx;
        effect.target_version = facts.target_version.clone();
        let text = render(&facts, &files, &None);
        for part in [
            "# Tail session of nginx: 25% of max load, 0 ms upstream\n",
            "- target: nginx, Debian's package (`nginx -v`: nginx version: nginx/1.22.1)",
            "loaded with `loadgen --direct`",
            "- upstream delay 0 ms\n- tracer mode:",
            "its effect on nginx is the **Probe effect** line",
            "nginx CPU per request ×",
            "| nginx CPU µs/req |",
            "- Probe effect on nginx's latency and CPU",
            "(zero throughout this kernel-only session: ",
        ] {
            assert!(text.contains(part), "{part:?} not in:\n{text}");
        }
        for gone in [
            "tokio workers",
            "Without ledger_fsync",
            "gateway CPU",
            "writer fsync and signing included",
            "its effect on the gateway",
            "On-CPU time by phase",
            "tail-wait.svg is its off-CPU view",
            "| ledger_fsync | 0.0 |",
        ] {
            assert!(!text.contains(gone), "{gone:?} in:\n{text}");
        }
    }

    /// `--no-request-id`: the Settings say how the target was loaded, and profile.json keeps
    /// it; a profile.json from before the flag reads as a session with ids.
    #[test]
    fn a_session_without_request_ids_says_so_in_its_settings() {
        let dir = crate::workspace::root().join("profiles").join(SESSION);
        let mut facts: SessionFacts = read_json(&dir.join(FACTS_JSON)).unwrap();
        assert!(!facts.no_request_id);
        assert!(
            !serde_json::to_string(&facts)
                .unwrap()
                .contains("no_request_id")
        );
        let files = Files::read(&dir).unwrap();
        const WITHOUT: &str = "no x-request-id (as most clients), ids only in the body";
        let gateway = render(&facts, &files, &None);
        assert!(!gateway.contains(WITHOUT), "{gateway}");
        facts.no_request_id = true;
        let gateway = render(&facts, &files, &None);
        assert!(
            gateway.contains(&format!(
                "- upstream delay 0 ms; gateway tokio workers 1; loaded with {WITHOUT}\n"
            )),
            "{gateway}"
        );
        let json = serde_json::to_string(&facts).unwrap();
        assert!(json.contains(r#""no_request_id":true"#), "{json}");
        let back: SessionFacts = serde_json::from_str(&json).unwrap();
        assert!(back.no_request_id);

        facts.target = Target::Nginx;
        facts.target_version = Some("nginx version: nginx/1.22.1".to_owned());
        let nginx = render(&facts, &files, &None);
        assert!(
            nginx.contains(&format!(
                "loaded with `loadgen --direct` (POST /echo, {WITHOUT}, no API key)\n"
            )),
            "{nginx}"
        );
        assert!(!nginx.contains("a unique x-request-id each"), "{nginx}");
        facts.no_request_id = false;
        let nginx = render(&facts, &files, &None);
        assert!(
            nginx.contains("(POST /echo, a unique x-request-id each, no API key)\n"),
            "{nginx}"
        );
        assert!(!nginx.contains(WITHOUT), "{nginx}");
    }

    fn wait(unknown_ns: u64) -> Wait {
        let holder = |holder: &str, ns| Holder {
            holder: holder.to_owned(),
            ns,
        };
        Wait {
            scheduling_ns: 10_000_000,
            charged_ns: 10_000_000,
            unknown_ns,
            holders: vec![
                holder("other process · sh (pid 7)", 6_000_000 - unknown_ns),
                holder("ledger-writer · sign", 4_000_000),
                holder("[cpu not seen]", unknown_ns),
            ],
            receipt_ns: 2_000_000,
            receipt: vec![ReceiptHolder {
                part: "ledger_fsync".to_owned(),
                holder: "ledger-writer · fdatasync".to_owned(),
                ns: 2_000_000,
            }],
            requests: Some(4),
            uncharged_requests: Some(0),
        }
    }

    #[test]
    fn the_wait_table_ranks_holders_and_names_an_uncovered_remainder() {
        let all = Wait {
            scheduling_ns: 20_000_000,
            holders: vec![Holder {
                holder: "idle (the wait had another cause)".to_owned(),
                ns: 5_000_000,
            }],
            ..Wait::default()
        };
        let md = wait_tables(Some(&wait(0)), Some(&all), 4);
        assert!(
            md.contains("| other process · sh (pid 7) | 6.000 | 60.0% | 1500.0 |"),
            "{md}"
        );
        assert!(
            md.contains("| **total charged** | 10.000 | 100.0% |"),
            "{md}"
        );
        assert!(md.contains("to within 5%"), "{md}");
        assert!(
            md.contains("the largest holders: idle (the wait had another cause) 25.0%."),
            "{md}"
        );
        assert!(md.contains("`idle` means nothing ran"), "{md}");
        assert!(
            md.contains("| ledger_fsync | ledger-writer · fdatasync | 2.000 | 100.0% |"),
            "{md}"
        );
        let md = wait_tables(Some(&wait(1_000_000)), None, 4);
        assert!(md.contains("**Uncovered: 1.000 ms (10.0%)"), "{md}");
        let md = wait_tables(None, None, 4);
        assert!(md.contains("no `wait` section"), "{md}");
    }

    #[test]
    fn a_loop_that_fell_behind_is_flagged() {
        let (_, _, mut loadgen, _) = recorded(SESSION);
        loadgen.achieved_rate = 3890.0;
        loadgen.errors.clear();
        loadgen.send_lag_us.as_mut().unwrap().p99 = 40.0;
        assert_eq!(overload_warning(&loadgen, 3898.0, Target::Gateway), None);
        loadgen.achieved_rate = 3502.0;
        loadgen.errors.insert("unsent".to_owned(), 4864);
        loadgen.send_lag_us.as_mut().unwrap().p99 = 3.3e6;
        let warning = overload_warning(&loadgen, 3898.0, Target::Gateway).unwrap();
        assert!(warning.contains("4864 requests unsent"), "{warning}");
    }

    fn breakdown(lost: u64, incomplete: u64) -> Breakdown {
        let (mut b, ..) = recorded(SESSION);
        b.requests = 1000;
        b.lost_events = lost;
        b.incomplete = incomplete;
        b.incomplete_reasons.clear();
        if incomplete > 0 {
            b.incomplete_reasons
                .insert("lost_events".to_owned(), incomplete);
        }
        b.hits_per_request = session::breakdown::Hits {
            sites: 76.5,
            syscalls: 6.9,
            sock: 2.0,
            sched: 17.2,
            samples: 0.06,
        };
        let kinds = |pairs: &[(&str, f64)]| {
            pairs
                .iter()
                .map(|(k, v)| ((*k).to_owned(), Some(*v)))
                .collect()
        };
        let calibration: &mut Calibration = b.calibration.as_mut().unwrap();
        calibration.cpu = 1;
        calibration.noisy = vec!["sock".to_owned()];
        calibration.unmeasured = None;
        calibration.ns_per_hit = kinds(&[
            ("sched", 157.5),
            ("site", 410.0),
            ("sock", 605.9),
            ("syscall", 350.8),
        ]);
        calibration.probe_ns_per_request = 37733.1;
        calibration.probe_ns_per_request_by_kind = kinds(&[("sites", 31392.8)]);
        let cost = b.cost.as_mut().unwrap();
        cost.bpf_stats = "enabled".to_owned();
        cost.bpf = Some(session::breakdown::BpfCost {
            cpu_share: Some(0.224),
            programs: Vec::new(),
            total_run_count: 9301492,
            total_run_time_ns: 4950391,
        });
        cost.tracer.cpu_session_s = 5.978;
        cost.tracer.peak_rss_kib = Some(167492);
        b
    }

    #[test]
    fn cost_and_loss_quotes_calibration_bpf_time_and_the_tracer_process() {
        let text = cost_and_loss(&breakdown(0, 0), Target::Gateway);
        assert!(text.contains("## Tracer cost and loss"), "{text}");
        assert!(text.contains("0 lost events, 0 incomplete"), "{text}");
        assert!(!text.contains("WARNING"), "{text}");
        assert!(text.contains("site 410 ns"), "{text}");
        assert!(text.contains("(noisy: [\"sock\"])"), "{text}");
        assert!(
            text.contains("**37733 ns of probe time per request**"),
            "{text}"
        );
        assert!(text.contains("by kind: sites 31393 ns"), "{text}");
        assert!(text.contains("sites 76.50, syscalls 6.90"), "{text}");
        assert!(text.contains("samples 0.06"), "{text}");
        // 4.95 ms of BPF run time over 1000 complete requests.
        assert!(text.contains("4950 ns per complete request"), "{text}");
        assert!(text.contains("22.4% of one CPU"), "{text}");
        assert!(text.contains("6.0 s CPU during the session"), "{text}");
        assert!(text.contains("peak RSS 163.6 MiB"), "{text}");
        assert!(text.contains("profiles/validation-*/"), "{text}");
        assert!(!text.contains("fell behind"), "{text}");
    }

    #[test]
    fn a_reader_that_fell_behind_is_said_with_its_seconds() {
        let mut session = breakdown(0, 0);
        session.tracer = Some(session::breakdown::TracerCounters {
            reader_behind_s: Some(2.5),
            ..Default::default()
        });
        let text = cost_and_loss(&session, Target::Gateway);
        assert!(
            text.contains("**The tracer's reader fell behind** for 2.5 s of the session"),
            "{text}"
        );
        // Kept up throughout, or recorded before the count existed: nothing said.
        for behind in [Some(0.0), None] {
            session.tracer.as_mut().unwrap().reader_behind_s = behind;
            assert!(!cost_and_loss(&session, Target::Gateway).contains("fell behind"));
        }
    }

    #[test]
    fn an_unmeasured_kind_renders_as_unmeasured_and_left_out() {
        let mut session = breakdown(0, 0);
        let calibration = session.calibration.as_mut().unwrap();
        calibration.ns_per_hit.insert("sock".to_owned(), None);
        calibration.unmeasured = Some(vec!["sock".to_owned()]);
        calibration
            .probe_ns_per_request_by_kind
            .insert("sock".to_owned(), None);
        let text = cost_and_loss(&session, Target::Gateway);
        assert!(text.contains("sock unmeasured, syscall 351 ns"), "{text}");
        assert!(
            text.contains("(by kind: sites 31393 ns, sock unmeasured; left out, unmeasured: sock)"),
            "{text}"
        );
        // A session recorded before `unmeasured` existed: its negative figure is not repeated.
        let calibration = session.calibration.as_mut().unwrap();
        calibration
            .ns_per_hit
            .insert("sock".to_owned(), Some(-79.0));
        let text = cost_and_loss(&session, Target::Gateway);
        assert!(text.contains("sock unmeasured"), "{text}");
        assert!(!text.contains("-79"), "{text}");
    }

    #[test]
    fn cost_and_loss_flags_loss_and_a_missing_calibration() {
        let mut lossy = breakdown(12, 3);
        lossy.calibration = None;
        let text = cost_and_loss(&lossy, Target::Gateway);
        assert!(
            text.contains("**WARNING: 12 lost events, 3 incomplete requests**"),
            "{text}"
        );
        assert!(text.contains("{\"lost_events\":3}"), "{text}");
        assert!(text.contains("not calibrated in this session"), "{text}");
    }

    #[test]
    fn overheads_come_from_the_rows() {
        let row = |id, overhead_ns, ledger_fsync_ns| RequestRow {
            request_id: id,
            overhead_ns,
            ledger_fsync_ns,
            ..RequestRow::default()
        };
        let mut w = session::requests::writer(Vec::new(), RequestRow::header()).unwrap();
        w.serialize(row(1, 3000, 2000)).unwrap();
        w.serialize(row(2, 3000, 1000)).unwrap();
        let csv = w.into_inner().unwrap();
        let o = overheads(csv.as_slice()).unwrap();
        assert_eq!(o.overhead, [3000, 3000]);
        assert_eq!(o.non_fsync, [1000, 2000]);
        let err = overheads("request_id,t_arrive_ns\n1,2\n".as_bytes()).unwrap_err();
        assert!(format!("{err:#}").contains("missing field"), "{err:#}");
    }

    #[test]
    fn percentiles_are_nearest_rank() {
        let values: Vec<u64> = (1..=200).map(|v| v * 1000).collect();
        assert_eq!(pct_us(&values, 990), 198.0);
        assert_eq!(pct_us(&values, 550), 110.0);
        assert!(pct_us(&[], 500).is_nan());
    }

    #[test]
    fn tail_parts_sort_by_share_and_leave_upstream_out() {
        let (b, ..) = recorded(SESSION);
        let rows = view_parts(&b.tail.parts);
        let names: Vec<&str> = rows.iter().map(|(n, _, _)| n.as_str()).collect();
        assert_eq!(&names[..3], ["ledger_fsync", "signing", "scheduling"]);
        assert!(!names.contains(&"upstream"));
    }
}
