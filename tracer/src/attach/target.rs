//! The process we trace: that it exists, that its binary has the probe sites, which TCP ports
//! it listens on, and which threads it has.

use std::{
    collections::{HashMap, HashSet},
    fs,
    num::NonZeroU32,
    os::{
        fd::{AsRawFd as _, OwnedFd},
        unix::fs::{FileExt as _, MetadataExt as _, OpenOptionsExt as _},
    },
    path::{Path, PathBuf},
    sync::Arc,
};

use anyhow::{Context as _, bail};
use object::{Object as _, ObjectSection as _, ObjectSymbol as _};
use rustix::{
    event::{PollFd, PollFlags, Timespec, poll},
    io::Errno,
    process::{Pid, PidfdFlags, pidfd_open},
};
use tracer_ebpf::sites::Site;

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
    /// File offset of each probe site's NOP5, as checked.
    pub site_offsets: HashMap<Site, u64>,
}

/// The initial PID namespace's inode number (`PROC_PID_INIT_INO`, include/linux/proc_ns.h).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// The 5-byte NOP every probe site starts with (gateway/src/probe.rs).
pub const NOP5: [u8; 5] = [0x0f, 0x1f, 0x44, 0x00, 0x00];

impl Target {
    /// Checks that `pid` is a live process, seen with the kernel's own pids, whose binary has
    /// every probe site, each starting with the NOP5 the uprobe replaces.
    pub fn open(pid: u32) -> anyhow::Result<Self> {
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
            .custom_flags(libc::O_PATH)
            .open(&exe_link)
            .with_context(|| format!("opening {}", exe_link.display()))?
            .into();
        let exe = PathBuf::from(format!("/proc/self/fd/{}", exe_fd.as_raw_fd()));
        let data = fs::read(&exe).with_context(|| format!("reading {}", exe_name.display()))?;
        let missing = missing_sites_in(&data, &exe_name)?;
        if !missing.is_empty() {
            bail!(
                "pid {pid} runs {} which lacks {} of {} probe sites: {}",
                exe_name.display(),
                missing.len(),
                Site::ALL.len(),
                missing.join(", ")
            );
        }
        let mut site_offsets = HashMap::new();
        let file = fs::File::open(&exe).with_context(|| format!("opening {}", exe.display()))?;
        for site in Site::ALL {
            let offset = site_offset(&data, site.symbol())
                .with_context(|| format!("{} in {}", site.symbol(), exe_name.display()))?;
            check_nop5(&file, offset).with_context(|| {
                format!("probe site {} in {}", site.symbol(), exe_name.display())
            })?;
            site_offsets.insert(site, offset);
        }
        ensure_alive(&pidfd, pid)?;
        Ok(Target {
            pid,
            pidfd: Arc::new(pidfd),
            exe_fd: Arc::new(exe_fd),
            exe,
            exe_name,
            site_offsets,
        })
    }

    /// Whether the target has exited (its pidfd is readable).
    pub fn exited(&self) -> bool {
        exited(&self.pidfd)
    }

    pub fn tids(&self) -> anyhow::Result<Vec<u32>> {
        let dir = format!("/proc/{}/task", self.pid);
        let mut tids = Vec::new();
        for entry in fs::read_dir(&dir).with_context(|| format!("reading {dir}"))? {
            if let Ok(tid) = entry?.file_name().to_string_lossy().parse() {
                tids.push(tid);
            }
        }
        Ok(tids)
    }

    /// The CPUs any of its threads may run on now (the union of their `Cpus_allowed_list`).
    pub fn cpus_allowed(&self) -> anyhow::Result<Vec<u32>> {
        let mut cpus = Vec::new();
        for tid in self.tids()? {
            let path = format!("/proc/{}/task/{tid}/status", self.pid);
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
        cpus.sort_unstable();
        cpus.dedup();
        Ok(cpus)
    }

    /// Local ports of TCP sockets in LISTEN state that are open in this process.
    pub fn listen_ports(&self) -> anyhow::Result<Vec<u16>> {
        let inodes = socket_inodes(self.pid.get())?;
        let mut ports = Vec::new();
        for table in ["tcp", "tcp6"] {
            let path = format!("/proc/{}/net/{table}", self.pid);
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

/// Probe-site symbols absent from the ELF at `exe`.
pub fn missing_sites(exe: &Path) -> anyhow::Result<Vec<&'static str>> {
    let data = fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    missing_sites_in(&data, exe)
}

fn missing_sites_in(data: &[u8], exe: &Path) -> anyhow::Result<Vec<&'static str>> {
    let file = object::File::parse(data)
        .with_context(|| format!("{} is not an ELF binary", exe.display()))?;
    let names: HashSet<&str> = file
        .symbols()
        .chain(file.dynamic_symbols())
        .filter(|symbol| symbol.is_definition())
        .filter_map(|symbol| symbol.name().ok())
        .collect();
    Ok(Site::ALL
        .iter()
        .map(|site| site.symbol())
        .filter(|name| !names.contains(name))
        .collect())
}

/// The file offset of `symbol`'s first byte (where a uprobe on it goes).
fn site_offset(data: &[u8], symbol: &str) -> anyhow::Result<u64> {
    let file = object::File::parse(data)?;
    let sym = file
        .symbols()
        .chain(file.dynamic_symbols())
        .find(|s| s.is_definition() && s.name() == Ok(symbol))
        .context("symbol not defined")?;
    let index = sym.section_index().context("symbol has no section")?;
    let section = file.section_by_index(index)?;
    let (start, _) = section
        .file_range()
        .context("symbol's section has no bytes in the file")?;
    Ok(sym.address() - section.address() + start)
}

/// Refuses a site whose first bytes are not the NOP5: a binary whose symbol has another body
/// (an older gateway, a stripped or rebuilt one) would get a uprobe in the middle of code.
pub fn check_nop5(file: &fs::File, offset: u64) -> anyhow::Result<()> {
    let mut bytes = [0u8; NOP5.len()];
    file.read_exact_at(&mut bytes, offset)
        .with_context(|| format!("reading 5 bytes at file offset {offset:#x}"))?;
    if bytes != NOP5 {
        bail!(
            "file offset {offset:#x} holds {bytes:02x?} where a probe site has the NOP5 \
             {NOP5:02x?}"
        );
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
mod tests {
    use super::*;

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

    /// Issue 21 item 4: a site's bytes are checked, not only its symbol's name.
    #[test]
    fn item4_nop5_is_checked_at_the_site_offset() {
        let mut file = tempfile::tempfile().unwrap();
        std::io::Write::write_all(&mut file, &[0xc3, 0x0f, 0x1f, 0x44, 0x00, 0x00, 0xc3]).unwrap();
        check_nop5(&file, 1).unwrap();
        let err = check_nop5(&file, 0).unwrap_err().to_string();
        assert!(err.contains("0x0") && err.contains("c3"), "{err}");
        assert!(check_nop5(&file, 4).is_err(), "past the end");
    }

    /// Issue 21 items 2 and 4 on a live process: this test binary has no probe sites; it is
    /// opened by pidfd and refused for its sites, and a pid that is not running is refused
    /// as such.
    #[test]
    fn opening_a_process_without_sites_names_them() {
        let err = Target::open(std::process::id()).unwrap_err().to_string();
        assert!(err.contains("lacks"), "{err}");
        let err = Target::open(i32::MAX as u32).unwrap_err().to_string();
        assert!(err.contains("no process with pid"), "{err}");
    }

    #[test]
    fn sleep_lacks_every_site() {
        let sleep = Path::new("/bin/sleep");
        if sleep.exists() {
            assert_eq!(missing_sites(sleep).unwrap().len(), Site::ALL.len());
        }
    }
}
