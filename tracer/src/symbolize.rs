//! Stack ids → frame names for folded stacks.
//!
//! User frames: the address is located in a snapshot of the target's `/proc/PID/maps`, turned
//! into a file offset of the mapped ELF, and resolved by blazesym (ELF symbols and DWARF,
//! inlined calls expanded, Rust and C++ names demangled). The snapshot is taken when the
//! session starts, so frames still resolve after the target has exited. With a live target
//! each mapped file is opened then as the target sees it (`/proc/PID/map_files/<range>`, else
//! `/proc/PID/root/<path>`), never by its path in the tracer's own mount namespace, where a
//! container's `/usr/lib/...` is another file and would give wrong names; a mapping that
//! cannot be opened that way shows as its module name. Where the file at the same path in the
//! tracer's namespace has another GNU build-id, the session warns once (tools run there, such
//! as perf or addr2line, would name other code). Kernel frames come
//! from `/proc/kallsyms` and carry the `_[k]` suffix that inferno and perf use for kernel code.
//!
//! Generic argument lists are dropped from user frames (see [`shorten_generics`]). Every name
//! is sanitized for the folded format (`;` separates frames, a newline ends a line)
//! and cached per address, and whole stacks are cached per stack id.

use std::collections::HashMap;
use std::fs::{self, File};
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use anyhow::{Context, Result};
use blazesym::MaybeDefault;
use blazesym::symbolize::source::{Elf, Kernel, Source};
use blazesym::symbolize::{Input, Symbolized, Symbolizer as Blaze};

/// Where stack ids come from: the kernel programs' STACKS map, or synthetic stacks in tests.
/// Kernel and user stacks share one id space (one map).
pub trait StackSource {
    /// The instruction pointers of stack `id`, innermost first (as `bpf_get_stack` writes
    /// them); `None` for a negative id (no stack taken) or one the map does not hold.
    fn stack(&self, id: i64) -> Option<Vec<u64>>;
}

impl<T: std::borrow::Borrow<aya::maps::MapData>> StackSource
    for aya::maps::HashMap<T, u64, tracer_ebpf::abi::Stack>
{
    fn stack(&self, id: i64) -> Option<Vec<u64>> {
        let id = u64::try_from(id).ok()?;
        let stack = self.get(&id, 0).ok()?;
        Some(stack.ips.into_iter().take_while(|&ip| ip != 0).collect())
    }
}

impl StackSource for HashMap<i64, Vec<u64>> {
    fn stack(&self, id: i64) -> Option<Vec<u64>> {
        self.get(&id).cloned()
    }
}

/// The suffix that marks a kernel frame.
pub const KERNEL_MARK: &str = "_[k]";

/// One executable mapping of the target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ExecMapping {
    pub start: u64,
    pub end: u64,
    /// File offset of `start`.
    pub offset: u64,
    /// The mapped file, or a pseudo name such as `[vdso]`.
    pub path: PathBuf,
}

/// The executable mappings of a process, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct ProcessMaps {
    mappings: Vec<ExecMapping>,
}

impl ProcessMaps {
    pub fn read(pid: u32) -> Result<Self> {
        let path = format!("/proc/{pid}/maps");
        let text = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
        Ok(Self::parse(&text))
    }

    /// Parses `/proc/PID/maps` text, keeping executable mappings; malformed lines are skipped.
    pub fn parse(text: &str) -> Self {
        let mut mappings: Vec<ExecMapping> = text.lines().filter_map(parse_maps_line).collect();
        mappings.sort_by_key(|m| m.start);
        ProcessMaps { mappings }
    }

    pub fn find(&self, addr: u64) -> Option<&ExecMapping> {
        let at = self.mappings.partition_point(|m| m.start <= addr);
        let mapping = self.mappings.get(at.checked_sub(1)?)?;
        (addr < mapping.end).then_some(mapping)
    }

    pub fn mappings(&self) -> &[ExecMapping] {
        &self.mappings
    }
}

/// The file behind mapping `m` of `pid` as that process sees it: the mapping itself (needs
/// CAP_SYS_ADMIN), else its path under the process's root (its mount namespace).
fn open_as_seen_by(pid: u32, m: &ExecMapping) -> Option<File> {
    let range = format!("/proc/{pid}/map_files/{:x}-{:x}", m.start, m.end);
    open_regular(Path::new(&range)).or_else(|| {
        let relative = m.path.strip_prefix("/").unwrap_or(&m.path);
        open_regular(&Path::new(&format!("/proc/{pid}/root")).join(relative))
    })
}

/// `path` opened for reading if it is a regular file. The path is the target's to choose: it
/// may name a FIFO (an open would wait for a writer) or a device here (an open is the
/// driver's to act on), so it is looked at through an `O_PATH` handle, which opens nothing,
/// and only a regular file is opened, through that handle.
fn open_regular(path: &Path) -> Option<File> {
    let handle = File::options()
        .read(true)
        .custom_flags(libc::O_PATH)
        .open(path)
        .ok()?;
    if !handle.metadata().ok()?.is_file() {
        return None;
    }
    File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", handle.as_raw_fd()))
        .ok()
}

/// The GNU build-id note of the ELF file `file`, if it has one. Reads only the headers and
/// the notes, not the whole file.
pub fn build_id(file: &File) -> Option<Vec<u8>> {
    use object::Object as _;
    let cache = object::ReadCache::new(file);
    let elf = object::File::parse(&cache).ok()?;
    Some(elf.build_id().ok()??.to_vec())
}

/// A mapped file whose build-id differs from the file at its path in the tracer's own mount
/// namespace: the target's file is the one read.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OtherBuild {
    pub path: PathBuf,
    /// The build-id of the file the target mapped.
    pub target: Vec<u8>,
    /// The build-id of the file at the same path in the tracer's namespace.
    pub tracer: Vec<u8>,
}

impl std::fmt::Display for OtherBuild {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let hex = |id: &[u8]| id.iter().map(|b| format!("{b:02x}")).collect::<String>();
        write!(
            f,
            "{} (the target's build-id {}, the tracer's {})",
            self.path.display(),
            hex(&self.target),
            hex(&self.tracer)
        )
    }
}

/// Compares the build-id of `target` (the mapped file, opened as the target sees it) with that
/// of the file at `path` in the tracer's namespace; `None` when they agree or either is unknown.
fn other_build(path: &Path, target: &File) -> Option<OtherBuild> {
    let tracer = build_id(&open_regular(path)?)?;
    let target = build_id(target)?;
    (target != tracer).then(|| OtherBuild {
        path: path.to_owned(),
        target,
        tracer,
    })
}

fn parse_maps_line(line: &str) -> Option<ExecMapping> {
    let mut fields = line.split_ascii_whitespace();
    let (start, end) = fields.next()?.split_once('-')?;
    let perms = fields.next()?;
    let offset = fields.next()?;
    let _dev = fields.next()?;
    let _inode = fields.next()?;
    // The path is the rest of the line and may contain spaces.
    let path = fields.collect::<Vec<_>>().join(" ");
    if !perms.contains('x') || path.is_empty() {
        return None;
    }
    let (start, end) = (
        u64::from_str_radix(start, 16).ok()?,
        u64::from_str_radix(end, 16).ok()?,
    );
    // `find` and the map_files name assume a range; the kernel never writes one backwards.
    if start > end {
        return None;
    }
    Some(ExecMapping {
        start,
        end,
        offset: u64::from_str_radix(offset, 16).ok()?,
        path: PathBuf::from(path),
    })
}

/// Makes a symbol name safe as one folded frame.
pub fn sanitize(name: &str) -> String {
    name.chars()
        .map(|c| match c {
            ';' => ':',
            '\n' | '\r' => ' ',
            c => c,
        })
        .collect()
}

/// Drops generic argument lists (`Vec<u8, Global>` → `Vec`) but keeps qualified paths
/// (`<Conn as Future>::poll`). Inlined frames from DWARF carry every type argument, which
/// makes one frame hundreds of characters long and splits one function into many towers.
pub fn shorten_generics(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut depth = 0usize;
    let mut prev = '\0';
    for c in name.chars() {
        if depth > 0 {
            match c {
                '<' => depth += 1,
                // `->` inside the arguments (`Fn() -> T`) is not a closing bracket.
                '>' if prev != '-' => depth -= 1,
                _ => {}
            }
        } else if c == '<' && (prev.is_alphanumeric() || prev == '_' || prev == '>') {
            depth = 1;
        } else {
            out.push(c);
        }
        prev = c;
    }
    out
}

/// Whether `/proc/kallsyms` shows real addresses (it shows zeros without privilege).
pub fn kallsyms_readable() -> bool {
    let Ok(text) = fs::read_to_string("/proc/kallsyms") else {
        return false;
    };
    text.lines().take(1000).any(|line| {
        line.split(' ')
            .next()
            .is_some_and(|addr| addr.bytes().any(|b| b != b'0'))
    })
}

/// Resolves addresses of one target process and of the kernel.
pub struct Symbolizer {
    blaze: Blaze,
    maps: ProcessMaps,
    /// The mapped files opened as the target sees them, by mapping path; `None`: the paths are
    /// used as they are (a snapshot without a process, as in tests).
    opened: Option<HashMap<PathBuf, File>>,
    /// Of those, the ones another file (by build-id) stands for at the same path here.
    other_builds: Vec<OtherBuild>,
    kernel: bool,
    user_addrs: HashMap<u64, Rc<[String]>>,
    kernel_addrs: HashMap<u64, Rc<str>>,
    user_stacks: HashMap<i64, Option<Rc<str>>>,
    kernel_stacks: HashMap<i64, Option<Rc<str>>>,
}

impl Symbolizer {
    /// Snapshots the executable mappings of `pid` now; kernel frames resolve if kallsyms
    /// shows addresses.
    pub fn for_process(pid: u32) -> Result<Self> {
        Ok(Self::opened(pid, ProcessMaps::read(pid)?))
    }

    /// For the mappings `maps` of live process `pid`: each file is opened now through the
    /// process's own view of it, and only those opened files are read. Their build-ids are
    /// compared with the files at the same paths here ([`Symbolizer::other_builds`]).
    pub fn opened(pid: u32, maps: ProcessMaps) -> Self {
        let mut opened = HashMap::new();
        let mut other_builds = Vec::new();
        for m in maps.mappings().iter().filter(|m| m.path.is_absolute()) {
            if opened.contains_key(&m.path) {
                continue;
            }
            if let Some(file) = open_as_seen_by(pid, m) {
                other_builds.extend(other_build(&m.path, &file));
                opened.insert(m.path.clone(), file);
            }
        }
        Symbolizer {
            opened: Some(opened),
            other_builds,
            ..Self::new(maps)
        }
    }

    /// The target's mapped files that differ by build-id from the files at their paths in the
    /// tracer's mount namespace (a container's libraries, a binary replaced on disk). Frames
    /// are named from the target's files all the same.
    pub fn other_builds(&self) -> &[OtherBuild] {
        &self.other_builds
    }

    pub fn new(maps: ProcessMaps) -> Self {
        Symbolizer {
            blaze: Blaze::new(),
            maps,
            opened: None,
            other_builds: Vec::new(),
            kernel: kallsyms_readable(),
            user_addrs: HashMap::new(),
            kernel_addrs: HashMap::new(),
            user_stacks: HashMap::new(),
            kernel_stacks: HashMap::new(),
        }
    }

    /// Whether kernel frames get names (else they show as `[unknown]_[k]`).
    pub fn kernel_names(&self) -> bool {
        self.kernel
    }

    /// The frames at one user address, outermost first: the function containing `addr`, then
    /// the calls inlined into it. An unresolved address shows as `[module]` or `[unknown]`.
    pub fn user_frames(&mut self, addr: u64) -> Rc<[String]> {
        if let Some(frames) = self.user_addrs.get(&addr) {
            return frames.clone();
        }
        let frames: Rc<[String]> = self.resolve_user(addr).into();
        self.user_addrs.insert(addr, frames.clone());
        frames
    }

    fn resolve_user(&self, addr: u64) -> Vec<String> {
        let Some(mapping) = self.maps.find(addr) else {
            return vec!["[unknown]".to_owned()];
        };
        let module = || {
            let name = mapping.path.file_name().map_or_else(
                || mapping.path.to_string_lossy(),
                |name| name.to_string_lossy(),
            );
            vec![format!("[{}]", sanitize(&name))]
        };
        if !mapping.path.is_absolute() {
            return module();
        }
        let path = match &self.opened {
            None => mapping.path.clone(),
            Some(opened) => match opened.get(&mapping.path) {
                Some(file) => PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd())),
                None => return module(),
            },
        };
        let offset = addr - mapping.start + mapping.offset;
        let source = Source::Elf(Elf::new(&path));
        match self
            .blaze
            .symbolize_single(&source, Input::FileOffset(offset))
        {
            Ok(Symbolized::Sym(sym)) => std::iter::once(sym.name.as_ref())
                .chain(sym.inlined.iter().map(|inlined| inlined.name.as_ref()))
                .map(|name| sanitize(&shorten_generics(name)))
                .collect(),
            Ok(Symbolized::Unknown(_)) | Err(_) => module(),
        }
    }

    /// The name of the kernel function at `addr`, with the kernel mark.
    pub fn kernel_frame(&mut self, addr: u64) -> Rc<str> {
        if let Some(name) = self.kernel_addrs.get(&addr) {
            return name.clone();
        }
        let name: Rc<str> = format!("{}{KERNEL_MARK}", self.resolve_kernel(addr)).into();
        self.kernel_addrs.insert(addr, name.clone());
        name
    }

    fn resolve_kernel(&self, addr: u64) -> String {
        if !self.kernel {
            return "[unknown]".to_owned();
        }
        let source = Source::Kernel(Kernel {
            kallsyms: MaybeDefault::Default,
            // kallsyms alone: searching for a vmlinux image is slow and rarely fruitful here.
            vmlinux: MaybeDefault::None,
            debug_syms: false,
            ..Kernel::default()
        });
        match self.blaze.symbolize_single(&source, Input::AbsAddr(addr)) {
            Ok(Symbolized::Sym(sym)) => sanitize(&sym.name),
            Ok(Symbolized::Unknown(_)) | Err(_) => "[unknown]".to_owned(),
        }
    }

    /// User stack `id` as folded frames, outermost first (`a;b;c`); `None` if there is none.
    pub fn user_stack(&mut self, stacks: &dyn StackSource, id: i64) -> Option<Rc<str>> {
        if let Some(folded) = self.user_stacks.get(&id) {
            return folded.clone();
        }
        let folded = stacks.stack(id).filter(|ips| !ips.is_empty()).map(|ips| {
            let mut frames = Vec::new();
            for (depth, ip) in ips.iter().enumerate().rev() {
                frames.extend(self.user_frames(call_site(depth, *ip)).iter().cloned());
            }
            Rc::from(frames.join(";"))
        });
        self.user_stacks.insert(id, folded.clone());
        folded
    }

    /// Kernel stack `id` as folded frames, outermost first; `None` if there is none.
    pub fn kernel_stack(&mut self, stacks: &dyn StackSource, id: i64) -> Option<Rc<str>> {
        if let Some(folded) = self.kernel_stacks.get(&id) {
            return folded.clone();
        }
        let folded = stacks.stack(id).filter(|ips| !ips.is_empty()).map(|ips| {
            let frames: Vec<Rc<str>> = ips
                .iter()
                .enumerate()
                .rev()
                .map(|(depth, ip)| self.kernel_frame(call_site(depth, *ip)))
                .collect();
            Rc::from(frames.join(";"))
        });
        self.kernel_stacks.insert(id, folded.clone());
        folded
    }

    /// A whole stack, user frames then kernel frames, outermost first; `None` if neither
    /// half was taken.
    pub fn stack(
        &mut self,
        stacks: &dyn StackSource,
        kernel_id: i64,
        user_id: i64,
    ) -> Option<String> {
        let user = self.user_stack(stacks, user_id);
        let kernel = self.kernel_stack(stacks, kernel_id);
        match (user, kernel) {
            (Some(user), Some(kernel)) => Some(format!("{user};{kernel}")),
            (Some(only), None) | (None, Some(only)) => Some(only.to_string()),
            (None, None) => None,
        }
    }
}

/// Every frame but the innermost holds a return address, which may already belong to the
/// next line or function; the call itself is one byte earlier (as perf does).
fn call_site(depth: usize, ip: u64) -> u64 {
    if depth == 0 { ip } else { ip.saturating_sub(1) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    const MAPS: &str = "\
55d0c0000000-55d0c0100000 r--p 00000000 08:01 1234 /opt/gw/gateway
55d0c0100000-55d0c0800000 r-xp 00100000 08:01 1234 /opt/gw/gateway
7f0000000000-7f0000010000 r-xp 00028000 08:01 99 /usr/lib/my lib.so
7ffd00000000-7ffd00002000 r-xp 00000000 00:00 0 [vdso]
7ffe00000000-7ffe00001000 rw-p 00000000 00:00 0 [stack]
garbage line
";

    #[test]
    fn maps_keep_executable_mappings_with_paths_that_contain_spaces() {
        let maps = ProcessMaps::parse(MAPS);
        let paths: Vec<_> = maps
            .mappings()
            .iter()
            .map(|m| m.path.to_str().unwrap())
            .collect();
        assert_eq!(paths, ["/opt/gw/gateway", "/usr/lib/my lib.so", "[vdso]"]);
        let gw = maps.find(0x55d0c0100010).unwrap();
        assert_eq!(gw.offset, 0x100000);
        assert!(
            maps.find(0x55d0c0000010).is_none(),
            "the r--p mapping is not executable"
        );
        assert!(maps.find(0x55d0c0800000).is_none(), "end is exclusive");
        assert_eq!(
            maps.find(0x7f0000000001).unwrap().path,
            Path::new("/usr/lib/my lib.so")
        );
    }

    #[test]
    fn a_maps_line_that_ends_before_it_starts_is_malformed() {
        let maps = ProcessMaps::parse("2000-1000 r-xp 00000000 08:01 1 /bin/x\n");
        assert_eq!(maps.mappings(), []);
    }

    #[test]
    fn unresolvable_addresses_name_their_module_or_are_unknown() {
        let mut sym = Symbolizer::new(ProcessMaps::parse(MAPS));
        assert_eq!(&*sym.user_frames(0x1), ["[unknown]"]);
        assert_eq!(&*sym.user_frames(0x7ffd00000010), ["[[vdso]]"]);
        // The file does not exist: the frame still says where the address was.
        assert_eq!(&*sym.user_frames(0x55d0c0100010), ["[gateway]"]);
    }

    /// A FIFO named by a mapping's path would block a plain open until a writer came; a device
    /// would be opened by its driver.
    #[test]
    fn only_regular_files_are_opened_and_a_fifo_does_not_block() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        rustix::fs::mknodat(
            rustix::fs::CWD,
            &fifo,
            rustix::fs::FileType::Fifo,
            rustix::fs::Mode::RUSR,
            0,
        )
        .unwrap();
        assert!(open_regular(&fifo).is_none());
        assert!(open_regular(dir.path()).is_none(), "a directory");
        assert!(open_regular(Path::new("/dev/null")).is_none(), "a device");
        assert!(open_regular(Path::new("/proc/self/exe")).is_some());
    }

    #[test]
    fn generic_arguments_go_and_qualified_paths_stay() {
        assert_eq!(
            shorten_generics("and_then<&http::HeaderValue, &str, F>"),
            "and_then"
        );
        assert_eq!(
            shorten_generics("<hyper::Conn<T, B> as core::future::Future>::poll"),
            "<hyper::Conn as core::future::Future>::poll"
        );
        assert_eq!(
            shorten_generics("call<Box<dyn Fn() -> u8>>::{closure#0}"),
            "call::{closure#0}"
        );
        assert_eq!(
            shorten_generics("gateway::act::handle"),
            "gateway::act::handle"
        );
    }

    #[test]
    fn sanitize_keeps_one_frame_one_field() {
        assert_eq!(
            sanitize("core::array<[u8; 32]>\nx"),
            "core::array<[u8: 32]> x"
        );
    }

    #[test]
    fn stacks_fold_outermost_first_user_before_kernel() {
        let mut sym = Symbolizer::new(ProcessMaps::default());
        let stacks: HashMap<i64, Vec<u64>> = HashMap::from([(1, vec![0x10, 0x20]), (2, vec![])]);
        assert_eq!(
            sym.user_stack(&stacks, 1).as_deref(),
            Some("[unknown];[unknown]")
        );
        assert_eq!(
            sym.user_stack(&stacks, 2),
            None,
            "an empty stack is no stack"
        );
        assert_eq!(sym.stack(&stacks, -1, -1), None);
        let both = sym.stack(&stacks, 1, 1).unwrap();
        assert!(both.ends_with(&format!("[unknown]{KERNEL_MARK}")), "{both}");
        assert!(both.starts_with("[unknown];[unknown];"), "{both}");
    }
}
