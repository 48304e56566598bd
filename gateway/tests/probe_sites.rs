//! Every probe site in the built gateway binary starts with the 5-byte NOP the tracer expects.

use object::{Object, ObjectSection, ObjectSymbol};
use tracer_ebpf::sites::{NOP5, Site};

#[test]
fn probe_sites_start_with_nop5() {
    let path = env!("CARGO_BIN_EXE_gateway");
    let data = std::fs::read(path).expect("read the gateway binary");
    let file = object::File::parse(&*data).expect("parse ELF");
    for site in Site::ALL {
        let name = site.symbol();
        let symbol = file
            .symbols()
            .find(|s| s.name() == Ok(name))
            .unwrap_or_else(|| panic!("{name} is not in {path}'s symbol table"));
        let section = symbol
            .section_index()
            .and_then(|i| file.section_by_index(i).ok())
            .unwrap_or_else(|| panic!("{name} has no section"));
        let bytes = section
            .data_range(symbol.address(), 5)
            .ok()
            .flatten()
            .unwrap_or_else(|| panic!("{name}: cannot read its first bytes"));
        assert_eq!(bytes, NOP5, "{name} does not start with the NOP5");
    }
}
