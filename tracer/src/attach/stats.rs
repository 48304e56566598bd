//! Counters the kernel keeps about our programs that aya's `ProgramInfo` does not expose,
//! read with BPF_OBJ_GET_INFO_BY_FD, so that what the kernel skipped is reported rather than
//! lost silently.

use std::os::fd::{AsRawFd as _, BorrowedFd};

use anyhow::Context as _;
use aya_obj::generated::{bpf_attr, bpf_cmd, bpf_prog_info};

/// BPF_OBJ_GET_INFO_BY_FD into a zeroed `T` (the kernel fills the fields it knows).
fn info_by_fd<T>(fd: BorrowedFd<'_>) -> std::io::Result<T> {
    // SAFETY: both are plain C structs of integers, for which all zeroes is a valid value.
    let mut info: T = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    let mut attr: bpf_attr = unsafe { std::mem::zeroed() };
    attr.info.bpf_fd = fd.as_raw_fd() as u32;
    attr.info.info_len = size_of::<T>() as u32;
    attr.info.info = (&raw mut info) as u64;
    // SAFETY: `attr` is a valid bpf_attr whose `info` points to `size_of::<T>()` writable bytes.
    let ret = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            bpf_cmd::BPF_OBJ_GET_INFO_BY_FD as libc::c_long,
            &raw mut attr,
            size_of::<bpf_attr>(),
        )
    };
    if ret < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(info)
}

/// How many times the kernel skipped the program because another BPF program was running on
/// that CPU (`bpf_prog_info.recursion_misses`, Linux 5.12+; 0 where the kernel has none).
pub fn recursion_misses(program_fd: BorrowedFd<'_>) -> anyhow::Result<u64> {
    let info: bpf_prog_info =
        info_by_fd(program_fd).context("BPF_OBJ_GET_INFO_BY_FD on a program")?;
    Ok(info.recursion_misses)
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsFd as _;

    use super::*;

    #[test]
    fn a_file_is_no_program() {
        let file = tempfile::tempfile().unwrap();
        assert!(recursion_misses(file.as_fd()).is_err());
    }
}
