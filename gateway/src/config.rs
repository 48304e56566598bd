//! The in-memory copy of the configuration tables: API keys, services (the registry) and the
//! vault's decrypted tokens.
//!
//! A [`Config`] is immutable and tagged with the `config_gen` it was read at. Triggers bump
//! `config_gen` on every change to those tables, so a server compares one integer per request
//! and reloads only when something changed. On reload a vault token whose row `version` is
//! unchanged keeps its decrypted value; changed rows are decrypted again, deleted rows vanish.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use hyper::Method;
use hyper::header::{HeaderName, HeaderValue};
use rusqlite::Connection;
use serde_json::Value;

use crate::db;
use crate::secrets::Sealer;
use crate::upstream::{Pool, Pools, UpstreamUrl};

pub struct Config {
    pub generation: i64,
    pub keys: HashMap<Box<str>, Arc<ApiKey>>,
    pub services: HashMap<Box<str>, Service>,
}

pub struct ApiKey {
    pub rowid: i64,
    pub key_id: Arc<str>,
    pub secret_mac: [u8; 32],
    pub revoked: bool,
    pub services: Scope,
    pub users: Scope,
}

/// Allowed names, `*` meaning any.
#[derive(Debug, PartialEq, Eq)]
pub enum Scope {
    Any,
    Only(Box<[Box<str>]>),
}

impl Scope {
    pub fn parse(list: &str) -> Scope {
        let names: Vec<&str> = list
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        if names.contains(&"*") {
            Scope::Any
        } else {
            Scope::Only(names.into_iter().map(Box::from).collect())
        }
    }

    pub fn allows(&self, name: &str) -> bool {
        match self {
            Scope::Any => true,
            Scope::Only(names) => names.iter().any(|n| &**n == name),
        }
    }
}

pub struct Service {
    pub rowid: i64,
    pub name: Arc<str>,
    pub method: Method,
    pub base_path: Box<str>,
    pub template: PathTemplate,
    pub credential: Credential,
    /// (tokens per second, burst); `None` is unlimited.
    pub rate: Option<(f64, f64)>,
    pub timeout: Duration,
    pub pool: Arc<Pool>,
    /// The vault's tokens for this service, by principal.
    pub tokens: HashMap<Box<str>, VaultToken>,
}

pub enum Credential {
    Bearer,
    Header(HeaderName),
}

impl Credential {
    pub fn parse(kind: &str, header: Option<&str>) -> anyhow::Result<Credential> {
        match (kind, header) {
            ("bearer", _) => Ok(Credential::Bearer),
            ("header", Some(name)) => Ok(Credential::Header(
                HeaderName::from_bytes(name.as_bytes())
                    .with_context(|| format!("invalid credential header name {name:?}"))?,
            )),
            ("header", None) => bail!("credential kind 'header' needs a header name"),
            (other, _) => bail!("unknown credential kind {other:?} (bearer or header)"),
        }
    }

    pub fn header_name(&self) -> HeaderName {
        match self {
            Credential::Bearer => hyper::header::AUTHORIZATION,
            Credential::Header(name) => name.clone(),
        }
    }
}

pub struct VaultToken {
    pub version: i64,
    pub expires_at: Option<i64>,
    /// The decrypted token, already in its header form (`Bearer <token>` or `<token>`).
    pub header_value: HeaderValue,
}

/// `/items/{id}/sub`: literal text and `{param}` placeholders filled from `params`.
#[derive(Debug, PartialEq, Eq)]
pub struct PathTemplate(Box<[Segment]>);

#[derive(Debug, PartialEq, Eq)]
enum Segment {
    Literal(Box<str>),
    Param(Box<str>),
}

#[derive(Debug, PartialEq, Eq)]
pub enum PathError {
    Missing(Box<str>),
    NotScalar(Box<str>),
    /// The placeholder made a whole path segment empty, `.` or `..`: a server that normalises
    /// the path would resolve it to another path than the template's.
    DotSegment(Box<str>),
}

impl PathTemplate {
    pub fn parse(template: &str) -> anyhow::Result<PathTemplate> {
        if !template.starts_with('/') {
            bail!("path template {template:?} must start with /");
        }
        let mut segments = Vec::new();
        let mut rest = template;
        while let Some(open) = rest.find('{') {
            let close = rest[open..]
                .find('}')
                .map(|i| open + i)
                .with_context(|| format!("unclosed {{ in path template {template:?}"))?;
            if open > 0 {
                segments.push(Segment::Literal(rest[..open].into()));
            }
            let name = &rest[open + 1..close];
            if name.is_empty() || name.contains('{') {
                bail!("bad placeholder in path template {template:?}");
            }
            segments.push(Segment::Param(name.into()));
            rest = &rest[close + 1..];
        }
        if rest.contains('}') {
            bail!("unmatched }} in path template {template:?}");
        }
        if !rest.is_empty() {
            segments.push(Segment::Literal(rest.into()));
        }
        Ok(PathTemplate(segments.into()))
    }

    /// Appends the rendered path to `out`; placeholder values are percent-encoded. A path
    /// segment a placeholder wrote into may not end up empty, `.` or `..`: encoding the dots
    /// would not do, as servers that normalise paths decode `%2E` first.
    pub fn render(&self, params: &Value, out: &mut String) -> Result<(), PathError> {
        // Where the path segment being written starts, and the last placeholder written in it;
        // past a literal `?` or `#`, what follows is no longer the path.
        let mut start = out.rfind('/').map_or(0, |i| i + 1);
        let mut filled: Option<&str> = None;
        let mut in_path = true;
        for segment in &self.0 {
            match segment {
                Segment::Literal(text) if in_path => {
                    let Some(end) = text.find(['/', '?', '#']) else {
                        out.push_str(text);
                        continue;
                    };
                    out.push_str(&text[..end]);
                    whole_segment(out, start, filled)?;
                    let rest = &text[end..];
                    match rest.find(['?', '#']) {
                        Some(_) => in_path = false,
                        None => start = out.len() + rest.rfind('/').map_or(0, |i| i + 1),
                    }
                    out.push_str(rest);
                    filled = None;
                }
                Segment::Literal(text) => out.push_str(text),
                Segment::Param(name) => {
                    match params.get(&**name) {
                        Some(Value::String(s)) => percent_encode(s, out),
                        Some(Value::Number(n)) => {
                            let _ = write!(out, "{n}");
                        }
                        Some(Value::Bool(b)) => {
                            let _ = write!(out, "{b}");
                        }
                        Some(_) => return Err(PathError::NotScalar(name.clone())),
                        None => return Err(PathError::Missing(name.clone())),
                    }
                    filled = Some(name);
                }
            }
        }
        if in_path {
            whole_segment(out, start, filled)?;
        }
        Ok(())
    }
}

/// Refuses the segment `out[start..]` when placeholder `filled` wrote into it and it is empty,
/// `.` or `..`.
fn whole_segment(out: &str, start: usize, filled: Option<&str>) -> Result<(), PathError> {
    match filled {
        Some(name) if matches!(&out[start..], "" | "." | "..") => {
            Err(PathError::DotSegment(name.into()))
        }
        _ => Ok(()),
    }
}

fn percent_encode(s: &str, out: &mut String) {
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
}

pub fn vault_aad(principal: &str, service: &str) -> Vec<u8> {
    let mut aad = Vec::with_capacity(8 + principal.len() + service.len());
    aad.extend_from_slice(b"vault\0");
    aad.extend_from_slice(principal.as_bytes());
    aad.push(0);
    aad.extend_from_slice(service.as_bytes());
    aad
}

impl Config {
    /// Reads every configuration table in one read transaction.
    pub fn load(
        conn: &Connection,
        vault: &Sealer,
        pools: &Pools,
        previous: Option<&Config>,
    ) -> anyhow::Result<Config> {
        let tx = conn.unchecked_transaction()?;
        let generation: i64 =
            tx.query_row("SELECT gen FROM config_gen WHERE id = 1", [], |r| r.get(0))?;

        let mut keys = HashMap::new();
        let mut stmt =
            tx.prepare("SELECT rowid, key_id, secret_mac, services, users, revoked FROM api_keys")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let key_id: String = row.get(1)?;
            let secret_mac = db::blob32(row, 2, || format!("api key {key_id}: stored MAC"))?;
            let services: String = row.get(3)?;
            let users: String = row.get(4)?;
            keys.insert(
                key_id.as_str().into(),
                Arc::new(ApiKey {
                    rowid: row.get(0)?,
                    key_id: key_id.as_str().into(),
                    secret_mac,
                    revoked: row.get::<_, i64>(5)? != 0,
                    services: Scope::parse(&services),
                    users: Scope::parse(&users),
                }),
            );
        }
        drop(rows);
        drop(stmt);

        let mut services = HashMap::new();
        let mut stmt = tx.prepare(
            "SELECT rowid, name, upstream, method, path_template, credential_kind,
                    credential_header, rate_per_s, burst, timeout_ms FROM services",
        )?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let name: String = row.get(1)?;
            let context = || format!("service {name}");
            let upstream = UpstreamUrl::parse(&row.get::<_, String>(2)?).with_context(context)?;
            let method: String = row.get(3)?;
            let method = Method::from_bytes(method.as_bytes()).with_context(context)?;
            let template = PathTemplate::parse(&row.get::<_, String>(4)?).with_context(context)?;
            let credential = Credential::parse(
                &row.get::<_, String>(5)?,
                row.get::<_, Option<String>>(6)?.as_deref(),
            )
            .with_context(context)?;
            let rate = match (row.get::<_, Option<f64>>(7)?, row.get::<_, Option<f64>>(8)?) {
                (Some(rate), burst) if rate > 0.0 => Some((rate, burst.unwrap_or(rate).max(1.0))),
                _ => None,
            };
            let timeout_ms: i64 = row.get(9)?;
            services.insert(
                name.as_str().into(),
                Service {
                    rowid: row.get(0)?,
                    name: name.as_str().into(),
                    method,
                    base_path: upstream.base_path.as_str().into(),
                    template,
                    credential,
                    rate,
                    timeout: Duration::from_millis(timeout_ms.max(1) as u64),
                    pool: pools.get(&upstream),
                    tokens: HashMap::new(),
                },
            );
        }
        drop(rows);
        drop(stmt);

        let mut stmt =
            tx.prepare("SELECT principal, service, sealed, expires_at, version FROM vault_tokens")?;
        let mut rows = stmt.query([])?;
        while let Some(row) = rows.next()? {
            let principal: String = row.get(0)?;
            let service_name: String = row.get(1)?;
            let version: i64 = row.get(4)?;
            let Some(service) = services.get_mut(service_name.as_str()) else {
                continue; // a token for a service that is not registered cannot be used
            };
            let cached = previous
                .and_then(|p| p.services.get(service_name.as_str()))
                .and_then(|s| s.tokens.get(principal.as_str()))
                .filter(|t| t.version == version)
                .map(|t| t.header_value.clone());
            let header_value = match cached {
                Some(value) => value,
                None => {
                    let sealed: Vec<u8> = row.get(2)?;
                    let plain = vault
                        .open(&vault_aad(&principal, &service_name), &sealed)
                        .with_context(|| format!("vault token {principal}/{service_name}"))?;
                    token_header(&service.credential, &plain)?
                }
            };
            service.tokens.insert(
                principal.into(),
                VaultToken {
                    version,
                    expires_at: row.get(3)?,
                    header_value,
                },
            );
        }
        drop(rows);
        drop(stmt);
        tx.finish()?;
        Ok(Config {
            generation,
            keys,
            services,
        })
    }
}

/// The header value that carries `token` for this credential kind.
pub fn token_header(credential: &Credential, token: &[u8]) -> anyhow::Result<HeaderValue> {
    let mut value = match credential {
        Credential::Bearer => {
            let mut v = b"Bearer ".to_vec();
            v.extend_from_slice(token);
            HeaderValue::from_bytes(&v)
        }
        Credential::Header(_) => HeaderValue::from_bytes(token),
    }
    .context("token is not a valid header value")?;
    value.set_sensitive(true);
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn scope_wildcard_and_lists() {
        assert!(Scope::parse("*").allows("x"));
        let scope = Scope::parse("a, b");
        assert!(scope.allows("a") && scope.allows("b") && !scope.allows("c"));
        assert!(!Scope::parse("").allows("a"));
    }

    #[test]
    fn template_renders_and_encodes() {
        let t = PathTemplate::parse("/items/{id}/by/{who}").expect("parse");
        let mut out = String::new();
        t.render(&json!({"id": 7, "who": "a b/c"}), &mut out)
            .expect("render");
        assert_eq!(out, "/items/7/by/a%20b%2Fc");
        let mut out = String::new();
        assert_eq!(
            t.render(&json!({"id": 7}), &mut out),
            Err(PathError::Missing("who".into()))
        );
        let mut out = String::new();
        assert_eq!(
            t.render(&json!({"id": [1], "who": "x"}), &mut out),
            Err(PathError::NotScalar("id".into()))
        );
        // A placeholder may not make a segment empty, `.` or `..`, alone or with another.
        let t = PathTemplate::parse("/a/{x}{y}/b/{z}").expect("parse");
        for (params, culprit) in [
            (json!({"x": "..", "y": "", "z": 1}), "y"),
            (json!({"x": ".", "y": ".", "z": 1}), "y"),
            (json!({"x": "a", "y": "b", "z": ""}), "z"),
            (json!({"x": "a", "y": "b", "z": "."}), "z"),
        ] {
            let mut out = String::new();
            assert_eq!(
                t.render(&params, &mut out),
                Err(PathError::DotSegment(culprit.into())),
                "{params}"
            );
        }
        let mut out = String::from("/base");
        t.render(&json!({"x": ".", "y": "..", "z": "..."}), &mut out)
            .expect("dots inside a segment");
        assert_eq!(out, "/base/a/.../b/...");
        // The path ends at the query: `/q/..?k=v` is still `/q/..` to a server.
        let t = PathTemplate::parse("/q/{x}?k={y}").expect("parse");
        let mut out = String::new();
        assert_eq!(
            t.render(&json!({"x": "..", "y": 1}), &mut out),
            Err(PathError::DotSegment("x".into()))
        );
        let mut out = String::new();
        t.render(&json!({"x": "a", "y": ".."}), &mut out)
            .expect("a query value is not a path segment");
        assert_eq!(out, "/q/a?k=..");
        for bad in ["items", "/a/{", "/a/{}", "/a/}"] {
            assert!(PathTemplate::parse(bad).is_err(), "{bad}");
        }
    }
}
