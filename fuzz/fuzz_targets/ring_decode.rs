//! The ring record decoder: bytes of any length → an event, a data record, or `None`
//! (malformed, counted), never a panic. What it accepts is exactly what the layout allows,
//! read field by field here from the bytes themselves, and a data record re-encodes to one
//! that decodes the same.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::events::{Record, data, decode::decode_record};
use tracer_ebpf::abi::{DATA_BYTES, DataEvent, Event, kind, syscall};

fn u16_at(bytes: &[u8], at: usize) -> u16 {
    u16::from_ne_bytes(bytes[at..at + 2].try_into().unwrap())
}
fn u32_at(bytes: &[u8], at: usize) -> u32 {
    u32::from_ne_bytes(bytes[at..at + 4].try_into().unwrap())
}
fn u64_at(bytes: &[u8], at: usize) -> u64 {
    u64::from_ne_bytes(bytes[at..at + 8].try_into().unwrap())
}

fuzz_target!(|bytes: &[u8]| {
    let decoded = decode_record(bytes);
    let is_data_size = bytes.len() == size_of::<DataEvent>();
    match &decoded {
        None => {
            assert_ne!(
                bytes.len(),
                size_of::<Event>(),
                "every event-sized record decodes"
            );
            if is_data_size {
                let (record_kind, sub, ret) =
                    (u16_at(bytes, 12), u16_at(bytes, 14), u64_at(bytes, 32));
                let moved = ret as i64 > 0;
                let data_call = syscall::is_receive(sub) || syscall::is_send(sub);
                assert!(
                    record_kind != kind::DATA || !moved || !data_call,
                    "a well-formed DATA record was refused"
                );
            }
        }
        Some(Record::Event(event)) => {
            assert_eq!(bytes.len(), size_of::<Event>());
            let fields = (
                u64_at(bytes, 0),
                u32_at(bytes, 8),
                u16_at(bytes, 12),
                u16_at(bytes, 14),
            );
            assert_eq!((event.ts_ns, event.tid, event.kind, event.sub), fields);
            let args = [u64_at(bytes, 16), u64_at(bytes, 24), u64_at(bytes, 32)];
            assert_eq!(event.args, args);
        }
        Some(Record::Data(d)) => {
            assert!(is_data_size);
            assert_eq!(u16_at(bytes, 12), kind::DATA);
            assert_eq!(
                (d.exit_ns, d.tid, d.syscall),
                (u64_at(bytes, 0), u32_at(bytes, 8), u16_at(bytes, 14))
            );
            assert_eq!((d.enter_ns, d.len), (u64_at(bytes, 16), u64_at(bytes, 32)));
            assert_eq!(
                (d.fd, d.tgid),
                (u64_at(bytes, 24) as u32, u32_at(bytes, 40))
            );
            assert!(d.len as i64 > 0, "a record that moved nothing is not data");
            // What it says it captured, but never more than the syscall moved or it holds.
            let captured = u64::from(u32_at(bytes, 44));
            let kept = captured.min(DATA_BYTES as u64).min(d.len);
            assert_eq!(d.bytes.len() as u64, kept);
            assert_eq!(d.bytes, bytes[48..48 + d.bytes.len()]);
            let again = decode_record(data::encode(&d.to_event()));
            assert_eq!(again.as_ref(), decoded.as_ref(), "re-encoded differently");
        }
    }
});
