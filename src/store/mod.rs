//! Where counters and concurrency slots live: the one seam between the admission pipeline and
//! every backend. [`Store`] is either the embedded memory store or Redis (single, Cluster or
//! Sentinel); the choice is made once, here, when it is built.
//!
//! It offers two kinds of check, both atomic over all of one request's limits:
//! - [`Store::check`]: rate limits. Every limit is checked, and only if every enforcing limit
//!   admits is `cost` consumed from each. A denied request consumes nothing.
//! - [`Store::take_slots`]: concurrency limits. One slot of every limit, all or nothing, held
//!   by a [`HeldSlots`] guard until the request ends.
//!
//! With Redis, [`Store::local`] is the in-process fallback that `on_error: local` limits use
//! while Redis cannot answer; with the memory store it is the store itself.
//!
//! Phase: `request_filter`, after identity, route and shedding. The memory store answers
//! synchronously under short shard locks that are never held across an await.

pub mod breaker;
pub mod deadlines;
pub mod key;
pub mod lease;
mod leased;
pub mod memory;
pub mod over_limit;
pub mod redis;
pub mod sharded;
pub mod slots;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use smallvec::SmallVec;

use crate::config::{LimitId, StoreSettings};
use crate::limit::{Decision, Quota};

pub use self::redis::RedisStore;
pub use key::{CounterKey, KeyMemo};
pub use lease::Leases;
pub use leased::{bit_set, FromLease};
pub use memory::MemoryStore;
pub use over_limit::{Invalidation, OverLimitCache};
pub use slots::{HeldSlots, InUse, MemorySlots, SlotStats};

/// One rate limit to check for one request.
#[derive(Debug, Clone)]
pub struct Check {
    pub id: LimitId,
    /// The limit's name (part of the Redis key).
    pub name: Arc<str>,
    pub key: CounterKey,
    pub quota: Quota,
    pub cost: u64,
    /// Counted and reported, never denies: its own denial does not block the others.
    pub shadow: bool,
}

/// One concurrency limit to take a slot of for one request.
#[derive(Debug, Clone)]
pub struct Claim {
    pub id: LimitId,
    pub name: Arc<str>,
    pub key: CounterKey,
    /// Requests in progress at once.
    pub cap: u64,
    /// A slot is held at most this long.
    pub timeout_ms: u64,
    pub shadow: bool,
}

/// The checks of one request: inline up to 8, the most key parts and near every request's
/// number of limits, so the common path does not allocate.
pub type Checks = SmallVec<[Check; 8]>;
pub type Claims = SmallVec<[Claim; 4]>;
pub type Decisions = SmallVec<[Decision; 8]>;

/// Which kind of failure a store error is, for logs and metrics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ErrorKind {
    /// The call missed its deadline.
    Timeout,
    /// No connection, or it broke.
    Connection,
    /// Redis answered with an error (the script failed, READONLY, LOADING, ...).
    Script,
    /// Anything else: an unexpected reply, a client error.
    Other,
    /// Not called: the circuit breaker is open.
    CircuitOpen,
}

impl ErrorKind {
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorKind::Timeout => "timeout",
            ErrorKind::Connection => "connection",
            ErrorKind::Script => "script",
            ErrorKind::Other => "other",
            ErrorKind::CircuitOpen => "circuit_open",
        }
    }
}

/// Why a store could not answer. Turned into a per-limit failure policy by the caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0:?}")]
    Timeout(Duration),
    #[error("store connection failed: {0}")]
    Connection(#[source] ::redis::RedisError),
    #[error("store answered with an error: {0}")]
    Script(#[source] ::redis::RedisError),
    #[error("store failed: {0}")]
    Other(#[source] ::redis::RedisError),
    #[error("unexpected store reply: {0}")]
    Reply(String),
    #[error("store circuit breaker is open")]
    CircuitOpen,
}

impl StoreError {
    /// Classify an error of the Redis client.
    pub fn from_redis(e: ::redis::RedisError) -> StoreError {
        use ::redis::ErrorKind as K;
        if e.is_timeout() {
            // The client's own response timeout; ours is `Timeout` with its duration.
            return StoreError::Connection(e);
        }
        match e.kind() {
            K::Io
            | K::AuthenticationFailed
            | K::ClusterConnectionNotFound
            | K::MasterNameNotFoundBySentinel
            | K::NoValidReplicasFoundBySentinel
            | K::EmptySentinelList => StoreError::Connection(e),
            K::Server(_) | K::Extension => StoreError::Script(e),
            _ if e.is_connection_dropped() || e.is_connection_refusal() => {
                StoreError::Connection(e)
            }
            _ => StoreError::Other(e),
        }
    }

    pub fn kind(&self) -> ErrorKind {
        match self {
            StoreError::Timeout(_) => ErrorKind::Timeout,
            StoreError::Connection(_) => ErrorKind::Connection,
            StoreError::Script(_) => ErrorKind::Script,
            StoreError::Other(_) | StoreError::Reply(_) => ErrorKind::Other,
            StoreError::CircuitOpen => ErrorKind::CircuitOpen,
        }
    }

    /// Whether the call may have run in Redis (and taken what it was asked to take).
    pub fn may_have_run(&self) -> bool {
        !matches!(self, StoreError::CircuitOpen)
    }
}

/// Counters and slots in this process.
pub struct Local {
    pub counters: MemoryStore,
    pub slots: MemorySlots,
}

impl Local {
    fn new(max_keys: usize) -> Local {
        Local {
            counters: MemoryStore::new(max_keys),
            slots: MemorySlots::new(),
        }
    }
}

enum Backend {
    Memory(Local),
    Redis(Box<RedisStore>),
}

/// The configured store.
pub struct Store {
    backend: Backend,
    slot_stats: SlotStats,
    /// This process among every gateway sharing a Redis, for request ids.
    instance: u64,
    next_request: AtomicU64,
    /// The origin of the monotonic clock that local slots are timed on.
    origin: Instant,
    /// Redis: denials answered from this process until they end (off for the memory store).
    over_limit: OverLimitCache,
    /// Redis: quota leases of the limits that lease (off for the memory store).
    leases: Leases,
}

/// Callers (limit and caller pairs) the lease table keeps at most.
pub const LEASE_ENTRIES: usize = 100_000;

/// Keys the local fallback limiter keeps at most.
pub const FALLBACK_MAX_KEYS: usize = 100_000;

impl Store {
    /// The store `settings` describe. No Redis connection is made yet: the first call
    /// connects, so the gateway starts while Redis is down (`/readyz` says it is unreachable).
    pub fn new(settings: &StoreSettings) -> Result<Store, StoreError> {
        Ok(match &settings.redis {
            None => Store::memory(settings.max_keys),
            Some(t) => Store::redis(
                RedisStore::new(t.clone(), &settings.key_prefix, settings.timeout)?
                    .with_breaker(settings.breaker),
            )
            .with_over_limit_cache(settings.over_limit_entries),
        })
    }

    /// The embedded store, keeping at most `max_keys` counters.
    pub fn memory(max_keys: usize) -> Store {
        Store::with_backend(Backend::Memory(Local::new(max_keys)))
    }

    /// A Redis store.
    pub fn redis(redis: RedisStore) -> Store {
        Store::with_backend(Backend::Redis(Box::new(redis)))
    }

    fn with_backend(backend: Backend) -> Store {
        Store {
            backend,
            slot_stats: SlotStats::default(),
            instance: instance_id(),
            next_request: AtomicU64::new(1),
            origin: Instant::now(),
            over_limit: OverLimitCache::new(0),
            leases: Leases::new(0),
        }
    }

    /// Keep at most `max_entries` denials in the over-limit cache (Redis only; 0: off).
    pub fn with_over_limit_cache(mut self, max_entries: usize) -> Store {
        if self.redis_store().is_some() {
            self.over_limit = OverLimitCache::new(max_entries);
            self.leases = Leases::new(LEASE_ENTRIES);
        }
        self
    }

    /// This gateway's quota leases (empty and off for the memory store).
    pub fn leases(&self) -> &Leases {
        &self.leases
    }

    /// The over-limit cache (empty and off for the memory store).
    pub fn over_limit(&self) -> &OverLimitCache {
        &self.over_limit
    }

    /// Drop what `inv` names from the over-limit cache here, and (Redis) on every gateway
    /// sharing the store, over pub/sub. A failed publish is logged: the other gateways' entries
    /// then end on their own, at their retry time.
    pub async fn invalidate(&self, inv: Invalidation) {
        self.over_limit.invalidate(&inv);
        self.end_leases(&inv).await;
        if let Backend::Redis(r) = &self.backend {
            if self.over_limit.enabled() || self.leases.enabled() {
                if let Err(e) = Box::pin(r.publish_invalidation(&inv)).await {
                    tracing::warn!("over-limit cache invalidation not published: {e}");
                }
            }
        }
    }

    /// Apply the invalidations other gateways publish, until `shutdown` (Redis with the
    /// over-limit cache on; otherwise returns at once).
    pub async fn follow_invalidations(
        self: Arc<Self>,
        shutdown: tokio::sync::watch::Receiver<bool>,
    ) {
        if let Backend::Redis(r) = &self.backend {
            if self.over_limit.enabled() || self.leases.enabled() {
                r.follow_invalidations(&self.over_limit, &self.leases, shutdown)
                    .await;
            }
        }
    }

    /// The Redis store, if that is the backend.
    pub fn redis_store(&self) -> Option<&RedisStore> {
        match &self.backend {
            Backend::Redis(r) => Some(r),
            Backend::Memory(_) => None,
        }
    }

    /// Counters and slots in this process: the memory store itself, or Redis's local
    /// fallback.
    pub fn local(&self) -> &Local {
        match &self.backend {
            Backend::Memory(m) => m,
            Backend::Redis(r) => &r.fallback,
        }
    }

    /// Check every rate limit of a request atomically. `now` is the gateway's clock (ms since
    /// the Unix epoch); Redis uses its own. `out` receives one decision per check, in order.
    /// Returns the time the decisions were made at, for the reset headers.
    pub async fn check(
        &self,
        checks: &[Check],
        now: u64,
        out: &mut Decisions,
    ) -> Result<u64, StoreError> {
        match &self.backend {
            Backend::Memory(m) => {
                m.counters.check(checks, now, out);
                Ok(now)
            }
            // Boxed: the Redis call's future is kilobytes, and every future that awaits this
            // one would carry it, on the memory path too.
            Backend::Redis(r) => Box::pin(r.check(checks, now, out)).await,
        }
    }

    /// What each rate limit of `checks` has left now (remaining, ms until fully restored),
    /// without consuming anything; and the time of the reading (the store's clock).
    pub async fn peek(
        &self,
        checks: &[Check],
        now: u64,
    ) -> Result<(Vec<(u64, u64)>, u64), StoreError> {
        match &self.backend {
            Backend::Memory(m) => {
                let mut d = Decisions::new();
                m.counters.peek(checks, now, &mut d);
                Ok((
                    d.iter().map(|d| (d.remaining, d.reset_after_ms)).collect(),
                    now,
                ))
            }
            Backend::Redis(r) => {
                let mut out = Vec::new();
                let at = Box::pin(r.peek(checks, &mut out)).await?;
                Ok((out, at))
            }
        }
    }

    /// Drop the counters of `checks` (a usage reset); how many there were.
    /// With Redis, the counters' cached denials go too, on every gateway.
    pub async fn reset(&self, checks: &[Check]) -> Result<u64, StoreError> {
        match &self.backend {
            Backend::Memory(m) => Ok(m.counters.remove(checks) as u64),
            Backend::Redis(r) => {
                let removed = Box::pin(r.reset(checks)).await?;
                self.invalidate(Invalidation::Keys(checks.iter().map(|c| c.key).collect()))
                    .await;
                Ok(removed)
            }
        }
    }

    /// Take one slot of every claim, all or nothing; see [`MemorySlots::take`] for `in_use`.
    /// `Some(guard)` when the request holds its slots.
    pub async fn take_slots(
        self: &Arc<Self>,
        claims: &[Claim],
        in_use: &mut InUse,
    ) -> Result<Option<HeldSlots>, StoreError> {
        let Backend::Redis(redis) = &self.backend else {
            return Ok(self.take_local_slots(claims, in_use));
        };
        let keys: Vec<String> = claims.iter().map(|c| redis.slot_key(c)).collect();
        let member = self.request_member();
        match Box::pin(redis.take_slots(&keys, claims, &member, in_use)).await {
            Ok(true) => Ok(Some(HeldSlots::new(
                self,
                slots::Held::Redis { keys, member },
            ))),
            Ok(false) => Ok(None),
            Err(e) => {
                // A call that timed out or lost its connection may still have run: give back
                // whatever it took (a release of a slot never taken frees nothing).
                if e.may_have_run() {
                    slots::release_in_redis(self.clone(), keys, member);
                }
                Err(e)
            }
        }
    }

    /// Take slots in this process: the memory store's, or the local fallback's while Redis
    /// cannot answer.
    pub fn take_local_slots(
        self: &Arc<Self>,
        claims: &[Claim],
        in_use: &mut InUse,
    ) -> Option<HeldSlots> {
        if claims.is_empty() {
            return None;
        }
        let id = self.next_request.fetch_add(1, Ordering::Relaxed);
        let now = self.origin.elapsed().as_millis() as u64;
        if !self.local().slots.take(claims, id, now, in_use) {
            return None;
        }
        let keys = claims.iter().map(|c| c.key).collect();
        Some(HeldSlots::new(self, slots::Held::Local { keys, id }))
    }

    /// A request id unique across the fleet: the sorted-set member of its slots in Redis.
    fn request_member(&self) -> String {
        let n = self.next_request.fetch_add(1, Ordering::Relaxed);
        format!("{:016x}:{n:x}", self.instance)
    }

    /// Slots held by this process's requests.
    pub fn slot_stats(&self) -> &SlotStats {
        &self.slot_stats
    }

    /// Drop expired counters of the memory store (a no-op for Redis, whose keys expire).
    pub fn sweep(&self, now: u64) -> usize {
        match &self.backend {
            Backend::Memory(m) => m.counters.sweep(now),
            Backend::Redis(_) => 0,
        }
    }

    /// Counters and breaker state, for `/readyz`.
    pub fn status(&self) -> serde_json::Value {
        match &self.backend {
            Backend::Memory(m) => serde_json::json!({
                "backend": "memory",
                "evictions": m.counters.evictions(),
            }),
            Backend::Redis(r) => r.status(),
        }
    }

    /// Whether the store can answer right now (for `/readyz`).
    pub async fn ready(&self) -> bool {
        match &self.backend {
            Backend::Memory(_) => true,
            Backend::Redis(r) => r.ping().await,
        }
    }
}

/// This process among all gateways sharing a Redis: a hash of the pid, the start time and an
/// address, so that request ids of two gateways never collide.
pub fn instance_id() -> u64 {
    let mut h = blake3::Hasher::new();
    h.update(&std::process::id().to_le_bytes());
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default();
    h.update(&now.as_nanos().to_le_bytes());
    let here = 0u8;
    h.update(&(&here as *const u8 as usize).to_le_bytes());
    u64::from_le_bytes(h.finalize().as_bytes()[..8].try_into().expect("8 bytes"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_members_are_unique() {
        let s = Store::memory(10);
        let a = s.request_member();
        let b = s.request_member();
        assert_ne!(a, b);
        assert_eq!(a.split(':').next().unwrap().len(), 16);
    }

    #[test]
    fn dropping_the_guard_releases() {
        let s = Arc::new(Store::memory(10));
        let c = [Claim {
            id: 0,
            name: "t".into(),
            key: CounterKey::new("t", [&b"k"[..]]),
            cap: 1,
            timeout_ms: 60_000,
            shadow: false,
        }];
        let mut in_use = InUse::new();
        let slots = s.take_local_slots(&c, &mut in_use).expect("admitted");
        assert_eq!(s.slot_stats().requests_holding(), 1);
        assert!(s.take_local_slots(&c, &mut in_use).is_none());
        assert_eq!(in_use.as_slice(), [1]);
        drop(slots);
        assert_eq!(s.local().slots.held(), 0);
        assert_eq!(s.slot_stats().requests_holding(), 0);
        assert!(s.take_local_slots(&c, &mut in_use).is_some());
    }
}
