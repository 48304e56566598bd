//! The raw event dump (`tracer record --raw-events FILE`): every event the tracer read, in
//! the order read, in the record format `session::analysis::crosscheck` reads. Kernel-only
//! mode's DATA records are not events and are not in it (their own dump is `--raw-data`, a
//! [`RawDump`] too); its PROCESS events are.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context as _, Result};
use session::analysis::crosscheck;
use tracer_ebpf::abi::Event;

use crate::events::data::{self, Data};

/// Which dump: `--raw-events` (every event, 40 bytes each, in the order read) or `--raw-data`
/// (every DATA record as the kernel wrote it, `events::data::read_dump`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Events,
    Data,
}

impl Kind {
    pub fn flag(self) -> &'static str {
        match self {
            Kind::Events => "--raw-events",
            Kind::Data => "--raw-data",
        }
    }

    /// The line the dump starts with, before its records.
    pub fn header(self) -> &'static [u8] {
        match self {
            Kind::Events => crosscheck::DUMP_HEADER,
            Kind::Data => data::DUMP_HEADER,
        }
    }
}

/// A dump: its [`Kind::header`], then records back to back. The first write error is kept
/// and said at [`RawDump::finish`].
pub struct RawDump {
    kind: Kind,
    out: BufWriter<File>,
    written: u64,
    error: Option<io::Error>,
}

impl RawDump {
    /// Creates `path` as a session's outputs are created (`overwrite`: `--overwrite`).
    pub fn create(kind: Kind, path: &Path, overwrite: bool) -> Result<RawDump> {
        // create_file_at writes the header unbuffered: even a session that dies before its
        // first flush leaves a file that says what it is (and that --overwrite may replace).
        let file =
            crate::out_dir::create_file_at(path, overwrite, kind.header()).context(kind.flag())?;
        Ok(RawDump {
            kind,
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            error: None,
        })
    }

    pub fn event(&mut self, event: &Event) {
        self.record(&crosscheck::encode(event));
    }

    pub fn data(&mut self, data: &Data) {
        self.record(data::encode(&data.to_event()));
    }

    fn record(&mut self, bytes: &[u8]) {
        if self.error.is_some() {
            return;
        }
        match self.out.write_all(bytes) {
            Ok(()) => self.written += 1,
            Err(e) => self.error = Some(e),
        }
    }

    /// The records written, or the first error (naming the dump's flag).
    pub fn finish(mut self) -> Result<u64> {
        let flag = self.kind.flag();
        if let Some(e) = self.error.take() {
            return Err(e).with_context(|| format!("writing {flag}"));
        }
        self.out
            .flush()
            .with_context(|| format!("flushing {flag}"))?;
        Ok(self.written)
    }
}

#[cfg(test)]
mod tests {
    use session::analysis::crosscheck::read_dump;
    use tracer_ebpf::abi::{kind, syscall};

    use super::*;

    #[test]
    fn the_dump_reads_back_as_the_cross_check_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.events");
        let events = [
            (5, 1, kind::SYSCALL, syscall::FDATASYNC, [2, 9, u64::MAX]),
            (7, 2, kind::SWITCH_IN, 0, [0; 3]),
        ]
        .map(|(ts_ns, tid, kind, sub, args)| Event {
            ts_ns,
            tid,
            kind,
            sub,
            args,
        });
        let mut dump = RawDump::create(Kind::Events, &path, false).unwrap();
        for e in &events {
            dump.event(e);
        }
        assert_eq!(dump.finish().unwrap(), 2);
        let header = crosscheck::DUMP_HEADER.len() as u64;
        assert_eq!(std::fs::metadata(&path).unwrap().len(), header + 80);
        assert_eq!(read_dump(&path).unwrap(), events);
    }

    #[test]
    fn the_data_dump_reads_back_as_events_data_reads_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("raw.data");
        let record = Data {
            enter_ns: 3,
            exit_ns: 5,
            tgid: 7,
            tid: 8,
            fd: 9,
            syscall: syscall::READ,
            len: 100,
            bytes: b"GET / HTTP/1.1\r\n".to_vec(),
        };
        let mut dump = RawDump::create(Kind::Data, &path, false).unwrap();
        dump.data(&record);
        assert_eq!(dump.finish().unwrap(), 1);
        let bytes = std::fs::read(&path).unwrap();
        assert!(bytes.starts_with(data::DUMP_HEADER));
        assert_eq!(data::read_dump(&bytes).unwrap(), [record]);
        let err = data::read_dump(&bytes[data::DUMP_HEADER.len()..]).unwrap_err();
        assert!(err.to_string().contains("not a --raw-data dump"), "{err}");
    }
}
