//! The tracer's user side, split by job along the data flow:
//! attach → read events → rebuild requests → aggregate → symbolize → report.

pub mod aggregate;
pub mod attach;
pub mod calibrate;
pub mod cli;
pub mod events;
pub mod flame;
pub mod out_dir;
pub mod record;
pub mod report;
pub mod requests;
pub mod symbolize;
pub mod trace_json;
pub mod validate;
