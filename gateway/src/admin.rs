//! Administrative operations behind the CLI: init, keys, services, vault tokens.

use std::path::Path;
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use rusqlite::Connection;

use crate::act::MAX_NAME;
use crate::apikey;
use crate::config::{Credential, PathTemplate, Scope, token_header, vault_aad};
use crate::secrets::MasterKey;
use crate::upstream::UpstreamUrl;

pub fn now_s() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64)
}

/// Creates (or migrates) the database, the master key file and the signer.
pub fn init(db: &Path, key_file: &Path) -> anyhow::Result<(Connection, MasterKey)> {
    let master = MasterKey::load(key_file, true)?;
    let conn = crate::db::open(db, true)?;
    crate::ledger::signer::ensure(&conn, &master.signer(), now_s())?;
    Ok((conn, master))
}

/// Creates an API key; returns the full `ak_...` string (shown once, never stored).
pub fn create_key(
    conn: &Connection,
    master: &MasterKey,
    services: &str,
    users: &str,
) -> anyhow::Result<String> {
    for list in [services, users] {
        if matches!(Scope::parse(list), Scope::Only(ref names) if names.is_empty()) {
            bail!("scope list {list:?} names nothing (use * for any)");
        }
    }
    let (id, secret, full) = apikey::generate();
    let mac = apikey::secret_mac(&master.api_key_mac(), &secret);
    conn.execute(
        "INSERT INTO api_keys (key_id, secret_mac, services, users, revoked, created_at)
         VALUES (?1, ?2, ?3, ?4, 0, ?5)",
        rusqlite::params![id, mac.as_slice(), services, users, now_s()],
    )?;
    Ok(full)
}

pub fn revoke_key(conn: &Connection, key_id: &str) -> anyhow::Result<()> {
    let id = key_id
        .strip_prefix("ak_")
        .map_or(key_id, |rest| rest.split('_').next().unwrap_or(rest));
    let changed = conn.execute("UPDATE api_keys SET revoked = 1 WHERE key_id = ?1", [id])?;
    if changed == 0 {
        bail!("no API key with id {id}");
    }
    Ok(())
}

pub struct ServiceSpec<'a> {
    pub name: &'a str,
    pub upstream: &'a str,
    pub method: &'a str,
    pub path: &'a str,
    /// `None`: bearer; `Some(name)`: the token goes in header `name`.
    pub credential_header: Option<&'a str>,
    pub rate_per_s: Option<f64>,
    pub burst: Option<f64>,
    pub timeout_ms: u64,
}

/// Adds or replaces a service, validating every field the server will parse.
pub fn add_service(conn: &Connection, spec: &ServiceSpec<'_>) -> anyhow::Result<()> {
    if spec.name.is_empty() || spec.name.len() > MAX_NAME {
        bail!("service name must be 1 to {MAX_NAME} bytes (requests name it)");
    }
    UpstreamUrl::parse(spec.upstream)?;
    PathTemplate::parse(spec.path)?;
    let method = spec.method.to_ascii_uppercase();
    hyper::Method::from_bytes(method.as_bytes()).with_context(|| format!("bad method {method}"))?;
    let kind = if spec.credential_header.is_some() {
        "header"
    } else {
        "bearer"
    };
    Credential::parse(kind, spec.credential_header)?;
    if spec.rate_per_s.is_some_and(|r| !(r.is_finite() && r > 0.0)) {
        bail!("--rate must be a positive number of requests per second");
    }
    if spec.burst.is_some_and(|b| !(b.is_finite() && b >= 1.0)) {
        bail!("--burst must be at least 1");
    }
    if spec.timeout_ms == 0 {
        bail!("--timeout-ms must be positive");
    }
    conn.execute(
        "INSERT INTO services (name, upstream, method, path_template, credential_kind,
                               credential_header, rate_per_s, burst, timeout_ms)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)
         ON CONFLICT (name) DO UPDATE SET upstream = excluded.upstream, method = excluded.method,
           path_template = excluded.path_template, credential_kind = excluded.credential_kind,
           credential_header = excluded.credential_header, rate_per_s = excluded.rate_per_s,
           burst = excluded.burst, timeout_ms = excluded.timeout_ms",
        rusqlite::params![
            spec.name,
            spec.upstream,
            method,
            spec.path,
            kind,
            spec.credential_header,
            spec.rate_per_s,
            spec.burst,
            spec.timeout_ms as i64
        ],
    )?;
    Ok(())
}

/// Stores (or replaces) the token used for `principal` on `service`, sealed.
pub fn link_token(
    conn: &Connection,
    master: &MasterKey,
    principal: &str,
    service: &str,
    token: &str,
    expires_at: Option<i64>,
) -> anyhow::Result<()> {
    if principal.is_empty() || token.is_empty() {
        bail!("user and token must not be empty");
    }
    if principal.len() > MAX_NAME {
        bail!("user must be at most {MAX_NAME} bytes (requests name it)");
    }
    // Reject now what the server could not put in a header later.
    token_header(&Credential::Bearer, token.as_bytes())?;
    let sealed = master
        .vault()
        .seal(&vault_aad(principal, service), token.as_bytes());
    conn.execute(
        "INSERT INTO vault_tokens (principal, service, sealed, expires_at, version)
         VALUES (?1, ?2, ?3, ?4, 1)
         ON CONFLICT (principal, service) DO UPDATE SET sealed = excluded.sealed,
           expires_at = excluded.expires_at, version = vault_tokens.version + 1",
        rusqlite::params![principal, service, sealed, expires_at],
    )?;
    Ok(())
}

/// `init --demo`: one key for everything, service `demo` (POST {upstream}/echo), a token for
/// `user-1`, no rate limit. Returns the API key.
pub fn demo(conn: &Connection, master: &MasterKey, upstream: &str) -> anyhow::Result<String> {
    add_service(
        conn,
        &ServiceSpec {
            name: "demo",
            upstream,
            method: "POST",
            path: "/echo",
            credential_header: None,
            rate_per_s: None,
            burst: None,
            timeout_ms: 5000,
        },
    )?;
    link_token(conn, master, "user-1", "demo", "demo-upstream-token", None)?;
    create_key(conn, master, "*", "*")
}
