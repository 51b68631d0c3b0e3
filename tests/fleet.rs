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
//! - Rolling restart under load: SIGTERM to one gateway, which HAProxy drops within the
//!   shipped `drain_period` while the gateway keeps serving; it exits by itself, is started
//!   again and comes back into rotation; then the other. No request fails (no transport error,
//!   no 5xx), and the limit holds exactly: every key's first N requests are admitted and every
//!   later one denied, in order, and the upstream saw exactly the admitted ones.
//! - Binary upgrade under load: `tollgate --upgrade` takes gateway-1's listening sockets over
//!   while loads run through the balancer and straight to gateway-1 (a new connection per
//!   request); the old process gets SIGQUIT and exits by itself. No request of either load
//!   fails, HAProxy never takes gateway-1 out of rotation, and the upstream saw every request
//!   exactly once.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::clear_of_window_boundary;
use common::faults::signal;
use common::fleet::{shipped, Fleet};
use common::load::{by_status, Driver, Headers, Load, Reply};
use common::upstream::Stats;
use common::wait::eventually;

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

/// The replies that failed: a transport error or a 5xx.
fn failures(replies: &[Reply]) -> Vec<&Reply> {
    replies
        .iter()
        .filter(|r| r.status() == 0 || r.status() >= 500)
        .collect()
}

/// Wait until `driver` has `more` replies beyond the `from`-th answered by gateway `name`.
async fn served_by(driver: &Driver, name: &str, from: usize, more: usize) {
    driver
        .wait(
            &format!("{name} answered {more} more requests"),
            Duration::from_secs(20),
            |r| {
                r.get(from..)
                    .is_some_and(|r| r.iter().filter(|x| gateway_of(x) == name).count() >= more)
            },
        )
        .await;
}

/// The free tier's limit per key in the rolling-restart test ...
const ROLL_LIMIT: usize = 10;
/// ... and how many requests each key gets: its first ROLL_LIMIT are admitted, the rest
/// denied. Each connection moves to a new key every ROLL_PER_KEY requests, so requests are
/// admitted all through the restarts.
const ROLL_PER_KEY: usize = 25;

fn roll_key(conn: usize, n: usize) -> Headers {
    vec![(
        "x-api-key".into(),
        format!("roll-{conn}-{}", n / ROLL_PER_KEY),
    )]
}

#[tokio::test(flavor = "multi_thread")]
async fn a_rolling_restart_under_load_fails_no_request_and_the_limit_holds() {
    const CONNS: usize = 6;
    // The test takes about 30 s; no window boundary of the hour-long window may fall in it.
    clear_of_window_boundary(3600, 120).await;
    let drain = shipped("TOLLGATE_DRAIN_PERIOD");
    let drain_period = humantime::parse_duration(&drain).expect("a duration");
    let limit = ROLL_LIMIT.to_string();
    // A failed store call must show as a 503 (a failure), not as a local admission.
    let mut fleet = Fleet::start(&[
        ("TOLLGATE_FREE_LIMIT", &limit),
        ("TOLLGATE_FREE_WINDOW", "1h"),
        ("TOLLGATE_STORE_TIMEOUT", "5s"),
        ("TOLLGATE_ON_ERROR", "deny"),
        ("TOLLGATE_DRAIN_PERIOD", &drain),
    ])
    .await;
    for g in ["gateway-1", "gateway-2"] {
        fleet.wait_lb_status(g, "UP", Duration::from_secs(10)).await;
    }
    let driver = Load::new(&fleet.url("/roll"))
        .conns(CONNS)
        .headers(roll_key)
        .start();
    for g in ["gateway-1", "gateway-2"] {
        served_by(&driver, g, 0, 50).await;
    }

    for i in 0..2 {
        let name = fleet.gateways[i].name.clone();
        let old = fleet.gateways[i].pid;
        let term_at = Instant::now();
        fleet.signal(i, "TERM");
        // /readyz turned 503 at once: HAProxy drops the gateway while it still serves.
        fleet.wait_lb_status(&name, "DOWN", drain_period).await;
        let down_after = term_at.elapsed();
        fleet
            .wait_exit(old, drain_period + Duration::from_secs(10))
            .await;
        let exited_after = term_at.elapsed();
        assert!(
            exited_after >= drain_period,
            "{name} must serve for the whole drain period ({drain_period:?}): exited \
             {exited_after:?} after SIGTERM"
        );
        fleet.spawn_gateway(i, false);
        fleet.wait_ready(i).await;
        fleet
            .wait_lb_status(&name, "UP", Duration::from_secs(10))
            .await;
        let at = driver.len();
        served_by(&driver, &name, at, 50).await;
        eprintln!(
            "rolling restart: {name} out of HAProxy's rotation {down_after:?} after SIGTERM, \
             exited after {:?}, back in after {:?}",
            exited_after,
            term_at.elapsed()
        );
    }
    let replies = driver.finish().await;

    let failed = failures(&replies);
    assert!(
        failed.is_empty(),
        "{} of {} requests failed during the rolling restart: {failed:#?}",
        failed.len(),
        replies.len()
    );
    // Every key: its first ROLL_LIMIT requests admitted, every later one denied, in order.
    let mut promised = 0;
    for conn in 0..CONNS {
        let mine: Vec<u16> = replies
            .iter()
            .filter(|r| r.conn == conn)
            .map(Reply::status)
            .collect();
        for (k, got) in mine.chunks(ROLL_PER_KEY).enumerate() {
            let want: Vec<u16> = (0..got.len())
                .map(|j| if j < ROLL_LIMIT { 200 } else { 429 })
                .collect();
            assert_eq!(got, want, "key roll-{conn}-{k}");
            promised += got.len().min(ROLL_LIMIT);
        }
    }
    let statuses = by_status(&replies);
    assert_eq!(
        statuses,
        BTreeMap::from([
            (200, promised as u64),
            (429, (replies.len() - promised) as u64)
        ])
    );
    assert_eq!(
        upstream_stats(&fleet).await.requests,
        promised as u64,
        "the upstream saw exactly the admitted requests"
    );
    let mut hidden = Vec::new();
    for g in ["gateway-1", "gateway-2"] {
        hidden.push((
            g,
            fleet.lb_counter(g, "wretr").await,
            fleet.lb_counter(g, "wredis").await,
        ));
    }
    eprintln!(
        "rolling restart: {} requests, {statuses:?}; HAProxy's (gateway, retries, \
         redispatches): {hidden:?}",
        replies.len()
    );
}

/// Keys with room for every request of the upgrade test (a new key every 100 requests, the
/// free tier's limit raised to 1000 a minute): any answer but 200 is a failure.
fn upgrade_key(load: &'static str) -> impl Fn(usize, usize) -> Headers + Send + Sync + 'static {
    move |conn, n| {
        vec![(
            "x-api-key".into(),
            format!("upgrade-{load}-{conn}-{}", n / 100),
        )]
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_binary_upgrade_under_load_fails_no_request() {
    let mut fleet = Fleet::start(&[
        ("TOLLGATE_FREE_LIMIT", "1000"),
        ("TOLLGATE_STORE_TIMEOUT", "5s"),
        ("TOLLGATE_ON_ERROR", "deny"),
    ])
    .await;
    for g in ["gateway-1", "gateway-2"] {
        fleet.wait_lb_status(g, "UP", Duration::from_secs(10)).await;
    }
    let gw1 = fleet.gateways[0].clone();
    let through_lb = Load::new(&fleet.url("/upgrade"))
        .conns(4)
        .headers(upgrade_key("lb"))
        .start();
    // Straight to gateway-1, a new connection for every request: each one is accepted from
    // the listening socket that changes hands.
    let direct = Load::new(&format!("http://{}/upgrade", gw1.listen))
        .conns(4)
        .header("connection", "close")
        .headers(upgrade_key("direct"))
        .start();
    served_by(&through_lb, "gateway-1", 0, 50).await;
    direct
        .wait("100 direct requests", Duration::from_secs(20), |r| {
            r.len() >= 100
        })
        .await;

    let old = fleet.spawn_gateway(0, true);
    let new = fleet.gateways[0].pid;
    let sock = fleet.upgrade_sock(0);
    eventually(
        format!("the upgrading gateway listens on {sock:?}"),
        Duration::from_secs(10),
    )
    .every(Duration::from_millis(10))
    .holds(|| {
        if !fleet.running(new) {
            return Err(format!("the upgrading gateway (pid {new}) exited"));
        }
        sock.exists().then_some(()).ok_or("not yet".to_string())
    })
    .await;
    let quit_at = Instant::now();
    signal(old, "QUIT");
    let took = fleet.wait_exit(old, Duration::from_secs(20)).await;
    let exited_at = Instant::now();
    assert!(fleet.running(new), "the new gateway runs on");
    let (lb_at, direct_at) = (through_lb.len(), direct.len());
    served_by(&through_lb, "gateway-1", lb_at, 100).await;
    direct
        .wait(
            "200 direct requests after the old process exited",
            Duration::from_secs(20),
            |r| r.len() >= direct_at + 200,
        )
        .await;
    fleet.wait_ready(0).await;
    let lb_replies = through_lb.finish().await;
    let direct_replies = direct.finish().await;

    for (load, replies) in [
        ("through the balancer", &lb_replies),
        ("straight to gateway-1", &direct_replies),
    ] {
        let failed: Vec<&Reply> = replies.iter().filter(|r| r.status() != 200).collect();
        let when: Vec<String> = failed
            .iter()
            .map(|r| match r.sent.checked_duration_since(quit_at) {
                Some(d) => format!("sent {d:?} after SIGQUIT"),
                None => format!("sent {:?} before SIGQUIT", quit_at - r.sent),
            })
            .collect();
        assert!(
            failed.is_empty(),
            "{load}: {} of {} requests failed during the upgrade (the old process exited \
             {took:?} after SIGQUIT; {when:?}): {failed:#?}",
            failed.len(),
            replies.len()
        );
    }
    let during = direct_replies
        .iter()
        .filter(|r| r.sent >= quit_at && r.sent < exited_at)
        .count();
    let after = direct_replies
        .iter()
        .filter(|r| r.sent >= exited_at)
        .count();
    assert!(
        after >= 200,
        "the new process served gateway-1's address alone"
    );
    assert!(
        fleet
            .log("gateway-1")
            .contains("handing the listening sockets over (SIGQUIT)"),
        "the old process handed its sockets over"
    );
    assert_eq!(
        fleet.lb_counter("gateway-1", "chkdown").await,
        0,
        "HAProxy never took gateway-1 out of rotation"
    );
    assert_eq!(
        upstream_stats(&fleet).await.requests,
        (lb_replies.len() + direct_replies.len()) as u64,
        "the upstream saw every request exactly once"
    );
    eprintln!(
        "binary upgrade: the old gateway exited {took:?} after SIGQUIT; {} requests through \
         the balancer and {} straight to gateway-1 ({during} while both processes held the \
         sockets, {after} after), all 200; HAProxy retries {}",
        lb_replies.len(),
        direct_replies.len(),
        fleet.lb_counter("gateway-1", "wretr").await
    );
}
