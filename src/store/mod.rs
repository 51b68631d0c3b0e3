//! Where counters live. [`Store`] checks all of one request's limits in one atomic step:
//! every limit is checked, and only if every enforcing limit admits is `cost` consumed from
//! each. A denied request consumes nothing.
//!
//! Phase: `request_filter`, after identity, route and shedding. The memory store answers
//! synchronously under short shard locks that are never held across an await.

pub mod breaker;
pub mod key;
pub mod memory;
pub mod redis;
pub mod sharded;

use std::sync::Arc;

use crate::limit::{Decision, Quota};

pub use self::redis::{RedisStore, Topology};
pub use key::CounterKey;
pub use memory::MemoryStore;

/// One limit to check for one request.
#[derive(Debug, Clone)]
pub struct Check {
    /// The limit's name (part of the Redis key).
    pub name: Arc<str>,
    pub key: CounterKey,
    pub quota: Quota,
    pub cost: u64,
    /// Counted and reported, never denies: its own denial does not block the others.
    pub shadow: bool,
}

/// Why a store could not answer. Turned into a per-limit failure policy by the caller.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    #[error("store timed out after {0:?}")]
    Timeout(std::time::Duration),
    #[error("store unavailable: {0}")]
    Unavailable(String),
    #[error("store circuit breaker is open")]
    CircuitOpen,
}

/// The configured store. An enum rather than a trait object: the set is closed and the hot
/// path stays a direct call.
pub enum Store {
    Memory(MemoryStore),
    Redis(Box<RedisStore>),
}

impl Store {
    /// Check every limit of a request atomically. `now` is the gateway's clock (ms since the
    /// Unix epoch); Redis uses its own. `out` receives one decision per check, in order.
    /// Returns the time the decisions were made at, for the reset headers.
    pub async fn check(
        &self,
        checks: &[Check],
        now: u64,
        out: &mut Vec<Decision>,
    ) -> Result<u64, StoreError> {
        match self {
            Store::Memory(m) => {
                m.check(checks, now, out);
                Ok(now)
            }
            Store::Redis(r) => r.check(checks, now, out).await,
        }
    }

    /// The in-process limiter that `on_error: local` limits fall back to when this store
    /// cannot answer (none for the memory store, which cannot fail).
    pub fn fallback(&self) -> Option<&MemoryStore> {
        match self {
            Store::Memory(_) => None,
            Store::Redis(r) => Some(&r.fallback),
        }
    }

    /// Counters and breaker state, for `/readyz`.
    pub fn status(&self) -> serde_json::Value {
        use std::sync::atomic::Ordering::Relaxed;
        match self {
            Store::Memory(m) => serde_json::json!({
                "backend": "memory",
                "evictions": m.evictions(),
            }),
            Store::Redis(r) => serde_json::json!({
                "backend": "redis",
                "breaker": match r.breaker_state() {
                    breaker::State::Closed => "closed",
                    breaker::State::Open { .. } => "open",
                    breaker::State::HalfOpen => "half-open",
                },
                "failures": r.stats.failures.load(Relaxed),
                "rejected_by_breaker": r.stats.rejected.load(Relaxed),
                "breaker_opened": r.stats.opened.load(Relaxed),
            }),
        }
    }

    /// Whether the store can answer right now (for `/readyz`).
    pub async fn ready(&self) -> bool {
        match self {
            Store::Memory(_) => true,
            Store::Redis(r) => r.ping().await,
        }
    }
}
