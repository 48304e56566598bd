//! Crash safety: kill -9 the gateway under concurrent load, restart it on the same database,
//! and check that the ledger verifies and every acknowledged (200) request has its receipt.

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Demo, act, try_act, without_receipt};

const OK_BODY: &str =
    r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"n":1}}"#;
const CLIENTS: u64 = 32;
const PER_CLIENT: u64 = 12;

#[test]
fn kill_9_midway_loses_no_acknowledged_receipt() {
    let demo = Demo::new();
    let mut server = demo.serve();
    let acknowledged = Arc::new(Mutex::new(Vec::new()));
    let answered = Arc::new(AtomicUsize::new(0));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (addr, key) = (server.addr.clone(), demo.key.clone());
            let (acknowledged, answered) = (acknowledged.clone(), answered.clone());
            std::thread::spawn(move || {
                for i in 0..PER_CLIENT {
                    let id = c * 1000 + i + 1;
                    match try_act(&addr, Some(&key), Some(id), OK_BODY) {
                        Ok(reply) if reply.status == 200 => {
                            acknowledged.lock().expect("lock").push(id);
                            answered.fetch_add(1, Ordering::Relaxed);
                        }
                        // After the kill: refused or cut-off connections.
                        _ => {}
                    }
                }
            })
        })
        .collect();

    let total = (CLIENTS * PER_CLIENT) as usize;
    let deadline = Instant::now() + Duration::from_secs(60);
    while answered.load(Ordering::Relaxed) < total / 3 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(2));
    }
    server.proc.kill().expect("kill -9");
    for client in clients {
        client.join().expect("client thread");
    }
    let acknowledged = acknowledged.lock().expect("lock").clone();
    assert!(
        acknowledged.len() >= total / 3,
        "only {} answers before the kill",
        acknowledged.len()
    );
    assert!(
        acknowledged.len() < total,
        "the kill came after every request finished"
    );

    // Restart on the same database: the chain continues, nothing acknowledged is missing.
    let server = demo.serve();
    assert_eq!(
        act(&server.addr, Some(&demo.key), Some(999_999), OK_BODY).status,
        200
    );
    drop(server);
    let missing = without_receipt(&demo.db, &acknowledged);
    assert!(
        missing.is_empty(),
        "acknowledged without a receipt: {missing:?}"
    );
    assert!(without_receipt(&demo.db, &[999_999]).is_empty());
}
