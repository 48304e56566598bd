//! The rebuild of a kernel-only session: the same event stream as the exact mode, plus the
//! data syscalls' bytes, in; one [`Outcome`] per proxied request out (`docs/model.md`,
//! "Kernel-only mode"). The [`Joiner`] finds the exchanges in the bytes; the run states,
//! sockets and cover are the exact mode's own; [`parts`](super::parts) splits each exchange.
//!
//! Choices, each covered by a test:
//! - fds are per process: a socket is keyed by (tgid, fd), as `SOCK_FD` and the data records
//!   name them. An accept's new fd and a connect's fd start a new connection in the joiner.
//! - A receive's arrival is the first data-ready on its socket since the last send on it,
//!   taken when the receive is seen (later sends move that mark on).
//! - Without a data-ready for an exchange's first request byte (or the upstream reply), the
//!   receive's enter stands in, and the session counts it (`Stats::arrival_from_syscall`).
//! - An exchange the proxy answered itself (no upstream request) has an empty `upstream`.
//! - Requests are keyed by their `x-request-id` ([`joiner::id_key`]); one without an id by
//!   [`ANONYMOUS`] | its joiner serial. A key seen among the last `RECENT_IDS` outcomes
//!   (two ids hashing alike, or a numeric id equal to another's key) makes the later one
//!   incomplete ("duplicate id"), so no two rows share a key.
//! - A loss span over an exchange makes it incomplete, as in the exact mode.

use std::collections::{BTreeMap, HashMap, HashSet, VecDeque};

use tracer_ebpf::abi::{Event, fd_of, kind, syscall};

use super::joiner::{self, Assignment, Joiner, Opened, Output, Role};
use super::parts::{self, Context, Io, Milestones};
use crate::events::data::{Data, Direction};
use crate::requests::held::{Held, incomplete, overlaps};
use crate::requests::ledger::{Interval, overlapping};
use crate::requests::outcome::{Hits, Outcome, RequestRecord};
use crate::requests::rebuild::{MARGIN_NS, MAX_OPEN_NS};
use crate::requests::recent::RecentIds;
use crate::requests::sockets::Sockets;
use crate::requests::threads::{SchedEv, Threads};

/// The high bit of the key of a request without an `x-request-id`: its joiner serial below it.
pub const ANONYMOUS: u64 = 1 << 63;

const MAINTAIN_EVERY_NS: u64 = 100_000_000;

/// What the session reports about its kernel-only rebuild.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Processes the kernel started following after attach (nginx's workers): (child pid,
    /// parent tgid, whether the kernel could not tell it from a thread), in order.
    pub forks: Vec<(u32, u32, bool)>,
    /// Target processes that exited.
    pub exits: Vec<u32>,
    /// Exchanges whose arrival (or upstream reply) was a receive's enter, for want of the
    /// socket's data-ready.
    pub arrival_from_syscall: u64,
    /// Incomplete outcomes by reason.
    pub incomplete: BTreeMap<String, u64>,
}

/// A data syscall of one thread, and whether it moved bytes for an exchange.
#[derive(Clone, Copy, Debug)]
struct Busy {
    exit: u64,
    seq: u64,
    assigned: bool,
}

#[derive(Default)]
pub struct KernelOnlyRebuilder {
    now: u64,
    joiner: Joiner,
    threads: Threads,
    sockets: Sockets,
    busy: HashMap<u32, VecDeque<Busy>>,
    /// Each receive's pending arrival, by its position in the data stream.
    ready_of_seq: VecDeque<(u64, u64, Option<u64>)>,
    /// fsync and fdatasync calls of any target thread, in exit order.
    fsyncs: VecDeque<Interval>,
    losses: Vec<(u64, u64)>,
    held: Held,
    /// Keys of recent outcomes: a repeated one is a duplicate.
    keys: RecentIds,
    /// Threads' processes, from the data records (an accept or connect names only its thread
    /// where the kernel did not pack the tgid in).
    tgid_of: HashMap<u32, u32>,
    next_maintenance: u64,
    stats: Stats,
}

fn sock_key(tgid: u32, fd: u32) -> u64 {
    (u64::from(tgid) << 32) | u64::from(fd)
}

impl KernelOnlyRebuilder {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn stats(&self) -> &Stats {
        &self.stats
    }

    /// One line for stderr: what was joined, what was not followed, which processes.
    pub fn summary(&self) -> String {
        let c = self.joiner.counts();
        let unsupported: Vec<String> = c
            .unsupported
            .iter()
            .map(|(kind, n)| format!("{}={n}", kind.name()))
            .collect();
        let forks: Vec<String> = self
            .stats
            .forks
            .iter()
            .map(|&(child, parent, maybe_thread)| {
                format!(
                    "{child}<-{parent}{}",
                    if maybe_thread { "(maybe a thread)" } else { "" }
                )
            })
            .collect();
        let exits: Vec<String> = self.stats.exits.iter().map(u32::to_string).collect();
        let reasons: Vec<String> = self
            .stats
            .incomplete
            .iter()
            .map(|(reason, n)| format!("{reason}={n}"))
            .collect();
        format!(
            "{} client requests: {} exchanges, {} incomplete [{}]; joined by id {}, as the only \
             candidate {}, by the answers' order {}, by threads {} (joins that kept a thread {}, \
             that moved {}); unsupported [{}]; arrivals from a receive {}; forks followed [{}]; \
             exits [{}]",
            c.client_requests,
            c.exchanges,
            c.incompletes,
            reasons.join(", "),
            c.joins.by_id,
            c.joins.only_candidate,
            c.joins.by_time,
            c.joins.by_thread,
            self.joiner.affinity().0,
            self.joiner.affinity().1,
            unsupported.join(" "),
            self.stats.arrival_from_syscall,
            forks.join(" "),
            exits.join(" "),
        )
    }

    /// breakdown.json's `kernel_only` section.
    pub fn to_model(&self) -> session::breakdown::KernelOnly {
        let c = self.joiner.counts();
        session::breakdown::KernelOnly {
            client_requests: c.client_requests,
            upstream_requests: c.upstream_requests,
            exchanges: c.exchanges,
            incomplete: c.incompletes,
            unsupported: c
                .unsupported
                .iter()
                .map(|(kind, n)| (kind.name().to_owned(), *n))
                .collect(),
            idle_connections_dropped: c.idle_dropped,
            arrival_from_syscall: self.stats.arrival_from_syscall,
            processes_followed: self.stats.forks.iter().map(|f| f.0).collect(),
            processes_exited: self.stats.exits.clone(),
            joins: Some(session::breakdown::Joins {
                by_id: c.joins.by_id,
                only_candidate: c.joins.only_candidate,
                by_time: c.joins.by_time,
                by_thread: c.joins.by_thread,
            }),
            connections_reopened: Some(c.reopened),
            incomplete_by_reason: self.stats.incomplete.clone(),
        }
    }

    /// What the joiner counted: exchanges, unsupported connections by kind, and the rest.
    pub fn counts(&self) -> &joiner::Counts {
        self.joiner.counts()
    }

    /// Connections that reached ESTABLISHED on a listening port and were never read by the
    /// target.
    pub fn established_unclaimed(&self) -> u64 {
        self.sockets.never_claimed
    }

    /// Exchanges begun and not yet decided.
    pub fn open_requests(&self) -> usize {
        self.joiner.open()
    }

    pub fn push(&mut self, ev: &Event) {
        if !self.advance(ev.ts_ns) {
            return;
        }
        match ev.kind {
            kind::SYSCALL => {
                self.threads.on_cpu(ev.ts_ns, ev.tid);
                let (fd, tgid) = fd_of(ev.args[1]);
                let tgid = match tgid {
                    0 => self.tgid_of.get(&ev.tid).copied(),
                    t => Some(t),
                };
                match ev.sub {
                    s if syscall::is_sync(s) => self.fsyncs.push_back(Interval {
                        start: ev.args[0],
                        end: ev.ts_ns,
                        tid: ev.tid,
                    }),
                    syscall::ACCEPT if (ev.args[2] as i64) >= 0 => {
                        if let Some(tgid) = tgid {
                            let new_fd = ev.args[2] as u32;
                            self.joiner.opened(tgid, new_fd, Opened::Accepted, ev.ts_ns);
                        }
                    }
                    syscall::CONNECT => {
                        if let Some(tgid) = tgid {
                            self.joiner.opened(tgid, fd, Opened::Connected, ev.ts_ns);
                        }
                    }
                    _ => {}
                }
                self.take_outputs();
            }
            kind::SOCK_FD => {
                self.threads.on_cpu(ev.ts_ns, ev.tid);
                let (sk, fd, tgid) = (ev.args[0], ev.args[1] as u32, ev.args[2] as u32);
                self.sockets.sock_fd(sk, sock_key(tgid, fd));
            }
            kind::DATA_READY => self.sockets.data_ready(ev.ts_ns, ev.args[0]),
            kind::ESTABLISHED => {
                let port = u16::try_from(ev.args[2]).ok().filter(|&p| p != 0);
                self.sockets.established(ev.ts_ns, ev.args[0], port)
            }
            kind::SWITCH_OUT | kind::SWITCH_IN | kind::WAKEUP => {
                if let Some(sched) = SchedEv::of(ev) {
                    self.threads.sched(ev.ts_ns, ev.tid, sched);
                }
            }
            kind::PROCESS if ev.sub == 0 => {
                self.tgid_of.insert(ev.tid, ev.tid);
                self.stats
                    .forks
                    .push((ev.tid, ev.args[0] as u32, ev.args[1] != 0))
            }
            kind::PROCESS => self.stats.exits.push(ev.tid),
            _ => {}
        }
        self.after_event();
    }

    pub fn data(&mut self, d: &Data) {
        if !self.advance(d.exit_ns) {
            return;
        }
        self.threads.on_cpu(d.exit_ns, d.tid);
        self.tgid_of.insert(d.tid, d.tgid);
        let key = sock_key(d.tgid, d.fd);
        let seq = self.joiner.next_seq();
        match d.direction() {
            Direction::Receive => {
                let ready = self.sockets.pending_arrival(key).ok();
                self.ready_of_seq.push_back((seq, d.exit_ns, ready));
            }
            Direction::Send => self.sockets.sent(key, d.enter_ns),
        }
        let port = self
            .sockets
            .sk_of(key)
            .and_then(|sk| self.sockets.peer_port(sk));
        let assigned = !matches!(self.joiner.push(d, port), Assignment::None);
        self.busy.entry(d.tid).or_default().push_back(Busy {
            exit: d.exit_ns,
            seq,
            assigned,
        });
        self.take_outputs();
        self.after_event();
    }

    /// Events may be missing in `[from_ns, to_ns]`: every exchange overlapping it is
    /// incomplete, decided already (and held) or still to be decided.
    pub fn lost(&mut self, from_ns: u64, to_ns: u64) {
        self.lose((from_ns.min(to_ns), from_ns.max(to_ns)));
    }

    fn lose(&mut self, span: (u64, u64)) {
        self.losses.push(span);
        self.held.lose(span, "events lost");
    }

    /// Moves event time on; an event older than one already seen is a loss span (as in the
    /// exact mode, the reader counts it as late).
    fn advance(&mut self, ts: u64) -> bool {
        if ts < self.now {
            self.lose((ts, self.now));
            return false;
        }
        self.now = ts;
        true
    }

    fn after_event(&mut self) {
        if self.now >= self.next_maintenance {
            self.maintain();
        }
    }

    /// Outcomes decided at least [`HOLD_NS`](crate::requests::HOLD_NS) ago, in order.
    pub fn drain(&mut self) -> Vec<Outcome> {
        self.held.drain(self.now)
    }

    /// Every exchange still open (incomplete, "session ended"), then every held outcome.
    pub fn finish(&mut self, end_ns: u64) -> Vec<Outcome> {
        self.now = self.now.max(end_ns);
        for output in self.joiner.finish() {
            self.decide(output);
        }
        self.held.take_all()
    }

    fn take_outputs(&mut self) {
        for output in self.joiner.take() {
            self.decide(output);
        }
    }

    fn decide(&mut self, output: Output) {
        let serial = output.serial();
        let id = output.request().key().unwrap_or(ANONYMOUS | serial);
        let duplicate = self.keys.contains(id);
        self.keys.insert(id);
        let (key_ts, outcome) = match output {
            _ if duplicate => (self.now, incomplete(id, "duplicate id")),
            Output::Exchange(joiner::Exchange { request: ex, .. }) => match self.record(&ex, id) {
                Ok(r) => (r.t_done_ns, Outcome::Complete(r)),
                Err(reason) => {
                    let done = ex.syscalls.iter().map(|s| s.exit_ns).max();
                    (done.unwrap_or(self.now), incomplete(id, reason))
                }
            },
            Output::Incomplete(inc) => (self.now, incomplete(id, &inc.reason.to_string())),
        };
        if let Outcome::Incomplete(i) = &outcome {
            *self.stats.incomplete.entry(i.reason.clone()).or_default() += 1;
        }
        self.held.insert(key_ts, serial, outcome);
    }

    fn ready_of(&self, seq: u64) -> Option<u64> {
        let i = self.ready_of_seq.partition_point(|&(s, _, _)| s < seq);
        self.ready_of_seq
            .get(i)
            .filter(|&&(s, _, _)| s == seq)
            .and_then(|&(_, _, ready)| ready)
    }

    /// The exchange's milestones and parts.
    fn record(&mut self, ex: &joiner::Request, id: u64) -> Result<RequestRecord, &'static str> {
        let of_role = |role: Role| ex.syscalls.iter().filter(move |s| s.role == role);
        let first = |role: Role| of_role(role).min_by_key(|s| s.seq);
        let last = |role: Role| of_role(role).max_by_key(|s| s.seq);
        let request = first(Role::ClientRequest).ok_or("request read not seen")?;
        let response = last(Role::ClientResponse).ok_or("response not seen")?;
        let done = response.enter_ns;
        let arrive = match self.ready_of(request.seq) {
            Some(t) if t <= request.exit_ns => t,
            _ => {
                self.stats.arrival_from_syscall += 1;
                request.enter_ns
            }
        };
        // The upstream can answer only once it has the whole request: its last send. Go's
        // transport flushes the headers before copying a streamed body, and the gap between
        // the two writes is the proxy's own time, not the upstream's.
        let (upstream_send, upstream_reply) =
            match (last(Role::UpstreamRequest), first(Role::UpstreamResponse)) {
                (Some(send), Some(reply)) => {
                    let reply_at = match self.ready_of(reply.seq) {
                        Some(t) if t >= send.enter_ns && t <= reply.exit_ns => t,
                        _ => {
                            self.stats.arrival_from_syscall += 1;
                            reply.enter_ns.max(send.enter_ns)
                        }
                    };
                    (send.enter_ns, reply_at)
                }
                (None, None) => (done, done),
                _ => return Err("upstream request or response not seen"),
            };
        if self.losses.iter().any(|&span| overlaps(span, arrive, done)) {
            return Err("events lost");
        }
        let milestones = Milestones {
            arrive,
            upstream_send,
            upstream_reply,
            done,
            ios: ex
                .syscalls
                .iter()
                .map(|s| Io {
                    enter: s.enter_ns.max(arrive),
                    exit: s.exit_ns,
                    tid: s.tid,
                })
                // Over before the arrival: nothing of the exchange's interval.
                .filter(|io| io.exit > io.enter)
                .collect(),
        };
        let built = parts::split(
            &milestones,
            &Ctx {
                rebuild: self,
                own: ex.syscalls.iter().map(|s| s.seq).collect(),
            },
        )?;
        Ok(RequestRecord {
            req_id: id,
            status: ex.status.unwrap_or(0),
            t_arrive_ns: arrive,
            t_done_ns: done,
            client_port: ex.client_port,
            upstream_start_ns: ex.upstream_fd.map(|_| upstream_send),
            parts: built.parts,
            slices: built.slices,
            samples: Vec::new(),
            offcpu: built.offcpu,
            waits: None,
            hits: Hits {
                syscalls: ex.syscalls.len() as u32,
                ..Hits::default()
            },
        })
    }

    /// Forgets history no open exchange can reach: the joiner gives up on an exchange after
    /// [`MAX_OPEN_NS`] without a syscall.
    fn maintain(&mut self) {
        self.next_maintenance = self.now + MAINTAIN_EVERY_NS;
        let horizon = self.now.saturating_sub(MAX_OPEN_NS + MARGIN_NS);
        if horizon == 0 {
            return;
        }
        self.threads.prune(horizon);
        self.sockets.prune(horizon);
        for log in self.busy.values_mut() {
            while log.front().is_some_and(|b| b.exit < horizon) {
                log.pop_front();
            }
        }
        self.busy.retain(|_, log| !log.is_empty());
        while self.ready_of_seq.front().is_some_and(|r| r.1 < horizon) {
            self.ready_of_seq.pop_front();
        }
        while self.fsyncs.front().is_some_and(|f| f.end < horizon) {
            self.fsyncs.pop_front();
        }
        self.losses.retain(|l| l.1 >= horizon);
    }
}

/// The split's view of the rebuild, for one exchange.
struct Ctx<'a> {
    rebuild: &'a KernelOnlyRebuilder,
    /// The `seq` of its syscalls.
    own: HashSet<u64>,
}

impl Context for Ctx<'_> {
    fn threads(&self) -> &Threads {
        &self.rebuild.threads
    }

    fn foreign_until(&self, tid: u32, from: u64, to: u64) -> Option<u64> {
        let log = self.rebuild.busy.get(&tid)?;
        let end = log.partition_point(|b| b.exit <= to);
        log.range(..end)
            .rev()
            .take_while(|b| b.exit > from)
            .find(|b| b.assigned && !self.own.contains(&b.seq))
            .map(|b| b.exit)
    }

    fn fsync_spans(&self, from: u64, to: u64) -> Vec<(u64, u64)> {
        let mut spans: Vec<(u64, u64)> = overlapping(&self.rebuild.fsyncs, from, to, None)
            .map(|iv| (iv.start, iv.end))
            .collect();
        spans.sort_unstable();
        // Two threads in fsync at once: one span.
        let mut merged: Vec<(u64, u64)> = Vec::with_capacity(spans.len());
        for (s, e) in spans {
            match merged.last_mut() {
                Some(last) if s <= last.1 => last.1 = last.1.max(e),
                _ => merged.push((s, e)),
            }
        }
        merged
    }
}

#[cfg(test)]
mod tests {
    use tracer_ebpf::abi::{fd_arg, syscall};

    use super::*;
    use crate::requests::{Incomplete, Part};

    const TGID: u32 = 100;

    fn ev(ts_ns: u64, kind: u16, sub: u16, args: [u64; 3]) -> Event {
        Event {
            ts_ns,
            tid: TGID,
            kind,
            sub,
            args,
        }
    }

    fn data(enter_ns: u64, exit_ns: u64, fd: u32, syscall: u16, text: &str) -> Data {
        Data {
            enter_ns,
            exit_ns,
            tgid: TGID,
            tid: TGID,
            fd,
            syscall,
            len: text.len() as u64,
            bytes: text.as_bytes().to_vec(),
        }
    }

    const REQUEST: &str =
        "POST /echo HTTP/1.1\r\nHost: x\r\nx-request-id: 42\r\nContent-Length: 2\r\n\r\n{}";
    const RESPONSE: &str = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}";
    const CLIENT_SK: u64 = 0xa;
    const UPSTREAM_SK: u64 = 0xb;

    enum In {
        Ev(Event),
        Data(Data),
    }

    /// One nginx-like exchange on one thread: the client's request lands at 1050 and is read
    /// at 1080..1120, sent upstream at 1190, the thread sleeps from 1300; the reply lands at
    /// 6200, the thread is woken at 6210 and runs at 6220, reads it at 6230 and answers at 6300.
    fn event_loop() -> Vec<In> {
        vec![
            In::Ev(ev(1_000, kind::SWITCH_IN, 0, [0; 3])),
            In::Ev(ev(1_050, kind::DATA_READY, 0, [CLIENT_SK, 0, 0])),
            In::Ev(ev(1_100, kind::SOCK_FD, 0, [CLIENT_SK, 5, TGID as u64])),
            In::Data(data(1_080, 1_120, 5, syscall::RECVFROM, REQUEST)),
            In::Ev(ev(1_200, kind::SOCK_FD, 0, [UPSTREAM_SK, 6, TGID as u64])),
            In::Data(data(
                1_190,
                1_210,
                6,
                syscall::WRITEV,
                &REQUEST.replace("Host: x", "Host: up"),
            )),
            In::Ev(ev(1_300, kind::SWITCH_OUT, 0, [u64::MAX, u64::MAX, 0])),
            In::Ev(ev(6_200, kind::DATA_READY, 0, [UPSTREAM_SK, 0, 0])),
            In::Ev(ev(6_210, kind::WAKEUP, 0, [0; 3])),
            In::Ev(ev(6_220, kind::SWITCH_IN, 0, [0; 3])),
            In::Data(data(6_230, 6_250, 6, syscall::RECVFROM, RESPONSE)),
            In::Data(data(6_300, 6_320, 5, syscall::WRITEV, RESPONSE)),
        ]
    }

    fn rebuild(stream: Vec<In>) -> (Vec<Outcome>, KernelOnlyRebuilder) {
        let mut r = KernelOnlyRebuilder::new();
        for input in &stream {
            match input {
                In::Ev(e) => r.push(e),
                In::Data(d) => r.data(d),
            }
        }
        let out = r.finish(10_000);
        (out, r)
    }

    /// The one complete request of `outcomes`; panics, quoting them, unless there is exactly
    /// one.
    fn only_complete(outcomes: &[Outcome]) -> &RequestRecord {
        let [req] = complete(outcomes)[..] else {
            panic!("{outcomes:?}");
        };
        req
    }

    fn complete(outcomes: &[Outcome]) -> Vec<&RequestRecord> {
        outcomes
            .iter()
            .filter_map(|o| match o {
                Outcome::Complete(r) => Some(r),
                Outcome::Incomplete(_) => None,
            })
            .collect()
    }

    #[test]
    fn an_event_loop_exchange_is_split_from_its_arrival_to_its_answer() {
        let (out, r) = rebuild(event_loop());
        let req = only_complete(&out);
        assert_eq!(
            (req.req_id, req.status, req.t_arrive_ns, req.t_done_ns),
            (42, 200, 1_050, 6_300)
        );
        assert_eq!(req.part_ns(Part::Upstream), 6_200 - 1_190);
        assert_eq!(req.part_ns(Part::Scheduling), 20);
        assert_eq!(req.part_ns(Part::OnCpu), 220);
        assert_eq!(req.parts.iter().sum::<u64>(), req.total_ns());
        assert_eq!(r.stats().arrival_from_syscall, 0);
    }

    /// Go's transport writes the headers, then the streamed body: the upstream has the request
    /// at the second write, and the gap before it is the proxy's.
    #[test]
    fn upstream_starts_at_the_send_that_completes_the_request() {
        let upstream = REQUEST.replace("Host: x", "Host: up");
        let (head, body) = upstream.split_at(upstream.len() - 2);
        let mut stream = event_loop();
        let at = stream
            .iter()
            .position(|i| matches!(i, In::Data(d) if d.fd == 6))
            .unwrap();
        stream[at] = In::Data(data(1_190, 1_210, 6, syscall::WRITE, head));
        stream.insert(
            at + 1,
            In::Data(data(1_250, 1_270, 6, syscall::WRITE, body)),
        );
        let (out, _) = rebuild(stream);
        let req = only_complete(&out);
        assert_eq!(req.part_ns(Part::Upstream), 6_200 - 1_250);
        assert_eq!(req.parts.iter().sum::<u64>(), req.total_ns());
    }

    #[test]
    fn without_the_sockets_events_the_receives_stand_in_and_are_counted() {
        let stream = event_loop()
            .into_iter()
            .filter(|i| !matches!(i, In::Ev(e) if e.kind == kind::SOCK_FD))
            .collect();
        let (out, r) = rebuild(stream);
        let req = only_complete(&out);
        assert_eq!(req.t_arrive_ns, 1_080);
        assert_eq!(req.part_ns(Part::Upstream), 6_230 - 1_190);
        assert_eq!(r.stats().arrival_from_syscall, 2);
    }

    #[test]
    fn a_loss_over_an_exchange_makes_it_incomplete() {
        let mut r = KernelOnlyRebuilder::new();
        for input in &event_loop() {
            match input {
                In::Ev(e) => r.push(e),
                In::Data(d) => r.data(d),
            }
        }
        r.lost(2_000, 3_000);
        let out = r.finish(10_000);
        assert_eq!(
            out,
            [Outcome::Incomplete(Incomplete {
                req_id: 42,
                reason: "events lost".into()
            })]
        );
    }

    #[test]
    fn an_exchange_still_open_at_the_end_is_incomplete_with_its_id() {
        let stream: Vec<In> = event_loop().into_iter().take(6).collect();
        let (out, _) = rebuild(stream);
        let [Outcome::Incomplete(inc)] = &out[..] else {
            panic!("{out:?}");
        };
        assert_eq!(inc.req_id, 42);
    }

    #[test]
    fn an_answer_the_loop_gave_another_request_first_is_queued() {
        const B_UPSTREAM_SK: u64 = 0xc;
        let request_b = REQUEST.replace("42", "43");
        let stream = vec![
            In::Ev(ev(1_000, kind::SWITCH_IN, 0, [0; 3])),
            In::Data(data(1_080, 1_120, 5, syscall::RECVFROM, REQUEST)),
            In::Ev(ev(1_200, kind::SOCK_FD, 0, [UPSTREAM_SK, 6, TGID as u64])),
            In::Data(data(1_190, 1_210, 6, syscall::WRITEV, REQUEST)),
            In::Data(data(1_280, 1_300, 7, syscall::RECVFROM, &request_b)),
            In::Ev(ev(1_400, kind::SOCK_FD, 0, [B_UPSTREAM_SK, 8, TGID as u64])),
            In::Data(data(1_390, 1_410, 8, syscall::WRITEV, &request_b)),
            // Both replies land by 6200; the loop reads and answers A's first.
            In::Ev(ev(6_190, kind::DATA_READY, 0, [UPSTREAM_SK, 0, 0])),
            In::Ev(ev(6_200, kind::DATA_READY, 0, [B_UPSTREAM_SK, 0, 0])),
            In::Data(data(6_230, 6_250, 6, syscall::RECVFROM, RESPONSE)),
            In::Data(data(6_300, 6_320, 5, syscall::WRITEV, RESPONSE)),
            In::Data(data(6_350, 6_370, 8, syscall::RECVFROM, RESPONSE)),
            In::Data(data(6_400, 6_420, 7, syscall::WRITEV, RESPONSE)),
        ];
        let (out, _) = rebuild(stream);
        let reqs = complete(&out);
        let b = reqs.iter().find(|r| r.req_id == 43).expect("request 43");
        // From B's reply (6200) to the exit of A's answer (6320), the loop worked for A.
        assert_eq!(b.part_ns(Part::Queued), 120);
        assert_eq!(b.part_ns(Part::Upstream), 6_200 - 1_390);
        assert_eq!(b.parts.iter().sum::<u64>(), b.total_ns());
        let a = reqs.iter().find(|r| r.req_id == 42).expect("request 42");
        assert_eq!(a.part_ns(Part::Queued), 0);
    }

    #[test]
    fn a_new_connection_on_a_reused_fd_arrives_on_its_own_socket() {
        const NEXT_SK: u64 = 0xd;
        let mut stream = event_loop();
        let request_b = REQUEST.replace("42", "43");
        stream.extend([
            // The client closes: its FIN is a data-ready on the old socket.
            In::Ev(ev(6_500, kind::DATA_READY, 0, [CLIENT_SK, 0, 0])),
            // A new connection gets fd 5 again; another thread of the process names it (Go:
            // a read that found nothing yet), then this one reads the request.
            In::Ev(ev(7_000, kind::DATA_READY, 0, [NEXT_SK, 0, 0])),
            In::Ev(Event {
                tid: TGID + 1,
                ..ev(7_005, kind::SOCK_FD, 0, [NEXT_SK, 5, TGID as u64])
            }),
            In::Data(data(7_010, 7_030, 5, syscall::RECVFROM, &request_b)),
            In::Data(data(7_040, 7_060, 6, syscall::WRITEV, &request_b)),
            In::Ev(ev(12_100, kind::DATA_READY, 0, [UPSTREAM_SK, 0, 0])),
            In::Data(data(12_130, 12_150, 6, syscall::RECVFROM, RESPONSE)),
            In::Data(data(12_200, 12_220, 5, syscall::WRITEV, RESPONSE)),
        ]);
        let (out, _) = rebuild(stream);
        let reqs = complete(&out);
        let b = reqs.iter().find(|r| r.req_id == 43).expect("request 43");
        assert_eq!(b.t_arrive_ns, 7_000, "not the old socket's FIN at 6500");
    }

    #[test]
    fn an_answer_the_proxy_gave_itself_has_no_upstream() {
        let stream = vec![
            In::Ev(ev(1_000, kind::SWITCH_IN, 0, [0; 3])),
            In::Ev(ev(1_050, kind::DATA_READY, 0, [CLIENT_SK, 0, 0])),
            In::Ev(ev(1_100, kind::SOCK_FD, 0, [CLIENT_SK, 5, TGID as u64])),
            In::Data(data(1_080, 1_120, 5, syscall::RECVFROM, REQUEST)),
            In::Data(data(1_300, 1_320, 5, syscall::WRITEV, RESPONSE)),
        ];
        let (out, _) = rebuild(stream);
        let req = only_complete(&out);
        assert_eq!((req.t_arrive_ns, req.t_done_ns), (1_050, 1_300));
        assert_eq!(req.part_ns(Part::Upstream), 0);
        assert_eq!(req.parts.iter().sum::<u64>(), 250);
    }

    /// [`event_loop`] with `x-request-id: 42\r\n` in every record's bytes replaced by `with`.
    fn event_loop_id(with: &str) -> Vec<In> {
        event_loop()
            .into_iter()
            .map(|input| match input {
                In::Data(mut d) => {
                    let text = String::from_utf8(d.bytes)
                        .unwrap()
                        .replace("x-request-id: 42\r\n", with);
                    d.len = text.len() as u64;
                    d.bytes = text.into_bytes();
                    In::Data(d)
                }
                other => other,
            })
            .collect()
    }

    #[test]
    fn a_request_without_an_id_is_keyed_by_its_serial() {
        let (out, _) = rebuild(event_loop_id(""));
        let req = only_complete(&out);
        // The joiner's first serial; no id to parse.
        assert_ne!(req.req_id, 42);
        assert_eq!(req.part_ns(Part::Upstream), 6_200 - 1_190);
    }

    /// Issue 31, finding 5: a numeric id equal to another id's hash, or to an id-less
    /// request's serial, overwrote one row with the other in the accuracy join. A repeated key
    /// is a duplicate, never a second row; id-less keys are apart from numeric ids.
    #[test]
    fn issue31_finding5_a_repeated_key_is_a_duplicate_not_an_overwrite() {
        let with_id = |id: &str| event_loop_id(&format!("x-request-id: {id}\r\n"));
        let colliding = joiner::id_key("a").to_string();
        let mut stream = with_id("a");
        let later: Vec<In> = with_id(&colliding)
            .into_iter()
            .map(|input| match input {
                In::Ev(e) => In::Ev(Event {
                    ts_ns: e.ts_ns + 10_000,
                    ..e
                }),
                In::Data(d) => In::Data(Data {
                    enter_ns: d.enter_ns + 10_000,
                    exit_ns: d.exit_ns + 10_000,
                    ..d
                }),
            })
            .collect();
        stream.extend(later);
        let (out, _) = rebuild(stream);
        assert_eq!(complete(&out).len(), 1, "{out:?}");
        assert!(out.contains(&Outcome::Incomplete(Incomplete {
            req_id: joiner::id_key("a"),
            reason: "duplicate id".into()
        })));
        let (out, _) = rebuild(event_loop_id(""));
        assert_ne!(only_complete(&out).req_id & ANONYMOUS, 0);
    }

    /// An accept's new fd (the tgid packed beside the listening fd) starts a new connection:
    /// a stale partial request on the old one is not the new client's.
    #[test]
    fn an_accept_starts_a_new_connection() {
        let mut stream = vec![In::Data(data(900, 910, 5, syscall::RECVFROM, "G"))];
        stream.push(In::Ev(ev(
            950,
            kind::SYSCALL,
            syscall::ACCEPT,
            [940, fd_arg(4, TGID), 5],
        )));
        stream.extend(event_loop());
        let (out, r) = rebuild(stream);
        let req = only_complete(&out);
        assert_eq!(req.t_arrive_ns, 1_050);
        assert_eq!(r.counts().reopened, 1);
    }
}
