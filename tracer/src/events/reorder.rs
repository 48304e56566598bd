//! Events from different CPUs reach the ring slightly out of timestamp order. The reorder
//! buffer holds them and releases, in (ts, arrival) order, those older than a watermark that
//! user space advances once nothing older can still arrive.

use std::{cmp::Reverse, collections::BinaryHeap};

use tracer_ebpf::abi::Event;

#[derive(Debug)]
struct Held {
    key: (u64, u64),
    event: Event,
}

impl PartialEq for Held {
    fn eq(&self, other: &Self) -> bool {
        self.key == other.key
    }
}
impl Eq for Held {}
impl PartialOrd for Held {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Held {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.key.cmp(&other.key)
    }
}

#[derive(Debug, Default)]
pub struct Reorder {
    heap: BinaryHeap<Reverse<Held>>,
    arrivals: u64,
    newest_ns: u64,
    released_ns: u64,
    /// Events that arrived older than what was already released (window too small).
    pub late: u64,
}

impl Reorder {
    pub fn push(&mut self, event: Event) {
        if event.ts_ns < self.released_ns {
            self.late += 1;
        }
        self.newest_ns = self.newest_ns.max(event.ts_ns);
        self.arrivals += 1;
        self.heap.push(Reverse(Held {
            key: (event.ts_ns, self.arrivals),
            event,
        }));
    }

    /// The newest timestamp seen so far.
    pub fn newest_ns(&self) -> u64 {
        self.newest_ns
    }

    pub fn len(&self) -> usize {
        self.heap.len()
    }

    pub fn is_empty(&self) -> bool {
        self.heap.is_empty()
    }

    /// Hands every held event with `ts_ns < watermark_ns` to `sink`, oldest first.
    pub fn release(&mut self, watermark_ns: u64, mut sink: impl FnMut(&Event)) {
        while let Some(Reverse(held)) = self.heap.peek() {
            if held.key.0 >= watermark_ns {
                break;
            }
            let Some(Reverse(held)) = self.heap.pop() else {
                break;
            };
            self.released_ns = held.key.0;
            sink(&held.event);
        }
    }

    /// Hands over everything still held (end of the session).
    pub fn flush(&mut self, sink: impl FnMut(&Event)) {
        self.release(u64::MAX, sink);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        reorder.release(30, |e| out.push((e.ts_ns, e.tid)));
        // Equal timestamps keep their arrival order.
        assert_eq!(out, [(10, 2), (10, 4), (20, 3)]);
        assert_eq!(reorder.len(), 2);
        out.clear();
        reorder.flush(|e| out.push((e.ts_ns, e.tid)));
        assert_eq!(out, [(30, 1), (50, 5)]);
        assert!(reorder.is_empty());
        assert_eq!(reorder.late, 0);
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
}
