//! Issue 39, items 3 and 5, against the real gateway process with raw sockets: a head is
//! bounded while it arrives (a client that sends an endless head gets `431` and a closed
//! connection as soon as it passes `server.max_request_header_bytes`, and holds no memory), and
//! the admin listener cannot starve the proxy (its own connection cap, head and keep-alive
//! deadlines, and file descriptors reserved for the proxy's cap).

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use common::gateway::Gateway;
use common::process::raise_own_open_files;
use common::raw::{RawConn, RawResp};
use common::upstream::Upstream;
use common::wait::eventually;

/// `server.max_request_header_bytes`' default.
const LIMIT: usize = 64 * 1024;
/// What each client of the flood means to send: an unfinished head of 900 KB.
const FLOOD_HEAD: usize = 900 * 1024;
/// One header line of the flood (few and long: Pingora refuses more than 256 headers).
const LINE: usize = 16 * 1024;
/// Connections per wave of the flood.
const CLIENTS: usize = 200;

fn config(up: &Upstream, extra: &str) -> String {
    format!(
        "{}{extra}routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n",
        up.upstreams_yaml()
    )
}

async fn one(addr: SocketAddr, req: &str) -> RawResp {
    let mut c = RawConn::connect(addr).await;
    c.send(req.as_bytes()).await.expect("send");
    c.read_response()
        .await
        .unwrap_or_else(|| panic!("no answer to {req:?}"))
}

/// A header line of `len` bytes, CRLF included.
fn pad_line(i: usize, len: usize) -> Vec<u8> {
    let name = format!("X-Pad-{i}: ");
    let mut line = name.into_bytes();
    line.resize(len - 2, b'a');
    line.extend_from_slice(b"\r\n");
    line
}

/// The gateway's resident memory (VmRSS of /proc/PID/status), in KiB.
fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("proc status");
    let line = status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))
        .expect("VmRSS line");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// How one flooding client fared.
struct Flooder {
    /// Head bytes sent when the gateway answered or closed; `None`: it never did.
    answered_after: Option<usize>,
    /// The answer, when a whole one arrived before the connection closed.
    answer: Option<RawResp>,
    /// Kept open (the client side) until the gateway's memory is read.
    _conn: RawConn,
}

/// Send an unfinished head of [`FLOOD_HEAD`] bytes, [`LINE`] at a time. Once past the limit,
/// wait (at most 10 s, once) for an answer or the close before sending more.
async fn flood_one(addr: SocketAddr) -> Flooder {
    let mut conn = RawConn::connect(addr).await;
    let mut sent = 0;
    let start = b"GET /flood HTTP/1.1\r\nHost: t\r\n";
    conn.send(start).await.expect("send the request line");
    sent += start.len();
    let mut waited = false;
    for i in 0.. {
        if sent >= FLOOD_HEAD {
            break;
        }
        if conn.send(&pad_line(i, LINE)).await.is_err() {
            // Closed by the gateway: what it wrote before is kept for `read_response`.
            return Flooder {
                answered_after: Some(sent),
                answer: conn.read_response().await,
                _conn: conn,
            };
        }
        sent += LINE;
        if sent > LIMIT && !waited {
            waited = true;
            if conn.wait_closed(Duration::from_secs(10)).await.is_some() {
                return Flooder {
                    answered_after: Some(sent),
                    answer: conn.read_response().await,
                    _conn: conn,
                };
            }
        }
    }
    Flooder {
        answered_after: None,
        answer: None,
        _conn: conn,
    }
}

/// [`CLIENTS`] flooding clients at once.
async fn flood(addr: SocketAddr) -> Vec<Flooder> {
    let tasks: Vec<_> = (0..CLIENTS)
        .map(|_| tokio::spawn(flood_one(addr)))
        .collect();
    let mut out = Vec::with_capacity(CLIENTS);
    for t in tasks {
        out.push(t.await.expect("flood task"));
    }
    out
}

/// Every client was answered `431` (or closed) before it had sent twice the limit.
fn assert_refused_early(wave: &str, flooders: &[Flooder]) {
    for (i, f) in flooders.iter().enumerate() {
        let after = f.answered_after.unwrap_or_else(|| {
            panic!("{wave}: client {i} got no answer and stayed open after {FLOOD_HEAD} bytes")
        });
        assert!(
            after <= 2 * LIMIT,
            "{wave}: client {i} was answered only after {after} bytes"
        );
        if let Some(answer) = &f.answer {
            let body = answer.problem(431);
            assert_eq!(answer.header("connection").as_deref(), Some("close"));
            assert_eq!(
                body["detail"],
                "The request line and headers are larger than this gateway accepts."
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unfinished_heads_past_the_limit_get_431_at_once_and_hold_no_memory() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, "")).await;
    for i in 0..20 {
        let r = one(
            gw.listen,
            &format!("GET /warm/{i} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let before = rss_kib(gw.pid());
    let first = flood(gw.listen).await;
    let after_first = rss_kib(gw.pid());
    let second = flood(gw.listen).await;
    let after_second = rss_kib(gw.pid());
    let grew = |from: u64, to: u64| to.saturating_sub(from);
    eprintln!(
        "VmRSS {before} KiB, {after_first} KiB after the first wave, {after_second} KiB after the second"
    );
    assert_refused_early("first wave", &first);
    assert_refused_early("second wave", &second);
    let answered = first
        .iter()
        .chain(&second)
        .filter(|f| f.answer.is_some())
        .count();
    eprintln!(
        "{answered} of {} clients read the 431 before the close",
        2 * CLIENTS
    );
    assert!(answered > 0, "no client read the 431 before the close");
    // At most 0.5 MB per connection held (a head of 900 KB held 1.8 MB each).
    let allowed = CLIENTS as u64 * 512;
    assert!(
        grew(before, after_first) <= allowed,
        "the first wave grew VmRSS by {} KiB (at most {allowed})",
        grew(before, after_first)
    );
    // The second wave reuses what the first freed (whatever the allocator keeps in its
    // threads' caches: 128 KiB per connection of slack, where a held head took 1.8 MB).
    let slack = CLIENTS as u64 * 128;
    assert!(
        grew(after_first, after_second) <= slack,
        "the second wave grew VmRSS by {} KiB more (at most {slack})",
        grew(after_first, after_second)
    );
    let stats = gw.stats().await;
    assert_eq!(
        stats["connections"]["heads_too_large"],
        2 * CLIENTS,
        "{stats}"
    );
    drop((first, second));
    // The gateway still serves.
    let r = one(
        gw.listen,
        "GET /after HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_head_of_a_keepalive_connection_is_counted_from_its_start_and_bodies_not_at_all() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, "")).await;
    let mut c = RawConn::connect(gw.listen).await;
    // Three heads of 48 KB each on one connection: together past the limit, each within it.
    for i in 0..3 {
        let mut req = format!("GET /ka/{i} HTTP/1.1\r\nHost: t\r\n").into_bytes();
        for j in 0..3 {
            req.extend(pad_line(j, LINE));
        }
        req.extend_from_slice(b"\r\n");
        c.send(&req).await.expect("send");
        let r = c.read_response().await.expect("answer");
        assert_eq!(r.status, 200, "head {i}");
    }
    // A body of 300 KB is no head.
    let body = vec![b'b'; 300 * 1024];
    let mut req = format!(
        "POST /body HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    req.extend_from_slice(&body);
    c.send(&req).await.expect("send");
    assert_eq!(c.read_response().await.expect("answer").status, 200);
    // The next head, sent in pieces, passes the limit: 431, and the connection closes.
    c.send(b"GET /big HTTP/1.1\r\nHost: t\r\n")
        .await
        .expect("send");
    for j in 0..5 {
        if c.send(&pad_line(j, LINE)).await.is_err() {
            break;
        }
    }
    let closed = c.wait_closed(Duration::from_secs(10)).await;
    assert!(closed.is_some(), "the connection stayed open");
    let r = c.read_response().await.expect("the 431");
    r.problem(431);
    // A head of exactly the limit is within it; one byte more is not (both in one piece).
    for (extra, status) in [(0, 200), (1, 431)] {
        let start = "GET /edge HTTP/1.1\r\nHost: t\r\nConnection: close\r\nX-Pad: ";
        let pad = LIMIT + extra - start.len() - 4;
        let req = format!("{start}{}\r\n\r\n", "p".repeat(pad));
        assert_eq!(req.len(), LIMIT + extra);
        let r = one(gw.listen, &req).await;
        assert_eq!(r.status, status, "a head of {} bytes", req.len());
    }
}

/// A request whose head is `size` bytes, sent in [`LINE`] pieces: its answer (`None`: closed
/// without one).
async fn head_of(addr: SocketAddr, size: usize) -> Option<RawResp> {
    let start = "GET /sized HTTP/1.1\r\nHost: t\r\nConnection: close\r\n";
    let mut head = start.as_bytes().to_vec();
    let mut i = 0;
    while head.len() + LINE + 2 <= size {
        head.extend(pad_line(i, LINE));
        i += 1;
    }
    head.extend(pad_line(i, size - head.len() - 2));
    head.extend_from_slice(b"\r\n");
    assert_eq!(head.len(), size);
    let mut c = RawConn::connect(addr).await;
    for piece in head.chunks(LINE) {
        if c.send(piece).await.is_err() {
            break;
        }
    }
    c.read_response().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_moves_the_head_limit_of_the_connections() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&up, "")).await;
    let big = 100 * 1024;
    assert_eq!(head_of(gw.listen, big).await.map(|r| r.status), Some(431));
    gw.replace_config(&config(
        &up,
        "server: { max_request_header_bytes: 131072 }\n",
    ));
    gw.sighup();
    gw.wait_generation(1, Duration::from_secs(10)).await;
    assert_eq!(head_of(gw.listen, big).await.map(|r| r.status), Some(200));
    let r = head_of(gw.listen, 131_073).await.expect("an answer");
    r.problem(431);
}

/// Which of `conns` the gateway has closed, within `within` (all waited on at once).
async fn closed(conns: Vec<RawConn>, within: Duration) -> (Vec<RawConn>, usize) {
    let tasks: Vec<_> = conns
        .into_iter()
        .map(|mut c| {
            tokio::spawn(async move {
                let gone = c.wait_closed(within).await.is_some();
                (c, gone)
            })
        })
        .collect();
    let (mut open, mut gone) = (Vec::new(), 0);
    for t in tasks {
        let (c, g) = t.await.expect("task");
        if g {
            gone += 1;
        } else {
            open.push(c);
        }
    }
    (open, gone)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_admin_connections_past_the_cap_are_closed_and_the_proxy_and_healthz_still_answer() {
    raise_own_open_files(1_024);
    let up = Upstream::start().await;
    let wrapper = ["prlimit", "--nofile=256:256", "--"];
    let gw = Gateway::start_under(&wrapper, "admin-cap", &config(&up, ""), &[]).await;
    // More idle admin connections than the gateway has files for.
    let mut idle = Vec::new();
    for _ in 0..300 {
        idle.push(RawConn::connect(gw.admin).await);
    }
    // At the cap (64) the oldest that has sent nothing is closed for each new one.
    let (idle, gone) = closed(idle, Duration::from_secs(3)).await;
    assert_eq!((gone, idle.len()), (300 - 64, 64));
    // New proxy clients and /healthz are answered.
    for i in 0..5 {
        let r = one(
            gw.listen,
            &format!("GET /new/{i} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n"),
        )
        .await;
        assert_eq!(r.status, 200);
    }
    let r = one(
        gw.admin,
        "GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 200);
    let r = one(
        gw.admin,
        "GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    let stats = r.json();
    // 90% of 256 would be 230: the proxy's cap leaves 64 for the admin listener and 64 more.
    assert_eq!(stats["connections"]["max"], 128, "{stats}");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_admin_connection_is_closed_after_the_head_and_keepalive_timeouts() {
    let up = Upstream::start().await;
    let extra = "server: { header_timeout: 1s, keepalive_timeout: 1s }\n";
    let gw = Gateway::start(&config(&up, extra)).await;
    // Never sends a head.
    let mut silent = RawConn::connect(gw.admin).await;
    let (took, _) = silent
        .wait_closed(Duration::from_secs(10))
        .await
        .expect("a silent admin connection stayed open");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    // Idle after one request.
    let mut kept = RawConn::connect(gw.admin).await;
    kept.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
        .await
        .expect("send");
    assert_eq!(kept.read_response().await.expect("answer").status, 200);
    let (took, _) = kept
        .wait_closed(Duration::from_secs(10))
        .await
        .expect("an idle admin connection stayed open");
    assert!(took >= Duration::from_millis(900), "closed after {took:?}");
    // A head trickled for longer than header_timeout is cut too.
    let mut slow = RawConn::connect(gw.admin).await;
    let sent = slow
        .trickle(
            b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
            Duration::from_millis(100),
        )
        .await;
    assert!(sent < 30, "a trickled head of {sent} bytes got through");
    eventually("the gateway still answers", Duration::from_secs(5))
        .holds_async(|| async {
            let mut c = RawConn::connect(gw.admin).await;
            c.send(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
                .await
                .is_ok()
                && c.read_response().await.is_some_and(|r| r.status == 200)
        })
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_proxy_cap_the_open_file_limit_cannot_hold_is_warned_about() {
    let up = Upstream::start().await;
    let wrapper = ["prlimit", "--nofile=256:256", "--"];
    let extra = "server: { max_connections: 1000 }\nadmin: { max_connections: 8 }\n";
    let gw = Gateway::start_under(&wrapper, "fd-warning", &config(&up, extra), &[]).await;
    gw.wait_output(
        "need an open-file limit of 1072, above this one: raise it (ulimit -n, systemd's \
         LimitNOFILE) or lower server.max_connections to 184",
        Duration::from_secs(5),
    )
    .await;
    let r = one(
        gw.admin,
        "GET /stats HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.json()["connections"]["max"], 1000, "kept as configured");
}
