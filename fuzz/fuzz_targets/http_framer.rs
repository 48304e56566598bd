//! One direction's framer on arbitrary bytes cut into arbitrary syscalls: it never panics,
//! every step moves on (the run ends), and it never holds more than a header block's cap.
//!
//! Input: a byte `n`, then syscalls: each a length byte `l` (the syscall moved `l * 37` bytes
//! when `l & 0x80`, else `l`), then its bytes, of which the first `min(moved, 512)` are
//! captured (fewer when the input runs out).

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::requests::kernel_only::framer::{Body, Ev, Framer, MAX_HEAD};
use tracer::requests::kernel_only::wire::{Framing, Start};

const CAPTURE: usize = 512;

fuzz_target!(|data: &[u8]| {
    let mut framer = Framer::default();
    let mut rest = data;
    while let [l, tail @ ..] = rest {
        let moved = if l & 0x80 != 0 {
            u64::from(l & 0x7f) * 37
        } else {
            u64::from(*l)
        };
        let captured = (moved as usize).min(CAPTURE).min(tail.len());
        let (bytes, after) = tail.split_at(captured);
        rest = after;
        let mut pos = 0u64;
        let mut steps = 0;
        while let Some(ev) = framer.step(bytes, moved, &mut pos) {
            steps += 1;
            assert!(steps <= 2 * moved as usize + 8, "the framer does not move on");
            if let Ev::Head(head) = ev {
                let framing = match head.start {
                    Start::Request { .. } => head.body.request_framing().unwrap_or(Framing::None),
                    Start::Response { status } => head.body.response_framing(status, false, false),
                    Start::Http2 => Framing::None,
                };
                framer.body(match framing {
                    Framing::Length(n) => Body::Length(n),
                    Framing::Chunked => Body::Chunked,
                    Framing::Close => Body::Close,
                    _ => Body::None,
                });
            }
            assert!(pos <= moved);
        }
        assert!(framer.held() <= MAX_HEAD + CAPTURE);
    }
});
