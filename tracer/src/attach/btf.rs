//! The few facts the kernel programs take from the kernel's BTF (`/sys/kernel/btf/vmlinux`):
//! where the struct members they read with `bpf_probe_read_kernel` are, and the argument lists
//! of the raw tracepoints they attach to (`btf_trace_<name>` typedefs).
//!
//! aya-obj parses BTF but keeps its type and member lookups crate-private, so this reads the
//! format itself (the kernel's Documentation/bpf/btf.rst): a header, then a type section of
//! `struct btf_type` records each followed by its kind's data, then a string section. Only
//! what the lookups need is kept.

use std::{fs, ops::Range};

use anyhow::{Context as _, bail, ensure};

pub const BTF_VMLINUX: &str = "/sys/kernel/btf/vmlinux";

const MAGIC: u16 = 0xeb9f;
const HEADER_LEN: usize = 24;

const INT: u8 = 1;
const PTR: u8 = 2;
const ARRAY: u8 = 3;
const STRUCT: u8 = 4;
const UNION: u8 = 5;
const ENUM: u8 = 6;
const FWD: u8 = 7;
const TYPEDEF: u8 = 8;
const VOLATILE: u8 = 9;
const CONST: u8 = 10;
const RESTRICT: u8 = 11;
const FUNC: u8 = 12;
const FUNC_PROTO: u8 = 13;
const VAR: u8 = 14;
const DATASEC: u8 = 15;
const FLOAT: u8 = 16;
const DECL_TAG: u8 = 17;
const TYPE_TAG: u8 = 18;
const ENUM64: u8 = 19;

/// One type record: its kind, name, `size` or referred `type`, and its members or parameters.
#[derive(Clone, Debug)]
struct Type {
    kind: u8,
    /// Member offsets are `bitfield_size << 24 | bit_offset`.
    kind_flag: bool,
    name_off: u32,
    size_or_type: u32,
    /// Struct and union members, or function prototype parameters, in [`Btf::items`].
    items: Range<usize>,
    /// An array's element type and length.
    array: Option<(u32, u32)>,
}

/// A struct or union member (`offset` in bits, see [`Type::kind_flag`]), or a parameter.
#[derive(Clone, Copy, Debug)]
struct Item {
    name_off: u32,
    type_id: u32,
    offset: u32,
}

/// A struct member found by [`Btf::member`]: bytes from the start of the outer struct.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Member {
    pub offset: u32,
    pub size: u32,
}

#[derive(Clone, Debug)]
pub struct Btf {
    /// Indexed by type id; id 0 is `void`.
    types: Vec<Type>,
    items: Vec<Item>,
    strings: Vec<u8>,
}

fn u32_at(data: &[u8], at: usize) -> anyhow::Result<u32> {
    let bytes = data
        .get(at..at + 4)
        .with_context(|| format!("BTF truncated at byte {at}"))?;
    Ok(u32::from_le_bytes(bytes.try_into()?))
}

impl Btf {
    pub fn from_sys_fs() -> anyhow::Result<Btf> {
        let data = fs::read(BTF_VMLINUX).with_context(|| format!("reading {BTF_VMLINUX}"))?;
        Btf::parse(&data).with_context(|| format!("parsing {BTF_VMLINUX}"))
    }

    /// Parses little-endian BTF (the only kind an x86-64 kernel has).
    pub fn parse(data: &[u8]) -> anyhow::Result<Btf> {
        ensure!(data.len() >= HEADER_LEN, "shorter than a BTF header");
        let magic = u16::from_le_bytes([data[0], data[1]]);
        ensure!(magic == MAGIC, "not little-endian BTF (magic {magic:#06x})");
        let header_len = u32_at(data, 4)? as usize;
        let section = |off: usize, len: usize| -> anyhow::Result<&[u8]> {
            let start = header_len + u32_at(data, off)? as usize;
            let len = u32_at(data, len)? as usize;
            data.get(start..start + len)
                .context("a BTF section runs past the end of the data")
        };
        let type_data = section(8, 12)?;
        let strings = section(16, 20)?.to_vec();

        let mut types = vec![Type {
            kind: 0,
            kind_flag: false,
            name_off: 0,
            size_or_type: 0,
            items: 0..0,
            array: None,
        }];
        let mut items = Vec::new();
        let mut at = 0;
        while at < type_data.len() {
            let name_off = u32_at(type_data, at)?;
            let info = u32_at(type_data, at + 4)?;
            let size_or_type = u32_at(type_data, at + 8)?;
            at += 12;
            let kind = ((info >> 24) & 0x1f) as u8;
            let vlen = (info & 0xffff) as usize;
            let start = items.len();
            let mut array = None;
            let extra = match kind {
                INT | VAR | DECL_TAG => 4,
                PTR | FWD | TYPEDEF | VOLATILE | CONST | RESTRICT | FUNC | FLOAT | TYPE_TAG => 0,
                ARRAY => {
                    array = Some((u32_at(type_data, at)?, u32_at(type_data, at + 8)?));
                    12
                }
                STRUCT | UNION => {
                    for i in 0..vlen {
                        let m = at + i * 12;
                        items.push(Item {
                            name_off: u32_at(type_data, m)?,
                            type_id: u32_at(type_data, m + 4)?,
                            offset: u32_at(type_data, m + 8)?,
                        });
                    }
                    vlen * 12
                }
                FUNC_PROTO => {
                    for i in 0..vlen {
                        let p = at + i * 8;
                        items.push(Item {
                            name_off: u32_at(type_data, p)?,
                            type_id: u32_at(type_data, p + 4)?,
                            offset: 0,
                        });
                    }
                    vlen * 8
                }
                ENUM => vlen * 8,
                ENUM64 | DATASEC => vlen * 12,
                _ => bail!("unknown BTF kind {kind} for type {}", types.len()),
            };
            at += extra;
            types.push(Type {
                kind,
                kind_flag: info >> 31 == 1,
                name_off,
                size_or_type,
                items: start..items.len(),
                array,
            });
        }
        ensure!(
            at == type_data.len(),
            "the BTF type section ends mid-record"
        );
        Ok(Btf {
            types,
            items,
            strings,
        })
    }

    fn name(&self, off: u32) -> &str {
        let rest = self.strings.get(off as usize..).unwrap_or_default();
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        std::str::from_utf8(&rest[..end]).unwrap_or_default()
    }

    fn get(&self, id: u32) -> anyhow::Result<&Type> {
        self.types
            .get(id as usize)
            .with_context(|| format!("BTF type id {id} out of range"))
    }

    fn by_name(&self, kind: u8, name: &str) -> Option<&Type> {
        self.types
            .iter()
            .find(|t| t.kind == kind && self.name(t.name_off) == name)
    }

    /// `id` with typedefs and qualifiers looked through.
    fn resolve(&self, mut id: u32) -> anyhow::Result<&Type> {
        for _ in 0..32 {
            let t = self.get(id)?;
            match t.kind {
                TYPEDEF | VOLATILE | CONST | RESTRICT | TYPE_TAG => id = t.size_or_type,
                _ => return Ok(t),
            }
        }
        bail!("BTF type {id}: a chain of typedefs too long")
    }

    fn size(&self, id: u32) -> anyhow::Result<u32> {
        let t = self.resolve(id)?;
        Ok(match t.kind {
            INT | STRUCT | UNION | ENUM | ENUM64 | FLOAT => t.size_or_type,
            PTR => 8,
            ARRAY => {
                let (elem, n) = t.array.context("array without element")?;
                self.size(elem)? * n
            }
            kind => bail!("BTF type {id} of kind {kind} has no size"),
        })
    }

    /// The member `name` of the struct or union `t`, looking through anonymous members, with
    /// its offset in bytes from the start of `t`.
    fn find_member(&self, t: &Type, name: &str) -> anyhow::Result<Option<(u32, Item)>> {
        for item in &self.items[t.items.clone()] {
            let (bits, bitfield) = if t.kind_flag {
                (item.offset & 0xff_ffff, item.offset >> 24)
            } else {
                (item.offset, 0)
            };
            let member_name = self.name(item.name_off);
            if member_name == name {
                ensure!(
                    bitfield == 0 && bits % 8 == 0,
                    "`{name}` is a bitfield, which a byte-offset read cannot take"
                );
                return Ok(Some((bits / 8, *item)));
            }
            if member_name.is_empty() {
                let inner = self.resolve(item.type_id)?;
                if matches!(inner.kind, STRUCT | UNION)
                    && let Some((offset, found)) = self.find_member(inner, name)?
                {
                    return Ok(Some((bits / 8 + offset, found)));
                }
            }
        }
        Ok(None)
    }

    /// Where `path` (member names, each inside the one before) is in `struct <name>`: its byte
    /// offset and size. Members of anonymous structs and unions are found through them.
    pub fn member(&self, name: &str, path: &[&str]) -> anyhow::Result<Member> {
        let mut t = self
            .by_name(STRUCT, name)
            .with_context(|| format!("no struct {name} in the kernel's BTF"))?;
        let mut offset = 0;
        let mut size = 0;
        let mut outer = format!("struct {name}");
        for (i, &field) in path.iter().enumerate() {
            let (at, item) = self
                .find_member(t, field)
                .with_context(|| format!("{outer}.{field}"))?
                .with_context(|| format!("{outer} has no member `{field}` in the kernel's BTF"))?;
            offset += at;
            size = self.size(item.type_id)?;
            outer = format!("{outer}.{field}");
            if i + 1 < path.len() {
                t = self.resolve(item.type_id)?;
                ensure!(
                    matches!(t.kind, STRUCT | UNION),
                    "{outer} is not a struct or union"
                );
            }
        }
        Ok(Member { offset, size })
    }

    /// A short C spelling of type `id`: `bool`, `unsigned int`, `struct task_struct *`.
    fn spell(&self, id: u32) -> anyhow::Result<String> {
        let t = self.get(id)?;
        let name = self.name(t.name_off);
        Ok(match t.kind {
            0 => "void".to_owned(),
            PTR => format!("{} *", self.spell(t.size_or_type)?),
            STRUCT => format!("struct {name}"),
            UNION => format!("union {name}"),
            CONST | VOLATILE | RESTRICT | TYPE_TAG => self.spell(t.size_or_type)?,
            _ => name.to_owned(),
        })
    }

    /// The arguments a raw tracepoint's program gets (`TP_PROTO`), spelled as in C, from the
    /// kernel's `btf_trace_<name>` typedef (a pointer to `void (void *, args...)`).
    pub fn raw_tracepoint_args(&self, name: &str) -> anyhow::Result<Vec<String>> {
        let typedef = format!("btf_trace_{name}");
        let t = self
            .by_name(TYPEDEF, &typedef)
            .with_context(|| format!("no {typedef} in the kernel's BTF"))?;
        let ptr = self.get(t.size_or_type)?;
        ensure!(ptr.kind == PTR, "{typedef} is not a function pointer");
        let proto = self.get(ptr.size_or_type)?;
        ensure!(
            proto.kind == FUNC_PROTO,
            "{typedef} is not a function pointer"
        );
        let params = &self.items[proto.items.clone()];
        ensure!(!params.is_empty(), "{typedef} has no parameters");
        // The first is the probe's private data, not a tracepoint argument.
        params[1..].iter().map(|p| self.spell(p.type_id)).collect()
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Writes BTF the way the kernel lays it out, for tests: types get ids from 1 in order.
    #[derive(Default)]
    pub(crate) struct Writer {
        types: Vec<u8>,
        strings: Vec<u8>,
        next_id: u32,
    }

    impl Writer {
        pub(crate) fn new() -> Writer {
            Writer {
                types: Vec::new(),
                strings: vec![0],
                next_id: 1,
            }
        }

        fn string(&mut self, s: &str) -> u32 {
            if s.is_empty() {
                return 0;
            }
            let off = self.strings.len() as u32;
            self.strings.extend_from_slice(s.as_bytes());
            self.strings.push(0);
            off
        }

        fn record(&mut self, name: &str, kind: u8, flag: bool, vlen: usize, size: u32) -> u32 {
            let name = self.string(name);
            let info = (u32::from(kind) << 24) | (u32::from(flag) << 31) | vlen as u32;
            for word in [name, info, size] {
                self.types.extend_from_slice(&word.to_le_bytes());
            }
            self.next_id += 1;
            self.next_id - 1
        }

        fn words(&mut self, words: &[u32]) {
            for w in words {
                self.types.extend_from_slice(&w.to_le_bytes());
            }
        }

        pub(crate) fn int(&mut self, name: &str, size: u32) -> u32 {
            let id = self.record(name, INT, false, 0, size);
            self.words(&[size * 8]);
            id
        }

        pub(crate) fn ptr(&mut self, to: u32) -> u32 {
            self.record("", PTR, false, 0, to)
        }

        pub(crate) fn typedef(&mut self, name: &str, to: u32) -> u32 {
            self.record(name, TYPEDEF, false, 0, to)
        }

        pub(crate) fn array(&mut self, elem: u32, index: u32, n: u32) -> u32 {
            let id = self.record("", ARRAY, false, 0, 0);
            self.words(&[elem, index, n]);
            id
        }

        /// Members as (name, type, byte offset); `bitfield` marks the last one a 3-bit field.
        pub(crate) fn composite(
            &mut self,
            kind: u8,
            name: &str,
            size: u32,
            members: &[(&str, u32, u32)],
            bitfield: bool,
        ) -> u32 {
            let id = self.record(name, kind, bitfield, members.len(), size);
            for (i, &(member, ty, offset)) in members.iter().enumerate() {
                let name = self.string(member);
                let bits = if bitfield && i + 1 == members.len() {
                    (3 << 24) | (offset * 8)
                } else {
                    offset * 8
                };
                self.words(&[name, ty, bits]);
            }
            id
        }

        pub(crate) fn structure(&mut self, name: &str, size: u32, m: &[(&str, u32, u32)]) -> u32 {
            self.composite(STRUCT, name, size, m, false)
        }

        pub(crate) fn func_proto(&mut self, params: &[u32]) -> u32 {
            let id = self.record("", FUNC_PROTO, false, params.len(), 0);
            for &p in params {
                self.words(&[0, p]);
            }
            id
        }

        /// A kind none of the lookups use, to check records are skipped by their length.
        pub(crate) fn enumeration(&mut self, name: &str, values: &[(&str, u32)]) -> u32 {
            let id = self.record(name, ENUM, false, values.len(), 4);
            for &(n, v) in values {
                let n = self.string(n);
                self.words(&[n, v]);
            }
            id
        }

        pub(crate) fn bytes(&self) -> Vec<u8> {
            let mut out = Vec::new();
            out.extend_from_slice(&MAGIC.to_le_bytes());
            out.extend_from_slice(&[1, 0]);
            let type_len = self.types.len() as u32;
            for word in [
                HEADER_LEN as u32,
                0,
                type_len,
                type_len,
                self.strings.len() as u32,
            ] {
                out.extend_from_slice(&word.to_le_bytes());
            }
            out.extend_from_slice(&self.types);
            out.extend_from_slice(&self.strings);
            out
        }
    }

    /// A miniature of the kernel's types: `sock` reaches `net` through a typedef'd anonymous
    /// struct, `ns_common.inum` sits in an anonymous union, and sched_switch's raw arguments.
    pub(crate) fn sample() -> Vec<u8> {
        let mut w = Writer::new();
        let int = w.int("int", 4);
        let uint = w.int("unsigned int", 4);
        let char_ = w.int("char", 1);
        let bool_ = w.int("_Bool", 1);
        let bool_t = w.typedef("bool", bool_);
        w.enumeration("skipped", &[("A", 1), ("B", 2)]);
        let comm = w.array(char_, int, 16);
        let task = w.structure(
            "task_struct",
            64,
            &[("exit_state", int, 8), ("pid", int, 12), ("comm", comm, 40)],
        );
        let anon_union = w.composite(UNION, "", 4, &[("count", int, 0), ("inum", uint, 0)], false);
        let ns = w.structure("ns_common", 16, &[("stashed", int, 0), ("", anon_union, 8)]);
        let net = w.structure("net", 64, &[("passive", int, 0), ("ns", ns, 24)]);
        let net_ptr = w.ptr(net);
        let possible = w.structure("", 8, &[("net", net_ptr, 0)]);
        let possible_t = w.typedef("possible_net_t", possible);
        let common = w.composite(
            STRUCT,
            "sock_common",
            64,
            &[
                ("skc_daddr", uint, 0),
                ("skc_net", possible_t, 48),
                ("skc_flag", uint, 56),
            ],
            true,
        );
        w.structure("sock", 128, &[("__sk_common", common, 0)]);
        let task_ptr = w.ptr(task);
        let void_ptr = w.ptr(0);
        let proto = w.func_proto(&[void_ptr, bool_t, task_ptr, task_ptr, uint]);
        let proto_ptr = w.ptr(proto);
        w.typedef("btf_trace_sched_switch", proto_ptr);
        w.bytes()
    }

    #[test]
    fn members_through_typedefs_and_anonymous_members() {
        let btf = Btf::parse(&sample()).unwrap();
        let at = |s: &str, path: &[&str]| btf.member(s, path).unwrap();
        assert_eq!(
            at("task_struct", &["pid"]),
            Member {
                offset: 12,
                size: 4
            }
        );
        assert_eq!(
            at("task_struct", &["comm"]),
            Member {
                offset: 40,
                size: 16
            }
        );
        assert_eq!(
            at("sock", &["__sk_common", "skc_net", "net"]),
            Member {
                offset: 48,
                size: 8
            }
        );
        assert_eq!(
            at("net", &["ns", "inum"]),
            Member {
                offset: 32,
                size: 4
            }
        );
    }

    #[test]
    fn a_missing_member_or_struct_is_named() {
        let btf = Btf::parse(&sample()).unwrap();
        let err = btf.member("task_struct", &["state"]).unwrap_err();
        assert_eq!(
            err.to_string(),
            "struct task_struct has no member `state` in the kernel's BTF"
        );
        let err = btf.member("nope", &["x"]).unwrap_err();
        assert_eq!(err.to_string(), "no struct nope in the kernel's BTF");
        let err = btf.member("task_struct", &["pid", "x"]).unwrap_err();
        assert!(err.to_string().contains("is not a struct"), "{err}");
        let err = btf
            .member("sock", &["__sk_common", "skc_flag"])
            .unwrap_err();
        assert!(format!("{err:#}").contains("bitfield"), "{err:#}");
    }

    #[test]
    fn raw_tracepoint_arguments_are_spelled() {
        let btf = Btf::parse(&sample()).unwrap();
        assert_eq!(
            btf.raw_tracepoint_args("sched_switch").unwrap(),
            [
                "bool",
                "struct task_struct *",
                "struct task_struct *",
                "unsigned int"
            ]
        );
        assert!(btf.raw_tracepoint_args("sched_nope").is_err());
    }

    #[test]
    fn bad_data_is_an_error_not_a_panic() {
        let good = sample();
        assert!(Btf::parse(&good[..10]).is_err());
        assert!(Btf::parse(&good[..good.len() - 5]).is_err());
        let mut wrong = good.clone();
        wrong[0] = 0;
        assert!(Btf::parse(&wrong).is_err());
        // A record cut short inside the type section.
        let mut short = good;
        let type_len = u32_at(&short, 12).unwrap() - 2;
        short[12..16].copy_from_slice(&type_len.to_le_bytes());
        assert!(Btf::parse(&short).is_err());
    }

    /// The running kernel's own BTF has every member the programs read.
    #[test]
    fn this_kernels_btf() {
        if !std::path::Path::new(BTF_VMLINUX).exists() {
            eprintln!("SKIPPED this_kernels_btf: no {BTF_VMLINUX}");
            return;
        }
        let btf = Btf::from_sys_fs().unwrap();
        assert_eq!(btf.member("task_struct", &["pid"]).unwrap().size, 4);
        assert_eq!(btf.member("task_struct", &["comm"]).unwrap().size, 16);
        assert_eq!(
            btf.member("sock", &["__sk_common", "skc_net", "net"])
                .unwrap()
                .size,
            8
        );
        assert_eq!(btf.member("net", &["ns", "inum"]).unwrap().size, 4);
        assert_eq!(
            btf.raw_tracepoint_args("sched_wakeup").unwrap(),
            ["struct task_struct *"]
        );
    }
}
