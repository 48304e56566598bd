//! The process we trace: that it exists, that its binary has the probe sites, which TCP ports
//! it listens on, and which threads it has.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    num::NonZeroU32,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, bail};
use object::{Endianness, Object as _, ObjectSymbol as _, read::elf::ElfFile64};
use rustix::{
    event::{PollFd, PollFlags, Timespec, poll},
    io::Errno,
    process::{Pid, PidfdFlags, pidfd_open},
};
use tracer_ebpf::sites::{NOP5, Site, USDT_PROVIDER};

use super::usdt;

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: NonZeroU32,
    /// This very process, whatever later happens to its pid: opened before anything about the
    /// pid is read, readable once it has exited.
    pub pidfd: Arc<OwnedFd>,
    /// The binary, opened once (O_PATH) through /proc/PID/exe and checked; `exe` names it.
    #[expect(dead_code, reason = "held open for `exe`, never read")]
    exe_fd: Arc<OwnedFd>,
    /// `/proc/self/fd/N` of that open file: uprobes attach through it, so neither a binary
    /// replaced on disk nor a pid reused since the checks changes what they hit.
    pub exe: PathBuf,
    /// Where /proc/PID/exe pointed when opened, for messages.
    pub exe_name: PathBuf,
    /// Where each probe site is in `exe`, its NOP5 checked.
    pub sites: SiteOffsets,
    /// The inode number of its network namespace (the kernel's `ns.inum`), read while it is
    /// known to be alive: a zombie has no /proc/PID/ns.
    pub netns: u32,
}

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`, include/linux/proc_ns.h).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

impl Target {
    /// Checks that `pid` is a live process, seen with the kernel's own pids, whose binary has
    /// every probe site, each starting with the NOP5 the uprobe replaces.
    pub fn open(pid: u32) -> anyhow::Result<Self> {
        let target = Self::open_any(pid)?;
        if let Some(missing) = target.missing_sites() {
            bail!("{missing}");
        }
        Ok(target)
    }

    /// [`Target::open`] but for the sites' presence: any live process of ours (a binary's
    /// probe sites that are there are still checked). [`Target::missing_sites`] says what
    /// it lacks.
    pub fn open_any(pid: u32) -> anyhow::Result<Self> {
        let pid = NonZeroU32::new(pid).context("--pid 0 is not a process")?;
        // First: everything read below is about this process or, if it exits meanwhile and its
        // pid is reused, found out by `ensure_alive`.
        let raw = Pid::from_raw(pid.get().try_into().context("pid out of range")?);
        let pidfd = match pidfd_open(raw.context("pid out of range")?, PidfdFlags::empty()) {
            Err(Errno::SRCH) => bail!("no process with pid {pid}"),
            other => other.with_context(|| format!("pidfd_open({pid})"))?,
        };
        check_pid_namespace(pid.get())?;
        let exe_link = PathBuf::from(format!("/proc/{pid}/exe"));
        let exe_name = fs::read_link(&exe_link).unwrap_or_else(|_| exe_link.clone());
        let exe_fd: OwnedFd = fs::OpenOptions::new()
            .read(true)
            .custom_flags(rustix::fs::OFlags::PATH.bits() as i32)
            .open(&exe_link)
            .with_context(|| format!("opening {}", exe_link.display()))?
            .into();
        let exe = PathBuf::from(format!("/proc/self/fd/{}", exe_fd.as_raw_fd()));
        let sites = SiteOffsets::find(&exe)
            .with_context(|| format!("pid {pid} runs {}", exe_name.display()))?;
        let netns = netns_inode(pid.get())?;
        ensure_alive(&pidfd, pid)?;
        Ok(Target {
            netns,
            pid,
            pidfd: Arc::new(pidfd),
            exe_fd: Arc::new(exe_fd),
            exe,
            exe_name,
            sites,
        })
    }

    /// Why exact mode cannot trace it: the probe sites its binary lacks, named, and where they
    /// were looked for. `None` when it has all of them.
    pub fn missing_sites(&self) -> Option<String> {
        let missing = self.sites.missing();
        if missing.is_empty() {
            return None;
        }
        let looked = match self.sites.found_by {
            FoundBy::Notes => format!("in its `{USDT_PROVIDER}` stapsdt notes"),
            FoundBy::Symbols => {
                format!("(it has no `{USDT_PROVIDER}` stapsdt notes; looked for symbols)")
            }
        };
        Some(format!(
            "pid {} runs {} which lacks {} of {} probe sites {looked}: {}",
            self.pid,
            self.exe_name.display(),
            missing.len(),
            Site::ALL.len(),
            missing.join(", ")
        ))
    }

    pub fn tids(&self) -> anyhow::Result<Vec<u32>> {
        tids_of(self.pid.get())
    }
}

/// The threads of process `pid` now.
pub fn tids_of(pid: u32) -> anyhow::Result<Vec<u32>> {
    let dir = format!("/proc/{pid}/task");
    let mut tids = Vec::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        if let Ok(tid) = entry?.file_name().to_string_lossy().parse() {
            tids.push(tid);
        }
    }
    Ok(tids)
}

/// The child processes of `pid` and theirs, recursively (each thread's
/// `/proc/PID/task/TID/children`), without `pid`; in the order found. A process that exits
/// while it is read is left out.
pub fn descendants_of(pid: u32) -> Vec<u32> {
    let mut found: Vec<u32> = Vec::new();
    let mut queue = vec![pid];
    while let Some(parent) = queue.pop() {
        let Ok(tids) = tids_of(parent) else { continue };
        for tid in tids {
            let path = format!("/proc/{parent}/task/{tid}/children");
            let Ok(text) = fs::read_to_string(&path) else {
                continue;
            };
            for child in text
                .split_whitespace()
                .filter_map(|c| c.parse::<u32>().ok())
            {
                if child != pid && !found.contains(&child) {
                    found.push(child);
                    queue.push(child);
                }
            }
        }
    }
    found
}

/// The CPUs any thread of the processes `pids` may run on now (the union of their
/// `Cpus_allowed_list`).
pub fn cpus_allowed_of(pids: &[u32]) -> anyhow::Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for &pid in pids {
        // A process that exited since it was listed has nothing left to read.
        let Ok(tids) = tids_of(pid) else { continue };
        for tid in tids {
            let path = format!("/proc/{pid}/task/{tid}/status");
            // A thread that exited since the listing has no status left to read.
            let Ok(status) = fs::read_to_string(&path) else {
                continue;
            };
            let list = status
                .lines()
                .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
                .with_context(|| format!("{path} has no Cpus_allowed_list"))?;
            cpus.extend(parse_cpu_list(list.trim()).with_context(|| format!("reading {path}"))?);
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Ok(cpus)
}

/// Local ports of TCP sockets in LISTEN state open in any of the processes `pids` (the first
/// one's network namespace's tables: the kernel programs match ports in that one).
pub fn listen_ports_of(pids: &[u32]) -> anyhow::Result<Vec<u16>> {
    let Some(&first) = pids.first() else {
        return Ok(Vec::new());
    };
    let mut inodes = socket_inodes(first)?;
    for &pid in &pids[1..] {
        // A process that exited since it was listed has no fds left to read.
        if let Ok(more) = socket_inodes(pid) {
            inodes.extend(more);
        }
    }
    let mut ports = Vec::new();
    for table in ["tcp", "tcp6"] {
        let path = format!("/proc/{first}/net/{table}");
        let Ok(text) = fs::read_to_string(&path) else {
            continue;
        };
        for (port, inode) in listening_sockets(&text) {
            if inodes.contains(&inode) && !ports.contains(&port) {
                ports.push(port);
            }
        }
    }
    Ok(ports)
}

/// The inode number of `pid`'s network namespace, as the kernel's `ns.inum`.
fn netns_inode(pid: u32) -> anyhow::Result<u32> {
    use std::os::unix::fs::MetadataExt as _;
    let path = format!("/proc/{pid}/ns/net");
    let inode = fs::metadata(&path)
        .with_context(|| format!("reading {path}"))?
        .ino();
    u32::try_from(inode).with_context(|| format!("{path}: inode {inode} is not a u32"))
}

/// A kernel CPU list such as `0-3,6`.
fn parse_cpu_list(text: &str) -> anyhow::Result<Vec<u32>> {
    let mut cpus = Vec::new();
    for range in text.split(',').filter(|r| !r.is_empty()) {
        let (first, last) = range.split_once('-').unwrap_or((range, range));
        let (first, last): (u32, u32) = (first.parse()?, last.parse()?);
        anyhow::ensure!(first <= last, "CPU range {range} runs backwards");
        cpus.extend(first..=last);
    }
    Ok(cpus)
}

/// Where the probe sites were found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FoundBy {
    /// `.note.stapsdt` notes of provider [`USDT_PROVIDER`]; these survive `strip`.
    Notes,
    /// Symbols `gw_probe_*`, for a binary without notes.
    Symbols,
}

impl FoundBy {
    pub const fn name(self) -> &'static str {
        match self {
            FoundBy::Notes => "USDT notes",
            FoundBy::Symbols => "symbols",
        }
    }
}

/// The file offset of each probe site in a binary: what a uprobe attaches to.
#[derive(Clone, Debug)]
pub struct SiteOffsets {
    pub found_by: FoundBy,
    offsets: BTreeMap<Site, u64>,
}

impl SiteOffsets {
    /// Finds the sites of the ELF at `exe` by its USDT notes, or by symbols when it has none,
    /// and checks that each found one starts with the NOP5.
    pub fn find(exe: &Path) -> anyhow::Result<Self> {
        let data = fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
        let file = ElfFile64::<Endianness>::parse(&*data)
            .with_context(|| format!("{} is not a 64-bit ELF binary", exe.display()))?;
        let mut notes = HashMap::new();
        for note in usdt::notes(&file)
            .with_context(|| format!("reading the USDT notes of {}", exe.display()))?
            .into_iter()
            .filter(|note| note.provider == USDT_PROVIDER)
        {
            // One uprobe per site: a second copy of a site would go untraced.
            if notes.insert(note.name.clone(), note.pc).is_some() {
                bail!(
                    "{} has two `{USDT_PROVIDER}:{}` USDT notes",
                    exe.display(),
                    note.name
                );
            }
        }
        let (found_by, addresses) = if notes.is_empty() {
            let symbols: HashMap<&str, u64> = file
                .symbols()
                .chain(file.dynamic_symbols())
                .filter(|symbol| symbol.is_definition())
                .filter_map(|symbol| Some((symbol.name().ok()?, symbol.address())))
                .collect();
            let find = |site: Site| symbols.get(site.symbol()).copied();
            (FoundBy::Symbols, Site::ALL.map(find))
        } else {
            let find = |site: Site| notes.get(site.probe_name()).copied();
            (FoundBy::Notes, Site::ALL.map(find))
        };
        let mut offsets = BTreeMap::new();
        for (site, address) in Site::ALL.into_iter().zip(addresses) {
            let Some(address) = address else { continue };
            let offset = usdt::file_offset(&file, address).with_context(|| {
                format!(
                    "probe site {} at {address:#x} is in no executable segment of {}",
                    site.symbol(),
                    exe.display()
                )
            })?;
            let start = usize::try_from(offset)
                .ok()
                .and_then(|at| data.get(at..)?.get(..NOP5.len()));
            if start != Some(&NOP5[..]) {
                bail!(
                    "probe site {} at file offset {offset:#x} of {} starts with {start:02x?}, \
                     not the NOP5 {NOP5:02x?}: refusing to place a uprobe there",
                    site.symbol(),
                    exe.display()
                );
            }
            offsets.insert(site, offset);
        }
        Ok(SiteOffsets { found_by, offsets })
    }

    /// The file offset of `site`, if the binary has it.
    pub fn offset(&self, site: Site) -> Option<u64> {
        self.offsets.get(&site).copied()
    }

    /// Symbols of the sites the binary lacks.
    pub fn missing(&self) -> Vec<&'static str> {
        Site::ALL
            .into_iter()
            .filter(|site| !self.offsets.contains_key(site))
            .map(Site::symbol)
            .collect()
    }
}

fn exited(pidfd: &OwnedFd) -> bool {
    let mut fds = [PollFd::new(pidfd, PollFlags::IN)];
    let now = Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    poll(&mut fds, Some(&now)).is_ok_and(|n| n > 0)
}

/// The checks read /proc/PID; had the process exited, the pid could name another one by now.
fn ensure_alive(pidfd: &OwnedFd, pid: NonZeroU32) -> anyhow::Result<()> {
    if exited(pidfd) {
        bail!("pid {pid} exited while the tracer was checking it");
    }
    Ok(())
}

/// `NSpid:` of a /proc/PID/status: the pid in every PID namespace from the one the /proc
/// belongs to down to the process's own (Documentation/filesystems/proc.rst).
pub fn parse_nspid(status: &str) -> anyhow::Result<Vec<u32>> {
    let line = status
        .lines()
        .find_map(|line| line.strip_prefix("NSpid:"))
        .context("no NSpid line (kernel older than 4.1?)")?;
    let pids = line
        .split_whitespace()
        .map(|pid| pid.parse().with_context(|| format!("NSpid field {pid:?}")))
        .collect::<anyhow::Result<Vec<u32>>>()?;
    anyhow::ensure!(!pids.is_empty(), "empty NSpid line");
    Ok(pids)
}

/// The kernel programs compare against the pids of the initial PID namespace (what
/// `bpf_get_current_pid_tgid` returns); `pid` and the tids the tracer seeds are read from this
/// /proc. They agree only when this /proc is the initial namespace's; otherwise nothing would
/// ever match and the session would record nothing, so it is refused.
fn pid_namespace_decision(proc_ns_ino: u64, pid: u32, nspid: &[u32]) -> anyhow::Result<()> {
    if proc_ns_ino == INIT_PID_NS_INO {
        anyhow::ensure!(
            nspid.first() == Some(&pid),
            "/proc/{pid}/status says NSpid {nspid:?}: not the process asked for"
        );
        return Ok(());
    }
    bail!(
        "the tracer sees pids of a PID namespace other than the initial one (/proc/1/ns/pid is \
         pid:[{proc_ns_ino}], the initial one is pid:[{INIT_PID_NS_INO}]): pid {pid} (NSpid \
         {nspid:?} from here) has another pid in the kernel's initial namespace, which is what the \
         kernel programs filter on, so nothing would be recorded. Run the tracer in the host's \
         PID namespace with the host's /proc (e.g. `docker run --pid=host`, or `nsenter -t 1 -p -m`)"
    )
}

fn check_pid_namespace(pid: u32) -> anyhow::Result<()> {
    // A /proc that shows the tracer itself belongs to the tracer's namespace or an ancestor:
    // if the tracer's is the initial one, so is this /proc's. Otherwise the namespace of this
    // /proc's pid 1 is the one it shows pids of (reading it takes root).
    let ns_ino = |path: &str| fs::metadata(path).map(|m| m.ino());
    let proc_ns = match ns_ino("/proc/self/ns/pid") {
        Ok(INIT_PID_NS_INO) => INIT_PID_NS_INO,
        _ => ns_ino("/proc/1/ns/pid").context("reading /proc/1/ns/pid")?,
    };
    let path = format!("/proc/{pid}/status");
    let status = fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    let nspid = parse_nspid(&status).with_context(|| format!("reading {path}"))?;
    pid_namespace_decision(proc_ns, pid, &nspid)
}

fn socket_inodes(pid: u32) -> anyhow::Result<HashSet<u64>> {
    let dir = format!("/proc/{pid}/fd");
    let mut inodes = HashSet::new();
    for entry in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
        let Ok(link) = fs::read_link(entry?.path()) else {
            continue;
        };
        let link = link.to_string_lossy();
        let inode = link
            .strip_prefix("socket:[")
            .and_then(|s| s.strip_suffix(']'));
        if let Some(Ok(inode)) = inode.map(str::parse) {
            inodes.insert(inode);
        }
    }
    Ok(inodes)
}

/// (local port, inode) of every LISTEN row of a /proc/net/tcp{,6} table.
fn listening_sockets(table: &str) -> Vec<(u16, u64)> {
    const TCP_LISTEN: &str = "0A";
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let (local, state, inode) = (cols.get(1)?, cols.get(3)?, cols.get(9)?);
            if *state != TCP_LISTEN {
                return None;
            }
            let port = u16::from_str_radix(local.rsplit(':').next()?, 16).ok()?;
            Some((port, inode.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// Links the gateway's nine sites into this test binary, notes and all.
    pub(crate) fn link_gateway_sites() {
        use gateway::probe::*;
        let sites: [extern "C" fn(u64, u64, u64); 9] = [
            gw_probe_request_begin,
            gw_probe_request_end,
            gw_probe_phase,
            gw_probe_poll_enter,
            gw_probe_poll_exit,
            gw_probe_ledger_enqueue,
            gw_probe_sign_begin,
            gw_probe_sign_end,
            gw_probe_receipt_durable,
        ];
        std::hint::black_box(sites);
    }

    #[test]
    fn cpu_lists_parse_ranges_and_singles() {
        assert_eq!(parse_cpu_list("0").unwrap(), vec![0]);
        assert_eq!(parse_cpu_list("0-2,5").unwrap(), vec![0, 1, 2, 5]);
        for bad in ["x", "3-1", "1-"] {
            assert!(parse_cpu_list(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn finds_listening_rows_only() {
        let table = "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 0100007F:1F90 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 4242 1 0000000000000000 100 0 0 10 0
   1: 0100007F:1F90 0100007F:C350 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0000000000000000 20 4 30 10 -1";
        assert_eq!(listening_sockets(table), vec![(8080, 4242)]);
    }

    const STATUS: &str = "Name:\tgateway\nTgid:\t4242\nNgid:\t0\nPid:\t4242\nPPid:\t1\nNSpid:\t4242\t17\t1\nNSpgid:\t4242\t17\t1\n";

    /// Issue 21 item 2: NSpid runs from this /proc's namespace down to the process's own.
    #[test]
    fn item2_nspid_parses_outermost_first() {
        assert_eq!(parse_nspid(STATUS).unwrap(), vec![4242, 17, 1]);
        assert_eq!(parse_nspid("NSpid:\t9\n").unwrap(), vec![9]);
        assert!(parse_nspid("Pid:\t9\n").is_err());
        assert!(parse_nspid("NSpid:\t9 x\n").is_err());
        assert!(parse_nspid("NSpid:\n").is_err());
    }

    /// Issue 21 item 2: a /proc of another PID namespace than the kernel's initial one shows
    /// pids the kernel programs never see: refused with a message that says so, not a session
    /// that records nothing.
    #[test]
    fn item2_pid_namespace_other_than_initial_is_refused() {
        pid_namespace_decision(INIT_PID_NS_INO, 4242, &[4242, 17, 1]).unwrap();
        let err = pid_namespace_decision(4026532400, 17, &[17, 1])
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("PID namespace other than the initial one"),
            "{err}"
        );
        assert!(err.contains("--pid=host"), "{err}");
        assert!(pid_namespace_decision(INIT_PID_NS_INO, 4242, &[4243]).is_err());
    }

    /// Issue 21 items 2 and 4 on a live process: `sleep` has no probe sites; it is opened by
    /// pidfd and refused for its sites, and a pid that is not running is refused as such.
    #[test]
    fn opening_a_process_without_sites_names_them() {
        let mut sleep = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .expect("running sleep");
        let opened = Target::open(sleep.id());
        let _ = sleep.kill();
        let _ = sleep.wait();
        let err = opened.unwrap_err().to_string();
        assert!(err.contains("lacks"), "{err}");
        let err = Target::open(i32::MAX as u32).unwrap_err().to_string();
        assert!(err.contains("no process with pid"), "{err}");
    }

    #[test]
    fn sleep_lacks_every_site() {
        let sleep = Path::new("/bin/sleep");
        if sleep.exists() {
            let sites = SiteOffsets::find(sleep).unwrap();
            assert_eq!(sites.found_by, FoundBy::Symbols);
            assert_eq!(sites.missing().len(), Site::ALL.len());
        }
    }

    /// A stripped copy of this test binary, which links the gateway's sites.
    fn stripped_copy(dir: &Path) -> PathBuf {
        link_gateway_sites();
        let copy = dir.join("stripped");
        let status = std::process::Command::new("strip")
            .arg("-o")
            .arg(&copy)
            .arg(std::env::current_exe().unwrap())
            .status()
            .expect("running strip (binutils)");
        assert!(status.success(), "strip: {status}");
        copy
    }

    #[test]
    fn a_stripped_binary_has_its_sites_by_notes() {
        let dir = tempfile::tempdir().unwrap();
        let built = SiteOffsets::find(&std::env::current_exe().unwrap()).unwrap();
        let stripped = SiteOffsets::find(&stripped_copy(dir.path())).unwrap();
        assert_eq!(stripped.found_by, FoundBy::Notes);
        assert_eq!(stripped.missing(), Vec::<&str>::new());
        // strip leaves the code where it was.
        assert_eq!(stripped.offsets, built.offsets);
    }

    /// Issue 21 item 4: a site's bytes are checked, not only its name.
    #[test]
    fn item4_refuses_a_site_that_does_not_start_with_the_nop5() {
        let dir = tempfile::tempdir().unwrap();
        let path = stripped_copy(dir.path());
        let offset = SiteOffsets::find(&path)
            .unwrap()
            .offset(Site::PollExit)
            .unwrap();
        let mut data = fs::read(&path).unwrap();
        data[offset as usize] = 0xcc;
        fs::write(&path, data).unwrap();
        let error = format!("{:#}", SiteOffsets::find(&path).unwrap_err());
        assert!(
            error.contains("gw_probe_poll_exit") && error.contains("refusing"),
            "{error}"
        );
    }
}
