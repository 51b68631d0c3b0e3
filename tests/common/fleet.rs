//! The fleet under test: `docker/fleet.sh`, the script a person runs too, started on free
//! loopback ports: redis-server, the demo upstream, two gateways on `docker/gateway.yaml` and
//! HAProxy on `docker/haproxy.cfg`, the files compose uses. The test reads the addresses and
//! pids the script writes to `fleet.env` once everything answers.
//!
//! A test may stop a gateway and start it again, or upgrade it (`tollgate --upgrade`), the
//! way a person would with the script's `gateway-N.env` ([`Fleet::spawn_gateway`]); such a
//! gateway is a process of the test, killed by PID when the fleet drops.
//!
//! Dropping a [`Fleet`] sends SIGTERM to the script (which stops what it started), then
//! SIGKILLs by PID every process of the fleet still alive: each is recognised by its pid and
//! its start time, so a pid reused by another process is never signalled. When the test
//! panics, the tail of every process's log is printed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use tempfile::TempDir;

use super::faults::signal;
use super::haproxy;
use super::http::client_builder;
use super::process::{on_free_ports, Proc, BIN};
use super::wait::eventually;

/// The gateways' environment the harness sets unless a test says otherwise: a short
/// `grace_period`, so that a fleet stops in about a second, and no `drain_period` (the
/// shipped one, [`shipped`], is 5 s; tests of draining ask for it).
const HARNESS_ENV: [(&str, &str); 2] = [
    ("TOLLGATE_GRACE_PERIOD", "1s"),
    ("TOLLGATE_DRAIN_PERIOD", "0s"),
];

/// How long the whole fleet gets to come up.
const UP_WITHIN: Duration = Duration::from_secs(60);
/// How long the script gets to stop the fleet when told to.
const DOWN_WITHIN: Duration = Duration::from_secs(15);
const LOG_TAIL: usize = 4_000;
/// What to install when a program of the fleet is missing.
pub const INSTALL: &str =
    "install what the fleet needs with scripts/setup.sh (apt-get install haproxy redis-server redis-tools)";

/// The names of the fleet's processes, as the script names their logs and pids.
const MEMBERS: [&str; 5] = ["redis", "upstream", "gateway-1", "gateway-2", "haproxy"];

/// The repository root (`docker/` is in it).
pub fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// One gateway of the fleet.
#[derive(Debug, Clone)]
pub struct Member {
    /// `gateway-1` or `gateway-2`: HAProxy's server name and the `X-Tollgate-Gateway` header.
    pub name: String,
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub pid: u32,
}

/// A process of the fleet: its pid and its start time (field 22 of `/proc/PID/stat`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Identity {
    pid: u32,
    start: u64,
}

impl Identity {
    fn of(pid: u32) -> Option<Identity> {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
        // The fields after the command name, which may hold spaces, in parentheses.
        let after = &stat[stat.rfind(')')? + 2..];
        let start = after.split(' ').nth(19)?.parse().ok()?;
        Some(Identity { pid, start })
    }

    fn alive(self) -> bool {
        Identity::of(self.pid) == Some(self)
    }

    /// Alive and not a zombie (exited, not yet reaped by its parent).
    fn running(self) -> bool {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid)).unwrap_or_default();
        let state = stat.rfind(')').and_then(|i| stat.get(i + 2..i + 3));
        self.alive() && !matches!(state, Some("Z" | "X") | None)
    }
}

/// The default of `${name:-default}` in `docker/gateway.yaml`: what the image ships.
pub fn shipped(name: &str) -> String {
    let path = repo().join("docker/gateway.yaml");
    let text = std::fs::read_to_string(&path).expect("docker/gateway.yaml");
    let from = format!("${{{name}:-");
    let at = text
        .find(&from)
        .unwrap_or_else(|| panic!("no ${{{name}:-...}} in docker/gateway.yaml"))
        + from.len();
    text[at..].split('}').next().unwrap().to_string()
}

/// The fleet started by `docker/fleet.sh`.
pub struct Fleet {
    /// The balancer, where clients connect.
    pub lb: SocketAddr,
    /// HAProxy's stats page.
    pub lb_stats: SocketAddr,
    pub redis: SocketAddr,
    pub upstream: SocketAddr,
    pub gateways: Vec<Member>,
    processes: Vec<(String, Identity)>,
    /// What reached the script's (and so the gateways') environment: [`HARNESS_ENV`] and the
    /// test's.
    env: Vec<(String, String)>,
    /// Gateways this test started (again), by [`Fleet::spawn_gateway`].
    spawned: Vec<Proc>,
    script: Proc,
    dir: TempDir,
    client: reqwest::Client,
    /// This test's turn: fleets run one at a time (each is seven processes and a load; several
    /// at once on a small machine starve HAProxy's health checks). Last, so it is released
    /// after the processes are gone.
    turn: Option<tokio::sync::MutexGuard<'static, ()>>,
}

/// No colour, no `RUST_LOG`, and no `TOLLGATE_*` or `FLEET_*` variable of the test's own
/// environment: what reaches a fleet process is what the test gives it.
fn clean_env(cmd: &mut Command) {
    cmd.env("NO_COLOR", "1").env_remove("RUST_LOG");
    for (k, _) in std::env::vars() {
        if k.starts_with("TOLLGATE_") || k.starts_with("FLEET_") {
            cmd.env_remove(k);
        }
    }
}

/// Held by the one fleet running in this test binary.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

impl Fleet {
    /// Start the fleet with `env` added to the script's environment (it reaches both
    /// gateways: `TOLLGATE_FREE_LIMIT`, ...). No `TOLLGATE_*` or `FLEET_*` variable of the
    /// test's own environment gets through. [`HARNESS_ENV`] applies unless `env` says
    /// otherwise: `TOLLGATE_GRACE_PERIOD` 1s and `TOLLGATE_DRAIN_PERIOD` 0s, so that the fleet
    /// stops quickly when the test ends.
    pub async fn start(env: &[(&str, &str)]) -> Fleet {
        let all: Vec<(String, String)> = HARNESS_ENV
            .iter()
            .filter(|(k, _)| env.iter().all(|(e, _)| e != k))
            .chain(env)
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let all = &all;
        let turn = ONE_AT_A_TIME.lock().await;
        let mut fleet = on_free_ports("fleet", || async move {
            let dir = tempfile::tempdir().expect("temp dir");
            let mut cmd = Command::new("bash");
            cmd.arg(repo().join("docker/fleet.sh"))
                .arg("--dir")
                .arg(dir.path())
                .args(["--bin", BIN])
                .current_dir(repo());
            clean_env(&mut cmd);
            cmd.envs(all.iter().map(|(k, v)| (k, v)));
            let mut script = Proc::spawn("fleet.sh", cmd, INSTALL);
            let env_file = dir.path().join("fleet.env");
            let up = eventually("the fleet is up (fleet.env written)", UP_WITHIN)
                .every(Duration::from_millis(100))
                .holds(|| match script.exited() {
                    Some(status) => {
                        Some(Err(format!("exited with {status}:\n{}", script.output())))
                    }
                    None => env_file.exists().then_some(Ok(())),
                })
                .await;
            up.map(|()| Fleet::from_env_file(script, dir, all.clone()))
        })
        .await;
        fleet.turn = Some(turn);
        fleet
    }

    fn from_env_file(script: Proc, dir: TempDir, env: Vec<(String, String)>) -> Fleet {
        let text = std::fs::read_to_string(dir.path().join("fleet.env")).expect("fleet.env");
        let vars: HashMap<&str, &str> = text.lines().filter_map(|l| l.split_once('=')).collect();
        let var = |k: &str| {
            *vars
                .get(k)
                .unwrap_or_else(|| panic!("{k} missing in fleet.env:\n{text}"))
        };
        let addr = |k: &str| -> SocketAddr {
            var(k)
                .parse()
                .unwrap_or_else(|_| panic!("{k} is not an address"))
        };
        let pid = |name: &str| -> u32 {
            let k = format!("FLEET_{}_PID", name.to_uppercase().replace('-', "_"));
            var(&k).parse().expect("a pid")
        };
        let processes = MEMBERS
            .iter()
            .filter_map(|m| Identity::of(pid(m)).map(|id| (m.to_string(), id)))
            .collect();
        let gateways = (1..=2)
            .map(|n| Member {
                name: format!("gateway-{n}"),
                listen: addr(&format!("FLEET_GATEWAY_{n}")),
                admin: addr(&format!("FLEET_GATEWAY_{n}_ADMIN")),
                pid: pid(&format!("gateway-{n}")),
            })
            .collect();
        Fleet {
            lb: addr("FLEET_LB"),
            lb_stats: addr("FLEET_LB_STATS"),
            redis: addr("FLEET_REDIS"),
            upstream: addr("FLEET_UPSTREAM"),
            gateways,
            processes,
            env,
            spawned: Vec::new(),
            script,
            dir,
            client: client_builder()
                .timeout(Duration::from_secs(2))
                .build()
                .expect("client"),
            turn: None,
        }
    }

    /// `http://<balancer>{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.lb)
    }

    pub fn dir(&self) -> PathBuf {
        self.dir.path().to_path_buf()
    }

    /// What process `name` (`gateway-1`, `haproxy`, ...) logged so far.
    pub fn log(&self, name: &str) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{name}.log"))).unwrap_or_default()
    }

    /// `kill -9` gateway `i` (0 or 1).
    pub fn kill9(&self, i: usize) {
        signal(self.gateways[i].pid, "KILL");
    }

    /// `kill -9` the fleet's Redis (the gateways then answer by their `on_error` policy).
    pub fn kill9_redis(&self) {
        let (_, redis) = self
            .processes
            .iter()
            .find(|(name, _)| name == "redis")
            .expect("the fleet's redis-server");
        assert!(redis.alive(), "the fleet's redis-server is not running");
        signal(redis.pid, "KILL");
    }

    /// Send `sig` (`TERM`, `QUIT`, ...) to gateway `i`'s current process.
    pub fn signal(&self, i: usize, sig: &str) {
        signal(self.gateways[i].pid, sig);
    }

    /// Gateway `i`'s environment, as the script started it: the script's own ([`HARNESS_ENV`]
    /// and the test's) and `gateway-N.env` (addresses, Redis, upgrade socket).
    pub fn gateway_env(&self, i: usize) -> Vec<(String, String)> {
        let file = self
            .dir
            .path()
            .join(format!("{}.env", self.gateways[i].name));
        let text = std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("{file:?}: {e}"));
        let own = text
            .lines()
            .filter_map(|l| l.split_once('='))
            .map(|(k, v)| (k.to_string(), v.to_string()));
        self.env.iter().cloned().chain(own).collect()
    }

    /// Gateway `i`'s `server.upgrade_sock` (`TOLLGATE_UPGRADE_SOCK` of `gateway-N.env`).
    pub fn upgrade_sock(&self, i: usize) -> PathBuf {
        let env = self.gateway_env(i);
        let (_, path) = env
            .iter()
            .rfind(|(k, _)| k == "TOLLGATE_UPGRADE_SOCK")
            .expect("TOLLGATE_UPGRADE_SOCK in gateway-N.env");
        PathBuf::from(path)
    }

    /// Start gateway `i` as the script did (`docker/gateway.yaml`, [`Fleet::gateway_env`]),
    /// with `--upgrade` when `upgrade`, as a process of this test; from now on it is gateway
    /// `i` (`gateways[i].pid`). Returns the pid of the process it replaces. Waits for nothing.
    pub fn spawn_gateway(&mut self, i: usize, upgrade: bool) -> u32 {
        let name = format!(
            "{}{}",
            self.gateways[i].name,
            if upgrade { " (upgrade)" } else { "" }
        );
        let mut cmd = Command::new(BIN);
        cmd.arg("--config")
            .arg(repo().join("docker/gateway.yaml"))
            .args(upgrade.then_some("--upgrade"))
            .current_dir(repo());
        clean_env(&mut cmd);
        cmd.envs(self.gateway_env(i));
        let proc = Proc::spawn(&name, cmd, "build it with `cargo build`");
        let old = std::mem::replace(&mut self.gateways[i].pid, proc.pid());
        self.spawned.push(proc);
        old
    }

    /// Whether process `pid` of the fleet (started by the script or by this test) is still
    /// running. Reaps the test's own gateways that have exited.
    pub fn running(&mut self, pid: u32) -> bool {
        for p in &mut self.spawned {
            if p.pid() == pid && p.exited().is_some() {
                return false;
            }
        }
        Identity::of(pid).is_some_and(Identity::running)
    }

    /// Wait until process `pid` of the fleet has exited, at most `within`; how long it took.
    pub async fn wait_exit(&mut self, pid: u32, within: Duration) -> Duration {
        let start = std::time::Instant::now();
        eventually(format!("fleet process {pid} exits"), within)
            .every(Duration::from_millis(10))
            .holds(|| !self.running(pid))
            .await;
        start.elapsed()
    }

    /// Wait until gateway `i`'s `/readyz` answers 200 while its process runs (at most 20 s).
    pub async fn wait_ready(&mut self, i: usize) {
        let (pid, url) = (
            self.gateways[i].pid,
            format!("http://{}/readyz", self.gateways[i].admin),
        );
        let client = self.client.clone();
        let within = Duration::from_secs(20);
        eventually(
            format!("{} (pid {pid}) is ready", self.gateways[i].name),
            within,
        )
        .holds_async(|| {
            let running = self.running(pid);
            let ok = super::http::http_ok(&client, &url);
            async move {
                if running {
                    ok.await.then_some(Ok(()))
                } else {
                    Some(Err(format!("pid {pid} exited")))
                }
            }
        })
        .await
        .unwrap_or_else(|e: String| panic!("{e}"));
    }

    /// HAProxy's status of each gateway: `gateway-1` → "UP", "DOWN", "DOWN 1/2", ...
    pub async fn lb_status(&self) -> std::collections::BTreeMap<String, String> {
        haproxy::server_status(&self.client, self.lb_stats, "gateways").await
    }

    /// HAProxy's counter `field` of gateway `name` (`chkdown`, `wretr`, `wredis`, ...).
    pub async fn lb_counter(&self, name: &str, field: &str) -> u64 {
        let stats = haproxy::server_stats(&self.client, self.lb_stats, "gateways").await;
        let value = stats
            .get(name)
            .and_then(|s| s.get(field))
            .unwrap_or_else(|| panic!("no {field} of {name} in HAProxy's stats: {stats:?}"));
        value.parse().unwrap_or(0)
    }

    /// Poll HAProxy's stats every 50 ms until gateway `name` has `status`; panics after
    /// `within`.
    pub async fn wait_lb_status(&self, name: &str, status: &str, within: Duration) {
        eventually(format!("HAProxy holds {name} {status}"), within)
            .holds_on(
                || self.lb_status(),
                |s| s.get(name).map(String::as_str) == Some(status),
            )
            .await;
    }
}

impl Drop for Fleet {
    fn drop(&mut self) {
        if std::thread::panicking() {
            for m in MEMBERS {
                let log = self.log(m);
                let mut from = log.len().saturating_sub(LOG_TAIL);
                while !log.is_char_boundary(from) {
                    from += 1;
                }
                eprintln!("----- fleet {m} log (tail) -----\n{}", &log[from..]);
            }
        }
        // The script's trap stops every process it started; wait for it, bounded.
        if self.script.exited().is_none() {
            self.script.signal("TERM");
            let start = std::time::Instant::now();
            while self.script.exited().is_none() && start.elapsed() < DOWN_WITHIN {
                std::thread::sleep(Duration::from_millis(50));
            }
        }
        for (_, id) in &self.processes {
            if id.alive() {
                let _ = Command::new("kill")
                    .args(["-KILL", &id.pid.to_string()])
                    .status();
            }
        }
    }
}
