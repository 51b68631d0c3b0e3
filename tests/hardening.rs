//! Closing the doors (issue 11), against the real gateway process with raw sockets where a
//! client library would normalize or hide what is sent: path variants that must not walk
//! around a route's limit, idle and slow connections, the open-file limit and the connection
//! cap, head, URI and body sizes, a hung upstream, pipelining and a missing Host.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::gateway::Gateway;
use common::process::raise_own_open_files;
use common::raw::{RawConn, RawResp};
use common::upstream::Upstream;
use common::wait::eventually;

/// A GET of `target` with `Host: host` that closes its connection after the answer.
fn get_req(target: &str, host: &str) -> String {
    format!("GET {target} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n")
}

async fn one(addr: SocketAddr, req: &str) -> RawResp {
    let mut c = RawConn::connect(addr).await;
    c.send(req.as_bytes()).await.expect("send");
    c.read_response()
        .await
        .unwrap_or_else(|| panic!("no answer to {req:?}"))
}

/// The target the upstream received, from its echo.
fn forwarded(r: &RawResp) -> String {
    assert_eq!(r.status, 200, "{r:?}");
    r.json()["target"].as_str().expect("target").to_string()
}

fn login_config(up: &Upstream, extra: &str, limit: usize) -> String {
    format!(
        "{}{extra}routes:
  - name: login
    match: {{ path_prefix: /login }}
    upstream: backend
    limits: [ {{ name: login-limit, key: [], limit: {limit}, window: 1h }} ]
  - name: admin
    match: {{ path_prefix: /admin, host: api.example.com }}
    upstream: backend
    limits: [ {{ name: admin-limit, key: [], limit: 4, window: 1h }} ]
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
",
        up.upstreams_yaml()
    )
}

/// (as sent, as a normalizing upstream would read it and as it must be forwarded)
const LOGIN_VARIANTS: &[(&str, &str)] = &[
    ("/login", "/login"),
    ("//login", "/login"),
    ("///login", "/login"),
    ("/./login", "/login"),
    ("/x/../login", "/login"),
    ("/x/y/../../login", "/login"),
    ("/%6Cogin", "/login"),
    ("/%6cogin", "/login"),
    ("/%6C%6F%67%69%6E", "/login"),
    ("/%2e/login", "/login"),
    ("/login/./", "/login/"),
    ("/login?next=//x/../y", "/login?next=//x/../y"),
    ("http://tollgate.test//login", "/login"),
    ("http://tollgate.test/./x/../login?a=1", "/login?a=1"),
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_variants_count_against_the_route_limit_and_go_upstream_normalized() {
    let up = Upstream::start().await;
    let n = LOGIN_VARIANTS.len();
    let gw = Gateway::start(&login_config(&up, "", n)).await;
    for (sent, want) in LOGIN_VARIANTS {
        let r = one(gw.listen, &get_req(sent, "tollgate.test")).await;
        assert_eq!(forwarded(&r), *want, "{sent}");
        assert!(
            r.header("ratelimit")
                .unwrap()
                .starts_with("\"login-limit\""),
            "{sent}: {r:?}"
        );
    }
    // Every variant was counted against the one limit: the next is refused.
    for (sent, _) in &LOGIN_VARIANTS[..3] {
        let r = one(gw.listen, &get_req(sent, "tollgate.test")).await;
        assert_eq!(r.status, 429, "{sent}: {r:?}");
    }
    assert_eq!(up.requests().await, n as u64);

    // A host-scoped route: case, a trailing dot and a port all meet the same limit of 4.
    let hosts = [
        "api.example.com",
        "API.Example.COM",
        "api.example.com.",
        "api.example.com.:8080",
    ];
    for h in hosts {
        let r = one(gw.listen, &get_req("//admin/./x", h)).await;
        assert_eq!(forwarded(&r), "/admin/x", "{h}");
    }
    let r = one(gw.listen, &get_req("/admin/x", "api.example.com")).await;
    assert_eq!(r.status, 429, "{r:?}");
    // Absolute-form with its authority as the Host.
    let r = one(
        gw.listen,
        "GET http://api.example.com/admin HTTP/1.1\r\nHost: api.example.com\r\nConnection: close\r\n\r\n",
    )
    .await;
    assert_eq!(r.status, 429, "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reject_mode_answers_400_to_every_path_not_already_normal() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&login_config(
        &up,
        "server: { path_normalization: reject }\n",
        100,
    ))
    .await;
    for (sent, want) in LOGIN_VARIANTS {
        let r = one(gw.listen, &get_req(sent, "tollgate.test")).await;
        let origin_form_normal = sent == want;
        if origin_form_normal {
            assert_eq!(forwarded(&r), *want, "{sent}");
        } else if sent.starts_with("http://")
            && want.len() + "http://tollgate.test".len() == sent.len()
        {
            // An absolute-form target whose path is normal is only rewritten to origin-form.
            assert_eq!(forwarded(&r), *want, "{sent}");
        } else {
            let body = r.problem(400);
            assert!(
                body["detail"].as_str().unwrap().contains("normal form"),
                "{sent}: {body}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn escaped_slashes_are_kept_encoded_or_refused() {
    let up = Upstream::start().await;
    let keep = Gateway::start(&login_config(&up, "", 100)).await;
    let r = one(keep.listen, &get_req("/a%2fb/%5c", "t")).await;
    assert_eq!(forwarded(&r), "/a%2Fb/%5C");
    let reject = Gateway::start(&login_config(
        &up,
        "server: { escaped_slashes: reject }\n",
        100,
    ))
    .await;
    for p in ["/a%2Fb", "/a%2fb", "/x%5Cy"] {
        let body = one(reject.listen, &get_req(p, "t")).await.problem(400);
        assert!(
            body["detail"].as_str().unwrap().contains("escaped slash"),
            "{p}: {body}"
        );
    }
    let r = one(reject.listen, &get_req("/a/b", "t")).await;
    assert_eq!(forwarded(&r), "/a/b");
    // A bad escape is a 400 in every mode.
    one(keep.listen, &get_req("/a%zz", "t")).await.problem(400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn http11_without_host_is_400_and_pipelined_requests_are_answered_in_order() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&login_config(&up, "", 100)).await;
    let body = one(gw.listen, "GET / HTTP/1.1\r\nConnection: close\r\n\r\n")
        .await
        .problem(400);
    assert!(body["detail"].as_str().unwrap().contains("Host"), "{body}");
    // HTTP/1.0 needs none.
    let r = one(gw.listen, "GET /ten HTTP/1.0\r\n\r\n").await;
    assert_eq!(forwarded(&r), "/ten");
    assert_eq!(up.requests().await, 1);

    let mut c = RawConn::connect(gw.listen).await;
    let three: String = ["/p1", "/p2", "/p3"]
        .iter()
        .map(|p| format!("GET {p} HTTP/1.1\r\nHost: t\r\n\r\n"))
        .collect();
    c.send(three.as_bytes()).await.expect("send");
    for want in ["/p1", "/p2", "/p3"] {
        let r = c.read_response().await.expect("a pipelined answer");
        assert_eq!(forwarded(&r), want);
        assert_eq!(
            r.header("connection").as_deref(),
            Some("keep-alive"),
            "{r:?}"
        );
    }
}

/// A gateway whose idle keep-alive connections close after 1 s.
async fn keepalive_1s(up: &Upstream) -> Gateway {
    Gateway::start(&login_config(
        up,
        "server: { keepalive_timeout: 1s }\n",
        100,
    ))
    .await
}

/// `c` is closed by the gateway, unanswered, about 1 s after its last answer: its one idle
/// timeout.
async fn closed_after_1s_idle(c: &mut RawConn, gw: &Gateway) {
    let (after, bytes) = c
        .wait_closed(Duration::from_secs(6))
        .await
        .expect("the idle connection was closed");
    assert_eq!(bytes, 0);
    assert!(
        after >= Duration::from_millis(800) && after < Duration::from_millis(2500),
        "closed {after:?} after the last answer"
    );
    let stats = gw.stats().await;
    assert_eq!(stats["connections"]["idle_timeouts"], 1, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_keepalive_connection_is_closed_after_keepalive_timeout() {
    let up = Upstream::start().await;
    let gw = keepalive_1s(&up).await;
    let mut c = RawConn::connect(gw.listen).await;
    // The client asks for far longer; the gateway's timeout wins.
    c.send(
        b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: keep-alive\r\nKeep-Alive: timeout=600\r\n\r\n",
    )
    .await
    .expect("send");
    let r = c.read_response().await.expect("answer");
    assert_eq!(r.status, 200);
    closed_after_1s_idle(&mut c, &gw).await;
}

/// Each request on a keep-alive connection pushes its idle deadline later. The timer armed
/// after the first request fires before the deadline of the last; the connection stays open
/// through it and closes `keepalive_timeout` after the last answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn later_requests_push_the_idle_deadline_and_the_connection_closes_after_the_last() {
    let up = Upstream::start().await;
    let gw = keepalive_1s(&up).await;
    let mut c = RawConn::connect(gw.listen).await;
    // Three requests 600 ms apart: the second and third arrive after the first request's
    // timer was armed (for 1 s after its answer), the third after that timer has fired.
    for i in 0..3 {
        if i > 0 {
            tokio::time::sleep(Duration::from_millis(600)).await;
        }
        c.send(b"GET /a HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("send");
        let r = c
            .read_response()
            .await
            .expect("answer on the same connection");
        assert_eq!(r.status, 200, "request {i}");
    }
    closed_after_1s_idle(&mut c, &gw).await;
    assert_eq!(up.requests().await, 3);
}

/// A head sent one byte every 100 ms (the whole head would take over 5 s).
const SLOW_HEAD: &[u8] =
    b"GET /slow HTTP/1.1\r\nHost: t\r\nX-Padding: aaaaaaaaaaaaaaaaaaaa\r\n\r\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_trickled_head_is_cut_off_by_header_timeout_on_first_and_reused_connections() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&login_config(&up, "server: { header_timeout: 1s }\n", 100)).await;
    // First request of a connection.
    let mut c = RawConn::connect(gw.listen).await;
    let start = Instant::now();
    let sent = c.trickle(SLOW_HEAD, Duration::from_millis(100)).await;
    let (_, bytes) = c.wait_closed(Duration::from_secs(5)).await.expect("closed");
    let cut = start.elapsed();
    assert!(sent < SLOW_HEAD.len(), "the whole head got through");
    assert_eq!(bytes, 0, "no answer to a head that never completed");
    assert!(
        cut >= Duration::from_millis(900) && cut < Duration::from_secs(3),
        "cut after {cut:?}"
    );

    // A reused connection: a fast first request, then a trickled second head.
    let mut c = RawConn::connect(gw.listen).await;
    c.send(b"GET /fast HTTP/1.1\r\nHost: t\r\n\r\n")
        .await
        .expect("send");
    assert_eq!(c.read_response().await.expect("answer").status, 200);
    tokio::time::sleep(Duration::from_millis(1500)).await; // longer than header_timeout: idle is not head time
    let start = Instant::now();
    let sent = c.trickle(SLOW_HEAD, Duration::from_millis(100)).await;
    let (_, bytes) = c.wait_closed(Duration::from_secs(5)).await.expect("closed");
    let cut = start.elapsed();
    assert!(sent < SLOW_HEAD.len() && bytes == 0);
    assert!(
        cut >= Duration::from_millis(900) && cut < Duration::from_secs(3),
        "cut after {cut:?}"
    );
    assert_eq!(
        up.requests().await,
        1,
        "only the fast request reached the upstream"
    );
    let stats = gw.stats().await;
    assert_eq!(stats["connections"]["head_timeouts"], 2, "{stats}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_heads_uris_and_bodies_are_refused_before_the_upstream() {
    let up = Upstream::start().await;
    let extra = "server: { max_body_bytes: 1000 }\n";
    let yaml = login_config(&up, extra, 100).replace(
        "  - { name: default,",
        "  - { name: tiny, match: { path_prefix: /tiny }, upstream: backend, max_body_bytes: 10 }\n  - { name: default,",
    );
    let gw = Gateway::start(&yaml).await;
    // 100 KB of headers in 20 lines: 431.
    let mut big = String::from("GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n");
    for i in 0..20 {
        big.push_str(&format!("X-Big-{i}: {}\r\n", "v".repeat(5_000)));
    }
    big.push_str("\r\n");
    one(gw.listen, &big).await.problem(431);
    // A 9 KB target: 414.
    one(gw.listen, &get_req(&format!("/{}", "a".repeat(9_000)), "t"))
        .await
        .problem(414);
    // A declared body over the limit: 413, from the Content-Length.
    let post = |path: &str, len: usize| {
        format!("POST {path} HTTP/1.1\r\nHost: t\r\nConnection: close\r\nContent-Length: {len}\r\n\r\n{}", "b".repeat(len))
    };
    one(gw.listen, &post("/x", 1_001)).await.problem(413);
    one(gw.listen, &post("/tiny", 11)).await.problem(413);
    assert_eq!(up.requests().await, 0, "nothing reached the upstream");
    assert_eq!(one(gw.listen, &post("/x", 1_000)).await.status, 200);
    assert_eq!(one(gw.listen, &post("/tiny", 10)).await.status, 200);
    // A chunked body that passes the limit is cut: 413.
    let chunk = format!("{:x}\r\n{}\r\n", 600, "c".repeat(600));
    let chunked = format!(
        "POST /x HTTP/1.1\r\nHost: t\r\nConnection: close\r\nTransfer-Encoding: chunked\r\n\r\n{chunk}{chunk}0\r\n\r\n"
    );
    one(gw.listen, &chunked).await.problem(413);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_upstream_gets_504_after_its_read_timeout_and_a_closed_one_502() {
    // An upstream that accepts and never answers.
    let hung = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let hung_addr = hung.local_addr().expect("addr");
    let holder = tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hung.accept().await {
            held.push(s);
        }
    });
    let closed = common::raw::ClosedPort::new();
    let yaml = format!(
        "upstreams:
  hung: {{ servers: [\"{hung_addr}\"], timeouts: {{ read: 1s, connect: 1s }} }}
  gone: [\"127.0.0.1:{}\"]
routes:
  - {{ name: gone, match: {{ path_prefix: /gone }}, upstream: gone }}
  - {{ name: hung, match: {{ path_prefix: / }}, upstream: hung }}
",
        closed.port
    );
    let gw = Gateway::start(&yaml).await;
    let start = Instant::now();
    one(gw.listen, &get_req("/slow", "t")).await.problem(504);
    let took = start.elapsed();
    assert!(
        took >= Duration::from_millis(900) && took < Duration::from_secs(5),
        "504 after {took:?}"
    );
    one(gw.listen, &get_req("/gone", "t")).await.problem(502);
    holder.abort();
}

/// `n` keep-alive connections that each had one request answered and now sit idle.
async fn idle_connections(addr: SocketAddr, n: usize) -> Vec<RawConn> {
    let mut conns = Vec::with_capacity(n);
    for _ in 0..n {
        let mut c = RawConn::connect(addr).await;
        c.send(b"GET /idle HTTP/1.1\r\nHost: t\r\n\r\n")
            .await
            .expect("send");
        assert_eq!(c.read_response().await.expect("answer").status, 200);
        conns.push(c);
    }
    conns
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn started_with_1024_open_files_the_gateway_serves_past_1100_idle_connections() {
    raise_own_open_files(4_096);
    let up = Upstream::start().await;
    let wrapper = ["prlimit", "--nofile=1024:4096", "--"];
    let gw = Gateway::start_under(&wrapper, "fd-limit", &login_config(&up, "", 100), &[]).await;
    assert!(
        gw.output().contains("raised the open-file limit"),
        "the gateway did not say it raised its limit:\n{}",
        gw.output()
    );
    let idle = idle_connections(gw.listen, 1_100).await;
    for i in 0..20 {
        let r = one(gw.listen, &get_req(&format!("/new/{i}"), "t")).await;
        assert_eq!(r.status, 200);
    }
    let stats = gw.stats().await;
    assert!(
        stats["connections"]["open"].as_u64().unwrap() >= 1_100,
        "{stats}"
    );
    assert_eq!(stats["connections"]["refused_at_cap"], 0, "{stats}");
    assert_eq!(stats["connections"]["max"], 3_686, "90% of 4096: {stats}");
    drop(idle);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn at_max_connections_the_oldest_idle_connection_goes_first_then_new_ones_are_refused() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&login_config(&up, "server: { max_connections: 10 }\n", 100)).await;
    let mut idle = idle_connections(gw.listen, 10).await;
    // The cap is full of idle connections: a new client is served, the oldest idle one closed.
    let r = one(gw.listen, &get_req("/new", "t")).await;
    assert_eq!(r.status, 200);
    let closed = idle[0].wait_closed(Duration::from_secs(5)).await;
    assert!(
        closed.is_some(),
        "the oldest idle connection was not closed"
    );
    drop(idle.drain(..));
    gw.wait_stats("no connection open", Duration::from_secs(5), |s| {
        s["connections"]["open"] == 0
    })
    .await;
    // Ten requests in progress: nothing is idle, so an eleventh connection is refused.
    let slow =
        "GET /slow HTTP/1.1\r\nHost: t\r\nX-Demo-Delay-Ms: 3000\r\nConnection: close\r\n\r\n";
    let mut busy = Vec::new();
    for _ in 0..10 {
        busy.push(common::raw::raw_send(gw.listen, slow.to_string()).await);
    }
    up.wait_in_flight(10).await;
    let mut c = RawConn::connect(gw.listen).await;
    let _ = c.send(get_req("/refused", "t").as_bytes()).await;
    assert!(
        c.read_response().await.is_none(),
        "an eleventh connection was served"
    );
    for b in busy {
        assert_eq!(b.await.expect("task").expect("answer").status, 200);
    }
    let stats = gw.stats().await;
    assert_eq!(stats["connections"]["idle_closed_at_cap"], 1, "{stats}");
    assert_eq!(stats["connections"]["refused_at_cap"], 1, "{stats}");
    eventually(
        "the refused connection is not counted",
        Duration::from_secs(5),
    )
    .holds_async(|| async { gw.stats().await["connections"]["open"] == 0 })
    .await;
}
