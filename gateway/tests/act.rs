//! `POST /v1/act` end to end: the happy path, every bad input and fault from the issue, and
//! the receipts they leave. Real binaries, real HTTP on loopback, real SQLite in a temp dir.

mod common;

use common::{Demo, act, gateway_cli, http, mock_upstream, receipts};
use serde_json::Value;

const OK_BODY: &str =
    r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"b":[1,2],"a":"x"}}"#;

fn body(service: &str, user: &str) -> String {
    format!(r#"{{"service":"{service}","action":"go","on_behalf_of":"{user}","params":{{}}}}"#)
}

fn receipt_for(receipts: &[Value], req_id: u64) -> &Value {
    receipts
        .iter()
        .find(|r| r["request_id"] == req_id)
        .unwrap_or_else(|| panic!("no receipt for request {req_id}"))
}

#[test]
fn happy_path_returns_upstream_body_and_a_durable_receipt() {
    let demo = Demo::new();
    let server = demo.serve();
    let reply = act(&server.addr, Some(&demo.key), Some(4242), OK_BODY);
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert_eq!(reply.header("x-request-id"), Some("4242"));
    let json = reply.json();
    assert_eq!(json["status"], 200);
    // The upstream received the canonical params, the demo path and the vault's token.
    assert_eq!(
        json["body"],
        serde_json::json!({
            "echo": {"a": "x", "b": [1, 2]},
            "path": "/echo",
            "authorization": "Bearer demo-upstream-token",
        })
    );
    let receipt = &json["receipt"];
    assert_eq!(receipt["seq"], 1);
    assert_eq!(receipt["entry_hash"].as_str().map(str::len), Some(64));
    assert_eq!(receipt["signature"].as_str().map(str::len), Some(128));

    let stored = receipts(&demo.db);
    let row = receipt_for(&stored, 4242);
    assert_eq!(row["entry_hash"], receipt["entry_hash"]);
    assert_eq!(row["signature"], receipt["signature"]);
    assert_eq!(row["decision"], "allow");
    assert_eq!(row["principal"], "user-1");
    assert_eq!(row["service"], "demo");
    assert_eq!(row["action"], "echo");
    // SHA-256 of the canonical encoding {"a":"x","b":[1,2]}.
    let digest = sha2_hex(br#"{"a":"x","b":[1,2]}"#);
    assert_eq!(row["params_digest"], digest);
    assert!(row["upstream_latency_us"].as_i64().is_some_and(|l| l >= 0));

    // A request without an id gets a generated one, echoed back.
    let reply = act(&server.addr, Some(&demo.key), None, OK_BODY);
    assert_eq!(reply.status, 200);
    let generated: u64 = reply
        .header("x-request-id")
        .and_then(|v| v.parse().ok())
        .expect("id");
    receipt_for(&receipts(&demo.db), generated);
    // An invalid id is replaced too.
    let reply = http(
        &server.addr,
        "POST",
        "/v1/act",
        &[
            ("authorization", &format!("Bearer {}", demo.key)),
            ("x-request-id", "not-a-number"),
        ],
        OK_BODY.as_bytes(),
    );
    assert_eq!(reply.status, 200);
    assert!(
        reply
            .header("x-request-id")
            .is_some_and(|v| v.parse::<u64>().is_ok())
    );
}

fn sha2_hex(bytes: &[u8]) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(bytes))
}

#[test]
fn unauthorized_requests_get_401_and_no_receipt() {
    let demo = Demo::new();
    let server = demo.serve();
    let (id, _) = demo
        .key
        .trim_start_matches("ak_")
        .split_once('_')
        .expect("key shape");
    let wrong_secret = format!("ak_{id}_{}", "0".repeat(64));
    let cases: [(&str, Option<&str>, u64); 3] = [
        ("no key", None, 1),
        ("malformed key", Some("ak_nothex_short"), 2),
        ("wrong secret", Some(&wrong_secret), 3),
    ];
    for (what, key, req_id) in cases {
        let reply = act(&server.addr, key, Some(req_id), OK_BODY);
        assert_eq!(reply.status, 401, "{what}");
        assert_eq!(reply.code(), "unauthorized", "{what}");
        assert!(reply.json()["error"].is_string(), "{what}");
    }
    // Revocation applies to the running server at once.
    assert_eq!(
        act(&server.addr, Some(&demo.key), Some(4), OK_BODY).status,
        200
    );
    demo.cli_ok(&["key", "revoke", "--id", id]);
    let reply = act(&server.addr, Some(&demo.key), Some(5), OK_BODY);
    assert_eq!(reply.status, 401, "revoked key");
    assert_eq!(reply.code(), "unauthorized");

    let ids: Vec<u64> = receipts(&demo.db)
        .iter()
        .filter_map(|r| r["request_id"].as_u64())
        .collect();
    assert_eq!(ids, vec![4], "401s leave no receipt");
}

#[test]
fn bad_bodies_get_400_or_413() {
    let demo = Demo::new();
    let server = demo.serve();
    let key = Some(demo.key.as_str());
    let mut deep = String::from("{}");
    for _ in 0..32 {
        deep = format!(r#"{{"n":{deep}}}"#);
    }
    let too_deep =
        format!(r#"{{"service":"demo","action":"a","on_behalf_of":"user-1","params":{deep}}}"#);
    let cases = [
        (
            "malformed JSON",
            r#"{"service": "demo""#.to_owned(),
            "invalid_json",
        ),
        ("not an object", "[1,2]".to_owned(), "invalid_field"),
        (
            "missing service",
            r#"{"action":"a","on_behalf_of":"u"}"#.to_owned(),
            "missing_field",
        ),
        (
            "missing action",
            r#"{"service":"demo","on_behalf_of":"u"}"#.to_owned(),
            "missing_field",
        ),
        (
            "missing on_behalf_of",
            r#"{"service":"demo","action":"a"}"#.to_owned(),
            "missing_field",
        ),
        (
            "service not a string",
            r#"{"service":1,"action":"a","on_behalf_of":"u"}"#.to_owned(),
            "invalid_field",
        ),
        (
            "params an array",
            r#"{"service":"demo","action":"a","on_behalf_of":"u","params":[1]}"#.to_owned(),
            "params_not_object",
        ),
        (
            "params null",
            r#"{"service":"demo","action":"a","on_behalf_of":"u","params":null}"#.to_owned(),
            "params_not_object",
        ),
        ("params too deep", too_deep, "params_too_deep"),
    ];
    for (i, (what, body, code)) in cases.iter().enumerate() {
        let reply = act(&server.addr, key, Some(100 + i as u64), body);
        assert_eq!(reply.status, 400, "{what}: {}", reply.text());
        assert_eq!(reply.code(), *code, "{what}");
    }
    // Exactly at the depth limit is fine.
    let mut ok_deep = String::from("{}");
    for _ in 0..31 {
        ok_deep = format!(r#"{{"n":{ok_deep}}}"#);
    }
    let at_limit =
        format!(r#"{{"service":"demo","action":"a","on_behalf_of":"user-1","params":{ok_deep}}}"#);
    assert_eq!(act(&server.addr, key, Some(200), &at_limit).status, 200);

    let huge = format!(
        r#"{{"service":"demo","action":"a","on_behalf_of":"user-1","params":{{"x":"{}"}}}}"#,
        "a".repeat(1 << 20)
    );
    let reply = act(&server.addr, key, Some(300), &huge);
    assert_eq!(reply.status, 413);
    assert_eq!(reply.code(), "body_too_large");

    // The server is still healthy after all of that.
    assert_eq!(http(&server.addr, "GET", "/healthz", &[], b"").status, 200);
    assert_eq!(act(&server.addr, key, Some(301), OK_BODY).status, 200);
}

type Case<'a> = (&'a str, Option<&'a str>, String, u16, &'a str, &'a str);

#[test]
fn denials_and_upstream_failures_get_their_status_and_a_receipt() {
    let demo = Demo::new();
    let slow = mock_upstream(3000);
    // A port with nothing listening: bind, note it, close.
    let down = {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
        listener.local_addr().expect("addr")
    };
    let up = format!("http://{}", demo.upstream.addr);
    let add = |name: &str, upstream: &str, extra: &[&str]| {
        let mut args = vec!["service", "add", "--name", name, "--upstream", upstream];
        if !extra.contains(&"--path") {
            args.extend_from_slice(&["--path", "/x"]);
        }
        args.extend_from_slice(extra);
        demo.cli_ok(&args);
        demo.link_token("user-1", name, "t", &[]);
    };
    add("limited", &up, &["--rate", "0.001", "--burst", "1"]);
    add(
        "slow",
        &format!("http://{}", slow.addr),
        &["--timeout-ms", "300"],
    );
    add("down", &format!("http://{down}"), &[]);
    add("templated", &up, &["--path", "/items/{id}"]);
    demo.cli_ok(&[
        "service",
        "add",
        "--name",
        "tokenless",
        "--upstream",
        &up,
        "--path",
        "/x",
    ]);
    demo.link_token("user-2", "demo", "old", &["--ttl-s", "-10"]);
    let narrow = demo.create_key(&["--services", "demo", "--users", "user-1"]);

    let server = demo.serve();
    let key = Some(demo.key.as_str());
    // (what, key, body, status, code, decision)
    let cases: Vec<Case> = vec![
        (
            "out of scope service",
            Some(&narrow),
            body("limited", "user-1"),
            403,
            "scope_denied",
            "deny",
        ),
        (
            "out of scope user",
            Some(&narrow),
            body("demo", "user-2"),
            403,
            "scope_denied",
            "deny",
        ),
        (
            "unknown service",
            key,
            body("nope", "user-1"),
            404,
            "not_found",
            "deny",
        ),
        (
            "token missing",
            key,
            body("tokenless", "user-1"),
            403,
            "token_missing",
            "deny",
        ),
        (
            "token expired",
            key,
            body("demo", "user-2"),
            403,
            "token_expired",
            "deny",
        ),
        (
            "missing path param",
            key,
            body("templated", "user-1"),
            400,
            "bad_params",
            "deny",
        ),
        (
            "upstream down",
            key,
            body("down", "user-1"),
            502,
            "upstream_unreachable",
            "error",
        ),
        (
            "upstream slow",
            key,
            body("slow", "user-1"),
            504,
            "upstream_timeout",
            "error",
        ),
    ];
    for (i, (what, key, body, status, code, _)) in cases.iter().enumerate() {
        let reply = act(&server.addr, *key, Some(1000 + i as u64), body);
        assert_eq!(reply.status, *status, "{what}: {}", reply.text());
        assert_eq!(reply.code(), *code, "{what}");
    }
    // Rate limit: burst 1, then empty for ~1000 s.
    assert_eq!(
        act(&server.addr, key, Some(2000), &body("limited", "user-1")).status,
        200
    );
    let reply = act(&server.addr, key, Some(2001), &body("limited", "user-1"));
    assert_eq!(reply.status, 429);
    assert_eq!(reply.code(), "rate_limited");
    // A path template filled from params.
    let templated =
        r#"{"service":"templated","action":"a","on_behalf_of":"user-1","params":{"id":"a/b"}}"#;
    let reply = act(&server.addr, key, Some(2002), templated);
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["body"]["path"], "/items/a%2Fb");

    let stored = receipts(&demo.db);
    for (i, (what, _, _, status, code, decision)) in cases.iter().enumerate() {
        let row = receipt_for(&stored, 1000 + i as u64);
        assert_eq!(row["status"], *status, "{what}");
        assert_eq!(row["error_code"], *code, "{what}");
        assert_eq!(row["decision"], *decision, "{what}");
    }
    assert_eq!(receipt_for(&stored, 2001)["error_code"], "rate_limited");
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!(code, 0);
    assert_eq!(out.trim(), format!("ok: {} receipts", stored.len()));
}

#[test]
fn other_routes() {
    let demo = Demo::new();
    let server = demo.serve();
    let health = http(&server.addr, "GET", "/healthz", &[], b"");
    assert_eq!(health.status, 200);
    let pubkey = http(&server.addr, "GET", "/v1/receipts/pubkey", &[], b"").json();
    assert_eq!(pubkey["algorithm"], "ed25519");
    assert_eq!(pubkey["public_key"].as_str().map(str::len), Some(64));
    let missing = http(&server.addr, "GET", "/nope", &[], b"");
    assert_eq!(
        (missing.status, missing.code()),
        (404, "not_found".to_owned())
    );
    let wrong = http(&server.addr, "GET", "/v1/act", &[], b"");
    assert_eq!(
        (wrong.status, wrong.code()),
        (405, "method_not_allowed".to_owned())
    );
}

#[test]
fn vault_changes_reach_a_running_server() {
    let demo = Demo::new();
    let server = demo.serve();
    let key = Some(demo.key.as_str());
    let injected =
        |id| act(&server.addr, key, Some(id), OK_BODY).json()["body"]["authorization"].clone();
    assert_eq!(injected(1), "Bearer demo-upstream-token");
    demo.link_token("user-1", "demo", "rotated", &[]);
    assert_eq!(
        injected(2),
        "Bearer rotated",
        "the decrypted-token cache was not invalidated"
    );
    demo.link_token("user-1", "demo", "rotated", &["--ttl-s", "-1"]);
    let reply = act(&server.addr, key, Some(3), OK_BODY);
    assert_eq!(
        (reply.status, reply.code()),
        (403, "token_expired".to_owned())
    );
    // A header credential instead of bearer.
    let up = format!("http://{}", demo.upstream.addr);
    demo.cli_ok(&[
        "service",
        "add",
        "--name",
        "hdr",
        "--upstream",
        &up,
        "--path",
        "/h",
        "--credential-header",
        "x-api-key",
    ]);
    demo.link_token("user-1", "hdr", "k1", &[]);
    let reply = act(&server.addr, key, Some(4), &body("hdr", "user-1"));
    assert_eq!(reply.status, 200);
    assert_eq!(reply.json()["body"]["authorization"], Value::Null);
}

#[test]
fn issue37_item2_dot_segments_cannot_escape_the_path_template() {
    let demo = Demo::new();
    let up = format!("http://{}", demo.upstream.addr);
    for (name, path) in [("items", "/items/{id}/x"), ("pair", "/p/{a}{b}/x")] {
        demo.cli_ok(&[
            "service",
            "add",
            "--name",
            name,
            "--upstream",
            &up,
            "--path",
            path,
        ]);
        demo.link_token("user-1", name, "t", &[]);
    }
    let server = demo.serve();
    let key = Some(demo.key.as_str());
    let with = |service: &str, params: &str| {
        format!(
            r#"{{"service":"{service}","action":"get","on_behalf_of":"user-1","params":{params}}}"#
        )
    };
    // Each would reach another upstream path with the user's credential, once a server
    // normalises it: /items/../x is /x, /items/./x and /items//x are /items/x.
    let refused = [
        ("items", r#"{"id":".."}"#),
        ("items", r#"{"id":"."}"#),
        ("items", r#"{"id":""}"#),
        ("pair", r#"{"a":".","b":"."}"#),
        ("pair", r#"{"a":"..","b":""}"#),
    ];
    for (i, (service, params)) in refused.iter().enumerate() {
        let reply = act(
            &server.addr,
            key,
            Some(10 + i as u64),
            &with(service, params),
        );
        assert_eq!(
            (reply.status, reply.code()),
            (400, "bad_params".to_owned()),
            "{service} {params}: {}",
            reply.text()
        );
    }
    // Dots inside a segment are only names.
    for (i, (service, params, path)) in [
        ("items", r#"{"id":"..."}"#, "/items/.../x"),
        ("items", r#"{"id":"a..b"}"#, "/items/a..b/x"),
        ("pair", r#"{"a":".","b":"a"}"#, "/p/.a/x"),
    ]
    .iter()
    .enumerate()
    {
        let reply = act(
            &server.addr,
            key,
            Some(20 + i as u64),
            &with(service, params),
        );
        assert_eq!(reply.status, 200, "{params}: {}", reply.text());
        assert_eq!(reply.json()["body"]["path"], *path);
    }
    let stored = receipts(&demo.db);
    for i in 0..refused.len() as u64 {
        let row = receipt_for(&stored, 10 + i);
        assert_eq!(
            (&row["decision"], &row["error_code"]),
            (&"deny".into(), &"bad_params".into())
        );
    }
}

#[test]
fn issue37_item3_a_key_cannot_grow_the_ledger_without_bound() {
    let demo = Demo::new();
    let narrow = demo.create_key(&["--services", "demo", "--users", "user-1"]);
    let server = demo.serve();
    let key = Some(demo.key.as_str());
    let named = |service: &str, action: &str, user: &str| {
        format!(r#"{{"service":"{service}","action":"{action}","on_behalf_of":"{user}"}}"#)
    };

    // What goes into a receipt is bounded: each name at most 256 bytes, and not empty.
    let long = "a".repeat(1 << 19);
    for (i, body) in [
        named("demo", &long, "user-1"),
        named(&long, "echo", "user-1"),
        named("demo", "echo", &long),
        named("demo", &"a".repeat(257), "user-1"),
        named("demo", "", "user-1"),
    ]
    .iter()
    .enumerate()
    {
        let reply = act(&server.addr, key, Some(100 + i as u64), body);
        assert_eq!(
            (reply.status, reply.code()),
            (400, "invalid_field".to_owned()),
            "body {i}: {}",
            reply.text()
        );
    }
    assert!(
        receipts(&demo.db).is_empty(),
        "a refused body left a receipt"
    );
    let at_limit = named("demo", &"a".repeat(256), "user-1");
    assert_eq!(act(&server.addr, key, Some(200), &at_limit).status, 200);

    // Denials are receipted up to a budget per key (burst 100, then 10/s); past it they are
    // refused without one. Before, every denied request left a receipt.
    const DENIED: u64 = 300;
    let started = std::time::Instant::now();
    let mut refused = 0;
    for i in 0..DENIED {
        let reply = act(
            &server.addr,
            Some(&narrow),
            Some(1000 + i),
            &body("other", "user-1"),
        );
        match (reply.status, reply.code().as_str()) {
            (403, "scope_denied") => {}
            (429, "too_many_denials") => refused += 1,
            other => panic!("denied request {i}: {other:?} {}", reply.text()),
        }
    }
    let elapsed = started.elapsed().as_secs_f64();
    let stored = receipts(&demo.db);
    let narrow_id = narrow.split('_').nth(1).expect("ak_<id>_<secret>");
    let denied = stored.iter().filter(|r| r["key_id"] == narrow_id).count() as u64;
    assert_eq!(denied + refused, DENIED);
    let budget = 100 + (10.0 * elapsed).ceil() as u64;
    assert!(
        denied <= budget,
        "{denied} denials receipted in {elapsed:.2} s (budget {budget})"
    );
    // The budget is for denials only: the same key's allowed requests still act.
    assert_eq!(
        act(
            &server.addr,
            Some(&narrow),
            Some(5000),
            &body("demo", "user-1")
        )
        .status,
        200
    );
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!(
        (code, out.trim()),
        (0, format!("ok: {} receipts", stored.len() + 1).as_str())
    );
}
