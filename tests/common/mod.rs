//! Shared harness of the integration tests: real `tollgate` processes on loopback.
//!
//! [`Upstream`] runs `tollgate demo-upstream` (echoes each request as JSON, counts them);
//! [`Gateway`] runs the gateway on a temporary config file. Both pick free loopback ports,
//! retry when a port was taken in the meantime, wait (bounded) until they answer, capture
//! stderr to a temporary file, and are killed by PID when dropped, also when a test panics
//! (then the captured stderr is printed, so a failure shows what the process logged).
//!
//! Every wait here is bounded; nothing listens or connects outside 127.0.0.0/8.
#![allow(dead_code)] // Each test binary uses a different part of the harness.

use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use reqwest::header::{HeaderMap, HeaderName, HeaderValue};
use reqwest::{Method, StatusCode};
use serde::Deserialize;
use tempfile::{NamedTempFile, TempDir};

/// How long a process gets to answer after it was started.
pub const START_TIMEOUT: Duration = Duration::from_secs(20);
/// Start attempts when a picked port turns out to be taken.
const START_ATTEMPTS: usize = 5;
/// Timeout of every HTTP request a test makes.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(20);

pub const QUOTA_EXCEEDED: &str = "https://iana.org/assignments/http-problem-types#quota-exceeded";

const BIN: &str = env!("CARGO_BIN_EXE_tollgate");

/// A free TCP port on 127.0.0.1 (bound, read, released: the caller retries if it is gone).
pub fn free_port() -> u16 {
    TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .expect("bind 127.0.0.1:0")
        .local_addr()
        .expect("local addr")
        .port()
}

/// A loopback port on which connections are refused for as long as the value lives: the
/// socket is bound (so no other process gets the port) but never listens.
pub struct ClosedPort {
    _socket: tokio::net::TcpSocket,
    pub port: u16,
}

impl ClosedPort {
    pub fn new() -> ClosedPort {
        let socket = tokio::net::TcpSocket::new_v4().expect("socket");
        socket.bind(loopback(0)).expect("bind 127.0.0.1:0");
        let port = socket.local_addr().expect("local addr").port();
        ClosedPort {
            _socket: socket,
            port,
        }
    }
}

/// The soft limit on open files of this process (`/proc/self/limits`), if known.
pub fn max_open_files() -> Option<u64> {
    let limits = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = limits.lines().find(|l| l.starts_with("Max open files"))?;
    line.split_whitespace().nth(3)?.parse().ok()
}

pub fn loopback(port: u16) -> SocketAddr {
    SocketAddr::from((Ipv4Addr::LOCALHOST, port))
}

/// Milliseconds since the Unix epoch (the gateway's clock: the same system clock).
pub fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_millis() as u64
}

/// Fixed windows are aligned to the Unix epoch. If fewer than `margin` seconds are left in
/// the current window of `window_s` seconds, sleep into the next one, so a test that takes
/// less than `margin` seconds never sees a window boundary. Sleeps at most `margin` + 1 s.
pub async fn clear_of_window_boundary(window_s: u64, margin_s: u64) {
    assert!(margin_s < window_s);
    let now = now_ms();
    let window_ms = window_s * 1000;
    let left = window_ms - now % window_ms;
    if left < margin_s * 1000 {
        tokio::time::sleep(Duration::from_millis(left + 200)).await;
    }
}

/// A client of the gateway: no proxy from the environment, bounded timeouts.
pub fn client() -> reqwest::Client {
    client_builder().build().expect("reqwest client")
}

pub fn client_builder() -> reqwest::ClientBuilder {
    reqwest::Client::builder()
        .no_proxy()
        .timeout(REQUEST_TIMEOUT)
        .connect_timeout(Duration::from_secs(5))
}

/// A client whose connections come from `local` (any 127.x.y.z works on Linux: all of
/// 127.0.0.0/8 is routed to `lo`).
pub fn client_from(local: Ipv4Addr) -> reqwest::Client {
    client_builder()
        .local_address(IpAddr::V4(local))
        .build()
        .expect("reqwest client")
}

/// A whole response, read.
#[derive(Debug)]
pub struct Resp {
    pub status: StatusCode,
    pub headers: HeaderMap,
    pub body: Vec<u8>,
}

impl Resp {
    pub async fn read(r: reqwest::Response) -> Resp {
        let status = r.status();
        let headers = r.headers().clone();
        let body = r.bytes().await.expect("response body").to_vec();
        Resp {
            status,
            headers,
            body,
        }
    }

    /// The single value of header `name`; panics (showing the response) when absent or
    /// repeated.
    pub fn header(&self, name: &str) -> &str {
        let mut all = self.headers.get_all(name).iter();
        let Some(v) = all.next() else {
            panic!("no {name} header in {self:#?}");
        };
        assert!(
            all.next().is_none(),
            "{name} sent more than once: {self:#?}"
        );
        v.to_str().expect("visible ASCII header")
    }

    pub fn opt_header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).map(|v| v.to_str().expect("ascii"))
    }

    /// A header parsed as an unsigned integer.
    pub fn header_u64(&self, name: &str) -> u64 {
        let v = self.header(name);
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: {v:?} is not a number"))
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {:?}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The `t` parameter of the `RateLimit` header.
    pub fn ratelimit_t(&self) -> u64 {
        let v = self.header("ratelimit");
        let t = v
            .split(';')
            .find_map(|p| p.strip_prefix("t="))
            .unwrap_or_else(|| panic!("no t= in RateLimit {v:?}"));
        t.parse()
            .unwrap_or_else(|_| panic!("RateLimit t={t:?} is not a number"))
    }

    /// None of the rate-limit headers is present.
    pub fn assert_no_ratelimit_headers(&self) {
        for h in [
            "ratelimit",
            "ratelimit-policy",
            "x-ratelimit-limit",
            "x-ratelimit-remaining",
            "x-ratelimit-reset",
            "retry-after",
        ] {
            assert!(
                self.headers.get(h).is_none(),
                "unexpected {h} header: {self:#?}"
            );
        }
    }
}

/// Send `method url` with `headers` (appended in order, so a name may repeat) and `body`.
pub async fn send(
    client: &reqwest::Client,
    method: Method,
    url: &str,
    headers: &[(&str, &str)],
    body: Option<Vec<u8>>,
) -> Resp {
    let mut map = HeaderMap::new();
    for (k, v) in headers {
        map.append(
            HeaderName::from_bytes(k.as_bytes()).expect("header name"),
            HeaderValue::from_bytes(v.as_bytes()).expect("header value"),
        );
    }
    let mut req = client.request(method.clone(), url).headers(map);
    if let Some(b) = body {
        req = req.body(b);
    }
    let r = req
        .send()
        .await
        .unwrap_or_else(|e| panic!("{method} {url}: {e:?}"));
    Resp::read(r).await
}

pub async fn get(client: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Resp {
    send(client, Method::GET, url, headers, None).await
}

/// `GET url`, which must answer 200 with JSON.
pub async fn get_json<T: serde::de::DeserializeOwned>(client: &reqwest::Client, url: &str) -> T {
    let r = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {e}"));
    assert_eq!(r.status(), StatusCode::OK, "GET {url}");
    r.json()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: not JSON: {e}"))
}

/// A child process that is killed (SIGKILL, by PID) and reaped when dropped.
pub struct Proc {
    name: String,
    child: Child,
    log: NamedTempFile,
}

impl Proc {
    fn spawn(name: &str, args: &[String], env: &[(&str, &str)]) -> Proc {
        let log = NamedTempFile::new().expect("temp file for stderr");
        let err = log.as_file().try_clone().expect("clone log fd");
        let out = log.as_file().try_clone().expect("clone log fd");
        let mut cmd = Command::new(BIN);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err))
            // Plain text logs; no proxy settings or config from the environment.
            .env("NO_COLOR", "1")
            .env_remove("RUST_LOG")
            .env_remove("TOLLGATE_CONFIG")
            .env_remove("TOLLGATE_REDIS_URL");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {BIN}: {e}"));
        Proc {
            name: name.to_string(),
            child,
            log,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Everything the process wrote to stdout and stderr so far.
    pub fn output(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }

    /// `Some(status)` once the process has exited.
    pub fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().expect("try_wait")
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            let out = self.output();
            let tail = &out[out.len().saturating_sub(16_000)..];
            eprintln!(
                "----- {} (pid {}) output -----\n{tail}\n----- end of {} output -----",
                self.name,
                self.child.id(),
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
async fn on_free_ports<T, F, Fut>(name: &str, mut attempt: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
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

/// Poll `ready` every 50 ms until it holds, the process exits, or [`START_TIMEOUT`].
/// `Err(output)` when the process exited.
async fn wait_ready<F, Fut>(proc: &mut Proc, mut ready: F) -> Result<(), String>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = Instant::now() + START_TIMEOUT;
    loop {
        if let Some(status) = proc.exited() {
            return Err(format!("exited with {status}:\n{}", proc.output()));
        }
        if ready().await {
            return Ok(());
        }
        if Instant::now() > deadline {
            panic!(
                "{} did not become ready within {START_TIMEOUT:?}; output:\n{}",
                proc.name,
                proc.output()
            );
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn http_ok(client: &reqwest::Client, url: &str) -> bool {
    match client.get(url).send().await {
        Ok(r) => r.status() == StatusCode::OK,
        Err(_) => false,
    }
}

fn tcp_open(addr: SocketAddr) -> bool {
    TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok()
}

/// The demo upstream, `tollgate demo-upstream --listen 127.0.0.1:PORT`.
pub struct Upstream {
    pub addr: SocketAddr,
    pub proc: Proc,
    client: reqwest::Client,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
pub struct Stats {
    pub requests: u64,
    pub in_flight: u64,
    pub max_in_flight: u64,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let client = client_builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        let client = &client;
        on_free_ports("demo upstream", || async move {
            let addr = loopback(free_port());
            let mut proc = Proc::spawn(
                "demo upstream",
                &["demo-upstream".into(), "--listen".into(), addr.to_string()],
                &[],
            );
            let stats = format!("http://{addr}/__demo/stats");
            wait_ready(&mut proc, || http_ok(client, &stats))
                .await
                .map(|()| Upstream {
                    addr,
                    proc,
                    client: client.clone(),
                })
        })
        .await
    }

    pub async fn stats(&self) -> Stats {
        get_json(&self.client, &format!("http://{}/__demo/stats", self.addr)).await
    }

    pub async fn requests(&self) -> u64 {
        self.stats().await.requests
    }

    pub async fn reset(&self) {
        let r = self
            .client
            .post(format!("http://{}/__demo/reset", self.addr))
            .send()
            .await
            .expect("POST /__demo/reset");
        assert_eq!(r.status(), StatusCode::OK);
    }
}

/// The gateway on a temporary `gateway.yaml`, with `--listen` and `--admin-listen` on free
/// loopback ports.
pub struct Gateway {
    pub listen: SocketAddr,
    pub admin: SocketAddr,
    pub proc: Proc,
    dir: TempDir,
    client: reqwest::Client,
}

impl Gateway {
    pub async fn start(yaml: &str) -> Gateway {
        Gateway::launch("gateway".into(), yaml, &[], &[]).await
    }

    /// Start with extra environment variables (for example a JWT secret).
    pub async fn start_with_env(yaml: &str, env: &[(&str, &str)]) -> Gateway {
        Gateway::launch("gateway".into(), yaml, &[], env).await
    }

    /// Start with extra command-line arguments (after `--config`, `--listen` and
    /// `--admin-listen`) and environment variables. `name` tells several gateways of one test
    /// apart: the process is "gateway {name}" in its panic output and error messages.
    pub async fn start_named(
        name: &str,
        yaml: &str,
        args: &[&str],
        env: &[(&str, &str)],
    ) -> Gateway {
        Gateway::launch(format!("gateway {name}"), yaml, args, env).await
    }

    async fn launch(name: String, yaml: &str, extra: &[&str], env: &[(&str, &str)]) -> Gateway {
        let client = client_builder()
            .timeout(Duration::from_secs(2))
            .build()
            .expect("client");
        let (client, name) = (&client, name.as_str());
        on_free_ports(name, || async move {
            let dir = tempfile::tempdir().expect("temp dir");
            std::fs::write(dir.path().join("gateway.yaml"), yaml).expect("write config");
            let (listen, admin) = (loopback(free_port()), loopback(free_port()));
            let mut args = vec![
                "--config".to_string(),
                dir.path().join("gateway.yaml").display().to_string(),
                "--listen".into(),
                listen.to_string(),
                "--admin-listen".into(),
                admin.to_string(),
            ];
            args.extend(extra.iter().map(|a| a.to_string()));
            let mut proc = Proc::spawn(name, &args, env);
            let healthz = format!("http://{admin}/healthz");
            wait_ready(&mut proc, || {
                let healthz = &healthz;
                async move { http_ok(client, healthz).await && tcp_open(listen) }
            })
            .await
            .map(|()| Gateway {
                listen,
                admin,
                proc,
                dir,
                client: client.clone(),
            })
        })
        .await
    }

    /// `http://127.0.0.1:PORT{path}` of the proxy listener.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.listen)
    }

    pub fn pid(&self) -> u32 {
        self.proc.pid()
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("gateway.yaml")
    }

    /// Everything the gateway logged so far.
    pub fn output(&self) -> String {
        self.proc.output()
    }

    /// Replace the config file atomically (write a sibling, rename over it).
    pub fn replace_config(&self, yaml: &str) {
        let tmp = self.dir.path().join("gateway.yaml.new");
        std::fs::write(&tmp, yaml).expect("write new config");
        std::fs::rename(&tmp, self.config_path()).expect("rename config");
    }

    /// Rewrite the config file in place, as an editor saving it would.
    pub fn rewrite_config(&self, yaml: &str) {
        std::fs::write(self.config_path(), yaml).expect("rewrite config");
    }

    /// Send SIGHUP with `kill -HUP <pid>`.
    pub fn sighup(&self) {
        let status = Command::new("kill")
            .args(["-HUP", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -HUP {} failed", self.pid());
    }

    /// `GET /readyz` of the admin listener, which must answer 200.
    pub async fn readyz(&self) -> serde_json::Value {
        get_json(&self.client, &format!("http://{}/readyz", self.admin)).await
    }

    /// `GET /readyz` of the admin listener, whatever it answers (503 while the store is
    /// unreachable): the status and the JSON body. Each request may take up to 5 s.
    pub async fn readyz_status(&self) -> (u16, serde_json::Value) {
        let url = format!("http://{}/readyz", self.admin);
        let r = self
            .client
            .get(&url)
            .timeout(Duration::from_secs(5))
            .send()
            .await
            .unwrap_or_else(|e| panic!("GET {url}: {e}"));
        let status = r.status().as_u16();
        let body = r
            .json()
            .await
            .unwrap_or_else(|e| panic!("GET {url} ({status}): not JSON: {e}"));
        (status, body)
    }

    /// Poll `/readyz` every 50 ms until it answers `want`; panics after `within`. Returns the
    /// JSON body of that answer.
    pub async fn wait_readyz(&self, want: u16, within: Duration) -> serde_json::Value {
        let start = Instant::now();
        loop {
            let (status, body) = self.readyz_status().await;
            if status == want {
                return body;
            }
            assert!(
                start.elapsed() < within,
                "/readyz of {} did not answer {want} within {within:?} (last {status} {body}); output:\n{}",
                self.proc.name,
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// `GET /stats` of the admin listener: requests in flight, shedding per class, slots.
    pub async fn stats(&self) -> serde_json::Value {
        get_json(&self.client, &format!("http://{}/stats", self.admin)).await
    }

    /// Successful reloads since start, from `/readyz`.
    pub async fn generation(&self) -> u64 {
        self.readyz().await["config_generation"]
            .as_u64()
            .expect("config_generation")
    }

    /// Poll every 50 ms until the config generation reaches `at_least`; panics after
    /// `within`. Returns how long it took.
    pub async fn wait_generation(&self, at_least: u64, within: Duration) -> Duration {
        let start = Instant::now();
        loop {
            if self.generation().await >= at_least {
                return start.elapsed();
            }
            assert!(
                start.elapsed() < within,
                "config generation did not reach {at_least} within {within:?}; output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// Poll the gateway's output every 50 ms until it contains `needle`; panics after
    /// `within`.
    pub async fn wait_output(&self, needle: &str, within: Duration) {
        let start = Instant::now();
        loop {
            if self.output().contains(needle) {
                return;
            }
            assert!(
                start.elapsed() < within,
                "the gateway did not log {needle:?} within {within:?}; output:\n{}",
                self.output()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// Occurrences of `needle` in `haystack`.
pub fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

/// Unix seconds at which the fixed window of `window_s` seconds containing `ms` ends.
pub fn window_end_s(ms: u64, window_s: u64) -> u64 {
    (ms / 1000 / window_s + 1) * window_s
}

/// For a fixed window of `window_s` seconds and a request sent at `before` and answered at
/// `after` (ms), the `t` the gateway may report: it is `end − floor(now_s)` for the gateway's
/// `now` in `[before, after]`, because the window end is a whole second.
pub fn fixed_window_t_range(
    before: u64,
    after: u64,
    window_s: u64,
) -> std::ops::RangeInclusive<u64> {
    let end = window_end_s(before, window_s);
    assert_eq!(
        end,
        window_end_s(after, window_s),
        "a window boundary passed during one request"
    );
    (end - after / 1000)..=(end - before / 1000)
}

pub fn path_of(p: &Path) -> String {
    p.display().to_string()
}

/// One HTTP/1.1 connection driven by hand, for what a client library hides (whether the
/// gateway keeps a connection open after an answer).
pub struct RawConn {
    stream: tokio::net::TcpStream,
    buf: Vec<u8>,
}

/// A response read from a [`RawConn`]: the head (status line and headers) and the body.
#[derive(Debug)]
pub struct RawResp {
    pub status: u16,
    pub head: String,
    pub body: Vec<u8>,
}

impl RawResp {
    /// The value of header `name` (case-insensitive), if present.
    pub fn header(&self, name: &str) -> Option<String> {
        self.head.lines().skip(1).find_map(|l| {
            let (k, v) = l.split_once(':')?;
            k.trim()
                .eq_ignore_ascii_case(name)
                .then(|| v.trim().to_string())
        })
    }
}

/// Send every request on its own [`RawConn`] to its address: all connections are opened
/// first, then every request is written at once. Returns each answer (None: the connection
/// closed without one), in order.
pub async fn raw_burst(targets: &[(SocketAddr, String)]) -> Vec<Option<RawResp>> {
    let mut conns = Vec::with_capacity(targets.len());
    for (addr, _) in targets {
        conns.push(RawConn::connect(*addr).await);
    }
    let barrier = std::sync::Arc::new(tokio::sync::Barrier::new(targets.len()));
    let tasks: Vec<_> = conns
        .into_iter()
        .zip(targets.iter().map(|(_, r)| r.clone()))
        .map(|(mut conn, req)| {
            let barrier = barrier.clone();
            tokio::spawn(async move {
                barrier.wait().await;
                conn.send(req.as_bytes()).await.ok()?;
                conn.read_response().await
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.expect("burst task"));
    }
    out
}

impl RawConn {
    pub async fn connect(addr: SocketAddr) -> RawConn {
        let stream =
            tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
                .await
                .expect("connect timed out")
                .expect("connect");
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, request: &[u8]) -> std::io::Result<()> {
        use tokio::io::AsyncWriteExt;
        self.stream.write_all(request).await
    }

    /// Read one response with a `Content-Length` body. `None` when the peer closed (or reset)
    /// the connection before a complete response; panics after 10 s without one.
    pub async fn read_response(&mut self) -> Option<RawResp> {
        use tokio::io::AsyncReadExt;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(end) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.buf[..end]).into_owned();
                let status = head
                    .split(' ')
                    .nth(1)
                    .and_then(|s| s.parse().ok())
                    .expect("status line");
                let mut resp = RawResp {
                    status,
                    head,
                    body: Vec::new(),
                };
                let len: usize = resp
                    .header("content-length")
                    .map_or(0, |v| v.parse().expect("content-length"));
                if self.buf.len() >= end + 4 + len {
                    resp.body = self.buf[end + 4..end + 4 + len].to_vec();
                    self.buf.drain(..end + 4 + len);
                    return Some(resp);
                }
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(!left.is_zero(), "no complete response within 10 s");
            let mut chunk = [0u8; 8192];
            match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
                Err(_) => panic!("no complete response within 10 s"),
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }
}
