//! The tracer's user side, split by job along the data flow:
//! attach → read events → rebuild requests → aggregate → symbolize → report.

/// `eprintln!` that never panics: a closed or hung-up stderr (an ssh drop, a pipe whose reader
/// left) must not end a session before it has written its files.
#[macro_export]
macro_rules! say {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr(), $($arg)*);
    }};
}

pub mod aggregate;
pub mod attach;
pub mod audit;
pub mod calibrate;
pub mod cli;
pub mod events;
pub mod flame;
pub mod out_dir;
pub mod record;
pub mod report;
pub mod requests;
pub mod symbolize;
