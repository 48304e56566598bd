//! The ledger from the outside: verify, tamper detection, receipts listing, bad CLI input.

mod common;

use common::{Demo, act, gateway_cli, receipts};

const OK_BODY: &str = r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{}}"#;

fn fill(demo: &Demo, n: u64) {
    let server = demo.serve();
    for id in 1..=n {
        assert_eq!(
            act(&server.addr, Some(&demo.key), Some(id), OK_BODY).status,
            200
        );
    }
}

#[test]
fn verify_passes_then_detects_a_tampered_record() {
    let demo = Demo::new();
    fill(&demo, 5);
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!((code, out.trim()), (0, "ok: 5 receipts"));

    // The triggers refuse an UPDATE; an attacker with file access drops them first.
    let conn = rusqlite::Connection::open(&demo.db).expect("open");
    let refused = conn.execute("UPDATE receipts SET status = 201 WHERE seq = 3", []);
    assert!(refused.is_err());
    conn.execute_batch(
        "DROP TRIGGER receipts_no_update; UPDATE receipts SET status = 201 WHERE seq = 3;",
    )
    .expect("tamper");
    drop(conn);
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!(code, 1);
    assert!(out.starts_with("bad receipt at seq 3"), "{out}");
}

#[test]
fn verify_detects_a_missing_record() {
    let demo = Demo::new();
    fill(&demo, 4);
    let conn = rusqlite::Connection::open(&demo.db).expect("open");
    conn.execute_batch("DROP TRIGGER receipts_no_delete; DELETE FROM receipts WHERE seq = 2;")
        .expect("tamper");
    drop(conn);
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!(code, 1);
    assert!(
        out.starts_with("bad receipt at seq 3: expected seq 2"),
        "{out}"
    );
}

#[test]
fn receipts_lists_json_lines_from_a_seq_and_the_chain_survives_restarts() {
    let demo = Demo::new();
    fill(&demo, 3);
    fill(&demo, 2); // a second server process continues the chain from the stored head
    let all = receipts(&demo.db);
    let seqs: Vec<u64> = all.iter().filter_map(|r| r["seq"].as_u64()).collect();
    assert_eq!(seqs, vec![1, 2, 3, 4, 5]);
    for pair in all.windows(2) {
        assert_eq!(pair[1]["prev_hash"], pair[0]["entry_hash"]);
    }
    let (code, out, _) = gateway_cli(&["receipts", "--db", demo.db_str(), "--from", "4"]);
    assert_eq!(code, 0);
    let seqs: Vec<u64> = out
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).expect("json")["seq"]
                .as_u64()
                .expect("seq")
        })
        .collect();
    assert_eq!(seqs, vec![4, 5]);
    let (code, out, _) = gateway_cli(&["verify", "--db", demo.db_str()]);
    assert_eq!((code, out.trim()), (0, "ok: 5 receipts"));
}

#[test]
fn bad_cli_input_is_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let missing = dir.path().join("missing.db");
    let missing = missing.to_str().expect("utf-8");
    let (code, _, err) = gateway_cli(&["verify", "--db", missing]);
    assert_eq!(code, 1);
    assert!(err.contains("does not exist"), "{err}");
    let (code, _, err) = gateway_cli(&["serve", "--db", missing, "--listen", "127.0.0.1:0"]);
    assert_eq!(code, 1);
    assert!(
        err.contains("master key file") || err.contains("does not exist"),
        "{err}"
    );
    let (code, _, err) = gateway_cli(&["init", "--db", missing, "--demo"]);
    assert_eq!(code, 2, "clap usage error");
    assert!(err.contains("--upstream"), "{err}");

    let demo = Demo::new();
    let (code, _, err) =
        gateway_cli(&["serve", "--db", demo.db_str(), "--listen", "not-an-address"]);
    assert_eq!(code, 1);
    assert!(err.contains("binding not-an-address"), "{err}");
    let (code, _, err) = gateway_cli(&[
        "service",
        "add",
        "--db",
        demo.db_str(),
        "--name",
        "x",
        "--upstream",
        "ftp://h",
        "--path",
        "/",
    ]);
    assert_eq!(code, 1);
    assert!(err.contains("http://"), "{err}");
    let (code, _, err) = gateway_cli(&["key", "revoke", "--db", demo.db_str(), "--id", "ffff"]);
    assert_eq!(code, 1);
    assert!(err.contains("no API key"), "{err}");
    // init is idempotent on an existing database.
    let (code, _, err) = gateway_cli(&["init", "--db", demo.db_str()]);
    assert_eq!(code, 0, "{err}");
}
