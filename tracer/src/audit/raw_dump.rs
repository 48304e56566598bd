//! The raw event dump (`tracer record --raw-events FILE`): every event the tracer read, in
//! the order read, in the record format `session::analysis::crosscheck` reads. Kernel-only
//! mode's DATA records are not events and are not in it (their own dump is `--raw-data`, a
//! [`RawDump`] too); its PROCESS events are.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context as _, Result};
use session::analysis::crosscheck::encode;
use tracer_ebpf::abi::Event;

use crate::events::data::Data;

/// A dump of records back to back: `--raw-events` (every event, 40 bytes each, in the order
/// read) or `--raw-data` (every DATA record as the kernel wrote it,
/// `events::data::read_dump`). The first write error is kept and said at [`RawDump::finish`].
pub struct RawDump {
    out: BufWriter<File>,
    written: u64,
    error: Option<io::Error>,
}

impl RawDump {
    /// Creates `path` as a session's outputs are created (`overwrite`: `--overwrite`).
    pub fn create(path: &Path, overwrite: bool) -> Result<RawDump> {
        let file = crate::out_dir::create_file_at(path, overwrite)?;
        Ok(RawDump {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            error: None,
        })
    }

    pub fn event(&mut self, event: &Event) {
        self.record(&encode(event));
    }

    pub fn data(&mut self, data: &Data) {
        self.record(crate::events::data::encode(&data.to_event()));
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

    /// The records written, or the first error; `flag` names the dump in it.
    pub fn finish(mut self, flag: &str) -> Result<u64> {
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
        let mut dump = RawDump::create(&path, false).unwrap();
        for e in &events {
            dump.event(e);
        }
        assert_eq!(dump.finish("--raw-events").unwrap(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        assert_eq!(read_dump(&path).unwrap(), events);
    }
}
