//! A session's outputs in its directory: `requests.csv` and `incomplete.csv` streamed as
//! outcomes arrive, then `breakdown.json` and the stdout table at the end (schema: README,
//! section `breakdown.json`).

mod bands;
mod csv;
mod json;
mod table;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::{BufReader, BufWriter, Write};

use anyhow::{Context, Result};

use crate::aggregate::{Aggregate, Metric};
use crate::out_dir::OutDir;
use crate::requests::{Outcome, Part};

pub use bands::{Band, Bands};

/// What is known when a session starts.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SessionMeta {
    pub pid: u32,
    /// The `tracer` command line exactly as run, so a session says how it was taken.
    pub record_args: Vec<String>,
    /// Hook name → how it is attached (for example "tracepoint", "tp_btf", "uprobe").
    pub attach_modes: BTreeMap<String, String>,
}

/// What is known when it ends.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SessionEnd {
    pub duration_s: f64,
    /// Events the kernel could not reserve in the ring buffer (the LOSS counters' total).
    pub lost_events: u64,
}

/// The result of a session: the table for stdout, and the figures it was built from.
#[derive(Clone, Debug, PartialEq)]
pub struct Summary {
    pub table: String,
    pub requests: u64,
    pub incomplete: u64,
    /// The tail threshold: p99 of overhead, ns (`bands.tail_above_ns`).
    pub tail_threshold_ns: u64,
    /// The bands the tail view and the median band were selected with; the pictures use them.
    pub bands: Bands,
    pub tail: Band,
    pub median: Band,
}

pub const REQUESTS_CSV: &str = "requests.csv";
pub const INCOMPLETE_CSV: &str = "incomplete.csv";
pub const BREAKDOWN_JSON: &str = "breakdown.json";

/// Writes one session's files as outcomes stream in, aggregating as it goes.
pub struct SessionWriter {
    dir: OutDir,
    meta: SessionMeta,
    requests: BufWriter<File>,
    incomplete: BufWriter<File>,
    aggregate: Aggregate,
    /// Extra top-level sections of breakdown.json (the tracer's own cost, BPF program stats,
    /// the kernel cross-check figures), after the standard ones, in the order added.
    sections: Vec<(String, serde_json::Value)>,
}

impl SessionWriter {
    /// Start `requests.csv` and `incomplete.csv` in `dir`.
    pub fn create(dir: &OutDir, meta: SessionMeta) -> Result<Self> {
        let mut requests = BufWriter::new(dir.create_file(REQUESTS_CSV)?);
        writeln!(requests, "{}", csv::header())?;
        let mut incomplete = BufWriter::new(dir.create_file(INCOMPLETE_CSV)?);
        writeln!(incomplete, "request_id,reason")?;
        Ok(SessionWriter {
            dir: dir.clone(),
            meta,
            requests,
            incomplete,
            aggregate: Aggregate::new(),
            sections: Vec::new(),
        })
    }

    pub fn write(&mut self, outcome: &Outcome) -> Result<()> {
        self.aggregate.add(outcome);
        match outcome {
            Outcome::Complete(r) => csv::write_row(&mut self.requests, r),
            Outcome::Incomplete(i) => {
                csv::write_incomplete(&mut self.incomplete, i.req_id, &i.reason)
            }
        }
        .context("writing a request row")
    }

    /// Adds a top-level section `name` to breakdown.json (replacing one of that name).
    pub fn add_section(&mut self, name: &str, value: serde_json::Value) {
        self.sections.retain(|(n, _)| n != name);
        self.sections.push((name.to_owned(), value));
    }

    /// The running aggregate, for live progress (for example its p99 overhead).
    pub fn aggregate(&self) -> &Aggregate {
        &self.aggregate
    }

    /// Flush the CSVs, compute the tail and median bands from `requests.csv`, write
    /// `breakdown.json` and return the table.
    pub fn finish(mut self, end: SessionEnd) -> Result<Summary> {
        self.requests.flush().context("flushing requests.csv")?;
        self.incomplete.flush().context("flushing incomplete.csv")?;
        let agg = &self.aggregate;
        let bands = Bands::from_quantiles(|q| agg.overhead_quantile_ns(q));
        let mut tail = bands::BandSum::new();
        let mut median = bands::BandSum::new();
        let file = self.dir.open_file(REQUESTS_CSV)?;
        csv::for_each_row(BufReader::new(file), |row| {
            if bands.is_tail(row.overhead_ns) {
                tail.add(row);
            }
            if bands.is_median(row.overhead_ns) {
                median.add(row);
            }
        })?;
        let (tail, median) = (tail.band(), median.band());
        let view = table::View {
            meta: &self.meta,
            end,
            agg,
            bands,
            tail: &tail,
            median: &median,
        };
        let mut json = breakdown(&view);
        for (name, value) in &self.sections {
            json = json.with(name, json::Value::from_serde(value));
        }
        let json = json.render();
        self.dir.write(BREAKDOWN_JSON, json.as_bytes())?;
        Ok(Summary {
            table: table::render(&view),
            requests: agg.requests(),
            incomplete: agg.incomplete(),
            tail_threshold_ns: bands.tail_above_ns,
            bands,
            tail,
            median,
        })
    }
}

fn us(ns: f64) -> json::Value {
    json::Value::Num(ns / 1000.0)
}

fn band_json(band: &Band, extra: json::Value) -> json::Value {
    let mut parts = json::Value::obj();
    for part in Part::ALL {
        let share = band.share(part).map_or(json::Value::Null, json::Value::Num);
        let v = json::Value::obj()
            .with("mean_us", us(band.mean_ns[part.index()]))
            .with("share", share);
        parts = parts.with(part.name(), v);
    }
    let json::Value::Obj(mut fields) = extra else {
        unreachable!("band extras are an object")
    };
    fields.push(("requests".into(), json::Value::Int(band.requests)));
    fields.push(("mean_overhead_us".into(), us(band.mean_overhead_ns)));
    fields.push(("parts".into(), parts));
    json::Value::Obj(fields)
}

fn breakdown(v: &table::View<'_>) -> json::Value {
    use json::Value::{Int, Num, Str};
    let agg = v.agg;
    let reasons = agg
        .incomplete_reasons()
        .iter()
        .fold(json::Value::obj(), |o, (reason, n)| o.with(reason, Int(*n)));
    let modes = v
        .meta
        .attach_modes
        .iter()
        .fold(json::Value::obj(), |o, (hook, mode)| {
            o.with(hook, Str(mode.clone()))
        });
    let mut parts = json::Value::obj();
    for metric in Metric::all() {
        let s = agg.stats(metric);
        let stats = json::Value::obj()
            .with("p50_us", us(s.p50_ns as f64))
            .with("p90_us", us(s.p90_ns as f64))
            .with("p99_us", us(s.p99_ns as f64))
            .with("p999_us", us(s.p999_ns as f64))
            .with("max_us", us(s.max_ns as f64))
            .with("mean_us", us(s.mean_ns));
        parts = parts.with(metric.name(), stats);
    }
    let h = agg.hits_per_request();
    let hits = json::Value::obj()
        .with("sites", Num(h.sites))
        .with("syscalls", Num(h.syscalls))
        .with("sock", Num(h.sock))
        .with("sched", Num(h.sched))
        .with("samples", Num(h.samples));
    json::Value::obj()
        .with("pid", Int(u64::from(v.meta.pid)))
        .with(
            "record_args",
            json::Value::Arr(v.meta.record_args.iter().cloned().map(Str).collect()),
        )
        .with("duration_s", Num(v.end.duration_s))
        .with("requests", Int(agg.requests()))
        .with("incomplete", Int(agg.incomplete()))
        .with("incomplete_reasons", reasons)
        .with("lost_events", Int(v.end.lost_events))
        .with("attach_modes", modes)
        .with("parts", parts)
        .with(
            "tail",
            band_json(
                v.tail,
                json::Value::obj().with("threshold_us", us(v.bands.tail_above_ns as f64)),
            ),
        )
        .with(
            "median",
            band_json(
                v.median,
                json::Value::obj()
                    .with("low_us", us(v.bands.median_lo_ns as f64))
                    .with("high_us", us(v.bands.median_hi_ns as f64)),
            ),
        )
        .with("hits_per_request", hits)
}
