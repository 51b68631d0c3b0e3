//! The fleet under test: `docker/fleet.sh`, the script a person runs too, started on free
//! loopback ports: redis-server, the demo upstream, two gateways on `docker/gateway.yaml` and
//! HAProxy on `docker/haproxy.cfg`, the files compose uses. The test reads the addresses and
//! pids the script writes to `fleet.env` once everything answers.
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
    script: Proc,
    dir: TempDir,
    client: reqwest::Client,
}

impl Fleet {
    /// Start the fleet with `env` added to the script's environment (it reaches both
    /// gateways: `TOLLGATE_FREE_LIMIT`, ...). No `TOLLGATE_*` or `FLEET_*` variable of the
    /// test's own environment gets through. `TOLLGATE_GRACE_PERIOD` is 1s unless `env` says
    /// otherwise, so that the fleet stops quickly when the test ends.
    pub async fn start(env: &[(&str, &str)]) -> Fleet {
        on_free_ports("fleet", || async move {
            let dir = tempfile::tempdir().expect("temp dir");
            let mut cmd = Command::new("bash");
            cmd.arg(repo().join("docker/fleet.sh"))
                .arg("--dir")
                .arg(dir.path())
                .args(["--bin", BIN])
                .current_dir(repo())
                .env("NO_COLOR", "1")
                .env_remove("RUST_LOG");
            for (k, _) in std::env::vars() {
                if k.starts_with("TOLLGATE_") || k.starts_with("FLEET_") {
                    cmd.env_remove(k);
                }
            }
            cmd.env("TOLLGATE_GRACE_PERIOD", "1s");
            cmd.envs(env.iter().copied());
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
            up.map(|()| Fleet::from_env_file(script, dir))
        })
        .await
    }

    fn from_env_file(script: Proc, dir: TempDir) -> Fleet {
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
            script,
            dir,
            client: client_builder()
                .timeout(Duration::from_secs(2))
                .build()
                .expect("client"),
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

    /// HAProxy's status of each gateway: `gateway-1` → "UP", "DOWN", "DOWN 1/2", ...
    pub async fn lb_status(&self) -> std::collections::BTreeMap<String, String> {
        haproxy::server_status(&self.client, self.lb_stats, "gateways").await
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
