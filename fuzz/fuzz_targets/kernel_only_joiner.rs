//! The kernel-only joiner on arbitrary interleavings of three processes' connections: it never
//! panics, every client request whose header block was parsed ends exactly once, no output
//! repeats a serial, and at the end nothing is held.

#![no_main]

mod common {
    pub mod stream;
}

use std::collections::HashSet;

use common::stream::{Item, items};
use libfuzzer_sys::fuzz_target;
use tracer::requests::kernel_only::joiner::{Joiner, Opened, Output};

fuzz_target!(|data: &[u8]| {
    let mut joiner = Joiner::new();
    let mut out: Vec<Output> = Vec::new();
    for item in items(data) {
        match item {
            Item::Data(d) => {
                joiner.push(&d, None);
            }
            Item::Opened { tgid, fd, accept, at } => {
                let how = if accept { Opened::Accepted } else { Opened::Connected };
                joiner.opened(tgid, fd, how, at);
            }
            Item::Event(_) | Item::Lost(..) => {}
        }
        out.extend(joiner.take());
    }
    out.extend(joiner.finish());
    let counts = joiner.counts();
    let mut serials = HashSet::new();
    for o in &out {
        assert!(serials.insert(o.serial()), "serial {} out twice", o.serial());
    }
    let client_side = out
        .iter()
        .filter(|o| !matches!(o, Output::Incomplete(i) if i.client_fd.is_none()))
        .count() as u64;
    assert_eq!(client_side, counts.client_requests, "{counts:?}");
    assert_eq!(counts.exchanges + counts.incompletes, out.len() as u64);
    assert_eq!((joiner.open(), joiner.held_calls()), (0, 0));
});
