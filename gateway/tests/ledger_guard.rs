//! Issue 21, items 15–17: the ledger is served by one gateway at a time, a writer failure stops
//! the gateway loudly, and `verify` checks against what was published, not only the file.

mod common;

use std::process::Command;
use std::time::Duration;

use common::{Demo, Proc, act, gateway_cli, gateway_serve_logged, wait_exit};
use ed25519_dalek::{Signer, SigningKey};

const OK_BODY: &str =
    r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"n":1}}"#;

#[test]
fn item_17_second_gateway_on_one_ledger_refuses_to_start() {
    let demo = Demo::new();
    let first = demo.serve();
    assert_eq!(
        act(&first.addr, Some(&demo.key), Some(1), OK_BODY).status,
        200
    );

    let log = demo.dir.path().join("second.log");
    let mut second = Proc {
        proc: common::start(
            testproc::Spawn::command(
                "second gateway",
                common::gateway_serve_command(&demo.db, &[]),
            )
            .log(&log),
        ),
        addr: String::new(),
    };
    let status = wait_exit(&mut second, Duration::from_secs(20));
    assert!(!status.success(), "the second gateway exited with {status}");
    let err = std::fs::read_to_string(&log).expect("second log");
    let holder = format!("pid {}", first.proc.pid());
    assert!(
        err.contains("already served by another gateway") && err.contains(&holder),
        "the error does not name the holder ({holder}): {err}"
    );

    assert_eq!(
        act(&first.addr, Some(&demo.key), Some(2), OK_BODY).status,
        200
    );
}

#[test]
fn item_15_writer_failure_fails_health_and_exits_with_the_error() {
    let demo = Demo::new();
    let log = demo.dir.path().join("gateway.log");
    let mut server = gateway_serve_logged(&demo.db, &[], &log);
    assert_eq!(
        act(&server.addr, Some(&demo.key), Some(1), OK_BODY).status,
        200
    );

    // Every later insert fails inside the writer's transaction.
    let conn = rusqlite::Connection::open(&demo.db).expect("open");
    conn.execute_batch(
        "CREATE TRIGGER forced_failure BEFORE INSERT ON receipts
         BEGIN SELECT RAISE(ABORT, 'forced writer failure'); END;",
    )
    .expect("trigger");
    drop(conn);

    let reply = act(&server.addr, Some(&demo.key), Some(2), OK_BODY);
    assert_eq!(reply.status, 500, "{}", reply.text());
    assert_eq!(reply.code(), "receipt_failed");
    let status = wait_exit(&mut server, Duration::from_secs(30));
    assert!(!status.success(), "the gateway exited with {status}");
    let err = std::fs::read_to_string(&log).expect("log");
    assert!(
        err.contains("ledger writer stopped") && err.contains("forced writer failure"),
        "the writer's error is not logged: {err}"
    );
}

#[test]
fn item_15_serve_rejects_out_of_range_values() {
    let demo = Demo::new();
    for (flag, value) in [
        ("--batch-max", "0"),
        ("--batch-max", "1000000"),
        ("--workers", "0"),
        ("--checkpoint-records", "0"),
        ("--header-timeout-ms", "0"),
        ("--body-timeout-ms", "0"),
        ("--max-connections", "0"),
        ("--deny-rate", "0"),
        ("--deny-burst", "0"),
    ] {
        let (code, _, err) = gateway_cli(&["serve", "--db", demo.db_str(), flag, value]);
        assert_eq!(code, 2, "{flag} {value} was accepted: {err}");
        assert!(err.contains(flag), "{flag} {value}: {err}");
    }
}

/// Three receipts, the server stopped; returns (`head=` value, `public_key=` value).
fn ledger_with_three_receipts(demo: &Demo) -> (String, String) {
    let server = demo.serve();
    for id in 1..=3 {
        assert_eq!(
            act(&server.addr, Some(&demo.key), Some(id), OK_BODY).status,
            200
        );
    }
    drop(server);
    let out = demo.cli_ok(&["head"]);
    let field = |name: &str| {
        out.lines()
            .find_map(|l| l.strip_prefix(name))
            .unwrap_or_else(|| panic!("no {name} line in {out:?}"))
            .to_owned()
    };
    let head = field("head=");
    assert!(head.starts_with("3:"), "{head}");
    (head, field("public_key="))
}

fn verify(demo: &Demo, extra: &[&str]) -> (i32, String) {
    let mut args = vec!["verify", "--db", demo.db_str()];
    args.extend_from_slice(extra);
    let (code, out, err) = gateway_cli(&args);
    (code, out + &err)
}

#[test]
fn item_16_truncated_chain_fails_against_the_published_head() {
    let demo = Demo::new();
    let (head, pubkey) = ledger_with_three_receipts(&demo);
    let published = ["--expect-head", &head, "--pubkey", &pubkey];
    assert_eq!(verify(&demo, &published).0, 0);

    let conn = rusqlite::Connection::open(&demo.db).expect("open");
    conn.execute_batch("DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = 3;")
        .expect("truncate");
    drop(conn);

    let (code, out) = verify(&demo, &[]);
    assert_eq!(code, 0, "the file alone still looks fine: {out}");
    let (code, out) = verify(&demo, &published);
    assert_eq!(code, 1, "{out}");
    assert!(
        out.contains("published head") && out.contains("missing"),
        "{out}"
    );
}

#[test]
fn item_16_rekeyed_chain_fails_against_the_published_key() {
    let demo = Demo::new();
    let (head, pubkey) = ledger_with_three_receipts(&demo);

    // Whoever can write the file swaps in their own key and re-signs every receipt.
    let forger = SigningKey::generate(&mut rand::rngs::OsRng);
    let mut conn = rusqlite::Connection::open(&demo.db).expect("open");
    let tx = conn.transaction().expect("tx");
    tx.execute_batch("DROP TRIGGER receipts_no_update;")
        .expect("drop trigger");
    tx.execute(
        "UPDATE signer_keys SET public_key = ?1",
        [forger.verifying_key().to_bytes().as_slice()],
    )
    .expect("rekey");
    let hashes: Vec<(i64, Vec<u8>)> = tx
        .prepare("SELECT seq, entry_hash FROM receipts")
        .expect("select")
        .query_map([], |r| Ok((r.get(0)?, r.get(1)?)))
        .expect("query")
        .collect::<Result<_, _>>()
        .expect("rows");
    for (seq, hash) in hashes {
        let signature = forger.sign(&hash).to_bytes();
        tx.execute(
            "UPDATE receipts SET signature = ?1 WHERE seq = ?2",
            rusqlite::params![signature.as_slice(), seq],
        )
        .expect("re-sign");
    }
    tx.commit().expect("commit");
    drop(conn);

    let (code, out) = verify(&demo, &["--expect-head", &head]);
    assert_eq!(code, 0, "same hashes: the head alone cannot tell: {out}");
    let (code, out) = verify(&demo, &["--pubkey", &pubkey]);
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("published key"), "{out}");
}

#[test]
fn item_16_verify_opens_read_only_and_lists_its_flags() {
    let dir = tempfile::tempdir().expect("tempdir");
    let db = dir.path().join("empty.db");
    std::fs::write(&db, b"").expect("empty file");
    let (code, out, err) = gateway_cli(&["verify", "--db", db.to_str().expect("utf-8")]);
    assert_ne!(code, 0, "an empty file verified: {out}");
    assert!(err.contains("schema version 0"), "{err}");
    assert_eq!(
        std::fs::metadata(&db).expect("stat").len(),
        0,
        "verify wrote the file"
    );

    let help = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .args(["verify", "--help"])
        .output()
        .expect("help");
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("--pubkey <HEX>") && help.contains("--expect-head <SEQ:HASH>"),
        "{help}"
    );
    // The command list names them too: that is where a reader looks for what verify can do.
    let usage = Command::new(env!("CARGO_BIN_EXE_gateway"))
        .arg("--help")
        .output()
        .expect("help");
    let usage = String::from_utf8_lossy(&usage.stdout);
    let verify = usage
        .lines()
        .find(|l| l.trim_start().starts_with("verify "))
        .unwrap_or_else(|| panic!("no verify line in {usage}"));
    assert!(
        verify.contains("--pubkey") && verify.contains("--expect-head"),
        "{usage}"
    );
}

#[test]
fn item_6_repeated_and_zero_client_ids_each_get_a_receipt() {
    let demo = Demo::new();
    let server = demo.serve();
    for id in [5, 5, 0] {
        let reply = act(&server.addr, Some(&demo.key), Some(id), OK_BODY);
        assert_eq!(reply.status, 200);
        assert_eq!(reply.header("x-request-id"), Some(id.to_string().as_str()));
    }
    drop(server);
    let ids: Vec<u64> = common::receipts(&demo.db)
        .iter()
        .map(|r| r["request_id"].as_u64().expect("request_id"))
        .collect();
    assert_eq!(ids, [5, 5, 0], "receipts keep the client's ids");
}

#[test]
fn item_16_head_refuses_a_ledger_that_does_not_verify() {
    let demo = Demo::new();
    ledger_with_three_receipts(&demo);

    // A receipt's contents changed after it was signed.
    let conn = rusqlite::Connection::open(&demo.db).expect("open");
    conn.execute_batch(
        "DROP TRIGGER receipts_no_update; UPDATE receipts SET principal = 'mallory' WHERE seq = 2;",
    )
    .expect("tamper");
    drop(conn);

    let (code, out, err) = gateway_cli(&["head", "--db", demo.db_str()]);
    assert_eq!(code, 1, "head printed {out:?} for a tampered ledger");
    assert!(!out.contains("head="), "{out}");
    assert!(
        err.contains("does not verify") && err.contains("seq 2"),
        "{err}"
    );
}
