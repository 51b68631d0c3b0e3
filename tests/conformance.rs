//! One suite of decision sequences, run against the memory store and against the Lua scripts
//! on a real redis-server: both must return the same decision, field for field, at every step.
//!
//! Sequences are generated from a fixed seed (several keys, costs 1-3 and some above the
//! limit, time steps from 0 ms to a third of the window, window boundaries crossed often,
//! and in one suite idle gaps of whole windows),
//! with single-limit and multi-limit requests (all-or-nothing, shadow limits).

mod common;

use std::time::Duration;

use common::redis::RedisServer;
use tollgate::config::Topology;
use tollgate::limit::{Algorithm, Decision, Quota};
use tollgate::store::{Check, CounterKey, Decisions, RedisStore, Store};

/// A small deterministic generator (xorshift64*), so failures replay.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

fn quotas() -> Vec<Quota> {
    let mut out = Vec::new();
    for a in Algorithm::ALL {
        out.push(Quota::new(a, 5, 1_000));
        out.push(Quota::new(a, 7, 1_500));
        out.push(Quota::new(a, 100, 60_000));
        if matches!(a, Algorithm::TokenBucket | Algorithm::Gcra) {
            out.push(Quota::new(a, 10, 1_000).with_burst(3));
            out.push(Quota::new(a, 3, 1_000).with_burst(8));
        }
    }
    out
}

fn stores(redis: &RedisServer, prefix: &str) -> (Store, Store) {
    let memory = Store::memory(100_000);
    let r = RedisStore::new(
        Topology::Single { url: redis.url() },
        prefix,
        Duration::from_secs(2),
    )
    .expect("redis store")
    .with_explicit_time();
    (memory, Store::redis(r))
}

async fn both(
    memory: &Store,
    redis: &Store,
    checks: &[Check],
    now: u64,
    context: &str,
) -> Vec<Decision> {
    let (mut a, mut b) = (Decisions::new(), Decisions::new());
    memory.check(checks, now, &mut a).await.expect("memory");
    redis
        .check(checks, now, &mut b)
        .await
        .unwrap_or_else(|e| panic!("redis failed at {context}: {e}"));
    assert_eq!(
        a, b,
        "memory vs redis differ at {context}, now={now}, checks={checks:?}"
    );
    a.to_vec()
}

fn check(name: &str, key: u64, q: Quota, cost: u64, shadow: bool) -> Check {
    Check {
        id: 0,
        name: name.into(),
        key: CounterKey::new(name, [&key.to_le_bytes()[..]]),
        quota: q,
        cost,
        shadow,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn single_limit_sequences_agree() {
    let redis = RedisServer::start();
    let (memory, r) = stores(&redis, "conf1");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut decided = 0;
    let mut denied = 0;
    for (qi, q) in quotas().into_iter().enumerate() {
        let name = format!("q{qi}");
        // Start at an arbitrary, unaligned instant.
        let mut now = 1_700_000_000_000 + rng.below(q.window_ms * 3);
        for step in 0..300 {
            now += match rng.below(4) {
                0 => 0,
                _ => rng.below(q.window_ms / 3 + 1),
            };
            let key = rng.below(3);
            let cost = if rng.below(20) == 0 {
                q.limit.max(q.burst) + 1
            } else {
                1 + rng.below(3)
            };
            let c = check(&name, key, q, cost, false);
            let d = both(&memory, &r, &[c], now, &format!("{q:?} step {step}")).await;
            decided += 1;
            denied += usize::from(!d[0].allowed);
        }
    }
    // The sequences exercise both outcomes substantially.
    assert!(
        denied > decided / 5 && denied < decided * 4 / 5,
        "denied {denied} of {decided}"
    );
}

/// Bursts separated by idle gaps of one to three whole windows: whatever a store kept from
/// windows before the previous one (Redis keeps a minute of slack when time is explicit, and
/// `sliding_window` reuses a hash field every other window) must count for nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sequences_with_idle_windows_agree() {
    let redis = RedisServer::start();
    let (memory, r) = stores(&redis, "conf4");
    let mut rng = Rng(0x0123_4567_89ab_cdef);
    let (mut allowed, mut denied) = (0, 0);
    for (qi, q) in quotas().into_iter().enumerate() {
        let name = format!("g{qi}");
        let mut now = 1_700_000_000_000 + rng.below(q.window_ms * 3);
        for step in 0..200 {
            now += match rng.below(10) {
                0 => q.window_ms * (1 + rng.below(3)) + rng.below(q.window_ms),
                1..=6 => 0,
                _ => rng.below(q.window_ms / 4 + 1),
            };
            let c = check(&name, 0, q, 1 + rng.below(2), false);
            let d = both(&memory, &r, &[c], now, &format!("{q:?} step {step}")).await;
            if d[0].allowed {
                allowed += 1;
            } else {
                denied += 1;
            }
        }
    }
    assert!(
        allowed > 1000 && denied > 1000,
        "allowed {allowed}, denied {denied}"
    );
}

/// A reload may change a limit's algorithm and keep its name: the limit then starts afresh
/// in both stores, and Redis never trips over the state (a hash, string or sorted set, in
/// another format) the old algorithm left under the same limit and caller.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_limit_whose_algorithm_changes_starts_afresh_in_both_stores() {
    let redis = RedisServer::start();
    let (memory, r) = stores(&redis, "conf5");
    let mut now = 1_700_000_000_000;
    for (i, a) in Algorithm::ALL.into_iter().enumerate() {
        for (j, b) in Algorithm::ALL.into_iter().enumerate() {
            if a == b {
                continue;
            }
            let name = format!("switch{i}{j}");
            let (qa, qb) = (Quota::new(a, 3, 60_000), Quota::new(b, 3, 60_000));
            let mut allowed = Vec::new();
            for (step, q) in [qa, qa, qa, qa, qb, qb, qa].into_iter().enumerate() {
                now += 7;
                let c = check(&name, 0, q, 1, false);
                let d = both(
                    &memory,
                    &r,
                    &[c],
                    now,
                    &format!("{a} then {b}, step {step}"),
                )
                .await;
                allowed.push(d[0].allowed);
            }
            // 3 of `a`, then `b` from nothing, then `a` finds its own state, still full.
            assert_eq!(
                allowed,
                [true, true, true, false, true, true, false],
                "{a} then {b}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_limit_requests_agree_and_are_all_or_nothing() {
    let redis = RedisServer::start();
    let (memory, r) = stores(&redis, "conf2");
    let mut rng = Rng(0xdead_beef_cafe_f00d);
    let qs = quotas();
    let mut now = 1_700_000_000_123;
    for step in 0..1500 {
        now += rng.below(150);
        let n = 1 + rng.below(3) as usize;
        let checks: Vec<Check> = (0..n)
            .map(|j| {
                let qi = rng.below(qs.len() as u64) as usize;
                // Distinct names per position so one request never names a limit twice.
                check(
                    &format!("m{j}q{qi}"),
                    rng.below(2),
                    qs[qi],
                    1 + rng.below(2),
                    rng.below(5) == 0,
                )
            })
            .collect();
        let cost = 1 + rng.below(2);
        let checks: Vec<Check> = checks
            .into_iter()
            .map(|mut c| {
                c.cost = cost;
                c
            })
            .collect();
        both(&memory, &r, &checks, now, &format!("multi step {step}")).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn denied_request_leaves_other_counters_unchanged_in_redis() {
    let redis = RedisServer::start();
    let (_, r) = stores(&redis, "conf3");
    let minute = Quota::new(Algorithm::SlidingWindow, 10, 60_000);
    let hour = Quota::new(Algorithm::FixedWindow, 3, 3_600_000);
    let now = 1_700_000_000_000;
    let req = [
        check("minute", 1, minute, 1, false),
        check("hour", 1, hour, 1, false),
    ];
    let mut out = Decisions::new();
    for _ in 0..8 {
        r.check(&req, now, &mut out).await.unwrap();
    }
    assert!(!out[1].allowed, "hour limit denies");
    // The minute counter saw exactly the 3 admitted requests: 10 - 3 = 7 remain, and this
    // probe (cost 1) leaves 6.
    r.check(&[check("minute", 1, minute, 1, false)], now, &mut out)
        .await
        .unwrap();
    assert_eq!(out[0].remaining, 6);
}

/// A request of more limits than a call keeps its indexes for without collecting them (64):
/// one call all the same, decided as the memory store decides, all or nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_of_many_limits_agree() {
    let redis = RedisServer::start();
    let (memory, r) = stores(&redis, "conf-many");
    let qs = quotas();
    let mut now = 1_700_000_000_000;
    for n in [63, 64, 65, 70] {
        let checks: Vec<Check> = (0..n)
            .map(|j| check(&format!("n{n}l{j}"), 1, qs[j % qs.len()], 1, false))
            .collect();
        let mut admitted = 0;
        for step in 0..12 {
            now += 10;
            let d = both(
                &memory,
                &r,
                &checks,
                now,
                &format!("{n} limits, step {step}"),
            )
            .await;
            assert_eq!(d.len(), n);
            admitted += usize::from(d.iter().all(|d| d.allowed));
        }
        // The first is admitted; the tightest quotas (3 at once) deny the later ones.
        assert!(
            (1..12).contains(&admitted),
            "{n} limits: {admitted} of 12 admitted"
        );
    }
}
