//! The processes of a measurement session: release binaries built once, children pinned to
//! CPUs (a `taskset -c` list, applied with sched_setaffinity before exec), readiness checks, and
//! stop-and-reap on drop so an error (or a dying xtask: `PR_SET_PDEATHSIG`) never leaves a
//! gateway or upstream running. Each child is a [`testproc::Proc`], the fixture the tests use.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
use rustix::process::{Pid, Signal, kill_process};

use testproc::proxy::Proxy;

use crate::privilege::Runner;

/// How long a server may take to print `listening on` and answer `/healthz`.
const READY_TIMEOUT: Duration = Duration::from_secs(20);
/// How long a SIGTERM'd child gets to exit before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(3);
/// The line the tracer prints once every program is attached.
const TRACER_READY: &str = "tracer: program ids";
/// Calibration and attach, before the ready line.
const TRACER_READY_TIMEOUT: Duration = Duration::from_secs(120);
/// Draining, rebuilding, symbolizing and drawing after the stop signal.
const TRACER_FINISH_TIMEOUT: Duration = Duration::from_secs(300);

/// Executables from one `cargo build --release`, by file name.
pub struct Executables(Vec<PathBuf>);

impl Executables {
    pub fn find(&self, name: &str) -> anyhow::Result<PathBuf> {
        self.0
            .iter()
            .find(|path| path.file_name().is_some_and(|file| file == name))
            .cloned()
            .with_context(|| format!("cargo build produced no `{name}` binary"))
    }
}

/// `cargo build --release ARGS`, reading the executables' paths from cargo's JSON messages
/// (so `CARGO_TARGET_DIR` and config are honoured). Cargo's own lines go to a log under
/// `target/xtask-logs/`: a build prints one line when it starts compiling (one with nothing to
/// do prints nothing), and a failed one quotes the log's end.
pub fn cargo_build_release(args: &[&str]) -> anyhow::Result<Executables> {
    cargo_build_release_in(&crate::workspace::root(), None, args)
}

/// [`cargo_build_release`] of the workspace at `dir`, into `target_dir` if given.
pub fn cargo_build_release_in(
    dir: &Path,
    target_dir: Option<&Path>,
    args: &[&str],
) -> anyhow::Result<Executables> {
    // The `-p` packages name the log.
    let packages: Vec<&str> = args
        .windows(2)
        .filter(|pair| pair[0] == "-p")
        .map(|pair| pair[1])
        .collect();
    let log = crate::workspace::log_dir()?.join(format!("build-{}.log", packages.join("-")));
    let mut log_file = File::create(&log).with_context(|| format!("creating {}", log.display()))?;
    let announce = format!(
        "xtask: building release binaries ({}; a first build takes minutes); log: {}",
        packages.join(", "),
        log.display()
    );
    let mut command = Command::new(env!("CARGO"));
    if let Some(target_dir) = target_dir {
        command.env("CARGO_TARGET_DIR", target_dir);
    }
    let mut child = command
        .current_dir(dir)
        .args(["build", "--release"])
        .args(args)
        .args(["--message-format", "json-render-diagnostics"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("running cargo build")?;
    let stderr = child.stderr.take().context("cargo's stderr")?;
    let relay = std::thread::spawn(move || {
        let mut announced = false;
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if !announced && line.trim_start().starts_with("Compiling") {
                eprintln!("{announce}");
                announced = true;
            }
            let _ = writeln!(log_file, "{line}");
        }
    });
    let mut stdout = Vec::new();
    child
        .stdout
        .take()
        .context("cargo's stdout")?
        .read_to_end(&mut stdout)
        .context("reading cargo's messages")?;
    let status = child.wait().context("waiting for cargo build")?;
    let _ = relay.join();
    ensure!(
        status.success(),
        "cargo build --release {} failed ({status}); the end of {}:\n{}",
        args.join(" "),
        log.display(),
        crate::workspace::log_tail(&log, 40)
    );
    Ok(Executables(
        stdout
            .split(|&b| b == b'\n')
            .filter_map(|line| serde_json::from_slice::<CargoMessage>(line).ok())
            .filter_map(|message| message.executable)
            .collect(),
    ))
}

/// The part of a `cargo build --message-format=json` line read here: an artifact's executable.
#[derive(serde::Deserialize)]
struct CargoMessage {
    executable: Option<PathBuf>,
}

/// The release binaries of a session.
#[derive(Clone)]
pub struct Binaries {
    pub gateway: PathBuf,
    pub mock_upstream: PathBuf,
    pub loadgen: PathBuf,
}

impl Binaries {
    pub fn build() -> anyhow::Result<Self> {
        let built = cargo_build_release(&["-p", "gateway", "-p", "loadgen"])?;
        Ok(Binaries {
            gateway: built.find("gateway")?,
            mock_upstream: built.find("mock-upstream")?,
            loadgen: built.find("loadgen")?,
        })
    }
}

/// A child process, killed and reaped when dropped (a [`testproc::Proc`]). Its stdout and
/// stderr go to `log_dir/NAME.log`, quoted when something fails.
pub struct Proc {
    pub name: String,
    /// The CPU list it was pinned to, if any.
    pub cpus: Option<String>,
    inner: testproc::Proc,
}

impl Proc {
    /// Starts `program args`, on the CPUs of `cpus` when given. The child gets SIGKILL if xtask
    /// dies first.
    pub fn spawn(
        name: &str,
        cpus: Option<&str>,
        program: &Path,
        args: &[String],
        log_dir: &Path,
    ) -> anyhow::Result<Proc> {
        Proc::start(
            name,
            testproc::Spawn::new(name, program).args(args),
            cpus,
            log_dir,
        )
    }

    /// Starts a child built by the caller (a proxy's [`testproc::proxy::Proxy::spawn`]) as
    /// [`Proc::spawn`] starts a program: on the CPUs of `cpus`, its output in
    /// `log_dir/NAME.log`.
    pub fn start(
        name: &str,
        spawn: testproc::Spawn,
        cpus: Option<&str>,
        log_dir: &Path,
    ) -> anyhow::Result<Proc> {
        let inner = spawn
            .cpus(cpus)
            .log(log_dir.join(format!("{name}.log")))
            .grace(STOP_GRACE)
            .start()?;
        Ok(Proc {
            name: name.to_owned(),
            cpus: cpus.map(str::to_owned),
            inner,
        })
    }

    pub fn pid(&self) -> u32 {
        self.inner.pid()
    }

    /// The CPUs the kernel lets it run on (`Cpus_allowed_list`), to record the pinning as
    /// applied rather than as asked.
    pub fn cpus_allowed(&self) -> anyhow::Result<String> {
        cpus_allowed(self.pid())
    }

    /// Waits for its first line starting with `listening on ` and returns the address.
    fn wait_listening(&mut self) -> anyhow::Result<String> {
        self.inner.wait_for_prefix("listening on ", READY_TIMEOUT)
    }

    /// Waits for it to exit; kills it past `timeout`.
    pub fn wait_timeout(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        self.inner.wait_timeout(timeout)
    }

    /// SIGTERM, then SIGKILL after a grace period; reaps it either way.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        if self.inner.stop()?.1 == testproc::Stopped::Killed {
            eprintln!(
                "xtask: {} ignored SIGTERM for {STOP_GRACE:?}; killed",
                self.name
            );
        }
        Ok(())
    }

    /// The end of its output, for error messages.
    pub fn log_tail(&self) -> String {
        self.inner.tail()
    }

    fn ensure_running(&mut self) -> anyhow::Result<()> {
        if let Some(status) = self.inner.try_wait()? {
            bail!("{} exited ({status}){}", self.name, self.log_tail());
        }
        Ok(())
    }
}

/// `Cpus_allowed_list` of a process.
fn cpus_allowed(pid: u32) -> anyhow::Result<String> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))?;
    status
        .lines()
        .find_map(|line| line.strip_prefix("Cpus_allowed_list:"))
        .map(|list| list.trim().to_owned())
        .context("no Cpus_allowed_list in /proc/PID/status")
}

/// A running `tracer record`, attached: started by [`start_tracer`], ended by
/// [`TracerProc::stop`] (or killed on drop, like any [`Proc`]).
pub struct TracerProc {
    /// The tracer, or the `sudo` that runs it.
    pub proc: Proc,
    /// The tracer's own pid.
    pid: u32,
    runner: Runner,
    /// Its `--out` directory, handed back to the user after it stops.
    out: Option<PathBuf>,
}

/// Starts the tracer with `args` (through sudo unless xtask is root, on the CPUs of `cpus`
/// when given), logging to `log_dir/tracer.log`, and waits for its `tracer: program ids` line:
/// every program attached.
pub fn start_tracer(
    bin: &Path,
    cpus: Option<&str>,
    args: &[String],
    log_dir: &Path,
) -> anyhow::Result<TracerProc> {
    let runner = Runner::detect();
    let name = bin.file_name().context("the tracer's file name")?;
    // The tracer's own pid: under sudo, a descendant of the child.
    let tracer_pid = |proc: &Proc| match runner {
        Runner::Root => Some(proc.pid()),
        Runner::Sudo { .. } => {
            crate::privilege::descendant_named(proc.pid(), &name.to_string_lossy())
        }
    };
    runner.refresh()?;
    let (program, line) = runner.command_line(bin, args);
    let line: Vec<String> = line
        .iter()
        .map(|arg| arg.to_string_lossy().into_owned())
        .collect();
    let mut proc = Proc::spawn("tracer", cpus, &program, &line, log_dir)?;
    let out = args
        .iter()
        .position(|arg| arg == "--out")
        .and_then(|i| args.get(i + 1))
        .map(PathBuf::from);
    let attached = proc
        .inner
        .wait_for("its ready line", TRACER_READY_TIMEOUT, |line| {
            line.contains(TRACER_READY).then_some(())
        });
    if attached.is_err() {
        if let Some(status) = proc.inner.try_wait()? {
            bail!(
                "the tracer exited before attaching ({status}){}",
                proc.log_tail()
            );
        }
        // Killing sudo (on drop) would leave a root tracer behind.
        if let Some(pid) = tracer_pid(&proc) {
            let _ = runner.kill(pid, Signal::KILL);
        }
        bail!(
            "the tracer did not attach within {TRACER_READY_TIMEOUT:?}{}",
            proc.log_tail()
        );
    }
    let pid = tracer_pid(&proc)
        .with_context(|| format!("no tracer process under sudo ({})", proc.pid()))?;
    Ok(TracerProc {
        proc,
        pid,
        runner,
        out,
    })
}

impl TracerProc {
    /// The tracer's own pid (not sudo's), for /proc.
    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// The tracer's own CPUs, as [`Proc::cpus_allowed`].
    pub fn cpus_allowed(&self) -> anyhow::Result<String> {
        cpus_allowed(self.pid)
    }

    /// Sends the tracer `signal` (through sudo when it runs as root and xtask does not).
    pub fn signaller(&self) -> impl Fn(libc::c_int) -> anyhow::Result<()> + Send + 'static {
        let (runner, pid, sudo) = (self.runner, self.pid, self.proc.pid());
        move |number| {
            let signal = Signal::from_named_raw(number)
                .with_context(|| format!("no signal numbered {number}"))?;
            runner.kill(pid, signal)?;
            if signal == Signal::CONT && runner != Runner::Root {
                // Without a terminal, sudo stops itself when its command stops; it runs with
                // our real uid, so we may continue it, and it must run to reap the tracer.
                if let Some(sudo) = Pid::from_raw(sudo as i32) {
                    let _ = kill_process(sudo, Signal::CONT);
                }
            }
            Ok(())
        }
    }

    /// SIGINT (the tracer's Ctrl-C: drain, detach, report), then waits for it to write its
    /// files and hands them to the user; fails unless it exits successfully.
    pub fn stop(&mut self) -> anyhow::Result<()> {
        // A long session can outlast sudo's credential cache; `sudo -n kill` needs it.
        self.runner.refresh()?;
        let signalled = self.runner.kill(self.pid, Signal::INT);
        let waited = match &signalled {
            Ok(()) => self.proc.wait_timeout(TRACER_FINISH_TIMEOUT),
            // Already gone (its target exited, say): its exit status tells how it went.
            Err(_) => self.proc.wait_timeout(STOP_GRACE),
        };
        if waited.is_err() && self.runner != Runner::Root && process_exists(self.pid) {
            // The wait killed sudo on its way out, which does not reach the root tracer.
            let _ = self.runner.kill(self.pid, Signal::KILL);
        }
        let status = match (signalled, waited) {
            (_, Ok(status)) => status,
            (Err(err), Err(_)) | (Ok(()), Err(err)) => return Err(err),
        };
        let handed_back = match &self.out {
            Some(out) => self.runner.hand_back(out),
            None => Ok(()),
        };
        ensure!(
            status.success(),
            "the tracer failed ({status}){}",
            self.proc.log_tail()
        );
        handed_back
    }
}

/// Whether `pid` names a live (or unreaped) process.
fn process_exists(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

impl Drop for TracerProc {
    fn drop(&mut self) {
        // SIGKILL to sudo would not reach the tracer, and sudo may be gone already: kill the
        // tracer itself while it runs.
        if self.runner != Runner::Root && process_exists(self.pid) {
            let _ = self.runner.kill(self.pid, Signal::KILL);
        }
    }
}

/// A started server and the URL it answers at (`http://127.0.0.1:PORT`).
pub struct Listener {
    pub proc: Proc,
    pub url: String,
}

/// `mock-upstream --listen 127.0.0.1:0 --delay-ms D`, ready once it prints its address.
pub fn start_mock_upstream(
    bins: &Binaries,
    cpus: Option<&str>,
    delay_ms: u64,
    log_dir: &Path,
) -> anyhow::Result<Listener> {
    let args = [
        "--listen",
        "127.0.0.1:0",
        "--delay-ms",
        &delay_ms.to_string(),
    ]
    .map(String::from);
    let name = format!("mock-upstream-{delay_ms}ms");
    let mut proc = Proc::spawn(&name, cpus, &bins.mock_upstream, &args, log_dir)?;
    let addr = proc.wait_listening()?;
    Ok(Listener {
        proc,
        url: format!("http://{addr}"),
    })
}

/// `gateway serve --db DB --listen 127.0.0.1:0 --workers N`, ready once `/healthz` answers 200.
pub fn start_gateway(
    bins: &Binaries,
    cpus: Option<&str>,
    db: &Path,
    workers: usize,
    log_dir: &Path,
) -> anyhow::Result<Listener> {
    let args = vec![
        "serve".to_owned(),
        "--db".to_owned(),
        db.display().to_string(),
        "--listen".to_owned(),
        "127.0.0.1:0".to_owned(),
        "--workers".to_owned(),
        workers.to_string(),
    ];
    let mut proc = Proc::spawn("gateway", cpus, &bins.gateway, &args, log_dir)?;
    let addr = proc.wait_listening()?;
    wait_for_200(&mut proc, "gateway", &addr, "/healthz")?;
    Ok(Listener {
        proc,
        url: format!("http://{addr}"),
    })
}

/// What profile and validate measure against: mock-upstream (delay `delay_ms`) on the load
/// CPUs, a demo ledger `work/ledger.db` pointing at it, and the gateway pinned per `placement`.
pub struct Served {
    pub mock: Listener,
    /// The demo ledger's API key.
    pub key: String,
    pub gateway: Listener,
}

pub fn start_served(
    bins: &Binaries,
    placement: &crate::flags::Placement,
    delay_ms: u64,
    work: &Path,
) -> anyhow::Result<Served> {
    let mock = start_mock_upstream(bins, Some(&placement.load_cpus), delay_ms, work)?;
    let db = work.join("ledger.db");
    let key = init_demo_db(&bins.gateway, &db, &mock.url)?;
    let gateway = start_gateway(
        bins,
        Some(&placement.gateway_cpus),
        &db,
        placement.workers as usize,
        work,
    )?;
    eprintln!(
        "xtask: gateway pid {} at {} (CPUs {})",
        gateway.proc.pid(),
        gateway.url,
        placement.gateway_cpus
    );
    Ok(Served { mock, key, gateway })
}

/// Waits until `GET path` on `addr` answers 200, while `proc` (named `name`) runs.
fn wait_for_200(proc: &mut Proc, name: &str, addr: &str, path: &str) -> anyhow::Result<()> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        proc.ensure_running()?;
        if get_ok(addr, path) {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "{name} at {addr} did not answer GET {path} with 200 within {READY_TIMEOUT:?}{}",
                proc.log_tail()
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// One `GET path` over a fresh connection; true on a 200.
fn get_ok(addr: &str, path: &str) -> bool {
    let attempt = || -> std::io::Result<bool> {
        let mut stream = TcpStream::connect(addr)?;
        stream.set_read_timeout(Some(Duration::from_secs(2)))?;
        write!(
            stream,
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
        )?;
        let mut status_line = String::new();
        BufReader::new(stream).read_line(&mut status_line)?;
        Ok(status_line.starts_with("HTTP/1.1 200"))
    };
    attempt().unwrap_or(false)
}

/// `proxy`'s binary from Debian's package, installed with apt-get where it is missing (a new
/// machine). Debian starts an installed daemon on its default port; it is stopped, as
/// sessions run their own.
pub fn installed_proxy(proxy: Proxy) -> anyhow::Result<PathBuf> {
    if let Some(path) = proxy.find() {
        return Ok(path);
    }
    let name = proxy.package();
    crate::install::apt_install(&[name], false)?;
    let _ = Runner::detect()
        .command("systemctl")
        .args(["stop", name])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
    proxy.find().with_context(|| {
        format!("{name} is installed, but no {name} binary is in /usr/sbin or /usr/bin")
    })
}

/// The first line `binary` prints for its version (`nginx -v`, `haproxy -v`, `caddy
/// version`).
pub fn proxy_version(proxy: Proxy, binary: &Path) -> anyhow::Result<String> {
    let command = format!("{} {}", binary.display(), proxy.version_args().join(" "));
    let output = Command::new(binary)
        .args(proxy.version_args())
        .output()
        .with_context(|| format!("running {command}"))?;
    ensure!(
        output.status.success(),
        "{command} failed ({})",
        output.status
    );
    // nginx prints it on stderr, haproxy, caddy and apache2 on stdout.
    let text = String::from_utf8_lossy(&output.stdout) + String::from_utf8_lossy(&output.stderr);
    text.lines()
        .map(str::trim)
        .find(|line| !line.is_empty())
        .map(str::to_owned)
        .with_context(|| format!("{} printed no version", binary.display()))
}

/// `proxy` (`binary`) as a reverse proxy in front of `upstream` (a URL, `http://HOST:PORT`) on a
/// free port of 127.0.0.1, on the CPUs of `cpus` (nginx's workers inherit them from the
/// master); its configuration, logs and temporary files in `log_dir/<package>/`. Ready once a
/// `GET /` through it answers 200, which takes the upstream answering too.
pub fn start_proxy(
    proxy: Proxy,
    binary: &Path,
    cpus: Option<&str>,
    upstream: &str,
    log_dir: &Path,
) -> anyhow::Result<Listener> {
    let name = proxy.package();
    let dir = log_dir.join(name);
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let port = testproc::proxy::free_port().context("binding 127.0.0.1:0 for a free port")?;
    let upstream = upstream.strip_prefix("http://").unwrap_or(upstream);
    let spawn = proxy
        .spawn(binary, &dir, port, upstream)
        .with_context(|| format!("writing {name}'s configuration in {}", dir.display()))?;
    let mut proc = Proc::start(name, spawn, cpus, log_dir)?;
    let addr = format!("127.0.0.1:{port}");
    wait_for_200(&mut proc, name, &addr, "/")?;
    Ok(Listener {
        proc,
        url: format!("http://{addr}"),
    })
}

/// `gateway init --db DB --demo --upstream URL` of the `gateway` binary; returns the printed
/// `api_key=ak_...`.
pub fn init_demo_db(gateway: &Path, db: &Path, upstream_url: &str) -> anyhow::Result<String> {
    let output = Command::new(gateway)
        .arg("init")
        .arg("--db")
        .arg(db)
        .args(["--demo", "--upstream", upstream_url])
        .output()
        .context("running gateway init")?;
    ensure!(
        output.status.success(),
        "gateway init --demo failed ({}): {}",
        output.status,
        String::from_utf8_lossy(&output.stderr).trim()
    );
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .find_map(|line| line.trim().strip_prefix("api_key="))
        .filter(|key| key.starts_with("ak_"))
        .map(str::to_owned)
        .context("gateway init --demo printed no `api_key=ak_...` line")
}

/// Runs loadgen pinned to `cpus` with `--quiet`, and fails with its stderr if it fails.
pub fn run_loadgen(
    bins: &Binaries,
    cpus: Option<&str>,
    args: &[String],
    timeout: Duration,
    log_dir: &Path,
) -> anyhow::Result<()> {
    let mut args = args.to_vec();
    args.push("--quiet".to_owned());
    let mut proc = Proc::spawn("loadgen", cpus, &bins.loadgen, &args, log_dir)?;
    let status = proc.wait_timeout(timeout)?;
    ensure!(
        status.success(),
        "loadgen {} failed ({status}){}",
        args.join(" "),
        proc.log_tail()
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::fs;

    use super::*;

    fn sleeper(cpus: Option<&str>, dir: &Path) -> Proc {
        Proc::spawn("sleep", cpus, Path::new("sleep"), &["30".to_owned()], dir).unwrap()
    }

    #[test]
    fn a_dropped_child_is_killed_and_reaped() {
        let dir = tempfile::tempdir().unwrap();
        let proc = sleeper(None, dir.path());
        let pid = proc.pid();
        assert!(Path::new(&format!("/proc/{pid}")).exists());
        drop(proc);
        // Reaped, not a zombie: the pid is gone (or, rarely, reused by another process).
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        assert!(!status.contains("Name:\tsleep"), "{status}");
    }

    #[test]
    fn a_failed_build_quotes_cargos_output_from_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let name = "xtask-quiet-build-test";
        fs::write(
            dir.path().join("Cargo.toml"),
            format!("[package]\nname = \"{name}\"\nversion = \"0.1.0\"\nedition = \"2024\"\n"),
        )
        .unwrap();
        fs::create_dir(dir.path().join("src")).unwrap();
        fs::write(
            dir.path().join("src/main.rs"),
            "fn main() { undefined_thing(); }\n",
        )
        .unwrap();
        let target = dir.path().join("target");
        let err = cargo_build_release_in(dir.path(), Some(&target), &["-p", name])
            .err()
            .expect("the crate does not compile");
        let text = format!("{err:#}");
        let log = crate::workspace::log_dir()
            .unwrap()
            .join(format!("build-{name}.log"));
        assert!(text.contains(&log.display().to_string()), "{text}");
        assert!(
            text.contains("undefined_thing"),
            "rustc's error is quoted: {text}"
        );
        let kept = fs::read_to_string(&log).unwrap();
        assert!(kept.contains("Compiling xtask-quiet-build-test"), "{kept}");
        fs::remove_file(&log).unwrap();
    }

    #[test]
    fn pinning_is_applied_and_read_back() {
        let dir = tempfile::tempdir().unwrap();
        let proc = sleeper(Some("0"), dir.path());
        assert_eq!(proc.cpus_allowed().unwrap(), "0");
    }

    fn fake_tracer(script: &str, dir: &Path) -> anyhow::Result<TracerProc> {
        let args = ["-c".to_owned(), script.to_owned()];
        start_tracer(Path::new("/bin/sh"), None, &args, dir)
    }

    #[test]
    fn a_tracer_is_ready_at_its_program_ids_line_and_stops_on_sigint() {
        let dir = tempfile::tempdir().unwrap();
        let script = "trap 'echo drained >&2; exit 0' INT; \
                      echo 'tracer: program ids 1,2' >&2; while :; do sleep 0.05; done";
        let mut tracer = fake_tracer(script, dir.path()).unwrap();
        tracer.stop().unwrap();
        let log = fs::read_to_string(dir.path().join("tracer.log")).unwrap();
        assert!(log.contains("drained"), "SIGINT reached the trap: {log}");
    }

    #[test]
    fn a_tracer_that_exits_before_attaching_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let err = fake_tracer("echo 'no probe sites' >&2; exit 3", dir.path())
            .err()
            .expect("never printed its ready line");
        let text = format!("{err:#}");
        assert!(text.contains("exited before attaching"), "{text}");
        assert!(text.contains("no probe sites"), "{text}");
    }

    #[test]
    fn a_failing_tracer_stop_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let script = "trap 'exit 4' INT; echo 'tracer: program ids 7' >&2; \
                      while :; do sleep 0.05; done";
        let mut tracer = fake_tracer(script, dir.path()).unwrap();
        let text = format!("{:#}", tracer.stop().unwrap_err());
        assert!(text.contains("the tracer failed"), "{text}");
    }

    /// Each of Debian's proxies as profile starts it (installed with apt-get when missing, so
    /// root only where one is): pinned, in front of mock-upstream, a 200 through it, its version
    /// read, and every process of it pinned (nginx's worker inherits the master's CPUs).
    #[test]
    fn each_proxy_serves_through_the_harness_in_front_of_mock_upstream() {
        let missing = Proxy::ALL.iter().any(|proxy| proxy.find().is_none());
        if missing && !rustix::process::geteuid().is_root() {
            eprintln!(
                "SKIPPED each_proxy_serves_through_the_harness: a proxy is missing (apt-get needs root)"
            );
            return;
        }
        let built = cargo_build_release(&["-p", "gateway", "--bin", "mock-upstream"]).unwrap();
        let bins = Binaries {
            gateway: PathBuf::new(),
            mock_upstream: built.find("mock-upstream").unwrap(),
            loadgen: PathBuf::new(),
        };
        let dir = tempfile::tempdir().unwrap();
        let mock = start_mock_upstream(&bins, None, 0, dir.path()).unwrap();
        for proxy in Proxy::ALL {
            let binary = installed_proxy(proxy).unwrap();
            let version = proxy_version(proxy, &binary).unwrap();
            let expected = match proxy {
                Proxy::Nginx => "nginx version: nginx/",
                Proxy::Haproxy => "HAProxy version ",
                Proxy::Caddy => "",
                Proxy::Apache => "Server version: Apache/2.4.",
            };
            assert!(version.starts_with(expected), "{proxy:?}: {version}");
            assert!(
                version.contains(|c: char| c.is_ascii_digit()),
                "{proxy:?}: {version}"
            );
            let server = start_proxy(proxy, &binary, Some("0"), &mock.url, dir.path())
                .unwrap_or_else(|e| panic!("{proxy:?}: {e:#}"));
            let addr = server.url.strip_prefix("http://").unwrap();
            assert!(get_ok(addr, "/echo"), "{proxy:?}: no 200 through {addr}");
            let family: Vec<u32> = crate::procstat::comm_ppid_all()
                .into_iter()
                .filter(|(pid, ppid, _)| *pid == server.proc.pid() || *ppid == server.proc.pid())
                .map(|(pid, _, _)| pid)
                .collect();
            if matches!(proxy, Proxy::Nginx | Proxy::Apache) {
                assert!(
                    family.len() >= 2,
                    "{proxy:?}: a parent and its children: {family:?}"
                );
            }
            for pid in family {
                assert_eq!(cpus_allowed(pid).unwrap(), "0", "{proxy:?} pid {pid}");
            }
            assert!(dir.path().join(proxy.package()).is_dir());
        }
    }

    #[test]
    fn stop_ends_a_child_that_honours_sigterm() {
        let dir = tempfile::tempdir().unwrap();
        let mut proc = sleeper(None, dir.path());
        let started = Instant::now();
        proc.stop().unwrap();
        assert!(
            started.elapsed() < STOP_GRACE,
            "sleep exits on SIGTERM, no SIGKILL needed"
        );
    }
}
