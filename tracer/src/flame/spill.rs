//! A compact on-disk log of what the pictures need from each complete request, so a long
//! session stays bounded in memory: the tail threshold is only known at the end, and the
//! flamegraphs and trace.json are built in one read pass over this file.
//!
//! Format: one record per request, `varint(len) ++ body`; all integers are LEB128 varints,
//! signed ones (stack ids, times that could precede `t_arrive`) zigzag-encoded. The file is
//! private to one session and removed when the [`Spill`] is dropped. It keeps everything the
//! pictures use, which is all of a [`RequestRecord`] but its hit counts: records read back
//! carry zero hits.

use std::fs::File;
use std::io::{self, BufReader, BufWriter, Read, Write};

use tracer_ebpf::sites::Phase;

use crate::out_dir::OutDir;

use crate::requests::{
    Hits, Holder, OffCpu, PARTS, Part, RequestRecord, Slice, StackSample, WaitCharge, WriterWork,
};

/// The spill's name in the output directory.
pub const SPILL_FILE: &str = ".flame-spill.bin";

/// Writes records to a file in the session's output directory, removed on drop.
pub struct Spill {
    dir: OutDir,
    writer: Option<BufWriter<File>>,
    records: u64,
    scratch: Vec<u8>,
}

impl Spill {
    /// Creates [`SPILL_FILE`] in `dir` (a leftover from a crashed session only with
    /// `--overwrite`, as any other output).
    pub fn create(dir: &OutDir) -> anyhow::Result<Self> {
        let file = dir.create_file(SPILL_FILE)?;
        Ok(Spill {
            dir: dir.clone(),
            writer: Some(BufWriter::with_capacity(1 << 20, file)),
            records: 0,
            scratch: Vec::with_capacity(512),
        })
    }

    pub fn records(&self) -> u64 {
        self.records
    }

    pub fn push(&mut self, record: &RequestRecord) -> io::Result<()> {
        let Some(writer) = self.writer.as_mut() else {
            return Err(io::Error::other("spill already finished"));
        };
        self.scratch.clear();
        encode(record, &mut self.scratch);
        let mut len = Vec::with_capacity(5);
        put_u(&mut len, self.scratch.len() as u64);
        writer.write_all(&len)?;
        writer.write_all(&self.scratch)?;
        self.records += 1;
        Ok(())
    }

    /// Flushes and returns a reader over every record pushed so far, in push order.
    pub fn read_back(&mut self) -> anyhow::Result<SpillReader> {
        if let Some(mut writer) = self.writer.take() {
            writer.flush()?;
        }
        Ok(SpillReader {
            reader: BufReader::with_capacity(1 << 20, self.dir.open_file(SPILL_FILE)?),
            body: Vec::with_capacity(512),
        })
    }
}

impl Drop for Spill {
    fn drop(&mut self) {
        self.writer = None;
        // Best effort: the file is scratch space and must not outlive the session.
        let _ = self.dir.remove(SPILL_FILE);
    }
}

pub struct SpillReader {
    reader: BufReader<File>,
    body: Vec<u8>,
}

impl Iterator for SpillReader {
    type Item = io::Result<RequestRecord>;

    fn next(&mut self) -> Option<Self::Item> {
        let len = match read_len(&mut self.reader) {
            Ok(Some(len)) => len,
            Ok(None) => return None,
            Err(err) => return Some(Err(err)),
        };
        self.body.resize(len, 0);
        if let Err(err) = self.reader.read_exact(&mut self.body) {
            return Some(Err(err));
        }
        Some(decode(&self.body).ok_or_else(|| invalid("corrupt spill record")))
    }
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, what.to_owned())
}

/// Reads a record length; `None` at a clean end of file.
fn read_len(reader: &mut impl Read) -> io::Result<Option<usize>> {
    let mut value = 0u64;
    for shift in (0..64).step_by(7) {
        let mut byte = [0u8];
        if reader.read(&mut byte)? == 0 {
            return if shift == 0 {
                Ok(None)
            } else {
                Err(invalid("truncated spill length"))
            };
        }
        value |= u64::from(byte[0] & 0x7f) << shift;
        if byte[0] & 0x80 == 0 {
            return usize::try_from(value)
                .map(Some)
                .map_err(|_| invalid("spill length"));
        }
    }
    Err(invalid("spill length too long"))
}

fn encode(r: &RequestRecord, out: &mut Vec<u8>) {
    put_u(out, r.req_id);
    put_u(out, u64::from(r.status));
    put_u(out, r.t_arrive_ns);
    put_u(out, r.t_done_ns - r.t_arrive_ns);
    for ns in r.parts {
        put_u(out, ns);
    }
    put_u(out, r.slices.len() as u64);
    for s in &r.slices {
        put_i(out, s.start_ns as i64 - r.t_arrive_ns as i64);
        put_u(out, s.end_ns - s.start_ns);
        put_u(out, s.part.index() as u64);
        put_u(out, u64::from(s.tid));
    }
    put_u(out, r.samples.len() as u64);
    for s in &r.samples {
        put_i(out, s.ts_ns as i64 - r.t_arrive_ns as i64);
        put_u(out, u64::from(s.tid));
        put_i(out, s.kernel_stack);
        put_i(out, s.user_stack);
        put_u(out, s.phase.map_or(0, |p| p as u64));
    }
    put_u(out, r.offcpu.len() as u64);
    for o in &r.offcpu {
        put_u(out, u64::from(o.tid));
        put_u(out, o.ns);
        put_i(out, o.kernel_stack);
        put_i(out, o.user_stack);
        put_u(out, o.part.index() as u64);
    }
    // 0: not charged; n + 1: n charges.
    put_u(out, r.waits.as_ref().map_or(0, |w| w.len() as u64 + 1));
    for w in r.waits.iter().flatten() {
        put_u(out, w.part.index() as u64);
        let (tag, value) = holder_code(w.holder);
        put_u(out, tag);
        put_u(out, value);
        put_u(out, w.ns);
        put_i(out, w.kernel_stack);
        put_i(out, w.user_stack);
    }
}

const WORKS: [WriterWork; 3] = [WriterWork::Sign, WriterWork::Fsync, WriterWork::Other];

/// (tag, value) of a holder.
fn holder_code(holder: Holder) -> (u64, u64) {
    match holder {
        Holder::Request { phase } => (0, phase.map_or(0, |p| p as u64)),
        Holder::Writer(work) => (1, WORKS.iter().position(|w| *w == work).unwrap_or(0) as u64),
        Holder::WriterBlocked => (2, 0),
        Holder::Thread(tid) => (3, u64::from(tid)),
        Holder::Process(pid) => (4, u64::from(pid)),
        Holder::Idle => (5, 0),
        Holder::Unknown => (6, 0),
    }
}

fn holder_from(tag: u64, value: u64) -> Option<Holder> {
    Some(match tag {
        0 => Holder::Request {
            phase: match value {
                0 => None,
                id => Some(Phase::from_id(id)?),
            },
        },
        1 => Holder::Writer(*WORKS.get(usize::try_from(value).ok()?)?),
        2 => Holder::WriterBlocked,
        3 => Holder::Thread(u32::try_from(value).ok()?),
        4 => Holder::Process(u32::try_from(value).ok()?),
        5 => Holder::Idle,
        6 => Holder::Unknown,
        _ => return None,
    })
}

fn decode(body: &[u8]) -> Option<RequestRecord> {
    let mut c = Cursor { body, at: 0 };
    let req_id = c.u()?;
    let status = u16::try_from(c.u()?).ok()?;
    let t_arrive_ns = c.u()?;
    let t_done_ns = t_arrive_ns.checked_add(c.u()?)?;
    let mut parts = [0u64; PARTS];
    for ns in &mut parts {
        *ns = c.u()?;
    }
    let slices = (0..c.count()?)
        .map(|_| {
            let start_ns = t_arrive_ns.checked_add_signed(c.i()?)?;
            Some(Slice {
                start_ns,
                end_ns: start_ns.checked_add(c.u()?)?,
                part: c.part()?,
                tid: c.tid()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let samples = (0..c.count()?)
        .map(|_| {
            Some(StackSample {
                ts_ns: t_arrive_ns.checked_add_signed(c.i()?)?,
                tid: c.tid()?,
                kernel_stack: c.i()?,
                user_stack: c.i()?,
                phase: match c.u()? {
                    0 => None,
                    id => Some(Phase::from_id(id)?),
                },
            })
        })
        .collect::<Option<Vec<_>>>()?;
    let offcpu = (0..c.count()?)
        .map(|_| {
            Some(OffCpu {
                tid: c.tid()?,
                ns: c.u()?,
                kernel_stack: c.i()?,
                user_stack: c.i()?,
                part: c.part()?,
            })
        })
        .collect::<Option<Vec<_>>>()?;
    // 0: not charged; n + 1: n charges (so the count itself may exceed the bytes left).
    let waits = match c.u()? {
        0 => None,
        n => Some(
            (0..c.bounded(n - 1)?)
                .map(|_| {
                    Some(WaitCharge {
                        part: c.part()?,
                        holder: holder_from(c.u()?, c.u()?)?,
                        ns: c.u()?,
                        kernel_stack: c.i()?,
                        user_stack: c.i()?,
                    })
                })
                .collect::<Option<Vec<_>>>()?,
        ),
    };
    (c.at == body.len()).then_some(RequestRecord {
        req_id,
        status,
        t_arrive_ns,
        t_done_ns,
        client_port: None,
        upstream_start_ns: None,
        parts,
        slices,
        samples,
        offcpu,
        waits,
        hits: Hits::default(),
    })
}

fn put_u(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

fn put_i(out: &mut Vec<u8>, value: i64) {
    put_u(out, ((value << 1) ^ (value >> 63)) as u64);
}

struct Cursor<'a> {
    body: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn u(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for shift in (0..64).step_by(7) {
            let byte = *self.body.get(self.at)?;
            self.at += 1;
            value |= u64::from(byte & 0x7f) << shift;
            if byte & 0x80 == 0 {
                return Some(value);
            }
        }
        None
    }

    fn i(&mut self) -> Option<i64> {
        let raw = self.u()?;
        Some(((raw >> 1) as i64) ^ -((raw & 1) as i64))
    }

    /// A length that cannot exceed the bytes left, so a corrupt count cannot allocate wildly.
    fn count(&mut self) -> Option<usize> {
        let n = self.u()?;
        self.bounded(n)
    }

    fn bounded(&self, n: u64) -> Option<usize> {
        let n = usize::try_from(n).ok()?;
        (n <= self.body.len() - self.at).then_some(n)
    }

    fn tid(&mut self) -> Option<u32> {
        u32::try_from(self.u()?).ok()
    }

    fn part(&mut self) -> Option<Part> {
        Part::ALL.get(usize::try_from(self.u()?).ok()?).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(req_id: u64) -> RequestRecord {
        let mut parts = [0u64; PARTS];
        parts[Part::Scheduling.index()] = 40;
        parts[Part::Cpu(Phase::Auth).index()] = 60;
        RequestRecord {
            req_id,
            status: 200,
            t_arrive_ns: 1_000_000_000_000,
            t_done_ns: 1_000_000_000_100,
            client_port: None,
            upstream_start_ns: None,
            parts,
            slices: vec![
                Slice {
                    start_ns: 1_000_000_000_000,
                    end_ns: 1_000_000_000_040,
                    part: Part::Scheduling,
                    tid: 0,
                },
                Slice {
                    start_ns: 1_000_000_000_040,
                    end_ns: 1_000_000_000_100,
                    part: Part::Cpu(Phase::Auth),
                    tid: 77,
                },
            ],
            samples: vec![StackSample {
                ts_ns: 1_000_000_000_050,
                tid: 77,
                kernel_stack: -1,
                user_stack: 12,
                phase: Some(Phase::Auth),
            }],
            offcpu: vec![OffCpu {
                tid: 78,
                ns: 5,
                kernel_stack: 3,
                user_stack: -1,
                part: Part::LedgerFsync,
            }],
            waits: Some(vec![
                WaitCharge {
                    part: Part::Scheduling,
                    holder: Holder::Process(4242),
                    ns: 30,
                    kernel_stack: -1,
                    user_stack: -1,
                },
                WaitCharge {
                    part: Part::Scheduling,
                    holder: Holder::Request {
                        phase: Some(Phase::Auth),
                    },
                    ns: 10,
                    kernel_stack: 3,
                    user_stack: 4,
                },
                WaitCharge {
                    part: Part::LedgerOther,
                    holder: Holder::Writer(WriterWork::Other),
                    ns: 1,
                    kernel_stack: -1,
                    user_stack: -1,
                },
            ]),
            hits: Hits::default(),
        }
    }

    #[test]
    fn records_round_trip_in_order_and_the_file_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::create(&OutDir::open_for(dir.path(), false, None).unwrap()).unwrap();
        for id in [u64::MAX, 7, 0] {
            spill.push(&record(id)).unwrap();
        }
        let back: Vec<_> = spill
            .read_back()
            .unwrap()
            .collect::<io::Result<_>>()
            .unwrap();
        assert_eq!(back.len(), 3);
        // The records have no hits, the one thing the spill does not keep.
        for (got, id) in back.iter().zip([u64::MAX, 7, 0]) {
            assert_eq!(got, &record(id));
        }
        let path = dir.path().join(SPILL_FILE);
        assert!(path.exists());
        drop(spill);
        assert!(!path.exists());
    }

    #[test]
    fn a_charged_request_with_no_charges_round_trips() {
        // Its waits end the record: the count (1) is larger than the bytes left (0).
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::create(&OutDir::open_for(dir.path(), false, None).unwrap()).unwrap();
        let mut charged_nothing = record(3);
        charged_nothing.waits = Some(vec![]);
        spill.push(&charged_nothing).unwrap();
        let back: Vec<_> = spill
            .read_back()
            .unwrap()
            .collect::<io::Result<_>>()
            .unwrap();
        assert_eq!(back[0].waits, Some(vec![]));
    }

    #[test]
    fn a_truncated_file_is_an_error_not_a_short_read() {
        let dir = tempfile::tempdir().unwrap();
        let mut spill = Spill::create(&OutDir::open_for(dir.path(), false, None).unwrap()).unwrap();
        spill.push(&record(1)).unwrap();
        spill.read_back().unwrap();
        let path = dir.path().join(SPILL_FILE);
        let bytes = std::fs::read(&path).unwrap();
        std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
        let results: Vec<_> = spill.read_back().unwrap().collect();
        assert_eq!(results.len(), 1);
        assert!(results[0].is_err());
    }
}
