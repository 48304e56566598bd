//! The kernel-only rebuild on arbitrary interleaved events and data records (three processes,
//! sockets, scheduler events, accepts and connects, losses, time jumps): it never panics or
//! stalls, gives one outcome per request the joiner ended, every complete request's parts sum
//! to its total, and no two complete requests share a key.

#![no_main]

mod common {
    pub mod stream;
}

use std::collections::HashSet;

use common::stream::{Item, items};
use libfuzzer_sys::fuzz_target;
use tracer::requests::{KernelOnlyRebuilder, Outcome};

fuzz_target!(|data: &[u8]| {
    let mut rebuild = KernelOnlyRebuilder::new();
    let mut out: Vec<Outcome> = Vec::new();
    for item in items(data) {
        match item {
            Item::Data(d) => rebuild.data(&d),
            Item::Event(e) => rebuild.push(&e),
            Item::Lost(from, to) => rebuild.lost(from, to),
            // The rebuild learns of new connections from SYSCALL events.
            Item::Opened { .. } => {}
        }
        out.extend(rebuild.drain());
    }
    out.extend(rebuild.finish(u64::MAX / 4));
    let counts = rebuild.counts();
    assert_eq!(out.len() as u64, counts.exchanges + counts.incompletes);
    let mut keys = HashSet::new();
    for o in &out {
        if let Outcome::Complete(r) = o {
            assert_eq!(r.parts.iter().sum::<u64>(), r.total_ns(), "{r:?}");
            assert!(keys.insert(r.req_id), "key {} on two complete requests", r.req_id);
        }
    }
});
