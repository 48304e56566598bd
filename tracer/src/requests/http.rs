//! Kernel-only sessions (issue 20): join the data syscalls of a proxy (nginx, haproxy, caddy)
//! into proxied HTTP/1.1 exchanges, from the bytes alone.
//!
//! Input: [`Data`] records in exit-timestamp order, one per data syscall that moved bytes.
//! [`Joiner::push`] takes them one by one and answers, per record, which exchange it belongs
//! to ([`Assignment`]); finished exchanges and the ones that cannot be finished come out of
//! [`Joiner::take`] as [`Output`]s, in the order they were decided.
//!
//! The model (measured facts in `docs/kernel-only.md`):
//! - A connection is a `(tgid, fd)`, with a byte stream each way. fds are per process, so
//!   haproxy's threads sharing an idle server connection and caddy's several threads per
//!   request need nothing special: the thread only shows in each [`Syscall`]'s `tid`.
//! - A connection whose first bytes *received* form an HTTP/1.x request line is a **client
//!   connection** (the proxy is the server); one whose first bytes *sent* form a request line is
//!   an **upstream connection**. Anything else (log files, pipes, eventfds, non-HTTP sockets)
//!   is ignored after one look at its first bytes, until a chunk starts with a complete request
//!   line (fd reuse, or capture that began mid-message).
//! - Each direction is framed as RFC 9112 messages: start line and headers up to CRLFCRLF
//!   (possibly over several syscalls), then a body by Content-Length, chunked coding (sizes
//!   read from the captured bytes), or, for responses only, until the connection closes. Body
//!   bytes are skipped by counting `len`, so bodies beyond the captured prefix are fine; a
//!   header block or chunk-size line that is not inside the captured bytes is not guessed:
//!   the connection is marked [`Unsupported`] until a chunk starts with a request line again.
//! - Joining: a client request is joined to the upstream request with the same `x-request-id`
//!   in the same process (oldest not yet joined one first). Otherwise (no id, or an id no
//!   pending client request carried, e.g. one the proxy generated) it is joined to the single
//!   pending client request *without* an id of that process with the identical method and
//!   target, and to none when zero or several are pending ([`JoinFailure`]). Client requests
//!   with an id are never joined by request line: the proxies studied forward the id, so an
//!   upstream request without it (or with another) is not theirs. The upstream
//!   response on an upstream connection belongs to the last request sent on it (one request
//!   in flight per upstream connection). The client response is the next response sent on the
//!   client connection after its request.
//! - Invariant: every client request whose header block was parsed (counted in
//!   [`Counts::client_requests`]) ends as exactly one [`Output`] carrying its serial: an
//!   [`Exchange`] when the last byte of its client response was sent, or an [`Incomplete`]
//!   with a [`Reason`]. Upstream requests that join nothing end as an [`Incomplete`] without
//!   a client fd ([`Reason::NotJoined`]).
//! - Memory: per-connection state (a header block under construction is capped at
//!   [`MAX_HEAD`]) and the open exchanges; connections idle for [`CONN_IDLE_NS`] of event time
//!   are dropped ([`Counts::idle_dropped`]); exchanges with no syscall for
//!   [`RESPONSE_TIMEOUT_NS`] end as [`Reason::NoResponse`].
//!
//! Limits (by design, reported, never guessed):
//! - Only the first `DATA_BYTES` (512) bytes of a syscall are seen: a header block that
//!   does not end inside them (any header block over 512 B read or written in one syscall,
//!   e.g. nginx's first 1024-byte read of a 1.5 KB block) is [`Unsupported::TruncatedHead`];
//!   so is a chunk-size line past them (several chunks of > ~500 B in one writev).
//! - A close-delimited client response ends only when the end of its connection is
//!   inferred: the fd's next request line, [`RESPONSE_TIMEOUT_NS`] of silence, or
//!   [`Joiner::finish`].
//! - A client connection cut mid-request-body and reused as a client connection while its
//!   exchange is still open is not noticed: the new bytes count as the old body until its
//!   length runs out. (Reuse is noticed when the exchange already ended, in the other role,
//!   inside a header block, or after a close-delimited response.) One cut at a message
//!   boundary and reused before its response is counted as [`Unsupported::Pipelined`].
//! - A record that moved bytes of two exchanges (the end of one, the start of the next)
//!   answers with the first; both list it.
//! - An exchange keeps every syscall of its messages: a long streamed body keeps many.

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::events::data::{Data, Direction};

/// An open exchange with no syscall for this long (event time) ends as
/// [`Reason::NoResponse`] (or, when its client response was close-delimited and already being
/// sent, as a finished [`Exchange`]: the silence is taken as the close).
pub const RESPONSE_TIMEOUT_NS: u64 = 10_000_000_000;
/// A connection with no syscall for this long (event time) is forgotten.
pub const CONN_IDLE_NS: u64 = 60_000_000_000;
/// How often (event time) timeouts and idle connections are looked for.
pub const SWEEP_NS: u64 = 1_000_000_000;
/// Longest header block kept while it is being assembled; longer is [`Unsupported::HeadTooLarge`].
pub const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size or trailer line.
const MAX_LINE: usize = 4096;

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
    /// Unique per [`Joiner`], given when the client request's header block was parsed (or, for
    /// an unjoined upstream request, when it was); what [`Assignment::To`] names.
    pub serial: u64,
    pub tgid: u32,
    /// The upstream connection its request was sent on (the last one, when the proxy retried
    /// it on another: `syscalls` then hold both attempts); `None` when the proxy answered by
    /// itself (no upstream request joined it).
    pub upstream_fd: Option<u32>,
    /// The `x-request-id` value (client's, else the upstream request's), OWS trimmed.
    pub request_id: Option<String>,
    /// Of the client request line.
    pub method: String,
    pub target: String,
    /// Final status of the client response.
    pub status: Option<u16>,
    /// Final status of the upstream response, when one was parsed.
    pub upstream_status: Option<u16>,
    /// Every syscall that moved a byte of its four messages, in push order.
    pub syscalls: Vec<Syscall>,
}

impl Request {
    /// A request whose header block was just parsed: no upstream, status or syscall yet.
    fn parsed(
        serial: u64,
        tgid: u32,
        method: String,
        target: String,
        request_id: Option<String>,
    ) -> Self {
        Request {
            serial,
            tgid,
            upstream_fd: None,
            request_id,
            method,
            target,
            status: None,
            upstream_status: None,
            syscalls: Vec::new(),
        }
    }

    /// [`id_key`] of `request_id`.
    pub fn key(&self) -> Option<u64> {
        self.request_id.as_deref().map(id_key)
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
    NotJoined(JoinFailure),
    /// No syscall of the exchange for [`RESPONSE_TIMEOUT_NS`] before its client response was
    /// finished.
    NoResponse,
    /// Its client connection's fd started another connection (a request line where none could
    /// be) before its client response was finished.
    Reset,
    /// Its connection (client or upstream) hit something the joiner does not follow.
    Unsupported(Unsupported),
    /// [`Joiner::finish`] found it open.
    SessionEnded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum JoinFailure {
    /// It had an `x-request-id` no pending client request of the process had, and not exactly
    /// one id-less pending client request had its request line.
    UnknownId,
    /// No `x-request-id`, and no id-less pending client request with its request line.
    NoIdNoCandidate,
    /// No `x-request-id`, and several id-less pending client requests with its request line.
    NoIdAmbiguous,
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
    /// A header block longer than [`MAX_HEAD`].
    HeadTooLarge,
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
        match self {
            Reason::NotJoined(JoinFailure::UnknownId) => {
                f.write_str("upstream request with an x-request-id no client request had")
            }
            Reason::NotJoined(JoinFailure::NoIdNoCandidate) => {
                f.write_str("upstream request without an id and no client request like it")
            }
            Reason::NotJoined(JoinFailure::NoIdAmbiguous) => {
                f.write_str("upstream request without an id and several client requests like it")
            }
            Reason::NoResponse => f.write_str("no response within 10 s"),
            Reason::Reset => f.write_str("connection reused before the response"),
            Reason::Unsupported(kind) => write!(f, "unsupported: {}", kind.name()),
            Reason::SessionEnded => f.write_str("still open at end"),
        }
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
            Unsupported::Upgrade => "protocol upgrade",
        }
    }
}

impl Output {
    pub fn serial(&self) -> u64 {
        match self {
            Output::Exchange(e) => e.request.serial,
            Output::Incomplete(i) => i.request.serial,
        }
    }
}

/// The per-record answer of [`Joiner::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// Not part of any followed exchange (other fds, unsupported connections, messages whose
    /// request was never seen or whose exchange already ended, e.g. the response to an
    /// unjoined upstream request).
    None,
    /// Part of a header block not complete yet: its exchange is not known yet. The record
    /// (by `seq`) will be listed in the `syscalls` of the [`Output`] it ends in, if any.
    Deferred,
    /// Bytes of the exchange `serial` (the first one when it moved bytes of two); the record
    /// is listed in that serial's [`Output`] (an [`Incomplete`] if it ends as one, possibly
    /// already out: a pipelined request, an unjoined upstream request).
    To { serial: u64, role: Role },
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
    /// Times a connection was found unsupported, by kind (a connection counts again after it
    /// resynchronised and hit it again).
    pub unsupported: BTreeMap<Unsupported, u64>,
    /// Connections forgotten after [`CONN_IDLE_NS`] without a syscall.
    pub idle_dropped: u64,
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

/// The streaming joiner. See the module documentation.
#[derive(Default)]
pub struct Joiner {
    conns: HashMap<(u32, u32), Conn>,
    open: HashMap<u64, Open>,
    /// Client requests not joined yet, by (tgid, id), oldest first.
    by_id: HashMap<(u32, String), VecDeque<u64>>,
    /// Client requests not joined yet, by (tgid, method, target), oldest first.
    by_line: HashMap<(u32, String, String), VecDeque<u64>>,
    out: Vec<Output>,
    serial: u64,
    seq: u64,
    now: u64,
    next_sweep: u64,
    counts: Counts,
    /// Set by [`Joiner::head`] when the header block just parsed ended at once as this
    /// [`Incomplete`] (pipelined, unjoined upstream request): the answer for its records.
    ended_at_head: Option<u64>,
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

    /// Exchanges open (client request parsed, client response not finished).
    pub fn open(&self) -> usize {
        self.open.len()
    }

    /// The outputs decided since the last call.
    pub fn take(&mut self) -> Vec<Output> {
        std::mem::take(&mut self.out)
    }

    /// Ends the session: every open exchange ends as [`Reason::SessionEnded`] (or, when its
    /// client response was close-delimited and being sent, as an [`Exchange`]). Returns what
    /// [`Joiner::take`] would, with those.
    pub fn finish(&mut self) -> Vec<Output> {
        let mut serials: Vec<u64> = self.open.keys().copied().collect();
        serials.sort_unstable();
        for s in serials {
            let close = self.open[&s].until_close;
            self.end(
                s,
                if close {
                    None
                } else {
                    Some(Reason::SessionEnded)
                },
            );
        }
        self.conns.clear();
        self.take()
    }

    /// The `seq` the next record pushed gets (its syscall's [`Syscall::seq`]).
    pub fn next_seq(&self) -> u64 {
        self.seq + 1
    }

    /// One record, in exit-timestamp order.
    pub fn push(&mut self, d: &Data) -> Assignment {
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
        let assignment = self.process(&mut conn, d);
        self.conns.insert(key, conn);
        assignment
    }

    fn process(&mut self, conn: &mut Conn, d: &Data) -> Assignment {
        let dir = d.direction();
        let class = classify(&d.bytes);
        match conn.kind {
            Kind::Unknown => match class {
                Class::Request | Class::Maybe => self.begin(conn, dir),
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
                self.begin(conn, dir);
            }
            Kind::Client | Kind::Upstream => {
                if class == Class::Request {
                    let requests_here = (conn.kind == Kind::Client) == (dir == Direction::Receive);
                    let answered = self.live(conn.current).is_none();
                    let frame = &conn.framer(dir).state;
                    // A request line where this connection has none: the fd is another
                    // connection now (closed and reused, or a header block abandoned).
                    let reused = match frame {
                        Frame::Start => !requests_here,
                        // Past the start line of a header block (a request line split
                        // after its first bytes is a continuation, not a new request).
                        Frame::Head(buf) => find(buf, b"\r\n").is_some(),
                        // A close-delimited response only ends with its connection.
                        Frame::Close => true,
                        // A request body cut short: its exchange already ended (answered
                        // early, or failed), and the fd is a new connection.
                        Frame::Body(_) | Frame::Chunked(_) => {
                            requests_here && conn.kind == Kind::Client && answered
                        }
                    };
                    if reused {
                        self.reset(conn);
                        self.begin(conn, dir);
                    }
                }
            }
        }
        self.feed(conn, d, dir)
    }

    /// Starts `conn` afresh with the role its first request line gives it.
    fn begin(&mut self, conn: &mut Conn, dir: Direction) {
        let kind = match dir {
            Direction::Receive => Kind::Client,
            Direction::Send => Kind::Upstream,
        };
        conn.restart(kind);
    }

    /// The connection's fd is another connection now: its client exchange cannot finish.
    fn reset(&mut self, conn: &mut Conn) {
        if conn.kind == Kind::Client
            && let Some(s) = self.live(conn.current)
        {
            let close = self.open[&s].until_close;
            self.end(s, if close { None } else { Some(Reason::Reset) });
        }
        conn.restart(Kind::Unknown);
    }

    fn unsupported(&mut self, conn: &mut Conn, kind: Unsupported) {
        *self.counts.unsupported.entry(kind).or_default() += 1;
        if let Some(s) = self.live(conn.current) {
            self.end(s, Some(Reason::Unsupported(kind)));
        }
        conn.restart(Kind::Unsupported);
    }

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
            let owner = self.live(conn.owner(dir));
            let before = pos;
            let ev = conn.framer(dir).step(bytes, d.len, &mut pos);
            if pos > before && !matches!(ev, Some(Ev::Head(_))) && !conn.framer(dir).in_head() {
                // Bytes of the message under way (body, chunk, or the end of it).
                if let Some(s) = owner {
                    self.attach(s, &call, &mut answer);
                }
            }
            match ev {
                None => {
                    if conn.framer(dir).in_head() {
                        let f = conn.framer(dir);
                        if f.head_calls.last().map(|c| c.seq) != Some(call.seq) {
                            f.head_calls.push(call.clone());
                        }
                        if answer == Assignment::None {
                            answer = Assignment::Deferred;
                        }
                    }
                    return answer;
                }
                Some(Ev::End) => self.message_end(conn, dir),
                Some(Ev::Bad(kind)) => {
                    if kind == Unsupported::Malformed && !conn.parsed {
                        // Looked like a request line at first, never was one: not HTTP.
                        conn.kind = Kind::Ignored;
                        conn.recv = Framer::default();
                        conn.send = Framer::default();
                    } else {
                        self.unsupported(conn, kind);
                    }
                    return answer;
                }
                Some(Ev::Head(head)) => {
                    let mut calls = std::mem::take(&mut conn.framer(dir).head_calls);
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
                            match framing {
                                Framing::Length(0) | Framing::None => self.message_end(conn, dir),
                                Framing::Length(n) => conn.framer(dir).state = Frame::Body(n),
                                Framing::Chunked => {
                                    conn.framer(dir).state = Frame::Chunked(Chunk::Size(Vec::new()))
                                }
                                Framing::Close => {
                                    conn.framer(dir).state = Frame::Close;
                                    if let Some(o) = owner.and_then(|s| self.open.get_mut(&s))
                                        && role == Role::ClientResponse
                                    {
                                        o.until_close = true;
                                    }
                                }
                                Framing::Interim => {}
                                Framing::Upgrade => {
                                    self.message_end(conn, dir);
                                    self.unsupported(conn, Unsupported::Upgrade);
                                    return answer;
                                }
                            }
                        }
                        Err(kind) => {
                            if let Some(s) = self.live(conn.owner(dir)) {
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

    /// Adds `call` to exchange `s` (once) and makes it the answer if there is none yet.
    fn attach(&mut self, s: u64, call: &Syscall, answer: &mut Assignment) {
        if let Some(o) = self.open.get_mut(&s) {
            if !o
                .request
                .syscalls
                .iter()
                .rev()
                .take(4)
                .any(|c| c.seq == call.seq && c.role == call.role)
            {
                o.request.syscalls.push(call.clone());
            }
            o.last_ns = o.last_ns.max(call.exit_ns);
            if matches!(answer, Assignment::None | Assignment::Deferred) {
                *answer = Assignment::To {
                    serial: s,
                    role: call.role,
                };
            }
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
        let body = head.body;
        match (conn.kind, dir, head.start) {
            (_, _, Start::Http2) => Err(Unsupported::Http2),
            (Kind::Client, Direction::Receive, Start::Request { method, target }) => {
                let framing = body.request_framing()?;
                if matches!(conn.send.state, Frame::Close) {
                    // The close-delimited response before ended with its connection.
                    conn.send = Framer::default();
                }
                if let Some(prev) = self.live(conn.current) {
                    if self.open[&prev].until_close {
                        // A close-delimited response ended with its connection: a new one.
                        self.end(prev, None);
                    } else {
                        // Pipelined: this request is parsed, so it ends as one incomplete too.
                        let s = self.client_request(d, method, target, head.request_id);
                        for c in calls {
                            self.attach(s, c, &mut Assignment::None);
                        }
                        self.end(s, Some(Reason::Unsupported(Unsupported::Pipelined)));
                        self.ended_at_head = Some(s);
                        return Err(Unsupported::Pipelined);
                    }
                }
                let s = self.client_request(d, method, target, head.request_id);
                conn.current = Some(s);
                conn.recv_owner = Some(s);
                Ok((Some(s), framing))
            }
            (Kind::Client, Direction::Send, Start::Response { status }) => {
                let Some(s) = self.live(conn.current) else {
                    // A response to a request never seen (capture began mid-exchange): framed
                    // for its length, belonging to nobody.
                    conn.send_owner = None;
                    return Ok((None, body.response_framing(status, false, false)?));
                };
                conn.send_owner = Some(s);
                let r = &mut self.open.get_mut(&s).expect("live").request;
                let framing =
                    body.response_framing(status, r.method == "HEAD", r.method == "CONNECT")?;
                if framing != Framing::Interim {
                    r.status = Some(status);
                }
                Ok((Some(s), framing))
            }
            (Kind::Upstream, Direction::Send, Start::Request { method, target }) => {
                let framing = body.request_framing()?;
                self.counts.upstream_requests += 1;
                if matches!(conn.recv.state, Frame::Close) {
                    conn.recv = Framer::default();
                }
                conn.head_request = method == "HEAD";
                conn.connect = method == "CONNECT";
                match self.join(d.tgid, &method, &target, head.request_id.as_deref()) {
                    Ok(s) => {
                        let r = &mut self.open.get_mut(&s).expect("pending is open").request;
                        r.upstream_fd = Some(d.fd);
                        if r.request_id.is_none() {
                            r.request_id = head.request_id;
                        }
                        conn.current = Some(s);
                        conn.send_owner = Some(s);
                        Ok((Some(s), framing))
                    }
                    Err(failure) => {
                        conn.current = None;
                        conn.send_owner = None;
                        self.serial += 1;
                        self.counts.incompletes += 1;
                        self.ended_at_head = Some(self.serial);
                        self.out.push(Output::Incomplete(Incomplete {
                            reason: Reason::NotJoined(failure),
                            client_fd: None,
                            request: Request {
                                upstream_fd: Some(d.fd),
                                syscalls: calls.to_vec(),
                                ..Request::parsed(
                                    self.serial,
                                    d.tgid,
                                    method,
                                    target,
                                    head.request_id,
                                )
                            },
                        }));
                        Ok((None, framing))
                    }
                }
            }
            (Kind::Upstream, Direction::Receive, Start::Response { status }) => {
                let owner = self.live(conn.current);
                conn.recv_owner = owner;
                let framing = body.response_framing(status, conn.head_request, conn.connect)?;
                if framing != Framing::Interim
                    && let Some(o) = owner.and_then(|s| self.open.get_mut(&s))
                {
                    o.request.upstream_status = Some(status);
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
        method: String,
        target: String,
        request_id: Option<String>,
    ) -> u64 {
        self.serial += 1;
        self.counts.client_requests += 1;
        let s = self.serial;
        if let Some(id) = &request_id {
            self.by_id
                .entry((d.tgid, id.clone()))
                .or_default()
                .push_back(s);
        }
        self.by_line
            .entry((d.tgid, method.clone(), target.clone()))
            .or_default()
            .push_back(s);
        self.open.insert(
            s,
            Open {
                client_fd: d.fd,
                request: Request::parsed(s, d.tgid, method, target, request_id),
                last_ns: d.exit_ns,
                until_close: false,
            },
        );
        s
    }

    /// The client request an upstream request belongs to: a pending one (no longer pending
    /// then), or, for an id no pending one has, an already joined one with that id still
    /// waiting for its client response (a retry).
    fn join(
        &mut self,
        tgid: u32,
        method: &str,
        target: &str,
        id: Option<&str>,
    ) -> Result<u64, JoinFailure> {
        if let Some(id) = id
            && let Some(&s) = self
                .by_id
                .get(&(tgid, id.to_owned()))
                .and_then(|q| q.front())
        {
            self.unpend(s);
            return Ok(s);
        }
        if let Some(id) = id
            && let Some(s) = self
                .open
                .values()
                .map(|o| &o.request)
                .filter(|r| {
                    r.tgid == tgid
                        && r.upstream_fd.is_some()
                        && r.status.is_none()
                        && r.request_id.as_deref() == Some(id)
                })
                .map(|r| r.serial)
                .min()
        {
            // A retry (nginx's proxy_next_upstream): the same request again, on another
            // upstream connection, before any client response.
            return Ok(s);
        }
        let line = (tgid, method.to_owned(), target.to_owned());
        let candidates: Vec<u64> = self
            .by_line
            .get(&line)
            .map(|q| {
                q.iter()
                    .copied()
                    .filter(|s| self.open[s].request.request_id.is_none())
                    .collect()
            })
            .unwrap_or_default();
        match (candidates.len(), id) {
            (1, _) => {
                self.unpend(candidates[0]);
                Ok(candidates[0])
            }
            (_, Some(_)) => Err(JoinFailure::UnknownId),
            (0, None) => Err(JoinFailure::NoIdNoCandidate),
            (_, None) => Err(JoinFailure::NoIdAmbiguous),
        }
    }

    /// Removes `s` from the pending client requests (if there).
    fn unpend(&mut self, s: u64) {
        let Some(r) = self.open.get(&s).map(|o| &o.request) else {
            return;
        };
        if let Some(id) = &r.request_id {
            let k = (r.tgid, id.clone());
            if let Some(q) = self.by_id.get_mut(&k) {
                q.retain(|&x| x != s);
                if q.is_empty() {
                    self.by_id.remove(&k);
                }
            }
        }
        let k = (r.tgid, r.method.clone(), r.target.clone());
        if let Some(q) = self.by_line.get_mut(&k) {
            q.retain(|&x| x != s);
            if q.is_empty() {
                self.by_line.remove(&k);
            }
        }
    }

    /// The message in direction `dir` of `conn` ended.
    fn message_end(&mut self, conn: &mut Conn, dir: Direction) {
        match (conn.kind, dir) {
            (Kind::Client, Direction::Receive) => conn.recv_owner = None,
            (Kind::Client, Direction::Send) => {
                let owner = conn.send_owner.take();
                if let Some(s) = self.live(owner)
                    && self.open[&s].request.status.is_some()
                {
                    self.end(s, None);
                    conn.current = None;
                }
            }
            (_, Direction::Send) => conn.send_owner = None,
            (_, Direction::Receive) => {
                // One request in flight per upstream connection: none now. What happens on
                // the connection from here on is not this exchange's.
                conn.recv_owner = None;
                conn.current = None;
            }
        }
    }

    /// Ends open exchange `s`: an [`Exchange`] for `None`, else an [`Incomplete`].
    fn end(&mut self, s: u64, reason: Option<Reason>) {
        self.unpend(s);
        let Some(o) = self.open.remove(&s) else {
            return;
        };
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
            self.end(
                s,
                if close {
                    None
                } else {
                    Some(Reason::NoResponse)
                },
            );
        }
        let before = self.conns.len();
        self.conns
            .retain(|_, c| c.last_ns.saturating_add(CONN_IDLE_NS) >= now);
        self.counts.idle_dropped += (before - self.conns.len()) as u64;
    }
}

/// An exchange whose client request was parsed and whose client response is not finished.
struct Open {
    client_fd: u32,
    request: Request,
    /// Exit of its last syscall.
    last_ns: u64,
    /// Its client response is close-delimited and under way: it ends when the connection is
    /// seen to end (fd reuse, silence, session end).
    until_close: bool,
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
    recv: Framer,
    send: Framer,
    /// Client connection: its open exchange. Upstream connection: the exchange of the request
    /// in flight on it (sent, its response not finished). May be stale (ended); checked
    /// against the open set.
    current: Option<u64>,
    /// Whose message each direction is framing now.
    recv_owner: Option<u64>,
    send_owner: Option<u64>,
    /// A header block was parsed on it since it began.
    parsed: bool,
    /// Upstream connection: the last request sent was HEAD / CONNECT.
    head_request: bool,
    connect: bool,
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

    fn framer(&mut self, dir: Direction) -> &mut Framer {
        match dir {
            Direction::Receive => &mut self.recv,
            Direction::Send => &mut self.send,
        }
    }

    fn owner(&self, dir: Direction) -> Option<u64> {
        match dir {
            Direction::Receive => self.recv_owner,
            Direction::Send => self.send_owner,
        }
    }
}

/// One direction's framing state.
#[derive(Default)]
struct Framer {
    state: Frame,
    /// The syscalls that moved bytes of the header block under construction.
    head_calls: Vec<Syscall>,
}

#[derive(Default)]
enum Frame {
    /// At a message boundary.
    #[default]
    Start,
    /// Header block bytes so far.
    Head(Vec<u8>),
    /// Body bytes left.
    Body(u64),
    Chunked(Chunk),
    /// Everything until the connection ends is body.
    Close,
}

enum Chunk {
    /// A chunk-size line so far.
    Size(Vec<u8>),
    /// Chunk data and its CRLF left.
    Data(u64),
    /// A trailer line so far (an empty one ends the message).
    Trailer(Vec<u8>),
}

enum Ev {
    Head(Head),
    End,
    Bad(Unsupported),
}

impl Framer {
    fn in_head(&self) -> bool {
        matches!(self.state, Frame::Head(_))
    }

    /// Consumes bytes of a syscall from `*pos` until the next event or the syscall's end
    /// (`None`). `bytes` is the captured prefix of the `len` bytes moved.
    fn step(&mut self, bytes: &[u8], len: u64, pos: &mut u64) -> Option<Ev> {
        let cap = bytes.len() as u64;
        loop {
            if *pos >= len {
                return None;
            }
            match &mut self.state {
                Frame::Start => {
                    if *pos >= cap {
                        return Some(Ev::Bad(Unsupported::TruncatedHead));
                    }
                    self.state = Frame::Head(Vec::new());
                }
                Frame::Head(buf) => {
                    if *pos >= cap {
                        return Some(Ev::Bad(Unsupported::TruncatedHead));
                    }
                    let avail = &bytes[*pos as usize..];
                    let old = buf.len();
                    buf.extend_from_slice(avail);
                    let from = old.saturating_sub(3);
                    if let Some(i) = find(&buf[from..], b"\r\n\r\n") {
                        let end = from + i + 4;
                        *pos += (end - old) as u64;
                        buf.truncate(end);
                        let block = std::mem::take(buf);
                        self.state = Frame::Start;
                        return Some(match parse_head(&block) {
                            Some(h) => Ev::Head(h),
                            None => Ev::Bad(Unsupported::Malformed),
                        });
                    }
                    if !start_prefix_ok(buf) {
                        return Some(Ev::Bad(Unsupported::Malformed));
                    }
                    if buf.len() > MAX_HEAD {
                        return Some(Ev::Bad(Unsupported::HeadTooLarge));
                    }
                    *pos += avail.len() as u64;
                    if *pos < len {
                        return Some(Ev::Bad(Unsupported::TruncatedHead));
                    }
                    return None;
                }
                Frame::Body(rem) => {
                    let n = (*rem).min(len - *pos);
                    *pos += n;
                    *rem -= n;
                    if *rem == 0 {
                        self.state = Frame::Start;
                        return Some(Ev::End);
                    }
                }
                Frame::Close => {
                    *pos = len;
                }
                Frame::Chunked(Chunk::Data(rem)) => {
                    let n = (*rem).min(len - *pos);
                    *pos += n;
                    *rem -= n;
                    if *rem == 0 {
                        self.state = Frame::Chunked(Chunk::Size(Vec::new()));
                    }
                }
                Frame::Chunked(Chunk::Size(line) | Chunk::Trailer(line)) => {
                    if *pos >= cap {
                        return Some(Ev::Bad(Unsupported::TruncatedChunk));
                    }
                    let avail = &bytes[*pos as usize..];
                    let Some(i) = avail.iter().position(|&b| b == b'\n') else {
                        line.extend_from_slice(avail);
                        *pos += avail.len() as u64;
                        if line.len() > MAX_LINE {
                            return Some(Ev::Bad(Unsupported::Malformed));
                        }
                        if *pos < len {
                            return Some(Ev::Bad(Unsupported::TruncatedChunk));
                        }
                        return None;
                    };
                    line.extend_from_slice(&avail[..i]);
                    *pos += i as u64 + 1;
                    let mut l = std::mem::take(line);
                    if l.last() == Some(&b'\r') {
                        l.pop();
                    }
                    if matches!(self.state, Frame::Chunked(Chunk::Trailer(_))) {
                        if l.is_empty() {
                            self.state = Frame::Start;
                            return Some(Ev::End);
                        }
                        continue;
                    }
                    let size = l.split(|&b| b == b';').next().unwrap_or_default();
                    let size = std::str::from_utf8(size)
                        .ok()
                        .and_then(|s| u64::from_str_radix(s.trim_matches([' ', '\t']), 16).ok());
                    match size {
                        None => return Some(Ev::Bad(Unsupported::Malformed)),
                        Some(0) => self.state = Frame::Chunked(Chunk::Trailer(Vec::new())),
                        Some(n) => self.state = Frame::Chunked(Chunk::Data(n.saturating_add(2))),
                    }
                }
            }
        }
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

/// How a message's body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Framing {
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes (responses only).
    Close,
    /// A 1xx other than 101: no body, the final response follows.
    Interim,
    /// 101, or 2xx to CONNECT: the connection stops being HTTP/1.1 after the header.
    Upgrade,
}

#[derive(Debug)]
enum Start {
    Request { method: String, target: String },
    Response { status: u16 },
    Http2,
}

#[derive(Debug)]
struct Head {
    start: Start,
    body: BodyHeaders,
    request_id: Option<String>,
}

/// The headers that frame the body.
#[derive(Clone, Copy, Debug, Default)]
struct BodyHeaders {
    content_length: Option<u64>,
    /// Transfer-Encoding present: whether its last coding is chunked.
    chunked: Option<bool>,
}

impl BodyHeaders {
    fn request_framing(&self) -> Result<Framing, Unsupported> {
        match (self.chunked, self.content_length) {
            (Some(true), _) => Ok(Framing::Chunked),
            (Some(false), _) => Err(Unsupported::Malformed),
            (None, Some(n)) => Ok(Framing::Length(n)),
            (None, None) => Ok(Framing::None),
        }
    }

    fn response_framing(
        &self,
        status: u16,
        head: bool,
        connect: bool,
    ) -> Result<Framing, Unsupported> {
        Ok(match status {
            101 => Framing::Upgrade,
            100..=199 => Framing::Interim,
            _ if connect && (200..300).contains(&status) => Framing::Upgrade,
            _ if head || status == 204 || status == 304 => Framing::None,
            _ => match (self.chunked, self.content_length) {
                (Some(true), _) => Framing::Chunked,
                (Some(false), _) => Framing::Close,
                (None, Some(n)) => Framing::Length(n),
                (None, None) => Framing::Close,
            },
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Class {
    /// Starts with a complete HTTP/1.x request line.
    Request,
    /// Too short to tell, but could start a request line.
    Maybe,
    Http2,
    Tls,
    Other,
}

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// What a chunk's first bytes say about its connection.
fn classify(b: &[u8]) -> Class {
    if b.is_empty() {
        return Class::Other;
    }
    if b.first() == Some(&0x16) {
        return Class::Tls;
    }
    if b.starts_with(PREFACE) {
        return Class::Http2;
    }
    match request_line(b) {
        Line::Complete => Class::Request,
        Line::Prefix => Class::Maybe,
        Line::Invalid => Class::Other,
    }
}

enum Line {
    Complete,
    Prefix,
    Invalid,
}

/// Whether `b` starts with `METHOD SP target SP HTTP/1.d CRLF` (or a prefix of one).
fn request_line(b: &[u8]) -> Line {
    const VERSION: &[u8] = b"HTTP/1.";
    let mut i = 0;
    // Method: 1..=20 upper-case letters, '-' or '_'.
    while i < b.len() && (b[i].is_ascii_uppercase() || b[i] == b'-' || b[i] == b'_') {
        i += 1;
    }
    if i > 20 || (i < b.len() && (i == 0 || b[i] != b' ')) {
        return Line::Invalid;
    }
    if i == b.len() {
        return Line::Prefix;
    }
    i += 1;
    let target = i;
    while i < b.len() && b[i] > b' ' && b[i] != 0x7f {
        i += 1;
    }
    if i < b.len() && (i == target || b[i] != b' ') {
        return Line::Invalid;
    }
    if i == b.len() {
        return Line::Prefix;
    }
    i += 1;
    let rest = &b[i..];
    let n = rest.len().min(VERSION.len());
    if rest[..n] != VERSION[..n] {
        return Line::Invalid;
    }
    let tail = &rest[n..];
    match tail {
        [] => Line::Prefix,
        [d] if d.is_ascii_digit() => Line::Prefix,
        [d, b'\r'] if d.is_ascii_digit() => Line::Prefix,
        [d, b'\r', b'\n', ..] if d.is_ascii_digit() => Line::Complete,
        _ => Line::Invalid,
    }
}

/// Whether a header block under construction can still become a request or a response.
fn start_prefix_ok(b: &[u8]) -> bool {
    const STATUS: &[u8] = b"HTTP/1.";
    let n = b.len().min(STATUS.len());
    b[..n] == STATUS[..n]
        || !matches!(request_line(b), Line::Invalid)
        || PREFACE.starts_with(&b[..b.len().min(PREFACE.len())])
}

/// Parses a header block (start line to CRLFCRLF included).
fn parse_head(block: &[u8]) -> Option<Head> {
    let mut lines = block
        .split(|&b| b == b'\n')
        .map(|l| l.strip_suffix(b"\r").unwrap_or(l));
    let first = lines.next()?;
    let start = if let Some(rest) = first.strip_prefix(b"HTTP/1.") {
        // HTTP/1.d SP 3DIGIT [SP reason]
        if rest.len() < 5 || !rest[0].is_ascii_digit() || rest[1] != b' ' {
            return None;
        }
        let code = &rest[2..5];
        if !code.iter().all(u8::is_ascii_digit) || rest.get(5).is_some_and(|&b| b != b' ') {
            return None;
        }
        Start::Response {
            status: std::str::from_utf8(code).ok()?.parse().ok()?,
        }
    } else if first == b"PRI * HTTP/2.0" {
        Start::Http2
    } else {
        let mut line = first.to_vec();
        line.extend_from_slice(b"\r\n");
        if !matches!(request_line(&line), Line::Complete) {
            return None;
        }
        let mut parts = first.splitn(3, |&b| b == b' ');
        let method = String::from_utf8_lossy(parts.next()?).into_owned();
        let target = String::from_utf8_lossy(parts.next()?).into_owned();
        Start::Request { method, target }
    };
    let mut head = Head {
        start,
        body: BodyHeaders::default(),
        request_id: None,
    };
    for line in lines {
        if line.is_empty() {
            break;
        }
        let colon = line.iter().position(|&b| b == b':')?;
        let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
        if name.eq_ignore_ascii_case(b"content-length") {
            let s = std::str::from_utf8(value).ok()?;
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return None;
            }
            let n: u64 = s.parse().ok()?;
            if head.body.content_length.is_some_and(|m| m != n) {
                return None;
            }
            head.body.content_length = Some(n);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            let last = value
                .rsplit(|&b| b == b',')
                .next()
                .map(trim)
                .unwrap_or_default();
            head.body.chunked = Some(last.eq_ignore_ascii_case(b"chunked"));
        } else if name.eq_ignore_ascii_case(b"x-request-id") && head.request_id.is_none() {
            head.request_id = Some(String::from_utf8_lossy(value).into_owned());
        }
    }
    Some(head)
}

fn trim(mut v: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = v {
        v = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = v {
        v = rest;
    }
    v
}

#[cfg(test)]
mod tests {
    use tracer_ebpf::abi::{
        DATA_BYTES,
        syscall::{READ, RECVFROM, SENDTO, WRITE, WRITEV},
    };

    use super::*;

    const PID: u32 = 100;

    /// Feeds records with increasing timestamps (1 µs apart) and keeps every output.
    struct Sim {
        j: Joiner,
        t: u64,
        tgid: u32,
        out: Vec<Output>,
        /// Every answer of `push`, by record (index = seq - 1).
        answers: Vec<Assignment>,
    }

    impl Sim {
        fn new() -> Sim {
            Sim {
                j: Joiner::new(),
                t: 1_000_000,
                tgid: PID,
                out: Vec::new(),
                answers: Vec::new(),
            }
        }

        /// One syscall that moved `bytes` (captured up to `DATA_BYTES`, like the kernel does).
        fn rec(&mut self, tid: u32, fd: u32, syscall: u16, bytes: &[u8]) -> Assignment {
            self.t += 1_000;
            let d = Data {
                enter_ns: self.t - 400,
                exit_ns: self.t,
                tgid: self.tgid,
                tid,
                fd,
                syscall,
                len: bytes.len() as u64,
                bytes: bytes[..bytes.len().min(DATA_BYTES)].to_vec(),
            };
            let a = self.j.push(&d);
            self.answers.push(a);
            self.out.extend(self.j.take());
            a
        }

        fn recv(&mut self, fd: u32, bytes: &[u8]) -> Assignment {
            self.rec(1, fd, RECVFROM, bytes)
        }

        fn send(&mut self, fd: u32, bytes: &[u8]) -> Assignment {
            self.rec(1, fd, WRITEV, bytes)
        }

        fn wait(&mut self, ns: u64) {
            self.t += ns;
        }

        fn finish(&mut self) {
            let rest = self.j.finish();
            self.out.extend(rest);
        }

        fn exchanges(&self) -> Vec<&Exchange> {
            self.out
                .iter()
                .filter_map(|o| match o {
                    Output::Exchange(e) => Some(e),
                    _ => None,
                })
                .collect()
        }

        /// The one exchange out; fails listing the outputs when there is not exactly one.
        fn only_exchange(&self) -> &Exchange {
            let e = self.exchanges();
            assert_eq!(e.len(), 1, "{:?}", self.out);
            e[0]
        }

        fn incompletes(&self) -> Vec<&Incomplete> {
            self.out
                .iter()
                .filter_map(|o| match o {
                    Output::Incomplete(i) => Some(i),
                    _ => None,
                })
                .collect()
        }

        fn unsupported(&self, kind: Unsupported) -> u64 {
            self.j.counts().unsupported.get(&kind).copied().unwrap_or(0)
        }

        /// nginx-like: the four steps of one request, one syscall each.
        fn proxy(&mut self, client: u32, upstream: u32, id: &str) {
            let r = req("POST", "/echo", &[("x-request-id", id)], b"{\"a\":1}");
            self.recv(client, &r);
            self.send(upstream, &r);
            let s = resp(200, b"{\"ok\":true}");
            self.recv(upstream, &s);
            self.send(client, &s);
        }
    }

    /// A request with a Host header, `headers`, and a Content-Length when `body` is not empty.
    fn req(method: &str, target: &str, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut s = format!("{method} {target} HTTP/1.1\r\nhost: 127.0.0.1:8081\r\n");
        for (n, v) in headers {
            s += &format!("{n}: {v}\r\n");
        }
        if !body.is_empty() {
            s += &format!("content-length: {}\r\n", body.len());
        }
        s += "\r\n";
        let mut b = s.into_bytes();
        b.extend_from_slice(body);
        b
    }

    fn resp(status: u16, body: &[u8]) -> Vec<u8> {
        resp_with(status, &[("content-length", &body.len().to_string())], body)
    }

    fn resp_with(status: u16, headers: &[(&str, &str)], body: &[u8]) -> Vec<u8> {
        let mut s = format!("HTTP/1.1 {status} X\r\n");
        for (n, v) in headers {
            s += &format!("{n}: {v}\r\n");
        }
        s += "\r\n";
        let mut b = s.into_bytes();
        b.extend_from_slice(body);
        b
    }

    fn roles(r: &Request) -> Vec<Role> {
        r.syscalls.iter().map(|c| c.role).collect()
    }

    /// The answer for a record of `r`'s in `role`.
    fn to(r: &Request, role: Role) -> Assignment {
        Assignment::To {
            serial: r.serial,
            role,
        }
    }

    use Role::*;

    #[test]
    fn nginx_like_one_request() {
        let mut sim = Sim::new();
        // loadgen's 228-byte request: 128 B of headers and a 99 B JSON body (here: 100 B).
        let body = [b'x'; 99];
        let r = req(
            "POST",
            "/echo",
            &[
                ("content-type", "application/json"),
                ("x-request-id", "1796273436132279"),
            ],
            &body,
        );
        let a1 = sim.recv(3, &r);
        sim.rec(
            1,
            20,
            WRITE,
            b"127.0.0.1 - - [03/Dec/2026] \"POST /echo HTTP/1.1\" 200\n",
        );
        // writev [headers, body] on the upstream connection: one record.
        let up = req(
            "POST",
            "/echo",
            &[
                ("content-type", "application/json"),
                ("x-request-id", "1796273436132279"),
            ],
            &body,
        );
        let a2 = sim.send(16, &up);
        let s = resp(200, &[b'y'; 144]);
        let a3 = sim.recv(16, &s);
        let a4 = sim.send(3, &s);
        let e = sim.only_exchange();
        let r = &e.request;
        assert_eq!((r.tgid, e.client_fd, r.upstream_fd), (PID, 3, Some(16)));
        assert_eq!(r.request_id.as_deref(), Some("1796273436132279"));
        assert_eq!(r.key(), Some(1796273436132279));
        assert_eq!((r.method.as_str(), r.target.as_str()), ("POST", "/echo"));
        assert_eq!((r.status, r.upstream_status), (Some(200), Some(200)));
        assert_eq!(
            roles(r),
            [
                ClientRequest,
                UpstreamRequest,
                UpstreamResponse,
                ClientResponse
            ]
        );
        assert_eq!(r.syscalls[0].seq, 1);
        assert_eq!(r.syscalls[1].seq, 3);
        assert_eq!(
            [a1, a2, a3, a4],
            [
                to(r, ClientRequest),
                to(r, UpstreamRequest),
                to(r, UpstreamResponse),
                to(r, ClientResponse)
            ]
        );
        assert!(sim.incompletes().is_empty());
        assert!(sim.j.counts().unsupported.is_empty());
        assert_eq!(sim.j.open(), 0);
    }

    #[test]
    fn keep_alive_requests_share_connections() {
        let mut sim = Sim::new();
        for i in 0..5 {
            sim.proxy(3, 6, &format!("id-{i}"));
        }
        let e = sim.exchanges();
        assert_eq!(e.len(), 5);
        for (i, e) in e.iter().enumerate() {
            assert_eq!(e.request.request_id, Some(format!("id-{i}")));
            assert_eq!(e.request.key(), Some(id_key(&format!("id-{i}"))));
            assert_eq!((e.client_fd, e.request.upstream_fd), (3, Some(6)));
            assert_eq!(
                roles(&e.request),
                [
                    ClientRequest,
                    UpstreamRequest,
                    UpstreamResponse,
                    ClientResponse
                ]
            );
        }
        assert_eq!(sim.j.counts().client_requests, 5);
        assert_eq!(sim.j.counts().upstream_requests, 5);
    }

    #[test]
    fn header_block_split_over_reads() {
        let mut sim = Sim::new();
        let r = req(
            "POST",
            "/echo",
            &[("x-pad", &"p".repeat(300)), ("x-request-id", "split")],
            b"body",
        );
        // nginx: 1024-byte first read in general; here the block is cut inside a header line,
        // and again right inside the CRLFCRLF.
        let cut = r.len() - 6;
        assert_eq!(sim.recv(3, &r[..100]), Assignment::Deferred);
        assert_eq!(sim.recv(3, &r[100..cut]), Assignment::Deferred);
        let a = sim.recv(3, &r[cut..]);
        sim.send(6, &r);
        let s = resp(200, b"ok");
        sim.recv(6, &s);
        sim.send(3, &s);
        let r = &sim.only_exchange().request;
        assert_eq!(a, to(r, ClientRequest));
        assert_eq!(r.request_id.as_deref(), Some("split"));
        assert_eq!(
            roles(r),
            [
                ClientRequest,
                ClientRequest,
                ClientRequest,
                UpstreamRequest,
                UpstreamResponse,
                ClientResponse
            ]
        );
        assert_eq!(
            r.syscalls.iter().map(|c| c.seq).collect::<Vec<_>>(),
            [1, 2, 3, 4, 5, 6]
        );
    }

    #[test]
    fn request_line_split_after_one_byte() {
        // Go's background read may return the first byte of the next request alone.
        let mut sim = Sim::new();
        let r = req("GET", "/a", &[("x-request-id", "go")], b"");
        assert_eq!(sim.rec(1, 7, READ, &r[..1]), Assignment::Deferred);
        sim.rec(1, 7, READ, &r[1..]);
        sim.rec(1, 8, WRITE, &r);
        let s = resp(200, b"");
        sim.rec(1, 8, READ, &s);
        sim.rec(1, 7, WRITE, &s);
        assert_eq!(sim.only_exchange().request.syscalls.len(), 5);
    }

    #[test]
    fn caddy_like_threads_and_two_writes() {
        let mut sim = Sim::new();
        let (a, b, c, d) = (11, 12, 13, 14);
        let body = [b'j'; 99];
        let r = req("POST", "/echo", &[("x-request-id", "c-1")], &body);
        sim.rec(a, 7, READ, &r);
        // Go writes Host, Content-Length, then the headers sorted by name: the id after 200 B.
        let head = format!(
            "POST /echo HTTP/1.1\r\nHost: 127.0.0.1:9000\r\nUser-Agent: {}\r\nContent-Length: 99\r\n\
             Content-Type: application/json\r\nX-Forwarded-For: 127.0.0.1\r\nX-Forwarded-Host: \
             127.0.0.1:8083\r\nX-Forwarded-Proto: http\r\nX-Request-Id: c-1\r\nAccept-Encoding: gzip\r\n\r\n",
            "u".repeat(60)
        );
        assert!(head.find("X-Request-Id").unwrap() > 200);
        let w1 = sim.rec(b, 9, WRITE, head.as_bytes());
        let w2 = sim.rec(b, 9, WRITE, &body);
        let s = resp(200, &[b'r'; 144]);
        sim.rec(c, 9, READ, &s);
        sim.rec(d, 7, WRITE, &s);
        let r = &sim.only_exchange().request;
        assert_eq!(w1, to(r, UpstreamRequest));
        assert_eq!(w2, w1);
        assert_eq!(r.upstream_fd, Some(9));
        assert_eq!(
            r.syscalls
                .iter()
                .map(|c| (c.role, c.tid))
                .collect::<Vec<_>>(),
            [
                (ClientRequest, a),
                (UpstreamRequest, b),
                (UpstreamRequest, b),
                (UpstreamResponse, c),
                (ClientResponse, d)
            ]
        );
    }

    #[test]
    fn haproxy_like_shared_upstream_connection() {
        let mut sim = Sim::new();
        // Client connections 7 and 9 on two threads, both served by server connection 8.
        let r7 = req("POST", "/echo", &[("x-request-id", "h7")], b"seven");
        let r9 = req("POST", "/echo", &[("x-request-id", "h9")], b"nine");
        sim.rec(1, 7, RECVFROM, &r7);
        sim.rec(2, 9, RECVFROM, &r9);
        sim.rec(1, 8, SENDTO, &r7);
        let s7 = resp(200, b"for seven");
        sim.rec(1, 8, RECVFROM, &s7);
        sim.rec(1, 7, SENDTO, &s7);
        sim.rec(2, 8, SENDTO, &r9);
        let s9 = resp(201, b"for nine");
        sim.rec(2, 8, RECVFROM, &s9);
        sim.rec(2, 9, SENDTO, &s9);
        let e = sim.exchanges();
        assert_eq!(e.len(), 2, "{:?}", sim.out);
        assert_eq!(
            e.iter()
                .map(|e| (e.client_fd, e.request.upstream_fd, e.request.status))
                .collect::<Vec<_>>(),
            [(7, Some(8), Some(200)), (9, Some(8), Some(201))]
        );
        assert!(e[1].request.syscalls.iter().all(|c| c.tid == 2));
    }

    #[test]
    fn id_past_256_bytes_and_past_the_capture() {
        let mut sim = Sim::new();
        let r = req(
            "GET",
            "/far",
            &[("cookie", &"c".repeat(400)), ("X-REQUEST-ID", " far-away ")],
            b"",
        );
        assert!(r.len() < DATA_BYTES);
        sim.recv(3, &r);
        sim.send(6, &r);
        let s = resp(200, b"");
        sim.recv(6, &s);
        sim.send(3, &s);
        let e = sim.exchanges();
        assert_eq!(e.len(), 1);
        assert_eq!(e[0].request.request_id.as_deref(), Some("far-away"));
        assert_eq!(e[0].request.upstream_fd, Some(6));
        // Past the 512 captured bytes: the header block cannot be read, nothing is guessed.
        let r = req(
            "GET",
            "/far",
            &[("cookie", &"c".repeat(600)), ("x-request-id", "lost")],
            b"",
        );
        assert_eq!(sim.recv(3, &r), Assignment::None);
        assert_eq!(sim.unsupported(Unsupported::TruncatedHead), 1);
        assert_eq!(sim.j.counts().client_requests, 1);
    }

    #[test]
    fn no_id_unique_request_line_joins() {
        let mut sim = Sim::new();
        let a = req("GET", "/a", &[], b"");
        let b = req("GET", "/b", &[], b"");
        sim.recv(3, &a);
        sim.recv(4, &b);
        sim.send(6, &b);
        sim.send(7, &a);
        let s = resp(200, b"a");
        sim.recv(7, &s);
        sim.send(3, &s);
        sim.recv(6, &s);
        sim.send(4, &s);
        let e = sim.exchanges();
        assert_eq!(e.len(), 2, "{:?}", sim.out);
        assert_eq!(
            e.iter()
                .map(|e| (
                    e.client_fd,
                    e.request.upstream_fd,
                    e.request.target.as_str()
                ))
                .collect::<Vec<_>>(),
            [(3, Some(7), "/a"), (4, Some(6), "/b")]
        );
        assert_eq!(e[0].request.request_id, None);
        assert_eq!(e[0].request.key(), None);
    }

    #[test]
    fn no_id_ambiguous_request_line_is_not_guessed() {
        let mut sim = Sim::new();
        let a = req("GET", "/same", &[], b"");
        sim.recv(3, &a);
        sim.recv(4, &a);
        let answer = sim.send(6, &a);
        let i = sim.incompletes();
        assert_eq!(i.len(), 1);
        assert_eq!(answer, to(&i[0].request, UpstreamRequest));
        assert_eq!(i[0].reason, Reason::NotJoined(JoinFailure::NoIdAmbiguous));
        assert_eq!((i[0].client_fd, i[0].request.upstream_fd), (None, Some(6)));
        assert_eq!(i[0].request.syscalls.len(), 1);
        // Its response belongs to nobody; the client requests end without an upstream side.
        let s = resp(200, b"x");
        assert_eq!(sim.recv(6, &s), Assignment::None);
        sim.send(3, &s);
        sim.send(4, &s);
        let e = sim.exchanges();
        assert_eq!(e.len(), 2);
        assert!(e.iter().all(|e| e.request.upstream_fd.is_none()));
        // An upstream request with an id nobody received, and one without any candidate.
        sim.send(6, &req("GET", "/x", &[("x-request-id", "nobody")], b""));
        sim.send(6, &req("GET", "/y", &[], b""));
        let reasons: Vec<_> = sim.incompletes().iter().map(|i| i.reason).collect();
        assert_eq!(
            reasons,
            [
                Reason::NotJoined(JoinFailure::NoIdAmbiguous),
                Reason::NotJoined(JoinFailure::UnknownId),
                Reason::NotJoined(JoinFailure::NoIdNoCandidate)
            ]
        );
    }

    #[test]
    fn proxy_generated_id_joins_by_request_line() {
        // nginx `proxy_set_header X-Request-Id $request_id`: the client sent none.
        let mut sim = Sim::new();
        let a = req("GET", "/gen", &[], b"");
        sim.recv(3, &a);
        sim.send(6, &req("GET", "/gen", &[("X-Request-Id", "f00d")], b""));
        let s = resp(200, b"");
        sim.recv(6, &s);
        sim.send(3, &s);
        let r = &sim.only_exchange().request;
        assert_eq!(r.request_id.as_deref(), Some("f00d"));
        assert_eq!(r.key(), Some(id_key("f00d")));
        assert_ne!(id_key("f00d"), 0xf00d);
    }

    #[test]
    fn same_id_in_two_processes_is_kept_apart() {
        let mut sim = Sim::new();
        let r = req("GET", "/", &[("x-request-id", "7")], b"");
        sim.tgid = 1;
        sim.recv(3, &r);
        sim.tgid = 2;
        sim.recv(3, &r);
        sim.send(6, &r);
        sim.tgid = 1;
        sim.send(6, &r);
        let s = resp(200, b"");
        sim.recv(6, &s);
        sim.send(3, &s);
        sim.tgid = 2;
        sim.recv(6, &s);
        sim.send(3, &s);
        let e = sim.exchanges();
        assert_eq!(e.len(), 2);
        assert_eq!(
            e.iter()
                .map(|e| (e.request.tgid, e.request.upstream_fd, e.request.key()))
                .collect::<Vec<_>>(),
            [(1, Some(6), Some(7)), (2, Some(6), Some(7))]
        );
        assert_eq!(e[0].request.syscalls.len(), 4);
        assert_eq!(e[1].request.syscalls.len(), 4);
    }

    #[test]
    fn pipelining_is_unsupported() {
        let mut sim = Sim::new();
        let a = req("GET", "/1", &[("x-request-id", "p1")], b"");
        let b = req("GET", "/2", &[("x-request-id", "p2")], b"");
        // Two requests in one read.
        sim.recv(3, &[a.clone(), b.clone()].concat());
        assert_eq!(sim.unsupported(Unsupported::Pipelined), 1);
        let i = sim.incompletes();
        assert_eq!(i.len(), 2);
        assert!(
            i.iter()
                .all(|i| i.reason == Reason::Unsupported(Unsupported::Pipelined))
        );
        // The responses are not guessed at.
        assert_eq!(sim.send(3, &resp(200, b"")), Assignment::None);
        // Two reads, the second before the first's response.
        sim.recv(4, &a);
        sim.recv(4, &b);
        assert_eq!(sim.unsupported(Unsupported::Pipelined), 2);
        assert_eq!(sim.incompletes().len(), 4);
        assert!(sim.exchanges().is_empty());
        assert_eq!(sim.j.counts().client_requests, 4);
    }

    #[test]
    fn http2_and_tls_are_unsupported() {
        let mut sim = Sim::new();
        assert_eq!(
            sim.recv(3, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\x00\x00\x12\x04"),
            Assignment::None
        );
        assert_eq!(sim.recv(3, b"\x00\x00\x00\x04\x01"), Assignment::None);
        assert_eq!(
            sim.recv(4, b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03"),
            Assignment::None
        );
        assert_eq!(sim.unsupported(Unsupported::Http2), 1);
        assert_eq!(sim.unsupported(Unsupported::Tls), 1);
        // h2 on an established HTTP/1.1 connection (prior knowledge after a close/accept).
        sim.proxy(5, 6, "before");
        sim.recv(5, b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n");
        assert_eq!(sim.unsupported(Unsupported::Http2), 2);
        assert_eq!(sim.exchanges().len(), 1);
        assert!(sim.incompletes().is_empty());
    }

    #[test]
    fn truncated_header_block_is_unsupported_then_resynchronised() {
        let mut sim = Sim::new();
        // nginx's first read of a 1.5 KB header block: 1024 bytes, 512 captured, no CRLFCRLF.
        let big = req(
            "GET",
            "/big",
            &[("x-pad", &"p".repeat(1400)), ("x-request-id", "big")],
            b"",
        );
        assert_eq!(sim.recv(3, &big[..1024]), Assignment::None);
        assert_eq!(sim.unsupported(Unsupported::TruncatedHead), 1);
        // The rest of it and its upstream copy are ignored, never guessed.
        assert_eq!(sim.recv(3, &big[1024..]), Assignment::None);
        assert_eq!(sim.send(6, &big), Assignment::None);
        assert_eq!(sim.unsupported(Unsupported::TruncatedHead), 2);
        sim.recv(6, &resp(200, b""));
        sim.send(3, &resp(200, b""));
        assert!(sim.out.is_empty(), "{:?}", sim.out);
        // The next request on the connection starts with a request line: followed again.
        sim.proxy(3, 6, "next");
        let r = &sim.only_exchange().request;
        assert_eq!(r.request_id.as_deref(), Some("next"));
    }

    #[test]
    fn truncated_upstream_response_head_fails_its_exchange() {
        let mut sim = Sim::new();
        let r = req("GET", "/", &[("x-request-id", "t")], b"");
        sim.recv(3, &r);
        sim.send(6, &r);
        let s = resp_with(
            200,
            &[("x-pad", &"p".repeat(600)), ("content-length", "0")],
            b"",
        );
        sim.recv(6, &s);
        let i = sim.incompletes();
        assert_eq!(i.len(), 1);
        assert_eq!(i[0].reason, Reason::Unsupported(Unsupported::TruncatedHead));
        assert_eq!(i[0].client_fd, Some(3));
        assert_eq!(sim.send(3, &s), Assignment::None);
        assert!(sim.exchanges().is_empty());
    }

    fn chunked(body: &[&[u8]]) -> Vec<u8> {
        let mut b = Vec::new();
        for c in body {
            b.extend_from_slice(format!("{:x}\r\n", c.len()).as_bytes());
            b.extend_from_slice(c);
            b.extend_from_slice(b"\r\n");
        }
        b.extend_from_slice(b"0\r\n\r\n");
        b
    }

    #[test]
    fn chunked_bodies() {
        let mut sim = Sim::new();
        let te = [("transfer-encoding", "chunked")];
        let r = [
            req("POST", "/c", &[("x-request-id", "ch"), te[0]], b""),
            chunked(&[b"abc", b"defgh"]),
        ]
        .concat();
        sim.recv(3, &r);
        sim.send(6, &r);
        // The upstream response in three reads: the head and the first chunk, a size line cut
        // in the middle, the rest (with a trailer).
        let body = chunked(&[&[b'z'; 300], b"0123456789abcdef"]);
        let body = [&body[..body.len() - 2], b"x-trailer: 1\r\n\r\n"].concat();
        let s = [resp_with(200, &te, b""), body].concat();
        let h = s.len() - 40;
        sim.recv(6, &s[..h]);
        sim.recv(6, &s[h..h + 1]);
        let a = sim.recv(6, &s[h + 1..]);
        assert!(matches!(
            a,
            Assignment::To {
                role: UpstreamResponse,
                ..
            }
        ));
        assert!(sim.exchanges().is_empty());
        // The client response: one chunk per write, then the last chunk.
        sim.send(3, &resp_with(200, &te, b""));
        sim.send(3, b"5\r\nhello\r\n");
        assert!(sim.exchanges().is_empty());
        sim.send(3, b"0\r\n\r\n");
        assert_eq!(
            roles(&sim.only_exchange().request),
            [
                ClientRequest,
                UpstreamRequest,
                UpstreamResponse,
                UpstreamResponse,
                UpstreamResponse,
                ClientResponse,
                ClientResponse,
                ClientResponse
            ]
        );
        // A chunk larger than the capture followed by its next size line: not followed.
        sim.recv(3, &req("GET", "/c2", &[("x-request-id", "ch2")], b""));
        let big = [resp_with(200, &te, b""), chunked(&[&[b'q'; 700], b"tail"])].concat();
        sim.send(3, &big);
        assert_eq!(sim.unsupported(Unsupported::TruncatedChunk), 1);
        assert_eq!(
            sim.incompletes()[0].reason,
            Reason::Unsupported(Unsupported::TruncatedChunk)
        );
    }

    #[test]
    fn bodyless_responses_and_interim() {
        let mut sim = Sim::new();
        // HEAD: a Content-Length but no body, upstream and client side.
        let h = req("HEAD", "/h", &[("x-request-id", "h")], b"");
        sim.recv(3, &h);
        sim.send(6, &h);
        let s = resp_with(200, &[("content-length", "1000")], b"");
        sim.recv(6, &s);
        sim.send(3, &s);
        // 100 Continue, then 204 and 304 with no Content-Length.
        let p = req(
            "PUT",
            "/p",
            &[("x-request-id", "p"), ("expect", "100-continue")],
            b"data",
        );
        sim.recv(3, &p[..p.len() - 4]);
        sim.send(6, &p[..p.len() - 4]);
        sim.recv(6, b"HTTP/1.1 100 Continue\r\n\r\n");
        sim.send(3, b"HTTP/1.1 100 Continue\r\n\r\n");
        sim.recv(3, b"data");
        sim.send(6, b"data");
        sim.recv(6, &resp_with(204, &[], b""));
        sim.send(3, &resp_with(204, &[], b""));
        let g = req("GET", "/g", &[("x-request-id", "g")], b"");
        sim.recv(3, &g);
        sim.send(6, &g);
        sim.recv(6, &resp_with(304, &[], b""));
        sim.send(3, &resp_with(304, &[], b""));
        let e = sim.exchanges();
        assert_eq!(e.len(), 3, "{:?}", sim.out);
        assert_eq!(
            e.iter().map(|e| e.request.status).collect::<Vec<_>>(),
            [Some(200), Some(204), Some(304)]
        );
        assert_eq!(
            roles(&e[1].request),
            [
                ClientRequest,
                UpstreamRequest,
                UpstreamResponse,
                ClientResponse,
                ClientRequest,
                UpstreamRequest,
                UpstreamResponse,
                ClientResponse
            ]
        );
    }

    #[test]
    fn close_delimited_response_ends_with_the_connection() {
        let mut sim = Sim::new();
        let r = req("GET", "/old", &[("x-request-id", "c1")], b"");
        sim.recv(3, &r);
        sim.send(6, &r);
        // HTTP/1.0-style upstream: no length, body until close.
        sim.recv(6, &resp_with(200, &[], b"part one"));
        sim.recv(6, b"part two");
        sim.send(3, &resp_with(200, &[("connection", "close")], b"part one"));
        sim.send(3, b"part two");
        assert!(sim.exchanges().is_empty());
        // fd 3 accepted again, fd 6 connected again: the previous ones ended.
        sim.proxy(3, 6, "c2");
        let e = sim.exchanges();
        assert_eq!(e.len(), 2, "{:?}", sim.out);
        assert_eq!(e[0].request.request_id.as_deref(), Some("c1"));
        assert_eq!(e[0].request.syscalls.len(), 6);
        assert_eq!(e[1].request.request_id.as_deref(), Some("c2"));
        assert_eq!(e[1].request.syscalls.len(), 4);
        // At the session's end too.
        sim.recv(3, &r);
        sim.send(3, &resp_with(200, &[], b"local"));
        sim.finish();
        assert_eq!(sim.exchanges().len(), 3);
        assert!(sim.incompletes().is_empty());
    }

    #[test]
    fn fd_reuse() {
        let mut sim = Sim::new();
        sim.proxy(3, 6, "a");
        // fd 3 closed, reused as an upstream connection, fd 6 as a client connection.
        sim.proxy(6, 3, "b");
        // and back.
        sim.proxy(3, 6, "c");
        let e = sim.exchanges();
        assert_eq!(e.len(), 3, "{:?}", sim.out);
        assert_eq!(
            e.iter()
                .map(|e| (e.client_fd, e.request.upstream_fd))
                .collect::<Vec<_>>(),
            [(3, Some(6)), (6, Some(3)), (3, Some(6))]
        );
        // Reused while its exchange waited for the upstream: the exchange is reset.
        let r = req("GET", "/r", &[("x-request-id", "r")], b"");
        sim.recv(3, &r);
        sim.send(6, &r);
        sim.send(3, &req("GET", "/other", &[], b"")); // fd 3 is an upstream connection now
        let i = sim.incompletes();
        assert_eq!(i.len(), 2, "{:?}", sim.out);
        assert_eq!(i[0].reason, Reason::Reset);
        assert_eq!(i[0].request.upstream_fd, Some(6));
        assert_eq!(i[1].reason, Reason::NotJoined(JoinFailure::NoIdNoCandidate));
        // Reset inside a header block: the new request line wins.
        sim.recv(9, b"GET /half HTTP/1.1\r\nhost: x\r\n");
        sim.proxy(9, 10, "whole");
        assert_eq!(sim.exchanges().len(), 4);
        assert_eq!(sim.j.counts().client_requests, 5);
    }

    #[test]
    fn retry_on_another_upstream_connection() {
        let mut sim = Sim::new();
        let r = req("GET", "/retry", &[("x-request-id", "again")], b"");
        sim.recv(3, &r);
        sim.send(6, &r);
        // The first upstream fails (nothing readable here); nginx retries on fd 7.
        let a = sim.send(7, &r);
        let s = resp(200, b"second");
        sim.recv(7, &s);
        sim.send(3, &s);
        let r = &sim.only_exchange().request;
        assert_eq!(a, to(r, UpstreamRequest));
        assert_eq!(r.upstream_fd, Some(7));
        assert_eq!(
            r.syscalls
                .iter()
                .map(|c| (c.role, c.fd))
                .collect::<Vec<_>>(),
            [
                (ClientRequest, 3),
                (UpstreamRequest, 6),
                (UpstreamRequest, 7),
                (UpstreamResponse, 7),
                (ClientResponse, 3)
            ]
        );
        assert!(sim.incompletes().is_empty());
    }

    #[test]
    fn request_body_cut_short_then_fd_reused() {
        let mut sim = Sim::new();
        // The proxy answers 413 before the body arrived and closes; fd 3 is accepted again.
        let big = req("POST", "/upload", &[("x-request-id", "big")], &[b'u'; 5000]);
        sim.recv(3, &big[..400]);
        sim.send(3, &resp(413, b""));
        sim.proxy(3, 6, "next");
        let e = sim.exchanges();
        assert_eq!(e.len(), 2, "{:?}", sim.out);
        assert_eq!(
            (e[0].request.status, e[0].request.upstream_fd),
            (Some(413), None)
        );
        assert_eq!(e[1].request.request_id.as_deref(), Some("next"));
    }

    #[test]
    fn pooled_upstream_failure_spares_the_answered_exchange() {
        // caddy: thread C read the upstream response, thread B sends the next request on the
        // pooled connection (a header block past the capture) before thread D answers.
        let mut sim = Sim::new();
        let r = req("GET", "/one", &[("x-request-id", "one")], b"");
        sim.rec(11, 7, READ, &r);
        sim.rec(12, 9, WRITE, &r);
        let s = resp(200, b"");
        sim.rec(13, 9, READ, &s);
        let big = req(
            "GET",
            "/two",
            &[("cookie", &"c".repeat(5000)), ("x-request-id", "two")],
            b"",
        );
        sim.rec(11, 8, READ, &big[..4096]);
        sim.rec(12, 9, WRITE, &big[..4096]);
        assert_eq!(sim.unsupported(Unsupported::TruncatedHead), 2);
        sim.rec(14, 7, WRITE, &s);
        let r = &sim.only_exchange().request;
        assert_eq!(r.request_id.as_deref(), Some("one"));
        assert!(sim.incompletes().is_empty());
    }

    #[test]
    fn upgrade_ends_the_exchange_and_the_http_framing() {
        let mut sim = Sim::new();
        let r = req(
            "GET",
            "/ws",
            &[
                ("x-request-id", "ws"),
                ("upgrade", "websocket"),
                ("connection", "upgrade"),
            ],
            b"",
        );
        sim.recv(3, &r);
        sim.send(6, &r);
        let s = resp_with(101, &[("upgrade", "websocket")], b"");
        sim.recv(6, &s);
        sim.send(3, &s);
        let r = &sim.only_exchange().request;
        assert_eq!((r.status, r.upstream_status), (Some(101), Some(101)));
        assert_eq!(sim.unsupported(Unsupported::Upgrade), 2);
        // WebSocket frames both ways belong to nobody.
        assert_eq!(sim.recv(3, b"\x81\x85abcd12345"), Assignment::None);
        assert_eq!(sim.send(6, b"\x81\x85abcd12345"), Assignment::None);
        assert_eq!(sim.recv(6, b"\x81\x02hi"), Assignment::None);
        assert_eq!(sim.send(3, b"\x81\x02hi"), Assignment::None);
        assert_eq!(sim.out.len(), 1);
    }

    #[test]
    fn timeouts_and_session_end() {
        let mut sim = Sim::new();
        let r = req("GET", "/slow", &[("x-request-id", "slow")], b"");
        sim.recv(3, &r);
        sim.send(6, &r);
        sim.wait(RESPONSE_TIMEOUT_NS + SWEEP_NS);
        sim.proxy(4, 7, "fast");
        let i = sim.incompletes();
        assert_eq!(i.len(), 1);
        assert_eq!(
            (i[0].reason, i[0].request.upstream_fd),
            (Reason::NoResponse, Some(6))
        );
        // A late response is nobody's.
        assert_eq!(sim.recv(6, &resp(200, b"")), Assignment::None);
        assert_eq!(sim.send(3, &resp(200, b"")), Assignment::None);
        sim.recv(5, &r);
        sim.finish();
        assert_eq!(sim.incompletes()[1].reason, Reason::SessionEnded);
        assert_eq!(sim.exchanges().len(), 1);
        // Idle connections are forgotten.
        let mut sim = Sim::new();
        sim.proxy(3, 6, "x");
        sim.rec(1, 20, WRITE, b"log line\n");
        assert_eq!(sim.j.connections(), 3);
        sim.wait(CONN_IDLE_NS + SWEEP_NS);
        sim.rec(1, 20, WRITE, b"log line\n");
        assert_eq!(sim.j.connections(), 1);
        // fds 3, 6 and 20 (its second record came after the sweep).
        assert_eq!(sim.j.counts().idle_dropped, 3);
    }

    #[test]
    fn other_fds_are_ignored() {
        let mut sim = Sim::new();
        assert_eq!(
            sim.rec(1, 20, WRITE, b"127.0.0.1 - - \"GET / HTTP/1.1\" 200\n"),
            Assignment::None
        );
        assert_eq!(sim.rec(1, 5, WRITE, b"\x01"), Assignment::None);
        assert_eq!(sim.rec(1, 5, READ, &8u64.to_ne_bytes()), Assignment::None);
        assert_eq!(sim.recv(21, b"HTTP/1.1 200 OK\r\n\r\n"), Assignment::None);
        // Text that looks like the start of a request line at first, then is not.
        assert_eq!(
            sim.rec(1, 22, WRITE, b"INFO starting"),
            Assignment::Deferred
        );
        assert_eq!(
            sim.rec(1, 22, WRITE, b" up\nINFO ready\n"),
            Assignment::None
        );
        assert_eq!(sim.rec(1, 22, WRITE, b"INFO more\n"), Assignment::None);
        assert!(sim.out.is_empty());
        assert!(sim.j.counts().unsupported.is_empty());
    }

    #[test]
    fn id_keys() {
        assert_eq!(id_key("1796273436132279"), 1796273436132279);
        assert_eq!(id_key("0"), 0);
        // FNV-1a 64 of "a" and of a number too large for a u64.
        assert_eq!(id_key("a"), 0xaf63dc4c8601ec8c);
        assert_eq!(id_key(""), 0xcbf29ce484222325);
        assert_ne!(id_key("18446744073709551616"), 0);
        assert_ne!(id_key("+5"), 5);
    }

    /// One record of a scripted exchange: fd, tid, received?, bytes.
    type Step = (u32, u32, bool, Vec<u8>);

    /// Invariant: on a mixed, randomised stream (interleaved connections, keep-alive,
    /// split header blocks, ids or not, pipelining, truncated headers, missing responses,
    /// fd reuse, pauses past the timeout), every client request whose header block was parsed
    /// ends as exactly one output, and exchanges carry their own request's id.
    #[test]
    fn every_parsed_client_request_ends_exactly_once() {
        let mut rng = 0x2545_f491_4f6c_dd1du64;
        let mut next = move |n: u64| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng % n
        };
        for round in 0..20 {
            let mut sim = Sim::new();
            // Scripts of records, advanced in random interleaving.
            let mut scripts: Vec<VecDeque<Step>> = Vec::new();
            let mut free_up: Vec<u32> = (100..108).collect();
            let mut busy_client = [false; 8];
            let mut n = 0;
            let mut ufd_of: HashMap<String, u32> = HashMap::new();
            for _ in 0..400 {
                if next(3) == 0 && scripts.len() < 6 {
                    let c = next(8) as usize;
                    if busy_client[c] || free_up.is_empty() {
                        continue;
                    }
                    n += 1;
                    let cfd = 10 + c as u32;
                    let ufd = free_up.swap_remove(next(free_up.len() as u64) as usize);
                    let id = format!("{round}-{n}");
                    ufd_of.insert(id.clone(), ufd);
                    let mut h: Vec<(&str, &str)> = Vec::new();
                    if next(4) != 0 {
                        h.push(("x-request-id", &id));
                    }
                    // Mostly inside the capture, sometimes not (a truncated header block).
                    let most = if next(8) == 0 { 800 } else { 300 };
                    let pad = "p".repeat(next(most) as usize);
                    h.push(("x-pad", &pad));
                    let body = vec![b'b'; next(2000) as usize];
                    let target = format!("/t{}", next(3));
                    let r = req("POST", &target, &h, &body);
                    let mut s: VecDeque<Step> = VecDeque::new();
                    let cut = 1 + next(r.len() as u64 - 1) as usize;
                    s.push_back((cfd, 1, true, r[..cut].to_vec()));
                    s.push_back((cfd, 1, true, r[cut..].to_vec()));
                    if next(10) == 0 {
                        // pipelined follower
                        s.push_back((cfd, 1, true, req("GET", "/pipe", &[], b"")));
                    }
                    s.push_back((ufd, 2, false, r.clone()));
                    let resp_body = vec![b'r'; next(3000) as usize];
                    let sr = if next(2) == 0 {
                        resp(200, &resp_body)
                    } else {
                        [
                            resp_with(200, &[("transfer-encoding", "chunked")], b""),
                            chunked(&[&resp_body[..resp_body.len() % 400], b"end"]),
                        ]
                        .concat()
                    };
                    s.push_back((ufd, 3, true, sr.clone()));
                    if next(12) != 0 {
                        s.push_back((cfd, 4, false, sr));
                    }
                    busy_client[c] = true;
                    scripts.push(s);
                } else if !scripts.is_empty() {
                    let k = next(scripts.len() as u64) as usize;
                    let (fd, tid, rx, bytes) = scripts[k].pop_front().unwrap();
                    if !bytes.is_empty() {
                        sim.rec(tid, fd, if rx { READ } else { WRITE }, &bytes);
                    }
                    if next(50) == 0 {
                        sim.wait(RESPONSE_TIMEOUT_NS + SWEEP_NS);
                    }
                    if scripts[k].is_empty() {
                        scripts.swap_remove(k);
                    }
                    // Free fds of finished scripts (approximate: free when no script uses them).
                    let used: Vec<u32> =
                        scripts.iter().flat_map(|s| s.iter().map(|r| r.0)).collect();
                    for (c, busy) in busy_client.iter_mut().enumerate() {
                        if *busy && !used.contains(&(10 + c as u32)) {
                            *busy = false;
                        }
                    }
                    for u in 100..108 {
                        if !used.contains(&u) && !free_up.contains(&u) {
                            free_up.push(u);
                        }
                    }
                }
            }
            sim.finish();
            let counts = sim.j.counts().clone();
            let mut seen = std::collections::HashSet::new();
            for o in &sim.out {
                assert!(seen.insert(o.serial()), "serial {} twice", o.serial());
            }
            let client_side = sim
                .out
                .iter()
                .filter(|o| !matches!(o, Output::Incomplete(i) if i.client_fd.is_none()))
                .count() as u64;
            assert_eq!(
                client_side, counts.client_requests,
                "round {round}: {counts:?}"
            );
            assert_eq!(counts.exchanges + counts.incompletes, sim.out.len() as u64);
            assert_eq!(sim.j.open(), 0);
            assert!(counts.exchanges > 0, "round {round}: {counts:?}");
            // The per-record answers agree with the outputs' syscall lists.
            let mut listed: HashMap<u64, Vec<(u64, Role)>> = HashMap::new();
            for o in &sim.out {
                let calls = match o {
                    Output::Exchange(e) => &e.request.syscalls,
                    Output::Incomplete(i) => &i.request.syscalls,
                };
                for c in calls {
                    listed.entry(c.seq).or_default().push((o.serial(), c.role));
                }
            }
            for (i, a) in sim.answers.iter().enumerate() {
                let seq = i as u64 + 1;
                match a {
                    Assignment::To { serial, role } => {
                        assert!(listed[&seq].contains(&(*serial, *role)), "seq {seq}: {a:?}")
                    }
                    Assignment::None => assert!(!listed.contains_key(&seq), "seq {seq}"),
                    Assignment::Deferred => {}
                }
            }
            for e in sim.exchanges() {
                if let (Some(id), Some(u)) = (&e.request.request_id, e.request.upstream_fd) {
                    assert_eq!(ufd_of[id], u, "{e:?}");
                }
                // Every syscall of an exchange is on its own connections.
                for c in &e.request.syscalls {
                    match c.role {
                        ClientRequest | ClientResponse => assert_eq!(c.fd, e.client_fd),
                        UpstreamRequest | UpstreamResponse => {
                            assert_eq!(Some(c.fd), e.request.upstream_fd)
                        }
                    }
                }
            }
        }
    }
}
