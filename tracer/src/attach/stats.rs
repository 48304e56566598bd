//! Counters the kernel keeps about our programs and links that aya's `ProgramInfo` and
//! `LinkInfo` do not expose,
//! read with BPF_OBJ_GET_INFO_BY_FD, so that what the kernel skipped is reported rather than
//! lost silently.

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use anyhow::Context as _;
use aya::{
    Ebpf,
    programs::{KProbe, links::FdLink},
    util::KernelVersion,
};
use aya_obj::generated::{
    bpf_attr, bpf_cmd, bpf_link_info, bpf_link_type, bpf_perf_event_type, bpf_prog_info,
};

use super::hooks::{Link, typed};

/// bpf(2) with `cmd` and `attr`: the non-negative result, or errno. Through libc: rustix has
/// no bpf(2).
///
/// # Safety
/// `attr` must be valid for `cmd`, and any pointer in it must point to memory that is valid
/// for what the kernel writes there.
unsafe fn sys_bpf(cmd: bpf_cmd, attr: &mut bpf_attr) -> std::io::Result<i64> {
    // SAFETY: the caller's promise.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            cmd as libc::c_long,
            std::ptr::from_mut(attr),
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(ret)
}

/// BPF_OBJ_GET_INFO_BY_FD into a zeroed `T` (the kernel fills the fields it knows).
fn info_by_fd<T>(fd: BorrowedFd<'_>) -> std::io::Result<T> {
    // SAFETY: both are plain C structs of integers, for which all zeroes is a valid value.
    let mut info: T = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<T>() as u32;
    attr.info.info = (&raw mut info) as u64;
    // SAFETY: `info` points to `size_of::<T>()` writable bytes.
    unsafe { sys_bpf(bpf_cmd::BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    Ok(info)
}

/// How many times the kernel skipped the program because another BPF program was running on
/// that CPU (`bpf_prog_info.recursion_misses`, Linux 5.12+; 0 where the kernel has none).
pub fn recursion_misses(program_fd: BorrowedFd<'_>) -> anyhow::Result<u64> {
    let info: bpf_prog_info =
        info_by_fd(program_fd).context("BPF_OBJ_GET_INFO_BY_FD on a program")?;
    Ok(info.recursion_misses)
}

/// A new fd for the link with kernel id `id` (BPF_LINK_GET_FD_BY_ID).
fn link_fd_by_id(id: u32) -> std::io::Result<OwnedFd> {
    // SAFETY: all zeroes is a valid bpf_attr.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.__bindgen_anon_6.__bindgen_anon_1.link_id = id;
    // SAFETY: a valid bpf_attr for this command, with no pointers.
    let fd = unsafe { sys_bpf(bpf_cmd::BPF_LINK_GET_FD_BY_ID, &mut attr) }?;
    // SAFETY: the kernel returned a new fd that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// The first kernel whose kprobe perf links report `missed`; older ones leave the field 0,
/// which would read as "none missed".
const KPROBE_MISSED_SINCE: KernelVersion = KernelVersion::new(6, 7, 0);

/// Why a kprobe link's missed count means nothing on `kernel` (None: it is reported).
pub fn kprobe_missed_unreported(kernel: Option<KernelVersion>) -> Option<String> {
    match kernel {
        Some(version) if version >= KPROBE_MISSED_SINCE => None,
        Some(version) => Some(format!(
            "Linux {version} does not report a kprobe link's missed count ({KPROBE_MISSED_SINCE}+)"
        )),
        None => Some(format!(
            "the kernel's version is unknown, and kprobe links report missed counts only from \
             {KPROBE_MISSED_SINCE}"
        )),
    }
}

/// Missed hits of a kprobe or kretprobe perf link (for a kretprobe: calls entered with no free
/// instance, whose exit never ran the program). None where the link is not a kprobe perf
/// link. Before 6.7 it is 0 whatever was missed: see [`kprobe_missed_unreported`].
pub fn kprobe_missed(link_fd: BorrowedFd<'_>) -> Option<u64> {
    let info: bpf_link_info = info_by_fd(link_fd).ok()?;
    if info.type_ != bpf_link_type::BPF_LINK_TYPE_PERF_EVENT as u32 {
        return None;
    }
    // SAFETY: the kernel filled the perf_event member, as the link type says.
    let event = unsafe { info.__bindgen_anon_1.perf_event };
    let kprobe = [
        bpf_perf_event_type::BPF_PERF_EVENT_KPROBE as u32,
        bpf_perf_event_type::BPF_PERF_EVENT_KRETPROBE as u32,
    ];
    if !kprobe.contains(&event.type_) {
        return None;
    }
    // SAFETY: the kernel filled the kprobe member, as the event type says.
    Some(unsafe { event.__bindgen_anon_1.kprobe.missed })
}

/// The session's kprobe and kretprobe links, taken out of their programs (dropping them
/// detaches) so that their missed counts can be read at the end.
#[derive(Default)]
pub struct KprobeLinks {
    links: Vec<(String, FdLink)>,
    /// Kprobes attached as perf events without a BPF link (before 5.15): no count to read.
    unavailable: bool,
}

impl KprobeLinks {
    /// Takes the kprobe links out of `links`; the others stay with their programs.
    pub fn take(ebpf: &mut Ebpf, links: Vec<Link>) -> anyhow::Result<Self> {
        let mut out = KprobeLinks::default();
        for link in links {
            let Link::Kprobe(name, id) = link else {
                continue;
            };
            // Without BPF perf links aya attaches by ioctl, and converting would detach it.
            if !aya::features().bpf_perf_link() {
                out.unavailable = true;
                continue;
            }
            let program: &mut KProbe = typed(ebpf, &name)?;
            let fd_link = FdLink::try_from(program.take_link(id)?)
                .with_context(|| format!("{name}: not a BPF link"))?;
            out.links.push((name, fd_link));
        }
        Ok(out)
    }

    /// Per kretprobe program, the calls whose exit it missed, or why that is unknown (the
    /// kernel does not report it, or a link's count cannot be read). Empty when no kretprobe
    /// was attached: none can have missed.
    pub fn kretprobe_missed(&self) -> Result<Vec<(String, u64)>, String> {
        if self.unavailable {
            return Err(
                "kprobes are attached without BPF links on this kernel (before 5.15): no missed \
                 count to read"
                    .to_owned(),
            );
        }
        let mut kretprobes = self
            .links
            .iter()
            .filter(|(n, _)| n.starts_with("kretprobe_"))
            .peekable();
        if kretprobes.peek().is_none() {
            return Ok(Vec::new());
        }
        if let Some(reason) = kprobe_missed_unreported(KernelVersion::current().ok()) {
            return Err(reason);
        }
        let mut missed = Vec::new();
        for (name, link) in kretprobes {
            let count = link
                .info()
                .map_err(|e| e.to_string())
                .and_then(|info| link_fd_by_id(info.id()).map_err(|e| e.to_string()))
                .and_then(|fd| {
                    kprobe_missed(fd.as_fd()).ok_or_else(|| "not a kprobe perf link".to_owned())
                })
                .map_err(|e| format!("reading the missed count of {name}'s link: {e}"))?;
            missed.push((name.clone(), count));
        }
        Ok(missed)
    }
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use super::*;

    #[test]
    fn a_file_is_no_program() {
        let file = tempfile::tempfile().unwrap();
        assert!(recursion_misses(file.as_fd()).is_err());
        assert_eq!(kprobe_missed(file.as_fd()), None);
        assert!(link_fd_by_id(u32::MAX).is_err());
    }

    /// Issue 21 item 9: before 6.7 a kprobe link's `missed` reads 0 whatever was missed, so
    /// the count is unknown there, not 0.
    #[test]
    fn item9_kprobe_missed_is_unknown_before_6_7() {
        for old in [KernelVersion::new(6, 1, 0), KernelVersion::new(6, 6, 63)] {
            let reason = kprobe_missed_unreported(Some(old)).expect("unknown before 6.7");
            assert!(reason.contains(&old.to_string()), "{reason}");
        }
        assert!(kprobe_missed_unreported(None).is_some());
        for new in [KernelVersion::new(6, 7, 0), KernelVersion::new(6, 18, 0)] {
            assert_eq!(kprobe_missed_unreported(Some(new)), None);
        }
    }
}
