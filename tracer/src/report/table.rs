//! The stdout table: per-metric percentiles, then the tail view beside the median band,
//! parts ordered by their tail contribution.

use std::fmt::Write;

use crate::aggregate::{Aggregate, Metric};
use crate::requests::Part;

use super::{Band, Bands, SessionEnd, SessionMeta};

pub(crate) struct View<'a> {
    pub meta: &'a SessionMeta,
    pub end: SessionEnd,
    pub agg: &'a Aggregate,
    pub bands: Bands,
    pub tail: &'a Band,
    pub median: &'a Band,
}

fn us(ns: f64) -> String {
    format!("{:.1}", ns / 1000.0)
}

fn pct(share: Option<f64>) -> String {
    share.map_or_else(|| "-".to_owned(), |s| format!("{:.1}%", s * 100.0))
}

pub(crate) fn render(v: &View<'_>) -> String {
    let agg = v.agg;
    let mut out = String::new();
    let rate = if v.end.duration_s > 0.0 {
        agg.requests() as f64 / v.end.duration_s
    } else {
        0.0
    };
    let w = &mut out;
    let _ = writeln!(
        w,
        "pid {} · {:.1} s · {} requests ({rate:.1}/s) · {} incomplete · {} lost events",
        v.meta.pid,
        v.end.duration_s,
        agg.requests(),
        agg.incomplete(),
        v.end.lost_events
    );
    if !agg.incomplete_reasons().is_empty() {
        let reasons: Vec<String> = agg
            .incomplete_reasons()
            .iter()
            .map(|(r, n)| format!("{r}: {n}"))
            .collect();
        let _ = writeln!(w, "incomplete (excluded below): {}", reasons.join(", "));
    }
    if v.end.lost_events > 0 {
        let _ = writeln!(
            w,
            "WARNING: events were lost; requests overlapping a loss are incomplete, never guessed"
        );
    }
    if !v.meta.attach_modes.is_empty() {
        let modes: Vec<String> = v
            .meta
            .attach_modes
            .iter()
            .map(|(h, m)| format!("{h}={m}"))
            .collect();
        let _ = writeln!(w, "attach: {}", modes.join(" "));
    }

    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "per request, µs", "p50", "p90", "p99", "p99.9", "max", "mean"
    );
    let mut omitted = Vec::new();
    for metric in Metric::all() {
        let s = agg.stats(metric);
        // Parts that never happened add nothing but noise; unattributed is always shown.
        if s.max_ns == 0 && matches!(metric, Metric::Part(p) if p != Part::Unattributed) {
            omitted.push(metric.name());
            continue;
        }
        let indent = if matches!(metric, Metric::Part(_)) {
            "  "
        } else {
            ""
        };
        let _ = writeln!(
            w,
            "{:<16} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            format!("{indent}{}", metric.name()),
            us(s.p50_ns as f64),
            us(s.p90_ns as f64),
            us(s.p99_ns as f64),
            us(s.p999_ns as f64),
            us(s.max_ns as f64),
            us(s.mean_ns)
        );
    }
    if !omitted.is_empty() {
        let _ = writeln!(w, "(always 0: {})", omitted.join(", "));
    }

    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "where the overhead goes (overhead = total − upstream; shares are of overhead)"
    );
    let _ = writeln!(
        w,
        "{:<16} {:>24} {:>24}",
        "",
        format!("tail: > p99 {} µs", us(v.bands.tail_above_ns as f64)),
        format!(
            "median: {}..{} µs",
            us(v.bands.median_lo_ns as f64),
            us(v.bands.median_hi_ns as f64)
        )
    );
    let _ = writeln!(
        w,
        "{:<16} {:>24} {:>24}",
        "",
        format!("{} requests", v.tail.requests),
        format!("{} requests", v.median.requests)
    );
    let _ = writeln!(
        w,
        "{:<16} {:>12} {:>11} {:>12} {:>11}",
        "part", "mean µs", "share", "mean µs", "share"
    );
    let mut parts: Vec<Part> = Part::ALL
        .into_iter()
        .filter(|&p| p != Part::Upstream)
        .collect();
    // Biggest tail contributors first; ties in the fixed part order.
    parts.sort_by(|a, b| v.tail.mean_ns[b.index()].total_cmp(&v.tail.mean_ns[a.index()]));
    for part in parts {
        let (t, m) = (v.tail.mean_ns[part.index()], v.median.mean_ns[part.index()]);
        if t == 0.0 && m == 0.0 && part != Part::Unattributed {
            continue;
        }
        let _ = writeln!(
            w,
            "{:<16} {:>12} {:>11} {:>12} {:>11}",
            part.name(),
            us(t),
            pct(v.tail.share(part)),
            us(m),
            pct(v.median.share(part))
        );
    }
    let _ = writeln!(
        w,
        "{:<16} {:>12} {:>11} {:>12} {:>11}",
        "= overhead",
        us(v.tail.mean_overhead_ns),
        "100%",
        us(v.median.mean_overhead_ns),
        "100%"
    );
    let up = Part::Upstream.index();
    let _ = writeln!(
        w,
        "{:<16} {:>12} {:>11} {:>12} {:>11}",
        "(upstream)",
        us(v.tail.mean_ns[up]),
        "excluded",
        us(v.median.mean_ns[up]),
        "excluded"
    );

    let h = agg.hits_per_request();
    let _ = writeln!(w);
    let _ = writeln!(
        w,
        "probe hits per request: sites {:.1}, syscalls {:.1}, sock {:.1}, sched {:.1}, samples {:.1}",
        h.sites, h.syscalls, h.sock, h.sched, h.samples
    );
    out
}
