//! One guest run: virtiofsd shares the host's root, QEMU boots the kernel under TCG (this
//! host's KVM is paravirtual and hangs a stock guest), and the serial console is logged, with
//! the guest's progress lines relayed, until the init prints its exit marker.

use std::{
    fs::File,
    io::{BufRead as _, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{Context as _, bail};

use super::initramfs::{EXIT_MARKER, TAG};

pub struct Guest<'a> {
    pub vmlinuz: &'a Path,
    pub initramfs: &'a Path,
    /// Run inside the guest's chroot of the host's root.
    pub script: &'a Path,
    pub virtiofsd: &'a Path,
    /// This run's own directory: virtiofsd's socket and log.
    pub run_dir: &'a Path,
    pub console_log: &'a Path,
    pub memory_mib: u32,
    pub cpus: u32,
    pub timeout: Duration,
}

/// A child killed and reaped when dropped.
struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Console lines shown on the terminal: the guest script's own progress and the tests'
/// summaries; everything is in the console log.
fn relayed(line: &str) -> bool {
    line.starts_with("vmtest:")
        || line.starts_with("e2e:")
        || line.starts_with("test result:")
        || line.starts_with("thread '")
}

impl Guest<'_> {
    /// Boots, runs the script, and returns its exit status.
    pub fn run(&self) -> anyhow::Result<i32> {
        let socket = self.run_dir.join("virtiofsd.sock");
        let _ = std::fs::remove_file(&socket);
        let log = self.run_dir.join("virtiofsd.log");
        let _virtiofsd = Killed(self.spawn_virtiofsd(&socket, &log)?);
        wait_until_exists(&socket, Duration::from_secs(10)).context("virtiofsd did not start")?;

        let mut qemu = self.qemu(&socket);
        let mut child = qemu
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("starting qemu-system-x86_64")?;
        let stdout = child.stdout.take().context("qemu's stdout")?;
        let stderr = child.stderr.take().context("qemu's stderr")?;
        let mut qemu = Killed(child);

        let (tx, rx) = mpsc::channel::<Option<String>>();
        let err_tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = tx.send(Some(line.trim_end_matches('\r').to_owned()));
            }
            let _ = tx.send(None);
        });
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                let _ = err_tx.send(Some(format!("qemu: {line}")));
            }
        });

        let mut log = File::create(self.console_log)
            .with_context(|| format!("creating {}", self.console_log.display()))?;
        let deadline = Instant::now() + self.timeout;
        let mut status = None;
        // The guest kernel's first BUG/Oops line and its panic line, if it crashed.
        let mut crash = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match rx.recv_timeout(left) {
                Ok(Some(line)) => {
                    writeln!(log, "{line}")?;
                    if crash.len() < 2 && is_crash(&line, crash.is_empty()) {
                        crash.push(line.clone());
                    }
                    if let Some(code) = line.strip_prefix(EXIT_MARKER) {
                        status = code.trim().parse::<i32>().ok();
                    } else if relayed(&line) || line.starts_with("qemu: ") {
                        eprintln!("{line}");
                    }
                }
                // The console closed: QEMU is exiting.
                Ok(None) | Err(mpsc::RecvTimeoutError::Disconnected) => break,
                Err(mpsc::RecvTimeoutError::Timeout) => bail!(
                    "the guest did not finish within {:?} (console: {})",
                    self.timeout,
                    self.console_log.display()
                ),
            }
        }
        let exit = qemu.0.wait().context("waiting for qemu")?;
        match status {
            Some(code) => Ok(code),
            None if !crash.is_empty() => bail!(
                "the guest kernel crashed: {}; console: {}",
                crash.join(" … "),
                self.console_log.display()
            ),
            None => bail!(
                "the guest stopped without an exit status (qemu {exit}); console: {}",
                self.console_log.display()
            ),
        }
    }

    fn spawn_virtiofsd(&self, socket: &Path, log: &Path) -> anyhow::Result<Child> {
        let mut command = Command::new(self.virtiofsd);
        command.arg(format!("--socket-path={}", socket.display()));
        // The C daemon of QEMU ≤ 7 takes -o options; the Rust one (Debian 13's `virtiofsd`)
        // takes long flags.
        if self.virtiofsd.starts_with("/usr/lib/qemu") {
            command.args(["-o", "source=/", "-o", "sandbox=chroot", "-o", "cache=auto"]);
        } else {
            command.args(["--shared-dir=/", "--sandbox=chroot", "--cache=auto"]);
        }
        let log = File::create(log).with_context(|| format!("creating {}", log.display()))?;
        command
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("starting {}", self.virtiofsd.display()))
    }

    fn qemu(&self, socket: &Path) -> Command {
        let memory = format!("{}M", self.memory_mib);
        let mut command = Command::new("qemu-system-x86_64");
        command
            // One host thread runs both vCPUs: with one each (multi-threaded TCG) the guest
            // livelocked on a stale int3 at a syscall's entry after fentry attach/detach
            // re-patched it (soft lockups in attach_events, 2 runs of 3); ~25% slower.
            .args(["-accel", "tcg,thread=single", "-cpu", "max"])
            .args(["-smp", &self.cpus.to_string(), "-m", &memory])
            // virtiofs maps guest memory into virtiofsd: it must be shared.
            .arg("-object")
            .arg(format!(
                "memory-backend-memfd,id=mem,size={memory},share=on"
            ))
            .args(["-numa", "node,memdev=mem"])
            .arg("-chardev")
            .arg(format!("socket,id=fs,path={}", socket.display()))
            .arg("-device")
            .arg(format!("vhost-user-fs-pci,chardev=fs,tag={TAG}"))
            .arg("-kernel")
            .arg(self.vmlinuz)
            .arg("-initrd")
            .arg(self.initramfs)
            .arg("-append")
            .arg(format!(
                "console=ttyS0 loglevel=5 panic=-1 softlockup_panic=1 vmtest.script={}",
                self.script.display()
            ))
            .args(["-nodefaults", "-display", "none", "-serial", "stdio"])
            .args(["-monitor", "none", "-no-reboot"]);
        command
    }
}

/// A kernel console line that says the guest kernel crashed: the first BUG or Oops (a soft
/// lockup among them: `softlockup_panic` makes it one), then the panic.
fn is_crash(line: &str, first: bool) -> bool {
    let text = line.split_once("] ").map_or(line, |(_, text)| text);
    if first {
        ["BUG:", "kernel BUG", "Oops", "watchdog: BUG:"]
            .iter()
            .any(|start| text.starts_with(start))
    } else {
        text.starts_with("Kernel panic")
    }
}

fn wait_until_exists(path: &Path, timeout: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !path.exists() {
        if Instant::now() > deadline {
            bail!("{} did not appear within {timeout:?}", path.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(())
}

/// The virtiofs daemon: QEMU 7's own, or Debian 13's `virtiofsd` package.
pub fn find_virtiofsd() -> Option<PathBuf> {
    ["/usr/libexec/virtiofsd", "/usr/lib/qemu/virtiofsd"]
        .into_iter()
        .map(PathBuf::from)
        .find(|path| path.is_file())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_crash_is_its_first_bug_line_then_the_panic() {
        let console = [
            "test sigint_detaches ... [  207.69] BUG: kernel NULL pointer dereference, address: 0",
            "[  207.69] Oops: 0010 [#1] PREEMPT SMP NOPTI",
            "[  318.54] kernel BUG at arch/x86/kernel/kprobes/core.c:917!",
            "vmtest: e2e_gateway --attach kprobe: ok in 33s",
            "[  318.54] Kernel panic - not syncing: Fatal exception in interrupt",
        ];
        let mut crash: Vec<&str> = Vec::new();
        for line in console {
            if crash.len() < 2 && is_crash(line, crash.is_empty()) {
                crash.push(line);
            }
        }
        assert_eq!(crash, [console[0], console[4]]);
        let lockup =
            "[  216.81] watchdog: BUG: soft lockup - CPU#1 stuck for 44s! [stacks_are_not_:261]";
        assert!(is_crash(lockup, true));
    }
}
