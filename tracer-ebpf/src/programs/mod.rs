//! One module per hook group; the user side's `tracer/src/attach/*.rs` mirror these names.

mod detect;
mod maps;
mod samples;
mod sched;
mod sites;
mod sockets;
mod syscalls;
