//! A keep-alive JSON echo server standing in for the tool behind the gateway.
//!
//! Every request (any method, any path) is answered with
//! `{"echo": <request body as JSON, or null>, "path": "<request path>", "authorization":
//! <the Authorization header, or null>}` after a fixed delay,
//! slept on the tokio timer so concurrent requests overlap their delays as a real service would.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// Serves until the process ends. Prints `listening on ADDR` once the socket is bound: tests and
/// xtask wait for that line before sending.
pub async fn run(listener: TcpListener, delay: Duration) -> std::io::Result<()> {
    let local = listener.local_addr()?;
    println!("listening on {local}");
    loop {
        let (stream, _peer): (_, SocketAddr) = match listener.accept().await {
            Ok(accepted) => accepted,
            // Transient accept errors (e.g. EMFILE) must not end the server.
            Err(_) => continue,
        };
        let _ = stream.set_nodelay(true);
        tokio::spawn(async move {
            let service = service_fn(move |req| echo(req, delay));
            // A client that disconnects mid-request is not an error worth reporting.
            let _ = http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await;
        });
    }
}

async fn echo(
    req: Request<Incoming>,
    delay: Duration,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let path = req.uri().path().to_owned();
    // Echoed so tests can see which credential the gateway injected.
    let authorization = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned);
    let body = match req.into_body().collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => Bytes::new(),
    };
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    let echo: serde_json::Value = serde_json::from_slice(&body).unwrap_or(serde_json::Value::Null);
    let reply = serde_json::json!({ "echo": echo, "path": path, "authorization": authorization });
    let bytes = serde_json::to_vec(&reply).unwrap_or_default();
    let response = Response::builder()
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(bytes)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())));
    Ok(response)
}
