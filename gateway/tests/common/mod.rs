//! Shared helpers for the gateway's integration tests: start the real binaries, talk HTTP/1.1
//! over loopback with a deliberately tiny client (one request per connection).

#![expect(
    dead_code,
    reason = "each test binary uses a different subset of the helpers"
)]

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

/// How long a server may take to print `listening on ADDR`.
const READY: Duration = Duration::from_secs(20);

/// A started binary and the address it listens on. The process is a [`testproc::Proc`]:
/// stopped (SIGTERM, then SIGKILL) and reaped on drop, so a failing test leaves nothing behind;
/// its output is kept and quoted when it fails to start.
pub struct Proc {
    pub proc: testproc::Proc,
    pub addr: String,
}

/// Starts `bin args...` and waits (bounded) for its `listening on ADDR` line.
pub fn spawn_listening(bin: &str, args: &[&str]) -> Proc {
    let mut command = Command::new(bin);
    command.args(args);
    spawn_command(command)
}

/// Starts `command` (its stdout and stderr are read here) and waits (bounded) for
/// `listening on ADDR`.
pub fn spawn_command(command: Command) -> Proc {
    listening(start(testproc::Spawn::command(name_of(&command), command)))
}

/// Like [`spawn_command`], with stdout and stderr also written to `log` for the test to read.
pub fn spawn_command_logged(command: Command, log: &Path) -> Proc {
    listening(start(
        testproc::Spawn::command(name_of(&command), command).log(log),
    ))
}

fn name_of(command: &Command) -> String {
    Path::new(command.get_program())
        .file_name()
        .map_or_else(String::new, |name| name.to_string_lossy().into_owned())
}

/// The built gateway binary that the tests run.
pub const GATEWAY: &str = env!("CARGO_BIN_EXE_gateway");

/// The symbol `name` of `file` (the parsed [`GATEWAY`]), panicking when it is not there.
pub fn symbol<'data, 'file>(
    file: &'file object::File<'data>,
    name: &str,
) -> object::Symbol<'data, 'file> {
    use object::{Object as _, ObjectSymbol as _};
    file.symbols()
        .find(|s| s.name() == Ok(name))
        .unwrap_or_else(|| panic!("{name} is not in {GATEWAY}'s symbol table"))
}

/// Starts `spawn`, panicking with why it could not.
pub fn start(spawn: testproc::Spawn) -> testproc::Proc {
    spawn.start().unwrap_or_else(|e| panic!("{e:#}"))
}

fn listening(mut proc: testproc::Proc) -> Proc {
    let addr = proc
        .wait_for_prefix("listening on ", READY)
        .unwrap_or_else(|e| panic!("{e:#}"));
    Proc { proc, addr }
}

pub fn mock_upstream(delay_ms: u64) -> Proc {
    let delay = delay_ms.to_string();
    spawn_listening(
        env!("CARGO_BIN_EXE_mock-upstream"),
        &["--listen", "127.0.0.1:0", "--delay-ms", &delay],
    )
}

/// Runs the gateway CLI to completion, returning (exit code, stdout, stderr).
pub fn gateway_cli(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(args)
        .output()
        .expect("running gateway");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub fn gateway_serve(db: &Path, extra: &[&str]) -> Proc {
    spawn_command(gateway_serve_command(db, extra))
}

/// `gateway serve --db DB --listen 127.0.0.1:0 extra...`, not started yet.
pub fn gateway_serve_command(db: &Path, extra: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_gateway"));
    command
        .args(["serve", "--db", db.to_str().expect("utf-8 temp path")])
        .args(["--listen", "127.0.0.1:0"])
        .args(extra);
    command
}

/// Like [`gateway_serve`], with its output also going to `log` for the test to read.
pub fn gateway_serve_logged(db: &Path, extra: &[&str], log: &Path) -> Proc {
    spawn_command_logged(gateway_serve_command(db, extra), log)
}

/// Waits (bounded) for the process to exit by itself, and for its output; its exit status.
pub fn wait_exit(proc: &mut Proc, within: Duration) -> std::process::ExitStatus {
    proc.proc
        .wait_timeout(within)
        .unwrap_or_else(|e| panic!("{e:#}"))
}

pub struct Reply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Reply {
    /// The body as text, for a failed assertion's message.
    pub fn text(&self) -> std::borrow::Cow<'_, str> {
        String::from_utf8_lossy(&self.body)
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("body is not JSON ({e}): {}", self.text()))
    }

    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The `code` of a `{"error", "code"}` body.
    pub fn code(&self) -> String {
        self.json()["code"].as_str().unwrap_or_default().to_owned()
    }
}

/// One HTTP/1.1 request with `Connection: close`; reads the whole response.
pub fn http(addr: &str, method: &str, path: &str, headers: &[(&str, &str)], body: &[u8]) -> Reply {
    try_http(addr, method, path, headers, body).unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

/// Like [`http`], but a refused connection or a cut-off response is an `Err`.
pub fn try_http(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Reply, String> {
    try_http_within(addr, method, path, headers, body, Duration::from_secs(30))
}

/// Like [`try_http`], giving up on connecting or on any read after `timeout`.
pub fn try_http_within(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
    timeout: Duration,
) -> Result<Reply, String> {
    let addr_parsed: std::net::SocketAddr = addr.parse().map_err(|e| format!("{addr}: {e}"))?;
    let mut stream =
        TcpStream::connect_timeout(&addr_parsed, timeout).map_err(|e| format!("connect: {e}"))?;
    stream
        .set_read_timeout(Some(timeout))
        .map_err(|e| e.to_string())?;
    let mut req = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str("\r\n");
    stream
        .write_all(req.as_bytes())
        .map_err(|e| format!("write: {e}"))?;
    // The server may answer (413) and close before reading a large body.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    parse_reply(&raw)
}

/// `POST /v1/act` with an optional API key and request id.
pub fn act(addr: &str, key: Option<&str>, req_id: Option<u64>, body: &str) -> Reply {
    try_act(addr, key, req_id, body).unwrap_or_else(|e| panic!("act: {e}"))
}

pub fn try_act(
    addr: &str,
    key: Option<&str>,
    req_id: Option<u64>,
    body: &str,
) -> Result<Reply, String> {
    try_act_within(addr, key, req_id, body, Duration::from_secs(30))
}

pub fn try_act_within(
    addr: &str,
    key: Option<&str>,
    req_id: Option<u64>,
    body: &str,
    timeout: Duration,
) -> Result<Reply, String> {
    let auth = key.map(|k| format!("Bearer {k}"));
    let id = req_id.map(|id| id.to_string());
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth));
    }
    if let Some(id) = &id {
        headers.push(("x-request-id", id));
    }
    try_http_within(addr, "POST", "/v1/act", &headers, body.as_bytes(), timeout)
}

/// `gateway receipts --db` parsed into JSON values.
pub fn receipts(db: &Path) -> Vec<serde_json::Value> {
    let (code, out, err) = gateway_cli(&["receipts", "--db", db.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "receipts failed: {err}");
    out.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("bad receipt line {l:?}: {e}")))
        .collect()
}

/// Asserts the ledger verifies; returns the ids in `ids` that have no receipt.
pub fn without_receipt(db: &Path, ids: &[u64]) -> Vec<u64> {
    let (code, out, err) = gateway_cli(&["verify", "--db", db.to_str().expect("utf-8")]);
    assert_eq!(code, 0, "verify failed: {out}{err}");
    let stored: std::collections::HashSet<u64> = receipts(db)
        .iter()
        .filter_map(|r| r["request_id"].as_u64())
        .collect();
    ids.iter()
        .copied()
        .filter(|id| !stored.contains(id))
        .collect()
}

fn parse_reply(raw: &[u8]) -> Result<Reply, String> {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .ok_or_else(|| format!("no header end in {:?}", String::from_utf8_lossy(raw)))?;
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("bad status line {status_line:?}"))?;
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    let body = if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Ok(Reply {
        status,
        headers,
        body,
    })
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(eol) = rest.windows(2).position(|w| w == b"\r\n") {
        let size = usize::from_str_radix(String::from_utf8_lossy(&rest[..eol]).trim(), 16)
            .expect("chunk size");
        if size == 0 {
            break;
        }
        let start = eol + 2;
        body.extend_from_slice(&rest[start..start + size]);
        rest = &rest[start + size + 2..];
    }
    body
}

/// A demo deployment in a temp dir: mock upstream, `gateway init --demo`, and its API key.
pub struct Demo {
    pub dir: tempfile::TempDir,
    pub db: std::path::PathBuf,
    pub key: String,
    pub upstream: Proc,
}

impl Demo {
    pub fn new() -> Demo {
        Demo::with_upstream(mock_upstream(0))
    }

    /// A demo whose service calls `upstream`.
    pub fn with_upstream(upstream: Proc) -> Demo {
        let dir = tempfile::tempdir().expect("tempdir");
        let db = dir.path().join("gateway.db");
        Demo::with_db(upstream, dir, db)
    }

    /// A demo whose database (and key and lock files beside it) is `db`, wherever that is;
    /// `dir` is its scratch directory.
    pub fn with_db(upstream: Proc, dir: tempfile::TempDir, db: std::path::PathBuf) -> Demo {
        let url = format!("http://{}", upstream.addr);
        let (code, out, err) = gateway_cli(&[
            "init",
            "--db",
            db.to_str().expect("utf-8"),
            "--demo",
            "--upstream",
            &url,
        ]);
        assert_eq!(code, 0, "init failed: {err}");
        let key = out
            .lines()
            .find_map(|l| l.strip_prefix("api_key="))
            .unwrap_or_else(|| panic!("no api_key= line in {out:?}"))
            .to_owned();
        Demo {
            dir,
            db,
            key,
            upstream,
        }
    }

    pub fn db_str(&self) -> &str {
        self.db.to_str().expect("utf-8")
    }

    /// Runs `gateway <args> --db <db>` and asserts success; returns stdout.
    pub fn cli_ok(&self, args: &[&str]) -> String {
        let mut all = args.to_vec();
        all.extend_from_slice(&["--db", self.db_str()]);
        let (code, out, err) = gateway_cli(&all);
        assert_eq!(code, 0, "gateway {args:?} failed: {err}");
        out
    }

    /// `gateway key create ARGS`: the new key.
    pub fn create_key(&self, args: &[&str]) -> String {
        let mut all = vec!["key", "create"];
        all.extend_from_slice(args);
        let out = self.cli_ok(&all);
        out.trim()
            .strip_prefix("api_key=")
            .unwrap_or_else(|| panic!("no api_key= line in {out:?}"))
            .to_owned()
    }

    /// `gateway token link --user USER --service SERVICE --token TOKEN EXTRA`.
    pub fn link_token(&self, user: &str, service: &str, token: &str, extra: &[&str]) {
        let mut args = vec![
            "token",
            "link",
            "--user",
            user,
            "--service",
            service,
            "--token",
            token,
        ];
        args.extend_from_slice(extra);
        self.cli_ok(&args);
    }

    pub fn serve(&self) -> Proc {
        gateway_serve(&self.db, &[])
    }
}
