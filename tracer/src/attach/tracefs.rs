//! tracefs: mounted or mounted by us, and the format files that the kernel programs' field
//! offsets ([`tracer_ebpf::tracepoints`]) are checked against.

use std::{
    fs,
    path::Path,
    sync::atomic::{AtomicBool, Ordering},
};

use anyhow::{Context as _, bail};
use rustix::mount::{MountFlags, UnmountFlags, mount, unmount};
use tracer_ebpf::tracepoints::{EXIT_DEAD, EXIT_ZOMBIE, Field, Layout, TASK_REPORT_MAX};

pub const TRACEFS: &str = "/sys/kernel/tracing";
/// [`TRACEFS`] for a signal handler, which must not allocate a C string.
const TRACEFS_C: &std::ffi::CStr = c"/sys/kernel/tracing";

/// Set once this process mounted tracefs, so that it leaves the machine as it found it.
static MOUNTED_BY_US: AtomicBool = AtomicBool::new(false);

/// aya finds tracepoint ids through tracefs; mount it when the machine has not.
pub fn ensure_mounted() -> anyhow::Result<()> {
    if Path::new(TRACEFS).join("events").is_dir() {
        return Ok(());
    }
    mount(
        "nodev",
        TRACEFS,
        "tracefs",
        MountFlags::empty(),
        None::<&std::ffi::CStr>,
    )
    .map_err(std::io::Error::from)
    .with_context(|| format!("tracefs is not mounted at {TRACEFS} and mounting it failed"))?;
    MOUNTED_BY_US.store(true, Ordering::SeqCst);
    if !Path::new(TRACEFS).join("events").is_dir() {
        bail!("mounted tracefs at {TRACEFS} but it has no events/ directory");
    }
    say!("tracer: mounted tracefs at {TRACEFS}");
    Ok(())
}

/// Unmounts tracefs on drop if [`ensure_mounted`] mounted it. Hold it for the whole session
/// and drop it after detaching.
#[derive(Debug)]
pub struct UnmountOnDrop;

impl Drop for UnmountOnDrop {
    fn drop(&mut self) {
        if !MOUNTED_BY_US.swap(false, Ordering::SeqCst) {
            return;
        }
        // Lazy: another process may still have a file open in it; it goes when that closes.
        match unmount(TRACEFS, UnmountFlags::DETACH) {
            Ok(()) => say!("tracer: unmounted tracefs from {TRACEFS}"),
            Err(e) => say!("tracer: WARNING could not unmount tracefs from {TRACEFS}: {e}"),
        }
    }
}

/// [`UnmountOnDrop`] for a signal handler about to `_exit` (a second Ctrl-C), where no drop
/// runs: async-signal-safe (an atomic swap and one syscall; no allocation, no message).
pub fn unmount_from_signal_handler() {
    if MOUNTED_BY_US.swap(false, Ordering::SeqCst) {
        let _ = unmount(TRACEFS_C, UnmountFlags::DETACH);
    }
}

/// One `field:` line of a format file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FormatField {
    pub name: String,
    pub offset: usize,
    pub size: usize,
}

#[derive(Clone, Debug, Default)]
pub struct Format {
    pub fields: Vec<FormatField>,
    pub print_fmt: String,
}

pub fn read_format(category: &str, name: &str) -> anyhow::Result<Format> {
    let path = format!("{TRACEFS}/events/{category}/{name}/format");
    let text = fs::read_to_string(&path)
        .with_context(|| format!("reading {path}: tracepoint {category}:{name} missing?"))?;
    parse_format(&text).with_context(|| format!("parsing {path}"))
}

pub fn parse_format(text: &str) -> anyhow::Result<Format> {
    let mut format = Format::default();
    for line in text.lines().map(str::trim) {
        if let Some(fmt) = line.strip_prefix("print fmt:") {
            format.print_fmt = fmt.trim().to_owned();
            continue;
        }
        let Some(rest) = line.strip_prefix("field:") else {
            continue;
        };
        let mut parts = rest.split(';').map(str::trim);
        let decl = parts.next().unwrap_or_default();
        let name = decl.split_whitespace().last().unwrap_or_default();
        let name = name.split('[').next().unwrap_or_default().to_owned();
        let mut number = |key: &str| -> anyhow::Result<usize> {
            let item = parts.next().unwrap_or_default();
            let value = item
                .strip_prefix(key)
                .with_context(|| format!("expected `{key}` in `{line}`"))?;
            Ok(value.parse()?)
        };
        let offset = number("offset:")?;
        let size = number("size:")?;
        format.fields.push(FormatField { name, offset, size });
    }
    Ok(format)
}

/// Fails, naming the field, if a tracepoint's layout is not what the kernel programs read.
pub fn check_layout(layout: &Layout) -> anyhow::Result<Format> {
    check(layout.category, layout.name, layout.fields)
}

/// [`check_layout`] of a tracepoint named at run time.
pub fn check(category: &str, name: &str, fields: &[Field]) -> anyhow::Result<Format> {
    let format = read_format(category, name)?;
    check_fields(&format, category, name, fields)?;
    Ok(format)
}

pub fn check_fields(
    format: &Format,
    category: &str,
    name: &str,
    fields: &[Field],
) -> anyhow::Result<()> {
    for want in fields {
        match format.fields.iter().find(|f| f.name == want.name) {
            Some(f) if f.offset == want.offset && f.size == want.size => {}
            Some(f) => bail!(
                "{category}:{name} field `{}` is at offset {} size {} on this kernel, but the \
                 kernel programs read offset {} size {}; rebuild tracer-ebpf for this layout",
                want.name,
                f.offset,
                f.size,
                want.offset,
                want.size
            ),
            None => bail!(
                "{category}:{name} has no field `{}` on this kernel",
                want.name
            ),
        }
    }
    Ok(())
}

/// TASK_REPORT_MAX as the kernel encodes it in sched_switch's print fmt:
/// `REC->prev_state & (((0x0 | 0x1 | ... | 0x40) + 1) << 1) ? "+" : ""`.
pub fn task_report_max(print_fmt: &str) -> anyhow::Result<i64> {
    let tail = print_fmt
        .find(r#") ? "+" : """#)
        .map(|end| &print_fmt[..end])
        .context("sched_switch print fmt has no preempted (\"+\") marker")?;
    let start = tail
        .rfind("REC->prev_state & (")
        .context("sched_switch print fmt does not mask prev_state for the preempted marker")?;
    let expr = &tail[start..];
    if !expr.contains("+ 1) << 1") {
        bail!("unexpected TASK_REPORT_MAX expression in sched_switch print fmt: {expr}");
    }
    let mut states = 0i64;
    for token in expr.split(|c: char| !c.is_ascii_alphanumeric()) {
        if let Some(hex) = token.strip_prefix("0x") {
            states |= i64::from_str_radix(hex, 16)?;
        }
    }
    Ok((states + 1) << 1)
}

/// The `prev_state` flag sched_switch's print fmt names `letter` (`{ 0x00000010, "X" }`).
fn state_flag(print_fmt: &str, letter: char) -> Option<i64> {
    let quoted = format!("\"{letter}\" }}");
    let end = print_fmt.find(&quoted)?;
    let start = print_fmt[..end].rfind("{ 0x")? + "{ 0x".len();
    let hex = print_fmt[start..end].trim().trim_end_matches(',').trim();
    i64::from_str_radix(hex, 16).ok()
}

/// The kernel programs tell a dying thread's last switch-out by the exit states' bits.
pub fn check_exit_states(print_fmt: &str) -> anyhow::Result<()> {
    for (letter, want) in [('X', EXIT_DEAD), ('Z', EXIT_ZOMBIE)] {
        match state_flag(print_fmt, letter) {
            Some(found) if found == want => {}
            found => bail!(
                "sched_switch reports exit state {letter:?} as prev_state {found:#x?} on this \
                 kernel, the kernel programs expect {want:#x}"
            ),
        }
    }
    Ok(())
}

pub fn check_task_report_max(print_fmt: &str) -> anyhow::Result<()> {
    let found = task_report_max(print_fmt)?;
    if found != TASK_REPORT_MAX {
        bail!(
            "sched_switch reports preempted tasks as prev_state {found:#x} on this kernel, \
             the kernel programs expect {TASK_REPORT_MAX:#x}"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    const SWITCH: &str = r#"name: sched_switch
ID: 316
format:
	field:unsigned short common_type;	offset:0;	size:2;	signed:0;
	field:char prev_comm[16];	offset:8;	size:16;	signed:0;
	field:pid_t prev_pid;	offset:24;	size:4;	signed:1;
	field:long prev_state;	offset:32;	size:8;	signed:1;
	field:pid_t next_pid;	offset:56;	size:4;	signed:1;

print fmt: "prev_state=%s%s", (REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1)) ? __print_flags(REC->prev_state & ((((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) - 1), "|", { 0x00000001, "S" }) : "R", REC->prev_state & (((0x00000000 | 0x00000001 | 0x00000002 | 0x00000004 | 0x00000008 | 0x00000010 | 0x00000020 | 0x00000040) + 1) << 1) ? "+" : "", REC->next_comm"#;

    #[test]
    fn the_signal_handlers_path_is_tracefs() {
        assert_eq!(TRACEFS_C.to_str(), Ok(TRACEFS));
    }

    #[test]
    fn parses_fields_and_array_names() {
        let format = parse_format(SWITCH).unwrap();
        let comm = FormatField {
            name: "prev_comm".into(),
            offset: 8,
            size: 16,
        };
        assert_eq!(format.fields[1], comm);
        let state = FormatField {
            name: "prev_state".into(),
            offset: 32,
            size: 8,
        };
        assert_eq!(format.fields[3], state);
    }

    #[test]
    fn derives_task_report_max() {
        let format = parse_format(SWITCH).unwrap();
        assert_eq!(task_report_max(&format.print_fmt).unwrap(), 0x100);
        check_task_report_max(&format.print_fmt).unwrap();
    }

    /// Issue 21 item 7: the kernel programs skip a dying thread's last switch-out by these
    /// bits, so a kernel that reports exit states otherwise is refused.
    #[test]
    fn item7_exit_states_checked_in_print_fmt() {
        let flags = r#"__print_flags(REC->prev_state & 0xff, "|", { 0x00000001, "S" }, { 0x00000002, "D" }, { 0x00000004, "T" }, { 0x00000008, "t" }, { 0x00000010, "X" }, { 0x00000020, "Z" }, { 0x00000040, "P" }, { 0x00000080, "I" }) : "R""#;
        check_exit_states(flags).unwrap();
        let moved = flags.replace(r#"{ 0x00000020, "Z" }"#, r#"{ 0x00000040, "Z" }"#);
        let err = check_exit_states(&moved).unwrap_err().to_string();
        assert!(err.contains("'Z'") && err.contains("0x40"), "{err}");
        assert!(check_exit_states(SWITCH).is_err(), "no X or Z flag at all");
    }

    #[test]
    fn layout_mismatch_names_the_field() {
        let format = parse_format(SWITCH).unwrap();
        let moved = [Field {
            name: "next_pid",
            offset: 60,
            size: 4,
        }];
        let err = check_fields(&format, "sched", "sched_switch", &moved).unwrap_err();
        assert!(
            err.to_string().contains("`next_pid` is at offset 56"),
            "{err}"
        );
        let missing = [Field {
            name: "nope",
            offset: 0,
            size: 4,
        }];
        assert!(check_fields(&format, "sched", "sched_switch", &missing).is_err());
    }
}
