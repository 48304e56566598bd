//! The rebuild: events in, one [`Outcome`] per request out (see `docs/model.md`).
//!
//! Choices where the model leaves room, each covered by a test:
//! - `read_enter` is the enter of the last successful receive on the client fd whose *exit* is
//!   at or after `t_arrive`, clamped to `t_arrive` (a receive can start just before the data
//!   lands); none → the `RequestBegin` ts.
//! - The first poll starts at `RequestBegin` and the last one ends at `RequestEnd` (the
//!   gateway folds those poll bounds into them); `PollEnter` / `PollExit` bracket the polls
//!   in between, and a `PollExit` always means the poll returned pending.
//! - The upstream connection is not named by a site: it is the fd of the first successful
//!   send, inside one of the request's polls, on a socket that is not a client connection
//!   (accepted, or the fd of some request's `RequestBegin`) and was not since reconnected.
//! - Without `Phase` sites (the lean default) on-CPU time is one part, `cpu`; with them it is
//!   `cpu.<phase>`, the phase being the last one entered (phases do not nest).
//! - `t_done` is the enter of the first *successful* send on the client fd after
//!   `RequestEnd` (a send returning an error sent nothing).
//! - A gap between polls is explained by what the request had started by the `PollExit` that
//!   began it: a ledger enqueue `E` → `[gap, E)` blocked_other, `[E, D)` the writer split,
//!   `[D, gap end)` scheduling; else, once the upstream send `S` (or the connect of a fresh
//!   upstream connection) has happened, `[gap, S)` blocked_other, `[S, A)` upstream,
//!   `[A, gap end)` scheduling; any other gap → unattributed.
//! - Inside a poll, after `E` and before `D`, time the request's thread was off CPU while the
//!   writer signed or fsynced is `Signing` / `LedgerFsync` (the writer split painted over the
//!   poll's `Scheduling` and `BlockedOther` pieces only, never over its on-CPU time): with the
//!   writer and the worker on one CPU the writer preempts the worker right after the enqueue
//!   and signs before the poll returns, and that wait is for the receipt, not generic run-queue
//!   delay. Those charges carry no stack (the flamegraph's synthetic writer frames).
//! - Off-CPU charges come from every thread-state split of the request (the read before the
//!   first poll and the response write after the last one as well as the polls).
//! - A blocked switch-out gives two off-CPU charges with its stacks: `BlockedOther` until the
//!   wakeup, `Scheduling` from the wakeup to the switch-in (the same split as the slices).
//!   Charges inside the upstream span are dropped with the slices it overrides.
//! - Hits: sites with the request's id, plus the writer sites, syscalls and sched events of
//!   the batch that made its receipt durable if it is that batch's first durable request;
//!   syscalls, socket and sched events on a thread
//!   while it polls the request, or on its client or upstream fd while it is open; the
//!   arrival's data-ready and the receive that read it; samples inside its polls.
//! - One upstream connection per request: later sends on other sockets are not upstream.
//! - A request breaks (→ `Incomplete`, emitted at once) on the first inconsistent event:
//!   duplicate or unmatched poll events, an unknown phase id, a begin for an id still open, events for an id
//!   whose begin was never seen (once per id), a loss span over its interval (an event older
//!   than one already pushed is a loss span from its ts to the newest, "event out of order"
//!   whether it reaches the request before its begin or after), or no `t_done`
//!   within [`MAX_OPEN_NS`]. Later events for a finished id are ignored.
//! - Requests are keyed by the gateway's probe id (`RequestBegin` a0, unique per process);
//!   outcomes carry the client's `x-request-id` (a2; 0 from a gateway that passes none: the
//!   probe id). A begin whose client id or probe id was seen among the last [`RECENT_IDS`](super::recent::RECENT_IDS)
//!   is reported incomplete ("duplicate id"), not dropped.
//! - Outcomes are held for [`HOLD_NS`](super::HOLD_NS) of event time after they are decided, so a loss
//!   reported late (the loss counter is polled) still turns the requests it overlaps into
//!   `Incomplete`. They come out ordered by (decision ts = `t_done` for complete ones, req id).

use std::collections::HashMap;

use tracer_ebpf::abi::{Event, fd_of, kind, switch, syscall};
use tracer_ebpf::sites::{Phase, Site};

use super::cover::{Cover, Piece};
use super::cpus::CpuLog;
use super::held::{Held, incomplete, overlaps};
use super::kernel::KernelStats;
use super::ledger::WriterLog;
use super::outcome::{Hits, Outcome, Part, RequestRecord, StackSample};
use super::recent::RecentIds;
use super::sockets::Sockets;
use super::threads::{RunState, SchedEv, Threads};
use super::wait::{self, Activity, Selection, Sources};

/// History kept before the oldest open request.
pub const MARGIN_NS: u64 = 1_000_000_000;
/// A request with no `t_done` this long after its begin is given up on.
pub const MAX_OPEN_NS: u64 = 10_000_000_000;
const MAINTAIN_EVERY_NS: u64 = 100_000_000;
/// Finished ids remembered so their late events are ignored.

#[derive(Clone, Copy, Debug)]
struct PollSpan {
    enter: u64,
    exit: u64,
    tid: u32,
}

#[derive(Clone, Copy, Debug)]
struct Upstream {
    fd: u64,
    /// S: enter of the first send on the upstream socket.
    send: u64,
    /// A: the first data-ready on the upstream socket at or after S.
    reply: Option<u64>,
}

/// The request's phases over time, from `Phase` sites: each lasts until the next begins.
/// Empty when phases are not traced.
#[derive(Default, Debug)]
struct Phases {
    changes: Vec<(u64, Phase)>,
}

impl Phases {
    fn traced(&self) -> bool {
        !self.changes.is_empty()
    }

    fn current(&self) -> Option<Phase> {
        self.changes.last().map(|&(_, p)| p)
    }

    fn begin(&mut self, ts: u64, phase: Phase) {
        if self.current() != Some(phase) {
            self.changes.push((ts, phase));
        }
    }

    /// The on-CPU part at `t`: `cpu` when phases are not traced, else `cpu.<phase>` (parse
    /// before the first phase site).
    fn part_at(&self, t: u64) -> Part {
        if !self.traced() {
            return Part::OnCpu;
        }
        let i = self.changes.partition_point(|&(ts, _)| ts <= t);
        Part::Cpu(if i == 0 {
            Phase::Parse
        } else {
            self.changes[i - 1].1
        })
    }
}

/// Which part on-CPU time of a split goes to.
#[derive(Clone, Copy)]
enum OnCpu<'a> {
    Fixed(Part),
    Phases(&'a Phases),
}

impl OnCpu<'_> {
    fn at(self, t: u64) -> Part {
        match self {
            OnCpu::Fixed(p) => p,
            OnCpu::Phases(p) => p.part_at(t),
        }
    }
}

#[derive(Debug)]
struct OpenRequest {
    req_id: u64,
    /// The client's id, which outcomes carry.
    client_id: u64,
    begin_ts: u64,
    begin_tid: u32,
    client_fd: u64,
    t_arrive: u64,
    read_enter: u64,
    read_enter_in_context: bool,
    status: Option<u16>,
    phases: Phases,
    polls: Vec<PollSpan>,
    open_poll: Option<(u64, u32)>,
    polled_to_completion: bool,
    upstream: Option<Upstream>,
    /// Enter of the first connect inside the request's polls (a fresh upstream connection).
    connect: Option<u64>,
    enqueue: Option<u64>,
    durable: Option<(u64, u32)>,
    samples: Vec<StackSample>,
    hits: Hits,
}

/// Rebuilds requests from the event stream. Feed events in non-decreasing ts with
/// [`Rebuilder::push`], report loss spans with [`Rebuilder::lost`], and collect outcomes with
/// [`Rebuilder::drain`] and, at the end, [`Rebuilder::finish`].
#[derive(Default)]
pub struct Rebuilder {
    now: u64,
    sockets: Sockets,
    threads: Threads,
    writer: WriterLog,
    /// Keep the CPU and activity logs and attribute each request's waits (the wait-for view).
    wait_for: bool,
    cpus: CpuLog,
    activity: Activity,
    charged: Selection,
    open: HashMap<u64, OpenRequest>,
    by_client_fd: HashMap<u64, u64>,
    by_upstream_fd: HashMap<u64, u64>,
    /// Per thread, the requests it is polling, innermost last.
    polling: HashMap<u32, Vec<u64>>,
    finished: RecentIds,
    /// Client ids of recently begun requests.
    clients: RecentIds,
    /// Loss spans still within the history kept, each with the reason its requests get.
    losses: Vec<Loss>,
    held: Held,
    next_maintenance: u64,
    kernel: KernelStats,
}

/// Events missing in `[from, to]`: lost by the kernel, or one released too late to be used.
#[derive(Clone, Copy, Debug)]
struct Loss {
    from: u64,
    to: u64,
    reason: &'static str,
}

impl Rebuilder {
    /// Rebuilds requests and their parts; their `waits` stay empty.
    pub fn new() -> Self {
        Self::default()
    }

    /// Also charges requests' waits to what held the CPU (`RequestRecord::waits`): those of
    /// every tail candidate and of a uniform sample ([`wait::in_uniform_sample`]); the others'
    /// stay `None`. Nothing changes in the kernel.
    pub fn with_wait_for(mut self) -> Self {
        self.wait_for = true;
        self
    }

    /// fsync durations and run-queue delays as the model saw them, for the cross-check.
    pub fn kernel(&self) -> &KernelStats {
        &self.kernel
    }

    /// Connections that reached ESTABLISHED on a listening port and were never read by the
    /// target (see `Sockets::never_claimed`).
    pub fn established_unclaimed(&self) -> u64 {
        self.sockets.never_claimed
    }

    /// Names of the tasks outside the target that took a target thread's CPU, by pid.
    pub fn task_names(&self) -> &HashMap<u32, String> {
        self.cpus.names()
    }

    /// Requests begun and not yet decided.
    pub fn open_requests(&self) -> usize {
        self.open.len()
    }

    pub fn push(&mut self, ev: &Event) {
        if ev.ts_ns < self.now {
            // Released after newer events (the reorder window was too short; the reader counts
            // it in `late_events`): the history it belongs in has moved on, so the event is
            // lost to the model, and so are the requests it could have changed.
            self.lose((ev.ts_ns, self.now), "event out of order");
            return;
        }
        self.now = ev.ts_ns;
        match ev.kind {
            kind::SITE => self.site(ev),
            kind::SYSCALL => self.syscall(ev),
            kind::SOCK_FD => {
                self.threads.on_cpu(ev.ts_ns, ev.tid);
                self.sockets.sock_fd(ev.args[0], ev.args[1]);
                if let Some(r) = self.polled_by(ev.tid) {
                    r.hits.sock += 1;
                }
            }
            kind::DATA_READY => self.data_ready(ev),
            kind::ESTABLISHED => {
                let port = u16::try_from(ev.args[2]).ok().filter(|&p| p != 0);
                self.sockets.established(ev.ts_ns, ev.args[0], port)
            }
            kind::SWITCH_OUT => {
                if self.wait_for {
                    let (next_pid, cpu) = switch::unpack(ev.args[2]);
                    self.cpus.switch_out(ev.ts_ns, ev.tid, next_pid, cpu);
                }
                self.sched_event(ev)
            }
            kind::SWITCH_IN => {
                if self.wait_for {
                    self.cpus.switch_in(ev.ts_ns, ev.tid, ev.args[0] as u32);
                }
                self.sched_event(ev)
            }
            kind::TASK_NAME => self.cpus.task_name(ev.tid, [ev.args[0], ev.args[1]]),
            kind::WAKEUP => self.sched_event(ev),
            kind::SAMPLE => self.sample(ev),
            _ => {}
        }
        if self.now >= self.next_maintenance {
            self.maintain();
        }
    }

    /// Events were lost somewhere in `[from_ns, to_ns]`: every request overlapping it is
    /// incomplete, whether decided already (and still held), open, or yet to begin.
    pub fn lost(&mut self, from_ns: u64, to_ns: u64) {
        self.lose((from_ns.min(to_ns), from_ns.max(to_ns)), "events lost");
    }

    fn lose(&mut self, span: (u64, u64), reason: &'static str) {
        self.losses.push(Loss {
            from: span.0,
            to: span.1,
            reason,
        });
        self.held.lose(span, reason);
        let mut hit: Vec<u64> = self
            .open
            .values()
            .filter(|r| r.t_arrive <= span.1)
            .map(|r| r.req_id)
            .collect();
        hit.sort_unstable();
        for id in hit {
            self.abandon(id, reason);
        }
    }

    /// Outcomes decided at least [`HOLD_NS`](super::HOLD_NS) ago, in order.
    pub fn drain(&mut self) -> Vec<Outcome> {
        self.held.drain(self.now)
    }

    /// Every held outcome, then every request still open (incomplete, by id).
    pub fn finish(&mut self, end_ns: u64) -> Vec<Outcome> {
        self.now = self.now.max(end_ns);
        let mut out = self.held.take_all();
        let mut ids: Vec<u64> = self.open.keys().copied().collect();
        ids.sort_unstable();
        for id in ids {
            if let Some(req) = self.open.remove(&id) {
                out.push(incomplete(req.client_id, "still open at end"));
            }
            self.finished.insert(id);
        }
        self.by_client_fd.clear();
        self.by_upstream_fd.clear();
        out
    }

    /// The reason of the first loss span over `[from, to]`: a request gets the same reason
    /// whether the span came before its begin or while it was open or held (the first span to
    /// reach it decides, there too).
    fn loss_over(&self, from: u64, to: u64) -> Option<&'static str> {
        self.losses
            .iter()
            .find(|l| overlaps((l.from, l.to), from, to))
            .map(|l| l.reason)
    }

    /// The request `tid` is polling (innermost), if any.
    fn polled_id(&self, tid: u32) -> Option<u64> {
        self.polling.get(&tid)?.last().copied()
    }

    fn polled_by(&mut self, tid: u32) -> Option<&mut OpenRequest> {
        let id = self.polled_id(tid)?;
        self.open.get_mut(&id)
    }

    /// Holds `outcome` of the request with probe id `id` (unique, where client ids may repeat).
    fn decide(&mut self, key_ts: u64, id: u64, outcome: Outcome) {
        self.held.insert(key_ts, id, outcome);
    }

    fn forget(&mut self, req: &OpenRequest) {
        self.finished.insert(req.req_id);
        if self.by_client_fd.get(&req.client_fd) == Some(&req.req_id) {
            self.by_client_fd.remove(&req.client_fd);
        }
        if let Some(up) = req.upstream
            && self.by_upstream_fd.get(&up.fd) == Some(&req.req_id)
        {
            self.by_upstream_fd.remove(&up.fd);
        }
    }

    fn abandon(&mut self, id: u64, reason: &str) {
        if let Some(req) = self.open.remove(&id) {
            self.forget(&req);
            self.decide(self.now, id, incomplete(req.client_id, reason));
        }
    }

    /// The open request `id`, or None. An id never begun is reported once as incomplete.
    fn request(&mut self, id: u64) -> Option<&mut OpenRequest> {
        if !self.open.contains_key(&id) {
            if !self.finished.contains(id) {
                self.finished.insert(id);
                self.decide(self.now, id, incomplete(id, "request begin not seen"));
            }
            return None;
        }
        let req = self.open.get_mut(&id)?;
        req.hits.sites += 1;
        Some(req)
    }

    fn site(&mut self, ev: &Event) {
        self.site_inner(ev);
        if !self.wait_for {
            return;
        }
        // What the thread polls from now on, for the wait-for view.
        let polled = self
            .polled_id(ev.tid)
            .and_then(|id| Some((id, self.open.get(&id)?.phases.current())));
        self.activity.polling(ev.ts_ns, ev.tid, polled);
    }

    fn site_inner(&mut self, ev: &Event) {
        self.threads.on_cpu(ev.ts_ns, ev.tid);
        let Some(site) = Site::from_id(ev.sub) else {
            return;
        };
        let [a0, a1, a2] = ev.args;
        let (ts, tid) = (ev.ts_ns, ev.tid);
        match site {
            Site::RequestBegin => self.request_begin(ts, tid, a0, a1, a2),
            Site::RequestEnd => {
                self.stop_polling(tid, a0);
                let Some(r) = self.request(a0) else { return };
                r.status = Some(u16::try_from(a1).unwrap_or(u16::MAX));
                match r.open_poll.take() {
                    Some((enter, t)) if t == tid => {
                        r.polls.push(PollSpan {
                            enter,
                            exit: ts,
                            tid,
                        });
                        r.polled_to_completion = true;
                    }
                    _ => self.abandon(a0, "request end outside its poll"),
                }
            }
            Site::Phase => {
                let Some(r) = self.request(a0) else { return };
                match Phase::from_id(a1) {
                    Some(phase) => r.phases.begin(ts, phase),
                    None => self.abandon(a0, "unknown phase id"),
                }
            }
            Site::PollEnter => {
                let Some(r) = self.request(a0) else { return };
                let result = if r.open_poll.is_some() {
                    Err("poll enter inside a poll")
                } else if r.polled_to_completion {
                    Err("poll after completion")
                } else {
                    r.open_poll = Some((ts, tid));
                    Ok(())
                };
                match result {
                    Ok(()) => self.polling.entry(tid).or_default().push(a0),
                    Err(reason) => self.abandon(a0, reason),
                }
            }
            Site::PollExit => {
                self.stop_polling(tid, a0);
                let Some(r) = self.request(a0) else { return };
                match r.open_poll.take() {
                    Some((enter, t)) if t == tid => r.polls.push(PollSpan {
                        enter,
                        exit: ts,
                        tid,
                    }),
                    _ => self.abandon(a0, "poll exit without matching enter"),
                }
            }
            Site::LedgerEnqueue => {
                let Some(r) = self.request(a0) else { return };
                if r.enqueue.replace(ts).is_some() {
                    self.abandon(a0, "duplicate ledger enqueue");
                }
            }
            Site::ReceiptDurable => {
                let Some(r) = self.request(a0) else { return };
                if r.durable.replace((ts, tid)).is_some() {
                    self.abandon(a0, "duplicate receipt durable");
                    return;
                }
                let batch = self.writer.take_batch(tid);
                let Some(r) = self.open.get_mut(&a0) else {
                    return;
                };
                r.hits.sites += batch.sites;
                r.hits.syscalls += batch.syscalls;
                r.hits.sched += batch.sched;
            }
            Site::SignBegin => {
                // Sealing is the first marked step of a batch: its hits start here.
                self.writer.batch_begin(tid);
                self.writer.sign_begin(ts, tid);
            }
            Site::SignEnd => {
                self.writer.sign_end(ts, tid);
                if let Some(b) = self.writer.batch_mut(tid) {
                    b.sites += 1;
                }
            }
        }
    }

    /// `tid` no longer polls `id`.
    fn stop_polling(&mut self, tid: u32, id: u64) {
        if let Some(stack) = self.polling.get_mut(&tid)
            && let Some(i) = stack.iter().rposition(|&x| x == id)
        {
            stack.remove(i);
        }
    }

    /// `client`: the client's id (0: none given, or an older gateway), reported in place of
    /// the probe id `id`; only a given one is checked for repeats, since the two count apart.
    fn request_begin(&mut self, ts: u64, tid: u32, id: u64, fd: u64, client: u64) {
        if self.open.contains_key(&id) {
            self.abandon(id, "duplicate request begin");
            return;
        }
        let client_id = if client == 0 { id } else { client };
        let repeated_client = client != 0 && self.clients.contains(client);
        if client != 0 {
            self.clients.insert(client);
        }
        let duplicate = self.finished.contains(id) || repeated_client;
        if duplicate {
            // Held under its own probe id, so it replaces no other outcome; its later events
            // are ignored.
            self.finished.insert(id);
            self.decide(ts, id, incomplete(client_id, "duplicate id"));
            return;
        }
        if let Some(&old) = self.by_client_fd.get(&fd) {
            self.abandon(old, "response send not seen");
        }
        let arrival = self.sockets.pending_arrival(fd).and_then(|t| {
            if t > ts {
                Err("arrival not seen")
            } else if let Some(reason) = self.loss_over(t, ts) {
                Err(reason)
            } else {
                Ok(t)
            }
        });
        let t_arrive = match arrival {
            Ok(t) => t,
            Err(reason) => {
                self.finished.insert(id);
                self.decide(ts, id, incomplete(client_id, reason));
                return;
            }
        };
        // The arrival's data-ready, and the receive that read it, belong to the request.
        let mut hits = Hits {
            sites: 1,
            sock: 1,
            ..Hits::default()
        };
        let (read_enter, read_enter_in_context) = match self.sockets.last_recv(fd) {
            Some((enter, exit)) if exit >= t_arrive && exit <= ts => {
                hits.syscalls += 1;
                (enter.max(t_arrive), enter >= t_arrive)
            }
            _ => (ts, true),
        };
        if self.wait_for {
            self.activity
                .worked_for(tid, read_enter, ts, id, Phase::Parse);
        }
        self.by_client_fd.insert(fd, id);
        self.sockets.mark_client(fd);
        // The handler's first poll starts now, on this thread.
        self.polling.entry(tid).or_default().push(id);
        self.open.insert(
            id,
            OpenRequest {
                req_id: id,
                client_id,
                begin_ts: ts,
                begin_tid: tid,
                client_fd: fd,
                t_arrive,
                read_enter,
                read_enter_in_context,
                status: None,
                phases: Phases::default(),
                polls: Vec::new(),
                open_poll: Some((ts, tid)),
                polled_to_completion: false,
                upstream: None,
                connect: None,
                enqueue: None,
                durable: None,
                samples: Vec::new(),
                hits,
            },
        );
    }

    /// The request an fd event belongs to: the one polled on `tid`, else the one whose client
    /// or upstream connection `fd` is.
    fn owner_of(&self, tid: u32, fd: Option<u64>) -> Option<u64> {
        let polled = self.polled_id(tid).filter(|id| self.open.contains_key(id));
        polled.or_else(|| {
            let fd = fd?;
            self.by_client_fd
                .get(&fd)
                .or_else(|| self.by_upstream_fd.get(&fd))
                .copied()
        })
    }

    fn syscall(&mut self, ev: &Event) {
        self.threads.on_cpu(ev.ts_ns, ev.tid);
        let [enter, fd, ret] = ev.args;
        // The fd alone: the gateway is one process, its tgid is known.
        let fd = u64::from(fd_of(fd).0);
        let ok = (ret as i64) > 0;
        if let Some(id) = self.owner_of(ev.tid, Some(fd)) {
            if let Some(r) = self.open.get_mut(&id) {
                r.hits.syscalls += 1;
            }
        } else if let Some(b) = self.writer.batch_mut(ev.tid) {
            b.syscalls += 1;
        }
        match ev.sub {
            syscall::ACCEPT if (ret as i64) >= 0 => self.sockets.accepted(ret),
            syscall::CONNECT => {
                self.sockets.connected(fd);
                if let Some(r) = self.polled_by(ev.tid) {
                    r.connect.get_or_insert(enter);
                }
            }
            s if syscall::is_receive(s) && ok => self.sockets.received(fd, enter, ev.ts_ns),
            s if syscall::is_send(s) && ok => {
                self.upstream_sent(ev.tid, fd, enter);
                self.client_sent(fd, enter);
                self.sockets.sent(fd, enter);
            }
            s if syscall::is_sync(s) => {
                self.kernel.fsync.record(ev.ts_ns.saturating_sub(enter));
                self.writer.sync(enter, ev.ts_ns, ev.tid)
            }
            _ => {}
        }
    }

    /// A send on `fd` by `tid`: the upstream send of the request `tid` is polling, if it is the
    /// first on a socket that is not a client connection.
    fn upstream_sent(&mut self, tid: u32, fd: u64, enter: u64) {
        let Some(sk) = self.sockets.sk_of(fd) else {
            return;
        };
        if self.sockets.is_client(fd) {
            return;
        }
        let Some(id) = self.polled_id(tid) else {
            return;
        };
        let Some(r) = self.open.get_mut(&id) else {
            return;
        };
        if r.upstream.is_some() {
            return;
        }
        // The reply may already be here: events are ordered by exit, the send's is late.
        match self.sockets.first_ready(sk, enter) {
            Ok(reply) => {
                r.upstream = Some(Upstream {
                    fd,
                    send: enter,
                    reply,
                });
                self.by_upstream_fd.insert(fd, id);
            }
            Err(reason) => self.abandon(id, reason),
        }
    }

    fn client_sent(&mut self, fd: u64, enter: u64) {
        let Some(&id) = self.by_client_fd.get(&fd) else {
            return;
        };
        let Some(r) = self.open.get(&id) else { return };
        let Some(&last) = r.polls.last() else { return };
        if !r.polled_to_completion || enter < last.exit {
            return;
        }
        let Some(req) = self.open.remove(&id) else {
            return;
        };
        if self.wait_for {
            self.activity
                .worked_for(last.tid, last.exit, enter, id, Phase::Respond);
        }
        self.forget(&req);
        let outcome = match self.complete(&req, enter) {
            Ok(record) => Outcome::Complete(record),
            Err(reason) => incomplete(req.client_id, reason),
        };
        self.decide(enter, id, outcome);
    }

    fn data_ready(&mut self, ev: &Event) {
        let sk = ev.args[0];
        self.sockets.data_ready(ev.ts_ns, sk);
        let Some(fd) = self.sockets.fd_of(sk) else {
            return;
        };
        if let Some(&id) = self.by_upstream_fd.get(&fd)
            && let Some(up) = self.open.get_mut(&id).and_then(|r| r.upstream.as_mut())
            && up.fd == fd
            && up.reply.is_none()
            && ev.ts_ns >= up.send
        {
            up.reply = Some(ev.ts_ns);
        }
        let owner = self
            .by_client_fd
            .get(&fd)
            .or_else(|| self.by_upstream_fd.get(&fd));
        if let Some(r) = owner.copied().and_then(|id| self.open.get_mut(&id)) {
            r.hits.sock += 1;
        }
    }

    /// A SWITCH_OUT, SWITCH_IN or WAKEUP record.
    fn sched_event(&mut self, ev: &Event) {
        let Some(sched) = SchedEv::of(ev) else {
            return;
        };
        if let Some((ns, preempted)) = self.threads.sched(ev.ts_ns, ev.tid, sched) {
            self.kernel.runqueue_delay(ns, preempted);
        }
        if let Some(r) = self.polled_by(ev.tid) {
            r.hits.sched += 1;
        } else if let Some(b) = self.writer.batch_mut(ev.tid) {
            b.sched += 1;
        }
    }

    fn sample(&mut self, ev: &Event) {
        self.threads.on_cpu(ev.ts_ns, ev.tid);
        let (ts_ns, tid) = (ev.ts_ns, ev.tid);
        if self.wait_for {
            self.activity
                .sample(ts_ns, tid, ev.args[0] as i64, ev.args[1] as i64);
        }
        if let Some(r) = self.polled_by(tid) {
            r.hits.samples += 1;
            let phase = r.phases.current();
            r.samples.push(StackSample {
                ts_ns,
                tid,
                kernel_stack: ev.args[0] as i64,
                user_stack: ev.args[1] as i64,
                phase,
            });
        }
    }

    fn maintain(&mut self) {
        self.next_maintenance = self.now + MAINTAIN_EVERY_NS;
        let mut expired: Vec<u64> = self
            .open
            .values()
            .filter(|r| r.begin_ts.saturating_add(MAX_OPEN_NS) < self.now)
            .map(|r| r.req_id)
            .collect();
        expired.sort_unstable();
        for id in expired {
            self.abandon(id, "no response within the open-request limit");
        }
        let oldest = self
            .open
            .values()
            .map(|r| r.t_arrive)
            .min()
            .unwrap_or(self.now);
        let horizon = oldest.min(self.now).saturating_sub(MARGIN_NS);
        self.sockets.prune(horizon);
        self.threads.prune(horizon);
        self.writer.prune(horizon);
        self.cpus.prune(horizon);
        self.activity.prune(horizon);
        self.losses.retain(|l| l.to >= horizon);
        self.polling.retain(|_, s| !s.is_empty());
    }

    /// Build the record of a request whose `t_done` is known.
    fn complete(&mut self, req: &OpenRequest, t_done: u64) -> Result<RequestRecord, &'static str> {
        let t_arrive = req.t_arrive;
        if let Some(reason) = self.loss_over(t_arrive, t_done) {
            return Err(reason);
        }
        let status = req.status.ok_or("request end not seen")?;
        let (first, last) = match (req.polls.first(), req.polls.last()) {
            (Some(f), Some(l)) => (*f, *l),
            _ => return Err("no poll seen"),
        };
        let in_order = t_arrive <= req.read_enter
            && req.read_enter <= req.begin_ts
            && req.begin_ts <= first.enter
            && last.exit <= t_done;
        if !in_order {
            return Err("events out of order");
        }

        // Around the polls: the read before the first, the response write after the last.
        let (before, after) = if req.phases.traced() {
            (Part::Cpu(Phase::Parse), Part::Cpu(Phase::Respond))
        } else {
            (Part::OnCpu, Part::OnCpu)
        };
        let mut tl = Cover::default();
        tl.push(Piece::new(t_arrive, req.read_enter, Part::Scheduling, 0));
        self.split(
            &mut tl,
            req.begin_tid,
            req.read_enter,
            first.enter,
            req.read_enter_in_context,
            OnCpu::Fixed(before),
        )?;
        for (i, poll) in req.polls.iter().enumerate() {
            if i > 0 {
                let prev = req.polls[i - 1];
                self.gap(&mut tl, req, prev.exit, poll.enter)?;
            }
            self.split(
                &mut tl,
                poll.tid,
                poll.enter,
                poll.exit,
                true,
                OnCpu::Phases(&req.phases),
            )?;
        }
        self.split(
            &mut tl,
            last.tid,
            last.exit,
            t_done,
            true,
            OnCpu::Fixed(after),
        )?;
        if let (Some(e), Some((d, w))) = (req.enqueue, req.durable) {
            self.receipt_work_in_polls(&mut tl, req, e.max(t_arrive), d.min(t_done), w);
        }
        if let Some(up) = req.upstream {
            let a = up.reply.ok_or("upstream response arrival not seen")?;
            tl.overlay(up.send.max(t_arrive), a.min(t_done), Part::Upstream, 0);
        }
        let built = tl.build(t_arrive, t_done)?;
        let overhead_ns = built.parts.iter().sum::<u64>() - built.parts[Part::Upstream.index()];
        let waits = if self.wait_for && self.charged.wants(req.client_id, overhead_ns) {
            let sources = Sources {
                cpus: &self.cpus,
                activity: &self.activity,
                writer: &self.writer,
                threads: &self.threads,
            };
            Some(wait::attribute(&sources, &built.slices, req.begin_tid))
        } else {
            None
        };
        Ok(RequestRecord {
            req_id: req.client_id,
            status,
            t_arrive_ns: t_arrive,
            t_done_ns: t_done,
            client_port: self
                .sockets
                .sk_of(req.client_fd)
                .and_then(|sk| self.sockets.peer_port(sk)),
            upstream_start_ns: req.upstream.map(|up| up.send.max(t_arrive)),
            parts: built.parts,
            slices: built.slices,
            // A sample taken before the first phase site had no phase yet: that time is parse.
            samples: req
                .samples
                .iter()
                .map(|&sample| StackSample {
                    phase: sample.phase.or(req.phases.traced().then_some(Phase::Parse)),
                    ..sample
                })
                .collect(),
            offcpu: built.offcpu,
            waits,
            hits: req.hits,
        })
    }

    /// The writer's signing and fsync in `[e, d)` that ran while a poll of the request was open
    /// but its thread off CPU (see the module notes), painted over those off-CPU pieces.
    fn receipt_work_in_polls(&self, tl: &mut Cover, req: &OpenRequest, e: u64, d: u64, w: u32) {
        for poll in &req.polls {
            let (a, b) = (poll.enter.max(e), poll.exit.min(d));
            if a >= b {
                continue;
            }
            for p in self.writer.split(w, a, b) {
                if p.part == Part::LedgerOther {
                    continue;
                }
                let top = Piece {
                    off: Some((p.tid, -1, -1)),
                    ..Piece::new(p.start, p.end, p.part, p.tid)
                };
                tl.overlay_where(top, |under| {
                    matches!(under.part, Part::Scheduling | Part::BlockedOther)
                });
            }
        }
    }

    /// Thread-state split of `[a, b)` on `tid`; on-CPU time goes to `Cpu(phase)`.
    fn split(
        &self,
        tl: &mut Cover,
        tid: u32,
        a: u64,
        b: u64,
        a_in_context: bool,
        on_cpu: OnCpu<'_>,
    ) -> Result<(), &'static str> {
        for seg in self.threads.split(tid, a, b, a_in_context)? {
            let off = seg.stacks.map(|(k, u)| (tid, k, u));
            match seg.state {
                RunState::OnCpu => self.cpu_pieces(tl, tid, seg.start, seg.end, on_cpu),
                RunState::Preempted | RunState::Runnable => tl.push(Piece {
                    off,
                    ..Piece::new(seg.start, seg.end, Part::Scheduling, tid)
                }),
                RunState::Blocked => tl.push(Piece {
                    off,
                    ..Piece::new(seg.start, seg.end, Part::BlockedOther, tid)
                }),
            }
        }
        Ok(())
    }

    /// On-CPU `[a, b)`, cut at the request's phase changes inside it.
    fn cpu_pieces(&self, tl: &mut Cover, tid: u32, a: u64, b: u64, on_cpu: OnCpu<'_>) {
        let mut start = a;
        let mut part = on_cpu.at(a);
        if let OnCpu::Phases(phases) = on_cpu {
            let from = phases.changes.partition_point(|&(ts, _)| ts <= a);
            for &(ts, next) in &phases.changes[from..] {
                if ts >= b {
                    break;
                }
                tl.push(Piece::new(start, ts, part, tid));
                start = ts;
                part = Part::Cpu(next);
            }
        }
        tl.push(Piece::new(start, b, part, tid));
    }

    /// A gap between two polls: explained by what the request was waiting on.
    fn gap(&self, tl: &mut Cover, req: &OpenRequest, gs: u64, ge: u64) -> Result<(), &'static str> {
        let clamp = |t: u64| t.clamp(gs, ge);
        if let Some(e) = req.enqueue.filter(|&e| e <= gs) {
            let (d, w) = req.durable.ok_or("receipt durable not seen")?;
            if e > d {
                return Err("receipt durable before enqueue");
            }
            tl.push(Piece::new(gs, clamp(e), Part::BlockedOther, 0));
            for p in self.writer.split(w, clamp(e), clamp(d)) {
                match p.part {
                    Part::LedgerFsync => self.fsync_pieces(tl, p.tid, p.start, p.end),
                    Part::Signing => tl.push(Piece {
                        off: Some((p.tid, -1, -1)),
                        ..Piece::new(p.start, p.end, p.part, p.tid)
                    }),
                    _ => tl.push(Piece::new(p.start, p.end, p.part, p.tid)),
                }
            }
            tl.push(Piece::new(clamp(d), ge, Part::Scheduling, 0));
        } else if let Some(up) = req
            .upstream
            .filter(|up| up.send <= gs || req.connect.is_some_and(|c| c <= gs))
        {
            let a = up.reply.ok_or("upstream response arrival not seen")?;
            tl.push(Piece::new(gs, clamp(up.send), Part::BlockedOther, 0));
            tl.push(Piece::new(clamp(up.send), clamp(a), Part::Upstream, 0));
            tl.push(Piece::new(clamp(a), ge, Part::Scheduling, 0));
        } else {
            tl.push(Piece::new(gs, ge, Part::Unattributed, 0));
        }
        Ok(())
    }

    /// Fsync time charged to a waiting request, with the writer's switch-outs inside it as
    /// off-CPU charges.
    fn fsync_pieces(&self, tl: &mut Cover, tid: u32, a: u64, b: u64) {
        match self.threads.split(tid, a, b, false) {
            Ok(segs) => {
                for seg in segs {
                    let off = match seg.state {
                        RunState::OnCpu => None,
                        _ => seg.stacks.map(|(k, u)| (tid, k, u)),
                    };
                    tl.push(Piece {
                        off,
                        ..Piece::new(seg.start, seg.end, Part::LedgerFsync, tid)
                    });
                }
            }
            Err(_) => tl.push(Piece::new(a, b, Part::LedgerFsync, tid)),
        }
    }
}
