//! The wait-for view: while a request was ready but not running (`scheduling`), what ran on
//! the CPU it waited for; and while it waited for its receipt, what the writer did.
//!
//! For a `scheduling` slice the waiter is the slice's thread (preempted, or woken and in the
//! run queue), or, for a slice on no thread (arrival → first read, reply or receipt → next
//! poll), the thread that ran the request next. Its CPU is that of its first switch inside
//! the slice, else its last one before. The CPU's runners ([`CpuLog`]) cut the slice; a
//! gateway thread is then cut by what it was doing ([`Activity`]: polling which request, in
//! which phase, or reading a request before its handler began (`cpu.parse`) or writing a
//! response after it ended (`cpu.respond`), whether or not phases are traced) or, for the
//! ledger writer, by its signing and fsync intervals. Each piece is
//! charged to its holder, with the stack of a cpu-clock sample of the holder taken inside
//! the piece when there is one.
//!
//! A receipt wait: `signing` and `ledger_fsync` are the writer's own work; `ledger_other` is
//! cut by the writer's run state: on CPU (insert, commit, batching), blocked outside fsync,
//! or waiting for the CPU, charged like a `scheduling` slice to what held it.

use std::collections::{HashMap, VecDeque};

use tracer_ebpf::sites::Phase;

use super::cpus::{CpuLog, Runner, keep_last_before};
use super::ledger::WriterLog;
use super::outcome::{Part, Slice};
use super::threads::{RunState, Threads};

/// What the ledger writer was doing on CPU.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum WriterWork {
    /// Sealing the batch (hashing and signing).
    Sign,
    /// Inside fsync/fdatasync, on CPU.
    Fsync,
    /// The rest: batching, SQLite insert, commit bookkeeping, completing waiters.
    Other,
}

/// Whatever held the CPU (or the writer) while a request waited.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Holder {
    /// A gateway thread polling another request, in its phase where phases are traced.
    Request { phase: Option<Phase> },
    /// The ledger writer, on CPU.
    Writer(WriterWork),
    /// The ledger writer blocked outside fsync (receipt waits only).
    WriterBlocked,
    /// A gateway thread on CPU outside any request's poll (runtime, hyper I/O, accept).
    Thread(u32),
    /// A task outside the gateway, by pid (sched_switch's `next_pid`).
    Process(u32),
    /// Nothing ran: the wait had another cause (wakeup latency, a switch not yet done).
    Idle,
    /// The waiting thread's CPU, or who ran on it then, is not known.
    Unknown,
}

/// Wait ns of one request charged to one holder (and stack).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitCharge {
    /// The waiter's part: `scheduling`, or a receipt part.
    pub part: Part,
    pub holder: Holder,
    pub ns: u64,
    /// The holder's stack from a cpu-clock sample inside the charged time (-1: none).
    pub kernel_stack: i64,
    pub user_stack: i64,
}

/// What a thread was polling: (request id, its phase then).
type Polled = Option<(u64, Option<Phase>)>;

/// Per gateway thread: which request it polled over time, and its cpu-clock samples.
#[derive(Default)]
pub(crate) struct Activity {
    polls: HashMap<u32, VecDeque<(u64, Polled)>>,
    samples: HashMap<u32, VecDeque<(u64, i64, i64)>>,
}

impl Activity {
    /// `tid` polls `now` from `ts` on (recorded only when it changed).
    pub(crate) fn polling(&mut self, ts: u64, tid: u32, now: Polled) {
        let log = self.polls.entry(tid).or_default();
        if log.back().is_none_or(|&(_, last)| last != now) {
            log.push_back((ts, now));
        }
    }

    /// `tid` worked for request `id` over `[a, b)` outside its polls (hyper reading it before
    /// its handler began, writing its response after it ended): where the log says the thread
    /// polled nothing then, it was `id`'s, in `phase`. Entries after `b` are kept as they are.
    pub(crate) fn worked_for(&mut self, tid: u32, a: u64, b: u64, id: u64, phase: Phase) {
        if a >= b {
            return;
        }
        let log = self.polls.entry(tid).or_default();
        let mut moved = Vec::new();
        while log.back().is_some_and(|&(t, _)| t >= a) {
            moved.extend(log.pop_back());
        }
        moved.reverse();
        let mut state = log.back().and_then(|&(_, p)| p);
        let fill = |p: Polled| p.or(Some((id, Some(phase))));
        let push = |log: &mut VecDeque<(u64, Polled)>, t: u64, p: Polled| {
            if log.back().is_none_or(|&(_, last)| last != p) {
                log.push_back((t, p));
            }
        };
        push(log, a, fill(state));
        let mut rest = moved.into_iter().peekable();
        while let Some(&(t, p)) = rest.peek().filter(|&&(t, _)| t < b) {
            push(log, t, fill(p));
            state = p;
            rest.next();
        }
        push(log, b, state);
        for (t, p) in rest {
            push(log, t, p);
        }
    }

    pub(crate) fn sample(&mut self, ts: u64, tid: u32, kernel_stack: i64, user_stack: i64) {
        self.samples
            .entry(tid)
            .or_default()
            .push_back((ts, kernel_stack, user_stack));
    }

    /// `[a, b)` of `tid` cut by what it polled.
    fn polled(&self, tid: u32, a: u64, b: u64) -> Vec<(u64, u64, Polled)> {
        let Some(log) = self.polls.get(&tid) else {
            return vec![(a, b, None)];
        };
        let first_inside = log.partition_point(|&(t, _)| t <= a);
        let mut current = first_inside.checked_sub(1).and_then(|i| log[i].1);
        let mut start = a;
        let mut out = Vec::new();
        for &(t, now) in log.range(first_inside..) {
            if t >= b {
                break;
            }
            if t > start {
                out.push((start, t, current));
            }
            start = t;
            current = now;
        }
        out.push((start, b, current));
        out
    }

    fn samples_in(&self, tid: u32, a: u64, b: u64) -> Vec<(i64, i64)> {
        let Some(log) = self.samples.get(&tid) else {
            return Vec::new();
        };
        let from = log.partition_point(|&(t, _, _)| t < a);
        log.range(from..)
            .take_while(|&&(t, _, _)| t < b)
            .map(|&(_, k, u)| (k, u))
            .collect()
    }

    pub(crate) fn prune(&mut self, horizon: u64) {
        self.polls
            .values_mut()
            .for_each(|log| keep_last_before(log, horizon));
        for log in self.samples.values_mut() {
            while log.front().is_some_and(|&(t, _, _)| t < horizon) {
                log.pop_front();
            }
        }
        self.samples.retain(|_, log| !log.is_empty());
    }
}

/// Every this many requests, by a hash of the id, is charged whatever its overhead: the
/// uniform sample `wait_all` is drawn from.
pub const UNIFORM_EVERY: u64 = 16;
/// Requests charged before the running threshold is trusted.
const WARMUP_REQUESTS: u64 = 2000;
/// The running quantile a request's overhead must reach to be charged as a tail candidate:
/// well below the p99 that defines the tail at the end, so a drifting distribution still
/// finds its tail charged (pictures.json counts any tail request that was not).
const CANDIDATE_QUANTILE: f64 = 0.95;

/// Whether `req_id` is in the uniform sample (a multiplicative hash, so sequential ids spread).
pub fn in_uniform_sample(req_id: u64) -> bool {
    (req_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32).is_multiple_of(UNIFORM_EVERY)
}

/// Which completed requests get their waits charged. Charging every one doubled the tracer's
/// own CPU at 25% load; the pictures need only the tail's and a uniform sample's.
pub(crate) struct Selection {
    overheads: hdrhistogram::Histogram<u64>,
    threshold_ns: u64,
}

impl Default for Selection {
    fn default() -> Self {
        Selection {
            // Bounded (1 ns to ~18 min): saturating_record clamps to the bounds, never resizes.
            overheads: hdrhistogram::Histogram::new_with_bounds(1, 1 << 40, 2)
                .expect("valid bounds and precision"),
            threshold_ns: 0,
        }
    }
}

impl Selection {
    /// Records the request's overhead and says whether to charge its waits.
    pub(crate) fn wants(&mut self, req_id: u64, overhead_ns: u64) -> bool {
        self.overheads.saturating_record(overhead_ns);
        let seen = self.overheads.len();
        if seen.is_multiple_of(256) {
            self.threshold_ns = self.overheads.value_at_quantile(CANDIDATE_QUANTILE);
        }
        seen <= WARMUP_REQUESTS || overhead_ns >= self.threshold_ns || in_uniform_sample(req_id)
    }
}

/// The histories a request's waits are read from.
pub(crate) struct Sources<'a> {
    pub cpus: &'a CpuLog,
    pub activity: &'a Activity,
    pub writer: &'a WriterLog,
    pub threads: &'a Threads,
}

/// The wait-for charges of one request, from its slices. `fallback_tid`: the thread that
/// began it, for a wait on no thread with no thread after it.
pub(crate) fn attribute(src: &Sources<'_>, slices: &[Slice], fallback_tid: u32) -> Vec<WaitCharge> {
    let mut out = Charges::default();
    for (i, slice) in slices.iter().enumerate() {
        let (a, b) = (slice.start_ns, slice.end_ns);
        match slice.part {
            Part::Scheduling => {
                let waiter = if slice.tid != 0 {
                    slice.tid
                } else {
                    slices[i + 1..]
                        .iter()
                        .find(|s| s.tid != 0 && !is_receipt(s.part))
                        .map_or(fallback_tid, |s| s.tid)
                };
                out.behind_cpu(src, Part::Scheduling, waiter, a, b);
            }
            Part::Signing => out.writer_work(src, slice.part, slice.tid, WriterWork::Sign, a, b),
            Part::LedgerFsync => {
                out.writer_work(src, slice.part, slice.tid, WriterWork::Fsync, a, b)
            }
            Part::LedgerOther => match src.threads.split(slice.tid, a, b, false) {
                Ok(segs) => {
                    for seg in segs {
                        let (s, e) = (seg.start, seg.end);
                        match seg.state {
                            RunState::OnCpu => {
                                out.runner(src, slice.part, Runner::Target(slice.tid), s, e)
                            }
                            RunState::Blocked => {
                                out.add(slice.part, Holder::WriterBlocked, e - s, None)
                            }
                            RunState::Preempted | RunState::Runnable => {
                                out.behind_cpu(src, slice.part, slice.tid, s, e)
                            }
                        }
                    }
                }
                Err(_) => out.add(slice.part, Holder::Unknown, b - a, None),
            },
            _ => {}
        }
    }
    out.finish()
}

fn is_receipt(part: Part) -> bool {
    matches!(part, Part::Signing | Part::LedgerFsync | Part::LedgerOther)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_uniform_sample_takes_one_in_sixteen_of_sequential_ids() {
        let n = (1..=160_000u64).filter(|&id| in_uniform_sample(id)).count();
        assert!((9_000..11_000).contains(&n), "{n}");
    }

    #[test]
    fn every_request_above_the_running_p95_is_charged_and_few_others() {
        let mut selection = Selection::default();
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let (mut charged, mut tail_missed) = (0, 0);
        let total = 100_000u64;
        for id in 0..total {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            let overhead = 100_000 + rng % 1_000_000;
            let wants = selection.wants(id, overhead);
            charged += u64::from(wants);
            // The final p99 of a uniform 100..1100 µs is ~1090 µs.
            if overhead >= 1_090_000 && !wants {
                tail_missed += 1;
            }
        }
        assert_eq!(tail_missed, 0);
        // p95 and above, the 1-in-16 sample and the warm-up: about 12% of requests.
        assert!(charged < total * 3 / 20, "{charged} of {total} charged");
    }

    #[test]
    fn work_outside_polls_fills_only_where_nothing_was_polled() {
        let mut a = Activity::default();
        a.polling(100, 5, Some((1, None)));
        a.polling(200, 5, None);
        a.polling(300, 5, Some((2, None)));
        a.polling(400, 5, None);
        a.worked_for(5, 150, 350, 9, Phase::Respond);
        assert_eq!(
            a.polled(5, 0, 500),
            vec![
                (0, 100, None),
                (100, 200, Some((1, None))),
                (200, 300, Some((9, Some(Phase::Respond)))),
                (300, 400, Some((2, None))),
                (400, 500, None),
            ]
        );
        a.worked_for(5, 420, 450, 3, Phase::Parse);
        assert_eq!(
            a.polled(5, 400, 500),
            vec![
                (400, 420, None),
                (420, 450, Some((3, Some(Phase::Parse)))),
                (450, 500, None),
            ]
        );
    }
}

#[derive(Default)]
struct Charges {
    list: Vec<WaitCharge>,
}

impl Charges {
    fn add(&mut self, part: Part, holder: Holder, ns: u64, stack: Option<(i64, i64)>) {
        if ns == 0 {
            return;
        }
        let (kernel_stack, user_stack) = stack.unwrap_or((-1, -1));
        self.list.push(WaitCharge {
            part,
            holder,
            ns,
            kernel_stack,
            user_stack,
        });
    }

    /// `[a, b)` charged to `holder`, shared evenly between the samples of `tid` inside it.
    fn add_sampled(
        &mut self,
        src: &Sources<'_>,
        part: Part,
        holder: Holder,
        tid: u32,
        a: u64,
        b: u64,
    ) {
        let samples = src.activity.samples_in(tid, a, b);
        let ns = b - a;
        if samples.is_empty() {
            self.add(part, holder, ns, None);
            return;
        }
        let n = samples.len() as u64;
        for (i, &stack) in samples.iter().enumerate() {
            let share = ns / n + u64::from(i == 0) * (ns % n);
            self.add(part, holder, share, Some(stack));
        }
    }

    /// `[a, b)` in which `waiter` waited for its CPU: charged to what ran there.
    fn behind_cpu(&mut self, src: &Sources<'_>, part: Part, waiter: u32, a: u64, b: u64) {
        let Some(cpu) = src.cpus.cpu_of(waiter, a, b) else {
            self.add(part, Holder::Unknown, b - a, None);
            return;
        };
        for (s, e, runner) in src.cpus.runners(cpu, a, b) {
            match runner {
                Some(runner) => self.runner(src, part, runner, s, e),
                None => self.add(part, Holder::Unknown, e - s, None),
            }
        }
    }

    fn runner(&mut self, src: &Sources<'_>, part: Part, runner: Runner, a: u64, b: u64) {
        match runner {
            Runner::Idle => self.add(part, Holder::Idle, b - a, None),
            Runner::Other(pid) => self.add(part, Holder::Process(pid), b - a, None),
            Runner::Target(tid) if src.writer.is_writer(tid) => {
                for p in src.writer.split(tid, a, b) {
                    let work = match p.part {
                        Part::Signing => WriterWork::Sign,
                        Part::LedgerFsync => WriterWork::Fsync,
                        _ => WriterWork::Other,
                    };
                    self.add_sampled(src, part, Holder::Writer(work), tid, p.start, p.end);
                }
            }
            Runner::Target(tid) => {
                for (s, e, polled) in src.activity.polled(tid, a, b) {
                    let holder = match polled {
                        Some((_, phase)) => Holder::Request { phase },
                        None => Holder::Thread(tid),
                    };
                    self.add_sampled(src, part, holder, tid, s, e);
                }
            }
        }
    }

    fn writer_work(
        &mut self,
        src: &Sources<'_>,
        part: Part,
        tid: u32,
        work: WriterWork,
        a: u64,
        b: u64,
    ) {
        self.add_sampled(src, part, Holder::Writer(work), tid, a, b);
    }

    /// Charges with the same part, holder and stack merged, in a stable order.
    fn finish(mut self) -> Vec<WaitCharge> {
        self.list
            .sort_by_key(|c| (c.part, c.holder, c.kernel_stack, c.user_stack));
        let mut out: Vec<WaitCharge> = Vec::with_capacity(self.list.len());
        for c in self.list {
            match out.last_mut() {
                Some(last)
                    if (last.part, last.holder, last.kernel_stack, last.user_stack)
                        == (c.part, c.holder, c.kernel_stack, c.user_stack) =>
                {
                    last.ns += c.ns
                }
                _ => out.push(c),
            }
        }
        out
    }
}
