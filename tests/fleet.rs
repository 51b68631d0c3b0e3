//! The fleet end to end, as `docker/fleet.sh` starts it on loopback from the files compose
//! uses: HAProxy in front of two gateways that share Redis, and the demo upstream.
//!
//! - A limit of N holds exactly across both gateways through the balancer.
//! - `kill -9` of one gateway under load: the balancer takes it out of rotation once its
//!   health check fails. What is asserted, precisely: every request that failed (a transport
//!   error or a 5xx) was in flight at the moment of the kill (sent before it, answered after
//!   it), so at most one per connection; every request sent after the kill got 200, also
//!   those sent before HAProxy marked the gateway down (they were redispatched); HAProxy
//!   marks it DOWN within its check interval × fall (1 s × 2) plus slack; every request sent
//!   after that was answered by the other gateway.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::clear_of_window_boundary;
use common::fleet::Fleet;
use common::load::{by_status, Load, Reply};
use common::upstream::Stats;

/// Which gateway answered, as HAProxy tells (`X-Tollgate-Gateway`); "-" when none did.
fn gateway_of(r: &Reply) -> String {
    r.header("x-tollgate-gateway").unwrap_or("-").to_string()
}

fn count_by<'a>(
    replies: impl IntoIterator<Item = &'a Reply>,
    f: impl Fn(&Reply) -> String,
) -> BTreeMap<String, usize> {
    let mut m = BTreeMap::new();
    for r in replies {
        *m.entry(f(r)).or_default() += 1;
    }
    m
}

async fn upstream_stats(fleet: &Fleet) -> Stats {
    common::http::get_json(
        &common::http::client(),
        &format!("http://{}/__demo/stats", fleet.upstream),
    )
    .await
}

#[tokio::test(flavor = "multi_thread")]
async fn a_limit_holds_exactly_across_both_gateways_through_the_balancer() {
    const N: usize = 100;
    // The free tier's limit and window come from the environment (docker/gateway.yaml), and
    // so does the store's failure policy: a store call that fails must show up as a 503, not
    // as a request admitted by the local fallback (the defaults, 25 ms and `local`, degrade
    // under the load of the whole test suite on a small machine).
    clear_of_window_boundary(3600, 60).await;
    let fleet = Fleet::start(&[
        ("TOLLGATE_FREE_LIMIT", "100"),
        ("TOLLGATE_FREE_WINDOW", "1h"),
        ("TOLLGATE_STORE_TIMEOUT", "5s"),
        ("TOLLGATE_ON_ERROR", "deny"),
    ])
    .await;
    let replies = Load::new(&fleet.url("/orders"))
        .conns(20)
        .header("x-api-key", "fleet-exactness")
        .run(15)
        .await;
    assert_eq!(replies.len(), 300);
    let statuses = by_status(&replies);
    assert_eq!(
        statuses,
        BTreeMap::from([(200, N as u64), (429, 200)]),
        "exactly {N} of 300 admitted across the fleet: {statuses:?}"
    );
    // Both gateways decided, on the one counter in Redis.
    let by_gateway = count_by(&replies, gateway_of);
    let admitted_by = count_by(replies.iter().filter(|r| r.status() == 200), gateway_of);
    for g in ["gateway-1", "gateway-2"] {
        assert!(
            by_gateway.get(g).copied().unwrap_or(0) >= 100,
            "round robin gives each gateway about half: {by_gateway:?}"
        );
        assert!(admitted_by.contains_key(g), "{admitted_by:?}");
    }
    assert_eq!(
        upstream_stats(&fleet).await.requests,
        N as u64,
        "the upstream saw exactly the admitted requests"
    );
}

/// Request `n` of connection `conn` of the crash load: a key used for 20 requests at most, so
/// the free tier's 60 per minute never denies one (nor its local fallback's 30, were the store
/// slow under load).
fn crash_key(conn: usize, n: usize) -> Vec<(String, String)> {
    vec![("x-api-key".into(), format!("crash-{conn}-{}", n / 20))]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_gateway_killed_under_load_is_routed_around() {
    const CONNS: usize = 8;
    // A store call that fails under load admits (`allow`): only the balancer is tested here.
    let fleet = Fleet::start(&[("TOLLGATE_ON_ERROR", "allow")]).await;
    fleet
        .wait_lb_status("gateway-1", "UP", Duration::from_secs(10))
        .await;
    fleet
        .wait_lb_status("gateway-2", "UP", Duration::from_secs(10))
        .await;
    let driver = Load::new(&fleet.url("/work"))
        .conns(CONNS)
        .headers(crash_key)
        .start();
    driver
        .wait(
            "both gateways served 100 requests each",
            Duration::from_secs(30),
            |r| {
                let by = count_by(r, gateway_of);
                by.get("gateway-1") >= Some(&100) && by.get("gateway-2") >= Some(&100)
            },
        )
        .await;

    let killed_at = Instant::now();
    fleet.kill9(0);
    // Out of rotation after 2 failed checks 1 s apart, plus a check timeout and slack.
    fleet
        .wait_lb_status("gateway-1", "DOWN", Duration::from_secs(6))
        .await;
    let down_at = Instant::now();
    let at_down = driver.len();
    driver
        .wait(
            "300 more requests after gateway-1 is down",
            Duration::from_secs(30),
            |r| r.len() >= at_down + 300,
        )
        .await;
    let replies = driver.finish().await;

    let failed: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status() == 0 || r.status() >= 500)
        .collect();
    let others: Vec<&Reply> = replies
        .iter()
        .filter(|r| r.status() != 200 && r.status() != 0 && r.status() < 500)
        .collect();
    assert!(
        others.is_empty(),
        "answers that are neither 200 nor failures: {others:#?}"
    );
    for r in &failed {
        assert!(
            r.sent < killed_at && r.sent + r.latency >= killed_at,
            "a request that was not in flight at the kill failed: {r:?}"
        );
    }
    assert!(failed.len() <= CONNS, "{failed:#?}");
    let after_kill: Vec<&Reply> = replies.iter().filter(|r| r.sent >= killed_at).collect();
    let after_down: Vec<&Reply> = replies.iter().filter(|r| r.sent >= down_at).collect();
    assert!(after_down.len() >= 300);
    assert_eq!(
        count_by(after_down.iter().copied(), gateway_of),
        BTreeMap::from([("gateway-2".to_string(), after_down.len())]),
        "after HAProxy marked gateway-1 down, gateway-2 answered everything"
    );
    eprintln!(
        "kill -9 of gateway-1: marked down after {:?}; {} requests sent between the kill and that, \
         {} after; {} failed (in flight at the kill); by status: {:?}",
        down_at - killed_at,
        after_kill.len() - after_down.len(),
        after_down.len(),
        failed.len(),
        by_status(&replies)
    );
}
