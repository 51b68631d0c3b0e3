//! Concurrency slots held in this process: the memory store's, and those `on_error: local`
//! limits take while Redis cannot answer. Per key, the requests holding a slot; a key exists
//! only while some request holds one, so memory follows the requests in flight.
//!
//! [`HeldSlots`] is the guard a request keeps in its context: dropping it gives its slots back
//! exactly once, to this process or to Redis, however the request ends.
//!
//! Phase: `request_filter` (take) and the end of the request (release). The shards are locked
//! for a few map operations and never across an await; a Redis release runs on a spawned task.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use smallvec::SmallVec;

use super::sharded::Sharded;
use super::{Claim, CounterKey, Store};

/// Slots in use per claim of one request, before it took its own.
pub type InUse = SmallVec<[u64; 4]>;

/// Attempts to give slots back to Redis. A release is idempotent (a member is removed at most
/// once), so a failed one is retried, after 50 ms, then twice as long each time (1.55 s in
/// all); after that the slots expire with their `timeout`.
pub const RELEASE_ATTEMPTS: u32 = 6;

/// One key's slots: (request id, taken at ms), oldest first. Inline up to 4, so a key with
/// few requests in progress (the usual case) costs no allocation as it comes and goes.
type Holders = SmallVec<[(u64, u64); 4]>;

/// Slots in this process.
#[derive(Default)]
pub struct MemorySlots {
    shards: Sharded<Holders>,
}

impl MemorySlots {
    pub fn new() -> MemorySlots {
        MemorySlots::default()
    }

    /// Take a slot of every claim for request `id` at `now` (monotonic ms), all or nothing.
    /// `in_use` receives each claim's slots in use before this request. The request holds its
    /// slots (and `true` is returned) exactly when every enforcing claim had room; a full
    /// shadow claim gives it no slot and does not stop it.
    pub fn take(&self, claims: &[Claim], id: u64, now: u64, in_use: &mut InUse) -> bool {
        in_use.clear();
        let mut locked = self.shards.lock(claims.iter().map(|c| &c.key));
        let mut admit = true;
        for c in claims {
            let shard = locked.map_mut(&c.key);
            let mut n = 0;
            if let Some(holders) = shard.get_mut(&c.key) {
                let expired = holders
                    .iter()
                    .take_while(|&&(_, at)| at + c.timeout_ms <= now)
                    .count();
                holders.drain(..expired);
                n = holders.len() as u64;
            }
            if n == 0 {
                shard.remove(&c.key);
            }
            admit &= n < c.cap || c.shadow;
            in_use.push(n);
        }
        if !admit {
            return false;
        }
        for (c, &n) in claims.iter().zip(in_use.iter()) {
            if n < c.cap {
                locked
                    .map_mut(&c.key)
                    .entry(c.key)
                    .or_default()
                    .push((id, now));
            }
        }
        true
    }

    /// Give back request `id`'s slots of `keys`. A slot that expired is already gone and is
    /// not freed twice.
    pub fn release(&self, keys: &[CounterKey], id: u64) {
        for key in keys {
            let mut shard = self.shards.lock_one(key);
            if let Some(holders) = shard.get_mut(key) {
                if let Some(pos) = holders.iter().position(|&(h, _)| h == id) {
                    holders.remove(pos);
                }
                if holders.is_empty() {
                    shard.remove(key);
                }
            }
        }
    }

    /// Slots held right now (including expired ones not yet dropped).
    pub fn held(&self) -> usize {
        self.shards
            .each()
            .map(|s| s.values().map(|h| h.len()).sum::<usize>())
            .sum()
    }
}

/// Requests holding slots in this process right now, and Redis releases under way.
#[derive(Debug, Default)]
pub struct SlotStats {
    pub(super) held: AtomicU64,
    pub(super) releasing: AtomicU64,
}

impl SlotStats {
    /// Requests of this process holding slots (in memory or in Redis).
    pub fn requests_holding(&self) -> u64 {
        self.held.load(Ordering::Relaxed)
    }

    /// Redis releases not yet done.
    pub fn releases_pending(&self) -> u64 {
        self.releasing.load(Ordering::Relaxed)
    }
}

pub(super) enum Held {
    /// In this process: the memory store's, or the local fallback's.
    Local {
        keys: SmallVec<[CounterKey; 4]>,
        id: u64,
    },
    Redis {
        keys: Vec<String>,
        member: String,
    },
}

/// The slots one request holds; dropping it gives them back.
pub struct HeldSlots {
    store: Arc<Store>,
    held: Option<Held>,
}

impl std::fmt::Debug for HeldSlots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.held {
            Some(Held::Local { keys, .. }) => write!(f, "HeldSlots({} in memory)", keys.len()),
            Some(Held::Redis { keys, .. }) => write!(f, "HeldSlots({} in redis)", keys.len()),
            None => f.write_str("HeldSlots(none)"),
        }
    }
}

impl HeldSlots {
    pub(super) fn new(store: &Arc<Store>, held: Held) -> HeldSlots {
        store.slot_stats.held.fetch_add(1, Ordering::Relaxed);
        HeldSlots {
            store: store.clone(),
            held: Some(held),
        }
    }
}

impl Drop for HeldSlots {
    fn drop(&mut self) {
        let Some(held) = self.held.take() else { return };
        self.store.slot_stats.held.fetch_sub(1, Ordering::Relaxed);
        match held {
            Held::Local { keys, id } => self.store.local().slots.release(&keys, id),
            Held::Redis { keys, member } => release_in_redis(self.store.clone(), keys, member),
        }
    }
}

/// Give slots back to Redis on the runtime, retrying (a release is idempotent). Without a
/// runtime (the process is ending) the slots expire after their timeout.
pub(super) fn release_in_redis(store: Arc<Store>, keys: Vec<String>, member: String) {
    let Ok(rt) = tokio::runtime::Handle::try_current() else {
        return;
    };
    if store.redis_store().is_none() {
        return;
    }
    store.slot_stats.releasing.fetch_add(1, Ordering::Relaxed);
    rt.spawn(async move {
        let redis = store.redis_store().expect("a Redis store");
        let mut pause = Duration::from_millis(50);
        for attempt in 1..=RELEASE_ATTEMPTS {
            match redis.release_slots(&keys, &member).await {
                Ok(_) => break,
                Err(e) if attempt == RELEASE_ATTEMPTS => {
                    tracing::warn!(error = %e, "concurrency slots not given back to Redis; they expire after their timeout");
                }
                Err(_) => {
                    tokio::time::sleep(pause).await;
                    pause *= 2;
                }
            }
        }
        store.slot_stats.releasing.fetch_sub(1, Ordering::Relaxed);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn claim(key: &str, cap: u64, timeout_ms: u64, shadow: bool) -> Claim {
        Claim {
            id: 0,
            name: "t".into(),
            key: CounterKey::new("t", [key.as_bytes()]),
            cap,
            timeout_ms,
            shadow,
        }
    }

    fn take(t: &MemorySlots, claims: &[Claim], id: u64, now: u64) -> Result<InUse, InUse> {
        let mut in_use = InUse::new();
        if t.take(claims, id, now, &mut in_use) {
            Ok(in_use)
        } else {
            Err(in_use)
        }
    }

    #[test]
    fn takes_up_to_the_limit_and_release_frees_exactly_once() {
        let t = MemorySlots::new();
        let c = [claim("k", 3, 60_000, false)];
        for id in 1..=3 {
            assert!(take(&t, &c, id, 0).is_ok());
        }
        assert_eq!(take(&t, &c, 4, 0), Err(SmallVec::from_slice(&[3])));
        t.release(&[c[0].key], 2);
        // Releasing the same request again frees nothing more.
        t.release(&[c[0].key], 2);
        assert!(take(&t, &c, 5, 0).is_ok());
        assert!(take(&t, &c, 6, 0).is_err());
        for id in [1, 3, 5] {
            t.release(&[c[0].key], id);
        }
        assert_eq!(t.held(), 0);
        assert!(t.shards.each().all(|s| s.is_empty()));
    }

    #[test]
    fn all_or_nothing_across_limits() {
        let t = MemorySlots::new();
        let a = claim("a", 5, 60_000, false);
        let b = claim("b", 1, 60_000, false);
        assert!(take(&t, &[a.clone(), b.clone()], 1, 0).is_ok());
        // b is full: the request takes nothing from a either.
        assert_eq!(
            take(&t, &[a.clone(), b.clone()], 2, 0),
            Err(SmallVec::from_slice(&[1, 1]))
        );
        assert_eq!(t.held(), 2);
        for id in 3..=6 {
            assert!(take(&t, std::slice::from_ref(&a), id, 0).is_ok());
        }
        assert!(take(&t, std::slice::from_ref(&a), 7, 0).is_err());
    }

    #[test]
    fn slots_expire_after_the_timeout_and_a_late_release_frees_nothing() {
        let t = MemorySlots::new();
        let c = [claim("k", 2, 1_000, false)];
        assert!(take(&t, &c, 1, 0).is_ok());
        assert!(take(&t, &c, 2, 500).is_ok());
        assert!(take(&t, &c, 3, 999).is_err());
        // Request 1's slot is 1000 ms old: expired.
        assert!(take(&t, &c, 3, 1_000).is_ok());
        assert!(take(&t, &c, 4, 1_000).is_err());
        // Request 1 ends late: nothing of it is left to free; 2 and 3 still hold theirs.
        t.release(&[c[0].key], 1);
        assert!(take(&t, &c, 4, 1_001).is_err());
    }

    #[test]
    fn a_full_shadow_limit_never_denies() {
        let t = MemorySlots::new();
        let real = claim("real", 10, 60_000, false);
        let shadow = claim("shadow", 1, 60_000, true);
        let both = [real, shadow];
        assert_eq!(take(&t, &both, 1, 0), Ok(SmallVec::from_slice(&[0, 0])));
        // The shadow limit is full: reported, no slot taken of it, the request admitted.
        assert_eq!(take(&t, &both, 2, 0), Ok(SmallVec::from_slice(&[1, 1])));
        assert_eq!(t.held(), 3);
    }

    #[test]
    fn exact_under_concurrency() {
        let t = Arc::new(MemorySlots::new());
        let c = claim("k", 20, 60_000, false);
        let barrier = Arc::new(std::sync::Barrier::new(8));
        let threads: Vec<_> = (0..8u64)
            .map(|n| {
                let (t, c, barrier) = (t.clone(), c.clone(), barrier.clone());
                std::thread::spawn(move || {
                    barrier.wait();
                    (0..50u64)
                        .filter(|i| take(&t, std::slice::from_ref(&c), n * 100 + i, 0).is_ok())
                        .count()
                })
            })
            .collect();
        let taken: usize = threads.into_iter().map(|h| h.join().unwrap()).sum();
        assert_eq!(taken, 20);
        assert_eq!(t.held(), 20);
    }
}
