//! Synthetic event streams for tests: each call adds the events one kernel hook would emit,
//! so a test reads like the timeline it describes. [`Stream::events`] sorts them by ts
//! (stably: equal stamps keep the order they were written in), as the reader would.

use tracer_ebpf::abi::{Event, kind, switch, syscall};
use tracer_ebpf::sites::{Phase, Site};

use super::{Outcome, Rebuilder};

#[derive(Clone, Debug, Default)]
pub struct Stream {
    events: Vec<Event>,
}

impl Stream {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn raw(&mut self, ev: Event) -> &mut Self {
        self.events.push(ev);
        self
    }

    fn ev(&mut self, ts_ns: u64, tid: u32, kind: u16, sub: u16, args: [u64; 3]) -> &mut Self {
        self.raw(Event {
            ts_ns,
            tid,
            kind,
            sub,
            args,
        })
    }

    pub fn site(&mut self, ts: u64, tid: u32, site: Site, args: [u64; 3]) -> &mut Self {
        self.ev(ts, tid, kind::SITE, site as u16, args)
    }

    /// A begin without the client's id (0): outcomes carry the probe id `req`.
    pub fn request_begin(&mut self, ts: u64, tid: u32, req: u64, client_fd: u64) -> &mut Self {
        self.client_request_begin(ts, tid, req, client_fd, 0)
    }

    /// A begin with the client's `x-request-id` as well as the gateway's probe id `req`.
    pub fn client_request_begin(
        &mut self,
        ts: u64,
        tid: u32,
        req: u64,
        client_fd: u64,
        client_id: u64,
    ) -> &mut Self {
        self.site(ts, tid, Site::RequestBegin, [req, client_fd, client_id])
    }

    pub fn request_end(&mut self, ts: u64, tid: u32, req: u64, status: u16) -> &mut Self {
        self.site(ts, tid, Site::RequestEnd, [req, u64::from(status), 0])
    }

    pub fn phase(&mut self, ts: u64, tid: u32, req: u64, phase: Phase) -> &mut Self {
        self.site(ts, tid, Site::Phase, [req, phase as u64, 0])
    }

    pub fn poll_enter(&mut self, ts: u64, tid: u32, req: u64) -> &mut Self {
        self.site(ts, tid, Site::PollEnter, [req, 0, 0])
    }

    /// A poll returned pending (the last poll ends at `request_end` instead).
    pub fn poll_exit(&mut self, ts: u64, tid: u32, req: u64) -> &mut Self {
        self.site(ts, tid, Site::PollExit, [req, 0, 0])
    }

    pub fn ledger_enqueue(&mut self, ts: u64, tid: u32, req: u64) -> &mut Self {
        self.site(ts, tid, Site::LedgerEnqueue, [req, 0, 0])
    }

    /// The writer seals batch `batch` of `count` records in `[begin, end]`.
    pub fn seal(&mut self, begin: u64, end: u64, tid: u32, batch: u64, count: u64) -> &mut Self {
        self.site(begin, tid, Site::SignBegin, [batch, count, 0])
            .site(end, tid, Site::SignEnd, [batch, count, 0])
    }

    pub fn receipt_durable(&mut self, ts: u64, tid: u32, req: u64, seq: u64) -> &mut Self {
        self.site(ts, tid, Site::ReceiptDurable, [req, seq, 0])
    }

    /// A traced syscall `[enter, exit]`; the event is stamped at the exit.
    pub fn syscall(
        &mut self,
        enter: u64,
        exit: u64,
        tid: u32,
        sub: u16,
        fd: u64,
        ret: i64,
    ) -> &mut Self {
        self.ev(exit, tid, kind::SYSCALL, sub, [enter, fd, ret as u64])
    }

    pub fn recv(&mut self, enter: u64, exit: u64, tid: u32, fd: u64, bytes: i64) -> &mut Self {
        self.syscall(enter, exit, tid, syscall::READ, fd, bytes)
    }

    pub fn send(&mut self, enter: u64, exit: u64, tid: u32, fd: u64, bytes: i64) -> &mut Self {
        self.syscall(enter, exit, tid, syscall::WRITEV, fd, bytes)
    }

    pub fn accept(
        &mut self,
        enter: u64,
        exit: u64,
        tid: u32,
        listen_fd: u64,
        new_fd: u64,
    ) -> &mut Self {
        self.syscall(enter, exit, tid, syscall::ACCEPT, listen_fd, new_fd as i64)
    }

    pub fn fdatasync(&mut self, enter: u64, exit: u64, tid: u32, fd: u64) -> &mut Self {
        self.syscall(enter, exit, tid, syscall::FDATASYNC, fd, 0)
    }

    pub fn sock_fd(&mut self, ts: u64, tid: u32, sk: u64, fd: u64) -> &mut Self {
        self.ev(ts, tid, kind::SOCK_FD, 0, [sk, fd, 0])
    }

    pub fn data_ready(&mut self, ts: u64, sk: u64) -> &mut Self {
        self.ev(ts, 0, kind::DATA_READY, 0, [sk, 0, 0])
    }

    pub fn established(&mut self, ts: u64, sk: u64, port: u64) -> &mut Self {
        self.ev(ts, 0, kind::ESTABLISHED, 0, [sk, port, 0])
    }

    /// Switched out, with stack ids `[kernel, user]` = `[tid, tid + 1]` so tests can tell them apart.
    pub fn switch_out(&mut self, ts: u64, tid: u32, preempted: bool) -> &mut Self {
        let stacks = [u64::from(tid), u64::from(tid) + 1, 0];
        self.ev(ts, tid, kind::SWITCH_OUT, u16::from(preempted), stacks)
    }

    pub fn switch_in(&mut self, ts: u64, tid: u32) -> &mut Self {
        self.ev(ts, tid, kind::SWITCH_IN, 0, [0; 3])
    }

    /// Switched out on `cpu`, `next_pid` (0: idle) taking the CPU; stacks as `switch_out`.
    pub fn switch_to(
        &mut self,
        ts: u64,
        tid: u32,
        preempted: bool,
        next_pid: u32,
        cpu: u32,
    ) -> &mut Self {
        let args = [
            u64::from(tid),
            u64::from(tid) + 1,
            switch::pack(next_pid, cpu),
        ];
        self.ev(ts, tid, kind::SWITCH_OUT, u16::from(preempted), args)
    }

    pub fn switch_in_on(&mut self, ts: u64, tid: u32, cpu: u32) -> &mut Self {
        self.ev(ts, tid, kind::SWITCH_IN, 0, [u64::from(cpu), 0, 0])
    }

    /// The name of a task outside the target (at most 16 bytes, as the kernel's comm).
    pub fn task_name(&mut self, ts: u64, pid: u32, name: &str) -> &mut Self {
        let mut comm = [0u8; 16];
        let n = name.len().min(16);
        comm[..n].copy_from_slice(&name.as_bytes()[..n]);
        let word = |i: usize| u64::from_le_bytes(comm[i..i + 8].try_into().expect("8 bytes"));
        self.ev(ts, pid, kind::TASK_NAME, 0, [word(0), word(8), 0])
    }

    pub fn wakeup(&mut self, ts: u64, tid: u32) -> &mut Self {
        self.ev(ts, tid, kind::WAKEUP, 0, [0; 3])
    }

    pub fn sample(&mut self, ts: u64, tid: u32) -> &mut Self {
        self.ev(ts, tid, kind::SAMPLE, 0, [7, 8, 0])
    }

    /// The events in ts order.
    pub fn events(&self) -> Vec<Event> {
        let mut events = self.events.clone();
        events.sort_by_key(|e| e.ts_ns);
        events
    }

    /// Feed everything to a fresh [`Rebuilder`] with the wait-for view, then finish at the
    /// last event.
    pub fn rebuild(&self) -> Vec<Outcome> {
        self.rebuild_with(Rebuilder::new().with_wait_for())
    }

    /// [`Stream::rebuild`]'s record of request `req`, which must be complete.
    pub fn rebuild_complete(&self, req: u64) -> super::RequestRecord {
        complete(&self.rebuild(), req).clone()
    }

    /// Feed everything to `rebuilder`, then finish at the last event.
    pub fn rebuild_with(&self, mut rebuilder: Rebuilder) -> Vec<Outcome> {
        let events = self.events();
        let mut out = Vec::new();
        for ev in &events {
            rebuilder.push(ev);
            out.extend(rebuilder.drain());
        }
        let end = events.last().map_or(0, |e| e.ts_ns);
        out.extend(rebuilder.finish(end));
        out
    }
}

/// `ns` of a wait charged to `holder`, with its user stack only (-1: none).
pub fn wait_charge(
    part: super::Part,
    holder: super::Holder,
    ns: u64,
    user_stack: i64,
) -> super::WaitCharge {
    super::WaitCharge {
        part,
        holder,
        ns,
        kernel_stack: -1,
        user_stack,
    }
}

/// A complete record of figures only, for the aggregates and reports built from it: done when
/// its `parts` add up from `t_arrive_ns`, with no slices, samples, off-CPU charges or waits.
pub fn record_of_parts(
    req_id: u64,
    status: u16,
    t_arrive_ns: u64,
    parts: [u64; super::PARTS],
    hits: super::Hits,
) -> super::RequestRecord {
    super::RequestRecord {
        req_id,
        status,
        t_arrive_ns,
        t_done_ns: t_arrive_ns + parts.iter().sum::<u64>(),
        client_port: None,
        upstream_start_ns: None,
        parts,
        slices: Vec::new(),
        samples: Vec::new(),
        offcpu: Vec::new(),
        waits: None,
        hits,
    }
}

/// Request `req`'s record among `outcomes`; panics, listing them, when it is not complete.
pub fn complete(outcomes: &[Outcome], req: u64) -> &super::RequestRecord {
    outcomes
        .iter()
        .find_map(|o| match o {
            Outcome::Complete(r) if r.req_id == req => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {req} not complete: {outcomes:?}"))
}

/// Panics unless `record`'s slices cover `[t_arrive, t_done)` without gaps or overlaps, in
/// order, and its parts are exactly the per-part sums of its slices and add up to the total.
pub fn assert_consistent(record: &super::RequestRecord) {
    let mut at = record.t_arrive_ns;
    let mut sums = [0u64; super::PARTS];
    for s in &record.slices {
        assert_eq!(
            s.start_ns, at,
            "request {}: gap or overlap at {at}",
            record.req_id
        );
        assert!(
            s.end_ns > s.start_ns,
            "request {}: empty slice {s:?}",
            record.req_id
        );
        sums[s.part.index()] += s.end_ns - s.start_ns;
        at = s.end_ns;
    }
    assert_eq!(
        at, record.t_done_ns,
        "request {}: slices end before t_done",
        record.req_id
    );
    assert_eq!(
        sums, record.parts,
        "request {}: parts differ from slices",
        record.req_id
    );
    assert_eq!(
        record.parts.iter().sum::<u64>(),
        record.total_ns(),
        "request {}: parts != total",
        record.req_id
    );
}
