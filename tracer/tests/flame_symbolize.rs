//! The symbolizer resolves real addresses: a function of this very test binary through
//! /proc/self/maps and its ELF, and a kernel function through /proc/kallsyms.

use std::collections::HashMap;
use std::fs;

use tracer::symbolize::{
    KERNEL_MARK, OtherBuild, ProcessMaps, Symbolizer, build_id, kallsyms_readable,
};

#[inline(never)]
fn a_known_function_of_this_test(x: u64) -> u64 {
    std::hint::black_box(x).wrapping_mul(31).rotate_left(7)
}

fn own_address() -> u64 {
    let f: fn(u64) -> u64 = a_known_function_of_this_test;
    assert_eq!(f(1), 31u64.rotate_left(7));
    f as usize as u64
}

#[test]
fn a_function_of_the_test_binary_resolves_demangled_via_proc_self_maps() {
    let addr = own_address();
    let maps = ProcessMaps::read(std::process::id()).unwrap();
    let mapping = maps
        .find(addr)
        .expect("the function lies in an executable mapping");
    assert_eq!(mapping.path, fs::read_link("/proc/self/exe").unwrap());

    let mut symbolizer = Symbolizer::new(maps);
    // A few bytes into the function, as a sampled instruction pointer would be.
    let frames = symbolizer.user_frames(addr + 2);
    let outer = frames.first().expect("one frame at least");
    assert_eq!(
        outer, "flame_symbolize::a_known_function_of_this_test",
        "frames: {frames:?}"
    );
}

#[test]
fn a_stack_of_own_addresses_folds_root_first() {
    let leaf = own_address();
    let caller = a_stack_of_own_addresses_folds_root_first as fn() as usize as u64;
    // bpf_get_stack order: innermost first; the caller's entry is a return address + 1.
    let stacks = HashMap::from([(5i64, vec![leaf + 1, caller + 1])]);
    let mut symbolizer = Symbolizer::for_process(std::process::id()).unwrap();
    let folded = symbolizer.user_stack(&stacks, 5).unwrap();
    let frames: Vec<&str> = folded.split(';').collect();
    assert_eq!(
        frames.first(),
        Some(&"flame_symbolize::a_stack_of_own_addresses_folds_root_first")
    );
    assert_eq!(
        frames.last(),
        Some(&"flame_symbolize::a_known_function_of_this_test")
    );
}

#[test]
fn a_kernel_function_resolves_from_kallsyms_with_the_kernel_mark() {
    if !kallsyms_readable() {
        eprintln!("skipped: /proc/kallsyms shows no addresses (not root?)");
        return;
    }
    let kallsyms = fs::read_to_string("/proc/kallsyms").unwrap();
    let symbols: Vec<(u64, &str)> = kallsyms
        .lines()
        .filter_map(|line| {
            let mut fields = line.split_ascii_whitespace();
            let addr = u64::from_str_radix(fields.next()?, 16).ok()?;
            let kind = fields.next()?;
            let name = fields.next()?;
            (fields.next().is_none() && matches!(kind, "T" | "t")).then_some((addr, name))
        })
        .collect();
    let (addr, _) = *symbols
        .iter()
        .find(|(_, name)| *name == "schedule")
        .expect("schedule is in kallsyms");
    // Any alias at the same address is an equally right answer.
    let aliases: Vec<String> = symbols
        .iter()
        .filter(|(a, _)| *a == addr)
        .map(|(_, name)| format!("{name}{KERNEL_MARK}"))
        .collect();

    let mut symbolizer = Symbolizer::new(ProcessMaps::default());
    let frame = symbolizer.kernel_frame(addr + 4);
    assert!(
        aliases.iter().any(|alias| **alias == *frame),
        "{frame} not in {aliases:?}"
    );
}

/// Issue 21 item 3: the mapped file is read as the target sees it, not by the path in the
/// tracer's mount namespace. Here the snapshot names another binary at the test binary's
/// range (as a container's path names another file on the host): the frame still resolves
/// to this test's function; through another process's view the range is not this file, and
/// this test's name never comes out.
#[test]
fn item3_mapped_files_are_opened_as_the_target_sees_them() {
    let addr = own_address();
    let exe = fs::read_link("/proc/self/exe").unwrap();
    let text = fs::read_to_string("/proc/self/maps").unwrap();
    let elsewhere = text.replace(exe.to_str().unwrap(), "/bin/true");
    let mut symbolizer = Symbolizer::opened(std::process::id(), ProcessMaps::parse(&elsewhere));
    let frames = symbolizer.user_frames(addr + 2);
    assert_eq!(
        frames.first().map(String::as_str),
        Some("flame_symbolize::a_known_function_of_this_test"),
        "frames: {frames:?}"
    );
    // Pid 1 does not map this binary there: its view of the path is read instead.
    let mut foreign = Symbolizer::opened(1, ProcessMaps::parse(&elsewhere));
    let frames = foreign.user_frames(addr + 2);
    assert!(
        !frames.iter().any(|f| f.contains("a_known_function")),
        "frames: {frames:?}"
    );
}

/// Kills and reaps the child on drop, so a failed assertion leaves nothing running.
struct Reaped(std::process::Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Issue 21 item 3, build-ids: the target runs a binary at a path where, in its own mount
/// namespace only, another file is bind-mounted. The symbolizer reads the target's file and
/// names the difference: both build-ids, the target's first.
#[test]
fn item3_a_path_that_is_another_build_for_the_target_is_named() {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        eprintln!("skipped: needs root (unshare --mount, mount --bind)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("prog");
    let theirs = dir.path().join("theirs");
    fs::copy("/usr/bin/true", &path).unwrap();
    fs::copy("/usr/bin/sleep", &theirs).unwrap();
    let id = |p: &std::path::Path| build_id(&fs::File::open(p).unwrap()).expect("a build-id");
    let (ours_id, theirs_id) = (id(&path), id(&theirs));
    assert_ne!(ours_id, theirs_id);

    // unshare and sh exec in turn: the child's pid is the target's.
    let target = Reaped(
        std::process::Command::new("unshare")
            .args(["--mount", "--propagation", "private", "sh", "-c"])
            .arg(r#"mount --bind "$1" "$2" && exec "$2" 600"#)
            .arg("sh")
            .args([&theirs, &path])
            .spawn()
            .expect("running unshare"),
    );
    let pid = target.0.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    let maps = loop {
        let maps = ProcessMaps::read(pid).unwrap();
        if maps.mappings().iter().any(|m| m.path == path) {
            break maps;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the target never mapped {}",
            path.display()
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let symbolizer = Symbolizer::opened(pid, maps);
    assert_eq!(
        symbolizer.other_builds(),
        [OtherBuild {
            path: path.clone(),
            target: theirs_id,
            tracer: ours_id,
        }]
    );
    // The libraries are the same files for both: no other difference is named.
    let here = Symbolizer::opened(
        std::process::id(),
        ProcessMaps::read(std::process::id()).unwrap(),
    );
    assert_eq!(here.other_builds(), []);
}
