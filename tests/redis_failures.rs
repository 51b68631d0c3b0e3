//! Redis failure handling (issue 4, "Tests that must exist and pass"), with real processes and
//! real faults: `tollgate` gateway processes in front of the real demo upstream, real
//! `redis-server` / `redis-sentinel` processes, and faults made for real: `kill -9`,
//! `SIGSTOP`/`SIGCONT`, a restart on the same port (empty data set and script cache), a
//! Sentinel failover, and latency injected by a small TCP proxy (`common::LatencyProxy`). The
//! harness (processes, load drivers, faults, `eventually`) is `tests/common/`; this file holds
//! the tests and the few helpers that only they need.
//!
//! 1. Redis killed under load: `allow` limits pass everything, `deny` limits answer 503 (the
//!    upstream sees nothing), `local` limits admit exactly `limit × local_share`; the breaker
//!    opens after exactly the configured number of failures and every later call is rejected
//!    by it (exact counts in `/readyz`).
//! 2. Redis stopped (SIGSTOP): no request waits longer than the deadline plus a margin; once
//!    the breaker is open the limit check adds no Redis wait; SIGCONT and recovery.
//! 3. Redis restarted on the same port: limiting against Redis again, exactly, within
//!    cooldown + 1 s (asserted with a 2 s noise margin on top).
//! 4. Redis slower than the deadline (TCP proxy delaying every chunk by 100 ms): requests follow
//!    their policy after the deadline instead of waiting.
//! 5. Sentinel failover (master killed): the gateway follows the new master; the degraded window
//!    is measured and printed.
//! 6. A restart that loses the script cache mid-run: no client-visible error.
//! 7. Sentinel failover away from a master that is stopped (SIGSTOP), not dead: the gateway
//!    must follow the new master too.
//! 8. The local fallback limiter starts empty when each outage starts (as docs/stores.md says).
//! 9. A connection whose replies stopped for good, without being closed (the TCP proxy stops
//!    relaying on it): requests follow their policy at the deadline, and the gateway replaces
//!    the connection once it has been silent for 5 s, so Redis decides again.
//!
//! Test 1 drives the kill with one connection sending back to back (then bursts of 8
//! connections once the breaker is open): with several calls in flight at the kill, each of them
//! fails and counts, so the number of failures would not be exact.
//!
//! The tests run one at a time (a shared async mutex): they measure latencies on small, noisy
//! machines. Timing assertions have generous margins; measured figures are printed. Every
//! process is killed by PID when its guard drops, also when a test panics; the proxy's tasks are
//! aborted when it drops. Every loop is bounded in count and time. A missing `redis-server`,
//! `redis-sentinel` or `redis-cli` fails, naming what to install.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use common::faults::LatencyProxy;
use common::gateway::{Gateway, StoreStatus};
use common::http::{client, get, Resp, DEGRADED, QUOTA_EXCEEDED, REDUCED_CAPACITY};
use common::load::{by_status, ms, Driver, Latency, Load, Reply};
use common::process::{count, loopback};
use common::redis::{base_key, RedisSentinel, RedisServer, MASTER_NAME};
use common::upstream::Upstream;
use common::wait::eventually;

/// The tests measure latencies: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

const POLICY_ALLOW: &str = "store-unavailable; policy=allow";
const POLICY_DENY: &str = "store-unavailable; policy=deny";
const POLICY_LOCAL: &str = "store-unavailable; policy=local";
/// What the gateway logs (at warn) when the breaker opens.
const BREAKER_OPENED: &str = "redis circuit breaker opened";
/// Margin on every latency bound: these 2-core machines are noisy.
const LATENCY_MARGIN: Duration = Duration::from_millis(250);
/// Margin on recovery-time bounds.
const RECOVERY_MARGIN: Duration = Duration::from_secs(2);
/// Upper bound of any batch of requests.
const BATCH_TIMEOUT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------
// Requests and what they say.
// ---------------------------------------------------------------------------------------

fn degraded(r: &Resp) -> Option<&str> {
    r.opt_header(DEGRADED)
}

/// GET `url` and time it. Panics (naming the URL) on a transport error.
async fn timed_get(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> (Resp, Duration) {
    let start = Instant::now();
    let r = get(c, url, headers).await;
    (r, start.elapsed())
}

/// GET `url`, which must answer 200: the response if it was decided by Redis (not
/// degraded), else `None`.
async fn not_degraded(c: &reqwest::Client, url: &str, headers: &[(&str, &str)]) -> Option<Resp> {
    let r = get(c, url, headers).await;
    assert_eq!(r.status, 200, "{r:#?}");
    degraded(&r).is_none().then_some(r)
}

/// `conns` connections at once, each sending `per_conn` GETs with `headers` one after the
/// other; every reply, within [`BATCH_TIMEOUT`].
async fn burst(url: &str, headers: &[(&str, &str)], conns: usize, per_conn: usize) -> Vec<Reply> {
    let load = Load::new(url).conns(conns).within(BATCH_TIMEOUT);
    let load = headers.iter().fold(load, |l, (k, v)| l.header(k, v));
    load.run(per_conn).await
}

/// The latencies of `replies`.
fn latency<'a>(replies: impl IntoIterator<Item = &'a Reply>) -> Latency {
    Latency::of(&replies.into_iter().map(|r| r.latency).collect::<Vec<_>>())
}

/// `d` in whole milliseconds ("1234 ms"), or "(not seen)".
fn ms_or_not_seen(d: Option<Duration>) -> String {
    d.map_or("(not seen)".into(), |d| format!("{:.0} ms", ms(d)))
}

/// Light load on `url`: a request every 20 ms, each with a fresh counter (`x-k: drv-<n>`);
/// returned once it has recorded 10 requests.
async fn light_driver(url: &str) -> Driver {
    let driver = Load::new(url)
        .pace(Duration::from_millis(20))
        .headers(|_, n| vec![("x-k".into(), format!("drv-{n}"))])
        .start();
    driver
        .wait("10 requests", Duration::from_secs(20), |s| s.len() >= 10)
        .await;
    driver
}

/// `/readyz` twice in a row, with no request in between: both answers, and how many store
/// calls one `/readyz` makes (0, or 1 when its ping goes through the circuit breaker and so
/// counts in `failures` / `rejected_by_breaker`). `counter` picks the counter that moves.
async fn readyz_twice(
    gw: &Gateway,
    counter: impl Fn(&StoreStatus) -> u64,
) -> (StoreStatus, StoreStatus, u64) {
    let (_, a, _) = gw.store_status().await;
    let (_, b, body) = gw.store_status().await;
    let per_readyz = counter(&b) - counter(&a);
    assert!(
        per_readyz <= 1,
        "one /readyz made {per_readyz} store calls: {body}"
    );
    (a, b, per_readyz)
}

// ---------------------------------------------------------------------------------------
// Configs and what Redis holds.
// ---------------------------------------------------------------------------------------

/// The base key of limit `limit` for `x-k: <caller>`.
fn caller_key(prefix: &str, limit: &str, caller: &str) -> String {
    base_key(prefix, limit, &[caller.as_bytes()])
}

/// One route `/x` with one limit `name`: `limit` per hour per `x-k` header, exact
/// (`sliding_log`), failing open.
fn one_limit_route(name: &str, limit: u64) -> String {
    format!(
        "routes:\n  - {{ name: x, match: {{ path_prefix: /x }}, upstream: main, limits: [ \
         {{ name: {name}, key: [\"header:x-k\"], algorithm: sliding_log, limit: {limit}, window: 1h, on_error: allow }} ] }}\n"
    )
}

/// `caller` sends `total` requests to `url` over 3 connections: exactly `admitted` are 200,
/// the rest 429, none degraded; the upstream sees exactly `admitted` more requests.
async fn assert_exact_through_redis(
    what: &str,
    url: &str,
    caller: &str,
    total: usize,
    admitted: usize,
    up: &Upstream,
) {
    assert_eq!(total % 3, 0);
    let before = up.requests().await;
    let rs = burst(url, &[("x-k", caller)], 3, total / 3).await;
    let want = BTreeMap::from([(200, admitted as u64), (429, (total - admitted) as u64)]);
    assert_eq!(
        by_status(&rs),
        want,
        "{what}: expected exactly {admitted} × 200 then 429s"
    );
    for r in rs.iter().map(Reply::resp) {
        assert_eq!(
            degraded(r),
            None,
            "{what}: decided by Redis, not degraded: {r:#?}"
        );
        r.header("ratelimit");
        if r.status == 429 {
            assert!(r.header_u64("retry-after") >= 1, "{r:#?}");
            assert_eq!(r.json()["type"], QUOTA_EXCEEDED, "{r:#?}");
        }
    }
    let upstream = up.requests().await - before;
    assert_eq!(upstream, admitted as u64, "{what}: upstream count");
}

/// A gateway in front of `up` using the master that sentinel `s` names (key prefix `prefix`,
/// deadline `timeout`, breaker cooldown 1 s) with `one_limit_route(limit, 20)`; returned once
/// the replica has synced.
async fn sentinel_gateway(
    s: &RedisSentinel,
    up: &Upstream,
    prefix: &str,
    limit: &str,
    timeout: &str,
) -> Gateway {
    let yaml = format!(
        "store: {{ backend: redis_sentinel, sentinel: {{ master_name: {MASTER_NAME}, nodes: [\"{}\"] }}, key_prefix: {prefix}, timeout: {timeout}, breaker: {{ cooldown: 1s }} }}\n\
         upstreams: {{ main: [\"{}\"] }}\n{}",
        s.sentinel_url(),
        up.addr,
        one_limit_route(limit, 20)
    );
    let gw = Gateway::start(&yaml).await;
    s.wait_replica_synced();
    gw
}

// ---------------------------------------------------------------------------------------
// 1. kill -9 under load: allow / deny / local, and the breaker's exact counts.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_killed_under_load_each_limit_follows_its_policy_and_the_breaker_opens() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let main_up = Upstream::start().await;
    let login_up = Upstream::start().await;
    // The deadline is generous here: this test counts failures exactly, and a spurious
    // timeout on a busy machine would be one more.
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: k9, timeout: 500ms, local_share: 0.5, \
         breaker: {{ failures: 4, cooldown: 60s }} }}\n\
         upstreams: {{ main: [\"{}\"], login: [\"{}\"] }}\n\
         routes:\n\
         \x20 - {{ name: open, match: {{ path_prefix: /open }}, upstream: main, limits: [ {{ name: open-limit, key: [], limit: 1000000, window: 1h, on_error: allow }} ] }}\n\
         \x20 - {{ name: login, match: {{ path_prefix: /login }}, upstream: login, limits: [ {{ name: login-limit, key: [client_ip], limit: 1000000, window: 1h, on_error: deny }} ] }}\n\
         \x20 - {{ name: local, match: {{ path_prefix: /local }}, upstream: main, limits: [ {{ name: local-limit, key: [\"header:x-k\"], algorithm: sliding_log, limit: 10, window: 1h, on_error: local }} ] }}\n",
        redis.url(),
        main_up.addr,
        login_up.addr
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();

    // Redis up: every route answers from Redis, nothing degraded.
    for _ in 0..5 {
        let (r, _) = timed_get(&c, &gw.url("/open"), &[]).await;
        assert_eq!((r.status.as_u16(), degraded(&r)), (200, None), "{r:#?}");
        r.header("ratelimit");
    }
    for _ in 0..3 {
        let (r, _) = timed_get(&c, &gw.url("/login"), &[]).await;
        assert_eq!((r.status.as_u16(), degraded(&r)), (200, None), "{r:#?}");
    }
    for want in [9, 8, 7] {
        let (r, _) = timed_get(&c, &gw.url("/local"), &[("x-k", "warm")]).await;
        assert_eq!((r.status.as_u16(), degraded(&r)), (200, None), "{r:#?}");
        assert_eq!(r.header_u64("x-ratelimit-limit"), 10);
        assert_eq!(r.header_u64("x-ratelimit-remaining"), want);
    }
    login_up.reset().await;
    let (status, st, body) = gw.store_status().await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(
        st,
        StoreStatus {
            breaker: "closed".into(),
            failures: 0,
            rejected: 0,
            opened: 0
        },
        "{body}"
    );

    // One connection sends back to back while Redis is killed.
    let driver = Load::new(&gw.url("/open")).start();
    driver
        .wait("20 requests", Duration::from_secs(20), |s| s.len() >= 20)
        .await;
    let killed_at = Instant::now();
    redis.kill();
    driver
        .wait("30 degraded responses", Duration::from_secs(20), |s| {
            s.iter().filter(|x| x.header(DEGRADED).is_some()).count() >= 30
        })
        .await;
    let samples = driver.finish().await;
    let first_degraded = samples
        .iter()
        .position(|s| s.header(DEGRADED).is_some())
        .expect("a degraded response");
    for (i, s) in samples.iter().enumerate() {
        assert_eq!(s.status(), 200, "allow limit: request {i}: {s:?}");
        let ratelimit = s.header("ratelimit").is_some();
        if i < first_degraded {
            assert!(ratelimit, "request {i} was decided by Redis: {s:?}");
        } else {
            // The breaker stays open (60 s cooldown): every later answer is degraded too.
            assert_eq!(s.header(DEGRADED), Some(POLICY_ALLOW), "request {i}: {s:?}");
            assert!(!ratelimit, "failed open: no limit decided: {s:?}");
        }
    }
    let mut degraded_total = (samples.len() - first_degraded) as u64;
    let during = latency(&samples[first_degraded..]);
    println!(
        "kill -9: {} requests before the kill was seen, {} degraded after; first degraded answer {:.1} ms after the kill; degraded latency {during}",
        first_degraded,
        samples.len() - first_degraded,
        ms(samples[first_degraded].sent.saturating_duration_since(killed_at))
    );

    // The breaker opened after exactly the configured 4 failures; since then every call was
    // rejected by it without touching Redis (each /readyz too, if its ping is a store call).
    let (status, _, body) = gw.store_status().await;
    assert_eq!(
        (status, &body["status"], &body["store"]),
        (200, &"ready".into(), &"unreachable".into()),
        "Redis is down: the gateway still serves (ready), and says the store is unreachable: {body}"
    );
    let (_, st, per_readyz) = readyz_twice(&gw, |s| s.rejected).await;
    assert_eq!(
        st,
        StoreStatus {
            breaker: "open".into(),
            failures: 4,
            rejected: degraded_total - 4 + 3 * per_readyz,
            opened: 1
        },
        "{body}"
    );

    // Concurrent load on every policy while the breaker is open.
    let main_before = main_up.requests().await;
    let open = burst(&gw.url("/open"), &[], 8, 5).await;
    for r in open.iter().map(Reply::resp) {
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(degraded(r), Some(POLICY_ALLOW), "{r:#?}");
        r.assert_no_ratelimit_headers();
    }
    let login = burst(&gw.url("/login"), &[], 8, 5).await;
    for r in login.iter().map(Reply::resp) {
        assert_eq!(r.status, 503, "deny limit: {r:#?}");
        assert_eq!(degraded(r), Some(POLICY_DENY), "{r:#?}");
        assert_eq!(r.header_u64("retry-after"), 1, "{r:#?}");
        assert_eq!(r.header("content-type"), "application/problem+json");
        let p = r.json();
        assert_eq!(p["type"], REDUCED_CAPACITY, "{p}");
        assert_eq!(p["status"], 503, "{p}");
        assert_eq!(p["policy"], "login-limit", "{p}");
        assert_eq!(p["retry_after"], 1, "{p}");
    }
    assert_eq!(
        login_up.requests().await,
        0,
        "a deny limit's upstream never sees a request while the store is down"
    );
    // limit 10 × local_share 0.5: exactly 5 of 30 concurrent requests of a fresh caller.
    let local = burst(&gw.url("/local"), &[("x-k", "fresh")], 6, 5).await;
    assert_eq!(
        by_status(&local),
        BTreeMap::from([(200, 5), (429, 25)]),
        "local limit: exactly limit × local_share = 5 admitted"
    );
    let mut remaining = BTreeSet::new();
    for r in local.iter().map(Reply::resp) {
        assert_eq!(degraded(r), Some(POLICY_LOCAL), "{r:#?}");
        // The local limiter's numbers; RateLimit-Policy names the configured quota (docs/stores.md).
        assert_eq!(r.header_u64("x-ratelimit-limit"), 5, "{r:#?}");
        assert_eq!(
            r.header("ratelimit-policy"),
            "\"local-limit\";q=10;w=3600",
            "{r:#?}"
        );
        let rem = r.header_u64("x-ratelimit-remaining");
        assert!(
            r.header("ratelimit")
                .starts_with(&format!("\"local-limit\";r={rem};")),
            "{r:#?}"
        );
        if r.status == 200 {
            remaining.insert(rem);
        } else {
            assert_eq!(rem, 0, "{r:#?}");
            assert!(r.header_u64("retry-after") >= 1, "{r:#?}");
            let p = r.json();
            assert_eq!(p["type"], QUOTA_EXCEEDED, "{p}");
            assert_eq!(p["policy"], "local-limit", "{p}");
        }
    }
    assert_eq!(remaining, BTreeSet::from([0, 1, 2, 3, 4]));
    assert_eq!(
        main_up.requests().await - main_before,
        40 + 5,
        "the upstream saw the 40 failed-open and the 5 locally admitted requests"
    );
    degraded_total += (open.len() + login.len() + local.len()) as u64;
    let l = latency(open.iter().chain(&login).chain(&local));
    println!("kill -9, breaker open, 8 connections: {l}");

    let (status, st, body) = gw.store_status().await;
    assert_eq!(
        (status, &body["store"]),
        (200, &"unreachable".into()),
        "{body}"
    );
    assert_eq!(
        st,
        StoreStatus {
            breaker: "open".into(),
            failures: 4,
            rejected: degraded_total - 4 + 4 * per_readyz,
            opened: 1
        },
        "every call after the 4th failure was rejected by the breaker: {body}"
    );
    assert_eq!(count(&gw.output(), BREAKER_OPENED), 1, "{}", gw.output());
}

// ---------------------------------------------------------------------------------------
// 2. SIGSTOP: bounded by the deadline; no Redis wait once the breaker is open.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_stopped_costs_at_most_the_deadline_and_nothing_once_the_breaker_is_open() {
    let _serial = SERIAL.lock().await;
    const DEADLINE: Duration = Duration::from_millis(25);
    const COOLDOWN: Duration = Duration::from_secs(3);
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: stop, timeout: 25ms, breaker: {{ failures: 3, cooldown: 3s }} }}\n\
         upstreams: {{ main: [\"{}\"] }}\n\
         routes:\n  - {{ name: open, match: {{ path_prefix: /open }}, upstream: main, limits: [ {{ name: open-limit, key: [], limit: 1000000, window: 1h, on_error: allow }} ] }}\n",
        redis.url(),
        up.addr
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();
    let url = gw.url("/open");
    for _ in 0..10 {
        timed_get(&c, &url, &[]).await;
    }
    let mut before = Vec::new();
    for _ in 0..50 {
        let (r, d) = timed_get(&c, &url, &[]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        before.push(d);
    }
    let before = Latency::of(&before);
    let (status, st, body) = gw.store_status().await;
    assert_eq!((status, st.breaker.as_str()), (200, "closed"), "{body}");
    let spurious = st.failures;

    redis.signal("STOP");
    let stopped_at = Instant::now();
    // Until the breaker opens, each request waits for the deadline, never much longer.
    let mut failing = Vec::new();
    for _ in 0..100 {
        let (r, d) = timed_get(&c, &url, &[]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(degraded(&r), Some(POLICY_ALLOW), "{r:#?}");
        failing.push(d);
        if gw.output().contains(BREAKER_OPENED) {
            break;
        }
    }
    let opened_at = Instant::now();
    for (i, d) in failing.iter().enumerate() {
        assert!(
            *d >= DEADLINE - Duration::from_millis(1),
            "request {i} after SIGSTOP took {d:?}: it cannot fail before the deadline"
        );
        assert!(
            *d < DEADLINE + LATENCY_MARGIN,
            "request {i} after SIGSTOP took {d:?}, more than the deadline {DEADLINE:?} + {LATENCY_MARGIN:?}"
        );
    }
    if spurious == 0 {
        assert_eq!(
            failing.len(),
            3,
            "the breaker opens after exactly 3 consecutive failures: {failing:?}"
        );
    } else {
        assert!(failing.len() <= 3, "{failing:?}");
    }
    let failing = Latency::of(&failing);

    // Open: requests no longer wait on Redis.
    let mut after = Vec::new();
    for _ in 0..50 {
        let (r, d) = timed_get(&c, &url, &[]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(degraded(&r), Some(POLICY_ALLOW), "{r:#?}");
        after.push(d);
    }
    // And 8 connections at once: none waits on Redis either.
    let concurrent = burst(&url, &[], 8, 10).await;
    for x in &concurrent {
        let (r, d) = (x.resp(), x.latency);
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(degraded(r), Some(POLICY_ALLOW), "{r:#?}");
        assert!(d < DEADLINE + LATENCY_MARGIN, "breaker open: {d:?}");
    }
    let after_took = opened_at.elapsed();
    let concurrent = latency(&concurrent);
    let after = Latency::of(&after);
    println!(
        "SIGSTOP, deadline 25ms: Redis up {before}; stopped, breaker closed {failing}; breaker open {after}, 8 connections {concurrent}; detection (SIGSTOP to open) {:.1} ms",
        ms(opened_at - stopped_at)
    );
    assert!(
        after.max < DEADLINE + LATENCY_MARGIN,
        "breaker open: {after}"
    );
    assert!(
        after.p50 < DEADLINE,
        "breaker open: the median request ({after}) must not wait on Redis (deadline {DEADLINE:?})"
    );
    assert!(
        after.p50 <= before.p50 + Duration::from_millis(10),
        "breaker open: median {:?} vs {:?} with Redis up: the limit check must add no Redis wait",
        after.p50,
        before.p50
    );
    let (_, st, per_readyz) = readyz_twice(&gw, |s| s.rejected).await;
    if after_took < COOLDOWN {
        // No probe yet: every one of the 50 + 80 (and each /readyz whose ping is a store
        // call) was rejected by the breaker.
        assert_eq!(
            (st.breaker.as_str(), st.rejected),
            ("open", 50 + 80 + 2 * per_readyz),
            "{st:?}"
        );
    }

    // SIGCONT: the probe after the cooldown finds Redis answering again.
    redis.signal("CONT");
    let resumed_at = Instant::now();
    let within = COOLDOWN + RECOVERY_MARGIN + Duration::from_secs(1);
    let r = eventually("an answer decided by Redis after SIGCONT", within)
        .every(Duration::from_millis(20))
        .holds_async(|| not_degraded(&c, &url, &[]))
        .await;
    r.header("ratelimit");
    println!(
        "SIGCONT: limiting against Redis again {:.0} ms after SIGCONT, {:.0} ms after the breaker opened (cooldown {COOLDOWN:?})",
        ms(resumed_at.elapsed()),
        ms(opened_at.elapsed())
    );
}

// ---------------------------------------------------------------------------------------
// 3. Redis comes back: exact limiting again within cooldown + 1 s.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restarted_on_the_same_port_is_used_exactly_again_within_the_cooldown() {
    let _serial = SERIAL.lock().await;
    // The breaker's defaults: 3 failures, 5 s cooldown.
    const COOLDOWN: Duration = Duration::from_secs(5);
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: back, timeout: 250ms }}\n\
         upstreams: {{ main: [\"{}\"] }}\n{}",
        redis.url(),
        up.addr,
        one_limit_route("back-limit", 20)
    );
    let gw = Gateway::start(&yaml).await;
    let url = gw.url("/x");
    assert_exact_through_redis("before the outage", &url, "before", 30, 20, &up).await;

    // Light load with a fresh counter per request: 200 whether degraded or not.
    // (No /readyz while Redis is down: its ping reconnects and could hide a slow recovery.)
    let driver = light_driver(&url).await;
    let killed_at = Instant::now();
    redis.kill();
    gw.wait_output(BREAKER_OPENED, Duration::from_secs(10))
        .await;
    let opened_at = Instant::now();
    // Redis stays down for a while (longer than the client's reconnect attempts), then comes
    // back on the same port, empty.
    tokio::time::sleep(Duration::from_secs(1)).await;
    redis.restart();
    let back_at = Instant::now();
    let n_back = driver.len();
    let limit =
        back_at + COOLDOWN + Duration::from_secs(1) + RECOVERY_MARGIN + Duration::from_secs(8);
    driver
        .wait(
            "a response decided by Redis again",
            limit.saturating_duration_since(Instant::now()),
            |s| s[n_back..].iter().any(|x| x.header(DEGRADED).is_none()),
        )
        .await;
    let samples = driver.finish().await;
    let recovered = samples[n_back..]
        .iter()
        .find(|x| x.header(DEGRADED).is_none())
        .expect("recovered")
        .sent;
    for s in &samples {
        assert_eq!(s.status(), 200, "{s:?}");
        if let Some(d) = s.header(DEGRADED) {
            assert_eq!(d, POLICY_ALLOW);
        }
    }
    let recovery = recovered.saturating_duration_since(back_at);
    println!(
        "restart: breaker open {:.0} ms after kill -9; Redis back {:.0} ms after that; limiting against Redis again {:.0} ms after Redis was back ({:.0} ms after the breaker opened; cooldown {COOLDOWN:?})",
        ms(opened_at - killed_at),
        ms(back_at - opened_at),
        ms(recovery),
        ms(recovered.saturating_duration_since(opened_at))
    );
    // Redis was back before the cooldown ended, so the first probe (one cooldown after the
    // breaker opened) must find it.
    let since_open = recovered.saturating_duration_since(opened_at);
    assert!(
        recovery <= COOLDOWN + Duration::from_secs(1) + RECOVERY_MARGIN
            && since_open <= COOLDOWN + Duration::from_secs(1) + RECOVERY_MARGIN,
        "the gateway used Redis again only {recovery:?} after it came back ({since_open:?} after \
         the breaker opened): more than cooldown {COOLDOWN:?} + 1 s (+ {RECOVERY_MARGIN:?} margin). \
         Gateway log:\n{}",
        gw.output()
    );

    // Exactly the limit again, from the new (empty) Redis.
    assert_exact_through_redis("after the restart", &url, "after", 30, 20, &up).await;
    let keys = redis.scan(&format!("{}*", caller_key("back", "back-limit", "after")));
    assert_eq!(
        keys.len(),
        1,
        "the counter lives in the new Redis: {keys:?}"
    );
    let (status, st, body) = gw.store_status().await;
    assert_eq!((status, st.breaker.as_str()), (200, "closed"), "{body}");
    assert!(st.opened >= 1, "{body}");
}

// ---------------------------------------------------------------------------------------
// 4. Redis slower than the deadline (a latency-injecting TCP proxy).
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_slower_than_the_deadline_makes_requests_follow_their_policy_without_waiting() {
    let _serial = SERIAL.lock().await;
    const DEADLINE: Duration = Duration::from_millis(25);
    const DELAY: Duration = Duration::from_millis(100);
    let redis = RedisServer::start();
    let proxy = LatencyProxy::start(loopback(redis.port)).await;
    let main_up = Upstream::start().await;
    let login_up = Upstream::start().await;
    // The breaker never opens here: every request meets the slow Redis and its deadline.
    let through_proxy = format!("redis://{}", proxy.addr());
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: slow, timeout: 25ms, breaker: {{ failures: 1000000, min_calls: 1000000 }} }}\n\
         upstreams: {{ main: [\"{}\"], login: [\"{}\"] }}\n\
         routes:\n\
         \x20 - {{ name: open, match: {{ path_prefix: /open }}, upstream: main, limits: [ {{ name: open-limit, key: [], limit: 1000000, window: 1h, on_error: allow }} ] }}\n\
         \x20 - {{ name: login, match: {{ path_prefix: /login }}, upstream: login, limits: [ {{ name: login-limit, key: [], limit: 1000000, window: 1h, on_error: deny }} ] }}\n",
        through_proxy,
        main_up.addr,
        login_up.addr
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();

    // No delay: through the proxy to Redis.
    for path in ["/open", "/login"] {
        for _ in 0..5 {
            let (r, _) = timed_get(&c, &gw.url(path), &[]).await;
            assert_eq!((r.status.as_u16(), degraded(&r)), (200, None), "{r:#?}");
        }
    }
    assert!(
        !redis.scan("{slow:*").is_empty(),
        "counters written through the proxy"
    );
    login_up.reset().await;
    let (_, st0, _) = gw.store_status().await;

    proxy.set_delay(DELAY);
    let mut allow = Vec::new();
    let mut deny = Vec::new();
    for _ in 0..20 {
        let (r, d) = timed_get(&c, &gw.url("/open"), &[]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        assert_eq!(degraded(&r), Some(POLICY_ALLOW), "{r:#?}");
        allow.push(d);
        let (r, d) = timed_get(&c, &gw.url("/login"), &[]).await;
        assert_eq!(r.status, 503, "{r:#?}");
        assert_eq!(degraded(&r), Some(POLICY_DENY), "{r:#?}");
        assert_eq!(r.header_u64("retry-after"), 1, "{r:#?}");
        assert_eq!(r.json()["type"], REDUCED_CAPACITY, "{r:#?}");
        deny.push(d);
    }
    for (what, samples) in [("allow", &allow), ("deny", &deny)] {
        for d in samples.iter() {
            assert!(
                *d >= DEADLINE - Duration::from_millis(1),
                "{what}: {d:?}: answered before the deadline, so Redis was not slow?"
            );
            assert!(
                *d < DEADLINE + LATENCY_MARGIN,
                "{what}: {d:?}: waited for the slow Redis ({DELAY:?} per chunk) instead of the deadline {DEADLINE:?}"
            );
        }
    }
    println!(
        "Redis behind a {DELAY:?}-per-chunk proxy, deadline {DEADLINE:?}: allow {}; deny {}",
        Latency::of(&allow),
        Latency::of(&deny)
    );
    assert_eq!(
        login_up.requests().await,
        0,
        "deny: the upstream saw nothing"
    );
    let (_, st, per_readyz) = readyz_twice(&gw, |s| s.failures).await;
    assert_eq!(
        (st.failures - st0.failures, st.breaker.as_str(), st.opened),
        (40 + 2 * per_readyz, "closed", 0),
        "each of the 40 slow calls (and each /readyz whose ping is a store call) failed at its deadline: {st:?}"
    );

    // The delay goes away: Redis decides again.
    proxy.set_delay(Duration::ZERO);
    let login = gw.url("/login");
    eventually(
        "Redis decides again within 5 s of the delay's removal",
        Duration::from_secs(5),
    )
    .every(Duration::from_millis(20))
    .holds_async(|| {
        let (c, login) = (&c, &login);
        async move {
            let r = get(c, login, &[]).await;
            if r.status == 200 && degraded(&r).is_none() {
                Ok(())
            } else {
                Err(format!("{r:#?}"))
            }
        }
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// 5. Sentinel failover: the gateway follows the new master.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_the_gateway_follows_the_new_master_and_limits_exactly() {
    let _serial = SERIAL.lock().await;
    let mut s = RedisSentinel::start();
    let up = Upstream::start().await;
    let gw = sentinel_gateway(&s, &up, "fo", "fo-limit", "250ms").await;
    let url = gw.url("/x");
    assert_exact_through_redis("before the failover", &url, "pre", 30, 20, &up).await;
    let pre = format!("{}*", caller_key("fo", "fo-limit", "pre"));
    assert_eq!(s.master.scan(&pre).len(), 1, "written on the master");
    assert_eq!(
        s.master.cli(&["WAIT", "1", "5000"]),
        "1",
        "the replica acknowledged every write"
    );

    let driver = light_driver(&url).await;
    let master_port = s.master.port;
    let new_port = s.replica.port;
    let killed_at = Instant::now();
    s.master.kill();
    let n_kill = driver.len();
    // Wait for the sentinel to promote the replica and for the gateway to use it.
    let mut promoted: Option<Duration> = None;
    let within = Duration::from_secs(40).saturating_sub(killed_at.elapsed());
    let recovered = eventually(
        "the gateway uses the new master within 40 s of the kill",
        within,
    )
    .holds(|| {
        if promoted.is_none() && s.names_master(new_port) {
            promoted = Some(killed_at.elapsed());
        }
        driver
            .first_since(n_kill, |x| x.header(DEGRADED).is_none())
            .map(|x| x.sent)
            .ok_or_else(|| format!("sentinel switched: {promoted:?}"))
    })
    .await;
    let samples = driver.finish().await;
    let window = recovered.saturating_duration_since(killed_at);
    let degraded_n = samples[n_kill..]
        .iter()
        .filter(|x| x.header(DEGRADED).is_some())
        .count();
    println!(
        "sentinel failover (down-after-milliseconds 2000): sentinel reported the new master {} after kill -9; degraded window (kill to first response decided by the new master) {:.0} ms; {degraded_n} degraded responses",
        ms_or_not_seen(promoted),
        ms(window)
    );
    for x in &samples {
        assert_eq!(x.status(), 200, "allow policy across the failover: {x:?}");
        if let Some(d) = x.header(DEGRADED) {
            assert_eq!(d, POLICY_ALLOW);
        }
    }
    assert!(
        s.replica.cli(&["ROLE"]).starts_with("master"),
        "the replica was promoted"
    );
    assert_ne!(master_port, new_port);

    // Exactly the limit, counted on the new master.
    assert_exact_through_redis("after the failover", &url, "post", 30, 20, &up).await;
    let post = format!("{}*", caller_key("fo", "fo-limit", "post"));
    assert_eq!(
        s.replica.scan(&post).len(),
        1,
        "the counter of a caller seen after the failover is on the new master"
    );
    // The pre-failover counter was replicated: its caller stays limited.
    let before = up.requests().await;
    let rs = burst(&url, &[("x-k", "pre")], 1, 3).await;
    assert_eq!(by_status(&rs), BTreeMap::from([(429, 3)]));
    assert_eq!(up.requests().await, before);
}

// ---------------------------------------------------------------------------------------
// 6. A restart that loses the script cache mid-run: no client-visible error.
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_restart_losing_the_script_cache_mid_run_shows_clients_no_error() {
    let _serial = SERIAL.lock().await;
    let mut redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: cache, timeout: 250ms, breaker: {{ cooldown: 1s }} }}\n\
         upstreams: {{ main: [\"{}\"] }}\n{}",
        redis.url(),
        up.addr,
        one_limit_route("cache-limit", 20)
    );
    let gw = Gateway::start(&yaml).await;
    let url = gw.url("/x");
    assert_exact_through_redis("before the restart", &url, "before", 30, 20, &up).await;
    assert!(
        redis.noscript_errors() >= 1,
        "the script was loaded on first use"
    );

    // Four connections keep sending as one caller (limited: 200s then 429s).
    let drivers: Vec<Driver> = (0..4)
        .map(|_| {
            Load::new(&url)
                .pace(Duration::from_millis(5))
                .header("x-k", "busy")
                .start()
        })
        .collect();
    for d in &drivers {
        d.wait("20 requests", Duration::from_secs(20), |s| s.len() >= 20)
            .await;
    }
    let old_pid = redis.pid();
    redis.restart();
    assert_ne!(redis.pid(), old_pid);
    let back_at = Instant::now();
    // Wait until every connection has had answers decided by the new Redis.
    for d in &drivers {
        d.wait(
            "20 answers from the new Redis",
            Duration::from_secs(20),
            |s| {
                s.iter()
                    .filter(|x| x.sent > back_at && x.header(DEGRADED).is_none())
                    .count()
                    >= 20
            },
        )
        .await;
    }
    let mut samples = Vec::new();
    for d in drivers {
        samples.extend(d.finish().await);
    }
    let mut counts: BTreeMap<(u16, Option<String>), usize> = BTreeMap::new();
    for x in &samples {
        assert!(
            x.status() == 200 || x.status() == 429,
            "client-visible error across the restart: {x:?}"
        );
        if let Some(d) = x.header(DEGRADED) {
            assert_eq!((x.status(), d), (200, POLICY_ALLOW), "{x:?}");
        }
        let degraded = x.header(DEGRADED).map(str::to_string);
        *counts.entry((x.status(), degraded)).or_default() += 1;
    }
    let limited_after = samples
        .iter()
        .filter(|x| x.sent > back_at && x.status() == 429)
        .count();
    println!("across the restart (status, degraded): {counts:?}");
    assert!(
        limited_after > 0,
        "the new Redis limits the caller again: {counts:?}"
    );
    // The new Redis had no script: the gateway got NOSCRIPT and loaded it, invisibly.
    assert!(
        redis.noscript_errors() >= 1,
        "the script cache was lost and the script reloaded"
    );
    assert_exact_through_redis("after the restart", &url, "after", 30, 20, &up).await;
}

// ---------------------------------------------------------------------------------------
// 7. Sentinel failover away from a master that is stopped, not dead (a blackhole).
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sentinel_failover_away_from_a_stopped_master_is_followed() {
    let _serial = SERIAL.lock().await;
    const COOLDOWN: Duration = Duration::from_secs(1);
    let s = RedisSentinel::start();
    let up = Upstream::start().await;
    // A deadline below the client's own response timeout (100 ms at least): calls to the stopped
    // master end at tollgate's deadline.
    let gw = sentinel_gateway(&s, &up, "fs", "fs-limit", "50ms").await;
    let url = gw.url("/x");
    assert_exact_through_redis("before the failover", &url, "pre", 30, 20, &up).await;

    let driver = light_driver(&url).await;
    let new_port = s.replica.port;
    let stopped_at = Instant::now();
    s.master.signal("STOP");
    let n_stop = driver.len();
    let mut promoted: Option<Instant> = None;
    // The deadline moves: 30 s for the switch, then cooldown + 1 s (+ margins) for the
    // gateway to follow it. It is asserted here; the outer bound (40 s) only backs it up.
    let recovered = eventually("the gateway follows the switch", Duration::from_secs(40))
        .holds(|| {
            if promoted.is_none() && s.names_master(new_port) {
                promoted = Some(Instant::now());
            }
            if let Some(x) = driver.first_since(n_stop, |x| x.header(DEGRADED).is_none()) {
                return Some(x.sent);
            }
            let deadline = match promoted {
                None => stopped_at + Duration::from_secs(30),
                Some(p) => {
                    p + COOLDOWN + Duration::from_secs(1) + RECOVERY_MARGIN + Duration::from_secs(5)
                }
            };
            assert!(
                Instant::now() < deadline,
                "the sentinel switched to the replica {} after SIGSTOP of the master, but {:.1} s \
                 after the switch the gateway still answers degraded (it keeps calling the stopped \
                 master)",
                ms_or_not_seen(promoted.map(|p| p - stopped_at)),
                promoted.map_or(0.0, |p| p.elapsed().as_secs_f64()),
            );
            None
        })
        .await;
    let samples = driver.finish().await;
    s.master.signal("CONT");
    for x in &samples {
        assert_eq!(x.status(), 200, "allow policy across the failover: {x:?}");
    }
    println!(
        "sentinel failover away from a SIGSTOPped master: sentinel switched {} after SIGSTOP; degraded window {:.0} ms",
        ms_or_not_seen(promoted.map(|p| p - stopped_at)),
        ms(recovered.saturating_duration_since(stopped_at))
    );
    assert_exact_through_redis("after the failover", &url, "post", 30, 20, &up).await;
    let post = format!("{}*", caller_key("fs", "fs-limit", "post"));
    assert_eq!(s.replica.scan(&post).len(), 1, "counted on the new master");
}

// ---------------------------------------------------------------------------------------
// 8. The local fallback limiter starts empty at each outage (docs/stores.md, "When Redis fails").
// ---------------------------------------------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_fallback_counters_start_empty_when_each_outage_starts() {
    let _serial = SERIAL.lock().await;
    const COOLDOWN: Duration = Duration::from_secs(1);
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = format!(
        "store: {{ backend: redis, url: \"{}\", key_prefix: twice, timeout: 50ms, local_share: 0.5, breaker: {{ cooldown: 1s }} }}\n\
         upstreams: {{ main: [\"{}\"] }}\n\
         routes:\n  - {{ name: local, match: {{ path_prefix: /local }}, upstream: main, limits: [ {{ name: twice-limit, key: [\"header:x-k\"], algorithm: sliding_log, limit: 10, window: 1h, on_error: local }} ] }}\n",
        redis.url(),
        up.addr
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();
    let url = gw.url("/local");
    let (r, _) = timed_get(&c, &url, &[("x-k", "warm")]).await;
    assert_eq!((r.status.as_u16(), degraded(&r)), (200, None), "{r:#?}");

    let mut admitted = Vec::new();
    for outage in 1..=2 {
        redis.signal("STOP");
        let mut statuses = BTreeMap::new();
        for _ in 0..10 {
            let (r, _) = timed_get(&c, &url, &[("x-k", "caller")]).await;
            assert_eq!(degraded(&r), Some(POLICY_LOCAL), "outage {outage}: {r:#?}");
            *statuses.entry(r.status.as_u16()).or_insert(0) += 1;
        }
        redis.signal("CONT");
        admitted.push(statuses.get(&200).copied().unwrap_or(0));
        // Redis answers again: wait for a response it decided (a fresh caller each time).
        let mut probes = 0;
        eventually(
            format!("outage {outage}: Redis used again after SIGCONT"),
            COOLDOWN * 2 + RECOVERY_MARGIN + Duration::from_secs(1),
        )
        .every(Duration::from_millis(20))
        .holds_async(|| {
            let key = format!("probe-{outage}-{probes}");
            probes += 1;
            let (c, url) = (&c, &url);
            async move {
                let r = get(c, url, &[("x-k", &key)]).await;
                degraded(&r).is_none()
            }
        })
        .await;
    }
    assert_eq!(
        admitted,
        vec![5, 5],
        "limit 10 × local_share 0.5 per outage: docs/stores.md says \"Local counters start empty when \
         the outage starts\", so the second outage admits 5 again"
    );
}

// ---------------------------------------------------------------------------------------
// 9. A connection whose replies stopped for good is replaced.
// ---------------------------------------------------------------------------------------

/// What `SILENT_CONNECTION` is in the store: how long a single node's connection may answer
/// nothing, while calls miss their deadlines, before it is replaced.
const SILENT_CONNECTION: Duration = Duration::from_secs(5);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redis_connection_whose_replies_stopped_is_replaced() {
    let _serial = SERIAL.lock().await;
    const DEADLINE: Duration = Duration::from_millis(25);
    let redis = RedisServer::start();
    let proxy = LatencyProxy::start(loopback(redis.port)).await;
    let up = Upstream::start().await;
    // The breaker never opens: every request's check goes to the connection.
    let yaml = format!(
        "store: {{ backend: redis, url: \"redis://{}\", key_prefix: stall, timeout: 25ms, breaker: {{ failures: 1000000, min_calls: 1000000 }} }}\n\
         upstreams: {{ main: [\"{}\"] }}\n\
         routes:\n\
         \x20 - {{ name: open, match: {{ path_prefix: / }}, upstream: main, limits: [ {{ name: open-limit, key: [], limit: 1000000, window: 1h, on_error: allow }} ] }}\n",
        proxy.addr(),
        up.addr
    );
    let gw = Gateway::start(&yaml).await;
    let c = client();
    let url = gw.url("/open");
    let mut last_answer_sent = Instant::now();
    for i in 0..5 {
        last_answer_sent = Instant::now();
        assert!(
            not_degraded(&c, &url, &[]).await.is_some(),
            "request {i}: decided by Redis through the proxy"
        );
    }

    // The connection's replies stop, and it is not closed: nothing tells the client.
    let accepted = proxy.accepted();
    proxy.stall_existing();
    let stalled = Instant::now();
    let mut missed = Vec::new();
    let (recovered, silent) = loop {
        assert!(
            stalled.elapsed() < SILENT_CONNECTION + RECOVERY_MARGIN + Duration::from_secs(5),
            "still not decided by Redis {:?} after its connection stalled ({} requests followed \
             `on_error: allow`): the silent connection was kept",
            stalled.elapsed(),
            missed.len()
        );
        let (r, d) = timed_get(&c, &url, &[]).await;
        assert_eq!(r.status, 200, "{r:#?}");
        match degraded(&r) {
            None => break (stalled.elapsed(), last_answer_sent.elapsed()),
            Some(policy) => {
                assert_eq!(policy, POLICY_ALLOW, "{r:#?}");
                assert!(
                    d < DEADLINE + LATENCY_MARGIN,
                    "{d:?}: waited on the stalled connection beyond the deadline {DEADLINE:?}"
                );
                missed.push(d);
            }
        }
    };
    println!(
        "stalled Redis connection: {} requests at the deadline ({}), decided by Redis again {} ms \
         after the stall",
        missed.len(),
        Latency::of(&missed),
        recovered.as_millis()
    );
    // `silent`: since the last request before the stall was sent. The connection last answered
    // during it, so no sooner (the gateway and this test share the monotonic clock).
    assert!(
        silent >= SILENT_CONNECTION,
        "decided by Redis again {silent:?} after the connection's last answer, sooner than the \
         {SILENT_CONNECTION:?} a connection may stay silent: a slow reply must not replace it"
    );
    assert!(
        recovered < SILENT_CONNECTION + RECOVERY_MARGIN,
        "the silent connection was replaced only {recovered:?} after the stall"
    );
    assert!(
        proxy.accepted() > accepted,
        "Redis decides again, so the gateway made a new connection ({} accepted before the stall, {} now)",
        accepted,
        proxy.accepted()
    );
}
