//! Property-style: random but valid synthetic streams → every request is complete, its parts
//! sum exactly to its total and its slices cover its interval; and what the generator knows
//! (arrival, response, status, the upstream span, traced or lean) comes out as it went in.
//!
//! The streams follow the event model of `tracer/src/requests/rebuild.rs`: the first poll
//! starts at `request_begin`, the last ends at `request_end`, `poll_enter` / `poll_exit`
//! bracket the polls between; the upstream send is made inside a poll, on a pooled
//! connection or on a fresh one connected in an earlier poll; half the requests carry phase
//! sites, half are lean.

use tracer::requests::synthetic::{Stream, assert_consistent};
use tracer::requests::{Outcome, Part, RequestRecord};
use tracer_ebpf::abi::syscall;
use tracer_ebpf::sites::Phase;

mod xorshift;
use xorshift::Rng;

const WRITER: u32 = 900;
/// A thread that never polls a request.
const OTHER: u32 = 99;
const EINPROGRESS: i64 = -115;
/// Worker tids are `FIRST_WORKER + index in busy`.
const FIRST_WORKER: u32 = 101;

/// An upstream connection in the pool, idle from `free_at`.
struct UpConn {
    fd: u64,
    sk: u64,
    free_at: u64,
}

/// What a request must come out as.
struct Expect {
    t_arrive: u64,
    t_done: u64,
    status: u16,
    traced: bool,
    /// `[S, A)`: its upstream send's enter and the reply's arrival.
    upstream: Option<(u64, u64)>,
    /// `[E, D)`: its ledger enqueue and the receipt's durability.
    receipt: Option<(u64, u64)>,
    /// Samples taken inside its polls.
    samples: u32,
}

/// A request being generated: the thread polling it and the time reached in that poll.
struct Req {
    id: u64,
    traced: bool,
    tid: u32,
    at: u64,
    samples: u32,
}

/// Threads are used one poll at a time: `busy[i]` is when worker i is free again.
struct Gen {
    rng: Rng,
    s: Stream,
    busy: Vec<u64>,
    writer_free: u64,
    batch: u64,
    pool: Vec<UpConn>,
    fresh: u64,
    /// The writer's sealing and fsync intervals.
    seals: Vec<(u64, u64)>,
    syncs: Vec<(u64, u64)>,
    expect: Vec<Expect>,
}

impl Gen {
    fn new(seed: u64) -> Self {
        Gen {
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            s: Stream::new(),
            busy: vec![0; 4],
            writer_free: 0,
            batch: 0,
            pool: Vec::new(),
            fresh: 0,
            seals: Vec::new(),
            syncs: Vec::new(),
            expect: Vec::new(),
        }
    }

    /// A worker free at `t`, held until [`Gen::release`].
    fn thread(&mut self, t: u64) -> u32 {
        let free: Vec<usize> = (0..self.busy.len())
            .filter(|&i| self.busy[i] <= t)
            .collect();
        let i = if free.is_empty() {
            self.busy.push(0);
            self.busy.len() - 1
        } else {
            free[(self.rng.next() % free.len() as u64) as usize]
        };
        self.busy[i] = u64::MAX;
        FIRST_WORKER + i as u32
    }

    fn release(&mut self, tid: u32, until: u64) {
        self.busy[(tid - FIRST_WORKER) as usize] = until;
    }

    /// The rest of a poll, `[a, b)`, after its in-context events: maybe one preemption or one
    /// block, never at the edges, and maybe a sample while on CPU. Returns the samples taken.
    fn run(&mut self, tid: u32, a: u64, b: u64) -> u32 {
        let mut off = None;
        if b - a > 40 && self.rng.chance(40) {
            let out = self.rng.range(a + 10, b - 20);
            let back = self.rng.range(out + 2, b - 5);
            if self.rng.chance(50) {
                self.s.switch_out(out, tid, true).switch_in(back, tid);
            } else {
                let wake = self.rng.range(out + 1, back);
                self.s
                    .switch_out(out, tid, false)
                    .wakeup(wake, tid)
                    .switch_in(back, tid);
            }
            off = Some((out, back));
        }
        if self.rng.chance(30) {
            let t = self.rng.range(a + 1, b);
            if off.is_none_or(|(out, back)| t < out || t > back) {
                self.s.sample(t, tid);
                return 1;
            }
        }
        0
    }

    /// The poll returns pending after a while; the next one starts once `ready` has passed,
    /// on whichever worker is free.
    fn suspend(&mut self, r: &mut Req, ready: u64) {
        let exit = r.at + self.rng.range(10, 300);
        r.samples += self.run(r.tid, r.at, exit);
        self.s.poll_exit(exit, r.tid, r.id);
        self.release(r.tid, exit);
        let t = exit.max(ready) + self.rng.range(1, 300);
        r.tid = self.thread(t);
        self.s.poll_enter(t, r.tid, r.id);
        r.at = t + 1;
    }

    fn phase(&mut self, r: &mut Req, phase: Phase) {
        if r.traced {
            self.s.phase(r.at, r.tid, r.id, phase);
            r.at += self.rng.range(1, 30);
        }
    }

    /// The upstream call, from the current poll: `[S, A)`.
    fn upstream(&mut self, r: &mut Req) -> (u64, u64) {
        self.phase(r, Phase::Upstream);
        let pooled = self.pool.iter().position(|c| c.free_at <= r.at);
        let (fd, sk) = match pooled {
            Some(i) => {
                let c = self.pool.swap_remove(i);
                (c.fd, c.sk)
            }
            None => {
                // A fresh connection: connect now, send once it is writable, in a later poll.
                self.fresh += 1;
                let (fd, sk) = (5000 + self.fresh, 0xd000_0000 + self.fresh);
                self.s
                    .syscall(r.at, r.at + 2, r.tid, syscall::CONNECT, fd, EINPROGRESS);
                r.at += 3;
                let connected = r.at + self.rng.range(10, 500);
                self.suspend(r, connected);
                (fd, sk)
            }
        };
        let send = r.at;
        self.s
            .sock_fd(send + 2, r.tid, sk, fd)
            .send(send, send + 4, r.tid, fd, 10);
        r.at += 5;
        // The reply may even land before the send returns.
        let reply = send + self.rng.range(1, 3000);
        self.s.data_ready(reply, sk);
        self.suspend(r, reply);
        // The reply is read in this poll; the connection goes back to the pool.
        self.pool.push(UpConn {
            fd,
            sk,
            free_at: r.at + 1,
        });
        r.at += 2;
        (send, reply)
    }

    /// The receipt wait, from the current poll: `[E, D)`.
    fn receipt(&mut self, r: &mut Req) -> (u64, u64) {
        self.phase(r, Phase::ReceiptWait);
        let enqueue = r.at;
        self.s.ledger_enqueue(enqueue, r.tid, r.id);
        r.at += 1;
        // The writer may start before the poll returns (another CPU).
        let start = enqueue.max(self.writer_free) + self.rng.range(1, 200);
        self.batch += 1;
        let sign_end = start + self.rng.range(20, 100);
        let sync = sign_end + self.rng.range(1, 50);
        let sync_end = sync + self.rng.range(100, 5000);
        let durable = sync_end + self.rng.range(5, 50);
        self.s.seal(start, sign_end, WRITER, self.batch, 1);
        if self.rng.chance(30) {
            // The writer sleeps in the fsync.
            self.s
                .switch_out(sync + 1, WRITER, false)
                .wakeup(sync_end - 2, WRITER)
                .switch_in(sync_end - 1, WRITER);
        }
        self.s
            .fdatasync(sync, sync_end, WRITER, 3)
            .receipt_durable(durable, WRITER, r.id, self.batch);
        self.writer_free = durable + 1;
        self.seals.push((start, sign_end));
        self.syncs.push((sync, sync_end));
        self.suspend(r, durable);
        (enqueue, durable)
    }

    fn request(&mut self, req: u64, t0: u64) {
        let (fd, sk) = (1000 + req, 0xc000_0000 + req);
        let traced = self.rng.chance(50);
        self.s.data_ready(t0, sk);
        let read = t0 + self.rng.range(1, 500);
        let read_end = read + self.rng.range(5, 50);
        let tid = self.thread(read);
        self.s
            .sock_fd(read + 1, tid, sk, fd)
            .recv(read, read_end, tid, fd, 100);
        // The first poll starts here.
        let begin = read_end + 2;
        self.s.request_begin(begin, tid, req, fd);
        // Routing before the handler's first phase site: maybe preempted or sampled.
        let routed = begin + self.rng.range(2, 80);
        let samples = self.run(tid, begin, routed);
        let mut r = Req {
            id: req,
            traced,
            tid,
            at: routed,
            samples,
        };
        if traced {
            // The handler always enters auth first; the later checks are optional.
            self.phase(&mut r, Phase::Auth);
            for phase in [
                Phase::Parse,
                Phase::Scope,
                Phase::RateLimit,
                Phase::Registry,
                Phase::Vault,
            ] {
                if self.rng.chance(60) {
                    self.phase(&mut r, phase);
                }
            }
        }
        if self.rng.chance(20) {
            // A `100 Continue` on the client connection: a send in the poll, not upstream.
            self.s.send(r.at, r.at + 2, r.tid, fd, 25);
            r.at += 3;
        }
        // 0: answered at once; 1: upstream call; 2: receipt wait; 3: both, as /v1/act.
        let kind = self.rng.next() % 4;
        let upstream = matches!(kind, 1 | 3).then(|| self.upstream(&mut r));
        let receipt = matches!(kind, 2 | 3).then(|| self.receipt(&mut r));
        if self.rng.chance(50) {
            self.phase(&mut r, Phase::Respond);
        }
        let end = r.at + self.rng.range(10, 200);
        r.samples += self.run(r.tid, r.at, end);
        let status = [200, 404, 502][(self.rng.next() % 3) as usize];
        // The last poll ends here; the response is written on the same thread.
        self.s.request_end(end, r.tid, req, status);
        let send = end + self.rng.range(1, 90);
        self.s.send(send, send + 3, r.tid, fd, 100);
        self.release(r.tid, send + 4);
        self.expect.push(Expect {
            t_arrive: t0,
            t_done: send,
            status,
            traced,
            upstream,
            receipt,
            samples: r.samples,
        });
        self.noise(t0);
    }

    /// Sends on non-client sockets outside any request's polls: never anyone's upstream.
    fn noise(&mut self, t0: u64) {
        if self.rng.chance(30) {
            let t = t0 + self.rng.range(0, 3000);
            self.s
                .sock_fd(t + 1, OTHER, 0xe000_0000, 9000)
                .send(t, t + 3, OTHER, 9000, 10);
        }
        if self.rng.chance(30) {
            // A worker between polls.
            let t = t0 + self.rng.range(0, 3000);
            let tid = self.thread(t);
            self.s
                .sock_fd(t + 1, tid, 0xe000_0001, 9001)
                .send(t, t + 3, tid, 9001, 10);
            self.release(tid, t + 4);
        }
    }
}

/// Checks one request against what the generator put in. Returns its samples whose phase
/// disagrees with the on-CPU part of the slice they fall in (checked last, see the test).
fn check(seed: u64, g: &Gen, r: &RequestRecord, e: &Expect) -> Vec<String> {
    let id = r.req_id;
    assert_consistent(r);
    assert_eq!(
        (r.t_arrive_ns, r.t_done_ns, r.status),
        (e.t_arrive, e.t_done, e.status),
        "seed {seed} request {id}"
    );
    let phased: u64 = Phase::ALL.iter().map(|p| r.part_ns(Part::Cpu(*p))).sum();
    let lean = r.part_ns(Part::OnCpu);
    if e.traced {
        assert_eq!(lean, 0, "seed {seed} request {id}: traced, yet `cpu`");
        assert!(phased > 0, "seed {seed} request {id}");
    } else {
        assert_eq!(
            phased, 0,
            "seed {seed} request {id}: lean, yet `cpu.<phase>`"
        );
        assert!(lean > 0, "seed {seed} request {id}");
    }
    // The upstream span is exactly [S, A), whatever else happened in it.
    assert_eq!(
        r.part_ns(Part::Upstream),
        e.upstream.map_or(0, |(s, a)| a - s),
        "seed {seed} request {id}: upstream"
    );
    // Every gap is explained: by the upstream call (connect or send before it) or the
    // receipt wait (enqueue before it).
    assert_eq!(r.part_ns(Part::Unattributed), 0, "seed {seed} request {id}");
    let (signing, fsync, other) = (
        r.part_ns(Part::Signing),
        r.part_ns(Part::LedgerFsync),
        r.part_ns(Part::LedgerOther),
    );
    match e.receipt {
        Some((enqueue, durable)) => {
            // At most the writer's sealing and fsync inside its wait (an earlier batch's
            // included: a receipt enqueued during a batch waits for it and its own).
            let within = |ivs: &[(u64, u64)]| -> u64 {
                ivs.iter()
                    .map(|&(a, b)| b.min(durable).saturating_sub(a.max(enqueue)))
                    .sum()
            };
            let (sealing, synced) = (within(&g.seals), within(&g.syncs));
            assert!(
                signing <= sealing && fsync <= synced,
                "seed {seed} request {id}: charged {signing} signing of {sealing}, {fsync} fsync of {synced}"
            );
            assert!(signing + fsync + other > 0, "seed {seed} request {id}");
        }
        None => assert_eq!(
            (signing, fsync, other),
            (0, 0, 0),
            "seed {seed} request {id}: no receipt wait"
        ),
    }
    assert_eq!(
        (r.samples.len(), r.hits.samples),
        (e.samples as usize, e.samples),
        "seed {seed} request {id}: samples"
    );
    let mut disagree = Vec::new();
    for sample in &r.samples {
        let slice = r
            .slices
            .iter()
            .find(|sl| sl.start_ns <= sample.ts_ns && sample.ts_ns < sl.end_ns)
            .expect("a sample inside the request");
        let on_cpu = matches!(slice.part, Part::OnCpu | Part::Cpu(_));
        let named = sample.phase.map_or(Part::OnCpu, Part::Cpu);
        if on_cpu && named != slice.part {
            disagree.push(format!(
                "seed {seed} request {id}: sample at {} says {}, its slice is {}",
                sample.ts_ns,
                named.name(),
                slice.part.name()
            ));
        }
    }
    disagree
}

#[test]
fn random_valid_streams_sum_exactly() {
    let mut disagree = Vec::new();
    let (mut traced, mut lean, mut fresh) = (0, 0, 0);
    for seed in 1..=20u64 {
        let mut g = Gen::new(seed);
        let mut t0 = 1_000;
        let n = 200;
        for req in 1..=n {
            g.request(req, t0);
            t0 += g.rng.range(50, 2000);
        }
        let out = g.s.rebuild();
        assert_eq!(out.len(), n as usize, "seed {seed}");
        let mut last_done = 0;
        for o in &out {
            match o {
                Outcome::Complete(r) => {
                    let e = &g.expect[(r.req_id - 1) as usize];
                    disagree.extend(check(seed, &g, r, e));
                    // Out in t_done order.
                    assert!(r.t_done_ns >= last_done, "seed {seed}: order");
                    last_done = r.t_done_ns;
                    if e.traced {
                        traced += 1;
                    } else {
                        lean += 1;
                    }
                }
                Outcome::Incomplete(i) => panic!("seed {seed}: {i:?}"),
            }
        }
        fresh += g.fresh;
    }
    // The generator covers both kinds of request and both kinds of upstream connection.
    assert!(traced > 1000 && lean > 1000, "traced {traced}, lean {lean}");
    assert!(fresh > 20, "fresh upstream connections {fresh}");
    // Last, so that a wrong sample phase does not hide the checks above: a sample's phase
    // must name the on-CPU part of the slice it falls in (the flamegraph roots it there).
    assert!(
        disagree.is_empty(),
        "{} samples disagree with their slice, e.g. {:?}",
        disagree.len(),
        &disagree[..disagree.len().min(3)]
    );
}
