//! A session's outputs in its directory: `requests.csv` and `incomplete.csv` streamed as
//! outcomes arrive, then `breakdown.json` and the stdout table at the end (schema: README,
//! section `breakdown.json`).

mod bands;
mod csv;
mod table;

use std::collections::BTreeMap;
use std::fs::File;
use std::io::BufReader;

use anyhow::{Context, Result, bail};
use session::breakdown::{BandPart, BandParts, Breakdown, MedianBand, PartStats, TailBand};

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

pub use session::breakdown::FILE as BREAKDOWN_JSON;
pub use session::requests::{INCOMPLETE_CSV, REQUESTS_CSV};

/// Writes one session's files as outcomes stream in, aggregating as it goes.
pub struct SessionWriter {
    dir: OutDir,
    meta: SessionMeta,
    requests: ::csv::Writer<File>,
    incomplete: ::csv::Writer<File>,
    aggregate: Aggregate,
    /// Extra top-level sections of breakdown.json still built as JSON (the kernel
    /// cross-check figures, loss spans, cost), typed when the file is written.
    sections: Vec<(String, serde_json::Value)>,
    drops: Option<session::breakdown::Drops>,
    tracer: Option<session::breakdown::TracerCounters>,
    calibration: Option<session::breakdown::Calibration>,
    kernel_only: Option<session::breakdown::KernelOnly>,
}

impl SessionWriter {
    /// Start `requests.csv` and `incomplete.csv` in `dir`.
    pub fn create(dir: &OutDir, meta: SessionMeta) -> Result<Self> {
        let requests = csv::requests_writer(dir.create_file(REQUESTS_CSV)?)
            .context("writing the header of requests.csv")?;
        let incomplete = csv::incomplete_writer(dir.create_file(INCOMPLETE_CSV)?)
            .context("writing the header of incomplete.csv")?;
        Ok(SessionWriter {
            dir: dir.clone(),
            meta,
            requests,
            incomplete,
            aggregate: Aggregate::new(),
            sections: Vec::new(),
            drops: None,
            tracer: None,
            calibration: None,
            kernel_only: None,
        })
    }

    pub fn write(&mut self, outcome: &Outcome) -> Result<()> {
        self.aggregate.add(outcome);
        match outcome {
            Outcome::Complete(r) => self.requests.serialize(csv::row(r)),
            Outcome::Incomplete(i) => self
                .incomplete
                .serialize(csv::incomplete(i.req_id, &i.reason)),
        }
        .context("writing a request row")
    }

    /// Adds a top-level section `name` to breakdown.json (replacing one of that name).
    pub fn add_section(&mut self, name: &str, value: serde_json::Value) {
        self.sections.retain(|(n, _)| n != name);
        self.sections.push((name.to_owned(), value));
    }

    /// breakdown.json's `drops` section: what the kernel side dropped or could not do.
    pub fn set_drops(&mut self, drops: session::breakdown::Drops) {
        self.drops = Some(drops);
    }

    /// breakdown.json's `tracer` section: the tracer process's own counters.
    pub fn set_tracer(&mut self, tracer: session::breakdown::TracerCounters) {
        self.tracer = Some(tracer);
    }

    /// breakdown.json's `kernel_only` section.
    pub fn set_kernel_only(&mut self, kernel_only: session::breakdown::KernelOnly) {
        self.kernel_only = Some(kernel_only);
    }

    /// breakdown.json's `calibration` section.
    pub fn set_calibration(&mut self, calibration: session::breakdown::Calibration) {
        self.calibration = Some(calibration);
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
        for (name, value) in std::mem::take(&mut self.sections) {
            add_section(&mut json, &name, value)
                .with_context(|| format!("breakdown.json section `{name}`"))?;
        }
        json.drops = self.drops.take();
        json.tracer = self.tracer.take();
        json.calibration = self.calibration.take();
        json.kernel_only = self.kernel_only.take();
        self.dir.write(BREAKDOWN_JSON, json.to_json().as_bytes())?;
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

/// Types a section added with [`SessionWriter::add_section`]; one the model does not
/// describe is an error, so a renamed key fails the session's tests, not a reader later.
fn add_section(b: &mut Breakdown, name: &str, value: serde_json::Value) -> Result<()> {
    fn typed<T: serde::de::DeserializeOwned>(value: serde_json::Value) -> Result<Option<T>> {
        Ok(Some(serde_json::from_value(value)?))
    }
    match name {
        "drops" => b.drops = typed(value)?,
        "tracer" => b.tracer = typed(value)?,
        "kernel" => b.kernel = typed(value)?,
        "loss_spans" => b.loss_spans = typed(value)?,
        "cost" => b.cost = typed(value)?,
        "calibration" => b.calibration = typed(value)?,
        _ => bail!("not a section of the model (session::breakdown)"),
    }
    Ok(())
}

fn us(ns: f64) -> f64 {
    ns / 1000.0
}

fn band_parts(band: &Band) -> BandParts {
    Part::ALL
        .iter()
        .map(|&part| {
            let v = BandPart {
                mean_us: us(band.mean_ns[part.index()]),
                share: band.share(part),
            };
            (part.name().to_owned(), v)
        })
        .collect()
}

fn breakdown(v: &table::View<'_>) -> Breakdown {
    let agg = v.agg;
    let parts = Metric::all()
        .map(|metric| {
            let s = agg.stats(metric);
            let stats = PartStats {
                p50_us: us(s.p50_ns as f64),
                p90_us: us(s.p90_ns as f64),
                p99_us: us(s.p99_ns as f64),
                p999_us: us(s.p999_ns as f64),
                max_us: us(s.max_ns as f64),
                mean_us: us(s.mean_ns),
            };
            (metric.name().to_owned(), stats)
        })
        .collect();
    Breakdown {
        pid: v.meta.pid,
        record_args: Some(v.meta.record_args.clone()),
        duration_s: v.end.duration_s,
        requests: agg.requests(),
        incomplete: agg.incomplete(),
        incomplete_reasons: agg.incomplete_reasons().clone(),
        lost_events: v.end.lost_events,
        attach_modes: v.meta.attach_modes.clone(),
        parts,
        tail: TailBand {
            threshold_us: us(v.bands.tail_above_ns as f64),
            requests: v.tail.requests,
            mean_overhead_us: us(v.tail.mean_overhead_ns),
            parts: band_parts(v.tail),
        },
        median: MedianBand {
            low_us: us(v.bands.median_lo_ns as f64),
            high_us: us(v.bands.median_hi_ns as f64),
            requests: v.median.requests,
            mean_overhead_us: us(v.median.mean_overhead_ns),
            parts: band_parts(v.median),
        },
        hits_per_request: agg.hits_per_request(),
        drops: None,
        tracer: None,
        kernel: None,
        loss_spans: None,
        cost: None,
        calibration: None,
        kernel_only: None,
    }
}
