//! Checks with quota leases (see [`super::lease`]): the store seam's side of leasing.
//!
//! A request first pays from this gateway's leases the limits it can; the others go to Redis
//! in one call, which may also take new leases. All or nothing still holds: units reserved
//! from a lease are spent only if the Redis call admits the rest, and go back to their lease
//! otherwise, so no limit is consumed without the others.
//!
//! Phase: `request_filter` (checks); the maintenance task (giving back).

use smallvec::SmallVec;

use super::lease::{Ended, Reserved};
use super::redis::Took;
use super::{Backend, Check, Checks, Decisions, Invalidation, Store, StoreError};

/// How long a request waits for a lease another request of the same caller is taking, before
/// it calls the store itself.
const LEASE_WAIT: std::time::Duration = std::time::Duration::from_millis(20);

/// Which checks of a request a lease answered: bit `i` for check `i` (checks past 64 never
/// lease).
pub type FromLease = u64;

impl Store {
    /// [`Store::check`], where check `i` may lease up to `max[i]` units per store call (0 or
    /// 1: no leasing). `from_lease` gets the checks a lease answered.
    pub async fn check_leasing(
        &self,
        checks: &[Check],
        max: &[u64],
        now: u64,
        out: &mut Decisions,
        from_lease: &mut FromLease,
    ) -> Result<u64, StoreError> {
        *from_lease = 0;
        let Backend::Redis(redis) = &self.backend else {
            return self.check(checks, now, out).await;
        };
        let mut mono = self.over_limit.now();
        let warm = self.warm(checks, max, mono);
        if warm == 0 {
            // Only cold callers: exactly the path without leasing.
            return Box::pin(redis.check(checks, now, out)).await;
        }
        let mut reserved = self.reserve(checks, warm, mono);
        if reserved.len() < checks.len() && self.wait_for_lease(checks, warm, &reserved, mono).await
        {
            self.roll_back(checks, &reserved, mono);
            mono = self.over_limit.now();
            reserved = self.reserve(checks, warm, mono);
        }
        out.clear();
        if reserved.len() == checks.len() {
            for r in &reserved {
                *from_lease |= 1 << r.index;
                out.push(r.decision);
            }
            return Ok(reserved[0].at_ms);
        }
        let (owned, extra) = self.rest(checks, max, warm, &reserved, mono);
        let rest: &[Check] = owned.as_deref().unwrap_or(checks);
        let mut decided = Decisions::new();
        let mut took = Took::new();
        let result =
            Box::pin(redis.check_leasing(rest, &extra, now, &mut decided, &mut took)).await;
        for (c, _) in rest.iter().zip(&extra).filter(|(_, &e)| e > 0) {
            self.leases.asked(c);
        }
        let at = match result {
            Ok(at) => at,
            Err(e) => {
                self.roll_back(checks, &reserved, mono);
                return Err(e);
            }
        };
        for ((c, d), &units) in rest.iter().zip(&decided).zip(&took) {
            if units > 0 {
                self.leases.take(c, units, d, at, mono);
            }
        }
        let admitted = rest
            .iter()
            .zip(&decided)
            .all(|(c, d)| d.allowed || c.shadow);
        if !admitted {
            self.roll_back(checks, &reserved, mono);
        }
        let mut from_redis = decided.iter();
        for i in 0..checks.len() {
            match reserved.iter().find(|r| r.index == i) {
                Some(r) => {
                    if admitted {
                        *from_lease |= 1 << i;
                    }
                    out.push(r.decision);
                }
                None => out.push(*from_redis.next().expect("one decision per check")),
            }
        }
        Ok(at)
    }

    /// Put every reserved unit back: the request was not admitted.
    fn roll_back(&self, checks: &[Check], reserved: &[Reserved], mono: u64) {
        for r in reserved {
            self.leases.roll_back(r, &checks[r.index], mono);
        }
    }

    /// When a lease call for one of the checks no lease paid is under way, wait for it
    /// (at most [`LEASE_WAIT`]) instead of calling the store too; whether it waited.
    async fn wait_for_lease(
        &self,
        checks: &[Check],
        warm: FromLease,
        reserved: &[Reserved],
        mono: u64,
    ) -> bool {
        let unpaid = |i: &usize| bit_set(warm, *i) && !reserved.iter().any(|r| r.index == *i);
        let Some(arrived) = (0..checks.len())
            .filter(unpaid)
            .find_map(|i| self.leases.asking(&checks[i], mono))
        else {
            return false;
        };
        let notified = arrived.notified();
        tokio::pin!(notified);
        notified.as_mut().enable();
        // It may have arrived between the look and the registration.
        if !(0..checks.len())
            .filter(unpaid)
            .any(|i| self.leases.asking(&checks[i], mono).is_some())
        {
            return true;
        }
        let _ = tokio::time::timeout(LEASE_WAIT, notified).await;
        true
    }

    /// Count the request for each check that leases (see [`super::lease::Leases::warm`]);
    /// the checks whose callers may be warm enough to lease, as bits.
    fn warm(&self, checks: &[Check], max: &[u64], mono: u64) -> FromLease {
        let mut warm = 0;
        for (i, c) in checks.iter().enumerate().take(64) {
            if max[i] > 1 && !c.shadow && self.leases.warm(c, mono) {
                warm |= 1 << i;
            }
        }
        warm
    }

    /// Reserve each warm check's cost from this gateway's lease, where it can pay.
    fn reserve(&self, checks: &[Check], warm: FromLease, mono: u64) -> SmallVec<[Reserved; 8]> {
        let mut reserved = SmallVec::new();
        for (i, c) in checks.iter().enumerate().take(64) {
            if bit_set(warm, i) {
                if let Some(r) = self.leases.reserve(i, c, mono) {
                    reserved.push(r);
                }
            }
        }
        reserved
    }

    /// The checks no lease paid for (`None`: all of them), and the extra units each may lease
    /// (empty: none asks).
    fn rest(
        &self,
        checks: &[Check],
        max: &[u64],
        warm: FromLease,
        reserved: &[Reserved],
        mono: u64,
    ) -> (Option<Checks>, SmallVec<[u64; 8]>) {
        let mut rest = Checks::new();
        let mut extra: SmallVec<[u64; 8]> = SmallVec::new();
        for (i, c) in checks.iter().enumerate() {
            if !reserved.iter().any(|r| r.index == i) {
                extra.push(if bit_set(warm, i) {
                    self.leases.extra(c, max[i], mono)
                } else {
                    0
                });
                if !reserved.is_empty() {
                    rest.push(c.clone());
                }
            }
        }
        if extra.iter().all(|&e| e == 0) {
            extra.clear();
        }
        ((!reserved.is_empty()).then_some(rest), extra)
    }

    /// Give back the units of every lease that has ended or was marked to end; a no-op without
    /// leases.
    pub async fn sweep_leases(&self) {
        let Backend::Redis(redis) = &self.backend else {
            return;
        };
        if !self.leases.enabled() {
            return;
        }
        let ended = self.leases.sweep(self.over_limit.now());
        self.give_back(redis, ended).await;
    }

    async fn give_back(&self, redis: &super::RedisStore, ended: Vec<Ended>) {
        if ended.is_empty() {
            return;
        }
        let units: u64 = ended.iter().map(|e| e.units).sum();
        let keys: Vec<_> = ended.iter().map(|e| e.key).collect();
        let stats = &self.leases.stats;
        use std::sync::atomic::Ordering::Relaxed;
        match Box::pin(redis.give_back(&ended)).await {
            Ok((back, dropped)) => {
                stats.units_given_back.fetch_add(back, Relaxed);
                stats.units_lost.fetch_add(dropped, Relaxed);
                // Denials cached anywhere while these units were leased out may be wrong now.
                if back > 0 {
                    let inv = Invalidation::Denials(keys);
                    self.over_limit.invalidate(&inv);
                    if let Err(e) = Box::pin(redis.publish_invalidation(&inv)).await {
                        tracing::warn!("over-limit cache invalidation not published: {e}");
                    }
                }
            }
            Err(e) => {
                tracing::warn!(units, "leased units not given back: {e}");
                stats.units_lost.fetch_add(units, Relaxed);
            }
        }
    }

    /// End the leases `inv` names and give their units back.
    pub(super) async fn end_leases(&self, inv: &Invalidation) {
        self.leases.mark(inv);
        self.sweep_leases().await;
    }
}

/// Whether bit `i` of `bits` is set (never, past 64).
pub fn bit_set(bits: FromLease, i: usize) -> bool {
    i < 64 && bits & (1 << i) != 0
}
