//! Real Redis processes: a single server, a 3-master cluster, and a master + replica +
//! sentinel, each on free loopback ports in its own temp directory, each process a [`Proc`]
//! (killed by PID when its guard drops, also when a test panics). And what the tests read
//! back from them with `redis-cli`. A missing `redis-server`, `redis-sentinel` or
//! `redis-cli` is a failure that says what to install, never a skip.

use std::process::Command;
use std::time::{Duration, Instant};

use tempfile::TempDir;
use tollgate::store::CounterKey;

use super::process::{free_port, free_port_with, Proc};
use super::wait::eventually;

const INSTALL: &str = "redis-server, redis-sentinel and redis-cli are needed: run scripts/setup.sh or `apt-get install -y redis-server redis-sentinel redis-tools`";

/// The name the sentinel of [`RedisSentinel`] knows the master by.
pub const MASTER_NAME: &str = "mymaster";

/// How long a Redis process or a set of them gets to come up.
const START_WITHIN: Duration = Duration::from_secs(20);

/// Run redis-cli against the server at `port`: its stdout, or `Err(stderr)` if it failed (the
/// server is not up yet, say).
fn try_cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_string())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

/// Run redis-cli and return its stdout; a failing redis-cli fails the test.
pub fn cli(port: u16, args: &[&str]) -> String {
    try_cli(port, args)
        .unwrap_or_else(|stderr| panic!("redis-cli {args:?} on port {port} failed: {stderr}"))
}

/// Wait (blocking, at most 10 s) until the server at `port` answers PING: `true`, or `false`
/// when `proc` exited first (a port it needs was taken).
fn wait_ping(port: u16, proc: &mut Proc) -> bool {
    eventually(
        format!("redis on port {port} answers PING"),
        Duration::from_secs(10),
    )
    .holds_blocking(|| {
        if try_cli(port, &["PING"]).is_ok_and(|pong| pong == "PONG") {
            Some(true)
        } else {
            proc.exited().map(|_| false)
        }
    })
}

/// The base key of limit `limit` with key parts `parts` under `prefix` (see
/// `RedisStore::base_key`): `{prefix:limit:hex}`.
pub fn base_key(prefix: &str, limit: &str, parts: &[&[u8]]) -> String {
    let key = CounterKey::new(limit, parts.iter().copied());
    format!("{{{prefix}:{limit}:{}}}", key.hex())
}

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    proc: Option<Proc>,
    extra: Vec<String>,
    dir: TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with extra `--name value` arguments. A cluster node also listens on its port +
    /// 10000 (the cluster bus), which is checked free too; a server that exits because a
    /// port of its was taken meanwhile (by any socket on the machine) is started again on
    /// new ones, up to three times.
    pub fn start_with(extra: &[&str]) -> Self {
        let bus = extra.contains(&"--cluster-enabled");
        let mut last_output = String::new();
        for _ in 0..3 {
            let mut s = RedisServer {
                port: if bus {
                    free_port_with(10_000)
                } else {
                    free_port()
                },
                proc: None,
                extra: extra.iter().map(|a| a.to_string()).collect(),
                dir: tempfile::tempdir().expect("tempdir"),
            };
            if s.try_spawn() {
                return s;
            }
            last_output = s.proc.as_ref().map_or(String::new(), Proc::output);
        }
        panic!("redis-server exited at start three times (its ports taken?); last output: {last_output}")
    }

    fn spawn(&mut self) {
        assert!(
            self.try_spawn(),
            "redis-server :{} exited at start: {}",
            self.port,
            self.proc.as_ref().map_or(String::new(), Proc::output)
        );
    }

    /// Start the server on its port; `false` if it exited before it answered PING.
    fn try_spawn(&mut self) -> bool {
        let mut cmd = Command::new("redis-server");
        cmd.args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .current_dir(self.dir.path());
        let name = format!("redis-server :{}", self.port);
        let proc = self.proc.insert(Proc::spawn(&name, cmd, INSTALL));
        wait_ping(self.port, proc)
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    pub fn pid(&self) -> u32 {
        self.proc.as_ref().expect("running").pid()
    }

    /// kill -9, then start again on the same port with an empty dataset and script cache.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// kill -9 (and reap).
    pub fn kill(&mut self) {
        self.proc = None;
    }

    /// Send a signal (`STOP`, `CONT`) to the process.
    pub fn signal(&self, sig: &str) {
        self.proc.as_ref().expect("running").signal(sig);
    }

    /// Keys matching `pattern`, sorted.
    pub fn scan(&self, pattern: &str) -> Vec<String> {
        // (redis-cli 7.0 has no `--count` option: with it, it prints nothing and exits 1.)
        let mut keys: Vec<String> = self
            .cli(&["--scan", "--pattern", pattern])
            .lines()
            .filter(|l| !l.is_empty())
            .map(str::to_string)
            .collect();
        keys.sort();
        keys
    }

    /// Every key with its TTL in ms (`PTTL`), in key order.
    pub fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        self.scan("*")
            .into_iter()
            .map(|k| {
                let ttl = self.cli(&["PTTL", &k]);
                let ttl = ttl.parse().unwrap_or_else(|_| panic!("PTTL {k}: {ttl:?}"));
                (k, ttl)
            })
            .collect()
    }

    /// `errorstat_NOSCRIPT` from `INFO errorstats` (0 if none yet).
    pub fn noscript_errors(&self) -> u64 {
        self.cli(&["INFO", "errorstats"])
            .lines()
            .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
            .map(|n| n.trim().parse().expect("count"))
            .unwrap_or(0)
    }

    /// Calls of command `cmd` (for example `evalsha`) from `INFO commandstats` (0 if none).
    pub fn command_calls(&self, cmd: &str) -> u64 {
        self.cli(&["INFO", "commandstats"])
            .lines()
            .find_map(|l| l.strip_prefix(&format!("cmdstat_{cmd}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("calls"))
    }

    /// Whether this server is a replica whose link to its master is up (its first sync done).
    /// A server that cannot answer right now (it closes its clients while its role changes)
    /// is not synced yet: meant for polling.
    pub fn replica_synced(&self) -> bool {
        try_cli(self.port, &["INFO", "replication"])
            .is_ok_and(|info| info.contains("master_link_status:up"))
    }

    /// Whether `ROLE` names this server's role as `role` (`master`, `slave`). A server that
    /// cannot answer right now is not in that role yet: when Sentinel demotes a master it
    /// closes the server's client connections, so a poll can see "Server closed the
    /// connection" mid-failover.
    pub fn has_role(&self, role: &str) -> bool {
        try_cli(self.port, &["ROLE"]).is_ok_and(|out| out.starts_with(role))
    }
}

/// Three masters, no replicas, created with `redis-cli --cluster create`.
pub struct RedisCluster {
    pub nodes: Vec<RedisServer>,
}

impl RedisCluster {
    pub fn start() -> Self {
        let nodes: Vec<RedisServer> = (0..3)
            .map(|_| {
                RedisServer::start_with(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        let out = Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&addrs)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
            .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
        assert!(
            out.status.success(),
            "redis-cli --cluster create failed: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        eventually("the cluster reaches state ok", START_WITHIN)
            .every(Duration::from_millis(100))
            .holds_blocking(|| {
                nodes
                    .iter()
                    .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
            });
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}

/// A master, one replica and one sentinel watching them as [`MASTER_NAME`].
pub struct RedisSentinel {
    sentinel: Proc,
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel_port: u16,
    dir: TempDir,
}

impl RedisSentinel {
    /// Returned once the replica has synced and the sentinel knows the master.
    pub fn start() -> Self {
        let master = RedisServer::start();
        let replica =
            RedisServer::start_with(&["--replicaof", "127.0.0.1", &master.port.to_string()]);
        let dir = tempfile::tempdir().expect("tempdir");
        let sentinel_port = free_port();
        let conf = dir.path().join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\nsentinel resolve-hostnames no\n\
                 sentinel monitor {MASTER_NAME} 127.0.0.1 {} 1\n\
                 sentinel down-after-milliseconds {MASTER_NAME} 2000\n\
                 sentinel failover-timeout {MASTER_NAME} 10000\n",
                master.port
            ),
        )
        .expect("write sentinel.conf");
        let mut cmd = Command::new("redis-sentinel");
        cmd.arg(&conf).current_dir(dir.path());
        let mut sentinel = Proc::spawn(&format!("redis-sentinel :{sentinel_port}"), cmd, INSTALL);
        assert!(
            wait_ping(sentinel_port, &mut sentinel),
            "redis-sentinel :{sentinel_port} exited at start: {}",
            sentinel.output()
        );
        let s = RedisSentinel {
            sentinel,
            master,
            replica,
            sentinel_port,
            dir,
        };
        // The replica must have synced before a failover could promote it.
        let start = Instant::now();
        s.wait_replica_synced();
        eventually(
            "the sentinel learns the master",
            START_WITHIN.saturating_sub(start.elapsed()),
        )
        .every(Duration::from_millis(100))
        .holds_blocking(|| s.names_master(s.master.port));
        s
    }

    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel_port)
    }

    /// redis-cli against the sentinel.
    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.sentinel_port, args)
    }

    /// Whether the sentinel names the server at `port` as the master.
    pub fn names_master(&self, port: u16) -> bool {
        self.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME])
            .contains(&port.to_string())
    }

    /// Wait (blocking, at most 20 s) until the replica has finished its first sync: it waits
    /// for repl-diskless-sync-delay (5 s by default), and a failover before that promotes an
    /// empty replica.
    pub fn wait_replica_synced(&self) {
        eventually("the replica syncs with the master", START_WITHIN)
            .every(Duration::from_millis(100))
            .holds_blocking(|| self.replica.replica_synced())
    }
}
