//! `POST /v1/act`: the request path, phase by phase.
//!
//! Order: auth → parse → scope → ratelimit → registry → vault → upstream → receipt → respond.
//! Each phase runs in [`probe::in_phase`] (its site, then its frame) and lasts until the next.
//! 401 and body errors (400/413) answer at once; from scope on, every outcome (allowed,
//! denied, upstream failure) gets a receipt, and the answer is sent only after that receipt
//! is durable. A shutdown lets a request that has begun deciding finish through its receipt
//! ([`crate::acting`]).

use std::borrow::Cow;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::header::{CONTENT_LENGTH, CONTENT_TYPE, HOST};
use hyper::{HeaderMap, Request, StatusCode};
use serde::Deserialize;
use serde_json::Value;

use crate::apikey;
use crate::app::App;
use crate::canonical;
use crate::config::{ApiKey, Config, PathError, Service};
use crate::error::ApiError;
use crate::ledger::{Durable, PendingReceipt};
use crate::probe::{self, Phase};
use crate::upstream::UpstreamError;

/// The request id header: the client's (or the one the server gives it) comes back on the
/// answer and goes on to the upstream.
pub const REQUEST_ID: &str = "x-request-id";

/// Largest accepted request body.
pub const MAX_BODY: usize = 1 << 20;

/// Longest `service`, `action` and `on_behalf_of`, in bytes: each is copied into the receipt,
/// which the ledger keeps for good (params only as their digest).
pub const MAX_NAME: usize = 256;

#[derive(Deserialize)]
struct ActBody {
    service: String,
    action: String,
    on_behalf_of: String,
    #[serde(default = "empty_object")]
    params: Value,
}

fn empty_object() -> Value {
    Value::Object(serde_json::Map::new())
}

/// The answer to an act request: status and JSON body bytes.
pub struct Answer {
    pub status: StatusCode,
    pub body: Vec<u8>,
}

impl From<ApiError> for Answer {
    fn from(e: ApiError) -> Answer {
        Answer {
            status: e.status,
            body: e.body(),
        }
    }
}

/// A receipt's decision when a step refused the request before any upstream call.
const DENY: &str = "deny";

/// What the decision steps produced, before the receipt.
enum Outcome {
    Upstream {
        status: StatusCode,
        body: Bytes,
        latency_us: i64,
    },
    Denied {
        error: ApiError,
        decision: &'static str,
        latency_us: i64,
    },
}

/// `req_id` is the probe id; `client_id` the client's `x-request-id`, which the receipt keeps.
pub async fn act(app: &App, req: Request<Incoming>, req_id: u64, client_id: u64) -> Answer {
    let (config, key) =
        match probe::in_phase(req_id, Phase::Auth, || authenticate(app, req.headers())) {
            Ok(found) => found,
            Err(e) => return respond_error(req_id, e),
        };

    let (body, canonical_params, params_digest) = match probe::in_phase_async(
        req_id,
        Phase::Parse,
        parse(req, app.limits.body_timeout),
    )
    .await
    {
        Ok(parsed) => parsed,
        Err(e) => return respond_error(req_id, e),
    };

    // From here to the receipt, a shutdown waits past its grace period: the upstream call may
    // act. Refused only once that wait has begun, when nothing has been sent upstream yet.
    let Some(pass) = app.acting.enter() else {
        return respond_error(
            req_id,
            ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "shutting_down",
                "the gateway is shutting down",
            ),
        );
    };
    let outcome = decide(
        app,
        &config,
        &key,
        &body,
        canonical_params,
        req_id,
        client_id,
    )
    .await;
    // Nothing went upstream: past its key's budget, a denial is refused without a receipt.
    if let Outcome::Denied { decision: DENY, .. } = &outcome
        && !denial_receipted(app, &key)
    {
        drop(pass);
        return respond_error(
            req_id,
            ApiError::new(
                StatusCode::TOO_MANY_REQUESTS,
                "too_many_denials",
                "too many denied requests for this API key; this one gets no receipt",
            ),
        );
    }

    let (status, error_code, decision, latency_us) = match &outcome {
        Outcome::Upstream { latency_us, .. } => (StatusCode::OK, "", "allow", *latency_us),
        Outcome::Denied {
            error,
            decision,
            latency_us,
        } => (error.status, error.code, *decision, *latency_us),
    };
    let receipt = PendingReceipt {
        ts_ms: now_ms(),
        request_id: client_id,
        principal: body.on_behalf_of.into_boxed_str(),
        key_id: key.key_id.clone(),
        service: body.service.into_boxed_str(),
        action: body.action.into_boxed_str(),
        params_digest,
        decision,
        status: match &outcome {
            Outcome::Upstream { status, .. } => status.as_u16(),
            Outcome::Denied { .. } => status.as_u16(),
        },
        upstream_latency_us: latency_us,
        error_code,
    };
    let durable = probe::in_phase_async(
        req_id,
        Phase::ReceiptWait,
        app.ledger.append(req_id, receipt),
    )
    .await;
    drop(pass);

    probe::in_phase(req_id, Phase::Respond, || {
        let Ok(durable) = durable else {
            let e = ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "receipt_failed",
                "the receipt could not be made durable; the upstream result is withheld",
            );
            return e.into();
        };
        match outcome {
            Outcome::Upstream { status, body, .. } => Answer {
                status: StatusCode::OK,
                body: success_body(status, &body, &durable),
            },
            Outcome::Denied { error, .. } => Answer {
                status: error.status,
                body: error.body(),
            },
        }
    })
}

/// Takes one of the key's denial receipts ([`crate::app::KeyLimits`]): a key whose requests
/// are denied cannot write receipts as fast as it can send requests. Nothing was sent upstream.
fn denial_receipted(app: &App, key: &ApiKey) -> bool {
    let limits = &app.limits;
    app.denials.allow(
        (key.rowid, 0),
        limits.denials_per_s,
        limits.denials_burst,
        Instant::now(),
    )
}

fn respond_error(req_id: u64, e: ApiError) -> Answer {
    probe::in_phase(req_id, Phase::Respond, || e.into())
}

/// Finds the key by id and checks its secret. Returns the configuration it was found in.
fn authenticate(app: &App, headers: &HeaderMap) -> Result<(Arc<Config>, Arc<ApiKey>), ApiError> {
    let header = headers
        .get(hyper::header::AUTHORIZATION)
        .ok_or_else(|| ApiError::unauthorized("missing API key (Authorization: Bearer ak_...)"))?;
    let presented = apikey::parse_authorization(header.as_bytes())
        .ok_or_else(|| ApiError::unauthorized("malformed API key"))?;
    let config = app.config()?;
    let key = config
        .keys
        .get(presented.key_id)
        .filter(|k| apikey::mac_matches(&app.mac_key, presented.secret, &k.secret_mac))
        .ok_or_else(|| ApiError::unauthorized("invalid API key"))?;
    if key.revoked {
        return Err(ApiError::unauthorized("API key revoked"));
    }
    let key = key.clone();
    Ok((config, key))
}

async fn parse(
    req: Request<Incoming>,
    body_timeout: Duration,
) -> Result<(ActBody, Vec<u8>, [u8; 32]), ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            "request body exceeds 1 MiB",
        )
    };
    let declared = req
        .headers()
        .get(CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|len| len > MAX_BODY as u64) {
        return Err(too_large());
    }
    let collect = Limited::new(req.into_body(), MAX_BODY).collect();
    let Some(collected) = within(body_timeout, collect).await else {
        return Err(ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "body_timeout",
            format!(
                "the request body did not arrive within {} ms",
                body_timeout.as_millis()
            ),
        ));
    };
    let bytes = match collected {
        Ok(collected) => collected.to_bytes(),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => return Err(too_large()),
        Err(_) => {
            return Err(ApiError::bad_request(
                "body_read_failed",
                "could not read the body",
            ));
        }
    };
    let body: ActBody = serde_json::from_slice(&bytes).map_err(|e| {
        let message = e.to_string();
        let code = if e.is_data() {
            if message.starts_with("missing field") {
                "missing_field"
            } else {
                "invalid_field"
            }
        } else {
            "invalid_json"
        };
        ApiError::bad_request(code, message)
    })?;
    for (field, value) in [
        ("service", &body.service),
        ("action", &body.action),
        ("on_behalf_of", &body.on_behalf_of),
    ] {
        if value.is_empty() || value.len() > MAX_NAME {
            return Err(ApiError::bad_request(
                "invalid_field",
                format!("{field} must be 1 to {MAX_NAME} bytes"),
            ));
        }
    }
    if !body.params.is_object() {
        return Err(ApiError::bad_request(
            "params_not_object",
            "params must be a JSON object",
        ));
    }
    let mut canonical_params = Vec::with_capacity(bytes.len());
    canonical::encode(&body.params, &mut canonical_params).map_err(|_| {
        ApiError::bad_request(
            "params_too_deep",
            format!("params nest deeper than {}", canonical::MAX_DEPTH),
        )
    })?;
    let digest = canonical::digest(&canonical_params);
    Ok((body, canonical_params, digest))
}

/// `future`'s output, or `None` when it takes longer than `limit`. One ready at its first poll
/// (a body that came with its head) arms no timer.
async fn within<F: Future>(limit: Duration, future: F) -> Option<F::Output> {
    let mut future = std::pin::pin!(future);
    let first = std::future::poll_fn(|cx| Poll::Ready(future.as_mut().poll(cx))).await;
    match first {
        Poll::Ready(out) => Some(out),
        Poll::Pending => tokio::time::timeout(limit, future).await.ok(),
    }
}

async fn decide(
    app: &App,
    config: &Config,
    key: &ApiKey,
    body: &ActBody,
    canonical_params: Vec<u8>,
    req_id: u64,
    client_id: u64,
) -> Outcome {
    let deny = |status, code, message: Cow<'static, str>| Outcome::Denied {
        error: ApiError::new(status, code, message),
        decision: DENY,
        latency_us: -1,
    };
    // Each phase's closure answers Err(outcome) to end the decision there.
    let scoped = probe::in_phase(req_id, Phase::Scope, || {
        if !key.services.allows(&body.service) || !key.users.allows(&body.on_behalf_of) {
            return Err(deny(
                StatusCode::FORBIDDEN,
                "scope_denied",
                "this API key may not act on this service for this user".into(),
            ));
        }
        Ok(config.services.get(body.service.as_str()))
    });
    let service = match scoped {
        Ok(service) => service,
        Err(denied) => return denied,
    };
    let limited = probe::in_phase(req_id, Phase::RateLimit, || {
        if let Some((rate, burst)) = service.and_then(|s| s.rate) {
            let bucket = (key.rowid, service.map_or(0, |s| s.rowid));
            if !app.limiter.allow(bucket, rate, burst, Instant::now()) {
                return Err(deny(
                    StatusCode::TOO_MANY_REQUESTS,
                    "rate_limited",
                    "rate limit exceeded".into(),
                ));
            }
        }
        Ok(())
    });
    if let Err(denied) = limited {
        return denied;
    }
    let found = probe::in_phase(req_id, Phase::Registry, || {
        let Some(service) = service else {
            return Err(deny(
                StatusCode::NOT_FOUND,
                "not_found",
                "unknown service".into(),
            ));
        };
        match render_path(service, &body.params) {
            Ok(path) => Ok((service, path)),
            Err(message) => Err(deny(StatusCode::BAD_REQUEST, "bad_params", message.into())),
        }
    });
    let (service, path) = match found {
        Ok(found) => found,
        Err(denied) => return denied,
    };
    // The vault phase ends with the upstream request built around the credential.
    let built = probe::in_phase(req_id, Phase::Vault, || {
        let credential = match service.tokens.get(body.on_behalf_of.as_str()) {
            None => {
                return Err(deny(
                    StatusCode::FORBIDDEN,
                    "token_missing",
                    "no upstream token for this user and service".into(),
                ));
            }
            Some(token) if token.expires_at.is_some_and(|at| at <= now_ms() / 1000) => {
                return Err(deny(
                    StatusCode::FORBIDDEN,
                    "token_expired",
                    "the upstream token for this user and service has expired".into(),
                ));
            }
            Some(token) => token.header_value.clone(),
        };
        Request::builder()
            .method(service.method.clone())
            .uri(path)
            .header(HOST, service.pool.host().clone())
            .header(CONTENT_TYPE, "application/json")
            .header(service.credential.header_name(), credential)
            // Forwarded as proxies do, so the upstream's logs (and a kernel-only trace) can
            // join its request to the client's.
            .header(REQUEST_ID, client_id)
            .body(Full::new(Bytes::from(canonical_params)))
            .map_err(|_| {
                deny(
                    StatusCode::BAD_REQUEST,
                    "bad_params",
                    "the upstream path is not a valid URI".into(),
                )
            })
    });
    let request = match built {
        Ok(request) => request,
        Err(denied) => return denied,
    };
    let started = Instant::now();
    let result = probe::in_phase_async(
        req_id,
        Phase::Upstream,
        service.pool.call(request, service.timeout),
    )
    .await;
    let latency_us = started.elapsed().as_micros() as i64;
    match result {
        Ok((status, body)) => Outcome::Upstream {
            status,
            body,
            latency_us,
        },
        Err(e) => {
            let (status, code, message) = match e {
                UpstreamError::Unreachable => (
                    StatusCode::BAD_GATEWAY,
                    "upstream_unreachable",
                    "could not connect to the upstream",
                ),
                UpstreamError::Protocol => (
                    StatusCode::BAD_GATEWAY,
                    "upstream_error",
                    "the upstream exchange failed",
                ),
                UpstreamError::Timeout => (
                    StatusCode::GATEWAY_TIMEOUT,
                    "upstream_timeout",
                    "the upstream did not answer in time",
                ),
            };
            Outcome::Denied {
                error: ApiError::new(status, code, message),
                decision: "error",
                latency_us,
            }
        }
    }
}

fn render_path(service: &Service, params: &Value) -> Result<String, String> {
    let mut path = String::with_capacity(service.base_path.len() + 32);
    path.push_str(&service.base_path);
    service
        .template
        .render(params, &mut path)
        .map_err(|e| match e {
            PathError::Missing(name) => format!("params.{name} is required by the service path"),
            PathError::NotScalar(name) => {
                format!("params.{name} must be a string, number or boolean")
            }
            PathError::DotSegment(name) => {
                format!("params.{name} may not make a path segment empty, . or ..")
            }
        })?;
    Ok(path)
}

/// `{"status": <upstream status>, "body": <json or text>, "receipt": {...}}`. A JSON upstream
/// body is embedded as its own bytes (validated, not re-serialized).
fn success_body(status: StatusCode, upstream: &[u8], durable: &Durable) -> Vec<u8> {
    let mut out = Vec::with_capacity(upstream.len() + 320);
    out.extend_from_slice(b"{\"status\":");
    out.extend_from_slice(status.as_str().as_bytes());
    out.extend_from_slice(b",\"body\":");
    if !upstream.is_empty() && serde_json::from_slice::<serde::de::IgnoredAny>(upstream).is_ok() {
        out.extend_from_slice(upstream);
    } else {
        let _ = serde_json::to_writer(&mut out, &*String::from_utf8_lossy(upstream));
    }
    out.extend_from_slice(b",\"receipt\":{\"seq\":");
    out.extend_from_slice(durable.seq.to_string().as_bytes());
    out.extend_from_slice(b",\"entry_hash\":\"");
    push_hex(&mut out, &durable.entry_hash);
    out.extend_from_slice(b"\",\"signature\":\"");
    push_hex(&mut out, &durable.signature);
    out.extend_from_slice(b"\"}}");
    out
}

fn push_hex(out: &mut Vec<u8>, bytes: &[u8]) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    for b in bytes {
        out.push(DIGITS[usize::from(b >> 4)]);
        out.push(DIGITS[usize::from(b & 15)]);
    }
}

fn now_ms() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}
