//! The process we trace: that it exists, that its binary has the probe sites, which TCP ports
//! it listens on, and which threads it has.

use std::{
    collections::HashSet,
    fs,
    num::NonZeroU32,
    path::{Path, PathBuf},
};

use anyhow::{Context as _, bail};
use object::{Object as _, ObjectSymbol as _};
use tracer_ebpf::sites::Site;

#[derive(Clone, Debug)]
pub struct Target {
    pub pid: NonZeroU32,
    /// `/proc/PID/exe`: uprobes attach through it, so a binary replaced on disk still works.
    pub exe: PathBuf,
}

impl Target {
    /// Checks that `pid` is a live process whose binary has every probe site.
    pub fn open(pid: u32) -> anyhow::Result<Self> {
        let pid = NonZeroU32::new(pid).context("--pid 0 is not a process")?;
        let proc_dir = PathBuf::from(format!("/proc/{pid}"));
        if !proc_dir.exists() {
            bail!("no process with pid {pid}");
        }
        let exe = proc_dir.join("exe");
        let missing = missing_sites(&exe)?;
        if !missing.is_empty() {
            let real = fs::read_link(&exe).unwrap_or_else(|_| exe.clone());
            bail!(
                "pid {pid} runs {} which lacks {} of {} probe sites: {}",
                real.display(),
                missing.len(),
                Site::ALL.len(),
                missing.join(", ")
            );
        }
        Ok(Target { pid, exe })
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

/// Probe-site symbols absent from the ELF at `exe`.
pub fn missing_sites(exe: &Path) -> anyhow::Result<Vec<&'static str>> {
    let data = fs::read(exe).with_context(|| format!("reading {}", exe.display()))?;
    let file = object::File::parse(&*data)
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

    #[test]
    fn sleep_lacks_every_site() {
        let sleep = Path::new("/bin/sleep");
        if sleep.exists() {
            assert_eq!(missing_sites(sleep).unwrap().len(), Site::ALL.len());
        }
    }
}
