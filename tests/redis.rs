//! Redis integration tests: real `tollgate` gateway processes sharing real `redis-server`
//! processes (single instance, 3-master cluster, master + replica + sentinel), in front of
//! the real demo upstream, everything on loopback.
//!
//! What is checked (issue 3, "Tests that must exist and pass"):
//! exactness across two gateway instances for every algorithm, all-or-nothing across limits,
//! clock skew between gateways (one under libfaketime), a TTL on every key, NOSCRIPT after
//! `SCRIPT FLUSH` and after a Redis restart, `/readyz` following Redis, Redis Cluster (exact,
//! no CROSSSLOT) and Sentinel (plus a Sentinel failover).
//!
//! The exactness configs set `store.timeout: 5s` and `on_error: deny`: a store call that fails
//! shows up as a 503 instead of an admitted, uncounted request (the defaults, 25 ms and
//! `allow`, fail open under the load of these tests on a small machine).
//!
//! Every process is killed by PID when its guard drops, also when a test panics. Every loop is
//! bounded in count and time. A missing `redis-server` or `faketime` fails, naming what to
//! install.

mod common;
mod redis_server;

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{clear_of_window_boundary, client_builder, free_port, Gateway, Upstream};
use redis_server::{cli, RedisCluster, RedisSentinel, RedisServer, MASTER_NAME};
use tempfile::TempDir;
use tollgate::store::CounterKey;

const ALGORITHMS: [&str; 5] = [
    "sliding_window",
    "fixed_window",
    "sliding_log",
    "token_bucket",
    "gcra",
];

const DAY_S: u64 = 86_400;
const DAY_MS: i64 = 86_400_000;

/// Upper bound of a whole load run (every request also has its own 20 s timeout).
const RUN_TIMEOUT: Duration = Duration::from_secs(90);

/// The environment that runs a process under libfaketime with `offset` (e.g. `+10m`). The
/// library is preloaded directly (not through the `faketime` wrapper, which forks: killing the
/// wrapper by PID would leave the gateway running).
fn faketime_env(offset: &str) -> Vec<(&'static str, &str)> {
    const INSTALL: &str = "libfaketime is needed for the clock-skew test: `apt-get install -y faketime` (or run scripts/setup.sh)";
    let found = Command::new("faketime")
        .args(["-f", "+0", "true"])
        .status()
        .unwrap_or_else(|e| panic!("cannot run faketime: {e}. {INSTALL}"));
    assert!(found.success(), "`faketime -f +0 true` failed. {INSTALL}");
    let candidates = [
        "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/aarch64-linux-gnu/faketime/libfaketimeMT.so.1",
        "/usr/lib/faketime/libfaketimeMT.so.1",
        "/usr/local/lib/faketime/libfaketimeMT.so.1",
        "/usr/lib64/faketime/libfaketimeMT.so.1",
    ];
    let lib = candidates
        .iter()
        .find(|p| std::path::Path::new(p).exists())
        .unwrap_or_else(|| panic!("libfaketimeMT.so.1 not found in {candidates:?}. {INSTALL}"));
    vec![
        ("LD_PRELOAD", *lib),
        ("FAKETIME", offset),
        // Only the wall clock moves; timers keep their monotonic clock.
        ("FAKETIME_DONT_FAKE_MONOTONIC", "1"),
    ]
}

// ---------------------------------------------------------------------------------------
// Load.
// ---------------------------------------------------------------------------------------

/// Responses by status (0 = transport error), plus a few samples of anything unexpected.
#[derive(Debug, Default, Clone)]
struct Tally {
    by_status: BTreeMap<u16, u64>,
    /// Per target (index into the target list): responses by status.
    per_target: Vec<BTreeMap<u16, u64>>,
    unexpected: Vec<String>,
}

fn statuses(pairs: &[(u16, u64)]) -> BTreeMap<u16, u64> {
    pairs.iter().copied().filter(|(_, n)| *n > 0).collect()
}

/// `conns` tasks, each with its own client holding one keep-alive connection, task `i` pinned
/// to `targets[i % targets.len()]`, each sending `per_conn` GETs with `headers(i)` one after
/// the other. `progress` counts answered requests.
async fn blast_with(
    targets: &[String],
    conns: usize,
    per_conn: usize,
    headers: impl Fn(usize) -> Vec<(String, String)>,
    progress: Option<Arc<AtomicU64>>,
) -> Tally {
    let mut set = tokio::task::JoinSet::new();
    for i in 0..conns {
        let target = i % targets.len();
        let url = targets[target].clone();
        let hs = headers(i);
        let progress = progress.clone();
        set.spawn(async move {
            let client = client_builder()
                .pool_max_idle_per_host(1)
                .build()
                .expect("client");
            let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
            let mut unexpected = Vec::new();
            for _ in 0..per_conn {
                let mut req = client.get(&url);
                for (k, v) in &hs {
                    req = req.header(k, v);
                }
                let status = match req.send().await {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let body = r.bytes().await.map(|b| b.to_vec()).unwrap_or_default();
                        if s != 200 && s != 429 && unexpected.len() < 3 {
                            unexpected
                                .push(format!("{url}: {s} {}", String::from_utf8_lossy(&body)));
                        }
                        s
                    }
                    Err(e) => {
                        if unexpected.len() < 3 {
                            unexpected.push(format!("{url}: {e:?}"));
                        }
                        0
                    }
                };
                *by_status.entry(status).or_default() += 1;
                if let Some(p) = &progress {
                    p.fetch_add(1, Ordering::SeqCst);
                }
            }
            (target, by_status, unexpected)
        });
    }
    let mut tally = Tally {
        per_target: vec![BTreeMap::new(); targets.len()],
        ..Tally::default()
    };
    let all = async {
        while let Some(r) = set.join_next().await {
            let (target, by_status, unexpected) = r.expect("load task panicked");
            for (s, n) in by_status {
                *tally.by_status.entry(s).or_default() += n;
                *tally.per_target[target].entry(s).or_default() += n;
            }
            if tally.unexpected.len() < 10 {
                tally.unexpected.extend(unexpected);
            }
        }
    };
    tokio::time::timeout(RUN_TIMEOUT, all)
        .await
        .unwrap_or_else(|_| panic!("load run did not finish within {RUN_TIMEOUT:?}"));
    tally
}

async fn blast(targets: &[String], conns: usize, per_conn: usize) -> Tally {
    blast_with(targets, conns, per_conn, |_| Vec::new(), None).await
}

/// Assert the exact outcome of a run: `admitted` 200s, the rest 429s, nothing else, and the
/// upstream counted exactly `admitted` more requests.
async fn assert_exact(
    what: &str,
    tally: &Tally,
    total: u64,
    admitted: u64,
    up: &Upstream,
    before: u64,
) {
    let upstream = up.requests().await - before;
    assert_eq!(
        tally.by_status,
        statuses(&[(200, admitted), (429, total - admitted)]),
        "{what}: expected exactly {admitted} × 200 and {} × 429; per gateway {:?}; samples {:#?}",
        total - admitted,
        tally.per_target,
        tally.unexpected
    );
    assert_eq!(
        upstream, admitted,
        "{what}: the upstream counted {upstream} requests, {admitted} were admitted"
    );
}

// ---------------------------------------------------------------------------------------
// Redis inspection.
// ---------------------------------------------------------------------------------------

/// Keys matching `pattern` on the server at `port`.
fn scan(port: u16, pattern: &str) -> Vec<String> {
    // (redis-cli 7.0 has no `--count` option: with it, it prints nothing and exits 1.)
    let mut keys: Vec<String> = cli(port, &["--scan", "--pattern", pattern])
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_string)
        .collect();
    keys.sort();
    keys
}

/// The counter of every key matching `pattern`, in key order: a string's value; for a
/// sliding-window hash (`n0 c0 n1 c1`: window number and count, by the number's parity), the
/// count of its current window, the one with the higher number.
fn counters(port: u16, pattern: &str) -> Vec<String> {
    scan(port, pattern)
        .into_iter()
        .map(|k| match cli(port, &["TYPE", &k]).as_str() {
            "string" => cli(port, &["GET", &k]),
            "hash" => {
                let all = cli(port, &["HGETALL", &k]);
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
fn dump(port: u16, pattern: &str) -> BTreeMap<String, String> {
    scan(port, pattern)
        .into_iter()
        .map(|k| {
            let v = match cli(port, &["TYPE", &k]).as_str() {
                "string" => cli(port, &["GET", &k]),
                "hash" => cli(port, &["HGETALL", &k]),
                "zset" => cli(port, &["ZRANGE", &k, "0", "-1", "WITHSCORES"]),
                other => panic!("key {k} has unexpected type {other}"),
            };
            (k, v)
        })
        .collect()
}

/// The base key of a limit with key parts `parts` (see `RedisStore::base_key`).
fn base_key(prefix: &str, limit: &str, parts: &[&[u8]]) -> String {
    let key = CounterKey::new(limit, parts.iter().copied());
    format!("{{{prefix}:{limit}:{}}}", key.hex())
}

/// `errorstat_NOSCRIPT` from `INFO errorstats` (0 if none yet).
fn noscript_errors(port: u16) -> u64 {
    let info = cli(port, &["INFO", "errorstats"]);
    info.lines()
        .find_map(|l| l.strip_prefix("errorstat_NOSCRIPT:count="))
        .map(|n| n.trim().parse().expect("count"))
        .unwrap_or(0)
}

/// Every key on the server with its TTL in ms (`PTTL`). (Not `RedisServer::keys_with_ttl`,
/// which passes `--count` to `redis-cli --scan` and so finds no key with redis-cli 7.0.)
fn keys_with_ttl(port: u16) -> Vec<(String, i64)> {
    scan(port, "*")
        .into_iter()
        .map(|k| {
            let ttl = cli(port, &["PTTL", &k]);
            let ttl = ttl.parse().unwrap_or_else(|_| panic!("PTTL {k}: {ttl:?}"));
            (k, ttl)
        })
        .collect()
}

/// Every key has a TTL (none is -1), each at most `max_ttl_ms(key)`; returns the keys.
fn assert_every_key_expires(
    port: u16,
    prefix: &str,
    max_ttl_ms: impl Fn(&str) -> i64,
) -> Vec<String> {
    let keys = keys_with_ttl(port);
    assert!(!keys.is_empty(), "no key at all on port {port}");
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

fn upstreams(up: &Upstream) -> String {
    format!("upstreams: {{ backend: [\"{}\"] }}\n", up.addr)
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
        upstreams(&up),
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
        let tally = blast(&[a.url(&path), b.url(&path)], 200, 50).await;
        assert_exact(alg, &tally, 10_000, 1000, &up, before).await;
        // Both gateways answered their 5,000 requests.
        for (i, t) in tally.per_target.iter().enumerate() {
            assert_eq!(t.values().sum::<u64>(), 5000, "gateway {i}: {t:?}");
        }
        eprintln!(
            "{alg}: 10,000 requests in {:?}, per gateway {:?}",
            started.elapsed(),
            tally.per_target
        );
    }
    // 4 (after a run). Every key written has an expiry, at most two windows away.
    let keys = assert_every_key_expires(redis.port, "exact", |_| 2 * DAY_MS);
    for alg in ALGORITHMS {
        assert!(
            keys.iter()
                .any(|k| k.starts_with(&format!("{{exact:exact-{alg}:"))),
            "no key of {alg} in {keys:?}"
        );
    }
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
        upstreams(&up)
    );
    let gw = Gateway::start_named("aon", &yaml, &[], &[]).await;
    let c = common::client();
    for alg in ALGORITHMS {
        // Windows aligned to the epoch: 10 s clear of a minute boundary, hence of an hour
        // boundary. (token_bucket and gcra refill one token per 6 s at 10/1m; all of this
        // takes well under a second.)
        if matches!(alg, "sliding_window" | "fixed_window") {
            clear_of_window_boundary(60, 10).await;
        }
        let before = up.requests().await;
        for i in 0..3u64 {
            let r = common::get(&c, &gw.url(&format!("/both/{alg}")), &[]).await;
            assert_eq!(r.status, 200, "{alg} request {i}: {r:#?}");
            // The hour limit is the most restrictive one.
            assert_eq!(
                r.header("ratelimit-policy"),
                format!("\"hour-{alg}\";q=3;w=3600")
            );
            assert_eq!(r.header_u64("x-ratelimit-remaining"), 2 - i, "{alg}");
        }
        let pattern = format!("{{aon:minute-{alg}:*");
        let minute_before = dump(redis.port, &pattern);
        assert!(!minute_before.is_empty(), "{alg}: no minute key");
        if matches!(alg, "sliding_window" | "fixed_window") {
            // One counter, of the current window: 3.
            assert_eq!(
                counters(redis.port, &pattern),
                vec!["3"],
                "{alg}: {minute_before:?}"
            );
        }
        for i in 0..5 {
            let r = common::get(&c, &gw.url(&format!("/both/{alg}")), &[]).await;
            assert_eq!(r.status, 429, "{alg} denied request {i}: {r:#?}");
            assert_eq!(r.json()["policy"], format!("hour-{alg}"), "{alg}");
        }
        let minute_after = dump(redis.port, &pattern);
        assert_eq!(
            minute_after, minute_before,
            "{alg}: requests denied by the hour limit changed the minute counter"
        );
        // The minute limit alone: 3 used before, this one is the 4th.
        let r = common::get(&c, &gw.url(&format!("/minute/{alg}")), &[]).await;
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
        upstreams(&up),
        routes_with_own_limit(&entries)
    );
    let a = Gateway::start_named("A (true clock)", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B (+10 min)", &yaml, &[], &skew_env).await;
    let c = common::client();
    for alg in ALGORITHMS {
        if matches!(alg, "sliding_window" | "fixed_window") {
            clear_of_window_boundary(60, 10).await;
        }
        let path = format!("/{alg}");
        let before = up.requests().await;
        // B alone takes half of the limit, then A and B race for the rest.
        let first = blast(&[b.url(&path)], 10, 5).await;
        assert_eq!(first.by_status, statuses(&[(200, 50)]), "{alg}: {first:?}");
        let rest = blast(&[a.url(&path), b.url(&path)], 40, 25).await;
        assert_exact(alg, &rest, 1000, 50, &up, before + 50).await;

        // faketime really moved B's clock (its `Date` header is 600 s ahead), yet both report
        // the same X-RateLimit-Reset, because resets are computed on Redis's clock.
        let ra = common::get(&c, &a.url(&path), &[]).await;
        let rb = common::get(&c, &b.url(&path), &[]).await;
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
        let date = |r: &common::Resp| {
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
        upstreams(&up)
    );
    let gw = Gateway::start_named("ttl", &yaml, &[], &[]).await;
    let c = common::client();
    for alg in ALGORITHMS {
        for i in 0..12 {
            let user = format!("u{}", i % 2);
            let r = common::get(&c, &gw.url(&format!("/own/{alg}")), &[("x-user", &user)]).await;
            assert!(r.status == 200 || r.status == 429, "{r:#?}");
        }
    }
    clear_of_window_boundary(600, 5).await;
    let mut all = BTreeMap::new();
    for _ in 0..12 {
        let r = common::get(&c, &gw.url("/all"), &[]).await;
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
    let keys = assert_every_key_expires(redis.port, "ttl", bound);
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
    let left = scan(redis.port, "{ttl:short-*");
    assert!(left.is_empty(), "keys outlived their state: {left:?}");
    assert_every_key_expires(redis.port, "ttl", bound);
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
        upstreams(&up),
        routes_with_own_limit(&entries)
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    const TOTAL: u64 = 2000;
    for alg in ALGORITHMS {
        clear_of_window_boundary(DAY_S, 30).await;
        let before = up.requests().await;
        let noscript_before = noscript_errors(redis.port);
        let progress = Arc::new(AtomicU64::new(0));
        // Flush the script cache four times while requests are in flight.
        let flusher = {
            let (progress, port) = (progress.clone(), redis.port);
            std::thread::spawn(move || {
                let deadline = Instant::now() + RUN_TIMEOUT;
                let mut flushed_at = Vec::new();
                for pct in [10, 30, 50, 70] {
                    while progress.load(Ordering::SeqCst) < TOTAL * pct / 100 {
                        assert!(Instant::now() < deadline, "the run stalled");
                        std::thread::sleep(Duration::from_millis(1));
                    }
                    assert_eq!(cli(port, &["SCRIPT", "FLUSH"]), "OK");
                    flushed_at.push(progress.load(Ordering::SeqCst));
                }
                flushed_at
            })
        };
        let path = format!("/{alg}");
        let tally = blast_with(
            &[a.url(&path), b.url(&path)],
            40,
            (TOTAL / 40) as usize,
            |_| Vec::new(),
            Some(progress.clone()),
        )
        .await;
        let flushed_at = flusher.join().expect("flusher");
        assert!(
            flushed_at.iter().all(|&p| p < TOTAL),
            "{alg}: a flush came after the run ({flushed_at:?})"
        );
        assert_exact(alg, &tally, TOTAL, 300, &up, before).await;
        let noscript = noscript_errors(redis.port) - noscript_before;
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
        upstreams(&up)
    );
    let gw = Gateway::start_named("gw", &yaml, &[], &[]).await;
    gw.wait_readyz(200, Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let url = gw.url("/x");
    let caller_a = |_| vec![("x-k".to_string(), "a".to_string())];

    // Caller a exhausts its limit.
    let before = up.requests().await;
    let t = blast_with(std::slice::from_ref(&url), 3, 10, caller_a, None).await;
    assert_exact("caller a before the restart", &t, 30, 20, &up, before).await;

    // Caller b keeps sending while Redis is killed (-9) and started again, empty.
    let stop = Arc::new(AtomicBool::new(false));
    let progress = Arc::new(AtomicU64::new(0));
    let mut background = tokio::task::JoinSet::new();
    for _ in 0..8 {
        let (stop, progress, url) = (stop.clone(), progress.clone(), url.clone());
        background.spawn(async move {
            let client = client_builder().build().expect("client");
            let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
            let mut samples = Vec::new();
            for _ in 0..5_000 {
                if stop.load(Ordering::SeqCst) {
                    break;
                }
                let s = match client.get(&url).header("x-k", "b").send().await {
                    Ok(r) => {
                        let s = r.status().as_u16();
                        let body = r.text().await.unwrap_or_default();
                        if s != 200 && s != 429 && samples.len() < 3 {
                            samples.push(format!("{s} {body}"));
                        }
                        s
                    }
                    Err(e) => {
                        samples.push(format!("{e:?}"));
                        0
                    }
                };
                *by_status.entry(s).or_default() += 1;
                progress.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
            (by_status, samples)
        });
    }
    let wait_progress = |at_least: u64| {
        let progress = progress.clone();
        async move {
            let deadline = Instant::now() + Duration::from_secs(30);
            while progress.load(Ordering::SeqCst) < at_least {
                assert!(Instant::now() < deadline, "background requests stalled");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }
    };
    wait_progress(100).await;
    let old_pid = redis.pid();
    redis.restart();
    assert_ne!(redis.pid(), old_pid);
    let at_restart = progress.load(Ordering::SeqCst);
    // The gateway reconnects (and reloads the script) by itself.
    gw.wait_readyz(200, Duration::from_secs(15)).await;
    wait_progress(at_restart + 200).await;
    stop.store(true, Ordering::SeqCst);
    let mut by_status: BTreeMap<u16, u64> = BTreeMap::new();
    let mut samples = Vec::new();
    let joined = tokio::time::timeout(RUN_TIMEOUT, async {
        while let Some(r) = background.join_next().await {
            let (s, sm) = r.expect("background task");
            for (k, v) in s {
                *by_status.entry(k).or_default() += v;
            }
            samples.extend(sm);
        }
    })
    .await;
    assert!(joined.is_ok(), "background requests did not stop");
    assert!(
        by_status.keys().all(|s| *s == 200 || *s == 429),
        "client-visible errors across the restart: {by_status:?} {samples:#?}"
    );
    assert!(
        by_status.get(&429).copied().unwrap_or(0) > 0,
        "{by_status:?}"
    );
    eprintln!("across the restart: {by_status:?}");

    // Counting resumes once the gateway's store calls succeed again (after the circuit
    // breaker's cooldown, if it opened): until then requests fail open, without rate-limit
    // headers. A third caller probes, so caller a's counter is untouched.
    let c = common::client();
    let resuming = Instant::now();
    let mut probes = 0;
    loop {
        let r = common::get(&c, &url, &[("x-k", "probe")]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        probes += 1;
        if r.opt_header("x-ratelimit-remaining").is_some() {
            assert_eq!(r.header_u64("x-ratelimit-remaining"), 19, "{r:#?}");
            break;
        }
        assert!(
            resuming.elapsed() < Duration::from_secs(15),
            "the gateway did not count again within 15 s of Redis answering; /readyz: {}",
            gw.readyz_status().await.1
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    eprintln!(
        "counting resumed {:?} after /readyz turned 200 ({probes} probes)",
        resuming.elapsed()
    );

    // The new Redis is empty: caller a gets exactly its limit again, no more.
    assert!(scan(redis.port, "*")
        .iter()
        .all(|k| k.starts_with("{restart:")));
    let before = up.requests().await;
    let t = blast_with(std::slice::from_ref(&url), 3, 10, caller_a, None).await;
    assert_exact("caller a after the restart", &t, 30, 20, &up, before).await;
}

// ---------------------------------------------------------------------------------------
// 6. /readyz follows Redis.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_is_503_while_redis_is_down_and_200_again_after_it_returns() {
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ key_prefix: ready, timeout: 200ms }}\n{}\
         routes:\n  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}\n",
        upstreams(&up)
    );
    let gw = Gateway::start_named("gw", &yaml, &["--redis-url", &redis.url()], &[]).await;
    let body = gw.wait_readyz(200, Duration::from_secs(10)).await;
    assert_eq!(body["store"], "ok", "{body}");
    let (status, body) = gw.readyz_status().await;
    assert_eq!((status, &body["status"]), (200, &"ready".into()), "{body}");

    redis.kill();
    let body = gw.wait_readyz(503, Duration::from_secs(10)).await;
    assert_eq!(body["store"], "unreachable", "{body}");
    assert_eq!(body["status"], "not ready", "{body}");
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
        upstreams(&up)
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    for g in [&a, &b] {
        let body = g.wait_readyz(200, Duration::from_secs(10)).await;
        assert_eq!(body["store"], "ok", "{body}");
    }
    clear_of_window_boundary(DAY_S, 60).await;

    for alg in ALGORITHMS {
        let before = up.requests().await;
        let path = format!("/{alg}");
        let tally = blast(&[a.url(&path), b.url(&path)], 40, 50).await;
        assert_exact(&format!("cluster {alg}"), &tally, 2000, 200, &up, before).await;
        // All of a limit's keys are on one node (one hash tag, one slot).
        let holders: Vec<usize> = cluster
            .nodes
            .iter()
            .enumerate()
            .filter(|(_, n)| !scan(n.port, &format!("{{cl:cl-{alg}:*")).is_empty())
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
            .map(|c| slot(&base_key("cl", per_key, &[c.as_bytes()])))
            .collect();
        assert!(
            slots.iter().any(|s| *s != g),
            "{per_key} {slots:?} and {global} {g} share a slot: the test proves nothing"
        );
        eprintln!("slots: {global} {g}, {per_key} of k1, k2, k3 {slots:?}");
    }
    let api_key = |i: usize| vec![("x-api-key".to_string(), callers[i % 3].to_string())];

    // a: the per-caller limits (10 each) decide; the global one counts only what they admit.
    let before = up.requests().await;
    let t = blast_with(
        &[a.url("/multi-a"), b.url("/multi-a")],
        6,
        10,
        api_key,
        None,
    )
    .await;
    assert_exact("cluster multi-slot a", &t, 60, 30, &up, before).await;
    let global_a: Vec<String> = cluster
        .nodes
        .iter()
        .flat_map(|n| counters(n.port, "{cl:global-a:*"))
        .collect();
    assert_eq!(global_a, vec!["30"], "the global counter of multi-a");

    // b: the global limit (50) decides: 3 callers × 40 requests, at most 30 each.
    let before = up.requests().await;
    let t = blast_with(
        &[a.url("/multi-b"), b.url("/multi-b")],
        12,
        10,
        api_key,
        None,
    )
    .await;
    assert_exact("cluster multi-slot b", &t, 120, 50, &up, before).await;
    // The limits of multi-b live on more than one node.
    let holders = cluster
        .nodes
        .iter()
        .filter(|n| {
            !scan(n.port, "{cl:per-key-b:*").is_empty()
                || !scan(n.port, "{cl:global-b:*").is_empty()
        })
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
        upstreams(&up),
        routes_with_own_limit(&[("x".into(), "sent-limit".into(), "sliding_window", 50, "24h")])
    );
    let a = Gateway::start_named("A", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B", &yaml, &[], &[]).await;
    a.wait_readyz(200, Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let before = up.requests().await;
    let t = blast(&[a.url("/x"), b.url("/x")], 20, 25).await;
    assert_exact("sentinel", &t, 500, 50, &up, before).await;
    // Written on the master (and replicated, read-only, to the replica).
    assert!(s.master.cli(&["ROLE"]).starts_with("master"));
    assert!(s.replica.cli(&["ROLE"]).starts_with("slave"));
    let on_master = counters(s.master.port, "{sent:sent-limit:*");
    assert_eq!(on_master, vec!["50"]);
    assert_every_key_expires(s.master.port, "sent", |_| 2 * DAY_MS);
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
        upstreams(&up),
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

    // Bounded polling of a condition on the Redis processes.
    let wait_for = |what: &str, within: Duration, cond: &dyn Fn() -> bool| {
        let start = Instant::now();
        while !cond() {
            assert!(start.elapsed() < within, "{what}: not within {within:?}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let replica_port = s.replica.port.to_string();
    wait_for("replica in sync", Duration::from_secs(20), &|| {
        s.replica
            .cli(&["INFO", "replication"])
            .contains("master_link_status:up")
    });
    wait_for(
        "sentinel knows the replica",
        Duration::from_secs(20),
        &|| cli(s.sentinel_port, &["SENTINEL", "REPLICAS", MASTER_NAME]).contains(&replica_port),
    );
    assert_eq!(
        cli(s.sentinel_port, &["SENTINEL", "FAILOVER", MASTER_NAME]),
        "OK"
    );
    wait_for(
        "sentinel names the new master",
        Duration::from_secs(30),
        &|| {
            cli(
                s.sentinel_port,
                &["SENTINEL", "GET-MASTER-ADDR-BY-NAME", MASTER_NAME],
            )
            .contains(&replica_port)
        },
    );
    wait_for(
        "the old master is a replica",
        Duration::from_secs(30),
        &|| s.master.cli(&["ROLE"]).starts_with("slave"),
    );
    assert!(s.replica.cli(&["ROLE"]).starts_with("master"));

    // The gateway finds the new master (503s from `on_error: deny` meanwhile are fine).
    let c = common::client();
    let start = Instant::now();
    loop {
        let r = common::get(&c, &gw.url("/probe"), &[]).await;
        if r.status == 200 {
            break;
        }
        assert_eq!(r.status, 503, "{r:#?}");
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "the gateway did not reach the new master within 30 s; /readyz: {}",
            gw.readyz_status().await.1
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
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
    let on_new_master = counters(s.replica.port, "{sf:after:*");
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
        upstreams(&up),
        routes_with_own_limit(&[("x".into(), "tls-limit".into(), "sliding_window", 20, "24h")])
    );
    let gw = Gateway::start_named("tls", &yaml, &[], &[]).await;
    gw.wait_readyz(200, Duration::from_secs(10)).await;
    clear_of_window_boundary(DAY_S, 30).await;
    let before = up.requests().await;
    let t = blast(&[gw.url("/x")], 5, 10).await;
    assert_exact("rediss", &t, 50, 20, &up, before).await;
    assert_eq!(counters(redis.port, "{tls:tls-limit:*"), vec!["20"]);
}
