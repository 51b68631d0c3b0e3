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
async fn during_the_drain_period_after_sigint_readyz_is_503_and_requests_get_connection_close() {
    drain_period_after("INT").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn during_the_drain_period_after_sigterm_readyz_is_503_and_requests_get_connection_close() {
    drain_period_after("TERM").await;
}

/// The shutdown sequence with `drain_period: 2s`, started by `signal` (`INT` or `TERM`):
/// `/readyz` 503 at once while requests are still served, each with `Connection: close`; then
/// the listener closes and the process exits, not before a good part of the drain period.
async fn drain_period_after(signal: &str) {
    let up = Upstream::start().await;
    let mut gw = Gateway::start(&config(&up, "drain_period: 2s, grace_period: 5s")).await;
    let c = client();
    assert_eq!(gw.readyz_status().await.0, 200);
    gw.proc.signal(signal);
    // The signal is handled asynchronously: readiness turns within a moment, then stays 503.
    let body = eventually(
        format!("/readyz answers 503 right after SIG{signal}"),
        Duration::from_secs(1),
    )
    .every(Duration::from_millis(10))
    .holds_on(|| gw.readyz_status(), |(status, _)| *status == 503)
    .await
    .1;
    assert_eq!(
        (&body["draining"], &body["reason"]),
        (&true.into(), &"draining".into()),
        "{body}"
    );
    for _ in 0..3 {
        let r = c
            .get(gw.url("/during-drain"))
            .send()
            .await
            .unwrap_or_else(|e| panic!("not served during the drain after SIG{signal}: {e}"));
        assert_eq!(r.status(), 200, "SIG{signal}");
        assert_eq!(r.headers()["connection"], "close", "SIG{signal}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // After the drain period the listener is closed and the process exits.
    let took = exited_within(&mut gw, Duration::from_secs(6)).await;
    assert!(
        took >= Duration::from_millis(1_000),
        "exited {took:?} into a 2 s drain period after SIG{signal}"
    );
    assert_eq!(served(gw.listen).await, None, "SIG{signal}");
    assert!(gw.proc.exited().expect("exited").success(), "SIG{signal}");
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
