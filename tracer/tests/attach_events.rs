//! Root only: attach the tracer to a fixture with every probe site, check that every kind of
//! event arrives, and that nothing of ours stays in the kernel afterwards. `TRACER_ATTACH` is
//! passed on as `--attach`; the attach lines must show the mode detection picks for it.

mod attach_common;

use std::{
    io::{Read as _, Write as _},
    time::Duration,
};

use attach_common::*;
use tracer::events::data::{Direction, read_dump};
use tracer_ebpf::abi::{DATA_BYTES, syscall};

/// The fixture's body when re-executed by the tests below; a no-op in a normal test run.
#[test]
fn fixture_child() {
    if let Ok(secs) = std::env::var(FIXTURE_ENV) {
        fixture_main(secs.parse().unwrap());
    }
    if std::env::var_os(LISTEN_ONLY_ENV).is_some() {
        listen_only_main();
    }
    if std::env::var_os(IOV_FIXTURE_ENV).is_some() {
        iov_fixture_main();
    }
}

#[test]
fn every_event_kind_arrives_and_detach_is_clean() {
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let stderr = record_fixture(&me, &["--duration", "3", "--offcpu-stacks"]);
    eprintln!("{stderr}");

    let (sched, syscalls, sockets) = expected_kinds();
    // Raw where the kernel's BTF has what they read: no machine this runs on lacks it.
    let want_sched = if attach_choice() == "tracepoint" {
        "tracepoint"
    } else {
        "raw_tracepoint"
    };
    assert_eq!(sched, want_sched);
    for (group, mode) in [
        ("sched", sched.as_str()),
        ("syscalls", syscalls.as_str()),
        ("sockets", sockets.as_str()),
        ("sites", "uprobe"),
        ("samples", "perf_event"),
    ] {
        let line = stderr
            .lines()
            .find(|l| l.starts_with(&format!("tracer: attach {group} ")));
        let line = line.unwrap_or_else(|| panic!("no attach line for {group}:\n{stderr}"));
        let shown = line.split_whitespace().nth(3);
        assert_eq!(shown, Some(mode), "{line}");
    }
    let counts = event_counts(&stderr);
    assert_eq!(counts.len(), 10, "{stderr}");
    // A task name is sent only when a process outside the target takes its CPU.
    for (name, count) in counts.iter().filter(|(name, _)| name != "task_name") {
        assert!(*count > 0, "no {name} events:\n{stderr}");
    }
    assert!(stderr.contains("stopped (duration reached)"), "{stderr}");
    assert!(stderr.contains("(0 lost"), "{stderr}");

    let ids = program_ids(&stderr);
    assert!(ids.len() > 30, "program ids missing:\n{stderr}");
    assert_detached(&stderr, &[&me]);
}

#[test]
fn stops_when_the_target_exits() {
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // Lives long enough for any machine to attach; killed once traced for a moment.
    let mut fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let pid = fixture.pid().to_string();
    let mut tracer =
        Background::spawn(&record_args(fixture.pid(), out.path(), &["--no-calibrate"]));
    tracer.wait_ready(Duration::from_secs(120));
    std::thread::sleep(Duration::from_millis(500));
    fixture.kill().unwrap();
    let exited = std::time::Instant::now();
    let (status, stderr) = tracer.finish();
    assert!(status.success(), "tracer failed:\n{stderr}");
    assert!(
        stderr.contains(&format!("stopped (pid {pid} exited)")),
        "{stderr}"
    );
    // Bounded: the tracer must not wait for anything once the target is gone.
    assert!(exited.elapsed() < Duration::from_secs(30));
    let counts = event_counts(&stderr);
    assert!(
        counts.iter().any(|(name, n)| name == "site" && *n > 0),
        "{stderr}"
    );
    assert_detached(&stderr, &[&me]);
}

#[test]
fn sigint_detaches() {
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    // Killed when done: long enough for a slow (emulated) machine to calibrate and attach.
    let fixture = spawn_fixture(&me, 600.0);
    let out = tempfile::tempdir().unwrap();
    let mut tracer = Background::spawn(&record_args(fixture.pid(), out.path(), &[]));
    tracer.wait_ready(Duration::from_secs(120));
    tracer.signal(Signal::INT);
    let (status, stderr) = tracer.finish();
    drop(fixture);
    assert!(status.success(), "tracer failed:\n{stderr}");
    assert!(stderr.contains("stopped (signal 2)"), "{stderr}");
    assert_detached(&stderr, &[&me]);
}

/// `--empty-programs` (validate's "hooks only" floor row) must cost what the hooks cost: every
/// group attached as in a normal session, while the fixture keeps hitting its sites and
/// syscalls, and not one event written.
#[test]
fn empty_programs_attach_every_hook_and_record_nothing() {
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let stderr = record_fixture(
        &me,
        &["--duration", "2", "--no-calibrate", "--empty-programs"],
    );
    assert!(stderr.contains("+ empty programs"), "{stderr}");
    for group in ["sched", "syscalls", "sockets", "sites", "samples"] {
        assert!(
            stderr
                .lines()
                .any(|l| l.starts_with(&format!("tracer: attach {group} "))),
            "no attach line for {group}:\n{stderr}"
        );
    }
    let counts = event_counts(&stderr);
    assert_eq!(counts.len(), 10, "{stderr}");
    assert!(counts.iter().all(|(_, n)| *n == 0), "{stderr}");
    assert_detached(&stderr, &[&me]);
}

/// Issue 21 item 7: a thread that exits leaves TIDS for good. Its last switch-out, after
/// sched_process_exit removed it, used to add it back: here the fixture's two threads stayed in
/// the map after the process had exited. With the raw sched programs (which read the exit
/// state from the task) and the classic ones (which get it in the record).
#[test]
fn item7_tids_not_readded_at_exit() {
    use tracer::attach::detect::{Choice, Plan, SchedKind};
    if !require_root() {
        return;
    }
    let raw = Plan::new(Choice::Auto).unwrap();
    assert_eq!(raw.sched, SchedKind::RawTracepoint);
    tids_not_readded_at_exit(&raw);
    // The classic ones, as `--attach tracepoint` attaches them; only the sched group is
    // attached, so syscalls and sockets keep their modes (the sock tracepoints are 6.3+).
    let classic = Plan {
        sched: SchedKind::Tracepoint,
        ..raw
    };
    tids_not_readded_at_exit(&classic);
}

fn tids_not_readded_at_exit(plan: &tracer::attach::detect::Plan) {
    use tracer::attach::{Group, Options, Session, target::Target};
    let me = std::env::current_exe().unwrap();
    // Runs until stopped below: attaching takes from a second here to a minute in the
    // emulated guest, so an exit on its own could come before the programs are in.
    let mut fixture = spawn_fixture(&me, 600.0);
    let target = Target::open(fixture.pid()).unwrap();
    let options = Options {
        sample_hz: 0,
        ring_bytes: 1 << 20,
        stack_entries: tracer_ebpf::abi::STACK_ENTRIES,
        offcpu_stacks: false,
        phases: false,
        skip: vec![
            Group::Syscalls,
            Group::Sockets,
            Group::Sites,
            Group::Samples,
        ],
        empty_programs: false,
    };
    let session = Session::attach(&target, &options, plan).expect("attaching the sched group");
    assert!(
        !session.target_tids().unwrap().is_empty(),
        "threads seeded from /proc"
    );
    // Threads seeded before sched_process_exit was attached and gone since would stay: the
    // check below needs the fixture to exit while everything is attached.
    assert!(
        fixture.try_wait().unwrap().is_none(),
        "the fixture exited while the tracer attached"
    );
    // Every thread exits while everything is attached, each through its own last switch-out.
    fixture.signal(Signal::TERM).unwrap();
    fixture.wait().unwrap();
    // The parent can be woken between a thread's exit_notify and its last switch-out: give
    // that switch a moment, so the check below sees it happen (it asserts no time).
    std::thread::sleep(Duration::from_millis(200));
    assert_eq!(session.target_tids().unwrap(), Vec::<u32>::new());
    session.detach();
}

/// Issue 21 item 10: a connection that reaches ESTABLISHED on the target's listening port in
/// another network namespace (here a thread of this test, in a namespace of its own with a
/// listener on the same port) is not the target's: it used to enter TARGET_SOCKS, matched by
/// port alone. A connection to the target itself still does.
#[test]
fn item10_other_netns_same_port_is_not_the_targets() {
    use tracer::attach::{
        Group, Options, Session,
        detect::{Choice, Plan},
        target::Target,
    };
    use tracer_ebpf::abi::{Event, kind};
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let (mut fixture, addr) = spawn_listen_only(&me);
    let target = Target::open(fixture.pid()).unwrap();
    let options = Options {
        sample_hz: 0,
        ring_bytes: 1 << 20,
        stack_entries: tracer_ebpf::abi::STACK_ENTRIES,
        offcpu_stacks: false,
        phases: false,
        skip: vec![Group::Syscalls, Group::Sched, Group::Sites, Group::Samples],
        empty_programs: false,
    };
    let plan = Plan::new(Choice::Auto).unwrap();
    assert!(plan.netns_match, "{:?}", plan.detected.sock_netns);
    let mut session = Session::attach(&target, &options, &plan).expect("attaching sockets");
    let mut ring = session.take_events().unwrap();

    // Another namespace: connected and accepted (so its ESTABLISHED has fired) before ours.
    std::thread::spawn(move || {
        enter_new_netns_with_loopback();
        let listener = std::net::TcpListener::bind(addr).expect("the same port, elsewhere");
        let _client = std::net::TcpStream::connect(addr).unwrap();
        listener.accept().unwrap();
    })
    .join()
    .unwrap();
    let _own = std::net::TcpStream::connect(addr).unwrap();

    let mut established = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while established.is_empty() && std::time::Instant::now() < deadline {
        while let Some(item) = ring.next() {
            // SAFETY: every record in the ring is one `Event`, written by the kernel programs.
            let event: Event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            if event.kind == kind::ESTABLISHED {
                established.push(event.args[1]);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    fixture.kill().unwrap();
    session.detach();
    assert_eq!(
        established,
        [u64::from(addr.port())],
        "the target's connection only"
    );
}

/// Moves the calling thread into a new network namespace and brings its loopback up.
fn enter_new_netns_with_loopback() {
    // SAFETY: affects only this thread's namespaces.
    assert_eq!(unsafe { libc::unshare(libc::CLONE_NEWNET) }, 0, "unshare");
    // SAFETY: a plain socket for the interface ioctls, closed below.
    let fd = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM, 0) };
    assert!(fd >= 0);
    // SAFETY: all zeroes is a valid ifreq; the name fits with its NUL.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(b"lo") {
        *dst = *src as libc::c_char;
    }
    // SAFETY: `ifr` names an interface and lives across both calls.
    unsafe {
        assert_eq!(libc::ioctl(fd, libc::SIOCGIFFLAGS, &mut ifr), 0);
        ifr.ifr_ifru.ifru_flags |= libc::IFF_UP as libc::c_short;
        assert_eq!(libc::ioctl(fd, libc::SIOCSIFFLAGS, &ifr), 0);
        libc::close(fd);
    }
}

/// Issue 21 (every `drops` counter at 0): a session's stacks are not lost to hash collisions.
/// The kernel's stack-trace map keys a stack by its hash's bucket and refuses one whose bucket
/// holds another (-EEXIST, counted in `stack_failed`): with this many distinct stacks in this
/// many buckets, some collide. Stacks kept by a hash of their frames are lost only to a full
/// map, and each id names one stack.
#[test]
fn stacks_are_not_lost_to_hash_collisions() {
    use std::collections::HashMap;

    use tracer::{
        attach::{
            Group, Options, Session,
            detect::{Choice, Plan},
            target::Target,
        },
        symbolize::StackSource as _,
    };
    use tracer_ebpf::abi::{Event, kind};
    if !require_root() {
        return;
    }
    const ENTRIES: u32 = 512;
    let me = std::env::current_exe().unwrap();
    let mut fixture = spawn_fixture(&me, 600.0);
    let target = Target::open(fixture.pid()).unwrap();
    let options = Options {
        sample_hz: 299,
        ring_bytes: 1 << 22,
        stack_entries: ENTRIES,
        offcpu_stacks: true,
        phases: false,
        skip: vec![Group::Syscalls, Group::Sockets, Group::Sites],
        empty_programs: false,
    };
    let plan = Plan::new(Choice::Auto).unwrap();
    let mut session = Session::attach(&target, &options, &plan).expect("attaching");
    let mut ring = session.take_events().unwrap();
    let drops = session.take_drops().unwrap();
    let stacks = session.take_stacks().unwrap();

    let mut ids = Vec::new();
    let deadline = std::time::Instant::now() + Duration::from_secs(6);
    while std::time::Instant::now() < deadline {
        while let Some(item) = ring.next() {
            // SAFETY: every record in the ring is one `Event`, written by the kernel programs.
            let event: Event = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            if matches!(event.kind, kind::SWITCH_OUT | kind::SAMPLE) {
                ids.extend([event.args[0] as i64, event.args[1] as i64]);
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    session.detach();
    fixture.kill().unwrap();

    let failed: u64 = drops
        .get(&0, 0)
        .unwrap()
        .iter()
        .map(|d| d.stack_failed)
        .sum();
    let mut by_id: HashMap<i64, Vec<u64>> = HashMap::new();
    for &id in ids.iter().filter(|&&id| id >= 0) {
        let stack = stacks.stack(id).expect("every id sent resolves");
        assert!(!stack.is_empty(), "stack {id} is empty");
        by_id.insert(id, stack);
    }
    let distinct = by_id.len();
    eprintln!(
        "{} stack ids, {distinct} distinct stacks, {failed} not taken",
        ids.len()
    );
    // Enough that a bucket per hash would almost surely have collided (expected colliding
    // pairs ~ n² / (2 × buckets): 4 at 64, no collision then 1 time in 50; this fixture
    // makes ~100 on 6.18, and fills the map on the emulated 6.1).
    assert!(
        distinct >= 64,
        "only {distinct} distinct stacks: too few to test collisions"
    );
    assert!(
        distinct <= ENTRIES as usize,
        "{distinct} distinct stacks cannot fit {ENTRIES} entries"
    );
    // A full map refuses the rest (Debian 6.1 under emulation samples more distinct stacks
    // than fit); no bucket-per-hash map could have filled every entry.
    assert!(
        failed == 0 || distinct == ENTRIES as usize,
        "{failed} stacks not taken with {distinct} of {ENTRIES} entries used"
    );
    let mut unique: Vec<&Vec<u64>> = by_id.values().collect();
    unique.sort();
    unique.dedup();
    assert_eq!(unique.len(), distinct, "two ids name the same stack");
}

/// Kernel-only mode's readv/writev capture (`copy_iov`): the fixture reads 300 bytes with
/// readv into 3-byte buffers and writes three writevs of many small iovecs (issue 31: Apache
/// writes an iovec per header line). Each DATA record holds exactly the first
/// `min(ret, DATA_BYTES)` bytes moved, in order: empty iovecs skipped, a walk past DATA_BYTES
/// cut there, and one of 1024 iovecs (Linux's most) walked to its last.
#[test]
fn kernel_only_readv_writev_gather_every_iovec() {
    if !require_root() {
        return;
    }
    let me = std::env::current_exe().unwrap();
    let (fixture, addr) = spawn_iov_fixture(&me);
    let dir = tempfile::tempdir().unwrap();
    let raw = dir.path().join("raw.data");
    let raw_arg = raw.to_string_lossy().into_owned();
    let extra = [
        "--kernel-only",
        "--sample-hz",
        "0",
        "--no-calibrate",
        "--raw-data",
        &raw_arg,
    ];
    let mut tracer =
        Background::spawn(&record_args(fixture.pid(), &dir.path().join("out"), &extra));
    tracer.wait_ready(Duration::from_secs(120));

    let mut client = std::net::TcpStream::connect(addr).unwrap();
    client.write_all(&iov_pattern(0, IOV_FIXTURE_IN)).unwrap();
    let writes = iov_fixture_writes();
    let sent: Vec<Vec<u8>> = writes
        .iter()
        .enumerate()
        .map(|(k, lens)| iov_pattern(k + 1, lens.iter().sum()))
        .collect();
    let mut received = vec![0; sent.iter().map(Vec::len).sum()];
    client.read_exact(&mut received).unwrap();
    assert_eq!(received, sent.concat());
    // Past the reorder window, so the last records are in before the stop.
    std::thread::sleep(Duration::from_millis(200));
    let stderr = tracer.stop(Duration::from_secs(120));
    drop(fixture);

    let data = read_dump(&std::fs::read(&raw).unwrap()).unwrap();
    let (reads, written): (Vec<_>, Vec<_>) = data
        .iter()
        .partition(|d| d.direction() == Direction::Receive);
    let input = iov_pattern(0, IOV_FIXTURE_IN);
    let mut at = 0;
    for read in &reads {
        assert_eq!(read.syscall, syscall::READV, "{read:#?}");
        assert!(read.whole(), "{read:#?}");
        assert_eq!(read.bytes, input[at..at + read.bytes.len()], "{read:#?}");
        at += read.bytes.len();
    }
    assert_eq!(at, IOV_FIXTURE_IN, "{reads:#?}\n{stderr}");
    assert_eq!(written.len(), sent.len(), "{written:#?}\n{stderr}");
    for (write, sent) in written.iter().zip(&sent) {
        assert_eq!(write.syscall, syscall::WRITEV, "{write:#?}");
        assert_eq!(write.len, sent.len() as u64, "{write:#?}");
        assert_eq!(
            write.bytes,
            sent[..sent.len().min(DATA_BYTES)],
            "{write:#?}"
        );
    }
}
