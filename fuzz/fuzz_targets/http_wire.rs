//! The HTTP/1 wire layer on arbitrary bytes: classifying a connection's first bytes, a request
//! line's prefix, a header block and a chunk-size line never panic, and agree with each
//! other: a chunk classified as starting with a complete request line has one.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::requests::kernel_only::wire::{self, Class, Line, Start};

fuzz_target!(|data: &[u8]| {
    let class = wire::classify(data);
    let line = wire::request_line(data);
    if class == Class::Request {
        assert_eq!(line, Line::Complete);
    }
    let _ = wire::start_prefix_ok(data);
    if let Ok(head) = wire::parse_head(data) {
        if let Start::Request { method, target } = &head.start {
            assert!(!method.is_empty() && !target.is_empty());
            let _ = head.body.request_framing();
        }
        if let Start::Response { status } = head.start {
            let _ = head.body.response_framing(status, false, false);
        }
        if let Some(Ok(id)) = &head.request_id {
            assert!(!id.is_empty() && id.len() <= wire::MAX_ID);
            assert!(id.bytes().all(|b| b.is_ascii_graphic()));
        }
    }
    if let Some(size) = wire::chunk_size(data) {
        assert!(size < 1 << 60);
    }
});
