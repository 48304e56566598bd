//! Child processes for the tests and the measurement harness, in one place.
//!
//! A [`Proc`] is started by [`Spawn`], pinned to CPUs when asked. Its stdout and stderr are read
//! line by line as they come (kept in memory, and copied to a log file when given), so it never
//! blocks on a full pipe; [`Proc::wait_for`] waits for a ready line and fails with the output's
//! tail when the line does not come in time or the child exits first. Dropped, it gets SIGTERM,
//! then SIGKILL after a grace period, and is reaped: a failed assertion, a panic or an error
//! leaves nothing running. A child also gets SIGKILL when the thread that started it dies
//! without dropping it (`PR_SET_PDEATHSIG`: an aborted test binary, a killed xtask), so start
//! it from a thread that outlives it.

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Read, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStderr, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail, ensure};
pub use rustix::process::Signal;
use rustix::process::{Pid, kill_process, set_parent_process_death_signal};
use rustix::thread::{CpuSet, sched_setaffinity};

/// How long a child gets between SIGTERM and SIGKILL unless [`Spawn::grace`] says otherwise.
pub const DEFAULT_GRACE: Duration = Duration::from_secs(3);
/// Lines of output an error quotes.
const TAIL_LINES: usize = 20;
/// How long the output pipes may stay open after the child exited (a grandchild can hold them)
/// before its output is taken as complete.
const PIPES_SETTLE: Duration = Duration::from_secs(2);

/// Which of the child's outputs a line came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
}

/// How a child is started: a [`Command`], and what the fixture adds to it.
pub struct Spawn {
    name: String,
    command: Command,
    cpus: Option<String>,
    log: Option<PathBuf>,
    grace: Duration,
    capture_stdout: bool,
    capture_stderr: bool,
}

impl Spawn {
    /// `program`, named `name` in messages.
    pub fn new(name: impl Into<String>, program: impl AsRef<OsStr>) -> Spawn {
        Spawn::command(name, Command::new(program))
    }

    /// A command built by the caller (its environment, working directory, `pre_exec` hooks);
    /// its stdout and stderr are captured unless [`Spawn::stdout`] or [`Spawn::stderr`] say.
    pub fn command(name: impl Into<String>, command: Command) -> Spawn {
        Spawn {
            name: name.into(),
            command,
            cpus: None,
            log: None,
            grace: DEFAULT_GRACE,
            capture_stdout: true,
            capture_stderr: true,
        }
    }

    pub fn arg(mut self, arg: impl AsRef<OsStr>) -> Spawn {
        self.command.arg(arg);
        self
    }

    pub fn args(mut self, args: impl IntoIterator<Item = impl AsRef<OsStr>>) -> Spawn {
        self.command.args(args);
        self
    }

    pub fn env(mut self, key: impl AsRef<OsStr>, value: impl AsRef<OsStr>) -> Spawn {
        self.command.env(key, value);
        self
    }

    /// Runs it on the CPUs of a `taskset -c` style list (`0`, `1-3`, `0,2`), when given.
    pub fn cpus(mut self, cpus: Option<&str>) -> Spawn {
        self.cpus = cpus.map(str::to_owned);
        self
    }

    /// Also writes every output line to `path` (created or truncated), as it comes.
    pub fn log(mut self, path: impl Into<PathBuf>) -> Spawn {
        self.log = Some(path.into());
        self
    }

    /// How long it gets between SIGTERM and SIGKILL when stopped or dropped.
    pub fn grace(mut self, grace: Duration) -> Spawn {
        self.grace = grace;
        self
    }

    /// Its stdout goes to `stdio` instead of being captured ([`Proc::take_stdout`] hands over a
    /// pipe).
    pub fn stdout(mut self, stdio: impl Into<Stdio>) -> Spawn {
        self.command.stdout(stdio);
        self.capture_stdout = false;
        self
    }

    /// Its stderr goes to `stdio` instead of being captured ([`Proc::take_stderr`] hands over a
    /// pipe).
    pub fn stderr(mut self, stdio: impl Into<Stdio>) -> Spawn {
        self.command.stderr(stdio);
        self.capture_stderr = false;
        self
    }

    /// Starts it, with stdin from /dev/null.
    pub fn start(self) -> anyhow::Result<Proc> {
        let Spawn {
            name,
            mut command,
            cpus,
            log,
            grace,
            capture_stdout,
            capture_stderr,
        } = self;
        let cpu_set = cpus
            .as_deref()
            .map(parse_cpu_list)
            .transpose()
            .with_context(|| format!("{name}'s CPUs"))?;
        let log_file = log
            .as_deref()
            .map(|path| File::create(path).with_context(|| format!("creating {}", path.display())))
            .transpose()?;
        command.stdin(Stdio::null());
        if capture_stdout {
            command.stdout(Stdio::piped());
        }
        if capture_stderr {
            command.stderr(Stdio::piped());
        }
        // SAFETY: the closure makes only async-signal-safe system calls (prctl, signal,
        // sched_setaffinity) and touches no memory the parent could have locked.
        unsafe {
            command.pre_exec(move || {
                set_parent_process_death_signal(Some(Signal::KILL))?;
                // Children are stopped with SIGINT or SIGTERM. A parent started in the
                // background (`cmd &`) has SIGINT ignored, a launcher may ignore SIGTERM, and
                // exec passes that on: a child without its own handler could not be stopped.
                // rustix offers sigaction only in its unstable `runtime` API.
                for signal in [libc::SIGINT, libc::SIGTERM] {
                    if libc::signal(signal, libc::SIG_DFL) == libc::SIG_ERR {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                if let Some(set) = &cpu_set {
                    sched_setaffinity(None, set)?;
                }
                Ok(())
            });
        }
        let mut child = command.spawn().with_context(|| {
            format!(
                "starting {name} ({})",
                command.get_program().to_string_lossy()
            )
        })?;
        let shared = Arc::new(Shared {
            output: Mutex::new(Output {
                lines: Vec::new(),
                open: 0,
                log: log_file,
            }),
            changed: Condvar::new(),
        });
        if capture_stdout && let Some(pipe) = child.stdout.take() {
            shared.read(Stream::Stdout, pipe);
        }
        if capture_stderr && let Some(pipe) = child.stderr.take() {
            shared.read(Stream::Stderr, pipe);
        }
        Ok(Proc {
            name,
            cpus,
            child,
            shared,
            log,
            grace,
        })
    }
}

/// What `command` printed to stdout; it had to succeed.
pub fn stdout_of(command: &mut Command) -> String {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("running {command:?}: {e}"));
    succeeded_stdout(&format!("{command:?}"), output)
}

/// The stdout of `what`, a command that had to succeed; panics, quoting its status and stderr,
/// when it failed.
pub fn succeeded_stdout(what: &str, output: std::process::Output) -> String {
    assert!(
        output.status.success(),
        "{what} failed: {}\n{}",
        output.status,
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// The stderr of a command that had to fail; panics, quoting it, when it succeeded.
pub fn failed_stderr(output: &std::process::Output) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).into_owned();
    assert!(
        !output.status.success(),
        "succeeded where it had to fail:\n{stderr}"
    );
    stderr
}

/// `0`, `2-3`, `0,2-3` as a CPU set.
pub fn parse_cpu_list(list: &str) -> anyhow::Result<CpuSet> {
    let mut set = CpuSet::new();
    for part in list.split(',') {
        let (first, last) = part.split_once('-').unwrap_or((part, part));
        let cpu = |text: &str| -> anyhow::Result<usize> {
            let cpu: usize = text
                .trim()
                .parse()
                .with_context(|| format!("`{list}` is not a CPU list such as 0,2-3"))?;
            ensure!(cpu < CpuSet::MAX_CPU, "CPU {cpu} is past the last one");
            Ok(cpu)
        };
        let (first, last) = (cpu(first)?, cpu(last)?);
        ensure!(first <= last, "`{part}` in `{list}` counts down");
        (first..=last).for_each(|cpu| set.set(cpu));
    }
    Ok(set)
}

/// What the child wrote so far, by line, and how many of its captured pipes are still open.
struct Output {
    lines: Vec<(Stream, String)>,
    open: usize,
    log: Option<File>,
}

struct Shared {
    output: Mutex<Output>,
    /// Signalled on every line and every closed pipe.
    changed: Condvar,
}

impl Shared {
    /// Reads `pipe` to its end on a thread of its own, line by line.
    fn read(self: &Arc<Self>, stream: Stream, pipe: impl Read + Send + 'static) {
        self.lock().open += 1;
        let shared = Arc::clone(self);
        std::thread::spawn(move || {
            let mut reader = BufReader::new(pipe);
            let mut line = Vec::new();
            while reader.read_until(b'\n', &mut line).is_ok_and(|n| n > 0) {
                let text = String::from_utf8_lossy(&line);
                let text = text.strip_suffix('\n').unwrap_or(&text);
                let mut output = shared.lock();
                if let Some(log) = &mut output.log {
                    // The log is for reading later; a failed write must not stop the child.
                    let _ = writeln!(log, "{text}");
                }
                output.lines.push((stream, text.to_owned()));
                drop(output);
                shared.changed.notify_all();
                line.clear();
            }
            shared.lock().open -= 1;
            shared.changed.notify_all();
        });
    }

    fn lock(&self) -> MutexGuard<'_, Output> {
        // A reader cannot panic while holding the lock; the data is lines, valid either way.
        self.output
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }
}

/// A running child: killed and reaped when dropped.
pub struct Proc {
    name: String,
    cpus: Option<String>,
    child: Child,
    shared: Arc<Shared>,
    log: Option<PathBuf>,
    grace: Duration,
}

impl Proc {
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The CPU list it was started on, as given to [`Spawn::cpus`].
    pub fn cpus(&self) -> Option<&str> {
        self.cpus.as_deref()
    }

    /// The log file given to [`Spawn::log`].
    pub fn log_path(&self) -> Option<&Path> {
        self.log.as_deref()
    }

    /// Waits until a line of its output makes `matcher` return `Some`, and returns that.
    /// Lines are looked at in the order they came, from the first; `what` names the line in
    /// the error, which quotes the output's tail, when it does not come within `timeout` or the
    /// child exits first.
    pub fn wait_for<T>(
        &mut self,
        what: &str,
        timeout: Duration,
        mut matcher: impl FnMut(&str) -> Option<T>,
    ) -> anyhow::Result<T> {
        let deadline = Instant::now() + timeout;
        let mut seen = 0;
        let mut exited = None;
        loop {
            let mut output = self.shared.lock();
            for (_, line) in &output.lines[seen..] {
                if let Some(found) = matcher(line) {
                    return Ok(found);
                }
            }
            seen = output.lines.len();
            let now = Instant::now();
            if output.open == 0 || exited.is_some_and(|at| now >= at + PIPES_SETTLE) {
                drop(output);
                // A child's pipes close a moment before its exit can be reaped: an exit
                // looked for once would be missed now and then.
                let state = match self.exit_status_within(PIPES_SETTLE)? {
                    Some(status) => format!("exited ({status})"),
                    None => "closed its output".to_owned(),
                };
                bail!(
                    "{} {state} before printing {what}{}",
                    self.name,
                    self.tail()
                );
            }
            if now >= deadline {
                drop(output);
                bail!(
                    "{} did not print {what} within {timeout:?}{}",
                    self.name,
                    self.tail()
                );
            }
            // Woken by each line; every 50 ms also looks whether the child exited while a
            // grandchild holds its pipes open.
            let wait = deadline.min(now + Duration::from_millis(50)) - now;
            output = self
                .shared
                .changed
                .wait_timeout(output, wait)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
            drop(output);
            if exited.is_none() && self.child.try_wait()?.is_some() {
                exited = Some(Instant::now());
            }
        }
    }

    /// Its exit status if it exits within `limit` (reaped, its output not yet settled); `None`
    /// if it still runs then.
    fn exit_status_within(&mut self, limit: Duration) -> anyhow::Result<Option<ExitStatus>> {
        let deadline = Instant::now() + limit;
        loop {
            if let Some(status) = self.child.try_wait()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits for a line that starts with `prefix` (leading and trailing blanks aside) and
    /// returns the rest of it, trimmed.
    pub fn wait_for_prefix(&mut self, prefix: &str, timeout: Duration) -> anyhow::Result<String> {
        self.wait_for(&format!("`{}…`", prefix.trim_end()), timeout, |line| {
            line.trim()
                .strip_prefix(prefix)
                .map(|rest| rest.trim().to_owned())
        })
    }

    /// Everything it wrote to stdout and stderr so far, a line each, in the order read.
    pub fn output(&self) -> String {
        self.lines_of(None)
    }

    /// Everything it wrote to `stream` so far.
    pub fn output_of(&self, stream: Stream) -> String {
        self.lines_of(Some(stream))
    }

    fn lines_of(&self, stream: Option<Stream>) -> String {
        let output = self.shared.lock();
        let mut text = String::new();
        for (from, line) in &output.lines {
            if stream.is_none_or(|stream| stream == *from) {
                text.push_str(line);
                text.push('\n');
            }
        }
        text
    }

    /// The output's last lines, for an error message: empty when there are none.
    pub fn tail(&self) -> String {
        let output = self.shared.lock();
        let lines = &output.lines[output.lines.len().saturating_sub(TAIL_LINES)..];
        if lines.is_empty() {
            return String::new();
        }
        let mut text = format!("\n  {}", self.name);
        if let Some(log) = &self.log {
            let _ = write!(text, " ({})", log.display());
        }
        text.push_str(":\n");
        for (_, line) in lines {
            let _ = writeln!(text, "    {line}");
        }
        text.pop();
        text
    }

    /// Sends it `signal`; an error once it is reaped (its pid may be another process's).
    pub fn signal(&mut self, signal: Signal) -> anyhow::Result<()> {
        if let Some(status) = self.child.try_wait()? {
            bail!("{} exited already ({status})", self.name);
        }
        let pid = Pid::from_child(&self.child);
        kill_process(pid, signal).with_context(|| format!("signalling {}", self.name))
    }

    /// Its exit status once it exited (it is then reaped).
    pub fn try_wait(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for it to exit, without a bound, then for its output to be read.
    pub fn wait(&mut self) -> anyhow::Result<ExitStatus> {
        let status = self.child.wait()?;
        self.settle();
        Ok(status)
    }

    /// Waits for it to exit, then for its output to be read; past `timeout` it is killed,
    /// and that is an error quoting its output.
    pub fn wait_timeout(&mut self, timeout: Duration) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exit_status_within(timeout)? {
            self.settle();
            return Ok(status);
        }
        self.kill()?;
        bail!(
            "{} still running after {timeout:?}; killed{}",
            self.name,
            self.tail()
        );
    }

    /// SIGTERM, then SIGKILL once the grace period is over; reaps it either way. Returns its
    /// exit status, and whether it had to be killed.
    pub fn stop(&mut self) -> anyhow::Result<(ExitStatus, Stopped)> {
        if let Some(status) = self.child.try_wait()? {
            return Ok((status, Stopped::Before));
        }
        self.signal(Signal::TERM)?;
        if let Some(status) = self.exit_status_within(self.grace)? {
            self.settle();
            return Ok((status, Stopped::Terminated));
        }
        Ok((self.kill()?, Stopped::Killed))
    }

    /// SIGKILL now, and reap it.
    pub fn kill(&mut self) -> anyhow::Result<ExitStatus> {
        self.child.kill()?;
        let status = self.child.wait()?;
        self.settle();
        Ok(status)
    }

    /// The stdout pipe, when [`Spawn::stdout`] asked for one.
    pub fn take_stdout(&mut self) -> Option<ChildStdout> {
        self.child.stdout.take()
    }

    /// The stderr pipe, when [`Spawn::stderr`] asked for one.
    pub fn take_stderr(&mut self) -> Option<ChildStderr> {
        self.child.stderr.take()
    }

    /// Waits (bounded) for the reader threads to reach the end of the pipes.
    fn settle(&self) {
        let deadline = Instant::now() + PIPES_SETTLE;
        let mut output = self.shared.lock();
        while output.open > 0 {
            let now = Instant::now();
            if now >= deadline {
                return;
            }
            output = self
                .shared
                .changed
                .wait_timeout(output, deadline - now)
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .0;
        }
    }
}

/// How [`Proc::stop`] ended it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stopped {
    /// It had exited already.
    Before,
    /// It exited on SIGTERM within the grace period.
    Terminated,
    /// It outlived the grace period and got SIGKILL.
    Killed,
}

impl Drop for Proc {
    fn drop(&mut self) {
        if self.stop().is_err() {
            // The stop failed before its SIGKILL (no signal could be sent): kill it anyway.
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

pub mod proxy;

#[cfg(test)]
mod tests;
