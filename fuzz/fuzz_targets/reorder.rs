//! The reorder buffer against a stable sort. The input is a list of operations, 3 bytes each:
//! `op, ts_lo, ts_hi`; `op % 4` is 0 or 1: push an event, 2: push a data record (both at
//! `ts`), 3: release below the watermark `ts`; `op & 0x80` puts `ts` just under `u64::MAX`.
//! A final flush hands over the rest, as `EventStream::finish` does.
//!
//! Each release hands over exactly the held records older than its watermark, in (ts, arrival)
//! order; a record pushed older than one already handed over is counted late; every record
//! comes out once; with none late, the whole output is the stable sort of the input.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::events::{Record, data::Data, reorder::Reorder};
use tracer_ebpf::abi::{Event, syscall};

/// A record whose tid is its arrival number, so that the output names what it was.
fn record(ts_ns: u64, arrival: u32, data: bool) -> Record {
    if data {
        Record::Data(Box::new(Data {
            enter_ns: ts_ns.saturating_sub(1),
            exit_ns: ts_ns,
            tgid: 1,
            tid: arrival,
            fd: 3,
            syscall: syscall::READ,
            len: 1,
            bytes: vec![b'x'],
        }))
    } else {
        Record::Event(Event {
            ts_ns,
            tid: arrival,
            ..Event::default()
        })
    }
}

fn key(record: &Record) -> (u64, u32) {
    match record {
        Record::Event(event) => (event.ts_ns, event.tid),
        Record::Data(data) => (data.exit_ns, data.tid),
    }
}

/// What the buffer should do, as plain vectors: `(ts, arrival)` pairs.
#[derive(Default)]
struct Model {
    held: Vec<(u64, u32)>,
    pushed: Vec<(u64, u32)>,
    out: Vec<(u64, u32)>,
    newest_released: Option<u64>,
    late: u64,
}

impl Model {
    fn push(&mut self, reorder: &mut Reorder, ts: u64, data: bool) {
        let arrival = self.pushed.len() as u32;
        if self.newest_released.is_some_and(|newest| ts < newest) {
            self.late += 1;
        }
        reorder.push(record(ts, arrival, data));
        self.held.push((ts, arrival));
        self.pushed.push((ts, arrival));
        assert_eq!(reorder.late, self.late, "late count after pushing {ts}");
        let newest = self.pushed.iter().map(|&(ts, _)| ts).max();
        assert_eq!(Some(reorder.newest_ns()), newest);
    }

    fn release(&mut self, reorder: &mut Reorder, watermark: u64) {
        let mut expected: Vec<(u64, u32)> = (self.held.iter().copied())
            .filter(|&(ts, _)| ts < watermark)
            .collect();
        expected.sort();
        self.held.retain(|&(ts, _)| ts >= watermark);
        let mut got = Vec::new();
        reorder.release(watermark, |record| got.push(key(record)));
        assert_eq!(got, expected, "release({watermark})");
        if let Some(&(ts, _)) = got.last() {
            self.newest_released = Some(self.newest_released.map_or(ts, |n| n.max(ts)));
        }
        self.out.extend(got);
        assert_eq!(reorder.len(), self.held.len());
    }
}

fuzz_target!(|bytes: &[u8]| {
    let mut reorder = Reorder::default();
    let mut model = Model::default();
    for op in bytes.chunks_exact(3) {
        let low = u64::from(u16::from_le_bytes([op[1], op[2]]));
        let ts = if op[0] & 0x80 != 0 {
            u64::MAX - low
        } else {
            low
        };
        match op[0] % 4 {
            3 => model.release(&mut reorder, ts),
            kind => model.push(&mut reorder, ts, kind == 2),
        }
    }
    // The flush: everything left, in order.
    let mut rest = Vec::new();
    reorder.flush(|record| rest.push(key(record)));
    model.held.sort();
    assert_eq!(rest, model.held, "flush");
    assert!(reorder.is_empty());
    model.out.extend(rest);
    // Every record once.
    let mut arrivals: Vec<u32> = model.out.iter().map(|&(_, a)| a).collect();
    arrivals.sort();
    let n = model.pushed.len() as u32;
    assert!(arrivals.into_iter().eq(0..n), "lost or duplicated");
    if model.late == 0 {
        model.pushed.sort_by_key(|&(ts, _)| ts);
        assert_eq!(model.out, model.pushed, "not the stable sort of the input");
    }
});
