//! Ring-buffer records → [`Event`].

use tracer_ebpf::abi::Event;

/// The record as the kernel wrote it, or `None` for a record of the wrong size (which would
/// mean the object and the tracer disagree on the ABI).
pub fn decode(bytes: &[u8]) -> Option<Event> {
    if bytes.len() != size_of::<Event>() {
        return None;
    }
    // SAFETY: the length matches and Event is plain integers (any bit pattern is valid);
    // ring records are 8-byte aligned, but read_unaligned does not rely on it.
    Some(unsafe { bytes.as_ptr().cast::<Event>().read_unaligned() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_rejects_wrong_sizes() {
        let event = Event {
            ts_ns: 7,
            tid: 3,
            kind: 2,
            sub: 5,
            args: [1, 2, u64::MAX],
        };
        // SAFETY: viewing a repr(C) struct without padding as bytes.
        let bytes = unsafe {
            core::slice::from_raw_parts((&raw const event).cast::<u8>(), size_of::<Event>())
        };
        assert_eq!(decode(bytes), Some(event));
        assert_eq!(decode(&bytes[..39]), None);
    }
}
