//! A kernel-only stream from arbitrary bytes, for the joiner and rebuild targets: data records
//! of three processes' threads and fds, mostly HTTP fragments (so that exchanges form, split
//! and break in every way), new connections, time jumps past every timeout, and the socket and
//! scheduler events the rebuild reads. Times only grow, as the reader hands them over.

use tracer::events::data::Data;
use tracer_ebpf::abi::{Event, fd_arg, kind, syscall};

pub enum Item {
    Data(Data),
    Opened { tgid: u32, fd: u32, accept: bool, at: u64 },
    Event(Event),
    Lost(u64, u64),
}

const FRAGMENTS: &[&[u8]] = &[
    b"GET / HTTP/1.1\r\nHost: a\r\n\r\n",
    b"POST /a HTTP/1.1\r\nContent-Length: 5\r\n\r\nhello",
    b"POST /a HTTP/1.1\r\nx-request-id: 1\r\nContent-Length: 0\r\n\r\n",
    b"POST /a HTTP/1.1\r\nx-request-id: 2\r\nContent-Length: 0\r\n\r\n",
    b"GET / HTTP/1.1\r\nx-request-id: caf\xc3\xa9\r\n\r\n",
    b"PUT /c HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"5\r\nhello\r\n",
    b"0\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok",
    b"HTTP/1.1 100 Continue\r\n\r\n",
    b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
    b"HTTP/1.1 204 No Content\r\n\r\n",
    b"HTTP/1.0 200 OK\r\n\r\nuntil close",
    b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
    b"GET",
    b" /x HTTP/1.1\r\n",
    b"\r\n",
    b"\x16\x03\x01",
    b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
    b"<134>Dec  4 proxy: log",
];

struct Bytes<'a>(&'a [u8]);

impl Bytes<'_> {
    fn next(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }

    fn take(&mut self, n: usize) -> &[u8] {
        let n = n.min(self.0.len());
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        head
    }
}

pub fn items(data: &[u8]) -> Vec<Item> {
    let mut input = Bytes(data);
    let mut now: u64 = 1_000_000;
    let mut out = Vec::new();
    while let Some(op) = input.next() {
        let who = input.next().unwrap_or(0);
        let (tgid, tid, fd) = (
            100 + u32::from(who & 3),
            1 + u32::from((who >> 2) & 7),
            3 + u32::from(who >> 5),
        );
        now += u64::from(op >> 4) * 50_000 + 1_000;
        match op & 7 {
            0..=2 | 4 => {
                let receive = input.next().unwrap_or(0) & 1 == 0;
                let bytes = if op & 7 == 4 {
                    let n = usize::from(input.next().unwrap_or(0));
                    input.take(n).to_vec()
                } else {
                    let i = usize::from(input.next().unwrap_or(0)) % FRAGMENTS.len();
                    FRAGMENTS[i].to_vec()
                };
                if bytes.is_empty() {
                    continue;
                }
                // Sometimes the syscall moved more than was captured.
                let len = bytes.len() as u64 + u64::from(input.next().unwrap_or(0) >> 6) * 300;
                out.push(Item::Data(Data {
                    enter_ns: now - 500,
                    exit_ns: now,
                    tgid,
                    tid: tgid + tid,
                    fd,
                    syscall: if receive { syscall::READ } else { syscall::WRITEV },
                    len,
                    bytes: bytes[..bytes.len().min(512)].to_vec(),
                }));
            }
            3 => out.push(Item::Opened {
                tgid,
                fd,
                accept: who & 0x80 == 0,
                at: now,
            }),
            5 => now += u64::from(input.next().unwrap_or(0)) * 100_000_000,
            6 => {
                let sk = 0x1000 + u64::from(fd);
                let which = input.next().unwrap_or(0);
                let ev = |kind, sub, args| Event {
                    ts_ns: now,
                    tid: tgid + tid,
                    kind,
                    sub,
                    args,
                };
                out.push(Item::Event(match which % 7 {
                    0 => ev(kind::DATA_READY, 0, [sk, 0, 0]),
                    1 => ev(kind::SOCK_FD, 0, [sk, u64::from(fd), u64::from(tgid)]),
                    2 => ev(kind::ESTABLISHED, 0, [sk, 80, 40_000 + u64::from(fd)]),
                    3 => ev(kind::SWITCH_OUT, u16::from(which & 8 != 0), [u64::MAX, u64::MAX, 0]),
                    4 => ev(kind::SWITCH_IN, 0, [0; 3]),
                    5 => ev(kind::WAKEUP, 0, [0; 3]),
                    _ => ev(
                        kind::SYSCALL,
                        if which & 8 != 0 { syscall::ACCEPT } else { syscall::CONNECT },
                        [now - 100, fd_arg(fd, tgid), u64::from(fd)],
                    ),
                }));
            }
            _ => out.push(Item::Lost(now.saturating_sub(200_000), now)),
        }
    }
    out
}
