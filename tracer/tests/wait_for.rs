//! The wait-for view on synthetic streams: a request's `scheduling` ns charged to what ran
//! on its CPU instead (another request, the ledger writer, another process, idle), and its
//! receipt wait to what the writer did.

use tracer::requests::synthetic::{Stream, assert_consistent, complete};
use tracer::requests::{Holder, Part, Rebuilder, RequestRecord, WriterWork};
use tracer_ebpf::sites::Phase;

const WORKER: u32 = 101;
const W: u32 = 200; // the ledger writer
const HOG: u32 = 4242; // a process outside the gateway
const CPU: u32 = 0;

/// The streams' common lead-in.
trait Lead {
    /// Request 1 arrives on socket 0xc1 (the worker's fd 10) at 1000, is read at 1010 and
    /// begins at 1100.
    fn request_1_begins(&mut self) -> &mut Self;
}

impl Lead for Stream {
    fn request_1_begins(&mut self) -> &mut Self {
        self.data_ready(1000, 0xc1)
            .sock_fd(1015, WORKER, 0xc1, 10)
            .recv(1010, 1020, WORKER, 10, 100)
            .request_begin(1100, WORKER, 1, 10)
    }
}

/// ns charged to each holder for `part`, largest first.
fn charged(r: &RequestRecord, part: Part) -> Vec<(Holder, u64)> {
    let mut by: Vec<(Holder, u64)> = Vec::new();
    for w in r.waits.iter().flatten().filter(|w| w.part == part) {
        match by.iter_mut().find(|(h, _)| *h == w.holder) {
            Some((_, ns)) => *ns += w.ns,
            None => by.push((w.holder, w.ns)),
        }
    }
    by.sort_by_key(|&(h, ns)| (std::cmp::Reverse(ns), h));
    by
}

/// Every ns of the part is charged to some holder.
fn assert_covers(r: &RequestRecord, part: Part) {
    assert_consistent(r);
    let sum: u64 = charged(r, part).iter().map(|(_, ns)| ns).sum();
    assert_eq!(
        sum,
        r.part_ns(part),
        "{part:?} of {}: {:?}",
        r.req_id,
        r.waits
    );
}

/// Request 1 on the worker, preempted by HOG for 300 ns in its first poll.
fn preempted_by_hog() -> Stream {
    let mut s = Stream::new();
    s.switch_in_on(900, WORKER, CPU)
        .request_1_begins()
        .switch_to(1200, WORKER, true, HOG, CPU)
        .task_name(1200, HOG, "hog")
        .switch_in_on(1500, WORKER, CPU)
        .request_end(1600, WORKER, 1, 200)
        .send(1700, 1710, WORKER, 10, 100);
    s
}

#[test]
fn preempted_by_another_process_is_charged_to_it_by_name() {
    let s = preempted_by_hog();
    let mut rebuilder = Rebuilder::new().with_wait_for();
    let events = s.events();
    for ev in &events {
        rebuilder.push(ev);
    }
    let out = rebuilder.finish(2000);
    let r = complete(&out, 1);
    assert_covers(r, Part::Scheduling);
    // arrival → read: the worker was on CPU but not yet in the request's poll.
    assert_eq!(
        charged(r, Part::Scheduling),
        vec![(Holder::Process(HOG), 300), (Holder::Thread(WORKER), 10)]
    );
    assert_eq!(rebuilder.task_names()[&HOG], "hog");
}

/// Without the wait-for view the same stream rebuilds to the same requests, parts and slices,
/// with no waits charged.
#[test]
fn without_the_view_nothing_but_the_waits_changes() {
    let s = preempted_by_hog();
    let with = s.rebuild();
    let without = s.rebuild_with(Rebuilder::new());
    let r = complete(&with, 1);
    assert!(r.waits.as_ref().is_some_and(|w| !w.is_empty()));
    let lean = complete(&without, 1);
    assert!(lean.waits.is_none(), "{:?}", lean.waits);
    assert_eq!(
        RequestRecord {
            waits: None,
            ..r.clone()
        },
        *lean
    );
}

#[test]
fn waiting_behind_another_request_on_the_same_worker() {
    let mut s = Stream::new();
    s.switch_in_on(800, WORKER, CPU)
        // Request 1 is polled from 900 to 1400 (auth from 1000).
        .data_ready(850, 0xc1)
        .sock_fd(855, WORKER, 0xc1, 10)
        .recv(850, 860, WORKER, 10, 100)
        .request_begin(900, WORKER, 1, 10)
        .phase(1000, WORKER, 1, Phase::Auth)
        // Request 2 arrives meanwhile and is read only once the worker is free.
        .data_ready(950, 0xc2)
        .request_end(1400, WORKER, 1, 200)
        .send(1410, 1420, WORKER, 10, 100)
        .sock_fd(1455, WORKER, 0xc2, 11)
        .recv(1450, 1460, WORKER, 11, 100)
        .request_begin(1500, WORKER, 2, 11)
        .request_end(1600, WORKER, 2, 200)
        .send(1700, 1710, WORKER, 11, 100);
    let r = &s.rebuild_complete(2);
    assert_covers(r, Part::Scheduling);
    assert_eq!(
        charged(r, Part::Scheduling),
        vec![
            (
                Holder::Request {
                    phase: Some(Phase::Auth)
                },
                400
            ),
            // [950, 1000): request 1 before its first phase site.
            (Holder::Request { phase: None }, 50),
            // [1410, 1450): the worker between request 1's response and request 2's read.
            (Holder::Thread(WORKER), 40),
            // [1400, 1410): request 1's response, after its last poll.
            (
                Holder::Request {
                    phase: Some(Phase::Respond)
                },
                10
            ),
        ]
    );
    assert!(
        !charged(r, Part::Scheduling)
            .iter()
            .any(|(h, _)| matches!(h, Holder::Process(_))),
        "no process outside the gateway ran"
    );
}

#[test]
fn the_writer_holds_the_cpu_then_it_is_idle() {
    // One CPU: the enqueue wakes the writer, which preempts the worker, seals and fsyncs
    // (blocked: the CPU idles), makes the receipt durable and sleeps; the worker's switch-in
    // comes 50 ns after the CPU went idle.
    let mut s = Stream::new();
    s.switch_in_on(900, WORKER, CPU)
        .request_1_begins()
        .phase(1300, WORKER, 1, Phase::ReceiptWait)
        .ledger_enqueue(1400, WORKER, 1)
        .switch_to(1450, WORKER, true, W, CPU)
        .switch_in_on(1450, W, CPU)
        .seal(1600, 1700, W, 1, 1)
        .switch_to(1850, W, false, 0, CPU)
        .wakeup(2700, W)
        .switch_in_on(2750, W, CPU)
        .fdatasync(1800, 2800, W, 3)
        .receipt_durable(2900, W, 1, 0)
        .switch_to(2950, W, false, 0, CPU)
        .switch_in_on(3000, WORKER, CPU)
        .poll_exit(3100, WORKER, 1)
        .poll_enter(3200, WORKER, 1)
        .request_end(3300, WORKER, 1, 200)
        .send(3400, 3410, WORKER, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_covers(r, Part::Scheduling);
    // [1450, 1600) and [1700, 1800) and [2800, 2950): the writer outside sealing and fsync;
    // [2950, 3000): nothing ran; [1000, 1010): the worker before the request's poll; and
    // [3100, 3200): between the polls, the worker ran no request.
    assert_eq!(
        charged(r, Part::Scheduling),
        vec![
            (Holder::Writer(WriterWork::Other), 400),
            (Holder::Thread(WORKER), 110),
            (Holder::Idle, 50),
        ]
    );
    assert_eq!(
        charged(r, Part::Signing),
        vec![(Holder::Writer(WriterWork::Sign), 100)]
    );
    assert_eq!(
        charged(r, Part::LedgerFsync),
        vec![(Holder::Writer(WriterWork::Fsync), 1000)]
    );
}

#[test]
fn a_receipt_wait_names_what_delayed_the_writer() {
    // The worker blocks after the enqueue; the writer seals, is preempted by the hog, then
    // fsyncs without sleeping and makes the receipt durable.
    let mut s = Stream::new();
    s.switch_in_on(900, WORKER, CPU)
        .request_1_begins()
        .ledger_enqueue(1400, WORKER, 1)
        .poll_exit(1500, WORKER, 1)
        .switch_to(1500, WORKER, false, W, CPU)
        .switch_in_on(1500, W, CPU)
        .seal(1600, 1700, W, 1, 1)
        .switch_to(1750, W, true, HOG, CPU)
        .switch_in_on(1850, W, CPU)
        .fdatasync(1900, 2000, W, 3)
        .receipt_durable(2100, W, 1, 0)
        .wakeup(2100, WORKER)
        .switch_to(2150, W, false, 0, CPU)
        .switch_in_on(2160, WORKER, CPU)
        .poll_enter(2200, WORKER, 1)
        .request_end(2300, WORKER, 1, 200)
        .send(2400, 2410, WORKER, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_covers(r, Part::LedgerOther);
    assert_eq!(
        charged(r, Part::LedgerOther),
        vec![
            (Holder::Writer(WriterWork::Other), 300),
            (Holder::Process(HOG), 100),
        ]
    );
    // After the receipt: the writer finishing [2100, 2150), idle [2150, 2160), then the
    // worker outside the request's poll [2160, 2200).
    assert_covers(r, Part::Scheduling);
    let after: Vec<_> = charged(r, Part::Scheduling);
    assert!(
        after.contains(&(Holder::Writer(WriterWork::Other), 50)),
        "{after:?}"
    );
    assert!(after.contains(&(Holder::Idle, 10)), "{after:?}");
}

#[test]
fn an_unseen_cpu_is_charged_as_unknown_not_guessed() {
    let mut s = Stream::new();
    s.request_1_begins()
        .request_end(1600, WORKER, 1, 200)
        .send(1700, 1710, WORKER, 10, 100);
    let r = &s.rebuild_complete(1);
    assert_covers(r, Part::Scheduling);
    assert_eq!(charged(r, Part::Scheduling), vec![(Holder::Unknown, 10)]);
}
