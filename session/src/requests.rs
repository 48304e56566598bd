//! requests.csv (one row per complete request, streamed as it arrives) and incomplete.csv
//! (`request_id,reason`), as `tracer record` writes them. One row type each, read and written
//! with the `csv` crate; a renamed or missing column is a parse error naming it.

use std::io::{Read, Write};

use serde::{Deserialize, Serialize};

pub const REQUESTS_CSV: &str = "requests.csv";
pub const INCOMPLETE_CSV: &str = "incomplete.csv";

/// The parts of a request's time, in column order (the tracer's `Part::ALL`).
pub const PARTS: [&str; 19] = [
    "upstream",
    "scheduling",
    "ledger_fsync",
    "signing",
    "ledger_other",
    "cpu",
    "cpu.parse",
    "cpu.auth",
    "cpu.scope",
    "cpu.ratelimit",
    "cpu.registry",
    "cpu.vault",
    "cpu.upstream",
    "cpu.receipt",
    "cpu.respond",
    "queued",
    "blocked.fsync",
    "blocked_other",
    "unattributed",
];

/// One complete request; times in ns.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RequestRow {
    pub request_id: u64,
    pub status: u16,
    pub t_arrive_ns: u64,
    pub t_done_ns: u64,
    pub total_ns: u64,
    pub overhead_ns: u64,
    pub upstream_ns: u64,
    pub scheduling_ns: u64,
    pub ledger_fsync_ns: u64,
    pub signing_ns: u64,
    pub ledger_other_ns: u64,
    /// On-CPU time in all (sessions from 2026-12-01 evening on; the first two lack it).
    pub cpu_ns: Option<u64>,
    #[serde(rename = "cpu.parse_ns")]
    pub cpu_parse_ns: u64,
    #[serde(rename = "cpu.auth_ns")]
    pub cpu_auth_ns: u64,
    #[serde(rename = "cpu.scope_ns")]
    pub cpu_scope_ns: u64,
    #[serde(rename = "cpu.ratelimit_ns")]
    pub cpu_ratelimit_ns: u64,
    #[serde(rename = "cpu.registry_ns")]
    pub cpu_registry_ns: u64,
    #[serde(rename = "cpu.vault_ns")]
    pub cpu_vault_ns: u64,
    #[serde(rename = "cpu.upstream_ns")]
    pub cpu_upstream_ns: u64,
    #[serde(rename = "cpu.receipt_ns")]
    pub cpu_receipt_ns: u64,
    #[serde(rename = "cpu.respond_ns")]
    pub cpu_respond_ns: u64,
    /// Kernel-only parts (sessions from 2026-12-03 on; 0 in the exact mode).
    #[serde(default)]
    pub queued_ns: Option<u64>,
    #[serde(default, rename = "blocked.fsync_ns")]
    pub blocked_fsync_ns: Option<u64>,
    pub blocked_other_ns: u64,
    pub unattributed_ns: u64,
    /// The client connection's remote port, where the kernel said it (sessions from
    /// 2026-12-04 on; empty for connections accepted before the tracer attached).
    #[serde(default)]
    pub client_port: Option<u16>,
    /// Where `upstream` begins, the upstream request's send (sessions from 2026-12-04 on;
    /// empty without an upstream request).
    #[serde(default)]
    pub t_upstream_ns: Option<u64>,
}

impl RequestRow {
    /// The header line's columns.
    pub fn header() -> Vec<String> {
        [
            "request_id",
            "status",
            "t_arrive_ns",
            "t_done_ns",
            "total_ns",
            "overhead_ns",
        ]
        .iter()
        .map(|c| (*c).to_owned())
        .chain(PARTS.iter().map(|p| format!("{p}_ns")))
        .chain(["client_port".to_owned(), "t_upstream_ns".to_owned()])
        .collect()
    }

    /// The row with its parts set from [`PARTS`] order.
    pub fn with_parts(mut self, parts: [u64; PARTS.len()]) -> Self {
        for (field, value) in self.parts_mut().into_iter().zip(parts) {
            *field = value;
        }
        self
    }

    /// The parts in [`PARTS`] order (`cpu` 0 in a session that lacks it).
    pub fn parts(&self) -> [u64; PARTS.len()] {
        let mut row = *self;
        row.parts_mut().map(|part| *part)
    }

    /// The part columns in [`PARTS`] order: the one list of them. A part an older session
    /// lacks becomes 0.
    fn parts_mut(&mut self) -> [&mut u64; PARTS.len()] {
        [
            &mut self.upstream_ns,
            &mut self.scheduling_ns,
            &mut self.ledger_fsync_ns,
            &mut self.signing_ns,
            &mut self.ledger_other_ns,
            self.cpu_ns.get_or_insert(0),
            &mut self.cpu_parse_ns,
            &mut self.cpu_auth_ns,
            &mut self.cpu_scope_ns,
            &mut self.cpu_ratelimit_ns,
            &mut self.cpu_registry_ns,
            &mut self.cpu_vault_ns,
            &mut self.cpu_upstream_ns,
            &mut self.cpu_receipt_ns,
            &mut self.cpu_respond_ns,
            self.queued_ns.get_or_insert(0),
            self.blocked_fsync_ns.get_or_insert(0),
            &mut self.blocked_other_ns,
            &mut self.unattributed_ns,
        ]
    }

    /// Overhead without the disk's fdatasync: what the gateway adds besides it.
    pub fn non_fsync_ns(&self) -> u64 {
        self.overhead_ns.saturating_sub(self.ledger_fsync_ns)
    }
}

/// A request counted but not attributed.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IncompleteRow {
    pub request_id: u64,
    pub reason: String,
}

impl IncompleteRow {
    pub const HEADER: [&str; 2] = ["request_id", "reason"];
}

/// A CSV writer of rows of `T` that has already written `header` (so a session without any
/// row still has its header).
pub fn writer<W: Write, H: AsRef<[u8]>>(
    out: W,
    header: impl IntoIterator<Item = H>,
) -> csv::Result<csv::Writer<W>> {
    let mut w = csv::WriterBuilder::new()
        .has_headers(false)
        .from_writer(out);
    w.write_record(header)?;
    Ok(w)
}

/// The rows of a CSV file with a header, each checked against `T`'s columns.
pub fn rows<T: serde::de::DeserializeOwned, R: Read>(
    input: R,
) -> impl Iterator<Item = csv::Result<T>> {
    csv::Reader::from_reader(input).into_deserialize()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row() -> RequestRow {
        RequestRow {
            request_id: 7,
            status: 200,
            t_arrive_ns: 1_000,
            t_done_ns: 6_000,
            total_ns: 5_000,
            overhead_ns: 4_000,
            client_port: Some(53412),
            t_upstream_ns: Some(1_100),
            ..RequestRow::default()
        }
        .with_parts(std::array::from_fn(|i| i as u64 * 10))
    }

    #[test]
    fn the_header_is_what_serde_writes_and_rows_read_back() {
        let mut serde_header = csv::Writer::from_writer(Vec::new());
        serde_header.serialize(row()).unwrap();
        let text = String::from_utf8(serde_header.into_inner().unwrap()).unwrap();
        assert_eq!(text.lines().next().unwrap(), RequestRow::header().join(","));

        let mut w = writer(Vec::new(), RequestRow::header()).unwrap();
        w.serialize(row()).unwrap();
        let bytes = w.into_inner().unwrap();
        let text = String::from_utf8(bytes.clone()).unwrap();
        assert!(text.ends_with("7,200,1000,6000,5000,4000,0,10,20,30,40,50,60,70,80,90,100,110,120,130,140,150,160,170,180,53412,1100\n"), "{text}");
        let back: Vec<RequestRow> = rows(bytes.as_slice()).collect::<Result<_, _>>().unwrap();
        assert_eq!(back, [row()]);
        assert_eq!(back[0].parts()[5], 50);
    }

    #[test]
    fn a_renamed_column_is_an_error_naming_it() {
        let text = RequestRow::header()
            .join(",")
            .replace("ledger_fsync_ns", "fsync_ns")
            + "\n7,200,1000,6000,5000,4000,0,10,20,30,40,50,60,70,80,90,100,110,120,130,140,150,160,170,180,,\n";
        let err = rows::<RequestRow, _>(text.as_bytes())
            .next()
            .unwrap()
            .unwrap_err();
        assert!(err.to_string().contains("fsync_ns"), "{err}");
    }

    #[test]
    fn a_session_before_the_cpu_and_kernel_only_columns_reads_them_as_zero() {
        let later = [
            "cpu_ns",
            "queued_ns",
            "blocked.fsync_ns",
            "client_port",
            "t_upstream_ns",
        ];
        let header: Vec<String> = RequestRow::header()
            .into_iter()
            .filter(|c| !later.contains(&c.as_str()))
            .collect();
        let text = header.join(",")
            + "\n7,200,1000,6000,5000,4000,0,10,20,30,40,60,70,80,90,100,110,120,130,140,150,160\n";
        let back: RequestRow = rows(text.as_bytes()).next().unwrap().unwrap();
        assert_eq!(
            (back.cpu_ns, back.queued_ns, back.blocked_fsync_ns),
            (None, None, None)
        );
        assert_eq!((back.client_port, back.t_upstream_ns), (None, None));
        assert_eq!(back.parts()[5], 0);
        assert_eq!(back.parts()[6], 60);
        assert_eq!(back.parts()[15..], [0, 0, 150, 160]);
    }
}
