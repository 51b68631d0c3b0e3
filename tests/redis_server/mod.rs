//! Real Redis processes for the integration tests: a single server, a 3-master cluster, and a
//! master + replica + sentinel, each on free loopback ports in its own temp directory. Every
//! process is killed by PID when its guard drops, also when a test panics. A missing
//! `redis-server` is a failure that says what to install, never a skip.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const INSTALL: &str = "redis-server, redis-sentinel and redis-cli are needed: run scripts/setup.sh or `apt-get install -y redis-server redis-sentinel redis-tools`";

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .unwrap()
        .port()
}

fn spawn(program: &str, args: &[String], dir: &Path) -> Child {
    Command::new(program)
        .args(args)
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}. {INSTALL}"))
}

/// Run redis-cli; its stdout, or `None` if it failed (e.g. the server is not up yet).
fn try_cli(port: u16, args: &[&str]) -> Option<String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// Run redis-cli and return its stdout; a failing redis-cli fails the test.
pub fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
    assert!(
        out.status.success(),
        "redis-cli {args:?} on port {port} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn wait_ping(port: u16) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if try_cli(port, &["PING"]).as_deref() == Some("PONG") {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("redis on port {port} did not answer PING within 10 s");
}

/// One redis-server process.
pub struct RedisServer {
    pub port: u16,
    child: Option<Child>,
    extra: Vec<String>,
    dir: tempfile::TempDir,
}

impl RedisServer {
    pub fn start() -> Self {
        Self::start_with(&[])
    }

    /// Start with extra `--name value` arguments.
    pub fn start_with(extra: &[&str]) -> Self {
        let mut s = RedisServer {
            port: free_port(),
            child: None,
            extra: extra.iter().map(|a| a.to_string()).collect(),
            dir: tempfile::tempdir().expect("tempdir"),
        };
        s.spawn();
        s
    }

    fn spawn(&mut self) {
        let mut args: Vec<String> = [
            "--port",
            &self.port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|a| a.to_string())
        .collect();
        args.extend(self.extra.iter().cloned());
        self.child = Some(spawn("redis-server", &args, self.dir.path()));
        wait_ping(self.port);
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    pub fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// kill -9, then start again on the same port with an empty dataset and script cache.
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Send a signal (`STOP`, `CONT`) to the process.
    pub fn signal(&self, sig: &str) {
        let status = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("kill");
        assert!(status.success(), "kill -{sig} failed");
    }

    /// Every key with its TTL in ms (`PTTL`).
    pub fn keys_with_ttl(&self) -> Vec<(String, i64)> {
        let keys = self.cli(&["--scan"]);
        keys.lines()
            .filter(|k| !k.is_empty())
            .map(|k| (k.to_string(), self.cli(&["PTTL", k]).parse().unwrap_or(-3)))
            .collect()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
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
        let deadline = Instant::now() + Duration::from_secs(20);
        for n in &nodes {
            while !n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok") {
                assert!(
                    Instant::now() < deadline,
                    "cluster did not reach state ok in 20 s"
                );
                std::thread::sleep(Duration::from_millis(100));
            }
        }
        RedisCluster { nodes }
    }

    pub fn urls(&self) -> Vec<String> {
        self.nodes.iter().map(|n| n.url()).collect()
    }
}

/// A master, one replica and one sentinel watching them as `mymaster`.
pub struct RedisSentinel {
    pub master: RedisServer,
    pub replica: RedisServer,
    pub sentinel_port: u16,
    sentinel: Option<Child>,
    dir: tempfile::TempDir,
}

pub const MASTER_NAME: &str = "mymaster";

impl RedisSentinel {
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
        let sentinel = spawn("redis-sentinel", &[conf.display().to_string()], dir.path());
        wait_ping(sentinel_port);
        // The replica must have synced before a failover could promote it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
        {
            assert!(
                Instant::now() < deadline,
                "replica did not sync with the master in 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        while !cli(
            sentinel_port,
            &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
        )
        .contains(&master.port.to_string())
        {
            assert!(
                Instant::now() < deadline,
                "sentinel did not learn the master in 20 s"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        RedisSentinel {
            master,
            replica,
            sentinel_port,
            sentinel: Some(sentinel),
            dir,
        }
    }

    pub fn sentinel_url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.sentinel_port)
    }
}

impl Drop for RedisSentinel {
    fn drop(&mut self) {
        if let Some(mut c) = self.sentinel.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
