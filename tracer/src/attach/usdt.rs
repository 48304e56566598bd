//! USDT notes: the `.note.stapsdt` section of a binary (SystemTap SDT v3, as `sys/sdt.h`
//! writes it), read as libbpf reads it. aya 0.14 has no USDT support; a uprobe at the file
//! offset of a note's pc is all the tracer needs from one.

use anyhow::{Context as _, bail, ensure};
use object::{
    Endian as _, Endianness, Object as _, ObjectSection as _, elf,
    read::elf::{ElfFile64, ProgramHeader as _, SectionHeader as _},
};

const NOTE_SECTION: &str = ".note.stapsdt";
/// The section a note's `base` field points at; it moves if the binary is prelinked.
const BASE_SECTION: &str = ".stapsdt.base";
const NOTE_OWNER: &[u8] = b"stapsdt";
const NT_STAPSDT: u32 = 3;

/// One USDT probe of a binary.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SdtNote {
    pub provider: String,
    pub name: String,
    /// Address of the probed instruction, adjusted for prelink like libbpf does.
    pub pc: u64,
    /// Address of the probe's semaphore, 0 if it has none.
    pub semaphore: u64,
    /// Argument spec, such as `8@%rdi 8@%rsi`.
    pub args: String,
}

/// Every stapsdt note of `file`, in section order; empty when it has none.
pub fn notes(file: &ElfFile64<'_, Endianness>) -> anyhow::Result<Vec<SdtNote>> {
    let Some(section) = file.section_by_name(NOTE_SECTION) else {
        return Ok(Vec::new());
    };
    let endian = file.endian();
    let base = file.section_by_name(BASE_SECTION).map(|s| s.address());
    let mut iter = section
        .elf_section_header()
        .notes(endian, file.data())
        .context("reading .note.stapsdt")?
        .context(".note.stapsdt is not a note section")?;
    let mut notes = Vec::new();
    while let Some(note) = iter.next().context("reading .note.stapsdt")? {
        if note.name() != NOTE_OWNER || note.n_type(endian) != NT_STAPSDT {
            continue;
        }
        let RawNote {
            mut note,
            base: linked,
        } = parse_desc(endian, note.desc())
            .with_context(|| format!("stapsdt note {} of .note.stapsdt", notes.len()))?;
        // A prelinked binary has moved since it was linked: by how far its base section did.
        if let Some(base) = base
            && linked != 0
        {
            note.pc = note.pc.wrapping_add(base.wrapping_sub(linked));
        }
        notes.push(note);
    }
    Ok(notes)
}

/// A note as written: pc not yet adjusted, with the base it was linked against.
#[derive(Debug)]
struct RawNote {
    note: SdtNote,
    base: u64,
}

/// The descriptor: pc, base, semaphore (one address each), then provider, name and argument
/// spec, each NUL-terminated.
fn parse_desc(endian: Endianness, desc: &[u8]) -> anyhow::Result<RawNote> {
    const ADDRS: usize = 3 * size_of::<u64>();
    ensure!(
        desc.len() > ADDRS,
        "descriptor of {} bytes is too short for three addresses and strings",
        desc.len()
    );
    let (addrs, strings) = desc.split_at(ADDRS);
    let addr = |i: usize| {
        let bytes: [u8; 8] = addrs[i * 8..(i + 1) * 8].try_into().expect("8 bytes");
        endian.read_u64_bytes(bytes)
    };
    let mut fields = strings.splitn(4, |&b| b == 0);
    let mut string = |what: &str| -> anyhow::Result<String> {
        let field = fields.next().unwrap_or_default();
        String::from_utf8(field.to_vec()).with_context(|| format!("its {what} is not UTF-8"))
    };
    let (provider, name, args) = (string("provider")?, string("name")?, string("arguments")?);
    // The fourth field is what follows the spec's NUL; without it the spec ran off the end.
    if fields.next().is_none() {
        bail!("its strings are not NUL-terminated");
    }
    Ok(RawNote {
        note: SdtNote {
            provider,
            name,
            pc: addr(0),
            semaphore: addr(2),
            args,
        },
        base: addr(1),
    })
}

/// The file offset of the instruction at `address` in an executable segment of `file`:
/// uprobes attach by file offset, not by address.
pub fn file_offset(file: &ElfFile64<'_, Endianness>, address: u64) -> Option<u64> {
    let endian = file.endian();
    file.elf_program_headers()
        .iter()
        .filter(|ph| ph.p_type(endian) == elf::PT_LOAD && ph.p_flags(endian) & elf::PF_X != 0)
        .find_map(|ph| {
            let within = address.checked_sub(ph.p_vaddr(endian))?;
            if within < ph.p_filesz(endian) {
                ph.p_offset(endian).checked_add(within)
            } else {
                None
            }
        })
}

#[cfg(test)]
mod tests {
    use object::ObjectSymbol as _;
    use tracer_ebpf::sites::{NOP5, Site, USDT_ARGS, USDT_PROVIDER};

    use super::*;

    #[test]
    fn the_gateway_sites_have_a_note_each_at_their_nop5() {
        crate::attach::target::tests::link_gateway_sites();
        let data = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        let file = ElfFile64::<Endianness>::parse(&*data).unwrap();
        let ours: Vec<SdtNote> = notes(&file)
            .unwrap()
            .into_iter()
            .filter(|note| note.provider == USDT_PROVIDER)
            .collect();
        let mut names: Vec<&str> = ours.iter().map(|note| note.name.as_str()).collect();
        names.sort_unstable();
        let mut expected: Vec<&str> = Site::ALL.iter().map(|site| site.probe_name()).collect();
        expected.sort_unstable();
        assert_eq!(names, expected);
        for note in &ours {
            assert_eq!(note.args, USDT_ARGS, "{note:?}");
            assert_eq!(note.semaphore, 0, "{note:?}");
            let site = Site::ALL
                .into_iter()
                .find(|site| site.probe_name() == note.name)
                .unwrap();
            let symbol = file
                .symbols()
                .find(|symbol| symbol.name() == Ok(site.symbol()))
                .unwrap();
            assert_eq!(note.pc, symbol.address(), "{note:?}");
            let offset = file_offset(&file, note.pc).unwrap() as usize;
            assert_eq!(data[offset..offset + 5], NOP5, "{note:?}");
        }
    }

    #[test]
    fn a_binary_without_notes_has_none() {
        let sleep = std::path::Path::new("/bin/sleep");
        if !sleep.exists() {
            return;
        }
        let data = std::fs::read(sleep).unwrap();
        let file = ElfFile64::<Endianness>::parse(&*data).unwrap();
        assert_eq!(notes(&file).unwrap(), Vec::new());
    }

    fn desc(strings: &[u8]) -> Vec<u8> {
        let mut desc = Vec::new();
        for addr in [0x1000u64, 0x500, 0] {
            desc.extend(addr.to_le_bytes());
        }
        desc.extend(strings);
        desc
    }

    #[test]
    fn parses_a_descriptor() {
        let raw = parse_desc(Endianness::Little, &desc(b"gw\0begin\08@%rdi\0\0\0")).unwrap();
        assert_eq!(raw.base, 0x500);
        assert_eq!(
            raw.note,
            SdtNote {
                provider: "gw".into(),
                name: "begin".into(),
                pc: 0x1000,
                semaphore: 0,
                args: "8@%rdi".into(),
            }
        );
    }

    #[test]
    fn refuses_a_truncated_descriptor() {
        for bad in [
            &desc(b"")[..20],
            &desc(b"gw\0begin")[..],
            &desc(b"gw\0begin\08@%rdi"),
        ] {
            assert!(parse_desc(Endianness::Little, bad).is_err(), "{bad:?}");
        }
        let error = parse_desc(Endianness::Little, &desc(b"gw\0begin\08@%rdi")).unwrap_err();
        assert!(error.to_string().contains("NUL-terminated"), "{error}");
    }
}
