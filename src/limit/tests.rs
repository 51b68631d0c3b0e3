//! Unit tests for the rate-limit algorithms, driven by a fake clock: every "now" is a plain
//! millisecond value, nothing sleeps.
//!
//! The contract under test (independent of how `algorithm.rs` computes it):
//! - `fixed_window`: epoch-aligned windows, admit while `count + cost <= limit`,
//!   `reset_after` = window end − now, a denial's `retry_after` = `reset_after`.
//! - `sliding_window`: `prev × (1 − elapsed/window) + current + cost <= limit`, exact integer
//!   arithmetic, no double burst across a boundary.
//! - `sliding_log`: at most `limit` units in any interval of length `window`.
//! - `token_bucket`: capacity `burst`, refilled at `limit / window`, `remaining` = floor(tokens).
//! - `gcra`: a token bucket of capacity `burst` whose emission interval is rounded up to whole
//!   microseconds; one stored value.
//! - `retry_after` is exact: with no other traffic the same request is still denied at
//!   `now + retry_after − 1` and admitted at `now + retry_after`.
//! - A denied request changes no state.

use std::collections::VecDeque;

use proptest::prelude::*;

use super::algorithm::gcra_interval_us;
use super::*;

use Algorithm::{FixedWindow, Gcra, SlidingLog, SlidingWindow, TokenBucket};

const SEC: u64 = 1_000;

fn quota(algorithm: Algorithm, limit: u64, window_ms: u64) -> Quota {
    Quota::new(algorithm, limit, window_ms)
}

/// An admitted decision, built field by field (not through `Decision::allow`).
fn ok(limit: u64, remaining: u64, reset_after_ms: u64) -> Decision {
    Decision {
        allowed: true,
        limit,
        remaining,
        reset_after_ms,
        retry_after_ms: 0,
    }
}

/// A denied decision, built field by field (not through `Decision::deny`).
fn no(limit: u64, remaining: u64, reset_after_ms: u64, retry_after_ms: u64) -> Decision {
    Decision {
        allowed: false,
        limit,
        remaining,
        reset_after_ms,
        retry_after_ms,
    }
}

/// The largest cost that can ever be admitted: `limit` for the window algorithms, `burst` for
/// the buckets.
fn capacity(q: &Quota) -> u64 {
    match q.algorithm {
        TokenBucket | Gcra => q.burst,
        _ => q.limit,
    }
}

/// Invariants every outcome must satisfy.
fn assert_invariants(q: &Quota, now: u64, cost: u64, out: &Outcome) {
    let d = &out.decision;
    assert_eq!(
        d.limit, q.limit,
        "{q:?} now={now} cost={cost}: decision.limit"
    );
    if d.allowed {
        assert_eq!(
            d.retry_after_ms, 0,
            "{q:?} now={now} cost={cost}: allowed ⇒ retry 0"
        );
        assert!(
            out.next.is_some(),
            "{q:?} now={now} cost={cost}: an admitted request must carry the next state"
        );
    } else {
        assert!(
            d.retry_after_ms >= 1,
            "{q:?} now={now} cost={cost}: denied ⇒ retry_after ≥ 1, got {d:?}"
        );
        assert!(
            out.next.is_none(),
            "{q:?} now={now} cost={cost}: a denied request must not produce a new state"
        );
    }
}

/// One rate-limited key, kept the way a store keeps it: `next` is stored only when allowed.
#[derive(Debug, Clone, Default)]
struct Key {
    state: Option<State>,
}

impl Key {
    fn new() -> Self {
        Key::default()
    }

    fn outcome(&self, q: &Quota, now: u64, cost: u64) -> Outcome {
        let out = check(q, self.state.as_ref(), now, cost);
        assert_invariants(q, now, cost, &out);
        out
    }

    /// What a request would get at `now`, without storing anything.
    fn peek(&self, q: &Quota, now: u64, cost: u64) -> Decision {
        self.outcome(q, now, cost).decision
    }

    /// A real request: the state advances only when it is admitted.
    fn hit(&mut self, q: &Quota, now: u64, cost: u64) -> Decision {
        let out = self.outcome(q, now, cost);
        if out.decision.allowed {
            self.state = out.next;
        }
        out.decision
    }

    /// `n` requests of `cost` at `now`, all of which must be admitted.
    fn admit_n(&mut self, q: &Quota, now: u64, cost: u64, n: u64) {
        for i in 0..n {
            let d = self.hit(q, now, cost);
            assert!(
                d.allowed,
                "{q:?}: request {i} of {n} (cost {cost}) at {now} denied: {d:?}"
            );
        }
    }
}

/// Asserts the request of `cost` at `now` is denied and that its `retry_after` is exact: with
/// no other traffic it is still denied at `now + retry_after − 1` and admitted at
/// `now + retry_after`. Returns the retry_after.
fn assert_retry_exact(key: &Key, q: &Quota, now: u64, cost: u64) -> u64 {
    let d = key.peek(q, now, cost);
    assert!(
        !d.allowed,
        "{q:?} cost {cost} at {now}: expected a denial, got {d:?}"
    );
    let r = d.retry_after_ms;
    let before = key.peek(q, now + r - 1, cost);
    assert!(
        !before.allowed,
        "{q:?} cost {cost} at {now}: retry_after={r} too long, already admitted at {}",
        now + r - 1
    );
    let at = key.peek(q, now + r, cost);
    assert!(
        at.allowed,
        "{q:?} cost {cost} at {now}: retry_after={r} too short, still denied at {}: {at:?}",
        now + r
    );
    r
}

/// How many of `n` requests of `cost` at `now` are admitted (stored as they go).
fn admitted_count(key: &mut Key, q: &Quota, now: u64, cost: u64, n: u64) -> u64 {
    (0..n).filter(|_| key.hit(q, now, cost).allowed).count() as u64
}

// ---------------------------------------------------------------------------------------------
// Behaviour shared by all five algorithms.
// ---------------------------------------------------------------------------------------------

#[test]
fn every_algorithm_admits_exactly_limit_from_fresh_then_denies() {
    // limit 10 per second, all at one instant that is a window start.
    let now = 7_000;
    for alg in Algorithm::ALL {
        let q = quota(alg, 10, SEC);
        let mut k = Key::new();
        for i in 1..=10 {
            let d = k.hit(&q, now, 1);
            assert!(d.allowed, "{alg}: request {i} denied: {d:?}");
            assert_eq!(d.remaining, 10 - i, "{alg}: remaining after {i}");
        }
        let d = k.hit(&q, now, 1);
        assert!(!d.allowed, "{alg}: request 11 admitted: {d:?}");
        assert_eq!(d.remaining, 0, "{alg}: remaining when denied");
        assert_eq!(d.limit, 10);
        // And it stays denied for the rest of that instant.
        for _ in 0..5 {
            assert!(!k.hit(&q, now, 1).allowed, "{alg}");
        }
    }
}

#[test]
fn every_algorithm_reports_hand_computed_values_for_a_full_drain() {
    // limit 10 / 1000 ms, 10 requests at t = 7000 (a window start), then one more.
    let now = 7_000;
    let cases: [(Algorithm, [u64; 10], Decision); 5] = [
        // Fixed window: window end is 1000 ms away throughout; retry = reset.
        (FixedWindow, [1000; 10], no(10, 0, 1000, 1000)),
        // Sliding window: the current count fades out over the next window (2000 ms); the
        // 11th fits once 10 × (1 − e/1000) + 1 ≤ 10, i.e. e = 100 into the next window.
        (SlidingWindow, [2000; 10], no(10, 0, 2000, 1100)),
        // Sliding log: every entry expires 1000 ms after it was admitted.
        (SlidingLog, [1000; 10], no(10, 0, 1000, 1000)),
        // Token bucket: one token per 100 ms; k used tokens take 100·k ms to refill.
        (
            TokenBucket,
            [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000],
            no(10, 0, 1000, 100),
        ),
        // GCRA: same as the token bucket (interval 100 000 µs).
        (
            Gcra,
            [100, 200, 300, 400, 500, 600, 700, 800, 900, 1000],
            no(10, 0, 1000, 100),
        ),
    ];
    for (alg, resets, denial) in cases {
        let q = quota(alg, 10, SEC);
        let mut k = Key::new();
        for (i, reset) in resets.into_iter().enumerate() {
            let remaining = 9 - i as u64;
            assert_eq!(
                k.hit(&q, now, 1),
                ok(10, remaining, reset),
                "{alg}: request {}",
                i + 1
            );
        }
        assert_eq!(k.hit(&q, now, 1), denial, "{alg}: request 11");
        assert_retry_exact(&k, &q, now, 1);
    }
}

#[test]
fn every_algorithm_charges_cost_greater_than_one() {
    // Cost 3 against limit 10: 3 admitted (remaining 7, 4, 1), the 4th denied with 1 left,
    // and a request of cost 1 still fits.
    let now = 20_000;
    for alg in Algorithm::ALL {
        let q = quota(alg, 10, SEC);
        let mut k = Key::new();
        for remaining in [7, 4, 1] {
            let d = k.hit(&q, now, 3);
            assert!(d.allowed, "{alg}: {d:?}");
            assert_eq!(d.remaining, remaining, "{alg}");
        }
        let d = k.hit(&q, now, 3);
        assert!(!d.allowed, "{alg}: 4th request of cost 3 admitted: {d:?}");
        assert_eq!(d.remaining, 1, "{alg}: remaining on the denial");
        assert_retry_exact(&k, &q, now, 3);
        let d = k.hit(&q, now, 1);
        assert!(d.allowed, "{alg}: cost 1 should still fit: {d:?}");
        assert_eq!(d.remaining, 0, "{alg}");
        let d = k.hit(&q, now, 1);
        assert!(!d.allowed, "{alg}: {d:?}");
        assert_eq!(d.remaining, 0, "{alg}");
        assert_retry_exact(&k, &q, now, 1);
        assert_retry_exact(&k, &q, now, 3);
        assert_retry_exact(&k, &q, now, 10);
    }
}

#[test]
fn every_algorithm_denies_a_cost_above_its_capacity_even_when_fresh() {
    for alg in Algorithm::ALL {
        let q = quota(alg, 10, SEC);
        let k = Key::new();
        let d = k.peek(&q, 3_250, 11);
        assert!(!d.allowed, "{alg}: cost 11 > limit 10 admitted: {d:?}");
        assert!(d.retry_after_ms >= 1, "{alg}");
        assert_eq!(d.remaining, 10, "{alg}: nothing was used");
        // ... and the full capacity is admitted.
        assert!(k.peek(&q, 3_250, 10).allowed, "{alg}");
    }
    for alg in [TokenBucket, Gcra] {
        let q = quota(alg, 10, SEC).with_burst(4);
        let k = Key::new();
        let d = k.peek(&q, 3_250, 5);
        assert!(!d.allowed, "{alg}: cost 5 > burst 4 admitted: {d:?}");
        assert!(d.retry_after_ms >= 1);
        assert_eq!(d.remaining, 4, "{alg}: a full bucket of 4");
        assert!(k.peek(&q, 3_250, 4).allowed, "{alg}");
    }
}

#[test]
fn every_algorithm_leaves_state_alone_on_a_denial() {
    for alg in Algorithm::ALL {
        let q = quota(alg, 10, SEC);
        let mut k = Key::new();
        k.admit_n(&q, 40_000, 1, 10);
        let snapshot = k.state.clone();
        // Denied traffic over the next 50 ms (no algorithm frees a unit that fast).
        for t in 40_000..40_050 {
            for cost in [1, 2, 10, 11] {
                let out = check(&q, k.state.as_ref(), t, cost);
                assert!(!out.decision.allowed, "{alg} at {t} cost {cost}: {out:?}");
                assert_eq!(out.next, None, "{alg}: a denial must not carry a new state");
                k.hit(&q, t, cost);
                assert_eq!(k.state, snapshot, "{alg}");
            }
        }
        // The key behaves exactly like one that never saw the denied traffic.
        let mut quiet = Key::new();
        quiet.admit_n(&q, 40_000, 1, 10);
        for t in (40_050..43_000).step_by(37) {
            assert_eq!(k.hit(&q, t, 2), quiet.hit(&q, t, 2), "{alg} at {t}");
        }
    }
}

#[test]
fn every_algorithm_is_a_pure_function() {
    for alg in Algorithm::ALL {
        let q = quota(alg, 5, SEC);
        let mut k = Key::new();
        k.admit_n(&q, 1_000, 1, 3);
        let a = check(&q, k.state.as_ref(), 1_500, 2);
        let b = check(&q, k.state.as_ref(), 1_500, 2);
        assert_eq!(a, b, "{alg}");
    }
}

#[test]
fn every_algorithm_treats_a_state_of_another_shape_as_fresh() {
    let now = 9_123;
    let foreign = [
        State::Window {
            start: 9_000,
            count: 10,
            prev: 10,
        },
        State::Log(VecDeque::from(vec![(now, 10)])),
        State::Bucket {
            tokens: 0,
            last: now,
        },
        State::Tat(now * 1000 + 10_000_000),
    ];
    for alg in Algorithm::ALL {
        let q = quota(alg, 10, SEC);
        for s in &foreign {
            let own_shape = matches!(
                (alg, s),
                (FixedWindow | SlidingWindow, State::Window { .. })
                    | (SlidingLog, State::Log(_))
                    | (TokenBucket, State::Bucket { .. })
                    | (Gcra, State::Tat(_))
            );
            if own_shape {
                // The same "full" state in the algorithm's own shape denies.
                assert!(!check(&q, Some(s), now, 1).decision.allowed, "{alg} {s:?}");
                continue;
            }
            for cost in [1, 10] {
                assert_eq!(
                    check(&q, Some(s), now, cost),
                    check(&q, None, now, cost),
                    "{alg} given {s:?}"
                );
            }
        }
    }
}

// ---------------------------------------------------------------------------------------------
// fixed_window
// ---------------------------------------------------------------------------------------------

#[test]
fn fixed_window_counts_per_epoch_aligned_window() {
    let q = quota(FixedWindow, 10, SEC);
    let mut k = Key::new();
    // Window [10 000, 11 000): 750 ms left at 10 250.
    for i in 1..=10 {
        assert_eq!(k.hit(&q, 10_250, 1), ok(10, 10 - i, 750));
    }
    assert_eq!(k.hit(&q, 10_250, 1), no(10, 0, 750, 750));
    assert_eq!(k.hit(&q, 10_999, 1), no(10, 0, 1, 1));
    // The next window starts from zero.
    assert_eq!(k.hit(&q, 11_000, 1), ok(10, 9, 1000));
    assert_eq!(k.hit(&q, 11_999, 4), ok(10, 5, 1));
    // A window never seen since (two later) is fresh too.
    assert_eq!(k.hit(&q, 13_500, 10), ok(10, 0, 500));
}

#[test]
fn fixed_window_aligns_to_the_unix_epoch() {
    // 1 700 000 123 456 ms = 28 333 335 minutes + 23 456 ms.
    let q = quota(FixedWindow, 100, 60_000);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 1_700_000_123_456, 1), ok(100, 99, 36_544));
    assert_eq!(k.hit(&q, 1_700_000_159_999, 98), ok(100, 1, 1));
    assert_eq!(k.hit(&q, 1_700_000_159_999, 2), no(100, 1, 1, 1));
    assert_eq!(k.hit(&q, 1_700_000_160_000, 100), ok(100, 0, 60_000));
    // A window that does not divide evenly into the clock: 7 ms windows.
    let q = quota(FixedWindow, 1, 7);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 100, 1), ok(1, 0, 5)); // window [98, 105)
    assert_eq!(k.hit(&q, 104, 1), no(1, 0, 1, 1));
    assert_eq!(k.hit(&q, 105, 1), ok(1, 0, 7));
}

#[test]
fn fixed_window_cost_three() {
    let q = quota(FixedWindow, 10, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 400, 3), ok(10, 7, 600));
    assert_eq!(k.hit(&q, 401, 3), ok(10, 4, 599));
    assert_eq!(k.hit(&q, 402, 3), ok(10, 1, 598));
    assert_eq!(k.hit(&q, 403, 3), no(10, 1, 597, 597));
    assert_eq!(assert_retry_exact(&k, &q, 403, 3), 597);
    assert_eq!(k.hit(&q, 404, 1), ok(10, 0, 596));
    assert_eq!(k.hit(&q, 405, 1), no(10, 0, 595, 595));
    assert_eq!(assert_retry_exact(&k, &q, 405, 1), 595);
    assert_eq!(assert_retry_exact(&k, &q, 405, 10), 595);
}

#[test]
fn fixed_window_allows_the_double_burst_across_a_boundary() {
    let q = quota(FixedWindow, 10, SEC);
    let mut k = Key::new();
    // 10 in the last millisecond of [0, 1000) and 10 more in the first of [1000, 2000):
    // 20 requests within 2 ms, twice the limit. This is the documented cost of the algorithm.
    assert_eq!(admitted_count(&mut k, &q, 999, 1, 15), 10);
    assert_eq!(admitted_count(&mut k, &q, 1_000, 1, 15), 10);
    assert!(!k.hit(&q, 1_001, 1).allowed);
}

#[test]
fn fixed_window_denial_retry_is_the_window_end() {
    let q = quota(FixedWindow, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 5_001, 5, 2);
    for now in [5_001, 5_500, 5_998, 5_999] {
        let d = k.hit(&q, now, 1);
        assert!(!d.allowed);
        assert_eq!(d.retry_after_ms, d.reset_after_ms, "at {now}");
        assert_eq!(d.retry_after_ms, 6_000 - now, "at {now}");
        assert_retry_exact(&k, &q, now, 1);
    }
    // A cost above the limit: retry is still the window end.
    let d = k.peek(&q, 5_100, 11);
    assert_eq!(d, no(10, 0, 900, 900));
}

// ---------------------------------------------------------------------------------------------
// sliding_window
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_window_weights_the_previous_window_by_hand() {
    let q = quota(SlidingWindow, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 500, 1, 10); // previous window [0, 1000) holds 10.
                               // At 1250 the previous window weighs 10 × 0.75 = 7.5.
    assert_eq!(k.peek(&q, 1_250, 2), ok(10, 0, 1_750)); // 7.5 + 2 = 9.5 → floor(0.5) = 0
    assert!(!k.peek(&q, 1_250, 3).allowed); // 7.5 + 3 = 10.5
                                            // Cost 3 fits once 10 × (1 − e/1000) + 3 ≤ 10 → e ≥ 300.
    assert_eq!(assert_retry_exact(&k, &q, 1_250, 3), 50);
    assert_eq!(k.hit(&q, 1_250, 1), ok(10, 1, 1_750)); // 7.5 + 1 = 8.5 → floor(1.5) = 1
    assert_eq!(k.hit(&q, 1_250, 1), ok(10, 0, 1_750)); // 9.5 → 0
                                                       // 7.5 + 2 + 1 = 10.5: denied; 0 left; the current count fades by the end of the next window.
    assert_eq!(k.hit(&q, 1_250, 1), no(10, 0, 1_750, 50));
    // 10 × (1 − e/1000) + 2 + 1 ≤ 10 → e ≥ 300.
    assert_eq!(assert_retry_exact(&k, &q, 1_250, 1), 50);
    assert!(!k.hit(&q, 1_299, 1).allowed);
    assert_eq!(k.hit(&q, 1_300, 1), ok(10, 0, 1_700));
}

#[test]
fn sliding_window_uses_exact_integer_arithmetic() {
    let q = quota(SlidingWindow, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 0, 7, 1); // previous window [0, 1000) holds 7.
                            // At 1100: 7 × 0.9 = 6.3; + 4 = 10.3 > 10.
    let d = k.peek(&q, 1_100, 4);
    assert!(!d.allowed);
    assert_eq!(d.remaining, 3); // floor(10 − 6.3)
                                // 7 × (1000 − e) ≤ 6000 ⇔ e ≥ 1000 − floor(6000 / 7) = 143.
    assert_eq!(assert_retry_exact(&k, &q, 1_100, 4), 43);
    // 7 × 0.857 + 4 = 9.999 ≤ 10 is admitted, 7 × 0.858 + 4 = 10.006 is not.
    assert!(k.peek(&q, 1_143, 4).allowed);
    assert!(!k.peek(&q, 1_142, 4).allowed);
    assert_eq!(k.peek(&q, 1_143, 4).remaining, 0);
    // 6.3 + 3 = 9.3 → floor(0.7) = 0 remaining; 6.3 + 1 → floor(2.7) = 2.
    assert_eq!(k.peek(&q, 1_100, 3), ok(10, 0, 1_900));
    assert_eq!(k.peek(&q, 1_100, 1), ok(10, 2, 1_900));
}

#[test]
fn sliding_window_has_no_double_burst_across_a_boundary() {
    let q = quota(SlidingWindow, 10, SEC);
    let mut k = Key::new();
    assert_eq!(admitted_count(&mut k, &q, 999, 1, 15), 10);
    // Right after the boundary the previous window still weighs 10 × (1 − e/1000).
    let d = k.hit(&q, 1_000, 1);
    assert_eq!(d, no(10, 0, 1_000, 100));
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 100);
    for t in 1_000..1_100 {
        assert!(
            !k.hit(&q, t, 1).allowed,
            "admitted at {t}: boundary double burst"
        );
    }
    // A greedy client (one request every ms) only gets one in as each tenth of the
    // previous window fades.
    let admitted: Vec<u64> = (1_100..2_000)
        .filter(|&t| k.hit(&q, t, 1).allowed)
        .collect();
    assert_eq!(
        admitted,
        (1..=9).map(|i| 1_000 + 100 * i).collect::<Vec<_>>()
    );
    // The same traffic against a fixed window gets 10 + 10 within 2 ms.
    let f = quota(FixedWindow, 10, SEC);
    let mut fk = Key::new();
    assert_eq!(admitted_count(&mut fk, &f, 999, 1, 15), 10);
    assert_eq!(admitted_count(&mut fk, &f, 1_000, 1, 15), 10);
}

#[test]
fn sliding_window_cost_three() {
    let q = quota(SlidingWindow, 10, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 0, 3), ok(10, 7, 2_000));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 4, 2_000));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 1, 2_000));
    // 9 + 3 > 10. In the next window: 9 × (1 − e/1000) + 3 ≤ 10 ⇔ e ≥ 1000 − floor(7000/9)
    // = 223, so 1000 + 223 ms from now.
    assert_eq!(k.hit(&q, 0, 3), no(10, 1, 2_000, 1_223));
    assert_eq!(assert_retry_exact(&k, &q, 0, 3), 1_223);
    assert_eq!(k.hit(&q, 0, 1), ok(10, 0, 2_000));
    // Full: cost 1 needs 10 × (1 − e/1000) + 1 ≤ 10 → e ≥ 100; cost 3 needs e ≥ 300.
    assert_eq!(k.hit(&q, 0, 1), no(10, 0, 2_000, 1_100));
    assert_eq!(assert_retry_exact(&k, &q, 0, 1), 1_100);
    assert_eq!(assert_retry_exact(&k, &q, 0, 3), 1_300);
    // Cost 10 must wait for the count to fade completely: the end of the next window.
    assert_eq!(assert_retry_exact(&k, &q, 0, 10), 2_000);
    // Mid-window the same waits shrink.
    assert_eq!(assert_retry_exact(&k, &q, 640, 3), 660);
}

#[test]
fn sliding_window_forgets_a_window_two_back() {
    let q = quota(SlidingWindow, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 999, 1, 10);
    assert_eq!(admitted_count(&mut k, &q, 2_000, 1, 15), 10);
    // And the state from [2000, 3000) is the previous window at 3000.
    assert!(!k.hit(&q, 3_000, 1).allowed);
    assert!(k.hit(&q, 4_000, 10).allowed);
}

#[test]
fn sliding_window_within_one_window_is_a_plain_counter() {
    let q = quota(SlidingWindow, 5, SEC);
    let mut k = Key::new();
    for (i, t) in [3_000, 3_100, 3_500, 3_900, 3_999].into_iter().enumerate() {
        let d = k.hit(&q, t, 1);
        assert_eq!(d, ok(5, 4 - i as u64, 2_000 - (t - 3_000)));
    }
    assert!(!k.hit(&q, 3_999, 1).allowed);
}

// ---------------------------------------------------------------------------------------------
// sliding_log
// ---------------------------------------------------------------------------------------------

#[test]
fn sliding_log_expires_each_entry_one_window_after_it() {
    let q = quota(SlidingLog, 10, SEC);
    let mut k = Key::new();
    for i in 0..10 {
        assert_eq!(k.hit(&q, 100 * i, 1), ok(10, 9 - i, 1_000));
    }
    // Full at 950: the entry of t=0 leaves at 1000; the last one (900) at 1900.
    assert_eq!(k.hit(&q, 950, 1), no(10, 0, 950, 50));
    assert_eq!(assert_retry_exact(&k, &q, 950, 1), 50);
    // Two units need the entries of 0 and 100 gone.
    assert_eq!(assert_retry_exact(&k, &q, 950, 2), 150);
    assert_eq!(assert_retry_exact(&k, &q, 950, 10), 950);
    assert!(!k.hit(&q, 999, 1).allowed);
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 0, 1_000));
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 1_000, 100));
}

#[test]
fn sliding_log_cost_greater_than_one() {
    let q = quota(SlidingLog, 10, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 0, 3), ok(10, 7, 1_000));
    assert_eq!(k.hit(&q, 200, 3), ok(10, 4, 1_000));
    assert_eq!(k.hit(&q, 400, 4), ok(10, 0, 1_000));
    // Full. Cost 1 and cost 3 wait for the entry of 0 (3 units) to leave at 1000; costs 4–6
    // also need the one of 200 gone (at 1200, 4 units left); costs 7–10 wait for all.
    assert_eq!(k.hit(&q, 500, 1), no(10, 0, 900, 500));
    assert_eq!(assert_retry_exact(&k, &q, 500, 1), 500);
    assert_eq!(assert_retry_exact(&k, &q, 500, 3), 500);
    assert_eq!(assert_retry_exact(&k, &q, 500, 4), 700);
    assert_eq!(assert_retry_exact(&k, &q, 500, 6), 700);
    assert_eq!(assert_retry_exact(&k, &q, 500, 7), 900);
    assert_eq!(assert_retry_exact(&k, &q, 500, 8), 900);
    assert_eq!(assert_retry_exact(&k, &q, 500, 10), 900);
    // At 1000 the first entry is gone: 3 units free.
    assert_eq!(k.hit(&q, 1_000, 3), ok(10, 0, 1_000));
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 1_000, 200));
}

#[test]
fn sliding_log_has_no_double_burst_across_a_boundary() {
    let q = quota(SlidingLog, 10, SEC);
    let mut k = Key::new();
    assert_eq!(admitted_count(&mut k, &q, 999, 1, 15), 10);
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 999);
    for t in 1_000..1_999 {
        assert!(
            !k.hit(&q, t, 1).allowed,
            "admitted at {t}: more than 10 within 1000 ms"
        );
    }
    assert_eq!(admitted_count(&mut k, &q, 1_999, 1, 15), 10);
}

#[test]
fn sliding_log_same_millisecond_entries_expire_together() {
    let q = quota(SlidingLog, 6, 100);
    let mut k = Key::new();
    k.admit_n(&q, 50, 1, 3);
    k.admit_n(&q, 50, 2, 1);
    k.admit_n(&q, 60, 1, 1);
    assert_eq!(k.peek(&q, 149, 1), no(6, 0, 11, 1));
    assert_eq!(k.peek(&q, 150, 5), ok(6, 0, 100));
    assert!(!k.peek(&q, 150, 6).allowed);
    assert_eq!(assert_retry_exact(&k, &q, 150, 6), 10);
}

// ---------------------------------------------------------------------------------------------
// token_bucket
// ---------------------------------------------------------------------------------------------

#[test]
fn token_bucket_refills_one_unit_per_window_over_limit() {
    let q = quota(TokenBucket, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 5_000, 1, 10);
    assert_eq!(k.hit(&q, 5_000, 1), no(10, 0, 1_000, 100));
    assert_eq!(k.hit(&q, 5_099, 1), no(10, 0, 901, 1));
    // After exactly 100 ms one more unit, and only one.
    assert_eq!(k.hit(&q, 5_100, 1), ok(10, 0, 1_000));
    assert_eq!(k.hit(&q, 5_100, 1), no(10, 0, 1_000, 100));
    // 2.5 tokens after 250 ms: two admitted (remaining floor(1.5), floor(0.5)).
    assert_eq!(k.hit(&q, 5_350, 1), ok(10, 1, 850));
    assert_eq!(k.hit(&q, 5_350, 1), ok(10, 0, 950));
    assert_eq!(k.hit(&q, 5_350, 1), no(10, 0, 950, 50));
    assert_eq!(assert_retry_exact(&k, &q, 5_350, 1), 50);
    // A long pause refills to capacity and no further.
    assert_eq!(admitted_count(&mut k, &q, 60_000, 1, 15), 10);
}

#[test]
fn token_bucket_cost_three() {
    let q = quota(TokenBucket, 10, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 0, 3), ok(10, 7, 300));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 4, 600));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 1, 900));
    // 1 token left, 3 needed: 2 more tokens take 200 ms.
    assert_eq!(k.hit(&q, 0, 3), no(10, 1, 900, 200));
    assert_eq!(assert_retry_exact(&k, &q, 0, 3), 200);
    assert_eq!(k.hit(&q, 200, 3), ok(10, 0, 1_000));
    assert_eq!(assert_retry_exact(&k, &q, 200, 3), 300);
    assert_eq!(assert_retry_exact(&k, &q, 250, 3), 250);
    assert_eq!(assert_retry_exact(&k, &q, 200, 10), 1_000);
}

#[test]
fn token_bucket_with_a_rate_that_is_not_a_whole_number_of_ms() {
    // 3 per second: one token every 333.3 ms.
    let q = quota(TokenBucket, 3, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 0, 1), ok(3, 2, 334));
    assert_eq!(k.hit(&q, 0, 1), ok(3, 1, 667));
    assert_eq!(k.hit(&q, 0, 1), ok(3, 0, 1_000));
    assert_eq!(k.hit(&q, 0, 1), no(3, 0, 1_000, 334));
    assert_eq!(assert_retry_exact(&k, &q, 0, 1), 334);
    assert_eq!(k.peek(&q, 333, 1).remaining, 0); // 0.999 tokens
                                                 // At 334: 1.002 tokens, one taken, 0.002 left.
    assert_eq!(k.hit(&q, 334, 1), ok(3, 0, 1_000));
    // At 1334: 3.002 → capped at 3.
    assert_eq!(k.peek(&q, 1_334, 1), ok(3, 2, 334));
}

#[test]
fn token_bucket_burst_above_limit() {
    let q = quota(TokenBucket, 10, SEC).with_burst(20);
    let mut k = Key::new();
    for i in 1..=20 {
        assert_eq!(k.hit(&q, 1_000, 1), ok(10, 20 - i, 100 * i));
    }
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 2_000, 100));
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 100);
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 20), 2_000);
    // One window refills `limit`, not `burst`.
    assert_eq!(admitted_count(&mut k, &q, 2_000, 1, 25), 10);
    // A long pause refills up to `burst`.
    assert_eq!(admitted_count(&mut k, &q, 100_000, 1, 25), 20);
    assert!(Key::new().peek(&q, 0, 20).allowed);
    assert!(!Key::new().peek(&q, 0, 21).allowed);
}

#[test]
fn token_bucket_burst_below_limit() {
    let q = quota(TokenBucket, 10, SEC).with_burst(3);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 2, 100));
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 1, 200));
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 0, 300));
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 300, 100));
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 100);
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 3), 300);
    // The refill rate is still limit / window: one per 100 ms.
    assert_eq!(k.hit(&q, 1_100, 1), ok(10, 0, 300));
    assert!(!k.hit(&q, 1_100, 1).allowed);
    // The capacity is 3 however long the pause.
    assert_eq!(admitted_count(&mut k, &q, 50_000, 1, 10), 3);
    // Over a second of steady traffic (one request every 100 ms) all 10 get through.
    let mut k = Key::new();
    let admitted = (0..10)
        .filter(|i| k.hit(&q, 200_000 + 100 * i, 1).allowed)
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn token_bucket_stores_tokens_scaled_by_the_window() {
    let q = quota(TokenBucket, 10, SEC);
    let out = check(&q, None, 5, 1);
    assert_eq!(
        out.next,
        Some(State::Bucket {
            tokens: 9_000,
            last: 5,
        })
    );
    assert_eq!(out.expires_at, 105);
}

// ---------------------------------------------------------------------------------------------
// gcra
// ---------------------------------------------------------------------------------------------

#[test]
fn gcra_emission_interval_is_rounded_up_to_whole_microseconds() {
    assert_eq!(gcra_interval_us(&quota(Gcra, 10, SEC)), 100_000);
    assert_eq!(gcra_interval_us(&quota(Gcra, 3, SEC)), 333_334);
    assert_eq!(gcra_interval_us(&quota(Gcra, 7, 1)), 143);
    assert_eq!(gcra_interval_us(&quota(Gcra, 1_000, 1)), 1);
    assert_eq!(gcra_interval_us(&quota(Gcra, 3_000, 1)), 1);
}

#[test]
fn gcra_refills_one_unit_per_window_over_limit() {
    let q = quota(Gcra, 10, SEC);
    let mut k = Key::new();
    k.admit_n(&q, 5_000, 1, 10);
    assert_eq!(k.hit(&q, 5_000, 1), no(10, 0, 1_000, 100));
    assert_eq!(k.hit(&q, 5_099, 1), no(10, 0, 901, 1));
    assert_eq!(k.hit(&q, 5_100, 1), ok(10, 0, 1_000));
    assert_eq!(k.hit(&q, 5_100, 1), no(10, 0, 1_000, 100));
    assert_eq!(k.hit(&q, 5_350, 1), ok(10, 1, 850));
    assert_eq!(k.hit(&q, 5_350, 1), ok(10, 0, 950));
    assert_eq!(k.hit(&q, 5_350, 1), no(10, 0, 950, 50));
    assert_eq!(assert_retry_exact(&k, &q, 5_350, 1), 50);
    assert_eq!(admitted_count(&mut k, &q, 60_000, 1, 15), 10);
}

#[test]
fn gcra_cost_three() {
    let q = quota(Gcra, 10, SEC);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 0, 3), ok(10, 7, 300));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 4, 600));
    assert_eq!(k.hit(&q, 0, 3), ok(10, 1, 900));
    assert_eq!(k.hit(&q, 0, 3), no(10, 1, 900, 200));
    assert_eq!(assert_retry_exact(&k, &q, 0, 3), 200);
    assert_eq!(k.hit(&q, 200, 3), ok(10, 0, 1_000));
    assert_eq!(assert_retry_exact(&k, &q, 200, 3), 300);
    assert_eq!(assert_retry_exact(&k, &q, 250, 3), 250);
    assert_eq!(assert_retry_exact(&k, &q, 200, 10), 1_000);
}

#[test]
fn gcra_with_a_rounded_emission_interval() {
    // 3 per second: interval 333 334 µs, tolerance 1 000 002 µs.
    let q = quota(Gcra, 3, SEC);
    let mut k = Key::new();
    let t0 = 50_000;
    assert_eq!(k.hit(&q, t0, 1), ok(3, 2, 334));
    assert_eq!(k.hit(&q, t0, 1), ok(3, 1, 667));
    assert_eq!(k.hit(&q, t0, 1), ok(3, 0, 1_001));
    assert_eq!(k.state, Some(State::Tat(t0 * 1000 + 1_000_002)));
    assert_eq!(k.hit(&q, t0, 1), no(3, 0, 1_001, 334));
    assert_eq!(assert_retry_exact(&k, &q, t0, 1), 334);
    // 1000 ms later the bucket is 2 µs short of full (2.999994 units): one request leaves
    // floor(1.999994) = 1.
    assert_eq!(k.peek(&q, t0 + 1_000, 1), ok(3, 1, 334));
    // 1 ms later it is full.
    assert_eq!(k.peek(&q, t0 + 1_001, 1), ok(3, 2, 334));
    // The long-run rate never exceeds 3 per second: steady traffic every ms for 10 s.
    let mut k = Key::new();
    let times: Vec<u64> = (0..10_000)
        .filter(|&t| k.hit(&q, t0 + t, 1).allowed)
        .collect();
    for (i, &t) in times.iter().enumerate() {
        let in_window = times[i..].iter().take_while(|&&u| u < t + SEC).count();
        assert!(in_window <= 3 + 3, "burst + rate bound exceeded at {t}");
    }
    assert!(times.len() as u64 <= 3 + 10 * 3);
}

#[test]
fn gcra_burst_above_limit() {
    let q = quota(Gcra, 10, SEC).with_burst(20);
    let mut k = Key::new();
    for i in 1..=20 {
        assert_eq!(k.hit(&q, 1_000, 1), ok(10, 20 - i, 100 * i));
    }
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 2_000, 100));
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 100);
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 20), 2_000);
    assert_eq!(admitted_count(&mut k, &q, 2_000, 1, 25), 10);
    assert_eq!(admitted_count(&mut k, &q, 100_000, 1, 25), 20);
    assert!(Key::new().peek(&q, 0, 20).allowed);
    assert!(!Key::new().peek(&q, 0, 21).allowed);
}

#[test]
fn gcra_burst_below_limit() {
    let q = quota(Gcra, 10, SEC).with_burst(3);
    let mut k = Key::new();
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 2, 100));
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 1, 200));
    assert_eq!(k.hit(&q, 1_000, 1), ok(10, 0, 300));
    assert_eq!(k.hit(&q, 1_000, 1), no(10, 0, 300, 100));
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 1), 100);
    assert_eq!(assert_retry_exact(&k, &q, 1_000, 3), 300);
    assert_eq!(k.hit(&q, 1_100, 1), ok(10, 0, 300));
    assert!(!k.hit(&q, 1_100, 1).allowed);
    assert_eq!(admitted_count(&mut k, &q, 50_000, 1, 10), 3);
    let mut k = Key::new();
    let admitted = (0..10)
        .filter(|i| k.hit(&q, 200_000 + 100 * i, 1).allowed)
        .count();
    assert_eq!(admitted, 10);
}

#[test]
fn gcra_keeps_one_stored_value() {
    let q = quota(Gcra, 10, SEC);
    let mut k = Key::new();
    k.hit(&q, 5, 1);
    assert_eq!(k.state, Some(State::Tat(5_000 + 100_000)));
    k.hit(&q, 5, 2);
    assert_eq!(k.state, Some(State::Tat(5_000 + 300_000)));
    // Idle time does not accumulate credit beyond the burst: the TAT restarts from now.
    k.hit(&q, 10_000, 1);
    assert_eq!(k.state, Some(State::Tat(10_000_000 + 100_000)));
}

#[test]
fn gcra_matches_token_bucket_by_hand() {
    for burst in [1, 3, 10, 25] {
        let tb = quota(TokenBucket, 10, SEC).with_burst(burst);
        let gc = quota(Gcra, 10, SEC).with_burst(burst);
        let (mut a, mut b) = (Key::new(), Key::new());
        for (t, cost) in [
            (0, 1),
            (0, 2),
            (10, 4),
            (99, 1),
            (150, 3),
            (151, 1),
            (400, 2),
            (401, 5),
            (2_000, 10),
            (2_050, 1),
            (2_100, 1),
            (2_101, 1),
        ] {
            assert_eq!(
                a.hit(&tb, t, cost),
                b.hit(&gc, t, cost),
                "burst {burst} at {t}"
            );
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Decision, Algorithm and Quota helpers.
// ---------------------------------------------------------------------------------------------

#[test]
fn decision_constructors() {
    assert_eq!(Decision::allow(10, 3, 500), ok(10, 3, 500));
    assert_eq!(Decision::deny(10, 0, 500, 250), no(10, 0, 500, 250));
    // A denial always tells the client to wait at least 1 ms.
    assert_eq!(Decision::deny(10, 0, 0, 0).retry_after_ms, 1);
}

#[test]
fn decision_more_restrictive_than() {
    let allow_many = ok(10, 9, 100);
    let allow_few = ok(10, 1, 100);
    let short_wait = no(10, 0, 100, 5);
    let long_wait = no(10, 0, 100, 50);
    assert!(short_wait.more_restrictive_than(&allow_few));
    assert!(!allow_few.more_restrictive_than(&short_wait));
    assert!(long_wait.more_restrictive_than(&short_wait));
    assert!(!short_wait.more_restrictive_than(&long_wait));
    assert!(allow_few.more_restrictive_than(&allow_many));
    assert!(!allow_many.more_restrictive_than(&allow_few));
    // Equal remaining: the smaller limit is more restrictive.
    assert!(ok(5, 1, 100).more_restrictive_than(&ok(10, 1, 100)));
    assert!(!ok(10, 1, 100).more_restrictive_than(&ok(5, 1, 100)));
    // Nothing is more restrictive than itself.
    for d in [allow_many, allow_few, short_wait, long_wait] {
        assert!(!d.more_restrictive_than(&d));
    }
}

#[test]
fn algorithm_names_round_trip() {
    for alg in Algorithm::ALL {
        assert_eq!(alg.as_str().parse::<Algorithm>(), Ok(alg));
        assert_eq!(alg.to_string(), alg.as_str());
    }
    assert_eq!(Algorithm::default(), SlidingWindow);
    assert!("leaky_bucket".parse::<Algorithm>().is_err());
    assert!("".parse::<Algorithm>().is_err());
    assert_eq!(
        Algorithm::ALL.map(Algorithm::as_str),
        [
            "sliding_window",
            "fixed_window",
            "sliding_log",
            "token_bucket",
            "gcra"
        ]
    );
}

#[test]
fn quota_burst_defaults_to_limit() {
    let q = Quota::new(TokenBucket, 7, 60_000);
    assert_eq!(q.burst, 7);
    assert_eq!(q.with_burst(20).burst, 20);
    assert_eq!(q.with_burst(20).limit, 7);
}

// ---------------------------------------------------------------------------------------------
// Properties.
// ---------------------------------------------------------------------------------------------

fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

fn arb_quota() -> impl Strategy<Value = Quota> {
    (
        prop::sample::select(Algorithm::ALL.to_vec()),
        1u64..=20,
        prop_oneof![1 => 1u64..=10, 4 => 1u64..=3_000],
        prop::option::of(1u64..=40),
    )
        .prop_map(|(alg, limit, window, burst)| {
            Quota::new(alg, limit, window).with_burst(burst.unwrap_or(limit))
        })
}

/// Gaps between requests (ms) and costs, scaled to the quota so that traffic both saturates
/// the limit and lets it recover.
fn arb_requests(q: &Quota, max_len: usize) -> impl Strategy<Value = Vec<(u64, u64)>> {
    let w = q.window_ms;
    let step = (w / q.limit).max(1);
    let cap = capacity(q);
    let gap = prop_oneof![3 => Just(0u64), 5 => 0..=step + 1, 2 => 0..=2 * w + 1];
    let cost = prop_oneof![5 => Just(1u64), 3 => 1..=cap, 1 => 1..=cap + 2];
    prop::collection::vec((gap, cost), 1..max_len)
}

fn arb_scenario() -> impl Strategy<Value = (Quota, u64, Vec<(u64, u64)>)> {
    arb_quota().prop_flat_map(|q| (Just(q), 0u64..=2_000_000_000_000, arb_requests(&q, 80)))
}

/// An independent model of the contract, computed from the history of admitted requests
/// (`(time, cost)`, in order). Returns `(allowed, remaining)`.
fn model(q: &Quota, history: &[(u64, u64)], now: u64, cost: u64) -> (bool, u64) {
    let (limit, w) = (q.limit as u128, q.window_ms as u128);
    let (now128, cost128) = (now as u128, cost as u128);
    let sum = |from: u128, to: u128| -> u128 {
        // Units admitted in [from, to).
        history
            .iter()
            .filter(|&&(t, _)| (t as u128) >= from && (t as u128) < to)
            .map(|&(_, c)| c as u128)
            .sum()
    };
    match q.algorithm {
        FixedWindow => {
            let start = now128 - now128 % w;
            let cur = sum(start, now128 + 1);
            if cur + cost128 <= limit {
                (true, (limit - cur - cost128) as u64)
            } else {
                (false, limit.saturating_sub(cur) as u64)
            }
        }
        SlidingWindow => {
            let start = now128 - now128 % w;
            let cur = sum(start, now128 + 1);
            let prev = if start >= w { sum(start - w, start) } else { 0 };
            let elapsed = now128 - start;
            // Everything × w: prev × (w − elapsed)/w + cur + cost ≤ limit.
            let est = prev * (w - elapsed) + cur * w;
            if est + cost128 * w <= limit * w {
                (true, ((limit * w - est - cost128 * w) / w) as u64)
            } else {
                (false, ((limit * w).saturating_sub(est) / w) as u64)
            }
        }
        SlidingLog => {
            // Units in the window-length interval ending at now: (now − w, now].
            let used = sum((now128 + 1).saturating_sub(w), now128 + 1);
            if used + cost128 <= limit {
                (true, (limit - used - cost128) as u64)
            } else {
                (false, limit.saturating_sub(used) as u64)
            }
        }
        TokenBucket | Gcra => {
            // A bucket counted in ticks: one unit is `unit` ticks, and `ticks_per_ms` ticks
            // flow in per ms. token_bucket: a unit is window_ms ticks and limit ticks flow in
            // per ms (limit units per window); gcra: a tick is 1 µs and a unit is the emission
            // interval rounded up to whole µs.
            let (unit, ticks_per_ms) = match q.algorithm {
                TokenBucket => (w, limit),
                _ => (gcra_interval_us(q) as u128, 1000),
            };
            let cap = q.burst as u128 * unit;
            let mut tokens = cap;
            let mut last: Option<u128> = None;
            for &(t, c) in history {
                let t = t as u128;
                if let Some(l) = last {
                    tokens = cap.min(tokens + (t - l) * ticks_per_ms);
                }
                tokens -= c as u128 * unit;
                last = Some(t);
            }
            if let Some(l) = last {
                tokens = cap.min(tokens + (now128 - l) * ticks_per_ms);
            }
            if tokens >= cost128 * unit {
                (true, ((tokens - cost128 * unit) / unit) as u64)
            } else {
                (false, (tokens / unit) as u64)
            }
        }
    }
}

/// Checks a denial's retry_after: exact when the cost can ever fit.
fn check_retry(
    key: &Key,
    q: &Quota,
    now: u64,
    cost: u64,
    d: &Decision,
) -> Result<(), TestCaseError> {
    prop_assert!(d.retry_after_ms >= 1);
    if cost > capacity(q) {
        prop_assert!(!key.peek(q, now + d.retry_after_ms, cost).allowed);
        return Ok(());
    }
    let r = d.retry_after_ms;
    let before = key.peek(q, now + r - 1, cost);
    prop_assert!(
        !before.allowed,
        "retry_after {} too long: admitted at now + {}",
        r,
        r - 1
    );
    let at = key.peek(q, now + r, cost);
    prop_assert!(at.allowed, "retry_after {} too short: {:?}", r, at);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// sliding_log is exact: no interval of length `window` ever holds more than `limit`
    /// admitted units.
    #[test]
    fn prop_sliding_log_never_exceeds_limit_in_any_window(
        limit in 1u64..=20,
        window in 1u64..=2_000,
        t0 in 0u64..=2_000_000_000_000,
        raw in prop::collection::vec((0u64..=1_000, 1u64..=6), 1..150),
    ) {
        let q = quota(SlidingLog, limit, window);
        let mut k = Key::new();
        let mut now = t0;
        let mut admitted: Vec<(u64, u64)> = Vec::new();
        for (gap, cost) in raw {
            // Gaps on the scale of the window, biased towards bursts.
            now += gap * window / 1_000 / (gap % 3 + 1);
            if k.hit(&q, now, cost).allowed {
                admitted.push((now, cost));
            }
        }
        // Any interval of length `window` holding admitted requests fits inside
        // (t − window, t] for its last admitted time t.
        for &(t, _) in &admitted {
            let units: u64 = admitted
                .iter()
                .filter(|&&(u, _)| u <= t && u + window > t)
                .map(|&(_, c)| c)
                .sum();
            prop_assert!(units <= limit, "{} units in ({}, {}]", units, t - window, t);
        }
    }

    /// With `window_ms × 1000` divisible by `limit` (an exact emission interval), GCRA and the
    /// token bucket are the same algorithm.
    #[test]
    fn prop_gcra_equals_token_bucket_with_an_exact_interval(
        (limit, window, burst, requests) in (1u64..=64, 1u64..=200, prop::option::of(1u64..=100))
            .prop_flat_map(|(limit, mult, burst)| {
                let window = mult * (limit / gcd(limit, 1000));
                let burst = burst.unwrap_or(limit);
                let step = (window / limit).max(1);
                let gap = prop_oneof![3 => Just(0u64), 5 => 0..=2 * step + 1, 1 => 0..=2 * window];
                let cost = prop_oneof![4 => Just(1u64), 2 => 1..=burst + 1];
                (Just(limit), Just(window), Just(burst),
                 prop::collection::vec((gap, cost), 1..120))
            }),
        t0 in 0u64..=2_000_000_000_000,
    ) {
        prop_assert_eq!(window * 1000 % limit, 0);
        let tb = quota(TokenBucket, limit, window).with_burst(burst);
        let gc = quota(Gcra, limit, window).with_burst(burst);
        let (mut a, mut b) = (Key::new(), Key::new());
        let mut now = t0;
        for (gap, cost) in requests {
            now += gap;
            let da = a.hit(&tb, now, cost);
            let db = b.hit(&gc, now, cost);
            prop_assert_eq!(da.allowed, db.allowed, "at {} cost {}: {:?} vs {:?}", now - t0, cost, da, db);
            prop_assert_eq!(da, db, "at {} cost {}", now - t0, cost);
        }
    }

    /// For every algorithm: a denied request's retry_after is exact (when the cost can ever
    /// fit), decisions match an independent model of the contract, reset_after restores the
    /// full quota, and expires_at is when the stored state stops mattering.
    #[test]
    fn prop_every_algorithm_follows_the_contract((q, t0, requests) in arb_scenario()) {
        let mut k = Key::new();
        let mut history: Vec<(u64, u64)> = Vec::new();
        let mut now = t0;
        let full = capacity(&q);
        for (gap, cost) in requests {
            now += gap;
            let out = k.outcome(&q, now, cost);
            let d = out.decision;
            let (allowed, remaining) = model(&q, &history, now, cost);
            prop_assert_eq!(d.allowed, allowed, "{:?} at {} cost {}: {:?}", q, now - t0, cost, d);
            prop_assert_eq!(d.remaining, remaining, "{:?} at {} cost {}: {:?}", q, now - t0, cost, d);
            if !d.allowed {
                check_retry(&k, &q, now, cost, &d)?;
            }
            k.hit(&q, now, cost);
            if d.allowed {
                history.push((now, cost));
            }
            // The whole quota is back after reset_after.
            let restored = k.peek(&q, now + d.reset_after_ms, full);
            prop_assert!(restored.allowed, "{:?}: full cost {} still denied {} ms after {:?}",
                q, full, d.reset_after_ms, d);
            // From expires_at on, the stored state makes no difference.
            for c in [1, full] {
                prop_assert_eq!(
                    check(&q, k.state.as_ref(), out.expires_at, c).decision,
                    check(&q, None, out.expires_at, c).decision,
                    "{:?}: state {:?} still matters at expires_at {}", q, k.state, out.expires_at
                );
            }
        }
    }

    /// For every algorithm: a denied decision's retry_after is exact even under heavy
    /// same-instant traffic with large costs.
    #[test]
    fn prop_retry_after_is_exact_under_bursts(
        q in arb_quota(),
        t0 in 0u64..=2_000_000_000_000,
        burst_sizes in prop::collection::vec((0u64..=40, 0u64..=5, 1u64..=3), 1..12),
    ) {
        let mut k = Key::new();
        let mut now = t0;
        let full = capacity(&q);
        for (n, gap_tenths, probe_div) in burst_sizes {
            now += gap_tenths * q.window_ms / 10;
            for _ in 0..n {
                k.hit(&q, now, 1);
            }
            for cost in [1, (full / probe_div).max(1), full] {
                let d = k.peek(&q, now, cost);
                if !d.allowed {
                    check_retry(&k, &q, now, cost, &d)?;
                }
            }
        }
    }
}

#[test]
fn the_system_clock_converts_a_wall_time_read_and_another_clock_tells_its_own() {
    struct Fixed(u64);
    impl Clock for Fixed {
        fn now_ms(&self) -> u64 {
            self.0
        }
    }
    let wall = std::time::UNIX_EPOCH + std::time::Duration::from_micros(1_795_770_960_123_999);
    assert_eq!(SystemClock.ms_at(wall), 1_795_770_960_123);
    assert_eq!(SystemClock.ms_at(std::time::UNIX_EPOCH), 0);
    assert_eq!(Fixed(42).ms_at(wall), 42);
}
