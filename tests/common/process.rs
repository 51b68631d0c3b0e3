//! Child processes and loopback ports.
//!
//! A [`Proc`] captures stdout and stderr to a temporary file and is killed (SIGKILL, by PID)
//! and reaped when dropped, also when a test panics; then it prints the tail of its output,
//! so a failure shows what the process logged. [`on_free_ports`] retries a start whose
//! freshly picked port was taken in the meantime.

use std::collections::BTreeSet;
use std::future::Future;
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::Duration;

use tempfile::NamedTempFile;

use super::faults::signal;
use super::http::http_ok;
use super::wait::eventually;

/// How long a process gets to answer after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Start attempts when a picked port turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// How much of a process's output a failing test prints.
const OUTPUT_TAIL: usize = 16_000;

/// The `tollgate` binary of this build.
pub const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// Ports handed out by [`free_port`] and [`free_port_with`] in this test binary.
static HANDED_OUT: parking_lot::Mutex<BTreeSet<u16>> = parking_lot::Mutex::new(BTreeSet::new());

/// A free TCP port on 127.0.0.1 (bound, read, released: the caller retries if it is gone),
/// never one this test process was handed before: the kernel may give the same port to two
/// binds in a row, which once put a gateway's proxy and admin listener on one port.
pub fn free_port() -> u16 {
    for _ in 0..1000 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .expect("bind 127.0.0.1:0")
            .local_addr()
            .expect("local addr")
            .port();
        if HANDED_OUT.lock().insert(port) {
            return port;
        }
    }
    panic!("no port that was not handed out before, in 1000 binds");
}

/// A free loopback port whose port + `offset` is free too (a Redis Cluster node's bus port),
/// neither handed out before.
pub fn free_port_with(offset: u16) -> u16 {
    for _ in 0..1000 {
        let port = free_port();
        let Some(other) = port.checked_add(offset) else {
            continue;
        };
        if TcpListener::bind((Ipv4Addr::LOCALHOST, other)).is_ok()
            && HANDED_OUT.lock().insert(other)
        {
            return port;
        }
    }
    panic!("no port with port + {offset} free too, in 1000 tries");
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// The soft limit on open files of this process (`/proc/self/limits`), if known.
pub fn max_open_files() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

/// Occurrences of `needle` in `haystack` (a process's output, say).
pub fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// A child process that is killed (SIGKILL, by PID) and reaped when dropped.
pub struct Proc {
    name: String,
    child: Child,
    log: NamedTempFile,
}

impl Proc {
    /// Start `cmd` as `name` (how messages call it), stdin closed, stdout and stderr captured.
    /// A program that cannot be started fails the test with `install`: what to install.
    pub fn spawn(name: &str, mut cmd: Command, install: &str) -> Proc {
        let log = NamedTempFile::new().expect("temp file for output");
        let out = log.as_file().try_clone().expect("clone log fd");
        let err = log.as_file().try_clone().expect("clone log fd");
        cmd.stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        let child = cmd.spawn().unwrap_or_else(|e| {
            panic!(
                "cannot start {name} ({}): {e}. {install}",
                cmd.get_program().to_string_lossy()
            )
        });
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    /// `tollgate <args>` with plain-text logs and no proxy settings or config from the
    /// environment, plus `env`.
    pub fn tollgate(name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        Proc::tollgate_under(&[], name, args, env)
    }

    /// [`Proc::tollgate`] run by a wrapper command (`["prlimit", "--nofile=1024:4096", "--"]`).
    pub fn tollgate_under(
        wrapper: &[&str],
        name: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Proc {
        let mut cmd = match wrapper.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(BIN);
                c
            }
            None => Command::new(BIN),
        };
        cmd.args(args)
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("TOLLGATE_CONFIG")
            .env_remove("TOLLGATE_REDIS_URL");
        for (k, v) in env {
            cmd.env(k, v);
        }
        Proc::spawn(name, cmd, "build it with `cargo build`")
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote to stdout and stderr so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }

    /// Send `sig` (`STOP`, `CONT`, `HUP`, ...) with `kill -<sig> <pid>`.
    pub fn signal(&self, sig: &str) {
        signal(self.pid(), sig);
    }

    /// Wait until `GET url` answers 200 (see [`Proc::wait_ready`]); the process, or
    /// `Err(output)` when it exited first.
    pub async fn answering(mut self, client: &reqwest::Client, url: &str) -> Result<Proc, String> {
        self.wait_ready(|| http_ok(client, url)).await?;
        Ok(self)
    }

    /// Wait until `ready` holds, at most [`START_TIMEOUT`]. `Err(output)` when the process
    /// exited first.
    pub async fn wait_ready<F, Fut>(&mut self, mut ready: F) -> Result<(), String>
    where
        F: FnMut() -> Fut,
        Fut: Future<Output = bool>,
    {
        let what = format!("{} answers", self.name);
        eventually(what, START_TIMEOUT)
            .holds_async(|| {
                let exited = self
                    .exited()
                    .map(|status| format!("exited with {status}:\n{}", self.output()));
                let ready = ready();
                async move {
                    match exited {
                        Some(output) => Some(Err(output)),
                        None => ready.await.then_some(Ok(())),
                    }
                }
            })
            .await
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let out = self.output();
            let mut from = out.len().saturating_sub(OUTPUT_TAIL);
            while !out.is_char_boundary(from) {
                from += 1;
            }
            eprintln!(
                "----- {} (pid {}) output -----\n{}\n----- end of {} output -----",
                self.name,
                self.child.id(),
                &out[from..],
                self.name
            );
        }
    }
}

fn is_bind_failure(output: &str) -> bool {
    output.contains("cannot listen") || output.contains("Address already in use")
}

/// Start `name` with `attempt` (which picks fresh free ports each time) until an attempt is
/// not defeated by a port taken in the meantime: at most [`START_ATTEMPTS`] tries. Any other
/// start failure panics with the process's output.
pub async fn on_free_ports<T, F, Fut>(name: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<T, String>>,
{
    let mut failures = Vec::new();
    for _ in 0..START_ATTEMPTS {
        match attempt().await {
            Ok(started) => return started,
            Err(out) if is_bind_failure(&out) => failures.push(out),
            Err(out) => panic!("{name} failed to start: {out}"),
        }
    }
    panic!("{name}: no free ports after {START_ATTEMPTS} attempts: {failures:#?}");
}

/// Raise this test process's own open-file limit, so it can hold the client side of many
/// connections.
pub fn raise_own_open_files(at_least: u64) {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).expect("getrlimit");
    assert!(
        hard >= at_least,
        "this test needs a hard open-file limit of at least {at_least} (ulimit -Hn is {hard})"
    );
    if soft < at_least {
        setrlimit(Resource::RLIMIT_NOFILE, hard.min(65_536), hard).expect("setrlimit");
    }
}
