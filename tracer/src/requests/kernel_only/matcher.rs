//! Which client request each upstream request was sent for (`docs/model.md`, "Joining").
//!
//! Pure bookkeeping over times, threads and keys; the joiner tells it what the bytes said. A
//! join is never a guess:
//! - **An id joins.** An upstream request carrying the `x-request-id` of exactly one open
//!   client request of its process is that request's (a second one before its response is a
//!   retry). An id on two client requests at once, or again within [`RECENT_IDS`] requests,
//!   makes them all incomplete ("duplicate id"), and upstream requests carrying it unjoined.
//!   An id no client request carried is the proxy's own (nginx's `$request_id`): the upstream
//!   request is joined as if it had none.
//! - **Otherwise its candidates are the id-less client requests of its process with its
//!   request line, whose header block was read before it was sent, that are not joined and
//!   not yet answered.** One candidate joins at once.
//! - **Several are narrowed by time:** a proxy writes a client's response head only after it
//!   read the head of the upstream response it forwards, so a client request answered before
//!   an upstream response arrived was not that upstream request's. A candidate left alone, or
//!   an assignment that every way of giving each upstream request one of its candidates agrees
//!   on (checked once all the candidates were answered or ended), joins.
//! - **Then by thread, in a process shown to keep a request on one thread.** Where every one
//!   of at least [`AFFINITY_EVIDENCE`] joins decided above had the upstream request sent by the
//!   thread that read its client request, and the client answered by the thread that read its
//!   upstream response, and none did otherwise (an event loop, a thread per request; never Go,
//!   whose goroutines change threads), a candidate on another thread is dropped; and on one
//!   thread, if the order the upstream requests went out in and the order their answers came
//!   back in both pair the group the same way, that pairing joins.
//! - **What stays open is not guessed:** the upstream requests become unjoined and their
//!   candidates incomplete ("ambiguous").
//! - **A client request with no upstream request** is complete without one only if no
//!   upstream traffic of its process that nobody's join accounts for (an upstream request
//!   that joined no candidate, a reply on a connection not followed as HTTP) fell between its
//!   header block and its answer ([`Matcher::unaccounted_between`]).
//!
//! Work per call is bounded by the candidates involved: at most [`MAX_CANDIDATES`] per upstream
//! request, [`MAX_GROUP`] in a group weighed together.

use std::collections::hash_map::RandomState;
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::hash::BuildHasher as _;

use super::assignment::forced;
use super::wire::{BadId, RequestId};
use crate::requests::recent::RecentIds;

/// Pending client requests an upstream request is weighed against; more is
/// [`Failure::TooMany`].
pub const MAX_CANDIDATES: usize = 64;
/// Requests (client and upstream) weighed together when a group is decided; more is
/// [`Failure::Ambiguous`] for all of them.
pub const MAX_GROUP: usize = 256;
/// A client request whose id was seen among this many before is a duplicate.
pub const RECENT_IDS: usize = 1 << 17;
/// Joins decided without threads (each counted on the request side and on the answer side)
/// that must all have kept their request on one thread before threads may decide a join in
/// that process. Go and work-stealing runtimes move a request between threads in a few in a
/// hundred joins, so this many without one is not chance.
pub const AFFINITY_EVIDENCE: u64 = 256;
/// How long (event time) a group that only threads could decide waits for its process to show
/// whether it keeps requests on one thread, before it is ambiguous.
pub const PARK_NS: u64 = 10_000_000_000;

pub type Serial = u64;

/// When, and on which thread, something happened.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct At {
    pub ns: u64,
    pub tid: u32,
}

/// Why an upstream request joined no client request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Failure {
    /// An `x-request-id` a client request carried, but no open one has it now.
    UnknownId,
    /// No pending id-less client request with its line.
    NoCandidate,
    /// Identical client requests were pending together and nothing told which it was.
    Ambiguous,
    /// More than [`MAX_CANDIDATES`] identical client requests were pending.
    TooMany,
    /// Its id was on several client requests.
    DuplicateId,
    /// Its `x-request-id` is not usable (see `wire::BadId`).
    BadId,
    /// Every candidate was answered before its response arrived.
    Orphaned,
}

/// What a client request's id makes of it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IdVerdict {
    Ok,
    /// Seen on another client request of its process, open or recent.
    Duplicate,
    Bad,
}

/// How an upstream request was joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum By {
    Id,
    /// The only pending client request with its line.
    OnlyCandidate,
    /// Among several, by the order of the answers.
    Time,
    /// Among several, by the threads (in a process that keeps a request on one thread).
    Thread,
}

/// The answer to an upstream request being sent.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Sent {
    Joined(Serial, By),
    /// Another attempt of a joined client request not answered yet.
    Retry(Serial),
    /// Several candidates: decided later ([`Decision`]).
    Waiting,
    Failed(Failure),
}

/// Decided after the fact, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Decision {
    Joined {
        upstream: Serial,
        client: Serial,
        by: By,
    },
    Failed {
        upstream: Serial,
        why: Failure,
    },
    /// A candidate left with no upstream request: weigh [`Matcher::unaccounted_between`].
    Free(Serial),
    /// A candidate whose upstream request could not be told.
    Ambiguous(Serial),
}

/// Where a client request's join stands when it ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Standing {
    Joined,
    /// No upstream request of its own; weigh [`Matcher::unaccounted_between`].
    Free,
    /// Still a candidate of undecided upstream requests: a [`Decision`] will say.
    Undecided,
    Ambiguous,
    /// Its id was on another client request of its process while it was open.
    Duplicate,
}

/// A process and a request line: what id-less requests are matched within.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Line {
    pub tgid: u32,
    pub method: Box<str>,
    pub target: Box<str>,
}

#[derive(Debug)]
struct Client {
    line: Line,
    id: Option<RequestId>,
    /// The read that completed its header block.
    read: At,
    /// The write of its final response head.
    answered: Option<At>,
    ended: bool,
    /// The upstream request it joined, how, and the thread that read that one's response.
    joined: Option<(Serial, By)>,
    upstream_answer_tid: Option<u32>,
    ambiguous: bool,
    /// Its id was on another client request while it was open.
    duplicate: bool,
    /// Undecided upstream requests it is a candidate of.
    ups: Vec<Serial>,
}

#[derive(Debug)]
struct Up {
    tgid: u32,
    /// The first send of its header block.
    sent: At,
    /// The read of its final response head.
    answered: Option<At>,
    cands: Vec<Serial>,
}

/// Per process: joins decided without threads that kept their request on one thread, and
/// those that did not.
#[derive(Clone, Copy, Debug, Default)]
struct Affinity {
    kept: u64,
    moved: u64,
}

#[derive(Default)]
pub struct Matcher {
    clients: HashMap<Serial, Client>,
    ups: HashMap<Serial, Up>,
    /// Joined upstream requests whose client request it still keeps: upstream → client.
    owners: HashMap<Serial, Serial>,
    /// Id-less client requests not joined nor answered, by line: serials, in the order read
    /// (ordered sets, so that one leaving costs a log, not a scan).
    pending: HashMap<Line, BTreeSet<Serial>>,
    /// Open client requests by (tgid, id); `true` once the id was seen twice.
    ids: HashMap<(u32, RequestId), (Vec<Serial>, bool)>,
    recent: RecentIds,
    hasher: RandomState,
    affinity: HashMap<u32, Affinity>,
    /// Groups only threads could decide, waiting for their process's evidence: a client of
    /// each, its process, and since when.
    parked: Vec<(Serial, u32, u64)>,
    /// Parked groups whose process settled, decided at the next call that can.
    reparked: Vec<Serial>,
    /// Per process: times of upstream traffic no join accounts for.
    unaccounted: HashMap<u32, BTreeMap<u64, u32>>,
    decisions: Vec<Decision>,
}

impl Matcher {
    /// A client request's header block was read, completed by the read at `read`.
    pub fn client(
        &mut self,
        serial: Serial,
        line: Line,
        id: Option<Result<RequestId, BadId>>,
        read: At,
    ) -> IdVerdict {
        let mut verdict = IdVerdict::Ok;
        let id = match id {
            Some(Err(BadId)) => return IdVerdict::Bad,
            Some(Ok(id)) => {
                let key = self.id_key(line.tgid, &id);
                let (open, duplicate) = self.ids.entry((line.tgid, id.clone())).or_default();
                if self.recent.contains(key) || !open.is_empty() {
                    *duplicate = true;
                    verdict = IdVerdict::Duplicate;
                    // The ones open with it cannot be told from it either.
                    for other in open.iter() {
                        if let Some(c) = self.clients.get_mut(other) {
                            c.duplicate = true;
                        }
                    }
                }
                open.push(serial);
                self.recent.insert(key);
                Some(id)
            }
            None => {
                self.pending.entry(line.clone()).or_default().insert(serial);
                None
            }
        };
        self.clients.insert(
            serial,
            Client {
                line,
                id,
                read,
                answered: None,
                ended: false,
                joined: None,
                upstream_answer_tid: None,
                ambiguous: false,
                duplicate: verdict == IdVerdict::Duplicate,
                ups: Vec::new(),
            },
        );
        verdict
    }

    /// An upstream request's header block was sent, its first send at `sent`.
    pub fn upstream(
        &mut self,
        serial: Serial,
        line: Line,
        id: Option<Result<RequestId, BadId>>,
        sent: At,
    ) -> Sent {
        let tgid = line.tgid;
        match id {
            Some(Err(BadId)) => return self.fail_at_send(tgid, sent.ns, Failure::BadId),
            Some(Ok(id)) => {
                if let Some((open, duplicate)) = self.ids.get(&(tgid, id.clone())) {
                    let &[client] = &open[..] else {
                        return Sent::Failed(Failure::DuplicateId);
                    };
                    if *duplicate {
                        return Sent::Failed(Failure::DuplicateId);
                    }
                    let c = &self.clients[&client];
                    return match (c.joined, c.answered) {
                        (None, _) => {
                            self.join(serial, sent, client, By::Id);
                            Sent::Joined(client, By::Id)
                        }
                        (Some(_), None) => Sent::Retry(client),
                        (Some(_), Some(_)) => self.fail_at_send(tgid, sent.ns, Failure::UnknownId),
                    };
                }
                if self.recent.contains(self.id_key(tgid, &id)) {
                    return self.fail_at_send(tgid, sent.ns, Failure::UnknownId);
                }
                // The proxy's own id: joined by its line.
            }
            None => {}
        }
        let Some(queue) = self.pending.get(&line) else {
            return self.fail_at_send(tgid, sent.ns, Failure::NoCandidate);
        };
        let cands: Vec<Serial> = queue
            .iter()
            .copied()
            .take_while(|s| self.clients[s].read.ns <= sent.ns)
            .take(MAX_CANDIDATES + 1)
            .collect();
        match cands.len() {
            0 => self.fail_at_send(tgid, sent.ns, Failure::NoCandidate),
            1 => {
                let touched = self.join(serial, sent, cands[0], By::OnlyCandidate);
                self.settle(touched);
                Sent::Joined(cands[0], By::OnlyCandidate)
            }
            n if n > MAX_CANDIDATES => self.fail_at_send(tgid, sent.ns, Failure::TooMany),
            _ => {
                for c in &cands {
                    self.clients.get_mut(c).expect("pending").ups.push(serial);
                }
                self.ups.insert(
                    serial,
                    Up {
                        tgid,
                        sent,
                        answered: None,
                        cands,
                    },
                );
                Sent::Waiting
            }
        }
    }

    /// The final response head of upstream request `serial` was read, completed at `at`.
    pub fn upstream_answered(&mut self, serial: Serial, at: At) {
        if let Some(up) = self.ups.get_mut(&serial) {
            up.answered.get_or_insert(at);
        } else if let Some(client) = self.owners.get(&serial)
            && let Some(c) = self.clients.get_mut(client)
        {
            c.upstream_answer_tid.get_or_insert(at.tid);
        }
    }

    /// The final response head of client request `serial` was written, from `at`: upstream
    /// requests whose response had not arrived by then were not its.
    pub fn client_answered(&mut self, serial: Serial, at: At) {
        let Some(c) = self.clients.get_mut(&serial) else {
            return;
        };
        if c.answered.is_some() {
            return;
        }
        c.answered = Some(at);
        let (line, ups) = (c.line.clone(), c.ups.clone());
        if let (Some((_, by)), Some(tid)) = (c.joined, c.upstream_answer_tid) {
            let tgid = line.tgid;
            self.witness(tgid, by, tid == at.tid);
        }
        self.unpend(&line, serial);
        let mut touched = Vec::new();
        for u in ups.clone() {
            let up = self.ups.get_mut(&u).expect("listed ups are undecided");
            if up.answered.is_none_or(|a| a.ns > at.ns) {
                up.cands.retain(|&s| s != serial);
                touched.push(u);
                let c = self.clients.get_mut(&serial).expect("answered client");
                c.ups.retain(|&x| x != u);
            }
        }
        self.settle(touched);
        self.decide_group_of(serial);
        // The groups it left may have waited only for it.
        self.decide_groups(&ups);
    }

    /// Client request `serial` is over (answered in full, or failed): where its join stands.
    /// Its bookkeeping goes once no undecided upstream request needs it.
    pub fn client_ended(&mut self, serial: Serial) -> Standing {
        let Some(c) = self.clients.get_mut(&serial) else {
            return Standing::Free;
        };
        c.ended = true;
        let (line, ups) = (c.line.clone(), c.ups.clone());
        self.unpend(&line, serial);
        self.decide_group_of(serial);
        self.decide_groups(&ups);
        let Some(c) = self.clients.get(&serial) else {
            return Standing::Free;
        };
        let standing = if c.duplicate {
            Standing::Duplicate
        } else if c.joined.is_some() {
            Standing::Joined
        } else if c.ambiguous {
            Standing::Ambiguous
        } else if !c.ups.is_empty() {
            Standing::Undecided
        } else {
            Standing::Free
        };
        if standing != Standing::Undecided {
            self.forget_client(serial);
        }
        standing
    }

    /// Upstream request `serial` stops being weighed (its connection stopped being followed):
    /// it joins nothing, and its candidates see it as traffic no join accounts for.
    pub fn abandon(&mut self, serial: Serial) {
        let Some(up) = self.ups.remove(&serial) else {
            return;
        };
        self.unaccounted(up.tgid, up.sent.ns);
        for c in &up.cands {
            if let Some(client) = self.clients.get_mut(c) {
                client.ups.retain(|&u| u != serial);
            }
        }
        for c in up.cands {
            self.decide_group_of(c);
            self.release(c);
        }
    }

    /// Records upstream traffic of `tgid` at `at` that no join accounts for.
    pub fn unaccounted(&mut self, tgid: u32, at: u64) {
        *self
            .unaccounted
            .entry(tgid)
            .or_default()
            .entry(at)
            .or_default() += 1;
    }

    /// Whether upstream traffic of `tgid` that no join accounts for fell in `[from, to]`.
    pub fn unaccounted_between(&self, tgid: u32, from: u64, to: u64) -> bool {
        from <= to
            && self
                .unaccounted
                .get(&tgid)
                .is_some_and(|t| t.range(from..=to).next().is_some())
    }

    /// Event time moved on to `now`: groups parked for [`PARK_NS`] are decided without threads.
    pub fn tick(&mut self, now: u64) {
        for c in std::mem::take(&mut self.reparked) {
            self.decide_group(c, false);
        }
        let due: Vec<Serial> = self
            .parked
            .iter()
            .filter(|&&(_, _, since)| since.saturating_add(PARK_NS) <= now)
            .map(|&(c, _, _)| c)
            .collect();
        self.parked
            .retain(|&(_, _, since)| since.saturating_add(PARK_NS) > now);
        for c in due {
            self.decide_group(c, false);
        }
    }

    /// Decides every parked group now (the session ends).
    pub fn unpark_all(&mut self) {
        let reparked = std::mem::take(&mut self.reparked);
        for c in reparked.into_iter().chain(
            std::mem::take(&mut self.parked)
                .into_iter()
                .map(|(c, _, _)| c),
        ) {
            self.decide_group(c, false);
        }
    }

    /// Decisions made since the last call, in order.
    pub fn take(&mut self) -> Vec<Decision> {
        std::mem::take(&mut self.decisions)
    }

    /// Forgets unaccounted traffic before `horizon` (no open request reaches back that far).
    pub fn prune(&mut self, horizon: u64) {
        for times in self.unaccounted.values_mut() {
            *times = times.split_off(&horizon);
        }
        self.unaccounted.retain(|_, t| !t.is_empty());
    }

    /// Undecided upstream requests.
    pub fn undecided(&self) -> usize {
        self.ups.len()
    }

    /// Client requests it still keeps.
    pub fn clients(&self) -> usize {
        self.clients.len()
    }

    /// Joins decided without threads, over all processes: how many kept their request on one
    /// thread, and how many did not.
    pub fn affinity(&self) -> (u64, u64) {
        self.affinity
            .values()
            .fold((0, 0), |(k, m), a| (k + a.kept, m + a.moved))
    }

    /// Whether `tgid` has shown it keeps a request on one thread.
    pub fn thread_affine(&self, tgid: u32) -> bool {
        self.affinity
            .get(&tgid)
            .is_some_and(|a| a.moved == 0 && a.kept >= AFFINITY_EVIDENCE)
    }

    /// Whether `tgid` may yet show it keeps a request on one thread: no join moved, not
    /// enough evidence yet.
    fn affinity_open(&self, tgid: u32) -> bool {
        self.affinity
            .get(&tgid)
            .is_none_or(|a| a.moved == 0 && a.kept < AFFINITY_EVIDENCE)
    }

    fn id_key(&self, tgid: u32, id: &str) -> u64 {
        // Keyed by a per-session random hash: no one can make two ids collide on purpose.
        self.hasher.hash_one((tgid, id))
    }

    /// A join decided `by` some rule kept its request on one thread (`kept`) or not. Joins
    /// decided by threads are not evidence for themselves.
    fn witness(&mut self, tgid: u32, by: By, kept: bool) {
        if by == By::Thread {
            return;
        }
        let a = self.affinity.entry(tgid).or_default();
        let was_open = a.moved == 0 && a.kept < AFFINITY_EVIDENCE;
        if kept {
            a.kept += 1;
        } else {
            a.moved += 1;
        }
        if was_open && !self.affinity_open(tgid) {
            // Settled either way: the groups that waited for it can be decided.
            let (ready, rest): (Vec<_>, Vec<_>) =
                self.parked.drain(..).partition(|&(_, t, _)| t == tgid);
            self.parked = rest;
            self.reparked.extend(ready.into_iter().map(|(c, _, _)| c));
        }
    }

    fn fail_at_send(&mut self, tgid: u32, at: u64, why: Failure) -> Sent {
        self.unaccounted(tgid, at);
        Sent::Failed(why)
    }

    fn unpend(&mut self, line: &Line, serial: Serial) {
        if let Some(q) = self.pending.get_mut(line) {
            q.remove(&serial);
            if q.is_empty() {
                self.pending.remove(line);
            }
        }
    }

    /// Upstream request `up`, sent at `sent`, is `client`'s: the client leaves every other
    /// candidate list (returned, to settle).
    fn join(&mut self, up: Serial, sent: At, client: Serial, by: By) -> Vec<Serial> {
        let c = self.clients.get_mut(&client).expect("joined client");
        c.joined = Some((up, by));
        let others = std::mem::take(&mut c.ups);
        let (line, read_tid) = (c.line.clone(), c.read.tid);
        self.owners.insert(up, client);
        self.witness(line.tgid, by, read_tid == sent.tid);
        self.unpend(&line, client);
        let mut touched = Vec::new();
        for u in others {
            if u != up
                && let Some(other) = self.ups.get_mut(&u)
            {
                other.cands.retain(|&s| s != client);
                touched.push(u);
            }
        }
        touched
    }

    /// Joins undecided upstream request `u` to `client`, decided `by` a rule after it was sent.
    fn decide_join(&mut self, u: Serial, client: Serial, by: By) -> Vec<Serial> {
        let up = self.ups.remove(&u).expect("undecided");
        let touched = self.join(u, up.sent, client, by);
        let c = self.clients.get_mut(&client).expect("joined client");
        if let Some(a) = up.answered {
            c.upstream_answer_tid = Some(a.tid);
            if let Some(answered) = c.answered {
                let tgid = up.tgid;
                self.witness(tgid, by, a.tid == answered.tid);
            }
        }
        self.decisions.push(Decision::Joined {
            upstream: u,
            client,
            by,
        });
        touched
    }

    /// Decides the group of each of `ups` still undecided, if it is final.
    fn decide_groups(&mut self, ups: &[Serial]) {
        for u in ups {
            if let Some(&c) = self.ups.get(u).and_then(|up| up.cands.first()) {
                self.decide_group_of(c);
            }
        }
    }

    /// Joins every undecided upstream request in `touched` (and what that touches) left with
    /// one candidate; fails those left with none; then decides the groups they are in, which
    /// may have waited only for the candidates they lost.
    fn settle(&mut self, mut touched: Vec<Serial>) {
        let mut seen = Vec::new();
        while let Some(u) = touched.pop() {
            seen.push(u);
            let Some(up) = self.ups.get(&u) else {
                continue;
            };
            match up.cands[..] {
                [client] => {
                    touched.extend(self.decide_join(u, client, By::Time));
                    self.release(client);
                }
                [] => {
                    let up = self.ups.remove(&u).expect("present");
                    self.unaccounted(up.tgid, up.sent.ns);
                    self.decisions.push(Decision::Failed {
                        upstream: u,
                        why: Failure::Orphaned,
                    });
                }
                _ => {}
            }
        }
        self.decide_groups(&seen);
    }

    /// A client that ended while undecided and is now decided: its standing was said by a
    /// decision; its bookkeeping can go.
    fn release(&mut self, client: Serial) {
        if self
            .clients
            .get(&client)
            .is_some_and(|c| c.ended && c.ups.is_empty())
        {
            self.forget_client(client);
        }
    }

    fn forget_client(&mut self, serial: Serial) {
        let Some(c) = self.clients.remove(&serial) else {
            return;
        };
        if let Some((up, _)) = c.joined {
            self.owners.remove(&up);
        }
        if let Some(id) = c.id {
            let key = (c.line.tgid, id);
            if let Some((open, _)) = self.ids.get_mut(&key) {
                open.retain(|&s| s != serial);
                if open.is_empty() {
                    self.ids.remove(&key);
                }
            }
        }
    }

    /// Once every client request of `serial`'s group was answered or ended, nothing can change
    /// its candidates any more: decides what the times force, then what the threads do in a
    /// process that keeps requests on one thread, and the rest as ambiguous.
    fn decide_group_of(&mut self, serial: Serial) {
        for c in std::mem::take(&mut self.reparked) {
            self.decide_group(c, false);
        }
        self.decide_group(serial, true);
    }

    /// [`Matcher::decide_group_of`]; `may_park`: a group only threads could decide, in a
    /// process that has not yet shown whether it keeps requests on one thread, waits.
    fn decide_group(&mut self, serial: Serial, may_park: bool) {
        if self.clients.get(&serial).is_none_or(|c| c.ups.is_empty()) {
            return;
        }
        let Some((clients, ups)) = self.group(serial) else {
            return;
        };
        let tgid = self.ups[&ups[0]].tgid;
        if may_park && self.affinity_open(tgid) {
            let times = forced(&clients, &ups, |u| self.ups[&u].cands.clone());
            if times.ups.iter().any(|(_, owner)| owner.is_none()) {
                let since = clients
                    .iter()
                    .filter_map(|c| self.clients[c].answered.map(|a| a.ns))
                    .max()
                    .unwrap_or(0);
                if !self.parked.iter().any(|&(c, _, _)| clients.contains(&c)) {
                    self.parked.push((serial, tgid, since));
                }
                return;
            }
        }
        let mut open_clients = clients.clone();
        let mut open_ups = ups.clone();
        for by in [By::Time, By::Thread] {
            if by == By::Thread && !self.thread_affine(tgid) {
                break;
            }
            let owners = match by {
                By::Time => forced(&open_clients, &open_ups, |u| self.ups[&u].cands.clone()).ups,
                _ => self.by_thread(&open_clients, &open_ups),
            };
            for (u, owner) in owners {
                if let Some(client) = owner {
                    self.decide_join(u, client, by);
                }
            }
            open_ups.retain(|u| self.ups.contains_key(u));
            open_clients.retain(|c| self.clients[c].joined.is_none());
        }
        // What is left: the options no rule narrowed to one.
        let left = forced(&open_clients, &open_ups, |u| self.ups[&u].cands.clone());
        for u in open_ups {
            self.ups.remove(&u);
            self.decisions.push(Decision::Failed {
                upstream: u,
                why: Failure::Ambiguous,
            });
        }
        for (client, free) in left.clients {
            let c = self.clients.get_mut(&client).expect("group client");
            c.ups.clear();
            let line = c.line.clone();
            if free {
                self.decisions.push(Decision::Free(client));
            } else {
                c.ambiguous = true;
                self.unpend(&line, client);
                self.decisions.push(Decision::Ambiguous(client));
            }
        }
        for client in clients {
            self.release(client);
        }
    }

    /// In a process that keeps a request on one thread: the owners the threads force. A
    /// candidate read (or answered) on another thread than the upstream request was sent (or
    /// its answer read) is dropped; then, on each thread, if pairing the upstream requests and
    /// the client requests in the order they were sent and read, and in the order their
    /// answers came, gives one and the same assignment, that is it.
    fn by_thread(&self, clients: &[Serial], ups: &[Serial]) -> Vec<(Serial, Option<Serial>)> {
        let same_thread = |u: Serial, c: Serial| {
            let (up, client) = (&self.ups[&u], &self.clients[&c]);
            up.sent.tid == client.read.tid
                && match (up.answered, client.answered) {
                    (Some(a), Some(b)) => a.tid == b.tid,
                    _ => true,
                }
        };
        let cands = |u: Serial| -> Vec<Serial> {
            self.ups[&u]
                .cands
                .iter()
                .copied()
                .filter(|&c| same_thread(u, c))
                .collect()
        };
        let mut owners = forced(clients, ups, cands).ups;
        let decided: HashSet<Serial> = owners.iter().filter_map(|&(_, c)| c).collect();
        let mut by_tid: BTreeMap<u32, (Vec<Serial>, Vec<Serial>)> = BTreeMap::new();
        for &(u, owner) in &owners {
            if owner.is_none() {
                by_tid.entry(self.ups[&u].sent.tid).or_default().0.push(u);
            }
        }
        for &c in clients {
            if !decided.contains(&c) {
                let tid = self.clients[&c].read.tid;
                if let Some(entry) = by_tid.get_mut(&tid) {
                    entry.1.push(c);
                }
            }
        }
        for (us, cs) in by_tid.into_values() {
            let all_back = us.iter().all(|u| self.ups[u].answered.is_some())
                && cs.iter().all(|c| self.clients[c].answered.is_some());
            if us.len() != cs.len() || !all_back {
                continue;
            }
            let order = |mut v: Vec<Serial>, key: &dyn Fn(Serial) -> Option<u64>| {
                v.sort_by_key(|&s| key(s));
                v
            };
            let sent = order(us.clone(), &|u| Some(self.ups[&u].sent.ns));
            let read = order(cs.clone(), &|c| Some(self.clients[&c].read.ns));
            let back = order(us.clone(), &|u| self.ups[&u].answered.map(|a| a.ns));
            let answered = order(cs, &|c| self.clients[&c].answered.map(|a| a.ns));
            let pairs: Vec<(Serial, Serial)> = sent.iter().copied().zip(read).collect();
            let agree = pairs.iter().all(|&(u, c)| {
                back.iter().position(|&x| x == u) == answered.iter().position(|&x| x == c)
            }) && pairs.iter().all(|&(u, c)| cands(u).contains(&c));
            if agree {
                for (u, c) in pairs {
                    if let Some(slot) = owners.iter_mut().find(|(x, _)| *x == u) {
                        slot.1 = Some(c);
                    }
                }
            }
        }
        owners
    }

    /// The undecided group `serial` is in, if every client of it was answered or ended; the
    /// group as given up on (all ambiguous) when it grew past [`MAX_GROUP`].
    fn group(&self, serial: Serial) -> Option<(Vec<Serial>, Vec<Serial>)> {
        let mut clients = vec![serial];
        let mut ups = Vec::new();
        let mut seen_c: HashSet<Serial> = HashSet::from([serial]);
        let mut seen_u: HashSet<Serial> = HashSet::new();
        let mut i = 0;
        while i < clients.len() {
            let c = &self.clients[&clients[i]];
            if c.answered.is_none() && !c.ended && clients.len() + ups.len() <= MAX_GROUP {
                return None;
            }
            for &u in &c.ups {
                if seen_u.insert(u) {
                    ups.push(u);
                    for &other in &self.ups[&u].cands {
                        if seen_c.insert(other) {
                            clients.push(other);
                        }
                    }
                }
            }
            i += 1;
        }
        Some((clients, ups))
    }
}

#[cfg(test)]
mod tests;
