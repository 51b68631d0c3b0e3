//! The over-limit cache (issue 16, phase A), with real `redis-server`, real gateways and the
//! real demo upstream on loopback:
//!
//! - a caller hammering a limit far past it costs a handful of store calls per window (counted
//!   with `INFO commandstats`), every window admits exactly the limit, and the caller is
//!   admitted again right after the reset;
//! - a cached denial answers exactly like the store's (status, headers, body), and a cheaper
//!   request than the one denied still asks the store (`cost` > 1);
//! - a reload that changes a limit drops its cached denials on both gateways, the one reloaded
//!   and, over Redis pub/sub, the other;
//! - a usage reset through one gateway's admin API drops the cached denials on the other;
//! - under clock skew (one gateway 10 minutes ahead, libfaketime) the limit stays exact and
//!   cached denials end on time.
//!
//! Every process is killed by PID when its guard drops; every wait is bounded.

mod common;

use std::time::{Duration, Instant};

use common::clock::now_ms;
use common::faults::faketime_env;
use common::gateway::Gateway;
use common::http::{client, get, send, Resp};
use common::load::{by_status, Load, Reply};
use common::redis::RedisServer;
use common::upstream::Upstream;
use common::wait::eventually;
use http::Method;

/// A route `/` with one fixed-window limit of `limit` per `window`, and a route `/heavy` of
/// cost 3 under the same limit.
fn config(redis: &RedisServer, up: &Upstream, prefix: &str, limit: u64, window: &str) -> String {
    format!(
        "store: {{ backend: redis, url: \"{url}\", key_prefix: {prefix}, timeout: 5s, on_error: deny }}
{upstreams}routes:
  - {{ name: heavy, match: {{ path_prefix: /heavy }}, upstream: backend, cost: 3 }}
  - {{ name: all, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: hammered, algorithm: fixed_window, limit: {limit}, window: {window} }}
",
        url = redis.url(),
        upstreams = up.upstreams_yaml(),
    )
}

/// Sleep until `offset_ms` after the start of the next window of `window_ms` (windows are
/// aligned to the Unix epoch, on the one system clock Redis and the test share). Returns the
/// start of that window (ms).
async fn into_next_window(window_ms: u64, offset_ms: u64) -> u64 {
    let now = now_ms();
    let start = now - now % window_ms + window_ms;
    tokio::time::sleep(Duration::from_millis(start + offset_ms - now)).await;
    start
}

/// Sleep until `at` (ms since the Unix epoch).
async fn until(at: u64) {
    let now = now_ms();
    if at > now {
        tokio::time::sleep(Duration::from_millis(at - now)).await;
    }
}

async fn status(gw: &Gateway, path: &str) -> u16 {
    get(&client(), &gw.url(path), &[]).await.status.as_u16()
}

fn evalsha(redis: &RedisServer) -> u64 {
    redis.command_calls("evalsha")
}

/// Decisions of limit `hammered` answered from the over-limit cache, per the gateway's metrics.
async fn cached_denials(gw: &Gateway) -> f64 {
    gw.metrics().await.sum(
        "tollgate_decisions_total",
        &[("limit", "hammered"), ("source", "over_limit_cache")],
    )
}

async fn cache_entries(gw: &Gateway) -> f64 {
    gw.metrics()
        .await
        .value("tollgate_over_limit_cache_entries", &[])
}

/// Hammer `targets` with `conns` connections from 100 ms into a window until 300 ms before
/// the end of the `windows`-th window, so exactly `windows` windows are touched. Returns the
/// replies and the store calls made meanwhile.
async fn hammer(
    redis: &RedisServer,
    targets: &[String],
    conns: usize,
    window_ms: u64,
    windows: u64,
) -> (Vec<Reply>, u64) {
    let start = into_next_window(window_ms, 100).await;
    let calls = evalsha(redis);
    let driver = Load::across(targets).conns(conns).start();
    until(start + windows * window_ms - 300).await;
    let replies = driver.finish().await;
    (replies, evalsha(redis) - calls)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hammered_key_costs_a_handful_of_store_calls_per_window_and_is_admitted_after_its_reset()
{
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&redis, &up, "olc-hammer", 5, "2s")).await;
    let (windows, conns, limit) = (3, 4, 5);
    let before = up.requests().await;
    let (replies, calls) = hammer(&redis, &[gw.url("/x")], conns, 2000, windows).await;
    let total = replies.len() as u64;
    let statuses = by_status(&replies);
    // Exactly the limit in every window: each window's cached denials ended on time.
    assert_eq!(
        statuses.get(&200).copied(),
        Some(windows * limit),
        "{statuses:?}"
    );
    assert_eq!(statuses.keys().copied().collect::<Vec<_>>(), [200, 429]);
    assert_eq!(up.requests().await - before, windows * limit);
    // Per window: the admitted calls, the first denial, at most one call already under way
    // on each other connection when that denial came back, and a few just before the window
    // ends (an entry ends up to one round trip early: it is timed from when its call was sent).
    assert!(total >= 300, "only {total} requests: not hammered");
    assert!(
        calls <= windows * (limit + 2 * conns as u64),
        "{calls} store calls for {total} requests over {windows} windows"
    );
    assert!(
        calls * 20 <= total,
        "{calls} store calls for {total} requests"
    );
    eprintln!(
        "{total} requests, {calls} store calls ({:.4} per request)",
        calls as f64 / total as f64
    );
    let m = gw.metrics().await;
    let cached = cached_denials(&gw).await;
    let saved = m.value(
        "tollgate_store_calls_saved_total",
        &[("reason", "over_limit_cache")],
    );
    assert!(
        cached > 0.0 && cached == saved,
        "cached {cached}, saved {saved}"
    );

    // Admitted again right after the reset: denied 300 ms before the window ends (a cached
    // denial by then), admitted 30 ms after.
    let start = into_next_window(2000, 100).await;
    for _ in 0..limit {
        assert_eq!(status(&gw, "/x").await, 200);
    }
    until(start + 1700).await;
    assert_eq!(status(&gw, "/x").await, 429);
    let calls = evalsha(&redis);
    assert_eq!(status(&gw, "/x").await, 429);
    assert_eq!(evalsha(&redis), calls, "the second denial was a store call");
    until(start + 2030).await;
    let t = Instant::now();
    assert_eq!(status(&gw, "/x").await, 200, "not admitted after the reset");
    assert!(t.elapsed() < Duration::from_millis(500));
}

/// The header names of a response, and its values except the ones that count down.
fn shape(r: &Resp) -> (u16, Vec<(String, String)>, serde_json::Value) {
    let headers = r
        .headers
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "date" | "retry-after" | "ratelimit" | "content-length"
            )
        })
        .map(|(k, v)| (k.to_string(), v.to_str().unwrap_or("").to_string()))
        .collect();
    let mut body = r.json();
    // The wait counts down: "retry in N s".
    body["retry_after"] = serde_json::Value::Null;
    body["detail"] = serde_json::Value::Null;
    (r.status.as_u16(), headers, body)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cached_denial_answers_like_the_store_and_a_cheaper_request_still_asks_it() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let gw = Gateway::start(&config(&redis, &up, "olc-shape", 10, "1h")).await;
    let c = client();
    common::clock::clear_of_window_boundary(3600, 30).await;
    // 3 × cost 3 = 9 of 10, then cost 3 is denied by the store and cached.
    for _ in 0..3 {
        assert_eq!(status(&gw, "/heavy").await, 200);
    }
    let calls = evalsha(&redis);
    let from_store = get(&c, &gw.url("/heavy"), &[]).await;
    assert_eq!(evalsha(&redis), calls + 1);
    let from_cache = get(&c, &gw.url("/heavy"), &[]).await;
    assert_eq!(
        evalsha(&redis),
        calls + 1,
        "the repeated denial asked the store"
    );
    assert_eq!(shape(&from_store), shape(&from_cache));
    let retry = |r: &Resp| r.header_u64("retry-after");
    assert!(
        retry(&from_store) >= retry(&from_cache) && retry(&from_store) - retry(&from_cache) <= 1
    );
    assert_eq!(
        from_store.header("x-ratelimit-remaining"),
        "1",
        "{:?}",
        from_store.headers
    );
    // A request of cost 1 fits in what is left: the cached denial of cost 3 does not answer it.
    assert_eq!(status(&gw, "/x").await, 200);
    assert_eq!(evalsha(&redis), calls + 2);
    // Now the limit is full: cost 1 is denied (and cached), and so is cost 3, from the cache.
    assert_eq!(status(&gw, "/x").await, 429);
    assert_eq!(status(&gw, "/x").await, 429);
    assert_eq!(status(&gw, "/heavy").await, 429);
    assert_eq!(evalsha(&redis), calls + 3);
    assert_eq!(up.requests().await, 4);
    assert_eq!(cached_denials(&gw).await, 3.0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reload_that_changes_the_limit_drops_its_cached_denials_on_both_gateways() {
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let old = config(&redis, &up, "olc-reload", 3, "1h");
    let a = Gateway::start_named("A", &old, &[], &[]).await;
    let b = Gateway::start_named("B", &old, &[], &[]).await;
    common::clock::clear_of_window_boundary(3600, 30).await;
    for gw in [&a, &a, &a] {
        assert_eq!(status(gw, "/x").await, 200);
    }
    for gw in [&a, &b, &a, &b] {
        assert_eq!(status(gw, "/x").await, 429);
    }
    assert_eq!(
        (cache_entries(&a).await, cache_entries(&b).await),
        (1.0, 1.0)
    );
    assert_eq!(
        (cached_denials(&a).await, cached_denials(&b).await),
        (1.0, 1.0)
    );

    // Only A reloads, to a limit of 6: both drop their cached denials of `hammered` (B hears
    // of it over pub/sub).
    let new = config(&redis, &up, "olc-reload", 6, "1h");
    a.replace_config(&new);
    a.sighup();
    a.wait_generation(1, Duration::from_secs(5)).await;
    for gw in [&a, &b] {
        eventually("the cached denial is dropped", Duration::from_secs(2))
            .holds_async(|| async { cache_entries(gw).await == 0.0 })
            .await;
    }
    // B still runs the old config: the store denies it (and it is cached again).
    assert_eq!(status(&b, "/x").await, 429);
    b.replace_config(&new);
    b.sighup();
    b.wait_generation(1, Duration::from_secs(5)).await;
    // Under the new limit, exactly 3 more, across both gateways.
    let mut admitted = 0;
    for gw in [&a, &b, &a, &b, &a, &b, &a, &b] {
        if status(gw, "/x").await == 200 {
            admitted += 1;
        }
    }
    assert_eq!(admitted, 3);
    assert_eq!(up.requests().await, 6);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_usage_reset_through_one_gateway_drops_the_cached_denials_of_the_other() {
    const TOKEN: &str = "olc-admin-token";
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let dir = tempfile::tempdir().expect("temp dir");
    let yaml = format!(
        "store: {{ backend: redis, url: \"{url}\", key_prefix: olc-reset, timeout: 5s, on_error: deny }}
{upstreams}routes: [ {{ name: all, match: {{ path_prefix: / }}, upstream: backend }} ]
tiers:
  free: [ {{ name: hammered, limit: 2, window: 1h }} ]
default_tier: free
quotas: {{ database: \"sqlite://{db}\", refresh: 500ms }}
admin: {{ token_env: TG_ADMIN_TOKEN }}
",
        url = redis.url(),
        upstreams = up.upstreams_yaml(),
        db = dir.path().join("quotas.db").display(),
    );
    let env = [("TG_ADMIN_TOKEN", TOKEN)];
    let a = Gateway::start_named("A", &yaml, &[], &env).await;
    let b = Gateway::start_named("B", &yaml, &[], &env).await;
    let c = client();
    let key = [("x-api-key", "reset-me-0001")];
    let as_key = |gw: &Gateway| gw.url("/x");
    for (gw, want) in [(&a, 200), (&b, 200), (&b, 429), (&b, 429), (&a, 429)] {
        assert_eq!(get(&c, &as_key(gw), &key).await.status.as_u16(), want);
    }
    assert_eq!(cached_denials(&b).await, 1.0);
    let r = send(
        &c,
        Method::POST,
        &format!("http://{}/admin/v1/usage/reset-me-0001/reset", a.admin),
        &[("authorization", &format!("Bearer {TOKEN}"))],
        None,
    )
    .await;
    assert_eq!(r.status.as_u16(), 200, "{}", r.text());
    // B's cached denial would last an hour; the reset's message drops it.
    eventually("B drops its cached denial", Duration::from_secs(2))
        .holds_async(|| async { cache_entries(&b).await == 0.0 })
        .await;
    for (gw, want) in [(&b, 200), (&a, 200), (&b, 429)] {
        assert_eq!(get(&c, &as_key(gw), &key).await.status.as_u16(), want);
    }
    assert_eq!(up.requests().await, 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_clock_skew_the_limit_stays_exact_and_cached_denials_end_on_time() {
    let skew = faketime_env("+10m");
    let redis = RedisServer::start();
    let up = Upstream::start().await;
    let yaml = config(&redis, &up, "olc-skew", 3, "2s");
    let a = Gateway::start_named("A (true clock)", &yaml, &[], &[]).await;
    let b = Gateway::start_named("B (+10 min)", &yaml, &[], &skew).await;
    let (windows, limit) = (3, 3);
    let before = up.requests().await;
    let (replies, calls) = hammer(&redis, &[a.url("/x"), b.url("/x")], 6, 2000, windows).await;
    let statuses = by_status(&replies);
    assert_eq!(
        statuses.get(&200).copied(),
        Some(windows * limit),
        "{statuses:?}"
    );
    assert_eq!(up.requests().await - before, windows * limit);
    let total = replies.len() as u64;
    eprintln!("{total} requests, {calls} store calls");
    assert!(
        calls <= windows * (limit + 2 * 6) && calls * 20 <= total,
        "{calls} store calls for {total} requests"
    );
    assert!(cached_denials(&b).await > 0.0 && cached_denials(&a).await > 0.0);
    // B's cached denial ends at the window's end on Redis's clock, not 10 minutes off.
    let start = into_next_window(2000, 100).await;
    for _ in 0..limit {
        assert_eq!(status(&b, "/x").await, 200);
    }
    until(start + 1700).await;
    assert_eq!(status(&b, "/x").await, 429);
    assert_eq!(status(&b, "/x").await, 429);
    until(start + 2030).await;
    assert_eq!(
        status(&b, "/x").await,
        200,
        "B still denies after the reset"
    );
}
