//! The five rate-limit algorithms as pure functions of `(quota, state, now, cost)`.
//!
//! Phase: called by a store while it holds the state of one key (memory store: under the
//! shard lock; Redis: the Lua scripts in `lua/` implement the same arithmetic). Nothing here
//! reads a clock, allocates on the common path or touches I/O, so every decision can be
//! replayed in tests with a fake clock.
//!
//! All arithmetic is integer. Times are milliseconds since the Unix epoch; GCRA keeps its
//! theoretical arrival time in microseconds. Validation bounds `limit × window_ms` and
//! `burst × window_ms` by 2^53 so the same numbers are exact in Lua's doubles.

use std::collections::VecDeque;

use super::{Algorithm, Decision, Quota};

/// The stored state of one key. A key whose state has another shape (the limit changed
/// algorithm in a reload) is treated as fresh.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum State {
    /// `fixed_window` and `sliding_window`: the current window's start and count, and the
    /// previous window's count (always 0 for `fixed_window`).
    Window { start: u64, count: u64, prev: u64 },
    /// `sliding_log`: admitted `(timestamp, cost)` entries, oldest first.
    Log(VecDeque<(u64, u64)>),
    /// `token_bucket`: tokens scaled by `window_ms` (so refill is `limit` per ms) and the time
    /// of the last update.
    Bucket { tokens: u64, last: u64 },
    /// `gcra`: the theoretical arrival time, in microseconds.
    Tat(u64),
}

/// The outcome of one check: the decision, and the state to store if the request is admitted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Outcome {
    pub decision: Decision,
    /// The state after consuming `cost`; `None` when the request is denied (nothing changes).
    pub next: Option<State>,
    /// When the stored state becomes irrelevant (ms since epoch): the TTL of the key.
    pub expires_at: u64,
}

/// Decide one request of `cost` units against `quota` at `now` (ms), given the key's state.
pub fn check(quota: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    match quota.algorithm {
        Algorithm::FixedWindow => fixed_window(quota, state, now, cost),
        Algorithm::SlidingWindow => sliding_window(quota, state, now, cost),
        Algorithm::SlidingLog => sliding_log(quota, state, now, cost),
        Algorithm::TokenBucket => token_bucket(quota, state, now, cost),
        Algorithm::Gcra => gcra(quota, state, now, cost),
    }
}

fn div_ceil(a: u128, b: u128) -> u64 {
    a.div_ceil(b) as u64
}

fn fixed_window(q: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    let w = q.window_ms;
    let start = now - now % w;
    let count = match state {
        Some(State::Window {
            start: s, count, ..
        }) if *s == start => *count,
        _ => 0,
    };
    let reset_after = start + w - now;
    let expires_at = start + w;
    if count + cost <= q.limit {
        Outcome {
            decision: Decision::allow(q.limit, q.limit - count - cost, reset_after),
            next: Some(State::Window {
                start,
                count: count + cost,
                prev: 0,
            }),
            expires_at,
        }
    } else {
        // A cost above the limit can never pass; the window end is the honest best answer.
        let remaining = q.limit.saturating_sub(count);
        Outcome {
            decision: Decision::deny(q.limit, remaining, reset_after, reset_after),
            next: None,
            expires_at,
        }
    }
}

fn sliding_window(q: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    let w = q.window_ms;
    let start = now - now % w;
    let (prev, cur) = match state {
        Some(State::Window {
            start: s,
            count,
            prev,
        }) if *s == start => (*prev, *count),
        Some(State::Window {
            start: s, count, ..
        }) if *s + w == start => (*count, 0),
        _ => (0, 0),
    };
    let elapsed = now - start;
    let (w128, limit128) = (w as u128, q.limit as u128);
    // estimate × w = prev × (w − elapsed) + cur × w
    let est = prev as u128 * (w - elapsed) as u128 + cur as u128 * w128;
    let need = cost as u128 * w128;
    let capacity = limit128 * w128;
    let expires_at = start + 2 * w;
    if est + need <= capacity {
        let cur = cur + cost;
        // Time until the estimate is back to zero: the current count fades out over the next
        // window.
        let reset_after = 2 * w - elapsed;
        Outcome {
            decision: Decision::allow(
                q.limit,
                ((capacity - est - need) / w128) as u64,
                reset_after,
            ),
            next: Some(State::Window {
                start,
                count: cur,
                prev,
            }),
            expires_at,
        }
    } else {
        let remaining = (capacity.saturating_sub(est) / w128) as u64;
        let to_window_end = w - elapsed;
        let retry_after = if cur + cost <= q.limit {
            // Only the previous window's weight blocks: wait until it has faded enough.
            // prev × (w − elapsed − t) ≤ (limit − cur − cost) × w
            let room = (q.limit - cur - cost) as u128 * w128;
            to_window_end - (room / prev as u128) as u64
        } else if cost <= q.limit {
            // The current window alone is too full: in the next window it becomes `prev`.
            // cur × (w − e') ≤ (limit − cost) × w
            let room = (q.limit - cost) as u128 * w128;
            to_window_end + w.saturating_sub((room / cur as u128) as u64)
        } else {
            w
        };
        let reset_after = if cur > 0 {
            to_window_end + w
        } else {
            to_window_end
        };
        Outcome {
            decision: Decision::deny(q.limit, remaining, reset_after, retry_after),
            next: None,
            expires_at,
        }
    }
}

fn sliding_log(q: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    let w = q.window_ms;
    let empty = VecDeque::new();
    let stored = match state {
        Some(State::Log(entries)) => entries,
        _ => &empty,
    };
    // Entries in (now − w, now] are inside the window; the older ones, at the front, are
    // skipped here and dropped only when an admitted request writes a new log, so a denial
    // copies nothing.
    let expired = stored.iter().take_while(|&&(ts, _)| ts + w <= now).count();
    let log = stored.range(expired..);
    let used: u64 = log.clone().map(|&(_, c)| c).sum();
    if used + cost <= q.limit {
        let mut next: VecDeque<(u64, u64)> = VecDeque::with_capacity(log.len() + 1);
        next.extend(log);
        match next.back_mut() {
            Some((ts, c)) if *ts == now => *c += cost,
            _ => next.push_back((now, cost)),
        }
        let oldest_expiry = now + w;
        Outcome {
            decision: Decision::allow(q.limit, q.limit - used - cost, w),
            next: Some(State::Log(next)),
            expires_at: oldest_expiry,
        }
    } else {
        let last = log.clone().next_back().map_or(now, |&(ts, _)| ts);
        let reset_after = last + w - now;
        let retry_after = if cost <= q.limit {
            let mut freed = 0;
            let mut at = reset_after;
            for &(ts, c) in log {
                freed += c;
                if used - freed + cost <= q.limit {
                    at = ts + w - now;
                    break;
                }
            }
            at
        } else {
            w
        };
        Outcome {
            decision: Decision::deny(
                q.limit,
                q.limit.saturating_sub(used),
                reset_after,
                retry_after,
            ),
            next: None,
            expires_at: last + w,
        }
    }
}

fn token_bucket(q: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    let w = q.window_ms as u128;
    let rate = q.limit as u128; // scaled tokens per ms
    let capacity = q.burst as u128 * w;
    let tokens = match state {
        Some(State::Bucket { tokens, last }) => {
            let elapsed = now.saturating_sub(*last) as u128;
            capacity.min(*tokens as u128 + elapsed * rate)
        }
        _ => capacity,
    };
    let need = cost as u128 * w;
    if tokens >= need {
        let left = tokens - need;
        let reset_after = div_ceil(capacity - left, rate);
        Outcome {
            decision: Decision::allow(q.limit, (left / w) as u64, reset_after),
            next: Some(State::Bucket {
                tokens: left as u64,
                last: now,
            }),
            expires_at: now + reset_after,
        }
    } else {
        let reset_after = div_ceil(capacity - tokens, rate);
        let retry_after = if need <= capacity {
            div_ceil(need - tokens, rate)
        } else {
            q.window_ms
        };
        Outcome {
            decision: Decision::deny(q.limit, (tokens / w) as u64, reset_after, retry_after),
            next: None,
            expires_at: now + reset_after,
        }
    }
}

/// The GCRA emission interval in microseconds, rounded up so the long-run rate never exceeds
/// `limit` per window.
pub fn gcra_interval_us(q: &Quota) -> u64 {
    (q.window_ms * 1000).div_ceil(q.limit)
}

fn gcra(q: &Quota, state: Option<&State>, now: u64, cost: u64) -> Outcome {
    let t = gcra_interval_us(q);
    let now_us = now * 1000;
    let tolerance = q.burst * t;
    let tat = match state {
        Some(State::Tat(tat)) => (*tat).max(now_us),
        _ => now_us,
    };
    let new_tat = tat + cost * t;
    let ms = |us: u64| us.div_ceil(1000);
    if new_tat - now_us <= tolerance {
        let remaining = (tolerance - (new_tat - now_us)) / t;
        Outcome {
            decision: Decision::allow(q.limit, remaining, ms(new_tat - now_us)),
            next: Some(State::Tat(new_tat)),
            expires_at: ms(new_tat),
        }
    } else {
        let remaining = tolerance.saturating_sub(tat - now_us) / t;
        let retry_after = if cost * t <= tolerance {
            ms(new_tat - now_us - tolerance)
        } else {
            q.window_ms
        };
        Outcome {
            decision: Decision::deny(q.limit, remaining, ms(tat - now_us), retry_after),
            next: None,
            expires_at: ms(tat),
        }
    }
}
