//! The overrides every gateway holds in memory, so that no request waits on the database: one
//! table by key hash, swapped whole on each refresh, and the same table resolved against the
//! config in force (tier and limit names to ids, new parameters to pre-built rate specs),
//! rebuilt when either changes.
//!
//! Phase: `request_filter` reads it (one hash of the API key, one map lookup); the refresh task
//! writes it.

use std::collections::HashMap;
use std::sync::Arc;

use smallvec::SmallVec;

use super::model::{KeyHash, Override, Status};
use crate::config::{Config, LimitId, RateSpec, Spec, TierId};

/// Every override, as last loaded.
#[derive(Debug, Default)]
pub struct Table {
    pub by_key: HashMap<KeyHash, Override>,
    /// Increases with every load, so resolutions know they are stale.
    pub version: u64,
}

/// One key's override as a request applies it.
#[derive(Debug)]
pub struct Resolved {
    pub tier: Option<TierId>,
    pub disabled: bool,
    /// New parameters of rate limits, by limit id.
    pub limits: SmallVec<[(LimitId, Arc<RateSpec>); 2]>,
    pub effective_at: Option<i64>,
    pub expires_at: Option<i64>,
}

impl Resolved {
    /// Whether it applies at `now` (Unix seconds).
    pub fn in_force(&self, now: i64) -> bool {
        self.effective_at.is_none_or(|t| now >= t) && self.expires_at.is_none_or(|t| now < t)
    }

    /// The overridden spec of rate limit `id`, if any.
    pub fn rate(&self, id: LimitId) -> Option<&Arc<RateSpec>> {
        self.limits.iter().find(|(l, _)| *l == id).map(|(_, s)| s)
    }
}

/// A [`Table`] resolved against one config.
#[derive(Debug)]
pub struct ResolvedTable {
    /// The config it was resolved against (compared by pointer).
    pub config: Arc<Config>,
    pub version: u64,
    pub by_key: HashMap<KeyHash, Arc<Resolved>>,
}

impl ResolvedTable {
    pub fn resolve(cfg: &Arc<Config>, table: &Table) -> ResolvedTable {
        let by_key = table
            .by_key
            .iter()
            .map(|(k, o)| (*k, Arc::new(resolve_one(cfg, o))))
            .collect();
        ResolvedTable {
            config: cfg.clone(),
            version: table.version,
            by_key,
        }
    }
}

/// Names that the config no longer has are ignored (logged when the table is loaded).
fn resolve_one(cfg: &Config, o: &Override) -> Resolved {
    let tier = o
        .tier
        .as_deref()
        .and_then(|t| cfg.tiers.iter().position(|x| x.name == t));
    let mut limits = SmallVec::new();
    for (name, p) in &o.limits {
        let Some((id, l)) = cfg
            .limits
            .iter()
            .enumerate()
            .find(|(_, l)| &*l.name == name)
        else {
            continue;
        };
        let Spec::Rate(rate) = &l.spec else { continue };
        match rate.with_params(
            &l.name,
            p.limit,
            p.window.as_deref(),
            p.burst,
            cfg.failure.local_share,
        ) {
            Ok(spec) => limits.push((id, Arc::new(spec))),
            Err((field, e)) => tracing::warn!(
                key = %format!("fp:{}", o.fingerprint),
                limit = %name,
                "override of {field} ignored: {e}"
            ),
        }
    }
    Resolved {
        tier,
        disabled: o.status == Status::Disabled,
        limits,
        effective_at: o.effective_at,
        expires_at: o.expires_at,
    }
}
