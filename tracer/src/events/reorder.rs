//! Events from different CPUs reach the ring slightly out of timestamp order. The reorder
//! buffer holds them and releases, in (ts, arrival) order, those older than a watermark that
//! user space advances once nothing older can still arrive.
//!
//! The buffer is a deque kept sorted: almost every event is newer than all held ones and goes
//! to the back, the few from a lagging CPU are inserted near it, and releasing pops the
//! front, so an event costs O(1) where a heap paid two O(log n) sifts.

use std::collections::VecDeque;

use super::Record;

#[derive(Debug)]
struct Held {
    key: (u64, u64),
    record: Record,
}

#[derive(Debug, Default)]
pub struct Reorder {
    held: VecDeque<Held>,
    arrivals: u64,
    newest_ns: u64,
    /// The newest stamp handed over so far.
    released_ns: u64,
    /// Events that arrived older than what was already released (window too small).
    pub late: u64,
}

impl Reorder {
    /// Takes an [`super::Event`] or a [`Record`] (kernel-only mode's data records sort by
    /// their exit time, as the SYSCALL event they stand for would).
    pub fn push(&mut self, record: impl Into<Record>) {
        let record = record.into();
        let ts_ns = record.ts_ns();
        if ts_ns < self.released_ns {
            self.late += 1;
        }
        self.newest_ns = self.newest_ns.max(ts_ns);
        self.arrivals += 1;
        let held = Held {
            key: (ts_ns, self.arrivals),
            record,
        };
        // Arrival numbers only grow, so a key equal in ts goes after the held ones.
        if self.held.back().is_none_or(|last| last.key <= held.key) {
            self.held.push_back(held);
        } else {
            let at = self.held.partition_point(|h| h.key <= held.key);
            self.held.insert(at, held);
        }
    }

    /// The newest timestamp seen so far.
    pub fn newest_ns(&self) -> u64 {
        self.newest_ns
    }

    pub fn len(&self) -> usize {
        self.held.len()
    }

    pub fn is_empty(&self) -> bool {
        self.held.is_empty()
    }

    /// Hands every held record with `ts_ns < watermark_ns` to `sink`, oldest first.
    pub fn release(&mut self, watermark_ns: u64, mut sink: impl FnMut(&Record)) {
        while self
            .held
            .front()
            .is_some_and(|held| held.key.0 < watermark_ns)
        {
            self.release_front(&mut sink);
        }
    }

    /// Hands over everything still held (end of the session), a record stamped `u64::MAX`
    /// included.
    pub fn flush(&mut self, mut sink: impl FnMut(&Record)) {
        while !self.held.is_empty() {
            self.release_front(&mut sink);
        }
    }

    fn release_front(&mut self, sink: &mut impl FnMut(&Record)) {
        if let Some(held) = self.held.pop_front() {
            // The newest released, not the last: after a late record goes out, one older
            // than the newest is still late (the consumer has moved past it).
            self.released_ns = self.released_ns.max(held.key.0);
            sink(&held.record);
        }
    }
}

#[cfg(test)]
mod tests {
    use tracer_ebpf::abi::Event;

    use super::*;
    use crate::events::data::Data;

    trait Key {
        fn key(&self) -> (u64, u32);
    }
    impl Key for Record {
        fn key(&self) -> (u64, u32) {
            match self {
                Record::Event(e) => (e.ts_ns, e.tid),
                Record::Data(d) => (d.exit_ns, d.tid),
            }
        }
    }

    fn at(ts_ns: u64, tid: u32) -> Event {
        Event {
            ts_ns,
            tid,
            ..Event::default()
        }
    }

    #[test]
    fn releases_in_ts_order_below_the_watermark_only() {
        let mut reorder = Reorder::default();
        for (ts, tid) in [(30, 1), (10, 2), (20, 3), (10, 4), (50, 5)] {
            reorder.push(at(ts, tid));
        }
        let mut out = Vec::new();
        reorder.release(30, |e| out.push(e.key()));
        // Equal timestamps keep their arrival order.
        assert_eq!(out, [(10, 2), (10, 4), (20, 3)]);
        assert_eq!(reorder.len(), 2);
        out.clear();
        reorder.flush(|e| out.push(e.key()));
        assert_eq!(out, [(30, 1), (50, 5)]);
        assert!(reorder.is_empty());
        assert_eq!(reorder.late, 0);
    }

    #[test]
    fn data_records_interleave_by_exit_time() {
        let data = |exit_ns, tid| {
            Record::Data(Box::new(Data {
                enter_ns: 0,
                exit_ns,
                tgid: 1,
                tid,
                fd: 3,
                syscall: tracer_ebpf::abi::syscall::READ,
                len: 1,
                bytes: vec![b'x'],
            }))
        };
        let mut reorder = Reorder::default();
        reorder.push(at(30, 1));
        reorder.push(data(20, 2));
        reorder.push(at(10, 3));
        reorder.push(data(40, 4));
        let mut out = Vec::new();
        reorder.flush(|e| out.push((e.key(), matches!(e, Record::Data(_)))));
        assert_eq!(
            out,
            [
                ((10, 3), false),
                ((20, 2), true),
                ((30, 1), false),
                ((40, 4), true)
            ]
        );
    }

    #[test]
    fn counts_events_older_than_released() {
        let mut reorder = Reorder::default();
        reorder.push(at(100, 1));
        reorder.release(200, |_| {});
        reorder.push(at(50, 2));
        assert_eq!(reorder.late, 1);
        assert_eq!(reorder.newest_ns(), 100);
    }

    #[test]
    fn flush_hands_over_even_the_newest_possible_stamp() {
        let mut reorder = Reorder::default();
        reorder.push(at(u64::MAX, 1));
        reorder.push(at(5, 2));
        let mut out = Vec::new();
        reorder.flush(|e| out.push(e.key()));
        assert_eq!(out, [(5, 2), (u64::MAX, 1)]);
        assert!(reorder.is_empty());
    }

    #[test]
    fn an_event_older_than_any_released_one_is_late_after_a_late_release() {
        let mut reorder = Reorder::default();
        reorder.push(at(100, 1));
        reorder.release(200, |_| {});
        reorder.push(at(50, 2));
        // The late event goes out after the newer one; 70 is still older than 100.
        reorder.release(200, |_| {});
        reorder.push(at(70, 3));
        assert_eq!(reorder.late, 2);
    }

    #[test]
    fn matches_a_full_sort_on_a_shuffled_stream() {
        // Several CPUs' streams, each in order, interleaved with jitter, plus equal stamps.
        let mut events = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for i in 0..5000u64 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            events.push(at(i * 10 + x % 300, i as u32));
        }
        let mut expected: Vec<(u64, u32)> = events.iter().map(|e| (e.ts_ns, e.tid)).collect();
        // Stable: equal stamps keep arrival order, as the buffer does.
        expected.sort_by_key(|&(ts, _)| ts);
        let mut reorder = Reorder::default();
        let mut out = Vec::new();
        for (i, e) in events.iter().enumerate() {
            reorder.push(*e);
            if i % 100 == 99 {
                // A watermark well behind the newest: nothing older can still come.
                reorder.release(e.ts_ns.saturating_sub(1000), |e| out.push(e.key()));
            }
        }
        reorder.flush(|e| out.push(e.key()));
        assert_eq!(out, expected);
        assert_eq!(reorder.late, 0);
    }
}
