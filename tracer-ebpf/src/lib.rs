//! The contract between the gateway, the kernel programs and the tracer.
//!
//! - [`sites`]: the gateway's probe sites (symbol names, argument meanings, phase ids).
//! - [`abi`]: the one `#[repr(C)]` event record that every kernel program writes to the
//!   ring buffer and the tracer reads back.
//! - [`tracepoints`]: field offsets the kernel programs read, checked by user space.
//!
//! `no_std` so the same definitions compile for `bpfel-unknown-none`; the `user` feature adds
//! aya's `Pod` so user space can read maps and ring buffers without copies of these types.
#![cfg_attr(not(test), no_std)]

pub mod abi;
pub mod sites;
pub mod tracepoints;
