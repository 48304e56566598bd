//! Pure reconstruction: synthetic event streams → requests, with the exact ns of every part.

use tracer::requests::synthetic::{Stream, assert_consistent};
use tracer::requests::{Incomplete, OffCpu, Outcome, Part, Rebuilder, RequestRecord};
use tracer_ebpf::sites::Phase;

const W: u32 = 200; // the ledger writer thread

fn complete(outcomes: &[Outcome], req: u64) -> &RequestRecord {
    outcomes
        .iter()
        .find_map(|o| match o {
            Outcome::Complete(r) if r.req_id == req => Some(r),
            _ => None,
        })
        .unwrap_or_else(|| panic!("request {req} not complete: {outcomes:?}"))
}

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

/// Non-zero parts by name, for readable comparisons.
fn parts(r: &RequestRecord) -> Vec<(&'static str, u64)> {
    assert_consistent(r);
    Part::ALL
        .iter()
        .filter(|p| r.part_ns(**p) > 0)
        .map(|p| (p.name(), r.part_ns(*p)))
        .collect()
}

/// One upstream request, offset by `t0`: read, parse, auth, upstream call from the gap,
/// second poll on `tid2`, response. See the expected parts in `UPSTREAM_PARTS`.
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
        .request_begin(t0 + 1200, tid, req, c.fd)
        .poll_enter(t0 + 1300, tid, req)
        .phase_begin(t0 + 1350, tid, req, Phase::Auth)
        .phase_end(t0 + 1500, tid, req, Phase::Auth)
        .upstream_begin(t0 + 1600, tid, req, c.up_fd)
        .poll_exit(t0 + 1700, tid, req, false)
        // The client connection task sends the upstream request while ours is suspended.
        .sock_fd(t0 + 1850, tid, c.up_sk, c.up_fd)
        .send(t0 + 1800, t0 + 1900, tid, c.up_fd, 100)
        .data_ready(t0 + 2500, c.up_sk)
        .poll_enter(t0 + 2600, tid2, req)
        .phase_end(t0 + 2700, tid2, req, Phase::Upstream)
        .request_end(t0 + 2800, tid2, req, 200)
        .poll_exit(t0 + 2900, tid2, req, true)
        .send(t0 + 3000, t0 + 3100, tid2, c.fd, 500);
}

const UPSTREAM_PARTS: [(&str, u64); 7] = [
    ("upstream", 700),      // [S=1800, A=2500)
    ("scheduling", 140),    // arrival → read 40, reply → next poll 100
    ("cpu.parse", 310),     // read → first poll 260, poll before auth 50
    ("cpu.auth", 250),      // auth 150 + after it ends, until the next phase 100
    ("cpu.upstream", 400),  // rest of poll 1 100, poll 2 300
    ("cpu.respond", 100),   // final poll exit → response send
    ("blocked_other", 100), // suspended before the upstream send
];

fn conn(n: u64) -> Conn {
    Conn {
        fd: 10 + n,
        sk: 0xc000 + n,
        up_fd: 20 + n,
        up_sk: 0xd000 + n,
    }
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
        let mut expected = UPSTREAM_PARTS.to_vec();
        expected.sort_by_key(|(n, _)| Part::ALL.iter().position(|p| p.name() == *n));
        assert_eq!(parts(r), expected, "request {req}");
    }
    assert_eq!(
        complete(&out, 3).t_arrive_ns,
        4000,
        "keep-alive: the next arrival after t_done"
    );
    // Ordered by t_done.
    let ids: Vec<u64> = out
        .iter()
        .map(|o| {
            if let Outcome::Complete(r) = o {
                r.req_id
            } else {
                0
            }
        })
        .collect();
    assert_eq!(ids, vec![1, 2, 3]);
}

#[test]
fn task_migrates_threads_between_polls() {
    let mut s = Stream::new();
    upstream_request(&mut s, 0, 101, 102, 1, &conn(1));
    // Worker 101 sleeps meanwhile; that is not the request's business any more.
    s.switch_out(2650, 101, false)
        .wakeup(2950, 101)
        .switch_in(2990, 101);
    let out = s.rebuild();
    let r = complete(&out, 1);
    let mut expected = UPSTREAM_PARTS.to_vec();
    expected.sort_by_key(|(n, _)| Part::ALL.iter().position(|p| p.name() == *n));
    assert_eq!(parts(r), expected);
    let poll2 = r.slices.iter().find(|sl| sl.start_ns == 2600).unwrap();
    assert_eq!(
        (poll2.tid, poll2.part, poll2.end_ns),
        (102, Part::Cpu(Phase::Upstream), 2900)
    );
    let respond = r.slices.last().unwrap();
    assert_eq!(
        (respond.tid, respond.part),
        (102, Part::Cpu(Phase::Respond))
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
        .poll_enter(1200, tid, req)
        .phase_begin(1300 + 100 * i, tid, req, Phase::ReceiptWait)
        .ledger_enqueue(1400 + 100 * i, tid, req)
        .poll_exit(1500 + 100 * i, tid, req, false)
        .receipt_durable(6700 + 10 * i, W, req, i)
        .poll_enter(7000 + 100 * i, tid, req)
        .phase_end(7050 + 100 * i, tid, req, Phase::ReceiptWait)
        .request_end(7060 + 100 * i, tid, req, 200)
        .poll_exit(7100 + 100 * i, tid, req, true)
        .send(7200 + 100 * i, 7210 + 100 * i, tid, fd, 300);
}

#[test]
fn one_fsync_serves_a_batch_of_three() {
    let mut s = Stream::new();
    for i in 0..3 {
        receipt_request(&mut s, i);
    }
    s.batch_begin(5000, W, 1, 3)
        .sign(5100, 5200, W, 1, 0)
        .sign(5200, 5300, W, 1, 1)
        .sign(5300, 5400, W, 1, 2)
        .site(5400, W, tracer_ebpf::sites::Site::CommitBegin, [1, 0, 0])
        .switch_out(5550, W, false)
        .wakeup(6400, W)
        .switch_in(6450, W)
        .fdatasync(5500, 6500, W, 3)
        .site(6600, W, tracer_ebpf::sites::Site::CommitEnd, [1, 0, 0]);
    let out = s.rebuild();
    for i in 0..3u64 {
        let r = complete(&out, 1 + i);
        let gs = 1500 + 100 * i;
        let durable = 6700 + 10 * i;
        let ledger_other = (5100 - gs) + 100 + (durable - 6500);
        let scheduling = 10 + (7000 + 100 * i - durable);
        let expected = vec![
            ("scheduling", scheduling),
            ("ledger_fsync", 1000),
            ("signing", 300),
            ("ledger_other", ledger_other),
            ("cpu.parse", 290 + 100 * i),
            ("cpu.receipt", 200 + 100),
            ("cpu.respond", 100),
        ];
        assert_eq!(parts(r), expected, "request {}", 1 + i);
        assert_eq!(r.total_ns(), 7200 + 100 * i - 1000);
        // Every waiter is charged the writer's fsync sleep and its signing.
        assert_eq!(
            r.offcpu,
            vec![
                OffCpu {
                    tid: W,
                    ns: 300,
                    kernel_stack: -1,
                    user_stack: -1,
                    part: Part::Signing
                },
                OffCpu {
                    tid: W,
                    ns: 900,
                    kernel_stack: 200,
                    user_stack: 201,
                    part: Part::LedgerFsync
                },
            ]
        );
        let fsync = r
            .slices
            .iter()
            .find(|sl| sl.part == Part::LedgerFsync)
            .unwrap();
        assert_eq!((fsync.start_ns, fsync.end_ns, fsync.tid), (5500, 6500, W));
        // Own sites 10 and the read, response send and data-ready; the batch's 9 writer
        // sites, fdatasync and 3 writer sched events go to its first durable request only.
        let batch = if i == 0 { (9, 1, 3) } else { (0, 0, 0) };
        assert_eq!(
            (r.hits.sites, r.hits.syscalls, r.hits.sched, r.hits.sock),
            (10 + batch.0, 2 + batch.1, batch.2, 1)
        );
    }
}

#[test]
fn writer_preempts_the_worker_inside_its_poll_and_signs() {
    // One CPU: the enqueue wakes the writer, which preempts the worker before its poll
    // returns, signs and fsyncs; the worker runs again only after the receipt is durable.
    let mut s = Stream::new();
    s.data_ready(1000, 0xc1)
        .sock_fd(1015, 101, 0xc1, 10)
        .recv(1010, 1020, 101, 10, 100)
        .request_begin(1100, 101, 1, 10)
        .poll_enter(1200, 101, 1)
        .phase_begin(1300, 101, 1, Phase::ReceiptWait)
        .ledger_enqueue(1400, 101, 1)
        .switch_out(1450, 101, true)
        .batch_begin(1500, W, 1, 1)
        .sign(1600, 1700, W, 1, 0)
        .commit(1750, 2850, W, 1)
        .fdatasync(1800, 2800, W, 3)
        .receipt_durable(2900, W, 1, 0)
        .switch_in(3000, 101)
        .poll_exit(3100, 101, 1, false)
        .poll_enter(3200, 101, 1)
        .phase_end(3250, 101, 1, Phase::ReceiptWait)
        .request_end(3260, 101, 1, 200)
        .poll_exit(3300, 101, 1, true)
        .send(3400, 3410, 101, 10, 100);
    let out = s.rebuild();
    let r = complete(&out, 1);
    assert_eq!(
        parts(r),
        vec![
            // arrival → read 10, the rest of the preemption 450, durable → next poll 100
            ("scheduling", 10 + 450 + 100),
            ("ledger_fsync", 1000),
            ("signing", 100),
            ("cpu.parse", 190 + 100),
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
    let mut s = Stream::new();
    s.data_ready(1000, 0xc1)
        .sock_fd(1005, 101, 0xc1, 10)
        .recv(1000, 1010, 101, 10, 100)
        .request_begin(1100, 101, 1, 10)
        .poll_enter(1200, 101, 1)
        .switch_out(1400, 101, true)
        .switch_in(1500, 101)
        .sample(1550, 101)
        .switch_out(1600, 101, false)
        .wakeup(1700, 101)
        .switch_in(1750, 101)
        .request_end(1900, 101, 1, 200)
        .poll_exit(2000, 101, 1, true)
        .send(2100, 2150, 101, 10, 100);
    let out = s.rebuild();
    let r = complete(&out, 1);
    assert_eq!(
        parts(r),
        vec![
            ("scheduling", 150),
            ("cpu.parse", 200 + 800 - 250),
            ("cpu.respond", 100),
            ("blocked_other", 100)
        ]
    );
    assert_eq!(
        r.offcpu,
        vec![
            OffCpu {
                tid: 101,
                ns: 100,
                kernel_stack: 101,
                user_stack: 102,
                part: Part::Scheduling
            },
            OffCpu {
                tid: 101,
                ns: 100,
                kernel_stack: 101,
                user_stack: 102,
                part: Part::BlockedOther
            },
            OffCpu {
                tid: 101,
                ns: 50,
                kernel_stack: 101,
                user_stack: 102,
                part: Part::Scheduling
            },
        ]
    );
    assert_eq!(r.samples.len(), 1);
    assert_eq!(r.samples[0].phase, Some(Phase::Parse));
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
    s.data_ready(1000, 0xc1)
        .sock_fd(1005, 101, 0xc1, 10)
        .recv(1000, 1010, 101, 10, 100)
        .request_begin(1100, 101, 1, 10)
        .poll_enter(1200, 101, 1)
        .upstream_begin(1600, 101, 1, 20)
        // Sent from inside the poll.
        .sock_fd(1655, 101, 0xd1, 20)
        .send(1650, 1660, 101, 20, 100)
        .poll_exit(1700, 101, 1, false)
        // A spurious wake: polled again before the reply; still upstream time.
        .poll_enter(2000, 102, 1)
        .switch_out(2050, 102, true)
        .switch_in(2060, 102)
        .poll_exit(2100, 102, 1, false)
        .data_ready(2500, 0xd1)
        .poll_enter(2600, 101, 1)
        .phase_end(2700, 101, 1, Phase::Upstream)
        .request_end(2750, 101, 1, 502)
        .poll_exit(2800, 101, 1, true)
        .send(2900, 2950, 101, 10, 100);
    let out = s.rebuild();
    let r = complete(&out, 1);
    assert_eq!(r.status, 502);
    assert_eq!(
        parts(r),
        vec![
            ("upstream", 850),
            ("scheduling", 100),
            ("cpu.parse", 600),
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
    let mut s = Stream::new();
    s.data_ready(1000, 0xc1)
        .sock_fd(1005, 101, 0xc1, 10)
        .recv(1000, 1010, 101, 10, 100)
        .request_begin(1100, 101, 1, 10)
        .poll_enter(1200, 101, 1)
        .upstream_begin(1300, 101, 1, 20)
        .poll_exit(1400, 101, 1, false)
        .sock_fd(1505, 102, 0xd1, 20)
        .data_ready(1700, 0xd1)
        .send(1500, 1800, 102, 20, 100)
        .poll_enter(1900, 101, 1)
        .request_end(1950, 101, 1, 200)
        .poll_exit(2000, 101, 1, true)
        .send(2100, 2110, 101, 10, 100);
    let r = complete(&s.rebuild(), 1).clone();
    assert_eq!(r.part_ns(Part::Upstream), 200);
    assert_eq!(r.part_ns(Part::BlockedOther), 100);
    assert_eq!(r.part_ns(Part::Scheduling), 200);
    assert_consistent(&r);
}

fn simple(s: &mut Stream, t0: u64, req: u64, fd: u64, sk: u64) {
    s.data_ready(t0 + 1000, sk)
        .sock_fd(t0 + 1005, 101, sk, fd)
        .recv(t0 + 1000, t0 + 1010, 101, fd, 100)
        .request_begin(t0 + 1100, 101, req, fd)
        .poll_enter(t0 + 1200, 101, req)
        .request_end(t0 + 1300, 101, req, 200)
        .poll_exit(t0 + 1400, 101, req, true)
        .send(t0 + 1500, t0 + 1510, 101, fd, 100);
}

#[test]
fn loss_reported_late_makes_held_requests_incomplete() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    simple(&mut s, 10_000, 2, 11, 0xc2);
    let mut rb = Rebuilder::new();
    for ev in s.events() {
        rb.push(&ev);
    }
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
    // The poll exit and the response were lost; the loss covers them.
    let events: Vec<_> = s.events().into_iter().filter(|e| e.ts_ns < 1400).collect();
    let mut rb = Rebuilder::new();
    for ev in &events {
        rb.push(ev);
    }
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
    let mut rb = Rebuilder::new();
    let events = s.events();
    let (before, after): (Vec<_>, Vec<_>) = events.iter().partition(|e| e.ts_ns < 1050);
    for ev in before {
        rb.push(ev);
    }
    rb.lost(1020, 1040);
    for ev in after {
        rb.push(ev);
    }
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
    let mut rb = Rebuilder::new();
    for ev in &events {
        rb.push(ev);
    }
    let out = rb.finish(5000);
    assert_eq!(out.len(), 1);
    assert_eq!(incomplete(&out, 1), "arrival not seen");
}

#[test]
fn missing_receipt_durable_is_incomplete() {
    let mut s = Stream::new();
    receipt_request(&mut s, 0);
    let events: Vec<_> = s.events().into_iter().filter(|e| e.ts_ns != 6700).collect();
    let mut rb = Rebuilder::new();
    for ev in &events {
        rb.push(ev);
    }
    assert_eq!(incomplete(&rb.finish(9000), 1), "receipt durable not seen");
}

#[test]
fn duplicate_and_mismatched_poll_events_are_incomplete() {
    let mut s = Stream::new();
    // 1: entered twice.
    simple(&mut s, 0, 1, 10, 0xc1);
    s.poll_enter(1250, 101, 1);
    // 2: exits on another thread than it entered.
    s.data_ready(3000, 0xc2)
        .sock_fd(3005, 102, 0xc2, 11)
        .request_begin(3100, 102, 2, 11)
        .poll_enter(3200, 102, 2)
        .poll_exit(3300, 103, 2, true)
        .send(3400, 3410, 103, 11, 10);
    // 3: phase ended that never began; then more events for it, ignored.
    s.data_ready(5000, 0xc3)
        .sock_fd(5005, 104, 0xc3, 12)
        .request_begin(5100, 104, 3, 12)
        .poll_enter(5200, 104, 3)
        .phase_end(5250, 104, 3, Phase::Vault)
        .poll_exit(5300, 104, 3, true);
    // 4: never begun.
    s.poll_enter(6000, 105, 4).poll_exit(6100, 105, 4, true);
    // 5: begun twice.
    s.data_ready(7000, 0xc5)
        .sock_fd(7005, 106, 0xc5, 15)
        .request_begin(7100, 106, 5, 15)
        .request_begin(7200, 106, 5, 15);
    let out = s.rebuild();
    assert_eq!(incomplete(&out, 1), "poll enter inside a poll");
    assert_eq!(incomplete(&out, 2), "poll exit without matching enter");
    assert_eq!(incomplete(&out, 3), "phase end without begin");
    assert_eq!(incomplete(&out, 4), "request begin not seen");
    assert_eq!(incomplete(&out, 5), "duplicate request begin");
    assert_eq!(out.len(), 5, "one outcome per request: {out:?}");
}

#[test]
fn still_open_at_finish_is_incomplete_in_id_order() {
    let mut s = Stream::new();
    for (req, fd) in [(9, 19), (7, 17)] {
        s.data_ready(1000, fd + 0xc000)
            .sock_fd(1005, 101, fd + 0xc000, fd)
            .request_begin(1100, 101, req, fd);
    }
    let mut rb = Rebuilder::new();
    for ev in s.events() {
        rb.push(&ev);
    }
    assert_eq!(rb.open_requests(), 2);
    let out = rb.finish(2000);
    let ids: Vec<u64> = out
        .iter()
        .map(|o| {
            if let Outcome::Incomplete(i) = o {
                i.req_id
            } else {
                0
            }
        })
        .collect();
    assert_eq!(ids, vec![7, 9]);
    assert_eq!(rb.open_requests(), 0);
}

#[test]
fn drain_releases_after_the_hold() {
    let mut s = Stream::new();
    simple(&mut s, 0, 1, 10, 0xc1);
    let mut rb = Rebuilder::new();
    for ev in s.events() {
        rb.push(&ev);
    }
    assert!(rb.drain().is_empty());
    // Any later event moves the clock past the hold.
    let mut later = Stream::new();
    later.switch_in(1500 + tracer::requests::HOLD_NS, 999);
    rb.push(&later.events()[0]);
    let out = rb.drain();
    assert_eq!(out.len(), 1);
    assert_consistent(complete(&out, 1));
}
