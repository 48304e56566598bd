//! Root only where it is needed. xtask builds and runs everything as whoever ran it; the one
//! step that needs root (the tracer: eBPF programs, uprobes, perf events) goes through
//! `sudo` when that user is not root, the way aya's template runs its binary through a
//! `sudo -E` runner (without `-E`: the tracer needs none of the user's environment, and its
//! path is absolute, so sudo's secure_path does not matter). Run as root (CI, a VM), nothing
//! changes.
//!
//! Under sudo the tracer hands its own outputs to SUDO_UID; after it stops, whatever in its
//! output directory is still not the user's (a log, a file of an older tracer) is handed back
//! too (`sudo chown -R`), so nothing root-owned is left in the user's tree.

use std::ffi::OsString;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail, ensure};
use rustix::process::{self, Pid, Signal};

/// How the privileged step runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Runner {
    /// xtask is root already: the tracer runs as its plain child.
    Root,
    /// xtask runs as this user; the tracer runs under `sudo -n`.
    Sudo { uid: u32, gid: u32 },
}

impl Runner {
    pub fn detect() -> Runner {
        if process::geteuid().is_root() {
            Runner::Root
        } else {
            Runner::Sudo {
                uid: process::getuid().as_raw(),
                gid: process::getgid().as_raw(),
            }
        }
    }

    /// Before anything starts: under sudo, asks for the password once on the terminal
    /// (`sudo -v`), so that a missing sudo or a refused user fails before the builds. `why`
    /// names the command.
    pub fn authorize(self, why: &str) -> anyhow::Result<()> {
        if self == Runner::Root {
            return Ok(());
        }
        eprintln!("xtask: {why} runs the tracer as root through sudo; everything else runs as you");
        self.refresh()
            .with_context(|| format!("{why} needs root for the tracer"))
    }

    /// Under sudo: `sudo -v` again, right before the tracer starts with `sudo -n` (which never
    /// prompts). A first build can outlast sudo's credential cache; then this asks again, on the
    /// terminal, instead of the tracer failing unseen.
    pub fn refresh(self) -> anyhow::Result<()> {
        if self == Runner::Root {
            return Ok(());
        }
        let status = Command::new("sudo")
            .arg("-v")
            .status()
            .context("running sudo (install it, or run xtask as root)")?;
        ensure!(status.success(), "`sudo -v` failed ({status})");
        Ok(())
    }

    /// `program` with root, for a step that may ask for sudo's password on the terminal
    /// (`cargo xtask setup`'s apt-get).
    pub fn command(self, program: &str) -> Command {
        match self {
            Runner::Root => Command::new(program),
            Runner::Sudo { .. } => {
                let mut command = Command::new("sudo");
                command.args(["--", program]);
                command
            }
        }
    }

    /// `program args` with root: as given, or `sudo -n -- program args`.
    pub fn command_line(self, program: &Path, args: &[String]) -> (PathBuf, Vec<OsString>) {
        let args = args.iter().map(OsString::from);
        match self {
            Runner::Root => (program.to_owned(), args.collect()),
            Runner::Sudo { .. } => {
                let mut line: Vec<OsString> = vec!["-n".into(), "--".into(), program.into()];
                line.extend(args);
                (PathBuf::from("sudo"), line)
            }
        }
    }

    /// Sends `signal` to `pid`, a process that runs with root under this runner.
    pub fn kill(self, pid: u32, signal: Signal) -> anyhow::Result<()> {
        match self {
            Runner::Root => {
                let target = i32::try_from(pid)
                    .ok()
                    .and_then(Pid::from_raw)
                    .with_context(|| format!("{pid} is no pid"))?;
                process::kill_process(target, signal)
                    .with_context(|| format!("signalling pid {pid}"))
            }
            Runner::Sudo { .. } => {
                let status = Command::new("sudo")
                    .args(["-n", "kill", "-s", &signal.as_raw().to_string()])
                    .arg(pid.to_string())
                    .stdin(Stdio::null())
                    .status()
                    .context("running sudo kill")?;
                ensure!(
                    status.success(),
                    "sudo kill {} {pid} failed ({status})",
                    signal.as_raw()
                );
                Ok(())
            }
        }
    }

    /// Under sudo: gives the user whatever in `dir` is not theirs (the tracer's files), and
    /// checks that nothing is left. As root: nothing to do.
    pub fn hand_back(self, dir: &Path) -> anyhow::Result<()> {
        let Runner::Sudo { uid, gid } = self else {
            return Ok(());
        };
        if not_owned_by(dir, uid)?.is_empty() {
            return Ok(());
        }
        let status = Command::new("sudo")
            .args(["-n", "chown", "-R", &format!("{uid}:{gid}"), "--"])
            .arg(dir)
            .stdin(Stdio::null())
            .status()
            .context("running sudo chown")?;
        ensure!(
            status.success(),
            "sudo chown -R {uid}:{gid} {} failed ({status})",
            dir.display()
        );
        let left = not_owned_by(dir, uid)?;
        if !left.is_empty() {
            bail!(
                "after chown, {} of {} are still not yours: {}",
                left.len(),
                dir.display(),
                left[0].display()
            );
        }
        Ok(())
    }
}

/// Every path under `dir` (itself included) whose owner is not `uid`.
pub fn not_owned_by(dir: &Path, uid: u32) -> anyhow::Result<Vec<PathBuf>> {
    let mut found = Vec::new();
    let mut pending = vec![dir.to_owned()];
    while let Some(path) = pending.pop() {
        let meta = std::fs::symlink_metadata(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        if meta.uid() != uid {
            found.push(path.clone());
        }
        if meta.is_dir() {
            for entry in
                std::fs::read_dir(&path).with_context(|| format!("listing {}", path.display()))?
            {
                pending.push(entry?.path());
            }
        }
    }
    Ok(found)
}

/// The pid of the first process named `comm` among `ancestor`'s descendants: the tracer that
/// `sudo` (and, with `use_pty`, sudo's monitor) started.
pub fn descendant_named(ancestor: u32, comm: &str) -> Option<u32> {
    let parents = crate::procstat::comm_ppid_all();
    let is_descendant = |mut pid: u32| {
        // Bounded: a pid reused mid-walk cannot loop forever.
        for _ in 0..parents.len() {
            match parents.iter().find(|(p, ..)| *p == pid) {
                Some((_, ppid, _)) if *ppid == ancestor => return true,
                Some((_, ppid, _)) if *ppid > 1 => pid = *ppid,
                _ => return false,
            }
        }
        false
    };
    parents
        .iter()
        .find(|(pid, _, name)| name == comm && is_descendant(*pid))
        .map(|(pid, ..)| *pid)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_runs_the_tracer_as_given_and_a_user_through_sudo_n() {
        let tracer = Path::new("/w/target/release/tracer");
        let args = ["record".to_owned(), "--pid".to_owned(), "42".to_owned()];
        assert_eq!(
            Runner::Root.command_line(tracer, &args),
            (tracer.to_owned(), args.iter().map(OsString::from).collect())
        );
        let (program, line) = Runner::Sudo {
            uid: 1000,
            gid: 1000,
        }
        .command_line(tracer, &args);
        assert_eq!(program, Path::new("sudo"));
        // -n: never prompt (xtask asked once, up front); an absolute path: sudo's
        // secure_path does not hold ~/.cargo/bin or target/.
        assert_eq!(
            line,
            [
                "-n",
                "--",
                "/w/target/release/tracer",
                "record",
                "--pid",
                "42"
            ]
            .map(OsString::from)
        );
    }

    #[test]
    fn files_of_another_owner_are_found() {
        let dir = tempfile::tempdir().unwrap();
        let nested = dir.path().join("flame");
        std::fs::create_dir(&nested).unwrap();
        std::fs::write(nested.join("stacks.folded"), "x").unwrap();
        let me = std::fs::metadata(dir.path()).unwrap().uid();
        assert!(not_owned_by(dir.path(), me).unwrap().is_empty());
        let mut found = not_owned_by(dir.path(), me + 1).unwrap();
        found.sort();
        assert_eq!(
            found,
            [
                dir.path().to_owned(),
                nested.clone(),
                nested.join("stacks.folded")
            ]
        );
        assert!(not_owned_by(&dir.path().join("missing"), me).is_err());
    }

    /// The throwaway user's side of [`a_user_runs_only_the_tracer_as_root`].
    const USER_SIDE: &str = "privilege::tests::user_side_of_the_sudo_test";
    const DIR_VAR: &str = "XTASK_SUDO_TEST_DIR";
    /// Set when the user's side runs in a terminal.
    const TERMINAL_VAR: &str = "XTASK_SUDO_TEST_TERMINAL";

    #[test]
    #[ignore = "run as a throwaway user by a_user_runs_only_the_tracer_as_root"]
    fn user_side_of_the_sudo_test() {
        let dir = PathBuf::from(std::env::var_os(DIR_VAR).expect(DIR_VAR));
        let runner = Runner::detect();
        assert!(matches!(runner, Runner::Sudo { .. }), "{runner:?}");
        let out = dir.join("out");
        std::fs::create_dir(&out).unwrap();
        let logs = dir.join("logs");
        std::fs::create_dir(&logs).unwrap();
        let args = [
            "record".to_owned(),
            "--out".to_owned(),
            out.display().to_string(),
        ];
        let mut tracer =
            crate::procs::start_tracer(&dir.join("tracer"), None, &args, &logs).unwrap();
        assert_ne!(
            tracer.pid(),
            tracer.proc.pid(),
            "the tracer runs under sudo"
        );
        // In a terminal, sudo's monitor process sits between sudo and the tracer.
        let stat = procfs::process::Process::new(tracer.pid() as i32)
            .and_then(|process| process.stat())
            .unwrap();
        let parent = stat.ppid as u32;
        let terminal = std::env::var_os(TERMINAL_VAR).is_some();
        assert_eq!(
            parent == tracer.proc.pid(),
            !terminal,
            "terminal: {terminal}"
        );
        tracer.stop().unwrap();
    }

    /// Root only (sudo is installed with apt-get when missing): a throwaway user with
    /// password-less sudo starts a stand-in tracer the way profile and validate do. The tracer
    /// runs as root, xtask as the user, and the tracer's files end up the user's.
    #[test]
    fn a_user_runs_only_the_tracer_as_root() {
        // SAFETY: no preconditions.
        if !process::geteuid().is_root() {
            eprintln!("SKIPPED a_user_runs_only_the_tracer_as_root: needs root (useradd)");
            return;
        }
        if crate::install::find_in_path("sudo").is_none() {
            crate::install::apt_install(&["sudo"], false).expect("installing sudo");
        }
        let user = ThrowawayUser::create();
        // Debian's sudoers has `use_pty`: in a terminal the tracer runs below sudo's monitor
        // process, on a pty of its own. `script` gives the user's side a terminal.
        for terminal in [false, true] {
            if terminal && crate::install::find_in_path("script").is_none() {
                eprintln!("SKIPPED the terminal case: no `script` (util-linux)");
                continue;
            }
            user_side_as(&user, terminal);
        }
    }

    fn user_side_as(user: &ThrowawayUser, terminal: bool) {
        let dir = tempfile::tempdir().unwrap();
        let script = "#!/bin/sh\n\
            out=\"$3\"\n\
            id -u > \"$out/tracer-uid\"\n\
            mkdir \"$out/flame\" && echo x > \"$out/flame/stacks.folded\"\n\
            trap 'echo done > \"$out/report.txt\"; exit 0' INT\n\
            echo 'tracer: program ids 1' >&2\n\
            while :; do sleep 0.05; done\n";
        let tracer = dir.path().join("tracer");
        std::fs::write(&tracer, script).unwrap();
        std::fs::set_permissions(&tracer, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .unwrap();
        std::os::unix::fs::chown(dir.path(), Some(user.uid), Some(user.gid)).unwrap();

        let line = format!(
            "setpriv --reuid {} --regid {} --clear-groups -- {} --exact {USER_SIDE} --ignored \
             --nocapture",
            user.uid,
            user.gid,
            std::env::current_exe().unwrap().display()
        );
        let mut command = if terminal {
            let mut command = Command::new("script");
            command
                .args(["-qec", &line, "/dev/null"])
                .env(TERMINAL_VAR, "1");
            command
        } else {
            let mut command = Command::new("sh");
            command.args(["-c", &line]);
            command
        };
        let status = command.env(DIR_VAR, dir.path()).status().unwrap();
        assert!(
            status.success(),
            "the user's side failed ({status}), terminal: {terminal}"
        );

        let out = dir.path().join("out");
        assert_eq!(
            std::fs::read_to_string(out.join("tracer-uid"))
                .unwrap()
                .trim(),
            "0",
            "the tracer ran as root"
        );
        assert_eq!(
            std::fs::read_to_string(out.join("report.txt")).unwrap(),
            "done\n"
        );
        // The session and the logs are the user's; only the stand-in script is root's.
        for dir in [out, dir.path().join("logs")] {
            assert_eq!(not_owned_by(&dir, user.uid).unwrap(), Vec::<PathBuf>::new());
        }
    }

    /// A system user with password-less sudo, removed (with its sudoers file) on drop.
    struct ThrowawayUser {
        name: String,
        uid: u32,
        gid: u32,
        sudoers: PathBuf,
    }

    impl ThrowawayUser {
        fn create() -> ThrowawayUser {
            let name = format!("xtask-sudo-{}", std::process::id());
            let status = Command::new("useradd")
                .args([
                    "--system",
                    "--no-create-home",
                    "--shell",
                    "/usr/sbin/nologin",
                    &name,
                ])
                .status()
                .unwrap();
            assert!(status.success(), "useradd {name}");
            let id = |flag: &str| -> u32 {
                let out = Command::new("id").args([flag, &name]).output().unwrap();
                String::from_utf8_lossy(&out.stdout).trim().parse().unwrap()
            };
            let (uid, gid) = (id("-u"), id("-g"));
            let sudoers = PathBuf::from(format!("/etc/sudoers.d/{name}"));
            let user = ThrowawayUser {
                name,
                uid,
                gid,
                sudoers,
            };
            std::fs::write(
                &user.sudoers,
                format!("{} ALL=(root) NOPASSWD: ALL\n", user.name),
            )
            .unwrap();
            std::fs::set_permissions(
                &user.sudoers,
                std::os::unix::fs::PermissionsExt::from_mode(0o440),
            )
            .unwrap();
            user
        }
    }

    impl Drop for ThrowawayUser {
        fn drop(&mut self) {
            let _ = std::fs::remove_file(&self.sudoers);
            let _ = Command::new("userdel").arg(&self.name).status();
        }
    }

    #[test]
    fn a_grandchild_is_found_by_name() {
        let child = testproc::Spawn::new("sh", "sh")
            .args(["-c", "sh -c 'sleep 30' & wait"])
            .start()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
        let found = loop {
            if let Some(pid) = descendant_named(child.pid(), "sleep") {
                break pid;
            }
            assert!(std::time::Instant::now() < deadline, "no sleep under sh");
            std::thread::sleep(std::time::Duration::from_millis(10));
        };
        assert_ne!(found, child.pid());
        assert_eq!(descendant_named(child.pid(), "no-such-name"), None);
        Runner::Root.kill(found, Signal::KILL).unwrap();
    }
}
