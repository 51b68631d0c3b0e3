//! Redis integration tests: real `tollgate` gateway processes sharing real `redis-server`
//! processes (single instance, 3-master cluster, master + replica + sentinel), in front of
//! the real demo upstream, everything on loopback.
//!
//! What is checked (issue 3, "Tests that must exist and pass"):
//! exactness across two gateway instances for every algorithm, all-or-nothing across limits,
//! clock skew between gateways (one under libfaketime), a TTL on every key, NOSCRIPT after
//! `SCRIPT FLUSH` and after a Redis restart, `/readyz` reporting Redis (and following it with
//! `server.ready_requires_store`), Redis Cluster (exact, no CROSSSLOT) and Sentinel (plus a
//! Sentinel failover).
//!
//! The exactness configs set `store.timeout: 5s` and `on_error: deny`: a store call that fails
//! shows up as a 503 instead of an admitted, uncounted request (the defaults, 25 ms and
//! `allow`, fail open under the load of these tests on a small machine).
//!
//! Every process is killed by PID when its guard drops, also when a test panics. Every loop is
//! bounded in count and time. A missing `redis-server` or `faketime` fails, naming what to
//! install.

mod common;

use tollgate::fingerprint::KeyHash;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::clock::clear_of_window_boundary;
use common::faults::faketime_env;
use common::gateway::Gateway;
use common::http::{client, get, Resp};
use common::load::{by_status, Load, Reply, RUN_TIMEOUT};
use common::process::free_port;
use common::redis::{base_key, cli, RedisCluster, RedisSentinel, RedisServer, MASTER_NAME};
use common::upstream::Upstream;
use common::wait::eventually;
use tempfile::TempDir;

const ALGORITHMS: [&str; 5] = [
    "sliding_window",
    "fixed_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

const DAY_S: u64 = 86_400;
const DAY_MS: i64 = 86_400_000;

// ---------------------------------------------------------------------------------------
// Load.
// ---------------------------------------------------------------------------------------

fn statuses(pairs: &[(u16, u64)]) -> BTreeMap<u16, u64> {
    pairs.iter().copied().filter(|(_, n)| *n > 0).collect()
}

/// `conns` connections, connection `i` sending `per_conn` GETs to `targets[i % targets.len()]`.
async fn blast(targets: &[String], conns: usize, per_conn: usize) -> Vec<Reply> {
    Load::across(targets).conns(conns).run(per_conn).await
}

/// Replies of each target, by status.
fn per_target(replies: &[Reply], targets: usize) -> Vec<BTreeMap<u16, u64>> {
    (0..targets)
        .map(|t| by_status(replies.iter().filter(|r| r.target == t)))
        .collect()
}

/// Assert the exact outcome of a run: `admitted` 200s, the rest 429s, nothing else, and the
/// upstream counted exactly `admitted` more requests.
async fn assert_exact(
    what: &str,
    replies: &[Reply],
    total: u64,
    admitted: u64,
    up: &Upstream,
    before: u64,
) {
    let upstream = up.requests().await - before;
    let unexpected: Vec<&Reply> = replies
        .iter()
        .filter(|r| !matches!(r.status(), 200 | 429))
        .take(10)
        .collect();
    let targets = replies.iter().map(|r| r.target + 1).max().unwrap_or(0);
    assert_eq!(
        by_status(replies),
        statuses(&[(200, admitted), (429, total - admitted)]),
        "{what}: expected exactly {admitted} × 200 and {} × 429; per gateway {:?}; samples {unexpected:#?}",
        total - admitted,
        per_target(replies, targets),
    );
    assert_eq!(
        upstream, admitted,
        "{what}: the upstream counted {upstream} requests, {admitted} were admitted"
    );
}

// ---------------------------------------------------------------------------------------
// Redis inspection.
// ---------------------------------------------------------------------------------------

/// The counter of every key matching `pattern`, in key order: a string's value; for a
/// sliding-window hash (`n0 c0 n1 c1`: window number and count, by the number's parity), the
/// count of its current window, the one with the higher number.
fn counters(redis: &RedisServer, pattern: &str) -> Vec<String> {
    redis
        .scan(pattern)
        .into_iter()
        .map(|k| match redis.cli(&["TYPE", &k]).as_str() {
            "string" => redis.cli(&["GET", &k]),
            "hash" => {
                let all = redis.cli(&["HGETALL", &k]);
                let fields: BTreeMap<&str, &str> = all
                    .lines()
                    .collect::<Vec<_>>()
                    .chunks(2)
                    .map(|p| (p[0], p[1]))
                    .collect();
                let number = |f: &str| fields.get(f).map_or(-1, |n| n.parse::<i64>().unwrap());
                let current = if number("n0") > number("n1") {
                    "c0"
                } else {
                    "c1"
                };
                fields[current].to_string()
            }
            other => panic!("key {k} has unexpected type {other}"),
        })
        .collect()
}

/// Every key matching `pattern` with its value (a string, a hash as `field value ...`, or a
/// sorted set as `member score ...`).
fn dump(redis: &RedisServer, pattern: &str) -> BTreeMap<String, String> {
    redis
        .scan(pattern)
        .into_iter()
        .map(|k| {
            let v = match redis.cli(&["TYPE", &k]).as_str() {
                "string" => redis.cli(&["GET", &k]),
                "hash" => redis.cli(&["HGETALL", &k]),
                "zset" => redis.cli(&["ZRANGE", &k, "0", "-1", "WITHSCORES"]),
                other => panic!("key {k} has unexpected type {other}"),
            };
            (k, v)
        })
        .collect()
}

/// Every key has a TTL (none is -1), each at most `max_ttl_ms(key)`; returns the keys.
fn assert_every_key_expires(
    redis: &RedisServer,
    prefix: &str,
    max_ttl_ms: impl Fn(&str) -> i64,
) -> Vec<String> {
    let keys = redis.keys_with_ttl();
    assert!(!keys.is_empty(), "no key at all on port {}", redis.port);
    for (k, ttl) in &keys {
        assert!(
            k.starts_with(&format!("{{{prefix}:")),
            "unexpected key {k} (not under the prefix {prefix})"
        );
        assert_ne!(*ttl, -1, "key {k} has no expiry");
        assert!(
            *ttl == -2 || (*ttl > 0 && *ttl <= max_ttl_ms(k)),
            "key {k}: TTL {ttl} ms outside (0, {}]",
            max_ttl_ms(k)
        );
    }
    keys.into_iter().map(|(k, _)| k).collect()
}

/// One route `/<path>` per entry, each with one limit `<name>` of `key: []`.
fn routes_with_own_limit(entries: &[(String, String, &str, u64, &str)]) -> String {
    let mut s = String::from("routes:\n");
    for (path, name, alg, limit, window) in entries {
        s.push_str(&format!(
            "  - {{ name: r-{name}, match: {{ path_prefix: /{path} }}, upstream: backend, limits: [ {{ name: {name}, key: [], algorithm: {alg}, limit: {limit}, window: {window} }} ] }}\n"
        ));
    }
    s
}

// ---------------------------------------------------------------------------------------
// 1. Exactness across instances, every algorithm; then every key has a TTL.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_gateways_sharing_redis_admit_exactly_the_limit_for_every_algorithm() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let entries: Vec<_> = ALGORITHMS
        .iter()
        .map(|a| (a.to_string(), format!("exact-{a}"), *a, 1000, "24h"))
        .collect();
    let yaml = format!(
        "store: {{ key_prefix: exact, timeout: 5s, on_error: deny }}\n{}{}",
        up.upstreams_yaml(),
        routes_with_own_limit(&entries)
    );
    let a = Gateway::start_named("A", &yaml, &["--redis-url", &redis.url()], &[]).await;
    let b = Gateway::start_named("B", &yaml, &["--redis-url", &redis.url()], &[]).await;
    for alg in ALGORITHMS {
        // Fixed and sliding windows of a day are aligned to midnight UTC; token_bucket and
        // gcra refill one token per 86.4 s, far longer than a run.
        clear_of_window_boundary(DAY_S, 60).await;
        let before = up.requests().await;
        let started = Instant::now();
        let path = format!("/{alg}/x");
        let replies = blast(&[a.url(&path), b.url(&path)], 200, 50).await;
        assert_exact(alg, &replies, 10_000, 1000, &up, before).await;
        // Both gateways answered their 5,000 requests.
        let per_gateway = per_target(&replies, 2);
        for (i, t) in per_gateway.iter().enumerate() {
            assert_eq!(t.values().sum::<u64>(), 5000, "gateway {i}: {t:?}");
        }
        eprintln!(
            "{alg}: 10,000 requests in {:?}, per gateway {:?}",
            started.elapsed(),
            per_gateway
        );
    }
    // 4 (after a run). Every key written has an expiry, at most two windows away.
    let keys = assert_every_key_expires(&redis, "exact", |_| 2 * DAY_MS);
    for alg in ALGORITHMS {
        assert!(
            keys.iter()
                .any(|k| k.starts_with(&format!("{{exact:exact-{alg}:"))),
            "no key of {alg} in {keys:?}"
        );
    }
}

/// A gateway with one thread runs on a single-threaded runtime (`server.work_stealing`
/// defaults to off there; issue 15): its memory store and its Redis connection, whose driver
/// task shares that one thread with every request, still admit exactly the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_on_one_single_threaded_runtime_admits_exactly_the_limit() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml =
        format!(
        "server: {{ threads: 1 }}\nstore: {{ key_prefix: one, timeout: 5s, on_error: deny }}\n{}{}",
        up.upstreams_yaml(),
        routes_with_own_limit(&[("x".into(), "one-thread".into(), "sliding_window", 300, "24h")])
    );
    let memory = Gateway::start_named("memory", &yaml, &[], &[]).await;
    let on_redis = Gateway::start_named("redis", &yaml, &["--redis-url", &redis.url()], &[]).await;
    for gw in [&memory, &on_redis] {
        gw.wait_output("threads=1 work_stealing=false", Duration::from_secs(5))
            .await;
    }
    clear_of_window_boundary(DAY_S, 60).await;
    for (what, gw) in [("memory store", &memory), ("Redis store", &on_redis)] {
        let before = up.requests().await;
        let replies = blast(&[gw.url("/x/1")], 60, 25).await;
        assert_exact(what, &replies, 1500, 300, &up, before).await;
    }
    assert_eq!(counters(&redis, "{one:*"), ["300"]);
}

// ---------------------------------------------------------------------------------------
// 2. All-or-nothing: a request denied by its hour limit leaves its minute counter unchanged.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_request_denied_by_the_hour_limit_leaves_the_minute_counter_unchanged() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let mut routes = String::from("routes:\n");
    let mut limits = String::from("limits:\n");
    for alg in ALGORITHMS {
        routes.push_str(&format!(
            "  - {{ name: both-{alg}, match: {{ path_prefix: /both/{alg} }}, upstream: backend }}\n  - {{ name: minute-only-{alg}, match: {{ path_prefix: /minute/{alg} }}, upstream: backend }}\n"
        ));
        limits.push_str(&format!(
            "  - {{ name: minute-{alg}, key: [], algorithm: {alg}, limit: 10, window: 1m, routes: [both-{alg}, minute-only-{alg}] }}\n  - {{ name: hour-{alg}, key: [], algorithm: {alg}, limit: 3, window: 1h, routes: [both-{alg}] }}\n"
        ));
    }
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: aon, timeout: 5s, on_error: deny }}\n{}{routes}{limits}",
        redis.url(),
        up.upstreams_yaml()
    );
    let gw = Gateway::start_named("aon", &yaml, &[], &[]).await;
    let c = client();
    for alg in ALGORITHMS {
        // Windows aligned to the epoch: 10 s clear of a minute boundary, hence of an hour
        // boundary. (token_bucket and gcra refill one token per 6 s at 10/1m; all of this
        // takes well under a second.)
        if matches!(alg, "sliding_window" | "fixed_window") {
            clear_of_window_boundary(60, 10).await;
        }
        let before = up.requests().await;
        for i in 0..3u64 {
            let r = get(&c, &gw.url(&format!("/both/{alg}")), &[]).await;
            assert_eq!(r.status, 200, "{alg} request {i}: {r:#?}");
            // The hour limit is the most restrictive one.
            assert_eq!(
                r.header("ratelimit-policy"),
                format!("\"hour-{alg}\";q=3;w=3600")
            );
            assert_eq!(r.header_u64("x-ratelimit-remaining"), 2 - i, "{alg}");
        }
        let pattern = format!("{{aon:minute-{alg}:*");
        let minute_before = dump(&redis, &pattern);
        assert!(!minute_before.is_empty(), "{alg}: no minute key");
        if matches!(alg, "sliding_window" | "fixed_window") {
            // One counter, of the current window: 3.
            assert_eq!(
                counters(&redis, &pattern),
                vec!["3"],
                "{alg}: {minute_before:?}"
            );
        }
        for i in 0..5 {
            let r = get(&c, &gw.url(&format!("/both/{alg}")), &[]).await;
            assert_eq!(r.status, 429, "{alg} denied request {i}: {r:#?}");
            assert_eq!(r.json()["policy"], format!("hour-{alg}"), "{alg}");
        }
        let minute_after = dump(&redis, &pattern);
        assert_eq!(
            minute_after, minute_before,
            "{alg}: requests denied by the hour limit changed the minute counter"
        );
        // The minute limit alone: 3 used before, this one is the 4th.
        let r = get(&c, &gw.url(&format!("/minute/{alg}")), &[]).await;
        assert_eq!(r.status, 200, "{alg}: {r:#?}");
        assert_eq!(
            r.header("ratelimit-policy"),
            format!("\"minute-{alg}\";q=10;w=60")
        );
        assert_eq!(r.header_u64("x-ratelimit-remaining"), 6, "{alg}: {r:#?}");
        assert!(
            r.header("ratelimit")
                .starts_with(&format!("\"minute-{alg}\";r=6;t=")),
            "{alg}: {r:#?}"
        );
        assert_eq!(up.requests().await - before, 4, "{alg}");
    }
}

// ---------------------------------------------------------------------------------------
// 3. Clock skew: one gateway runs 10 minutes ahead (libfaketime); Redis is the only clock.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateways_whose_clocks_differ_by_ten_minutes_still_admit_exactly_the_limit() {
    let skew_env = faketime_env("+10m");
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    // Windows of 1 m: a gateway clock 10 m ahead would be 10 windows ahead. token_bucket and
    // gcra: 100/1h refills one token per 36 s (far longer than a run), while 10 minutes of
    // refill would be 16 tokens.
    let window = |alg: &str| match alg {
        "token_bucket" | "gcra" => "1h",
        _ => "1m",
    };
    let entries: Vec<_> = ALGORITHMS
        .iter()
        .map(|a| (a.to_string(), format!("skew-{a}"), *a, 100, window(a)))
        .collect();
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: skew, timeout: 5s, on_error: deny }}\n{}{}",
        redis.url(),
        up.upstreams_yaml(),
        routes_with_own_limit(&entries)
    );
    let a = Gateway::start_named("A (true clock)", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B (+10 min)", &yaml, &[], &skew_env).await;
    let c = client();
    for alg in ALGORITHMS {
        if matches!(alg, "sliding_window" | "fixed_window") {
            clear_of_window_boundary(60, 10).await;
        }
        let path = format!("/{alg}");
        let before = up.requests().await;
        // B alone takes half of the limit, then A and B race for the rest.
        let first = blast(&[b.url(&path)], 10, 5).await;
        assert_eq!(
            by_status(&first),
            statuses(&[(200, 50)]),
            "{alg}: {first:?}"
        );
        let rest = blast(&[a.url(&path), b.url(&path)], 40, 25).await;
        assert_exact(alg, &rest, 1000, 50, &up, before + 50).await;

        // faketime really moved B's clock (its `Date` header is 600 s ahead), yet both report
        // the same X-RateLimit-Reset, because resets are computed on Redis's clock.
        let ra = get(&c, &a.url(&path), &[]).await;
        let rb = get(&c, &b.url(&path), &[]).await;
        assert_eq!(
            (ra.status.as_u16(), rb.status.as_u16()),
            (429, 429),
            "{alg}"
        );
        let (reset_a, reset_b) = (
            ra.header_u64("x-ratelimit-reset") as i64,
            rb.header_u64("x-ratelimit-reset") as i64,
        );
        assert!(
            (reset_b - reset_a).abs() <= 1,
            "{alg}: X-RateLimit-Reset A {reset_a}, B {reset_b}: not on one clock"
        );
        let date = |r: &Resp| {
            httpdate::parse_http_date(r.header("date"))
                .unwrap_or_else(|e| panic!("bad Date header: {e}"))
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_secs() as i64
        };
        let skew = date(&rb) - date(&ra);
        assert!(
            (597..=603).contains(&skew),
            "{alg}: Date A {}, B {}: B's clock is not 10 minutes ahead",
            ra.header("date"),
            rb.header("date")
        );
    }
}

// ---------------------------------------------------------------------------------------
// 4. TTL: every key written has an expiry, bounded by what the algorithm needs; short-window
//    keys are really gone once their state no longer matters.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_key_written_expires() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let mut routes = String::from("routes:\n");
    for alg in ALGORITHMS {
        routes.push_str(&format!(
            "  - {{ name: own-{alg}, match: {{ path_prefix: /own/{alg} }}, upstream: backend, limits: [ {{ name: short-{alg}, key: [client_ip], algorithm: {alg}, limit: 5, window: 2s }}, {{ name: long-{alg}, key: [header:x-user], algorithm: {alg}, limit: 50, window: 1h }} ] }}\n"
        ));
    }
    routes.push_str("  - { name: all, match: { path_prefix: /all }, upstream: backend }\n");
    let mut limits = String::from("limits:\n");
    for alg in ALGORITHMS {
        limits.push_str(&format!(
            "  - {{ name: all-{alg}, key: [], algorithm: {alg}, limit: 8, window: 10m, routes: [all] }}\n"
        ));
    }
    limits.push_str(
        "  - { name: all-shadow, key: [route, method], limit: 2, window: 10m, shadow: true, routes: [all] }\n",
    );
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: ttl, timeout: 5s, on_error: deny }}\n{}{routes}{limits}",
        redis.url(),
        up.upstreams_yaml()
    );
    let gw = Gateway::start_named("ttl", &yaml, &[], &[]).await;
    let c = client();
    for alg in ALGORITHMS {
        for i in 0..12 {
            let user = format!("u{}", i % 2);
            let r = get(&c, &gw.url(&format!("/own/{alg}")), &[("x-user", &user)]).await;
            assert!(r.status == 200 || r.status == 429, "{r:#?}");
        }
    }
    clear_of_window_boundary(600, 5).await;
    let mut all = BTreeMap::new();
    for _ in 0..12 {
        let r = get(&c, &gw.url("/all"), &[]).await;
        *all.entry(r.status.as_u16()).or_insert(0u64) += 1;
    }
    assert_eq!(all, statuses(&[(200, 8), (429, 4)]));
    // Bounds: two windows for sliding_window (the previous window is read), one window for
    // the others.
    let bound = |k: &str| -> i64 {
        let name = k.trim_start_matches("{ttl:").split(':').next().unwrap();
        let window = if name.starts_with("short-") {
            2_000
        } else if name.starts_with("long-") {
            3_600_000
        } else {
            600_000
        };
        if name.ends_with("sliding_window") || name == "all-shadow" {
            2 * window
        } else {
            window
        }
    };
    let keys = assert_every_key_expires(&redis, "ttl", bound);
    for alg in ALGORITHMS {
        for name in [format!("long-{alg}"), format!("all-{alg}")] {
            assert!(
                keys.iter()
                    .any(|k| k.starts_with(&format!("{{ttl:{name}:"))),
                "no key of {name} in {keys:?}"
            );
        }
    }
    assert!(keys.iter().any(|k| k.starts_with("{ttl:all-shadow:")));
    // Two short windows later every key of the 2 s limits has expired.
    tokio::time::sleep(Duration::from_millis(4_300)).await;
    let left = redis.scan("{ttl:short-*");
    assert!(left.is_empty(), "keys outlived their state: {left:?}");
    assert_every_key_expires(&redis, "ttl", bound);
}

// ---------------------------------------------------------------------------------------
// 5. NOSCRIPT: SCRIPT FLUSH mid-run, and a Redis restart mid-run.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn script_flush_mid_run_is_invisible_and_counts_nothing_twice() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let entries: Vec<_> = ALGORITHMS
        .iter()
        .map(|a| (a.to_string(), format!("flush-{a}"), *a, 300, "24h"))
        .collect();
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: flush, timeout: 5s, on_error: deny }}\n{}{}",
        redis.url(),
        up.upstreams_yaml(),
        routes_with_own_limit(&entries)
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    const TOTAL: u64 = 2000;
    for alg in ALGORITHMS {
        clear_of_window_boundary(DAY_S, 30).await;
        let before = up.requests().await;
        let noscript_before = redis.noscript_errors();
        let progress = Arc::new(AtomicU64::new(0));
        // Flush the script cache four times while requests are in flight.
        let flusher = {
            let (progress, port) = (progress.clone(), redis.port);
            std::thread::spawn(move || {
                let start = Instant::now();
                let mut flushed_at = Vec::new();
                for pct in [10, 30, 50, 70] {
                    let what = format!("the run reaches {pct}% (else it stalled)");
                    eventually(what, RUN_TIMEOUT.saturating_sub(start.elapsed()))
                        .every(Duration::from_millis(1))
                        .holds_blocking(|| progress.load(Ordering::SeqCst) >= TOTAL * pct / 100);
                    assert_eq!(cli(port, &["SCRIPT", "FLUSH"]), "OK");
                    flushed_at.push(progress.load(Ordering::SeqCst));
                }
                flushed_at
            })
        };
        let path = format!("/{alg}");
        let replies = Load::across(&[a.url(&path), b.url(&path)])
            .conns(40)
            .progress(&progress)
            .run((TOTAL / 40) as usize)
            .await;
        let flushed_at = flusher.join().expect("flusher");
        assert!(
            flushed_at.iter().all(|&p| p < TOTAL),
            "{alg}: a flush came after the run ({flushed_at:?})"
        );
        assert_exact(alg, &replies, TOTAL, 300, &up, before).await;
        let noscript = redis.noscript_errors() - noscript_before;
        assert!(
            noscript >= 1,
            "{alg}: no NOSCRIPT after 4 flushes at {flushed_at:?}: the test proved nothing"
        );
        eprintln!("{alg}: flushed at {flushed_at:?}, {noscript} NOSCRIPT replies");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_mid_run_fails_open_and_then_limits_exactly_from_a_clean_slate() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: restart, timeout: 500ms }}\n{}\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n\
         limits:\n  - {{ name: per-caller, key: [\"header:x-k\"], limit: 20, window: 24h, on_error: allow }}\n",
        redis.url(),
        up.upstreams_yaml()
    );
    let gw = Gateway::start_named("gw", &yaml, &[], &[]).await;
    gw.wait_store("ok", Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let url = gw.url("/x");
    let caller_a = || Load::new(&url).conns(3).header("x-k", "a");

    // Caller a exhausts its limit.
    let before = up.requests().await;
    let t = caller_a().run(10).await;
    assert_exact("caller a before the restart", &t, 30, 20, &up, before).await;

    // Caller b keeps sending while Redis is killed (-9) and started again, empty.
    let background = Load::new(&url)
        .conns(8)
        .pace(Duration::from_millis(2))
        .header("x-k", "b")
        .start();
    background
        .wait("100 background requests", Duration::from_secs(30), |r| {
            r.len() >= 100
        })
        .await;
    let old_pid = redis.pid();
    redis.restart();
    assert_ne!(redis.pid(), old_pid);
    let at_restart = background.len();
    // The gateway reconnects (and reloads the script) by itself.
    gw.wait_store("ok", Duration::from_secs(15)).await;
    background
        .wait(
            "200 background requests after the restart",
            Duration::from_secs(30),
            |r| r.len() >= at_restart + 200,
        )
        .await;
    let replies = background.finish().await;
    let by_status = by_status(&replies);
    let errors: Vec<&Reply> = replies
        .iter()
        .filter(|r| !matches!(r.status(), 200 | 429))
        .take(10)
        .collect();
    assert!(
        by_status.keys().all(|s| *s == 200 || *s == 429),
        "client-visible errors across the restart: {by_status:?} {errors:#?}"
    );
    assert!(
        by_status.get(&429).copied().unwrap_or(0) > 0,
        "{by_status:?}"
    );
    eprintln!("across the restart: {by_status:?}");

    // Counting resumes once the gateway's store calls succeed again (after the circuit
    // breaker's cooldown, if it opened): until then requests fail open, without rate-limit
    // headers. A third caller probes, so caller a's counter is untouched.
    let c = client();
    let resuming = Instant::now();
    let mut probes = 0;
    let r = eventually(
        "the gateway counts again within 15 s of Redis answering",
        Duration::from_secs(15),
    )
    .every(Duration::from_millis(20))
    .holds_async(|| {
        probes += 1;
        let (c, url) = (&c, &url);
        async move {
            let r = get(c, url, &[("x-k", "probe")]).await;
            assert_eq!(r.status, 200, "{r:#?}");
            r.opt_header("x-ratelimit-remaining").is_some().then_some(r)
        }
    })
    .await;
    assert_eq!(r.header_u64("x-ratelimit-remaining"), 19, "{r:#?}");
    eprintln!(
        "counting resumed {:?} after /readyz said the store is ok ({probes} probes)",
        resuming.elapsed()
    );

    // The new Redis is empty: caller a gets exactly its limit again, no more.
    assert!(redis.scan("*").iter().all(|k| k.starts_with("{restart:")));
    let before = up.requests().await;
    let t = caller_a().run(10).await;
    assert_exact("caller a after the restart", &t, 30, 20, &up, before).await;
}

// ---------------------------------------------------------------------------------------
// 6. /readyz reports Redis, and follows it only with server.ready_requires_store.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_stays_200_while_redis_is_down_and_its_body_says_so() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ key_prefix: ready, timeout: 200ms }}\n{}\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n",
        up.upstreams_yaml()
    );
    let gw = Gateway::start_named("gw", &yaml, &["--redis-url", &redis.url()], &[]).await;
    let body = gw.wait_store("ok", Duration::from_secs(10)).await;
    let (status, body2) = gw.readyz_status().await;
    assert_eq!(
        (status, &body2["status"], &body2["ready_requires_store"]),
        (200, &"ready".into(), &false.into()),
        "{body} {body2}"
    );

    // Redis down: the gateway still serves (by each limit's on_error), so it stays ready;
    // the body says the store is unreachable and why the breaker is as it is.
    redis.kill();
    gw.wait_store("unreachable", Duration::from_secs(10)).await;
    let (status, body) = gw.readyz_status().await;
    assert_eq!(
        (status, &body["status"], &body["store"], &body["reason"]),
        (
            200,
            &"ready".into(),
            &"unreachable".into(),
            &serde_json::Value::Null
        ),
        "{body}"
    );
    assert!(
        body["store_status"]["failures"].as_u64() >= Some(1),
        "{body}"
    );

    redis.restart();
    let body = gw.wait_store("ok", Duration::from_secs(15)).await;
    assert_eq!(body["status"], "ready", "{body}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_ready_requires_store_readyz_is_503_while_redis_is_down_and_200_again_after() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "server: {{ ready_requires_store: true }}\n\
         store: {{ key_prefix: ready, timeout: 200ms }}\n{}\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n",
        up.upstreams_yaml()
    );
    let gw = Gateway::start_named("gw", &yaml, &["--redis-url", &redis.url()], &[]).await;
    let body = gw.wait_readyz(200, Duration::from_secs(10)).await;
    assert_eq!(
        (&body["store"], &body["ready_requires_store"]),
        (&"ok".into(), &true.into()),
        "{body}"
    );
    let (status, body) = gw.readyz_status().await;
    assert_eq!((status, &body["status"]), (200, &"ready".into()), "{body}");

    redis.kill();
    let body = gw.wait_readyz(503, Duration::from_secs(10)).await;
    assert_eq!(body["store"], "unreachable", "{body}");
    assert_eq!(body["status"], "not ready", "{body}");
    assert_eq!(
        body["reason"], "the store is unreachable (server.ready_requires_store)",
        "{body}"
    );
    // Still down: still not ready.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(gw.readyz_status().await.0, 503);

    redis.restart();
    let body = gw.wait_readyz(200, Duration::from_secs(15)).await;
    assert_eq!(body["store"], "ok", "{body}");
}

// ---------------------------------------------------------------------------------------
// 7. Redis Cluster: exact through it; limits in different slots, no CROSSSLOT.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_cluster_is_exact_and_limits_in_different_slots_work() {
    let cluster = RedisCluster::start();
    let up = Upstream::start().await;
    let nodes = cluster
        .urls()
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let entries: Vec<_> = ALGORITHMS
        .iter()
        .map(|a| (a.to_string(), format!("cl-{a}"), *a, 200, "24h"))
        .collect();
    let mut routes = routes_with_own_limit(&entries);
    routes.push_str(
        "  - { name: multi-a, match: { path_prefix: /multi-a }, upstream: backend }\n  - { name: multi-b, match: { path_prefix: /multi-b }, upstream: backend }\n",
    );
    // Per caller first, global second (the order of the store's calls).
    let limits = "limits:\n\
        \x20 - { name: per-key-a, key: [api_key], limit: 10, window: 24h, routes: [multi-a] }\n\
        \x20 - { name: global-a, key: [], limit: 1000, window: 24h, routes: [multi-a] }\n\
        \x20 - { name: per-key-b, key: [api_key], limit: 30, window: 24h, routes: [multi-b] }\n\
        \x20 - { name: global-b, key: [], limit: 50, window: 24h, routes: [multi-b] }\n";
    let yaml = format!(
        "store: {{ backend: redis_cluster, cluster_nodes: [{nodes}], key_prefix: cl, timeout: 5s, on_error: deny }}\n{}{routes}{limits}",
        up.upstreams_yaml()
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    for g in [&a, &b] {
        g.wait_store("ok", Duration::from_secs(10)).await;
    }
    clear_of_window_boundary(DAY_S, 60).await;

    for alg in ALGORITHMS {
        let before = up.requests().await;
        let path = format!("/{alg}");
        let replies = blast(&[a.url(&path), b.url(&path)], 40, 50).await;
        assert_exact(&format!("cluster {alg}"), &replies, 2000, 200, &up, before).await;
        // All of a limit's keys are on one node (one hash tag, one slot).
        let holders: Vec<usize> = cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !n.scan(&format!("{{cl:cl-{alg}:*")).is_empty())
            .map(|(i, _)| i)
            .collect();
        assert_eq!(holders.len(), 1, "{alg}: keys on nodes {holders:?}");
    }

    // The limits of one request live in different slots.
    let callers = ["k1", "k2", "k3"];
    let slot = |key: &str| -> u16 {
        let s = cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", key]);
        s.parse()
            .unwrap_or_else(|_| panic!("CLUSTER KEYSLOT {key}: {s:?}"))
    };
    for (per_key, global) in [("per-key-a", "global-a"), ("per-key-b", "global-b")] {
        let g = slot(&base_key("cl", global, &[]));
        let slots: Vec<u16> = callers
            .iter()
            .map(|c| slot(&base_key("cl", per_key, &[&KeyHash::of(c).0])))
            .collect();
        assert!(
            slots.iter().any(|s| *s != g),
            "{per_key} {slots:?} and {global} {g} share a slot: the test proves nothing"
        );
        eprintln!("slots: {global} {g}, {per_key} of k1, k2, k3 {slots:?}");
    }
    // Connection `i` is caller `i % 3`.
    let api_key = move |i: usize, _| vec![("x-api-key".to_string(), callers[i % 3].to_string())];

    // a: the per-caller limits (10 each) decide; the global one counts only what they admit.
    let before = up.requests().await;
    let t = Load::across(&[a.url("/multi-a"), b.url("/multi-a")])
        .conns(6)
        .headers(api_key)
        .run(10)
        .await;
    assert_exact("cluster multi-slot a", &t, 60, 30, &up, before).await;
    let global_a: Vec<String> = cluster
        .nodes
        .iter()
        .flat_map(|n| counters(n, "{cl:global-a:*"))
        .collect();
    assert_eq!(global_a, vec!["30"], "the global counter of multi-a");

    // b: the global limit (50) decides: 3 callers × 40 requests, at most 30 each.
    let before = up.requests().await;
    let t = Load::across(&[a.url("/multi-b"), b.url("/multi-b")])
        .conns(12)
        .headers(api_key)
        .run(10)
        .await;
    assert_exact("cluster multi-slot b", &t, 120, 50, &up, before).await;
    // The limits of multi-b live on more than one node.
    let holders = cluster
        .nodes
        .iter()
        .filter(|n| !n.scan("{cl:per-key-b:*").is_empty() || !n.scan("{cl:global-b:*").is_empty())
        .count();
    assert!(holders >= 2, "the keys of multi-b are all on one node");
    assert!(
        !a.output().contains("CROSSSLOT") && !b.output().contains("CROSSSLOT"),
        "CROSSSLOT in the gateway logs"
    );
}

// ---------------------------------------------------------------------------------------
// 8. Sentinel: the gateway finds the master and limits exactly; the keys are on the master.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_finds_the_master_and_limits_exactly() {
    let s = RedisSentinel::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis_sentinel, sentinel: {{ master_name: {MASTER_NAME}, nodes: [\"{}\"] }}, key_prefix: sent, timeout: 5s, on_error: deny }}\n{}{}",
        s.sentinel_url(),
        up.upstreams_yaml(),
        routes_with_own_limit(&[("x".into(), "sent-limit".into(), "sliding_window", 50, "24h")])
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    a.wait_store("ok", Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let before = up.requests().await;
    let t = blast(&[a.url("/x"), b.url("/x")], 20, 25).await;
    assert_exact("sentinel", &t, 500, 50, &up, before).await;
    // Written on the master (and replicated, read-only, to the replica).
    assert!(s.master.cli(&["ROLE"]).starts_with("master"));
    assert!(s.replica.cli(&["ROLE"]).starts_with("slave"));
    let on_master = counters(&s.master, "{sent:sent-limit:*");
    assert_eq!(on_master, vec!["50"]);
    assert_every_key_expires(&s.master, "sent", |_| 2 * DAY_MS);
}

/// Beyond the list: after a Sentinel failover the gateway re-resolves the master (the
/// old one turns read-only) and limits exactly on the new one, with the state it replicated.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_sentinel_failover_moves_the_gateway_to_the_new_master() {
    let s = RedisSentinel::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis_sentinel, sentinel: {{ master_name: {MASTER_NAME}, nodes: [\"{}\"] }}, key_prefix: sf, timeout: 2s, on_error: deny }}\n{}{}",
        s.sentinel_url(),
        up.upstreams_yaml(),
        routes_with_own_limit(&[
            ("before".into(), "before".into(), "sliding_window", 50, "24h"),
            ("after".into(), "after".into(), "sliding_window", 50, "24h"),
            ("probe".into(), "probe".into(), "sliding_window", 100_000, "24h"),
        ])
    );
    let gw = Gateway::start_named("gw", &yaml, &[], &[]).await;
    clear_of_window_boundary(DAY_S, 60).await;
    let before = up.requests().await;
    let t = blast(&[gw.url("/before")], 10, 10).await;
    assert_exact("before the failover", &t, 100, 50, &up, before).await;

    let replica_port = s.replica.port.to_string();
    let every = Duration::from_millis(100);
    eventually("replica in sync", Duration::from_secs(20))
        .every(every)
        .holds(|| s.replica.replica_synced())
        .await;
    eventually("sentinel knows the replica", Duration::from_secs(20))
        .every(every)
        .holds(|| {
            s.cli(&["SENTINEL", "REPLICAS", MASTER_NAME])
                .contains(&replica_port)
        })
        .await;
    assert_eq!(s.cli(&["SENTINEL", "FAILOVER", MASTER_NAME]), "OK");
    eventually("sentinel names the new master", Duration::from_secs(30))
        .every(every)
        .holds(|| s.names_master(s.replica.port))
        .await;
    eventually("the old master is a replica", Duration::from_secs(30))
        .every(every)
        .holds(|| s.master.has_role("slave"))
        .await;
    assert!(s.replica.cli(&["ROLE"]).starts_with("master"));

    // The gateway finds the new master (503s from `on_error: deny` meanwhile are fine).
    let c = client();
    let start = Instant::now();
    let probe = gw.url("/probe");
    eventually(
        "the gateway reaches the new master within 30 s",
        Duration::from_secs(30),
    )
    .holds_async(|| {
        let (c, probe) = (&c, &probe);
        async move {
            let r = get(c, probe, &[]).await;
            if r.status != 200 {
                assert_eq!(r.status, 503, "{r:#?}");
            }
            r.status == 200
        }
    })
    .await;
    eprintln!(
        "the gateway used the new master {:?} after the failover",
        start.elapsed()
    );

    // The counter written before the failover was replicated: still exhausted.
    let before = up.requests().await;
    let t = blast(&[gw.url("/before")], 2, 5).await;
    assert_exact("before-limit after the failover", &t, 10, 0, &up, before).await;
    // A fresh limit: exact on the new master, written there.
    let before = up.requests().await;
    let t = blast(&[gw.url("/after")], 10, 10).await;
    assert_exact("after the failover", &t, 100, 50, &up, before).await;
    let on_new_master = counters(&s.replica, "{sf:after:*");
    assert_eq!(on_new_master, vec!["50"]);
}

/// `rediss://`: the gateway talks TLS to a redis-server with a TLS port (a self-signed
/// certificate made here with the `openssl` command; `#insecure` skips verification of it) and
/// limits exactly. The counters are read back over the server's plain port.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rediss_tls_url_limits_exactly() {
    let certs = TempDir::new().expect("tempdir");
    let (cert, key) = (certs.path().join("cert.pem"), certs.path().join("key.pem"));
    let out = Command::new("openssl")
        .args([
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
        ])
        .args([
            "-subj",
            "/CN=127.0.0.1",
            "-addext",
            "subjectAltName=IP:127.0.0.1",
        ])
        .arg("-keyout")
        .arg(&key)
        .arg("-out")
        .arg(&cert)
        .output()
        .expect("the openssl command is needed: apt-get install -y openssl");
    assert!(
        out.status.success(),
        "openssl: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let tls_port = free_port();
    let (cert_s, key_s) = (cert.display().to_string(), key.display().to_string());
    let redis = RedisServer::start_with(&[
        "--tls-port",
        &tls_port.to_string(),
        "--tls-cert-file",
        &cert_s,
        "--tls-key-file",
        &key_s,
        "--tls-ca-cert-file",
        &cert_s,
        "--tls-auth-clients",
        "no",
    ]);
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"rediss://127.0.0.1:{tls_port}/#insecure\", key_prefix: tls, timeout: 5s, on_error: deny }}\n{}{}",
        up.upstreams_yaml(),
        routes_with_own_limit(&[("x".into(), "tls-limit".into(), "sliding_window", 20, "24h")])
    );
    let gw = Gateway::start_named("tls", &yaml, &[], &[]).await;
    gw.wait_store("ok", Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let before = up.requests().await;
    let t = blast(&[gw.url("/x")], 5, 10).await;
    assert_exact("rediss", &t, 50, 20, &up, before).await;
    assert_eq!(counters(&redis, "{tls:tls-limit:*"), vec!["20"]);
}
