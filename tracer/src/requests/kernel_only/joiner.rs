//! Joins a proxy's data syscalls into proxied HTTP/1.1 exchanges (`docs/model.md`,
//! "Kernel-only mode").
//!
//! Input: [`Data`] records in exit-timestamp order, one per data syscall that moved bytes, and
//! [`Joiner::opened`] when the kernel says an fd is a new connection (accept, connect).
//! [`Joiner::push`] answers, per record, which exchange it belongs to ([`Assignment`]);
//! finished exchanges and the ones that cannot be finished come out of [`Joiner::take`] as
//! [`Output`]s, in the order they were decided.
//!
//! - A connection is a `(tgid, fd)`, with a byte stream each way ([`framer`](super::framer)).
//!   Its state lives from the accept or connect that made it (or its first bytes) to the next
//!   one on that fd: no byte and no framing state crosses from one connection to the next.
//! - A connection whose first bytes *received* form an HTTP/1.x request line is a **client
//!   connection** (the proxy is the server); one whose first bytes *sent* form a request line
//!   an **upstream connection**. Anything else is ignored after one look at its first bytes,
//!   until a chunk starts with a complete request line.
//! - Each client request and each upstream request gets a serial. Which client request an
//!   upstream request was sent for is the [`Matcher`]'s to say (ids, request lines, and the
//!   order of answers); an upstream response belongs to the upstream request in flight on its
//!   connection (one at a time on HTTP/1.1), a client response to the client request before it.
//! - Invariant: every client request whose header block was parsed ([`Counts::client_requests`])
//!   ends as exactly one [`Output`] carrying its serial: an [`Exchange`] when the last byte of
//!   its response was sent and its join was decided, or an [`Incomplete`] with a [`Reason`].
//!   An upstream request ends joined (its syscalls listed in its client request's output) or
//!   as an [`Incomplete`] without a client fd ([`Reason::NotJoined`]).
//! - Memory is bounded by settings, never by traffic: a header block under construction by
//!   [`MAX_HEAD`](super::framer::MAX_HEAD) bytes and [`MAX_HEAD_CALLS`] syscalls, an exchange
//!   by [`MAX_CALLS`] syscalls, all of them by [`MAX_HELD_CALLS`], open client requests by
//!   [`MAX_OPEN`]; connections idle for [`CONN_IDLE_NS`] are dropped. What goes over a cap ends
//!   incomplete with the reason, and is counted.
//!
//! Limits (by design, reported, never guessed): only each syscall's first `DATA_BYTES` bytes
//! are seen, so a header block or chunk-size line past them is [`Unsupported`]; a
//! close-delimited response ends only when its connection is seen to end (the fd's next
//! accept, connect or request line, [`RESPONSE_TIMEOUT_NS`] of silence, or the session's end).

use std::collections::{BTreeMap, HashMap};

use super::framer::{Body, Break, Ev, Framer};
use super::matcher::{At, By, Decision, Failure, IdVerdict, Line, Matcher, Sent, Standing};
use super::wire::{self, Class, Framing, Head, RequestId, Start};
use crate::events::data::{Data, Direction};

/// An open exchange with no syscall for this long (event time) ends as
/// [`Reason::NoResponse`] (or, when its client response was close-delimited and already being
/// sent, as finished: the silence is taken as the close).
pub const RESPONSE_TIMEOUT_NS: u64 = 10_000_000_000;
/// A connection with no syscall for this long (event time) is forgotten.
pub const CONN_IDLE_NS: u64 = 60_000_000_000;
/// How often (event time) timeouts and idle connections are looked for.
pub const SWEEP_NS: u64 = 1_000_000_000;
/// Syscalls one header block may take; more is [`Unsupported::HeadInTooManyReads`].
pub const MAX_HEAD_CALLS: usize = 256;
/// Syscalls one exchange keeps (its four messages); more ends it incomplete.
pub const MAX_CALLS: usize = 16_384;
/// Syscalls kept across all exchanges not yet out; past it, the exchange that would add one
/// ends incomplete.
pub const MAX_HELD_CALLS: usize = 1 << 20;
/// Client requests open at once; a new one past it ends incomplete at once.
pub const MAX_OPEN: usize = 1 << 16;

/// What a syscall did for its exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Role {
    /// Received bytes of the client's request (header block or body) on the client connection.
    ClientRequest,
    /// Sent bytes of the request on the upstream connection.
    UpstreamRequest,
    /// Received bytes of the upstream's response (interim 1xx responses included).
    UpstreamResponse,
    /// Sent bytes of the response on the client connection (interim 1xx responses included).
    ClientResponse,
}

/// One data syscall, as an exchange lists it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Syscall {
    /// Position of its record in the pushed stream (1 for the first [`Joiner::push`]).
    pub seq: u64,
    pub role: Role,
    pub tid: u32,
    pub fd: u32,
    /// `tracer_ebpf::abi::syscall::*`.
    pub syscall: u16,
    pub enter_ns: u64,
    pub exit_ns: u64,
    /// Bytes the syscall moved (all of them, not only this exchange's).
    pub len: u64,
}

/// What the joiner knows of a proxied request, whether it ended as an [`Exchange`] or as an
/// [`Incomplete`] (then as far as it was known).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Request {
    /// Unique per [`Joiner`], given when the request's header block was parsed; what
    /// [`Assignment::To`] names.
    pub serial: u64,
    pub tgid: u32,
    /// The client connection's remote port, when the kernel said it ([`Joiner::push`]).
    pub client_port: Option<u16>,
    /// The upstream connection its request was sent on (the last one, when the proxy retried
    /// it on another: `syscalls` then hold both attempts); `None` when no upstream request
    /// joined it.
    pub upstream_fd: Option<u32>,
    /// Serials of the upstream requests joined to it (records answered with them are its).
    pub upstreams: Vec<u64>,
    /// The `x-request-id` value (client's, else the upstream request's), OWS trimmed.
    pub request_id: Option<RequestId>,
    /// Of the request line.
    pub method: String,
    pub target: String,
    /// Final status of the client response.
    pub status: Option<u16>,
    /// Final status of the upstream response, when one was parsed.
    pub upstream_status: Option<u16>,
    /// Every syscall that moved a byte of its messages, in push order (at most [`MAX_CALLS`]).
    pub syscalls: Vec<Syscall>,
}

impl Request {
    fn parsed(serial: u64, tgid: u32, method: &str, target: &str) -> Self {
        Request {
            serial,
            tgid,
            client_port: None,
            upstream_fd: None,
            upstreams: Vec::new(),
            request_id: None,
            method: method.to_owned(),
            target: target.to_owned(),
            status: None,
            upstream_status: None,
            syscalls: Vec::new(),
        }
    }

    /// [`id_key`] of `request_id`.
    pub fn key(&self) -> Option<u64> {
        self.request_id.as_deref().map(id_key)
    }

    fn line(&self) -> Line {
        Line {
            tgid: self.tgid,
            method: self.method.as_str().into(),
            target: self.target.as_str().into(),
        }
    }
}

/// A proxied request whose client response's last byte was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    pub client_fd: u32,
    pub request: Request,
}

/// A client request (or an unjoined upstream request) that did not end as an [`Exchange`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    pub reason: Reason,
    /// `None` only for [`Reason::NotJoined`] (an upstream request, the request's `syscalls`
    /// holding its sends).
    pub client_fd: Option<u32>,
    pub request: Request,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Reason {
    /// An upstream request no client request could be joined to.
    NotJoined(Failure),
    /// A client request among identical ones in flight together whose upstream request
    /// nothing told.
    Ambiguous,
    /// No upstream request joined it, but upstream traffic of its process that no join
    /// accounts for fell inside it: it may have been its.
    UnjoinedUpstream,
    /// Its `x-request-id` was on another client request of its process, open or recent.
    DuplicateId,
    /// Its `x-request-id` is not 1–128 visible ASCII characters.
    BadId,
    /// No syscall of the exchange for [`RESPONSE_TIMEOUT_NS`] before its response finished.
    NoResponse,
    /// Its connection ended (a new accept, connect or request line on its fd) first.
    Reset,
    /// Its connection (client or upstream) hit something the joiner does not follow.
    Unsupported(Unsupported),
    /// More than [`MAX_CALLS`] syscalls, or the [`MAX_HELD_CALLS`] budget ran out.
    TooManySyscalls,
    /// It arrived while [`MAX_OPEN`] client requests were open.
    TooManyOpen,
    /// [`Joiner::finish`] found it open.
    SessionEnded,
}

/// What the joiner does not follow; connections hitting it are counted by kind
/// ([`Counts::unsupported`]) and their open exchanges end as [`Reason::Unsupported`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Unsupported {
    /// A client request received before the previous one's response was finished.
    Pipelined,
    /// HTTP/2 (prior-knowledge preface `PRI * HTTP/2.0`).
    Http2,
    /// TLS (first byte 0x16, a handshake record).
    Tls,
    /// A header block (or a message start) past the captured prefix of a syscall.
    TruncatedHead,
    /// A chunk-size or trailer line past the captured prefix of a syscall.
    TruncatedChunk,
    /// Not a well-formed HTTP/1.x message where one should start.
    Malformed,
    /// A header block longer than `framer::MAX_HEAD`.
    HeadTooLarge,
    /// More headers than `wire::MAX_HEADERS`.
    TooManyHeaders,
    /// A header block over more than [`MAX_HEAD_CALLS`] syscalls.
    HeadInTooManyReads,
    /// 101 Switching Protocols or a 2xx answer to CONNECT: no longer HTTP/1.1 after it.
    Upgrade,
}

/// What [`Joiner::take`] and [`Joiner::finish`] return, in decision order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Output {
    Exchange(Exchange),
    Incomplete(Incomplete),
}

/// The words incomplete.csv gives each reason.
impl std::fmt::Display for Reason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = match self {
            Reason::NotJoined(why) => match why {
                Failure::UnknownId => {
                    "upstream request with an x-request-id no open client request had"
                }
                Failure::NoCandidate => "upstream request with no client request like it pending",
                Failure::Ambiguous => {
                    "upstream request among identical ones that could not be told apart"
                }
                Failure::TooMany => {
                    "upstream request with over 64 identical client requests pending"
                }
                Failure::DuplicateId => "upstream request with a duplicate id",
                Failure::BadId => "upstream request with an unusable x-request-id",
                Failure::Orphaned => "upstream request answered after every client request like it",
            },
            Reason::Ambiguous => {
                "ambiguous: identical requests in flight together whose upstream could not be told"
            }
            Reason::UnjoinedUpstream => "unjoined upstream traffic during it",
            Reason::DuplicateId => "duplicate id",
            Reason::BadId => "x-request-id not 1-128 visible ASCII characters",
            Reason::NoResponse => "no response within 10 s",
            Reason::Reset => "connection reused before the response",
            Reason::Unsupported(kind) => return write!(f, "unsupported: {}", kind.name()),
            Reason::TooManySyscalls => "over the syscalls kept per request",
            Reason::TooManyOpen => "over the open requests kept",
            Reason::SessionEnded => "still open at end",
        };
        f.write_str(s)
    }
}

impl Unsupported {
    pub fn name(self) -> &'static str {
        match self {
            Unsupported::Pipelined => "pipelined",
            Unsupported::Http2 => "HTTP/2",
            Unsupported::Tls => "TLS",
            Unsupported::TruncatedHead => "header block past the bytes captured",
            Unsupported::TruncatedChunk => "chunk size past the bytes captured",
            Unsupported::Malformed => "not HTTP/1.x",
            Unsupported::HeadTooLarge => "header block over 64 KiB",
            Unsupported::TooManyHeaders => "over 128 headers",
            Unsupported::HeadInTooManyReads => "header block over 256 syscalls",
            Unsupported::Upgrade => "protocol upgrade",
        }
    }
}

impl From<Break> for Unsupported {
    fn from(b: Break) -> Self {
        match b {
            Break::TruncatedHead => Unsupported::TruncatedHead,
            Break::TruncatedChunk => Unsupported::TruncatedChunk,
            Break::Malformed => Unsupported::Malformed,
            Break::HeadTooLarge => Unsupported::HeadTooLarge,
            Break::TooManyHeaders => Unsupported::TooManyHeaders,
        }
    }
}

impl Output {
    pub fn serial(&self) -> u64 {
        self.request().serial
    }

    pub fn request(&self) -> &Request {
        match self {
            Output::Exchange(e) => &e.request,
            Output::Incomplete(i) => &i.request,
        }
    }
}

/// The per-record answer of [`Joiner::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// Not part of any followed exchange.
    None,
    /// Part of a header block not complete yet: its exchange is not known yet. The record
    /// (by `seq`) will be listed in the `syscalls` of the [`Output`] it ends in, if any.
    Deferred,
    /// Bytes of the request `serial` (the first one when it moved bytes of two): a client
    /// request, or an upstream request, which lists it in its own output or in that of the
    /// client request it joins ([`Request::upstreams`]).
    To { serial: u64, role: Role },
}

/// How upstream requests were joined.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Joins {
    /// By `x-request-id`.
    pub by_id: u64,
    /// The only pending client request with its line.
    pub only_candidate: u64,
    /// Among several, by the order of the answers.
    pub by_time: u64,
    /// Among several, by threads, in a process that keeps a request on one thread.
    pub by_thread: u64,
}

/// Counters over the whole stream.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Counts {
    /// Records pushed.
    pub records: u64,
    /// Client request header blocks parsed; each ends as exactly one [`Output`] (the invariant).
    pub client_requests: u64,
    /// Upstream request header blocks parsed.
    pub upstream_requests: u64,
    pub exchanges: u64,
    pub incompletes: u64,
    pub joins: Joins,
    /// Times a connection was found unsupported, by kind (a connection counts again after it
    /// resynchronised and hit it again).
    pub unsupported: BTreeMap<Unsupported, u64>,
    /// Connections forgotten after [`CONN_IDLE_NS`] without a syscall.
    pub idle_dropped: u64,
    /// Connections restarted because the kernel said their fd was a new connection.
    pub reopened: u64,
}

impl Joins {
    fn count(&mut self, by: By) {
        *match by {
            By::Id => &mut self.by_id,
            By::OnlyCandidate => &mut self.only_candidate,
            By::Time => &mut self.by_time,
            By::Thread => &mut self.by_thread,
        } += 1;
    }
}

/// The `u64` key of an `x-request-id`: the id itself when it is a decimal number that fits
/// in a `u64` (ASCII digits only, no sign), else its 64-bit FNV-1a hash (offset basis
/// 0xcbf29ce484222325, prime 0x100000001b3, over the id's bytes).
pub fn id_key(id: &str) -> u64 {
    if !id.is_empty()
        && id.bytes().all(|b| b.is_ascii_digit())
        && let Ok(n) = id.parse::<u64>()
    {
        return n;
    }
    id.bytes().fold(0xcbf2_9ce4_8422_2325, |h: u64, b| {
        (h ^ b as u64).wrapping_mul(0x0100_0000_01b3)
    })
}

/// How the kernel says an fd became a new connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Opened {
    Accepted,
    Connected,
}

/// The streaming joiner. See the module documentation.
#[derive(Default)]
pub struct Joiner {
    conns: HashMap<(u32, u32), Conn>,
    /// Client requests whose response is not finished.
    open: HashMap<u64, Open>,
    /// Client requests finished and waiting for the matcher's decision.
    deferred: HashMap<u64, Open>,
    /// Upstream requests not joined yet, or joined to a client request still open.
    ups: HashMap<u64, Up>,
    matcher: Matcher,
    out: Vec<Output>,
    serial: u64,
    seq: u64,
    now: u64,
    next_sweep: u64,
    counts: Counts,
    /// Syscalls held in `open`, `deferred` and `ups`.
    held_calls: usize,
    /// Set by [`Joiner::head`] when the header block just parsed ended at once (pipelined,
    /// unjoined upstream request): the answer for its records.
    ended_at_head: Option<u64>,
    /// The remote port of the record being pushed, for a client request it starts.
    client_port: Option<u16>,
}

/// A client request whose output is not decided.
struct Open {
    client_fd: u32,
    request: Request,
    /// Exit of its last syscall.
    last_ns: u64,
    /// Exit of the read that completed its header block.
    read_at: u64,
    /// Enter of the write of its final response head.
    answered_at: Option<u64>,
    /// Its response is close-delimited and under way: it ends when the connection is seen to
    /// end (fd reuse, silence, session end).
    until_close: bool,
    /// Why it ends incomplete whatever happens (a duplicate or unusable id, too many calls).
    doomed: Option<Reason>,
}

/// An upstream request.
struct Up {
    fd: u32,
    /// The client request it joined.
    owner: Option<u64>,
    /// Its syscalls until it joined.
    request: Request,
    last_ns: u64,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
enum Kind {
    /// No byte seen yet.
    #[default]
    Unknown,
    /// Not HTTP/1.x as far as seen.
    Ignored,
    Client,
    Upstream,
    /// Hit an [`Unsupported`] kind; waits for a request line.
    Unsupported,
}

#[derive(Default)]
struct Conn {
    kind: Kind,
    last_ns: u64,
    /// Which way its first bytes went since it began: `Send` is the proxy speaking first (an
    /// upstream side), whatever the protocol.
    first: Option<Direction>,
    recv: Side,
    send: Side,
    /// Client connection: its open client request. Upstream connection: the upstream request
    /// in flight on it. May be stale (ended); checked against the open sets.
    current: Option<u64>,
    /// A header block was parsed on it since it began.
    parsed: bool,
    /// Upstream connection: the last request sent was HEAD / CONNECT.
    head_request: bool,
    connect: bool,
}

/// One direction of a connection.
#[derive(Default)]
struct Side {
    framer: Framer,
    /// Whose message it is framing now.
    owner: Option<u64>,
    /// The syscalls that moved bytes of the header block under construction.
    head_calls: Vec<Syscall>,
}

impl Conn {
    /// Forgets all but when the fd was last seen, as `kind` now.
    fn restart(&mut self, kind: Kind) {
        *self = Conn {
            kind,
            last_ns: self.last_ns,
            ..Conn::default()
        };
    }

    fn side(&mut self, dir: Direction) -> &mut Side {
        match dir {
            Direction::Receive => &mut self.recv,
            Direction::Send => &mut self.send,
        }
    }

    /// The proxy spoke first on it: it is an upstream side, whatever it carries.
    fn upstream_side(&self) -> bool {
        self.first == Some(Direction::Send)
    }
}

impl Joiner {
    pub fn new() -> Joiner {
        Joiner::default()
    }

    pub fn counts(&self) -> &Counts {
        &self.counts
    }

    /// Connections with state (ignored fds included).
    pub fn connections(&self) -> usize {
        self.conns.len()
    }

    /// Client requests not yet out (open, or finished and waiting for their join).
    pub fn open(&self) -> usize {
        self.open.len() + self.deferred.len()
    }

    /// Joins decided without threads that kept their request on one thread, and that did not.
    pub fn affinity(&self) -> (u64, u64) {
        self.matcher.affinity()
    }

    /// Syscalls held for requests not yet out.
    pub fn held_calls(&self) -> usize {
        self.held_calls
    }

    /// The outputs decided since the last call.
    pub fn take(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
    }

    /// The `seq` the next record pushed gets (its syscall's [`Syscall::seq`]).
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// The kernel says `fd` of `tgid` is a new connection from `at` on (an accept returned it,
    /// or a connect was made on it): whatever was on it before has ended.
    pub fn opened(&mut self, tgid: u32, fd: u32, how: Opened, at: u64) {
        self.now = self.now.max(at);
        let mut conn = self.conns.remove(&(tgid, fd)).unwrap_or_default();
        if conn.kind != Kind::Unknown || conn.first.is_some() {
            self.counts.reopened += 1;
        }
        self.reset(&mut conn);
        conn.last_ns = self.now;
        // Who speaks first on it is the kernel's to say here, not the bytes'.
        conn.first = Some(match how {
            Opened::Accepted => Direction::Receive,
            Opened::Connected => Direction::Send,
        });
        self.conns.insert((tgid, fd), conn);
        self.settle();
    }

    /// Ends the session: every open exchange ends as [`Reason::SessionEnded`] (or, when its
    /// client response was close-delimited and being sent, as finished). Returns what
    /// [`Joiner::take`] would, with those.
    pub fn finish(&mut self) -> Vec<Output> {
        let mut serials: Vec<u64> = self.open.keys().copied().collect();
        serials.sort_unstable();
        for s in serials {
            let close = self.open[&s].until_close;
            self.end_open(s, (!close).then_some(Reason::SessionEnded));
        }
        // Every client request has ended, so the matcher decided every group (those waiting
        // for their process's threads now); what is left (nothing, by its invariant) is not
        // guessed at.
        self.matcher.unpark_all();
        self.settle();
        let mut ups: Vec<u64> = self
            .ups
            .iter()
            .filter(|(_, up)| up.owner.is_none())
            .map(|(&u, _)| u)
            .collect();
        ups.sort_unstable();
        for u in ups {
            self.fail_up(u, Failure::Ambiguous);
        }
        let mut deferred: Vec<u64> = self.deferred.keys().copied().collect();
        deferred.sort_unstable();
        for s in deferred {
            self.output_deferred(s, Some(Reason::Ambiguous));
        }
        self.ups.clear();
        self.conns.clear();
        self.take()
    }

    /// One record, in exit-timestamp order; `client_port`: the remote port of the socket it
    /// moved bytes on, if the kernel said it.
    pub fn push(&mut self, d: &Data, client_port: Option<u16>) -> Assignment {
        self.seq += 1;
        self.counts.records += 1;
        self.now = self.now.max(d.exit_ns);
        if self.now >= self.next_sweep {
            self.sweep();
            self.next_sweep = self.now.saturating_add(SWEEP_NS);
        }
        let key = (d.tgid, d.fd);
        let mut conn = self.conns.remove(&key).unwrap_or_default();
        conn.last_ns = self.now;
        let dir = d.direction();
        conn.first.get_or_insert(dir);
        self.client_port = client_port;
        let assignment = self.process(&mut conn, d, dir);
        self.unaccounted(&conn, d, dir);
        self.conns.insert(key, conn);
        self.settle();
        assignment
    }

    /// Traffic on an upstream side that no exchange follows: the matcher weighs it against
    /// client requests with no upstream request of their own.
    fn unaccounted(&mut self, conn: &Conn, d: &Data, dir: Direction) {
        if !conn.upstream_side() {
            return;
        }
        let counts = match conn.kind {
            Kind::Unsupported => true,
            // Only replies: a log socket only sends.
            Kind::Ignored => dir == Direction::Receive,
            _ => false,
        };
        if counts {
            self.matcher.unaccounted(d.tgid, d.exit_ns);
        }
    }

    fn process(&mut self, conn: &mut Conn, d: &Data, dir: Direction) -> Assignment {
        let class = wire::classify(&d.bytes);
        match conn.kind {
            Kind::Unknown => match class {
                Class::Request | Class::Maybe => Self::begin(conn, dir),
                Class::Http2 => {
                    self.unsupported(conn, Unsupported::Http2);
                    return Assignment::None;
                }
                Class::Tls => {
                    self.unsupported(conn, Unsupported::Tls);
                    return Assignment::None;
                }
                Class::Other => {
                    conn.kind = Kind::Ignored;
                    return Assignment::None;
                }
            },
            Kind::Ignored | Kind::Unsupported => {
                if class != Class::Request {
                    return Assignment::None;
                }
                Self::begin(conn, dir);
            }
            Kind::Client | Kind::Upstream => {
                if class == Class::Request && self.reused(conn, dir) {
                    self.reset(conn);
                    Self::begin(conn, dir);
                    conn.first = Some(dir);
                }
            }
        }
        self.feed(conn, d, dir)
    }

    /// A request line where this connection has none: the fd is another connection now
    /// (closed and reused unseen, or a header block abandoned).
    fn reused(&self, conn: &mut Conn, dir: Direction) -> bool {
        let requests_here = (conn.kind == Kind::Client) == (dir == Direction::Receive);
        let answered = self.live(conn.current).is_none();
        let side = conn.side(dir);
        if side.framer.at_start() {
            !requests_here
        } else if side.framer.in_head() {
            // Past the start line of a header block (a request line split after its first
            // bytes is a continuation, not a new request).
            side.framer.past_start_line()
        } else if side.framer.until_close() {
            // A close-delimited response only ends with its connection.
            true
        } else {
            // A request body cut short: its exchange already ended (answered early, or
            // failed), and the fd is a new connection.
            requests_here && conn.kind == Kind::Client && answered
        }
    }

    /// Starts `conn` afresh with the role its first request line gives it (who spoke first on
    /// the connection stays what it was).
    fn begin(conn: &mut Conn, dir: Direction) {
        let first = conn.first;
        conn.restart(match dir {
            Direction::Receive => Kind::Client,
            Direction::Send => Kind::Upstream,
        });
        conn.first = first;
    }

    /// The connection's fd is another connection now: what was on it cannot finish. (An
    /// upstream request cut short stays its client request's, which may still be answered by
    /// an error page or a retry, or its candidates' to weigh.)
    fn reset(&mut self, conn: &mut Conn) {
        if conn.kind == Kind::Client
            && let Some(s) = self.live(conn.current)
        {
            let close = self.open[&s].until_close;
            self.end_open(s, (!close).then_some(Reason::Reset));
        }
        conn.restart(Kind::Unknown);
    }

    fn unsupported(&mut self, conn: &mut Conn, kind: Unsupported) {
        *self.counts.unsupported.entry(kind).or_default() += 1;
        match conn.kind {
            Kind::Client => {
                if let Some(s) = self.live(conn.current) {
                    self.end_open(s, Some(Reason::Unsupported(kind)));
                }
            }
            Kind::Upstream => {
                if let Some(u) = conn.current {
                    match self.ups.get(&u).map(|up| up.owner) {
                        Some(Some(owner)) if self.open.contains_key(&owner) => {
                            self.end_open(owner, Some(Reason::Unsupported(kind)));
                        }
                        Some(None) => {
                            // Nobody's yet: its candidates will weigh its traffic.
                            self.matcher.abandon(u);
                            self.fail_up_as(u, Reason::Unsupported(kind));
                        }
                        _ => {}
                    }
                }
            }
            _ => {}
        }
        let first = conn.first;
        conn.restart(Kind::Unsupported);
        conn.first = first;
    }

    /// `serial` if it is a client request still open.
    fn live(&self, serial: Option<u64>) -> Option<u64> {
        serial.filter(|s| self.open.contains_key(s))
    }

    fn feed(&mut self, conn: &mut Conn, d: &Data, dir: Direction) -> Assignment {
        let role = match (conn.kind, dir) {
            (Kind::Client, Direction::Receive) => Role::ClientRequest,
            (Kind::Client, Direction::Send) => Role::ClientResponse,
            (_, Direction::Send) => Role::UpstreamRequest,
            (_, Direction::Receive) => Role::UpstreamResponse,
        };
        let call = Syscall {
            seq: self.seq,
            role,
            tid: d.tid,
            fd: d.fd,
            syscall: d.syscall,
            enter_ns: d.enter_ns,
            exit_ns: d.exit_ns,
            len: d.len,
        };
        let mut answer = Assignment::None;
        let mut pos = 0u64;
        let bytes = &d.bytes[..d.bytes.len().min(d.len as usize)];
        loop {
            let owner = conn.side(dir).owner;
            let before = pos;
            let ev = conn.side(dir).framer.step(bytes, d.len, &mut pos);
            if pos > before && !matches!(ev, Some(Ev::Head(_))) && !conn.side(dir).framer.in_head()
            {
                // Bytes of the message under way (body, chunk, or the end of it).
                if let Some(s) = owner {
                    self.attach(s, &call, &mut answer);
                }
            }
            match ev {
                None => {
                    let side = conn.side(dir);
                    if side.framer.in_head() {
                        if side.head_calls.last().map(|c| c.seq) != Some(call.seq) {
                            if side.head_calls.len() >= MAX_HEAD_CALLS {
                                self.unsupported(conn, Unsupported::HeadInTooManyReads);
                                return answer;
                            }
                            side.head_calls.push(call.clone());
                        }
                        if answer == Assignment::None {
                            answer = Assignment::Deferred;
                        }
                    }
                    return answer;
                }
                Some(Ev::End) => self.message_end(conn, dir),
                Some(Ev::Bad(why)) => {
                    if why == Break::Malformed && !conn.parsed {
                        // Looked like a request line at first, never was one: not HTTP.
                        conn.kind = Kind::Ignored;
                        conn.recv = Side::default();
                        conn.send = Side::default();
                    } else {
                        self.unsupported(conn, why.into());
                    }
                    return answer;
                }
                Some(Ev::Head(head)) => {
                    let mut calls = std::mem::take(&mut conn.side(dir).head_calls);
                    if calls.last().map(|c| c.seq) != Some(call.seq) {
                        calls.push(call.clone());
                    }
                    for c in &mut calls {
                        c.role = role;
                    }
                    conn.parsed = true;
                    let parsed = self.head(conn, d, dir, head, &calls);
                    if let Some(s) = self.ended_at_head.take()
                        && matches!(answer, Assignment::None | Assignment::Deferred)
                    {
                        answer = Assignment::To { serial: s, role };
                    }
                    match parsed {
                        Ok((owner, framing)) => {
                            if let Some(s) = owner {
                                for c in &calls {
                                    self.attach(s, c, &mut Assignment::Deferred);
                                }
                                if matches!(answer, Assignment::None | Assignment::Deferred) {
                                    answer = Assignment::To { serial: s, role };
                                }
                            }
                            let body = match framing {
                                Framing::Length(0) | Framing::None | Framing::Interim => Body::None,
                                Framing::Length(n) => Body::Length(n),
                                Framing::Chunked => Body::Chunked,
                                Framing::Close => Body::Close,
                                Framing::Upgrade => Body::None,
                            };
                            conn.side(dir).framer.body(body);
                            match framing {
                                Framing::Length(0) | Framing::None => self.message_end(conn, dir),
                                Framing::Close => {
                                    if let Some(o) = owner.and_then(|s| self.open.get_mut(&s))
                                        && role == Role::ClientResponse
                                    {
                                        o.until_close = true;
                                    }
                                }
                                Framing::Upgrade => {
                                    self.message_end(conn, dir);
                                    self.unsupported(conn, Unsupported::Upgrade);
                                    return answer;
                                }
                                _ => {}
                            }
                        }
                        Err(kind) => {
                            if let Some(s) = conn.side(dir).owner {
                                self.attach(s, &call, &mut answer);
                            }
                            self.unsupported(conn, kind);
                            return answer;
                        }
                    }
                }
            }
        }
    }

    /// Adds `call` to request `s` (a client request, or an upstream request: then to the
    /// client request it joined, if any) once, and makes it the answer if there is none yet.
    fn attach(&mut self, s: u64, call: &Syscall, answer: &mut Assignment) {
        let (target, named) = match self.ups.get(&s) {
            Some(up) => (up.owner.unwrap_or(s), s),
            None => (s, s),
        };
        let held = self.held_calls;
        let (request, last_ns, doomed) = if let Some(o) = self.open.get_mut(&target) {
            (&mut o.request, &mut o.last_ns, Some(&mut o.doomed))
        } else if let Some(o) = self.deferred.get_mut(&target) {
            (&mut o.request, &mut o.last_ns, Some(&mut o.doomed))
        } else if let Some(up) = self.ups.get_mut(&target) {
            (&mut up.request, &mut up.last_ns, None)
        } else {
            return;
        };
        *last_ns = (*last_ns).max(call.exit_ns);
        if !request
            .syscalls
            .iter()
            .rev()
            .take(4)
            .any(|c| c.seq == call.seq && c.role == call.role)
        {
            if request.syscalls.len() >= MAX_CALLS || held >= MAX_HELD_CALLS {
                if let Some(doomed) = doomed {
                    doomed.get_or_insert(Reason::TooManySyscalls);
                }
            } else {
                request.syscalls.push(call.clone());
                self.held_calls += 1;
            }
        }
        if matches!(answer, Assignment::None | Assignment::Deferred) {
            *answer = Assignment::To {
                serial: named,
                role: call.role,
            };
        }
    }

    /// A header block was parsed: whose message it starts and how its body is framed.
    fn head(
        &mut self,
        conn: &mut Conn,
        d: &Data,
        dir: Direction,
        head: Head,
        calls: &[Syscall],
    ) -> Result<(Option<u64>, Framing), Unsupported> {
        let malformed = |_| Unsupported::Malformed;
        match (conn.kind, dir, head.start) {
            (_, _, Start::Http2) => Err(Unsupported::Http2),
            (Kind::Client, Direction::Receive, Start::Request { method, target }) => {
                let framing = head.body.request_framing().map_err(malformed)?;
                if conn.send.framer.until_close() {
                    // The close-delimited response before ended with its connection.
                    conn.send = Side::default();
                }
                if let Some(prev) = self.live(conn.current) {
                    if self.open[&prev].until_close {
                        self.end_open(prev, None);
                    } else {
                        // Pipelined: this request is parsed, so it ends as one incomplete too.
                        let s = self.client_request(d, &method, &target, head.request_id);
                        for c in calls {
                            self.attach(s, c, &mut Assignment::None);
                        }
                        self.end_open(s, Some(Reason::Unsupported(Unsupported::Pipelined)));
                        self.ended_at_head = Some(s);
                        return Err(Unsupported::Pipelined);
                    }
                }
                let s = self.client_request(d, &method, &target, head.request_id);
                conn.current = Some(s);
                conn.recv.owner = Some(s);
                Ok((Some(s), framing))
            }
            (Kind::Client, Direction::Send, Start::Response { status }) => {
                let Some(s) = self.live(conn.current) else {
                    // A response to a request never seen (capture began mid-exchange): framed
                    // for its length, belonging to nobody.
                    conn.send.owner = None;
                    return Ok((None, head.body.response_framing(status, false, false)));
                };
                conn.send.owner = Some(s);
                let o = self.open.get_mut(&s).expect("live");
                let r = &mut o.request;
                let framing =
                    head.body
                        .response_framing(status, r.method == "HEAD", r.method == "CONNECT");
                if framing != Framing::Interim {
                    r.status = Some(status);
                    let first = calls.first().unwrap_or(&calls[calls.len() - 1]);
                    o.answered_at.get_or_insert(first.enter_ns);
                    let at = At {
                        ns: first.enter_ns,
                        tid: first.tid,
                    };
                    self.matcher.client_answered(s, at);
                }
                Ok((Some(s), framing))
            }
            (Kind::Upstream, Direction::Send, Start::Request { method, target }) => {
                let framing = head.body.request_framing().map_err(malformed)?;
                self.counts.upstream_requests += 1;
                if conn.recv.framer.until_close() {
                    conn.recv = Side::default();
                }
                conn.head_request = method == "HEAD";
                conn.connect = method == "CONNECT";
                self.serial += 1;
                let u = self.serial;
                let mut request = Request::parsed(u, d.tgid, &method, &target);
                request.upstream_fd = Some(d.fd);
                request.request_id = head.request_id.clone().and_then(Result::ok);
                self.ups.insert(
                    u,
                    Up {
                        fd: d.fd,
                        owner: None,
                        request,
                        last_ns: d.exit_ns,
                    },
                );
                for c in calls {
                    self.attach(u, c, &mut Assignment::None);
                }
                conn.current = Some(u);
                conn.send.owner = Some(u);
                let line = self.ups[&u].request.line();
                let first = &calls[0];
                let sent = At {
                    ns: first.enter_ns,
                    tid: first.tid,
                };
                match self.matcher.upstream(u, line, head.request_id, sent) {
                    Sent::Joined(client, by) => {
                        self.counts.joins.count(by);
                        self.joined(u, client);
                    }
                    Sent::Retry(client) => self.joined(u, client),
                    Sent::Waiting => {}
                    Sent::Failed(why) => {
                        self.fail_up(u, why);
                        self.ended_at_head = Some(u);
                        conn.send.owner = None;
                        return Ok((None, framing));
                    }
                }
                Ok((Some(u), framing))
            }
            (Kind::Upstream, Direction::Receive, Start::Response { status }) => {
                let owner = conn.current.filter(|u| self.ups.contains_key(u));
                conn.recv.owner = owner;
                let framing = head
                    .body
                    .response_framing(status, conn.head_request, conn.connect);
                if framing != Framing::Interim
                    && let Some(u) = owner
                {
                    let at = At {
                        ns: d.exit_ns,
                        tid: d.tid,
                    };
                    self.matcher.upstream_answered(u, at);
                    let up = self.ups.get_mut(&u).expect("owner");
                    up.request.upstream_status = Some(status);
                    if let Some(o) = up.owner.and_then(|c| self.open.get_mut(&c)) {
                        o.request.upstream_status = Some(status);
                    }
                }
                if framing == Framing::Upgrade {
                    // The client response (101 or 2xx) finishes the exchange, not this.
                    conn.current = None;
                }
                Ok((owner, framing))
            }
            _ => Err(Unsupported::Malformed),
        }
    }

    fn client_request(
        &mut self,
        d: &Data,
        method: &str,
        target: &str,
        id: Option<Result<RequestId, wire::BadId>>,
    ) -> u64 {
        self.serial += 1;
        self.counts.client_requests += 1;
        let s = self.serial;
        let mut request = Request::parsed(s, d.tgid, method, target);
        request.client_port = self.client_port;
        request.request_id = id.clone().and_then(Result::ok);
        if self.open.len() + self.deferred.len() >= MAX_OPEN {
            // Ends at once: nothing of it is kept, and its connection's bytes are nobody's.
            self.counts.incompletes += 1;
            self.out.push(Output::Incomplete(Incomplete {
                reason: Reason::TooManyOpen,
                client_fd: Some(d.fd),
                request,
            }));
            return s;
        }
        let read = At {
            ns: d.exit_ns,
            tid: d.tid,
        };
        let doomed = match self.matcher.client(s, request.line(), id, read) {
            IdVerdict::Ok => None,
            IdVerdict::Duplicate => Some(Reason::DuplicateId),
            IdVerdict::Bad => Some(Reason::BadId),
        };
        self.open.insert(
            s,
            Open {
                client_fd: d.fd,
                request,
                last_ns: d.exit_ns,
                read_at: d.exit_ns,
                answered_at: None,
                until_close: false,
                doomed,
            },
        );
        s
    }

    /// Upstream request `u` is client request `client`'s.
    fn joined(&mut self, u: u64, client: u64) {
        let Some(up) = self.ups.get_mut(&u) else {
            return;
        };
        up.owner = Some(client);
        let calls = std::mem::take(&mut up.request.syscalls);
        let (fd, id, status) = (
            up.fd,
            up.request.request_id.clone(),
            up.request.upstream_status,
        );
        let Some(o) = self
            .open
            .get_mut(&client)
            .or_else(|| self.deferred.get_mut(&client))
        else {
            // Its client request already ended (incomplete): the upstream request was its.
            self.held_calls -= calls.len();
            self.ups.remove(&u);
            return;
        };
        let r = &mut o.request;
        r.upstream_fd = Some(fd);
        r.upstreams.push(u);
        if r.request_id.is_none() {
            r.request_id = id;
        }
        if status.is_some() {
            r.upstream_status = status;
        }
        // Merged in push order, a record listed once: a sort and a pass, not a scan per call.
        let before = r.syscalls.len() + calls.len();
        r.syscalls.extend(calls);
        r.syscalls.sort_by_key(|c| (c.seq, c.role));
        r.syscalls.dedup_by_key(|c| (c.seq, c.role));
        self.held_calls -= before - r.syscalls.len();
        if r.syscalls.len() > MAX_CALLS {
            o.doomed.get_or_insert(Reason::TooManySyscalls);
        }
        o.last_ns = o.last_ns.max(self.ups[&u].last_ns);
    }

    /// Upstream request `u` joins nothing: out as incomplete with its syscalls.
    fn fail_up(&mut self, u: u64, why: Failure) {
        self.fail_up_as(u, Reason::NotJoined(why));
    }

    fn fail_up_as(&mut self, u: u64, reason: Reason) {
        let Some(up) = self.ups.remove(&u) else {
            return;
        };
        self.held_calls -= up.request.syscalls.len();
        self.counts.incompletes += 1;
        self.out.push(Output::Incomplete(Incomplete {
            reason,
            client_fd: None,
            request: up.request,
        }));
    }

    /// Acts on what the matcher decided since it was last asked.
    fn settle(&mut self) {
        loop {
            let decisions = self.matcher.take();
            if decisions.is_empty() {
                return;
            }
            for d in decisions {
                match d {
                    Decision::Joined {
                        upstream,
                        client,
                        by,
                    } => {
                        self.counts.joins.count(by);
                        self.joined(upstream, client);
                        if self.deferred.contains_key(&client) {
                            self.output_deferred(client, None);
                        }
                    }
                    Decision::Failed { upstream, why } => self.fail_up(upstream, why),
                    Decision::Free(client) => {
                        if self.deferred.contains_key(&client) {
                            let reason = self.free_reason(&self.deferred[&client]);
                            self.output_deferred(client, reason);
                        }
                    }
                    Decision::Ambiguous(client) => {
                        if self.deferred.contains_key(&client) {
                            self.output_deferred(client, Some(Reason::Ambiguous));
                        }
                    }
                }
            }
        }
    }

    /// A client request with no upstream request of its own is complete only if no upstream
    /// traffic nobody's join accounts for fell inside it.
    fn free_reason(&self, o: &Open) -> Option<Reason> {
        let to = o.answered_at.unwrap_or(o.last_ns);
        self.matcher
            .unaccounted_between(o.request.tgid, o.read_at, to)
            .then_some(Reason::UnjoinedUpstream)
    }

    /// The message in direction `dir` of `conn` ended.
    fn message_end(&mut self, conn: &mut Conn, dir: Direction) {
        match (conn.kind, dir) {
            (Kind::Client, Direction::Receive) => conn.recv.owner = None,
            (Kind::Client, Direction::Send) => {
                let owner = conn.send.owner.take();
                if let Some(s) = self.live(owner)
                    && self.open[&s].request.status.is_some()
                {
                    self.end_open(s, None);
                    conn.current = None;
                }
            }
            (_, Direction::Send) => conn.send.owner = None,
            (_, Direction::Receive) => {
                // One request in flight per upstream connection: none now.
                conn.recv.owner = None;
                if let Some(u) = conn.current.take()
                    && let Some(up) = self.ups.get(&u)
                    && let Some(owner) = up.owner
                    && !self.open.contains_key(&owner)
                    && !self.deferred.contains_key(&owner)
                {
                    self.ups.remove(&u);
                }
            }
        }
    }

    /// Open client request `s` is over: finished (`None`) or failed.
    fn end_open(&mut self, s: u64, failure: Option<Reason>) {
        let Some(mut o) = self.open.remove(&s) else {
            return;
        };
        if o.doomed.is_none() {
            o.doomed = failure;
        }
        // Waiting among the deferred while the matcher decides: a decision its end forces
        // (its upstream request joined now) finds it there.
        self.deferred.insert(s, o);
        let standing = self.matcher.client_ended(s);
        self.settle();
        let Some(o) = self.deferred.get(&s) else {
            return;
        };
        let reason = match standing {
            Standing::Joined => None,
            Standing::Free => self.free_reason(o),
            Standing::Ambiguous => Some(Reason::Ambiguous),
            Standing::Duplicate => Some(Reason::DuplicateId),
            Standing::Undecided if o.doomed.is_some() => None,
            Standing::Undecided => return,
        };
        self.output_deferred(s, reason);
    }

    fn output_deferred(&mut self, s: u64, reason: Option<Reason>) {
        if let Some(o) = self.deferred.remove(&s) {
            let reason = o.doomed.or(reason);
            self.output(o, reason);
        }
    }

    fn output(&mut self, o: Open, reason: Option<Reason>) {
        self.held_calls -= o.request.syscalls.len();
        for u in &o.request.upstreams {
            self.ups.remove(u);
        }
        self.out.push(match reason {
            None => {
                self.counts.exchanges += 1;
                Output::Exchange(Exchange {
                    client_fd: o.client_fd,
                    request: o.request,
                })
            }
            Some(reason) => {
                self.counts.incompletes += 1;
                Output::Incomplete(Incomplete {
                    reason,
                    client_fd: Some(o.client_fd),
                    request: o.request,
                })
            }
        });
    }

    fn sweep(&mut self) {
        let now = self.now;
        let mut expired: Vec<u64> = self
            .open
            .values()
            .filter(|o| o.last_ns.saturating_add(RESPONSE_TIMEOUT_NS) < now)
            .map(|o| o.request.serial)
            .collect();
        expired.sort_unstable();
        for s in expired {
            let close = self.open[&s].until_close;
            self.end_open(s, (!close).then_some(Reason::NoResponse));
        }
        let before = self.conns.len();
        self.conns
            .retain(|_, c| c.last_ns.saturating_add(CONN_IDLE_NS) >= now);
        self.counts.idle_dropped += (before - self.conns.len()) as u64;
        // Unaccounted traffic matters back to the oldest request still to be weighed.
        let horizon = self
            .open
            .values()
            .chain(self.deferred.values())
            .map(|o| o.read_at)
            .min()
            .unwrap_or(now);
        self.matcher.prune(horizon);
        self.matcher.tick(now);
    }
}

#[cfg(test)]
mod tests;
