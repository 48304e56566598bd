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
//!   in the same process (oldest not yet joined one first); without an id (or with an id no
//!   client request carried, e.g. a proxy-generated one, then among id-less client requests
//!   only), to the single pending client request of that process with the identical method and
//!   target, and to none when zero or several are pending ([`JoinFailure`]). The upstream
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

/// A proxied request whose client response's last byte was sent.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Exchange {
    /// Unique per [`Joiner`], given when the client request's header block was parsed; what
    /// [`Assignment::To`] names.
    pub serial: u64,
    pub tgid: u32,
    pub client_fd: u32,
    /// The upstream connection its request was sent on; `None` when the proxy answered by
    /// itself (no upstream request joined it).
    pub upstream_fd: Option<u32>,
    /// The `x-request-id` value (client's, else the upstream request's), OWS trimmed.
    pub request_id: Option<String>,
    /// [`id_key`] of `request_id`.
    pub key: Option<u64>,
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

/// A client request (or an unjoined upstream request) that did not end as an [`Exchange`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Incomplete {
    pub reason: Reason,
    /// The fields as far as they were known; `client_fd == None` only for
    /// [`Reason::NotJoined`] (an upstream request, `syscalls` holding its sends). Its
    /// `serial` is fresh in that case too.
    pub serial: u64,
    pub tgid: u32,
    pub client_fd: Option<u32>,
    pub upstream_fd: Option<u32>,
    pub request_id: Option<String>,
    pub key: Option<u64>,
    pub method: String,
    pub target: String,
    pub status: Option<u16>,
    pub upstream_status: Option<u16>,
    pub syscalls: Vec<Syscall>,
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
    /// It had an `x-request-id` no pending client request of the process had, and no id-less
    /// pending client request had its request line.
    UnknownId,
    /// No `x-request-id`, and no pending client request with its request line.
    NoIdNoCandidate,
    /// No `x-request-id`, and several pending client requests with its request line.
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

impl Output {
    pub fn serial(&self) -> u64 {
        match self {
            Output::Exchange(e) => e.serial,
            Output::Incomplete(i) => i.serial,
        }
    }
}

/// The per-record answer of [`Joiner::push`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Assignment {
    /// Not part of any followed exchange (other fds, unsupported connections, messages whose
    /// request was never seen, unjoined upstream requests).
    None,
    /// Part of a header block not complete yet: its exchange is not known yet. The record
    /// (by `seq`) will be listed in the `syscalls` of the [`Output`] it ends in, if any.
    Deferred,
    /// Bytes of the exchange `serial` (the first one when it moved bytes of two).
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
    if !id.is_empty() && id.bytes().all(|b| b.is_ascii_digit()) {
        if let Ok(n) = id.parse::<u64>() {
            return n;
        }
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
                    let frame = &conn.framer(dir).state;
                    // A request line where this connection has none: the fd is another
                    // connection now (closed and reused, or a header block abandoned).
                    let reused = match frame {
                        Frame::Start => !requests_here,
                        Frame::Head(buf) => !buf.is_empty(),
                        // A close-delimited response only ends with its connection.
                        Frame::Close => true,
                        _ => false,
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
        *conn = Conn {
            kind: match dir {
                Direction::Receive => Kind::Client,
                Direction::Send => Kind::Upstream,
            },
            last_ns: conn.last_ns,
            ..Conn::default()
        };
    }

    /// The connection's fd is another connection now: its client exchange cannot finish.
    fn reset(&mut self, conn: &mut Conn) {
        if conn.kind == Kind::Client {
            if let Some(s) = self.live(conn.current) {
                let close = self.open[&s].until_close;
                self.end(s, if close { None } else { Some(Reason::Reset) });
            }
        }
        *conn = Conn {
            last_ns: conn.last_ns,
            ..Conn::default()
        };
    }

    fn unsupported(&mut self, conn: &mut Conn, kind: Unsupported) {
        *self.counts.unsupported.entry(kind).or_default() += 1;
        if let Some(s) = self.live(conn.current) {
            self.end(s, Some(Reason::Unsupported(kind)));
        }
        *conn = Conn {
            kind: Kind::Unsupported,
            last_ns: conn.last_ns,
            ..Conn::default()
        };
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
        loop {
            let owner = self.live(conn.owner(dir));
            let before = pos;
            let ev = conn.framer(dir).step(&d.bytes, d.len, &mut pos);
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
                    match self.head(conn, d, dir, head, &calls) {
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
                                    if let Some(o) = owner.and_then(|s| self.open.get_mut(&s)) {
                                        if role == Role::ClientResponse {
                                            o.until_close = true;
                                        }
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
                .syscalls
                .iter()
                .rev()
                .take(4)
                .any(|c| c.seq == call.seq && c.role == call.role)
            {
                o.syscalls.push(call.clone());
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
                let o = self.open.get_mut(&s).expect("live");
                let framing =
                    body.response_framing(status, o.method == "HEAD", o.method == "CONNECT")?;
                if framing != Framing::Interim {
                    o.status = Some(status);
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
                        let o = self.open.get_mut(&s).expect("pending is open");
                        o.upstream_fd = Some(d.fd);
                        if o.request_id.is_none() {
                            o.key = head.request_id.as_deref().map(id_key);
                            o.request_id = head.request_id;
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
                        self.out.push(Output::Incomplete(Incomplete {
                            reason: Reason::NotJoined(failure),
                            serial: self.serial,
                            tgid: d.tgid,
                            client_fd: None,
                            upstream_fd: Some(d.fd),
                            key: head.request_id.as_deref().map(id_key),
                            request_id: head.request_id,
                            method,
                            target,
                            status: None,
                            upstream_status: None,
                            syscalls: calls.to_vec(),
                        }));
                        Ok((None, framing))
                    }
                }
            }
            (Kind::Upstream, Direction::Receive, Start::Response { status }) => {
                let owner = self.live(conn.current);
                conn.recv_owner = owner;
                let framing = body.response_framing(status, conn.head_request, conn.connect)?;
                if framing != Framing::Interim {
                    if let Some(o) = owner.and_then(|s| self.open.get_mut(&s)) {
                        o.upstream_status = Some(status);
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
                serial: s,
                tgid: d.tgid,
                client_fd: d.fd,
                upstream_fd: None,
                key: request_id.as_deref().map(id_key),
                request_id,
                method,
                target,
                status: None,
                upstream_status: None,
                syscalls: Vec::new(),
                last_ns: d.exit_ns,
                until_close: false,
            },
        );
        s
    }

    /// The pending client request an upstream request belongs to (and no longer pending).
    fn join(
        &mut self,
        tgid: u32,
        method: &str,
        target: &str,
        id: Option<&str>,
    ) -> Result<u64, JoinFailure> {
        if let Some(id) = id {
            if let Some(&s) = self
                .by_id
                .get(&(tgid, id.to_owned()))
                .and_then(|q| q.front())
            {
                self.unpend(s);
                return Ok(s);
            }
        }
        let line = (tgid, method.to_owned(), target.to_owned());
        let candidates: Vec<u64> = self
            .by_line
            .get(&line)
            .map(|q| {
                q.iter()
                    .copied()
                    .filter(|s| id.is_none() || self.open[s].request_id.is_none())
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
        let Some(o) = self.open.get(&s) else { return };
        if let Some(id) = &o.request_id {
            let k = (o.tgid, id.clone());
            if let Some(q) = self.by_id.get_mut(&k) {
                q.retain(|&x| x != s);
                if q.is_empty() {
                    self.by_id.remove(&k);
                }
            }
        }
        let k = (o.tgid, o.method.clone(), o.target.clone());
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
                if let Some(s) = self.live(owner) {
                    if self.open[&s].status.is_some() {
                        self.end(s, None);
                        conn.current = None;
                    }
                }
            }
            (_, Direction::Send) => conn.send_owner = None,
            (_, Direction::Receive) => conn.recv_owner = None,
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
                    serial: o.serial,
                    tgid: o.tgid,
                    client_fd: o.client_fd,
                    upstream_fd: o.upstream_fd,
                    request_id: o.request_id,
                    key: o.key,
                    method: o.method,
                    target: o.target,
                    status: o.status,
                    upstream_status: o.upstream_status,
                    syscalls: o.syscalls,
                })
            }
            Some(reason) => {
                self.counts.incompletes += 1;
                Output::Incomplete(Incomplete {
                    reason,
                    serial: o.serial,
                    tgid: o.tgid,
                    client_fd: Some(o.client_fd),
                    upstream_fd: o.upstream_fd,
                    request_id: o.request_id,
                    key: o.key,
                    method: o.method,
                    target: o.target,
                    status: o.status,
                    upstream_status: o.upstream_status,
                    syscalls: o.syscalls,
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
            .map(|o| o.serial)
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
    serial: u64,
    tgid: u32,
    client_fd: u32,
    upstream_fd: Option<u32>,
    request_id: Option<String>,
    key: Option<u64>,
    method: String,
    target: String,
    status: Option<u16>,
    upstream_status: Option<u16>,
    syscalls: Vec<Syscall>,
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
    /// Client connection: its open exchange. Upstream connection: the exchange of the last
    /// request sent on it. May be stale (ended); checked against the open set.
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
