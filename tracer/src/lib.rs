//! The tracer's user side, split by job along the data flow:
//! attach → read events → rebuild requests → aggregate → symbolize → report.

pub mod requests;
pub mod aggregate;
pub mod report;
pub mod attach;
pub mod cli;
pub mod events;
pub mod record;
pub mod flame;
pub mod symbolize;
pub mod timeline;
pub mod validate;
pub mod calibrate;
