//! What happens when the store cannot answer: each limit's `on_error`, the same for rate and
//! concurrency limits. One `deny` limit (enforcing) among a request's limits makes it a 503;
//! otherwise `local` limits are decided in this process with their local quota or cap, and
//! `allow` limits are skipped. The answer says which policy decided (`Tollgate-Degraded`).
//!
//! Phase: `request_filter`, only after a store call failed.

use crate::config::{Config, LimitId, OnError};

/// What the failure policies of one request's limits say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Failure {
    /// This enforcing limit fails closed: 503.
    Closed(LimitId),
    /// Some limits fall back to the local limiter; the rest are skipped.
    Local,
    /// Every limit fails open.
    Open,
}

impl Failure {
    /// The policy the answer is degraded under.
    pub fn degraded(self) -> OnError {
        match self {
            Failure::Closed(_) => OnError::Deny,
            Failure::Local => OnError::Local,
            Failure::Open => OnError::Allow,
        }
    }
}

/// Decide over the limits `ids` of one request.
pub fn on_store_error(cfg: &Config, ids: impl Iterator<Item = LimitId> + Clone) -> Failure {
    let closed = ids.clone().find(|&id| {
        let l = cfg.limit(id);
        !l.shadow && l.on_error == OnError::Deny
    });
    if let Some(id) = closed {
        return Failure::Closed(id);
    }
    if ids.into_iter().any(|id| is_local(cfg, id)) {
        Failure::Local
    } else {
        Failure::Open
    }
}

/// Whether limit `id` is decided by the local fallback while the store cannot answer.
pub fn is_local(cfg: &Config, id: LimitId) -> bool {
    cfg.limit(id).on_error == OnError::Local
}
