//! The process we trace: that it exists, that its binary has the probe sites, which TCP ports
//! it listens on, and which threads it has.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    fs,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use object::{Endianness, Object as _, ObjectSymbol as _, read::elf::ElfFile64};
use tracer_ebpf::sites::{NOP5, Site, USDT_PROVIDER};

use super::usdt;

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: NonZeroU32,
    /// `/proc/PID/exe`: uprobes attach through it, so a binary replaced on disk still works.
    pub exe: PathBuf,
    /// Where each probe site is in `exe`.
    pub sites: SiteOffsets,
}

impl Target {
    /// Checks that `pid` is a live process whose binary has every probe site, each starting
    /// with the NOP5.
    pub fn open(pid: u32) -> anyhow::Result<Self> {
        let pid = NonZeroU32::new(pid).context("--pid 0 is not a process")?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if !proc_dir.exists() {
            bail!("no process with pid {pid}");
        }
        let exe = proc_dir.join("exe");
        let real = fs::read_link(&exe).unwrap_or_else(|_| exe.clone());
        let sites = SiteOffsets::find(&exe)
            .with_context(|| format!("pid {pid} runs {}", real.display()))?;
        let missing = sites.missing();
        if !missing.is_empty() {
            let looked = match sites.found_by {
                FoundBy::Notes => format!("in its `{USDT_PROVIDER}` stapsdt notes"),
                FoundBy::Symbols => {
                    format!("(it has no `{USDT_PROVIDER}` stapsdt notes; looked for symbols)")
                }
            };
            bail!(
                "pid {pid} runs {} which lacks {} of {} probe sites {looked}: {}",
                real.display(),
                missing.len(),
                Site::ALL.len(),
                missing.join(", ")
            );
        }
        Ok(Target { pid, exe, sites })
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

    #[test]
    fn refuses_a_site_that_does_not_start_with_the_nop5() {
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
