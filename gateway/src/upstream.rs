//! The upstream client: a keep-alive pool over `hyper::client::conn::http1`.
//!
//! A request checks a connection out, then drives both halves itself: the connection future
//! (which does the socket I/O) and the response/body futures, polled together inside the
//! request's own task. Nothing is spawned, so every upstream read and write happens during the
//! request's polls and the tracer can attribute it: the first socket write of a request's
//! polls that is not to its client is its upstream send. After the body is read the connection goes back to the pool; on any error
//! it is dropped.

use std::collections::HashMap;
use std::future::{Future, poll_fn};
use std::net::{SocketAddr, ToSocketAddrs};
use std::pin::pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Waker};
use std::time::Duration;

use anyhow::{Context as _, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::client::conn::http1::{self, Connection, SendRequest};
use hyper::header::HeaderValue;
use hyper::{Request, StatusCode};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpSocket, TcpStream};

/// An upstream base URL: `http://host:port[/base/path]` (plain HTTP only).
pub struct UpstreamUrl {
    pub authority: String,
    pub addr: SocketAddr,
    pub base_path: String,
}

impl UpstreamUrl {
    pub fn parse(url: &str) -> anyhow::Result<UpstreamUrl> {
        let rest = url
            .strip_prefix("http://")
            .with_context(|| format!("upstream {url:?} must start with http://"))?;
        let (authority, base) = match rest.find('/') {
            Some(i) => (&rest[..i], rest[i..].trim_end_matches('/')),
            None => (rest, ""),
        };
        if authority.is_empty() {
            bail!("upstream {url:?} has no host");
        }
        let with_port = if authority.contains(':') {
            authority.to_owned()
        } else {
            format!("{authority}:80")
        };
        let addr = with_port
            .to_socket_addrs()
            .with_context(|| format!("resolving upstream {authority}"))?
            .next()
            .with_context(|| format!("upstream {authority} resolves to no address"))?;
        Ok(UpstreamUrl {
            authority: authority.to_owned(),
            addr,
            base_path: base.to_owned(),
        })
    }
}

/// Largest upstream response body accepted.
const MAX_RESPONSE: usize = 8 << 20;
/// Idle connections kept per upstream; more are closed when returned.
const MAX_IDLE: usize = 256;

type Conn = Connection<TokioIo<TcpStream>, Full<Bytes>>;

struct Pooled {
    sender: SendRequest<Full<Bytes>>,
    conn: Conn,
}

#[derive(Debug, PartialEq, Eq)]
pub enum UpstreamError {
    /// Could not connect (refused, unreachable): 502.
    Unreachable,
    /// No full response within the service's timeout: 504.
    Timeout,
    /// Connected, but the exchange failed (reset, bad HTTP, body too large): 502.
    Protocol,
}

/// Pools by upstream authority, shared by every configuration generation.
#[derive(Default)]
pub struct Pools(Mutex<HashMap<String, Arc<Pool>>>);

impl Pools {
    pub fn get(&self, url: &UpstreamUrl) -> Arc<Pool> {
        let mut pools = self.0.lock().unwrap_or_else(|p| p.into_inner());
        pools
            .entry(format!("{}@{}", url.authority, url.addr))
            .or_insert_with(|| {
                Arc::new(Pool {
                    addr: url.addr,
                    host: HeaderValue::from_str(&url.authority)
                        .unwrap_or_else(|_| HeaderValue::from_static("upstream")),
                    idle: Mutex::new(Vec::new()),
                })
            })
            .clone()
    }
}

pub struct Pool {
    addr: SocketAddr,
    host: HeaderValue,
    #[expect(
        clippy::vec_box,
        reason = "connections stay boxed so a checkout moves a pointer, not ~700 bytes"
    )]
    idle: Mutex<Vec<Box<Pooled>>>,
}

enum Checkout {
    // Boxed once per connection, so checkouts move a pointer, not ~700 bytes.
    Reused(Box<Pooled>),
    Fresh(TcpSocket),
}

impl Pool {
    pub fn host(&self) -> &HeaderValue {
        &self.host
    }

    /// Sends `request` and reads the whole response, within `timeout`.
    pub async fn call(
        &self,
        request: Request<Full<Bytes>>,
        timeout: Duration,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let checkout = self.checkout().await?;
        match tokio::time::timeout(timeout, self.exchange(checkout, request)).await {
            Ok(result) => result,
            Err(_elapsed) => Err(UpstreamError::Timeout),
        }
    }

    /// A live idle connection, or a new socket (not yet connected) when none is left.
    async fn checkout(&self) -> Result<Checkout, UpstreamError> {
        loop {
            let idle = self.idle.lock().unwrap_or_else(|p| p.into_inner()).pop();
            let Some(mut pooled) = idle else { break };
            if usable_now(&mut pooled) {
                return Ok(Checkout::Reused(pooled));
            }
        }
        let socket = match self.addr {
            SocketAddr::V4(_) => TcpSocket::new_v4(),
            SocketAddr::V6(_) => TcpSocket::new_v6(),
        };
        socket
            .map(Checkout::Fresh)
            .map_err(|_| UpstreamError::Unreachable)
    }

    async fn exchange(
        &self,
        checkout: Checkout,
        request: Request<Full<Bytes>>,
    ) -> Result<(StatusCode, Bytes), UpstreamError> {
        let mut pooled = match checkout {
            Checkout::Reused(pooled) => pooled,
            Checkout::Fresh(socket) => {
                let stream = socket
                    .connect(self.addr)
                    .await
                    .map_err(|_| UpstreamError::Unreachable)?;
                let _ = stream.set_nodelay(true);
                let (sender, conn) = http1::handshake(TokioIo::new(stream))
                    .await
                    .map_err(|_| UpstreamError::Protocol)?;
                Box::new(Pooled { sender, conn })
            }
        };
        let mut conn_done = false;
        let response_future = pooled.sender.send_request(request);
        let response = drive(&mut pooled.conn, &mut conn_done, response_future)
            .await?
            .map_err(|_| UpstreamError::Protocol)?;
        let status = response.status();
        let body = Limited::new(response.into_body(), MAX_RESPONSE).collect();
        let body = drive(&mut pooled.conn, &mut conn_done, body)
            .await?
            .map_err(|_| UpstreamError::Protocol)?
            .to_bytes();
        if !conn_done && usable_now(&mut pooled) {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            if idle.len() < MAX_IDLE {
                idle.push(pooled);
            }
        }
        Ok((status, body))
    }
}

/// One non-blocking look at a connection: true if it can take a request right now. It polls
/// with a no-op waker: a pooled connection must not keep the waker of the task that last
/// looked at it, or the next request's use of it would wake that task for nothing (a wasted
/// task poll, and two probe hits when traced). The request that takes it drives it with its
/// own waker.
fn usable_now(pooled: &mut Pooled) -> bool {
    let mut cx = Context::from_waker(Waker::noop());
    if pooled.conn.poll_without_shutdown(&mut cx).is_ready() {
        return false; // closed by the peer, or failed
    }
    matches!(pooled.sender.poll_ready(&mut cx), Poll::Ready(Ok(())))
}

/// Polls the connection (socket I/O) and `fut` together until `fut` completes. If the
/// connection ends first and `fut` cannot finish without it, the exchange failed.
async fn drive<F: Future>(
    conn: &mut Conn,
    conn_done: &mut bool,
    fut: F,
) -> Result<F::Output, UpstreamError> {
    let mut fut = pin!(fut);
    poll_fn(|cx| {
        if !*conn_done && conn.poll_without_shutdown(cx).is_ready() {
            *conn_done = true;
        }
        match fut.as_mut().poll(cx) {
            Poll::Ready(out) => Poll::Ready(Ok(out)),
            Poll::Pending if *conn_done => Poll::Ready(Err(UpstreamError::Protocol)),
            Poll::Pending => Poll::Pending,
        }
    })
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_urls() {
        let u = UpstreamUrl::parse("http://127.0.0.1:9000/base/").expect("parse");
        assert_eq!(u.authority, "127.0.0.1:9000");
        assert_eq!(u.base_path, "/base");
        assert!(UpstreamUrl::parse("https://127.0.0.1:1").is_err());
        assert!(UpstreamUrl::parse("http:///x").is_err());
    }
}
