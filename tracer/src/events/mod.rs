//! From the ring buffer to an ordered event stream: read records, decode them into
//! [`Event`]s, reorder them by timestamp, and interleave loss spans from the kernel's LOSS
//! counters, so that the consumer sees every loss before any event newer than its start.

pub mod data;
pub mod decode;
pub mod drops;
pub mod loss;
pub mod priority;
pub mod reorder;

use std::os::fd::{AsFd as _, BorrowedFd};

use aya::maps::{MapData, RingBuf};
use tracer_ebpf::abi::Event;

use self::{data::Data, loss::LossPoller, priority::ReaderPriority, reorder::Reorder};

/// One record of the ordered stream: an event, or (kernel-only mode) a data syscall with its
/// bytes, ordered by its `exit_ns`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    Data(Box<Data>),
}

impl Record {
    /// The time it sorts by: the event's `ts_ns`, the data syscall's exit.
    pub fn ts_ns(&self) -> u64 {
        match self {
            Record::Event(event) => event.ts_ns,
            Record::Data(data) => data.exit_ns,
        }
    }

    /// Hands it to the sink's method for its kind.
    pub fn send(&self, sink: &mut impl EventSink) {
        match self {
            Record::Event(event) => sink.push(event),
            Record::Data(data) => sink.data(data),
        }
    }
}

impl From<Event> for Record {
    fn from(event: Event) -> Record {
        Record::Event(event)
    }
}

/// Where the ordered stream goes (the rebuild, or a counter in tests).
pub trait EventSink {
    /// Events in non-decreasing `ts_ns` order, interleaved with [`EventSink::data`].
    fn push(&mut self, event: &Event);
    /// Kernel-only mode: a data syscall, in the same order (by `exit_ns`) as the events pushed
    /// around it. Ignored by default (exact mode writes none).
    fn data(&mut self, _data: &Data) {}
    /// Events may be missing in `[from_ns, to_ns]`. Called before any event newer than
    /// `from_ns` is pushed.
    fn lost(&mut self, from_ns: u64, to_ns: u64);
}

/// How long an event is held for stragglers from other CPUs.
pub const DEFAULT_WINDOW_NS: u64 = 20_000_000;
/// How often the LOSS counters are read.
pub const LOSS_POLL_NS: u64 = 100_000_000;

pub fn monotonic_ns() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub events: u64,
    /// DATA records (kernel-only mode), not in `events`.
    pub data: u64,
    /// Records whose size is neither `size_of::<Event>()` nor `size_of::<DataEvent>()`, or
    /// DATA-sized ones that are not DATA records.
    pub malformed: u64,
}

pub struct EventStream {
    ring: RingBuf<MapData>,
    loss: LossPoller,
    reorder: Reorder,
    window_ns: u64,
    pub counters: Counters,
    /// The reading thread's scheduling, which follows how far behind its drains find it.
    pub priority: ReaderPriority,
}

impl EventStream {
    /// `ring_bytes`: the ring's size, against which a drain's bytes say whether the reader is
    /// behind.
    pub fn new(
        ring: RingBuf<MapData>,
        ring_bytes: u32,
        loss: PerCpuArrayLoss,
        window_ns: u64,
    ) -> Self {
        EventStream {
            ring,
            loss: LossPoller::new(loss, monotonic_ns()),
            reorder: Reorder::default(),
            window_ns,
            counters: Counters::default(),
            priority: ReaderPriority::new(u64::from(ring_bytes)),
        }
    }

    /// The ring's fd, readable when the kernel woke the reader (the ring filled past the
    /// wakeup threshold).
    pub fn ring_fd(&self) -> BorrowedFd<'_> {
        self.ring.as_fd()
    }

    pub fn lost_events(&self) -> u64 {
        self.loss.total()
    }

    pub fn late_events(&self) -> u64 {
        self.reorder.late
    }

    pub fn held(&self) -> usize {
        self.reorder.len()
    }

    /// Reads what the ring holds, polls loss when due, and releases to `sink` every event older
    /// than both the window and the point after which unreported losses may lie.
    pub fn pump(&mut self, sink: &mut impl EventSink) -> anyhow::Result<()> {
        // Read the clock before draining: anything stamped before `now - window` is in the
        // ring by now (a program runs for microseconds between its stamp and its submit).
        let now = monotonic_ns();
        self.drain_ring();
        if now.saturating_sub(self.loss.last_poll_ns()) >= LOSS_POLL_NS {
            self.poll_loss(now, sink)?;
        }
        let watermark = now
            .max(self.reorder.newest_ns())
            .saturating_sub(self.window_ns)
            .min(self.loss.settled_ns());
        self.reorder.release(watermark, |record| record.send(sink));
        Ok(())
    }

    /// After the programs are detached: read the rest, account the last losses, hand over all.
    pub fn finish(&mut self, sink: &mut impl EventSink) -> anyhow::Result<()> {
        self.drain_ring();
        self.poll_loss(monotonic_ns(), sink)?;
        self.reorder.flush(|record| record.send(sink));
        Ok(())
    }

    fn drain_ring(&mut self) {
        let behind = self.priority.behind_bytes();
        let mut bytes = 0u64;
        while let Some(record) = self.ring.next() {
            let before = bytes;
            bytes += record.len() as u64;
            // Behind: the rest of this drain already runs at normal priority.
            if before < behind && bytes >= behind {
                self.priority.drained(bytes);
            }
            match decode::decode_record(&record) {
                Some(record) => {
                    match record {
                        Record::Event(_) => self.counters.events += 1,
                        Record::Data(_) => self.counters.data += 1,
                    }
                    self.reorder.push(record);
                }
                None => self.counters.malformed += 1,
            }
        }
        self.priority.drained(bytes);
    }

    fn poll_loss(&mut self, now: u64, sink: &mut impl EventSink) -> anyhow::Result<()> {
        if let Some((from, to)) = self.loss.poll(now)? {
            // Everything older than `from` may go first, so the sink sees the span in order.
            self.reorder.release(from, |record| record.send(sink));
            sink.lost(from, to);
        }
        Ok(())
    }
}

type PerCpuArrayLoss = aya::maps::PerCpuArray<MapData, tracer_ebpf::abi::Loss>;
