//! CLOCK_MONOTONIC, read directly, so every timestamp loadgen writes joins with the kernel's
//! `bpf_ktime_get_ns` and with the tracer's records.

/// Nanoseconds on CLOCK_MONOTONIC.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec and CLOCK_MONOTONIC exists on every Linux.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    debug_assert_eq!(rc, 0, "clock_gettime(CLOCK_MONOTONIC) cannot fail");
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Blocks the calling thread until CLOCK_MONOTONIC reaches `deadline_ns` (absolute, so a late
/// wake-up never shifts the schedule that follows).
pub fn sleep_until_ns(deadline_ns: u64) {
    let ts = libc::timespec {
        tv_sec: (deadline_ns / 1_000_000_000) as libc::time_t,
        tv_nsec: (deadline_ns % 1_000_000_000) as libc::c_long,
    };
    loop {
        // SAFETY: `ts` is a valid timespec; the remainder pointer may be null with TIMER_ABSTIME.
        let rc = unsafe {
            libc::clock_nanosleep(
                libc::CLOCK_MONOTONIC,
                libc::TIMER_ABSTIME,
                &ts,
                std::ptr::null_mut(),
            )
        };
        if rc != libc::EINTR {
            return;
        }
    }
}

/// The default 50 µs timer slack would delay every scheduled send by up to 50 µs; the
/// dispatcher thread asks for 1 µs instead. Failure only costs precision, so it is ignored.
pub fn tighten_timer_slack() {
    // SAFETY: PR_SET_TIMERSLACK takes one integer argument and affects only this thread.
    let _ = unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 1_000 as libc::c_ulong, 0, 0, 0) };
}
