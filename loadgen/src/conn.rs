//! One keep-alive HTTP/1.1 connection per in-flight slot: a slot sends one request, reads the
//! whole response, and only then sends the next, so the connection count bounds concurrency.

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;

use crate::clock::monotonic_ns;
use crate::target::Target;

/// How long connecting may take before the target counts as unreachable.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A complete response with this HTTP status.
    Status(u16),
    /// Connect, write or read failed.
    Transport,
    /// No complete response within `--timeout-ms`.
    Timeout,
}

impl Outcome {
    pub fn is_ok(self) -> bool {
        matches!(self, Outcome::Status(status) if (200..300).contains(&status))
    }

    /// The key this outcome is counted under in `errors`, or `None` for success.
    pub fn error_key(self) -> Option<String> {
        match self {
            _ if self.is_ok() => None,
            Outcome::Status(status) => Some(status.to_string()),
            Outcome::Transport => Some("transport".to_owned()),
            Outcome::Timeout => Some("timeout".to_owned()),
        }
    }
}

/// When one request went out and came back, on CLOCK_MONOTONIC.
#[derive(Clone, Copy, Debug)]
pub struct Exchange {
    pub sent_ns: u64,
    pub received_ns: u64,
    pub outcome: Outcome,
    /// The connection's local port (0: it never connected), so a server-side trace can tell
    /// the client's connections apart.
    pub local_port: u16,
}

pub struct Conn {
    target: Arc<Target>,
    timeout: Duration,
    sender: Option<SendRequest<Full<Bytes>>>,
    local_port: u16,
}

impl Conn {
    pub fn new(target: Arc<Target>, timeout: Duration) -> Self {
        Conn {
            target,
            timeout,
            sender: None,
            local_port: 0,
        }
    }

    /// Opens the connection now, so that a run's first requests do not pay for the handshake.
    pub async fn connect(&mut self) -> anyhow::Result<()> {
        let target = &self.target;
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, TcpStream::connect(target.addr))
            .await
            .map_err(|_| anyhow::anyhow!("timed out after {CONNECT_TIMEOUT:?}"))
            .and_then(|connected| connected.map_err(anyhow::Error::from))
            .with_context(|| format!("cannot connect to {} ({})", target.url, target.addr))?;
        stream.set_nodelay(true)?;
        self.local_port = stream.local_addr()?.port();
        let (sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .with_context(|| format!("HTTP handshake with {} failed", target.url))?;
        // The connection task ends when the sender is dropped or the peer closes.
        tokio::spawn(connection);
        self.sender = Some(sender);
        Ok(())
    }

    /// Sends request `id` and reads its whole response. Any failure drops the connection; the
    /// next call reconnects.
    pub async fn send(&mut self, id: u64) -> Exchange {
        let request = self.target.request(id);
        let mut sent_ns = monotonic_ns();
        let timeout = self.timeout;
        let attempt = async {
            if self.sender.as_ref().is_none_or(|sender| sender.is_closed()) {
                self.connect().await.map_err(|_| ())?;
            }
            let sender = self.sender.as_mut().ok_or(())?;
            sender.ready().await.map_err(|_| ())?;
            sent_ns = monotonic_ns();
            let response = sender.send_request(request).await.map_err(|_| ())?;
            let status = response.status().as_u16();
            response.into_body().collect().await.map_err(|_| ())?;
            Ok::<u16, ()>(status)
        };
        let outcome = match tokio::time::timeout(timeout, attempt).await {
            Ok(Ok(status)) => Outcome::Status(status),
            Ok(Err(())) => Outcome::Transport,
            Err(_elapsed) => Outcome::Timeout,
        };
        if !matches!(outcome, Outcome::Status(_)) {
            self.sender = None;
        }
        Exchange {
            sent_ns,
            received_ns: monotonic_ns(),
            outcome,
            local_port: self.local_port,
        }
    }
}
