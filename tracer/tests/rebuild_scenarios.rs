//! Pure reconstruction: synthetic event streams → requests, with the exact ns of every part.
//!
//! Event model (see `tracer/src/requests/rebuild.rs`): the first poll of a request starts at
//! `request_begin` and its last one ends at `request_end`; `poll_enter` / `poll_exit` bracket
//! only the polls in between. The upstream is the fd of the first send a thread makes on a
//! non-client socket while it polls the request. On-CPU time is `cpu` without `Phase` sites,
//! `cpu.<phase>` with them.

use tracer::requests::synthetic::{Stream, assert_consistent, complete};
use tracer::requests::{Incomplete, OffCpu, Outcome, Part, Rebuilder, RequestRecord};
use tracer_ebpf::abi::{Event, syscall};
use tracer_ebpf::sites::{Phase, Site};

const W: u32 = 200; // the ledger writer thread
/// A non-blocking connect returns -EINPROGRESS; the rebuild takes it whatever it returns.
const EINPROGRESS: i64 = -115;

fn incomplete(outcomes: &[Outcome], req: u64) -> &str {
    outcomes
        .iter()
        .find_map(|o| match o {
            Outcome::Incomplete(Incomplete { req_id, reason }) if *req_id == req => {
                Some(reason.as_str())
            }
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {req} not incomplete: {outcomes:?}"))
}

/// The request ids of `outcomes`, in their order, complete or not.
fn ids(outcomes: &[Outcome]) -> Vec<u64> {
    outcomes
        .iter()
        .map(|o| match o {
            Outcome::Complete(r) => r.req_id,
            Outcome::Incomplete(i) => i.req_id,
        })
        .collect()
}

/// Non-zero parts by name, for readable comparisons.
fn parts(r: &RequestRecord) -> Vec<(&'static str, u64)> {
    assert_consistent(r);
    Part::ALL
        .iter()
        .filter(|p| r.part_ns(**p) > 0)
        .map(|p| (p.name(), r.part_ns(*p)))
        .collect()
}

/// The slice that contains `ts`.
fn slice_at(r: &RequestRecord, ts: u64) -> tracer::requests::Slice {
    *r.slices
        .iter()
        .find(|sl| sl.start_ns <= ts && ts < sl.end_ns)
        .unwrap_or_else(|| panic!("no slice at {ts}: {:?}", r.slices))
}

/// One upstream request, offset by `t0`: read, parse, auth, a fresh upstream connection
/// (connect in poll 1, the request sent in poll 2 once connected), the reply read in poll 3
/// on `tid2`, response. See the expected parts in `UPSTREAM_PARTS`.
///
/// Before the new event model the upstream send was made "from the gap" by another task
/// after `upstream_begin` named the fd; now the send must be made inside one of the
/// request's polls (the gateway drives the connection in the request's own task), so the
/// time suspended before the send is the wait for the connect.
struct Conn {
    fd: u64,
    sk: u64,
    up_fd: u64,
    up_sk: u64,
}

fn upstream_request(s: &mut Stream, t0: u64, tid: u32, tid2: u32, req: u64, c: &Conn) {
    s.data_ready(t0 + 1000, c.sk)
        .sock_fd(t0 + 1050, tid, c.sk, c.fd)
        .recv(t0 + 1040, t0 + 1100, tid, c.fd, 200)
        // Poll 1 starts here.
        .request_begin(t0 + 1200, tid, req, c.fd)
        .phase(t0 + 1350, tid, req, Phase::Auth)
        .phase(t0 + 1600, tid, req, Phase::Upstream)
        .syscall(
            t0 + 1650,
            t0 + 1660,
            tid,
            syscall::CONNECT,
            c.up_fd,
            EINPROGRESS,
        )
        .poll_exit(t0 + 1700, tid, req)
        // Connected: poll 2 sends the upstream request.
        .poll_enter(t0 + 1750, tid, req)
        .sock_fd(t0 + 1850, tid, c.up_sk, c.up_fd)
        .send(t0 + 1800, t0 + 1900, tid, c.up_fd, 100)
        .poll_exit(t0 + 1950, tid, req)
        .data_ready(t0 + 2500, c.up_sk)
        // Poll 3 reads the reply and ends at request_end.
        .poll_enter(t0 + 2600, tid2, req)
        .request_end(t0 + 2900, tid2, req, 200)
        .send(t0 + 3000, t0 + 3100, tid2, c.fd, 500);
}

const UPSTREAM_PARTS: [(&str, u64); 7] = [
    ("upstream", 700),     // [S=1800, A=2500): 150 of poll 2, 550 of gap 2
    ("scheduling", 140),   // arrival → read 40, reply → poll 3 100
    ("cpu.parse", 310),    // read → request_begin 160, poll 1 before auth 150
    ("cpu.auth", 250),     // [1350, 1600): until the next phase
    ("cpu.upstream", 450), // rest of poll 1 100, poll 2 before S 50, poll 3 300
    ("cpu.respond", 100),  // request_end → response send
    ("blocked_other", 50), // [1700, 1750): connected, suspended before the send (connect ≤ gap)
];

fn conn(n: u64) -> Conn {
    Conn {
        fd: 10 + n,
        sk: 0xc000 + n,
        up_fd: 20 + n,
        up_sk: 0xd000 + n,
    }
}

/// Off-CPU time of `tid` after a [`Stream::switch_out`] (stack ids `[tid, tid + 1]`).
fn switched_out(tid: u32, ns: u64, part: Part) -> OffCpu {
    OffCpu {
        tid,
        ns,
        kernel_stack: i64::from(tid),
        user_stack: i64::from(tid) + 1,
        part,
    }
}

/// The writer's signing charged to a waiter: work, not a switch-out, so without stacks.
fn writer_signing(ns: u64) -> OffCpu {
    OffCpu {
        tid: W,
        ns,
        kernel_stack: -1,
        user_stack: -1,
        part: Part::Signing,
    }
}

fn sorted(mut expected: Vec<(&'static str, u64)>) -> Vec<(&'static str, u64)> {
    expected.sort_by_key(|(n, _)| Part::ALL.iter().position(|p| p.name() == *n));
    expected
}

#[test]
fn interleaved_requests_on_two_workers() {
    let mut s = Stream::new();
    upstream_request(&mut s, 0, 101, 101, 1, &conn(1));
    upstream_request(&mut s, 450, 102, 102, 2, &conn(2));
    // A third on worker 101 after the first, on the first connection (keep-alive).
    upstream_request(&mut s, 3000, 101, 101, 3, &conn(1));
    let out = s.rebuild();
    assert_eq!(out.len(), 3, "{out:?}");
    for req in [1, 2, 3] {
        let r = complete(&out, req);
        assert_eq!(r.total_ns(), 2000);
        assert_eq!(r.overhead_ns(), 1300);
        assert_eq!(r.status, 200);
        assert_eq!(parts(r), sorted(UPSTREAM_PARTS.to_vec()), "request {req}");
    }
    assert_eq!(
        complete(&out, 3).t_arrive_ns,
        4000,
        "keep-alive: the next arrival after t_done"
    );
    // Ordered by t_done.
    assert_eq!(ids(&out), vec![1, 2, 3]);
}

#[test]
fn task_migrates_threads_between_polls() {
    let mut s = Stream::new();
    upstream_request(&mut s, 0, 101, 102, 1, &conn(1));
    // Worker 101 sleeps meanwhile; that is not the request's business any more.
    s.switch_out(2650, 101, false)
        .wakeup(2950, 101)
        .switch_in(2990, 101);
    let r = &s.rebuild_complete(1);
    assert_eq!(parts(r), sorted(UPSTREAM_PARTS.to_vec()));
    let last_poll = r.slices.iter().find(|sl| sl.start_ns == 2600).unwrap();
    assert_eq!(
        (last_poll.tid, last_poll.part, last_poll.end_ns),
        (102, Part::Cpu(Phase::Upstream), 2900)
    );
    let respond = r.slices.last().unwrap();
    assert_eq!(
        (respond.tid, respond.part, respond.start_ns),
        (102, Part::Cpu(Phase::Respond), 2900)
    );
    assert!(r.offcpu.is_empty(), "{:?}", r.offcpu);
}

/// Request `i` of the batch: parked in receipt wait from `1500 + 100 i` until durable.
fn receipt_request(s: &mut Stream, i: u64) {
    let (tid, req, fd, sk) = (101 + i as u32, 1 + i, 10 + i, 0xc000 + i);
    s.data_ready(1000, sk)
        .sock_fd(1015, tid, sk, fd)
        .recv(1010, 1020, tid, fd, 100)
        .request_begin(1100, tid, req, fd)
        .phase(1300 + 100 * i, tid, req, Phase::ReceiptWait)
        .ledger_enqueue(1400 + 100 * i, tid, req)
        .poll_exit(1500 + 100 * i, tid, req)
        .receipt_durable(6700 + 10 * i, W, req, i)
        .poll_enter(7000 + 100 * i, tid, req)
        .request_end(7100 + 100 * i, tid, req, 200)
        .send(7200 + 100 * i, 7210 + 100 * i, tid, fd, 300);
}

#[test]
fn one_fsync_serves_a_batch_of_three() {
    let mut s = Stream::new();
    for i in 0..3 {
        receipt_request(&mut s, i);
    }
    // One seal bracket for the batch's three records, then the commit's fdatasync.
    s.seal(5100, 5400, W, 1, 3)
        .switch_out(5550, W, false)
        .wakeup(6400, W)
        .switch_in(6450, W)
        .fdatasync(5500, 6500, W, 3);
    let out = s.rebuild();
    for i in 0..3u64 {
        let r = complete(&out, 1 + i);
        let gs = 1500 + 100 * i;
        let durable = 6700 + 10 * i;
        // [gap, 5100) + [5400, 5500) + [6500, durable)
        let ledger_other = (5100 - gs) + 100 + (durable - 6500);
        // arrival → read 10, durable → next poll
        let scheduling = 10 + (7000 + 100 * i - durable);
        let expected = vec![
            ("scheduling", scheduling),
            ("ledger_fsync", 1000),
            ("signing", 300),
            ("ledger_other", ledger_other),
            // read → request_begin 90, poll 1 until the receipt phase 200 + 100 i
            ("cpu.parse", 90 + 200 + 100 * i),
            // rest of poll 1 200, poll 2 100
            ("cpu.receipt", 200 + 100),
            ("cpu.respond", 100),
        ];
        assert_eq!(parts(r), expected, "request {}", 1 + i);
        assert_eq!(r.total_ns(), 7200 + 100 * i - 1000);
        // Every waiter is charged the writer's fsync sleep and its signing.
        assert_eq!(
            r.offcpu,
            vec![writer_signing(300), switched_out(W, 900, Part::LedgerFsync)]
        );
        let fsync = r
            .slices
            .iter()
            .find(|sl| sl.part == Part::LedgerFsync)
            .unwrap();
        assert_eq!((fsync.start_ns, fsync.end_ns, fsync.tid), (5500, 6500, W));
        // Own sites 7 (begin, phase, enqueue, poll exit, poll enter, end, durable) and the
        // read, response send and data-ready; the batch's 2 writer sites (sign begin/end),
        // fdatasync and 3 writer sched events go to its first durable request only.
        let batch = if i == 0 { (2, 1, 3) } else { (0, 0, 0) };
        assert_eq!(
            (r.hits.sites, r.hits.syscalls, r.hits.sched, r.hits.sock),
            (7 + batch.0, 2 + batch.1, batch.2, 1)
        );
    }
}

#[test]
fn writer_preempts_the_worker_inside_its_poll_and_signs() {
    // One CPU: the enqueue wakes the writer, which preempts the worker before its poll
    // returns, seals and fsyncs; the worker runs again only after the receipt is durable.
    let mut s = Stream::new();
    s.data_ready(1000, 0xc1)
        .sock_fd(1015, 101, 0xc1, 10)
        .recv(1010, 1020, 101, 10, 100)
        .request_begin(1100, 101, 1, 10)
        .phase(1300, 101, 1, Phase::ReceiptWait)
        .ledger_enqueue(1400, 101, 1)
        .switch_out(1450, 101, true)
        .seal(1600, 1700, W, 1, 1)
        .fdatasync(1800, 2800, W, 3)
        .receipt_durable(2900, W, 1, 0)
        .switch_in(3000, 101)
        .poll_exit(3100, 101, 1)
        .poll_enter(3200, 101, 1)
        .request_end(3300, 101, 1, 200)
        .send(3400, 3410, 101, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_eq!(
        parts(r),
        vec![
            // arrival → read 10, the rest of the preemption 450, durable → next poll 100
            ("scheduling", 10 + 450 + 100),
            ("ledger_fsync", 1000),
            ("signing", 100),
            // read → request_begin 90, poll 1 until the receipt phase 200
            ("cpu.parse", 90 + 200),
            ("cpu.receipt", 150 + 100 + 100),
            ("cpu.respond", 100),
        ]
    );
    let charged = |part: Part| -> u64 {
        r.offcpu
            .iter()
            .filter(|o| o.part == part)
            .map(|o| o.ns)
            .sum()
    };
    assert_eq!(
        (
            charged(Part::Signing),
            charged(Part::LedgerFsync),
            charged(Part::Scheduling)
        ),
        (100, 1000, 450)
    );
    assert!(
        r.offcpu
            .iter()
            .filter(|o| o.part != Part::Scheduling)
            .all(|o| (o.tid, o.kernel_stack, o.user_stack) == (W, -1, -1)),
        "{:?}",
        r.offcpu
    );
}

#[test]
fn preemption_and_a_blocked_switch_out_during_a_poll() {
    // No phase sites: all on-CPU time is the one `cpu` part.
    let mut s = Stream::new();
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        .switch_out(1400, 101, true)
        .switch_in(1500, 101)
        .sample(1550, 101)
        .switch_out(1600, 101, false)
        .wakeup(1700, 101)
        .switch_in(1750, 101)
        .request_end(2000, 101, 1, 200)
        .send(2100, 2150, 101, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_eq!(
        parts(r),
        vec![
            ("scheduling", 150),
            // read → request_begin 100, the poll [1100, 2000) 900 less 250 off CPU,
            // request_end → response send 100
            ("cpu", 100 + 900 - 250 + 100),
            ("blocked_other", 100)
        ]
    );
    assert_eq!(
        r.offcpu,
        vec![
            switched_out(101, 100, Part::Scheduling),
            switched_out(101, 100, Part::BlockedOther),
            switched_out(101, 50, Part::Scheduling),
        ]
    );
    assert_eq!(r.samples.len(), 1);
    assert_eq!(r.samples[0].phase, None, "phases not traced");
    let preempt = r.slices.iter().find(|sl| sl.start_ns == 1400).unwrap();
    assert_eq!(
        (preempt.end_ns, preempt.part, preempt.tid),
        (1500, Part::Scheduling, 101)
    );
    assert_eq!(r.hits.sched, 5);
    assert_eq!(r.hits.samples, 1);
}

#[test]
fn upstream_span_overrides_everything_inside_it() {
    let mut s = Stream::new();
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        .phase(1600, 101, 1, Phase::Upstream)
        // Sent from inside the poll on a pooled connection.
        .upstream_send(1650, 101, 0xd1, 20)
        .poll_exit(1700, 101, 1)
        // A spurious wake: polled again before the reply; still upstream time.
        .poll_enter(2000, 102, 1)
        .switch_out(2050, 102, true)
        .switch_in(2060, 102)
        .poll_exit(2100, 102, 1)
        .data_ready(2500, 0xd1)
        .poll_enter(2600, 101, 1)
        .request_end(2800, 101, 1, 502)
        .send(2900, 2950, 101, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_eq!(r.status, 502);
    assert_eq!(
        parts(r),
        vec![
            ("upstream", 850),   // [S=1650, A=2500)
            ("scheduling", 100), // reply → last poll
            ("cpu.parse", 100 + 500),
            ("cpu.upstream", 50 + 200),
            ("cpu.respond", 100),
        ]
    );
    assert!(
        r.offcpu.is_empty(),
        "the preemption is inside the upstream span"
    );
}

#[test]
fn reply_before_the_send_syscall_returns() {
    // Events are stamped at syscall exit: the reply's data-ready precedes the send's event.
    // A fresh connection: connect in poll 1, the send in poll 2 (migrated to thread 102).
    let mut s = Stream::new();
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        .phase(1300, 101, 1, Phase::Upstream)
        .syscall(1350, 1360, 101, syscall::CONNECT, 20, EINPROGRESS)
        .poll_exit(1400, 101, 1)
        .poll_enter(1500, 102, 1)
        .sock_fd(1505, 102, 0xd1, 20)
        .data_ready(1700, 0xd1)
        .send(1500, 1800, 102, 20, 100)
        .poll_exit(1850, 102, 1)
        .poll_enter(1900, 101, 1)
        .request_end(2000, 101, 1, 200)
        .send(2100, 2110, 101, 10, 100);
    let r = complete(&s.rebuild(), 1).clone();
    assert_eq!(r.part_ns(Part::Upstream), 200); // [S=1500, A=1700)
    assert_eq!(r.part_ns(Part::BlockedOther), 100); // [1400, 1500): connected, before S
    assert_eq!(r.part_ns(Part::Scheduling), 50); // [1850, 1900): reply already in
    assert_eq!(
        parts(&r),
        vec![
            ("upstream", 200),
            ("scheduling", 50),
            ("cpu.parse", 100 + 200), // read → begin, poll 1 before the phase
            ("cpu.upstream", 100 + 150 + 100), // poll 1 rest, poll 2 after A, poll 3
            ("cpu.respond", 100),
            ("blocked_other", 100),
        ]
    );
    assert_consistent(&r);
}

/// Request `req` arrives on `fd` (socket `sk`) at `t0 + 1000`, is read by `tid` in
/// `[t0 + 1000, t0 + 1010]`, and begins at `t0 + 1100`: its first poll starts there.
fn read_and_begin(s: &mut Stream, t0: u64, tid: u32, req: u64, fd: u64, sk: u64) -> &mut Stream {
    s.data_ready(t0 + 1000, sk)
        .sock_fd(t0 + 1005, tid, sk, fd)
        .recv(t0 + 1000, t0 + 1010, tid, fd, 100)
        .request_begin(t0 + 1100, tid, req, fd)
}

/// Steps of the scenarios' streams.
trait Steps {
    /// `tid` sends 100 bytes on `fd` (socket `sk`, which the sock_fd at `t + 5` names) in
    /// `[t, t + 10]`.
    fn upstream_send(&mut self, t: u64, tid: u32, sk: u64, fd: u64) -> &mut Self;
}

impl Steps for Stream {
    fn upstream_send(&mut self, t: u64, tid: u32, sk: u64, fd: u64) -> &mut Self {
        self.sock_fd(t + 5, tid, sk, fd)
            .send(t, t + 10, tid, fd, 100)
    }
}

/// A fresh rebuilder fed `events` in order, not finished.
fn fed(events: &[Event]) -> Rebuilder {
    let mut rb = Rebuilder::new();
    for ev in events {
        rb.push(ev);
    }
    rb
}

/// A fresh rebuilder fed the `events` before `ts`, then whatever `between` does to it, then
/// the rest of `events`.
fn fed_around(events: &[Event], ts: u64, between: impl FnOnce(&mut Rebuilder)) -> Rebuilder {
    let at = events.partition_point(|e| e.ts_ns < ts);
    let mut rb = fed(&events[..at]);
    between(&mut rb);
    for ev in &events[at..] {
        rb.push(ev);
    }
    rb
}

fn simple(s: &mut Stream, t0: u64, req: u64, fd: u64, sk: u64) {
    read_and_begin(s, t0, 101, req, fd, sk)
        .request_end(t0 + 1400, 101, req, 200)
        .send(t0 + 1500, t0 + 1510, 101, fd, 100);
}

#[test]
fn loss_reported_late_makes_held_requests_incomplete() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    simple(&mut s, 10_000, 2, 11, 0xc2);
    let mut rb = fed(&s.events());
    assert!(
        rb.drain().is_empty(),
        "outcomes are held for late loss reports"
    );
    rb.lost(1250, 1260);
    let out = rb.finish(20_000);
    assert_eq!(incomplete(&out, 1), "events lost");
    assert_consistent(complete(&out, 2));
}

#[test]
fn loss_with_partial_events_attributes_nothing() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    // The request end (its last poll's end) and the response were lost; the loss covers them.
    let events: Vec<_> = s.events().into_iter().filter(|e| e.ts_ns < 1400).collect();
    let mut rb = fed(&events);
    rb.lost(1390, 1520);
    // The next request on the connection: request 1's response send was lost, so its
    // arrival cannot be told from request 1's and it is incomplete too. Once a response is
    // seen again, the one after it is attributed.
    let mut next = Stream::new();
    simple(&mut next, 2000, 2, 10, 0xc1);
    simple(&mut next, 4000, 3, 10, 0xc1);
    for ev in next.events() {
        rb.push(&ev);
    }
    let out = rb.finish(10_000);
    assert_eq!(out.len(), 3, "{out:?}");
    assert_eq!(incomplete(&out, 1), "events lost");
    assert_eq!(incomplete(&out, 2), "events lost");
    let r = complete(&out, 3);
    assert_eq!(r.t_arrive_ns, 5000);
    assert_consistent(r);
}

#[test]
fn loss_before_a_begin_covers_a_later_request() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    let mut rb = fed_around(&s.events(), 1050, |rb| rb.lost(1020, 1040));
    assert_eq!(incomplete(&rb.finish(5000), 1), "events lost");
}

#[test]
fn arrival_not_seen_is_incomplete() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    let events: Vec<_> = s
        .events()
        .into_iter()
        .filter(|e| e.kind != tracer_ebpf::abi::kind::DATA_READY)
        .collect();
    let out = fed(&events).finish(5000);
    assert_eq!(out.len(), 1);
    assert_eq!(incomplete(&out, 1), "arrival not seen");
}

#[test]
fn missing_receipt_durable_is_incomplete() {
    let mut s = Stream::new();
    receipt_request(&mut s, 0);
    let events: Vec<_> = s.events().into_iter().filter(|e| e.ts_ns != 6700).collect();
    assert_eq!(
        incomplete(&fed(&events).finish(9000), 1),
        "receipt durable not seen"
    );
}

/// Arrival and client socket of request `req` on `fd`, so its begin is accepted.
fn arrive(s: &mut Stream, t: u64, tid: u32, fd: u64) -> &mut Stream {
    s.data_ready(t, 0xc000 + fd)
        .sock_fd(t + 5, tid, 0xc000 + fd, fd)
}

#[test]
fn duplicate_and_mismatched_poll_events_are_incomplete() {
    let mut s = Stream::new();
    // 1: entered twice: a PollEnter while its first poll (opened by RequestBegin) is open,
    //    as an old-style stream with an explicit first PollEnter would have.
    simple(&mut s, 0, 1, 10, 0xc1);
    s.poll_enter(1250, 101, 1);
    // 2: its first poll (begun on 102 by RequestBegin) exits on another thread.
    arrive(&mut s, 3000, 102, 11)
        .request_begin(3100, 102, 2, 11)
        .poll_exit(3300, 103, 2)
        .send(3400, 3410, 103, 11, 10);
    // 3: there is no phase end any more (phases are transitions, nothing can end unbegun);
    //    the closest check of a malformed phase event: an unknown phase id. Then more
    //    events for it, ignored.
    arrive(&mut s, 5000, 104, 12)
        .request_begin(5100, 104, 3, 12)
        .site(5250, 104, Site::Phase, [3, 99, 0])
        .request_end(5300, 104, 3, 200);
    // 4: never begun.
    s.poll_enter(6000, 105, 4).poll_exit(6100, 105, 4);
    // 5: begun twice.
    arrive(&mut s, 7000, 106, 15)
        .request_begin(7100, 106, 5, 15)
        .request_begin(7200, 106, 5, 15);
    // 6: a PollExit with no poll open (the first poll already returned pending).
    arrive(&mut s, 8000, 107, 16)
        .request_begin(8100, 107, 6, 16)
        .poll_exit(8200, 107, 6)
        .poll_exit(8300, 107, 6);
    // 7: RequestEnd between polls.
    arrive(&mut s, 9000, 108, 17)
        .request_begin(9100, 108, 7, 17)
        .poll_exit(9200, 108, 7)
        .request_end(9300, 108, 7, 200)
        .send(9400, 9410, 108, 17, 10);
    // 8: RequestEnd on another thread than the open poll.
    arrive(&mut s, 10_000, 109, 18)
        .request_begin(10_100, 109, 8, 18)
        .poll_exit(10_200, 109, 8)
        .poll_enter(10_300, 109, 8)
        .request_end(10_400, 110, 8, 200)
        .send(10_500, 10_510, 110, 18, 10);
    // 9: polled again after its RequestEnd (the last poll already ended).
    arrive(&mut s, 11_000, 111, 19)
        .request_begin(11_100, 111, 9, 19)
        .request_end(11_200, 111, 9, 200)
        .poll_enter(11_250, 111, 9)
        .poll_exit(11_280, 111, 9)
        .send(11_300, 11_310, 111, 19, 10);
    let out = s.rebuild();
    assert_eq!(incomplete(&out, 1), "poll enter inside a poll");
    assert_eq!(incomplete(&out, 2), "poll exit without matching enter");
    assert_eq!(incomplete(&out, 3), "unknown phase id");
    assert_eq!(incomplete(&out, 4), "request begin not seen");
    assert_eq!(incomplete(&out, 5), "duplicate request begin");
    assert_eq!(incomplete(&out, 6), "poll exit without matching enter");
    assert_eq!(incomplete(&out, 7), "request end outside its poll");
    assert_eq!(incomplete(&out, 8), "request end outside its poll");
    assert_eq!(incomplete(&out, 9), "poll after completion");
    assert_eq!(out.len(), 9, "one outcome per request: {out:?}");
}

#[test]
fn item_6_duplicate_ids_are_incomplete_not_dropped() {
    let mut s = Stream::new();
    // Probe ids 1 and 2 carry the same client id 77; probe id 3 carries client id 0.
    for (t0, req, client, fd) in [(0, 1, 77, 10), (2000, 2, 77, 11), (4000, 3, 0, 12)] {
        arrive(&mut s, t0 + 1000, 101, fd)
            .client_request_begin(t0 + 1100, 101, req, fd, client)
            .request_end(t0 + 1400, 101, req, 200)
            .send(t0 + 1500, t0 + 1510, 101, fd, 100);
    }
    // A begin reusing a finished probe id (a stream without client ids).
    arrive(&mut s, 7000, 101, 13)
        .request_begin(7100, 101, 3, 13)
        .request_end(7400, 101, 3, 200)
        .send(7500, 7510, 101, 13, 100);
    let out = s.rebuild();
    assert_eq!(out.len(), 4, "one outcome per begin: {out:?}");
    assert_consistent(complete(&out, 77));
    assert_eq!(incomplete(&out, 77), "duplicate id");
    // Client id 0 means none was passed: the probe id stands in.
    assert_consistent(complete(&out, 3));
    assert_eq!(incomplete(&out, 3), "duplicate id");
}

#[test]
fn a_probe_id_standing_in_for_client_id_0_is_no_client_id() {
    // Probe id 5 has no client id (x-request-id 0); probe id 6 carries client id 5. The two
    // ids count apart, so neither is a duplicate of the other.
    let mut s = Stream::new();
    for (t0, req, client, fd) in [(0, 5, 0, 10), (2000, 6, 5, 11)] {
        arrive(&mut s, t0 + 1000, 101, fd)
            .client_request_begin(t0 + 1100, 101, req, fd, client)
            .request_end(t0 + 1400, 101, req, 200)
            .send(t0 + 1500, t0 + 1510, 101, fd, 100);
    }
    let out = s.rebuild();
    assert_eq!(out.len(), 2, "{out:?}");
    assert!(
        out.iter().all(|o| matches!(o, Outcome::Complete(_))),
        "{out:?}"
    );
}

#[test]
fn still_open_at_finish_is_incomplete_in_id_order() {
    let mut s = Stream::new();
    for (req, fd) in [(9, 19), (7, 17)] {
        s.data_ready(1000, fd + 0xc000)
            .sock_fd(1005, 101, fd + 0xc000, fd)
            .request_begin(1100, 101, req, fd);
    }
    let mut rb = fed(&s.events());
    assert_eq!(rb.open_requests(), 2);
    let out = rb.finish(2000);
    assert_eq!(ids(&out), vec![7, 9]);
    for req in [7, 9] {
        assert_eq!(incomplete(&out, req), "still open at end");
    }
    assert_eq!(rb.open_requests(), 0);
}

#[test]
fn drain_releases_after_the_hold() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    let mut rb = fed(&s.events());
    assert!(rb.drain().is_empty());
    // Any later event moves the clock past the hold.
    let mut later = Stream::new();
    later.switch_in(1500 + tracer::requests::HOLD_NS, 999);
    rb.push(&later.events()[0]);
    let out = rb.drain();
    assert_eq!(out.len(), 1);
    assert_consistent(complete(&out, 1));
}

// ---- The new event model's rules. ----

#[test]
fn upstream_is_the_first_in_poll_send_on_a_non_client_socket() {
    // Lean requests (no phase sites). Request 1 on worker 101, client fd 10; request 2 on
    // worker 102, client fd 12; fd 11 is another accepted client connection.
    let mut s = Stream::new();
    s.accept(900, 910, 99, 3, 11);
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        // Inside poll 1, two sends on client sockets (sk known): a `100 Continue` on its
        // own connection, and a write to the other accepted connection. Neither is upstream.
        .send(1150, 1160, 101, 10, 25)
        .sock_fd(1205, 101, 0xc2, 11)
        .send(1200, 1210, 101, 11, 30)
        .poll_exit(1300, 101, 1)
        // In request 1's gap, its own worker sends on a non-client socket while polling
        // nothing: outside the request's polls, so not its upstream.
        .sock_fd(1505, 101, 0xd3, 22)
        .send(1500, 1510, 101, 22, 10)
        // ... and a thread that never polls a request does the same.
        .sock_fd(1555, 99, 0xd4, 23)
        .send(1550, 1560, 99, 23, 10)
        // Poll 2: the request's own upstream send on a pooled connection.
        .poll_enter(1600, 101, 1)
        .upstream_send(1650, 101, 0xd1, 21)
        .poll_exit(1700, 101, 1)
        .data_ready(2000, 0xd1)
        .poll_enter(2100, 101, 1)
        .request_end(2200, 101, 1, 200)
        .send(2300, 2310, 101, 10, 100);
    // Request 2 sends on fd 20 inside its first poll, during request 1's gap: that is
    // request 2's upstream, not request 1's.
    s.data_ready(1300, 0xc3)
        .sock_fd(1305, 102, 0xc3, 12)
        .recv(1300, 1310, 102, 12, 100)
        .request_begin(1350, 102, 2, 12)
        .upstream_send(1400, 102, 0xd2, 20)
        .poll_exit(1450, 102, 2)
        .data_ready(1800, 0xd2)
        .poll_enter(1900, 102, 2)
        .request_end(1950, 102, 2, 200)
        .send(2000, 2010, 102, 12, 100);
    let out = s.rebuild();
    assert_eq!(out.len(), 2, "{out:?}");
    let r1 = complete(&out, 1);
    assert_eq!(
        parts(r1),
        vec![
            ("upstream", 50 + 300), // [S=1650, A=2000)
            ("scheduling", 100),    // reply → poll 3
            // read → begin 100, poll 1 200, poll 2 before S 50, poll 3 100, respond 100
            ("cpu", 100 + 200 + 50 + 100 + 100),
            // [1300, 1600): no enqueue, no connect, the upstream send not yet made
            ("unattributed", 300),
        ]
    );
    let up = slice_at(r1, 1650);
    assert_eq!(
        (up.start_ns, up.end_ns, up.part),
        (1650, 2000, Part::Upstream)
    );
    assert_eq!(slice_at(r1, 1150).part, Part::OnCpu);
    assert_eq!(slice_at(r1, 1500).part, Part::Unattributed);
    let r2 = complete(&out, 2);
    assert_eq!(
        parts(r2),
        vec![
            ("upstream", 50 + 350),     // [S=1400, A=1800)
            ("scheduling", 100),        // reply → poll 2
            ("cpu", 50 + 50 + 50 + 50), // read → begin, poll 1 before S, poll 2, respond
        ]
    );
    assert_eq!(
        (slice_at(r2, 1400).start_ns, slice_at(r2, 1400).end_ns),
        (1400, 1800)
    );
}

/// A lean request on worker 101 (client fd 11): connect on `fd 10` in poll 1, then the send
/// on it in poll 2. fd 10 was request 1's client connection before (closed, number reused).
fn reused_fd_stream(with_connect: bool) -> Stream {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    read_and_begin(&mut s, 1000, 101, 2, 11, 0xc2);
    if with_connect {
        s.syscall(2200, 2210, 101, syscall::CONNECT, 10, EINPROGRESS);
    }
    s.poll_exit(2300, 101, 2)
        .poll_enter(2500, 101, 2)
        .upstream_send(2550, 101, 0xd1, 10)
        .poll_exit(2600, 101, 2)
        .data_ready(3000, 0xd1)
        .poll_enter(3100, 101, 2)
        .request_end(3200, 101, 2, 200)
        .send(3300, 3310, 101, 11, 100);
    s
}

#[test]
fn connect_turns_a_former_client_fd_into_an_upstream() {
    let out = reused_fd_stream(true).rebuild();
    assert_consistent(complete(&out, 1));
    assert_eq!(
        parts(complete(&out, 2)),
        vec![
            ("upstream", 50 + 400), // [S=2550, A=3000)
            ("scheduling", 100),    // reply → poll 3
            // read → begin 100, poll 1 200, poll 2 before S 50, poll 3 100, respond 100
            ("cpu", 100 + 200 + 50 + 100 + 100),
            // [2300, 2500): the connect (2200) was before the gap, the send after it
            ("blocked_other", 200),
        ]
    );
    // Without the connect, fd 10 is still request 1's client connection: the send is no
    // upstream, and neither gap is explained.
    let out = reused_fd_stream(false).rebuild();
    assert_eq!(
        parts(complete(&out, 2)),
        vec![
            ("cpu", 100 + 200 + 100 + 100 + 100),
            ("unattributed", 200 + 500),
        ]
    );
}

/// One request through every kind of wait: a preemption in poll 1, an upstream call sent in
/// poll 1, a receipt wait made durable by a batch; with or without phase sites.
fn phases_stream(traced: bool) -> Stream {
    let mut s = Stream::new();
    let phase = |s: &mut Stream, ts: u64, p: Phase| {
        if traced {
            s.phase(ts, 101, 1, p);
        }
    };
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1);
    phase(&mut s, 1150, Phase::Auth);
    phase(&mut s, 1200, Phase::Parse);
    s.switch_out(1250, 101, true).switch_in(1280, 101);
    phase(&mut s, 1300, Phase::Scope);
    s.sample(1320, 101);
    phase(&mut s, 1350, Phase::Upstream);
    s.upstream_send(1400, 101, 0xd1, 20)
        .poll_exit(1450, 101, 1)
        .data_ready(2000, 0xd1)
        .poll_enter(2100, 101, 1);
    phase(&mut s, 2150, Phase::ReceiptWait);
    s.ledger_enqueue(2200, 101, 1)
        .poll_exit(2250, 101, 1)
        .seal(2300, 2400, W, 1, 1)
        .fdatasync(2450, 2950, W, 3)
        .receipt_durable(3000, W, 1, 0)
        .poll_enter(3100, 101, 1);
    phase(&mut s, 3150, Phase::Respond);
    s.request_end(3200, 101, 1, 200)
        .send(3300, 3310, 101, 10, 100);
    s
}

#[test]
fn without_phase_sites_on_cpu_time_is_one_part() {
    let lean = complete(&phases_stream(false).rebuild(), 1).clone();
    let traced = complete(&phases_stream(true).rebuild(), 1).clone();
    // The waits, common to both.
    let waits = [
        ("upstream", 50 + 550),         // [S=1400, A=2000)
        ("scheduling", 30 + 100 + 100), // preemption, reply → poll 2, durable → poll 3
        ("ledger_fsync", 500),
        ("signing", 100),
        ("ledger_other", 50 + 50 + 50), // [2250, 2300), [2400, 2450), [2950, 3000)
    ];
    let mut expected = waits.to_vec();
    // read → begin 100, poll 1 before S 300 less the preemption 30, poll 2 150, poll 3 100,
    // request_end → response 100
    expected.push(("cpu", 100 + 270 + 150 + 100 + 100));
    assert_eq!(parts(&lean), expected);
    let mut expected = waits.to_vec();
    expected.extend([
        // read → begin 100, [1100, 1150), [1200, 1300) less the preemption 30
        ("cpu.parse", 100 + 50 + 70),
        ("cpu.auth", 50),
        ("cpu.scope", 50),
        ("cpu.upstream", 50 + 50), // [1350, S), [2100, 2150)
        ("cpu.receipt", 100 + 50), // [2150, 2250), [3100, 3150)
        ("cpu.respond", 50 + 100), // [3150, 3200), after request_end
    ]);
    assert_eq!(parts(&traced), expected);
    // Identical non-cpu parts and off-CPU charges; the cpu parts sum to the one `cpu`.
    for p in Part::ALL {
        if !matches!(p, Part::OnCpu | Part::Cpu(_)) {
            assert_eq!(lean.part_ns(p), traced.part_ns(p), "{}", p.name());
        }
    }
    let traced_cpu: u64 = Phase::ALL
        .iter()
        .map(|p| traced.part_ns(Part::Cpu(*p)))
        .sum();
    assert_eq!((traced_cpu, traced.part_ns(Part::OnCpu)), (720, 0));
    assert_eq!(lean.offcpu, traced.offcpu);
    assert_eq!(
        lean.offcpu,
        vec![switched_out(101, 30, Part::Scheduling), writer_signing(100)]
    );
    // The same slice boundaries except where a phase change cuts on-CPU time.
    let cuts = |r: &RequestRecord| -> Vec<(u64, u64, bool, u32)> {
        let mut v: Vec<(u64, u64, bool, u32)> = Vec::new();
        for sl in &r.slices {
            let cpu = matches!(sl.part, Part::OnCpu | Part::Cpu(_));
            match v.last_mut() {
                Some(last) if cpu && last.2 && last.1 == sl.start_ns && last.3 == sl.tid => {
                    last.1 = sl.end_ns
                }
                _ => v.push((sl.start_ns, sl.end_ns, cpu, sl.tid)),
            }
        }
        v
    };
    assert_eq!(cuts(&lean), cuts(&traced));
    // Samples carry the phase only when phases are traced.
    assert_eq!(lean.samples[0].phase, None);
    assert_eq!(traced.samples[0].phase, Some(Phase::Scope));
    // Hits: begin, 2 poll exits, 2 poll enters, enqueue, end, durable, the batch's seal
    // bracket; the read, upstream send, response send and fdatasync; the arrival, the
    // upstream sock_fd and reply; the preemption; the sample. Traced: 6 phase sites more.
    let hits = |h: tracer::requests::Hits| (h.sites, h.syscalls, h.sock, h.sched, h.samples);
    assert_eq!(hits(lean.hits), (10, 4, 3, 2, 1));
    assert_eq!(hits(traced.hits), (16, 4, 3, 2, 1));
}

#[test]
fn first_poll_starts_at_begin_and_last_ends_at_end() {
    // No PollEnter for the first poll and no PollExit for the last: request_begin and
    // request_end are those bounds.
    let mut s = Stream::new();
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        // Inside poll 1 already: a sample, a preemption, and the upstream send.
        .sample(1110, 101)
        .switch_out(1120, 101, true)
        .switch_in(1150, 101)
        .phase(1190, 101, 1, Phase::Upstream)
        .upstream_send(1200, 101, 0xd1, 20)
        .poll_exit(1300, 101, 1)
        .data_ready(1600, 0xd1)
        .poll_enter(1700, 101, 1)
        .request_end(1800, 101, 1, 200)
        // After the last poll: not the request's sample or sched hits, but its time is
        // split on the thread as the response write.
        .sample(1850, 101)
        .switch_out(1860, 101, true)
        .switch_in(1880, 101)
        .send(1900, 1910, 101, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_eq!(
        parts(r),
        vec![
            ("upstream", 100 + 300),       // [S=1200, A=1600): the send was in poll 1
            ("scheduling", 30 + 100 + 20), // preemption in poll 1, reply → poll 2, after end
            ("cpu.parse", 100 + 20 + 40),  // read → begin, [1100, 1120), [1150, 1190)
            ("cpu.upstream", 10 + 100),    // [1190, S), poll 2 [1700, 1800)
            ("cpu.respond", 60 + 20),      // [1800, 1900) less the preemption
        ]
    );
    // The last poll ends at request_end: the slice before it is the phase's, after it respond.
    let poll2 = slice_at(r, 1799);
    assert_eq!(
        (poll2.start_ns, poll2.end_ns, poll2.part),
        (1700, 1800, Part::Cpu(Phase::Upstream))
    );
    assert_eq!(slice_at(r, 1800).part, Part::Cpu(Phase::Respond));
    assert_eq!(
        r.samples.iter().map(|x| x.ts_ns).collect::<Vec<_>>(),
        vec![1110],
        "the sample after request_end is outside the request's polls"
    );
    assert_eq!((r.hits.sched, r.hits.samples), (2, 1));
    assert_eq!(
        r.offcpu,
        vec![
            switched_out(101, 30, Part::Scheduling),
            switched_out(101, 20, Part::Scheduling),
        ]
    );
}

#[test]
fn a_sample_before_the_first_phase_site_is_parse_in_a_traced_request() {
    // The time is `cpu.parse` (parse before the first Phase site), so the sample taken then
    // must say parse too, or the flamegraph roots it under `cpu`, a part this request has
    // not.
    let mut s = Stream::new();
    read_and_begin(&mut s, 0, 101, 1, 10, 0xc1)
        .sample(1150, 101)
        .phase(1200, 101, 1, Phase::Auth)
        .sample(1250, 101)
        .request_end(1300, 101, 1, 200)
        .send(1400, 1410, 101, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_eq!(
        parts(r),
        vec![
            ("cpu.parse", 100 + 100),
            ("cpu.auth", 100),
            ("cpu.respond", 100)
        ]
    );
    assert_eq!(
        r.samples.iter().map(|x| x.phase).collect::<Vec<_>>(),
        vec![Some(Phase::Parse), Some(Phase::Auth)]
    );
    // As the flamegraph roots a sample (`flame::fold`): its part is the slice's.
    for sample in &r.samples {
        assert_eq!(
            sample.phase.map_or(Part::OnCpu, Part::Cpu),
            slice_at(r, sample.ts_ns).part,
            "{sample:?}"
        );
    }
}

/// Issue 21 item 12: an event released after newer ones (the reorder window was too short)
/// used to run `ts - since` backwards in the thread history (a panic in debug builds). It is a
/// loss from its ts to the newest event: the request it falls in is incomplete, the next is not.
#[test]
fn item12_late_event_is_a_loss_not_an_underflow() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    // Thread 101 is preempted at 1250; its switch-in at 1200, on another CPU, arrives after.
    let mut sched = Stream::new();
    sched.switch_out(1250, 101, true).switch_in(1200, 101);
    let mut rb = fed_around(&s.events(), 1300, |rb| {
        for ev in sched.events().iter().rev() {
            rb.push(ev);
        }
    });
    simple(&mut s, 10_000, 2, 11, 0xc2);
    for ev in s.events().iter().filter(|e| e.ts_ns >= 10_000) {
        rb.push(ev);
    }
    let out = rb.finish(20_000);
    assert_eq!(incomplete(&out, 1), "event out of order");
    assert_consistent(complete(&out, 2));
}

/// Issue 21 item 12, one reason: an event released just behind the newest one gives the
/// request it overlaps "event out of order" wherever in the request it lands, before its begin
/// (the arrival seen, the request not yet open) as well as while it is open or held.
#[test]
fn item12_a_late_event_gives_one_reason_wherever_it_lands() {
    const LATE_NS: u64 = 10;
    let mut s = Stream::new();
    upstream_request(&mut s, 0, 101, 101, 1, &conn(1));
    let events = s.events();
    let mut reasons = std::collections::BTreeMap::new();
    for split in 1..=events.len() {
        let newest = events[split - 1].ts_ns;
        let mut late = Stream::new();
        late.wakeup(newest - LATE_NS, 300);
        let mut rb = Rebuilder::new();
        for ev in events[..split]
            .iter()
            .chain(&late.events())
            .chain(&events[split..])
        {
            rb.push(ev);
        }
        let out = rb.finish(10_000);
        let reason = out.iter().find_map(|o| match o {
            Outcome::Incomplete(i) if i.req_id == 1 => Some(i.reason.clone()),
            _ => None,
        });
        if let Some(reason) = reason {
            reasons.insert(newest, reason);
        }
    }
    assert!(
        reasons.contains_key(&1000),
        "a late event just after the arrival spared the request: {reasons:?}"
    );
    assert!(
        reasons.values().all(|r| r == "event out of order"),
        "one late event, several reasons (by the newest event's ts): {reasons:?}"
    );
}
