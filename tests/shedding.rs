//! Priority load shedding (issue 5) against real processes: the gateway binary, the demo
//! upstream holding requests with `x-demo-delay-ms`, and a real `redis-server` where the store
//! is involved (the module `with_redis`), all on loopback.
//!
//! `max_in_flight: 40` with the default thresholds sheds `test` at 28 requests in flight, `get`
//! at 32, `post` at 36, and never `critical`. The tests count answers per class, and read the
//! gateway's own per-class counters from `GET /stats`; none depends on how fast anything runs
//! beyond the upstream holding requests for longer than a burst takes to arrive.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::gateway::Gateway;
use common::http::REDUCED_CAPACITY;
use common::raw::{raw_burst, raw_request, raw_send, statuses, RawResp};
use common::upstream::Upstream;
use common::wait::eventually;

/// The classes, lowest priority first, as `/stats` names them.
const CLASSES: [&str; 4] = ["test", "get", "post", "critical"];

/// Tests in this file load the machine with bursts: run them one at a time, so that one test's
/// burst does not slow another's.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn config(upstream: SocketAddr, store: &str, extra: &str) -> String {
    format!(
        r#"{store}
upstreams:
  backend: ["{upstream}"]
routes:
  - {{ name: payments, match: {{ path_prefix: /payments }}, upstream: backend, priority: critical }}
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
shedding:
  max_in_flight: 40
  thresholds: {{ test: 0.7, get: 0.8, post: 0.9 }}
  test_traffic: {{ header: x-test-mode, api_key_prefix: test_ }}
{extra}"#
    )
}

/// One request of each class; `n` varies the form of test traffic (header or key prefix).
fn request(class: &str, n: usize, hold_ms: u64) -> String {
    let hold = hold_ms.to_string();
    let hold = ("x-demo-delay-ms", hold.as_str());
    match class {
        "critical" => raw_request("POST", "/payments/charge", &[hold]),
        "post" => raw_request("POST", "/orders", &[hold]),
        "get" => raw_request("GET", "/items", &[hold]),
        // Test traffic wins over the method: a POST with a test key is `test`.
        "test" if n.is_multiple_of(2) => {
            raw_request("GET", "/items", &[hold, ("x-test-mode", "1")])
        }
        "test" => raw_request("POST", "/orders", &[hold, ("x-api-key", "test_abc")]),
        other => panic!("no class {other}"),
    }
}

/// (admitted, shed) of each class, from `/stats`, in [`CLASSES`] order.
async fn decided(gw: &Gateway) -> [(u64, u64); 4] {
    let s = gw.stats().await;
    CLASSES.map(|c| {
        let class = &s["classes"][c];
        (
            class["admitted"].as_u64().expect("admitted"),
            class["shed"].as_u64().expect("shed"),
        )
    })
}

/// Every request on its own connection to `addr`, all written at once (see [`raw_burst`]).
async fn burst(addr: SocketAddr, requests: Vec<String>) -> Vec<Option<RawResp>> {
    raw_burst(requests.into_iter().map(|r| (addr, r))).await
}

/// A shed answer: 503, `Retry-After`, a `temporary-reduced-capacity` problem naming `class`.
fn assert_shed(r: &RawResp, class: &str) {
    let body = r.problem(503);
    assert_eq!(r.header("retry-after").as_deref(), Some("1"), "{r:?}");
    assert_eq!(body["type"], REDUCED_CAPACITY);
    assert_eq!(body["priority"], class);
    assert_eq!(body["retry_after"], 1);
}

/// Count `r`, the answer to a `class` request, in `got` (in [`CLASSES`] order) as admitted
/// (200) or shed (503, a proper shed answer); any other answer fails the test.
fn count_answer(got: &mut [(u64, u64); 4], class: &str, r: &RawResp) {
    let c = CLASSES.iter().position(|x| *x == class).expect("class");
    match r.status {
        200 => got[c].0 += 1,
        503 => {
            assert_shed(r, class);
            got[c].1 += 1
        }
        other => panic!("{class}: unexpected {other}: {r:?}"),
    }
}

/// A mixed load of 120 requests (3 × max_in_flight), 30 of each class, arriving in rounds of
/// critical, post, get, test. Each request is sent once the previous one was decided (the
/// gateway's per-class counters moved), and every admitted request is held until the whole
/// load has arrived, so the outcome is exact: test is shed from the 8th round on (28 in flight),
/// get from the 9th (32), post from the 11th (36), and critical never.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_mixed_load_at_three_times_capacity_sheds_test_then_get_then_post_never_critical() {
    let _serial = SERIAL.lock().await;
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&config(upstream.addr, "", "")).await;
    // Long enough for the whole load to arrive while every admitted request is still held.
    const HOLD_MS: u64 = 3_000;

    let start = Instant::now();
    let mut tasks = Vec::new();
    let mut first_shed_round: [Option<usize>; 4] = [None; 4];
    let mut expect = [(0u64, 0u64); 4];
    for round in 0..30 {
        for class in ["critical", "post", "get", "test"] {
            let c = CLASSES.iter().position(|x| *x == class).expect("class");
            let task = raw_send(gw.listen, request(class, round, HOLD_MS)).await;
            // Wait until the gateway decided it.
            let before = expect[c].0 + expect[c].1;
            let what = format!("{class} request of round {round} decided");
            let now = eventually(what, Duration::from_secs(5))
                .every(Duration::from_millis(1))
                .holds_async(|| async {
                    let d = decided(&gw).await;
                    (d[c].0 + d[c].1 > before).then_some(d)
                })
                .await;
            if now[c].1 > expect[c].1 && first_shed_round[c].is_none() {
                first_shed_round[c] = Some(round);
            }
            expect = now;
            tasks.push((class, task));
        }
    }
    let wave = start.elapsed();
    assert!(
        wave < Duration::from_millis(HOLD_MS),
        "the load took {wave:?} to arrive, longer than the upstream holds a request"
    );

    // Per class (test, get, post, critical): admitted and shed, as the gateway counted them.
    assert_eq!(
        decided(&gw).await,
        [(7, 23), (8, 22), (10, 20), (30, 0)],
        "(admitted, shed) of test, get, post, critical"
    );
    assert_eq!(first_shed_round, [Some(7), Some(8), Some(10), None]);
    // Everything admitted is at the upstream at once; nothing shed ever reached it.
    let s = upstream.stats().await;
    assert_eq!((s.requests, s.in_flight), (55, 55), "{s:?}");
    assert_eq!(gw.stats().await["in_flight"], 55);

    // What the clients got, per class: the admitted ones 200 once the upstream answers.
    let mut got: [(u64, u64); 4] = [(0, 0); 4];
    for (class, task) in tasks {
        let r = task.await.expect("task").expect("an answer");
        count_answer(&mut got, class, &r);
    }
    assert_eq!(got, [(7, 23), (8, 22), (10, 20), (30, 0)]);
    gw.wait_idle().await;
}

/// The same mix sent all at once, with the upstream holding each request 300 ms: which request
/// of a class arrives first is up to the network, so the exact split varies, but every
/// critical request succeeds, the caps hold per class, and the gateway's counts match what
/// the clients saw.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_simultaneous_mixed_burst_never_sheds_critical_and_respects_every_cap() {
    let _serial = SERIAL.lock().await;
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&config(upstream.addr, "", "")).await;

    let mut requests = Vec::new();
    let mut classes = Vec::new();
    for n in 0..30 {
        for class in ["critical", "post", "get", "test"] {
            requests.push(request(class, n, 300));
            classes.push(class);
        }
    }
    let resps = burst(gw.listen, requests).await;
    let mut got: [(u64, u64); 4] = [(0, 0); 4];
    for (class, r) in classes.iter().zip(&resps) {
        count_answer(&mut got, class, r.as_ref().expect("an answer"));
    }
    assert_eq!(got[3], (30, 0), "every critical request succeeds");
    let s = upstream.stats().await;
    assert_eq!(
        s.requests,
        got.iter().map(|g| g.0).sum::<u64>(),
        "exactly the admitted requests reached the upstream"
    );
    assert_eq!(
        decided(&gw).await,
        got,
        "the gateway counted what the clients saw"
    );
    // All 120 arrived within the 300 ms hold (everything admitted was at the upstream at
    // once), so each class was admitted only below its threshold: at most 28 test requests,
    // 32 of test and get together, 36 of the three.
    assert_eq!(s.max_in_flight, s.requests, "{s:?}");
    let [t, g, p, _] = got.map(|g| g.0);
    assert!(t <= 28 && t + g <= 32 && t + g + p <= 36, "{got:?}");
    // 30 critical alone exceed test's threshold: some test traffic is always shed.
    assert!(got[0].1 > 0, "{got:?}");
    gw.wait_idle().await;
}

/// A route's `priority` sets its class whatever the method; without `shedding` nothing is shed.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn route_priority_overrides_the_method_and_no_shedding_section_sheds_nothing() {
    let _serial = SERIAL.lock().await;
    let upstream = Upstream::start().await;
    let yaml = format!(
        r#"upstreams:
  backend: ["{}"]
routes:
  - {{ name: search, match: {{ methods: [POST], path_prefix: /search }}, upstream: backend, priority: get }}
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
shedding: {{ max_in_flight: 4, thresholds: {{ test: 0.25, get: 0.5, post: 0.75 }} }}
"#,
        upstream.addr
    );
    let gw = Gateway::start(&yaml).await;
    // Two POSTs to an ordinary route are in flight: `get` (cap 2) is shed, `post` (cap 3) is not.
    let post = |path: &str, hold: u64| {
        raw_request("POST", path, &[("x-demo-delay-ms", &hold.to_string())])
    };
    let a = raw_send(gw.listen, post("/orders", 2_000)).await;
    let b = raw_send(gw.listen, post("/orders", 2_000)).await;
    upstream
        .wait_stats("2 requests in flight", Duration::from_secs(10), |s| {
            s.in_flight >= 2
        })
        .await;
    let search = raw_send(gw.listen, post("/search", 0)).await;
    assert_shed(&search.await.unwrap().unwrap(), "get");
    let order = raw_send(gw.listen, post("/orders", 0)).await;
    assert_eq!(order.await.unwrap().unwrap().status, 200);
    for t in [a, b] {
        assert_eq!(t.await.unwrap().unwrap().status, 200);
    }

    // No `shedding` section: in flight is counted, nothing is shed.
    let plain = format!(
        "upstreams: {{ backend: [\"{}\"] }}\nroutes: [ {{ name: default, match: {{ path_prefix: / }}, upstream: backend }} ]\n",
        upstream.addr
    );
    let gw = Gateway::start(&plain).await;
    let resps = burst(
        gw.listen,
        (0..60).map(|n| request("test", n, 300)).collect(),
    )
    .await;
    assert_eq!(statuses(&resps), vec![200; 60]);
    // Without a `shedding` section there is no test traffic either: these are get and post.
    let d = decided(&gw).await;
    assert_eq!(d.map(|c| c.1), [0; 4], "nothing shed: {d:?}");
    assert_eq!(d.iter().map(|c| c.0).sum::<u64>(), 60);
    assert!(gw.stats().await["shedding"].is_null());
}

// ---------------------------------------------------------------------------------------
// With a Redis store.
// ---------------------------------------------------------------------------------------

/// The tests that need a real `redis-server` (`cargo test -- --skip with_redis::` runs the
/// others without one).
mod with_redis {
    use super::*;
    use common::redis::RedisServer;

    /// Every script call (`EVALSHA`, and `EVAL` or `SCRIPT` should a script be reloaded).
    fn script_calls(redis: &RedisServer) -> u64 {
        ["evalsha", "eval", "script"]
            .iter()
            .map(|c| redis.command_calls(c))
            .sum()
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn shed_requests_never_reach_the_upstream_and_never_touch_the_store() {
        let _serial = SERIAL.lock().await;
        let mut redis = RedisServer::start();
        let upstream = Upstream::start().await;
        let store = format!(
            "store: {{ backend: redis, url: \"{}\", timeout: 500ms }}",
            redis.url()
        );
        // A rate limit and a concurrency limit on every request: an admitted request makes one
        // take, one check and one release call.
        let limits = "limits:\n  - { name: global, key: [], limit: 100000, window: 1m }\n  - { name: inflight, kind: concurrency, key: [], limit: 1000, timeout: 1m }\n";
        let gw = Gateway::start(&config(upstream.addr, &store, limits)).await;

        // Warm up: the scripts are loaded, and the release of that request is done.
        let warm = burst(gw.listen, vec![request("get", 0, 0)]).await;
        assert_eq!(warm[0].as_ref().map(|r| r.status), Some(200));
        gw.wait_idle().await;
        wait_script_calls_settle(&redis).await;
        let before = script_calls(&redis);

        // 40 critical requests held at the upstream: 40 in flight, every class but critical is
        // shed from now on.
        let mut held = Vec::new();
        for _ in 0..40 {
            held.push(raw_send(gw.listen, request("critical", 0, 3_000)).await);
        }
        upstream
            .wait_stats("40 requests in flight", Duration::from_secs(10), |s| {
                s.in_flight >= 40
            })
            .await;
        let after_admitted = script_calls(&redis);
        assert_eq!(
            after_admitted - before,
            80,
            "one take and one check per admitted request"
        );

        // 60 shed requests: no store call, nothing at the upstream.
        let mut shed = Vec::new();
        for n in 0..20 {
            for class in ["test", "get", "post"] {
                shed.push((class, raw_send(gw.listen, request(class, n, 0)).await));
            }
        }
        for (class, t) in shed {
            let r = t.await.expect("task").expect("an answer");
            assert_shed(&r, class);
        }
        assert_eq!(
            script_calls(&redis),
            after_admitted,
            "shed requests made store calls"
        );
        let s = upstream.stats().await;
        assert_eq!(
            s.requests, 41,
            "the warm-up and the 40 held requests only: {s:?}"
        );
        assert_eq!(
            decided(&gw).await,
            [(0, 20), (1, 20), (0, 20), (40, 0)],
            "(admitted, shed) of test, get, post, critical"
        );

        // Shedding does not need the store at all: with Redis gone, a shed request is still
        // answered 503 at once (no store timeout on the way).
        redis.kill();
        let start = Instant::now();
        let r = raw_send(gw.listen, request("get", 0, 0)).await;
        let r = r.await.expect("task").expect("an answer");
        assert_shed(&r, "get");
        assert!(
            start.elapsed() < Duration::from_millis(400),
            "took {:?}",
            start.elapsed()
        );

        for t in held {
            let r = t.await.expect("task").expect("an answer");
            assert_eq!(r.status, 200);
        }
        gw.wait_idle().await;
    }

    /// Poll until Redis's script call count stops moving (a release runs after the answer): the
    /// same count twice, 50 ms apart.
    async fn wait_script_calls_settle(redis: &RedisServer) {
        let mut last = None;
        eventually("Redis script calls settle", Duration::from_millis(2_500))
            .every(Duration::from_millis(50))
            .holds(|| {
                let now = script_calls(redis);
                let settled = last == Some(now);
                last = Some(now);
                settled
            })
            .await
    }
}
