//! Integration tests: the real `tollgate` gateway in front of the real demo upstream, both on
//! loopback, driven over HTTP.
//!
//! Each test starts its own gateway and upstream on their own free ports (tests in this
//! binary run in parallel). Timing-sensitive values (`t`, `Retry-After`, `X-RateLimit-Reset`)
//! are checked on `fixed_window` limits of 1 h, whose window end is a known whole second; each
//! such test first makes sure it does not run across an hour boundary.

mod common;

use std::net::Ipv4Addr;
use std::time::{Duration, Instant};

use common::clock::{clear_of_window_boundary, fixed_window_t_range, now_ms, window_end_s};
use common::gateway::Gateway;
use common::http::{client, client_builder, client_from, get, send, Resp, QUOTA_EXCEEDED};
use common::process::{count, max_open_files};
use common::raw::{ClosedPort, RawConn};
use common::upstream::Upstream;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

const HOUR: u64 = 3600;

const DEFAULT_ROUTE: &str =
    "routes:\n  - { name: default, match: { path_prefix: / }, upstream: backend }\n";

/// The echo the demo upstream answered with: headers as `name → [values]`.
fn echoed_header(echo: &Value, name: &str) -> Vec<String> {
    match &echo["headers"][name] {
        Value::Null => Vec::new(),
        Value::Array(vs) => vs
            .iter()
            .map(|v| v.as_str().expect("string").to_string())
            .collect(),
        other => panic!("unexpected header shape {other}"),
    }
}

/// Assert a problem-details answer from the gateway itself (RFC 9457).
fn assert_problem(r: &Resp, status: u16, title: &str) -> Value {
    assert_eq!(r.status.as_u16(), status, "{r:#?}\n{}", r.text());
    assert_eq!(r.header("content-type"), "application/problem+json");
    let body = r.json();
    assert_eq!(body["status"], status, "{body}");
    assert_eq!(body["title"], title, "{body}");
    body
}

/// The rate-limit headers of an admitted request, with `t` checked against the fixed window.
fn assert_allowed(r: &Resp, name: &str, q: u64, w: u64, remaining: u64, before: u64, after: u64) {
    assert_eq!(r.status, StatusCode::OK, "{r:#?}\n{}", r.text());
    let t = r.ratelimit_t();
    let range = fixed_window_t_range(before, after, w);
    assert!(range.contains(&t), "t={t} not in {range:?}");
    assert_eq!(
        r.header("ratelimit-policy"),
        format!("\"{name}\";q={q};w={w}")
    );
    assert_eq!(
        r.header("ratelimit"),
        format!("\"{name}\";r={remaining};t={t}")
    );
    assert_eq!(r.header_u64("x-ratelimit-limit"), q);
    assert_eq!(r.header_u64("x-ratelimit-remaining"), remaining);
    assert!(r.opt_header("retry-after").is_none(), "{r:#?}");
}

/// A 429 of fixed_window limit `name` of `q` an hour, asked between `before` and `after`
/// (ms): every rate-limit header, exact; its `t`.
fn assert_denied_hourly(r: &Resp, name: &str, q: u64, before: u64, after: u64) -> u64 {
    let t = r.ratelimit_t();
    let range = fixed_window_t_range(before, after, HOUR);
    assert!(range.contains(&t), "t={t} not in {range:?}");
    assert!(t >= 1);
    assert_eq!(r.header_u64("retry-after"), t);
    assert_eq!(
        r.header("ratelimit-policy"),
        format!("\"{name}\";q={q};w={HOUR}")
    );
    assert_eq!(r.header("ratelimit"), format!("\"{name}\";r=0;t={t}"));
    assert_eq!(r.header_u64("x-ratelimit-limit"), q);
    assert_eq!(r.header("x-ratelimit-remaining"), "0");
    // Reset = now + t (±1 s: the gateway's now is between before and after).
    let reset = r.header_u64("x-ratelimit-reset");
    assert!(
        (before / 1000 + t..=after.div_ceil(1000) + t).contains(&reset),
        "reset {reset}, t {t}"
    );
    t
}

/// GET with timestamps around it: `(response, before_ms, after_ms)`.
async fn timed_get(c: &reqwest::Client, url: &str, h: &[(&str, &str)]) -> (Resp, u64, u64) {
    let before = now_ms();
    let r = get(c, url, h).await;
    (r, before, now_ms())
}

// ---------------------------------------------------------------------------------------
// 1. Proxy fidelity
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn proxy_passes_method_path_query_body_and_headers_through() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!("{}{DEFAULT_ROUTE}", up.upstreams_yaml())).await;
    let c = client();

    let path = "/api/v1/Things/%20spaced%2Fslash/x;matrix=1";
    let query = "a=1&b=two%20words&a=3&empty=&flag&utf=%C3%BC";
    let body_text = "line one\nline two: ünïcødé {\"json\": true}\r\n\u{0}tail";
    let methods = ["GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "PURGE"];
    for m in methods {
        let method = Method::from_bytes(m.as_bytes()).unwrap();
        let body = (m != "GET" && m != "OPTIONS").then(|| body_text.as_bytes().to_vec());
        let r = send(
            &c,
            method,
            &gw.url(&format!("{path}?{query}")),
            &[
                ("x-custom", "Value With  Spaces, and, commas"),
                ("x-multi", "one"),
                ("x-multi", "two"),
                ("content-type", "application/x-tollgate-test"),
                ("accept", "text/plain"),
                ("user-agent", "tollgate-tests/1.0"),
                ("cookie", "a=b; c=d"),
                ("x-empty", ""),
            ],
            body.clone(),
        )
        .await;
        assert_eq!(r.status, StatusCode::OK, "{m}: {}", r.text());
        assert_eq!(r.header("content-type"), "application/json");
        let echo = r.json();
        assert_eq!(echo["method"], m);
        assert_eq!(echo["path"], path);
        assert_eq!(echo["query"], query);
        let expect_body = body.as_deref().map_or(String::new(), |b| {
            String::from_utf8(b.to_vec()).expect("utf8 body")
        });
        assert_eq!(echo["body"], expect_body.as_str(), "{m}");
        assert_eq!(echo["body_len"], expect_body.len(), "{m}");
        for (name, values) in [
            ("x-custom", vec!["Value With  Spaces, and, commas"]),
            ("x-multi", vec!["one", "two"]),
            ("content-type", vec!["application/x-tollgate-test"]),
            ("accept", vec!["text/plain"]),
            ("user-agent", vec!["tollgate-tests/1.0"]),
            ("cookie", vec!["a=b; c=d"]),
            ("x-empty", vec![""]),
            ("x-forwarded-for", vec!["127.0.0.1"]),
        ] {
            assert_eq!(echoed_header(&echo, name), values, "{m} {name}");
        }
        assert_eq!(echoed_header(&echo, "host"), vec![gw.listen.to_string()]);
        // No limit is configured: no rate-limit headers.
        r.assert_no_ratelimit_headers();
    }

    // A large body arrives whole.
    let big: Vec<u8> = (0..300_000u32).map(|i| b'a' + (i % 26) as u8).collect();
    let r = send(&c, Method::POST, &gw.url("/upload"), &[], Some(big.clone())).await;
    assert_eq!(r.status, StatusCode::OK);
    let echo = r.json();
    assert_eq!(echo["body_len"], big.len());
    assert_eq!(echo["body"], String::from_utf8(big).unwrap().as_str());

    assert_eq!(up.requests().await, methods.len() as u64 + 1);
}

/// Hop-by-hop fields (RFC 9110 §7.6.1) stop at the gateway: the standard ones, and any field
/// the client's `Connection` names. End-to-end fields beside them reach the upstream unchanged,
/// and so does a request that carries none (the patched `pingora-proxy` skips the stripping
/// then, `patches/README.md`).
#[tokio::test(flavor = "multi_thread")]
async fn hop_by_hop_fields_are_not_forwarded_and_end_to_end_ones_are() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!("{}{DEFAULT_ROUTE}", up.upstreams_yaml())).await;
    let hop_by_hop = [
        ("Connection", "keep-alive, X-Nominated"),
        ("Keep-Alive", "timeout=5"),
        ("Proxy-Connection", "keep-alive"),
        ("Proxy-Authorization", "Basic dTpw"),
        ("TE", "trailers"),
        ("X-Nominated", "1"),
    ];
    let end_to_end = [("X-Kept", "1"), ("Accept", "*/*")];
    for with_hop_by_hop in [true, false] {
        let mut request = String::from("GET /hop HTTP/1.1\r\nHost: tollgate.test\r\n");
        let fields = end_to_end
            .iter()
            .chain(hop_by_hop.iter().filter(|_| with_hop_by_hop));
        for (name, value) in fields {
            request.push_str(&format!("{name}: {value}\r\n"));
        }
        request.push_str("\r\n");
        let mut conn = RawConn::connect(gw.listen).await;
        conn.send(request.as_bytes()).await.expect("send");
        let r = conn.read_response().await.expect("a response");
        assert_eq!(r.status, 200, "{}", r.head);
        let echo = r.json();
        for (name, value) in end_to_end {
            let name = name.to_ascii_lowercase();
            assert_eq!(echoed_header(&echo, &name), vec![value], "{name}");
        }
        for (name, _) in hop_by_hop {
            let name = name.to_ascii_lowercase();
            assert_eq!(echoed_header(&echo, &name), Vec::<String>::new(), "{name}");
        }
        assert_eq!(
            echoed_header(&echo, "x-forwarded-for"),
            vec!["127.0.0.1"],
            "with hop-by-hop fields: {with_hop_by_hop}"
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn x_forwarded_for_gets_the_client_address_appended() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!("{}{DEFAULT_ROUTE}", up.upstreams_yaml())).await;
    let c = client();
    let url = gw.url("/xff");
    assert_eq!(forwarded_for_seen(&c, &url, &[]).await, vec!["127.0.0.1"]);
    assert_eq!(
        forwarded_for_seen(&c, &url, &[("x-forwarded-for", "203.0.113.7")]).await,
        vec!["203.0.113.7, 127.0.0.1"]
    );
    assert_eq!(
        forwarded_for_seen(&c, &url, &[("x-forwarded-for", "203.0.113.7, 10.0.0.1")]).await,
        vec!["203.0.113.7, 10.0.0.1, 127.0.0.1"]
    );
    // Several header lines become one list, in order.
    assert_eq!(
        forwarded_for_seen(
            &c,
            &url,
            &[
                ("x-forwarded-for", "203.0.113.7"),
                ("x-forwarded-for", "198.51.100.1, 10.0.0.1"),
            ]
        )
        .await,
        vec!["203.0.113.7, 198.51.100.1, 10.0.0.1, 127.0.0.1"]
    );
    // From another loopback address the appended address is that peer.
    let c2 = client_from(Ipv4Addr::new(127, 0, 0, 2));
    assert_eq!(
        forwarded_for_seen(&c2, &url, &[("x-forwarded-for", "192.0.2.1")]).await,
        vec!["192.0.2.1, 127.0.0.2"]
    );
    // Without one, on the same connection as the request before: that peer alone (the
    // connection's own text of it, not the first client's).
    assert_eq!(forwarded_for_seen(&c2, &url, &[]).await, vec!["127.0.0.2"]);
    assert_eq!(forwarded_for_seen(&c, &url, &[]).await, vec!["127.0.0.1"]);
    assert_eq!(up.requests().await, 7);
}

/// The X-Forwarded-For values the upstream received for one request.
async fn forwarded_for_seen(c: &reqwest::Client, url: &str, h: &[(&str, &str)]) -> Vec<String> {
    let r = get(c, url, h).await;
    assert_eq!(r.status, StatusCode::OK);
    echoed_header(&r.json(), "x-forwarded-for")
}

#[tokio::test(flavor = "multi_thread")]
async fn upstream_status_codes_and_bodies_pass_through() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!("{}{DEFAULT_ROUTE}", up.upstreams_yaml())).await;
    let c = client();
    let statuses = [
        200u16, 201, 202, 301, 400, 401, 404, 418, 429, 500, 502, 503,
    ];
    for status in statuses {
        let s = status.to_string();
        let r = get(
            &c,
            &gw.url(&format!("/status/{status}?x=1")),
            &[("x-demo-status", &s), ("accept-encoding", "gzip, br")],
        )
        .await;
        assert_eq!(r.status.as_u16(), status);
        // Passed as the upstream sent it, whatever the client accepts: never compressed.
        assert_eq!(r.headers.get("content-encoding"), None, "{status}");
        // The upstream's own body and content type, not a gateway problem document.
        assert_eq!(r.header("content-type"), "application/json");
        assert_eq!(r.header("cache-control"), "no-store");
        let echo = r.json();
        assert_eq!(echo["path"], format!("/status/{status}"));
        assert_eq!(echo["query"], "x=1");
        assert_eq!(echoed_header(&echo, "x-demo-status"), vec![s.clone()]);
        assert_eq!(
            r.header_u64("content-length"),
            r.body.len() as u64,
            "{status}"
        );
    }
    assert_eq!(up.requests().await, statuses.len() as u64);
}

#[tokio::test(flavor = "multi_thread")]
async fn unknown_route_is_404_and_unreachable_upstream_is_502_problem_json() {
    let up = Upstream::start().await;
    // Connections to this port are refused for the whole test.
    let dead = ClosedPort::new();
    let gw = Gateway::start(&format!(
        "upstreams: {{ backend: [\"{}\"], dead: [\"127.0.0.1:{}\"] }}\n\
         routes:\n\
         \x20 - {{ name: api, match: {{ path_prefix: /api }}, upstream: backend }}\n\
         \x20 - {{ name: dead, match: {{ path_prefix: /dead }}, upstream: dead }}\n",
        up.addr, dead.port
    ))
    .await;
    let c = client();

    let r = get(&c, &gw.url("/api/ok"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);

    for (method, path) in [("GET", "/nothing"), ("POST", "/apix"), ("DELETE", "/")] {
        let r = send(
            &c,
            Method::from_bytes(method.as_bytes()).unwrap(),
            &gw.url(path),
            &[],
            None,
        )
        .await;
        let body = assert_problem(&r, 404, "Not Found");
        assert_eq!(
            body,
            json!({
                "type": "about:blank",
                "title": "Not Found",
                "status": 404,
                "detail": format!("No route matches {method} {path}."),
            })
        );
    }

    for method in [Method::GET, Method::POST] {
        let body = (method == Method::POST).then(|| b"payload".to_vec());
        // A fresh client each time: whether the connection survives a 502 is the subject of
        // `gateway_answers_leave_the_connection_usable_or_say_close`.
        let r = send(&client(), method, &gw.url("/dead/x"), &[], body).await;
        let body = assert_problem(&r, 502, "Bad Gateway");
        assert_eq!(body["type"], "about:blank");
        assert_eq!(
            body["detail"],
            "The upstream could not be reached or failed to answer."
        );
    }
    // Only the /api request reached the live upstream.
    assert_eq!(up.requests().await, 1);
}

/// After each answer the gateway writes itself (404, 400, 429, 502), a client on a keep-alive
/// connection must be able to send its next request there, unless the answer said
/// `Connection: close`. Otherwise the next request on a pooled connection fails.
#[tokio::test(flavor = "multi_thread")]
async fn gateway_answers_leave_the_connection_usable_or_say_close() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let dead = ClosedPort::new();
    let gw = Gateway::start(&format!(
        "upstreams: {{ backend: [\"{}\"], dead: [\"127.0.0.1:{}\"] }}\n\
         routes:\n\
         \x20 - {{ name: api, match: {{ path_prefix: /api }}, upstream: backend }}\n\
         \x20 - {{ name: dead, match: {{ path_prefix: /dead }}, upstream: dead }}\n\
         limits:\n\
         \x20 - {{ name: one, key: [header:x-bucket], algorithm: fixed_window, limit: 1, window: 1h }}\n",
        up.addr, dead.port
    ))
    .await;
    let host = gw.listen;
    let req = |path: &str, extra: &str| {
        format!("GET {path} HTTP/1.1\r\nHost: {host}\r\n{extra}\r\n").into_bytes()
    };
    // Use up the limit of bucket "b" so that the next request with it is a 429.
    let r = get(&client(), &gw.url("/api/x"), &[("x-bucket", "b")]).await;
    assert_eq!(r.status, StatusCode::OK);
    let cases = [
        (404, req("/nothing", "")),
        (400, req("/api/x", "x-api-key: has space\r\n")),
        (429, req("/api/x", "x-bucket: b\r\n")),
        (502, req("/dead/x", "")),
    ];
    for (status, first) in cases {
        let mut conn = RawConn::connect(gw.listen).await;
        conn.send(&first).await.expect("send");
        let r = conn.read_response().await.expect("a response");
        assert_eq!(r.status, status, "{}", r.head);
        let says_close = r
            .header("connection")
            .is_some_and(|v| v.eq_ignore_ascii_case("close"));
        if says_close {
            continue;
        }
        let next = match conn.send(&req("/api/next", "")).await {
            Ok(()) => conn.read_response().await,
            Err(_) => None,
        };
        let next = next.unwrap_or_else(|| {
            panic!(
                "after a {status} with `Connection: {}` the gateway closed the connection: \
                 the next request on it got no response",
                r.header("connection").unwrap_or_default()
            )
        });
        assert_eq!(
            next.status, 200,
            "request after the {status}: {}",
            next.head
        );
    }
}

/// `server.upstream_keepalive_pool`: idle upstream connections are kept for reuse, up to the
/// pool's size per worker thread over all upstreams (one thread here). Three rounds of 20
/// requests, each round all held at the upstream at once for 2 s (so each needs a connection
/// of its own, and a slow machine still gets all 20 there in time): with the default pool the
/// later rounds reuse the first round's 20 connections; with a pool of 2, each later round
/// finds 2 and opens 18 (`loadtest/log/2026-11-25-peer-options-floor.md`: a pool smaller
/// than the requests in flight made each request cost 1.5x the CPU).
#[tokio::test(flavor = "multi_thread")]
async fn upstream_connections_are_reused_up_to_the_keepalive_pool() {
    const N: u64 = 20;
    for (pool, connections) in [(None, N), (Some(2), N + 2 * (N - 2))] {
        let up = Upstream::start().await;
        let server = match pool {
            None => "server: { threads: 1 }\n".to_string(),
            Some(p) => format!("server: {{ threads: 1, upstream_keepalive_pool: {p} }}\n"),
        };
        let gw = Gateway::start(&format!("{server}{}{DEFAULT_ROUTE}", up.upstreams_yaml())).await;
        let c = client_builder()
            .pool_max_idle_per_host(N as usize)
            .build()
            .expect("client");
        for round in 0..3 {
            let mut set = tokio::task::JoinSet::new();
            for i in 0..N {
                let (c, url) = (c.clone(), gw.url(&format!("/r{round}/{i}")));
                set.spawn(
                    async move { get(&c, &url, &[("x-demo-delay-ms", "2000")]).await.status },
                );
            }
            up.wait_in_flight(N).await;
            while let Some(status) = set.join_next().await {
                assert_eq!(status.expect("request task"), StatusCode::OK);
            }
            // The gateway puts a connection back in its pool just after the client has its
            // answer; the next round must find them all there.
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
        let s = up.stats().await;
        assert_eq!((s.requests, s.max_in_flight), (3 * N, N));
        assert_eq!(
            s.connections, connections,
            "upstream_keepalive_pool {pool:?}"
        );
    }
}

/// Pooled upstream connections across an upstream restart. Three requests share one upstream
/// connection; the upstream then restarts on the same address (the kernel closes its end of
/// that connection), and the next three are answered 200 on one new connection. Pingora
/// checks a pooled connection's peer and liveness before each reuse (`patches/pingora-core`
/// checks the peer without a `getpeername` call per request); a request that failed on a
/// reused connection would also be retried, so this asserts the outcome, not which check
/// caught the closed connection.
#[tokio::test(flavor = "multi_thread")]
async fn after_an_upstream_restart_requests_are_answered_on_one_new_connection() {
    async fn three_on_one_connection(c: &reqwest::Client, gw: &Gateway, up: &Upstream, when: &str) {
        for i in 0..3 {
            let r = get(c, &gw.url(&format!("/{when}/{i}")), &[]).await;
            assert_eq!(r.status, StatusCode::OK, "{when} the restart: {:?}", r.body);
        }
        let s = up.stats().await;
        assert_eq!((s.requests, s.connections), (3, 1), "{when} the restart");
    }
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "server: {{ threads: 1 }}\n{}{DEFAULT_ROUTE}",
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    three_on_one_connection(&c, &gw, &up, "before").await;
    let up = up.restarted().await;
    three_on_one_connection(&c, &gw, &up, "after").await;
}

/// Idle upstream connections end as they did when Pingora watched each with a task of its own
/// (`patches/README.md`, pull request 6: one sweeping task per pool, every second). Two raw
/// upstreams note when each of their connections is closed:
/// - `a` (`idle: 400ms`) keeps its connections open: the gateway closes the pooled one once
///   its idle timeout has passed, never before it, and within a sweep after;
/// - `b` (`idle: 60s`) closes its side of a connection 100 ms after answering on it: the
///   gateway closes its own side within a sweep, and the next request is answered on a new
///   connection.
#[tokio::test(flavor = "multi_thread")]
async fn idle_upstream_connections_close_after_their_timeout_or_their_upstream() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::sync::mpsc;

    /// A connection's end: when its last answer was written and when the gateway closed it.
    struct Closed {
        answered: Instant,
        closed: Instant,
    }
    /// An upstream answering every request with `200 ok`, which closes its side of a
    /// connection `half_close` after answering on it, if given.
    async fn raw_upstream(
        half_close: Option<Duration>,
    ) -> (std::net::SocketAddr, mpsc::UnboundedReceiver<Closed>) {
        let listener = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .await
            .expect("bind");
        let addr = listener.local_addr().expect("addr");
        let (tx, rx) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                let tx = tx.clone();
                tokio::spawn(async move {
                    let mut head = Vec::new();
                    let mut chunk = [0u8; 4096];
                    let mut answered = None;
                    loop {
                        match s.read(&mut chunk).await {
                            Ok(0) | Err(_) => break,
                            Ok(n) => head.extend_from_slice(&chunk[..n]),
                        }
                        if head.ends_with(b"\r\n\r\n") {
                            head.clear();
                            let ok = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
                            s.write_all(ok).await.expect("answer");
                            answered = Some(Instant::now());
                            if let Some(after) = half_close {
                                tokio::time::sleep(after).await;
                                s.shutdown().await.expect("half-close");
                            }
                        }
                    }
                    if let Some(answered) = answered {
                        let closed = Instant::now();
                        let _ = tx.send(Closed { answered, closed });
                    }
                });
            }
        });
        (addr, rx)
    }
    const SWEEP: Duration = Duration::from_secs(1);
    let idle = Duration::from_millis(400);
    let (a, mut a_closed) = raw_upstream(None).await;
    let (b, mut b_closed) = raw_upstream(Some(Duration::from_millis(100))).await;
    let gw = Gateway::start(&format!(
        "server: {{ threads: 1 }}\n\
         upstreams:\n\
         \x20 a: {{ servers: [\"{a}\"], timeouts: {{ idle: 400ms }} }}\n\
         \x20 b: {{ servers: [\"{b}\"], timeouts: {{ idle: 60s }} }}\n\
         routes:\n\
         \x20 - {{ name: a, match: {{ path_prefix: /a }}, upstream: a }}\n\
         \x20 - {{ name: b, match: {{ path_prefix: /b }}, upstream: b }}\n"
    ))
    .await;
    let c = client();
    async fn next_closed(rx: &mut mpsc::UnboundedReceiver<Closed>, what: &str) -> Duration {
        let end = tokio::time::timeout(Duration::from_secs(5), rx.recv())
            .await
            .unwrap_or_else(|_| panic!("the gateway closes {what} within 5 s"))
            .expect("a closed connection");
        end.closed - end.answered
    }

    assert_eq!(get(&c, &gw.url("/a/1"), &[]).await.status, StatusCode::OK);
    let idle_for = next_closed(&mut a_closed, "an idle connection past its timeout").await;
    assert!(
        idle_for >= idle && idle_for < idle + 2 * SWEEP,
        "closed {idle_for:?} after its last answer, idle timeout {idle:?}"
    );

    assert_eq!(get(&c, &gw.url("/b/1"), &[]).await.status, StatusCode::OK);
    let idle_for = next_closed(&mut b_closed, "an idle connection its upstream closed").await;
    assert!(
        idle_for < Duration::from_millis(100) + 2 * SWEEP,
        "closed {idle_for:?} after its last answer"
    );
    let r = get(&c, &gw.url("/b/2"), &[]).await;
    assert_eq!(r.status, StatusCode::OK, "{:?}", r.body);
}

/// The peers tollgate hands Pingora (`tollgate::proxy::peer`) take the patched `pingora-core`'s
/// path (`patches/README.md`): a pooled connection is matched to its peer by the address
/// recorded when it was made, not with a `getpeername` call per reuse. It matches the peer it
/// was made to and no other, which is what keeps a connection filed under another peer's pool
/// key from being reused for it. Not built against stock Pingora, which has no such path
/// (`scripts/stock-build.sh`).
#[cfg(not(feature = "stock-pingora"))]
#[tokio::test]
async fn an_upstream_connection_matches_only_the_peer_it_was_made_to() {
    use pingora_core::connectors::TransportConnector;
    use pingora_core::upstreams::peer::Peer;
    use tollgate::config::defaults::UPSTREAM_TIMEOUTS;

    // Two listening ports; the kernel completes a connection to one before it is accepted.
    let listen = || std::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind");
    let (a, b) = (listen(), listen());
    let to_a = tollgate::proxy::peer(a.local_addr().expect("addr"), &UPSTREAM_TIMEOUTS, false);
    let to_b = tollgate::proxy::peer(b.local_addr().expect("addr"), &UPSTREAM_TIMEOUTS, false);
    let stream = TransportConnector::new(None)
        .new_stream(&to_a)
        .await
        .expect("connect to a listening port");
    let digest = stream
        .get_socket_digest()
        .expect("a TCP stream has a socket digest");
    assert_eq!(
        digest.peer_addr(),
        Some(to_a.address()),
        "recorded at connect"
    );
    assert!(to_a.matches_stream(&stream));
    assert!(!to_b.matches_stream(&stream));
}

/// Header names on the wire, both ways (`server.preserve_header_case`). By default a request's
/// and a response's names are forwarded in their titled form for the common ones (`Host`,
/// `Content-Length`) and in lowercase for the rest, as Envoy and HAProxy do; with the setting
/// on, exactly as they arrived. A raw upstream records the request head it was sent and answers
/// with mixed-case names; the client reads the response head as raw bytes. Not built against
/// stock Pingora, which always keeps the names' case (`src/pingora_patches.rs`).
#[cfg(not(feature = "stock-pingora"))]
#[tokio::test(flavor = "multi_thread")]
async fn header_names_keep_their_case_only_with_preserve_header_case() {
    use common::raw::raw_request;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let upstream = tokio::net::TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .await
        .expect("bind");
    let up_addr = upstream.local_addr().expect("addr");
    let (heads_tx, mut heads) = tokio::sync::mpsc::unbounded_channel::<String>();
    let server = tokio::spawn(async move {
        while let Ok((mut s, _)) = upstream.accept().await {
            let mut head = Vec::new();
            let mut chunk = [0u8; 4096];
            while !head.ends_with(b"\r\n\r\n") {
                match s.read(&mut chunk).await {
                    Ok(0) | Err(_) => break,
                    Ok(n) => head.extend_from_slice(&chunk[..n]),
                }
            }
            let _ = heads_tx.send(String::from_utf8_lossy(&head).into_owned());
            let answer = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Upstream-Mixed: u\r\n\
                          Connection: close\r\n\r\nok";
            let _ = s.write_all(answer.as_bytes()).await;
        }
    });
    let yaml = |preserve: bool| {
        format!(
            "server: {{ preserve_header_case: {preserve} }}\nupstreams: {{ backend: [\"{up_addr}\"] }}\n{DEFAULT_ROUTE}"
        )
    };
    let request = raw_request(
        "GET",
        "/case",
        &[("X-Client-Mixed", "c"), ("User-Agent", "raw")],
    );
    for preserve in [false, true] {
        let gw = Gateway::start(&yaml(preserve)).await;
        let mut conn = RawConn::connect(gw.listen).await;
        conn.send(request.as_bytes()).await.expect("send");
        let resp = conn.read_response().await.expect("a response");
        assert_eq!((resp.status, resp.body.as_slice()), (200, &b"ok"[..]));
        let sent = heads.recv().await.expect("the upstream saw the request");
        let lines = |head: &str| -> Vec<String> {
            head.lines()
                .skip(1)
                .filter_map(|l| l.split_once(':').map(|(k, _)| k.to_string()))
                .collect()
        };
        let (upstream_saw, client_saw) = (lines(&sent), lines(&resp.head));
        let expect = |names: &[&str], saw: &[String], side: &str| {
            for n in names {
                assert!(
                    saw.iter().any(|s| s == n),
                    "preserve_header_case: {preserve}: {side} has no {n:?} in {saw:?}"
                );
            }
        };
        // `Host` and `Content-Length` are titled either way; tollgate's own are lowercase.
        expect(
            &["Host", "x-forwarded-for"],
            &upstream_saw,
            "the upstream request",
        );
        expect(&["Content-Length"], &client_saw, "the response");
        if preserve {
            expect(
                &["X-Client-Mixed", "User-Agent"],
                &upstream_saw,
                "the upstream request",
            );
            expect(&["X-Upstream-Mixed"], &client_saw, "the response");
        } else {
            expect(
                &["x-client-mixed", "user-agent"],
                &upstream_saw,
                "the upstream request",
            );
            expect(&["x-upstream-mixed"], &client_saw, "the response");
        }
    }
    server.abort();
}

// ---------------------------------------------------------------------------------------
// 2. 429 after the limit, exact headers
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn limit_denies_with_exact_headers_and_problem_body() {
    // fixed_window, 1 h: the window end is a whole second known to the test, so t, Retry-After
    // and Reset are exact up to which second the gateway read its clock in.
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "{}{DEFAULT_ROUTE}limits:\n  - {{ name: per-key, key: [api_key], algorithm: fixed_window, limit: 3, window: 1h }}\n",
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    let url = gw.url("/v1/things");
    let key = [("x-api-key", "key-a")];

    for i in 1..=3u64 {
        let (r, before, after) = timed_get(&c, &url, &key).await;
        assert_allowed(&r, "per-key", 3, HOUR, 3 - i, before, after);
        let t = r.ratelimit_t();
        // Reset = now + t (±1 s: the gateway's now is between before and after).
        let reset = r.header_u64("x-ratelimit-reset");
        assert!(
            (before / 1000 + t..=after.div_ceil(1000) + t).contains(&reset),
            "reset {reset}, t {t}, before {before}, after {after}"
        );
        assert_eq!(r.json()["path"], "/v1/things");
    }

    for _ in 0..2 {
        let (r, before, after) = timed_get(&c, &url, &key).await;
        let body = assert_problem(&r, 429, "Too Many Requests");
        assert_eq!(r.header("cache-control"), "no-store");
        let t = assert_denied_hourly(&r, "per-key", 3, before, after);
        assert_eq!(body["type"], QUOTA_EXCEEDED);
        assert_eq!(body["policy"], "per-key");
        assert_eq!(body["limit"], 3);
        assert_eq!(body["window"], "1h");
        assert_eq!(body["window_seconds"], 3600);
        assert_eq!(body["remaining"], 0);
        assert_eq!(body["retry_after"], t);
        let detail = body["detail"].as_str().expect("detail");
        assert!(detail.contains("\"per-key\""), "{detail}");
    }
    // Denied requests never reached the upstream.
    assert_eq!(up.requests().await, 3);

    // Another key has its own counter.
    let (r, before, after) = timed_get(&c, &url, &[("x-api-key", "key-b")]).await;
    assert_allowed(&r, "per-key", 3, HOUR, 2, before, after);
    assert_eq!(up.requests().await, 4);
}

/// `X-RateLimit-Reset` is the Unix second at which the quota resets. For a fixed window that
/// is exactly the window end, a whole second.
#[tokio::test(flavor = "multi_thread")]
async fn x_ratelimit_reset_is_the_end_of_the_fixed_window() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "{}{DEFAULT_ROUTE}limits:\n  - {{ name: hourly, key: [], algorithm: fixed_window, limit: 1, window: 1h }}\n",
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    for expect in [200u16, 429] {
        let (r, before, _) = timed_get(&c, &gw.url("/x"), &[]).await;
        assert_eq!(r.status.as_u16(), expect);
        let end = window_end_s(before, HOUR);
        let t = r.ratelimit_t();
        assert_eq!(
            r.header_u64("x-ratelimit-reset"),
            end,
            "X-RateLimit-Reset must be the window end {end} (t={t}, request sent at {before} ms)"
        );
    }
}

/// `headers.on_admitted: false`: admitted answers carry no rate-limit headers, and a 429
/// carries every one of them, as by default.
#[tokio::test(flavor = "multi_thread")]
async fn rate_limit_headers_only_on_refusals_with_on_admitted_false() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "{}{DEFAULT_ROUTE}headers: {{ on_admitted: false }}\nlimits:\n  - {{ name: per-key, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h }}\n",
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    let key = [("x-api-key", "key-a")];
    for _ in 0..2 {
        let r = get(&c, &gw.url("/x"), &key).await;
        assert_eq!(r.status, StatusCode::OK, "{r:#?}");
        r.assert_no_ratelimit_headers();
    }
    let (r, before, after) = timed_get(&c, &gw.url("/x"), &key).await;
    assert_problem(&r, 429, "Too Many Requests");
    assert_denied_hourly(&r, "per-key", 2, before, after);
    // The admitted two reached the upstream, the refused one did not.
    assert_eq!(up.requests().await, 2);
}

// ---------------------------------------------------------------------------------------
// 3. Tiers, most restrictive wins, anonymous callers
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn tiers_default_tier_most_restrictive_and_anonymous_limits() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        r#"{}
tiers:
  free: [ {{ name: free-hour, algorithm: fixed_window, limit: 5, window: 1h }} ]
  pro: [ {{ name: pro-hour, algorithm: fixed_window, limit: 50, window: 1h }} ]
api_keys: {{ key-free: free, key-pro: pro }}
default_tier: free
routes:
  - name: search
    match: {{ path_prefix: /search }}
    upstream: backend
    limits: [ {{ name: search, key: [api_key], algorithm: fixed_window, limit: 10, window: 1h }} ]
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: anon-ip, key: [client_ip], algorithm: fixed_window, limit: 2, window: 1h, anonymous_only: true, routes: [default] }}
"#,
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    let mut served = 0;
    let pro = [("x-api-key", "key-pro")];
    let free = [("x-api-key", "key-free")];

    // Each key's tier limit.
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &pro).await;
    assert_allowed(&r, "pro-hour", 50, HOUR, 49, b, a);
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &free).await;
    assert_allowed(&r, "free-hour", 5, HOUR, 4, b, a);
    // An unknown key gets the default tier, with its own counter.
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &[("x-api-key", "key-unknown")]).await;
    assert_allowed(&r, "free-hour", 5, HOUR, 4, b, a);
    served += 3;

    // Tier and route limit both apply: the one with fewer remaining is reported.
    // pro: pro-hour r=48, search r=9 → search.
    let (r, b, a) = timed_get(&c, &gw.url("/search"), &pro).await;
    assert_allowed(&r, "search", 10, HOUR, 9, b, a);
    // free: free-hour r=3, search r=9 → free-hour.
    let (r, b, a) = timed_get(&c, &gw.url("/search"), &free).await;
    assert_allowed(&r, "free-hour", 5, HOUR, 3, b, a);
    served += 2;
    for remaining in [2, 1, 0] {
        let (r, b, a) = timed_get(&c, &gw.url("/search"), &free).await;
        assert_allowed(&r, "free-hour", 5, HOUR, remaining, b, a);
        served += 1;
    }
    // The tier limit is exhausted (the route limit still has 6): denied by free-hour.
    let r = get(&c, &gw.url("/search"), &free).await;
    let body = assert_problem(&r, 429, "Too Many Requests");
    assert_eq!(body["policy"], "free-hour");
    assert_eq!(r.header("ratelimit-policy"), "\"free-hour\";q=5;w=3600");
    assert_eq!(r.header("x-ratelimit-remaining"), "0");
    // pro on /search again: search r=8 is still the more restrictive.
    let (r, b, a) = timed_get(&c, &gw.url("/search"), &pro).await;
    assert_allowed(&r, "search", 10, HOUR, 8, b, a);
    served += 1;

    // Anonymous: no tier limits, only the anonymous_only per-IP limit of the default route.
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &[]).await;
    assert_allowed(&r, "anon-ip", 2, HOUR, 1, b, a);
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &[]).await;
    assert_allowed(&r, "anon-ip", 2, HOUR, 0, b, a);
    served += 2;
    let r = get(&c, &gw.url("/items"), &[]).await;
    assert_eq!(
        assert_problem(&r, 429, "Too Many Requests")["policy"],
        "anon-ip"
    );
    // Anonymous on /search: the route limit is keyed on api_key and anon-ip is not on this
    // route, so nothing limits it and no rate-limit headers are sent.
    let r = get(&c, &gw.url("/search"), &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    r.assert_no_ratelimit_headers();
    served += 1;

    // A keyed caller from the same IP is not subject to the anonymous_only limit.
    let (r, b, a) = timed_get(&c, &gw.url("/items"), &pro).await;
    assert_allowed(&r, "pro-hour", 50, HOUR, 46, b, a);
    served += 1;

    assert_eq!(up.requests().await, served);
}

// ---------------------------------------------------------------------------------------
// 4. A denied request consumes nothing from the other limits
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn denied_request_consumes_nothing_from_other_limits() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        r#"{}
routes:
  - name: narrow
    match: {{ path_prefix: /narrow }}
    upstream: backend
    limits: [ {{ name: narrow, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h }} ]
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: wide, key: [api_key], algorithm: fixed_window, limit: 10, window: 1h }}
"#,
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    let k = [("x-api-key", "k")];
    for remaining in [1, 0] {
        let (r, b, a) = timed_get(&c, &gw.url("/narrow"), &k).await;
        assert_allowed(&r, "narrow", 2, HOUR, remaining, b, a);
    }
    for _ in 0..5 {
        let r = get(&c, &gw.url("/narrow"), &k).await;
        assert_eq!(
            assert_problem(&r, 429, "Too Many Requests")["policy"],
            "narrow"
        );
    }
    // 2 admitted, 5 denied: wide has 10 − 2 − 1 = 7 left after this request, not 2.
    let (r, b, a) = timed_get(&c, &gw.url("/other"), &k).await;
    assert_allowed(&r, "wide", 10, HOUR, 7, b, a);
    // It goes on from there to 0, then denies.
    for remaining in (0..=6).rev() {
        let (r, b, a) = timed_get(&c, &gw.url("/other"), &k).await;
        assert_allowed(&r, "wide", 10, HOUR, remaining, b, a);
    }
    let r = get(&c, &gw.url("/other"), &k).await;
    assert_eq!(
        assert_problem(&r, 429, "Too Many Requests")["policy"],
        "wide"
    );
    assert_eq!(up.requests().await, 10);
}

// ---------------------------------------------------------------------------------------
// 5. Shadow limits
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn shadow_limits_never_deny_and_are_not_in_headers() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        r#"{}
routes:
  - {{ name: mixed, match: {{ path_prefix: /mixed }}, upstream: backend }}
  - {{ name: shadow-only, match: {{ path_prefix: /shadow-only }}, upstream: backend }}
limits:
  - {{ name: canary, key: [api_key], algorithm: fixed_window, limit: 2, window: 1h, shadow: true }}
  - {{ name: real, key: [api_key], algorithm: fixed_window, limit: 100, window: 1h, routes: [mixed] }}
"#,
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    // 6 requests against a shadow limit of 2: all admitted; the headers are the real limit's.
    for i in 1..=6u64 {
        let (r, b, a) = timed_get(&c, &gw.url("/mixed"), &[("x-api-key", "k1")]).await;
        assert_allowed(&r, "real", 100, HOUR, 100 - i, b, a);
        for (name, v) in &r.headers {
            assert!(
                !v.to_str().unwrap().contains("canary"),
                "shadow limit in {name}: {v:?}"
            );
        }
    }
    // Only a shadow limit applies: admitted, and no rate-limit headers at all.
    for _ in 0..5 {
        let r = get(&c, &gw.url("/shadow-only"), &[("x-api-key", "k2")]).await;
        assert_eq!(r.status, StatusCode::OK);
        r.assert_no_ratelimit_headers();
    }
    assert_eq!(up.requests().await, 11);
    // The shadow limit counted: it would have denied 4 + 3 requests, and says so in the log.
    assert_eq!(count(&gw.output(), "shadow limit would deny"), 7);
}

// ---------------------------------------------------------------------------------------
// 6. Per-IP limits and X-Forwarded-For from trusted and untrusted peers
// ---------------------------------------------------------------------------------------

/// One route and a per-IP limit of 2 an hour, trusting X-Forwarded-For from 127.0.0.1;
/// `identity` adds settings to the identity section (", ipv6_prefix: 128").
fn per_ip_config(up: &Upstream, identity: &str) -> String {
    format!(
        r#"{}{DEFAULT_ROUTE}identity: {{ trusted_proxies: ["127.0.0.1/32"]{identity} }}
limits:
  - {{ name: per-ip, key: [client_ip], algorithm: fixed_window, limit: 2, window: 1h }}
"#,
        up.upstreams_yaml()
    )
}

#[tokio::test(flavor = "multi_thread")]
async fn per_ip_limit_honours_forwarded_for_only_from_trusted_proxies() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start(&per_ip_config(&up, "")).await;
    let url = gw.url("/ip");
    let trusted = client(); // connects from 127.0.0.1
    let untrusted = client_from(Ipv4Addr::new(127, 0, 0, 2));
    let xff = |v: &'static str| [("x-forwarded-for", v)];

    // Trusted peer: the forwarded address is the client, one counter per address.
    let (r, b, a) = timed_get(&trusted, &url, &xff("203.0.113.1")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 1, b, a);
    let (r, b, a) = timed_get(&trusted, &url, &xff("203.0.113.1")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 0, b, a);
    let r = get(&trusted, &url, &xff("203.0.113.1")).await;
    assert_problem(&r, 429, "Too Many Requests");
    let (r, b, a) = timed_get(&trusted, &url, &xff("203.0.113.2")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 1, b, a);
    // The rightmost untrusted hop is the client.
    let (r, b, a) = timed_get(&trusted, &url, &xff("203.0.113.1, 203.0.113.3")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 1, b, a);
    assert_eq!(
        echoed_header(&r.json(), "x-forwarded-for"),
        vec!["203.0.113.1, 203.0.113.3, 127.0.0.1"]
    );
    // Without the header the trusted peer itself is the client.
    let (r, b, a) = timed_get(&trusted, &url, &[]).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 1, b, a);

    // Untrusted peer 127.0.0.2: the header is ignored, every value shares the peer's counter.
    let (r, b, a) = timed_get(&untrusted, &url, &xff("198.51.100.1")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 1, b, a);
    assert_eq!(
        echoed_header(&r.json(), "x-forwarded-for"),
        vec!["198.51.100.1, 127.0.0.2"]
    );
    let (r, b, a) = timed_get(&untrusted, &url, &xff("198.51.100.2")).await;
    assert_allowed(&r, "per-ip", 2, HOUR, 0, b, a);
    for v in ["198.51.100.3", "203.0.113.77", "127.0.0.1"] {
        let r = get(&untrusted, &url, &xff(v)).await;
        assert_eq!(
            assert_problem(&r, 429, "Too Many Requests")["policy"],
            "per-ip"
        );
    }
    let r = get(&untrusted, &url, &[]).await;
    assert_problem(&r, 429, "Too Many Requests");
    // And that counter is 127.0.0.2's: a trusted proxy forwarding for 127.0.0.2 hits it.
    let r = get(&trusted, &url, &xff("127.0.0.2")).await;
    assert_problem(&r, 429, "Too Many Requests");

    assert_eq!(up.requests().await, 7);
}

/// One request of a per-IP test: the client address, and the remaining count after it (None: 429).
type Step<'a> = (&'a str, Option<u64>);

#[tokio::test(flavor = "multi_thread")]
async fn per_ip_limits_count_ipv6_clients_per_network() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let c = client();
    // (identity settings, [(X-Forwarded-For, remaining after it, or None for 429)]).
    let cases: [(&str, &[Step]); 3] = [
        // Default: one counter per /64; IPv4 addresses are never grouped.
        (
            "",
            &[
                ("2001:db8:1:2::1", Some(1)),
                ("2001:db8:1:2:ffff:ffff:ffff:ffff", Some(0)),
                ("2001:db8:1:2:abcd::7", None),
                ("2001:db8:1:3::1", Some(1)),
                ("203.0.113.1", Some(1)),
                ("203.0.113.2", Some(1)),
            ],
        ),
        // 128: every address on its own.
        (
            ", ipv6_prefix: 128",
            &[
                ("2001:db8:1:2::1", Some(1)),
                ("2001:db8:1:2::1", Some(0)),
                ("2001:db8:1:2::2", Some(1)),
                ("2001:db8:1:2::2", Some(0)),
            ],
        ),
        // 48: a whole site.
        (
            ", ipv6_prefix: 48",
            &[
                ("2001:db8:1:2::1", Some(1)),
                ("2001:db8:1:ffff::1", Some(0)),
                ("2001:db8:1::1", None),
                ("2001:db8:2::1", Some(1)),
            ],
        ),
    ];
    let mut admitted = 0;
    for (identity, steps) in cases {
        let gw = Gateway::start(&per_ip_config(&up, identity)).await;
        let url = gw.url("/ip6");
        for &(ip, want) in steps {
            let (r, b, a) = timed_get(&c, &url, &[("x-forwarded-for", ip)]).await;
            match want {
                Some(remaining) => {
                    assert_allowed(&r, "per-ip", 2, HOUR, remaining, b, a);
                    admitted += 1;
                }
                None => {
                    assert_problem(&r, 429, "Too Many Requests");
                }
            }
        }
    }
    assert_eq!(up.requests().await, admitted);
    assert_eq!(admitted, 12);
}

// ---------------------------------------------------------------------------------------
// 7. JWT: user and tier
// ---------------------------------------------------------------------------------------

const JWT_SECRET: &str = "tollgate-integration-test-secret-0123456789";

fn jwt(claims: Value, secret: &str, alg: jsonwebtoken::Algorithm) -> String {
    jsonwebtoken::encode(
        &jsonwebtoken::Header::new(alg),
        &claims,
        &jsonwebtoken::EncodingKey::from_secret(secret.as_bytes()),
    )
    .expect("encode JWT")
}

fn unix_s() -> u64 {
    now_ms() / 1000
}

#[tokio::test(flavor = "multi_thread")]
async fn jwt_names_the_user_and_tier_and_bad_tokens_are_401() {
    clear_of_window_boundary(HOUR, 20).await;
    let up = Upstream::start().await;
    let gw = Gateway::start_with_env(
        &format!(
            r#"{}{DEFAULT_ROUTE}identity:
  jwt: {{ hs256_secret_env: TOLLGATE_IT_JWT_SECRET }}
tiers:
  free: [ {{ name: free-user, key: [user], algorithm: fixed_window, limit: 2, window: 1h }} ]
  gold: [ {{ name: gold-user, key: [user], algorithm: fixed_window, limit: 20, window: 1h }} ]
default_tier: free
"#,
            up.upstreams_yaml()
        ),
        &[("TOLLGATE_IT_JWT_SECRET", JWT_SECRET)],
    )
    .await;
    let c = client();
    let url = gw.url("/me");
    let hs = jsonwebtoken::Algorithm::HS256;
    let exp = unix_s() + 3600;
    let token = |claims: Value| format!("Bearer {}", jwt(claims, JWT_SECRET, hs));
    let alice = token(json!({ "sub": "alice", "tier": "gold", "exp": exp }));
    let carol = token(json!({ "sub": "carol", "tier": "gold", "exp": exp }));
    let bob = token(json!({ "sub": "bob", "exp": exp }));
    let dave = token(json!({ "sub": "dave", "tier": "platinum", "exp": exp }));

    // The tier claim selects the tier; the sub claim names the user of key: [user].
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &alice)]).await;
    assert_allowed(&r, "gold-user", 20, HOUR, 19, b, a);
    assert_eq!(
        echoed_header(&r.json(), "authorization"),
        vec![alice.clone()]
    );
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &alice)]).await;
    assert_allowed(&r, "gold-user", 20, HOUR, 18, b, a);
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &carol)]).await;
    assert_allowed(&r, "gold-user", 20, HOUR, 19, b, a);
    // No tier claim, or an unknown tier: the default tier.
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &bob)]).await;
    assert_allowed(&r, "free-user", 2, HOUR, 1, b, a);
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &bob)]).await;
    assert_allowed(&r, "free-user", 2, HOUR, 0, b, a);
    let r = get(&c, &url, &[("authorization", &bob)]).await;
    assert_eq!(
        assert_problem(&r, 429, "Too Many Requests")["policy"],
        "free-user"
    );
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &dave)]).await;
    assert_allowed(&r, "free-user", 2, HOUR, 1, b, a);
    // A token without the scheme word is accepted too.
    let bare = jwt(
        json!({ "sub": "erin", "tier": "gold", "exp": exp }),
        JWT_SECRET,
        hs,
    );
    let (r, b, a) = timed_get(&c, &url, &[("authorization", &bare)]).await;
    assert_allowed(&r, "gold-user", 20, HOUR, 19, b, a);
    // No token: anonymous, no tier, and every limit here needs a user.
    let r = get(&c, &url, &[]).await;
    assert_eq!(r.status, StatusCode::OK);
    r.assert_no_ratelimit_headers();
    let served = 8;
    assert_eq!(up.requests().await, served);

    // Invalid tokens: 401 problem, never proxied.
    let bad = [
        (
            "wrong secret",
            format!(
                "Bearer {}",
                jwt(
                    json!({ "sub": "alice", "tier": "gold", "exp": exp }),
                    "not-the-secret",
                    hs
                )
            ),
        ),
        (
            "expired an hour ago",
            token(json!({ "sub": "alice", "tier": "gold", "exp": unix_s() - 3600 })),
        ),
        (
            "HS384 instead of HS256",
            format!(
                "Bearer {}",
                jwt(
                    json!({ "sub": "alice", "exp": exp }),
                    JWT_SECRET,
                    jsonwebtoken::Algorithm::HS384
                )
            ),
        ),
        ("no sub claim", token(json!({ "tier": "gold", "exp": exp }))),
        ("not a JWT", "Bearer not.a.jwt".to_string()),
        ("tampered payload", {
            // alice's signature on a payload that names mallory.
            let parts: Vec<&str> = alice.trim_start_matches("Bearer ").split('.').collect();
            let forged = jwt(
                json!({ "sub": "mallory", "tier": "gold", "exp": exp }),
                "x",
                hs,
            );
            let forged_payload = forged.split('.').nth(1).unwrap().to_string();
            format!("Bearer {}.{}.{}", parts[0], forged_payload, parts[2])
        }),
    ];
    for (what, auth) in bad {
        let r = get(&c, &url, &[("authorization", &auth)]).await;
        let body = assert_problem(&r, 401, "Unauthorized");
        assert_eq!(
            r.header("www-authenticate"),
            "Bearer error=\"invalid_token\"",
            "{what}"
        );
        assert_eq!(body["type"], "about:blank", "{what}");
        let detail = body["detail"].as_str().unwrap();
        assert!(
            detail.starts_with("the bearer token is invalid"),
            "{what}: {detail}"
        );
        r.assert_no_ratelimit_headers();
    }
    assert_eq!(up.requests().await, served);
}

/// `identity.jwt.audience`, `issuer` and `require_exp` through the real gateway: a token
/// from the configured issuer for the configured audience is admitted and names its user;
/// every other one is a 401 that never reaches the upstream. Without an audience configured,
/// a token that carries `aud` is admitted (identity providers send it); without `exp` it is
/// refused unless `require_exp: false`; an `exp` that is a string is refused, not ignored.
#[tokio::test(flavor = "multi_thread")]
async fn jwt_audience_issuer_and_required_exp() {
    let up = Upstream::start().await;
    let yaml = |jwt: &str| {
        format!(
            "{}{DEFAULT_ROUTE}identity:\n  jwt: {{ hs256_secret_env: TOLLGATE_IT_JWT_SECRET{jwt} }}\n\
             limits:\n  - {{ name: per-user, key: [user], algorithm: fixed_window, limit: 100, window: 1h }}\n",
            up.upstreams_yaml()
        )
    };
    let env = [("TOLLGATE_IT_JWT_SECRET", JWT_SECRET)];
    let strict = Gateway::start_with_env(
        &yaml(", audience: [orders-api, billing-api], issuer: \"https://idp.example.com/\""),
        &env,
    )
    .await;
    let plain = Gateway::start_with_env(&yaml(""), &env).await;
    let lax = Gateway::start_with_env(&yaml(", require_exp: false"), &env).await;
    let c = client();
    let exp = unix_s() + 3600;
    let bearer = |claims: Value| {
        format!(
            "Bearer {}",
            jwt(claims, JWT_SECRET, jsonwebtoken::Algorithm::HS256)
        )
    };
    let iss = "https://idp.example.com/";
    let admitted = |gw: &Gateway, claims: Value| {
        let (url, auth) = (gw.url("/who"), bearer(claims.clone()));
        let c = c.clone();
        async move {
            let r = get(&c, &url, &[("authorization", &auth)]).await;
            assert_eq!(r.status, StatusCode::OK, "{claims}: {}", r.text());
            assert_eq!(
                r.header("ratelimit-policy"),
                "\"per-user\";q=100;w=3600",
                "{claims}"
            );
        }
    };
    let refused = |gw: &Gateway, claims: Value, why: &'static str| {
        let (url, auth) = (gw.url("/who"), bearer(claims.clone()));
        let c = c.clone();
        async move {
            let r = get(&c, &url, &[("authorization", &auth)]).await;
            let body = assert_problem(&r, 401, "Unauthorized");
            assert_eq!(
                body["detail"],
                format!("the bearer token is invalid: {why}"),
                "{claims}"
            );
        }
    };
    admitted(
        &strict,
        json!({ "sub": "a", "exp": exp, "iss": iss, "aud": "orders-api" }),
    )
    .await;
    admitted(
        &strict,
        json!({ "sub": "a", "exp": exp, "iss": iss, "aud": ["x", "billing-api"] }),
    )
    .await;
    refused(
        &strict,
        json!({ "sub": "a", "exp": exp, "iss": iss, "aud": "other-api" }),
        "InvalidAudience",
    )
    .await;
    refused(
        &strict,
        json!({ "sub": "a", "exp": exp, "iss": iss }),
        "Missing required claim: aud",
    )
    .await;
    refused(
        &strict,
        json!({ "sub": "a", "exp": exp, "iss": "https://evil.example/", "aud": "orders-api" }),
        "InvalidIssuer",
    )
    .await;
    refused(
        &strict,
        json!({ "sub": "a", "exp": exp, "aud": "orders-api" }),
        "Missing required claim: iss",
    )
    .await;
    refused(
        &strict,
        json!({ "sub": "a", "iss": iss, "aud": "orders-api" }),
        "claim \"exp\" is missing",
    )
    .await;
    // No audience configured: `aud` is not checked (the crate's default refused every token with one).
    admitted(&plain, json!({ "sub": "b", "exp": exp, "aud": "anything" })).await;
    refused(&plain, json!({ "sub": "b" }), "claim \"exp\" is missing").await;
    refused(
        &plain,
        json!({ "sub": "b", "exp": (unix_s() - 60).to_string() }),
        "claim \"exp\" is not a number",
    )
    .await;
    refused(
        &plain,
        json!({ "sub": "b", "exp": exp, "nbf": "later" }),
        "claim \"nbf\" is not a number",
    )
    .await;
    // `require_exp: false`: a token without `exp` is admitted; one with an old `exp` is not.
    admitted(&lax, json!({ "sub": "c" })).await;
    refused(
        &lax,
        json!({ "sub": "c", "exp": unix_s() - 60 }),
        "the token has expired",
    )
    .await;
    assert_eq!(up.requests().await, 4);
}

// ---------------------------------------------------------------------------------------
// 8. Malformed API keys
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn malformed_api_keys_are_400() {
    let up = Upstream::start().await;
    let gw = Gateway::start(&format!(
        "{}{DEFAULT_ROUTE}limits:\n  - {{ name: per-key, key: [api_key], algorithm: fixed_window, limit: 100, window: 1h }}\n",
        up.upstreams_yaml()
    ))
    .await;
    let c = client();
    let url = gw.url("/k");
    let expected = json!({
        "type": "about:blank",
        "title": "Bad Request",
        "status": 400,
        "detail": "the x-api-key header must be sent once, with 1 to 256 visible ASCII characters",
    });

    // 256 visible characters is the longest valid key.
    let longest = "k".repeat(256);
    let r = get(&c, &url, &[("x-api-key", &longest)]).await;
    assert_eq!(r.status, StatusCode::OK);
    assert_eq!(r.header("x-ratelimit-remaining"), "99");
    let printable: String = (0x21u8..=0x7e).map(char::from).collect();
    let r = get(&c, &url, &[("x-api-key", &printable)]).await;
    assert_eq!(r.status, StatusCode::OK, "every visible ASCII character");

    let too_long = "k".repeat(257);
    let cases: Vec<(&str, Vec<(&str, &str)>)> = vec![
        ("257 bytes", vec![("x-api-key", too_long.as_str())]),
        ("sent twice", vec![("x-api-key", "a"), ("x-api-key", "b")]),
        (
            "sent twice, same value",
            vec![("x-api-key", "a"), ("x-api-key", "a")],
        ),
        ("empty", vec![("x-api-key", "")]),
        ("inner space", vec![("x-api-key", "abc def")]),
        ("tab", vec![("x-api-key", "abc\tdef")]),
    ];
    for (what, headers) in cases {
        let r = get(&c, &url, &headers).await;
        let body = assert_problem(&r, 400, "Bad Request");
        assert_eq!(body, expected, "{what}");
    }
    // Bytes outside ASCII (obs-text).
    for raw in [&b"abc\xffdef"[..], "ключ".as_bytes()] {
        let r = c
            .get(&url)
            .header(
                "x-api-key",
                reqwest::header::HeaderValue::from_bytes(raw).unwrap(),
            )
            .send()
            .await
            .expect("send");
        let r = Resp::read(r).await;
        let body = assert_problem(&r, 400, "Bad Request");
        assert_eq!(body, expected, "{raw:?}");
    }
    assert_eq!(up.requests().await, 2);
}

// ---------------------------------------------------------------------------------------
// 9. Exact admission under concurrency, every algorithm
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread")]
async fn exactly_the_limit_is_admitted_under_1000_concurrent_requests() {
    // Windows are 1 h. fixed_window and sliding_window: the test stays clear of an hour
    // boundary (it takes far less than 60 s). sliding_log: nothing expires within 1 h.
    // token_bucket and gcra: 100 per hour refill 1 token every 36 s, and each batch takes a
    // few seconds from its first admitted request, so no token is added during a batch.
    clear_of_window_boundary(HOUR, 40).await;
    const ALGORITHMS: [&str; 5] = [
        "fixed_window",
        "sliding_window",
        "sliding_log",
        "token_bucket",
        "gcra",
    ];
    const N: usize = 1000;
    const LIMIT: u64 = 100;
    let up = Upstream::start().await;
    let mut yaml = up.upstreams_yaml();
    yaml.push_str("routes:\n");
    for a in ALGORITHMS {
        yaml.push_str(&format!(
            "  - {{ name: r-{a}, match: {{ path_prefix: /{a} }}, upstream: backend, limits: [ {{ name: {a}, key: [], algorithm: {a}, limit: {LIMIT}, window: 1h }} ] }}\n"
        ));
    }
    let gw = Gateway::start(&yaml).await;
    let c = client_builder()
        .pool_max_idle_per_host(N)
        .build()
        .expect("client");
    // All N in flight at once (N connections), unless this process may not open that many
    // sockets; the gateway runs with the same limit.
    let in_flight = match max_open_files() {
        Some(n) if n < 2 * N as u64 + 500 => (n.saturating_sub(500) / 2).max(50) as usize,
        _ => N,
    };
    let gate = std::sync::Arc::new(tokio::sync::Semaphore::new(in_flight));

    for a in ALGORITHMS {
        up.reset().await;
        let started = Instant::now();
        let mut set = tokio::task::JoinSet::new();
        for i in 0..N {
            let (c, url) = (c.clone(), gw.url(&format!("/{a}/{i}")));
            let gate = gate.clone();
            set.spawn(async move {
                let _permit = gate.acquire_owned().await.expect("semaphore");
                let r = get(&c, &url, &[]).await;
                let remaining = r.header_u64("x-ratelimit-remaining");
                assert_eq!(r.header_u64("x-ratelimit-limit"), LIMIT);
                (r.status, remaining)
            });
        }
        let mut admitted_remaining = Vec::new();
        let (mut ok, mut denied) = (0, 0);
        while let Some(res) = set.join_next().await {
            let (status, remaining) = res.expect("request task");
            match status {
                StatusCode::OK => {
                    ok += 1;
                    admitted_remaining.push(remaining);
                }
                StatusCode::TOO_MANY_REQUESTS => {
                    denied += 1;
                    assert_eq!(remaining, 0, "{a}: a denial with units left");
                }
                other => panic!("{a}: unexpected status {other}"),
            }
        }
        let took = started.elapsed();
        assert!(
            took < Duration::from_secs(30),
            "{a}: batch took {took:?}; the refill argument needs < 36 s"
        );
        assert_eq!((ok, denied), (LIMIT as usize, N - LIMIT as usize), "{a}");
        // Each admitted request saw a distinct remaining count: 99, 98, …, 0.
        admitted_remaining.sort_unstable();
        assert_eq!(
            admitted_remaining,
            (0..LIMIT).collect::<Vec<_>>(),
            "{a}: remaining values of the admitted requests"
        );
        let stats = up.stats().await;
        assert_eq!(stats.requests, LIMIT, "{a}: requests the upstream served");
        assert_eq!(stats.in_flight, 0, "{a}");
        if in_flight < N {
            eprintln!("{a}: at most {in_flight} requests in flight (open-file limit)");
        }
    }
}
