//! Kernel-only sessions: a data syscall and the bytes it moved, as the rebuild reads it.

use tracer_ebpf::abi::{DATA_BYTES, DataEvent, Event, kind, syscall};

/// Which way the bytes went, seen from the traced process.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Direction {
    /// read, readv, recvfrom: bytes arrived from the peer.
    Receive,
    /// write, writev, sendto: bytes left for the peer.
    Send,
}

/// One data syscall that moved bytes (its return value was positive).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Data {
    pub enter_ns: u64,
    pub exit_ns: u64,
    /// The process owning `fd`.
    pub tgid: u32,
    pub tid: u32,
    pub fd: u32,
    /// `tracer_ebpf::abi::syscall::*`.
    pub syscall: u16,
    /// Bytes moved (the return value).
    pub len: u64,
    /// The first bytes moved, at most `len` and `DATA_BYTES`.
    pub bytes: Vec<u8>,
}

impl Data {
    /// `None` for a record whose syscall moved nothing or is not a data syscall.
    pub fn from_event(record: &DataEvent) -> Option<Data> {
        let ret = record.event.args[2] as i64;
        let id = record.event.sub;
        if ret <= 0 || !(syscall::is_receive(id) || syscall::is_send(id)) {
            return None;
        }
        let captured = (record.captured as usize)
            .min(record.bytes.len())
            .min(ret as usize);
        Some(Data {
            enter_ns: record.event.args[0],
            exit_ns: record.event.ts_ns,
            tgid: record.tgid,
            tid: record.event.tid,
            fd: record.event.args[1] as u32,
            syscall: id,
            len: ret as u64,
            bytes: record.bytes[..captured].to_vec(),
        })
    }

    /// The record the kernel wrote for it (`captured` = `bytes.len()`; the bytes past it zero).
    pub fn to_event(&self) -> DataEvent {
        let mut bytes = [0; DATA_BYTES];
        let captured = self.bytes.len().min(DATA_BYTES);
        bytes[..captured].copy_from_slice(&self.bytes[..captured]);
        DataEvent {
            event: Event {
                ts_ns: self.exit_ns,
                tid: self.tid,
                kind: kind::DATA,
                sub: self.syscall,
                args: [self.enter_ns, u64::from(self.fd), self.len],
            },
            tgid: self.tgid,
            captured: captured as u32,
            bytes,
        }
    }

    pub fn direction(&self) -> Direction {
        if syscall::is_receive(self.syscall) {
            Direction::Receive
        } else {
            Direction::Send
        }
    }

    /// Whether `bytes` holds everything the syscall moved.
    pub fn whole(&self) -> bool {
        self.bytes.len() as u64 == self.len
    }
}

/// The line a `--raw-data` dump starts with, before its records: it tells a dump from any other
/// file (`--overwrite` replaces only a file that starts with it).
pub const DUMP_HEADER: &[u8] = b"tracer --raw-data 1\n";

/// A record's bytes as the kernel wrote them (the `--raw-data` dump's format).
pub fn encode(record: &DataEvent) -> &[u8] {
    // SAFETY: viewing a repr(C) struct without padding as bytes.
    unsafe {
        core::slice::from_raw_parts(
            (record as *const DataEvent).cast::<u8>(),
            size_of::<DataEvent>(),
        )
    }
}

/// The [`DataEvent`] in `bytes`, if they are exactly one's size.
pub fn data_event(bytes: &[u8]) -> Option<DataEvent> {
    // SAFETY: the length matches and DataEvent is plain integers and bytes.
    (bytes.len() == size_of::<DataEvent>())
        .then(|| unsafe { bytes.as_ptr().cast::<DataEvent>().read_unaligned() })
}

/// Reads a `--raw-data` dump: [`DUMP_HEADER`], then [`DataEvent`]s back to back, each turned
/// into [`Data`].
pub fn read_dump(bytes: &[u8]) -> anyhow::Result<Vec<Data>> {
    let bytes = bytes.strip_prefix(DUMP_HEADER).ok_or_else(|| {
        anyhow::anyhow!(
            "not a --raw-data dump (it does not start with {:?}); record one with \
             `tracer record --raw-data FILE`",
            String::from_utf8_lossy(DUMP_HEADER)
        )
    })?;
    let size = size_of::<DataEvent>();
    anyhow::ensure!(
        bytes.len().is_multiple_of(size),
        "a --raw-data dump of {} bytes is not a whole number of {size}-byte records",
        bytes.len()
    );
    bytes
        .chunks_exact(size)
        .enumerate()
        .map(|(i, chunk)| {
            let record = data_event(chunk).expect("chunks_exact gives whole records");
            Data::from_event(&record)
                .ok_or_else(|| anyhow::anyhow!("record {i} of the --raw-data dump moved nothing"))
        })
        .collect()
}
