//! The raw event dump (`tracer record --raw-events FILE`): every event the tracer read, in
//! the order read, in the record format `session::analysis::crosscheck` reads. Kernel-only
//! mode's DATA records are not events and are not in it (their own dump is `--raw-data`,
//! [`DataDump`]); its PROCESS events are.

use std::fs::File;
use std::io::{self, BufWriter, Write};
use std::path::Path;

use anyhow::{Context as _, Result};
use session::analysis::crosscheck::encode;
use tracer_ebpf::abi::Event;

use crate::events::data::Data;

/// Writes the raw dump: every event, in the order given, 40 bytes each.
pub struct RawDump {
    out: BufWriter<File>,
    pub written: u64,
}

impl RawDump {
    /// Creates `path` as a session's outputs are created (`overwrite`: `--overwrite`).
    pub fn create(path: &Path, overwrite: bool) -> Result<RawDump> {
        let file = crate::out_dir::create_file_at(path, overwrite)?;
        Ok(RawDump {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
        })
    }

    pub fn write(&mut self, event: &Event) -> io::Result<()> {
        self.written += 1;
        self.out.write_all(&encode(event))
    }

    pub fn finish(mut self) -> io::Result<u64> {
        self.out.flush()?;
        Ok(self.written)
    }
}

/// `--raw-data`: every DATA record as the kernel wrote it (`events::data::read_dump`).
pub struct DataDump {
    out: BufWriter<File>,
    written: u64,
    error: Option<std::io::Error>,
}

impl DataDump {
    pub fn create(path: &Path, overwrite: bool) -> anyhow::Result<DataDump> {
        let file = crate::out_dir::create_file_at(path, overwrite)?;
        Ok(DataDump {
            out: BufWriter::with_capacity(1 << 20, file),
            written: 0,
            error: None,
        })
    }

    pub fn write(&mut self, data: &Data) {
        if self.error.is_some() {
            return;
        }
        match self
            .out
            .write_all(crate::events::data::encode(&data.to_event()))
        {
            Ok(()) => self.written += 1,
            Err(e) => self.error = Some(e),
        }
    }

    pub fn finish(mut self) -> anyhow::Result<u64> {
        if let Some(e) = self.error.take() {
            return Err(e).context("writing --raw-data");
        }
        self.out.flush().context("flushing --raw-data")?;
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
            dump.write(e).unwrap();
        }
        assert_eq!(dump.finish().unwrap(), 2);
        assert_eq!(std::fs::metadata(&path).unwrap().len(), 80);
        assert_eq!(read_dump(&path).unwrap(), events);
    }
}
