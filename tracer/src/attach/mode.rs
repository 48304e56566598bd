//! Exact or kernel-only: decided here, once, from the `--pid` targets' binaries and
//! `--kernel-only`.
//!
//! - **Exact**: one target whose binary has every probe site (the gateway): uprobes on the
//!   sites, SYSCALL events, the rebuild of `requests/`.
//! - **Kernel-only** (issue 20): one or more processes without probe sites (nginx, haproxy,
//!   caddy), or any with `--kernel-only`. The targets are every `--pid` and its descendant
//!   processes (TGIDS, followed across fork by the kernel); no uprobes; the data syscalls write
//!   DATA records with their first bytes (`events::data::Data`).

use std::fmt;

use anyhow::bail;

use super::target::{Target, descendants_of, listen_ports_of, tids_of};

/// How a session traces, for the rest of the tracer (record.rs reads it).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Mode {
    Exact,
    /// `reason` says why, for the startup line: the binary that lacks the sites, or
    /// `--kernel-only`.
    KernelOnly {
        reason: String,
    },
}

impl Mode {
    pub fn is_kernel_only(&self) -> bool {
        matches!(self, Mode::KernelOnly { .. })
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Mode::Exact => write!(f, "exact"),
            Mode::KernelOnly { reason } => write!(f, "kernel-only ({reason})"),
        }
    }
}

/// What mode selection needs of one target: its pid, binary, and what it lacks
/// ([`Target::missing_sites`]; `None`: it has every site).
#[derive(Clone, Debug)]
pub struct SitesOf {
    pub pid: u32,
    pub exe: String,
    pub missing: Option<String>,
    /// How many sites it lacks, of how many.
    pub lacking: (usize, usize),
}

impl SitesOf {
    pub fn of(target: &Target) -> SitesOf {
        SitesOf {
            pid: target.pid.get(),
            exe: target.exe_name.display().to_string(),
            missing: target.missing_sites(),
            lacking: (
                target.sites.missing().len(),
                tracer_ebpf::sites::Site::ALL.len(),
            ),
        }
    }
}

/// The one place the mode is chosen: a target that lacks probe sites → kernel-only (saying
/// which); all have them → exact, unless `--kernel-only`; several in exact mode → an error.
pub fn choose(targets: &[SitesOf], kernel_only: bool) -> anyhow::Result<Mode> {
    if targets.is_empty() {
        bail!("no --pid given");
    }
    if let Some(without) = targets.iter().find(|t| t.missing.is_some()) {
        let (lacking, of) = without.lacking;
        let what = if lacking == of {
            "has no probe sites".to_owned()
        } else {
            format!("lacks {lacking} of {of} probe sites")
        };
        return Ok(Mode::KernelOnly {
            reason: format!("pid {} runs {}, which {what}", without.pid, without.exe),
        });
    }
    if kernel_only {
        return Ok(Mode::KernelOnly {
            reason: "--kernel-only".to_owned(),
        });
    }
    if targets.len() > 1 {
        let pids: Vec<String> = targets.iter().map(|t| t.pid.to_string()).collect();
        bail!(
            "--pid {} all run a binary with the probe sites: exact mode traces one process; \
             give one --pid, or add --kernel-only to trace them all without the sites",
            pids.join(", --pid ")
        );
    }
    Ok(Mode::Exact)
}

/// Opens every `--pid` (a missing or gone one fails as in exact mode) and chooses the mode.
pub fn open(pids: &[u32], kernel_only: bool) -> anyhow::Result<(Vec<Target>, Mode)> {
    let mut targets = Vec::new();
    for &pid in pids {
        if targets.iter().any(|t: &Target| t.pid.get() == pid) {
            bail!("--pid {pid} given twice");
        }
        targets.push(Target::open_any(pid)?);
    }
    let sites: Vec<SitesOf> = targets.iter().map(SitesOf::of).collect();
    let mode = choose(&sites, kernel_only)?;
    if let Mode::KernelOnly { reason } = &mode
        && listen_ports_of(&Seed::tgids(&targets))?.is_empty()
    {
        let sites: Vec<String> = targets.iter().filter_map(Target::missing_sites).collect();
        bail!(
            "kernel-only mode ({reason}) follows HTTP/1.1 servers and proxies, and these \
             processes listen on no TCP port: nothing to trace{}",
            if sites.is_empty() {
                String::new()
            } else {
                format!(
                    ". The exact mode needs the probe sites: {}",
                    sites.join("; ")
                )
            }
        );
    }
    Ok((targets, mode))
}

/// Kernel-only mode's processes and threads at attach: every target and its descendants.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Seed {
    /// Each target's pid, then the descendants found (TGIDS).
    pub tgids: Vec<u32>,
    /// Every thread of those (TIDS).
    pub tids: Vec<u32>,
}

impl Seed {
    /// Reads /proc now. A process that exits meanwhile is left out (the kernel's exit
    /// program would have removed it anyway).
    pub fn read(targets: &[Target]) -> Seed {
        let tgids = Self::tgids(targets);
        let mut tids = Vec::new();
        for &tgid in &tgids {
            if let Ok(of) = tids_of(tgid) {
                tids.extend(of);
            }
        }
        Seed { tgids, tids }
    }

    /// The targets and their descendant processes now, each once, without their threads.
    pub fn tgids(targets: &[Target]) -> Vec<u32> {
        let mut tgids = Vec::new();
        for target in targets {
            let pid = target.pid.get();
            for tgid in std::iter::once(pid).chain(descendants_of(pid)) {
                if !tgids.contains(&tgid) {
                    tgids.push(tgid);
                }
            }
        }
        tgids
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(pid: u32, lacking: usize) -> SitesOf {
        SitesOf {
            pid,
            exe: format!("/bin/p{pid}"),
            missing: (lacking > 0).then(|| format!("lacks {lacking}")),
            lacking: (lacking, 9),
        }
    }

    #[test]
    fn a_binary_without_sites_is_kernel_only_and_says_why() {
        let mode = choose(&[with(7, 9)], false).unwrap();
        assert_eq!(
            mode,
            Mode::KernelOnly {
                reason: "pid 7 runs /bin/p7, which has no probe sites".to_owned()
            }
        );
        assert_eq!(
            mode.to_string(),
            "kernel-only (pid 7 runs /bin/p7, which has no probe sites)"
        );
        let partial = choose(&[with(1, 0), with(8, 3)], false).unwrap();
        assert_eq!(
            partial,
            Mode::KernelOnly {
                reason: "pid 8 runs /bin/p8, which lacks 3 of 9 probe sites".to_owned()
            }
        );
    }

    #[test]
    fn sites_are_exact_unless_forced_and_several_exact_are_refused() {
        assert_eq!(choose(&[with(1, 0)], false).unwrap(), Mode::Exact);
        assert_eq!(
            choose(&[with(1, 0)], true).unwrap(),
            Mode::KernelOnly {
                reason: "--kernel-only".to_owned()
            }
        );
        assert!(
            choose(&[with(1, 0), with(2, 0)], true)
                .unwrap()
                .is_kernel_only()
        );
        let err = choose(&[with(1, 0), with(2, 0)], false)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("--pid 1, --pid 2") && err.contains("--kernel-only"),
            "{err}"
        );
        assert!(choose(&[], false).is_err());
    }

    /// A live process tree: `sh` forks `sleep`; both are found and seeded.
    #[test]
    fn seeds_a_process_and_its_descendants() {
        let mut sh = std::process::Command::new("sh")
            .args(["-c", "sleep 30 & sleep 30; wait"])
            .spawn()
            .unwrap();
        let pid = sh.id();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut found = Vec::new();
        while found.len() < 2 && std::time::Instant::now() < deadline {
            found = descendants_of(pid);
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        let target = Target::open_any(pid);
        let seed = target
            .as_ref()
            .ok()
            .map(|t| Seed::read(std::slice::from_ref(t)));
        let _ = sh.kill();
        let _ = sh.wait();
        for child in &found {
            let _ = rustix::process::kill_process(
                rustix::process::Pid::from_raw(*child as i32).unwrap(),
                rustix::process::Signal::KILL,
            );
        }
        assert_eq!(found.len(), 2, "{found:?}");
        let target = target.unwrap();
        assert!(target.missing_sites().is_some());
        assert!(SitesOf::of(&target).missing.is_some());
        let seed = seed.unwrap();
        assert_eq!(seed.tgids[0], pid);
        for child in &found {
            assert!(
                seed.tgids.contains(child) && seed.tids.contains(child),
                "{seed:?}"
            );
        }
    }
}
