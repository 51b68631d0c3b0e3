//! The shipped fleet files (`docker/fleet.sh` on `docker/haproxy.cfg` and `docker/gateway.yaml`,
//! the files compose uses) against a Redis outage and a client that forges its address
//! (issue 39, "Fleet wiring"):
//!
//! - Redis killed (-9) under steady load through HAProxy, gateways on `on_error: allow`: the
//!   gateways stay in the balancer's rotation (readiness means "this instance can serve", not
//!   "the store answers"), so at least 99% of the requests sent in the next 15 s get a
//!   gateway's answer (200, with HAProxy's `X-Tollgate-Gateway`), not the balancer's 503; and
//!   each gateway's `/readyz` still says that the store is unreachable.
//! - A client that sends a different forged `X-Forwarded-For` with every request is counted
//!   as the one client it is: through the balancer (which overwrites the header with the
//!   connection's source) a per-IP limit of N admits exactly N of 3N such requests, and
//!   straight to a gateway (which trusts only the balancer's address) the forged header is
//!   ignored too.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::clear_of_window_boundary;
use common::fleet::Fleet;
use common::http::{client, get};
use common::load::{by_status, Load, Reply};
use common::upstream::Stats;

/// Which gateway answered, as HAProxy tells (`X-Tollgate-Gateway`); `None` when HAProxy
/// answered itself (no server available) or there was no answer.
fn gateway_of(r: &Reply) -> Option<&str> {
    r.header("x-tollgate-gateway")
}

fn count_by_gateway<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in replies {
        *m.entry(gateway_of(r).unwrap_or("-").to_string())
            .or_default() += 1;
    }
    m
}

async fn upstream_stats(fleet: &Fleet) -> Stats {
    common::http::get_json(
        &client(),
        &format!("http://{}/__demo/stats", fleet.upstream),
    )
    .await
}

/// How long after the kill the requests are counted.
const OUTAGE: Duration = Duration::from_secs(15);

#[tokio::test(flavor = "multi_thread")]
async fn a_redis_outage_keeps_the_gateways_in_the_balancers_rotation() {
    // One key, far below its limit: with Redis up every request is admitted, and with Redis
    // down `allow` admits it unchecked. Any answer but a gateway's 200 is a failure.
    let fleet = Fleet::start(&[
        ("TOLLGATE_ON_ERROR", "allow"),
        ("TOLLGATE_FREE_LIMIT", "1000000"),
    ])
    .await;
    for g in ["gateway-1", "gateway-2"] {
        fleet.wait_lb_status(g, "UP", Duration::from_secs(10)).await;
    }
    let driver = Load::new(&fleet.url("/outage"))
        .conns(6)
        .pace(Duration::from_millis(5))
        .header("x-api-key", "outage")
        .start();
    driver
        .wait(
            "both gateways served 50 requests each",
            Duration::from_secs(30),
            |r| {
                let by = count_by_gateway(r);
                by.get("gateway-1") >= Some(&50) && by.get("gateway-2") >= Some(&50)
            },
        )
        .await;

    let killed_at = Instant::now();
    fleet.kill9_redis();
    tokio::time::sleep(OUTAGE).await;
    let status_after = fleet.lb_status().await;
    let replies = driver.finish().await;

    let during: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.sent >= killed_at && r.sent < killed_at + OUTAGE)
        .collect();
    let answered: Vec<&&Reply> = during
        .iter()
        .filter(|r| gateway_of(r).is_some() && r.status() == 200)
        .collect();
    let failed: Vec<&&Reply> = during
        .iter()
        .filter(|r| gateway_of(r).is_none() || r.status() != 200)
        .collect();
    eprintln!(
        "Redis killed: {} requests in the next {OUTAGE:?}, {} answered 200 by a gateway \
         ({:?} by gateway, {:?} by status); HAProxy after: {status_after:?}, checks that took a \
         gateway down: {} and {}",
        during.len(),
        answered.len(),
        count_by_gateway(during.iter().copied()),
        by_status(during.iter().copied()),
        fleet.lb_counter("gateway-1", "chkdown").await,
        fleet.lb_counter("gateway-2", "chkdown").await,
    );
    assert!(
        during.len() >= 200,
        "too few requests to judge: {}",
        during.len()
    );
    assert!(
        answered.len() * 100 >= during.len() * 99,
        "only {} of {} requests in the {OUTAGE:?} after Redis died got a gateway's 200; \
         HAProxy: {status_after:?}; the first failures: {:#?}",
        answered.len(),
        during.len(),
        failed.iter().take(5).collect::<Vec<_>>()
    );
    // The outage is not hidden: each gateway's /readyz says the store is unreachable.
    for g in &fleet.gateways {
        let r = get(&client(), &format!("http://{}/readyz", g.admin), &[]).await;
        let body = r.json();
        assert_eq!(
            (r.status.as_u16(), &body["status"], &body["store"]),
            (200, &"ready".into(), &"unreachable".into()),
            "{}: {body}",
            g.name
        );
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn forged_forwarded_for_values_from_one_client_count_as_that_client() {
    const N: usize = 10;
    // The anonymous per-IP limit (docker/gateway.yaml's `per-ip`, 1 minute) is N; a failed
    // store call shows as a 503, not as an unchecked admission.
    let limit = N.to_string();
    let fleet = Fleet::start(&[
        ("TOLLGATE_ANONYMOUS_LIMIT", &limit),
        ("TOLLGATE_STORE_TIMEOUT", "5s"),
        ("TOLLGATE_ON_ERROR", "deny"),
    ])
    .await;
    for g in ["gateway-1", "gateway-2"] {
        fleet.wait_lb_status(g, "UP", Duration::from_secs(10)).await;
    }
    clear_of_window_boundary(60, 20).await;

    // 3N requests through the balancer, each with another forged client address.
    let forged = |conn: usize, n: usize| {
        vec![(
            "x-forwarded-for".to_string(),
            format!("198.51.100.{}", 1 + conn * N + n),
        )]
    };
    let replies = Load::new(&fleet.url("/who"))
        .conns(3)
        .headers(forged)
        .run(N)
        .await;
    assert_eq!(replies.len(), 3 * N);
    let statuses = by_status(&replies);
    assert_eq!(
        statuses,
        BTreeMap::from([(200, N as u64), (429, 2 * N as u64)]),
        "one client, however many addresses it claims: exactly {N} of {} admitted",
        3 * N
    );
    let by_gateway = count_by_gateway(&replies);
    assert!(
        by_gateway.contains_key("gateway-1") && by_gateway.contains_key("gateway-2"),
        "both gateways counted the one client on the one counter: {by_gateway:?}"
    );

    // Straight to a gateway, bypassing the balancer: the peer is not the balancer, so the
    // forged header is not believed either, and the client's spent counter denies.
    let c = client();
    for (i, g) in fleet.gateways.iter().enumerate() {
        for n in 0..N {
            let xff = format!("203.0.113.{}", 1 + i * N + n);
            let r = get(
                &c,
                &format!("http://{}/who", g.listen),
                &[("x-forwarded-for", &xff)],
            )
            .await;
            assert_eq!(
                r.status, 429,
                "{} with X-Forwarded-For {xff}: {r:#?}",
                g.name
            );
        }
    }
    assert_eq!(
        upstream_stats(&fleet).await.requests,
        N as u64,
        "the upstream saw exactly the admitted requests"
    );
}
