//! `requests.csv` (one row per complete request, streamed as it arrives) and
//! `incomplete.csv` (request_id,reason).

use std::io::{self, BufRead, Write};

use anyhow::{Context, Result, bail};

use crate::requests::{PARTS, Part, RequestRecord};

pub(crate) const FIXED_COLUMNS: [&str; 6] = [
    "request_id",
    "status",
    "t_arrive_ns",
    "t_done_ns",
    "total_ns",
    "overhead_ns",
];

pub(crate) fn header() -> String {
    let parts = Part::ALL.iter().map(|p| format!("{}_ns", p.name()));
    FIXED_COLUMNS
        .iter()
        .map(|c| (*c).to_owned())
        .chain(parts)
        .collect::<Vec<_>>()
        .join(",")
}

pub(crate) fn write_row(out: &mut impl Write, r: &RequestRecord) -> io::Result<()> {
    write!(
        out,
        "{},{},{},{},{},{}",
        r.req_id,
        r.status,
        r.t_arrive_ns,
        r.t_done_ns,
        r.total_ns(),
        r.overhead_ns()
    )?;
    for ns in r.parts {
        write!(out, ",{ns}")?;
    }
    writeln!(out)
}

/// One row read back: what the band statistics need.
pub(crate) struct Row {
    pub overhead_ns: u64,
    pub parts: [u64; PARTS],
}

/// Stream the rows of a `requests.csv` written by [`write_row`] through `f`.
pub(crate) fn for_each_row(input: impl BufRead, mut f: impl FnMut(&Row)) -> Result<()> {
    let mut lines = input.lines();
    match lines.next() {
        Some(h) if h.as_deref().ok() == Some(header().as_str()) => {}
        _ => bail!("requests.csv: unexpected header"),
    }
    let mut fields = Vec::with_capacity(FIXED_COLUMNS.len() + PARTS);
    for (n, line) in lines.enumerate() {
        let line = line.context("reading requests.csv")?;
        fields.clear();
        for field in line.split(',') {
            fields.push(
                field
                    .parse::<u64>()
                    .with_context(|| format!("requests.csv line {}: {field:?}", n + 2))?,
            );
        }
        if fields.len() != FIXED_COLUMNS.len() + PARTS {
            bail!("requests.csv line {}: {} fields", n + 2, fields.len());
        }
        let mut parts = [0; PARTS];
        parts.copy_from_slice(&fields[FIXED_COLUMNS.len()..]);
        f(&Row {
            overhead_ns: fields[5],
            parts,
        });
    }
    Ok(())
}

pub(crate) fn write_incomplete(out: &mut impl Write, req_id: u64, reason: &str) -> io::Result<()> {
    // Reasons are fixed phrases; keep the file parseable even if one ever holds a comma.
    writeln!(out, "{req_id},{}", reason.replace([',', '\n'], ";"))
}
