//! A do-nothing fentry program: user space tries to load and attach it to learn whether this
//! kernel allows fentry at all (`tracer/src/attach/detect.rs`). It never emits anything.

use aya_ebpf::{macros::fentry, programs::FEntryContext};

#[fentry(function = "do_nanosleep")]
pub fn detect_fentry(_ctx: FEntryContext) -> u32 {
    0
}
