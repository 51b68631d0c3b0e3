//! Quota leasing (issue 16, phase B), with real `redis-server`, real gateways and the real demo
//! upstream on loopback:
//!
//! - two gateways leasing (`max: 50`), 10,000 requests over 200 connections against a limit of
//!   1000: between 900 and 1000 admitted, the upstream saw exactly the admitted, for each
//!   algorithm that leases; once the leases end, Redis holds exactly what was admitted and the
//!   rest of the limit can still be spent (units given back);
//! - a gateway killed with `kill -9` while holding a lease: never more than the limit, at most
//!   `max` units lost, every key with a TTL;
//! - a lease taken near the end of a fixed window is not spent in the next one: on two
//!   gateways (`max: 20`), no window admits more than the limit, and at most 2 × 20 units are
//!   lost per window.
//!
//! Every process is killed by PID when its guard drops; every wait is bounded.

mod common;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use common::clock::{clear_of_window_boundary, now_ms};
use common::faults::faketime_env;
use common::gateway::Gateway;
use common::http::{client, get};
use common::load::{by_status, Load, Reply};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::wait::eventually;

const LEASING: [&str; 4] = ["fixed_window", "sliding_window", "token_bucket", "gcra"];
const DAY_S: u64 = 86_400;
/// Leases last at most 1 s, and the sweeper gives back within 50 ms.
const LEASES_END: Duration = Duration::from_millis(1500);

/// One route `/<algorithm>` per algorithm, each with its own limit `lease-<algorithm>` of
/// `limit` per `window`, leasing up to `max` units.
fn config(
    redis: &RedisServer,
    up: &Upstream,
    prefix: &str,
    (limit, window, max): (u64, &str, u64),
) -> String {
    let mut routes = String::from("routes:\n");
    for a in LEASING {
        routes.push_str(&format!(
            "  - name: {a}\n    match: {{ path_prefix: /{a} }}\n    upstream: backend\n    limits: [ {{ name: lease-{a}, algorithm: {a}, limit: {limit}, window: {window}, lease: {{ max: {max} }} }} ]\n"
        ));
    }
    format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: {prefix}, timeout: 5s, on_error: deny }}\n{}{routes}",
        redis.url(),
        up.upstreams_yaml(),
    )
}

fn admitted(replies: &[Reply]) -> u64 {
    replies.iter().filter(|r| r.status() == 200).count() as u64
}

fn assert_only_200_and_429(what: &str, replies: &[Reply]) {
    let statuses = by_status(replies);
    let odd: Vec<_> = replies
        .iter()
        .filter(|r| !matches!(r.status(), 200 | 429))
        .take(3)
        .map(|r| {
            let before = replies
                .iter()
                .filter(|o| o.conn == r.conn && o.sent < r.sent)
                .count();
            format!(
                "conn {} request {before}: {:?}",
                r.conn,
                r.result.as_ref().map(|r| r.status)
            )
        })
        .collect();
    assert!(
        statuses.keys().all(|s| matches!(s, 200 | 429)),
        "{what}: {statuses:?} {odd:?}"
    );
}

/// Requests one after the other on `gw` until the first 429; how many were admitted.
async fn spend_the_rest(gw: &Gateway, path: &str) -> u64 {
    let c = client();
    for n in 0..=1000 {
        match get(&c, &gw.url(path), &[]).await.status.as_u16() {
            200 => {}
            429 => return n,
            s => panic!("{path}: {s}"),
        }
    }
    panic!("{path}: more than 1000 admitted one by one");
}

/// The count Redis holds for a fixed- or sliding-window limit (its current window).
fn redis_count(redis: &RedisServer, prefix: &str, name: &str) -> u64 {
    let keys = redis.scan(&format!("{{{prefix}:{name}:*"));
    assert_eq!(keys.len(), 1, "{keys:?}");
    let k = &keys[0];
    if redis.cli(&["TYPE", k]) == "string" {
        return redis.cli(&["GET", k]).parse().expect("count");
    }
    let n: u64 = (now_ms() / (DAY_S * 1000)) % 2;
    redis
        .cli(&["HGET", k, &format!("c{n}")])
        .parse()
        .expect("count")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_leasing_gateways_admit_at_most_the_limit_and_give_back_what_they_did_not_spend() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis, &up, "lease", (1000, "24h", 50));
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    for alg in LEASING {
        clear_of_window_boundary(DAY_S, 60).await;
        let path = format!("/{alg}/x");
        let before = up.requests().await;
        let calls = redis.command_calls("evalsha");
        let started = Instant::now();
        let replies = Load::across(&[a.url(&path), b.url(&path)])
            .conns(200)
            .run(50)
            .await;
        let took = started.elapsed();
        let calls = redis.command_calls("evalsha") - calls;
        assert_eq!(replies.len(), 10_000);
        for gw in [&a, &b] {
            let out = gw.output();
            let bad: Vec<&str> = out
                .lines()
                .filter(|l| l.contains("panicked") || l.contains("ERROR") || l.contains("WARN"))
                .take(5)
                .collect();
            assert!(bad.is_empty(), "{alg}: {bad:#?}");
        }
        assert_only_200_and_429(alg, &replies);
        let n = admitted(&replies);
        assert!((900..=1000).contains(&n), "{alg}: {n} admitted");
        assert_eq!(up.requests().await - before, n, "{alg}: upstream");
        eprintln!("{alg}: {n} of 10,000 admitted in {took:?}, {calls} store calls");
        // The leases end and give back what they held: Redis counts exactly the admitted.
        tokio::time::sleep(LEASES_END).await;
        if matches!(alg, "fixed_window" | "sliding_window") {
            assert_eq!(
                redis_count(&redis, "lease", &format!("lease-{alg}")),
                n,
                "{alg}"
            );
        }
        // And what was given back can still be spent, to the unit.
        let rest = spend_the_rest(&a, &path).await;
        assert_eq!(n + rest, 1000, "{alg}: {n} in the load, {rest} after");
        assert_eq!(up.requests().await - before, 1000, "{alg}: upstream");
    }
    // Leases were taken; none of their units was lost (what was not spent went back).
    for gw in [&a, &b] {
        let m = gw.metrics().await;
        let units = |e: &str| m.value("tollgate_lease_units_total", &[("event", e)]);
        assert!(units("taken") > 0.0);
        assert_eq!(units("lost"), 0.0);
    }
    let m = a.metrics().await;
    assert!(
        m.sum(
            "tollgate_decisions_total",
            &[("limit", "lease-fixed_window"), ("source", "lease")]
        ) > 0.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_holding_a_lease_never_lets_the_fleet_exceed_the_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis, &up, "lease-kill", (1000, "24h", 50));
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let mut b = Gateway::start_named("B", &yaml, &[], &[]).await;
    clear_of_window_boundary(DAY_S, 60).await;
    let path = "/fixed_window/x";
    // B is hot (it leases), and killed mid-load.
    let driver = Load::new(&b.url(path)).conns(8).start();
    driver
        .wait("B admitted 300", Duration::from_secs(30), |r| {
            admitted(r) >= 300
        })
        .await;
    b.proc.signal("KILL");
    let on_b = driver.finish().await;
    let on_b = admitted(&on_b);
    let _ = b.proc.exited();
    // A takes what is left, under load, then one by one after its own leases end.
    let on_a = admitted(&Load::new(&a.url(path)).conns(20).run(100).await);
    tokio::time::sleep(LEASES_END).await;
    let rest = spend_the_rest(&a, path).await;
    let answered = on_b + on_a + rest;
    // What the fleet admitted is what reached the upstream: B's requests in flight at the
    // kill (at most one per connection) reached it without their answer reaching the client.
    let upstream = up.requests().await;
    assert!(
        (answered..=answered + 8).contains(&upstream),
        "upstream {upstream}, answered 200: {answered}"
    );
    assert!(
        (950..=1000).contains(&upstream),
        "B {on_b} + A {on_a} + {rest} answered, upstream {upstream}: at most the 50 units of B's lease lost"
    );
    for (k, ttl) in redis.keys_with_ttl() {
        assert!(ttl > 0 || ttl == -2, "key {k} has no expiry ({ttl})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn leases_are_not_spent_across_a_fixed_window_boundary_on_two_gateways() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis, &up, "lease-boundary", (100, "2s", 20));
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    let path = "/fixed_window/x";
    let start = {
        let now = now_ms();
        let start = now - now % 2000 + 2000;
        tokio::time::sleep(Duration::from_millis(start + 100 - now)).await;
        start
    };
    let origin = (Instant::now(), now_ms());
    let driver = Load::across(&[a.url(path), b.url(path)]).conns(16).start();
    let end = start + 4 * 2000 - 300;
    tokio::time::sleep(Duration::from_millis(end.saturating_sub(now_ms()))).await;
    let replies = driver.finish().await;
    assert_only_200_and_429("boundary", &replies);
    // Each admission was decided between its request's send and its answer: count it in a
    // window only when both are in it.
    let at = |i: Instant| origin.1 + i.duration_since(origin.0).as_millis() as u64;
    let mut per_window: BTreeMap<u64, u64> = BTreeMap::new();
    let mut unsure = 0;
    for r in replies.iter().filter(|r| r.status() == 200) {
        let (from, to) = (at(r.sent), at(r.sent + r.latency));
        if from / 2000 == to / 2000 {
            *per_window.entry(from / 2000).or_default() += 1;
        } else {
            unsure += 1;
        }
    }
    let total = admitted(&replies);
    eprintln!("per window {per_window:?}, {unsure} across a boundary, {total} in all");
    assert!(per_window.values().all(|&n| n <= 100), "{per_window:?}");
    assert!(total <= 4 * 100, "{total}");
    assert!(
        total >= 4 * (100 - 2 * 20),
        "{total}: leases lost more than 2 × max"
    );
    assert_eq!(up.requests().await, total);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_on_one_gateway_ends_the_leases_of_the_changed_limit_on_both() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let limit = |n: u64| config(&redis, &up, "lease-reload", (n, "24h", 50));
    let a = Gateway::start_named("A", &limit(100_000), &[], &[]).await;
    let b = Gateway::start_named("B", &limit(100_000), &[], &[]).await;
    // Both gateways busy on one caller: their leases are spent long before they would end.
    let path = "/token_bucket/x";
    let driver = Load::across(&[a.url(path), b.url(path)]).conns(8).start();
    driver
        .wait("both lease", Duration::from_secs(30), |r| {
            admitted(r) >= 1000
        })
        .await;
    assert_eq!((ended_early(&a).await, ended_early(&b).await), (0.0, 0.0));
    let given = (given_back(&a).await, given_back(&b).await);
    // Only A reloads, changing the limit: B ends its lease too, over pub/sub, and gives its
    // units back at once (its own config still has the old limit, so it leases again). A
    // gateway has a lease to end only while it holds units: not while it is asking for the
    // next one, its last one spent. So A changes the limit again until each gateway has
    // ended one, at most 10 times; a gateway that ignored the change would never end any.
    let mut reloads = 0;
    let mut ended = (0.0, 0.0);
    while reloads < 10 && (ended.0 == 0.0 || ended.1 == 0.0) {
        reloads += 1;
        a.replace_config(&limit(100_000 * (reloads + 1)));
        a.sighup();
        a.wait_generation(reloads, Duration::from_secs(5)).await;
        let t = Instant::now();
        eventually("both gateways ended a lease early", Duration::from_secs(2))
            .may_hold_async(|| async {
                let e = (ended_early(&a).await, ended_early(&b).await);
                e.0 > 0.0 && e.1 > 0.0
            })
            .await;
        ended = (ended_early(&a).await, ended_early(&b).await);
        eprintln!(
            "reload {reloads}: leases ended early {ended:?} after {:?}",
            t.elapsed()
        );
    }
    assert!(
        ended.0 > 0.0,
        "A never ended a lease over {reloads} reloads"
    );
    assert!(
        ended.1 > 0.0,
        "B never ended a lease over {reloads} reloads of A"
    );
    // What an ended lease held went back to Redis.
    assert!(given_back(&a).await > given.0, "A gave nothing back");
    assert!(given_back(&b).await > given.1, "B gave nothing back");
    let replies = driver.finish().await;
    assert_only_200_and_429("reload", &replies);
    assert_eq!(up.requests().await, admitted(&replies));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_paid_from_a_lease_but_denied_in_redis_consumes_neither_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    // One route, two limits: a roomy one that leases and a tight one checked in Redis.
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: mixed, timeout: 5s, on_error: deny }}\n{}\
         routes:\n  - name: mixed\n    match: {{ path_prefix: / }}\n    upstream: backend\n    limits:\n\
         \x20     - {{ name: roomy, algorithm: fixed_window, limit: 100000, window: 24h, lease: {{ max: 50 }} }}\n\
         \x20     - {{ name: tight, algorithm: fixed_window, limit: 20, window: 24h }}\n",
        redis.url(),
        up.upstreams_yaml(),
    );
    let gw = Gateway::start(&yaml).await;
    clear_of_window_boundary(DAY_S, 60).await;
    let c = client();
    let mut statuses = BTreeMap::new();
    for _ in 0..100 {
        let status = get(&c, &gw.url("/x"), &[]).await.status.as_u16();
        *statuses.entry(status).or_insert(0) += 1;
    }
    assert_eq!(statuses, BTreeMap::from([(200, 20), (429, 80)]));
    assert_eq!(up.requests().await, 20);
    let m = gw.metrics().await;
    let leased = m.sum(
        "tollgate_decisions_total",
        &[("limit", "roomy"), ("source", "lease")],
    );
    assert!(leased > 0.0, "no request was paid from a lease");
    // The request `tight` refused had its `roomy` unit reserved from the lease: it went back
    // to the lease, and the lease's unspent units to Redis when it ended.
    tokio::time::sleep(LEASES_END).await;
    assert_eq!(redis_count(&redis, "mixed", "roomy"), 20, "roomy consumed");
    assert_eq!(redis_count(&redis, "mixed", "tight"), 20, "tight consumed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leasing_gateway_ten_minutes_ahead_keeps_the_fleet_exact() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis, &up, "lease-skew", (1000, "24h", 50));
    let a = Gateway::start_named("A (true clock)", &yaml, &[], &[]).await;
    let skew = faketime_env("+10m");
    let b = Gateway::start_named("B (+10 min)", &yaml, &[], &skew).await;
    clear_of_window_boundary(DAY_S, 60).await;
    // Redis is the clock: B's lease is timed on its monotonic clock, its window on Redis's.
    let path = "/fixed_window/x";
    let replies = Load::across(&[a.url(path), b.url(path)])
        .conns(200)
        .run(50)
        .await;
    assert_only_200_and_429("skew", &replies);
    let n = admitted(&replies);
    assert!((900..=1000).contains(&n), "{n} admitted");
    assert_eq!(up.requests().await, n);
    tokio::time::sleep(LEASES_END).await;
    assert_eq!(redis_count(&redis, "lease-skew", "lease-fixed_window"), n);
    let m = b.metrics().await;
    let taken = m.value("tollgate_leases_total", &[("event", "taken")]);
    assert!(taken > 0.0, "B took no lease");
}

/// Leases `gw` ended early, on an invalidation, so far.
async fn ended_early(gw: &Gateway) -> f64 {
    gw.metrics()
        .await
        .value("tollgate_leases_total", &[("event", "ended_early")])
}

/// Leased units `gw` gave back so far.
async fn given_back(gw: &Gateway) -> f64 {
    gw.metrics()
        .await
        .value("tollgate_lease_units_total", &[("event", "given_back")])
}
