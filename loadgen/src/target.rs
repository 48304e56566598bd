//! What every request looks like: the same `/v1/act` demo call for the gateway and, with
//! `--direct`, for mock-upstream, so the no-gateway baseline puts the same bytes on the wire.

use std::net::{SocketAddr, ToSocketAddrs as _};

use anyhow::{Context as _, bail, ensure};
use bytes::Bytes;
use http_body_util::Full;
use hyper::header::{AUTHORIZATION, CONTENT_TYPE, HOST, HeaderValue};
use hyper::{Method, Request, Uri};

/// The `/v1/act` body fields; `params` carries the request id so each body is unique.
pub struct ActBody<'a> {
    pub service: &'a str,
    pub action: &'a str,
    pub on_behalf_of: &'a str,
    /// Bytes of padding in `params` before the id: the body's first `pad` bytes are then the
    /// same for every request.
    pub pad: usize,
}

#[derive(Debug)]
pub struct Target {
    /// The URL as given, for messages.
    pub url: String,
    pub addr: SocketAddr,
    host: HeaderValue,
    path: String,
    authorization: Option<HeaderValue>,
    body_prefix: Vec<u8>,
    /// Send the id as `x-request-id` too (most real clients send none).
    id_header: bool,
}

impl Target {
    /// `url` is `http://HOST:PORT[/PATH]`; without a path, `/v1/act` (or `/echo` when `direct`,
    /// the path the demo service calls upstream).
    pub fn new(
        url: &str,
        direct: bool,
        key: Option<&str>,
        body: &ActBody<'_>,
        id_header: bool,
    ) -> anyhow::Result<Self> {
        let uri: Uri = url
            .parse()
            .with_context(|| format!("--url {url:?} is not a URL (expected http://HOST:PORT)"))?;
        match uri.scheme_str() {
            Some("http") => {}
            Some(other) => bail!("--url {url:?}: scheme {other:?} is not supported, only http"),
            None => bail!("--url {url:?} has no scheme (expected http://HOST:PORT)"),
        }
        let authority = uri
            .authority()
            .with_context(|| format!("--url {url:?} has no host"))?;
        let port = authority.port_u16().unwrap_or(80);
        let addr = (authority.host(), port)
            .to_socket_addrs()
            .with_context(|| format!("--url {url:?}: cannot resolve {}", authority.host()))?
            .next()
            .with_context(|| {
                format!("--url {url:?}: {} resolves to no address", authority.host())
            })?;
        let path = match uri.path_and_query().map(|p| p.as_str()) {
            None | Some("") | Some("/") if direct => "/echo".to_owned(),
            None | Some("") | Some("/") => "/v1/act".to_owned(),
            Some(path) => path.to_owned(),
        };
        ensure!(
            direct || key.is_some(),
            "--key is required against the gateway (use --direct to load mock-upstream without one)"
        );
        let authorization = key
            .map(|key| HeaderValue::try_from(format!("Bearer {key}")))
            .transpose()
            .context("--key contains characters not allowed in a header")?;
        // Everything but the id is fixed, so the per-request cost is one integer format.
        let pad = match body.pad {
            0 => String::new(),
            n => format!(r#""pad":"{}","#, "-".repeat(n)),
        };
        let body_prefix = format!(
            r#"{{"service":{},"action":{},"on_behalf_of":{},"params":{{{pad}"request_id":"#,
            serde_json::to_string(body.service)?,
            serde_json::to_string(body.action)?,
            serde_json::to_string(body.on_behalf_of)?,
        )
        .into_bytes();
        Ok(Target {
            url: url.to_owned(),
            addr,
            host: HeaderValue::from_str(authority.as_str())?,
            path,
            authorization,
            body_prefix,
            id_header,
        })
    }

    pub fn body(&self, id: u64) -> Bytes {
        let mut body = Vec::with_capacity(self.body_prefix.len() + 24);
        body.extend_from_slice(&self.body_prefix);
        body.extend_from_slice(id.to_string().as_bytes());
        body.extend_from_slice(b"}}");
        Bytes::from(body)
    }

    pub fn request(&self, id: u64) -> Request<Full<Bytes>> {
        let mut request = Request::new(Full::new(self.body(id)));
        *request.method_mut() = Method::POST;
        *request.uri_mut() =
            Uri::try_from(self.path.as_str()).unwrap_or_else(|_| Uri::from_static("/"));
        let headers = request.headers_mut();
        headers.insert(HOST, self.host.clone());
        headers.insert(CONTENT_TYPE, HeaderValue::from_static("application/json"));
        if self.id_header {
            headers.insert("x-request-id", HeaderValue::from(id));
        }
        if let Some(authorization) = &self.authorization {
            headers.insert(AUTHORIZATION, authorization.clone());
        }
        request
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const DEMO: ActBody<'static> = ActBody {
        service: "demo",
        action: "echo",
        on_behalf_of: "user-1",
        pad: 0,
    };

    #[test]
    fn body_is_valid_act_json_with_the_id() {
        let target = Target::new("http://127.0.0.1:9", false, Some("ak_1_x"), &DEMO, true).unwrap();
        let body: serde_json::Value = serde_json::from_slice(&target.body(42)).unwrap();
        assert_eq!(
            body,
            serde_json::json!({"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"request_id":42}})
        );
        let request = target.request(42);
        assert_eq!(request.uri().path(), "/v1/act");
        assert_eq!(request.headers()["x-request-id"], "42");
        assert_eq!(request.headers()[AUTHORIZATION], "Bearer ak_1_x");
    }

    /// Without the header and with padding, two requests' bodies agree in their first `pad`
    /// bytes and differ only after them.
    #[test]
    fn anonymous_padded_bodies_differ_only_past_the_padding() {
        let padded = ActBody { pad: 600, ..DEMO };
        let target = Target::new("http://127.0.0.1:9", true, None, &padded, false).unwrap();
        let (a, b) = (target.body(1), target.body(2));
        let first_difference = a.iter().zip(b.iter()).position(|(x, y)| x != y).unwrap();
        assert!(first_difference > 600, "{first_difference}");
        let body: serde_json::Value = serde_json::from_slice(&a).unwrap();
        assert_eq!(body["params"]["request_id"], 1);
        assert!(target.request(1).headers().get("x-request-id").is_none());
    }

    #[test]
    fn direct_defaults_to_echo_path_and_key_is_optional() {
        let target = Target::new("http://127.0.0.1:9", true, None, &DEMO, true).unwrap();
        assert_eq!(target.request(1).uri().path(), "/echo");
        assert!(target.request(1).headers().get(AUTHORIZATION).is_none());
    }

    #[test]
    fn bad_urls_and_missing_key_are_refused() {
        for url in ["127.0.0.1:9", "https://127.0.0.1:9", "not a url", "http://"] {
            assert!(Target::new(url, true, None, &DEMO, true).is_err(), "{url}");
        }
        let err = Target::new("http://127.0.0.1:9", false, None, &DEMO, true).unwrap_err();
        assert!(format!("{err:#}").contains("--key is required"));
    }
}
