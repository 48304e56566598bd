//! The joiner on scripted streams: each test a proxy's pattern, a way a connection ends, or
//! what hostile traffic must not do.

use std::collections::{HashMap, HashSet, VecDeque};

use tracer_ebpf::abi::{
    DATA_BYTES,
    syscall::{READ, RECVFROM, SENDTO, WRITE, WRITEV},
};

use super::*;
use crate::requests::kernel_only::matcher;

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
        self.moved(tid, fd, syscall, bytes, bytes.len() as u64)
    }

    /// A syscall that moved `len` bytes, of which `bytes` were captured (their first
    /// `DATA_BYTES`).
    fn moved(&mut self, tid: u32, fd: u32, syscall: u16, bytes: &[u8], len: u64) -> Assignment {
        self.t += 1_000;
        let d = Data {
            enter_ns: self.t - 400,
            exit_ns: self.t,
            tgid: self.tgid,
            tid,
            fd,
            syscall,
            len,
            bytes: bytes[..bytes.len().min(DATA_BYTES)].to_vec(),
        };
        let a = self.j.push(&d, None);
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

    /// The kernel says `fd` is a new connection (an accept or a connect).
    fn opened(&mut self, fd: u32, how: Opened) {
        self.t += 1_000;
        self.j.opened(self.tgid, fd, how, self.t);
        self.out.extend(self.j.take());
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

/// The answer for a record of `r`'s in `role`: an upstream one names its (last) upstream
/// request.
fn to(r: &Request, role: Role) -> Assignment {
    let serial = match role {
        UpstreamRequest | UpstreamResponse => *r.upstreams.last().expect("joined"),
        ClientRequest | ClientResponse => r.serial,
    };
    Assignment::To { serial, role }
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
        assert_eq!(
            e.request.request_id.as_deref(),
            Some(format!("id-{i}").as_str())
        );
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

/// Two identical requests pending when one upstream request goes out, both answered after its
/// response: either could be its. Nothing is guessed: the upstream request joins nothing and
/// both client requests are incomplete, never complete with its wait charged elsewhere.
#[test]
fn no_id_ambiguous_request_line_is_not_guessed() {
    let mut sim = Sim::new();
    let a = req("GET", "/same", &[], b"");
    sim.recv(3, &a);
    sim.recv(4, &a);
    let answer = sim.send(6, &a);
    assert!(matches!(answer, Assignment::To { .. }));
    assert!(sim.out.is_empty(), "{:?}", sim.out);
    let s = resp(200, b"x");
    sim.recv(6, &s);
    sim.send(3, &s);
    sim.send(4, &s);
    // Only threads could tell them apart, and this process has not shown it keeps a request
    // on one thread: they wait for that, then are ambiguous.
    assert!(sim.out.is_empty(), "{:?}", sim.out);
    sim.wait(matcher::PARK_NS + SWEEP_NS);
    sim.rec(1, 20, WRITE, b"log line\n");
    let i = sim.incompletes();
    assert_eq!(i.len(), 3, "{:?}", sim.out);
    let reasons: HashSet<Reason> = i.iter().map(|i| i.reason).collect();
    assert_eq!(
        reasons,
        HashSet::from([Reason::NotJoined(Failure::Ambiguous), Reason::Ambiguous])
    );
    assert!(sim.exchanges().is_empty());
    // An upstream request with an id nobody received is the proxy's: none pending, none joined.
    sim.send(6, &req("GET", "/x", &[("x-request-id", "nobody")], b""));
    sim.send(6, &req("GET", "/y", &[], b""));
    let reasons: Vec<_> = sim.incompletes()[3..].iter().map(|i| i.reason).collect();
    assert_eq!(
        reasons,
        [
            Reason::NotJoined(Failure::NoCandidate),
            Reason::NotJoined(Failure::NoCandidate)
        ]
    );
}

/// The same two identical requests, but the first upstream response comes back and its client
/// request is answered before the second's arrives: the order of the answers joins both.
#[test]
fn identical_requests_are_told_apart_by_the_order_of_their_answers() {
    let mut sim = Sim::new();
    let a = req("POST", "/same", &[], b"{}");
    sim.recv(3, &a);
    sim.recv(4, &a);
    sim.send(6, &a);
    sim.send(7, &a);
    // fd 7's upstream answers first, and fd 4's client gets its answer before fd 6's comes.
    let s = resp(200, b"x");
    sim.recv(7, &s);
    sim.send(4, &s);
    sim.recv(6, &s);
    sim.send(3, &s);
    let e = sim.exchanges();
    assert_eq!(e.len(), 2, "{:?}", sim.out);
    let pairs: HashSet<(u32, Option<u32>)> = e
        .iter()
        .map(|e| (e.client_fd, e.request.upstream_fd))
        .collect();
    assert_eq!(pairs, HashSet::from([(3, Some(6)), (4, Some(7))]));
    assert_eq!(sim.j.counts().joins.by_time, 2);
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
    sim.recv(3, &req("GET", "/old", &[("x-request-id", "c3")], b""));
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
    assert_eq!(i[1].reason, Reason::NotJoined(Failure::NoCandidate));
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
    sim.recv(5, &req("GET", "/slow", &[("x-request-id", "slow-2")], b""));
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
                let used: Vec<u32> = scripts.iter().flat_map(|s| s.iter().map(|r| r.0)).collect();
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
        let mut seen = HashSet::new();
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
            let r = o.request();
            for c in &r.syscalls {
                for name in std::iter::once(r.serial).chain(r.upstreams.iter().copied()) {
                    listed.entry(c.seq).or_default().push((name, c.role));
                }
            }
        }
        for (i, a) in sim.answers.iter().enumerate() {
            let seq = i as u64 + 1;
            match a {
                // Listed in its request's output, unless that request ended before the record's
                // upstream request joined it.
                Assignment::To { serial, role } => assert!(
                    listed
                        .get(&seq)
                        .is_none_or(|l| l.contains(&(*serial, *role))),
                    "seq {seq}: {a:?}"
                ),
                Assignment::None => assert!(!listed.contains_key(&seq), "seq {seq}"),
                Assignment::Deferred => {}
            }
        }
        for e in sim.exchanges() {
            if let (Some(id), Some(u)) = (&e.request.request_id, e.request.upstream_fd) {
                assert_eq!(ufd_of[&id.to_string()], u, "{e:?}");
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

/// Issue 31, finding 2: a client that sent `G` and closed left a byte in the framer; the next
/// client accepted on that fd had `GPOST …` parsed, and the old read taken as its arrival. An
/// aborted response left its exchange open, and the next client's request counted as
/// pipelined. The accept that returns the fd ends all of that.
#[test]
fn issue31_finding2_state_does_not_outlive_its_connection() {
    let mut sim = Sim::new();
    assert_eq!(sim.recv(3, b"G"), Assignment::Deferred);
    sim.opened(3, Opened::Accepted);
    sim.proxy(3, 6, "n");
    let r = &sim.only_exchange().request;
    assert_eq!((r.method.as_str(), r.syscalls.len()), ("POST", 4));
    assert!(
        r.syscalls.iter().all(|c| c.seq > 1),
        "the old read is not its"
    );
    // A response cut mid-body by the client going away; the fd accepted again.
    let mut sim = Sim::new();
    let r = req("GET", "/a", &[("x-request-id", "a1")], b"");
    sim.recv(3, &r);
    sim.send(6, &r);
    let s = resp(200, &[b'z'; 100]);
    sim.recv(6, &s);
    sim.send(3, &s[..s.len() - 90]);
    sim.opened(3, Opened::Accepted);
    sim.proxy(3, 7, "b1");
    assert_eq!(sim.unsupported(Unsupported::Pipelined), 0);
    assert_eq!(sim.incompletes()[0].reason, Reason::Reset);
    assert_eq!(
        sim.only_exchange().request.request_id.as_deref(),
        Some("b1")
    );
    assert_eq!(sim.j.counts().reopened, 1);
}

/// Issue 31, finding 4: a header block a byte per read held every read (65k reads ~3 MiB a
/// direction), and an exchange kept every syscall of a stream that never pauses.
#[test]
fn issue31_finding4_traffic_cannot_grow_memory_without_bound() {
    let mut sim = Sim::new();
    sim.recv(3, b"GET /");
    for _ in 0..4 * MAX_HEAD_CALLS {
        sim.recv(3, b"a");
    }
    assert_eq!(sim.unsupported(Unsupported::HeadInTooManyReads), 1);
    assert_eq!(sim.j.held_calls(), 0);
    // A request body streamed in more syscalls than an exchange keeps.
    let head = req(
        "POST",
        "/up",
        &[("x-request-id", "stream"), ("transfer-encoding", "chunked")],
        b"",
    );
    sim.recv(4, &head);
    sim.send(8, &head);
    for _ in 0..MAX_CALLS {
        sim.recv(4, b"1\r\nx\r\n");
        assert!(sim.j.held_calls() <= MAX_CALLS);
    }
    sim.recv(4, b"0\r\n\r\n");
    let s = resp(200, b"");
    sim.recv(8, &s);
    sim.send(4, &s);
    assert_eq!(sim.incompletes()[0].reason, Reason::TooManySyscalls);
    assert_eq!(sim.j.held_calls(), 0);
    // Clients that never wait for an answer: past MAX_OPEN, new ones end at once.
    let mut sim = Sim::new();
    let r = req("GET", "/", &[], b"");
    for fd in 0..=MAX_OPEN as u32 {
        sim.recv(1_000 + fd, &r);
    }
    assert_eq!(sim.j.open(), MAX_OPEN);
    assert_eq!(sim.incompletes()[0].reason, Reason::TooManyOpen);
}

/// Issue 31, finding 5: a repeated id let the oldest pending request take the join, and ids
/// that are not text collided after a lossy conversion. Now a repeated id joins nothing and
/// makes its requests incomplete; an unusable one too.
#[test]
fn issue31_finding5_ids_cannot_steer_a_join() {
    let mut sim = Sim::new();
    let victim = req("GET", "/pay", &[("x-request-id", "v-1")], b"");
    let attacker = req("GET", "/pay", &[("x-request-id", "v-1")], b"");
    sim.recv(3, &victim);
    sim.recv(4, &attacker);
    sim.send(6, &victim);
    let s = resp(200, b"");
    sim.recv(6, &s);
    sim.send(3, &s);
    sim.send(4, &s);
    assert!(sim.exchanges().is_empty(), "{:?}", sim.out);
    let reasons: HashSet<Reason> = sim.incompletes().iter().map(|i| i.reason).collect();
    assert_eq!(
        reasons,
        HashSet::from([Reason::DuplicateId, Reason::NotJoined(Failure::DuplicateId)])
    );
    // Two ids that are not visible ASCII: neither joins.
    let mut sim = Sim::new();
    let mut a = b"GET / HTTP/1.1\r\nx-request-id: caf\xc3\xa9\r\n\r\n".to_vec();
    sim.recv(3, &a);
    sim.send(6, &a);
    a[27] = 0xe9;
    sim.recv(4, &a[..a.len() - 1]);
    let s = resp(200, b"");
    sim.recv(6, &s);
    sim.send(3, &s);
    assert_eq!(
        sim.incompletes()[..2]
            .iter()
            .map(|i| i.reason)
            .collect::<Vec<_>>(),
        [Reason::NotJoined(Failure::BadId), Reason::BadId]
    );
}

/// An upstream request no pending client request matches (the proxy rewrote its path): the
/// client request answered meanwhile may have been its, so it is not complete without one.
#[test]
fn a_client_request_with_unjoined_upstream_traffic_inside_it_is_incomplete() {
    let mut sim = Sim::new();
    sim.recv(3, &req("GET", "/a", &[], b""));
    sim.send(6, &req("GET", "/api/a", &[], b""));
    let s = resp(200, b"ok");
    sim.recv(6, &s);
    sim.send(3, &s);
    let i = sim.incompletes();
    assert_eq!(
        i.iter().map(|i| i.reason).collect::<Vec<_>>(),
        [
            Reason::NotJoined(Failure::NoCandidate),
            Reason::UnjoinedUpstream
        ]
    );
    // One the proxy answered with nothing else going upstream is complete, without upstream.
    sim.recv(4, &req("GET", "/local", &[], b""));
    sim.send(4, &resp(404, b""));
    let e = sim.only_exchange();
    assert_eq!((e.request.status, e.request.upstream_fd), (Some(404), None));
}

/// Apache before the capture walked its iovecs: every upstream header block past the bytes
/// captured. Its client requests are incomplete, not complete with the upstream wait charged
/// to the proxy.
#[test]
fn an_upstream_header_block_past_the_capture_leaves_its_client_request_incomplete() {
    let mut sim = Sim::new();
    let r = req("POST", "/echo", &[], b"{}");
    sim.recv(3, &r);
    sim.opened(6, Opened::Connected);
    // The start of a writev whose other iovecs were not walked.
    assert_eq!(sim.moved(1, 6, WRITEV, &r[..40], 600), Assignment::None);
    let s = resp(200, b"{}");
    sim.recv(6, &s);
    sim.send(3, &s);
    assert_eq!(sim.unsupported(Unsupported::TruncatedHead), 1);
    assert_eq!(
        sim.incompletes()
            .iter()
            .map(|i| i.reason)
            .collect::<Vec<_>>(),
        [Reason::UnjoinedUpstream]
    );
}

/// A reply on a connection the proxy opened that is not HTTP (FastCGI, a cache) may be any
/// request's wait; a socket it only writes to (syslog) is nobody's.
#[test]
fn non_http_upstream_replies_count_but_a_log_socket_does_not() {
    let mut sim = Sim::new();
    sim.recv(3, &req("GET", "/php", &[], b""));
    sim.opened(9, Opened::Connected);
    sim.rec(1, 9, WRITE, b"\x01\x01\x00\x01\x00\x08\x00\x00");
    sim.rec(1, 10, SENDTO, b"<134>Dec  4 proxy: GET /php");
    sim.rec(1, 9, READ, b"\x01\x06\x00\x01\x00\x20\x00\x00");
    sim.send(3, &resp(200, b"php"));
    assert_eq!(sim.incompletes()[0].reason, Reason::UnjoinedUpstream);
    sim.recv(4, &req("GET", "/static", &[], b""));
    sim.rec(1, 10, SENDTO, b"<134>Dec  4 proxy: GET /static");
    sim.send(4, &resp(200, b"css"));
    assert_eq!(sim.exchanges().len(), 1);
}
