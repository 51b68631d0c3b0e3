//! Counter-keyed maps split over [`SHARDS`] mutexes, for the in-process stores (rate-limit
//! counters in [`super::MemoryStore`], concurrency slots in [`super::MemorySlots`]).
//!
//! A request that touches several keys locks their shards together, in ascending shard order,
//! so its check-then-commit is atomic and two requests can never deadlock. Locks are held for
//! a few map operations, never across an await.

use parking_lot::{Mutex, MutexGuard};
use smallvec::SmallVec;

use super::key::{KeyHasher, KeyMap};
use super::CounterKey;

/// Number of shards; a power of two.
pub const SHARDS: usize = 64;

pub struct Sharded<V> {
    shards: Box<[Mutex<KeyMap<V>>]>,
}

impl<V> Default for Sharded<V> {
    fn default() -> Self {
        Sharded {
            shards: (0..SHARDS).map(|_| Mutex::new(KeyMap::default())).collect(),
        }
    }
}

/// The shards of a set of keys, locked.
/// Inline up to 8 shards (a request's limits), so locking does not allocate.
pub struct Locked<'a, V> {
    ids: SmallVec<[usize; 8]>,
    guards: SmallVec<[MutexGuard<'a, KeyMap<V>>; 8]>,
}

impl<V> Locked<'_, V> {
    fn index(&self, key: &CounterKey) -> usize {
        self.ids
            .binary_search(&shard_of(key))
            .expect("the key's shard is locked")
    }

    /// The locked map holding `key`.
    pub fn map(&self, key: &CounterKey) -> &KeyMap<V> {
        &self.guards[self.index(key)]
    }

    /// The locked map holding `key`, mutably.
    pub fn map_mut(&mut self, key: &CounterKey) -> &mut KeyMap<V> {
        let i = self.index(key);
        &mut self.guards[i]
    }
}

fn shard_of(key: &CounterKey) -> usize {
    key.0[0] as usize & (SHARDS - 1)
}

impl<V> Sharded<V> {
    /// Lock the shards of every key in `keys`, in ascending order.
    pub fn lock<'a, 'k>(&'a self, keys: impl IntoIterator<Item = &'k CounterKey>) -> Locked<'a, V> {
        let mut ids: SmallVec<[usize; 8]> = keys.into_iter().map(shard_of).collect();
        ids.sort_unstable();
        ids.dedup();
        let guards = ids.iter().map(|&i| self.shards[i].lock()).collect();
        Locked { ids, guards }
    }

    /// Lock the one shard holding `key`.
    pub fn lock_one(&self, key: &CounterKey) -> MutexGuard<'_, KeyMap<V>> {
        self.shards[shard_of(key)].lock()
    }

    /// Every shard, one at a time (for sweeps and counts).
    pub fn each(&self) -> impl Iterator<Item = MutexGuard<'_, KeyMap<V>>> {
        self.shards.iter().map(|s| s.lock())
    }
}

/// A counter-keyed LRU map: a shard of the gateway's bounded caches (the over-limit cache, the
/// lease table).
pub type LruShard<V> = lru::LruCache<CounterKey, V, std::hash::BuildHasherDefault<KeyHasher>>;

/// `shards` LRU maps holding at most `max_entries` in all; none when `max_entries` is 0 (off).
pub fn lru_shards<V>(max_entries: usize, shards: usize) -> Box<[Mutex<LruShard<V>>]> {
    if max_entries == 0 {
        return Box::new([]);
    }
    let per_shard =
        std::num::NonZeroUsize::new(max_entries.div_ceil(shards)).expect("max_entries > 0");
    (0..shards)
        .map(|_| Mutex::new(LruShard::with_hasher(per_shard, Default::default())))
        .collect()
}
