//! The over-limit cache: denials Redis gave, answered again from this gateway's memory until
//! they end, so a caller hammering a limit it is already over costs no store call.
//!
//! An entry is kept per counter (limit and caller) when Redis denies an enforcing limit that
//! allows it (`over_limit_cache`, default true). It holds the denial, the quota it was decided
//! under and the cost that was asked for, and it ends `retry_after` after the call was *sent*,
//! on this gateway's monotonic clock (never its wall clock: gateways may be skewed and Redis
//! is the clock). Redis decided no earlier than the call was sent, so the entry ends no later
//! than the store's own denial would.
//!
//! Why a cached denial is one the store would also give: for every algorithm, what others
//! consume can only push a caller's next admission later, never earlier, and `retry_after` is
//! the first millisecond at which a request of that cost could be admitted if nobody else
//! consumed anything. So until then, the store denies any request of that cost or more. A
//! request of a smaller cost, or under another quota (a reload or a quota override changed the
//! limit), is not answered from the entry. What can change the counter itself (a usage reset)
//! removes entries on every gateway through [`Invalidation`] messages over Redis pub/sub.
//!
//! Bounded: LRU shards of at most `store.over_limit_cache.max_entries` entries in all.
//!
//! Phase: `request_filter` (lookups and inserts, under one short shard lock each, never held
//! across an await), the pub/sub task and reloads (removals).

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::sharded::{lru_shards, LruShard};
use super::{Check, CounterKey};
use crate::config::{Config, Spec};
use crate::limit::{Decision, Quota};

/// Shards of the cache; a power of two.
const SHARDS: usize = 16;

/// One cached denial.
#[derive(Debug, Clone)]
struct Entry {
    name: Arc<str>,
    quota: Quota,
    /// The cost that was denied: a request of this cost or more is denied until `until`.
    cost: u64,
    decision: Decision,
    /// When the store decided (its clock, ms since the Unix epoch).
    at_ms: u64,
    /// Monotonic ms (since the cache's origin) when the call was sent, and when the denial ends.
    sent: u64,
    until: u64,
}

type Shard = LruShard<Entry>;

/// The cache; with `max_entries` 0 it holds nothing and every call is a no-op.
pub struct OverLimitCache {
    shards: Box<[Mutex<Shard>]>,
    origin: Instant,
    /// Entries held, so that lookups skip the locks while the cache is empty.
    len: AtomicUsize,
    /// Requests answered from the cache: store calls saved.
    pub hits: AtomicU64,
    /// Denials added.
    pub inserts: AtomicU64,
}

/// What one invalidation message asks every gateway to drop.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Invalidation {
    /// Everything.
    All,
    /// The entries of these counters (a usage reset).
    Keys(Vec<CounterKey>),
    /// The entries of these limits (a reload changed them).
    Limits(Vec<String>),
    /// Only the cached denials of these counters, not their leases: leased units came back.
    Denials(Vec<CounterKey>),
}

impl Invalidation {
    /// The message text: `all`, `keys <hex>...`, `limits <name>...` (names never hold spaces).
    pub fn encode(&self) -> String {
        match self {
            Invalidation::All => "all".to_string(),
            Invalidation::Keys(keys) | Invalidation::Denials(keys) => {
                let mut s = String::from(match self {
                    Invalidation::Keys(_) => "keys",
                    _ => "denials",
                });
                for k in keys {
                    s.push(' ');
                    k.write_hex(&mut s);
                }
                s
            }
            Invalidation::Limits(names) => format!("limits {}", names.join(" ")),
        }
    }

    /// Parse a message; `None` when it is not one (then everything is dropped, to be safe).
    pub fn decode(text: &str) -> Option<Invalidation> {
        let mut words = text.split(' ');
        match words.next()? {
            "all" => Some(Invalidation::All),
            "keys" => words
                .map(CounterKey::from_hex)
                .collect::<Option<Vec<_>>>()
                .map(Invalidation::Keys),
            "limits" => Some(Invalidation::Limits(words.map(str::to_string).collect())),
            "denials" => words
                .map(CounterKey::from_hex)
                .collect::<Option<Vec<_>>>()
                .map(Invalidation::Denials),
            _ => None,
        }
    }
}

impl OverLimitCache {
    /// A cache of at most `max_entries` denials (0: off).
    pub fn new(max_entries: usize) -> OverLimitCache {
        OverLimitCache {
            shards: lru_shards(max_entries, SHARDS),
            origin: Instant::now(),
            len: AtomicUsize::new(0),
            hits: AtomicU64::new(0),
            inserts: AtomicU64::new(0),
        }
    }

    /// Whether the cache is on.
    pub fn enabled(&self) -> bool {
        !self.shards.is_empty()
    }

    /// Now on the cache's monotonic clock (ms since it was made).
    pub fn now(&self) -> u64 {
        self.ms(Instant::now())
    }

    /// `t` on the cache's clock (0 before the cache was made).
    pub fn ms(&self, t: Instant) -> u64 {
        t.saturating_duration_since(self.origin).as_millis() as u64
    }

    /// Entries held.
    pub fn len(&self) -> usize {
        self.len.load(Ordering::Relaxed)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn shard(&self, key: &CounterKey) -> &Mutex<Shard> {
        &self.shards[usize::from(key.0[1]) & (SHARDS - 1)]
    }

    /// The most restrictive cached denial among `checks` that `eligible` admits, at `now`
    /// (monotonic ms, [`OverLimitCache::now`]): the check's index, the denial as the store would
    /// give it now (its waits shortened by the time passed) and the store's time now.
    pub fn lookup(
        &self,
        checks: &[Check],
        now: u64,
        eligible: impl Fn(&Check) -> bool,
    ) -> Option<(usize, Decision, u64)> {
        if self.is_empty() {
            return None;
        }
        let mut best: Option<(usize, Decision, u64)> = None;
        for (i, c) in checks.iter().enumerate() {
            if !eligible(c) {
                continue;
            }
            let mut shard = self.shard(&c.key).lock();
            let Some(e) = shard.get(&c.key) else { continue };
            if now >= e.until || e.quota != c.quota {
                shard.pop(&c.key);
                self.len.fetch_sub(1, Ordering::Relaxed);
                continue;
            }
            if c.cost < e.cost {
                continue; // a smaller request might fit: ask the store
            }
            // Another thread may have put this entry after `now` was read.
            let passed = now.saturating_sub(e.sent);
            let d = Decision::deny(
                e.decision.limit,
                e.decision.remaining,
                e.decision.reset_after_ms.saturating_sub(passed),
                e.decision.retry_after_ms.saturating_sub(passed),
            );
            let at = e.at_ms + passed;
            drop(shard);
            if best.is_none_or(|(_, b, _)| d.more_restrictive_than(&b)) {
                best = Some((i, d, at));
            }
        }
        if best.is_some() {
            self.hits.fetch_add(1, Ordering::Relaxed);
        }
        best
    }

    /// Keep the denials among `decisions` (one per check; the store decided at `at_ms`, and the
    /// call was sent at monotonic `sent`) of the checks `keep` gives a bound to: `Some(ms)`, the
    /// longest a denial of that check may be kept (a limit that leases: units other gateways
    /// hold may come back before `retry_after`), `None`: not kept.
    pub fn remember(
        &self,
        checks: &[Check],
        decisions: &[Decision],
        at_ms: u64,
        sent: u64,
        keep: impl Fn(&Check) -> Option<u64>,
    ) {
        if !self.enabled() {
            return;
        }
        for (c, d) in checks.iter().zip(decisions) {
            if d.allowed || d.retry_after_ms == 0 {
                continue;
            }
            let Some(longest) = keep(c) else { continue };
            let entry = Entry {
                name: c.name.clone(),
                quota: c.quota,
                cost: c.cost,
                decision: *d,
                at_ms,
                sent,
                until: sent + d.retry_after_ms.min(longest),
            };
            let mut shard = self.shard(&c.key).lock();
            let before = shard.len();
            // A cheaper denial says more (it covers more requests); keep it while it lasts.
            if let Some(old) = shard.peek(&c.key) {
                if old.cost < entry.cost && old.quota == entry.quota && old.until > sent {
                    continue;
                }
            }
            shard.put(c.key, entry);
            let after = shard.len();
            drop(shard);
            // Otherwise it replaced an entry or evicted the least recently used.
            if after > before {
                self.len.fetch_add(1, Ordering::Relaxed);
            }
            self.inserts.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Drop what `inv` names.
    pub fn invalidate(&self, inv: &Invalidation) {
        match inv {
            Invalidation::All => self.clear(),
            Invalidation::Keys(keys) | Invalidation::Denials(keys) => {
                for k in keys {
                    if !self.enabled() {
                        return;
                    }
                    if self.shard(k).lock().pop(k).is_some() {
                        self.len.fetch_sub(1, Ordering::Relaxed);
                    }
                }
            }
            Invalidation::Limits(names) => self.retain(|e| !names.iter().any(|n| **n == *e.name)),
        }
    }

    /// Drop every entry.
    pub fn clear(&self) {
        self.retain(|_| false);
    }

    fn retain(&self, keep: impl Fn(&Entry) -> bool) {
        for s in self.shards.iter() {
            let mut shard = s.lock();
            let drop_keys: Vec<CounterKey> = shard
                .iter()
                .filter(|(_, e)| !keep(e))
                .map(|(k, _)| *k)
                .collect();
            for k in drop_keys {
                shard.pop(&k);
                self.len.fetch_sub(1, Ordering::Relaxed);
            }
        }
    }
}

/// The rate limits of `old` that `new` changes (parameters, shadow, `over_limit_cache`) or
/// drops: their cached denials must go.
pub fn changed_limits(old: &Config, new: &Config) -> Vec<String> {
    old.limits
        .iter()
        .filter_map(|l| {
            let Spec::Rate(r) = &l.spec else { return None };
            let same = new
                .limits
                .iter()
                .find(|n| n.name == l.name)
                .is_some_and(|n| {
                    matches!(&n.spec, Spec::Rate(s) if s.quota == r.quota)
                        && n.shadow == l.shadow
                        && n.over_limit_cache == l.over_limit_cache
                        && n.key == l.key
                });
            (!same).then(|| l.name.to_string())
        })
        .collect()
}

#[cfg(test)]
mod tests;
