//! The embedded store: counters in this process, for a single gateway node.
//!
//! Keys are spread over [`SHARDS`] mutex-protected maps. A request's checks lock the shards
//! they touch in ascending order (so two requests can never deadlock), decide, and commit only
//! if every enforcing limit admits, which makes each request's check atomic and exact under
//! any concurrency.
//!
//! Memory is bounded: at most `max_keys` keys. Expired state is swept periodically and
//! whenever a shard is full; if a full shard has nothing expired, the keys closest to expiry
//! (those whose counters matter least) are evicted, one sixteenth of the shard at a time, and
//! counted in [`MemoryStore::evictions`].

use std::sync::atomic::{AtomicU64, Ordering};

use smallvec::SmallVec;

use super::key::{CounterKey, KeyMap};
use super::sharded::Sharded;
pub use super::sharded::SHARDS;
use super::{Check, Decisions};
use crate::limit::{check, Outcome, State};

struct Entry {
    state: State,
    /// ms since epoch after which the state no longer matters.
    expires_at: u64,
}

type Shard = KeyMap<Entry>;

/// The state of `entry`, unless it has expired at `now`.
fn live(entry: Option<&Entry>, now: u64) -> Option<&State> {
    entry.filter(|e| e.expires_at > now).map(|e| &e.state)
}

pub struct MemoryStore {
    shards: Sharded<Entry>,
    shard_cap: usize,
    evictions: AtomicU64,
}

impl MemoryStore {
    /// A store that keeps at most `max_keys` keys (rounded up to a multiple of [`SHARDS`]).
    pub fn new(max_keys: usize) -> Self {
        MemoryStore {
            shards: Sharded::default(),
            shard_cap: max_keys.div_ceil(SHARDS).max(1),
            evictions: AtomicU64::new(0),
        }
    }

    /// Check all of a request's limits atomically; see the module docs.
    pub fn check(&self, checks: &[Check], now: u64, out: &mut Decisions) {
        out.clear();
        if let [c] = checks {
            return self.check_one(c, now, out);
        }
        let mut locked = self.shards.lock(checks.iter().map(|c| &c.key));

        // Each check's map key (its algorithm's own slot) with its outcome, computed once.
        let mut outcomes: SmallVec<[(CounterKey, Outcome); 8]> = SmallVec::new();
        let mut admit = true;
        for c in checks {
            let key = c.key.for_algorithm(c.quota.algorithm);
            let o = check(&c.quota, live(locked.map(&key).get(&key), now), now, c.cost);
            admit &= o.decision.allowed || c.shadow;
            out.push(o.decision);
            outcomes.push((key, o));
        }
        if !admit {
            return;
        }
        // In place: moving the outcomes out would copy the whole (inline) vector first.
        for (key, o) in outcomes.iter_mut() {
            let Some(state) = o.next.take() else {
                continue;
            };
            let shard = locked.map_mut(key);
            if shard.len() >= self.shard_cap && !shard.contains_key(key) {
                self.make_room(shard, now);
            }
            shard.insert(
                *key,
                Entry {
                    state,
                    expires_at: o.expires_at,
                },
            );
        }
    }

    /// [`Self::check`] of a request with one limit, the common case: one shard locked, and
    /// the key looked up once, its entry then written in place.
    fn check_one(&self, c: &Check, now: u64, out: &mut Decisions) {
        let key = c.key.for_algorithm(c.quota.algorithm);
        let mut shard = self.shards.lock_one(&key);
        let entry = shard.get_mut(&key);
        let o = check(&c.quota, live(entry.as_deref(), now), now, c.cost);
        out.push(o.decision);
        let Some(state) = o.next.filter(|_| o.decision.allowed || c.shadow) else {
            return;
        };
        let new = Entry {
            state,
            expires_at: o.expires_at,
        };
        match entry {
            Some(e) => *e = new,
            None => {
                if shard.len() >= self.shard_cap {
                    self.make_room(&mut shard, now);
                }
                shard.insert(key, new);
            }
        }
    }

    /// Each check's decision for a request of cost 0 (remaining, reset), changing nothing.
    pub fn peek(&self, checks: &[Check], now: u64, out: &mut Decisions) {
        out.clear();
        let locked = self.shards.lock(checks.iter().map(|c| &c.key));
        for c in checks {
            let key = c.key.for_algorithm(c.quota.algorithm);
            out.push(check(&c.quota, live(locked.map(&key).get(&key), now), now, 0).decision);
        }
    }

    /// Drop the counters of `checks`; how many there were.
    pub fn remove(&self, checks: &[Check]) -> usize {
        let mut locked = self.shards.lock(checks.iter().map(|c| &c.key));
        let mut removed = 0;
        for c in checks {
            let key = c.key.for_algorithm(c.quota.algorithm);
            removed += usize::from(locked.map_mut(&key).remove(&key).is_some());
        }
        removed
    }

    fn make_room(&self, shard: &mut Shard, now: u64) {
        shard.retain(|_, e| e.expires_at > now);
        let target = self.shard_cap - (self.shard_cap / 16).max(1);
        if shard.len() <= target {
            return;
        }
        let excess = shard.len() - target;
        let mut expiries: Vec<u64> = shard.values().map(|e| e.expires_at).collect();
        let (_, &mut cut, _) = expiries.select_nth_unstable(excess - 1);
        let before = shard.len();
        let mut budget = excess;
        shard.retain(|_, e| {
            if budget > 0 && e.expires_at <= cut {
                budget -= 1;
                false
            } else {
                true
            }
        });
        self.evictions
            .fetch_add((before - shard.len()) as u64, Ordering::Relaxed);
    }

    /// Drop every expired key. Run periodically; takes one shard lock at a time.
    pub fn sweep(&self, now: u64) -> usize {
        let mut removed = 0;
        for mut s in self.shards.each() {
            let before = s.len();
            s.retain(|_, e| e.expires_at > now);
            removed += before - s.len();
        }
        removed
    }

    /// Drop every counter.
    pub fn clear(&self) {
        for mut s in self.shards.each() {
            s.clear();
        }
    }

    /// Keys currently held (including expired ones not yet swept).
    pub fn len(&self) -> usize {
        self.shards.each().map(|s| s.len()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Live keys evicted because the store was full.
    pub fn evictions(&self) -> u64 {
        self.evictions.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limit::{Algorithm, Quota};
    use crate::store::CounterKey;
    use std::sync::Arc;

    fn one(store: &MemoryStore, key: &str, q: Quota, now: u64) -> bool {
        let mut out = Decisions::new();
        let c = Check {
            id: 0,
            name: "t".into(),
            key: CounterKey::new("t", [key.as_bytes()]),
            quota: q,
            cost: 1,
            shadow: false,
        };
        store.check(&[c], now, &mut out);
        out[0].allowed
    }

    #[test]
    fn denied_request_consumes_nothing_from_other_limits() {
        let s = MemoryStore::new(1000);
        let minute = Quota::new(Algorithm::FixedWindow, 10, 60_000);
        let hour = Quota::new(Algorithm::FixedWindow, 2, 3_600_000);
        let checks = [
            Check {
                id: 0,
                name: "t".into(),
                key: CounterKey::new("minute", []),
                quota: minute,
                cost: 1,
                shadow: false,
            },
            Check {
                id: 0,
                name: "t".into(),
                key: CounterKey::new("hour", []),
                quota: hour,
                cost: 1,
                shadow: false,
            },
        ];
        let mut out = Decisions::new();
        for _ in 0..5 {
            s.check(&checks, 1_000, &mut out);
        }
        // Two admitted, three denied by the hour limit: the minute counter holds only two, so
        // on the last (denied) request its own check still reports 10 - 2 - 1 = 7.
        assert_eq!(out[0].remaining, 7);
        assert!(!out[1].allowed);
    }

    #[test]
    fn shadow_limit_never_blocks() {
        let s = MemoryStore::new(1000);
        let q = Quota::new(Algorithm::FixedWindow, 1, 60_000);
        let checks = [
            Check {
                id: 0,
                name: "t".into(),
                key: CounterKey::new("real", []),
                quota: Quota::new(Algorithm::FixedWindow, 5, 60_000),
                cost: 1,
                shadow: false,
            },
            Check {
                id: 0,
                name: "t".into(),
                key: CounterKey::new("shadow", []),
                quota: q,
                cost: 1,
                shadow: true,
            },
        ];
        let mut out = Decisions::new();
        let mut admitted = 0;
        for _ in 0..10 {
            s.check(&checks, 1_000, &mut out);
            if out[0].allowed {
                admitted += 1;
            }
        }
        assert_eq!(admitted, 5);
        assert!(!out[1].allowed);
    }

    #[test]
    fn exact_under_concurrency() {
        let s = Arc::new(MemoryStore::new(1000));
        let q = Quota::new(Algorithm::SlidingWindow, 100, 60_000);
        let admitted = Arc::new(AtomicU64::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (s, admitted) = (s.clone(), admitted.clone());
                std::thread::spawn(move || {
                    for _ in 0..125 {
                        if one(&s, "k", q, 5_000) {
                            admitted.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                })
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(admitted.load(Ordering::Relaxed), 100);
    }

    #[test]
    fn bounded_and_evicts_soonest_expiring() {
        let s = MemoryStore::new(SHARDS * 16);
        let q = Quota::new(Algorithm::FixedWindow, 10, 60_000);
        for i in 0..20_000u32 {
            one(&s, &i.to_string(), q, 1_000);
        }
        assert!(s.len() <= SHARDS * 16, "held {}", s.len());
        assert!(s.evictions() > 0);
        // Expired state is swept.
        let held = s.len();
        assert_eq!(s.sweep(120_000), held);
        assert!(s.is_empty());
    }
}
