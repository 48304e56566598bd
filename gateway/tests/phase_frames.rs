//! The phase frames the sampled per-phase split looks for are in the built gateway, one
//! function each: a frame the linker folded into another would give two phases one name.

mod common;

use std::collections::HashMap;

use common::{GATEWAY, symbol};
use object::ObjectSymbol as _;
use tracer_ebpf::sites::Phase;

#[test]
fn every_phase_has_its_own_frame_function() {
    let data = std::fs::read(GATEWAY).expect("read the gateway binary");
    let file = object::File::parse(&*data).expect("parse ELF");
    let mut by_address: HashMap<u64, Phase> = HashMap::new();
    for phase in Phase::ALL {
        let name = phase.frame();
        let symbol = symbol(&file, name);
        assert!(symbol.size() > 0, "{name} has no code");
        assert_eq!(Phase::from_frame(name), Some(phase));
        if let Some(other) = by_address.insert(symbol.address(), phase) {
            panic!("{name} shares its address with {}", other.frame());
        }
    }
}
