//! Kernel-only sessions: a proxy without probe sites (nginx, haproxy, caddy, Apache) traced
//! from kernel events alone (`docs/model.md`, "Kernel-only mode").
//!
//! The bytes flow down the modules: [`wire`] reads a header block (`httparse`), [`framer`]
//! finds message boundaries in one direction of one connection, [`joiner`] turns a process's
//! connections into client and upstream requests and asks [`matcher`] which client request
//! each upstream request was sent for; [`rebuild`] adds the kernel's times and thread states,
//! and [`parts`] splits each exchange.

mod assignment;
pub mod framer;
pub mod joiner;
pub mod matcher;
pub(crate) mod parts;
mod rebuild;
pub mod wire;

pub use rebuild::{ANONYMOUS, KernelOnlyRebuilder, Stats};
