//! Figures for docs/stores.md's "When Redis fails": what a Redis outage costs requests, measured on
//! real processes with real faults. Starts its own `redis-server`, demo upstream and gateway
//! (all on free loopback ports, killed by PID when dropped, also on panic), drives closed-loop
//! load and makes Redis fail for real, once with `kill -9` (then a restart on the same port) and
//! once with `SIGSTOP` (then `SIGCONT`). Per run it prints:
//!
//! * p99 latency with Redis up, during the outage before the breaker opened, and after it opened
//!   (and the added p99 of both outage phases over the baseline);
//! * time to detect the outage: fault to the first degraded answer, and fault to the breaker
//!   opening (the gateway's log timestamp of `redis circuit breaker opened`);
//! * time to resume: Redis back to the first answer decided by Redis again, and whether a fresh
//!   caller then gets exactly its limit (20 of 30);
//! * noise: degraded answers in the baseline (deadline misses with Redis up) and breaker
//!   openings before the fault (`base_noise`, `<degraded>d/<openings>o`).
//!
//! Store settings are the defaults that matter here: `timeout: 25ms`, breaker of 3 failures and
//! 5 s cooldown. Redis stays down `OUTAGE_AFTER_OPEN` after the breaker opened.
//!
//! ```sh
//! cargo build --release --bin tollgate --example redis_outage
//! target/release/examples/redis_outage [runs per fault, default 3] [clients, default 8]
//! ```
//!
//! `TOLLGATE_BIN` overrides the gateway binary (default: `tollgate` next to `examples/`).

use std::net::{Ipv4Addr, TcpListener};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const INSTALL: &str =
    "redis-server and redis-cli are needed: `apt-get install -y redis-server redis-tools` (or scripts/setup.sh)";
const BASELINE: Duration = Duration::from_secs(5);
const OUTAGE_AFTER_OPEN: Duration = Duration::from_secs(2);
const COOLDOWN: Duration = Duration::from_secs(5);
const DEADLINE: Duration = Duration::from_millis(25);

fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("addr")
        .port()
}

/// A child process killed (SIGKILL, by PID) and reaped when dropped.
struct Proc(Option<Child>);

impl Proc {
    fn pid(&self) -> u32 {
        self.0.as_ref().expect("running").id()
    }
    fn kill(&mut self) {
        if let Some(mut c) = self.0.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
    fn signal(&self, sig: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{sig}"), &self.pid().to_string()])
            .status()
            .expect("run kill")
            .success();
        assert!(ok, "kill -{sig} failed");
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

fn redis_cli(port: u16, args: &[&str]) -> String {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run redis-cli: {e}. {INSTALL}"));
    String::from_utf8_lossy(&out.stdout).trim().to_string()
}

fn start_redis(port: u16, dir: &std::path::Path) -> Proc {
    let child = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .current_dir(dir)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start redis-server: {e}. {INSTALL}"));
    let p = Proc(Some(child));
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis_cli(port, &["PING"]) != "PONG" {
        assert!(
            Instant::now() < deadline,
            "redis-server did not answer in 10 s"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    p
}

fn tollgate_bin() -> PathBuf {
    if let Some(p) = std::env::var_os("TOLLGATE_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let bin = exe
        .parent()
        .and_then(|p| p.parent())
        .expect("examples dir")
        .join("tollgate");
    assert!(
        bin.exists(),
        "{} not found: run `cargo build --release --bin tollgate --example redis_outage` or set TOLLGATE_BIN",
        bin.display()
    );
    bin
}

fn spawn_tollgate(args: &[String], log: &std::path::Path) -> Proc {
    let f = std::fs::File::create(log).expect("log file");
    let child = Command::new(tollgate_bin())
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::from(f.try_clone().expect("fd")))
        .stderr(Stdio::from(f))
        .env("NO_COLOR", "1")
        .env_remove("RUST_LOG")
        .env_remove("TOLLGATE_CONFIG")
        .env_remove("TOLLGATE_REDIS_URL")
        .spawn()
        .expect("start tollgate");
    Proc(Some(child))
}

async fn wait_http(c: &reqwest::Client, url: &str) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if matches!(c.get(url).send().await, Ok(r) if r.status().is_success()) {
            return;
        }
        assert!(Instant::now() < deadline, "{url} did not answer in 20 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Unix microseconds of a log line's leading `YYYY-MM-DDTHH:MM:SS.ffffffZ`.
fn log_time_us(line: &str) -> Option<i64> {
    let ts = line.split_whitespace().next()?.strip_suffix('Z')?;
    let (date, time) = ts.split_once('T')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let mut t = hms.split(':').map(|x| x.parse::<i64>());
    let (hh, mm, ss) = (t.next()?.ok()?, t.next()?.ok()?, t.next()?.ok()?);
    let us: i64 = format!("{frac:0<6}")[..6].parse().ok()?;
    // Days from the civil date (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(((days * 86_400 + hh * 3600 + mm * 60 + ss) * 1_000_000) + us)
}

fn unix_us(t: SystemTime) -> i64 {
    t.duration_since(UNIX_EPOCH)
        .expect("after 1970")
        .as_micros() as i64
}

#[derive(Clone, Copy)]
struct Sample {
    sent: Instant,
    done: Instant,
    degraded: bool,
    status: u16,
}

fn p99(mut v: Vec<Duration>) -> Option<Duration> {
    if v.is_empty() {
        return None;
    }
    v.sort();
    let i = ((0.99 * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1;
    Some(v[i])
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

fn fmt_opt(d: Option<Duration>) -> String {
    d.map_or("-".into(), |d| format!("{:.1}", ms(d)))
}

fn signed_ms(a: Option<Duration>, b: Option<Duration>) -> String {
    match (a, b) {
        (Some(a), Some(b)) => format!("{:+.1}", ms(a) - ms(b)),
        _ => "-".into(),
    }
}

#[derive(Clone, Copy, PartialEq)]
enum Fault {
    Kill,
    Stop,
}

struct RunResult {
    base_p99: Option<Duration>,
    /// Degraded answers in the baseline (spurious deadline misses) and breaker openings
    /// before the fault.
    base_degraded: usize,
    opened_before: usize,
    pre_p99: Option<Duration>,
    pre_n: usize,
    open_p99: Option<Duration>,
    open_n: usize,
    first_degraded: Option<Duration>,
    detect: Duration,
    resume: Duration,
    resume_after_open: Duration,
    exact: String,
    errors: usize,
}

async fn run(fault: Fault, clients: usize) -> RunResult {
    let dir = tempfile::tempdir().expect("temp dir");
    let redis_port = free_port();
    let mut redis = start_redis(redis_port, dir.path());
    let up_addr = format!("127.0.0.1:{}", free_port());
    let _up = spawn_tollgate(
        &["demo-upstream".into(), "--listen".into(), up_addr.clone()],
        &dir.path().join("upstream.log"),
    );
    let (listen, admin) = (free_port(), free_port());
    let yaml = format!(
        "store: {{ backend: redis, url: \"redis://127.0.0.1:{redis_port}\", key_prefix: outage, timeout: 25ms }}\n\
         upstreams: {{ main: [\"{up_addr}\"] }}\n\
         routes:\n\
         \x20 - {{ name: open, match: {{ path_prefix: /open }}, upstream: main, limits: [ {{ name: open-limit, key: [\"header:x-c\"], limit: 100000000, window: 1h, on_error: allow }} ] }}\n\
         \x20 - {{ name: exact, match: {{ path_prefix: /exact }}, upstream: main, limits: [ {{ name: exact-limit, key: [\"header:x-k\"], algorithm: sliding_log, limit: 20, window: 1h, on_error: allow }} ] }}\n"
    );
    let config = dir.path().join("gateway.yaml");
    std::fs::write(&config, yaml).expect("write config");
    let log = dir.path().join("gateway.log");
    let _gw = spawn_tollgate(
        &[
            "--config".into(),
            config.display().to_string(),
            "--listen".into(),
            format!("127.0.0.1:{listen}"),
            "--admin-listen".into(),
            format!("127.0.0.1:{admin}"),
        ],
        &log,
    );
    let c = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(10))
        .build()
        .expect("client");
    wait_http(&c, &format!("http://{up_addr}/__demo/stats")).await;
    wait_http(&c, &format!("http://127.0.0.1:{admin}/healthz")).await;
    wait_http(&c, &format!("http://127.0.0.1:{admin}/readyz")).await;
    // Warm up (connect, load the script), then start from a closed breaker: the first calls
    // of a cold gateway may miss the 25 ms deadline.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let _ = c
            .get(format!("http://127.0.0.1:{listen}/open"))
            .header("x-c", "warm")
            .send()
            .await;
        let body: serde_json::Value = c
            .get(format!("http://127.0.0.1:{admin}/readyz"))
            .send()
            .await
            .expect("readyz")
            .json()
            .await
            .expect("readyz JSON");
        if body["store_status"]["breaker"] == "closed" {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "breaker not closed after 30 s: {body}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }

    // Closed-loop load: `clients` connections, each sending the next request when the last
    // one is answered.
    let stop = Arc::new(AtomicBool::new(false));
    let samples = Arc::new(Mutex::new(Vec::<Sample>::with_capacity(1 << 20)));
    let mut tasks = Vec::new();
    for i in 0..clients {
        let (stop, samples) = (stop.clone(), samples.clone());
        let url = format!("http://127.0.0.1:{listen}/open");
        tasks.push(tokio::spawn(async move {
            let c = reqwest::Client::builder()
                .no_proxy()
                .timeout(Duration::from_secs(10))
                .build()
                .expect("client");
            for _ in 0..10_000_000u64 {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let sent = Instant::now();
                let (status, degraded) = match c.get(&url).header("x-c", i.to_string()).send().await
                {
                    Ok(r) => {
                        let d = r.headers().contains_key("tollgate-degraded");
                        let s = r.status().as_u16();
                        let _ = r.bytes().await;
                        (s, d)
                    }
                    Err(_) => (0, false),
                };
                samples.lock().push(Sample {
                    sent,
                    done: Instant::now(),
                    degraded,
                    status,
                });
            }
        }));
    }

    tokio::time::sleep(BASELINE).await;
    let opened_line = "redis circuit breaker opened";
    let opened_before = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .matches(opened_line)
        .count();
    let fault_at = Instant::now();
    let fault_sys = SystemTime::now();
    match fault {
        Fault::Kill => redis.kill(),
        Fault::Stop => redis.signal("STOP"),
    }
    // The breaker's opening, from the gateway's log.
    let deadline = fault_at + Duration::from_secs(10);
    let open_us = loop {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        if let Some(line) = text
            .lines()
            .filter(|l| l.contains(opened_line))
            .nth(opened_before)
        {
            break log_time_us(line).expect("log timestamp");
        }
        assert!(
            Instant::now() < deadline,
            "the breaker did not open in 10 s"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    let detect = Duration::from_micros((open_us - unix_us(fault_sys)).max(0) as u64);
    let open_at = fault_at + detect;
    tokio::time::sleep(OUTAGE_AFTER_OPEN).await;
    let back_at = Instant::now();
    match fault {
        Fault::Kill => redis = start_redis(redis_port, dir.path()),
        Fault::Stop => redis.signal("CONT"),
    }
    // First answer decided by Redis again.
    let deadline = back_at + Duration::from_secs(30);
    let resumed_at = loop {
        let first = samples
            .lock()
            .iter()
            .filter(|s| s.sent >= back_at && !s.degraded && s.status == 200)
            .map(|s| s.sent)
            .min();
        if let Some(t) = first {
            break t;
        }
        assert!(
            Instant::now() < deadline,
            "Redis not used again within 30 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    // Exact again? A fresh caller: 30 requests, limit 20.
    let mut codes = std::collections::BTreeMap::<(u16, bool), usize>::new();
    for _ in 0..30 {
        let r = c
            .get(format!("http://127.0.0.1:{listen}/exact"))
            .header("x-k", "fresh")
            .send()
            .await
            .expect("exact request");
        let d = r.headers().contains_key("tollgate-degraded");
        *codes.entry((r.status().as_u16(), d)).or_default() += 1;
    }
    let exact = if codes
        == [((200, false), 20), ((429, false), 10)]
            .into_iter()
            .collect()
    {
        "exact (20 of 30)".to_string()
    } else {
        format!("NOT exact: {codes:?}")
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(15), t).await;
    }
    drop(redis);

    let samples = samples.lock().clone();
    let lat = |f: &dyn Fn(&Sample) -> bool| -> Vec<Duration> {
        samples
            .iter()
            .filter(|s| f(s))
            .map(|s| s.done - s.sent)
            .collect()
    };
    let base_window = |s: &Sample| s.sent >= fault_at - Duration::from_secs(4) && s.done < fault_at;
    let base_degraded = samples
        .iter()
        .filter(|s| base_window(s) && s.degraded)
        .count();
    let base = lat(&base_window);
    // Requests in flight at the fault or sent before the breaker opened.
    let pre = lat(&|s| s.done > fault_at && s.sent < open_at);
    let open = lat(&|s| s.sent > open_at && s.done < back_at);
    let first_degraded = samples
        .iter()
        .filter(|s| s.degraded && s.done > fault_at)
        .map(|s| s.done)
        .min()
        .map(|t| t.saturating_duration_since(fault_at));
    RunResult {
        base_p99: p99(base),
        base_degraded,
        opened_before,
        pre_n: pre.len(),
        pre_p99: p99(pre),
        open_n: open.len(),
        open_p99: p99(open),
        first_degraded,
        detect,
        resume: resumed_at.saturating_duration_since(back_at),
        resume_after_open: resumed_at.saturating_duration_since(open_at),
        exact,
        errors: samples.iter().filter(|s| s.status != 200).count(),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let runs: usize = args.get(1).map_or(3, |s| s.parse().expect("runs"));
    let clients: usize = args.get(2).map_or(8, |s| s.parse().expect("clients"));
    println!(
        "redis_outage: {clients} closed-loop clients, store.timeout {DEADLINE:?}, breaker 3 failures / {COOLDOWN:?} cooldown, Redis back {OUTAGE_AFTER_OPEN:?} after the breaker opened; times in ms"
    );
    println!(
        "{:<8} {:>3} {:>9} {:>10} {:>15} {:>5} {:>14} {:>6} {:>8} {:>7} {:>7} {:>11} {:>6}  exact after resume",
        "fault", "run", "base_p99", "base_noise", "preopen_p99", "(n)", "open_p99", "(n)", "1st_degr", "detect", "resume", "resume-open", "errors"
    );
    for fault in [Fault::Kill, Fault::Stop] {
        for i in 1..=runs {
            let r = run(fault, clients).await;
            let name = match fault {
                Fault::Kill => "kill -9",
                Fault::Stop => "SIGSTOP",
            };
            println!(
                "{:<8} {:>3} {:>9} {:>10} {:>15} {:>5} {:>14} {:>6} {:>8} {:>7.1} {:>7.0} {:>11.0} {:>6}  {}",
                name,
                i,
                fmt_opt(r.base_p99),
                format!("{}d/{}o", r.base_degraded, r.opened_before),
                format!("{} ({})", fmt_opt(r.pre_p99), signed_ms(r.pre_p99, r.base_p99)),
                r.pre_n,
                format!("{} ({})", fmt_opt(r.open_p99), signed_ms(r.open_p99, r.base_p99)),
                r.open_n,
                fmt_opt(r.first_degraded),
                ms(r.detect),
                ms(r.resume),
                ms(r.resume_after_open),
                r.errors,
                r.exact
            );
        }
    }
}
