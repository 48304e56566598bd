//! Message boundaries of one direction of one connection: a byte stream (of which only each
//! syscall's first bytes are seen) in, header blocks and message ends out.
//!
//! A header block is assembled from as many syscalls as it takes, up to [`MAX_HEAD`] bytes;
//! bodies are skipped by counting (Content-Length, chunk sizes, or until the connection
//! closes), so a body past the captured prefix costs nothing. Every step is linear in the bytes
//! it is given: the end of a header block is looked for in the new bytes only, and the start
//! line is checked while it is short and once when it ends.

use super::wire::{self, Head, Malformed};

/// Longest header block kept while it is being assembled; longer is [`Break::HeadTooLarge`].
pub const MAX_HEAD: usize = 64 * 1024;
/// Longest chunk-size or trailer line.
pub const MAX_LINE: usize = 4096;
/// A header block under construction is checked for a plausible start line on every append
/// while it is this short, then once when its first line ends.
const EARLY_CHECK: usize = 64;

/// Why a direction stopped being followed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Break {
    /// A header block (or a message start) past the captured prefix of a syscall.
    TruncatedHead,
    /// A chunk-size or trailer line past the captured prefix of a syscall.
    TruncatedChunk,
    /// Not a well-formed HTTP/1.x message where one should start.
    Malformed,
    /// A header block longer than [`MAX_HEAD`].
    HeadTooLarge,
    /// More headers than [`wire::MAX_HEADERS`].
    TooManyHeaders,
}

/// What [`Framer::step`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Ev {
    /// A header block ended and parsed; the message's body (if any) follows. The caller says
    /// how it is framed with [`Framer::body`].
    Head(Head),
    /// The message in progress ended.
    End,
    Bad(Break),
}

#[derive(Debug, Default)]
pub struct Framer {
    state: State,
    /// Bytes looked at while assembling header blocks, for the test that this stays linear.
    #[cfg(test)]
    scanned: usize,
}

#[derive(Debug, Default)]
enum State {
    /// At a message boundary.
    #[default]
    Start,
    /// Header block bytes so far, and whether its first line was found plausible.
    Head { buf: Vec<u8>, line_ok: bool },
    /// A parsed header block whose framing the caller has not said yet.
    Parsed,
    /// Body bytes left.
    Body(u64),
    /// A chunk-size line so far.
    ChunkSize(Vec<u8>),
    /// Chunk data and its CRLF left.
    ChunkData(u64),
    /// A trailer line so far (an empty one ends the message).
    Trailer(Vec<u8>),
    /// Everything until the connection ends is body.
    Close,
}

/// How the caller frames the body of the message whose head [`Ev::Head`] gave.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Body {
    /// No body: the message ended with its head.
    None,
    Length(u64),
    Chunked,
    /// Until the connection closes.
    Close,
}

impl Framer {
    /// Inside a header block not complete yet.
    pub fn in_head(&self) -> bool {
        matches!(self.state, State::Head { .. })
    }

    pub fn at_start(&self) -> bool {
        matches!(self.state, State::Start)
    }

    /// Inside a body that runs until the connection closes.
    pub fn until_close(&self) -> bool {
        matches!(self.state, State::Close)
    }

    /// Inside a body framed by length or chunks.
    pub fn in_counted_body(&self) -> bool {
        matches!(
            self.state,
            State::Body(_) | State::ChunkSize(_) | State::ChunkData(_) | State::Trailer(_)
        )
    }

    /// The first line of the header block under construction has ended.
    pub fn past_start_line(&self) -> bool {
        matches!(&self.state, State::Head { buf, .. } if buf.contains(&b'\n'))
    }

    /// Bytes held (a header block or a line under construction).
    pub fn held(&self) -> usize {
        match &self.state {
            State::Head { buf, .. } | State::ChunkSize(buf) | State::Trailer(buf) => buf.len(),
            _ => 0,
        }
    }

    /// Frames the body of the message [`Ev::Head`] just gave; `Body::None` ends it (the next
    /// [`Framer::step`] is at a message boundary).
    pub fn body(&mut self, body: Body) {
        self.state = match body {
            Body::None | Body::Length(0) => State::Start,
            Body::Length(n) => State::Body(n),
            Body::Chunked => State::ChunkSize(Vec::new()),
            Body::Close => State::Close,
        };
    }

    /// Consumes bytes of a syscall from `*pos` until the next event or the syscall's end
    /// (`None`). `bytes` is the captured prefix of the `len` bytes it moved.
    pub fn step(&mut self, bytes: &[u8], len: u64, pos: &mut u64) -> Option<Ev> {
        let cap = bytes.len() as u64;
        loop {
            if *pos >= len {
                return None;
            }
            match &mut self.state {
                State::Start => {
                    if *pos >= cap {
                        return Some(self.fail(Break::TruncatedHead, pos, len));
                    }
                    self.state = State::Head {
                        buf: Vec::new(),
                        line_ok: false,
                    };
                }
                State::Parsed => {
                    // The caller did not frame the body: take the message as ended.
                    self.state = State::Start;
                }
                State::Head { buf, line_ok } => {
                    if *pos >= cap {
                        return Some(self.fail(Break::TruncatedHead, pos, len));
                    }
                    let avail = &bytes[*pos as usize..];
                    let old = buf.len();
                    let room = (MAX_HEAD + 1).saturating_sub(old);
                    let took = avail.len().min(room);
                    buf.extend_from_slice(&avail[..took]);
                    let from = old.saturating_sub(3);
                    #[cfg(test)]
                    {
                        self.scanned += buf.len() - from;
                    }
                    if let Some(i) = find(&buf[from..], b"\r\n\r\n") {
                        let end = from + i + 4;
                        *pos += (end - old) as u64;
                        buf.truncate(end);
                        let block = std::mem::take(buf);
                        self.state = State::Parsed;
                        return Some(match wire::parse_head(&block) {
                            Ok(head) => Ev::Head(head),
                            Err(Malformed::TooManyHeaders) => {
                                self.fail(Break::TooManyHeaders, pos, len)
                            }
                            Err(Malformed::Syntax) => self.fail(Break::Malformed, pos, len),
                        });
                    }
                    let line_ended = !*line_ok && buf[old..].contains(&b'\n');
                    if (!*line_ok && buf.len() <= EARLY_CHECK) || line_ended {
                        let line_end = buf
                            .iter()
                            .position(|&b| b == b'\n')
                            .map_or(buf.len(), |i| i + 1);
                        #[cfg(test)]
                        {
                            self.scanned += 2 * line_end;
                        }
                        if !wire::start_prefix_ok(&buf[..line_end]) {
                            return Some(self.fail(Break::Malformed, pos, len));
                        }
                        *line_ok = line_ended;
                    }
                    if buf.len() > MAX_HEAD {
                        return Some(self.fail(Break::HeadTooLarge, pos, len));
                    }
                    *pos += took as u64;
                    if *pos < len {
                        return Some(self.fail(Break::TruncatedHead, pos, len));
                    }
                    return None;
                }
                State::Body(rem) => {
                    let n = (*rem).min(len - *pos);
                    *pos += n;
                    *rem -= n;
                    if *rem == 0 {
                        self.state = State::Start;
                        return Some(Ev::End);
                    }
                }
                State::Close => *pos = len,
                State::ChunkData(rem) => {
                    let n = (*rem).min(len - *pos);
                    *pos += n;
                    *rem -= n;
                    if *rem == 0 {
                        self.state = State::ChunkSize(Vec::new());
                    }
                }
                State::ChunkSize(line) | State::Trailer(line) => {
                    if *pos >= cap {
                        return Some(self.fail(Break::TruncatedChunk, pos, len));
                    }
                    let avail = &bytes[*pos as usize..];
                    let Some(i) = avail.iter().position(|&b| b == b'\n') else {
                        line.extend_from_slice(&avail[..avail.len().min(MAX_LINE + 1)]);
                        *pos += avail.len() as u64;
                        if line.len() > MAX_LINE {
                            return Some(self.fail(Break::Malformed, pos, len));
                        }
                        if *pos < len {
                            return Some(self.fail(Break::TruncatedChunk, pos, len));
                        }
                        return None;
                    };
                    line.extend_from_slice(&avail[..=i]);
                    *pos += i as u64 + 1;
                    if line.len() > MAX_LINE {
                        return Some(self.fail(Break::Malformed, pos, len));
                    }
                    let line = std::mem::take(line);
                    if matches!(self.state, State::Trailer(_)) {
                        if line == b"\r\n" || line == b"\n" {
                            self.state = State::Start;
                            return Some(Ev::End);
                        }
                        continue;
                    }
                    match wire::chunk_size(&line) {
                        None => return Some(self.fail(Break::Malformed, pos, len)),
                        Some(0) => self.state = State::Trailer(Vec::new()),
                        Some(n) => self.state = State::ChunkData(n.saturating_add(2)),
                    }
                }
            }
        }
    }

    /// Gives up on the direction: the rest of the syscall is skipped, and the direction
    /// restarts at a message boundary, holding nothing.
    fn fail(&mut self, why: Break, pos: &mut u64, len: u64) -> Ev {
        self.state = State::Start;
        *pos = len;
        Ev::Bad(why)
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::requests::kernel_only::wire::{Framing, Start};

    /// Feeds `chunks` as syscalls that each moved `len` bytes of which `chunk` was captured,
    /// framing every head's body by its headers; the events in order.
    fn run(chunks: &[(&[u8], u64)]) -> Vec<Ev> {
        let mut f = Framer::default();
        let mut out = Vec::new();
        for &(bytes, len) in chunks {
            let mut pos = 0;
            while let Some(ev) = f.step(bytes, len, &mut pos) {
                if let Ev::Head(head) = &ev {
                    let framing = match head.start {
                        Start::Request { .. } => head.body.request_framing().unwrap(),
                        _ => head.body.response_framing(200, false, false),
                    };
                    f.body(match framing {
                        Framing::Length(n) => Body::Length(n),
                        Framing::Chunked => Body::Chunked,
                        Framing::Close => Body::Close,
                        _ => Body::None,
                    });
                }
                out.push(ev);
            }
        }
        out
    }

    fn whole(b: &[u8]) -> (&[u8], u64) {
        (b, b.len() as u64)
    }

    fn ends(evs: &[Ev]) -> usize {
        evs.iter().filter(|e| **e == Ev::End).count()
    }

    #[test]
    fn a_head_over_many_reads_then_a_counted_body() {
        let evs = run(&[
            whole(b"POST / HT"),
            whole(b"TP/1.1\r\nContent-Le"),
            whole(b"ngth: 3\r\n\r"),
            whole(b"\nab"),
            whole(b"c"),
        ]);
        assert!(matches!(evs[0], Ev::Head(_)));
        assert_eq!(ends(&evs), 1);
    }

    #[test]
    fn a_body_past_the_capture_is_counted_not_read() {
        let head = b"HTTP/1.1 200 OK\r\nContent-Length: 5000\r\n\r\nxx";
        let evs = run(&[(head, head.len() as u64 - 2 + 5000)]);
        assert_eq!(ends(&evs), 1);
    }

    #[test]
    fn chunked_bodies_and_trailers() {
        let evs = run(&[
            whole(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n"),
            whole(b"0\r\nX-T: 1\r\n\r\n"),
        ]);
        assert_eq!(ends(&evs), 1);
        assert_eq!(
            run(&[whole(
                b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"
            )])[1],
            Ev::Bad(Break::Malformed)
        );
    }

    #[test]
    fn what_cannot_be_followed_is_said() {
        assert_eq!(
            run(&[(b"GET / HTTP/1.1\r\nHost: x", 1000)])[0],
            Ev::Bad(Break::TruncatedHead)
        );
        assert_eq!(run(&[whole(b"\x00\x01\x02")])[0], Ev::Bad(Break::Malformed));
        let huge = [&b"GET /"[..], &vec![b'a'; MAX_HEAD][..]].concat();
        assert_eq!(run(&[whole(&huge)])[0], Ev::Bad(Break::HeadTooLarge));
    }

    /// Issue 31, finding 3: a 64 KiB target sent a byte a read was ~2×10⁹ steps when every
    /// read rescanned the line; every byte is now looked at a bounded number of times.
    #[test]
    fn issue31_finding3_a_head_a_byte_at_a_time_is_linear() {
        let mut head = b"GET /".to_vec();
        head.extend(std::iter::repeat_n(b'a', MAX_HEAD - 100));
        head.extend_from_slice(b" HTTP/1.1\r\n\r\n");
        let mut f = Framer::default();
        let mut evs = Vec::new();
        for b in head.chunks(1) {
            let mut pos = 0;
            while let Some(ev) = f.step(b, 1, &mut pos) {
                evs.push(ev);
            }
        }
        assert!(matches!(evs[..], [Ev::Head(_)]), "{evs:?}");
        assert!(
            f.scanned <= 8 * head.len(),
            "{} bytes looked at for {}",
            f.scanned,
            head.len()
        );
    }

    #[test]
    fn nothing_is_held_past_its_cap() {
        let mut f = Framer::default();
        let mut pos = 0;
        // A method token that never ends is a plausible start until the cap.
        let line = vec![b'G'; 2 * MAX_HEAD];
        let ev = f.step(&line, line.len() as u64, &mut pos);
        assert_eq!(ev, Some(Ev::Bad(Break::HeadTooLarge)));
        assert_eq!(f.held(), 0);
    }
}
