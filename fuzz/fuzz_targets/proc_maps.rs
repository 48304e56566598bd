//! `/proc/PID/maps` parsing: any text → the executable mappings it names (malformed lines
//! skipped), never a panic. Every mapping has a path, `start <= end`, and the list is sorted;
//! `find` only ever returns a mapping that holds the address, and finds one wherever the
//! mappings do not overlap.

#![no_main]

use libfuzzer_sys::fuzz_target;
use tracer::symbolize::ProcessMaps;

fuzz_target!(|bytes: &[u8]| {
    let Ok(text) = std::str::from_utf8(bytes) else {
        return;
    };
    let maps = ProcessMaps::parse(text);
    let mappings = maps.mappings();
    assert!(mappings.len() <= text.lines().count());
    for m in mappings {
        assert!(m.start <= m.end, "{m:?}");
        assert!(!m.path.as_os_str().is_empty(), "{m:?}");
    }
    assert!(mappings.is_sorted_by_key(|m| m.start));
    let disjoint = mappings.windows(2).all(|w| w[0].end <= w[1].start);
    let probes = mappings.iter().flat_map(|m| {
        [
            m.start,
            m.end,
            m.start.saturating_sub(1),
            m.end.saturating_sub(1),
        ]
    });
    for addr in probes {
        let holder = mappings.iter().find(|m| (m.start..m.end).contains(&addr));
        match maps.find(addr) {
            Some(found) => assert!((found.start..found.end).contains(&addr), "{addr:#x}"),
            None => assert!(!disjoint || holder.is_none(), "{addr:#x} is in {holder:?}"),
        }
    }
});
