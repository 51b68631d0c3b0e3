//! The shutdown sequence (issue 11), which the fleet relies on: on SIGTERM or SIGINT `/readyz`
//! answers 503 at once; for `server.drain_period` the proxy keeps serving with
//! `Connection: close`; then it stops accepting, lets the requests in flight finish within
//! `server.grace_period`, and exits as soon as none is left. A second SIGINT exits at once.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::gateway::Gateway;
use common::http::client;
use common::raw::{raw_send, RawConn};
use common::upstream::Upstream;
use common::wait::eventually;

fn config(up: &Upstream, server: &str) -> String {
    format!(
        "server: {{ {server} }}\n{}routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]\n",
        up.upstreams_yaml()
    )
}

/// A request the upstream holds for `ms` before answering.
fn slow(ms: u64) -> String {
    format!("GET /slow HTTP/1.1\r\nHost: t\r\nX-Demo-Delay-Ms: {ms}\r\nConnection: close\r\n\r\n")
}

/// Wait until the gateway process has exited; how long that took.
async fn exited_within(gw: &mut Gateway, within: Duration) -> Duration {
    let start = Instant::now();
    eventually("the gateway exits", within)
        .every(Duration::from_millis(20))
        .holds(|| gw.proc.exited().is_some())
        .await;
    start.elapsed()
}

/// Whether a new connection to `addr` gets an answer.
async fn served(addr: SocketAddr) -> Option<u16> {
    let mut c = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr))
        .await
        .ok()?
        .ok()
        .map(RawConn::from_stream)?;
    c.send(b"GET /new HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .await
        .ok()?;
    c.read_response().await.map(|r| r.status)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_every_request_in_flight_finish_then_stops_accepting_and_exits() {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(&config(&up, "grace_period: 10s")).await;
    let mut in_flight = Vec::new();
    for _ in 0..5 {
        in_flight.push(raw_send(gw.listen, slow(1_500)).await);
    }
    up.wait_in_flight(5).await;
    let signalled = Instant::now();
    gw.proc.signal("INT");
    // With no drain period, new connections are refused shortly after the signal.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        served(gw.listen).await,
        None,
        "a new connection was served after SIGINT"
    );
    for r in in_flight {
        let r = r
            .await
            .expect("task")
            .expect("an answer to a request in flight");
        assert_eq!(r.status, 200);
    }
    exited_within(&mut gw, Duration::from_secs(5)).await;
    let took = signalled.elapsed();
    assert!(
        took < Duration::from_secs(4),
        "exited {took:?} after SIGINT, not soon after the last request"
    );
    assert!(gw.proc.exited().expect("exited").success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_drain_period_readyz_is_503_and_requests_are_served_with_connection_close() {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(&config(&up, "drain_period: 2s, grace_period: 5s")).await;
    let c = client();
    assert_eq!(gw.readyz_status().await.0, 200);
    gw.proc.signal("TERM");
    // The signal is handled asynchronously: readiness turns within a moment, then stays 503.
    let turned = Instant::now() + Duration::from_secs(1);
    let (status, body) = loop {
        let (status, body) = gw.readyz_status().await;
        if status == 503 || Instant::now() > turned {
            break (status, body);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    assert_eq!(status, 503, "{body}");
    assert_eq!(body["draining"], true, "{body}");
    for _ in 0..3 {
        let r = c
            .get(gw.url("/during-drain"))
            .send()
            .await
            .expect("served during the drain");
        assert_eq!(r.status(), 200);
        assert_eq!(r.headers()["connection"], "close");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // After the drain period the listener is closed and the process exits.
    let took = exited_within(&mut gw, Duration::from_secs(6)).await;
    assert!(
        took >= Duration::from_millis(1_000),
        "exited {took:?} into a 2 s drain period"
    );
    assert_eq!(served(gw.listen).await, None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_nothing_in_flight_the_gateway_does_not_sit_out_its_grace_period() {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(&config(&up, "grace_period: 30s")).await;
    assert_eq!(
        client()
            .get(gw.url("/"))
            .send()
            .await
            .expect("served")
            .status(),
        200
    );
    gw.proc.signal("TERM");
    let took = exited_within(&mut gw, Duration::from_secs(10)).await;
    assert!(
        took < Duration::from_secs(3),
        "exited {took:?} after SIGTERM with nothing in flight"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_sigint_exits_at_once() {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(&config(&up, "grace_period: 30s")).await;
    let long = raw_send(gw.listen, slow(20_000)).await;
    up.wait_in_flight(1).await;
    gw.proc.signal("INT");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        gw.proc.exited().is_none(),
        "the first SIGINT waits for the request in flight"
    );
    gw.proc.signal("INT");
    exited_within(&mut gw, Duration::from_secs(3)).await;
    assert!(
        long.await.expect("task").is_none(),
        "the long request was cut"
    );
}
