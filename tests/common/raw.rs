//! HTTP/1.1 by hand over raw loopback sockets, for what a client library hides: whether the
//! gateway keeps a connection open after an answer, clients that hang up mid-request, and
//! bursts in which every request is written at the same moment.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::process::loopback;

/// How long [`RawConn::read_response`] waits for a complete response.
const READ_TIMEOUT: Duration = Duration::from_secs(10);

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

/// A request that closes its connection after the answer: `method path`, `Host:
/// tollgate.test`, an empty body, then `headers` in order.
pub fn raw_request(method: &str, path: &str, headers: &[(&str, &str)]) -> String {
    let mut r = format!(
        "{method} {path} HTTP/1.1\r\nHost: tollgate.test\r\nContent-Length: 0\r\nConnection: close\r\n"
    );
    for (k, v) in headers {
        r.push_str(&format!("{k}: {v}\r\n"));
    }
    r.push_str("\r\n");
    r
}

/// One HTTP/1.1 connection driven by hand.
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

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).expect("JSON body")
    }

    /// A problem answer of the gateway (RFC 9457): `status`, `Content-Type:
    /// application/problem+json`, and `"status": status` in the body, which it returns.
    pub fn problem(&self, status: u16) -> serde_json::Value {
        assert_eq!(self.status, status, "{self:?}");
        assert_eq!(
            self.header("content-type").as_deref(),
            Some("application/problem+json"),
            "{self:?}"
        );
        let body = self.json();
        assert_eq!(body["status"], status, "{body}");
        body
    }
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

    /// A connection already made.
    pub fn from_stream(stream: tokio::net::TcpStream) -> RawConn {
        RawConn {
            stream,
            buf: Vec::new(),
        }
    }

    pub async fn send(&mut self, request: &[u8]) -> std::io::Result<()> {
        self.stream.write_all(request).await
    }

    /// Read one response with a `Content-Length` body. `None` when the peer closed (or reset)
    /// the connection before a complete response; panics after 10 s without one.
    pub async fn read_response(&mut self) -> Option<RawResp> {
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            if let Some(resp) = self.take_response() {
                return Some(resp);
            }
            let left = deadline.saturating_duration_since(Instant::now());
            assert!(
                !left.is_zero(),
                "no complete response within {READ_TIMEOUT:?}"
            );
            let mut chunk = [0u8; 8192];
            match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
                Err(_) => panic!("no complete response within {READ_TIMEOUT:?}"),
                Ok(Ok(0)) | Ok(Err(_)) => return None,
                Ok(Ok(n)) => self.buf.extend_from_slice(&chunk[..n]),
            }
        }
    }

    /// Wait until the peer closes (or resets) the connection, at most `within`: how long that
    /// took and how many bytes arrived meanwhile (kept for [`RawConn::read_response`]), or
    /// `None` if it stayed open.
    pub async fn wait_closed(&mut self, within: Duration) -> Option<(Duration, usize)> {
        let start = Instant::now();
        let mut received = 0;
        loop {
            let left = within.saturating_sub(start.elapsed());
            if left.is_zero() {
                return None;
            }
            let mut chunk = [0u8; 8192];
            match tokio::time::timeout(left, self.stream.read(&mut chunk)).await {
                Err(_) => return None,
                Ok(Ok(0)) | Ok(Err(_)) => return Some((start.elapsed(), received)),
                Ok(Ok(n)) => {
                    received += n;
                    self.buf.extend_from_slice(&chunk[..n]);
                }
            }
        }
    }

    /// Write `bytes` one at a time, `every` apart, until they are all sent or a write fails
    /// (the peer closed): how many were sent.
    pub async fn trickle(&mut self, bytes: &[u8], every: Duration) -> usize {
        for (i, b) in bytes.iter().enumerate() {
            if self.stream.write_all(&[*b]).await.is_err() {
                return i;
            }
            tokio::time::sleep(every).await;
        }
        bytes.len()
    }

    /// The first complete response in the buffer, removed from it.
    fn take_response(&mut self) -> Option<RawResp> {
        let end = self.buf.windows(4).position(|w| w == b"\r\n\r\n")?;
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
        if self.buf.len() < end + 4 + len {
            return None;
        }
        resp.body = self.buf[end + 4..end + 4 + len].to_vec();
        self.buf.drain(..end + 4 + len);
        Some(resp)
    }
}

/// Send every request on its own [`RawConn`] to its address: all connections are opened
/// first, then every request is written at once. Returns each answer (None: the connection
/// closed without one), in order.
pub async fn raw_burst(
    targets: impl IntoIterator<Item = (SocketAddr, String)>,
) -> Vec<Option<RawResp>> {
    let targets: Vec<(SocketAddr, String)> = targets.into_iter().collect();
    let mut conns = Vec::with_capacity(targets.len());
    for (addr, _) in &targets {
        conns.push(RawConn::connect(*addr).await);
    }
    let barrier = Arc::new(tokio::sync::Barrier::new(targets.len()));
    let tasks: Vec<_> = conns
        .into_iter()
        .zip(targets.into_iter().map(|(_, r)| r))
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

/// [`raw_burst`] of `n` copies of one request to one address.
pub async fn raw_burst_n(n: usize, addr: SocketAddr, req: &str) -> Vec<Option<RawResp>> {
    raw_burst(vec![(addr, req.to_string()); n]).await
}

/// Send `req` on a new connection and hand back the task that reads its answer.
pub async fn raw_send(addr: SocketAddr, req: String) -> tokio::task::JoinHandle<Option<RawResp>> {
    let mut conn = RawConn::connect(addr).await;
    tokio::spawn(async move {
        conn.send(req.as_bytes()).await.ok()?;
        conn.read_response().await
    })
}

/// `n` connections that have each sent `req` and read nothing yet: dropping them hangs up.
pub async fn raw_unanswered(n: usize, addr: SocketAddr, req: &str) -> Vec<RawConn> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = RawConn::connect(addr).await;
        c.send(req.as_bytes()).await.expect("send");
        conns.push(c);
    }
    conns
}

/// The status of each answer (0: none), sorted.
pub fn statuses(resps: &[Option<RawResp>]) -> Vec<u16> {
    let mut s: Vec<u16> = resps
        .iter()
        .map(|r| r.as_ref().map_or(0, |r| r.status))
        .collect();
    s.sort_unstable();
    s
}

/// How many answers have `status`.
pub fn count_status(resps: &[Option<RawResp>], status: u16) -> usize {
    resps
        .iter()
        .filter(|r| r.as_ref().is_some_and(|r| r.status == status))
        .count()
}
