//! Property-style: random but valid synthetic streams → every request is complete, its parts
//! sum exactly to its total and its slices cover its interval.

use tracer::requests::Outcome;
use tracer::requests::synthetic::{Stream, assert_consistent};
use tracer_ebpf::sites::Phase;

mod xorshift;
use xorshift::Rng;

const WRITER: u32 = 900;

/// Threads are used one poll at a time: `busy[t]` is when thread t is free again.
struct Gen {
    rng: Rng,
    s: Stream,
    busy: Vec<u64>,
    writer_free: u64,
    batch: u64,
}

impl Gen {
    /// A thread free at `t`, marked busy until `until`; off-CPU episodes inside `[t, until)`.
    fn thread(&mut self, t: u64, until: u64) -> u32 {
        let free: Vec<usize> = (0..self.busy.len())
            .filter(|&i| self.busy[i] <= t)
            .collect();
        let i = if free.is_empty() {
            self.busy.push(0);
            self.busy.len() - 1
        } else {
            free[(self.rng.next() % free.len() as u64) as usize]
        };
        self.busy[i] = until;
        101 + i as u32
    }

    fn run(&mut self, tid: u32, a: u64, b: u64) {
        // Maybe one preemption or one block inside, never at the edges.
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
        }
        if self.rng.chance(30) {
            self.s.sample(self.rng.range(a + 1, b), tid);
        }
    }

    fn request(&mut self, req: u64, t0: u64) {
        let (fd, sk, up_fd, up_sk) = (1000 + req, 0xc000_0000 + req, 5000 + req, 0xd000_0000 + req);
        let mut t = t0;
        self.s.data_ready(t, sk);
        t += self.rng.range(1, 500);
        let read_end = t + self.rng.range(5, 50);
        let poll_end = read_end + self.rng.range(60, 400);
        let tid = self.thread(t, poll_end);
        self.s
            .sock_fd(t + 1, tid, sk, fd)
            .recv(t, read_end, tid, fd, 100);
        self.s.request_begin(read_end + 2, tid, req, fd);
        let enter = read_end + 5;
        self.s.poll_enter(enter, tid, req);
        self.run(tid, enter, poll_end);
        let mut t = poll_end;
        let kind = self.rng.next() % 3;
        if kind == 1 {
            // Upstream call, sent from the gap by some thread.
            self.s
                .upstream_begin(t - 3, tid, req, up_fd)
                .poll_exit(t, tid, req, false);
            let send = t + self.rng.range(1, 100);
            let reply = send + self.rng.range(10, 3000);
            self.s
                .sock_fd(send + 1, 99, up_sk, up_fd)
                .send(send, send + 5, 99, up_fd, 10)
                .data_ready(reply, up_sk);
            t = reply + self.rng.range(1, 300);
        } else if kind == 2 {
            // Receipt wait, made durable by the next writer batch.
            self.s
                .phase_begin(t - 6, tid, req, Phase::ReceiptWait)
                .ledger_enqueue(t - 3, tid, req);
            self.s.poll_exit(t, tid, req, false);
            let start = t.max(self.writer_free) + self.rng.range(1, 200);
            self.batch += 1;
            let b = self.batch;
            let sign_end = start + self.rng.range(20, 100);
            let sync = sign_end + self.rng.range(1, 50);
            let sync_end = sync + self.rng.range(100, 5000);
            let durable = sync_end + self.rng.range(5, 50);
            self.s
                .batch_begin(start, WRITER, b, 1)
                .sign(start + 1, sign_end, WRITER, b, 0);
            self.s
                .fdatasync(sync, sync_end, WRITER, 3)
                .receipt_durable(durable, WRITER, req, 0);
            self.writer_free = durable + 1;
            t = durable + self.rng.range(1, 300);
        }
        if kind != 0 {
            let end = t + self.rng.range(20, 200);
            let tid = self.thread(t, end + 100);
            self.s.poll_enter(t, tid, req);
            self.run(tid, t, end);
            if kind == 1 {
                self.s.phase_end(t + 1, tid, req, Phase::Upstream);
            }
            t = end;
            self.finish(req, tid, fd, t);
        } else {
            self.finish(req, tid, fd, t);
        }
    }

    fn finish(&mut self, req: u64, tid: u32, fd: u64, t: u64) {
        self.s
            .request_end(t - 1, tid, req, 200)
            .poll_exit(t, tid, req, true);
        let send = t + self.rng.range(1, 90);
        self.s.send(send, send + 3, tid, fd, 100);
    }
}

#[test]
fn random_valid_streams_sum_exactly() {
    for seed in 1..=20u64 {
        let mut g = Gen {
            rng: Rng(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15)),
            s: Stream::new(),
            busy: vec![0; 4],
            writer_free: 0,
            batch: 0,
        };
        let mut t0 = 1_000;
        let n = 200;
        for req in 1..=n {
            g.request(req, t0);
            t0 += g.rng.range(50, 2000);
        }
        let out = g.s.rebuild();
        assert_eq!(out.len(), n as usize, "seed {seed}");
        for o in &out {
            match o {
                Outcome::Complete(r) => assert_consistent(r),
                Outcome::Incomplete(i) => panic!("seed {seed}: {i:?}"),
            }
        }
    }
}
