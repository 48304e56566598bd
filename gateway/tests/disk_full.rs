//! Issue 37, item 3: a full disk under the ledger refuses new acts with 503 and keeps the
//! gateway up, serving reads, until there is room again; the ledger stays whole.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{Demo, act, gateway_serve, http, mock_upstream, try_act, without_receipt};

const OK_BODY: &str =
    r#"{"service":"demo","action":"echo","on_behalf_of":"user-1","params":{"n":1}}"#;

/// A tmpfs of `size` mounted on `at`, unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, size: &str) -> Tmpfs {
        use rustix::mount::{MountFlags, mount};
        mount(
            "tmpfs",
            at,
            "tmpfs",
            MountFlags::empty(),
            Some(&*std::ffi::CString::new(format!("size={size}")).expect("no NUL")),
        )
        .unwrap_or_else(|e| panic!("mounting a tmpfs on {}: {e}", at.display()));
        Tmpfs(at.to_owned())
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        use rustix::mount::{UnmountFlags, unmount};
        let _ = unmount(&self.0, UnmountFlags::DETACH);
    }
}

/// Writes `path` until the filesystem has no room left.
fn fill(path: &Path) {
    let mut file = std::fs::File::create(path).expect("filler");
    let chunk = vec![0xa5u8; 64 << 10];
    loop {
        match file.write(&chunk) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) if e.raw_os_error() == Some(rustix::io::Errno::NOSPC.raw_os_error()) => return,
            Err(e) => panic!("filling {}: {e}", path.display()),
        }
    }
}

#[test]
fn issue37_item3_a_full_disk_refuses_acts_and_keeps_serving_reads() {
    if !rustix::process::geteuid().is_root() {
        let thread = std::thread::current();
        let test = thread.name().unwrap_or("this test");
        eprintln!("SKIPPED {test}: needs root (mounts a small tmpfs for the ledger)");
        return;
    }
    let mount_point = tempfile::tempdir().expect("tempdir");
    let tmpfs = Tmpfs::mount(mount_point.path(), "16m");
    let demo = Demo::with_db(
        mock_upstream(0),
        tempfile::tempdir().expect("tempdir"),
        mount_point.path().join("gateway.db"),
    );
    let mut server = gateway_serve(&demo.db, &[]);
    let key = Some(demo.key.as_str());
    let mut served = Vec::new();
    assert_eq!(act(&server.addr, key, Some(1), OK_BODY).status, 200);
    served.push(1);

    let filler = mount_point.path().join("filler");
    fill(&filler);
    // The next receipts find no room: the commit that fails answers 500 (its upstream result
    // withheld, as for any failed commit), and acts are refused from then on.
    let mut id = 100;
    let failed = loop {
        let reply = try_act(&server.addr, key, Some(id), OK_BODY).unwrap_or_else(|e| {
            panic!(
                "act {id} on a full disk: {e}; the gateway:\n{}",
                server.proc.tail()
            )
        });
        match reply.status {
            200 => served.push(id),
            _ => break reply,
        }
        id += 1;
        assert!(id < 1100, "1000 receipts written on a full disk");
    };
    assert_eq!(
        (failed.status, failed.code()),
        (500, "receipt_failed".to_owned()),
        "{}",
        failed.text()
    );
    let refused = act(&server.addr, key, Some(2000), OK_BODY);
    assert_eq!(
        (refused.status, refused.code()),
        (503, "ledger_full".to_owned()),
        "{}; the gateway:\n{}",
        refused.text(),
        server.proc.tail()
    );
    let health = http(&server.addr, "GET", "/healthz", &[], b"");
    assert_eq!(
        (health.status, health.code()),
        (503, "ledger_full".to_owned())
    );
    let pubkey = http(&server.addr, "GET", "/v1/receipts/pubkey", &[], b"");
    assert_eq!(pubkey.status, 200, "reads are still served");
    assert!(
        server.proc.try_wait().expect("try_wait").is_none(),
        "the gateway exited on a full disk:\n{}",
        server.proc.tail()
    );

    // Room again: acts are accepted again within a few seconds, on the same chain.
    std::fs::remove_file(&filler).expect("remove the filler");
    let freed = Instant::now();
    let mut id = 3000;
    loop {
        let reply = act(&server.addr, key, Some(id), OK_BODY);
        if reply.status == 200 {
            served.push(id);
            break;
        }
        assert_eq!(reply.code(), "ledger_full", "{}", reply.text());
        assert!(
            freed.elapsed() < Duration::from_secs(10),
            "acts still refused 10 s after the disk had room"
        );
        std::thread::sleep(Duration::from_millis(100));
        id += 1;
    }
    drop(server);
    assert_eq!(without_receipt(&demo.db, &served), Vec::<u64>::new());
    drop(tmpfs);
}
