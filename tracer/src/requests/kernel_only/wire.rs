//! The HTTP/1 wire: what a connection's first bytes are, and a header block's start line and
//! the headers that frame its body or name it, parsed with `httparse`.
//!
//! Everything here is a pure function of bytes, bounded by their length: the framer calls
//! [`classify`] once per connection start and [`parse_head`] once per complete header block.

/// Most headers a block may have; more is [`Malformed::TooManyHeaders`].
pub const MAX_HEADERS: usize = 128;
/// Longest `x-request-id` kept; a longer one is [`BadId`].
pub const MAX_ID: usize = 128;

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n";

/// What a chunk of bytes at the start of a message says about its connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Class {
    /// Starts with a complete HTTP/1.x request line.
    Request,
    /// Too short to tell, but could start a request line.
    Maybe,
    /// The HTTP/2 prior-knowledge preface (or a prefix of it).
    Http2,
    /// A TLS handshake record (0x16).
    Tls,
    Other,
}

/// What the first bytes of a connection (or of a chunk where a connection may restart) are.
pub fn classify(b: &[u8]) -> Class {
    match b.first() {
        None => return Class::Other,
        Some(0x16) => return Class::Tls,
        Some(_) => {}
    }
    if b.len() >= 3 && PREFACE.starts_with(&b[..b.len().min(PREFACE.len())]) {
        return Class::Http2;
    }
    match request_line(b) {
        Line::Complete => Class::Request,
        Line::Prefix => Class::Maybe,
        Line::Invalid => Class::Other,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Line {
    /// A whole request line (`METHOD SP target SP HTTP/1.d CRLF`).
    Complete,
    /// A prefix of one.
    Prefix,
    Invalid,
}

/// Whether `b` starts with an HTTP/1.x request line, by `httparse`: its method, target and
/// version parsed and the line ended. Costs one pass over the line.
pub fn request_line(b: &[u8]) -> Line {
    let mut headers = [httparse::EMPTY_HEADER; 0];
    let mut request = httparse::Request::new(&mut headers);
    match request.parse(b) {
        Ok(httparse::Status::Complete(_)) => Line::Complete,
        // Zero header slots: a complete line followed by a header is "too many headers".
        Err(httparse::Error::TooManyHeaders) => Line::Complete,
        Ok(httparse::Status::Partial) if request.version.is_some() => {
            let line = &b[..b.iter().position(|&c| c == b'\n').unwrap_or(b.len())];
            if line.len() < b.len() {
                Line::Complete
            } else {
                Line::Prefix
            }
        }
        Ok(httparse::Status::Partial) => Line::Prefix,
        Err(_) => Line::Invalid,
    }
}

/// Whether `b`, the start of a header block under construction, can still become one: a prefix
/// of a request line, of a status line, or of the HTTP/2 preface.
pub fn start_prefix_ok(b: &[u8]) -> bool {
    const STATUS: &[u8] = b"HTTP/1.";
    let n = b.len().min(STATUS.len());
    b[..n] == STATUS[..n]
        || request_line(b) != Line::Invalid
        || PREFACE.starts_with(&b[..b.len().min(PREFACE.len())])
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Start {
    Request { method: String, target: String },
    Response { status: u16 },
    Http2,
}

/// An `x-request-id`, as the joiner may use it: 1 to [`MAX_ID`] visible ASCII bytes.
pub type RequestId = Box<str>;

/// An `x-request-id` the joiner cannot use: not visible ASCII, empty, or over [`MAX_ID`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadId;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub start: Start,
    pub body: BodyHeaders,
    /// The first `x-request-id` header's value, OWS trimmed.
    pub request_id: Option<Result<RequestId, BadId>>,
}

/// The headers that frame the body.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BodyHeaders {
    pub content_length: Option<u64>,
    /// Transfer-Encoding present: whether its last coding is chunked.
    pub chunked: Option<bool>,
}

/// How a message's body is delimited (RFC 9112 §6.3).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Framing {
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

/// Why a header block is not one the joiner follows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Malformed {
    /// Not a well-formed HTTP/1.x header block.
    Syntax,
    /// More than [`MAX_HEADERS`] headers.
    TooManyHeaders,
}

impl BodyHeaders {
    pub fn request_framing(&self) -> Result<Framing, Malformed> {
        match (self.chunked, self.content_length) {
            (Some(true), _) => Ok(Framing::Chunked),
            (Some(false), _) => Err(Malformed::Syntax),
            (None, Some(n)) => Ok(Framing::Length(n)),
            (None, None) => Ok(Framing::None),
        }
    }

    /// `head`: the request was HEAD; `connect`: it was CONNECT.
    pub fn response_framing(&self, status: u16, head: bool, connect: bool) -> Framing {
        match status {
            101 => Framing::Upgrade,
            100..=199 => Framing::Interim,
            _ if connect && (200..300).contains(&status) => Framing::Upgrade,
            _ if head || status == 204 || status == 304 => Framing::None,
            _ => match (self.chunked, self.content_length) {
                (Some(true), _) => Framing::Chunked,
                (Some(false), _) | (None, None) => Framing::Close,
                (None, Some(n)) => Framing::Length(n),
            },
        }
    }
}

/// Parses a complete header block (start line to the empty line included).
pub fn parse_head(block: &[u8]) -> Result<Head, Malformed> {
    if block.starts_with(PREFACE) {
        return Ok(Head {
            start: Start::Http2,
            body: BodyHeaders::default(),
            request_id: None,
        });
    }
    let mut headers = [httparse::EMPTY_HEADER; MAX_HEADERS];
    let complete = |status: httparse::Result<usize>| match status {
        Ok(httparse::Status::Complete(_)) => Ok(()),
        Ok(httparse::Status::Partial) => Err(Malformed::Syntax),
        Err(httparse::Error::TooManyHeaders) => Err(Malformed::TooManyHeaders),
        Err(_) => Err(Malformed::Syntax),
    };
    let (start, headers) = if block.starts_with(b"HTTP/") {
        let mut response = httparse::Response::new(&mut headers);
        complete(response.parse(block))?;
        let status = response.code.ok_or(Malformed::Syntax)?;
        (Start::Response { status }, response.headers)
    } else {
        let mut request = httparse::Request::new(&mut headers);
        complete(request.parse(block))?;
        let (Some(method), Some(target)) = (request.method, request.path) else {
            return Err(Malformed::Syntax);
        };
        let start = Start::Request {
            method: method.to_owned(),
            target: target.to_owned(),
        };
        (start, request.headers)
    };
    let mut head = Head {
        start,
        body: BodyHeaders::default(),
        request_id: None,
    };
    for header in headers.iter() {
        let value = trim(header.value);
        if header.name.eq_ignore_ascii_case("content-length") {
            let n = std::str::from_utf8(value)
                .ok()
                .filter(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()))
                .and_then(|s| s.parse::<u64>().ok())
                .ok_or(Malformed::Syntax)?;
            if head.body.content_length.is_some_and(|m| m != n) {
                return Err(Malformed::Syntax);
            }
            head.body.content_length = Some(n);
        } else if header.name.eq_ignore_ascii_case("transfer-encoding") {
            let last = value.rsplit(|&b| b == b',').next().map(trim);
            head.body.chunked = Some(last.is_some_and(|c| c.eq_ignore_ascii_case(b"chunked")));
        } else if header.name.eq_ignore_ascii_case("x-request-id") && head.request_id.is_none() {
            head.request_id = Some(request_id(value));
        }
    }
    Ok(head)
}

fn request_id(value: &[u8]) -> Result<RequestId, BadId> {
    if value.is_empty() || value.len() > MAX_ID || !value.iter().all(u8::is_ascii_graphic) {
        return Err(BadId);
    }
    // Visible ASCII is UTF-8.
    std::str::from_utf8(value)
        .map(Into::into)
        .map_err(|_| BadId)
}

/// A chunk-size line (`hex[;ext]CRLF`), complete: the size. `None` if it is not one.
pub fn chunk_size(line: &[u8]) -> Option<u64> {
    match httparse::parse_chunk_size(line) {
        Ok(httparse::Status::Complete((used, size))) if used == line.len() => Some(size),
        _ => None,
    }
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
    use super::*;

    #[test]
    fn classifies_connection_starts() {
        assert_eq!(classify(b"GET / HTTP/1.1\r\nHost: x\r\n"), Class::Request);
        assert_eq!(classify(b"GET / HTTP/1.1\r\n"), Class::Request);
        assert_eq!(classify(b"G"), Class::Maybe);
        assert_eq!(classify(b"GET /x HTT"), Class::Maybe);
        assert_eq!(classify(b"PRI * HTTP/2.0\r\n\r\nSM"), Class::Http2);
        assert_eq!(classify(&[0x16, 3, 1]), Class::Tls);
        assert_eq!(classify(b"\x00\x01binary"), Class::Other);
        assert_eq!(classify(b"<134>Dec  4 syslog"), Class::Other);
        assert_eq!(classify(b""), Class::Other);
    }

    #[test]
    fn parses_request_and_response_heads() {
        let h = parse_head(
            b"POST /a?b HTTP/1.1\r\nHost: x\r\nContent-Length: 7\r\nX-Request-Id:  r-1 \r\n\r\n",
        )
        .unwrap();
        assert_eq!(
            h.start,
            Start::Request {
                method: "POST".into(),
                target: "/a?b".into()
            }
        );
        assert_eq!(h.body.request_framing(), Ok(Framing::Length(7)));
        assert_eq!(h.request_id, Some(Ok("r-1".into())));
        let h = parse_head(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: gzip, chunked\r\n\r\n").unwrap();
        assert_eq!(h.start, Start::Response { status: 200 });
        assert_eq!(h.body.response_framing(200, false, false), Framing::Chunked);
        assert_eq!(h.body.response_framing(200, true, false), Framing::None);
        assert_eq!(h.body.response_framing(101, false, false), Framing::Upgrade);
        assert_eq!(h.body.response_framing(100, false, false), Framing::Interim);
    }

    #[test]
    fn refuses_what_it_cannot_frame() {
        for bad in [
            &b"GET / HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n"[..],
            b"GET / HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            b"GET / HTTP/1.1\r\nbad header\r\n\r\n",
            b"HTTP/1.1 2x0 OK\r\n\r\n",
        ] {
            assert_eq!(parse_head(bad), Err(Malformed::Syntax), "{bad:?}");
        }
        let many: Vec<u8> = [b"GET / HTTP/1.1\r\n".to_vec()]
            .into_iter()
            .chain((0..=MAX_HEADERS).map(|i| format!("h{i}: v\r\n").into_bytes()))
            .chain([b"\r\n".to_vec()])
            .flatten()
            .collect();
        assert_eq!(parse_head(&many), Err(Malformed::TooManyHeaders));
    }

    #[test]
    fn an_id_is_visible_ascii_of_bounded_length() {
        let id = |v: &[u8]| {
            let mut block = b"GET / HTTP/1.1\r\nx-request-id: ".to_vec();
            block.extend_from_slice(v);
            block.extend_from_slice(b"\r\n\r\n");
            parse_head(&block).unwrap().request_id
        };
        assert_eq!(id(b"17"), Some(Ok("17".into())));
        assert_eq!(id(&[b'a'; MAX_ID]), Some(Ok("a".repeat(MAX_ID).into())));
        assert_eq!(id(&[b'a'; MAX_ID + 1]), Some(Err(BadId)));
        assert_eq!(id(b"caf\xc3\xa9"), Some(Err(BadId)));
        assert_eq!(id(b"a b"), Some(Err(BadId)));
    }

    #[test]
    fn chunk_sizes() {
        assert_eq!(chunk_size(b"1a\r\n"), Some(26));
        assert_eq!(chunk_size(b"0;ext=1\r\n"), Some(0));
        assert_eq!(chunk_size(b"zz\r\n"), None);
        assert_eq!(chunk_size(b"1a\r\nextra"), None);
    }

    #[test]
    fn request_line_prefixes() {
        assert_eq!(request_line(b"GET / HTTP/1.1\r\n"), Line::Complete);
        assert_eq!(request_line(b"GET / HTTP/1.1"), Line::Prefix);
        assert_eq!(request_line(b"GET /"), Line::Prefix);
        assert_eq!(request_line(b"GET / FTP/1.1\r\n"), Line::Invalid);
        assert!(start_prefix_ok(b"HTTP/1"));
        assert!(start_prefix_ok(b"PRI * HT"));
        assert!(!start_prefix_ok(b"\x00"));
    }
}
