//! Concurrent-request limits (`kind: concurrency`, issue 5) against real processes: the
//! gateway binary, the demo upstream holding each request with `x-demo-delay-ms`, and (for the
//! fleet-wide cap, in the module `with_redis`) a real `redis-server`, all on loopback.
//!
//! Bursts open every connection first and then write every request at once, so all of them
//! reach the gateway within a few milliseconds, far less than the 300 ms the upstream holds
//! each one: the admitted requests are all in flight together, and the counts are exact.
//! "Slots are free again" is read from the gateway's `GET /stats` (memory store) or from Redis
//! (no concurrency set left), polled with a bound, and then proven by admitting a full burst.

mod common;

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::gateway::Gateway;
use common::http::QUOTA_EXCEEDED;
use common::raw::{
    count_status, raw_burst, raw_burst_n, raw_request, raw_unanswered, statuses, ClosedPort,
    RawConn, RawResp,
};
use common::upstream::Upstream;

/// How long the upstream holds each request of a burst.
const HOLD_MS: u64 = 300;
/// The same through Redis, where every request also waits on a take, and two gateways or a
/// cluster share the machine: long enough that a burst always arrives within it.
const REDIS_HOLD_MS: u64 = 1_000;

fn config(upstream: SocketAddr, extra: &str) -> String {
    format!(
        r#"upstreams:
  backend: ["{upstream}"]
routes:
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: inflight, kind: concurrency, key: [api_key], limit: 20, timeout: 60s }}
{extra}"#
    )
}

fn held(key: &str, ms: u64) -> String {
    raw_request(
        "GET",
        "/work",
        &[("x-api-key", key), ("x-demo-delay-ms", &ms.to_string())],
    )
}

/// [`held`], and then the upstream answers 500.
fn held_then_500(key: &str, ms: u64) -> String {
    raw_request(
        "GET",
        "/work",
        &[
            ("x-api-key", key),
            ("x-demo-delay-ms", &ms.to_string()),
            ("x-demo-status", "500"),
        ],
    )
}

/// Exactly `n` answers of `resps` have `status` (200, or the upstream's 500) and exactly
/// `refused` are 429s. `context` starts the message.
fn assert_split(
    resps: &[Option<RawResp>],
    (status, n): (u16, usize),
    refused: usize,
    context: &str,
) {
    assert_eq!(
        (count_status(resps, status), count_status(resps, 429)),
        (n, refused),
        "{context}statuses: {:?}",
        statuses(resps)
    );
}

/// Exactly 20 of a burst of 50 held `hold_ms` reach the upstream, all at once; the other 30
/// get the 429.
async fn assert_twenty_of_fifty(gw: &Gateway, upstream: &Upstream, key: &str, hold_ms: u64) {
    upstream.reset().await;
    let resps = raw_burst_n(50, gw.listen, &held(key, hold_ms)).await;
    assert_split(&resps, (200, 20), 30, "");
    let s = upstream.stats().await;
    assert_eq!(
        (s.requests, s.max_in_flight),
        (20, 20),
        "the upstream saw {s:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn fifty_simultaneous_requests_against_a_limit_of_twenty_admit_exactly_twenty() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&config(upstream.addr, "")).await;

    upstream.reset().await;
    let resps = raw_burst_n(50, gw.listen, &held("caller-1", HOLD_MS)).await;
    assert_split(&resps, (200, 20), 30, "");
    let s = upstream.stats().await;
    assert_eq!(s.requests, 20, "requests that reached the upstream");
    assert_eq!(s.max_in_flight, 20, "requests at the upstream at once");

    // The 429: Retry-After and problem details naming the limit.
    let denied = resps
        .iter()
        .flatten()
        .find(|r| r.status == 429)
        .expect("a 429");
    let body = denied.problem(429);
    assert_eq!(denied.header("retry-after").as_deref(), Some("1"));
    assert_eq!(body["type"], QUOTA_EXCEEDED);
    assert_eq!(body["policy"], "inflight");
    assert_eq!(body["limit"], 20);
    assert_eq!(body["retry_after"], 1);

    // Once they finished, every slot is free again: a second burst admits exactly 20 again.
    gw.wait_slots_free(Duration::from_secs(5)).await;
    assert_twenty_of_fifty(&gw, &upstream, "caller-1", HOLD_MS).await;

    // Another caller has slots of its own, also while caller-1's are all taken.
    gw.wait_slots_free(Duration::from_secs(5)).await;
    upstream.reset().await;
    let mut targets = vec![(gw.listen, held("caller-1", HOLD_MS)); 25];
    targets.extend(vec![(gw.listen, held("caller-2", HOLD_MS)); 25]);
    let resps = raw_burst(targets).await;
    assert_eq!(count_status(&resps[..25], 200), 20);
    assert_eq!(count_status(&resps[25..], 200), 20);
    assert_eq!(upstream.stats().await.max_in_flight, 40);
    gw.wait_slots_free(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_are_released_when_clients_disconnect_mid_request() {
    let upstream = Upstream::start().await;
    let gw = Gateway::start(&config(upstream.addr, "")).await;

    // 20 requests the upstream holds for 4 s fill the limit.
    let conns = raw_unanswered(20, gw.listen, &held("caller-1", 4_000)).await;
    upstream.wait_in_flight(20).await;
    let full = raw_burst_n(1, gw.listen, &held("caller-1", 0)).await;
    assert_eq!(statuses(&full), vec![429]);

    // The clients go away, long before the upstream would answer: the gateway notices and
    // gives every slot back at once.
    drop(conns);
    gw.wait_slots_free(Duration::from_secs(2)).await;
    assert_eq!(gw.stats().await["in_flight"], 0);
    // A client going away is not the gateway's error: nothing at ERROR level.
    let errors: Vec<String> = gw
        .output()
        .lines()
        .filter(|l| l.contains("ERROR"))
        .map(str::to_string)
        .collect();
    assert!(
        errors.is_empty(),
        "client disconnects logged as errors: {errors:#?}"
    );
    assert!(
        upstream.stats().await.in_flight > 0,
        "the upstream still works on the abandoned requests"
    );

    // A full burst is admitted again (once the demo upstream, which does not notice that
    // the gateway hung up, has finished the abandoned requests, so that its counts are ours).
    upstream.wait_in_flight(0).await;
    assert_twenty_of_fifty(&gw, &upstream, "caller-1", HOLD_MS).await;
    gw.wait_slots_free(Duration::from_secs(5)).await;

    // Clients that vanish mid-burst, while their requests are being decided, leak nothing
    // either: abort half of a burst's client tasks right after writing.
    let mut tasks = Vec::new();
    for i in 0..50u32 {
        let mut c = RawConn::connect(gw.listen).await;
        let req = held("caller-1", HOLD_MS);
        tasks.push(tokio::spawn(async move {
            c.send(req.as_bytes()).await.expect("send");
            if i.is_multiple_of(2) {
                // Gone before the answer.
                return None;
            }
            c.read_response().await
        }));
    }
    for t in tasks {
        let _ = t.await;
    }
    gw.wait_slots_free(Duration::from_secs(5)).await;
    upstream.wait_in_flight(0).await;
    assert_twenty_of_fifty(&gw, &upstream, "caller-1", HOLD_MS).await;
    gw.wait_slots_free(Duration::from_secs(5)).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn slots_are_released_when_the_upstream_fails() {
    let upstream = Upstream::start().await;
    let closed = ClosedPort::new();
    let yaml = format!(
        r#"upstreams:
  backend: ["{}"]
  nowhere: ["127.0.0.1:{}"]
routes:
  - {{ name: broken, match: {{ path_prefix: /broken }}, upstream: nowhere }}
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: inflight, kind: concurrency, key: [api_key], limit: 20, timeout: 60s, routes: [default] }}
  - {{ name: broken-inflight, kind: concurrency, key: [api_key], limit: 20, timeout: 60s, routes: [broken] }}
"#,
        upstream.addr, closed.port
    );
    let gw = Gateway::start(&yaml).await;

    // Connection refused: 502, and every slot comes back. Some of the 50 may find all 20
    // slots taken by requests still failing (429); at least the first 20 get through.
    for _ in 0..3 {
        let resps = raw_burst_n(
            50,
            gw.listen,
            &raw_request("GET", "/broken", &[("x-api-key", "caller-1")]),
        )
        .await;
        assert!(
            resps
                .iter()
                .all(|r| r.as_ref().is_some_and(|r| [502, 429].contains(&r.status))),
            "statuses: {:?}",
            statuses(&resps)
        );
        assert!(count_status(&resps, 502) >= 20, "{:?}", statuses(&resps));
        gw.wait_slots_free(Duration::from_secs(5)).await;
    }
    // The broken route's limit is whole again: 20 at once all get through to the failure.
    let resps = raw_burst_n(
        20,
        gw.listen,
        &raw_request("GET", "/broken", &[("x-api-key", "caller-1")]),
    )
    .await;
    assert_eq!(count_status(&resps, 502), 20, "{:?}", statuses(&resps));
    gw.wait_slots_free(Duration::from_secs(5)).await;

    // An upstream that answers 500 still answers: the 500 goes through and the slot is freed.
    upstream.reset().await;
    let resps = raw_burst_n(50, gw.listen, &held_then_500("caller-1", HOLD_MS)).await;
    assert_split(&resps, (500, 20), 30, "");
    gw.wait_slots_free(Duration::from_secs(5)).await;
    assert_twenty_of_fifty(&gw, &upstream, "caller-1", HOLD_MS).await;
    gw.wait_slots_free(Duration::from_secs(5)).await;
}

/// A slot is held at most `timeout`: a request that runs longer loses it, and its late end
/// frees nothing (it must not free a slot another request holds now).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_slot_expires_after_its_timeout_and_is_never_freed_twice() {
    let upstream = Upstream::start().await;
    let yaml = format!(
        r#"upstreams:
  backend: ["{}"]
routes:
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: inflight, kind: concurrency, key: [api_key], limit: 2, timeout: 2s }}
"#,
        upstream.addr
    );
    let gw = Gateway::start(&yaml).await;
    let probe = || async { statuses(&raw_burst_n(1, gw.listen, &held("k", 0)).await) };

    // A and B take both slots at t0 and run for 2.8 s.
    let t0 = Instant::now();
    let addr = gw.listen;
    let ab = tokio::spawn(async move { raw_burst_n(2, addr, &held("k", 2_800)).await });
    upstream.wait_in_flight(2).await;
    assert_eq!(probe().await, vec![429]);

    // At t0 + 2.3 s their slots have expired: C and D take them, for 4 s.
    tokio::time::sleep_until((t0 + Duration::from_millis(2_300)).into()).await;
    let cd = tokio::spawn(async move { raw_burst_n(2, addr, &held("k", 4_000)).await });
    upstream.wait_in_flight(4).await;
    assert_eq!(probe().await, vec![429]);

    // A and B end at about t0 + 2.8 s. Their slots are gone already, so C and D still hold
    // both: at t0 + 3.4 s the limit is still full.
    let ab = ab.await.expect("A and B");
    assert_eq!(statuses(&ab), vec![200, 200]);
    tokio::time::sleep_until((t0 + Duration::from_millis(3_400)).into()).await;
    assert_eq!(
        upstream.stats().await.in_flight,
        2,
        "C and D are still at the upstream"
    );
    assert_eq!(probe().await, vec![429]);
    let cd = cd.await.expect("C and D");
    assert_eq!(statuses(&cd), vec![200, 200]);
    gw.wait_slots_free(Duration::from_secs(5)).await;
    assert_eq!(probe().await, vec![200]);
}

// ---------------------------------------------------------------------------------------
// Redis: the cap holds across the fleet.
// ---------------------------------------------------------------------------------------

/// The tests that need a real `redis-server` (`cargo test -- --skip with_redis::` runs the
/// others without one).
mod with_redis {
    use super::*;
    use common::http::{DEGRADED, REDUCED_CAPACITY};
    use common::redis::{RedisCluster, RedisServer};
    use common::wait::eventually;

    fn redis_config(upstream: SocketAddr, redis: &RedisServer) -> String {
        format!(
            "store: {{ backend: redis, url: \"{}\", timeout: 500ms }}\n{}",
            redis.url(),
            config(upstream, "")
        )
    }

    /// The concurrency sets in Redis.
    fn slot_sets(redis: &RedisServer) -> Vec<String> {
        redis.scan("*:inflight")
    }

    /// Poll Redis until no concurrency set is left (each release removes its member, and Redis
    /// drops an empty set); panics after `within`.
    async fn wait_redis_slots_free(redis: &RedisServer, within: Duration) {
        eventually("no concurrency set left in Redis", within)
            .every(Duration::from_millis(20))
            .holds(|| {
                let sets = slot_sets(redis);
                if sets.is_empty() {
                    return Ok(());
                }
                let members: Vec<String> = sets.iter().map(|k| redis.cli(&["ZCARD", k])).collect();
                Err(format!("{sets:?} ({members:?} members)"))
            })
            .await
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn the_cap_holds_fleet_wide_across_two_gateways_sharing_redis() {
        let redis = RedisServer::start();
        let upstream = Upstream::start().await;
        let yaml = redis_config(upstream.addr, &redis);
        let (a, b) = (Gateway::start(&yaml).await, Gateway::start(&yaml).await);

        for round in 0..2 {
            upstream.reset().await;
            let mut targets = vec![(a.listen, held("caller-1", REDIS_HOLD_MS)); 25];
            targets.extend(vec![(b.listen, held("caller-1", REDIS_HOLD_MS)); 25]);
            let resps = raw_burst(targets).await;
            assert_split(&resps, (200, 20), 30, &format!("round {round}: "));
            let s = upstream.stats().await;
            assert_eq!(
                (s.requests, s.max_in_flight),
                (20, 20),
                "round {round}: the upstream saw {s:?}"
            );
            // Every slot comes back.
            a.wait_slots_free(Duration::from_secs(5)).await;
            b.wait_slots_free(Duration::from_secs(5)).await;
            wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
        }

        // 20 held through both gateways: the set has 20 members, with a TTL of at most the
        // timeout; a 21st request through either gateway is refused.
        let mut targets = vec![(a.listen, held("caller-1", 3_000)); 10];
        targets.extend(vec![(b.listen, held("caller-1", 3_000)); 10]);
        let holding = tokio::spawn(async move { raw_burst(targets).await });
        upstream.wait_in_flight(20).await;
        let sets = slot_sets(&redis);
        assert_eq!(sets.len(), 1, "{sets:?}");
        assert_eq!(redis.cli(&["ZCARD", &sets[0]]), "20");
        let ttl: i64 = redis.cli(&["PTTL", &sets[0]]).parse().expect("PTTL");
        assert!(0 < ttl && ttl <= 60_000, "PTTL {ttl}");
        for gw in [&a, &b] {
            assert_eq!(
                statuses(&raw_burst_n(1, gw.listen, &held("caller-1", 0)).await),
                vec![429]
            );
        }
        let done = holding.await.expect("holding burst");
        assert_eq!(count_status(&done, 200), 20);
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn redis_slots_are_released_on_disconnect_and_on_upstream_failure() {
        let redis = RedisServer::start();
        let upstream = Upstream::start().await;
        let gw = Gateway::start(&redis_config(upstream.addr, &redis)).await;

        // Clients gone mid-request.
        let conns = raw_unanswered(20, gw.listen, &held("caller-1", 4_000)).await;
        upstream.wait_in_flight(20).await;
        assert_eq!(redis.cli(&["ZCARD", &slot_sets(&redis)[0]]), "20");
        drop(conns);
        wait_redis_slots_free(&redis, Duration::from_secs(2)).await;
        upstream.wait_in_flight(0).await;
        assert_twenty_of_fifty(&gw, &upstream, "caller-1", REDIS_HOLD_MS).await;
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;

        // The upstream answers 500.
        let resps = raw_burst_n(50, gw.listen, &held_then_500("caller-1", REDIS_HOLD_MS)).await;
        assert_split(&resps, (500, 20), 30, "");
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
        assert_twenty_of_fifty(&gw, &upstream, "caller-1", REDIS_HOLD_MS).await;
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
    }

    /// A gateway killed while its requests hold slots in Redis cannot give them back: the slots
    /// expire `timeout` after they were taken, and the rest of the fleet gets them again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn slots_of_a_dead_gateway_expire_after_the_timeout() {
        let redis = RedisServer::start();
        let upstream = Upstream::start().await;
        let yaml = format!(
            r#"store: {{ backend: redis, url: "{}", timeout: 500ms }}
upstreams:
  backend: ["{}"]
routes:
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: inflight, kind: concurrency, key: [api_key], limit: 2, timeout: 1500ms }}
"#,
            redis.url(),
            upstream.addr
        );
        let (a, b) = (Gateway::start(&yaml).await, Gateway::start(&yaml).await);
        let t0 = Instant::now();
        let conns = raw_unanswered(2, a.listen, &held("k", 10_000)).await;
        upstream.wait_in_flight(2).await;
        let probe =
            |gw: SocketAddr| async move { statuses(&raw_burst_n(1, gw, &held("k", 0)).await) };
        assert_eq!(probe(b.listen).await, vec![429]);

        // Gateway A dies (SIGKILL): nobody releases its two slots.
        drop(a);
        drop(conns);
        assert_eq!(redis.cli(&["ZCARD", &slot_sets(&redis)[0]]), "2");
        assert!(
            t0.elapsed() < Duration::from_millis(1_200),
            "too slow to test"
        );
        assert_eq!(probe(b.listen).await, vec![429]);

        // 1.5 s after they were taken they are stale, and B's next take drops them.
        tokio::time::sleep_until((t0 + Duration::from_millis(1_700)).into()).await;
        assert_eq!(probe(b.listen).await, vec![200]);
        assert_eq!(probe(b.listen).await, vec![200]);
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
    }

    /// With Redis down, each concurrency limit follows its `on_error`: `local` takes a slot in
    /// the gateway with `limit × store.local_share`, `deny` answers 503.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn with_redis_down_concurrency_limits_follow_their_failure_policy() {
        let mut redis = RedisServer::start();
        let upstream = Upstream::start().await;
        let yaml = format!(
            r#"store: {{ backend: redis, url: "{}", timeout: 500ms, local_share: 0.5 }}
upstreams:
  backend: ["{}"]
routes:
  - {{ name: strict, match: {{ path_prefix: /strict }}, upstream: backend }}
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: inflight, kind: concurrency, key: [api_key], limit: 4, timeout: 60s, on_error: local, routes: [default] }}
  - {{ name: strict-inflight, kind: concurrency, key: [api_key], limit: 4, timeout: 60s, on_error: deny, routes: [strict] }}
"#,
            redis.url(),
            upstream.addr
        );
        let gw = Gateway::start(&yaml).await;
        assert_eq!(
            statuses(&raw_burst_n(4, gw.listen, &held("k", REDIS_HOLD_MS)).await),
            vec![200; 4]
        );
        wait_redis_slots_free(&redis, Duration::from_secs(5)).await;
        redis.kill();

        let resps = raw_burst_n(5, gw.listen, &held("k", REDIS_HOLD_MS)).await;
        assert_eq!(statuses(&resps), vec![200, 200, 429, 429, 429]);
        for r in resps.iter().flatten() {
            assert_eq!(
                r.header(DEGRADED).as_deref(),
                Some("store-unavailable; policy=local"),
                "{r:?}"
            );
        }
        gw.wait_slots_free(Duration::from_secs(5)).await;

        let strict = raw_burst_n(
            1,
            gw.listen,
            &raw_request("GET", "/strict", &[("x-api-key", "k")]),
        )
        .await;
        let r = strict[0].as_ref().expect("an answer");
        assert_eq!(r.status, 503, "{r:?}");
        assert_eq!(r.header("retry-after").as_deref(), Some("1"));
        let body = r.json();
        assert_eq!(body["type"], REDUCED_CAPACITY);
        assert_eq!(body["policy"], "strict-inflight");
        assert_eq!(
            r.header(DEGRADED).as_deref(),
            Some("store-unavailable; policy=deny")
        );
    }

    /// On Redis Cluster the sets of one request can live in different slots: they are taken one
    /// slot at a time, and a denial in a later slot gives back what the earlier ones took.
    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn on_a_cluster_a_denial_in_a_later_slot_gives_back_the_earlier_slots() {
        let cluster = RedisCluster::start();
        let upstream = Upstream::start().await;
        let nodes: Vec<String> = cluster.urls().iter().map(|u| format!("\"{u}\"")).collect();
        let yaml = format!(
            r#"store: {{ backend: redis_cluster, cluster_nodes: [{}], timeout: 500ms }}
upstreams:
  backend: ["{}"]
routes:
  - {{ name: default, match: {{ path_prefix: / }}, upstream: backend }}
limits:
  - {{ name: per-key, kind: concurrency, key: [api_key], limit: 20, timeout: 60s }}
  - {{ name: everyone, kind: concurrency, key: [], limit: 5, timeout: 60s }}
"#,
            nodes.join(", "),
            upstream.addr
        );
        let gw = Gateway::start(&yaml).await;
        // Every concurrency set on every node, with its members.
        let sets = || -> Vec<(String, String)> {
            cluster
                .nodes
                .iter()
                .flat_map(|n| {
                    n.scan("*:inflight")
                        .into_iter()
                        .map(|k| {
                            let members = n.cli(&["ZCARD", &k]);
                            (k, members)
                        })
                        .collect::<Vec<_>>()
                })
                .collect()
        };
        let wait_empty = || {
            eventually(
                "no concurrency set left on the cluster",
                Duration::from_secs(5),
            )
            .every(Duration::from_millis(20))
            .holds(|| match sets() {
                s if s.is_empty() => Ok(()),
                s => Err(format!("{s:?}")),
            })
        };

        upstream.reset().await;
        let resps = raw_burst_n(30, gw.listen, &held("k", REDIS_HOLD_MS)).await;
        assert_split(&resps, (200, 5), 25, "");
        let s = upstream.stats().await;
        assert_eq!((s.requests, s.max_in_flight), (5, 5), "{s:?}");
        wait_empty().await;

        // Five held: each set has five members. Ten more are refused by `everyone`, and the
        // `per-key` slots they took first are given back: still five.
        let addr = gw.listen;
        let holding = tokio::spawn(async move { raw_burst_n(5, addr, &held("k", 2_000)).await });
        upstream.wait_in_flight(5).await;
        let refused = raw_burst_n(10, gw.listen, &held("k", 0)).await;
        assert_eq!(count_status(&refused, 429), 10);
        let mut now = sets();
        now.sort();
        assert_eq!(now.len(), 2, "{now:?}");
        assert!(now.iter().all(|(_, n)| n == "5"), "{now:?}");
        let slot = |k: &str| cluster.nodes[0].cli(&["CLUSTER", "KEYSLOT", k]);
        assert_ne!(
            slot(&now[0].0),
            slot(&now[1].0),
            "the two sets share a slot"
        );
        assert_eq!(count_status(&holding.await.expect("held"), 200), 5);
        wait_empty().await;
    }
}
