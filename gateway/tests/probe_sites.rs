//! Every probe site in the built gateway binary starts with the 5-byte NOP the tracer expects,
//! and is a USDT probe that other tools see: `readelf -n` and `bpftrace -l` list its note,
//! read independently of the tracer's own parser.

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{GATEWAY, symbol};
use object::{Object, ObjectSection, ObjectSymbol};
use testproc::stdout_of;
use tracer_ebpf::sites::{NOP5, Site, USDT_ARGS, USDT_PROVIDER};

#[test]
fn probe_sites_start_with_nop5() {
    let data = std::fs::read(GATEWAY).expect("read the gateway binary");
    let file = object::File::parse(&*data).expect("parse ELF");
    let notes = readelf_notes();
    for site in Site::ALL {
        let name = site.symbol();
        let symbol = symbol(&file, name);
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .unwrap_or_else(|| panic!("{name} has no section"));
        let bytes = section
            .data_range(symbol.address(), 5)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{name}: cannot read its first bytes"));
        assert_eq!(bytes, NOP5, "{name} does not start with the NOP5");

        let note = notes
            .iter()
            .find(|note| note.name == site.probe_name())
            .unwrap_or_else(|| panic!("readelf -n lists no note for {name}: {notes:?}"));
        assert_eq!(
            note.pc,
            symbol.address(),
            "{name}'s note is not at its NOP5"
        );
    }
}

#[test]
fn readelf_lists_the_nine_sites_as_stapsdt_notes() {
    let notes = readelf_notes();
    let mut names: Vec<&str> = notes.iter().map(|note| note.name.as_str()).collect();
    names.sort_unstable();
    let mut expected: Vec<&str> = Site::ALL.iter().map(|site| site.probe_name()).collect();
    expected.sort_unstable();
    assert_eq!(names, expected, "{notes:?}");
    for note in &notes {
        assert_eq!(note.args, USDT_ARGS, "{note:?}");
    }
}

#[test]
fn bpftrace_lists_the_sites() {
    // bpftrace refuses to start, even to list, unless it runs as root.
    if !is_root() {
        eprintln!("SKIPPED bpftrace_lists_the_sites: bpftrace runs only as root");
        return;
    }
    let listed = stdout_of(
        Command::new(tool("bpftrace", "bpftrace")).args(["-l", &format!("usdt:{GATEWAY}:*")]),
    );
    let mut probes: Vec<&str> = listed.lines().collect();
    probes.sort_unstable();
    let mut expected: Vec<String> = Site::ALL
        .iter()
        .map(|site| format!("usdt:{GATEWAY}:{USDT_PROVIDER}:{}", site.probe_name()))
        .collect();
    expected.sort_unstable();
    assert_eq!(probes, expected);
}

/// One stapsdt note as `readelf -n` prints it.
#[derive(Debug, Default)]
struct Note {
    provider: String,
    name: String,
    pc: u64,
    args: String,
}

/// The gateway's stapsdt notes of provider `gateway`, as `readelf -n` reads them. readelf is
/// binutils', there wherever the gateway links.
fn readelf_notes() -> Vec<Note> {
    let mut notes: Vec<Note> = Vec::new();
    for line in stdout_of(Command::new("readelf").args(["-n", GATEWAY])).lines() {
        if let Some((_, provider)) = line.split_once("Provider: ") {
            notes.push(Note {
                provider: provider.trim().to_owned(),
                ..Note::default()
            });
            continue;
        }
        let Some(note) = notes.last_mut() else {
            continue;
        };
        let line = line.trim();
        if let Some(name) = line.strip_prefix("Name: ") {
            note.name = name.to_owned();
        } else if let Some(location) = line.strip_prefix("Location: ") {
            let pc = location.split(',').next().unwrap_or_default();
            note.pc = u64::from_str_radix(pc.trim_start_matches("0x"), 16)
                .unwrap_or_else(|_| panic!("readelf printed a bad location: {line}"));
        } else if let Some(args) = line.strip_prefix("Arguments: ") {
            note.args = args.to_owned();
        }
    }
    notes.retain(|note| note.provider == USDT_PROVIDER);
    notes
}

fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}

/// `program` from PATH, installed from Debian's `package` when missing, as on a new machine.
/// Needs root, as apt-get does.
fn tool(program: &str, package: &str) -> PathBuf {
    use harness::install::{apt_install, find_in_path};
    if let Some(path) = find_in_path(program) {
        return path;
    }
    apt_install(&[package], false).unwrap_or_else(|e| panic!("{e:#}"));
    find_in_path(program).unwrap_or_else(|| panic!("{package} installed no {program}"))
}
