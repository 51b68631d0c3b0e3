//! Quota leases: units a gateway took from Redis ahead of need, for one limit and caller, and
//! spends locally, so a caller this gateway sees often costs one store call per lease instead
//! of one per request.
//!
//! A lease is taken by the same script call that checks a request (`lua/check.lua`): the
//! limit admits the request's `cost` plus up to `extra` more units, all counted in Redis at
//! once. Redis never admits more than the limit, and a leased unit is one Redis admitted, so
//! the fleet never admits more than the limit either: a lease only moves *when* a unit is spent,
//! never how many exist. Spending later than Redis counted is safe for every algorithm that
//! leases: a fixed or sliding window counts the unit in the window it was taken in, and the
//! lease ends before that window does; a bucket (token_bucket, gcra) was drained earlier than
//! needed, which only delays later admissions.
//!
//! A lease ends at the earliest of: [`lease_ttl`] after it was taken, shortly before the end
//! of its window (fixed and sliding windows), a reload that changes its limit, or a change of
//! the caller's quota. Its unspent units are then given back by the sweeper
//! (`lua/lease_return.lua`), unless its window has ended: those are dropped, not credited to
//! the next window. A gateway that dies holding a lease loses its units until its window (or
//! the bucket's refill) restores them.
//!
//! Size: `extra` follows how many requests of the caller this gateway saw in the previous
//! period of [`PERIOD_MS`]: none for a caller seen fewer than twice (exactly one call per
//! request, as without leasing), up to `lease.max` for a hot one. A caller enters the table
//! only once [`heat`] finds it seen twice in a period (the table's own count starts there, so
//! its first lease comes with its third request at the soonest): a cold one costs no table
//! entry, lock or allocation, and its requests take exactly the path they take without
//! leasing.
//!
//! Bounded: LRU shards of at most the over-limit cache's `max_entries` in all; an evicted lease
//! is given back.
//!
//! Phase: `request_filter` (reserve, roll back, take), under one short shard lock at a time,
//! never across an await; the sweeper task (give back).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::sharded::{lru_shards, LruShard};
use super::{Check, CounterKey, Invalidation};
use crate::limit::{Algorithm, Decision, Quota};
use heat::Heat;

const SHARDS: usize = 16;
/// Requests are counted per period of this long to size the next lease.
pub const PERIOD_MS: u64 = 100;
/// A window lease ends this long before its window does, so that its unspent units are given
/// back while the window is still current.
pub const WINDOW_MARGIN_MS: u64 = 100;

/// A call asking for a lease that has not returned after this long no longer blocks others.
const ASKING_MS: u64 = 1000;

/// How long a lease of a limit with window `w` lasts at most: a quarter of the window, at
/// most 1 s.
pub fn lease_ttl(window_ms: u64) -> u64 {
    (window_ms / 4).clamp(1, 1000)
}

/// A lease that ended with units unspent: what the sweeper gives back.
#[derive(Debug, Clone)]
pub struct Ended {
    pub name: Arc<str>,
    pub key: CounterKey,
    pub quota: Quota,
    pub units: u64,
    /// fixed_window: the window's start (ms); sliding_window: its number; otherwise 0.
    pub window: u64,
}

/// One limit and caller on this gateway: the lease in hand, and the caller's recent rate.
#[derive(Debug)]
struct Entry {
    name: Arc<str>,
    quota: Quota,
    /// Units left to spend, until `until` (monotonic ms).
    balance: u64,
    until: u64,
    window: u64,
    /// Which lease this is, so a late roll-back never credits a newer one.
    id: u64,
    /// What Redis had left after the lease was taken, its reset, and when (store clock; and
    /// monotonic): for the headers of requests answered from the lease.
    remaining: u64,
    reset_after_ms: u64,
    at_ms: u64,
    taken: u64,
    /// Requests seen in the current period (since `period`), and in the one before.
    seen: u64,
    seen_before: u64,
    period: u64,
    /// A store call asking for a lease is under way until then (monotonic ms): one at a time,
    /// so a gateway never holds more than one lease's units. Requests that find one under way
    /// wait for it on `arrived` rather than calling the store themselves.
    asking_until: u64,
    arrived: Option<Arc<Notify>>,
}

/// Counters of leasing, for the metrics.
#[derive(Debug, Default)]
pub struct LeaseStats {
    pub taken: AtomicU64,
    pub units_taken: AtomicU64,
    /// Requests answered from a lease: store calls saved.
    pub answered: AtomicU64,
    pub units_given_back: AtomicU64,
    /// Leases that still held units when an invalidation (a reload changing their limit, a
    /// quota change, a usage reset) ended them.
    pub ended_early: AtomicU64,
    /// Units given back too late (their window had ended), or whose return failed.
    pub units_lost: AtomicU64,
}

type Shard = LruShard<Entry>;

/// The leases of this gateway.
pub struct Leases {
    shards: Box<[Mutex<Shard>]>,
    ended: Mutex<Vec<Ended>>,
    /// Invalidations to apply at the next sweep: every lease, or those of these limits.
    end_all: std::sync::atomic::AtomicBool,
    end_limits: Mutex<Vec<String>>,
    next_id: AtomicU64,
    /// Which callers may be warm enough to lease (`None`: leasing off).
    heat: Option<Heat>,
    pub stats: LeaseStats,
}

/// A request's units reserved from a lease, until the request is admitted or refused.
#[derive(Debug, Clone, Copy)]
pub struct Reserved {
    pub index: usize,
    pub id: u64,
    pub decision: Decision,
    pub at_ms: u64,
}

impl Leases {
    /// A table of at most `max_entries` callers (0: off).
    pub fn new(max_entries: usize) -> Leases {
        Leases {
            shards: lru_shards(max_entries, SHARDS),
            ended: Mutex::new(Vec::new()),
            end_all: std::sync::atomic::AtomicBool::new(false),
            end_limits: Mutex::new(Vec::new()),
            next_id: AtomicU64::new(1),
            heat: (max_entries > 0).then(Heat::new),
            stats: LeaseStats::default(),
        }
    }

    /// Count a request of `c`'s caller at `now` (monotonic ms); whether the caller may be warm
    /// enough to lease. Only then is the lease table worth a look: a cold caller costs one
    /// atomic operation (see [`heat`]).
    pub fn warm(&self, c: &Check, now: u64) -> bool {
        self.heat.as_ref().is_some_and(|h| h.touch(&c.key, now))
    }

    pub fn enabled(&self) -> bool {
        !self.shards.is_empty()
    }

    fn shard(&self, key: &CounterKey) -> &Mutex<Shard> {
        &self.shards[usize::from(key.0[2]) & (SHARDS - 1)]
    }

    /// Count `e` among the leases ended early when it is `running` (an invalidation or a quota
    /// change ends it before its time) and still holds units.
    fn count_early(&self, e: &Entry, running: bool) {
        if running && e.balance > 0 {
            self.stats.ended_early.fetch_add(1, Ordering::Relaxed);
        }
    }

    fn end(&self, key: CounterKey, e: &mut Entry) {
        if e.balance > 0 {
            self.ended.lock().push(Ended {
                name: e.name.clone(),
                key,
                quota: e.quota,
                units: e.balance,
                window: e.window,
            });
            e.balance = 0;
        }
    }

    /// Take `c.cost` units from this gateway's lease of `c` at `now` (monotonic ms): the
    /// request's decision and the store time, or `None` when the lease cannot pay (then the
    /// request asks Redis). Also counts the request for the next lease's size.
    pub fn reserve(&self, index: usize, c: &Check, now: u64) -> Option<Reserved> {
        let mut shard = self.shard(&c.key).lock();
        let Some(e) = shard.get_mut(&c.key) else {
            let fresh = Entry {
                name: c.name.clone(),
                quota: c.quota,
                balance: 0,
                until: 0,
                window: 0,
                id: 0,
                remaining: 0,
                reset_after_ms: 0,
                at_ms: 0,
                taken: 0,
                seen: 1,
                seen_before: 0,
                period: now,
                asking_until: 0,
                arrived: None,
            };
            if let Some((k, mut old)) = shard.push(c.key, fresh) {
                if k != c.key {
                    self.end(k, &mut old);
                }
            }
            return None;
        };
        if now >= e.period + PERIOD_MS {
            e.seen_before = if now < e.period + 2 * PERIOD_MS {
                e.seen
            } else {
                0
            };
            e.seen = 0;
            e.period = now;
        }
        e.seen += 1;
        if e.quota != c.quota || now >= e.until {
            self.count_early(e, e.quota != c.quota && now < e.until);
            self.end(c.key, e);
            e.quota = c.quota;
            return None;
        }
        if e.balance < c.cost {
            return None;
        }
        e.balance -= c.cost;
        // Another thread may have taken this lease after `now` was read.
        let passed = now.saturating_sub(e.taken);
        let decision = Decision::allow(
            c.quota.limit,
            e.remaining + e.balance,
            e.reset_after_ms.saturating_sub(passed),
        );
        self.stats.answered.fetch_add(1, Ordering::Relaxed);
        Some(Reserved {
            index,
            id: e.id,
            decision,
            at_ms: e.at_ms + passed,
        })
    }

    /// The request `r` was reserved for was refused: its units go back to the lease, or, if
    /// that lease has ended meanwhile, to Redis.
    pub fn roll_back(&self, r: &Reserved, c: &Check, now: u64) {
        let mut shard = self.shard(&c.key).lock();
        match shard.peek_mut(&c.key) {
            Some(e) if e.id == r.id && now < e.until => e.balance += c.cost,
            Some(e) if e.id == r.id => {
                e.balance += c.cost;
                self.end(c.key, e);
            }
            // Another lease now: this one ended, and its window id is lost with it; the units
            // are dropped (counted as lost), never credited to a later window.
            _ => {
                self.stats.units_lost.fetch_add(c.cost, Ordering::Relaxed);
            }
        }
        self.stats.answered.fetch_sub(1, Ordering::Relaxed);
    }

    /// How many units beyond its cost `c` should lease on this call at `now` (at most `max` in
    /// all). Only one call per caller asks at a time; [`Leases::asked`] ends it.
    pub fn extra(&self, c: &Check, max: u64, now: u64) -> u64 {
        let room = max.saturating_sub(c.cost);
        if room == 0 {
            return 0;
        }
        let mut shard = self.shard(&c.key).lock();
        let Some(e) = shard.peek_mut(&c.key) else {
            return 0;
        };
        // The caller's requests in the last period, expected again over the lease's life.
        let recent = e.seen.max(e.seen_before);
        if recent < 2 || now < e.asking_until || e.quota != c.quota {
            return 0;
        }
        e.asking_until = now + ASKING_MS;
        let per_lease = recent * c.cost * lease_ttl(c.quota.window_ms).div_ceil(PERIOD_MS);
        per_lease.min(room)
    }

    /// The call that asked for a lease of `c` has returned (whatever it took): the requests
    /// waiting for it try the lease again.
    pub fn asked(&self, c: &Check) {
        if let Some(e) = self.shard(&c.key).lock().peek_mut(&c.key) {
            e.asking_until = 0;
            if let Some(n) = &e.arrived {
                n.notify_waiters();
            }
        }
    }

    /// When a call asking for a lease of `c` is under way at `now`: what wakes its waiters.
    pub fn asking(&self, c: &Check, now: u64) -> Option<Arc<Notify>> {
        let mut shard = self.shard(&c.key).lock();
        let e = shard.peek_mut(&c.key)?;
        if now >= e.asking_until {
            return None;
        }
        Some(e.arrived.get_or_insert_with(Default::default).clone())
    }

    /// Redis gave `c` a lease of `units` on a call sent at `sent` (monotonic ms), deciding at
    /// `at_ms` (its clock) with `d` (after the lease).
    pub fn take(&self, c: &Check, units: u64, d: &Decision, at_ms: u64, sent: u64) {
        let q = c.quota;
        let to_end = q.window_ms - at_ms % q.window_ms;
        let (life, window) = match q.algorithm {
            Algorithm::FixedWindow => (
                to_end.saturating_sub(WINDOW_MARGIN_MS),
                at_ms - at_ms % q.window_ms,
            ),
            Algorithm::SlidingWindow => {
                (to_end.saturating_sub(WINDOW_MARGIN_MS), at_ms / q.window_ms)
            }
            _ => (u64::MAX, 0),
        };
        let until = sent + life.min(lease_ttl(q.window_ms));
        self.stats.taken.fetch_add(1, Ordering::Relaxed);
        self.stats.units_taken.fetch_add(units, Ordering::Relaxed);
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        let mut shard = self.shard(&c.key).lock();
        let e = match shard.get_mut(&c.key) {
            Some(e) => e,
            None => {
                let fresh = Entry {
                    name: c.name.clone(),
                    quota: q,
                    balance: 0,
                    until: 0,
                    window,
                    id,
                    remaining: 0,
                    reset_after_ms: 0,
                    at_ms,
                    taken: sent,
                    seen: 0,
                    seen_before: 0,
                    period: sent,
                    asking_until: 0,
                    arrived: None,
                };
                if let Some((k, mut old)) = shard.push(c.key, fresh) {
                    if k != c.key {
                        self.end(k, &mut old);
                    }
                }
                shard.get_mut(&c.key).expect("just put")
            }
        };
        // A lease still running in the same window keeps its end; any other ends now.
        let merge = e.balance > 0 && e.quota == q && e.window == window && sent < e.until;
        if !merge {
            self.end(c.key, e);
            e.until = until;
        } else {
            e.until = e.until.min(until);
        }
        e.quota = q;
        e.balance += units;
        e.window = window;
        e.id = id;
        e.remaining = d.remaining;
        e.reset_after_ms = d.reset_after_ms;
        e.at_ms = at_ms;
        e.taken = sent;
        if sent >= e.until {
            self.end(c.key, e);
        }
    }

    /// End, at the next sweep, the leases `inv` names; a usage reset's callers lose theirs at
    /// once (their counters are gone, and the leased units with them).
    pub fn mark(&self, inv: &Invalidation) {
        match inv {
            Invalidation::All => self.end_all.store(true, Ordering::Relaxed),
            Invalidation::Limits(names) => self.end_limits.lock().extend(names.iter().cloned()),
            Invalidation::Denials(_) => {}
            Invalidation::Keys(keys) => {
                for k in keys {
                    if let Some(s) = self.shards.get(usize::from(k.0[2]) & (SHARDS - 1)) {
                        if let Some(e) = s.lock().pop(k) {
                            self.count_early(&e, true);
                        }
                    }
                }
            }
        }
    }

    /// End every lease that has run out by `now`, and those marked; what to give back.
    pub fn sweep(&self, now: u64) -> Vec<Ended> {
        let all = self.end_all.swap(false, Ordering::Relaxed);
        let names = std::mem::take(&mut *self.end_limits.lock());
        for s in self.shards.iter() {
            let mut shard = s.lock();
            for (k, e) in shard.iter_mut() {
                let marked = all || names.iter().any(|n| **n == *e.name);
                self.count_early(e, marked && now < e.until);
                if marked {
                    e.until = e.until.min(now);
                }
                if e.balance > 0 && now >= e.until {
                    let k = *k;
                    self.end(k, e);
                }
            }
        }
        std::mem::take(&mut *self.ended.lock())
    }

    /// Units held in leases now.
    pub fn held(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.lock().iter().map(|(_, e)| e.balance).sum::<u64>())
            .sum()
    }
}

mod heat;
#[cfg(test)]
mod tests;
