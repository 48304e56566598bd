//! The symbolizer resolves real addresses: a function of this very test binary through
//! /proc/self/maps and its ELF, and a kernel function through /proc/kallsyms.

use std::collections::HashMap;
use std::fs;

use tracer::symbolize::{KERNEL_MARK, ProcessMaps, Symbolizer, kallsyms_readable};

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
