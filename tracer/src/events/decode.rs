//! Ring-buffer records → [`Event`], and kernel-only mode's DATA records → [`Record::Data`].

use tracer_ebpf::abi::{Event, kind};

use super::{
    Record,
    data::{Data, data_event},
};

/// A record of either size the kernel writes: an [`Event`], or a
/// [`tracer_ebpf::abi::DataEvent`] (kind DATA) turned into [`Data`]. `None`: malformed
/// (another size, a DATA-sized record of another kind, or a DATA record that moved nothing,
/// which the programs never write).
pub fn decode_record(bytes: &[u8]) -> Option<Record> {
    if let Some(record) = data_event(bytes) {
        if record.event.kind != kind::DATA {
            return None;
        }
        return Data::from_event(&record).map(|data| Record::Data(Box::new(data)));
    }
    decode(bytes).map(Record::Event)
}

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
    use tracer_ebpf::abi::DataEvent;

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
        assert_eq!(decode_record(bytes), Some(Record::Event(event)));
    }

    #[test]
    fn decodes_a_data_record() {
        let mut record = DataEvent {
            event: Event {
                ts_ns: 9,
                tid: 4,
                kind: kind::DATA,
                sub: tracer_ebpf::abi::syscall::RECVFROM,
                args: [5, 3, 6],
            },
            tgid: 2,
            captured: 6,
            bytes: [0; tracer_ebpf::abi::DATA_BYTES],
        };
        record.bytes[..6].copy_from_slice(b"GET / ");
        let bytes = super::super::data::encode(&record);
        let Some(Record::Data(data)) = decode_record(bytes) else {
            panic!("not decoded");
        };
        assert_eq!((data.tgid, data.fd, data.len), (2, 3, 6));
        assert_eq!(data.bytes, b"GET / ");
        assert_eq!(data.to_event(), record);
        // The wrong kind at DATA's size is malformed.
        record.event.kind = kind::SYSCALL;
        assert_eq!(decode_record(super::super::data::encode(&record)), None);
    }
}
