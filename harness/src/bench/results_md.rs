//! RESULTS.md of a bench run, from its typed results.json by the template
//! `harness/templates/bench-results.md`. The verdicts are the rows' own ([`Gate`]); what the
//! reading computes from the rows is computed here, and the template only lays it out.

use std::collections::BTreeMap;

use askama::Template;
use session::bench::{
    Added, BaselineRev, BaselineRow, FsyncStats, MIN_ACHIEVED_SHARE, Results, Row,
};

use super::{DELAYS_MS, OPEN_FRACTIONS};

pub fn render(results: &Results) -> String {
    ResultsMd { r: results }
        .render()
        .expect("the template only formats")
}

#[derive(Template)]
#[template(path = "bench-results.md")]
struct ResultsMd<'a> {
    r: &'a Results,
}

/// A figure rounded to `digits`, or "—".
fn fixed(v: Option<f64>, digits: usize) -> String {
    v.map_or_else(|| "—".to_owned(), |v| format!("{v:.digits$}"))
}

/// The 1-minute figure of a load average.
fn first(loadavg: &str) -> f64 {
    loadavg
        .split_whitespace()
        .next()
        .and_then(|v| v.parse::<f64>().ok())
        .unwrap_or(0.0)
}

/// What the template calls; arguments come by reference.
impl<'a> ResultsMd<'a> {
    fn opt(&self, v: &Option<f64>, digits: usize) -> String {
        fixed(*v, digits)
    }

    fn errors(&self, errors: &BTreeMap<String, u64>) -> String {
        if errors.is_empty() {
            return "0".to_owned();
        }
        let list: Vec<String> = errors
            .iter()
            .map(|(kind, n)| format!("{n}×{kind}"))
            .collect();
        list.join(" ")
    }

    fn min_achieved_percent(&self) -> f64 {
        MIN_ACHIEVED_SHARE * 100.0
    }

    fn fdatasync(&self) -> Vec<(&'static str, &'static str, &'a FsyncStats)> {
        let r = self.r;
        let mut rows = Vec::new();
        for (when, probe) in [
            ("before the matrix", &r.fdatasync_before),
            ("after the matrix", &r.fdatasync_after),
        ] {
            rows.push((when, "overwrite", &probe.overwrite));
            rows.push((when, "append", &probe.append));
        }
        rows
    }

    /// The added p50 (0), p99 (1) or p99.9 (2) of a row, or "—" for an INVALID one.
    fn added(&self, row: &Row, which: usize) -> String {
        let pick = |a: &Added| [a.p50_us, a.p99_us, a.p999_us][which];
        fixed(row.added.as_ref().map(pick), 0)
    }

    fn baseline_added(&self, base: &BaselineRow) -> String {
        fixed(base.added.as_ref().map(|a| a.p99_us), 0)
    }

    fn short_commit(&self, b: &'a BaselineRev) -> &'a str {
        &b.commit[..b.commit.len().min(12)]
    }

    fn baseline_rows(&self) -> Vec<(&'a Row, &'a BaselineRow)> {
        let rows = self.r.rows.iter();
        rows.filter_map(|row| Some((row, row.baseline.as_ref()?)))
            .collect()
    }

    fn cpu_ratio(&self, row: &Row, base: &BaselineRow) -> String {
        let ratio = row
            .gateway_cpu_us_per_request
            .zip(base.gateway_cpu_us_per_request)
            .map(|(this, base)| this / base);
        fixed(ratio, 2)
    }

    /// The rows the gate is meant for: the open loop at the lowest fraction of max.
    fn gate_rows(&self) -> Vec<&'a Row> {
        let gate_fraction = OPEN_FRACTIONS[0];
        let rows = self.r.rows.iter();
        rows.filter(|row| row.fraction_of_max == Some(gate_fraction))
            .collect()
    }

    /// The 1-minute load averages at start and end, when either says the machine was busy.
    fn busy(&self) -> Option<(f64, f64)> {
        let (start, end) = (
            first(&self.r.machine.load_average),
            first(&self.r.load_average_at_end),
        );
        // While rows run, the bench itself keeps about two runnable processes.
        (start > 0.5 || end > 2.5).then_some((start, end))
    }

    fn passed(&self) -> usize {
        let rows = self.r.rows.iter();
        rows.filter(|row| row.gate.verdict().met()).count()
    }

    fn invalid(&self) -> Vec<String> {
        let rows = self.r.rows.iter().filter(|row| !row.is_valid());
        rows.map(|row| format!("{} {} ms {}", row.mode, row.delay_ms, row.load))
            .collect()
    }

    fn open(&self) -> Vec<&'a Row> {
        let rows = self.r.rows.iter();
        rows.filter(|row| row.mode == "open" && row.is_valid())
            .collect()
    }

    /// `{delay} ms {load}: {what}` for each open row `what` has something for, joined by ", ".
    fn per_open_row(&self, what: impl Fn(&Row) -> Option<String>) -> String {
        let list: Vec<String> = self
            .open()
            .iter()
            .filter_map(|row| Some(format!("{} ms {}: {}", row.delay_ms, row.load, what(row)?)))
            .collect();
        list.join(", ")
    }

    fn open_added_p50(&self) -> String {
        self.per_open_row(|row| Some(format!("{:.0} µs", row.added.as_ref()?.p50_us)))
    }

    /// Per upstream delay: the loads, the gateway p99s, and whether they grow with the load.
    fn by_delay(&self) -> Vec<(u64, String, String, bool)> {
        let open = self.open();
        DELAYS_MS
            .into_iter()
            .map(|delay| {
                let rows: Vec<&&Row> = open.iter().filter(|row| row.delay_ms == delay).collect();
                let monotonic = rows
                    .windows(2)
                    .all(|pair| pair[0].gateway.p99_us <= pair[1].gateway.p99_us);
                let loads: Vec<&str> = rows.iter().map(|row| row.load.as_str()).collect();
                let p99s: Vec<String> = rows
                    .iter()
                    .map(|row| format!("{:.0}", row.gateway.p99_us))
                    .collect();
                (delay, loads.join("/"), p99s.join(" → "), monotonic)
            })
            .collect()
    }

    fn direct_p99s(&self) -> String {
        self.per_open_row(|row| Some(format!("{:.0} µs", row.direct.p99_us)))
    }

    /// Open-loop rows whose direct p99 alone exceeds the upstream delay by more than the gate.
    fn noisy(&self) -> usize {
        let gate = self.r.gate_p99_added_us;
        let open = self.open();
        open.iter()
            .filter(|row| row.direct.p99_us - row.delay_ms as f64 * 1e3 > gate)
            .count()
    }

    fn drift(&self) -> String {
        self.per_open_row(|row| {
            let (first, last) = (
                row.gateway.p50_first_third_us?,
                row.gateway.p50_last_third_us?,
            );
            Some(format!("{first:.0} → {last:.0} µs"))
        })
    }

    fn send_lags(&self) -> String {
        self.per_open_row(|row| {
            Some(format!(
                "{} / {} µs",
                fixed(row.gateway.send_lag_p99_us, 0),
                fixed(row.direct.send_lag_p99_us, 0)
            ))
        })
    }
}
