//! `requests.csv` (one row per complete request, streamed as it arrives) and
//! `incomplete.csv` (request_id,reason), through the model's row types.

use std::io::{Read, Write};

use anyhow::{Context, Result};
use session::requests::{IncompleteRow, RequestRow, rows};

use crate::requests::RequestRecord;

pub(crate) fn requests_writer<W: Write>(out: W) -> csv::Result<csv::Writer<W>> {
    session::requests::writer(out, RequestRow::header())
}

pub(crate) fn incomplete_writer<W: Write>(out: W) -> csv::Result<csv::Writer<W>> {
    session::requests::writer(out, IncompleteRow::HEADER)
}

pub(crate) fn row(r: &RequestRecord) -> RequestRow {
    RequestRow {
        request_id: r.req_id,
        status: r.status,
        t_arrive_ns: r.t_arrive_ns,
        t_done_ns: r.t_done_ns,
        total_ns: r.total_ns(),
        overhead_ns: r.overhead_ns(),
        client_port: r.client_port,
        t_upstream_ns: r.upstream_start_ns,
        ..RequestRow::default()
    }
    .with_parts(r.parts)
}

pub(crate) fn incomplete(req_id: u64, reason: &str) -> IncompleteRow {
    IncompleteRow {
        request_id: req_id,
        // Reasons are fixed phrases; keep the file one comma a line even if one ever holds one.
        reason: reason.replace([',', '\n'], ";"),
    }
}

/// Stream the rows of a `requests.csv` through `f`.
pub(crate) fn for_each_row(input: impl Read, mut f: impl FnMut(&RequestRow)) -> Result<()> {
    for row in rows::<RequestRow, _>(input) {
        f(&row.context("reading requests.csv")?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::{PARTS, Part};

    #[test]
    fn the_model_lists_the_parts_in_the_tracers_order() {
        let names: Vec<&str> = Part::ALL.iter().map(|p| p.name()).collect();
        assert_eq!(names, session::requests::PARTS);
        assert_eq!(PARTS, session::requests::PARTS.len());
    }

    #[test]
    fn a_renamed_column_fails_naming_it() {
        let text = RequestRow::header()
            .join(",")
            .replace("t_done_ns", "t_end_ns")
            + "\n1,200,0,5,5,5,0,0,0,0,0,5,0,0,0,0,0,0,0,0,0,0,0,0,0,,\n";
        let err = for_each_row(text.as_bytes(), |_| {}).unwrap_err();
        assert!(format!("{err:#}").contains("t_end_ns"), "{err:#}");
    }
}
